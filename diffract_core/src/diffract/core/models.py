"""Reading models: a torch module, a state dict, a checkpoint file or directory.

:func:`read_model` turns what the user passed into an :class:`OpenedModel`: the
floating-point parameters' metadata (:class:`ParamInfo`), the :class:`ModelSource`
record a durable store keeps, and two lazy loaders: ``load(name)`` returns one
parameter as numpy (float32 for half and bfloat16 weights, the stored dtype otherwise)
and ``raw(name)`` as its source holds it (a torch tensor on its device, in its dtype, or
a numpy array). Nothing is read or copied at ``add`` time beyond headers.
:func:`open_source` builds the loaders again from a stored record after a reopen.

Sources:

* a ``torch.nn.Module`` (its ``named_parameters()``) or a mapping of names to torch
  tensors or numpy arrays (a state dict);
* a ``.safetensors`` file (read with plain file reads: no memory map, so a read costs
  only the tensor's own memory and a truncated file is an error, not a crash), a torch state-dict
  file ``.pt``/``.pth``/``.bin`` (``torch.load(weights_only=True)``, memory-mapped when
  the file is in the zip format; the legacy format is read whole, once) or ``.npz``;
* a Hugging Face-style checkpoint directory: ``model.safetensors.index.json`` with its
  shards, ``model.safetensors``, ``pytorch_model.bin.index.json`` with its shards, or
  ``pytorch_model.bin``.

Every problem at the file boundary is a :class:`ModelSourceError` naming the file, the
model and what to do. Before each read a file's identity is checked, so a file
truncated or replaced after it was added fails that parameter with what changed.
Integer and boolean tensors (``num_batches_tracked``) are not weights and are left out.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from diffract.core._safetensors import SafetensorsError, SafetensorsFile
from diffract.core.ptypes import infer_type, module_types
from diffract.core.sources import FileIdentity, ModelSource
from diffract.core.storage.base import ParamInfo
from diffract.errors import EmptyModelError, ModelSourceError

__all__ = ["OpenedModel", "open_source", "read_model"]

Loader = Callable[[str], Any]

_HF_FILES = ("model.safetensors.index.json", "model.safetensors",
             "pytorch_model.bin.index.json", "pytorch_model.bin")


@attrs.define
class OpenedModel:
    """What ``models.add`` records: parameters, the source record, the two loaders."""

    infos: list[ParamInfo]
    source: ModelSource
    load: Loader = attrs.field(repr=False)
    raw: Loader = attrs.field(repr=False)


# -- tensors --------------------------------------------------------------------------
def _is_torch_module(obj: Any) -> bool:
    # No torch import here: if torch is not loaded, obj cannot be a torch module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _readable(t: Any) -> Any:
    """``t`` detached, or a clear error when it holds no readable dense data."""
    if t.is_meta:
        raise ModelSourceError(
            "the parameter is on the meta device and has no data; load real weights into "
            "the model (load_state_dict, to_empty + init) before analysing it",
            model_id=None,
        )
    if t.layout is not sys.modules["torch"].strided:
        raise ModelSourceError(
            f"the parameter is a {t.layout} tensor; add the dense weights instead "
            "(tensor.to_dense())",
            model_id=None,
        )
    return t.detach()


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor or numpy array as numpy; half types as float32."""
    if isinstance(t, np.ndarray):
        return t.astype(np.float32) if t.dtype.itemsize < 4 else t
    t = _readable(t)
    if t.dtype.is_floating_point and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def _torch_dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _is_float(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return np.issubdtype(value.dtype, np.floating)
    return bool(value.dtype.is_floating_point)


def _from_mapping(model_id: str, mapping: Mapping[str, Any], description: str,
                  modules: Mapping[str, str] | None = None) -> OpenedModel:
    torch_mod = sys.modules.get("torch")
    bad = sorted(
        str(k)
        for k, v in mapping.items()
        if not isinstance(v, np.ndarray)
        and not (torch_mod is not None and isinstance(v, torch_mod.Tensor))
    )
    if bad:
        nested = [k for k in bad if isinstance(mapping[k], Mapping)]
        hint = (
            f" It looks like a training checkpoint: pass its state dict, e.g. "
            f"checkpoint[{nested[0]!r}]."
            if nested
            else ""
        )
        raise ModelSourceError(
            f"Model {model_id!r}: entries {bad[:10]} are neither torch tensors nor numpy arrays."
            f"{hint} Pass a mapping of parameter names to tensors.",
            model_id=model_id,
        )
    kept = {str(k): v for k, v in mapping.items() if _is_float(v)}
    modules = modules or {}
    infos = [
        ParamInfo(model_id, name, tuple(v.shape),
                  str(v.dtype) if isinstance(v, np.ndarray) else _torch_dtype_name(v),
                  infer_type(name, tuple(v.shape), modules.get(name)))
        for name, v in kept.items()
    ]

    def load(name: str) -> np.ndarray:
        return to_numpy(kept[name])

    def raw(name: str) -> Any:
        value = kept[name]
        return value if isinstance(value, np.ndarray) else _readable(value)

    return OpenedModel(infos, ModelSource("memory", description=description), load, raw)


# -- files ----------------------------------------------------------------------------
def _file_error(model_id: str, path: Path | str, problem: str) -> ModelSourceError:
    return ModelSourceError(f"Model {model_id!r}: {problem} ({str(path)!r}).", model_id=model_id)


class _Reader:
    """Reads tensors of one checkpoint file, opening it lazily, checking its identity."""

    def __init__(self, identity: FileIdentity, fmt: str, model_id: str) -> None:
        self.identity, self.fmt, self.model_id = identity, fmt, model_id
        self._handle: Any = None
        self._lock = threading.Lock()

    def _open(self) -> Any:
        if self._handle is None:
            self._handle = _open_file(Path(self.identity.path), self.fmt, self.model_id)
        return self._handle

    def get(self, name: str) -> Any:
        """The tensor as stored (torch for torch and safetensors files, else numpy)."""
        self.identity.check(self.model_id)
        with self._lock:
            handle = self._open()
        if self.fmt == "safetensors":
            return handle.read_raw(name)
        if self.fmt == "npz":
            with np.load(self.identity.path, allow_pickle=False) as npz:
                return npz[name]
        return handle[name]

    def get_numpy(self, name: str) -> np.ndarray:
        """The tensor as numpy, half types as float32 (converted without a second copy
        for safetensors files)."""
        if self.fmt != "safetensors":
            return to_numpy(self.get(name))
        self.identity.check(self.model_id)
        with self._lock:
            handle = self._open()
        return handle.read_numpy(name)


def _open_file(path: Path, fmt: str, model_id: str) -> Any:
    """An open checkpoint: a safetensors handle, or a mapping of names to tensors."""
    if fmt == "safetensors":
        try:
            return SafetensorsFile(path)
        except (OSError, SafetensorsError) as exc:  # a truncated or lying header
            raise _file_error(
                model_id, path,
                f"not a readable safetensors file: {exc}. The file is truncated or its header "
                "is corrupt; export it again",
            ) from None
    if fmt == "torch":
        return _torch_load(path, model_id)
    if fmt == "npz":
        try:
            return np.load(path, allow_pickle=False)
        except Exception as exc:  # noqa: BLE001
            raise _file_error(model_id, path, f"not a readable .npz file: {exc}") from None
    raise _file_error(model_id, path, f"unknown checkpoint format {fmt!r}")  # pragma: no cover


def _torch_load(path: Path, model_id: str) -> Mapping[str, Any]:
    """``torch.load(weights_only=True)``: memory-mapped for zip files, whole for the
    legacy format. Raises ModelSourceError naming what is not a plain state dict."""
    import torch

    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc) and "zip" not in str(exc):
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)  # legacy
    except Exception as exc:  # noqa: BLE001 - reported with the fix, never torch's advice
        text = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global ([\w.]+)", text)
        if found:
            why = (f"it holds a pickled {found.group(1)}, not a plain state dict of tensors")
        elif "weights_only" in text.lower() or "unpickl" in text.lower():
            why = "it holds pickled objects, not a plain state dict of tensors"
        else:
            why = f"torch cannot read it ({type(exc).__name__}: {text.splitlines()[0][:200]})"
        raise _file_error(
            model_id, path,
            f"cannot read {path.name} with torch.load(weights_only=True): {why}. Diffract never "
            "unpickles arbitrary objects: save model.state_dict() with torch.save and add that",
        ) from None
    if not isinstance(state, Mapping):
        raise _file_error(model_id, path, f"{path.name} holds a {type(state).__name__}, not a "
                          "state dict; save model.state_dict() and add that")
    return state


