"""The one-file HTML report: summary, per-layer tables, charts, provenance.

Everything is inline (styles, the sorting and charting script, the data), so the file
opens offline. The charts are drawn by the browser from the numbers the report embeds
(``_charts.js``: SVG, drawn when they come into view), so writing the report costs
about what reading the results does: drawing forty matplotlib figures took twenty times
longer than the analysis they show.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import numpy as np

from diffract_report.summary import (
    ALPHA_OVER_TRAINED,
    ALPHA_UNDER_TRAINED,
    conventions_line,
    format_value,
    summarize,
    told_by_summary,
    undefined_lines,
)
from diffract_report.viz import (
    DEPTH_FIELDS,
    ESD_FIELDS,
    linear_range,
    linear_title,
    mp_curve,
    short_names,
)

__all__ = ["figure_html", "html_table", "write_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1220px;padding:0 1em;color:#1d1d1f}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
h3{margin-top:1.4em}.muted{color:#666}table{border-collapse:collapse;margin:.6em 0}
td,th{padding:3px 7px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{white-space:normal;vertical-align:bottom;max-width:9em}
td:first-child,th:first-child{text-align:left;max-width:none}
table.sortable th{cursor:pointer;background:#f6f6f8;position:sticky;top:0}
table.sortable th:hover{background:#e8e8ee}th.asc::after{content:" \\25B2"}
th.desc::after{content:" \\25BC"}tr.bad td{color:#b00;background:#fff4f4}
.scroll{max-height:75vh;overflow:auto}a{color:#0b57d0;text-decoration:none}
a:hover{text-decoration:underline}nav.toc{background:#f6f6f8;padding:.6em 1em;
border-radius:6px}nav.toc ul{margin:.2em 0;padding-left:1.3em}
.charts{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}
.chart svg{max-width:100%;height:auto}figure{margin:.8em 0}
figcaption{font-weight:600;margin:.3em 0}
figure{border-top:1px solid #eee;padding-top:.4em}img{max-width:100%;border:1px solid #eee}
svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#999}
svg .tick{font-size:10px;fill:#444}svg .label{font-size:11px;fill:#222}
svg .ct{font-size:12px;font-weight:600;fill:#222}
code,pre{background:#f6f6f8;padding:1px 4px;border-radius:3px}
"""

#: Colours of the charts (matplotlib's first four).
BLUE, ORANGE, GREEN, RED = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _sort_key(value: Any) -> str:
    """The exact value a cell carries in ``data-v`` (repr of a number: parses back)."""
    if value is None:
        return ""
    if np.ndim(value) == 0 and isinstance(value, (int, float, np.number)) and not isinstance(
            value, (bool, np.bool_)):
        return repr(float(value))
    return str(value)


def _header(name: str) -> str:
    """A column header that may wrap after its underscores, never inside a word."""
    return _esc(name).replace("_", "_<wbr>")


