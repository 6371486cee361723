"""Per-layer allocations from a stored metric: what
``diffract_kernels_spectral.sparsity_schedule(session, ...)`` and ``diffract analyze
--schedule`` compute (the spectral pack's, not the core's: the core knows no metric).

``alphapruning`` is the layer-wise sparsity of AlphaPruning (Lu et al., NeurIPS 2024):
layers whose ESD is less heavy-tailed (larger alpha: less trained, so less to lose) are
pruned more. With the metric ``a_l`` of each layer (``pl_alpha_hill`` by default, the
paper's), ``f_l = (1 - eps) + 2 eps (a_l - a_min) / (a_max - a_min)`` maps the metric
linearly onto ``[1 - eps, 1 + eps]``, and the ratios ``s_l = s f_l sum(n) / sum(f n)``
(``n_l`` the layer's number of weights) keep the model's overall sparsity at ``s``
exactly: each layer gets about ``s (1 +- eps)``. ``by="block"`` first averages the
metric over each transformer block (the parameters sharing the path up to their first
number, ``model.layers.3``), AlphaPruning's block-wise mapping.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from diffract.errors import DiffractWarning, InvalidArgumentError, warn

__all__ = ["METHODS", "alphapruning", "block_of", "sparsity_schedule"]

METHODS = ("alphapruning",)
_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")


def block_of(name: str) -> str:
    """The transformer block a parameter belongs to: its path up to the first number
    (``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.3``); the name itself when
    it has none (an embedding, the head: a block of its own)."""
    found = _BLOCK.match(name)
    return found.group(1) if found else name


def alphapruning(metric: Mapping[str, float], sizes: Mapping[str, int], sparsity: float,
                 epsilon: float = 0.3, by: str = "layer") -> dict[str, float]:
    """Sparsity per parameter (see the module docstring). ``metric`` and ``sizes`` by
    parameter name; names whose metric is not finite are left out with a warning.
    Raises InvalidArgumentError for a sparsity outside (0, 1), an epsilon outside [0, 1),
    fewer than one usable layer, or ratios that would leave [0, 1] (choose a smaller
    epsilon)."""
    if not 0.0 < sparsity < 1.0:
        raise InvalidArgumentError(f"sparsity must be between 0 and 1 (the share of weights "
                                   f"pruned, e.g. 0.7), got {sparsity!r}.")
    if not 0.0 <= epsilon < 1.0:
        raise InvalidArgumentError(f"epsilon must be in [0, 1) (each layer gets about "
                                   f"sparsity x (1 +- epsilon)), got {epsilon!r}.")
    if by not in ("layer", "block"):
        raise InvalidArgumentError(f"by must be 'layer' or 'block', got {by!r}.")
    usable = {n: float(v) for n, v in metric.items()
              if isinstance(v, int | float) and math.isfinite(v)}
    left_out = sorted(set(metric) - set(usable))
    if left_out:
        warn(DiffractWarning(
            f"{len(left_out)} parameter(s) have no defined metric and are left out of the "
            f"schedule (prune them at the target sparsity or not at all): "
            f"{', '.join(left_out[:5])}{' ...' if len(left_out) > 5 else ''}"))
    if not usable:
        raise InvalidArgumentError("No parameter has a defined metric to schedule from; "
                                   "compute it first (e.g. apply('pl_alpha_hill')).")
    names = list(usable)
    values = np.array([usable[n] for n in names])
    if by == "block":
        blocks = [block_of(n) for n in names]
        means = {b: float(np.mean([v for v, c in zip(values, blocks, strict=True) if c == b]))
                 for b in set(blocks)}
        values = np.array([means[b] for b in blocks])
    low, high = float(values.min()), float(values.max())
    spread = (values - low) / (high - low) if high > low else np.zeros_like(values)
    factors = (1.0 - epsilon) + 2.0 * epsilon * spread
    n = np.array([float(sizes[name]) for name in names])
    ratios = sparsity * factors * n.sum() / float((factors * n).sum())
    if ratios.max() > 1.0 or ratios.min() < 0.0:
        worst = names[int(np.argmax(ratios))]
        raise InvalidArgumentError(
            f"With sparsity {sparsity:g} and epsilon {epsilon:g}, {worst} would get a "
            f"sparsity of {ratios.max():.3f}, more than 1: choose a smaller epsilon (at "
            f"most about {(1.0 / sparsity - 1.0):.3f} here).")
    return {name: float(r) for name, r in zip(names, ratios, strict=True)}


def sparsity_schedule(session: Any, method: str = "alphapruning", sparsity: float = 0.7, *,
                      metric: str | None = None, epsilon: float = 0.3, by: str = "layer",
                      model_id: str | None = None) -> dict[str, float]:
    """Per-layer sparsity by parameter name: ``method`` (AlphaPruning's mapping, see the
    module docstring) applied to one model's stored ``metric`` (``pl_alpha_hill`` by
    default), over its matrices in the scope of ``session`` (a session or a filtered
    view of one; views of parameters left out)."""
    if method not in METHODS:
        raise InvalidArgumentError(f"Unknown schedule {method!r}; known: {list(METHODS)}.")
    metric = metric or "pl_alpha_hill"
    ids: Sequence[str] = session.model_ids
    if model_id is None:
        if len(ids) != 1:
            raise InvalidArgumentError(
                f"A schedule is for one model; the scope holds {len(ids)}: pass model_id= "
                f"(one of {list(ids)}) or filter the session to one.")
        model_id = ids[0]
    elif model_id not in ids:
        raise InvalidArgumentError(f"Model {model_id!r} is not in scope ({list(ids)}).")
    rows = session.results.export_metrics(metric).get(model_id, {})
    root = getattr(session, "session", session)  # a view's session holds the models
    params = {p.name: p for p in root.models.params(model_id)}
    chosen = {name: row.get(metric) for name, row in rows.items()
              if name in params and params[name].parent is None
              and len(params[name].shape) >= 2}
    if not chosen:
        raise InvalidArgumentError(
            f"Model {model_id!r} has no stored {metric!r} on its matrices: compute it first "
            f"(session.compute.apply({metric!r})).")
    sizes = {name: math.prod(params[name].shape) for name in chosen}
    return alphapruning(chosen, sizes, sparsity, epsilon, by)
