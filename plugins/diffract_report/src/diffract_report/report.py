"""Readings of a session's results a person looks at: per-model summaries (the
WeightWatcher-style reading of alpha) and a one-file HTML report.

``summarize(session)`` is what ``diffract analyze`` prints under its table;
``write_html(session, path)`` is what ``--report`` writes. Both only read results: run
``compute.apply`` first.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ALPHA_OVER_TRAINED", "ALPHA_UNDER_TRAINED", "conventions_line", "format_table",
           "format_value", "pair_matrix", "summarize", "write_html"]

#: WeightWatcher's reading of a layer's power-law exponent: below 2 the layer is likely
#: over-trained (over-fit to its data), above 6 under-trained; 2-6 is the well-trained band.
ALPHA_OVER_TRAINED = 2.0
ALPHA_UNDER_TRAINED = 6.0


def _number(value: Any) -> float | None:
    if value is None or np.ndim(value) != 0:
        return None
    return float(value)


def _reason_key(reason: str) -> str:
    """A reason without its numbers, so that 'weights hold 3 NaN' and 'weights hold 5
    NaN' count as one kind of trouble."""
    out, digits = [], False
    for ch in reason:
        if ch.isdigit():
            if not digits:
                out.append("N")
            digits = True
        else:
            digits = False
            out.append(ch)
    return "".join(out)


def summarize(
    session: Any,
    model_ids: Iterable[str] | None = None,
    *,
    alpha: str = "pl_alpha",
    weighted: str = "alpha_weighted",
) -> list[dict[str, Any]]:
    """One record per model: ``layers`` where ``alpha`` was computed or attempted
    (stored, or failed), its mean and median over the layers where it is defined, the
    mean of ``weighted``, the share of layers with alpha below 2 (likely over-trained)
    and above 6 (likely under-trained), the layers where it is ``undefined`` (stored as
    NaN) or ``failed``, and their reasons grouped (``undefined_reasons``: reason ->
    count; reasons that differ only in their numbers are one group, shown by its first
    reason), and ``conventions``: the presets in effect (``configure_conventions``),
    comma-separated, or ``"custom"`` when the configuration matches none.

    Works in a view (``session.filter(...)``) on the parameters in scope. Fields that
    are not stored give None, not an error.
    """
    results = session.results
    in_scope = list(session.model_ids)
    ids = list(model_ids) if model_ids is not None else in_scope
    known = set(session.compute.list_available_metrics())
    fields = [f for f in (alpha, weighted) if f in known]
    table = results.export_metrics(*fields) if fields else {}
    notes = [n for n in results.export_notes() if n["kind"] in ("undefined", "failed")]
    producer = None
    if alpha in known:
        producer = next((r["kernel"] for r in session.compute.list_available_metrics(True)
                         if r["field"] == alpha), None)
    presets = session.compute.list_conventions()
    effect = session.compute.conventions_in_effect()
    conventions = ", ".join(effect) if effect else ("custom" if presets else "")
    out = []
    for model_id in ids:
        if model_id not in in_scope:
            continue
        rows = table.get(model_id, {})
        alphas = [_number(r.get(alpha)) for r in rows.values() if alpha in r]
        defined = np.array([a for a in alphas if a is not None and math.isfinite(a)])
        weights = [_number(r.get(weighted)) for r in rows.values() if weighted in r]
        weights_ok = [w for w in weights if w is not None and math.isfinite(w)]
        prefix = f"{model_id}/"
        reasons: Counter[str] = Counter()
        shown: dict[str, str] = {}  # group -> its first reason, numbers kept
        failed = 0
        for n in notes:
            if n["kernel"] != producer or not n["unit"].startswith(prefix):
                continue
            if n["kind"] == "failed":
                failed += 1
            group = _reason_key(n["reason"])
            shown.setdefault(group, n["reason"])
            reasons[group] += 1
        count = len(defined)
        out.append({
            "model_id": model_id,
            "layers": len(alphas) + failed,
            "alpha_defined": count,
            "alpha_mean": float(defined.mean()) if count else math.nan,
            "alpha_median": float(np.median(defined)) if count else math.nan,
            "alpha_weighted_mean": float(np.mean(weights_ok)) if weights_ok else math.nan,
            "share_over_trained": float((defined < ALPHA_OVER_TRAINED).mean()) if count
            else math.nan,
            "share_under_trained": float((defined > ALPHA_UNDER_TRAINED).mean()) if count
            else math.nan,
            "undefined": len(alphas) - count,  # stored as NaN, reasons recorded
            "failed": failed,
            "undefined_reasons": {shown[g]: c for g, c in reasons.most_common()},
            "conventions": conventions,
        })
    return out


