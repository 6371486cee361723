"""The cache manager: how many bytes of inputs one chunk may read.

The budget is the memory the machine has available (``MemAvailable`` on Linux), less a
headroom fraction, capped by ``[cache] max_bytes``, shared by ``CacheManager.IN_FLIGHT``."""

from __future__ import annotations

import os

__all__ = ["CacheManager"]


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover
        return 2 << 30


class CacheManager:
    """Derives the per-chunk read budget; see the module docstring."""

    #: Chunks resident at once: computing, queued behind it (pipelined), prefetching.
    IN_FLIGHT = 3

    def __init__(self, max_bytes: int = 0, headroom: float = 0.25) -> None:
        self.max_bytes = max_bytes
        self.headroom = headroom

    def available_bytes(self) -> int:
        """Bytes Diffract may hold now: available memory less headroom, capped."""
        free = int(_available_memory() * (1.0 - self.headroom))
        return min(free, self.max_bytes) if self.max_bytes else free

    def read_budget(self) -> int:
        """Bytes of inputs one chunk may read (at least 1)."""
        return max(1, self.available_bytes() // self.IN_FLIGHT)
