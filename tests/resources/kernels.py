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


def die_on_shape(weights: np.ndarray, *, marker: str = "", shape: tuple = (7, 7)) -> float:
    """Kills its own worker process on parameters of ``shape``: once when ``marker`` names
    a file that does not exist yet (it is created first), every time when it is empty."""
    import os
    import signal

    if tuple(weights.shape) == tuple(shape):
        if not marker:
            os.kill(os.getpid(), signal.SIGKILL)
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    return float(weights.sum())


def hang_on_shape(weights: np.ndarray, *, seconds: float = 60.0, shape: tuple = (7, 7)) -> float:
    """Sleeps ``seconds`` on parameters of ``shape`` (a stuck worker), else returns the sum."""
    import time

    if tuple(weights.shape) == tuple(shape):
        time.sleep(seconds)
    return float(weights.sum())


def worker_threads(weights: np.ndarray) -> int:
    """The BLAS thread limit the worker runs with (OMP_NUM_THREADS)."""
    import os

    return int(os.environ.get("OMP_NUM_THREADS", "0"))


def tick(weights: np.ndarray, *, log: str = "", seconds: float = 1.0) -> float:
    """Appends a line to ``log`` and sleeps ``seconds``: counts the units that ran."""
    import time

    with open(log, "a") as fh:
        fh.write("x\n")
    time.sleep(seconds)
    return float(weights.size)


def idle_pid(weights: np.ndarray, *, per_element: float = 1e-7) -> int:
    """The process id that ran the kernel, after idling ``per_element`` seconds per
    element of ``weights`` (work whose cost follows the unit's size and keeps no core
    busy: what a pool can spread)."""
    import os
    import time

    time.sleep(weights.size * per_element)
    return os.getpid()
