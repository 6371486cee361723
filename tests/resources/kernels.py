"""Top-level test kernels (picklable, so PARALLEL tests can ship them to workers)."""

from __future__ import annotations

import numpy as np

CALLS: list[str] = []


def squared_sum(weights: np.ndarray, *, offset: float = 0.0) -> float:
    """``sum W^2 + offset``."""
    return float(np.sum(np.square(weights))) + offset


def worker_pid(weights: np.ndarray) -> int:
    """The process id that ran the kernel."""
    import os

    return os.getpid()


def fails_on_bias(weights: np.ndarray) -> float:
    """Raises for 1-D parameters, like a kernel with a data-dependent bug."""
    if np.ndim(weights) == 1:
        raise ValueError(f"cannot handle a vector of length {len(weights)}")
    return float(np.abs(weights).max())


def slow_pair(weights: np.ndarray, *, delay: float = 0.01) -> tuple[float, float]:
    """``(||W||_F, max |W_ij|)`` after sleeping ``delay`` seconds (gives an apply time to
    be killed, with two outputs that must be stored together)."""
    import time

    time.sleep(delay)
    return float(np.sqrt(np.sum(np.square(weights)))), float(np.max(np.abs(weights)))
