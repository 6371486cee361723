"""The command line's output: progress, terminal tables, files, failures grouped.

Terminal niceties (rich tables and progress bars) are imported only when they are shown.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import printable
from diffract_report._inputs import UsageError
from diffract_report.summary import NOISE_MARK, NOISE_WHY, format_table, format_value


# -- progress ----------------------------------------------------------------------------
class ProgressBar:
    """A rich progress bar per step that runs longer than a second, advancing per
    committed chunk (chunks of at most ~0.5 s here, so per parameter for costly
    kernels). Nothing at all when quiet or not on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._tasks: dict[tuple[int, str], Any] = {}
        self._step_started: dict[tuple[int, str], float] = {}
        self._last = time.perf_counter()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, event: Any) -> None:
        if not self.enabled:
            return
        key = (event.step, event.kernel)
        now = time.perf_counter()
        started = self._step_started.setdefault(key, self._last)
        self._last = now
        if key not in self._tasks:
            if event.done >= event.total or now - started < 1.0:
                return
            bar = self._ensure()
            self._tasks[key] = bar.add_task(
                f"[{event.step}/{event.steps}] {event.kernel}", total=event.total,
                completed=event.done)
        self._bar.update(self._tasks[key], completed=event.done)

    def _ensure(self) -> Any:
        if self._bar is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                ProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.text import Text

            class Rate(ProgressColumn):
                def render(self, task: Any) -> Text:
                    speed = task.finished_speed or task.speed
                    return Text(" " * 8 if speed is None else f"{speed:>6.1f}/s")

            self._bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                redirect_stdout=False, redirect_stderr=False,
            )
            self._bar.start()
        return self._bar


# -- output ------------------------------------------------------------------------------
#: What marks a pl_alpha the powerlaw library's bound constrained, and the note it gets.
BOUNDED_MARK = "*"
BOUNDED_NOTE = ("* pl_alpha where the powerlaw library's fit (fit_method='powerlaw') left "
                "out a better xmin because its exponent is above 3, the most the library "
                "searches: not the CSN fit (fit_method='auto' fits without that bound)")


def bounded(view: Any, model_id: str) -> set[str]:
    """The parameters whose pl_alpha the powerlaw library's bound constrained."""
    if "pl_bounded" not in view.compute.list_available_metrics():
        return set()
    rows = view.results.export_metrics("pl_bounded").get(model_id, {})
    return {name for name, row in rows.items() if row.get("pl_bounded") == 1}


def noise_like(view: Any, model_id: str) -> set[str]:
    """The parameters whose spectrum has no eigenvalue beyond its Marchenko-Pastur bulk
    (num_spikes 0, where stored): consistent with noise (summary.NOISE_WHY)."""
    if "num_spikes" not in view.compute.list_available_metrics():
        return set()
    rows = view.results.export_metrics("num_spikes").get(model_id, {})
    return {name for name, row in rows.items() if row.get("num_spikes") == 0}


def _marked(metric: str, value: Any, flagged: bool, noise: bool = False) -> Any:
    """``value`` with NOISE_MARK when it is a pl_alpha of a noise-like spectrum and
    BOUNDED_MARK when the library's bound constrained it."""
    if metric not in ("pl_alpha", "alpha") or not (flagged or noise) or not (
            isinstance(value, (int, float)) and math.isfinite(value)):
        return value
    return (f"{format_value(value)}{NOISE_MARK if noise else ''}"
            f"{BOUNDED_MARK if flagged else ''}")


NOISE_NOTE = f"{NOISE_MARK} pl_alpha of a spectrum consistent with noise: {NOISE_WHY}"

#: What marks a stack's value (packed experts): the median over its views, and the note.
STACK_MARK = "~"
STACK_NOTE = ("~ the median over the tensor's experts (a stack of matrices has no spectrum "
              "of its own; the table below gives each stack's range, --format csv every "
              "expert)")


