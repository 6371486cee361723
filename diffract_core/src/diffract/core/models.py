"""Reading models: a torch module, a state dict, a checkpoint file or directory.

:func:`read_model` turns what the user passed into an :class:`OpenedModel`: the
floating-point parameters' metadata (:class:`ParamInfo`), the :class:`ModelSource`
record a durable store keeps, the model's configuration, and two lazy loaders:
``load(name, index=None)`` returns one parameter (or the slice ``index`` of it) as numpy
(float32 for half and bfloat16 weights, the stored dtype otherwise) and ``raw`` as its
source holds it (a torch tensor on its device, in its dtype, or a numpy array). Nothing
is read or copied at ``add`` time beyond headers.

Torch modules and mappings of names to tensors or arrays are read here; checkpoint
files and directories by the installed model formats (:mod:`diffract.core.formats`).
:func:`with_views` adds the views that rules split parameters into
(:mod:`diffract.core.views`), :func:`apply_overrides` renames and retypes parameters,
and :func:`open_source` builds the loaders again from a stored record after a reopen.
Integer and boolean tensors (``num_batches_tracked``) are not weights and are left out."""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from diffract.core.ptypes import infer_type, module_types
from diffract.core.sources import ModelSource
from diffract.core.storage.base import ParamInfo
from diffract.core.tensors import readable, to_numpy
from diffract.core.views import (
    RECENT_BYTES,
    Index,
    Recent,
    View,
    resolve_index,
    sliced_shape,
    to_slices,
    view_name,
)
from diffract.errors import EmptyModelError, InvalidArgumentError, ModelSourceError

__all__ = ["OpenedModel", "apply_overrides", "open_source", "read_model", "with_views"]

#: ``load(name, index=None)``: a parameter, or the slice ``index`` of it.
Loader = Callable[..., Any]


@attrs.define
class OpenedModel:
    """What ``models.add`` records: parameters, the source record, the two loaders and
    the model's configuration (for view rules; read when a rule first asks)."""

    infos: list[ParamInfo]
    source: ModelSource
    load: Loader = attrs.field(repr=False)
    raw: Loader = attrs.field(repr=False)
    config: Callable[[], Mapping[str, Any]] = attrs.field(default=dict, repr=False)


# -- tensors --------------------------------------------------------------------------
def _is_torch_module(obj: Any) -> bool:
    # No torch import here: if torch is not loaded, obj cannot be a torch module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _torch_dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _is_float(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return np.issubdtype(value.dtype, np.floating)
    return bool(value.dtype.is_floating_point)


def _sliced(value: Any, index: Index | None) -> Any:
    return value if index is None else value[to_slices(index)]


def _from_mapping(model_id: str, mapping: Mapping[str, Any], description: str,
                  modules: Mapping[str, str] | None = None,
                  config: Mapping[str, Any] | None = None) -> OpenedModel:
    torch_mod = sys.modules.get("torch")
    bad = sorted(
        str(k)
        for k, v in mapping.items()
        if not isinstance(v, np.ndarray)
        and not (torch_mod is not None and isinstance(v, torch_mod.Tensor))
    )
    if bad:
        nested = [k for k in bad if isinstance(mapping[k], Mapping)]
        hint = (
            f" It looks like a training checkpoint: pass its state dict, e.g. "
            f"checkpoint[{nested[0]!r}]."
            if nested
            else ""
        )
        raise ModelSourceError(
            f"Model {model_id!r}: entries {bad[:10]} are neither torch tensors nor numpy arrays."
            f"{hint} Pass a mapping of parameter names to tensors.",
            model_id=model_id)
    kept = {str(k): v for k, v in mapping.items() if _is_float(v)}
    modules = modules or {}
    infos = [
        ParamInfo(model_id, name, tuple(v.shape),
                  str(v.dtype) if isinstance(v, np.ndarray) else _torch_dtype_name(v),
                  infer_type(name, tuple(v.shape), modules.get(name)))
        for name, v in kept.items()
    ]

    def load(name: str, index: Index | None = None) -> np.ndarray:
        return to_numpy(_sliced(kept[name], index))

    def raw(name: str, index: Index | None = None) -> Any:
        value = kept[name]
        value = value if isinstance(value, np.ndarray) else readable(value)
        return _sliced(value, index)

    config = dict(config or {})
    return OpenedModel(infos, ModelSource("memory", description=description), load, raw,
                       lambda: config)


def _module_config(module: Any) -> dict[str, Any]:
    """A Hugging Face model's ``config`` as a dict (empty for other modules)."""
    to_dict = getattr(getattr(module, "config", None), "to_dict", None)
    try:
        return dict(to_dict()) if callable(to_dict) else {}
    except Exception:  # noqa: BLE001 - a configuration is a convenience, never an error
        return {}


