"""``diffract compare``: how each layer moved between checkpoints (alignment pack)."""

from __future__ import annotations

import argparse
import html
import itertools
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diffract.errors import printable
from diffract_report._inputs import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
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
    outcomes_reported_by_us,
    print_table,
    tell_failures,
    terminal_console,
)
from diffract_report.analyze import command_entry
from diffract_report.summary import dequantized_line, stored_as, undefined_lines

#: Pairwise fields shown by default: direction agreement, subspace overlap, spectrum change.
DEFAULT_COMPARE = ("avg_max_l_agreement", "l_subspace_overlap", "sval_rel_change",
                   "weights_rel_change")
#: What views (heads) are ranked by: 1 - the overlap of their top singular subspaces, on
#: the side (output, input) that moved most (diffract_report.views.rank_heads).
RANK_BY = ("l_subspace_overlap", "r_subspace_overlap")
#: Heads shown at each end of the ranking in the terminal (CSV and report hold all).
SHOWN = 10


def configure_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="two or more checkpoints, in order (files, directories, "
                        "module:factory)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--to-first", dest="pairs", action="store_const", const="first",
                      help="compare each checkpoint with the first (a base and its "
                           "fine-tunes)")
    mode.add_argument("--pairs", dest="pairs", action="store_const", const="all",
                      help="compare every pair")
    p.set_defaults(pairs="consecutive")
    p.add_argument("--metrics", metavar="a,b,...",
                   help=f"pairwise fields (default: {','.join(DEFAULT_COMPARE)})")
    p.add_argument("--tables", choices=("matrices", "all", "none"), default=None,
                   help="the per-layer tables in the terminal: the matrices' (default), "
                        "every parameter's (biases and norms too), or none (the default "
                        "with --views, whose head ranking comes first); CSV and the report "
                        "hold every parameter")
    add_session_arguments(p)


