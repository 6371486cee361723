"""``session.results.trajectory``: a field over training, one row per checkpoint.

Rows are the models in scope ordered by step (the index is the step when every model has
one, else the model id); columns are the stored parameters (``by="param"``), their views
(``by="view"``), or the parameter types, each the mean over its parameters where the
value is defined (``by="ptype"``). Cells are the stored values (NaN where a model lacks
one or it is undefined)."""

from __future__ import annotations

import math
from typing import Any

from diffract.errors import InvalidArgumentError

__all__ = ["trajectory"]


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _mean(values: list[float]) -> float:
    """The mean of the defined values (NaN when none is)."""
    defined = [v for v in values if not math.isnan(v)]
    return sum(defined) / len(defined) if defined else math.nan


def trajectory(results: Any, field: str, by: str = "param") -> Any:
    """The frame described in the module docstring (pandas)."""
    import pandas as pd

    if by not in ("param", "view", "ptype"):
        raise InvalidArgumentError(f"by must be 'param', 'view' or 'ptype', got {by!r}.")
    session = results._session
    ids = session.models.ordered(results._scope_ids())
    steps = session.models.steps()
    values = results.export_metrics(field)
    rows: dict[str, dict[str, float]] = {}
    for model_id in ids:
        row: dict[str, list[float]] = {}
        for info in results._scope.params(session.store, model_id):
            is_view = info.parent is not None
            if (by == "view") != is_view or field not in values[model_id].get(info.name, {}):
                continue
            key = info.ptype if by == "ptype" else info.name
            row.setdefault(key, []).append(_number(values[model_id][info.name][field]))
        rows[model_id] = {k: _mean(v) for k, v in row.items()}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.columns.name = by
    if ids and all(steps.get(m, {}).get("step") is not None for m in ids):
        frame.index = pd.Index([steps[m]["step"] for m in ids], name="step")
    else:
        frame.index.name = "model_id"
    return frame
