"""``diffract analyze``: checkpoints in, a per-layer table and a model summary out."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

from diffract.errors import printable
from diffract_report._inputs import (
    DEFAULT_METRICS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    VIEW_METRICS,
    UsageError,
    add_inputs,
    add_session_arguments,
    apply_settings,
    check_metrics,
    model_inputs,
    open_session,
    parents_only,
    scope,
)
from diffract_report._output import (
    BOUNDED_MARK,
    BOUNDED_NOTE,
    NOISE_NOTE,
    STACK_MARK,
    STACK_NOTE,
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
                   help=f"fields to compute (default: {','.join(DEFAULT_METRICS)}; with "
                        f"--views, the views get {','.join(VIEW_METRICS)})")
    p.add_argument("--schedule", choices=["alphapruning"],
                   help="write per-layer sparsity ratios (JSON keyed by parameter name): "
                        "alphapruning maps each layer's --schedule-metric onto sparsity x "
                        "[1 - eps, 1 + eps], the overall sparsity kept")
    p.add_argument("--sparsity", type=float, default=None, metavar="S",
                   help="the model's overall sparsity for --schedule (e.g. 0.7)")
    p.add_argument("--epsilon", type=float, default=0.3, metavar="EPS",
                   help="--schedule's spread: each layer gets about S x (1 +- EPS) "
                        "(default 0.3)")
    p.add_argument("--schedule-metric", default="pl_alpha_hill", metavar="FIELD",
                   help="the metric --schedule maps (default pl_alpha_hill, AlphaPruning's)")
    p.add_argument("--schedule-by", choices=["layer", "block"], default="layer",
                   help="block: average the metric over each transformer block first")
    p.add_argument("--schedule-file", metavar="PATH",
                   help="where the ratios go (default sparsity.json, sparsity-<model>.json "
                        "for several models; in --out when given)")
    p.add_argument("--view-rows", action="store_true",
                   help="with --views, list every view's values on the terminal too (by "
                        "default each parameter's median and range, the views at its ends "
                        "named)")
    add_session_arguments(p)


def analyze(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    from diffract_report.summary import (
        NOISE_MARK,
        summarize,
        summary_lines,
        told_by_summary,
        undefined_lines,
    )

    started = time.perf_counter()
    metrics = [m.strip() for m in (args.metrics or ",".join(DEFAULT_METRICS)).split(",")
               if m.strip()]
    if not metrics:
        raise UsageError("--metrics is empty; name at least one field.")
    if getattr(args, "schedule", None):
        if args.sparsity is None:
            raise UsageError("--schedule needs --sparsity S (the model's overall share of "
                             "weights pruned, e.g. 0.7).")
        if not 0.0 < args.sparsity < 1.0:
            raise UsageError(f"--sparsity must be between 0 and 1, got {args.sparsity:g}.")
        if not 0.0 <= args.epsilon < 1.0:
            raise UsageError(f"--epsilon must be in [0, 1), got {args.epsilon:g}.")
    elif getattr(args, "sparsity", None) is not None:
        raise UsageError("--sparsity is for --schedule: add --schedule alphapruning.")
    inputs = model_inputs(args.paths)
    session = open_session(args)
    with session:
        check_metrics(session, metrics)
        apply_settings(session, args.settings, args.conventions)
        model_ids = add_inputs(session, inputs, args)
        view = scope(session, model_ids, args)
        interactive = sys.stderr.isatty() and not args.quiet
        wanted = list(metrics)
        if getattr(args, "schedule", None):
            check_metrics(session, [args.schedule_metric])
            wanted.append(args.schedule_metric)
        if (args.plot or args.report) and "esd" in session.compute.list_available_metrics():
            wanted.append("esd")  # the ESD plots draw it
        view_fields = list(VIEW_METRICS) if args.views and not args.metrics else []
        if view_fields:
            check_metrics(session, view_fields)
        try:
            reports = []
            if view_fields:  # parents and views together: each parent is read once
                with ProgressBar(interactive) as bar:
                    reports.append(run_apply(view, view_fields, bar))
            with ProgressBar(interactive) as bar:  # the parents' spectra are stored now
                reports.append(run_apply(parents_only(session, view, model_ids) if view_fields
                                         else view, wanted, bar))
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
                if any(str(v).endswith(BOUNDED_MARK) for row in rows for v in row[2:]):
                    say(BOUNDED_NOTE)
                if any(str(v).endswith(STACK_MARK) for row in rows for v in row[2:]):
                    say(STACK_NOTE)
                if any(NOISE_MARK in str(v) for row in rows for v in row[2:]):
                    say(NOISE_NOTE)
                view_tables(session, view, model_id, view_fields or metrics, console, say,
                            every=args.view_rows)
            for line in undefined_lines(view, metrics,
                                        leave_out=told_by_summary(session, summaries)):
                say(line)
            for record in summaries:
                if record["layers"]:  # alpha was asked for
                    say("")
                    for line in wrapped(summary_lines(record),
                                        console.width if console is not None else None):
                        say(line)
        written = []
        if args.out or not to_terminal:
            written = write_outputs(view, _union(metrics, view_fields), args.format, args.out,
                                    summaries)
        if args.plot:
            from diffract_report.viz import plot_model

            with ProgressBar(interactive) as bar:
                for number, model_id in enumerate(model_ids, start=1):
                    written += plot_model(view, model_id, args.plot, lambda done, total, n=(
                        number, model_id): bar(SimpleNamespace(
                            step=n[0], steps=len(model_ids), kernel=f"ESD plots of {n[1]}",
                            done=done, total=total)))
        if getattr(args, "schedule", None):
            written += _write_schedules(view, model_ids, args)
        if args.report:
            from diffract_report.report import write_html

            written.append(write_html(view, args.report, metrics=metrics,
                                      view_metrics=view_fields or None,
                                      seconds=time.perf_counter() - started,
                                      command=" ".join(["diffract", *sys.argv[1:]])))
        tell = say if to_terminal else (lambda s: print(printable(s, "\n"), file=sys.stderr))
        for path in written:
            tell(f"wrote {path}")
        if tell_failures(reports, tell):
            return EXIT_FAILED
        tell(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


def _union(first: list[str], second: list[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _write_schedules(view: object, model_ids: list[str], args: argparse.Namespace) -> list:
    """One JSON file of sparsity ratios per model (see diffract_kernels_spectral.schedule)."""
    import json
    from pathlib import Path

    from diffract.errors import InvalidArgumentError, install_hint

    try:
        from diffract_kernels_spectral import sparsity_schedule
    except ImportError:
        raise UsageError("--schedule comes with the spectral pack: "
                         f"{install_hint('diffractml-kernels-spectral')}.") from None

    written = []
    for model_id in model_ids:
        try:
            ratios = sparsity_schedule(
                view, args.schedule, args.sparsity, metric=args.schedule_metric,
                epsilon=args.epsilon, by=args.schedule_by, model_id=model_id)
        except InvalidArgumentError as exc:
            raise UsageError(str(exc)) from None
        name = args.schedule_file or ("sparsity.json" if len(model_ids) == 1
                                      else f"sparsity-{model_id}.json")
        if args.schedule_file and len(model_ids) > 1:
            path = Path(name)
            name = f"{path.stem}-{model_id}{path.suffix or '.json'}"
        path = Path(args.out) / name if args.out and not Path(name).is_absolute() else Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ratios, indent=1) + "\n")
        written.append(path)
    return written


def command_entry(command: str, run: Callable[..., int]) -> Callable[..., int]:
    """The entry of one command: its usage errors are one line on stderr, exit 2 (other
    Diffract errors are handled the same way by diffract.cli.main). What it says goes out
    with the characters that drive a terminal (ESC, CR, BEL, bidi overrides...) escaped;
    names in tables are escaped whole (a newline too)."""

    def say(text: str) -> None:
        print(printable(text, keep="\n"))

    def entry(args: argparse.Namespace) -> int:
        try:
            return run(args, say=say)
        except UsageError as exc:
            print(f"diffract {command}: error: " + printable(str(exc), keep="\n"),
                  file=sys.stderr)
            return EXIT_USAGE

    return entry


main_analyze = command_entry("analyze", analyze)
