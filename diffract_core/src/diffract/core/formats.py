"""Checkpoint files through the ``diffract_model_formats`` hook: choosing a reader for a
path, recording what a durable store needs to reopen it, reading with identity checks.

A format plugin yields :class:`~diffract.plugins.ModelFormat` records; ``open(path)``
returns a :class:`CheckpointReader`, which lists the tensors without reading them and
reads one (or a slice of one) on request. Here the core asks the installed formats in
turn (:func:`find_format`), records each file's identity and where each tensor lives
(:class:`~diffract.core.sources.ModelSource`), and before every read compares the file
with its identity, so a file truncated or replaced after it was added fails that
parameter with what changed, instead of returning other weights or crashing."""

from __future__ import annotations

import abc
import inspect
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from diffract.core.sources import FileIdentity, ModelSource, url_format, url_scheme
from diffract.core.tensors import readable, to_numpy
from diffract.core.views import Index
from diffract.errors import (
    EmptyModelError,
    InvalidArgumentError,
    ModelSourceError,
    install_hint,
    provider_of,
)

__all__ = ["CheckpointReader", "FORMATS_DISTRIBUTION", "TensorEntry", "find_format",
           "open_object", "open_path", "reopen", "url_format"]

#: The distribution whose formats read the common checkpoint files.
FORMATS_DISTRIBUTION = "diffractml-formats"
#: Directory-kind sources written before formats were plugins name the files' format.
_LEGACY_DIRECTORY = {"safetensors", "torch"}


@attrs.frozen
class TensorEntry:
    """One tensor of a checkpoint: its name, shape, dtype (a numpy-style name such as
    ``"float32"`` or ``"bfloat16"``: what :meth:`CheckpointReader.read` returns), the
    index of the file that holds it in :attr:`CheckpointReader.files`, and metadata the
    parameter keeps (JSON values; exports show them as ``meta.<key>`` columns: how a
    format stored it, e.g. a quantisation type or that it was turned around)."""

    name: str
    shape: tuple[int, ...] = attrs.field(converter=lambda v: tuple(v))
    dtype: str
    file: int = 0
    meta: tuple[tuple[str, Any], ...] = attrs.field(
        default=(), converter=lambda m: tuple(sorted(dict(m).items())))


class CheckpointReader(abc.ABC):
    """An open checkpoint, as a :class:`~diffract.plugins.ModelFormat` returns it.

    Implement ``files``, ``entries`` and ``read``; override ``read_numpy`` when the
    format converts half types more cheaply than through a tensor, and ``config`` when
    the checkpoint carries the model's configuration. Readers may be used from several
    threads: each ``read`` opens what it needs or holds its own lock."""

    @property
    @abc.abstractmethod
    def files(self) -> Sequence[str]:
        """The files holding the weights; their identities are recorded at add time and
        checked before every read."""

    @abc.abstractmethod
    def entries(self) -> Iterable[TensorEntry]:
        """Every tensor, without reading any (integer ones too: the core keeps floats)."""

    @abc.abstractmethod
    def read(self, name: str, index: Index | None = None) -> Any:
        """The tensor ``name`` as stored (a numpy array, or a torch tensor keeping its
        dtype), or only ``tensor[index]`` (see :mod:`diffract.core.views`)."""

    def read_numpy(self, name: str, index: Index | None = None) -> np.ndarray:
        """The tensor (or slice) as numpy, half types as float32."""
        return to_numpy(self.read(name, index))

    def config(self) -> Mapping[str, Any]:
        """The model's configuration (``config.json`` of a Hugging Face directory), for
        view rules; empty by default. Raise ModelSourceError when it exists but cannot be
        read (called only when a view rule needs it)."""
        return {}


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def _formats() -> dict[str, Any]:
    from diffract.plugins._runtime import get_catalog

    return get_catalog().formats


