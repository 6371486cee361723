"""Sudden changes in a trajectory: a change of one layer's metric far outside that
layer's own history of changes. ``diffract track`` lists them and its report draws them;
both read them from here."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["MIN_HISTORY", "sudden"]

#: Changes of a layer's history needed (besides the one judged) to flag a sudden one.
MIN_HISTORY = 4


def sudden(frame: Any, k: float) -> list[tuple[Any, str, float, float]]:
    """(step, column, change, its size in median absolute deviations) for each change of
    a column beyond ``k`` MADs of that column's other changes (its own history, the
    change itself left out so an event does not hide itself); columns with at least
    :data:`MIN_HISTORY` other changes. The MAD has a floor of 1e-6 of the column's
    typical value, so float noise on a flat series is not an event, and of 1 for a
    count (``num_spikes``), whose MAD is often 0. Largest first."""
    out = []
    for column in frame.columns:
        series = frame[column].to_numpy(dtype=float)
        diffs = np.diff(series)
        finite = np.isfinite(diffs)
        if finite.sum() - 1 < MIN_HISTORY:
            continue
        floor = 1e-6 * (np.nanmedian(np.abs(series)) or 1.0)
        finite_values = series[np.isfinite(series)]
        if np.array_equal(finite_values, np.round(finite_values)):
            floor = 1.0  # counts: one more or less is not an event by itself
        for i in np.flatnonzero(finite):
            others = np.delete(diffs, i)
            others = others[np.isfinite(others)]
            centre = np.median(others)
            mad = max(float(np.median(np.abs(others - centre))), floor)
            size = abs(diffs[i] - centre) / mad
            if size > k:
                out.append((frame.index[i + 1], str(column), float(diffs[i]), float(size)))
    return sorted(out, key=lambda r: -r[3])
