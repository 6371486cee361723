"""The frozen records that Diffract's hooks yield."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

import attrs

from diffract.core.compute.spec import Domain, KernelOptions, KernelSpec, Range, Restriction, kernel

__all__ = [
    "Conventions",
    "Domain",
    "ExecutorSpec",
    "KernelOptions",
    "KernelSpec",
    "OpSpec",
    "Range",
    "Restriction",
    "StorageProfile",
    "kernel",
]


def _summary(fn: Any) -> str:
    return f"<{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}>"


@attrs.frozen
class Conventions:
    """A named set of kernel configurations that reproduces another tool's numbers.

    ``settings`` maps a kernel name to the keywords it sets (``{"power_law_fit":
    {"min_tail": 5}}``); ``session.compute.configure_conventions(name)`` applies them,
    checked as ``configure_kernel`` checks them, all or nothing. ``description`` says
    what the preset changes and why.
    """

    name: str
    settings: Mapping[str, Mapping[str, Any]] = attrs.field(
        converter=lambda m: {k: dict(v) for k, v in m.items()}, eq=False, hash=False)
    description: str = ""
    provider: str = "unknown"


@attrs.frozen
class StorageProfile:
    """A named storage profile: ``factory(options)`` returns a Store.

    ``options`` merges ``[profile.<name>]`` from the configuration with the keyword
    arguments given to ``Session(profile=name, ...)``. ``durable`` says whether results
    survive the process.
    """

    name: str
    factory: Callable[[Mapping[str, Any]], Any] = attrs.field(eq=False, hash=False, repr=_summary)
    description: str = ""
    durable: bool = False
    provider: str = "unknown"


@attrs.frozen
class ExecutorSpec:
    """A named executor: ``factory(config, options)`` returns a ``concurrent.futures.Executor``.

    ``config`` is the session's :class:`~diffract.config.Config`; ``options`` is its
    ``[executor.<name>]`` table (or ``Session(executor_options=...)``). Workers receive
    top-level kernel functions and their inputs by pickle; results come back to the
    session, which writes them. ``check(config, options)``, when given, returns the
    problems with the options (a list of phrases): a session refuses to open on any.
    """

    name: str
    factory: Callable[[Any, Mapping[str, Any]], Executor] = attrs.field(
        eq=False, hash=False, repr=_summary
    )
    description: str = ""
    provider: str = "unknown"
    check: Callable[[Any, Mapping[str, Any]], list[str]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False
    )
    #: Whether it starts worker processes on this machine (given its options): then a
    #: script must guard its work with ``if __name__ == "__main__":``, checked first.
    spawns: bool | Callable[[Mapping[str, Any]], bool] = attrs.field(
        default=False, eq=False, hash=False, repr=False
    )
    #: Whether its workers can read the models' checkpoint files (then they are sent a
    #: reference and read the weights themselves; else the weights are shipped).
    #: Default: when it spawns local processes.
    reads_files: bool | Callable[[Mapping[str, Any]], bool] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False
    )
    #: Whether it runs tasks in the calling thread (then a PARALLEL kernel's batch path
    #: is used instead: there is nothing to distribute).
    inline: bool = False


@attrs.frozen
class OpSpec:
    """One implementation of a named op (``causal_conv1d``, ``chunk_kda``).

    ``implementation(*args, **kwargs)`` computes the op; ``is_supported(*args, **kwargs)``
    returns ``(ok, reason)`` for one call; ``reference`` is the function it replaces,
    called when no implementation supports the call. Higher ``priority`` is tried first.
    """

    name: str
    implementation: Callable[..., Any] = attrs.field(eq=False, hash=False, repr=_summary)
    is_supported: Callable[..., tuple[bool, str]] = attrs.field(eq=False, hash=False, repr=_summary)
    reference: Callable[..., Any] | None = attrs.field(
        default=None, eq=False, hash=False, repr=_summary
    )
    priority: int = 0
    provider: str = "unknown"