def _unknown(path: Path, model_id: str, formats: Mapping[str, Any]) -> ModelSourceError:
    """The one message for a path no installed format reads: what they read, and where
    more formats come from."""
    suffixes = [x for f in formats.values() for x in f.suffixes]
    layouts = [f"{f.name}: {f.description}" for f in formats.values() if f.layout is not None]
    if path.is_dir():
        problem = ("this is a directory, not a checkpoint file" if path.suffix.lower() in suffixes
                   else "the directory is not a checkpoint directory any installed format "
                        f"reads ({'; '.join(layouts) or 'none reads directories'})")
    else:
        problem = (f"unsupported file type {path.suffix or '(none)'!r}: use "
                   f"{', '.join(suffixes) or 'a format plugin'}"
                   + (", or a checkpoint directory" if layouts else ""))
    more = (f"More formats come from plugins with a diffract_model_formats hook "
            f"(docs/plugins.md; `diffract plugins` lists the installed formats: "
            f"{', '.join(formats)})." if formats else
            f"No model format is available: {install_hint(FORMATS_DISTRIBUTION)} "
            "(safetensors, torch files, .npz, Hugging Face-style directories, ONNX, Flax "
            f".msgpack; {FORMATS_DISTRIBUTION}[keras,gguf] adds Keras/HDF5 and GGUF).")
    return ModelSourceError(
        f"Model {model_id!r}: {problem} ({str(path)!r}). {more} A torch module or a state "
        "dict needs no format.", model_id=model_id)


def find_format(path: Path, model_id: str, name: str | None = None) -> Any:
    """The :class:`~diffract.plugins.ModelFormat` that reads ``path``: ``name`` when
    given, else the highest-priority format that recognises it."""
    formats = _formats()
    if name is not None:
        if name in formats:
            return formats[name]
        from diffract.plugins._runtime import get_catalog

        contested = get_catalog().conflict_message("formats", name)
        dist = provider_of("formats", name)
        raise ModelSourceError(
            f"Model {model_id!r}: model format {contested}" if contested else
            f"Model {model_id!r}: no model format {name!r} is installed. Installed: "
            f"{', '.join(sorted(formats)) or 'none'}."
            + (f" It comes from {dist}: {install_hint(dist)}" if dist else ""),
            model_id=model_id)
    if not os.path.exists(path):  # False for a name too long for the file system, too
        raise ModelSourceError(f"Model {model_id!r}: the file does not exist "
                               f"({str(path)!r}).", model_id=model_id)
    ranked = sorted(formats.values(), key=lambda f: -f.priority)  # stable: catalog order
    for fmt in ranked:
        if fmt.recognises(path):
            return fmt
    raise _unknown(path, model_id, formats)


class _Reading:
    """A reader opened lazily (again after a reopen), checking file identities first."""

    def __init__(self, fmt: Any, path: str, identities: Sequence[FileIdentity],
                 where: Mapping[str, int], model_id: str, options: Mapping[str, Any],
                 reader: CheckpointReader | None = None) -> None:
        self.fmt, self.path, self.identities = fmt, path, identities
        self.where, self.model_id, self.options = where, model_id, options
        self._reader = reader
        self._lock = threading.Lock()

    def _open(self, name: str) -> CheckpointReader:
        if self.identities:  # none for an object in memory
            self.identities[self.where.get(name, 0)].check(self.model_id, options=self.options)
        with self._lock:
            if self._reader is None:  # files holding no tensor (a config it reads): now
                held = set(self.where.values()) or {0}
                for i, identity in enumerate(self.identities):
                    if i not in held:
                        identity.check(self.model_id, options=self.options)
                self._reader = _open(self.fmt, self.path, self.model_id, self.options)
            return self._reader

    def load(self, name: str, index: Index | None = None) -> np.ndarray:
        return self._open(name).read_numpy(name, index)

    def raw(self, name: str, index: Index | None = None) -> Any:
        value = self._open(name).read(name, index)
        return value if isinstance(value, np.ndarray) else readable(value)


def _named(model_id: str, call: Callable[[], Any]) -> Any:
    """``call()``, a reader's ModelSourceError or EmptyModelError (or OSError) given the
    model's name."""
    try:
        return call()
    except (ModelSourceError, EmptyModelError) as exc:
        if exc.model_id is not None:
            raise
        raise type(exc)(f"Model {model_id!r}: {exc}", model_id=model_id) from None
    except OSError as exc:
        raise ModelSourceError(f"Model {model_id!r}: cannot read the checkpoint: {exc}.",
                               model_id=model_id) from None


def _open(fmt: Any, target: Any, model_id: str, options: Mapping[str, Any]) -> CheckpointReader:
    """``fmt.open(target, **options)`` (a path as a string, or an object in memory); what
    goes wrong is a ModelSourceError naming the model (an option the format does not
    take, too)."""
    try:
        inspect.signature(fmt.open).bind(target, **options)
    except TypeError:
        raise ModelSourceError(
            f"Model {model_id!r}: model format {fmt.name!r} ({fmt.provider}) takes no "
            f"option(s) {sorted(options)}.", model_id=model_id) from None
    except ValueError:  # no signature to check (a builtin): let the call decide
        pass
    reader = _named(model_id, lambda: fmt.open(target, **options))
    if not isinstance(reader, CheckpointReader):
        raise ModelSourceError(
            f"Model {model_id!r}: model format {fmt.name!r} ({fmt.provider}) returned a "
            f"{type(reader).__name__}, not a CheckpointReader. Report this to its authors.",
            model_id=model_id)
    return reader


