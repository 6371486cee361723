"""A numerical self-check on first use: before an op engages for a new kind of call on a
device and toolchain, kernel-fun runs its kernels on a small probe of that kind (forward
and, when the call needs gradients, backward) and compares every output and gradient with
the op's float32 plain-PyTorch reference, within fla's own test tolerances for its chunked
kernels against its naive recurrence. The reference is torch's own arithmetic, so a
toolchain that miscompiles Triton kernels cannot make both sides wrong alike (fla's Triton
kernels compile with the same toolchain as ours).

The verdict is kept for the process, keyed by (op, kind, toolchain); with
``KERNEL_FUN_SELF_CHECK_CACHE=<file>`` also on disk (JSON), so a cluster's ranks and later
runs on the same toolchain agree without checking again. A failed kind sends every later
call of that kind to fla, with one WARNING naming the tensor, its error and the
toolchain. Under CUDA-graph capture no check runs: a kind must have been checked eagerly
first (``warmup``), or the call goes to fla. ``KERNEL_FUN_SELF_CHECK=0`` skips the check:
a toolchain that compiles the kernels wrong then trains on wrong values, silently.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import astuple
from pathlib import Path
from typing import Any

from kernel_fun import _support, _toolchain

__all__ = ["compare", "enabled", "err_ratio", "verdict"]

ENV = "KERNEL_FUN_SELF_CHECK"
CACHE_ENV = "KERNEL_FUN_SELF_CHECK_CACHE"

_lock = threading.Lock()
#: This process's verdicts by (op, kind, toolchain): the per-call lookup builds no JSON key.
_verdicts: dict[tuple, str | None] = {}
#: Seconds each check of this process took, in order (what docs/kernel_fun.md states).
seconds: list[float] = []


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def err_ratio(ref: Any, got: Any) -> float:
    """fla's measure: the RMS of the difference over the RMS of the reference."""
    ref, got = ref.detach().double(), got.detach().double()
    return float((ref - got).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def compare(reference: Mapping[str, Any], ours: Mapping[str, Any],
            tolerance: Mapping[str, float]) -> str | None:
    """The first tensor of ``ours`` that is not ``reference``'s within its tolerance, said
    in a line; None when all agree."""
    import torch

    for name, ref in reference.items():
        got = ours.get(name)
        if got is None or tuple(got.shape) != tuple(ref.shape):
            return f"{name} is {None if got is None else tuple(got.shape)}, expected " \
                   f"{tuple(ref.shape)}"
        if not bool(torch.isfinite(got).all()):
            return f"{name} has non-finite values where the reference has none"
        error = err_ratio(ref, got)
        limit = tolerance.get(name, tolerance.get("*", 0.0))
        if not error <= limit:
            return (f"{name} differs from the reference by {error:.3g} (RMS of the "
                    f"difference over the reference's; tolerance {limit:g})")
    return None


def _key(op: str, kind: tuple, toolchain: _toolchain.Toolchain) -> str:
    return json.dumps([op, [str(k) for k in kind], [str(t) for t in astuple(toolchain)]])


def _disk() -> Path | None:
    """The cache file, if one is set and safe to use: an existing regular file of this
    user (not a link, not a device: ``/dev/null`` is no cache), or a new name in a folder
    this user owns. Anything else is said once and the verdicts stay in the process."""
    raw = os.environ.get(CACHE_ENV)
    if not raw:
        return None
    path = Path(raw)
    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    except OSError as exc:
        return _unsafe(path, f"it cannot be looked at ({exc.strerror})")
    if info is not None:
        if not stat.S_ISREG(info.st_mode):
            return _unsafe(path, "it is not a regular file (a link, a device or a folder)")
        if uid is not None and info.st_uid != uid:
            return _unsafe(path, "it belongs to another user")
        return path
    try:
        folder = path.parent.lstat()
    except OSError as exc:
        return _unsafe(path, f"its folder cannot be looked at ({exc.strerror})")
    if not stat.S_ISDIR(folder.st_mode) or uid is not None and folder.st_uid != uid:
        return _unsafe(path, "it would be a new file in a folder this user does not own "
                             "(another user could plant a link there)")
    return path


def _unsafe(path: Path, why: str) -> None:
    _support.log_once(("selfcheck-cache", str(path)), logging.WARNING,
                      "kernel-fun: %s=%s is not used: %s; verdicts stay in this process",
                      CACHE_ENV, path, why)
    return None


def _load(path: Path) -> dict[str, Any]:
    """The cache's verdicts; an unreadable one (not JSON, nested past the recursion limit,
    not an object) is empty, said once."""
    try:
        stored = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError, RecursionError, UnicodeDecodeError) as exc:
        _support.log_once(("selfcheck-cache-read", str(path)), logging.WARNING,
                          "kernel-fun: the self-check cache %s cannot be read (%s); taken "
                          "as empty", path, type(exc).__name__)
        return {}
    return stored if isinstance(stored, dict) else {}


def _read(key: str) -> tuple[bool, str | None]:
    path = _disk()
    if path is None:
        return False, None
    stored = _load(path)
    found = stored.get(key, False)
    return (True, found) if found is None or isinstance(found, str) else (False, None)


def _write(key: str, result: str | None) -> None:
    path = _disk()
    if path is None:
        return
    part = path.with_name(f".{path.name}.{secrets.token_hex(8)}.part")
    try:
        stored = _load(path)
        stored[key] = result
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(part, flags, 0o600)  # a new file of ours, never a planted link
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(stored, indent=1))
        os.replace(part, path)
    except (OSError, ValueError) as exc:
        if not isinstance(exc, FileExistsError):  # ours, if it was made: not left behind
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)
        _support.log_once(("selfcheck-cache", str(path)), logging.WARNING,
                          "kernel-fun: the self-check cache %s cannot be written (%s); "
                          "verdicts stay in this process", path, exc)


def verdict(op: str, kind: tuple, device: Any, probe: Callable[[], str | None],
            then: str = "every call of this kind goes to fla") -> str | None:
    """None when ``op``'s kernels passed the check for ``kind`` on ``device`` (or checks
    are off); else why they did not (``then`` says what follows, for the log). ``probe``
    runs the check and says what differed, or None."""
    if not enabled():
        return None
    toolchain = _toolchain.current(device)
    seen = (op, kind, toolchain)
    with _lock:
        if seen in _verdicts:
            return _verdicts[seen]
    key = _key(op, kind, toolchain)  # the on-disk cache's key
    found, result = _read(key)
    if not found:
        if _support.is_capturing():
            return ("this kind of call was not self-checked before the CUDA-graph capture "
                    "(no check runs during one): run it eagerly first (or warmup()).")
        started = time.perf_counter()
        try:
            result = probe()
        except Exception as exc:  # noqa: BLE001 - a check that cannot run fails closed
            result = f"the check could not run: {type(exc).__name__}: {exc}"
        seconds.append(time.perf_counter() - started)
        _write(key, result)
    with _lock:
        _verdicts[seen] = result
    if result is not None:
        _support.log_once(
            ("selfcheck", key), logging.WARNING,
            "kernel-fun %s: the self-check failed for %s on %s: %s; %s "
            "(KERNEL_FUN_SELF_CHECK=0 skips the check, at the risk of training on wrong "
            "values).", op, kind, toolchain.describe(), result, then)
    return result


def reset_for_tests() -> None:
    with _lock:
        _verdicts.clear()
    seconds.clear()
