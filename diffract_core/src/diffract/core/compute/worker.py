"""What runs where a kernel runs (in this process or a worker): reading the weights a
reference points at, calling the kernel, turning every outcome into a tagged tuple.

A worker process unpickles these functions, so this module imports only what they need
(no planner, no runner, no store)."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from diffract.core.sources import ModelSource
from diffract.errors import FieldUndefined

if TYPE_CHECKING:  # pragma: no cover
    from diffract.core.compute.spec import KernelSpec

__all__ = ["RefError", "WeightsRef", "describe", "invoke", "invoke_batch", "invoke_group",
           "resolve", "timed"]

log = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    """``Type: message (file:line)`` of an exception raised by a kernel."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


@attrs.frozen
class WeightsRef:
    """A parameter of a file-backed model, sent to a worker process instead of its
    data: the worker reads it from the file itself (no copy through the session's
    process, and the reading happens in parallel)."""

    source: ModelSource
    model_id: str
    param: str
    raw: bool  # the ``tensor`` field (as stored) rather than ``weights`` (numpy)

    def load(self) -> Any:
        key = (self.source, self.model_id)
        loaders = _OPENED.get(key)
        if loaders is None:
            from diffract.core.models import open_source

            loaders = _OPENED[key] = open_source(self.source, self.model_id)
        return loaders[1 if self.raw else 0](self.param)


#: Sources a worker process opened (kept: a worker reads many parameters of a model).
_OPENED: dict[tuple[ModelSource, str], tuple[Callable[[str], Any], Callable[[str], Any]]] = {}


def resolve(inputs: Mapping[str, Any], read: dict[WeightsRef, Any] | None = None
            ) -> dict[str, Any]:
    """Inputs with every :class:`WeightsRef` read (in the process that runs the kernel);
    ``read`` holds what was read already (kernels of one unit share their parameter)."""
    out, read = {}, {} if read is None else read
    for arg, value in inputs.items():
        if isinstance(value, WeightsRef):
            value = _load_ref(arg, value, read)
        elif isinstance(value, tuple) and any(isinstance(v, WeightsRef) for v in value):
            value = tuple(_load_ref(arg, v, read) if isinstance(v, WeightsRef) else v
                          for v in value)
        out[arg] = value
    return out


class RefError(Exception):
    pass


def _load_ref(arg: str, ref: WeightsRef, read: dict[WeightsRef, Any]) -> Any:
    try:
        if ref not in read:
            read[ref] = ref.load()
        return read[ref]
    except Exception as exc:  # noqa: BLE001 - the unit fails with the reason
        field = "tensor" if ref.raw else "weights"
        raise RefError(f"cannot read input {field!r} of {ref.model_id}/{ref.param}: "
                        f"{type(exc).__name__}: {exc}") from None


def invoke(fn: Callable[..., Any], inputs: Mapping[str, Any], config: Mapping[str, Any],
           read: dict[WeightsRef, Any] | None = None):
    """Call a kernel; never raises (runs in worker processes too)."""
    try:
        return ("ok", fn(**resolve(inputs, read), **config))
    except RefError as exc:
        return ("error", str(exc))
    except FieldUndefined as exc:
        return ("undefined", exc.reason)
    except Exception as exc:  # noqa: BLE001 - recorded per unit, reported at the end
        return ("error", describe(exc))


Call = tuple[Callable[..., Any], Mapping[str, Any], Mapping[str, Any]]


def invoke_group(calls: Sequence[Call]) -> list[Any]:
    """:func:`invoke` over several (kernel, inputs, configuration) in one executor task:
    short units (one task each would cost more in the executor than in the kernel), and
    the kernels of one unit run together, whose parameter is read once for all of them
    (kept while the next call reads it too)."""
    read: dict[WeightsRef, Any] = {}
    outcomes = []
    for fn, got, config in calls:
        read = {ref: read[ref] for ref in got.values() if isinstance(ref, WeightsRef)
                and ref in read}
        outcomes.append(invoke(fn, got, config, read))
    return outcomes


def timed(call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``call(*args)`` in a worker, with the seconds it took there (what the runner
    groups short units by: the wall time it sees includes the executor's latency)."""
    start = time.perf_counter()
    return call(*args), time.perf_counter() - start


def invoke_batch(spec: KernelSpec, units: list[Mapping[str, Any]], config: Mapping[str, Any]):
    """Run a kernel's batch path; on any failure of the batch itself, unit by unit."""
    try:
        results = list(spec.batch(units, **config))
        if len(results) != len(units):
            raise ValueError(f"batch returned {len(results)} results for {len(units)} units")
    except Exception as exc:  # noqa: BLE001 - the per-unit path decides per unit
        log.warning("%s: batch path failed (%s); running unit by unit", spec.name, exc)
        return [invoke(spec.function, got, config) for got in units]
    outcomes = []
    for result in results:
        if isinstance(result, FieldUndefined):
            outcomes.append(("undefined", result.reason))
        elif isinstance(result, Exception):
            outcomes.append(("error", describe(result)))
        else:
            outcomes.append(("ok", result))
    return outcomes
