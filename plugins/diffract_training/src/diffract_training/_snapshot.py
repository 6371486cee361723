"""What the analysis reads at a cadence point: the live parameters, copied off the loop
within a byte limit (:class:`Snapshot`), and the process's rank."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["Snapshot", "blocks", "nbytes", "rank"]


class Snapshot:
    """The analysed weights of one cadence point, copied off the loop.

    Torch parameters are not copied at the cadence point: each tensor handed to the
    analysis is an alias of the live parameter, which holds the step's values until an
    optimizer next changes it. The worker copies the block it is about to analyse and,
    ahead of it, as many further blocks as fit in ``limit`` bytes of copies alive; a
    block's copy is freed once it is analysed. Just before any optimizer steps (a step
    pre-hook), what is still live is copied by the loop if it fits in the limit, else the
    loop waits for the worker to get through it. A parameter changed in place by anything
    but an optimizer step (its ``_version`` moved before it was copied) spoils the step,
    which is then not kept. Numpy arrays are copied at once; ``fixed`` holds copies made
    already (the gathered DTensors).
    """

    def __init__(self, live: Mapping[str, Any], size: Mapping[str, int], limit: float,
                 fixed: Mapping[str, Any]) -> None:
        # The loop's part is this: versions, and copies of what cannot stay live.
        self.tensors: dict[str, Any] = dict(fixed)
        self.live: dict[str, Any] = {}
        for name, value in live.items():
            if name in fixed:  # already a copy of its own (a gathered DTensor)
                continue
            if hasattr(value, "_version"):
                self.live[name] = value
            else:
                self.tensors[name] = np.array(value)
        self.version = {n: v._version for n, v in self.live.items()}
        self.order = list(live)
        self.size = size
        self.pending = dict.fromkeys(self.live)  # in order; not copied yet
        self.pending_bytes = sum(size[n] for n in self.pending)
        self.held = self.peak = 0  # bytes of copies alive (now, at most)
        self.limit = limit
        self.stale: list[str] = []
        self.blocked = 0.0  # seconds the loop spent here (copying or waiting)
        self.worked = 0.0  # seconds the worker spent analysing (this rank's share)
        self.copied = 0  # bytes the loop copied
        self.cond = threading.Condition()

    def aliases(self) -> dict[str, Any]:
        """The worker's first act: every analysed name to a tensor (an alias of the live
        parameter until it is copied), in the analysed order."""
        with self.cond:
            for name in self.live:
                if name not in self.tensors:
                    self.tensors[name] = alias(self.live[name])
            return {n: self.tensors[n] for n in self.order}

    def _copy(self, name: str) -> None:
        if name in self.pending:
            del self.pending[name]
            self.pending_bytes -= self.size[name]
            self.held += self.size[name]
            self.peak = max(self.peak, self.held)
            if self.live[name]._version != self.version[name]:
                self.stale.append(name)
            copy = self.live[name].detach().clone()
            target = self.tensors.get(name)
            if target is None:  # the worker has not made its alias yet
                self.tensors[name] = copy
            else:  # the alias now owns a copy; the parameter is untouched
                target.set_(copy)

    def take(self, block: Sequence[str], ahead: Sequence[Sequence[str]]) -> None:
        """The worker's side: copy ``block`` (what is still live of it) before reading
        it, then the blocks ``ahead`` in order while their copies fit in the limit."""
        with self.cond:
            for name in block:
                self._copy(name)
            for later in ahead:
                live = [n for n in later if n in self.pending]
                if self.held + sum(self.size[n] for n in live) > self.limit:
                    break
                for name in live:
                    self._copy(name)
            self.cond.notify_all()

    def release(self, names: Sequence[str]) -> None:
        """Free the copies of ``names`` (and forget any still live: the analysis ended)."""
        with self.cond:
            for name in names:
                value = self.tensors.get(name)
                if name in self.pending:
                    del self.pending[name]
                    self.pending_bytes -= self.size[name]
                elif name in self.live and value is not None and value.numel():
                    self.held -= self.size[name]  # a copy of ours, not freed yet
                if hasattr(value, "set_"):
                    value.set_()
            self.cond.notify_all()

    def forget(self) -> None:
        """Drop every tensor reference once the analysis is over: what stays (in
        ``Monitor._taken``, for ``blocked`` and ``copied``) is the step's numbers."""
        with self.cond:
            self.live.clear()
            self.tensors.clear()
            self.pending.clear()
            self.pending_bytes = 0
            self.cond.notify_all()

    def before_update(self, running: Callable[[], bool]) -> None:
        """The loop's side, just before an optimizer changes the weights in place."""
        if not self.pending:
            return
        start = time.perf_counter()
        with self.cond:
            while self.pending and self.held + self.pending_bytes > self.limit and running():
                self.cond.wait(timeout=1.0)  # woken by take(); the timeout only re-checks
            self.copied += self.pending_bytes
            for name in list(self.pending):
                self._copy(name)
        self.blocked += time.perf_counter() - start


def alias(value: Any) -> Any:
    """A tensor on ``value``'s storage with a version counter of its own: re-pointing it
    at a copy (``set_``) then leaves the parameter's counter, which autograd checks on
    the tensors it saved for backward, untouched (``detach()`` would share it)."""
    import torch

    with torch.no_grad():
        return torch.empty(0, dtype=value.dtype, device=value.device).set_(
            value.detach().untyped_storage(), value.storage_offset(), value.size(),
            value.stride())


def nbytes(value: Any) -> int:
    return int(value.numel()) * int(value.element_size())


def rank() -> int:
    """This process's rank: torch.distributed's once it is set up, else the launcher's
    (``RANK``, ``LOCAL_RANK``: torchrun, Lightning), else 0."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    for key in ("RANK", "LOCAL_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def blocks(names: Sequence[str], sizes: Mapping[str, int], cap: float) -> list[list[str]]:
    """``names`` in order, in runs of at most ``cap`` bytes (one name at least)."""
    out: list[list[str]] = []
    held = 0.0
    for name in names:
        if not out or held + sizes[name] > cap:
            out.append([])
            held = 0.0
        out[-1].append(name)
        held += sizes[name]
    return out
