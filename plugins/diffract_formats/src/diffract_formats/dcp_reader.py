"""torch.distributed.checkpoint (DCP) folders: a ``.metadata`` file and the
``__<rank>_<i>.distcp`` files every rank wrote (torchtitan, OLMo-core, FSDP/DTensor
saves), read without unpickling anything but the metadata's own classes.

torch's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain
``pickle.load``: a hostile checkpoint runs code there. Here the metadata is read by an
unpickler that resolves only the classes DCP's metadata is made of (its dataclasses,
``torch.Size``, dtypes, layouts and memory formats, paths) and refuses the file, naming
what it asked for, otherwise. Each stored item (one chunk of a tensor: a tensor sharded
over ranks has one per shard, with its offsets) is read with plain reads of its byte range
into memory the caller owns and decoded by ``torch.load(weights_only=True)``; its shape
and dtype must be what the metadata declares, and every range must lie inside a file in
the folder (no ``..``, no absolute path, no link out of it).

The model's parameters are the tensors under the prefix the stacks use (``app.model.``,
``model.``, ``module.``: the first that holds every tensor but the training state), named
without it; otherwise every tensor outside the optimizer, scheduler, RNG and loader
state, named as saved. The option ``prefix`` names another. Scalars and pickled objects
(``BytesStorageMetadata``) are left out.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, TensorEntry, inside, to_slices
from diffract_formats._common import config_json, error, file_identity, library
from diffract_formats._safetensors import LocalFiles

__all__ = ["DcpReader", "dcp_folder", "dcp_layout"]

METADATA = ".metadata"
#: OLMo-core writes the model and optimizer state one folder down.
INNER = ("model_and_optim",)
#: Where the stacks put the model's parameters, tried in this order.
PREFIXES = ("app.model.", "model.", "module.")
#: Top-level groups that are not the model (torchtitan saves the model's keys bare).
NOT_MODEL = ("optimizer", "optim", "lr_scheduler", "scheduler", "dataloader", "train_state",
             "rng", "rng_state", "rng_states", "extra_state", "trainer")
#: A metadata file larger than this is refused before it is read.
MAX_METADATA = 256 << 20
#: The most cells of the grid a tensor's chunk boundaries cut that the tiling check marks
#: (one byte each): far more than any rank layout makes (as many cells as chunks).
MAX_GRID_CELLS = 1 << 26

_DCP = "torch.distributed.checkpoint."
#: (module, name) the metadata unpickler resolves; dtypes are checked apart.
_ALLOWED = {
    _DCP + "metadata": {"Metadata", "TensorStorageMetadata", "ChunkStorageMetadata",
                        "TensorProperties", "BytesStorageMetadata", "MetadataIndex",
                        "StorageMeta", "_MEM_FORMAT_ENCODING"},
    _DCP + "filesystem": {"_StorageInfo"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
}


def dcp_folder(path: str | Path) -> Path | None:
    """The folder holding the ``.metadata`` of the DCP checkpoint at ``path`` (the path
    itself, or OLMo-core's ``model_and_optim/`` inside it), or None."""
    p = Path(path)
    for folder in (p, *(p / name for name in INNER)):
        if (folder / METADATA).is_file():
            return folder
    return None


def _checked_folder(path: str | Path) -> Path | None:
    """:func:`dcp_folder`, resolved, with its ``.metadata`` and OLMo-core's inner folder
    inside the checkpoint's folder (neither may link out of it)."""
    folder = dcp_folder(path)
    if folder is None:
        return None
    inside(path, folder.relative_to(path) / METADATA)
    return inside(path, folder.relative_to(path))


def dcp_layout(path: str) -> bool:
    return dcp_folder(path) is not None


class _MetadataUnpickler(pickle._Unpickler):  # the Python one: a length read is a read
    # (the C unpickler allocates what a length field declares before reading it)
    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(io.BytesIO(data))
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        torch = sys.modules["torch"]
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise error(self._path, f"the checkpoint's metadata asks for {module}.{name}, which "
                                "is not part of torch.distributed.checkpoint's metadata: "
                                "refused, Diffract never runs code from a checkpoint (a "
                                "hostile or foreign .metadata; save it with "
                                "torch.distributed.checkpoint.save)")

    def persistent_load(self, pid: Any) -> Any:
        raise error(self._path, "the checkpoint's metadata holds a persistent reference, "
                                "which DCP metadata never does: refused")


def read_metadata(path: Any, files: Any = LocalFiles) -> Any:
    """The ``Metadata`` of ``path`` (a ``.metadata`` file, on ``files``: plain files or an
    object store), unpickled safely."""
    library("torch", path, "reading a torch.distributed.checkpoint needs torch: pip install "
                           "torch")
    import torch.distributed.checkpoint.filesystem  # noqa: F401 - the classes resolved
    import torch.distributed.checkpoint.metadata as meta

    size = files.size(path)
    if size > MAX_METADATA:
        raise error(path, f"the metadata is {size} bytes, over {MAX_METADATA}: not a DCP "
                          "checkpoint's")
    with files.open(path) as fh:
        data = fh.read(MAX_METADATA + 1)
    try:
        found = _MetadataUnpickler(data, path).load()
    except ModelSourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure of the pickle is damage
        raise error(path, f"the metadata is damaged or not a pickle ({type(exc).__name__}: "
                          f"{str(exc)[:200]})") from None
    if not isinstance(found, meta.Metadata) or not isinstance(
            getattr(found, "state_dict_metadata", None), dict):
        raise error(path, f"the metadata holds a {type(found).__name__}, not DCP's Metadata")
    if not isinstance(getattr(found, "storage_data", None), dict):
        raise error(path, "the metadata says where no item is stored (no storage_data): "
                          "was it written by a storage other than the file system's?")
    return found


def _not_model(name: str) -> bool:
    """A key of the optimizer, scheduler, RNG or loader state (``app.`` in front or not)."""
    parts = name.split(".")
    return parts[0] in NOT_MODEL or (parts[0] == "app" and len(parts) > 1
                                     and parts[1] in NOT_MODEL)


def _choose(names: list[str], prefix: str | None) -> tuple[str, list[str]]:
    """The prefix of the model's parameters and the tensor keys under it: a stack's
    prefix when every other tensor is training state (a model saved bare whose own names
    start with ``model.``, as a Hugging Face causal LM's do beside ``lm_head``, keeps
    them whole)."""
    if prefix is not None:
        return prefix, [n for n in names if n.startswith(prefix)]
    for candidate in PREFIXES:
        under = [n for n in names if n.startswith(candidate)]
        if under and all(n.startswith(candidate) or _not_model(n) for n in names):
            return candidate, under
    return "", [n for n in names if not _not_model(n)]


class DcpReader(CheckpointReader):
    """A DCP checkpoint folder (see the module docstring). ``prefix`` names where the
    model's parameters are, when not under ``app.model.``, ``model.`` or ``module.``."""

    def __init__(self, path: str, prefix: str | None = None) -> None:
        folder = _checked_folder(path)
        if folder is None:
            raise error(path, f"no {METADATA} here (nor in model_and_optim/): not a "
                              "torch.distributed.checkpoint folder")
        self._root = folder
        self._metadata_path = self._root / METADATA
        self._indexed(read_metadata(self._metadata_path), prefix)

    def _indexed(self, metadata: Any, prefix: str | None) -> None:
        try:
            self._index(metadata, prefix)
        except ModelSourceError:
            raise  # said with its file and tensor
        except (AttributeError, TypeError, ValueError, KeyError, IndexError,
                OverflowError) as exc:  # a pickle of the right classes, wrongly filled
            raise error(self._metadata_path, f"the metadata is damaged ({type(exc).__name__}: "
                                             f"{str(exc)[:200]})") from None

    def _index(self, metadata: Any, prefix: str | None) -> None:
        """Every model tensor's chunks, each checked against the folder's files."""
        import torch
        import torch.distributed.checkpoint.metadata as meta

        tensors = {k: v for k, v in metadata.state_dict_metadata.items()
                   if isinstance(k, str) and isinstance(v, meta.TensorStorageMetadata)}
        self._prefix, keys = _choose(sorted(tensors), prefix)
        if not keys:
            groups = sorted({k.split(".", 1)[0] for k in tensors})
            raise error(self._metadata_path,
                        f"no model tensor here{f' under {prefix!r}' if prefix else ''}: "
                        f"the tensors are under {groups or 'nothing'}; name the model's "
                        "prefix with format_options={'prefix': 'NAME.'}")
        where: dict[tuple[str, tuple[int, ...]], Any] = {}
        for index, info in metadata.storage_data.items():
            fqn, offset = getattr(index, "fqn", None), getattr(index, "offset", None)
            if isinstance(fqn, str) and offset is not None:
                where[(fqn, tuple(int(o) for o in offset))] = info
        sizes: dict[Path, int] = {}
        files: dict[Any, Path] = {}  # each file the metadata names, checked once
        self._stats: dict[Path, tuple[int, ...]] = {}
        self._tensors: dict[str, tuple[Any, list[tuple[Any, Path, int, int]]]] = {}
        for key in keys:
            entry = tensors[key]
            shape = tuple(int(s) for s in entry.size)
            if not isinstance(entry.properties.dtype, torch.dtype):
                raise TypeError(f"tensor {key!r} has no dtype")
            chunks = []
            for chunk in entry.chunks:
                offsets = tuple(int(o) for o in chunk.offsets)
                lengths = tuple(int(s) for s in chunk.sizes)
                if len(offsets) != len(shape) or len(lengths) != len(shape) or any(
                        o < 0 or n < 0 or o + n > s
                        for o, n, s in zip(offsets, lengths, shape, strict=True)):
                    raise error(self._metadata_path, f"tensor {key!r}: a chunk at {offsets} "
                                                     f"of {lengths} lies outside its shape "
                                                     f"{shape}")
                info = where.get((key, offsets))
                if info is None:
                    raise error(self._metadata_path, f"tensor {key!r}: the chunk at "
                                                     f"{offsets} is stored nowhere")
                file = files.get(info.relative_path) or self._inside(info.relative_path, key)
                files[info.relative_path] = file
                if file not in sizes:
                    sizes[file], self._stats[file] = self._measure(file)
                start, length = int(info.offset), int(info.length)
                if not isinstance(info.offset, int) or not isinstance(info.length, int):
                    raise TypeError(f"tensor {key!r}: a chunk's place is not in bytes")
                if getattr(info, "transform_descriptors", None):
                    raise error(file, f"tensor {key!r} is stored transformed "
                                      f"({info.transform_descriptors}): compressed or "
                                      "extended DCP items are not read; save without them")
                if start < 0 or length < 0 or start + length > sizes[file]:
                    raise error(file, f"tensor {key!r}: the metadata puts a chunk at bytes "
                                      f"{start}..{start + length} of a {sizes[file]}-byte "
                                      "file (cut short, or not this checkpoint's)")
                if math.prod(lengths) * entry.properties.dtype.itemsize > length:
                    raise error(file, f"tensor {key!r}: a chunk of {lengths} is declared in "
                                      f"{length} bytes, fewer than its entries take")
                chunks.append((offsets, lengths, file, start, length))
            problem = _tiling_problem(shape, chunks)
            if problem is not None:
                raise error(self._metadata_path, f"tensor {key!r}: its chunks do not tile its "
                                                 f"shape {shape} ({problem})")
            self._tensors[key[len(self._prefix):]] = (entry, chunks)
        self._files = [str(self._metadata_path), *sorted(map(str, sizes))]
        #: each tensor's first chunk's file (the core checks its identity before a read;
        #: the reader checks every file it reads against what it saw when opened)
        self._file_of = {name: self._files.index(str(chunks[0][2])) if chunks else 0
                         for name, (_, chunks) in self._tensors.items()}

    def _inside(self, relative: Any, key: str) -> Path:
        """A file the metadata names, refused unless it lies in the folder."""
        if not isinstance(relative, str) or not relative:
            raise error(self._metadata_path, f"tensor {key!r} is stored at {relative!r}, "
                                             "which names no file: refused")
        try:
            file = inside(self._root, relative)
        except ModelSourceError as exc:
            raise error(self._metadata_path, f"tensor {key!r}: {exc}") from None
        if not file.is_file():
            raise error(self._metadata_path, f"tensor {key!r} is stored in {relative!r}, "
                                             "which is not a file of the checkpoint's folder")
        return file

    @staticmethod
    def _measure(file: Any) -> tuple[int, Any]:
        """A file's size and what tells it from another (compared before each read)."""
        stat = os.stat(file)
        return stat.st_size, file_identity(stat)

    def _bytes(self, name: str, file: Any, start: int, length: int) -> bytearray:
        """``length`` bytes of ``file`` from ``start``, the file checked unchanged."""
        buf = bytearray(length)
        with open(file, "rb") as fh:
            if file_identity(os.fstat(fh.fileno())) != self._stats[file]:
                raise error(file, f"tensor {name!r}: the file changed since the checkpoint "
                                  "was opened (saved over?); add the model again")
            fh.seek(start)
            got = fh.readinto(buf)
        if got != length:
            raise error(file, f"tensor {name!r}: read {got or 0} of {length} bytes: the "
                              "file is shorter than when it was opened; add the model again")
        return buf

    @property
    def files(self) -> list[str]:
        return list(self._files)

    def config(self) -> dict[str, Any]:
        """``config.json`` in the folder (or in the step folder above OLMo-core's
        ``model_and_optim/``, still the checkpoint's own), for view rules."""
        found = config_json(self._root)
        if not found and self._root.name in INNER:
            found = config_json(self._root.parent)
        return found

    def entries(self) -> Iterator[TensorEntry]:
        for name, (entry, _) in self._tensors.items():
            dtype = str(entry.properties.dtype).removeprefix("torch.")
            yield TensorEntry(name, tuple(int(s) for s in entry.size), dtype,
                              file=self._file_of[name])

    def read(self, name: str, index: Any = None) -> Any:
        import torch

        entry, chunks = self._tensors[name]
        shape = tuple(int(s) for s in entry.size)
        box = _box(shape, index)  # [lo, hi) per axis: what the index touches
        out = torch.empty([hi - lo for lo, hi in box], dtype=entry.properties.dtype)
        for offsets, lengths, file, start, length in chunks:
            cut = [(max(lo, o), min(hi, o + n))
                   for (lo, hi), o, n in zip(box, offsets, lengths, strict=True)]
            if any(a >= b for a, b in cut):
                continue
            part = self._item(name, file, start, length, lengths, entry.properties.dtype)
            src = tuple(slice(a - o, b - o) for (a, b), o in zip(cut, offsets, strict=True))
            dst = tuple(slice(a - lo, b - lo) for (a, b), (lo, _) in zip(cut, box, strict=True))
            out[dst] = part[src]
        if index is None:
            return out
        local = tuple(e - box[axis][0] if isinstance(e, int) else
                      slice(e.start - box[axis][0], e.stop - box[axis][0], e.step)
                      for axis, e in enumerate(to_slices(_resolved(shape, index))))
        return out[local]

    def _item(self, name: str, file: Any, start: int, length: int,
              lengths: tuple[int, ...], dtype: Any) -> Any:
        """One stored chunk: ``length`` bytes from ``start``, decoded as a tensor."""
        import torch

        buf = self._bytes(name, file, start, length)
        try:
            if bytes(buf[:2]) == b"PK":  # torch.save's zip format (DCP's default)
                part = torch.load(io.BytesIO(buf), map_location="cpu", weights_only=True)
            else:  # serialization_format=SAFETENSORS: one tensor per item
                from safetensors.torch import load as load_safetensors

                found = load_safetensors(bytes(buf))
                part = next(iter(found.values())) if len(found) == 1 else None
        except Exception as exc:  # noqa: BLE001 - a damaged item, said with its place
            raise error(file, f"tensor {name!r}: the chunk at byte {start} is not a stored "
                              f"tensor ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(part, torch.Tensor) or tuple(part.shape) != lengths \
                or part.dtype != dtype:
            what = (f"a {tuple(part.shape)} {part.dtype} tensor" if isinstance(
                part, torch.Tensor) else f"a {type(part).__name__}")
            raise error(file, f"tensor {name!r}: the chunk at byte {start} holds {what}, the "
                              f"metadata says {lengths} {dtype}")
        return part


def _tiling_problem(shape: tuple[int, ...], chunks: list[tuple[Any, ...]]) -> str | None:
    """Why the chunks (offsets, sizes, ...), each inside ``shape``, do not tile it, or None.

    They tile it when they cover as many entries as it holds and no two share an entry.
    Overlap is checked on the grid the chunks' own boundaries cut (one row of cells per
    distinct offset along each axis): every chunk is a block of its cells, so two chunks
    share an entry exactly when they share a cell. Chunks covering more cells in all than
    the grid holds overlap; chunks of one cell each (the grids ranks write: one row, or
    one block of a grid, per rank) overlap when two have the same cell; otherwise each
    chunk's cells are marked once, a cell marked twice being the overlap. O(n log n) in
    the number of chunks, where comparing them pair by pair was quadratic (20,000 chunks
    of one tensor took minutes)."""
    covered = sum(math.prod(c[1]) for c in chunks)
    if covered != math.prod(shape):
        return f"they cover {covered} of {math.prod(shape)} entries"
    boxes = [(c[0], c[1]) for c in chunks if math.prod(c[1])]
    if len(boxes) < 2:
        return None
    starts = np.array([o for o, _ in boxes], dtype=np.int64).reshape(len(boxes), len(shape))
    stops = starts + np.array([n for _, n in boxes], dtype=np.int64).reshape(starts.shape)
    cuts = [np.unique(np.concatenate([starts[:, a], stops[:, a]])) for a in range(len(shape))]
    first = np.stack([np.searchsorted(c, starts[:, a]) for a, c in enumerate(cuts)], axis=1)
    last = np.stack([np.searchsorted(c, stops[:, a]) for a, c in enumerate(cuts)], axis=1)
    grid = tuple(len(c) - 1 for c in cuts)
    spans = np.prod(last - first, axis=1, dtype=np.float64)  # no int64 overflow
    if spans.sum() > math.prod(grid):
        return "two of them overlap"
    if (spans == 1).all():
        return "two of them overlap" if len(np.unique(first, axis=0)) < len(boxes) else None
    if math.prod(grid) > MAX_GRID_CELLS:
        return (f"their {len(boxes)} chunks cut it into {math.prod(grid)} pieces, more than "
                f"Diffract checks ({MAX_GRID_CELLS}); save it with a regular sharding")
    marked = np.zeros(grid, dtype=bool)
    for lo, hi in zip(first.tolist(), last.tolist(), strict=True):
        block = tuple(map(slice, lo, hi))
        if marked[block].any():
            return "two of them overlap"
        marked[block] = True
    return None


def _resolved(shape: tuple[int, ...], index: Any) -> tuple[Any, ...]:
    out = []
    for axis, e in enumerate(index):
        if isinstance(e, int):
            out.append(e)
        else:
            start, stop, step = e
            out.append((start, shape[axis] if stop is None else stop, step))
    return tuple(out)


def _box(shape: tuple[int, ...], index: Any) -> list[tuple[int, int]]:
    """The smallest box ``[lo, hi)`` per axis holding what ``index`` selects."""
    box = [(0, s) for s in shape]
    if index is None:
        return box
    for axis, e in enumerate(_resolved(shape, index)):
        if isinstance(e, int):
            box[axis] = (e, e + 1)
        else:
            start, stop, step = e
            last = start + (len(range(start, stop, step)) - 1) * step
            box[axis] = (start, max(start, last + 1))
    return box
