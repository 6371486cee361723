"""The storage contract: what a profile must keep and how a chunk is committed.

A store holds, for each model: its parameters' metadata (:class:`ParamInfo`) and a
lazy loader for their weights; per-parameter field values; aggregates under contextual
names (``field@models[m]``, ``field@models[a,b]@params[p]``); and notes (why a unit was
skipped, left undefined, or failed). All writes of one chunk arrive in one
:meth:`Store.commit` call, which a profile must apply atomically.

Values a store keeps (:func:`storable_problem` checks them before any commit): Python
and numpy numbers (bool, int, float), strings (a label such as ``best_fit``), numpy
arrays of a numeric or boolean dtype, and tuples of numbers and arrays (nested tuples
too). None, lists, dicts, torch tensors and other objects are refused, so every profile,
durable or not, can keep every value."""

from __future__ import annotations

import abc
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:  # a record the stores hold: sources' lookups need the catalog
    from diffract.core.sources import ModelSource


__all__ = [
    "Batch",
    "Provenance",
    "Stamp",
    "canonical_config",
    "Note",
    "ParamInfo",
    "Store",
    "contextual_name",
    "estimate_nbytes",
    "rename_in_contextual",
    "split_contextual",
    "storable_problem",
]

#: What :func:`storable_problem` accepts, for error messages.
STORABLE_TYPES = (
    "numbers (bool, int, float, numpy scalars), strings, numpy arrays of a numeric or "
    "boolean dtype, and tuples of numbers and arrays"
)


@attrs.frozen
class ParamInfo:
    """One parameter of one model: name, shape, dtype (as a numpy-style string), its
    type (a :class:`~diffract.core.ptypes.ParameterType` value or a user's string) and
    metadata exports carry (JSON values, sorted ``(key, value)`` pairs)."""

    model_id: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    ptype: str = "unknown"
    meta: tuple[tuple[str, Any], ...] = ()

    @property
    def meta_dict(self) -> dict[str, Any]:
        return dict(self.meta)

    @property
    def parent(self) -> str | None:
        """The parameter this one is a view of (:mod:`diffract.core.views`), or None."""
        return self.meta_dict.get("view_of")

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element of the stored dtype (bfloat16 and other non-numpy types by
        their width)."""
        try:
            return np.dtype(self.dtype).itemsize
        except TypeError:
            return 2 if "16" in self.dtype else 1 if "8" in self.dtype else 4

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@attrs.frozen
class Note:
    """Why a unit has no (or NaN) values for a kernel.

    ``kind`` is ``skipped`` (a restriction or a missing input: nothing stored),
    ``undefined`` (the kernel said its outputs are undefined here: NaN stored) or
    ``failed`` (the kernel raised: nothing stored, retried by the next apply)."""

    kernel: str
    models: tuple[str, ...]
    param: str | None
    kind: str
    reason: str

    @property
    def unit(self) -> str:
        """A readable label: ``model/param``, ``model``, or ``[a,b]/param``."""
        head = self.models[0] if len(self.models) == 1 else f"[{','.join(self.models)}]"
        return head if self.param is None else f"{head}/{self.param}"

    @property
    def key(self) -> tuple[str, tuple[str, ...], str | None]:
        return (self.kernel, self.models, self.param)


@attrs.frozen
class Provenance:
    """What produced a stored value: the kernel, its provider (distribution and version)
    and the configuration it ran with (canonical JSON, sorted keys)."""

    kernel: str
    provider: str
    config: str

    @classmethod
    def of(cls, kernel: str, provider: str, config: Mapping[str, Any]) -> Provenance:
        return cls(kernel, provider, canonical_config(config))

    @property
    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config)


def canonical_config(config: Mapping[str, Any]) -> str:
    """A configuration as canonical JSON (sorted keys; other objects by repr)."""
    return json.dumps(dict(config), sort_keys=True, default=repr)


@attrs.frozen
class Stamp:
    """A stored value's provenance and the commit sequence number that wrote it
    (increasing within a store: a value written later has a larger ``seq``)."""

    provenance: Provenance
    seq: int


@attrs.define
class Batch:
    """The writes of one chunk, committed together.

    ``values`` maps (model_id, param, field) to a per-parameter value; ``aggregates``
    maps a contextual name to a value; ``provenance`` maps each written field to what
    produced it; ``notes`` are recorded (replacing any note of the same kernel and
    unit) and ``cleared_notes`` (Note.key tuples) removed."""

    values: dict[tuple[str, str, str], Any] = attrs.field(factory=dict)
    aggregates: dict[str, Any] = attrs.field(factory=dict)
    notes: list[Note] = attrs.field(factory=list)
    cleared_notes: set[tuple[str, tuple[str, ...], str | None]] = attrs.field(factory=set)
    provenance: dict[str, Provenance] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.values) + len(self.aggregates) + len(self.notes)


def contextual_name(field: str, models: Sequence[str], param: str | None = None) -> str:
    """The deterministic storage name of an aggregate: ``field@models[a,b]@params[p]``."""
    name = f"{field}@models[{','.join(models)}]"
    return f"{name}@params[{param}]" if param is not None else name


_CONTEXT = re.compile(
    r"^(?P<field>[^@]+)@models\[(?P<models>[^\]]*)\](?:@params\[(?P<param>.*)\])?$"
)


def split_contextual(name: str) -> tuple[str, tuple[str, ...], str | None]:
    """Invert :func:`contextual_name`: (field, models, param or None)."""
    m = _CONTEXT.match(name)
    if m is None:
        return name, (), None
    models = tuple(x for x in m["models"].split(",") if x)
    return m["field"], models, m["param"]


def rename_in_contextual(name: str, old: str, new: str) -> str:
    """A contextual name with model id ``old`` replaced by ``new``."""
    field, models, param = split_contextual(name)
    if not models:
        return name
    return contextual_name(field, tuple(new if m == old else m for m in models), param)


def estimate_nbytes(value: Any) -> int:
    """Bytes a stored value takes when read back (arrays exactly, scalars as 8)."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (tuple, list)):
        return sum(estimate_nbytes(v) for v in value) + 8
    return 8


