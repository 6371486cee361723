"""Hook implementations: the ``ray`` executor."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import ExecutorSpec, hookimpl


@hookimpl
def diffract_executors() -> Iterator[ExecutorSpec]:
    from diffract_executor_ray import executor

    yield ExecutorSpec(
        "ray",
        executor.ray_executor,
        "Ray: the cluster connected, one by address=, or a local one of num_cpus workers.",
        check=executor.check_options,
        spawns=executor.spawns,
        reads_files=executor.reads_files,
    )
