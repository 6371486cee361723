"""The core's own plugin: the ``ram`` profile, three executors, the elementary kernels
and the ``plugins``, ``kernels`` and ``catalog`` commands.

Registered by :func:`~diffract.plugins.make_plugin_manager` through the same hooks as
any third-party plugin (``builtins=True``), so an embedding tool with autoload off
still has them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from diffract.plugins.hookspec import hookimpl
from diffract.plugins.types import Command, ExecutorSpec, KernelSpec, StorageProfile


def _ram(options: Mapping[str, Any]) -> Any:
    from diffract.core.storage.ram import RamStore

    if options:
        from diffract.errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"The 'ram' profile takes no options, got {sorted(options)}. "
            "Remove them, or choose a profile that accepts them."
        )
    return RamStore()


@hookimpl
def diffract_storage_profiles() -> Iterator[StorageProfile]:
    yield StorageProfile(
        name="ram",
        factory=_ram,
        description="In-process memory; the embedded default. Nothing survives the process.",
        durable=False)


@hookimpl
def diffract_executors() -> Iterator[ExecutorSpec]:
    from diffract.core import executors

    yield ExecutorSpec("sequential", executors.sequential_executor, "In the calling thread.",
                       inline=True)
    yield ExecutorSpec("threads", executors.thread_executor, "A thread pool.")
    yield ExecutorSpec("processes", executors.process_executor,
                       "A spawn-based process pool (one BLAS thread share per worker).",
                       check=executors.check_process_options, spawns=True)


@hookimpl
def diffract_kernels() -> Iterator[KernelSpec]:
    from diffract.core.compute.kernels import ELEMENTARY

    for fn in ELEMENTARY:
        yield KernelSpec.from_function(fn)


@hookimpl
def diffract_commands() -> Iterator[Command]:
    from diffract import cli

    yield Command("plugins", "installed plugins, what they register, what failed",
                  lambda parser: None, cli.run_plugins)
    yield Command("kernels", "registered kernels", cli.configure_kernels, cli.run_kernels)
    yield Command("catalog", "write the metric catalog (Markdown) of the registered kernels",
                  cli.configure_catalog, cli.run_catalog)
