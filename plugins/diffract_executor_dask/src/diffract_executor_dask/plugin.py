"""Hook implementations: the ``dask`` executor."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import ExecutorSpec, hookimpl


@hookimpl
def diffract_executors() -> Iterator[ExecutorSpec]:
    from diffract_executor_dask import executor

    yield ExecutorSpec(
        "dask",
        executor.dask_executor,
        "dask.distributed: a cluster by address=, or a LocalCluster of n_workers processes.",
        check=executor.check_options,
        spawns=executor.spawns,
        reads_files=executor.reads_files,
    )
