"""The readers: safetensors files, torch state-dict files, ``.npz`` files and Hugging
Face-style checkpoint directories.

Each lists its tensors without reading them and reads one tensor, or a slice of one (a
view: :func:`diffract.plugins.read_rows` reads a safetensors slice by its rows, so only
those bytes are read). Problems at the file boundary are
:class:`~diffract.errors.ModelSourceError` naming the file and what to do; the core adds
the model's name.
"""

from __future__ import annotations

import json
import re
import sys
import warnings
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from diffract.errors import ModelSourceError, ModelWarning
from diffract.plugins import CheckpointReader, TensorEntry, read_rows, to_slices
from diffract_formats._safetensors import ITEMSIZE, SafetensorsError, SafetensorsFile

__all__ = ["HF_MARKERS", "HuggingFaceReader", "NpzReader", "SafetensorsReader", "TorchReader",
           "hf_layout"]

#: Files that make a directory a Hugging Face-style checkpoint, in the order looked for.
HF_MARKERS = ("model.safetensors.index.json", "model.safetensors",
              "pytorch_model.bin.index.json", "pytorch_model.bin")


def _error(path: str | Path, problem: str) -> ModelSourceError:
    return ModelSourceError(f"{problem} ({str(path)!r})", model_id=None)


class SafetensorsReader(CheckpointReader):
    """A ``.safetensors`` file, read with plain file reads (see ``_safetensors``)."""

    def __init__(self, path: str) -> None:
        try:
            self._file = SafetensorsFile(path)
        except (OSError, SafetensorsError) as exc:  # a truncated or lying header
            raise _error(path, f"not a readable safetensors file: {exc}. The file is "
                               "truncated or its header is corrupt; export it again") from None

    @property
    def files(self) -> list[str]:
        return [self._file.path]

    @property
    def names(self) -> set[str]:
        """Every tensor's name, whatever its dtype."""
        return set(self._file.entries) | set(self._file.skipped)

    @property
    def skipped(self) -> dict[str, str]:
        """Tensors of dtypes not read as weights (complex, 4-bit...), with what they are."""
        return dict(self._file.skipped)

    def entries(self) -> Iterator[TensorEntry]:
        for name, what in self._file.skipped.items():
            warnings.warn(ModelWarning(
                f"{Path(self._file.path).name}: tensor {name!r} is {what}, which Diffract "
                "does not analyse; it is left out, the others are read"), stacklevel=4)
        for name, shape, dtype in self._file.floats():
            yield TensorEntry(name, shape, dtype)

    def _rows(self, name: str, index: Any, convert: bool) -> np.ndarray:
        dtype, shape, _, _ = self._file.entries[name]

        def rows(start: int, stop: int) -> np.ndarray:
            return self._file.rows(name, start, stop, convert=convert)

        if index is None:
            return rows(0, shape[0] if shape else 1)
        itemsize = 4 if convert or dtype.startswith("F8") else ITEMSIZE[dtype]
        return read_rows(shape, index, rows, itemsize=itemsize)

    def read(self, name: str, index: Any = None) -> Any:
        """A torch tensor when torch is loaded (bf16 kept), else numpy (bf16 as float32)."""
        if "torch" not in sys.modules:
            return self._rows(name, index, convert=True)
        import torch

        values = torch.from_numpy(self._rows(name, index, convert=False))
        return values.view(torch.bfloat16) if self._file.entries[name][0] == "BF16" else values

    def read_numpy(self, name: str, index: Any = None) -> np.ndarray:
        return self._rows(name, index, convert=True)


def _torch_load(path: str) -> Mapping[str, Any]:
    """``torch.load(weights_only=True)``: memory-mapped for zip files, whole for the
    legacy format. Raises ModelSourceError naming what is not a plain state dict."""
    try:
        import torch
    except ImportError:
        raise _error(path, "reading a torch file needs torch: pip install torch (or "
                           "diffract-formats[torch])") from None
    name = Path(path).name
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc) and "zip" not in str(exc):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy
    except Exception as exc:  # noqa: BLE001 - reported with the fix, never torch's advice
        text = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global ([\w.]+)", text)
        if found:
            why = f"it holds a pickled {found.group(1)}, not a plain state dict of tensors"
        elif "weights_only" in text.lower() or "unpickl" in text.lower():
            why = "it holds pickled objects, not a plain state dict of tensors"
        else:
            why = f"torch cannot read it ({type(exc).__name__}: {text.splitlines()[0][:200]})"
        raise _error(path, f"cannot read {name} with torch.load(weights_only=True): {why}. "
                           "Diffract never unpickles arbitrary objects: save "
                           "model.state_dict() with torch.save and add that") from None
    if not isinstance(state, Mapping):
        raise _error(path, f"{name} holds a {type(state).__name__}, not a state dict; save "
                           "model.state_dict() and add that")
    return state


