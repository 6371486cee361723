"""The symmetric eigensolver called straight from the OpenBLAS inside numpy's wheel.

``scipy.linalg.eigh(driver="evr")`` and this module run the same LAPACK routine
(``?syevr``, all eigenvalues, no vectors, ``abstol = 0``) and give the same bits. Going
around scipy saves its import (0.25 s of a 0.6 s ``diffract analyze``: ``scipy.linalg``
loads ``numpy.testing`` and ``numpy.f2py`` through its array-API layer), and a ctypes
call releases the GIL, so one solver per core runs truly side by side (scipy's wrapper
holds the GIL through the whole solve).

:func:`library` is ``None`` where numpy was not built against its bundled
``scipy-openblas`` (a conda or MKL build, a platform whose library is not found): the
callers then take scipy's route and thread limits by threadpoolctl, as before.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Any

import numpy as np

_COL_MAJOR = 102  # LAPACKE's column-major layout
_INT = ctypes.c_int64  # the bundled library is ILP64 (its symbols end in 64_)
_PREFIX, _SUFFIX = "scipy_", "64_"


class _Bundled:
    """numpy's OpenBLAS: ``?syevr`` for float32 and float64, and its thread count."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.syevr = {np.dtype(np.float32): self._function(lib, "LAPACKE_ssyevr", ctypes.c_float),
                      np.dtype(np.float64): self._function(lib, "LAPACKE_dsyevr", ctypes.c_double)}
        self.get_threads = getattr(lib, f"{_PREFIX}openblas_get_num_threads{_SUFFIX}")
        self.get_threads.restype = ctypes.c_int
        self.get_threads.argtypes = []
        self.set_threads = getattr(lib, f"{_PREFIX}openblas_set_num_threads{_SUFFIX}")
        self.set_threads.restype = None
        self.set_threads.argtypes = [ctypes.c_int]

    @staticmethod
    def _function(lib: ctypes.CDLL, name: str, real: Any) -> Any:
        fn = getattr(lib, f"{_PREFIX}{name}{_SUFFIX}")
        p_real, p_int = ctypes.POINTER(real), ctypes.POINTER(_INT)
        fn.restype = _INT
        # layout, jobz, range, uplo, n, a, lda, vl, vu, il, iu, abstol, m, w, z, ldz, isuppz
        fn.argtypes = [ctypes.c_int, ctypes.c_char, ctypes.c_char, ctypes.c_char, _INT,
                       p_real, _INT, real, real, _INT, _INT, real, p_int, p_real, p_real, _INT,
                       p_int]
        return fn


@functools.cache
def library() -> _Bundled | None:
    """numpy's bundled OpenBLAS when numpy uses it and it has LAPACKE, else ``None``."""
    try:
        config = np.show_config(mode="dicts")["Build Dependencies"]["lapack"]
    except Exception:  # noqa: BLE001 - an older or unusual numpy: not ours to guess
        return None
    if config.get("name") != "scipy-openblas":
        return None
    root = os.path.dirname(os.path.dirname(np.__file__))
    patterns = ("numpy.libs/*scipy_openblas64_*", "numpy/.dylibs/*scipy_openblas64_*")
    candidates = [path for pattern in patterns
                  for path in sorted(glob.glob(os.path.join(root, pattern)))]
    for path in candidates:
        try:
            return _Bundled(ctypes.CDLL(path))  # already loaded by numpy: the same handle
        except (OSError, AttributeError):
            continue
    return None


def eigvalsh(gram: np.ndarray) -> np.ndarray:
    """All eigenvalues of the symmetric ``gram`` (float32 or float64, C-contiguous),
    ascending, in its dtype; ``gram`` is overwritten.

    The Gram products here are exactly symmetric (one triangle computed, the other
    copied), so the C-ordered buffer read as column-major is the same matrix, and its
    lower triangle is what scipy's ``eigh(lower=True)`` hands the same routine.
    """
    lib = library()
    if lib is None:
        raise RuntimeError("numpy's bundled OpenBLAS is not available")
    if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or not gram.flags.c_contiguous:
        raise ValueError(f"a square C-contiguous matrix is needed, got shape {gram.shape}")
    fn = lib.syevr[gram.dtype]
    n = gram.shape[0]
    real = ctypes.c_float if gram.dtype == np.float32 else ctypes.c_double
    p_real, p_int = ctypes.POINTER(real), ctypes.POINTER(_INT)
    values = np.empty(n, dtype=gram.dtype)
    found = _INT(0)
    unused = np.zeros(1, dtype=gram.dtype)  # z: no vectors asked for
    support = np.zeros(2 * max(n, 1), dtype=np.int64)
    info = fn(_COL_MAJOR, b"N", b"A", b"L", n, gram.ctypes.data_as(p_real), max(n, 1),
              0.0, 0.0, 0, 0, 0.0, ctypes.byref(found), values.ctypes.data_as(p_real),
              unused.ctypes.data_as(p_real), 1, support.ctypes.data_as(p_int))
    if info != 0 or found.value != n:
        raise np.linalg.LinAlgError(
            f"the eigensolver (LAPACK ?syevr) failed on a {n}x{n} Gram matrix "
            f"(info {info}, {found.value} of {n} eigenvalues): a NaN or infinite entry?")
    return values