def summary_lines(record: Mapping[str, Any]) -> list[str]:
    """A summary record as the few lines ``diffract analyze`` prints."""

    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{100 * x:.0f}%"

    def num(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3f}"

    lines = [
        f"{record['model_id']}: alpha defined on {record['alpha_defined']} of "
        f"{record['layers']} layers",
        f"  alpha mean {num(record['alpha_mean'])}, median {num(record['alpha_median'])}; "
        f"alpha_weighted mean {num(record['alpha_weighted_mean'])}",
        f"  alpha < {ALPHA_OVER_TRAINED:g} (likely over-trained): "
        f"{pct(record['share_over_trained'])} of layers; alpha > {ALPHA_UNDER_TRAINED:g} "
        f"(likely under-trained): {pct(record['share_under_trained'])}",
    ]
    line = conventions_line(record.get("conventions", ""))
    if line:
        lines.append(f"  {line}")
    if record["undefined"] or record["failed"]:
        lines.append(f"  no alpha for {record['undefined'] + record['failed']} layer(s):")
        for reason, count in list(record["undefined_reasons"].items())[:5]:
            lines.append(f"    {count} x {reason}")
        more = len(record["undefined_reasons"]) - 5
        if more > 0:
            lines.append(f"    ... {more} more reason(s): results.export_notes() lists each")
    return lines


def conventions_line(conventions: str) -> str:
    """One line naming the conventions in effect and, unless they are WeightWatcher's,
    how to get its numbers (empty when no pack provides presets)."""
    if not conventions:
        return ""
    if "weightwatcher" in conventions.split(", "):
        return f"conventions: {conventions} (WeightWatcher 0.7.7's numbers)"
    return f"conventions: {conventions}; WeightWatcher's numbers: --conventions weightwatcher"


def pair_matrix(session: Any, field: str) -> tuple[list[str], list[str], Any]:
    """(layers, pair labels ``"a -> b"``, matrix layer x pair; NaN where a pair has no
    value) of one stored pairwise (CROSS_MODEL) scalar field."""
    records = session.results.export_aggregates(field, export_format="list")
    layers: list[str] = []
    pairs: list[str] = []
    cells: dict[tuple[str, str], float] = {}
    for r in records:
        if r["field"] != field or r["param"] is None or np.ndim(r["value"]) != 0:
            continue
        label = r["models"].replace(",", " -> ")
        if r["param"] not in layers:
            layers.append(r["param"])
        if label not in pairs:
            pairs.append(label)
        cells[(r["param"], label)] = float(r["value"])
    matrix = np.full((len(layers), len(pairs)), np.nan)
    for (layer, label), value in cells.items():
        matrix[layers.index(layer), pairs.index(label)] = value
    return layers, pairs, matrix


