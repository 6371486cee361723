"""``session.models``: add models (files, directories, torch modules, state dicts,
fine-tuning deltas, LoRA adapters; with views of their parameters) and look at them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from diffract.core.models import apply_overrides, read_model, with_views
from diffract.core.ptypes import ParameterOverrides
from diffract.errors import (
    DuplicateModelError,
    InvalidArgumentError,
    ModelError,
    ModelSourceError,
    ModelWarning,
    warn,
)

if TYPE_CHECKING:  # pragma: no cover
    from diffract.session import Session

__all__ = ["ModelsAPI", "ParameterNames"]


def _check_model_id(model_id: Any) -> None:
    if not isinstance(model_id, str) or not model_id or any(c in model_id for c in ",[]@/"):
        raise ModelError(
            f"model_id must be a non-empty string without ',', '[', ']', '@' or '/' (they "
            f"delimit contextual field names and parameter ids), got {model_id!r}.",
            model_id=str(model_id))


def _view_rules(views: Any, shared: Mapping[str, Any] | None = None
                ) -> list[tuple[Any, dict[str, Any]]]:
    """The view rules ``views`` names with their options (their own, and those of
    ``shared`` that they take), checked: unknown rules, options no chosen rule takes, and
    values a rule refuses."""
    if views is None:
        if shared:
            raise InvalidArgumentError("view_options were given without views=[...].")
        return []
    if isinstance(views, str):
        views = [v.strip() for v in views.split(",") if v.strip()]
    if not views or not isinstance(views, (Mapping, list, tuple)) or not all(
            isinstance(v, str) for v in views):
        raise InvalidArgumentError(f"views={views!r} names no view rule; name one or more.")
    wanted = ({name: dict(opts or {}) for name, opts in views.items()}
              if isinstance(views, Mapping) else {name: {} for name in views})
    from diffract.plugins._runtime import get_catalog

    catalog = get_catalog()
    shared = dict(shared or {})
    out, problems, used = [], [], set()
    for name, options in wanted.items():
        rule = catalog.views.get(name)
        if rule is None:
            contested = catalog.conflict_message("views", name)
            problems.append(f"view rule {contested}" if contested else
                            f"no view rule {name!r} is installed (installed: "
                            f"{', '.join(sorted(catalog.views)) or 'none'})")
            continue
        mine = {k: v for k, v in shared.items() if k in rule.options}
        used.update(mine)
        options = {**mine, **options}
        problems += [f"view rule {name!r}: {p}" for p in
                     (rule.check(options) if rule.check is not None else [])]
        out.append((rule, options))
    unused = sorted(set(shared) - used)
    if unused and not problems:
        takes = {rule.name: list(rule.options) for rule, _ in out}
        problems.append(f"view_options {unused} are taken by none of the rules (their "
                        f"options: {takes})")
    if problems:
        raise InvalidArgumentError("Cannot add views: " + "; ".join(problems) + ".")
    return out


class ParameterNames(list):
    """The parameter names ``models.add`` returns: a list, shown in one line."""

    def __repr__(self) -> str:
        more = f", ... ({len(self) - 3} more)" if len(self) > 3 else ""
        return f"<{len(self)} parameters: {', '.join(self[:3])}{more}>"


class ModelsAPI:
    """``session.models``: add models and look at what is there."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def add(
        self,
        model: Any,
        model_id: str,
        *,
        copy_weights: bool = True,
        parameter_overrides: Mapping[str, ParameterOverrides] | None = None,
        base_model_id: str | None = None,
        views: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None,
        view_options: Mapping[str, Any] | None = None,
        format: str | None = None,
        key: str | None = None,
        format_options: Mapping[str, Any] | None = None,
        step: float | None = None,
        tokens: int | None = None,
        epoch: float | None = None,
        label: str | None = None,
        step_from: str | None = None,
    ) -> ParameterNames:
        """Add a torch module, a state dict (a ``config`` on it is the view rules', as a
        module's), a checkpoint file or a Hugging Face-style directory under ``model_id``.

        Files and directories are read by the installed model formats (the first that
        recognises the path; ``format`` names one). ``views`` turns on view rules
        (``["heads", "experts"]``, ``"heads,experts"``, or ``{"name": {option: value}}``)
        and ``view_options`` gives each rule the options it takes: the views each splits
        a parameter into are added as parameters ``<parameter>[<label>]``, read as slices
        of it (see :mod:`diffract.core.views`). A rule that splits no parameter of the
        model is an error (with its reason), not a silent no-op. ``format_options`` go to
        the format's reader and are recorded with the model; ``key`` is the torch
        format's: the entry of a training checkpoint (``{"model": state_dict,
        "optimizer": ...}``) that holds the state dict, when several could.

        ``step`` (and ``tokens``, ``epoch``, ``label``) place the checkpoint in its
        training run; by default the step comes from a ``trainer_state.json`` beside the
        weights, else from the path or the id (``step-1000``, ``checkpoint-1000``,
        ``global_step1000``, ``iter_0001000``, ``epoch_05``...), or from ``step_from`` (a
        regex with one group). Models are ordered by step (``models.ordered()``; see
        :mod:`diffract.core.steps`).

        ``base_model_id`` (a model already added) makes this model the fine-tuning
        delta ``W - W_base`` of every parameter the base has with the same name and
        shape (after ``parameter_overrides``); the others are left out, with a
        :class:`~diffract.errors.ModelWarning` naming them.

        Returns the names of the parameters recorded (floating-point ones only). A
        durable profile copies the weights of an in-memory model so that it can read
        them after a reopen; ``copy_weights=False`` opts out (fields that need the
        weights are then skipped after a reopen, with that reason). Files are never
        copied: they are read again, after checking they did not change.
        ``parameter_overrides`` maps a parameter's name to a
        :class:`~diffract.ParameterOverrides`: a new name, a type, metadata.
        Raises DuplicateModelError, EmptyModelError or ModelSourceError; on any error
        nothing is added."""
        _check_model_id(model_id)
        store = self._session.store
        with self._session._lock:
            self._check_new(model_id)
            if base_model_id is not None:
                self._session._check_ids([base_model_id])
            rules = _view_rules(views, view_options)
            options = {**(format_options or {}), **({"key": key} if key is not None else {})}
            opened = read_model(model, model_id, format, options)
            if parameter_overrides:
                opened = apply_overrides(opened, parameter_overrides)
            if rules:
                opened = with_views(opened, rules)
            if base_model_id is not None:
                opened = self._delta(opened, base_model_id)
            opened = self._with_step(opened, model, model_id, dict(
                step=step, tokens=tokens, epoch=epoch, label=label), step_from)
            store.add_model(model_id, opened.infos, opened.source, opened.load, opened.raw,
                            copy_weights=copy_weights)
        return ParameterNames(i.name for i in opened.infos)

    def _with_step(self, opened: Any, given: Any, model_id: str, record: dict[str, Any],
                   step_from: str | None) -> Any:
        """The model's source with its step record."""
        import attrs

        from diffract.core.steps import read_step

        try:
            found = read_step(given if isinstance(given, (str, os.PathLike)) else None,
                              model_id, record, step_from)
        except ModelSourceError as exc:  # a trainer_state.json that cannot be read
            raise ModelSourceError(f"Model {model_id!r}: {exc}.", model_id=model_id) from None
        except ValueError as exc:
            raise InvalidArgumentError(f"Model {model_id!r}: {exc}.") from None
        return attrs.evolve(opened, source=attrs.evolve(
            opened.source, step_info=tuple(sorted(found.items()))))

    def steps(self) -> dict[str, dict[str, Any]]:
        """model_id -> its step record (``step``, ``tokens``, ``epoch``, ``label``: what
        is known), for every model."""
        store = self._session.store
        out = {}
        for model_id in store.model_ids():
            try:
                out[model_id] = dict(store.source(model_id).step_info)
            except (KeyError, NotImplementedError):
                out[model_id] = {}
        return out

    def ordered(self, model_ids: Iterable[str] | None = None) -> list[str]:
        """Model ids by step (those without one after, in the order added)."""
        from diffract.core.steps import order

        ids = list(model_ids) if model_ids is not None else self.model_ids
        return order(ids, self.steps())

    def _check_new(self, model_id: str) -> None:
        if model_id in self._session.store.model_ids():
            raise DuplicateModelError(
                f"Model id {model_id!r} is already in this session. Choose another "
                "model_id, or open a new session to replace it.",
                model_id=model_id)

    def _delta(self, opened: Any, base_model_id: str) -> Any:
        from diffract.core.derived import delta_model

        store = self._session.store
        opened, left_out = delta_model(
            opened, base_model_id, store.params(base_model_id),
            lambda name: store.load_weights(base_model_id, name),
            lambda name: store.load_tensor(base_model_id, name))
        if left_out:
            warn(ModelWarning(
                f"{len(left_out)} parameter(s) of {opened.infos[0].model_id!r} have no "
                f"parameter of the same name and shape in base {base_model_id!r} and are "
                f"left out of the delta: {left_out[:5]}{' ...' if len(left_out) > 5 else ''}"
            ))
        return opened

    def add_lora(
        self,
        adapter: Any,
        model_id: str,
        *,
        scale: float | None = None,
        copy_weights: bool = True,
    ) -> ParameterNames:
        """Add a LoRA adapter's effective updates ``scale * B @ A`` as a model, one
        parameter ``<module>.weight`` per adapted module: ``add(adapter, model_id,
        format="peft-lora")`` (a PEFT state dict, adapter file or directory). ``scale``
        defaults to ``adapter_config.json``'s ``lora_alpha / r`` (``/ sqrt(r)`` with
        rsLoRA), else 1."""
        return self.add(adapter, model_id, copy_weights=copy_weights, format="peft-lora",
                        format_options=None if scale is None else {"scale": scale})

    @property
    def model_ids(self) -> list[str]:
        """Every model id, in the order they were added (as ``session.model_ids``)."""
        return self._session.store.model_ids()

    def params(self, model_id: str) -> list[Any]:
        """ParamInfo records (name, shape, dtype, ptype, meta) of one model."""
        self._session._check_ids([model_id])
        return self._session.store.params(model_id)

    def list(self) -> list[dict[str, Any]]:
        """One record per model: id, parameters, elements, types, source and step."""
        store = self._session.store
        out = []
        for model_id in store.model_ids():
            params = store.params(model_id)
            try:
                source = store.source(model_id)
                where = source.path or source.description or source.kind
            except (KeyError, NotImplementedError):
                where = "?"
            out.append({
                "model_id": model_id,
                "params": len(params),
                "numel": sum(p.numel for p in params),
                "ptypes": sorted({p.ptype for p in params}),
                "source": where,
                "step": dict(source.step_info).get("step") if where != "?" else None,
            })
        return out

    def rename(self, old: str, new: str) -> None:
        """Give model ``old`` the id ``new``; everything that names it follows."""
        session = self._session
        session._check_ids([old])
        _check_model_id(new)
        with session._lock:
            if new in session.store.model_ids():
                raise DuplicateModelError(
                    f"Cannot rename {old!r} to {new!r}: a model {new!r} is already in this "
                    "session. Erase or rename that one first.", model_id=new)
            session.store.rename_model(old, new)

    def erase(self, *model_ids: str, erase_all: bool = False) -> None:
        """Remove models (every model with ``erase_all``), their fields and notes, and
        every aggregate that involves them (pairs included). Their files, if any, are
        not touched."""
        session = self._session
        if erase_all == bool(model_ids):
            raise InvalidArgumentError("models.erase() takes model ids or erase_all=True: "
                                       "one of the two.")
        model_ids = tuple(session.store.model_ids()) if erase_all else model_ids
        session._check_ids(list(model_ids))
        with session._lock:
            for model_id in model_ids:
                session.store.erase_model(model_id)

    def __len__(self) -> int:
        return len(self._session.store.model_ids())

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._session.store.model_ids()