def _from_format(model_id: str, given: Any, format: str | None,
                 options: Mapping[str, Any] | None) -> OpenedModel:
    """A checkpoint file or directory, or an object in memory a named format reads."""
    from diffract.core.formats import open_object, open_path

    entries, source, load, raw, config = (
        open_path(given, model_id, format, options)
        if isinstance(given, (str, os.PathLike)) else
        open_object(given, model_id, format or "", options))
    infos = [ParamInfo(model_id, e.name, e.shape, e.dtype, infer_type(e.name, e.shape),
                       e.meta) for e in entries]
    return OpenedModel(infos, source, load, raw, config)


# -- renames and views ----------------------------------------------------------------
def _renamed(loader: Loader, renamed: Mapping[str, str]) -> Loader:
    return lambda name, index=None: loader(renamed.get(name, name), index)


def _viewed(loader: Loader, views: Mapping[str, tuple[str, Index, bool]]) -> Loader:
    """``loader`` that also reads views. A parent read whole (for its own unit) is kept,
    up to ``RECENT_BYTES`` of recent parents, and its views are sliced from it (a view
    asking while its parent is being read waits for that read); a view whose parent is
    not kept reads only its slice. With the views listed right after their parent, a
    chunk that analyses a parameter and its views reads the parameter once."""
    parents = {parent for parent, _, _ in views.values()}
    recent = Recent(RECENT_BYTES)

    def read(name: str, index: Index | None = None) -> Any:
        view = views.get(name)
        if view is None:
            if index is None and name in parents:
                return recent.load(name, lambda: loader(name, None))
            return loader(name, index)
        parent, at, transpose = view
        whole = recent.get(parent)
        value = whole[to_slices(at)] if whole is not None else loader(parent, at)
        return value.T if transpose else value

    return read


def _with_source_maps(load: Loader, raw: Loader, source: ModelSource) -> tuple[Loader, Loader]:
    if source.renames:
        renamed = dict(source.renames)
        load, raw = _renamed(load, renamed), _renamed(raw, renamed)
    if source.views:
        views = {name: (parent, index, transpose)
                 for name, parent, index, transpose in source.views}
        load, raw = _viewed(load, views), _viewed(raw, views)
    return load, raw


def open_source(source: ModelSource, model_id: str) -> tuple[Loader, Loader]:
    """The loaders of a file-backed source recorded earlier (after a store reopens).

    The model format recorded reads the files again, lazily; each read first checks
    the file's identity, so a changed file fails the parameter being read, with what
    changed. Renamed parameters and views read as they did when the model was added."""
    if not source.is_file_backed:
        raise ValueError(f"open_source needs a file-backed source, got kind {source.kind!r}")
    from diffract.core.formats import reopen

    return _with_source_maps(*reopen(source, model_id), source)


def apply_overrides(opened: OpenedModel, overrides: Mapping[str, Any]) -> OpenedModel:
    """The model with :class:`~diffract.core.ptypes.ParameterOverrides` applied: renamed
    parameters (the loaders still read the original names), types and metadata."""
    from diffract.core.ptypes import ParameterOverrides

    names = [i.name for i in opened.infos]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ModelSourceError(
            f"parameter_overrides name parameter(s) the model does not have: {unknown[:10]}. "
            f"Its parameters include {names[:5]}.", model_id=opened.infos[0].model_id)
    renamed: dict[str, str] = {}
    infos = []
    for info in opened.infos:
        ov = overrides.get(info.name)
        if ov is None:
            infos.append(info)
            continue
        if not isinstance(ov, ParameterOverrides):
            raise ModelSourceError(
                f"parameter_overrides[{info.name!r}] must be a ParameterOverrides, got "
                f"{type(ov).__name__}.", model_id=info.model_id)
        new = ov.name or info.name
        if new != info.name:
            renamed[new] = info.name
        infos.append(attrs.evolve(info, name=new, ptype=ov.ptype or info.ptype,
                                  meta=ov.meta or info.meta))
    _refuse_clashes([i.name for i in infos], "parameter_overrides would give two parameters "
                    "the name(s)", infos[0].model_id)
    if not renamed:
        return attrs.evolve(opened, infos=infos)
    source = attrs.evolve(opened.source, renames=tuple(sorted(renamed.items())))
    return attrs.evolve(opened, infos=infos, source=source,
                        load=_renamed(opened.load, renamed), raw=_renamed(opened.raw, renamed))


def _refuse_clashes(names: Sequence[str], what: str, model_id: str) -> None:
    clashes = sorted(n for n, count in Counter(names).items() if count > 1)
    if clashes:
        raise ModelSourceError(f"{what} {clashes[:10]}.", model_id=model_id)


