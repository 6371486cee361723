"""Parameter views: named sub-matrices of a parameter, read as slices of it.

A view rule (the ``diffract_param_views`` hook) splits a parameter into :class:`View`
records: an attention projection into heads, a 3-D MoE tensor into experts, a fused QKV
matrix into its parts. Each view becomes a parameter in its own right, named
``<parameter>[<label>]`` (``model.layers.3.self_attn.q_proj.weight[head=5]``), with the
metadata ``view_of`` (its parent) and ``view`` (its label): kernels, stores, filters and
exports treat it as any parameter. Its weights are a slice of the parent, read lazily
(a checkpoint file reads only those bytes, or those rows block by block; an in-memory
tensor is sliced before it is converted), never a copy of the whole parent.

A model's views are recorded in its source (:attr:`ModelSource.views`), so a reopened
store reads them again without the rule's plugin. Aggregates over a whole model (IN_MODEL
kernels) summarise its stored parameters only: a view is part of its parent and would
count twice."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

__all__ = ["RECENT_BYTES", "Index", "Recent", "View", "normalize_index", "read_rows",
           "resolve_index", "sliced_shape", "to_slices", "view_name"]

#: Bytes of recently read parents kept for slicing their views (per loader).
RECENT_BYTES = 1 << 28

#: Per leading axis: an integer (the axis is dropped) or ``(start, stop, step)`` (a stop
#: of None: to the end of the axis, until :func:`resolve_index` fills it in).
Index = tuple[Any, ...]


def _entry(item: Any) -> int | tuple[int, int, int]:
    if isinstance(item, slice):
        item = (item.start or 0, item.stop, item.step or 1)
    if isinstance(item, (tuple, list)):
        start, stop, *step = item
        return (int(start), None if stop is None else int(stop), int(step[0]) if step else 1)
    if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
        return int(item)
    raise TypeError(f"a view index holds integers and (start, stop[, step]), got {item!r}")


def normalize_index(index: Any) -> Index:
    """An index as a tuple of integers and ``(start, stop, step)`` triples (slices,
    lists and pairs accepted)."""
    if not isinstance(index, (tuple, list)):
        index = (index,)
    return tuple(_entry(item) for item in index)


@attrs.frozen
class View:
    """One view of a parameter, as a rule returns it.

    ``label`` names it within its parent (``"head=5"``, ``"expert=3"``, ``"part=q"``);
    ``index`` selects it along the leading axes (integers drop the axis; ``slice`` or
    ``(start, stop[, step])`` keep it); ``transpose`` turns a 2-D slice around (a
    parameter stored ``[in, out]`` reported ``[out, in]``, as every format reports
    matrices); ``ptype`` and ``meta`` default to the parent's type and nothing."""

    label: str
    index: Index = attrs.field(converter=normalize_index)
    transpose: bool = False
    ptype: str | None = None
    meta: tuple[tuple[str, Any], ...] = attrs.field(
        default=(), converter=lambda m: tuple(sorted(dict(m).items())))


def view_name(parent: str, label: str) -> str:
    """The name of a view: ``<parent>[<label>]``."""
    return f"{parent}[{label}]"


def to_slices(index: Index) -> tuple[int | slice, ...]:
    """The index as Python indexing (integers and slices)."""
    return tuple(i if isinstance(i, int) else slice(*i) for i in index)


def resolve_index(index: Index, shape: Sequence[int]) -> Index:
    """``index`` with every open stop (None) replaced by its axis's size."""
    return tuple(e if isinstance(e, int) else (e[0], shape[axis] if e[1] is None else e[1], e[2])
                 for axis, e in enumerate(index))


def sliced_shape(shape: Sequence[int], index: Index, transpose: bool = False) -> tuple[int, ...]:
    """The shape of ``array[index]`` (transposed when asked) for an array of ``shape``;
    raises ValueError naming what does not fit."""
    if len(index) > len(shape):
        raise ValueError(f"index {list(index)} has {len(index)} entries for a "
                         f"{len(shape)}-D parameter")
    out = []
    for axis, (entry, size) in enumerate(zip(resolve_index(index, shape), shape, strict=False)):
        if isinstance(entry, int):
            if not 0 <= entry < size:
                raise ValueError(f"index {entry} is outside axis {axis} of size {size}")
            continue
        start, stop, step = entry
        if not (0 <= start < stop <= size and step >= 1):
            raise ValueError(f"range [{start}, {stop}) step {step} is not within axis {axis} "
                             f"of size {size}")
        out.append(len(range(start, stop, step)))
    out += list(shape[len(index):])
    if not out:
        raise ValueError("the index selects a single element, not a tensor")
    if transpose:
        if len(out) != 2:
            raise ValueError(f"transpose needs a 2-D slice, got shape {tuple(out)}")
        out.reverse()
    return tuple(out)


def read_rows(
    shape: Sequence[int],
    index: Index,
    rows: Callable[[int, int], np.ndarray],
    block_bytes: int = 1 << 24,
    itemsize: int = 4,
) -> np.ndarray:
    """``array[index]`` of an array stored row-major, reading rows of its leading axis.

    ``rows(start, stop)`` returns ``array[start:stop]``. A selection of the leading
    axis that is one row or a contiguous range is read in one call; any other (every
    row, a step) is read in blocks of about ``block_bytes`` whose rest-of-index slices
    are joined: the whole parameter is never held at once."""
    lead = index[0] if index else (0, shape[0], 1)
    rest = to_slices(index[1:])
    if isinstance(lead, int):
        return rows(lead, lead + 1)[0][rest]
    start, stop, step = lead
    if step == 1 and not rest:
        return rows(start, stop)
    per_row = max(1, math.prod(shape[1:]) * itemsize)
    block = max(step, (block_bytes // per_row) // step * step)
    parts = []
    for first in range(start, stop, block):
        chunk = rows(first, min(first + block, stop))
        parts.append(chunk[(slice(None, None, step), *rest)])
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _nbytes(value: Any) -> int:
    size = getattr(value, "nbytes", None)
    if isinstance(size, int):
        return size
    return int(value.element_size() * value.numel())  # a torch tensor


class Recent:
    """Parents read whole, the most recent up to ``max_bytes`` (least recently used
    dropped first). ``load(name, read)`` returns the kept value or reads it once (other
    threads loading or getting the name meanwhile wait for that read); ``get(name)``
    returns a kept value or None. A value larger than ``max_bytes`` is not kept."""

    def __init__(self, max_bytes: int) -> None:
        import threading
        from collections import OrderedDict

        self.max_bytes, self._lock = max_bytes, threading.Lock()
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._reading: dict[str, threading.Lock] = {}

    def get(self, name: str) -> Any:
        """The kept value (waiting for it while it is being read), or None."""
        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                return self._items[name]
            gate = self._reading.get(name)
        if gate is None:
            return None
        with gate:  # being read: wait for it
            with self._lock:
                return self._items.get(name)

    def load(self, name: str, read: Any) -> Any:
        import threading

        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                return self._items[name]
            gate = self._reading.setdefault(name, threading.Lock())
        with gate:  # one read per name; the others wait for it
            with self._lock:
                if name in self._items:
                    return self._items[name]
            value = read()
            with self._lock:
                self._reading.pop(name, None)
                if _nbytes(value) > self.max_bytes:
                    return value
                self._items[name] = value
                while sum(_nbytes(v) for v in self._items.values()) > self.max_bytes:
                    self._items.popitem(last=False)
            return value