def html_table(header: list[str], rows: list[list[Any]], *, sortable: bool = True,
               table_id: str | None = None, flagged: Sequence[bool] = (),
               links: Sequence[str | None] = ()) -> str:
    """An HTML table whose cells carry their exact value in ``data-v`` (what sorting
    uses, and what a reader of the file can parse); rows ``flagged`` are highlighted
    (class ``bad``); ``links`` make each row's first cell a link to that anchor."""
    attrs = (' class="sortable"' if sortable else "") + (f' id="{_esc(table_id)}"'
                                                          if table_id else "")
    out = [f"<table{attrs}><thead><tr>"]
    out += [f"<th>{_header(h)}</th>" for h in header]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        out.append("<tr class=bad>" if i < len(flagged) and flagged[i] else "<tr>")
        for j, value in enumerate(row):
            shown, key = _esc(format_value(value)), _sort_key(value)
            if j == 0 and i < len(links) and links[i]:
                shown = f"<a href='#{_esc(links[i])}'>{shown}</a>"
            out.append(f'<td data-v="{_esc(key)}">{shown}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def figure_html(fig: Any, alt: str = "") -> str:
    """An ``<img>`` holding a matplotlib figure as an inline PNG."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f"<img alt='{_esc(alt)}' src='data:image/png;base64,{data}'>"


# -- charts (specs the browser draws) ---------------------------------------------------------
def _num(values: Iterable[Any]) -> list[float | None]:
    """Numbers for JSON: 5 significant digits, None for NaN and infinities."""
    out = []
    for v in values:
        v = float(v)
        out.append(float(f"{v:.5g}") if math.isfinite(v) else None)
    return out


def _chart(spec: dict[str, Any], caption: str = "", anchor: str = "") -> str:
    ident = f" id='{_esc(anchor)}'" if anchor else ""
    caption = f"<figcaption>{_esc(caption)}</figcaption>" if caption else ""
    return (f"<figure{ident}>{caption}<div class=chart data-chart='"
            f"{_esc(json.dumps(spec))}'></div></figure>")


def esd_chart(row: dict[str, Any], shape: Sequence[int] | None) -> dict[str, Any] | None:
    """One layer's ESD: log-log density with the fitted power law and xmin; linear
    histogram with the Marchenko-Pastur bulk of a random matrix of its shape and scale."""
    esd = np.asarray(row.get("esd"), dtype=np.float64)
    esd = esd[esd > 0] if esd.ndim == 1 else esd[:0]
    if esd.size == 0:
        return None
    lo, hi = float(esd.min()), float(esd.max())
    if hi <= lo:  # one distinct eigenvalue (a rank-one matrix): a range around it
        lo, hi = lo * 0.9, hi * 1.1
    edges = np.geomspace(lo, hi * (1 + 1e-9), max(10, min(60, esd.size // 4)))
    counts, _ = np.histogram(esd, bins=edges)
    keep = counts > 0
    centres = np.sqrt(edges[:-1] * edges[1:])[keep]
    density = (counts / (esd.size * np.diff(edges)))[keep]
    log_series: list[dict[str, Any]] = [{"kind": "points", "x": _num(centres),
                                         "y": _num(density), "color": BLUE, "label": "ESD"}]
    alpha, xmin = row.get("pl_alpha"), row.get("pl_xmin")
    if alpha is not None and xmin is not None and math.isfinite(alpha) and math.isfinite(xmin):
        share = float(np.mean(esd >= xmin))
        x = np.geomspace(xmin, hi, 30)
        log_series += [{"kind": "line", "x": _num(x), "color": RED,
                        "y": _num(share * (alpha - 1) / xmin * (x / xmin) ** -alpha),
                        "label": f"power law, alpha {alpha:.2f}"},
                       {"kind": "vline", "x": float(xmin), "color": RED,
                        "label": f"xmin {xmin:.3g}"}]
    top, beyond = linear_range(esd, row.get("mp_bulk_max"))
    bins = np.linspace(lo, max(top, lo * (1 + 1e-9)), max(10, min(80, esd.size // 3)) + 1)
    counts, _ = np.histogram(esd[esd <= top], bins=bins)
    density = counts / (esd.size * np.diff(bins))
    lin_series: list[dict[str, Any]] = [{
        "kind": "bars", "x0": _num(bins[:-1]), "x1": _num(bins[1:]), "color": BLUE,
        "y": _num(density), "label": "ESD"}]
    if shape is not None and len(shape) >= 2:
        x = np.linspace(lo, top, 200)
        y, label, _ = mp_curve(x, esd, shape, float(density.max()))
        lin_series.append({"kind": "line", "x": _num(x), "color": ORANGE, "y": _num(y),
                           "label": label})
        edge = row.get("mp_bulk_max")
        if edge is not None and math.isfinite(edge) and edge <= top:
            lin_series.append({"kind": "vline", "x": float(edge), "color": ORANGE,
                               "label": "bulk edge"})
    return {"w": 1040, "h": 300, "panels": [
        {"title": "log-log ESD", "xlog": True, "ylog": True, "series": log_series,
         "xlabel": "eigenvalue of W^T W", "ylabel": "density"},
        {"title": linear_title(esd, top, beyond), "series": lin_series,
         "xlabel": "eigenvalue of W^T W",
         "ylabel": "density"}]}


def depth_charts(names: Sequence[str], rows: dict[str, dict[str, Any]],
                 fields: Sequence[str]) -> list[dict[str, Any]]:
    """One chart per field: its value per layer, in model order, layers named."""
    cats = short_names(names)
    charts = []
    for field in fields:
        ys = [rows.get(n, {}).get(field) for n in names]
        ys = [float(y) if isinstance(y, (int, float, np.number)) else math.nan for y in ys]
        series: list[dict[str, Any]] = []
        if field == "pl_alpha":
            series.append({"kind": "hband", "y0": ALPHA_OVER_TRAINED,
                           "y1": ALPHA_UNDER_TRAINED, "color": GREEN,
                           "label": f"{ALPHA_OVER_TRAINED:g} <= alpha <= "
                                    f"{ALPHA_UNDER_TRAINED:g}"})
        series.append({"kind": "line", "marks": True, "x": list(range(len(names))),
                       "y": _num(ys), "color": BLUE, "names": list(names)})
        charts.append({"w": 820, "h": 330, "panels": [
            {"title": f"{field} by layer", "cats": cats, "ylabel": field, "series": series,
             "ywhole": field != "pl_alpha" and all(float(y).is_integer() for y in ys
                                                   if math.isfinite(y))}]})
    return charts


def alpha_histogram(alphas: Sequence[float]) -> dict[str, Any] | None:
    """How many layers have each alpha, with WeightWatcher's 2 and 6 marked."""
    values = np.asarray([a for a in alphas if math.isfinite(a)])
    if values.size == 0:
        return None
    width = 0.25 if values.max() - values.min() <= 10 else (values.max() - values.min()) / 40
    edges = np.arange(math.floor(values.min() / width) * width,
                      values.max() + width + 1e-12, width)
    counts, _ = np.histogram(values, bins=edges)
    return {"w": 380, "h": 330, "panels": [{
        "title": "alpha of the layers", "xlabel": "pl_alpha", "ylabel": "layers",
        "ywhole": True, "series": [
            {"kind": "bars", "x0": _num(edges[:-1]), "x1": _num(edges[1:]),
             "y": [int(c) for c in counts], "color": BLUE},
            {"kind": "vline", "x": ALPHA_OVER_TRAINED, "color": RED,
             "label": f"alpha {ALPHA_OVER_TRAINED:g}"},
            {"kind": "vline", "x": ALPHA_UNDER_TRAINED, "color": ORANGE,
             "label": f"alpha {ALPHA_UNDER_TRAINED:g}"}]}]}


def checkpoints_chart(model_ids: Sequence[str], table: dict[str, Any]) -> dict[str, Any] | None:
    """alpha per checkpoint: a thin line per layer, the mean bold (models in order)."""
    layers = sorted({p for m in model_ids for p, r in table.get(m, {}).items()
                     if isinstance(r.get("pl_alpha"), (int, float))})
    if len(model_ids) < 2 or not layers:
        return None
    x = list(range(len(model_ids)))
    series: list[dict[str, Any]] = []
    grid = np.full((len(layers), len(model_ids)), np.nan)
    for i, layer in enumerate(layers):
        for j, m in enumerate(model_ids):
            value = table.get(m, {}).get(layer, {}).get("pl_alpha")
            grid[i, j] = value if isinstance(value, (int, float)) else np.nan
        series.append({"kind": "line", "x": x, "y": _num(grid[i]), "color": BLUE,
                       "width": 1, "opacity": 0.25})
    if not np.isfinite(grid).any():
        return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a checkpoint with no alpha
        mean = np.nanmean(np.where(np.isfinite(grid), grid, np.nan), axis=0)
    series.append({"kind": "line", "marks": True, "x": x, "y": _num(mean), "color": RED,
                   "width": 3, "label": "mean over layers", "names": list(model_ids)})
    return {"w": 820, "h": 320, "panels": [{
        "title": "alpha per checkpoint (one line per layer)", "cats": list(model_ids),
        "ylabel": "pl_alpha", "series": series}]}


# -- provenance --------------------------------------------------------------------------------
def _versions() -> dict[str, str]:
    import platform

    from diffract.plugins import get_catalog

    out = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("torch", "diffractml-core"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    for record in get_catalog().plugins:
        if record.version and record.status == "loaded":
            out[record.distribution] = record.version
    return out


def _inputs(root: Any, model_ids: Sequence[str]) -> list[list[Any]]:
    """Per model: parameters, elements, source, and each file's header hash."""
    rows = []
    for m in root.models.list():
        if m["model_id"] not in model_ids:
            continue
        try:
            files = root.store.source(m["model_id"]).files
        except (KeyError, NotImplementedError):
            files = ()
        hashes = "; ".join(f"{Path(f.path).name} {f.header_sha256[:16]}" for f in files)
        rows.append([m["model_id"], m["params"], m["numel"], m["source"], hashes or "-"])
    return rows


def _toc(parts: Sequence[str]) -> str:
    """A table of contents of the ``<h2 id=...>`` headings among ``parts``."""
    found = re.findall(r"<h2 id='([^']+)'>(.*?)</h2>", "".join(parts))
    items = "".join(f"<li><a href='#{i}'>{t}</a></li>" for i, t in found)
    return f"<nav class=toc><strong>Contents</strong><ul>{items}</ul></nav>"


def _percent(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.0f}%"


def _model_section(session: Any, root: Any, model_id: str, number: int, table: dict[str, Any],
                   fields: list[str], record: dict[str, Any] | None, plots: bool,
                   view_fields: Sequence[str] | None = None) -> list[str]:
    """A model's heading, its charts, its per-layer table (rows linking to their ESD
    plots, flagged rows highlighted) and the ESD plots (charts only with ``plots``)."""
    parts = [f"<h2 id='model-{number}'>{_esc(model_id)}</h2>"]
    if record and record["undefined_reasons"]:
        items = "".join(f"<li>{c} &times; {_esc(r)}</li>"
                        for r, c in record["undefined_reasons"].items())
        missing = record["undefined"] + record["failed"]
        parts.append(f"<p>No alpha for {missing} layer(s):</p><ul>{items}</ul>")
    if record and record.get("poor_fits"):
        items = "".join(f"<li>{c} &times; {_esc(r)}</li>"
                        for r, c in record["poor_reasons"].items())
        parts.append(f"<p id='poor-fits-{number}'>Poor power-law fits (pl_fit_quality) on "
                     f"{record['poor_fits']} layer(s):</p><ul>{items}</ul>")
    if record and record.get("noise_like"):
        names = record["noise_like"]
        parts.append(f"<p id='noise-{number}'>The alpha of {len(names)} layer(s) describes "
                     "noise: their spectrum has no eigenvalue beyond the Marchenko-Pastur "
                     "bulk edge of a random matrix of its size and norm (num_spikes 0), so it "
                     "is consistent with random noise:</p><ul>" + "".join(
                         f"<li>{_esc(n)}</li>" for n in names[:20]) + (
                         f"<li>... {len(names) - 20} more</li>" if len(names) > 20 else "")
                     + "</ul>")
    params = {p.name: p for p in root.models.params(model_id)}
    known = set(session.compute.list_available_metrics())
    wanted = [f for f in (*ESD_FIELDS, *DEPTH_FIELDS) if f in known] if plots else []
    extra = session.results.export_metrics(*wanted, include_arrays=True).get(model_id, {}) \
        if wanted else {}
    matrices = [n for n in table.get(model_id, {})
                if len(params[n].shape) >= 2 and params[n].parent is None]
    charts = [_chart(spec) for spec in depth_charts(
        matrices, extra, [f for f in DEPTH_FIELDS if any(f in extra.get(n, {})
                                                          for n in matrices)])]
    histogram = alpha_histogram([float(r["pl_alpha"]) for name, r in extra.items()
                                 if isinstance(r.get("pl_alpha"), (int, float))
                                 and name in params and params[name].parent is None])
    if histogram is not None:
        charts.insert(1, _chart(histogram))
    if charts:
        parts.append("<div class=charts>" + "".join(charts) + "</div>")
    esd = {name: esd_chart(row, params[name].shape) for name, row in extra.items()
           if name in params and "esd" in row and params[name].parent is None}
    anchors = {name: f"esd-{number}-{i}" for i, name in enumerate(n for n in esd if esd[n])}
    rows_in = {name: row for name, row in table.get(model_id, {}).items()
               if name not in params or params[name].parent is None}
    if not rows_in and not charts and not anchors and not record:
        return []  # nothing per model was computed (a comparison's report): no section
    if plots and any(p.parent for p in params.values()):
        parts += _view_parts(session, model_id, fields, view_fields)
    rows = [[name, "x".join(map(str, params[name].shape)),
             *("" if f == "warning" and not isinstance(row.get(f), str)  # none applies
               else row.get(f) if np.ndim(row.get(f, 0)) == 0 else None for f in fields)]
            for name, row in rows_in.items()]
    flagged = [isinstance(row.get("warning"), str) and bool(row["warning"])
               for row in rows_in.values()]
    parts.append("<h3>Layers</h3><div class=scroll>" + html_table(
        ["parameter", "shape", *fields], rows, table_id=f"metrics-{model_id}", flagged=flagged,
        links=[anchors.get(name) for name in rows_in]) + "</div>")
    if anchors:
        parts.append(f"<h3>ESD of each layer ({len(anchors)})</h3>")
        parts += [_chart(esd[name], name, anchor) for name, anchor in anchors.items()]
    return parts


def _view_parts(session: Any, model_id: str, fields: Sequence[str],
                view_fields: Sequence[str] | None = None) -> list[str]:
    """A model's views: a parameter x head heat map per view field (``view_fields``, or
    alpha and stable rank), or in words why a field has nothing to show; a parameter x
    expert table; and each field over each parameter's views."""
    from diffract_report.views import head_grid, undefined_reasons, view_summary

    parts = ["<h3>Views</h3>"]
    known = set(session.compute.list_available_metrics())
    shown = [f for f in (view_fields or ("pl_alpha", "stable_rank")) if f in known]
    for field in shown:
        rows, heads, matrix = head_grid(session, model_id, field)
        if rows and np.isfinite(matrix).any():
            parts.append(_chart({"w": 1040, "h": int(min(1400, 70 + 14 * len(rows))),
                                 "panels": [{"title": f"{field} per head", "xlabel": "head",
                                             "heat": {"rows": rows, "cols": heads,
                                                      "z": [_num(r) for r in matrix]}}]}))
        elif rows:
            reasons = undefined_reasons(session, model_id, field)
            why = ("; ".join(f"{n} &times; {_esc(r)}" for n, r in reasons[:5]) if reasons
                   else f"it was not computed on the views (add {_esc(field)} to --metrics)")
            parts.append(f"<p class=nothing><b>{_esc(field)} per head</b>: nothing to show, "
                         f"no head has a value: {why}.</p>")
    scalar = list(view_fields or ()) or [f for f in fields if f not in ("warning", "esd")]
    params = getattr(session, "session", session).models.params(model_id)
    for field in scalar[:2]:
        experts: dict[str, dict[int, Any]] = {}
        values = session.results.export_metrics(field).get(model_id, {})
        for p in params:
            label = re.fullmatch(r"expert=(\d+)(?:,part=(\w+))?", p.meta_dict.get("view", ""))
            if p.parent is not None and label:  # a packed gate_up_proj: a row per part
                row = f"{p.parent}[part={label.group(2)}]" if label.group(2) else p.parent
                experts.setdefault(row, {})[int(label.group(1))] = values.get(
                    p.name, {}).get(field)
        if experts:
            count = max(len(v) for v in experts.values())
            parts.append(f"<h4>{_esc(field)} per expert</h4><div class=scroll>" + html_table(
                ["parameter", *map(str, range(count))],
                [[parent, *(row.get(e) for e in range(count))] for parent, row in
                 experts.items()], table_id=f"experts-{model_id}-{field}") + "</div>")
    parts += _extreme_views(session, model_id, shown)
    for field in scalar[:4] if view_fields else scalar[:2]:
        summary = view_summary(session, model_id, field)
        if summary:
            keys = ("parameter", "views", "defined", "mean", "median", "min", "min_view", "max",
                    "max_view")
            parts.append(f"<h4>{_esc(field)} over each parameter's views</h4><div class=scroll>"
                         + html_table(["parameter", "views", "defined", "mean", "median", "min",
                                       "min at", "max", "max at"],
                                      [[r[k] for k in keys] for r in summary],
                                      table_id=f"views-{model_id}-{field}") + "</div>")
    return parts


def _extreme_views(session: Any, model_id: str, fields: Sequence[str]) -> list[str]:
    """The ESDs of the two views at the ends of the first of ``fields`` that has values
    (the model's lowest and highest head), as the layers' are drawn; a line saying why
    when their spectra were not stored."""
    root = getattr(session, "session", session)
    params = {p.name: p for p in root.models.params(model_id) if p.parent is not None}
    for field in fields:
        values = {n: float(r[field]) for n, r in
                  session.results.export_metrics(field).get(model_id, {}).items()
                  if n in params and isinstance(r.get(field), (int, float))
                  and math.isfinite(r[field])}
        if len(values) < 2:
            continue
        ends = (("lowest", min(values, key=values.get)), ("highest", max(values, key=values.get)))
        two = session.filter(param_ids=[f"{model_id}/{name}" for _, name in ends])
        rows = two.results.export_metrics("esd", "pl_alpha", "pl_xmin", "mp_bulk_max",
                                          include_arrays=True).get(model_id, {})
        charts = [_chart(spec, f"{name}: the {which} {field} of the model's views "
                               f"({format_value(values[name])})")
                  for which, name in ends
                  if (spec := esd_chart(rows.get(name, {}), params[name].shape)) is not None]
        if not charts:
            return [f"<p class=nothing>The ESDs of the views at the ends of {_esc(field)} were "
                    "not stored (the view metrics computed no spectrum).</p>"]
        return [f"<h4>ESD of the views at the ends of {_esc(field)}</h4>", *charts]
    return []


def write_html(
    session: Any,
    path: str | Path,
    *,
    metrics: Sequence[str] | None = None,
    seconds: float | None = None,
    command: str | None = None,
    plots: bool = True,
    sections: Sequence[str] = (),
    lead: Sequence[str] = (),
    detail: Sequence[str] | None = None,
    view_metrics: Sequence[str] | None = None,
    explain: Sequence[str] = (),
) -> Path:
    """One self-contained HTML file (styles, script, data and charts inline; opens
    offline): a table of contents; the summary (with the conventions in effect, and
    alpha per checkpoint when there are several); per model its charts (metrics by
    layer, the alpha histogram), the sortable per-layer table of ``metrics`` (every
    stored scalar field when None; flagged layers highlighted, each row linking to its
    ESD plot) and every layer's ESD (when ``plots`` and ``esd`` is stored), for the
    models of ``detail`` (all when None); ``lead`` (HTML fragments after the summary) and
    ``sections`` (after the models); ``view_metrics``: the fields drawn per head (alpha
    and stable rank when None); why values of these fields (and of ``explain``: a
    section's, such as compare's pairwise fields) are undefined; and the run's
    provenance: versions, kernel configuration, inputs with their files' header hashes,
    time taken, ``command``.
    Returns the path."""
    root = getattr(session, "session", session)
    model_ids = root.models.ordered(session.model_ids)
    table = session.results.export_metrics(*(metrics or ()))
    fields = list(metrics) if metrics else sorted(
        {f for rows in table.values() for row in rows.values() for f in row})
    parts = ["<h1>Diffract report</h1>",
             f"<p class=muted>{_esc(', '.join(model_ids))} &middot; generated "
             f"{_esc(datetime.datetime.now().isoformat(timespec='seconds'))}</p>"]
    summaries = {r["model_id"]: r for r in summarize(session, model_ids) if r["layers"]}
    if summaries:
        head = ["model", "layers with alpha", "alpha defined", "alpha mean", "alpha median",
                "alpha_weighted mean", f"alpha < {ALPHA_OVER_TRAINED:g}",
                f"alpha > {ALPHA_UNDER_TRAINED:g}", "undefined"]
        parts.append("<h2 id='summary'>Summary</h2>")
        parts.append(html_table(head, [[r["model_id"], r["layers"], r["alpha_defined"],
                                        r["alpha_mean"], r["alpha_median"],
                                        r["alpha_weighted_mean"],
                                        _percent(r["share_over_trained"]),
                                        _percent(r["share_under_trained"]), r["undefined"]]
                                       for r in summaries.values()], table_id="summary"))
        parts.append(f"<p class=muted>Shares are of the layers where alpha is defined. "
                     f"WeightWatcher's reading: alpha below {ALPHA_OVER_TRAINED:g} suggests an "
                     f"over-trained layer, above {ALPHA_UNDER_TRAINED:g} an under-trained "
                     "one.</p>")
        line = conventions_line(next(iter(summaries.values()))["conventions"])
        if line:
            python = ("" if "WeightWatcher 0.7.7" in line else
                      " (in Python: session.compute.configure_conventions('weightwatcher'))")
            parts.append(f"<p id=conventions>{_esc(line + python)}</p>")
        trend = checkpoints_chart(model_ids, session.results.export_metrics("pl_alpha")) \
            if plots and "pl_alpha" in session.compute.list_available_metrics() else None
        if trend is not None:
            parts.append(_chart(trend, "alpha of every layer across the models, in order"))
    parts += lead
    for number, model_id in enumerate(model_ids):
        if detail is None or model_id in detail:
            parts += _model_section(session, root, model_id, number, table, fields,
                                    summaries.get(model_id), plots, view_metrics)
    counter = iter(range(1_000_000))
    parts += [re.sub(r"<h2>", lambda _: f"<h2 id='section-{next(counter)}'>", s)
              for s in sections]
    undefined = undefined_lines(session, [*fields, *explain],
                                leave_out=told_by_summary(root, summaries.values()))
    if undefined:  # the tables show nan: why, as the command's terminal says
        parts.append("<h2 id='undefined'>Undefined values</h2><p>" + _esc(undefined[0])
                     + "</p><ul>" + "".join(f"<li>{_esc(line.strip())}</li>"
                                            for line in undefined[1:]) + "</ul>")
    parts.append("<h2 id='provenance'>Provenance</h2>")
    prov = [["command", command or ""], ["time taken (s)", seconds],
            ["storage profile", root.profile]]
    prov += [[name, version] for name, version in _versions().items()]
    parts.append(html_table(["", ""], prov, sortable=False, table_id="provenance"))
    kernels = sorted({r["kernel"] for r in session.compute.list_available_metrics(True)
                      if r["field"] in set(fields)})
    parts.append("<h3>Configuration</h3>")
    parts.append(html_table(["kernel", "configuration"],
                            [[k, json.dumps(session.compute.kernel_config(k), default=str)]
                             for k in kernels], sortable=False, table_id="configuration"))
    parts.append("<h3>Inputs</h3>")
    parts.append(html_table(["model", "parameters", "elements", "source", "header sha256"],
                            _inputs(root, model_ids), sortable=False, table_id="inputs"))
    script = resources.files("diffract_report").joinpath("_charts.js").read_text("utf-8")
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Diffract report"
            f"</title><meta name=viewport content='width=device-width'><style>{_CSS}</style>"
            f"</head><body>{parts[0]}{parts[1]}{_toc(parts)}{''.join(parts[2:])}"
            f"<script>{script}</script></body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
