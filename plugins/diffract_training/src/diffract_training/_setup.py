"""What a monitor sets up before training: its arguments checked, the lock on its store,
the heads' geometry."""

from __future__ import annotations

import math
import operator
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffract import Session
from diffract.errors import DiffractError, InvalidArgumentError, StorageError

__all__ = ["FrozenSession", "check_arguments", "checkpoint_names", "configured", "fsdp1_units",
           "global_step", "lock_store", "monitor_options", "unwrapped", "unwrapped_names"]


class _FrozenRegistry:
    """The process's kernel registry, every kernel's configuration as it was when frozen
    (the rest, registration and lookups, the registry's own)."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._config = {s.name: registry.effective_config(s.name) for s in registry.kernels()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._registry, name)

    def effective_config(self, name: str) -> dict[str, Any]:
        frozen = self._config.get(name)
        return dict(frozen) if frozen is not None else self._registry.effective_config(name)


class FrozenSession(Session):
    """A session whose kernels run with the configuration they had when :meth:`freeze`
    was called: kernel configuration is process-global (as in the original Diffract), and
    a ``configure_kernel`` elsewhere in a training process would otherwise change a
    monitor's numbers mid-run."""

    _frozen: _FrozenRegistry | None = None

    @property
    def registry(self) -> Any:
        return self._frozen if self._frozen is not None else super().registry

    def freeze(self) -> None:
        self._frozen = _FrozenRegistry(super().registry)

    def configure(self, kernel: str, **values: Any) -> None:
        """Set ``kernel``'s configuration for this session alone (once frozen)."""
        if self._frozen is None:
            self.freeze()
        self._frozen._config.setdefault(kernel, {}).update(values)


def _names(value: Any, what: str, *, empty: bool = True) -> str | None:
    """Why ``value`` is not a name or a list of names (None where ``empty``), or None."""
    if value is None and empty or isinstance(value, str):
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return None
    return (f"{what} takes a name or a list of names{' (or None)' if empty else ''}, got "
            f"{value!r}")


#: Modules that wrap a model and put their own name in its parameters' names:
#: torch.compile, FSDP (1), activation checkpointing; DDP's (and DataParallel's) ``module``
#: at the front of a wrapped model's names.
WRAPPERS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
DATA_PARALLEL = ("DistributedDataParallel", "DataParallel")


def unwrapped_names(model: Any) -> dict[str, Any]:
    """``model.named_parameters()`` under the names a checkpoint of the unwrapped model
    carries: the wrappers' parts taken out wherever they sit in a name, and DDP's leading
    ``module.`` (a monitor's store and ``diffract track`` of the run's checkpoints then
    name one parameter one way)."""
    return {unwrapped(name, model): value for name, value in model.named_parameters()}


def checkpoint_names(model: Any) -> dict[str, str]:
    """Each unwrapped parameter name of a Hugging Face model that ``save_pretrained``
    writes under another name -> that name (transformers' own renaming, reverted as it
    saves: LLaVA's live ``model.language_model.*`` is ``language_model.model.*`` in the
    saved checkpoint), so that a monitor's store and ``diffract track`` of the run's
    checkpoints name each parameter one way. Empty for any other model, and for the
    parameters a converter merges or splits (their saved tensors are not the live ones)."""
    inner = model
    for _ in range(8):  # the model a wrapper holds (as configured() finds its config)
        if callable(getattr(inner, "save_pretrained", None)) and hasattr(inner, "config"):
            break
        held = ("module",) * (type(inner).__name__ in DATA_PARALLEL) + WRAPPERS
        inner = next((getattr(inner, a) for a in held if getattr(inner, a, None) is not None),
                     None)
    else:
        return {}
    if inner is None:
        return {}
    try:
        import torch
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: its class-level mapping, reverted as it saves
        return _legacy_names(inner)
    shapes = {n: torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
              for n, v in unwrapped_names(inner).items() if hasattr(v, "shape")}
    try:
        saved = revert_weight_conversion(inner, dict(shapes))
    except Exception:  # noqa: BLE001 - a converter that cannot run on shapes: names as live
        return {}
    by_id = {id(v): n for n, v in shapes.items()}
    return {by_id[id(v)]: k for k, v in saved.items() if id(v) in by_id and by_id[id(v)] != k}


