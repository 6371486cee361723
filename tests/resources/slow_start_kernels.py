"""A kernel module that takes seconds to import in a worker process (DIFFRACT_TEST_SLOW_IMPORT
seconds), as a busy machine makes every import: a unit timeout must not count it."""

import os
import time

import numpy as np

if os.environ.get("DIFFRACT_TEST_SLOW_IMPORT") and os.getpid() != int(
        os.environ.get("DIFFRACT_TEST_PARENT", "0")):
    time.sleep(float(os.environ["DIFFRACT_TEST_SLOW_IMPORT"]))


def slow_hang(weights: np.ndarray, *, seconds: float = 60.0, shape: tuple = (7, 7)) -> float:
    """Sleeps ``seconds`` on parameters of ``shape`` (a stuck worker), else returns the sum."""
    if tuple(weights.shape) == tuple(shape):
        time.sleep(seconds)
    return float(weights.sum())
