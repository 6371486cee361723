"""DeepSpeed ZeRO checkpoints (``global_step*/`` with ``mp_rank_00_model_states.pt`` and
one ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` per data-parallel rank): the fp32
master weights, put together from the ranks' partitions as DeepSpeed's ``zero_to_fp32``
does, without DeepSpeed and without unpickling anything that runs.

The files are torch zip files whose pickles name DeepSpeed's classes (its loss scaler,
its ZeRO stage enum), which ``torch.load(weights_only=True)`` refuses; DeepSpeed's own
script loads them with ``weights_only=False``, running whatever a hostile file asks for.
Here every global that torch's weights-only unpickler does not allow is bound to an inert
stand-in that only records its arguments (so ``os.system`` in a file builds a record and
runs nothing), and the files are opened on the meta device: the pickles give every
tensor's shape and where its bytes start, and only the fp32 partitions a parameter spans
are read, with plain reads (the optimizer's moments are never read).

Stage 1 and 2: each parameter group's fp32 partitions, joined over the ranks in rank
order, hold the group's parameters one after another (each followed by its alignment
padding). Stage 3: every parameter is split over the ranks, ``ceil(numel / ranks)``
entries each, at the same offset of each rank's flat groups. Buffers and frozen
parameters come from rank 0's module state (stage 3's frozen fragments are not read: such
a checkpoint is refused, saying so), shared parameters as their source. Model-parallel
checkpoints (``mp_rank_01``...) are refused.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, TensorEntry, inside, to_slices
from diffract_formats._common import config_json, error, file_identity, library

__all__ = ["DeepSpeedReader", "zero_folder", "zero_layout"]

_MODEL = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt")
_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


def zero_folder(path: str | Path) -> Path | None:
    """The ``global_step*`` folder of the ZeRO checkpoint at ``path`` (the folder itself,
    or a save folder whose ``latest`` names one inside it), or None."""
    p = Path(path)
    if not p.is_dir():
        return None
    latest = p / "latest"
    if latest.is_file() and latest.stat().st_size < 256:
        tag = inside(p, "latest").read_text(encoding="ascii", errors="replace").strip()
        if tag and Path(tag).name == tag and tag not in (".", "..") and (p / tag).is_dir():
            p = p / tag
    names = [f.name for f in p.iterdir()] if p.is_dir() else []
    if any(_OPTIM.fullmatch(n) for n in names) and any(_MODEL.fullmatch(n) for n in names):
        return p
    return None


def zero_layout(path: str) -> bool:
    return zero_folder(path) is not None


class _Inert:
    """What a foreign global in a file becomes: a record of its arguments, no code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: Any) -> None:
        self.state = state


