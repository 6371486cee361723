"""Readings of a session's results a person looks at: per-model summaries (the
WeightWatcher-style reading of alpha), their lines on a terminal, tables as text.

``summarize(session)`` is what ``diffract analyze`` prints under its table. It only
reads results: run ``compute.apply`` first.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ALPHA_OVER_TRAINED", "ALPHA_UNDER_TRAINED", "conventions_line", "format_table",
           "format_value", "pair_matrix", "summarize", "summary_lines", "told_by_summary",
           "undefined_lines"]

#: WeightWatcher's reading of a layer's power-law exponent: below 2 the layer is likely
#: over-trained (over-fit to its data), above 6 under-trained; 2-6 is the well-trained band.
ALPHA_OVER_TRAINED = 2.0
ALPHA_UNDER_TRAINED = 6.0


def median(values: np.ndarray) -> float:
    """``np.median`` of a 1-D array, the same bits, without the ``numpy.ma`` import
    np.median makes (10 ms of every ``diffract analyze``)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    n = len(ordered)
    return float(ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)


def _number(value: Any) -> float | None:
    if value is None or np.ndim(value) != 0:
        return None
    return float(value)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _reason_key(reason: str) -> str:
    """A reason without its numbers, so that 'weights hold 3 NaN' and 'weights hold 5
    NaN' count as one kind of trouble."""
    return _NUMBER.sub("N", reason)


def grouped(reasons: Iterable[str]) -> dict[str, int]:
    """Reasons grouped by their text without numbers, most frequent first, each group
    shown with the range of each number that varies in it ('the tail has 24-49 points,
    fewer than 50': not the first reason's 24 for all of them)."""
    groups: dict[str, list[str]] = {}
    for reason in reasons:
        groups.setdefault(_reason_key(reason), []).append(reason)
    return {_spread(members): len(members)
            for members in sorted(groups.values(), key=lambda m: -len(m))}


def _spread(members: Sequence[str]) -> str:
    """The first reason with each of its numbers replaced by the group's range of it."""
    columns = iter(zip(*(_NUMBER.findall(r) for r in members), strict=True))

    def shown(_: re.Match[str]) -> str:
        column = next(columns)
        low, high = min(column, key=float), max(column, key=float)
        return low if float(low) == float(high) else f"{low}-{high}"

    return _NUMBER.sub(shown, members[0])


_CHAIN = re.compile(r"^(?:input '[^']+' is undefined: )+")
#: Reasons told after a command's tables; the rest are counted.
REASONS_SHOWN = 8


_HEADS = {"undefined": "nan where a value is undefined:",
          "skipped": "not computed, so not in the tables:"}


def told_by_summary(session: Any, summaries: Iterable[Mapping[str, Any]]) -> list[str]:
    """The kernels whose undefined values the model summary explains: alpha's producer,
    where alpha was asked for (a record with ``layers``)."""
    producer = getattr(session, "session", session).registry.producer("pl_alpha")
    return [producer.name] if producer is not None and any(
        r["layers"] for r in summaries) else []


def undefined_lines(session: Any, fields: Sequence[str], *, leave_out: Iterable[str] = (),
                    kinds: Sequence[str] = ("undefined",)) -> list[str]:
    """Why the values of ``fields`` that a command shows as nan are undefined: one line
    per reason (grouped as :func:`grouped` does; an input's chain of "input 'x' is
    undefined: ..." cut to its root), with the fields and the units it left undefined,
    the most frequent first. ``leave_out``: kernels whose reasons are told elsewhere (the
    model summary's alpha); views (heads, experts) are left out too, told with their own
    tables. ``kinds`` with ``"skipped"``: also, under a heading of their own, the units
    the fields' own kernels did not compute (a parameter missing from one model of a
    pair, or shaped differently; not those whose input was never computed, such as a
    bias's SVD). One pass over the notes; works in a view; empty when there are none."""
    from diffract.errors import printable

    root = getattr(session, "session", session)
    left_out = set(leave_out)
    kernels: dict[str, list[str]] = {}
    for field in dict.fromkeys(fields):
        producer = root.registry.producer(field)
        if producer is not None and producer.name not in left_out:
            kernels.setdefault(producer.name, []).append(field)
    views = {p.name for m in session.model_ids for p in root.models.params(m) if p.parent}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for note in session.results.export_notes():
        shown = kernels.get(note["kernel"])
        unit, kind = note["unit"], note["kind"]
        if not shown or kind not in kinds or views and any(
                unit[i + 1:] in views for i, c in enumerate(unit) if c == "/"):
            continue
        if kind == "skipped" and note["reason"].startswith("input '"):
            continue  # an input not computed (a bias has no SVD): not this field's doing
        reason = _CHAIN.sub("", note["reason"])
        group = groups.setdefault((kind, _reason_key(reason)), {"fields": {}, "units": {},
                                                                 "reasons": []})
        group["fields"].update(dict.fromkeys(shown))
        group["units"][note["unit"]] = None
        group["reasons"].append(reason)
    lines: list[str] = []
    for kind in kinds:
        ordered = sorted((g for (k, _), g in groups.items() if k == kind),
                         key=lambda g: -len(g["units"]))
        if ordered:
            lines.append(_HEADS[kind])
        for group in ordered[:REASONS_SHOWN]:
            units = list(group["units"])
            more = f" and {len(units) - 1} more" if len(units) > 1 else ""
            lines.append(printable(f"  {', '.join(group['fields'])} on {units[0]}{more}: "
                                   f"{_spread(group['reasons'])}"))
        if len(ordered) > REASONS_SHOWN:
            lines.append(f"  and {len(ordered) - REASONS_SHOWN} more reason(s): "
                         "session.results.export_notes() lists each")
    return lines


