"""Keras weights: ``.keras`` archives (``model.weights.h5`` inside a zip) and HDF5 weight
files (``.h5``, ``.hdf5``, ``.weights.h5``, Keras 2's ``save_weights`` and ``model.save``
layouts), read with ``h5py`` (``pip install diffractml-formats[keras]``), no TensorFlow.

Listing reads the HDF5 metadata only (dataset shapes and types); a weight is read alone.
Names follow the layer paths with dots: Keras 3 ``layers/dense/vars/0`` becomes
``layers.dense.kernel`` when the layer's class is known (from the archive's
``config.json``, else from a layer name such as ``dense_1`` or ``conv2d``: variable 0 of
a Dense or Conv layer is its kernel, 1 its bias), else stays ``layers.dense.vars.0``;
Keras 2 ``dense/dense/kernel:0`` becomes ``dense.kernel``. The optimizer's variables are
left out.

**Only the file's own bytes.** A dataset whose bytes lie elsewhere — HDF5 external
storage, a virtual dataset, an external link — is refused with where it points, and so is
one that declares more bytes than the file stores for it (HDF5 would hand back its fill
value, a constant, for the missing part) or that is compressed beyond
:data:`MAX_COMPRESSION` to 1 (memory would follow the declared size, not the file's).

**Orientation.** Keras kernels are ``[in, out]`` (Dense) and ``[k..., in, out]``
(Conv); they are reported as ``[out, in]`` and ``[out, in, k...]``, as PyTorch stores
them (``meta.orientation`` says so). Embeddings (``[vocab, dim]``) and everything else
are as stored.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError, install_hint
from diffract.plugins import CheckpointReader, TensorEntry, read_json_file
from diffract_formats._common import ConfigBeside, error, kernel_entry, library, turn_kernel

__all__ = ["KerasReader"]

_WEIGHTS_MEMBER = "model.weights.h5"
#: The largest ratio of declared to stored bytes accepted for a compressed dataset (or a
#: compressed archive member) over SMALL bytes; real weights compress by 1.1-3 to 1.
MAX_COMPRESSION, SMALL = 1024, 64 << 20
_KERNEL_CLASSES = re.compile(r"^(dense|conv|separable_conv|depthwise_conv|einsum_dense)",
                             re.IGNORECASE)
_VAR_NAMES = {"Dense": ("kernel", "bias"), "EinsumDense": ("kernel", "bias"),
              "Embedding": ("embeddings",)}



def _h5py(path: str) -> Any:
    return library("h5py", path, "reading a Keras/HDF5 file needs h5py: "
                                 + install_hint("diffractml-formats", "keras"))


def _classes(config: Any) -> dict[str, str]:
    """layer name -> class name, from a Keras model config (nested models too)."""
    out: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            name = node.get("config", {}).get("name") if isinstance(node.get("config"),
                                                                    dict) else None
            if isinstance(name, str) and isinstance(node.get("class_name"), str):
                out[name] = node["class_name"]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    return out


def _inflated(declared: int, stored: int) -> bool:
    """Whether ``declared`` bytes from ``stored`` ones is more than a compressor makes of
    weights (sizes under SMALL pass: their memory is bounded anyway)."""
    return declared > SMALL and declared > MAX_COMPRESSION * max(stored, 1)


def _var_name(layer: str, index: int, classes: dict[str, str]) -> str | None:
    kind = classes.get(layer)
    if kind is None:
        if _KERNEL_CLASSES.match(layer):
            kind = "Dense"  # variable 0 of a Dense or Conv layer is its kernel
        elif layer.lower().startswith("embedding"):
            kind = "Embedding"
    names = _VAR_NAMES.get(kind or "", ("kernel", "bias") if kind and "Conv" in kind else ())
    return names[index] if index < len(names) else None


class KerasReader(ConfigBeside, CheckpointReader):
    """A ``.keras`` archive or an HDF5 weights file: see the module docstring."""

    def __init__(self, path: str) -> None:
        self._path = str(Path(path).resolve())
        self._h5py = _h5py(path)
        self._lock = threading.Lock()
        self._archive = zipfile.is_zipfile(self._path)
        # name -> (dataset path, stored shape, dtype, turn: "dense" | "conv" | "")
        self._datasets: dict[str, tuple[str, tuple[int, ...], str, str]] = {}
        try:
            classes = self._config_classes()
            with self._open() as h5:
                self._list(h5, classes)
        except ModelSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - h5py's and zipfile's errors, with the file
            raise error(self._path, f"not a readable Keras/HDF5 weights file: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}. The file is "
                                     "truncated or corrupt; save it again") from None

    @contextlib.contextmanager
    def _open(self) -> Iterator[Any]:
        if not self._archive:
            with self._h5py.File(self._path, "r") as h5:
                yield h5
            return
        with zipfile.ZipFile(self._path) as archive:
            if _WEIGHTS_MEMBER not in archive.namelist():
                raise error(self._path, f"a zip without {_WEIGHTS_MEMBER}: not a .keras "
                                         "archive")
            info = archive.getinfo(_WEIGHTS_MEMBER)
            if _inflated(info.file_size, info.compress_size):
                raise error(self._path, f"{_WEIGHTS_MEMBER} declares {info.file_size} bytes "
                                         f"compressed into {info.compress_size}, more than "
                                         f"{MAX_COMPRESSION} to 1: not weights (a "
                                         "decompression bomb); save the model again")
            with archive.open(_WEIGHTS_MEMBER) as member, self._h5py.File(member, "r") as h5:
                yield h5

    def _config_classes(self) -> dict[str, str]:
        """Layer classes from the archive's config.json or the file's model_config (read
        in bounded memory: a bad one is an error naming it, not a guess)."""
        if self._archive:
            with zipfile.ZipFile(self._path) as archive:
                if "config.json" not in archive.namelist():
                    return {}
                with archive.open("config.json") as member:
                    return _classes(read_json_file(member, f"{self._path}!config.json"))
        with self._h5py.File(self._path, "r") as h5:
            config = h5.attrs.get("model_config")
        if isinstance(config, str):
            config = config.encode()
        if not isinstance(config, bytes):
            return {}
        return _classes(read_json_file(io.BytesIO(config), f"{self._path}!model_config"))

    def _list(self, h5: Any, classes: dict[str, str]) -> None:
        root = h5["model_weights"] if "model_weights" in h5 else h5
        links: list[str] = []
        root.visititems_links(lambda path, link: links.append(
            f"{path} -> {link.filename}:{link.path}") if isinstance(
                link, self._h5py.ExternalLink) else None)
        if links:
            raise error(self._path, f"the file links to other files ({'; '.join(links[:5])}); "
                                     "Diffract reads only the file's own datasets")
        if "layer_names" in root.attrs:  # Keras 2
            for layer in root.attrs["layer_names"]:
                layer = layer.decode() if isinstance(layer, bytes) else str(layer)
                group = root[layer]
                for weight in group.attrs.get("weight_names", []):
                    weight = weight.decode() if isinstance(weight, bytes) else str(weight)
                    name = weight.removesuffix(":0").replace("/", ".")
                    if not name.startswith(f"{layer}."):
                        name = f"{layer}.{name}"
                    dataset = group[weight]
                    self._check(dataset, h5)
                    self._add(name, dataset, weight.split("/")[-1].removesuffix(":0"))
            return

        found: list[tuple[str, Any]] = []  # checked after the walk: h5py's visit turns
        root.visititems(lambda path, item: found.append((path, item)) if isinstance(
            item, self._h5py.Dataset) and path.split("/")[0] != "optimizer" else None)
        for path, item in found:  # an exception raised inside it into a SystemError
            self._check(item, h5)
            parts = path.split("/")
            if len(parts) >= 3 and parts[-2] == "vars" and parts[-1].isdigit():
                var = _var_name(parts[-3], int(parts[-1]), classes)
                if var is not None:
                    parts = [*parts[:-2], var]
            self._add(".".join(parts), item, parts[-1], path)

    def _check(self, dataset: Any, h5: Any) -> None:
        """Refuse a dataset whose bytes are not the file's own, or fewer than it declares."""
        where = None
        if dataset.external:
            files = [e[0] for e in dataset.external][:3]
            where = f"stores its bytes in {files} (HDF5 external storage)"
        elif dataset.is_virtual:
            where = ("is a virtual dataset mapping "
                     f"{sorted({m.file_name for m in dataset.virtual_sources()})[:3]}")
        elif dataset.file.filename != h5.filename:
            where = f"is reached through a link into {dataset.file.filename!r}"
        if where is not None:
            raise error(self._path, f"dataset {dataset.name!r} {where}; Diffract reads only "
                                     "bytes inside the file itself")
        declared, stored = int(dataset.nbytes), int(dataset.id.get_storage_size())
        compressed = dataset.id.get_create_plist().get_nfilters() > 0
        if declared and not stored:
            problem = ("stores none of them: HDF5 would return its fill value, a constant, "
                       "not weights")
        elif not compressed and stored < declared:
            problem = f"stores only {stored}: the file is truncated or lies"
        elif compressed and _inflated(declared, stored):
            problem = (f"stores them compressed into {stored}, more than {MAX_COMPRESSION} "
                       "to 1: not weights (a decompression bomb or a constant)")
        else:
            return
        raise error(self._path, f"dataset {dataset.name!r} declares {declared} bytes but "
                                 f"{problem}; save the model again")

    def _add(self, name: str, dataset: Any, leaf: str, path: str | None = None) -> None:
        shape, dtype = tuple(int(d) for d in dataset.shape), np.dtype(dataset.dtype)
        turn = ""
        if leaf in ("kernel", "depthwise_kernel", "pointwise_kernel") and len(shape) >= 2:
            turn = "dense" if len(shape) == 2 else "conv"
        self._datasets[name] = (path or dataset.name, shape, dtype.name, turn)

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> Iterator[TensorEntry]:
        for name, (_, shape, dtype, turn) in self._datasets.items():
            shape, rule = kernel_entry(shape, turn, "Keras")
            yield TensorEntry(name, shape, dtype, meta={"orientation": rule})

    def read(self, name: str, index: Any = None) -> np.ndarray:
        path, _, _, turn = self._datasets[name]
        with self._lock, self._open() as h5:
            try:
                values = np.asarray(h5[path][()])
            except (OSError, KeyError) as exc:
                raise error(self._path, f"weight {name!r} cannot be read: {exc}; the file "
                                         "is truncated or corrupt") from None
        return turn_kernel(values, turn, index)
