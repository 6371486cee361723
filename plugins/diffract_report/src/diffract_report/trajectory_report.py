"""The report of a tracked training run: every metric over the steps.

Per metric a layers x steps heat map and its mean by layer type per step; the alignment
of each checkpoint with its predecessor and with the first (mean over the layers); the
movers (per interval, the layer whose metric changed most); the sudden changes (beyond
k median absolute deviations of that layer's own history); head views as heads x steps
when the run was tracked with ``--views heads``. The latest checkpoint gets the full
per-layer sections of :func:`diffract_report.report.write_html`, of which this is a part.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffract_report._html import BLUE, GREEN, ORANGE, RED, _chart, _esc, _num, html_table
from diffract_report.sudden import sudden

__all__ = ["track_sections", "write_track_report"]

_COLOURS = (BLUE, ORANGE, GREEN, RED, "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def _heat(frame: Any, title: str, axis: str = "step") -> str:
    columns = [str(c) for c in frame.columns]
    return _chart({"w": 1040, "h": int(min(1400, 90 + 14 * len(columns))), "panels": [{
        "title": title, "xlabel": axis, "heat": {
            "rows": columns, "cols": [str(s) for s in frame.index], "axis": axis,
            "z": [_num(frame[c].to_numpy(dtype=float)) for c in frame.columns]}}]})


def _lines(frame: Any, title: str, ylabel: str) -> str:
    steps = [float(s) for s in frame.index]
    series = [{"kind": "line", "marks": True, "x": steps, "y": _num(frame[c].to_numpy(float)),
               "color": _COLOURS[i % len(_COLOURS)], "label": str(c)}
              for i, c in enumerate(frame.columns)]
    return _chart({"w": 820, "h": 300, "panels": [{"title": title, "xlabel": "step",
                                                   "ylabel": ylabel, "series": series}]})


def _alignment(session: Any, field: str) -> dict[str, list[tuple[float, float]]]:
    """'previous' and 'first': (step, mean of ``field`` over the layers) per checkpoint."""
    steps = {m: s.get("step") for m, s in session.models.steps().items()}
    ids = session.models.ordered()
    if len(ids) < 2:
        return {}
    curves: dict[str, list[tuple[float, float]]] = {"previous": [], "first": []}
    records = session.results.export_aggregates(field, export_format="list")
    by_pair: dict[str, list[float]] = {}
    for r in records:
        if r["param"] is not None and np.ndim(r["value"]) == 0 and "[" not in r["param"]:
            by_pair.setdefault(r["models"], []).append(float(r["value"]))
    for i, model_id in enumerate(ids[1:], start=1):
        for kind, other in (("previous", ids[i - 1]), ("first", ids[0])):
            values = by_pair.get(f"{other},{model_id}")
            if values and (kind == "previous" or i > 1):
                curves[kind].append((float(steps[model_id]), float(np.mean(values))))
    return {k: v for k, v in curves.items() if v}


def _head_sections(session: Any, view_fields: Sequence[str]) -> list[str]:
    """With head views: per attention matrix, a heads x steps heat map of how much each
    head moved since the previous checkpoint (1 - the smaller of its output and input
    subspace overlaps, views.rank_heads) and of the first
    view metric; then the heads that moved most, ranked."""
    from diffract_report.views import head_moves

    moves = head_moves(session)
    field = next(iter(view_fields), None)
    frame = session.results.trajectory(field, by="view") if field else None
    if not moves and (frame is None or frame.empty):
        return []
    parts = ["<h3 id='heads'>Heads across the run</h3><div class=charts>"]
    grids: dict[str, dict[str, dict[Any, float]]] = {}
    for r in moves:
        parent, head = r["head"].rsplit("[", 1)
        grids.setdefault(parent, {}).setdefault(head.rstrip("]"), {})[r["step"]] = r["change"]
    for parent, heads in grids.items():
        labels = sorted(heads, key=_head_number)
        steps = sorted({s for h in heads.values() for s in h})
        parts.append(_chart({"w": 1040, "h": int(min(900, 90 + 14 * len(labels))), "panels": [{
            "title": f"{parent}: change (1 - min(l, r) subspace overlap) since the "
                     "previous checkpoint",
            "xlabel": "step", "heat": {"rows": labels, "cols": [str(s) for s in steps],
                                       "axis": "step",
                                       "z": [_num([heads[h].get(s, np.nan) for s in steps])
                                             for h in labels]}}]}))
    if frame is not None and not frame.empty and not frame.isna().all().all():
        for parent in dict.fromkeys(str(c).rsplit("[", 1)[0] for c in frame.columns):
            part = frame[[c for c in frame.columns if str(c).startswith(parent + "[")]]
            parts.append(_heat(part, f"{parent}: {field} per head and step"))
    parts.append("</div>")
    if moves:
        parts.append("<h4>Heads that moved most between consecutive checkpoints</h4>"
                     "<div class=scroll>" + html_table(
                         ["step", "from step", "head", "change (1 - min(l, r))"],
                         [[r["step"], r["from_step"], r["head"], r["change"]]
                          for r in moves[:50]], table_id="head-moves") + "</div>")
    return parts


def _head_number(label: str) -> tuple[int, str]:
    digits = "".join(ch for ch in label if ch.isdigit())
    return (int(digits) if digits else -1, label)


def track_sections(session: Any, metrics: Sequence[str], k: float,
                   view_fields: Sequence[str] = ()) -> list[str]:
    """The run's sections (HTML fragments with their ``<h2>``)."""
    parts = ["<h2 id='training-run'>Training run</h2>"]
    ids = session.models.ordered()
    steps = session.models.steps()
    parts.append(f"<p>{len(ids)} checkpoints, steps "
                 f"{_esc(', '.join(str(steps[m].get('step')) for m in ids))}.</p>")
    movers_rows: list[list[Any]] = []
    flagged_rows: list[list[Any]] = []
    for field in metrics:
        if field == "warning":
            continue
        frame = session.results.trajectory(field)
        if frame.empty or len(frame) < 2 or frame.isna().all().all():
            continue
        parts.append(f"<h3>{_esc(field)}</h3><div class=charts>")
        parts.append(_heat(frame, f"{field} per layer and step"))
        by_type = session.results.trajectory(field, by="ptype")
        parts.append(_lines(by_type, f"{field} by layer type (mean)", field) + "</div>")
        diffs = frame.diff().iloc[1:]
        for step, row in diffs.iterrows():
            if row.notna().any() and row.abs().max() > 0:  # an interval where none moved
                layer = row.abs().idxmax()  # has no mover (the terminal says "no change")
                movers_rows.append([field, step, layer, float(row[layer])])
        flagged_rows += [[field, step, layer, change, size]
                         for step, layer, change, size in sudden(frame, k)]
        views = session.results.trajectory(field, by="view")
        if not views.empty and not views.isna().all().all():
            parts.append(_heat(views, f"{field} per view and step"))
    curves = _alignment(session, "l_subspace_overlap")
    if curves:  # the first curve broad and pale, the second dashed on top: both show
        looks = ({"color": BLUE, "width": 4.5, "opacity": 0.45},  # where they coincide
                 {"color": ORANGE, "dash": "6,4"})
        series = [{"kind": "line", "marks": True, "x": [s for s, _ in pts],
                   "y": _num([v for _, v in pts]), **look,
                   "label": f"with the {kind} checkpoint"}
                  for (kind, pts), look in zip(curves.items(), looks, strict=False)]
        parts.append("<h3>Alignment</h3>" + _chart({"w": 820, "h": 300, "panels": [{
            "title": "l_subspace_overlap, mean over the layers", "xlabel": "step",
            "ylabel": "overlap", "ybound": [0, 1], "series": series}]}))
    if flagged_rows:
        votes: dict[tuple[Any, str], int] = {}
        for _, step, layer, _, _ in flagged_rows:
            votes[(step, layer)] = votes.get((step, layer), 0) + 1
        flagged_rows.sort(key=lambda r: (-votes[(r[1], r[2])], str(r[1]), r[2], -r[4]))
        parts.append(f"<h3 id='sudden-changes'>Sudden changes (beyond {k:g} median "
                     "absolute deviations of the layer's own history; the step and layer "
                     "most metrics flag first)</h3>")
        parts.append(html_table(["metric", "step", "layer", "change", "MADs"], flagged_rows,
                                table_id="sudden", flagged=[True] * len(flagged_rows)))
    parts += _head_sections(session, view_fields)
    if movers_rows:
        parts.append("<h3>Movers: per interval, the layer that changed most</h3>"
                     "<div class=scroll>" + html_table(
                         ["metric", "step", "layer", "change"], movers_rows,
                         table_id="movers") + "</div>")
    return parts


def write_track_report(session: Any, path: str | Path, metrics: Sequence[str],
                       k: float = 10.0, view_fields: Sequence[str] = ()) -> Path:
    """The report of a tracked run: its sections, then the latest checkpoint in full
    (``view_fields``: the metrics computed on the views, drawn per head)."""
    from diffract_report._html import write_html

    ids = session.models.ordered()
    return write_html(session, path, metrics=list(metrics), detail=ids[-1:],
                      lead=track_sections(session, metrics, k, view_fields),
                      command="diffract track", view_metrics=list(view_fields) or None)

