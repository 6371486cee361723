"""Keras weights: ``.keras`` archives (``model.weights.h5`` inside a zip) and HDF5 weight
files (``.h5``, ``.hdf5``, ``.weights.h5``, Keras 2's ``save_weights`` and ``model.save``
layouts), read with ``h5py`` (``pip install diffract-formats[keras]``), no TensorFlow.

Listing reads the HDF5 metadata only (dataset shapes and types); a weight is read alone.
Names follow the layer paths with dots: Keras 3 ``layers/dense/vars/0`` becomes
``layers.dense.kernel`` when the layer's class is known (from the archive's
``config.json``, else from a layer name such as ``dense_1`` or ``conv2d``: variable 0 of
a Dense or Conv layer is its kernel, 1 its bias), else stays ``layers.dense.vars.0``;
Keras 2 ``dense/dense/kernel:0`` becomes ``dense.kernel``. The optimizer's variables are
left out.

**Orientation.** Keras kernels are ``[in, out]`` (Dense) and ``[k..., in, out]``
(Conv); they are reported as ``[out, in]`` and ``[out, in, k...]``, as PyTorch stores
them (``meta.orientation`` says so). Embeddings (``[vocab, dim]``) and everything else
are as stored.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, TensorEntry
from diffract_formats._common import error, kernel_entry, library, turn_kernel

__all__ = ["KerasReader"]

_WEIGHTS_MEMBER = "model.weights.h5"
_KERNEL_CLASSES = re.compile(r"^(dense|conv|separable_conv|depthwise_conv|einsum_dense)",
                             re.IGNORECASE)
_VAR_NAMES = {"Dense": ("kernel", "bias"), "EinsumDense": ("kernel", "bias"),
              "Embedding": ("embeddings",)}



def _h5py(path: str) -> Any:
    return library("h5py", path, "reading a Keras/HDF5 file needs h5py: pip install "
                                 "diffract-formats[keras]")


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


def _var_name(layer: str, index: int, classes: dict[str, str]) -> str | None:
    kind = classes.get(layer)
    if kind is None:
        if _KERNEL_CLASSES.match(layer):
            kind = "Dense"  # variable 0 of a Dense or Conv layer is its kernel
        elif layer.lower().startswith("embedding"):
            kind = "Embedding"
    names = _VAR_NAMES.get(kind or "", ("kernel", "bias") if kind and "Conv" in kind else ())
    return names[index] if index < len(names) else None


class KerasReader(CheckpointReader):
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
            with archive.open(_WEIGHTS_MEMBER) as member, self._h5py.File(member, "r") as h5:
                yield h5

    def _config_classes(self) -> dict[str, str]:
        if self._archive:
            with zipfile.ZipFile(self._path) as archive:
                if "config.json" in archive.namelist():
                    with contextlib.suppress(ValueError):
                        return _classes(json.loads(archive.read("config.json")))
            return {}
        with self._h5py.File(self._path, "r") as h5:
            config = h5.attrs.get("model_config")
            if config is not None:
                with contextlib.suppress(ValueError, TypeError):
                    return _classes(json.loads(config))
        return {}

    def _list(self, h5: Any, classes: dict[str, str]) -> None:
        root = h5["model_weights"] if "model_weights" in h5 else h5
        if "layer_names" in root.attrs:  # Keras 2
            for layer in root.attrs["layer_names"]:
                layer = layer.decode() if isinstance(layer, bytes) else str(layer)
                group = root[layer]
                for weight in group.attrs.get("weight_names", []):
                    weight = weight.decode() if isinstance(weight, bytes) else str(weight)
                    name = weight.removesuffix(":0").replace("/", ".")
                    if not name.startswith(f"{layer}."):
                        name = f"{layer}.{name}"
                    self._add(name, group[weight], weight.split("/")[-1].removesuffix(":0"))
            return

        def visit(path: str, item: Any) -> None:
            if not isinstance(item, self._h5py.Dataset) or path.split("/")[0] == "optimizer":
                return
            parts = path.split("/")
            if len(parts) >= 3 and parts[-2] == "vars" and parts[-1].isdigit():
                var = _var_name(parts[-3], int(parts[-1]), classes)
                if var is not None:
                    parts = [*parts[:-2], var]
            self._add(".".join(parts), item, parts[-1], path)

        root.visititems(visit)

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