def fsdp1_units(model: Any) -> list[tuple[Any, dict[str, str], dict[str, Any]]]:
    """The FSDP1 (``FullyShardedDataParallel``) units of ``model``, each as (the unit,
    {a parameter's unwrapped name: its name inside the unit}, {that name: a meta tensor
    of its shape}): read from each unit's flat parameter, whose own name
    (``..._flat_param``) is no checkpoint's, without gathering anything."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is None or not hasattr(model, "named_modules"):
        return []
    import torch

    out = []
    for prefix, unit in model.named_modules():
        if not isinstance(unit, fsdp.FullyShardedDataParallel):
            continue
        flat = getattr(getattr(unit, "_handle", None), "flat_param", None)
        fqns, shapes = getattr(flat, "_fqns", None), getattr(flat, "_shapes", None)
        if flat is None or fqns is None or shapes is None:
            continue
        base = unwrapped(prefix, model)
        names = {".".join(p for p in f"{base}.{fqn}".split(".") if p and p not in WRAPPERS):
                 fqn for fqn in fqns}
        shapes_ = {n: torch.empty(tuple(shape), dtype=flat.dtype, device="meta")
                   for n, shape in zip(names, shapes, strict=True)}
        out.append((unit, names, shapes_))
    return out


def _legacy_names(model: Any) -> dict[str, str]:
    """transformers 4's ``_checkpoint_conversion_mapping`` (legacy pattern -> live name),
    applied backwards, first match wins, as its ``save_pretrained`` does."""
    import re

    mapping = getattr(model, "_checkpoint_conversion_mapping", None) or {}
    out = {}
    for name in unwrapped_names(model):
        for legacy, live in mapping.items():
            target = re.sub(r"\(.*\)", "", legacy.lstrip("^"))
            renamed, hits = re.subn(live, target, name)
            if hits:
                if renamed != name:
                    out[name] = renamed
                break
    return out


def unwrapped(name: str, model: Any) -> str:
    """One name of ``model`` (a parameter's, a module's) as the unwrapped model names it."""
    parts = name.split(".")
    if type(model).__name__ in DATA_PARALLEL and parts[0] == "module":
        parts = parts[1:]
    return ".".join(p for p in parts if p not in WRAPPERS)


def check_arguments(every: Any, metrics: Any, views: Any, view_options: Any,
                    view_metrics: Any, params: Any, store: Any, histograms: Any, prefix: Any,
                    background: Any, copy_limit: Any, final: Any = True) -> None:
    """Every problem with a monitor's arguments, at once, as an InvalidArgumentError,
    before anything (a session, a store's folder) is made."""
    problems = [p for p in (_names(metrics, "metrics", empty=False),
                            _names(view_metrics, "view_metrics", empty=False),
                            _names(views, "views"), _names(params, "params")) if p]
    if every is not None and (isinstance(every, bool) or not isinstance(every, int)
                              or every < 1):
        problems.append(f"every takes a whole number of steps of at least 1 (or None: only "
                        f"the checkpoints given to analyse_saved), got {every!r}")
    if view_options is not None and not (isinstance(view_options, Mapping) and all(
            isinstance(k, str) for k in view_options)):
        problems.append(f"view_options takes a mapping of option names to values (heads=12"
                        f"...), got {view_options!r}")
    if store is not None and (not isinstance(store, (str, os.PathLike)) or not str(store)
                              or "\x00" in str(store)):
        problems.append(f"store takes a folder's path (a str or Path without NUL), got "
                        f"{store!r}")
    problems += [f"{name} takes True or False, got {value!r}" for name, value in (
        ("histograms", histograms), ("background", background), ("final", final))
        if not isinstance(value, bool)]
    if not isinstance(prefix, str) or not prefix:
        problems.append(f"prefix takes the logged names' first part (a str), got {prefix!r}")
    if copy_limit is not None and (isinstance(copy_limit, bool) or not isinstance(
            copy_limit, (int, float)) or not math.isfinite(copy_limit) or copy_limit < 0
            or (isinstance(copy_limit, float) and copy_limit > 1)):
        problems.append(f"copy_limit takes a share of the analysed bytes (a float from 0 to "
                        f"1), a number of bytes (an int) or None (no limit), got "
                        f"{copy_limit!r}")
    if problems:
        raise InvalidArgumentError("Monitor: " + "; ".join(sorted(problems)) + ".")


def monitor_options(front_end: str, options: Mapping[str, Any], monitor: Any) -> dict[str, Any]:
    """A front end's keywords for its monitor (the class ``monitor``), every name one the
    monitor takes (the checks of their values are the monitor's); a copy, so a front end
    can build its monitor again (a second ``fit``)."""
    import inspect

    from diffract.errors import did_you_mean

    known = [n for n in inspect.signature(monitor).parameters if n != "model"]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgumentError(
            f"{front_end} got unknown keyword(s) {unknown}.{did_you_mean(unknown[0], known)} "
            f"It takes the monitor's: {', '.join(known)}.")
    options = dict(options)
    if "every" in options and options["every"] is None:  # no monitoring of its own: not
        options.setdefault("final", False)  # the final weights either (final=True asks)
    return options


def global_step(value: Any) -> int:
    """``value`` as a step number (an int, numpy's too; not a bool), or an
    InvalidArgumentError."""
    try:
        step = operator.index(value)
    except TypeError:
        step = -1
    if isinstance(value, bool) or step < 0:
        raise InvalidArgumentError(f"the global step is a whole number of at least 0 (the "
                                   f"optimizer steps taken), got {value!r}.") from None
    return step


class Configured(dict):
    """Tensors by name with the model's Hugging Face ``config`` on them: the core hands
    it to the view rules as it does a module's, so the monitor's views are those
    ``models.add`` gives the model's saved folder (its config.json)."""

    config: Any = None


def configured(tensors: Mapping[str, Any], model: Any) -> Mapping[str, Any]:
    """``tensors`` carrying ``model``'s config (that of the module a wrapper holds: DDP's
    ``module``, torch.compile's ``_orig_mod``, a checkpoint wrapper's), when it has one."""
    for _ in range(8):  # wrappers nest a few deep at most
        config = getattr(model, "config", None)
        if callable(getattr(config, "to_dict", None)):
            out = Configured(tensors)
            out.config = config
            return out
        held = ("module",) * (type(model).__name__ in DATA_PARALLEL) + WRAPPERS
        model = next((getattr(model, a) for a in held if getattr(model, a, None) is not None),
                     None)
    return tensors


def lock_store(store: str | Path) -> Any:
    """An exclusive lock on ``<store>/.monitor.lock`` for the monitor's life: a store
    another run is writing is refused before training starts."""
    folder = Path(store)
    try:
        fh = open(folder / ".monitor.lock", "a")  # noqa: SIM115 - held until close()
    except OSError as exc:  # a store on a read-only file system, or not ours to write
        raise StorageError(f"the store {str(folder)!r} cannot be written ({exc.strerror}): "
                           "a monitor adds a step to it at each analysis; give it a store "
                           "on a writable file system (store=...).") from None
    try:
        import fcntl

        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # pragma: no cover - no fcntl (Windows): no lock
        pass
    except BlockingIOError:
        fh.close()
        raise DiffractError(
            f"the store {str(folder)!r} is being written by another run (its "
            ".monitor.lock is held): give this run a store of its own.") from None
    return fh
