"""Readings of a session's results a person looks at: per-model summaries (the
WeightWatcher-style reading of alpha) and a one-file HTML report.

``summarize(session)`` is what ``diffract analyze`` prints under its table;
``write_html(session, path)`` is what ``--report`` writes. Both only read results: run
``compute.apply`` first.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["ALPHA_OVER_TRAINED", "ALPHA_UNDER_TRAINED", "summarize"]

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
    """One record per model: how many layers have ``alpha`` stored, its mean and
    median over the layers where it is defined, the mean of ``weighted``, the share of
    layers with alpha below 2 (likely over-trained) and above 6 (likely under-trained),
    and the layers where alpha is undefined with their reasons grouped
    (``undefined_reasons``: reason -> count; reasons that differ only in their numbers
    are one group, shown by its first reason).

    Works in a view (``session.filter(...)``) on the parameters in scope. Fields that
    are not stored give None, not an error.
    """
    results = session.results
    ids = list(model_ids) if model_ids is not None else list(session.model_ids)
    stored = set(results.export_metrics())  # every model in scope
    known = set(session.compute.list_available_metrics())
    fields = [f for f in (alpha, weighted) if f in known]
    table = results.export_metrics(*fields) if fields else {}
    notes = [n for n in results.export_notes() if n["kind"] in ("undefined", "failed")]
    producer = None
    if alpha in known:
        producer = next((r["kernel"] for r in session.compute.list_available_metrics(True)
                         if r["field"] == alpha), None)
    out = []
    for model_id in ids:
        if model_id not in stored:
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
            "layers": len(alphas),
            "alpha_defined": count,
            "alpha_mean": float(defined.mean()) if count else math.nan,
            "alpha_median": float(np.median(defined)) if count else math.nan,
            "alpha_weighted_mean": float(np.mean(weights_ok)) if weights_ok else math.nan,
            "share_over_trained": float((defined < ALPHA_OVER_TRAINED).mean()) if count
            else math.nan,
            "share_under_trained": float((defined > ALPHA_UNDER_TRAINED).mean()) if count
            else math.nan,
            "undefined": len(alphas) - count,
            "failed": failed,
            "undefined_reasons": {shown[g]: c for g, c in reasons.most_common()},
        })
    return out


def summary_lines(record: Mapping[str, Any]) -> list[str]:
    """A summary record as the few lines ``diffract analyze`` prints."""

    def pct(x: float) -> str:
        return "-" if math.isnan(x) else f"{100 * x:.0f}%"

    def num(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.3f}"

    lines = [
        f"{record['model_id']}: {record['layers']} layers with alpha, "
        f"{record['alpha_defined']} defined",
        f"  alpha mean {num(record['alpha_mean'])}, median {num(record['alpha_median'])}; "
        f"alpha_weighted mean {num(record['alpha_weighted_mean'])}",
        f"  alpha < {ALPHA_OVER_TRAINED:g} (likely over-trained): "
        f"{pct(record['share_over_trained'])} of layers; alpha > {ALPHA_UNDER_TRAINED:g} "
        f"(likely under-trained): {pct(record['share_under_trained'])}",
    ]
    if record["undefined"] or record["failed"]:
        lines.append(f"  no alpha for {record['undefined']} layer(s):")
        for reason, count in list(record["undefined_reasons"].items())[:5]:
            lines.append(f"    {count} x {reason}")
        more = len(record["undefined_reasons"]) - 5
        if more > 0:
            lines.append(f"    ... {more} more reason(s): results.export_notes() lists each")
    return lines
