"""A monitor's ranks under ``torch.distributed``: who analyses which matrices, and the
few collectives that keep every rank in step.

Every collective here is made on the training thread, at points every rank reaches in
the same order (a cadence point; each step while an analysis is in flight; the end), so
they interleave with the training's own collectives as any training code's do. A
worker thread never makes one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from diffract.errors import DiffractError

__all__ = ["Ranks", "shares", "world"]

#: Seconds a rank waits for the others: to attach (the handshake) and to finish a step's
#: analysis (past it, the step is abandoned on every rank). DIFFRACT_DIST_TIMEOUT sets it.
TIMEOUT = 600.0


def world() -> tuple[int, int]:
    """(rank, size) of torch.distributed's default group, or (0, 1) outside one."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def timeout() -> float:
    raw = os.environ.get("DIFFRACT_DIST_TIMEOUT", "")
    try:
        value = float(raw) if raw else TIMEOUT
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise DiffractError(f"DIFFRACT_DIST_TIMEOUT takes a number of seconds above 0, got "
                            f"{raw!r}.")
    return value


def shares(names: Sequence[str], sizes: Mapping[str, int], n: int) -> list[list[str]]:
    """``names`` dealt to ``n`` ranks, balanced by bytes: the largest first, each to the
    rank holding the fewest bytes so far (the lowest rank on a tie); each share in the
    model's order. The same on every rank: it depends on the names and sizes alone."""
    held = [0] * n
    owner: dict[str, int] = {}
    for name in sorted(names, key=lambda m: (-sizes[m], names.index(m))):
        r = min(range(n), key=lambda i: (held[i], i))
        owner[name] = r
        held[r] += sizes[name]
    return [[m for m in names if owner[m] == r] for r in range(n)]


class Ranks:
    """The default group as a monitor uses it (``rank``, ``size``); every method is a
    collective, and a failure of the group is a DiffractError that says so."""

    def __init__(self, rank: int, size: int, what: str) -> None:
        import torch.distributed as dist

        self.rank, self.size, self.what = rank, size, what
        self.timeout = timeout()
        backend = str(dist.get_backend()).lower()
        self.device = "cuda" if "nccl" in backend else "cpu"

    def _failed(self, exc: BaseException) -> DiffractError:
        return DiffractError(
            f"{self.what}: torch.distributed failed on rank {self.rank} of {self.size} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}): a "
            "rank left the process group, or it was torn down while training ran. Every "
            "rank builds, steps and closes the monitor (or callback, or schedule) alike.")

    def check(self) -> None:
        """The group is still up (a torn-down one would make the next collective hang or
        run alone)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise DiffractError(
                f"{self.what}: torch.distributed's process group was destroyed on rank "
                f"{self.rank} while it was attached there (world size {self.size}); close "
                "the monitor (or end training) before destroy_process_group().")

    def most(self, flags: Sequence[int]) -> list[int]:
        """Each flag's largest value over the ranks."""
        import torch
        import torch.distributed as dist

        self.check()
        tensor = torch.tensor(list(flags), dtype=torch.int64, device=self.device)
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        except (RuntimeError, ValueError) as exc:
            raise self._failed(exc) from None
        return [int(v) for v in tensor.tolist()]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        import torch.distributed as dist

        self.check()
        out: list[Any] = [None] * self.size
        try:
            dist.all_gather_object(out, obj)
        except (RuntimeError, ValueError) as exc:
            raise self._failed(exc) from None
        return out

    def handshake(self, number: int, signature: Mapping[str, Any]) -> None:
        """Every rank attaches its ``number``-th monitor with the same ``signature`` (the
        model's analysed matrices, the cadence, who drives it), or every rank that got
        here raises, naming what differs: through the group's store, with a timeout, so
        that a rank that attached nothing is found instead of waited for."""
        from datetime import timedelta

        import torch.distributed.distributed_c10d as c10d

        try:
            store = c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):  # pragma: no cover - no store
            return
        text = json.dumps(signature, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()
        key = f"diffract/attach/{number}"
        try:
            store.set(f"{key}/{self.rank}", text)
            store.wait([f"{key}/{r}" for r in range(self.size)],
                       timedelta(seconds=self.timeout))
            theirs = {r: store.get(f"{key}/{r}").decode() for r in range(self.size)}
        except (RuntimeError, ValueError) as exc:  # the store's timeout, or a lost peer
            missing = []
            for r in range(self.size):
                try:
                    if not store.check([f"{key}/{r}"]):
                        missing.append(r)
                except (RuntimeError, ValueError):
                    break
            raise DiffractError(
                f"{self.what}: rank(s) {missing or '?'} of {self.size} did not attach their "
                f"{_ordinal(number)} Diffract monitor within {self.timeout:g} s "
                f"({type(exc).__name__}): build the same callback, monitor and schedules "
                "on every rank (as the launcher runs one script), or raise "
                "DIFFRACT_DIST_TIMEOUT.") from None
        try:  # every rank has read every signature before any raises and leaves (rank
            store.set(f"{key}/seen/{self.rank}", "1")  # 0 may host the store)
            store.wait([f"{key}/seen/{r}" for r in range(self.size)],
                       timedelta(seconds=self.timeout))
        except (RuntimeError, ValueError):
            pass
        differ = [r for r, t in theirs.items()
                  if hashlib.sha256(t.encode()).hexdigest() != digest]
        if differ:
            mine = signature
            other = json.loads(theirs[differ[0]])
            keys = sorted(k for k in set(mine) | set(other) if mine.get(k) != other.get(k))
            raise DiffractError(
                f"{self.what}: rank {self.rank} and rank(s) {differ} attached different "
                f"monitors (they differ in {', '.join(keys)}): every rank must watch the "
                "same model with the same settings and schedules.")


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")
