"""What every op shares: device checks, log-once, warm shapes for CUDA graphs, versions.

Switches (environment variables):

* ``KERNEL_FUN_INTERPRET=1`` with ``TRITON_INTERPRET=1`` (both set before triton is
  imported): admit CPU tensors, so tests run the whole op path (gate -> Function ->
  kernels) in Triton's interpreter on a machine without a GPU.
* ``KERNEL_FUN_DEBUG=1``: log every gate decision at INFO, not only the first of each.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Hashable
from typing import Any

log = logging.getLogger("kernel_fun")

#: Oldest architecture the Triton kernels are tuned and tested for (Hopper).
MIN_ARCH = (9, 0)

_lock = threading.Lock()
_logged: set[Hashable] = set()
_warm: set[Hashable] = set()


def interpreter_allowed() -> bool:
    """Whether CPU tensors may take the Triton path (Triton's interpreter, for tests)."""
    env = os.environ
    return env.get("TRITON_INTERPRET") == "1" and env.get("KERNEL_FUN_INTERPRET") == "1"


def device_reason(t: Any) -> str | None:
    """None when ``t``'s device can run the Triton kernels, else a log-ready reason."""
    import torch

    if t.device.type == "cpu" and interpreter_allowed():
        return None
    if t.device.type != "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine, so kernel-fun uses fla."
        return f"the input is on {t.device}, not on a CUDA device, so kernel-fun uses fla."
    major, minor = torch.cuda.get_device_capability(t.device)
    if (major, minor) < MIN_ARCH:
        return (
            f"the GPU is sm{major}{minor}; kernel-fun's Triton kernels need "
            f"sm{MIN_ARCH[0]}{MIN_ARCH[1]} (Hopper) or newer, so kernel-fun uses fla."
        )
    return None


def fla_can_run(t: Any, op: str) -> None:
    """Before a call is handed to fla: fla's kernels are Triton kernels too, and on a
    CPU tensor outside Triton's interpreter they die inside Triton ("0 active
    drivers"). Say so, and how to run both on a CPU, instead (a RuntimeError)."""
    if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"kernel-fun {op}: this call goes to fla, whose kernels are Triton kernels too "
            "and need a CUDA GPU: on a CPU tensor neither runs (Triton would fail with '0 "
            "active drivers'). Move the tensors to a CUDA device, or, for tests on tiny "
            "shapes, run both under Triton's interpreter: set TRITON_INTERPRET=1 and "
            "KERNEL_FUN_INTERPRET=1 before triton is imported.")


def is_capturing() -> bool:
    """Whether the current CUDA stream is being captured into a graph."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def log_once(key: Hashable, level: int, message: str, *args: Any) -> None:
    """Log ``message`` the first time ``key`` is seen (always, with KERNEL_FUN_DEBUG=1)."""
    with _lock:
        first = key not in _logged
        _logged.add(key)
    if first:
        log.log(level, message, *args)
    elif os.environ.get("KERNEL_FUN_DEBUG") == "1":
        log.info(message, *args)


def log_versions() -> None:
    """Log torch, triton and fla versions once."""
    def version(name: str) -> str:
        mod = sys.modules.get(name)
        return getattr(mod, "__version__", "?") if mod is not None else "not imported"

    log_once(("versions",), logging.INFO, "kernel-fun running with torch %s, triton %s, fla %s",
             version("torch"), version("triton"), version("fla"))


def signature_problems(name: str, fn: Any, expected: tuple[str, ...]) -> list[str]:
    """How fla's ``fn`` (its ``name``) differs from the parameters kernel-fun mirrors:
    empty when they are the same, in the same order."""
    import inspect

    params = tuple(inspect.signature(fn).parameters)
    if params != tuple(expected):
        return [f"fla's {name} takes {params}, kernel-fun mirrors {tuple(expected)}"]
    return []


def shape_key(x: Any, w: Any) -> tuple:
    """What a warm shape is keyed by: shapes, strides, dtypes and device (not the stream)."""
    return (tuple(x.shape), x.stride(), x.dtype, w.dtype, str(x.device))


def mark_warm(key: Hashable) -> None:
    with _lock:
        _warm.add(key)


def is_warm(key: Hashable) -> bool:
    return key in _warm


def reset_for_tests() -> None:
    """Forget what was logged and warmed (tests only)."""
    with _lock:
        _logged.clear()
        _warm.clear()