def _file_infos(handle: Any, fmt: str, model_id: str, path: Path) -> list[tuple[str, tuple, str]]:
    """(name, shape, dtype) of the floating-point tensors of an open checkpoint."""
    out = []
    if fmt == "safetensors":
        return handle.floats()
    if fmt == "npz":
        for name in handle.files:
            arr = handle[name]
            if np.issubdtype(arr.dtype, np.floating):
                out.append((name, tuple(arr.shape), str(arr.dtype)))
        return out
    torch_mod = sys.modules["torch"]
    for name, value in handle.items():
        if not isinstance(value, torch_mod.Tensor):
            bad = type(value).__name__
            nested = " (a training checkpoint: save its 'state_dict' entry)" if isinstance(
                value, Mapping) else ""
            raise _file_error(model_id, path, f"entry {name!r} is a {bad}, not a tensor{nested}")
        if value.dtype.is_floating_point:
            out.append((name, tuple(value.shape), _torch_dtype_name(value)))
    return out


def _format_of(path: Path, model_id: str) -> str:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pt", ".pth", ".bin"):
        return "torch"
    if suffix == ".npz":
        return "npz"
    raise _file_error(model_id, path, f"unsupported file type {suffix or '(none)'!r}: use "
                      ".safetensors, .pt, .pth, .bin or .npz, a Hugging Face-style checkpoint "
                      "directory, a torch module or a state dict")


