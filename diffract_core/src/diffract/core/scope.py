"""What a session view covers: some models, and within them some parameters.

``session.filter(model_ids=..., param_names=..., param_types=..., param_ids=...)``
builds a :class:`Scope`; filtering a view again narrows it (every filter given must
hold). Parameter names match:

* exactly, by default (``"layer.0.weight"``, a view's ``"q_proj.weight[head=5]"``);
* as a shell-style glob when they hold ``*``, ``?`` or ``[`` (``"*.attention.*"``,
  matched against the whole name with :func:`fnmatch.fnmatchcase`; a bracketed group
  holding ``=`` is a view's label, so ``"*[head=*]"`` matches every head view);
* as a regular expression when they start with ``re:`` (``"re:^h\\.(0|1)\\."``,
  searched anywhere in the name; RE2's syntax, matched in linear time: see
  :func:`name_pattern`).

Parameter types are :class:`~diffract.core.ptypes.ParameterType` values or strings;
parameter ids are ``"model_id/param_name"``."""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from diffract.core.storage.base import ParamInfo, Store
from diffract.errors import InvalidArgumentError

__all__ = ["Scope", "ScopedAPI", "param_id"]


def param_id(model_id: str, name: str) -> str:
    """The id of a parameter: ``model_id/name``."""
    return f"{model_id}/{name}"


@functools.lru_cache(maxsize=512)
def name_pattern(text: str, what: str = "pattern") -> Any:
    """A user's regular expression compiled by RE2, which matches in time linear in the
    name whatever the pattern (``(a|aa)+$`` hangs Python's ``re``); it has ``search`` and
    ``match`` as ``re``'s do. What RE2 cannot run (backreferences, lookarounds) or does
    not compile is an InvalidArgumentError saying why."""
    import re2

    if not isinstance(text, str):
        raise InvalidArgumentError(f"{what} must be a regular expression (a string), got "
                                   f"{text!r}.")
    options = re2.Options()
    options.log_errors = False  # raised below, not also printed by RE2's logger
    try:
        return re2.compile(text, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else reason
        raise InvalidArgumentError(
            f"{what} {text!r} is not a regular expression Diffract can run: {reason}. "
            "Patterns are matched in linear time (RE2 syntax: no backreferences or "
            "lookarounds); rewrite it without them.") from None


def _matcher(pattern: str):
    if pattern.startswith("re:"):
        rx = name_pattern(pattern[3:], "param_names")
        return lambda name: rx.search(name) is not None
    if any(c in pattern for c in "*?["):  # a view's exact name matches too, brackets and all
        # a bracketed group holding "=" is a view's label, not a character class
        glob = re.sub(r"\[([^\]]*=[^\]]*)\]", lambda m: f"[[]{m.group(1)}[]]", pattern)
        return lambda name: name == pattern or fnmatch.fnmatchcase(name, glob)
    return lambda name: name == pattern


def _group(values: Any) -> tuple[str, ...] | None:
    if values is None:
        return None
    if isinstance(values, str):
        return (values,)
    return tuple(str(v) for v in values)


@attrs.frozen
class Scope:
    """Models in scope (None: all, in insertion order) and parameter filters: each
    filter is a tuple of groups, a parameter passing a group when it matches any of its
    entries and the filter when it passes every group (a view of a view)."""

    models: tuple[str, ...] | None = None
    names: tuple[tuple[str, ...], ...] = ()
    types: tuple[tuple[str, ...], ...] = ()
    ids: tuple[tuple[str, ...], ...] = ()

    @property
    def whole_models(self) -> bool:
        """Whether every parameter of the models in scope is in scope."""
        return not (self.names or self.types or self.ids)

    def model_ids(self, store: Store) -> list[str]:
        return list(self.models) if self.models is not None else store.model_ids()

    def keeps(self, info: ParamInfo) -> bool:
        """Whether a parameter is in scope."""
        for group in self.names:
            if not any(_matcher(p)(info.name) for p in group):
                return False
        for group in self.types:
            if info.ptype not in group:
                return False
        pid = param_id(info.model_id, info.name)
        return all(pid in group for group in self.ids)

    def keeps_param(self, model_id: str, name: str, store: Store) -> bool:
        info = next((p for p in store.params(model_id) if p.name == name), None)
        return info is not None and self.keeps(info)

    def params(self, store: Store, model_id: str) -> list[ParamInfo]:
        return [p for p in store.params(model_id) if self.keeps(p)]

    def narrow(self, models: Sequence[str] | None = None, names: Iterable[str] | None = None,
               types: Iterable[Any] | None = None, ids: Iterable[str] | None = None) -> Scope:
        """This scope with more filters (models replace, the others add up)."""
        return Scope(
            models=tuple(models) if models is not None else self.models,
            names=self.names + ((g,) if (g := _group(names)) else ()),
            types=self.types + ((g,) if (g := _group(types)) else ()),
            ids=self.ids + ((g,) if (g := _group(ids)) else ()),
        )

    def describe(self) -> str:
        parts = [f"models={list(self.models)}"] if self.models is not None else []
        parts += [f"param_names={list(g)}" for g in self.names]
        parts += [f"param_types={list(g)}" for g in self.types]
        parts += [f"param_ids={list(g)}" for g in self.ids]
        return ", ".join(parts) or "everything"


class ScopedAPI:
    """An API bound to a session and a :class:`Scope` (``compute``, ``results``)."""

    def __init__(self, session: Any, scope: Scope | None = None) -> None:
        self._session = session
        self._scope = scope if scope is not None else Scope()

    def _scope_ids(self) -> list[str]:
        return self._scope.model_ids(self._session.store)

    @staticmethod
    def _fields(fields: tuple[Any, ...], call: str) -> tuple[str, ...]:
        """Field names as given one by one (``call("a", "b")``) or in one list, checked."""
        if len(fields) == 1 and isinstance(fields[0], (list, tuple)):
            fields = tuple(fields[0])
        for f in fields:
            if not isinstance(f, str):
                raise InvalidArgumentError(f"{call}() takes field names, as {call}('a', 'b') "
                                           f"or {call}(['a', 'b']); got {f!r}.")
        return fields
