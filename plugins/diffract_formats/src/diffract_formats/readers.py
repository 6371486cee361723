"""The readers: safetensors files, torch state-dict files, ``.npz`` files and Hugging
Face-style checkpoint directories.

Each lists its tensors without reading them and reads one tensor, or a slice of one (a
view: :func:`diffract.plugins.read_rows` reads a safetensors slice by its rows, so only
those bytes are read). Problems at the file boundary are
:class:`~diffract.errors.ModelSourceError` naming the file and what to do; the core adds
the model's name.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from diffract.errors import ModelWarning, warn
from diffract.plugins import (
    CheckpointReader,
    TensorEntry,
    inside,
    read_json_file,
    read_rows,
    to_slices,
)
from diffract_formats._common import ConfigBeside, config_json, error
from diffract_formats._safetensors import ITEMSIZE, SafetensorsError, SafetensorsFile
from diffract_formats.torch_reader import TorchReader

__all__ = ["HF_MARKERS", "HuggingFaceReader", "NpzReader", "SafetensorsReader", "TorchReader",
           "hf_layout"]

#: Files that make a directory a Hugging Face-style checkpoint, in the order looked for.
HF_MARKERS = ("model.safetensors.index.json", "model.safetensors",
              "pytorch_model.bin.index.json", "pytorch_model.bin")



class SafetensorsReader(ConfigBeside, CheckpointReader):
    """A ``.safetensors`` file, read with plain file reads (see ``_safetensors``)."""

    def __init__(self, path: str, files: Any = None) -> None:
        try:
            self._file = SafetensorsFile(path, files)
        except (OSError, SafetensorsError) as exc:  # a truncated or lying header
            raise error(path, f"not a readable safetensors file: {exc}. The file is "
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
            warn(ModelWarning(
                f"{Path(self._file.path).name}: tensor {name!r} is {what}, which Diffract "
                "does not analyse; it is left out, the others are read"))
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

    def tensor_files(self) -> dict[str, SafetensorsFile]:
        """Every tensor (any dtype) -> the file holding it (a quantized checkpoint's
        integer and scale tensors are read through it)."""
        return dict.fromkeys(self._file.layout, self._file)


class NpzReader(ConfigBeside, CheckpointReader):
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
                    # by name: a big-endian ">f4" is float32 too (it was left out as no float)
                    self._entries.append(TensorEntry(member[:-4], shape, dtype.name))
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise error(path, f"not a readable .npz file: {exc}") from None

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> list[TensorEntry]:
        return list(self._entries)

    def read(self, name: str, index: Any = None) -> np.ndarray:
        with np.load(self._path, allow_pickle=False) as npz:
            value = npz[name]
        return value if index is None else value[to_slices(index)]


#: What a Hugging Face directory's refusal of a file outside it says to do.
OUTSIDE_HINT = ("copy the file into the folder, or models.add(..., format_options="
                "{'allow_outside': True}) if you mean it")


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
            raise error(root, f"the directory holds none of {list(HF_MARKERS)}; pass a "
                               "checkpoint file or a Hugging Face-style checkpoint directory")
        kind = SafetensorsReader if marker.startswith("model.") else TorchReader

        def file(name: str) -> Path:  # checked, named as given (a shard's name, no blob's)
            if not allow_outside:
                inside(root, name, OUTSIDE_HINT)
            return root / name

        shards: dict[str, list[str] | None] = {marker: None}
        if marker.endswith(".index.json"):
            shards = self._index(file(marker))
        self._readers = [kind(str(file(shard))) for shard in shards]
        self._wanted = [set(names) if names is not None else None for names in shards.values()]
        self._where: dict[str, int] = {}

    @staticmethod
    def _index(path: Any, load: Any = read_json_file,
               present: Any = None) -> dict[str, list[str] | None]:
        """The shards a shard index (``load(path)``: its JSON) names, with their tensors;
        each must be ``present`` (a file beside the index, by default)."""
        try:
            weight_map = load(path)["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise error(path, f"unreadable shard index ({type(exc).__name__}: "
                               f"{str(exc)[:200]}); it must be JSON with a 'weight_map'"
                         ) from None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise error(path, "the shard index's 'weight_map' must map tensor names to "
                               "shard file names (strings); fix or regenerate the index")
        shards: dict[str, list[str] | None] = {}
        for name, shard in weight_map.items():
            shards.setdefault(shard, []).append(name)  # type: ignore[union-attr]
        present = present or (lambda shard: (path.parent / shard).is_file())
        missing = sorted(s for s in shards if not present(s))
        if missing:
            raise error(path, f"the shard index lists {len(missing)} missing "
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
            raise error(self._root, f"the shard index names {len(missing)} tensor(s) their "
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
        return config_json(self._root)

    def tensor_files(self) -> dict[str, Any]:
        """Every tensor of the safetensors shards (any dtype) -> the SafetensorsFile
        holding it; a quantized checkpoint stored as torch files is refused (its integer
        tensors would be left out as no weights)."""
        out: dict[str, Any] = {}
        for reader, wanted in zip(self._readers, self._wanted, strict=True):
            if isinstance(reader, SafetensorsReader):
                out.update((n, reader._file) for n in reader._file.layout
                           if wanted is None or n in wanted)
            elif self.config().get("quantization_config"):
                raise error(self._root, "a quantized checkpoint in torch files "
                                        "(pytorch_model.bin): not read, its quantized "
                                        "weights would be taken raw; convert it to "
                                        "safetensors")
        return out