def storable_problem(value: Any) -> str | None:
    """Why a store cannot keep ``value`` (a short phrase), or None when it can."""
    if isinstance(value, (bool, int, float, str, np.bool_, np.integer, np.floating)):
        return None
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "biuf":
            return None
        return f"a numpy array of dtype {value.dtype}"
    if isinstance(value, tuple):
        for item in value:
            if isinstance(item, str):
                return "a tuple holding a string"
            problem = storable_problem(item)
            if problem is not None:
                return f"a tuple holding {problem}"
        return None
    kind = type(value)
    qualname = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}"
    )
    return f"a value of type {qualname}"


class Store(abc.ABC):
    """What a storage profile provides; the planner and executor use nothing else."""

    #: Whether results survive the process (a durable store also copies in-memory
    #: models' weights when they are added, see ``add_model``).
    durable: bool = False

    # -- models ---------------------------------------------------------------
    @abc.abstractmethod
    def add_model(
        self,
        model_id: str,
        params: Sequence[ParamInfo],
        source: ModelSource,
        load: Callable[[str], np.ndarray],
        load_raw: Callable[[str], Any] | None = None,
        *,
        copy_weights: bool = True,
    ) -> None:
        """Record a model at once (all or nothing): its parameters, its source record,
        the loader that reads one parameter as numpy and the loader of the raw tensor
        (device and dtype kept; defaults to ``load``).

        A durable store keeps ``source`` so that it can read the model again after a
        reopen (:func:`diffract.plugins.open_model_source` rebuilds file-backed
        loaders). For an in-memory source it copies the weights when ``copy_weights``
        (reading them through ``load_raw``); without a copy, reads after a reopen raise
        :class:`~diffract.errors.WeightsUnavailableError` and the units are skipped."""

    def source(self, model_id: str) -> ModelSource:
        """The source record of a model (what ``add_model`` was given)."""
        raise NotImplementedError

    @abc.abstractmethod
    def model_ids(self) -> list[str]:
        """Models in insertion order."""

    @abc.abstractmethod
    def params(self, model_id: str) -> list[ParamInfo]:
        """Parameters of one model, in insertion order."""

    @abc.abstractmethod
    def load_weights(self, model_id: str, param: str) -> np.ndarray:
        """Read one parameter's weights (numpy; half types as float32)."""

    def load_tensor(self, model_id: str, param: str) -> Any:
        """The parameter as its source holds it (the ``tensor`` field); by default the
        numpy weights, for profiles that cannot keep the original object."""
        return self.load_weights(model_id, param)

    # -- per-parameter fields -------------------------------------------------
    @abc.abstractmethod
    def present(self, model_id: str, field: str) -> set[str]:
        """Names of the parameters of ``model_id`` that have ``field`` stored."""

    @abc.abstractmethod
    def read(self, model_id: str, param: str, field: str) -> Any:
        """A stored per-parameter value (KeyError when absent)."""

    @abc.abstractmethod
    def nbytes(self, model_id: str, param: str, field: str) -> int:
        """Bytes ``read`` would return, from stored metadata (0 when absent)."""

    @abc.abstractmethod
    def fields(self, model_id: str) -> set[str]:
        """Every per-parameter field stored for the model."""

    # -- aggregates -----------------------------------------------------------
    @abc.abstractmethod
    def aggregate_names(self) -> list[str]:
        """Every stored contextual name, in insertion order."""

    @abc.abstractmethod
    def read_aggregate(self, name: str) -> Any:
        """A stored aggregate (KeyError when absent)."""

    # -- provenance -------------------------------------------------------------
    @abc.abstractmethod
    def stamps(self, model_id: str, field: str) -> dict[str, Stamp]:
        """Parameter name -> :class:`Stamp` of each stored value of ``field``."""

    @abc.abstractmethod
    def aggregate_stamp(self, name: str) -> Stamp | None:
        """The :class:`Stamp` of a stored aggregate, or None when it is absent."""

    # -- notes ----------------------------------------------------------------
    @abc.abstractmethod
    def notes(self) -> list[Note]:
        """Every recorded note."""

    # -- writes ---------------------------------------------------------------
    @abc.abstractmethod
    def commit(self, batch: Batch) -> None:
        """Apply every write of ``batch`` at once, or none of them."""

    @abc.abstractmethod
    def erase(
        self, fields: Iterable[str], model_ids: Iterable[str], kernels: Iterable[str] = ()
    ) -> int:
        """Erase per-parameter values and aggregates of ``fields`` for the models (an
        aggregate is erased when all its models are among ``model_ids``), and the notes
        of ``kernels`` for those models. Returns how many values were erased."""

    def erase_values(
        self,
        values: Iterable[tuple[str, str, str]],
        aggregates: Iterable[str] = (),
        notes: Iterable[tuple[str, tuple[str, ...], str | None]] = (),
    ) -> int:
        """Erase single per-parameter values ``(model_id, param, field)``, aggregates by
        contextual name and notes by key, at once; returns how many values went."""
        raise NotImplementedError(f"{type(self).__name__} cannot erase single values")

    def rename_model(self, old: str, new: str) -> None:
        """Give model ``old`` the id ``new`` everywhere: its parameters, values, the
        aggregates and notes that name it (one atomic change)."""
        raise NotImplementedError(f"{type(self).__name__} cannot rename models")

    def erase_model(self, model_id: str) -> None:
        """Remove a model with its values, and every aggregate and note that involves
        it (one atomic change)."""
        raise NotImplementedError(f"{type(self).__name__} cannot erase models")

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (files, handles). The default does nothing."""

    #: Whether the store was opened read-only (reads and exports only).
    read_only: bool = False

    def check_writable(self) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~diffract.errors.StorageError` saying why when nothing can be
        stored (a read-only store); ``apply`` asks before it computes anything. The
        default store is always writable."""

    @abc.abstractmethod
    def has_aggregate(self, name: str) -> bool:
        """Whether an aggregate is stored; the planner asks once per unit, so it must
        not scan (a dict lookup, a primary-key query)."""

    # -- conveniences built on the contract -----------------------------------
    def read_field(self, model_id: str, field: str) -> dict[str, Any]:
        """Every stored value of ``field`` of the model, by parameter. Exports call it
        once per (model, field); a store that can answer in one query overrides it."""
        return {p: self.read(model_id, p, field) for p in self.present(model_id, field)}


    def describe(self) -> Mapping[str, Any]:
        """A small summary for logs: models, parameters, stored values."""
        return {
            "models": len(self.model_ids()),
            "params": sum(len(self.params(m)) for m in self.model_ids()),
            "aggregates": len(self.aggregate_names()),
        }
