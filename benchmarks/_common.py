"""Shared helpers of the benchmark scripts: timing, the header, tables."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of ``repeats`` calls (after a warm-up call the caller makes): the
    floor of a computation on a machine whose speed moves between timings."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def header(title: str, packages: Sequence[str]) -> None:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip() or "?"
    except OSError:
        commit = "?"
    versions = []
    for name in packages:
        try:
            versions.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            versions.append(f"{name} (not installed)")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"# {title}")
    print(f"# commit {commit}; {platform.python_implementation()} {platform.python_version()}; "
          f"{platform.machine()}, {cpus} CPUs; " + "; ".join(versions))
    if hasattr(os, "getloadavg"):
        print("# load average (1, 5, 15 min) at the start: "
              + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


def table(header_row: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [list(map(str, header_row))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header_row))]
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
