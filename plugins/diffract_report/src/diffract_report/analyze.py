"""``diffract analyze``: checkpoints in, a per-layer table and a model summary out."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

from diffract_report._inputs import (
    DEFAULT_METRICS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    add_inputs,
    add_session_arguments,
    apply_settings,
    check_metrics,
    model_inputs,
    open_session,
    scope,
)
from diffract_report._output import (
    ProgressBar,
    print_table,
    run_apply,
    table_rows,
    tell_failures,
    terminal_console,
    view_tables,
    wrapped,
    write_outputs,
)


def configure_analyze(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help=".safetensors file, Hugging Face-style directory, torch state-dict "
                        "file, or module:factory returning an nn.Module")
    p.add_argument("--metrics", metavar="a,b,...",
                   help=f"fields to compute (default: {','.join(DEFAULT_METRICS)})")
    add_session_arguments(p)


def analyze(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    from diffract_report.report import summarize, summary_lines

    started = time.perf_counter()
    metrics = [m.strip() for m in (args.metrics or ",".join(DEFAULT_METRICS)).split(",")
               if m.strip()]
    if not metrics:
        raise UsageError("--metrics is empty; name at least one field.")
    inputs = model_inputs(args.paths)
    session = open_session(args)
    with session:
        check_metrics(session, metrics)
        apply_settings(session, args.settings, args.conventions)
        model_ids = add_inputs(session, inputs, args)
        view = scope(session, model_ids, args)
        interactive = sys.stderr.isatty() and not args.quiet
        wanted = list(metrics)
        if (args.plot or args.report) and "esd" in session.compute.list_available_metrics():
            wanted.append("esd")  # the ESD plots draw it
        try:
            with ProgressBar(interactive) as bar:
                report = run_apply(view, wanted, bar)
        except KeyboardInterrupt:
            where = (f"rerun the same command with --store {args.store} to resume"
                     if args.store else "use --store PATH to keep results across runs")
            print(f"diffract analyze: interrupted; {where}.", file=sys.stderr)
            return EXIT_INTERRUPTED
        summaries = summarize(view, model_ids)
        to_terminal = args.format == "table"
        if to_terminal:
            console = terminal_console() if sys.stdout.isatty() else None
            header = ["parameter", "shape", *metrics]
            for model_id in model_ids:
                rows = table_rows(session, view, model_id, metrics, args.include_1d)
                print_table(f"{model_id}: {len(rows)} layers", header, rows, console)
                view_tables(session, view, model_id, metrics, console, say)
            for record in summaries:
                if record["layers"]:  # alpha was asked for
                    say("")
                    for line in wrapped(summary_lines(record),
                                        console.width if console is not None else None):
                        say(line)
        written = []
        if args.out or not to_terminal:
            written = write_outputs(view, metrics, args.format, args.out, summaries)
        if args.plot:
            from diffract_report.viz import plot_model

            with ProgressBar(interactive) as bar:
                for number, model_id in enumerate(model_ids, start=1):
                    written += plot_model(view, model_id, args.plot, lambda done, total, n=(
                        number, model_id): bar(SimpleNamespace(
                            step=n[0], steps=len(model_ids), kernel=f"ESD plots of {n[1]}",
                            done=done, total=total)))
        if args.report:
            from diffract_report.report import write_html

            written.append(write_html(view, args.report, metrics=metrics,
                                      seconds=time.perf_counter() - started,
                                      command=" ".join(["diffract", *sys.argv[1:]])))
        tell = say if to_terminal else (lambda s: print(s, file=sys.stderr))
        for path in written:
            tell(f"wrote {path}")
        if report.failures:
            tell_failures(report.reasons("failed"), tell)
            return EXIT_FAILED
        tell(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


def command_entry(command: str, run: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """The entry of one command: its usage errors are one line on stderr, exit 2 (other
    Diffract errors are handled the same way by diffract.cli.main)."""

    def entry(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except UsageError as exc:
            print(f"diffract {command}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return entry


main_analyze = command_entry("analyze", analyze)