def table_rows(session: Any, view: Any, model_id: str, metrics: Sequence[str],
               include_1d: bool) -> list[list[Any]]:
    """Rows of (parameter, shape, metric values) in the view, 1-D parameters only when
    asked; parameter views are summarised apart (see :func:`view_tables`). A pl_alpha
    the powerlaw library's bound constrained carries BOUNDED_MARK; a stack of experts,
    which has no value of its own, shows the median over its views with STACK_MARK."""
    values = view.results.export_metrics(*metrics)[model_id]
    params = {p.name: p for p in session.models.params(model_id)}
    flagged = bounded(view, model_id)
    noise = noise_like(view, model_id)
    children: dict[str, list[str]] = {}
    for p in params.values():
        if p.parent is not None and len(params[p.parent].shape) >= 3:
            children.setdefault(p.parent, []).append(p.name)
    rows = []
    names = [n for n in params if n in values or n in children]  # a stack has no values
    for name in names:
        row = values.get(name, {})
        shape = params[name].shape if name in params else ()
        if (len(shape) < 2 and not include_1d) or (name in params and params[name].parent):
            continue
        cells = ["" if m == "warning" and not isinstance(row.get(m), str)
                 else _marked(m, row.get(m), name in flagged, name in noise)
                 for m in metrics]  # no warning applies: an empty cell, as WeightWatcher's
        for i, m in enumerate(metrics):
            if name in children and row.get(m) is None:
                stack = [values.get(c, {}).get(m) for c in children[name]]
                numbers = [v for v in stack if isinstance(v, (int, float)) and math.isfinite(v)]
                cells[i] = (f"{format_value(float(np.median(numbers)))}{STACK_MARK}"
                            if numbers else "")
        rows.append([name, "x".join(map(str, shape)), *cells])
    return rows


def view_tables(session: Any, view: Any, model_id: str, metrics: Sequence[str],
                console: Any | None, say: Callable[[str], None], every: bool = False) -> None:
    """When the model has views: what each rule split, then per parameter with views
    each scalar metric's median and range over its views, the views at the ends named
    (``every``: each view's row too; the export formats list every view), and why the
    values left undefined are undefined (reasons grouped)."""
    from diffract_report.views import split_lines, undefined_reasons, view_params, view_summary

    lines = split_lines(session, model_id)
    if not lines:
        return
    for line in lines:
        say(line)
    fields = [m for m in metrics if m not in ("warning", "esd")]
    summaries = {f: view_summary(view, model_id, f) for f in fields}
    if not any(summaries.values()):
        return
    first = next(iter(summaries.values()))
    rows = [[r["parameter"], r["views"]] for r in first]
    constrained = bounded(view, model_id)  # once: it exports every parameter's flag
    flagged = {p.parent for p in session.models.params(model_id) if p.name in constrained}
    for field in fields:
        for row, r in zip(rows, summaries[field], strict=True):
            cell = (f"{format_value(r['median'])} [{format_value(r['min'])} {r['min_view']}, "
                    f"{format_value(r['max'])} {r['max_view']}]" if r["defined"] else
                    "undefined")
            row.append(_marked(field, cell, r["parameter"] in flagged))
    print_table(f"{model_id}: median [min <view>, max <view>] over each parameter's views",
                ["parameter", "views", *fields], rows, console, keys=2)
    if every:
        table = view.results.export_metrics(*fields).get(model_id, {})
        listed = [[p.name, *(table.get(p.name, {}).get(f) for f in fields)]
                  for p in view_params(view, model_id) if p.parent is not None]
        print_table(f"{model_id}: every view", ["view", *fields], listed, console, keys=1)
    if any(str(v).endswith(BOUNDED_MARK) for row in rows for v in row[2:]):
        say(BOUNDED_NOTE.replace("pl_alpha where", "pl_alpha of a parameter some of whose "
                                 "views are fits where"))
    for field in fields:
        reasons = undefined_reasons(view, model_id, field)
        if reasons:
            total = sum(n for n, _ in reasons)
            say(f"{model_id}: {field} undefined on {total} view(s):")
            for count, reason in reasons[:5]:
                say(f"  {count} x {reason}")


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]],
                console: Any | None, keys: int = 2) -> None:
    """A table whose first ``keys`` columns name the row; on a terminal (``console``) the
    value columns come in groups that fit its width, each group with the key columns
    again, so nothing is squeezed into ellipses or dropped."""
    title = printable(title)  # names escaped whole: ESC, CR, a newline cannot drive a row
    cells = [[printable(format_value(v)) for v in r] for r in rows]
    if console is None:
        print(title)
        print(format_table(list(header), cells))
        return
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    heads = list(header)

    def width(i: int) -> int:
        return max([len(x) for x in heads[i].splitlines()] + [len(r[i]) for r in cells]) + 3

    if sum(width(i) for i in range(len(heads))) > console.width:  # break long names at "_"
        heads = [h.replace("_", "_\n", 1) if i >= keys and len(h) > 7 else h
                 for i, h in enumerate(header)]

    fixed = sum(width(i) for i in range(keys))
    groups: list[list[int]] = [[]]
    used = fixed
    for i in range(keys, len(header)):
        if groups[-1] and used + width(i) > console.width:
            groups.append([])
            used = fixed
        groups[-1].append(i)
        used += width(i)
    for n, group in enumerate(groups):
        table = Table(title=escape(title) if n == 0 else None, title_justify="left",
                      header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for i in range(keys):
            table.add_column(heads[i], no_wrap=True, overflow="fold")
        for i in group:
            table.add_column(heads[i], justify="right", no_wrap=True)
        for r in cells:  # [text] in a name is no markup
            table.add_row(*map(escape, r[:keys]), *(escape(r[i]) for i in group))
        console.print(table)


def wrapped(lines: Sequence[str], width: int | None) -> list[str]:
    """Lines wrapped at ``width`` between words (continuations indented under their
    line's text); as they are when ``width`` is None (not a terminal)."""
    if width is None:
        return list(lines)
    import textwrap

    out = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(line, width, subsequent_indent=indent + "  ",
                             break_long_words=False, break_on_hyphens=False) or [""]
    return out


def terminal_console() -> Any | None:
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def write_outputs(view: Any, metrics: Sequence[str], fmt: str, out: str | None,
                  summaries: list[dict[str, Any]]) -> list[Path]:
    """The metrics table in ``fmt`` (csv/json/parquet) and summary.json under ``out``;
    without ``out``, csv/json go to standard output."""
    written: list[Path] = []
    if out is None:
        if fmt == "parquet":
            raise UsageError("--format parquet writes a file: give --out DIR.")
        sys.stdout.write(view.results.export_metrics(*metrics, export_format=fmt))
        return written
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        frame = view.results.export_metrics(*metrics, export_format="pandas")
        try:
            frame.to_parquet(folder / "metrics.parquet")
        except ImportError:
            raise UsageError("--format parquet needs pyarrow: pip install pyarrow "
                             "(or use --format csv).") from None
        written.append(folder / "metrics.parquet")
    else:
        ext = "csv" if fmt == "table" else fmt
        written.append(view.results.export_metrics(*metrics, export_format=ext,
                                                   path=folder / f"metrics.{ext}"))
    from diffract.results import plain_value

    (folder / "summary.json").write_text(json.dumps(plain_value(summaries), indent=1,
                                                    allow_nan=False))
    written.append(folder / "summary.json")
    return written


@contextlib.contextmanager
def outcomes_reported_by_us() -> Iterator[None]:
    """Silence apply's warnings about failed units and undefined values: the command
    reports both itself, grouped."""
    import warnings

    from diffract.errors import FailedUnitsWarning, UndefinedValuesWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedValuesWarning)
        warnings.simplefilter("ignore", FailedUnitsWarning)
        yield


