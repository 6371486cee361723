"""The frozen records that Diffract's hooks yield."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import attrs

from diffract.core.compute.spec import Domain, KernelOptions, KernelSpec, Range, Restriction, kernel
from diffract.core.views import View

__all__ = [
    "Command",
    "Conventions",
    "Domain",
    "ExecutorSpec",
    "KernelOptions",
    "KernelSpec",
    "ModelFormat",
    "OpSpec",
    "Range",
    "Restriction",
    "StorageProfile",
    "View",
    "ViewRule",
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
    what the preset changes and why."""

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
    survive the process."""

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
    problems with the options (a list of phrases): a session refuses to open on any."""

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
    #: reference and read the weights themselves; else the weights are shipped):
    #: True, False, or "urls" (those in object storage only, not this machine's files).
    #: Default: when it spawns local processes.
    reads_files: bool | str | Callable[[Mapping[str, Any]], bool | str] | None = attrs.field(
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
    called when no implementation supports the call. Higher ``priority`` is tried first."""

    name: str
    implementation: Callable[..., Any] = attrs.field(eq=False, hash=False, repr=_summary)
    is_supported: Callable[..., tuple[bool, str]] = attrs.field(eq=False, hash=False, repr=_summary)
    reference: Callable[..., Any] | None = attrs.field(
        default=None, eq=False, hash=False, repr=_summary
    )
    priority: int = 0
    provider: str = "unknown"


@attrs.frozen
class ModelFormat:
    """A reader for one kind of checkpoint.

    ``open(path)`` returns a :class:`~diffract.plugins.CheckpointReader` (lists the
    tensors without reading them, reads one tensor or a slice of it). A file is
    recognised when its suffix is one of ``suffixes`` (lowercase, with the dot) or its
    first bytes start with one of ``magic``; a directory when ``layout(path)`` is true.
    When several formats recognise a path, the highest ``priority`` reads it (ties: the
    first in the catalog's order, the core's then by distribution name);
    ``models.add(path, format=name)`` picks one. The name is recorded with the
    model, so a durable store reopens it with the same format. ``locate(name)``, for a
    name that is no path (a hub's model id), returns the local folder it stands for or
    None, and raises ModelSourceError, saying how to fetch it, for one it knows of but
    cannot find. With ``objects``, ``open`` also takes what ``models.add(obj,
    format=name)`` was given in memory (a state dict); that model is in memory (a durable
    profile copies its weights). With ``schemes`` (``("s3", "gs")``) it reads URLs of
    them in place: ``stat(url, **options)`` gives an object's (size, version tag), what
    its identity records, and ``glob(pattern, **options)`` the checkpoints a URL pattern
    matches (``options``: the format's, as ``open`` takes them)."""

    name: str
    open: Callable[[str], Any] = attrs.field(eq=False, hash=False, repr=_summary)
    suffixes: tuple[str, ...] = attrs.field(
        default=(), converter=lambda xs: tuple(x.lower() for x in xs))
    magic: tuple[bytes, ...] = attrs.field(default=(), converter=lambda v: tuple(v))
    layout: Callable[[str], bool] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)
    locate: Callable[[str], str | None] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)
    description: str = ""
    priority: int = 0
    provider: str = "unknown"
    objects: bool = False
    schemes: tuple[str, ...] = attrs.field(default=(), converter=lambda v: tuple(v))
    stat: Callable[..., tuple[int, str]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)
    glob: Callable[..., list[str]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)

    def recognises(self, path: str | os.PathLike[str]) -> bool:
        """Whether this format reads ``path`` (a file by suffix or magic bytes, a
        directory by its layout)."""
        p = Path(path)
        if p.is_dir():
            return self.layout is not None and bool(self.layout(str(p)))
        if p.suffix.lower() in self.suffixes:
            return True
        if self.magic and p.is_file():
            with p.open("rb") as fh:
                start = fh.read(max(len(m) for m in self.magic))
            return any(start.startswith(m) for m in self.magic)
        return False

    def describe(self) -> str:
        """``name (.a, .b, magic, directories)``: what it recognises, for messages."""
        kinds = [*self.suffixes, *(f"magic {m!r}" for m in self.magic),
                 *(f"{s}://" for s in self.schemes)]
        if self.layout is not None:
            kinds.append("directories")
        return f"{self.name} ({', '.join(kinds)})" if kinds else self.name


@attrs.frozen
class ViewRule:
    """A rule that splits a parameter into named sub-matrices (heads, experts, parts).

    ``split(param, config, options)`` receives a parameter's
    :class:`~diffract.plugins.ParamInfo`, the model's configuration (``config.json`` of
    a Hugging Face directory, else empty) and the options the user gave the rule; it
    returns the :class:`View` records of that parameter (none: it is not split). Each
    view becomes a parameter named ``<parameter>[<label>]`` whose weights are read as a
    slice of the parameter. ``options`` names the options it takes (``models.add(...,
    view_options=)`` gives each rule its own); ``check(options)``, when given, returns the
    problems with their values (phrases): ``models.add`` refuses to start on any. A
    rule raises :class:`ValueError` for a parameter it recognises but cannot split (the
    message names the shapes and the option to fix); nothing is then added."""

    name: str
    split: Callable[[Any, Mapping[str, Any], Mapping[str, Any]], Iterable[View]] = attrs.field(
        eq=False, hash=False, repr=_summary)
    description: str = ""
    check: Callable[[Mapping[str, Any]], list[str]] | None = attrs.field(
        default=None, eq=False, hash=False, repr=False)
    options: tuple[str, ...] = attrs.field(default=(), converter=lambda v: tuple(v))
    provider: str = "unknown"


@attrs.frozen
class Command:
    """A subcommand of ``diffract``: ``diffract <name> ...``.

    ``configure(parser)`` adds its arguments to an ``argparse`` parser and is called only
    when the command runs (or its ``--help`` is asked), so a plugin imports its
    command's modules there; ``run(args)`` does the work and returns the exit code
    (0 done, 1 some work failed, 2 usage errors). ``help`` is the line ``diffract
    --help`` shows; ``description`` the paragraph of ``diffract <name> --help``."""

    name: str
    help: str
    configure: Callable[[Any], None] = attrs.field(eq=False, hash=False, repr=_summary)
    run: Callable[[Any], int] = attrs.field(eq=False, hash=False, repr=_summary)
    description: str = ""
    provider: str = "unknown"