def summarize(
    session: Any,
    model_ids: Iterable[str] | None = None,
    *,
    alpha: str = "pl_alpha",
    weighted: str = "alpha_weighted",
) -> list[dict[str, Any]]:
    """One record per model (its stored parameters: views of them are left out):
    ``layers`` where ``alpha`` was computed or attempted
    (stored, or failed), its mean and median over the layers where it is defined, the
    mean of ``weighted``, the share of layers with alpha below 2 (likely over-trained)
    and above 6 (likely under-trained), the layers where it is ``undefined`` (stored as
    NaN) or ``failed``, and their reasons grouped (``undefined_reasons``: reason ->
    count; reasons that differ only in their numbers are one group, shown with the range
    of each number), ``poor_fits`` and ``poor_reasons`` (layers whose ``pl_fit_quality`` is
    "poor", when stored, and their reasons grouped the same way), and ``conventions``:
    the presets in effect (``configure_conventions``), comma-separated, or ``"custom"``
    when the configuration matches none; ``quantized``: how its quantized weights were
    stored (``meta.quant`` -> count; float8 tensors read as their values without a
    scale too).

    Works in a view (``session.filter(...)``) on the parameters in scope. Fields that
    are not stored give None, not an error.
    """
    results = session.results
    in_scope = list(session.model_ids)
    ids = list(model_ids) if model_ids is not None else in_scope
    known = set(session.compute.list_available_metrics())
    fields = [f for f in (alpha, weighted, "pl_fit_quality", "pl_fit_quality_reason",
                          "num_spikes") if f in known]
    table = results.export_metrics(*fields) if fields else {}
    notes = [n for n in results.export_notes() if n["kind"] in ("undefined", "failed")]
    producer = None
    if alpha in known:
        producer = next((r["kernel"] for r in session.compute.list_available_metrics(True)
                         if r["field"] == alpha), None)
    presets = session.compute.list_conventions()
    effect = session.compute.conventions_in_effect()
    conventions = ", ".join(effect) if effect else ("custom" if presets else "")
    root = getattr(session, "session", session)
    out = []
    for model_id in ids:
        if model_id not in in_scope:
            continue
        views = {p.name for p in root.models.params(model_id) if p.parent is not None}
        rows = {k: v for k, v in table.get(model_id, {}).items() if k not in views}
        alphas = [_number(r.get(alpha)) for r in rows.values() if alpha in r]
        defined = np.array([a for a in alphas if a is not None and math.isfinite(a)])
        weights = [_number(r.get(weighted)) for r in rows.values() if weighted in r]
        weights_ok = [w for w in weights if w is not None and math.isfinite(w)]
        prefix = f"{model_id}/"
        reasons: list[str] = []
        failed = 0
        for n in notes:
            if (n["kernel"] != producer or not n["unit"].startswith(prefix)
                    or n["unit"][len(prefix):] in views):
                continue
            if n["kind"] == "failed":
                failed += 1
            reasons.append(n["reason"])
        poor: list[str] = []
        poor_layers = 0
        for r in rows.values():
            if r.get("pl_fit_quality") != "poor":
                continue
            poor_layers += 1
            poor += str(r.get("pl_fit_quality_reason") or "").split("; ")
        count = len(defined)
        stored = Counter(stored_as(root, model_id).values())
        noise = sorted(n for n, r in rows.items() if r.get("num_spikes") == 0 and (
            (a := _number(r.get(alpha))) is not None and math.isfinite(a)))
        out.append({
            "model_id": model_id,
            "quantized": dict(stored.most_common()),
            "layers": len(alphas) + failed,
            "alpha_defined": count,
            "alpha_mean": float(defined.mean()) if count else math.nan,
            "alpha_median": median(defined) if count else math.nan,
            "alpha_weighted_mean": float(np.mean(weights_ok)) if weights_ok else math.nan,
            "share_over_trained": float((defined < ALPHA_OVER_TRAINED).mean()) if count
            else math.nan,
            "share_under_trained": float((defined > ALPHA_UNDER_TRAINED).mean()) if count
            else math.nan,
            "undefined": len(alphas) - count,  # stored as NaN, reasons recorded
            "failed": failed,
            "undefined_reasons": grouped(reasons),
            "poor_fits": poor_layers,
            "poor_reasons": grouped(poor),
            "noise_like": noise,
            "conventions": conventions,
        })
    return out