def _directory_files(root: Path, model_id: str) -> tuple[str, list[tuple[Path, list[str] | None]]]:
    """The format and the files of a checkpoint directory: (path, names or None=all)."""
    for marker in _HF_FILES:
        if not (root / marker).is_file():
            continue
        fmt = "safetensors" if marker.startswith("model.") else "torch"
        if not marker.endswith(".index.json"):
            return fmt, [(root / marker, None)]
        try:
            weight_map = json.loads((root / marker).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _file_error(model_id, root / marker, f"unreadable shard index ({exc}); "
                              "it must be JSON with a 'weight_map'") from None
        shards: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            raise _file_error(model_id, root, f"the shard index lists {len(missing)} missing "
                              f"shard(s): {missing[:5]}; download them or fix the index")
        return fmt, [(root / s, names) for s, names in shards.items()]
    raise _file_error(model_id, root, f"directory holds none of {list(_HF_FILES)}; pass a "
                      "checkpoint file or a Hugging Face-style checkpoint directory")


def _from_files(model_id: str, given: Path) -> OpenedModel:
    if not given.exists():
        raise _file_error(model_id, given, "the file does not exist")
    if given.is_dir():
        if given.suffix.lower() in (".safetensors", ".pt", ".pth", ".bin", ".npz"):
            raise _file_error(model_id, given, "this is a directory, not a checkpoint file")
        fmt, files = _directory_files(given, model_id)
        kind = "directory"
    else:
        fmt, files, kind = _format_of(given, model_id), [(given, None)], "file"
    readers: list[_Reader] = []
    infos: list[ParamInfo] = []
    where: dict[str, int] = {}
    for index, (path, names) in enumerate(files):
        identity = FileIdentity.of(path)
        reader = _Reader(identity, fmt, model_id)
        entries = _file_infos(reader._open(), fmt, model_id, path)
        wanted = set(names) if names is not None else None
        for name, shape, dtype in entries:
            if wanted is not None and name not in wanted:
                continue
            if name in where:
                raise _file_error(model_id, path, f"parameter {name!r} appears in two files")
            where[name] = index
            infos.append(ParamInfo(model_id, name, shape, dtype, infer_type(name, shape)))
        readers.append(reader)
    source = ModelSource(
        kind=kind, format=fmt, path=str(given.resolve()),
        files=tuple(r.identity for r in readers),
        weight_map=tuple(where.items()) if kind == "directory" else (),
        description=f"{fmt} {kind}",
    )
    load, raw = _loaders(readers, where)
    return OpenedModel(infos, source, load, raw)


def _loaders(readers: list[_Reader], where: Mapping[str, int]) -> tuple[Loader, Loader]:
    def raw(name: str) -> Any:
        value = readers[where.get(name, 0)].get(name)
        return value if isinstance(value, np.ndarray) else _readable(value)

    def load(name: str) -> np.ndarray:
        return readers[where.get(name, 0)].get_numpy(name)

    return load, raw


def open_source(source: ModelSource, model_id: str) -> tuple[Loader, Loader]:
    """The loaders of a file-backed source recorded earlier (after a store reopens).

    Files open lazily; each read first checks the file's identity, so a changed file
    fails the parameter being read, with what changed.
    """
    if not source.is_file_backed:
        raise ValueError(f"open_source needs a file-backed source, got kind {source.kind!r}")
    readers = [_Reader(identity, source.format or "", model_id) for identity in source.files]
    load, raw = _loaders(readers, dict(source.weight_map))
    if not source.renames:
        return load, raw
    renamed = dict(source.renames)
    return (lambda name: load(renamed.get(name, name)),
            lambda name: raw(renamed.get(name, name)))


def apply_overrides(opened: OpenedModel, overrides: Mapping[str, Any]) -> OpenedModel:
    """The model with :class:`~diffract.core.ptypes.ParameterOverrides` applied: renamed
    parameters (the loaders still read the original names), types and metadata."""
    from diffract.core.ptypes import ParameterOverrides

    names = [i.name for i in opened.infos]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ModelSourceError(
            f"parameter_overrides name parameter(s) the model does not have: {unknown[:10]}. "
            f"Its parameters include {names[:5]}.", model_id=opened.infos[0].model_id)
    renamed: dict[str, str] = {}
    infos = []
    for info in opened.infos:
        ov = overrides.get(info.name)
        if ov is None:
            infos.append(info)
            continue
        if not isinstance(ov, ParameterOverrides):
            raise ModelSourceError(
                f"parameter_overrides[{info.name!r}] must be a ParameterOverrides, got "
                f"{type(ov).__name__}.", model_id=info.model_id)
        new = ov.name or info.name
        if new != info.name:
            renamed[new] = info.name
        infos.append(attrs.evolve(info, name=new, ptype=ov.ptype or info.ptype,
                                  meta=ov.meta or info.meta))
    final = [i.name for i in infos]
    clashes = sorted({n for n in final if final.count(n) > 1})
    if clashes:
        raise ModelSourceError(f"parameter_overrides would give two parameters the name(s) "
                               f"{clashes}.", model_id=infos[0].model_id)
    if not renamed:
        return attrs.evolve(opened, infos=infos)
    load, raw = opened.load, opened.raw
    source = attrs.evolve(opened.source, renames=tuple(sorted(renamed.items())))
    return attrs.evolve(opened, infos=infos, source=source,
                        load=lambda name: load(renamed.get(name, name)),
                        raw=lambda name: raw(renamed.get(name, name)))


def read_model(source: Any, model_id: str) -> OpenedModel:
    """Parameters, source record and loaders for what ``models.add`` was given."""
    if isinstance(source, (str, os.PathLike)):
        opened = _from_files(model_id, Path(source))
    elif _is_torch_module(source):
        kind = f"{type(source).__module__}.{type(source).__qualname__}"
        opened = _from_mapping(model_id, dict(source.named_parameters()), f"torch module {kind}",
                               module_types(source))
    elif isinstance(source, Mapping):
        opened = _from_mapping(model_id, source, "state dict")
    else:
        raise ModelSourceError(
            f"Model {model_id!r}: cannot read a {type(source).__module__}."
            f"{type(source).__qualname__}. Pass a torch.nn.Module, a state dict (names to "
            "tensors or arrays), a checkpoint file or a checkpoint directory.",
            model_id=model_id,
        )
    if not opened.infos:
        raise EmptyModelError(
            f"Model {model_id!r} has no floating-point parameters, so there is nothing to "
            "analyse. Check that you passed the model (or its state dict), not an empty "
            "container.",
            model_id=model_id,
        )
    return opened
