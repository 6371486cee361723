"""PARALLEL kernels on dask.distributed: an existing cluster by address, or a
LocalCluster started on first use.

:class:`DaskExecutor` is a ``concurrent.futures.Executor``: ``submit`` ships the kernel
(by reference: a top-level function of an importable module, which the workers must
have installed) and its inputs, tasks are impure (never deduplicated by Dask), and
``shutdown(cancel_futures=True)`` cancels what is queued. A LocalCluster's workers are
single-threaded processes, each limited to its share of the cores for BLAS, as the
``processes`` executor's are.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DaskExecutor", "check_options"]

_OPTIONS = ("address", "n_workers", "timeout", "read_files")


def check_options(config: Any, options: Mapping[str, Any]) -> list[str]:
    """Problems with the ``dask`` executor's options."""
    problems = []
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        problems.append(f"unknown option(s) {unknown}; it accepts {list(_OPTIONS)}")
    address = options.get("address")
    if address is not None and not isinstance(address, str):
        problems.append(f"address must be a scheduler address string, got {address!r}")
    workers = options.get("n_workers", config.process_workers)
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        problems.append(f"n_workers must be an integer >= 1, got {workers!r}")
    read_files = options.get("read_files", address is None)
    if not isinstance(read_files, bool):
        problems.append(f"read_files must be true or false, got {read_files!r}")
    timeout = options.get("timeout", 30)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        problems.append(f"timeout must be a positive number of seconds, got {timeout!r}")
    return problems


def spawns(options: Mapping[str, Any]) -> bool:
    """A LocalCluster (no address) starts worker processes on this machine."""
    return options.get("address") is None


def reads_files(options: Mapping[str, Any]) -> bool:
    """Whether the workers can read the models' files (then they get references, not
    data): a LocalCluster can; a remote cluster only when told so (``read_files=true``:
    the checkpoints are on storage every worker mounts at the same path)."""
    return bool(options.get("read_files", options.get("address") is None))


def _limit(threads: int) -> None:
    from diffract.plugins import limit_threads

    limit_threads(threads)


class DaskExecutor(cf.Executor):
    """A concurrent.futures executor over a dask.distributed Client."""

    def __init__(self, *, address: str | None = None, n_workers: int = 2,
                 timeout: float = 30) -> None:
        from distributed import Client, LocalCluster

        self._cluster = None
        if address is None:
            import dask

            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            # The workers' statistical profiler samples every thread every 10 ms: on a
            # machine whose cores are the workers, that is work taken from the kernels.
            with dask.config.set({"distributed.worker.profile.enabled": False}):
                self._cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1,
                                             processes=True, dashboard_address=None,
                                             silence_logs=40)
            self._client = Client(self._cluster, timeout=timeout)
            self._client.run(_limit, max(1, cpus // n_workers))
        else:
            self._client = Client(address, timeout=timeout)
        self._executor = self._client.get_executor(pure=False)

    @property
    def client(self) -> Any:
        return self._client

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future:
        return self._executor.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with contextlib.suppress(Exception):
            self._executor.shutdown(wait=wait and not cancel_futures)
        with contextlib.suppress(Exception):
            self._client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close()


def dask_executor(config: Any, options: Mapping[str, Any]) -> DaskExecutor:
    return DaskExecutor(
        address=options.get("address"),
        n_workers=int(options.get("n_workers", config.process_workers)),
        timeout=float(options.get("timeout", 30)),
    )
