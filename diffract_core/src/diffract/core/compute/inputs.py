"""Gathering a unit's inputs: stored fields, weights (or references a worker reads),
and why an input is absent (skipped upstream, failed upstream, undefined)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import attrs

from diffract.core.compute._enums import KernelApplyLevel
from diffract.core.compute.planner import Unit
from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.core.compute.worker import WeightsRef, describe
from diffract.core.sources import ModelSource, url_scheme
from diffract.core.storage.base import Note, ParamInfo, Store, contextual_name
from diffract.errors import WeightsUnavailableError

__all__ = ["BlockedInput", "Inputs", "MissingInput", "SkippedInput", "StepState",
           "UnreadableInput", "on_gpu"]


class MissingInput(Exception):
    """A required input field is absent for one (models, param) of the unit."""

    def __init__(self, field: str, models: tuple[str, ...], param: str | None) -> None:
        super().__init__(field)
        self.field, self.models, self.param = field, models, param


class SkippedInput(Exception):
    """An input is unavailable for a lasting reason (weights not kept): skip the unit."""


class BlockedInput(Exception):
    """An aggregate's inputs failed upstream on some parameters: it must wait."""


class UnreadableInput(Exception):
    """A required input exists but could not be read (meta tensor, I/O error...)."""


def on_gpu(inputs: Mapping[str, Any]) -> bool:
    """Whether a unit's inputs hold a tensor on a GPU: its kernel runs here, where the
    device is (shipping device tensors to worker processes would copy them through the
    host, or fail)."""
    return any(getattr(getattr(item, "device", None), "type", "cpu") != "cpu"
               for value in inputs.values()
               for item in (value if isinstance(value, tuple) else (value,)))


NoteKey = tuple[str, tuple[str, ...], "str | None"]


@attrs.frozen(eq=False)
class StepState:
    """What the runner knows while one step runs (built once when the step starts)."""

    spec: KernelSpec
    config: Mapping[str, Any]
    params: Mapping[str, Mapping[str, ParamInfo]]  # model -> name -> info
    #: input field -> (producing kernel, its level), for fields some kernel produces
    producers: Mapping[str, tuple[str, KernelApplyLevel]]
    #: (kernel, models, param) -> the note the producers of the inputs left there
    notes: Mapping[NoteKey, Note]
    #: model -> its source, for the models whose weights are files (workers read them)
    file_sources: Mapping[str, ModelSource]
    position: tuple[int, int]
    units: frozenset[Unit]  #: the units this kernel runs (a step may run several kernels)


def _whole(state: StepState, model_id: str) -> list[str]:
    """The stored parameters of a model, without views: what an aggregate over the whole
    model summarises (a view is part of its parent and would count twice)."""
    return [n for n, p in state.params[model_id].items() if p.parent is None]