def _tensors_only(value: Any) -> bool:
    torch = sys.modules["torch"]
    return (isinstance(value, Mapping) and len(value) > 0
            and all(isinstance(v, torch.Tensor) for v in value.values()))


def _state_dict(state: Mapping[str, Any], path: str, key: str | None) -> Mapping[str, Any]:
    """The state dict of a torch file: the file's mapping itself, or, in a training
    checkpoint (``{"model": state_dict, "optimizer": ..., "step": ...}``), the one entry
    that is a mapping of tensors (``key`` picks one when several are)."""
    name = Path(path).name
    candidates = sorted(str(k) for k, v in state.items() if _tensors_only(v))
    if key is not None:
        if key not in state or not _tensors_only(state[key]):
            raise _error(path, f"{name} has no entry {key!r} holding a state dict; the "
                               f"entries that do: {candidates or 'none'}")
        return state[key]
    if all(not isinstance(v, Mapping) for v in state.values()):
        return state  # a plain state dict (entries that are no tensors are named later)
    if len(candidates) == 1:
        warnings.warn(ModelWarning(
            f"{name} is a training checkpoint: its state dict is entry {candidates[0]!r} "
            f"(entries {sorted(map(str, state))}); pass key= (diffract analyze --key) to "
            "read another"), stacklevel=4)
        return state[candidates[0]]
    if len(candidates) > 1:
        raise _error(path, f"{name} is a training checkpoint with several state dicts: "
                           f"{candidates}; choose one with key=NAME (models.add(..., key=...), "
                           "diffract analyze --key NAME)")
    return state


class TorchReader(CheckpointReader):
    """A torch state-dict file (``.pt``, ``.pth``, ``.bin``), or a training checkpoint
    holding one (``key`` names its entry when there are several)."""

    def __init__(self, path: str, key: str | None = None) -> None:
        self._path = str(Path(path).resolve())
        self._state = _state_dict(_torch_load(path), path, key)

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> Iterator[TensorEntry]:
        torch = sys.modules["torch"]
        for name, value in self._state.items():
            if not isinstance(value, torch.Tensor):
                nested = (" (a training checkpoint: save its 'state_dict' entry)"
                          if isinstance(value, Mapping) else "")
                raise _error(self._path, f"entry {name!r} is a {type(value).__name__}, not a "
                                         f"tensor{nested}")
            yield TensorEntry(name, tuple(value.shape), str(value.dtype).removeprefix("torch."))

    def read(self, name: str, index: Any = None) -> Any:
        value = self._state[name]
        return value if index is None else value[to_slices(index)]


class NpzReader(CheckpointReader):
    """A numpy ``.npz`` file (``allow_pickle=False``); shapes come from the members'
    headers, so listing it reads no array."""

    def __init__(self, path: str) -> None:
        self._path = str(Path(path).resolve())
        self._entries = []
        try:
            with zipfile.ZipFile(self._path) as archive:
                for member in archive.namelist():
                    if not member.endswith(".npy"):
                        continue
                    with archive.open(member) as fh:
                        major, _ = np.lib.format.read_magic(fh)
                        header = (np.lib.format.read_array_header_1_0 if major == 1
                                  else np.lib.format.read_array_header_2_0)
                        shape, _, dtype = header(fh)
                    self._entries.append(TensorEntry(member[:-4], shape, str(dtype)))
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise _error(path, f"not a readable .npz file: {exc}") from None

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> list[TensorEntry]:
        return list(self._entries)

    def read(self, name: str, index: Any = None) -> np.ndarray:
        with np.load(self._path, allow_pickle=False) as npz:
            value = npz[name]
        return value if index is None else value[to_slices(index)]


