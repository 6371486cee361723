"""What the readers share: the error naming the file, an optional library imported with
the extra that installs it, and Keras's and Flax's kernel orientation."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError

__all__ = ["ConfigBeside", "config_json", "error", "kernel_entry", "library", "turn_kernel"]


def error(path: str | Path, problem: str) -> ModelSourceError:
    """A problem at the file boundary, naming the file; the core adds the model's name."""
    return ModelSourceError(f"{problem} ({str(path)!r})", model_id=None)


class Config(dict):
    """A model's configuration, and where it was read (``source``: view rules name it
    in their errors)."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        super().__init__(data)
        self.source = source


def config_json(folder: str | Path) -> dict[str, Any]:
    """The ``config.json`` of a checkpoint's folder (inside it, read bounded), or ``{}``
    when there is none; one that is not a JSON object is an error naming it."""
    from diffract.plugins import inside, read_json_file

    path = Path(folder) / "config.json"
    if not path.is_file():
        return {}
    data = read_json_file(inside(folder, "config.json"), str(path))
    if not isinstance(data, dict):
        raise error(path, "config.json holds no JSON object; fix it, or give the geometry as "
                          "view options")
    return Config(data, str(path))


class ConfigBeside:
    """For a reader of one file: its configuration is the ``config.json`` beside the
    file, as in a Hugging Face folder (``model.safetensors`` with its ``config.json``),
    so view rules find the head geometry there."""

    files: list[str]

    def config(self) -> dict[str, Any]:
        return config_json(Path(self.files[0]).parent)


def library(module: str, path: str | Path, missing: str) -> Any:
    """``import module``, or a ModelSourceError naming the file with ``missing`` (what
    to install)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(path, missing) from None


def kernel_entry(shape: tuple[int, ...], turn: str,
                 framework: str) -> tuple[tuple[int, ...], str]:
    """The ``[out, in, k...]`` shape of a Keras or Flax kernel stored ``[in, out]``
    (``turn="dense"``) or ``[k..., in, out]`` (``"conv"``), and the orientation rule
    recorded in its metadata; other tensors (``""``) as stored."""
    if turn == "dense":
        return shape[::-1], f"turned around: a {framework} kernel is [in, out]"
    if turn == "conv":
        return ((shape[-1], shape[-2], *shape[:-2]),
                f"turned around: a {framework} conv kernel is [k..., in, out]")
    return shape, "as stored"


def turn_kernel(values: np.ndarray, turn: str, index: Any = None) -> np.ndarray:
    """Stored values in the ``[out, in, k...]`` layout of :func:`kernel_entry`, sliced by
    ``index`` (a view's), as a contiguous array the caller owns."""
    from diffract.plugins import to_slices

    if turn == "dense":
        values = values.T
    elif turn == "conv":
        values = np.moveaxis(values, (-1, -2), (0, 1))
    values = values if index is None else values[to_slices(index)]
    return np.ascontiguousarray(values)


def file_identity(stat: os.stat_result) -> tuple[int, ...]:
    """What tells a file from the one a reader opened: size, modification and change
    times, inode (a reader of several files compares each before it reads it)."""
    return (stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)