# -- the HTML report ------------------------------------------------------------------------
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#1d1d1f}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
.muted{color:#666}table{border-collapse:collapse;margin:.6em 0}
td,th{padding:3px 9px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
table.sortable th{cursor:pointer;background:#f6f6f8;position:sticky;top:0}
table.sortable th:hover{background:#e8e8ee}th.asc::after{content:" \\25B2"}
th.desc::after{content:" \\25BC"}.bad{color:#b00}.scroll{max-height:70vh;overflow:auto}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
details{margin:.5em 0}summary{cursor:pointer;font-weight:600}
code,pre{background:#f6f6f8;padding:1px 4px;border-radius:3px}
"""

_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
  var asc=!th.classList.contains('asc');
  t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc')});
  th.classList.add(asc?'asc':'desc');
  var rows=Array.from(t.tBodies[0].rows);
  rows.sort(function(a,b){
   var x=a.cells[i].dataset.v, y=b.cells[i].dataset.v;
   var p=parseFloat(x), q=parseFloat(y);
   if(!isNaN(p)&&!isNaN(q)) return asc?p-q:q-p;
   if(isNaN(p)!==isNaN(q)) return isNaN(p)?1:-1;
   return asc?String(x).localeCompare(y):String(y).localeCompare(x);});
  rows.forEach(function(r){t.tBodies[0].appendChild(r)});});});});
"""


def _esc(text: Any) -> str:
    import html

    return html.escape(str(text), quote=True)


def format_value(value: Any) -> str:
    """A value as a table shows it: 4 significant digits, whole numbers (below 1e6) as
    integers, NaN as ``nan``, None (not stored) as empty."""
    if value is None:
        return ""
    if np.ndim(value) == 0 and isinstance(value, (int, float, np.number, bool)):
        if isinstance(value, (bool, np.bool_)):
            return str(bool(value))
        v = float(value)
        if math.isnan(v):
            return "nan"
        return f"{int(v)}" if v.is_integer() and abs(v) < 1e6 else f"{v:.4g}"
    return str(value)


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with aligned columns (values through :func:`format_value`)."""
    cells = [list(header)] + [[format_value(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _sort_key(value: Any) -> str:
    """The exact value a cell carries in ``data-v`` (repr of a number: parses back)."""
    if value is None:
        return ""
    if np.ndim(value) == 0 and isinstance(value, (int, float, np.number)) and not isinstance(
            value, (bool, np.bool_)):
        return repr(float(value))
    return str(value)


def html_table(header: list[str], rows: list[list[Any]], *, sortable: bool = True,
               table_id: str | None = None, flagged: Sequence[bool] = ()) -> str:
    """An HTML table whose cells carry their exact value in ``data-v`` (what sorting
    uses, and what a reader of the file can parse); rows ``flagged`` are highlighted
    (class ``bad``)."""
    attrs = (' class="sortable"' if sortable else "") + (f' id="{_esc(table_id)}"'
                                                          if table_id else "")
    out = [f"<table{attrs}><thead><tr>"]
    out += [f"<th>{_esc(h)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        out.append("<tr class=bad>" if i < len(flagged) and flagged[i] else "<tr>")
        for value in row:
            shown, key = format_value(value), _sort_key(value)
            out.append(f'<td data-v="{_esc(key)}">{_esc(shown)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def figure_html(fig: Any, alt: str = "") -> str:
    """An ``<img>`` holding ``fig`` as an inline PNG."""
    return f"<img alt='{_esc(alt)}' src='{_png(fig)}'>"


def _png(fig: Any) -> str:
    import base64
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _versions() -> dict[str, str]:
    import platform
    from importlib import metadata

    from diffract.plugins import get_catalog

    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        out["diffract-core"] = metadata.version("diffract-core")
    except metadata.PackageNotFoundError:
        pass
    for record in get_catalog().plugins:
        if record.version and record.status == "loaded":
            out[record.distribution] = record.version
    return out


def write_html(
    session: Any,
    path: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    seconds: float | None = None,
    command: str | None = None,
    plots: bool = True,
    sections: Sequence[str] = (),
) -> Path:
    """One self-contained HTML file (styles, sorting script and plots inline; opens
    offline): per model the summary, the sortable per-layer table of ``metrics``
    (every stored scalar field when None) and the plots (when matplotlib is installed
    and ``esd`` is stored), pairwise aggregates when there are any, and the run's
    provenance: versions, kernel configuration, inputs, time taken, ``command``.
    ``sections`` are extra HTML fragments appended before the provenance. Returns the
    path written."""
    import datetime

    root = getattr(session, "session", session)
    results = session.results
    model_ids = list(session.model_ids)
    table = results.export_metrics(*(metrics or ()))
    fields = list(metrics) if metrics else sorted(
        {f for rows in table.values() for row in rows.values() for f in row})
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Diffract report"
             f"</title><meta name=viewport content='width=device-width'><style>{_CSS}"
             "</style></head><body>",
             "<h1>Diffract report</h1>",
             f"<p class=muted>{_esc(', '.join(model_ids))} &middot; generated "
             f"{_esc(datetime.datetime.now().isoformat(timespec='seconds'))}</p>"]
    summaries = {r["model_id"]: r for r in summarize(session, model_ids) if r["layers"]}
    head = ["model", "layers with alpha", "alpha defined", "alpha mean", "alpha median",
            "alpha_weighted mean", f"share alpha < {ALPHA_OVER_TRAINED:g}",
            f"share alpha > {ALPHA_UNDER_TRAINED:g}", "undefined"]
    if summaries:
        parts.append("<h2>Summary</h2>")
        parts.append(html_table(head, [[r["model_id"], r["layers"], r["alpha_defined"],
                                        r["alpha_mean"], r["alpha_median"],
                                        r["alpha_weighted_mean"], r["share_over_trained"],
                                        r["share_under_trained"], r["undefined"]]
                                       for r in summaries.values()], table_id="summary"))
        parts.append(f"<p class=muted>WeightWatcher's reading: alpha below "
                     f"{ALPHA_OVER_TRAINED:g} suggests an over-trained layer, above "
                     f"{ALPHA_UNDER_TRAINED:g} an under-trained one.</p>")
        line = conventions_line(next(iter(summaries.values()))["conventions"])
        if line:
            python = ("" if "WeightWatcher 0.7.7" in line else
                      " (in Python: session.compute.configure_conventions('weightwatcher'))")
            parts.append(f"<p id=conventions>{_esc(line + python)}</p>")
    viz = None
    if plots:
        try:
            import matplotlib  # noqa: F401

            from diffract_report import viz
        except ImportError:
            parts.append("<p class=muted>Plots left out: pip install matplotlib.</p>")
    for model_id in model_ids:
        record = summaries.get(model_id)
        parts.append(f"<h2 id='model-{_esc(model_id)}'>{_esc(model_id)}</h2>")
        if record and record["undefined_reasons"]:
            items = "".join(f"<li>{c} &times; {_esc(r)}</li>"
                            for r, c in record["undefined_reasons"].items())
            missing = record["undefined"] + record["failed"]
            parts.append(f"<p>No alpha for {missing} layer(s):</p><ul>{items}</ul>")
        shapes = {p.name: p.shape for p in root.models.params(model_id)}
        rows = [[name, "x".join(map(str, shapes.get(name, ()))),
                 *(row.get(f) if np.ndim(row.get(f, 0)) == 0 else None for f in fields)]
                for name, row in table.get(model_id, {}).items()]
        flagged = [bool(row.get("warning")) and isinstance(row.get("warning"), str)
                   for row in table.get(model_id, {}).values()]
        parts.append("<div class=scroll>" + html_table(["parameter", "shape", *fields], rows,
                                                       table_id=f"metrics-{model_id}",
                                                       flagged=flagged) + "</div>")
        if viz is not None:
            depth = viz.depth_fields(session, model_id)
            if depth:
                parts.append(figure_html(viz.depth_figure(session, model_id, depth),
                                         "metrics against depth"))
            images = [figure_html(fig, f"ESD of {param}")
                      for param, fig in viz.esd_figures(session, model_id)]
            if images:
                parts.append(f"<details><summary>ESD of each layer ({len(images)})"
                             f"</summary>{''.join(images)}</details>")
    parts.extend(sections)
    parts.append("<h2>Provenance</h2>")
    prov = [["command", command or ""], ["time taken (s)", seconds],
            ["storage profile", root.profile]]
    prov += [[name, version] for name, version in _versions().items()]
    parts.append(html_table(["", ""], prov, sortable=False, table_id="provenance"))
    kernels = sorted({r["kernel"] for r in session.compute.list_available_metrics(True)
                      if r["field"] in set(fields)})
    config_rows = [[k, json.dumps(session.compute.kernel_config(k), default=str)]
                   for k in kernels]
    parts.append("<h3>Configuration</h3>")
    parts.append(html_table(["kernel", "configuration"], config_rows, sortable=False,
                            table_id="configuration"))
    parts.append("<h3>Inputs</h3>")
    inputs = [[m["model_id"], m["params"], m["numel"], m["source"]]
              for m in root.models.list() if m["model_id"] in model_ids]
    parts.append(html_table(["model", "parameters", "elements", "source"], inputs,
                            sortable=False, table_id="inputs"))
    parts.append(f"<script>{_JS}</script></body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(parts), encoding="utf-8")
    return path
