"""Freed decomposition buffers go back to the system in ``diffract track``'s processes.

glibc's allocator serves a block above its mmap threshold (128 KiB at first) from a
mapping it unmaps on free, and then raises the threshold to that block's size (up to
32 MiB): after the first freed 8 MiB SVD buffer, every later buffer of up to 32 MiB
comes from the heap, and what is freed there stays with the process. A track of small
checkpoints (matrices of a few MiB) peaked at 438 MiB for 240 MiB of live data, the
rest freed SVD and Gram buffers held by the allocator (docs/storage.md). A fixed
threshold of 1 MiB turns the raise off: those buffers are unmapped on free, at the cost
of the kernel zeroing fresh pages for each (about 7% of that small run's time; buffers
of 32 MiB and more, every matrix of a 1B model, were mapped afresh already).

Set only in processes Diffract owns (``diffract track`` and the workers it starts: they
inherit ``MALLOC_MMAP_THRESHOLD_``, which glibc reads at start), never in a host program
that embeds the library; a threshold the user set is left alone; elsewhere than glibc,
nothing is done."""

from __future__ import annotations

import ctypes
import os

__all__ = ["return_freed_buffers"]

#: glibc's mallopt parameter number for the mmap threshold (malloc.h's M_MMAP_THRESHOLD).
_M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 20


def return_freed_buffers() -> bool:
    """Fix the allocator's mmap threshold at ``THRESHOLD`` in this process and in those
    it starts; False where the user set one or the C library is not glibc."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's alone (musl has mallopt, not this)
    except (OSError, AttributeError):
        return False
    if libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD) != 1:
        return False
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(THRESHOLD)
    return True