def compare(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    from diffract_report.report import pair_matrix

    started = time.perf_counter()
    if len(args.paths) < 2:
        raise UsageError("compare needs at least two checkpoints.")
    defaults = (*DEFAULT_COMPARE, *(("intruder_dimensions",) if args.views else ()))
    metrics = [m.strip() for m in (args.metrics or ",".join(defaults)).split(",")
               if m.strip()]
    if args.views:  # the ranking of views reads both sides
        metrics += [side for side in RANK_BY if side not in metrics]
    inputs = model_inputs(args.paths)
    session = open_session(args)
    with session:
        check_metrics(session, metrics)
        levels = {r["field"]: r["apply_level"]
                  for r in session.compute.list_available_metrics(True)}
        single = [m for m in metrics if levels.get(m) != "CROSS_MODEL"]
        if single:
            raise UsageError(f"{', '.join(single)}: not pairwise (CROSS_MODEL) fields; "
                             "compare takes fields that compare two checkpoints (use "
                             "`diffract analyze` for the others).")
        apply_settings(session, args.settings, args.conventions)
        model_ids = add_inputs(session, inputs, args)
        _refuse_disjoint(session, model_ids)
        view = scope(session, model_ids, args)
        interactive = sys.stderr.isatty() and not args.quiet
        try:
            with ProgressBar(interactive) as bar, outcomes_reported_by_us():
                # the per-checkpoint inputs (SVDs) once for all, with one bar
                needs = sorted({f for m in metrics for f in _inputs_of(session, m)})
                reports = [view.compute.apply(*needs, errors="record", progress=bar)] if needs \
                    else []
                by_pair = view.compute.apply_pairs(*metrics, pairs=args.pairs,
                                                   errors="record")
                reports += by_pair.values()
        except KeyboardInterrupt:
            print("diffract compare: interrupted; rerun with --store PATH to resume.",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
        console = terminal_console() if sys.stdout.isatty() and args.format == "table" else None
        tell = say if args.format == "table" else (
            lambda s: print(printable(s, "\n"), file=sys.stderr))
        stored = {m: stored_as(session, m) for m in model_ids}
        said = [f"{m}: {dequantized_line(Counter(how.values()))}"
                for m, how in stored.items() if how]
        for line in said:  # before any number: the values are of dequantized weights
            tell(line)
        sections = [f"<p class='note'>{html.escape(line)}</p>" for line in said]
        written: list[Path] = []
        views = {p.name for m in model_ids for p in session.models.params(m) if p.parent}
        if views:  # the head ranking first: what --views heads is asked for
            written += _ranked_views(view, list(by_pair), metrics, args, console, say, sections)
        shown = args.tables or ("none" if views else "matrices")
        matrices = {p.name for m in model_ids for p in session.models.params(m)
                    if p.parent is None and len(p.shape) >= 2}
        for field in metrics:
            layers, pairs, matrix = pair_matrix(view, field)
            keep = [i for i, layer in enumerate(layers) if layer not in views]
            layers, matrix = [layers[i] for i in keep], matrix[keep]
            if args.format == "table" and shown != "none":
                rows = [[layer, *matrix[i]] for i, layer in enumerate(layers)
                        if shown == "all" or layer in matrices]
                print_table(f"{field} (layer x pair)", ["parameter", *pairs], rows, console,
                            keys=1)
            if args.plot or args.report:
                from diffract_report import viz

                fig = viz.heatmap_figure(matrix, layers, pairs, field)
                if args.plot:
                    written.append(viz.save_png(fig, Path(args.plot) / f"compare_{field}.png"))
                if args.report:
                    from diffract_report.report import figure_html, html_table

                    sections.append(f"<h2>{field}</h2>" + figure_html(fig) + html_table(
                        ["parameter", *pairs], [[layer, *matrix[i]]
                                                for i, layer in enumerate(layers)],
                        table_id=f"compare-{field}"))
        if args.format == "table":  # the report tells them under its own heading
            for line in undefined_lines(view, metrics, kinds=("undefined", "skipped")):
                tell(line)
        if args.out or args.format != "table":
            fmt = "csv" if args.format == "table" else args.format
            if args.out is None:
                sys.stdout.write(_export(view, metrics, fmt, None, stored))
            else:
                folder = Path(args.out)
                folder.mkdir(parents=True, exist_ok=True)
                if fmt == "parquet":
                    raise UsageError("compare writes csv or json; --format parquet is for "
                                     "analyze.")
                written.append(_export(view, metrics, fmt, folder / f"compare.{fmt}", stored))
        if args.format == "table" and shown == "none" and views:
            tell("per-layer tables: --tables matrices (or all); every parameter's values: "
                 "--out FOLDER or --report FILE")
        if args.report:
            from diffract_report.report import write_html

            written.append(write_html(view, args.report, metrics=[], sections=sections,
                                      explain=metrics,
                                      seconds=time.perf_counter() - started,
                                      command=" ".join(["diffract", *sys.argv[1:]])))
        for path in written:
            tell(f"wrote {path}")
        if tell_failures(reports, tell):
            return EXIT_FAILED
        tell(f"done in {time.perf_counter() - started:.1f} s")
    return EXIT_OK


def _ranked_views(view: Any, pairs: Sequence[tuple[str, str]], metrics: Sequence[str],
                  args: argparse.Namespace, console: Any, say: Callable[[str], None],
                  sections: list[str]) -> list[Path]:
    """Per compared pair, the head views ranked by change (1 - the smaller of their
    output and input subspace overlaps), both sides shown, most and least changed in the
    terminal, all of them in heads.csv (--out) and the report."""
    import csv

    from diffract_report.views import rank_heads

    written: list[Path] = []
    fields = [m for m in metrics if m not in RANK_BY]
    header = ["head", "change (1 - min(l, r))", *RANK_BY, *fields]
    every = []
    for a, b in pairs:
        ranked = rank_heads(view, (a, b), fields, by=RANK_BY)
        if not ranked:
            continue
        rows = [[r["head"], r["change"], *(r.get(s) for s in RANK_BY),
                 *(r.get(f) for f in fields)] for r in ranked]
        every += [[f"{a} -> {b}", *row] for row in rows]
        if args.format == "table":
            shown = rows if len(rows) <= 2 * SHOWN else rows[:SHOWN] + rows[-SHOWN:]
            title = (f"heads ranked by change, {a} -> {b}" + (
                f" ({SHOWN} most and {SHOWN} least changed of {len(rows)})"
                if len(rows) > 2 * SHOWN else ""))
            print_table(title, header, shown, console, keys=1)
        if args.report:
            from diffract_report.report import html_table

            sections.append(f"<h2>Heads ranked by change, {a} &rarr; {b}</h2>"
                            + html_table(header, rows, table_id=f"heads-{a}-{b}"))
    if args.out and every:
        path = Path(args.out) / "heads.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows([["pair", *header], *every])
        written.append(path)
    return written


def _export(view: Any, metrics: Sequence[str], fmt: str, path: Path | None,
            stored: dict[str, dict[str, str]]) -> Any:
    """The pairwise values as export_aggregates tabulates them, with a ``dequantized``
    column: for each row's models whose parameter was dequantized on read, ``model:
    how it was stored`` (``meta.quant``), empty where none was."""
    from diffract.exports import emit

    records = view.results.export_aggregates(*metrics, export_format="list")
    for r in records:
        r["dequantized"] = "; ".join(
            f"{m}: {stored[m][r['param']]}" for m in (r["models"] or "").split(",")
            if r["param"] in stored.get(m, {}))
    columns = ["name", "field", "models", "param", "value", "dequantized"]
    return emit(records, columns, fmt, path)


def _refuse_disjoint(session: Any, model_ids: Sequence[str]) -> None:
    """A usage error when two checkpoints to compare share no parameter name (nothing
    could be compared: different architectures, or names that differ by a prefix)."""
    names = {m: {p.name for p in session.models.params(m)} for m in model_ids}
    for first, other in itertools.combinations(model_ids, 2):
        if not names[first] & names[other]:
            a, b = sorted(names[first])[:3], sorted(names[other])[:3]
            raise UsageError(
                f"{first!r} and {other!r} share no parameter name, so there is nothing to "
                f"compare ({first}: {', '.join(a)}...; {other}: {', '.join(b)}...). Compare "
                "checkpoints of one architecture; a prefix that differs (model. / module.) "
                "can be renamed with models.add(..., parameter_overrides=...).")


def _inputs_of(session: Any, field: str) -> list[str]:
    """The per-parameter fields a pairwise field is computed from (their producers run
    on each checkpoint once, before the pairs)."""
    producer = {f: k for k in session.compute.list_available_kernels(True)
                for f in k["produce_fields"]}
    out: list[str] = []
    todo = [field]
    while todo:
        for f in producer[todo.pop()]["require_fields"]:
            if f not in producer:
                continue  # weights, shape: the model's own
            (out if producer[f]["apply_level"] == "PARAMETER" else todo).append(f)
    return out


main_compare = command_entry("compare", compare)