def open_path(given: str | os.PathLike[str], model_id: str, format: str | None = None,
              options: Mapping[str, Any] | None = None,
              ) -> tuple[list[TensorEntry], ModelSource, Callable, Callable, Mapping[str, Any]]:
    """Open a checkpoint file or directory, or a URL a format reads in place (``options``
    go to the format's reader and are recorded): its floating-point tensors, the source
    record, the two loaders (``load(name, index=None)`` numpy, ``raw`` as stored) and a
    function returning the model's configuration (read only if a view rule asks: a broken
    ``config.json`` does not stop a model read without views)."""
    url, path = url_scheme(given) and str(given), Path(given)
    if url:
        fmt = url_format(url, model_id, format)
    elif not os.path.exists(path):  # a name a format knows (a Hugging Face id), as it finds it
        for f in sorted(_formats().values(), key=lambda f: -f.priority):
            found = f.locate is not None and _named(model_id, lambda f=f, n=str(path): f.locate(n))
            if found:
                path = Path(found)
                break
    if not url:
        fmt = find_format(path, model_id, format)
    options = dict(options or {})
    reader = _open(fmt, url or str(path), model_id, options)
    files = _named(model_id, lambda: [FileIdentity.of(f, options) for f in reader.files])
    kind = ("directory" if len(files) > 1 or files[0].path != url else "file") if url else (
        "directory" if path.is_dir() else "file")
    kept, where = [], {}
    for entry in _named(model_id, lambda: list(reader.entries())):
        if entry.name in where:
            raise ModelSourceError(f"Model {model_id!r}: parameter {entry.name!r} appears "
                                   f"twice in {str(path)!r}.", model_id=model_id)
        where[entry.name] = entry.file
        if _is_float(entry.dtype):
            kept.append(entry)
    source = ModelSource(
        kind=kind, format=fmt.name, path=url or str(path.resolve()), files=tuple(files),
        weight_map=tuple((e.name, e.file) for e in kept) if len(files) > 1 else (),
        description=f"{fmt.name} {kind}", format_options=tuple(sorted(options.items())))
    reading = _Reading(fmt, url or str(path), files, dict(source.weight_map), model_id, options,
                       reader)
    return kept, source, reading.load, reading.raw, lambda: _named(  # a reader's own
        model_id, reader.config)  # mapping: it may say where it was read (``source``)


def open_object(obj: Any, model_id: str, format: str, options: Mapping[str, Any] | None
                ) -> tuple[list[TensorEntry], ModelSource, Callable, Callable, Callable]:
    """An object in memory read by the format named (one that takes ``objects``): as
    :func:`open_path` returns, with an in-memory source record."""
    fmt = find_format(Path(), model_id, format)
    if not fmt.objects:
        raise InvalidArgumentError(
            f"format={format!r} applies to checkpoint files and directories, not to a "
            f"{type(obj).__name__}: that format reads no object in memory.")
    reader = _open(fmt, obj, model_id, dict(options or {}))
    kept = [e for e in _named(model_id, lambda: list(reader.entries())) if _is_float(e.dtype)]
    source = ModelSource("memory", description=f"{fmt.name} of a {type(obj).__name__}")
    reading = _Reading(fmt, "", (), {}, model_id, {}, reader)
    return kept, source, reading.load, reading.raw, lambda: _named(model_id, reader.config)


def reopen(source: ModelSource, model_id: str) -> tuple[Callable, Callable]:
    """The loaders of a file-backed source recorded earlier (after a store reopens); the
    format is looked up by the name recorded, files open on the first read."""
    name = source.format or ""
    if source.kind == "directory" and name in _LEGACY_DIRECTORY:
        name = "huggingface"
    formats = _formats()
    if name not in formats:
        raise ModelSourceError(
            f"Model {model_id!r} was added from {source.path!r} with model format {name!r}, "
            f"which is not installed now (installed: {', '.join(sorted(formats)) or 'none'}). "
            f"Install the plugin that provides it (the common ones: "
            f"{install_hint(provider_of('formats', name) or FORMATS_DISTRIBUTION)}).",
            model_id=model_id)
    reading = _Reading(formats[name], source.path or "", source.files, dict(source.weight_map),
                       model_id, dict(source.format_options))
    return reading.load, reading.raw
