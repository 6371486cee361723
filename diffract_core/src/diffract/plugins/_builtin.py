"""The core's own plugin: the ``ram`` profile, three executors, the elementary kernels
and the ``plugins`` and ``kernels`` commands (the command host, :mod:`diffract.cli`,
hands them the catalog and the registry: nothing here reaches up to it).

Registered by :func:`~diffract.plugins.make_plugin_manager` through the same hooks as
any third-party plugin (``builtins=True``), so an embedding tool with autoload off
still has them."""

from __future__ import annotations

import argparse
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


def run_plugins(args: argparse.Namespace) -> int:
    """``diffract plugins``: each plugin, its status and what it provides; conflicts."""
    catalog = args.catalog
    for record in catalog.plugins:
        ep = f" (entry point {record.entry_point})" if record.entry_point else ""
        print(f"{record.label}{ep}: {record.status}")
        if record.reason:
            print(f"    reason: {record.reason}")
        for kind, names in sorted(record.provides.items()):
            print(f"    {kind}: {', '.join(names)}")
        if record.refused:
            print(f"    withheld (conflicts): {', '.join(record.refused)}")
    contested = sorted(
        {(claimed, providers) for names in catalog.contested.values()
         for claimed, providers in names.values()}
    )
    if contested:
        print("\nConflicts (neither provider is used until one is preferred):")
        for claimed, providers in contested:
            dist = providers[0].split(" ")[0]
            print(f"  {claimed!r}: {' and '.join(providers)}")
            print(f"    pick one: [plugins] prefer = {{ {claimed} = \"{dist}\" }}  "
                  f"(or DIFFRACT_PREFER={claimed}={dist})")
    return 0


def run_kernels(args: argparse.Namespace) -> int:
    """``diffract kernels [-v]``: the registered kernels, with ``-v`` their fields,
    level, configuration and summary."""
    registry = args.registry
    for spec in registry.kernels():
        if not args.verbose:
            print(spec.name)
            continue
        print(f"{spec.name}  [{spec.apply_level.name}, {spec.execution_protocol.name}]  "
              f"from {spec.provider}")
        print(f"    requires: {', '.join(spec.require_fields) or '-'}")
        print(f"    produces: {', '.join(spec.produce_fields)}")
        config = registry.effective_config(spec.name)
        domains = spec.config_domains
        for i, (key, value) in enumerate(config.items()):
            label = "    config:   " if i == 0 else "              "
            print(f"{label}{key}={value!r}  ({domains[key].describe()})")
        if spec.summary:
            import shutil
            import textwrap

            width = max(40, min(100, shutil.get_terminal_size().columns))
            print(textwrap.fill(spec.summary, width, initial_indent="    ",
                                subsequent_indent="    "))
    return 0


def configure_kernels(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="fields, level, configuration")


@hookimpl
def diffract_commands() -> Iterator[Command]:
    yield Command("plugins", "installed plugins, what they register, what failed",
                  lambda parser: None, run_plugins)
    yield Command("kernels", "registered kernels", configure_kernels, run_kernels)
