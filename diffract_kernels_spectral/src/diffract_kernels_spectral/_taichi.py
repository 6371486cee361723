"""The Taichi side of the accelerated fitter: lazy, once-only start and two kernels.

Taichi starts on the CPU (``arch=cpu``, float64) the first time a fit needs it; a
runtime the host program already started is reused, never re-initialised. If taichi is
missing or fails to start, :func:`kernels` raises :class:`FitUnavailableError` with the
reason, every time, without retrying the import.

Both kernels walk the candidates (in the calling thread, or their ``_threads`` twins
over Taichi's threads, for large data sets). For candidate ``c`` with tail start index
``s`` (in the sorted data), tail size ``m = n - s`` and exponent ``alpha``, the distance
at sorted index ``j >= s`` is ``|T(x_j) - A(x_j)|`` with the fitted CDF
``T(x) = 1 - (x / x_s)^(1 - alpha)`` and the empirical CDF ``A(x_j) = (f_j - s) / m``,
``f_j`` being the first index holding the value ``x_j``.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from types import SimpleNamespace
from typing import Any

from diffract.errors import install_hint
from diffract_kernels_spectral.errors import FitUnavailableError

__all__ = ["available", "kernels", "unavailable_reason"]

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {"kernels": None, "error": None}


def _start(ti: Any) -> None:
    try:
        running = ti.lang.impl.get_runtime().prog is not None
    except Exception:  # noqa: BLE001 - private API moved: start our own
        running = False
    if not running:
        # "[Taichi] Starting on arch=..." is printed; and ti.init turns on flush-to-zero
        # (FTZ/DAZ) in this thread, which made every subnormal number of the program 0
        # (numpy's included: 1e-310 * 2 gave 0.0): the environment is put back after it
        with contextlib.redirect_stdout(io.StringIO()), _floating_point_environment_kept():
            ti.init(arch=ti.cpu, default_fp=ti.f64, log_level=ti.ERROR, offline_cache=True)


@contextlib.contextmanager
def _floating_point_environment_kept() -> Any:
    """The calling thread's floating-point environment (x87 and SSE control words, with
    the flush-to-zero bits) saved before and restored after, by C's fegetenv/fesetenv;
    where libm cannot be loaded, as it was."""
    import ctypes
    import ctypes.util

    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        saved = ctypes.create_string_buffer(256)  # fenv_t is 32 bytes on x86-64 glibc
        kept = libm.fegetenv(saved) == 0
    except (OSError, AttributeError):
        kept = False
    try:
        yield
    finally:
        if kept:
            libm.fesetenv(saved)


def _warm_up(tk: Any) -> None:
    """Compile and launch each kernel once on a 3-point data set, here, under the lock.
    Taichi builds its runtime (and each kernel's code) on first launch, and asserts that
    this happens on the thread that started it: two solver threads compiling their first
    kernels side by side killed the fit with "Assertion failure: std::this_thread::get_id()
    == main_thread_id_" (seen on a fresh offline cache: a warm one skips compiling)."""
    import numpy as np

    logx = np.array([0.0, 0.5, 1.0])
    first = np.arange(3, dtype=np.int32)
    starts, ends = np.zeros(1, dtype=np.int32), np.full(1, 3, dtype=np.int32)
    alphas, stops = np.full(1, 2.0), np.full(1, np.inf)
    lower, out = np.zeros(1), np.zeros(1)
    grid = np.arange(3, dtype=np.int32)
    zero, three = np.zeros(1, dtype=np.int32), np.full(1, 3, dtype=np.int32)
    for ks_lower in (tk.ks_lower, tk.ks_lower_threads):
        ks_lower(logx, first, grid, logx, grid, zero, three, zero, starts, ends, alphas,
                 stops, lower, zero.copy(), 3)
    for ks_exact in (tk.ks_exact, tk.ks_exact_threads):
        ks_exact(logx, first, starts, ends, alphas, 1, stops, np.full(1, -1, dtype=np.int32),
                 out)


def kernels() -> SimpleNamespace:
    """The compiled kernels; raises FitUnavailableError when taichi cannot run."""
    if _STATE["kernels"] is not None:
        return _STATE["kernels"]
    with _LOCK:
        if _STATE["kernels"] is None:
            if _STATE["error"] is not None:
                raise FitUnavailableError(_STATE["error"])
            try:
                os.environ.setdefault("TI_LOG_LEVEL", "error")
                with contextlib.redirect_stdout(io.StringIO()):  # taichi's import banner
                    import taichi as ti
                _start(ti)
                from diffract_kernels_spectral import _taichi_kernels as tk

                _warm_up(tk)
                _STATE["kernels"] = SimpleNamespace(
                    ks_lower=tk.ks_lower, ks_exact=tk.ks_exact,
                    ks_lower_threads=tk.ks_lower_threads, ks_exact_threads=tk.ks_exact_threads)
            except ImportError as exc:
                _STATE["error"] = (
                    f"taichi is not installed ({exc}). Install the extra: "
                    f"{install_hint('diffractml-kernels-spectral', 'taichi')}, or use "
                    "fit_method='powerlaw'."
                )
            except Exception as exc:  # noqa: BLE001 - any start-up failure
                _STATE["error"] = (
                    f"taichi failed to initialize on the CPU ({type(exc).__name__}: {exc}). "
                    "Use fit_method='powerlaw' or fix the taichi installation."
                )
            if _STATE["error"] is not None:
                raise FitUnavailableError(_STATE["error"])
    return _STATE["kernels"]


def running() -> bool:
    """Whether the kernels are compiled already (nothing is started to find out)."""
    return _STATE["kernels"] is not None


def available() -> bool:
    """Whether the accelerated fitter can run (starts taichi on first call)."""
    try:
        kernels()
    except FitUnavailableError:
        return False
    return True


def unavailable_reason() -> str | None:
    """Why taichi cannot run, or None when it can (or was not tried yet)."""
    return _STATE["error"]