def with_views(opened: OpenedModel, rules: Sequence[tuple[Any, Mapping[str, Any]]]) -> OpenedModel:
    """The model with the views each rule (a ViewRule and its options) splits its
    parameters into, each parameter followed by its views (so that one chunk reads a
    parameter and its views together); the source records them."""
    model_id = opened.infos[0].model_id
    infos: list[ParamInfo] = []  # each parameter, then its views
    table: list[tuple[str, str, Index, bool]] = []
    config = opened.config() if rules else {}
    split: dict[str, int] = {rule.name: 0 for rule, _ in rules}
    for info in opened.infos:
        infos.append(info)
        for rule, options in rules:
            try:
                views = list(rule.split(info, config, options) or ())
            except Exception as exc:  # noqa: BLE001 - named with the rule and parameter
                raise ModelSourceError(
                    f"Model {model_id!r}: view rule {rule.name!r} ({rule.provider}) failed on "
                    f"{info.name!r} {info.shape}: {type(exc).__name__}: {exc}",
                    model_id=model_id) from None
            split[rule.name] += bool(views)
            for view in views:
                infos.append(_view_info(info, view, rule, model_id))
                index = resolve_index(view.index, info.shape)
                table.append((infos[-1].name, info.name, index, view.transpose))
    idle = [rule for rule, _ in rules if not split[rule.name]]
    if idle:
        names = [i.name for i in opened.infos]
        raise ModelSourceError(
            f"Model {model_id!r}: view rule(s) {[r.name for r in idle]} split none of its "
            f"{len(names)} parameters ({'; '.join(f'{r.name}: {r.description}' for r in idle)}"
            f"). Its parameters include {names[:4]}. Drop the rule for this model, or give "
            "the options that make it apply (a name pattern, the geometry).",
            model_id=model_id)
    _refuse_clashes([i.name for i in infos], "the views give two parameters the name(s)",
                    model_id)
    if not table:
        return opened
    source = attrs.evolve(opened.source, views=tuple(table))
    views = {name: (parent, index, transpose) for name, parent, index, transpose in table}
    return attrs.evolve(opened, infos=infos, source=source,
                        load=_viewed(opened.load, views), raw=_viewed(opened.raw, views))


def _view_info(info: ParamInfo, view: Any, rule: Any, model_id: str) -> ParamInfo:
    """The ParamInfo of one view, after checking it fits its parent."""
    if not isinstance(view, View):
        raise ModelSourceError(
            f"Model {model_id!r}: view rule {rule.name!r} ({rule.provider}) returned a "
            f"{type(view).__name__} for {info.name!r}, not a View.", model_id=model_id)
    if not view.label or any(c in view.label for c in "[]"):
        raise ModelSourceError(
            f"Model {model_id!r}: view rule {rule.name!r} gave {info.name!r} the label "
            f"{view.label!r}; a label is non-empty and holds no '[' or ']'.", model_id=model_id)
    try:
        shape = sliced_shape(info.shape, view.index, view.transpose)
    except ValueError as exc:
        raise ModelSourceError(
            f"Model {model_id!r}: view rule {rule.name!r} gave {info.name!r} {info.shape} the "
            f"view {view.label!r}, which does not fit: {exc}.", model_id=model_id) from None
    meta = {**dict(view.meta), "view_of": info.name, "view": view.label, "view_rule": rule.name}
    return ParamInfo(model_id, view_name(info.name, view.label), shape, info.dtype,
                     view.ptype or info.ptype, tuple(sorted(meta.items())))


def read_model(source: Any, model_id: str, format: str | None = None,
               format_options: Mapping[str, Any] | None = None) -> OpenedModel:
    """Parameters, source record and loaders for what ``models.add`` was given
    (``format`` and ``format_options`` for a checkpoint file or directory, or for an
    object in memory that the format named reads)."""
    if format is None and format_options and not isinstance(source, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"{sorted(format_options)} applies to checkpoint files and directories (or to a "
            f"format named with format=), not to a {type(source).__name__}.")
    if isinstance(source, (str, os.PathLike)) or format is not None:
        opened = _from_format(model_id, source, format, format_options)
    elif _is_torch_module(source):
        kind = f"{type(source).__module__}.{type(source).__qualname__}"
        opened = _from_mapping(model_id, dict(source.named_parameters()), f"torch module {kind}",
                               module_types(source), _module_config(source))
    elif isinstance(source, Mapping):  # a ``config`` attribute: as a module's, for views
        opened = _from_mapping(model_id, source, "state dict", None, _module_config(source))
    else:
        raise ModelSourceError(
            f"Model {model_id!r}: cannot read a {type(source).__module__}."
            f"{type(source).__qualname__}. Pass a torch.nn.Module, a state dict (names to "
            "tensors or arrays), a checkpoint file or a checkpoint directory.",
            model_id=model_id)
    if not opened.infos:
        raise EmptyModelError(
            f"Model {model_id!r} has no floating-point parameters, so there is nothing to "
            "analyse. Check that you passed the model (or its state dict), not an empty "
            "container.",
            model_id=model_id)
    return opened