class Inputs:
    """Reading the inputs of a step's units from ``store`` on the ``threads`` pool."""

    store: Store
    threads: ThreadPoolExecutor

    def _read(self, state: StepState, field: str, model_id: str, param: str | None,
              lazy: bool | str = False, read: dict[Any, Any] | None = None) -> Any:
        store = self.store
        if field == "shape":
            return state.params[model_id][param].shape
        source = state.file_sources.get(model_id)
        if lazy and field in ("weights", "tensor") and source is not None and (
                lazy is True or url_scheme(source.path)):  # "urls": those in object storage
            return WeightsRef(source, model_id, param, field == "tensor")
        if field in SOURCE_FIELDS:
            read, key = {} if read is None else read, (field, model_id, param)
            try:
                if key not in read:  # (else read for another kernel of the unit)
                    read[key] = (store.load_tensor if field == "tensor" else
                                 store.load_weights)(model_id, param)
                return read[key]
            except WeightsUnavailableError as exc:
                raise SkippedInput(str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - that unit fails, with the reason
                raise UnreadableInput(
                    f"cannot read input {field!r} of {model_id}/{param}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        level = state.producers[field][1] if field in state.producers else None
        try:
            if level is KernelApplyLevel.PARAMETER:
                return store.read(model_id, param, field)
            if level is KernelApplyLevel.IN_MODEL:
                return store.read_aggregate(contextual_name(field, (model_id,)))
        except KeyError:
            pass
        at = param if level is KernelApplyLevel.PARAMETER else None
        raise MissingInput(field, (model_id,), at)

    def _gather(self, state: StepState, unit: Unit, lazy: bool | str = False,
                read: dict[Any, Any] | None = None) -> dict[str, Any]:
        """The keyword arguments of one kernel call (raises MissingInput/UnreadableInput);
        ``read``: the weights read for the unit's other kernels (read once for them all)."""
        spec = state.spec
        inputs: dict[str, Any] = {}
        for arg, field in spec.inputs:
            plevel = state.producers.get(field, ("", KernelApplyLevel.PARAMETER))[1]
            if spec.apply_level is KernelApplyLevel.PARAMETER:
                try:
                    inputs[arg] = self._read(state, field, unit.models[0], unit.param, lazy,
                                             read)
                except MissingInput:
                    if field not in spec.optional_inputs:
                        raise
                    inputs[arg] = math.nan  # an optional input not stored here
            elif spec.apply_level is KernelApplyLevel.IN_MODEL:
                (model_id,) = unit.models
                if plevel is KernelApplyLevel.PARAMETER:
                    names = _whole(state, model_id)
                    if field not in SOURCE_FIELDS:
                        have = self.store.present(model_id, field)
                        self._check_not_blocked(state, field, model_id, names, have)
                        names = [n for n in names if n in have]
                    inputs[arg] = tuple(self._read(state, field, model_id, n) for n in names)
                else:
                    inputs[arg] = self._read(state, field, model_id, None)
            elif plevel is KernelApplyLevel.CROSS_MODEL:
                name = contextual_name(field, unit.models, unit.param)
                try:
                    inputs[arg] = self.store.read_aggregate(name)
                except KeyError:
                    raise MissingInput(field, unit.models, unit.param) from None
            else:
                inputs[arg] = tuple(self._read(state, field, m, unit.param, lazy)
                                    for m in unit.models)
        return inputs

    def _gather_one(self, state: StepState, unit: Unit, lazy: bool | str = False,
                    read: dict[Any, Any] | None = None) -> Any:
        if unit not in state.units:
            return None  # not a unit of this kernel (another of the step's has it)
        try:
            return self._gather(state, unit, lazy, read)
        except (MissingInput, UnreadableInput, BlockedInput, SkippedInput) as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a store that fails on one unit
            return UnreadableInput(f"cannot read the inputs of {unit.label}: {describe(exc)}")

    def _gather_all(self, states: Sequence[StepState], unit: Unit, lazy: bool | str) -> list[Any]:
        """Each kernel's inputs for ``unit``, its weights read once for them all."""
        read: dict[Any, Any] = {}
        return [self._gather_one(state, unit, lazy, read) for state in states]

    def _prefetch(self, states: Sequence[StepState], chunk: Sequence[Unit],
                  lazy: bool | str = False) -> list[Future[Any]]:
        """Start reading a chunk's inputs on the thread pool: one task per unit (its
        kernels' inputs, see :meth:`_gather_all`; the first kernel reads weights when one
        does). With ``lazy``, weights of file-backed models stay references for the
        workers to read.

        Tasks never wait on other tasks of the pool (a task that did could hold every
        worker while the tasks it waits for sit in the queue). Stored fields of an
        in-memory store are read here at once: a thread task per unit would cost more
        than the read (about 40 us a unit, 1000 units in ``diffract analyze`` of MiniLM)."""
        if self.store.durable or SOURCE_FIELDS.intersection(states[0].spec.require_fields):
            return [self.threads.submit(self._gather_all, states, unit, lazy) for unit in chunk]
        done = []
        for unit in chunk:
            done.append(Future())
            done[-1].set_result(self._gather_all(states, unit, lazy))
        return done

    @staticmethod
    def _check_not_blocked(
        state: StepState, field: str, model_id: str, names: list[str], have: set[str]
    ) -> None:
        """Raise BlockedInput when ``field`` is absent on parameters whose producer
        failed there (those parameters will be retried: the aggregate waits for them)."""
        producer = state.producers[field][0]
        failed = [
            (n, note.reason)
            for n in names
            if n not in have
            and (note := state.notes.get((producer, (model_id,), n))) is not None
            and note.kind == "failed"
        ]
        if failed:
            shown = "; ".join(f"{n}: {why}" for n, why in failed[:3])
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            raise BlockedInput(
                f"input {field!r} failed on {len(failed)} of {len(names)} parameters of "
                f"{model_id} ({shown}{more}); the aggregate is computed once they succeed"
            )

    @staticmethod
    def _why_missing(state: StepState, missing: MissingInput) -> tuple[str, str]:
        """(note kind, reason) for a unit whose input is absent: failed when the input's
        kernel failed there (retried next time), skipped otherwise."""
        field = missing.field
        producer = state.producers.get(field, ("", None))[0]
        note = state.notes.get((producer, missing.models, missing.param))
        if note is None:
            return "skipped", f"input field {field!r} is not available for this unit"
        if note.kind == "failed":
            return "failed", f"input {field!r} is missing because {producer!r} failed on " \
                f"{note.unit}: {note.reason}"
        return "skipped", f"input {field!r} is not available: {producer!r} skipped " \
            f"{note.unit} ({note.reason})"

    @staticmethod
    def _input_keys(level: KernelApplyLevel, unit: Unit) -> list[tuple[tuple[str, ...], Any]]:
        """The (models, param) keys of one input of ``unit`` produced at ``level``."""
        if level is KernelApplyLevel.PARAMETER:
            return [((m,), unit.param) for m in unit.models]
        if level is KernelApplyLevel.IN_MODEL:
            return [((m,), None) for m in unit.models]
        return [(unit.models, unit.param)]

    def _inherited_undefined(self, state: StepState, unit: Unit) -> str | None:
        """The reason an input of this unit is undefined, when its producer said so.

        Aggregates over a model's parameters are not covered here: they see NaN entries
        in their tuples and decide (see :meth:`_undefined_parts`)."""
        for field, (producer, level) in state.producers.items():
            if state.spec.apply_level is KernelApplyLevel.IN_MODEL and (
                level is KernelApplyLevel.PARAMETER
            ):
                continue
            for models, param in self._input_keys(level, unit):
                note = state.notes.get((producer, models, param))
                if note is not None and note.kind == "undefined":
                    return f"input {field!r} is undefined: {note.reason}"
        return None

    def _undefined_parts(self, state: StepState, unit: Unit) -> str | None:
        """For an aggregate over a model's parameters: which inputs were undefined, why."""
        if state.spec.apply_level is not KernelApplyLevel.IN_MODEL:
            return None
        (model_id,) = unit.models
        parts = []
        for field, (producer, level) in state.producers.items():
            if level is not KernelApplyLevel.PARAMETER:
                continue
            bad = [
                (name, note.reason)
                for name in _whole(state, model_id)
                if (note := state.notes.get((producer, (model_id,), name))) is not None
                and note.kind == "undefined"
            ]
            if bad:
                shown = "; ".join(f"{name}: {why}" for name, why in bad[:3])
                more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
                parts.append(
                    f"input {field!r} is undefined for {len(bad)} of "
                    f"{len(_whole(state, model_id))} parameters ({shown}{more})"
                )
        return "; ".join(parts) or None
