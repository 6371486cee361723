"""How a schedule turns alphas into factors of the user's value: the assignment functions
of TempBalance's ``get_layer_temps`` (YefanZhou/TempBalance, ``assign_func``), written
here from their definitions, as multiples of the user's value rather than rates.

- ``tb_linear_map`` (every schedule's): ``low`` to ``high``, linear in alpha over the
  analysed modules' range (with all alphas equal: the middle, where ``np.interp`` gives
  ``high``).
- ``tb_sqrt``, ``tb_log2``: ``n g(alpha_m) / sum_j g(alpha_j)`` with ``g`` the square
  root or the base-2 logarithm: factors whose mean over the ``n`` modules is 1, with no
  range (``low`` and ``high`` are not read).
- ``tb_step``: by rank, the ``i``-th smallest of ``n`` alphas (from 0) gets ``low + (high
  - low) i / n`` (the largest stays below ``high``, as theirs); equal alphas share the
  mean of their ranks' factors (theirs orders ties by position).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

#: The assignment functions, TempBalance's ``assign_func`` names.
ASSIGN = ("tb_linear_map", "tb_sqrt", "tb_log2", "tb_step")


def factors(assign: str, alphas: Mapping[str, float], low: float, high: float,
            top: float | None = None) -> dict[str, float]:
    """Each module's factor; empty with fewer than two alphas (nothing to balance), or
    where a function is undefined for these alphas (a logarithm of an alpha under 1:
    Hill's estimator is above 1 wherever it is defined). ``top``: an alpha the linear
    range reaches up to besides those of ``alphas`` (LayerwiseLR's pinned modules)."""
    if len(alphas) < 2:
        return {}
    if assign == "tb_linear_map":
        least, most = min(alphas.values()), max(alphas.values())
        if top is not None and math.isfinite(top):
            most = max(most, top)
        if most == least:
            return dict.fromkeys(alphas, (low + high) / 2)
        return {m: low + (a - least) / (most - least) * (high - low)
                for m, a in alphas.items()}
    if assign in ("tb_sqrt", "tb_log2"):
        if min(alphas.values()) < (0.0 if assign == "tb_sqrt" else 1.0):
            return {}
        scores = {m: math.sqrt(a) if assign == "tb_sqrt" else math.log2(a)
                  for m, a in alphas.items()}
        total = math.fsum(scores.values())
        if not total > 0:
            return {}
        return {m: len(scores) * s / total for m, s in scores.items()}
    if assign == "tb_step":
        ranked = sorted(alphas, key=lambda m: alphas[m])
        n = len(ranked)
        by_rank = {m: low + (high - low) * i / n for i, m in enumerate(ranked)}
        tied: dict[float, list[str]] = {}
        for m in ranked:
            tied.setdefault(alphas[m], []).append(m)
        return {m: math.fsum(by_rank[t] for t in tied[alphas[m]]) / len(tied[alphas[m]])
                for m in alphas}
    raise ValueError(f"unknown assignment function {assign!r}: one of {', '.join(ASSIGN)}")
