"""PARALLEL kernels on dask.distributed: an existing cluster by address, or a
LocalCluster started on first use.

:class:`DaskExecutor` is a ``concurrent.futures.Executor``: ``submit`` ships the kernel
(by reference: a top-level function of an importable module, which the workers must
have installed) and its inputs, tasks are impure (never deduplicated by Dask), and
``shutdown(cancel_futures=True)`` cancels what is queued. A LocalCluster's workers are
single-threaded processes. Every worker, of a LocalCluster or of a cluster given by
address, is limited to its share of its host's cores for BLAS (``limit_threads``,
default true), as the ``processes`` executor's are: a worker left at its default uses
every core, and two of them on two cores ran the decompositions ~5% slower.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["DaskExecutor", "check_options", "local_cluster_config", "share_cores",
           "start_local_cluster"]

_OPTIONS = ("address", "n_workers", "timeout", "read_files", "limit_threads")


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
    if not isinstance(options.get("limit_threads", True), bool):
        problems.append(f"limit_threads must be true or false, got "
                        f"{options['limit_threads']!r}")
    timeout = options.get("timeout", 30)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        problems.append(f"timeout must be a positive number of seconds, got {timeout!r}")
    return problems


def spawns(options: Mapping[str, Any]) -> bool:
    """A LocalCluster (no address) starts worker processes on this machine."""
    return options.get("address") is None


def reads_files(options: Mapping[str, Any]) -> bool | str:
    """What the workers read themselves (sent references, not data): a LocalCluster every
    checkpoint; a remote cluster those in object storage ("urls": each worker reaches the
    store, with its own credentials), its files only when told so (``read_files=true``:
    every worker mounts them at the same path); ``read_files=false``: nothing, every
    weight is shipped from here."""
    if "read_files" in options:
        return bool(options["read_files"])
    return True if options.get("address") is None else "urls"


def _share_cores(threads_on_host: int) -> int:
    """In a worker: BLAS/OpenMP/torch threads limited to its share of its host's cores
    (``threads_on_host`` Dask threads share them); returns the limit."""
    from diffract.plugins import limit_threads

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    share = max(1, cpus // max(threads_on_host, 1))
    limit_threads(share)
    return share


def share_cores(client: Any) -> dict[str, int]:
    """Give every worker of ``client``'s cluster its share of its host's cores for BLAS:
    on a host running ``t`` Dask threads in all, ``cores // t`` each, so that workers
    do not oversubscribe the cores (each defaults to all of them). Returns worker
    address -> threads."""
    workers = client.scheduler_info().get("workers", {})
    hosts: dict[Any, list[str]] = {}
    threads: dict[Any, int] = {}
    for address, info in workers.items():
        hosts.setdefault(info.get("host"), []).append(address)
        threads[info.get("host")] = threads.get(info.get("host"), 0) + int(info.get("nthreads", 1))
    out = {}
    for host, addresses in hosts.items():  # one call per host
        out.update(client.run(_share_cores, threads[host], workers=addresses))
    return out


def local_cluster_config() -> dict[str, Any]:
    """Dask settings for a cluster of diffract workers on this machine (what our
    LocalCluster uses; ``benchmarks/bench_executors.py`` starts its "running cluster"
    with them too). Two changes from Dask's defaults, both measured on 2 cores:

    * no statistical profiler: it samples every thread every 10 ms, work taken from the
      kernels when the workers are the machine's cores;
    * no ``MALLOC_TRIM_THRESHOLD_`` in the workers' environment: Dask sets it to return
      memory to the system early, which also pins glibc's mmap threshold, so every
      large numpy temporary is mapped and unmapped again: a 1024-point power-law fit
      took 19-21 ms in such a worker and 15-16 ms without it (14 ms in this process).
    """
    import dask

    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return {"distributed.worker.profile.enabled": False,
            "distributed.nanny.pre-spawn-environ": environ}


def start_local_cluster(n_workers: int) -> Any:
    """A LocalCluster of ``n_workers`` single-threaded worker processes with
    :func:`local_cluster_config` (Dask's nanny also writes its spawn environment into
    this process's ``os.environ``, where later clusters would inherit it: it is left out
    while the workers start, and restored after)."""
    import dask
    from distributed import LocalCluster

    saved = os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    try:
        with dask.config.set(local_cluster_config()):
            return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                dashboard_address=None, silence_logs=40)
    finally:
        if saved is not None:
            os.environ["MALLOC_TRIM_THRESHOLD_"] = saved


class DaskExecutor(cf.Executor):
    """A concurrent.futures executor over a dask.distributed Client."""

    def __init__(self, *, address: str | None = None, n_workers: int = 2,
                 timeout: float = 30, limit_threads: bool = True) -> None:
        from distributed import Client

        self._cluster = None
        if address is None:
            self._cluster = start_local_cluster(n_workers)
            self._client = Client(self._cluster, timeout=timeout)
        else:
            self._client = Client(address, timeout=timeout)
        if limit_threads:
            share_cores(self._client)
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
        limit_threads=bool(options.get("limit_threads", True)),
    )