#: What marks an alpha whose spectrum is consistent with Marchenko-Pastur noise, and why.
NOISE_MARK = "\u00b0"
NOISE_WHY = ("no eigenvalue lies beyond the Marchenko-Pastur bulk edge of a random matrix "
             "of its size and norm (num_spikes 0), so the spectrum is consistent with "
             "random noise and its alpha describes that noise, not learned structure")


def stored_as(session: Any, model_id: str) -> dict[str, str]:
    """The parameters of ``model_id`` that were dequantized on read (or float8 tensors
    read as their values, with no scale): name -> how they were stored (``meta.quant``)."""
    out = {}
    for p in session.models.params(model_id):
        how = p.meta_dict.get("quant") if p.parent is None else None
        if how is None and p.parent is None and p.dtype.startswith("float8"):
            how = f"{p.dtype} read as its values (no scale)"
        if how is not None and how not in ("F16", "F32", "BF16"):
            out[p.name] = str(how)
    return out


def dequantized_line(counts: Mapping[str, int]) -> str:
    """How many weights were stored how (``meta.quant`` -> count), as one line."""
    return "dequantized on read as its format defines (meta.quant): " + ", ".join(
        f"{n} x {how}" for how, n in counts.items())


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
    if record.get("quantized"):
        lines.append("  " + dequantized_line(record["quantized"]))
    if record["undefined"] or record["failed"]:
        lines.append(f"  no alpha for {record['undefined'] + record['failed']} layer(s):")
        for reason, count in list(record["undefined_reasons"].items())[:5]:
            lines.append(f"    {count} x {reason}")
        more = len(record["undefined_reasons"]) - 5
        if more > 0:
            lines.append(f"    ... {more} more reason(s): results.export_notes() lists each")
    if record.get("noise_like"):
        names = record["noise_like"]
        lines.append(f"  {NOISE_MARK} alpha of {len(names)} layer(s) describes noise "
                     f"({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}): no "
                     "eigenvalue beyond the Marchenko-Pastur bulk (num_spikes 0)")
    if record.get("poor_fits"):
        lines.append(f"  poor power-law fits (pl_fit_quality) on {record['poor_fits']} "
                     "layer(s):")
        for reason, count in list(record["poor_reasons"].items())[:5]:
            lines.append(f"    {count} x {reason}")
        more = len(record["poor_reasons"]) - 5
        if more > 0:
            lines.append(f"    ... {more} more: pl_fit_quality_reason has each layer's")
    return lines


#: What the presets of this repository's spectral pack mean, in a few words (a
#: newcomer reads "csn" as nothing); docs/spectral.md describes every preset.
_GLOSS = {"csn": "Clauset, Shalizi and Newman's exact power-law fit, tails of at least 50 "
                 "points",
          "diffract-0.3": "the original Diffract 0.3.1's ESD scale and alpha limit",
          "custom": "settings of your own, matching no preset"}


def conventions_line(conventions: str) -> str:
    """One line naming the conventions in effect, what they mean and, unless they are
    WeightWatcher's, how to get its numbers (empty when no pack provides presets)."""
    if not conventions:
        return ""
    names = conventions.split(", ")
    if "weightwatcher" in names:
        return f"conventions: {conventions} (WeightWatcher 0.7.7's numbers)"
    glosses = "; ".join(_GLOSS[n] for n in names if n in _GLOSS)
    return (f"conventions: {conventions} ({glosses + '; ' if glosses else ''}presets: "
            "docs/spectral.md); WeightWatcher's numbers: --conventions weightwatcher")


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
