"""The core's executors for PARALLEL kernels: sequential, threads and processes.

An executor is a factory returning a ``concurrent.futures.Executor``-shaped object.
The process executor uses the ``spawn`` start method: forking a process that already
runs threads (the prefetch pool, torch's intra-op pool) can deadlock, and spawned
workers import kernels by their module path, which is what makes a kernel picklable.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

__all__ = ["InlineExecutor", "process_executor", "sequential_executor", "thread_executor"]


class InlineExecutor(Executor):
    """Runs each task at submit time in the calling thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - delivered through the future
            future.set_exception(exc)
        return future


def sequential_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    return InlineExecutor()


def thread_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    return ThreadPoolExecutor(
        max_workers=int(options.get("max_workers", config.process_workers)),
        thread_name_prefix="diffract-kernel",
    )


def process_executor(config: Any, options: Mapping[str, Any]) -> Executor:
    return ProcessPoolExecutor(
        max_workers=int(options.get("max_workers", config.process_workers)),
        mp_context=multiprocessing.get_context(options.get("start_method", "spawn")),
    )
