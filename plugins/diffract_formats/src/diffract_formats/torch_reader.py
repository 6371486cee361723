"""Torch state-dict files (``.pt``, ``.pth``, ``.bin``), read without memory maps.

A zip-format file (what ``torch.save`` writes since torch 1.6) is opened with
``torch.load(weights_only=True, map_location="meta")``: the pickle gives every tensor's
dtype, shape, strides and storage, and torch records where each storage's bytes start in
the file, but no tensor data is read. A tensor is then read with plain file reads of the
bytes it covers (a slice of a row-major tensor: only its rows), into memory the caller
owns. Nothing of the file is memory-mapped, so a training job that saves its next
checkpoint over the file while an apply reads it cannot kill the process (with a memory
map the next access of a truncated page is SIGBUS): a short read is a ModelSourceError
for that parameter, the others go on.

The legacy (pre-zip) format, and files whose bytes are big-endian, are read whole by
``torch.load``, also into owned memory.
"""

from __future__ import annotations

import re
import sys
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelWarning, warn
from diffract.plugins import CheckpointReader, TensorEntry, read_rows, to_slices
from diffract_formats._common import ConfigBeside, error, library

__all__ = ["TorchReader"]



def _little_endian_zip(path: str) -> bool:
    """Whether the file is a zip-format torch file whose bytes can be read as they lie
    (little-endian, as every x86 and ARM machine writes them)."""
    try:
        with zipfile.ZipFile(path) as archive:
            order = [n for n in archive.namelist() if n.endswith("/byteorder")]
            return not order or archive.read(order[0]).strip() == b"little"
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _torch_load(path: str, meta: bool) -> Mapping[str, Any]:
    """``torch.load(weights_only=True)``, with tensors on the meta device when ``meta``
    (their bytes unread). Raises ModelSourceError naming what is not a plain state dict."""
    torch = library("torch", path, "reading a torch file needs torch: pip install torch "
                                   "(or diffractml-formats[torch])")
    name = Path(path).name
    try:
        state = torch.load(path, map_location="meta" if meta else "cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - reported with the fix, never torch's advice
        text = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"global ([\w.]+)", text)
        if found:
            why = f"it holds a pickled {found.group(1)}, not a plain state dict of tensors"
        elif "weights_only" in text.lower() or "unpickl" in text.lower():
            why = "it holds pickled objects, not a plain state dict of tensors"
        else:
            why = f"torch cannot read it ({type(exc).__name__}: {text.splitlines()[0][:200]})"
        raise error(path, f"cannot read {name} with torch.load(weights_only=True): {why}. "
                           "Diffract never unpickles arbitrary objects: save "
                           "model.state_dict() with torch.save and add that") from None
    if not isinstance(state, Mapping):
        raise error(path, f"{name} holds a {type(state).__name__}, not a state dict; save "
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
            raise error(path, f"{name} has no entry {key!r} holding a state dict; the "
                               f"entries that do: {candidates or 'none'}")
        return state[key]
    if all(not isinstance(v, Mapping) for v in state.values()):
        return state  # a plain state dict (entries that are no tensors are named later)
    if len(candidates) == 1:
        warn(ModelWarning(
            f"{name} is a training checkpoint: its state dict is entry {candidates[0]!r} "
            f"(entries {sorted(map(str, state))}); pass key= (diffract analyze --key) to "
            "read another"))
        return state[candidates[0]]
    if len(candidates) > 1:
        raise error(path, f"{name} is a training checkpoint with several state dicts: "
                           f"{candidates}; choose one with key=NAME (models.add(..., key=...), "
                           "diffract analyze --key NAME)")
    return state


class TorchReader(ConfigBeside, CheckpointReader):
    """A torch state-dict file, or a training checkpoint holding one (``key`` names its
    entry when there are several). See the module docstring for how it is read."""

    def __init__(self, path: str, key: str | None = None) -> None:
        self._path = str(Path(path).resolve())
        #: True when tensors are meta tensors whose bytes are read from the file on demand.
        self._lazy = _little_endian_zip(self._path)
        self._state = _state_dict(_torch_load(path, meta=self._lazy), path, key)

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> Iterator[TensorEntry]:
        torch = sys.modules["torch"]
        for name, value in self._state.items():
            if not isinstance(value, torch.Tensor):
                nested = (" (a training checkpoint: save its 'state_dict' entry)"
                          if isinstance(value, Mapping) else "")
                raise error(self._path, f"entry {name!r} is a {type(value).__name__}, not a "
                                         f"tensor{nested}")
            yield TensorEntry(name, tuple(value.shape), str(value.dtype).removeprefix("torch."))

    def read(self, name: str, index: Any = None) -> Any:
        value = self._state[name]
        if not self._lazy:
            return value if index is None else value[to_slices(index)]
        return self._read(name, value, index)

    # -- reading a meta tensor's bytes ----------------------------------------------------

    def _bytes(self, name: str, fh: Any, start: int, count: int) -> np.ndarray:
        """``count`` bytes from byte ``start`` of the file, or a ModelSourceError saying
        the file changed under the read."""
        buf = np.empty(count, dtype=np.uint8)
        fh.seek(start)
        got = fh.readinto(memoryview(buf))
        if got != count:
            raise error(self._path, f"tensor {name!r}: read {got or 0} of {count} bytes: the "
                                     "file is shorter than when it was opened (a checkpoint "
                                     "saved over it?); add the model again")
        return buf

    def _read(self, name: str, meta: Any, index: Any) -> Any:
        torch = sys.modules["torch"]
        item = meta.element_size()
        storage = meta.untyped_storage()
        base = getattr(storage, "_checkpoint_offset", None)
        if base is None:  # pragma: no cover - a torch that records no offsets
            raise error(self._path, f"tensor {name!r}: this torch ({torch.__version__}) does "
                                     "not say where the tensor's bytes lie; upgrade torch")
        base += meta.storage_offset() * item
        shape = tuple(meta.shape)
        out_shape = tuple(meta[to_slices(index)].shape) if index is not None else shape
        if meta.numel() == 0 or 0 in out_shape:
            return torch.empty(out_shape, dtype=meta.dtype)
        with open(self._path, "rb") as fh:
            if meta.is_contiguous():
                per_row = item * (int(np.prod(shape[1:])) if shape else 1)
                void = np.dtype(f"V{item}")

                def rows(start: int, stop: int) -> np.ndarray:
                    got = self._bytes(name, fh, base + start * per_row, (stop - start) * per_row)
                    return got.view(void).reshape((stop - start, *shape[1:]) if shape else ())

                if index is None:
                    raw = rows(0, shape[0] if shape else 1)
                else:
                    raw = read_rows(shape, index, rows, itemsize=item)
                raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
            else:  # a strided view was saved: read the span it covers, then pick
                span = 1 + sum((n - 1) * s for n, s in zip(shape, meta.stride(), strict=True))
                got = self._bytes(name, fh, base, span * item).view(np.dtype(f"V{item}"))
                picked = np.lib.stride_tricks.as_strided(
                    got, shape, [s * item for s in meta.stride()], writeable=False)
                if index is not None:
                    picked = picked[to_slices(index)]
                raw = np.ascontiguousarray(picked).reshape(-1).view(np.uint8)
        return torch.from_numpy(raw).view(meta.dtype).reshape(out_shape)