def _check_inside(root: Path, shard: str) -> None:
    """Refuse a shard that is not a file of the checkpoint directory: an absolute or
    ``..`` name, or a symlink resolving outside it (a Hugging Face cache snapshot's links
    into its repository's ``blobs/`` are inside). ``allow_outside=True`` lifts this."""
    base = root.resolve()
    target = (root / shard).resolve()
    blobs = base.parent.parent / "blobs" if base.parent.name == "snapshots" else None
    if Path(shard).is_absolute() or not (
            target.is_relative_to(base) or (blobs is not None and target.is_relative_to(blobs))):
        raise _error(root, f"shard {shard!r} resolves to {str(target)!r}, outside the "
                           "checkpoint directory; Diffract reads only the directory's own "
                           "files (models.add(..., format_options={'allow_outside': True}) "
                           "if you mean it)")


def hf_layout(path: str) -> bool:
    """Whether ``path`` is a Hugging Face-style checkpoint directory."""
    return any((Path(path) / marker).is_file() for marker in HF_MARKERS)


class HuggingFaceReader(CheckpointReader):
    """A Hugging Face-style checkpoint directory: a shard index with its shards, or one
    ``model.safetensors`` / ``pytorch_model.bin``; ``config.json`` is its configuration."""

    def __init__(self, path: str, allow_outside: bool = False) -> None:
        self._root = root = Path(path)
        marker = next((m for m in HF_MARKERS if (root / m).is_file()), None)
        if marker is None:
            raise _error(root, f"the directory holds none of {list(HF_MARKERS)}; pass a "
                               "checkpoint file or a Hugging Face-style checkpoint directory")
        kind = SafetensorsReader if marker.startswith("model.") else TorchReader
        shards: dict[str, list[str] | None] = {marker: None}
        if marker.endswith(".index.json"):
            shards = self._index(root / marker)
        if not allow_outside:
            for shard in shards:
                _check_inside(root, shard)
        self._readers = [kind(str(root / shard)) for shard in shards]
        self._wanted = [set(names) if names is not None else None for names in shards.values()]
        self._where: dict[str, int] = {}

    @staticmethod
    def _index(path: Path) -> dict[str, list[str] | None]:
        try:
            weight_map = json.loads(path.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise _error(path, f"unreadable shard index ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); it must be JSON with a 'weight_map'"
                         ) from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise _error(path, "the shard index's 'weight_map' must map tensor names to "
                               "shard file names (strings); fix or regenerate the index")
        shards: dict[str, list[str] | None] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)  # type: ignore[union-attr]
        missing = sorted(s for s in shards if not (path.parent / s).is_file())
        if missing:
            raise _error(path.parent, f"the shard index lists {len(missing)} missing "
                                      f"shard(s): {missing[:5]}; download them or fix the index")
        return shards

    @property
    def files(self) -> list[str]:
        return [f for reader in self._readers for f in reader.files]

    def entries(self) -> Iterator[TensorEntry]:
        missing: list[str] = []
        for i, (reader, wanted) in enumerate(zip(self._readers, self._wanted, strict=True)):
            found = set()
            for entry in reader.entries():
                found.add(entry.name)
                if wanted is None or entry.name in wanted:
                    self._where[entry.name] = i
                    yield attrs.evolve(entry, file=i)
            if wanted is not None:  # every tensor of the shard counts, integers too
                held = set(getattr(reader, "names", found)) | set(getattr(reader, "skipped", ()))
                lacking = set(wanted) - held
                missing += [f"{n} (in {Path(reader.files[0]).name})" for n in sorted(lacking)]
        if missing:
            raise _error(self._root, f"the shard index names {len(missing)} tensor(s) their "
                                     f"shards lack: {', '.join(missing[:5])}; download the "
                                     "shards again or fix the index")

    def _reader(self, name: str) -> CheckpointReader:
        if not self._where:
            for _ in self.entries():
                pass
        return self._readers[self._where[name]]

    def read(self, name: str, index: Any = None) -> Any:
        return self._reader(name).read(name, index)

    def read_numpy(self, name: str, index: Any = None) -> np.ndarray:
        return self._reader(name).read_numpy(name, index)

    def config(self) -> dict[str, Any]:
        path = self._root / "config.json"
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise _error(path, f"config.json cannot be read as JSON ({exc}); fix it, or give "
                               "the geometry as view options") from None
        if not isinstance(data, dict):
            raise _error(path, "config.json holds no JSON object; fix it, or give the "
                               "geometry as view options")
        return data