def _load(path: Path) -> Any:
    """A torch file on the meta device, every global weights_only refuses inert."""
    torch = library("torch", path, "reading a DeepSpeed checkpoint needs torch: pip install "
                                   "torch")
    try:
        foreign = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        with torch.serialization.safe_globals([(_Inert, name) for name in foreign]):
            return torch.load(str(path), map_location="meta", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a damaged file, said with its name
        raise error(path, f"cannot read it as a torch file ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200] if str(exc) else ''})") from None


def _stage(value: Any) -> int:
    if isinstance(value, _Inert) and value.args:  # ZeroStageEnum(2)
        value = value.args[0]
    return int(value)


class DeepSpeedReader(CheckpointReader):
    """A ZeRO checkpoint folder (see the module docstring)."""

    def __init__(self, path: str) -> None:
        folder = zero_folder(path)
        if folder is None:
            raise error(path, "no *_model_states.pt with *_optim_states.pt here (nor a "
                              "'latest' naming such a folder): not a DeepSpeed checkpoint")
        self._root = inside(path, folder.relative_to(path))  # a step folder linking out: no
        self._given = Path(path).resolve()
        names = sorted(f.name for f in self._root.iterdir())
        optim = {int(m[1]): m for m in map(_OPTIM.fullmatch, names) if m}
        model = [m for m in map(_MODEL.fullmatch, names) if m]
        if any(int(m[2]) for m in (*optim.values(), *model)):
            raise error(self._root, "a model-parallel ZeRO checkpoint (mp_rank_01 ...): not "
                                    "read; convert it with DeepSpeed's zero_to_fp32.py")
        first = next((m for m in model if m[1] in (None, "0")), None)
        if first is None:
            raise error(self._root, "rank 0's model states are missing")
        for name in (first[0], *(m[0] for m in optim.values())):  # no rank's file links out
            inside(self._root, name)
        self._model_path = self._root / first[0]
        try:
            self._index(_load(self._model_path), [self._root / optim[r][0]
                                                  for r in sorted(optim)])
        except ModelSourceError:
            raise
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise error(self._root, f"not a ZeRO checkpoint DeepSpeed wrote, or damaged "
                                    f"({type(exc).__name__}: {str(exc)[:200]})") from None

    def _index(self, states: Any, optim_paths: list[Path]) -> None:
        import torch

        ranks = [_load(p)["optimizer_state_dict"] for p in optim_paths]
        stage = _stage(ranks[0]["zero_stage"])
        count = ranks[0]["partition_count"]
        count = max(count) if isinstance(count, (list, tuple)) else int(count)
        if count != len(ranks) or sorted(int(_OPTIM.fullmatch(p.name)[1])
                                         for p in optim_paths) != list(range(count)):
            raise error(self._root, f"the checkpoint was written by {count} ranks and holds "
                                    f"{len(ranks)} optimizer files: a rank's file is missing "
                                    "(or another checkpoint's is here)")
        if states.get("frozen_param_shapes") and stage == 3:
            raise error(self._model_path, "a ZeRO-3 checkpoint with frozen parameters: their "
                                          "fragments are not read; convert it with DeepSpeed's "
                                          "zero_to_fp32.py")
        files = [self._model_path, *optim_paths]
        self._sizes = {f: f.stat().st_size for f in files}
        self._stats = {f: file_identity(f.stat()) for f in files}
        self._files = [str(f) for f in files]
        #: name -> (shape, pieces): pieces (file, byte start, entries) in order
        self._params: dict[str, tuple[tuple[int, ...], list[tuple[Path, int, int]]]] = {}
        groups = [dict(g) for g in states["param_shapes"]]
        if stage <= 2:
            self._zero2(groups, ranks, optim_paths)
        elif stage == 3:
            self._zero3(groups, ranks, optim_paths)
        else:
            raise error(self._root, f"ZeRO stage {stage}: not a stage DeepSpeed writes")
        module = states.get("module") or {}
        extra = [*states.get("buffer_names", []), *(states.get("frozen_param_shapes") or {})]
        for name in extra:  # whole tensors of rank 0's module state, read by byte range
            value = module.get(name)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                self._params[name] = (tuple(value.shape), [self._whole(value)])
        #: what each tensor reads as: the fp32 partitions, or a module tensor's own dtype
        self._dtypes = {n: module[n].dtype if n in extra else torch.float32
                        for n in self._params}
        for alias, source in (states.get("shared_params") or {}).items():
            if source in self._params:
                self._params[alias] = self._params[source]
                self._dtypes[alias] = self._dtypes[source]

    def _flat(self, tensor: Any, path: Path, what: str) -> tuple[int, int]:
        """(byte start, entries) of a 1-D fp32 partition in ``path``, checked."""
        import torch

        if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 \
                or tensor.dim() != 1:
            raise error(path, f"{what} is not a flat float32 tensor")
        return self._place(tensor, path, what), int(tensor.numel())

    def _place(self, tensor: Any, path: Path, what: str) -> int:
        base = getattr(tensor.untyped_storage(), "_checkpoint_offset", None)
        if base is None:
            raise error(path, f"{what}: this torch does not say where a tensor's bytes lie; "
                              "upgrade torch")
        start = int(base) + tensor.storage_offset() * tensor.element_size()
        end = start + tensor.numel() * tensor.element_size()
        if not tensor.is_contiguous() or end > self._sizes[path]:
            raise error(path, f"{what} lies past the end of the file (cut short?)")
        return start

    def _whole(self, tensor: Any) -> tuple[Path, int, int]:
        return (self._model_path, self._place(tensor, self._model_path, "a buffer"),
                int(tensor.numel()))

    def _zero2(self, groups: list[dict], ranks: list[dict], paths: list[Path]) -> None:
        world = len(ranks)
        parts = [r["single_partition_of_fp32_groups"] for r in ranks]
        paddings = ranks[0].get("param_alignment_paddings")
        for g, shapes in enumerate(groups):
            # the ranks' partitions as saved (the last ones without their padding), joined
            flats = [self._flat(parts[r][g], paths[r], f"rank {r}'s group {g}")
                     for r in range(world)]
            bounds = np.cumsum([0] + [n for _, n in flats])
            offset = 0
            pads = paddings[g] if paddings is not None else [0] * len(shapes)
            for (name, shape), pad in zip(shapes.items(), pads, strict=True):
                shape = tuple(int(s) for s in shape)
                numel = math.prod(shape)
                if offset + numel > bounds[-1]:
                    raise error(self._root, f"{name!r} lies past group {g}'s partitions")
                self._params[name] = (shape, _pieces(flats, bounds, paths, offset, numel))
                offset += numel + int(pad)
            align = 2 * world
            if math.ceil(offset / align) != math.ceil(int(bounds[-1]) / align):
                raise error(self._root, f"group {g}: its parameters take {offset} entries of "
                                        f"the {int(bounds[-1])} its partitions hold")

    def _zero3(self, groups: list[dict], ranks: list[dict], paths: list[Path]) -> None:
        world = len(ranks)
        flats = [[self._flat(t, paths[r], f"rank {r}'s flat group {g}")
                  for g, t in enumerate(ranks[r]["fp32_flat_groups"])] for r in range(world)]
        bounds = np.cumsum([0] + [n for _, n in flats[0]])
        if any([n for _, n in f] != [n for _, n in flats[0]] for f in flats):
            raise error(self._root, "the ranks' flat groups differ in size")
        offset = 0
        for shapes in groups:
            for name, shape in shapes.items():
                shape = tuple(int(s) for s in shape)
                numel = math.prod(shape)
                share = math.ceil(numel / world)
                if offset + share > bounds[-1]:
                    raise error(self._root, f"{name!r} lies past the ranks' flat groups")
                pieces = [piece for r in range(world)  # rank r's share, in rank order
                          for piece in _pieces(flats[r], bounds, [paths[r]] * len(bounds),
                                               offset, share)]
                self._params[name] = (shape, _trimmed(pieces, numel))
                offset += share

    @property
    def files(self) -> list[str]:
        return list(self._files)

    def config(self) -> dict[str, Any]:
        """``config.json`` in the step folder, or in the save folder given (whose
        ``latest`` named it: a Trainer's checkpoint-N/ holds both), for view rules."""
        found = config_json(self._root)
        return found or (config_json(self._given) if self._given != self._root else {})

    def entries(self) -> Iterator[TensorEntry]:
        for name, (shape, pieces) in self._params.items():
            file = self._files.index(str(pieces[0][0])) if pieces else 0
            yield TensorEntry(name, shape, str(self._dtypes[name]).removeprefix("torch."),
                              file=file)

    def read(self, name: str, index: Any = None) -> Any:
        import torch

        shape, pieces = self._params[name]
        dtype = self._dtypes[name]
        item = dtype.itemsize
        out = np.empty(math.prod(shape) * item, dtype=np.uint8)
        at = 0
        for path, start, count in pieces:
            self._bytes(name, path, start, count * item, out[at:at + count * item])
            at += count * item
        value = torch.from_numpy(out).view(dtype).reshape(shape)
        return value if index is None else value[to_slices(index)]

    def _bytes(self, name: str, path: Path, start: int, count: int, into: np.ndarray) -> None:
        with open(path, "rb") as fh:
            if file_identity(os.fstat(fh.fileno())) != self._stats[path]:
                raise error(path, f"{name!r}: the file changed since the checkpoint was "
                                  "opened (saved over?); add the model again")
            fh.seek(start)
            got = fh.readinto(memoryview(into))
        if got != count:
            raise error(path, f"{name!r}: read {got or 0} of {count} bytes: the file is "
                              "shorter than when it was opened")


def _pieces(flats: list[tuple[int, int]], bounds: Any, paths: list[Path], offset: int,
            numel: int) -> list[tuple[Path, int, int]]:
    """Entries ``offset .. offset + numel`` of flat fp32 tensors joined end to end (tensor
    ``i``: bytes from ``flats[i][0]`` of ``paths[i]``, entries ``bounds[i]..bounds[i+1]``)
    as (file, byte start, entries) pieces."""
    out, at = [], offset
    while at < offset + numel:
        i = int(np.searchsorted(bounds, at, side="right") - 1)
        take = min(int(bounds[i + 1]) - at, offset + numel - at)
        out.append((paths[i], flats[i][0] + 4 * (at - int(bounds[i])), take))
        at += take
    return out


def _trimmed(pieces: list[tuple[Path, int, int]], numel: int) -> list[tuple[Path, int, int]]:
    """The first ``numel`` entries of ``pieces`` (stage 3 pads the last rank's share)."""
    out, left = [], numel
    for path, start, count in pieces:
        if left <= 0:
            break
        out.append((path, start, min(count, left)))
        left -= count
    return out