def run_apply(view: Any, metrics: Sequence[str], bar: ProgressBar) -> Any:
    with outcomes_reported_by_us():
        return view.compute.apply(*metrics, errors="record", progress=bar)


_DOWNSTREAM = re.compile(r"^input '[^']+' is missing because '[^']+' failed on ")


def tell_failures(reports: Sequence[Any], tell: Callable[[str], None]) -> bool:
    """The failed units of one or more apply reports, grouped by reason, root causes
    first; units that failed only because an input failed upstream are counted under
    their kernel, not repeated. Returns whether any unit failed (nothing is told then)."""
    failed: dict[tuple[str, str, str], list[str]] = {}
    for report in reports:
        for key, units in report.reasons("failed").items():
            failed.setdefault(key, []).extend(units)
    if not failed:
        return False
    roots = {k: u for k, u in failed.items() if not _DOWNSTREAM.match(k[2])}
    downstream: dict[str, int] = {}
    for (_, kernel, reason), units in failed.items():
        if _DOWNSTREAM.match(reason):
            downstream[kernel] = downstream.get(kernel, 0) + len(units)
    total = sum(len(u) for u in roots.values())
    tell(f"\n{total} parameter(s) failed:")
    for (_, kernel, reason), units in sorted(roots.items(), key=lambda kv: -len(kv[1])):
        more = f" and {len(units) - 1} more" if len(units) > 1 else ""
        tell(f"  {kernel} on {printable(units[0])}{more}: {reason}")
    if downstream:
        tell("  and, because of them: " + ", ".join(f"{k} on {n}" for k, n in downstream.items()))
    return True
