"""A torch optimizer's parameter groups split per module, and put back as they were.

A schedule that sets a hyperparameter per module needs each module's parameters in a
group of their own. :class:`Split` moves them out of the user's groups into groups
appended after them (one per module and user group, each starting as a copy of the user
group's hyperparameters) and remembers where everything was, so that :meth:`Split.restore`
gives back the groups exactly as they were, in their order. The optimizer's state is keyed
by parameter and is not touched. A learning-rate scheduler built before the split steps
the user's groups only (it zips its base values with the groups), and :meth:`Split.apply`
derives each module's group from its user group's current value times the module's
factor, so the user's schedule stays the scale. The optimizer's ``state_dict`` keeps the
user's layout (the module groups folded back), so its checkpoints load into the optimizer
without the schedule, and ``load_state_dict`` takes such a checkpoint into the split
optimizer.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from diffract.errors import InvalidArgumentError

__all__ = ["Split", "schedulers", "torch_optimizer"]

#: Keys of a param group that list its parameters (torch 2.6+ keeps their names beside).
_LISTS = ("params", "param_names")


def torch_optimizer(optimizer: Any) -> list[Any]:
    """The optimizers from ``optimizer`` in to the innermost ``torch.optim.Optimizer`` (the
    one whose step hooks run: accelerate's and Lightning's wrappers keep theirs as
    ``.optimizer``), outermost first; or an InvalidArgumentError."""
    import torch

    chain = [optimizer]
    while hasattr(chain[-1], "optimizer") and len(chain) < 5:
        chain.append(chain[-1].optimizer)
    while chain and not isinstance(chain[-1], torch.optim.Optimizer):
        chain.pop()
    if not chain or not isinstance(getattr(chain[-1], "param_groups", None), list):
        raise InvalidArgumentError(
            f"a schedule sets per-module values in a torch.optim.Optimizer's param groups; "
            f"{type(optimizer).__name__} is none (nor wraps one as .optimizer). Pass the "
            "optimizer the training loop steps.")
    return chain


#: A learning-rate scheduler's lists with one entry per param group (torch's schedulers).
_PER_GROUP = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs")
#: A scheduler's methods a split replaces on the instance, while it lasts.
_PATCHED = ("state_dict", "load_state_dict")


def schedulers(chain: Sequence[Any]) -> list[Any]:
    """The torch learning-rate schedulers built on any optimizer of ``chain`` (found from
    what refers to them: a scheduler built before the split zips its per-group lists with
    the groups, strictly, and must grow with them)."""
    import gc

    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    found: list[Any] = []
    for optimizer in chain:
        for ref in gc.get_referrers(optimizer):
            owners = gc.get_referrers(ref) if isinstance(ref, dict) else [ref]
            found += [o for o in owners if isinstance(o, (LRScheduler, ReduceLROnPlateau))
                      and not any(o is f for f in found)]
    return found


class Split:
    """``optimizer``'s groups with some modules' parameters in groups of their own;
    ``key`` is the hyperparameter a schedule sets (``"lr"``, ``"weight_decay"``)."""

    def __init__(self, chain: Sequence[Any], key: str) -> None:
        self.optimizer = optimizer = chain[-1]
        self.key = key
        self._before = len(optimizer.param_groups)
        self._schedulers = schedulers(chain)
        #: (the module's group, the user group it came from, the module's name)
        self.derived: list[tuple[dict[str, Any], dict[str, Any], str]] = []
        self._original: dict[int, dict[str, list[Any]]] = {}  # id(user group) -> its lists
        self._hooks = [optimizer.register_state_dict_post_hook(self._saving),
                       optimizer.register_load_state_dict_pre_hook(self._loading),
                       optimizer.register_load_state_dict_post_hook(self._loaded)]
        self._positions: dict[int, int] = {}  # id(group) -> its place, while loading
        self._told = False

    def holders(self, params: Sequence[Any]) -> list[dict[str, Any]]:
        """The user groups holding any of ``params``."""
        ids = {id(p) for p in params}
        return [g for g in self.optimizer.param_groups if any(id(p) in ids for p in g["params"])]

    def split(self, modules: Mapping[str, Sequence[Any]]) -> list[str]:
        """Move each module's parameters (those the optimizer holds) to groups of their
        own; the modules that got one, in order."""
        moved_modules = []
        for module, params in modules.items():
            for origin in self.holders(params):
                ids = {id(p) for p in params}
                lists = self._original.setdefault(
                    id(origin), {k: list(origin[k]) for k in _LISTS if k in origin})
                group = {k: v for k, v in origin.items() if k not in _LISTS}
                keep = [id(p) not in ids for p in origin["params"]]
                for key in lists:
                    group[key] = [v for v, k in zip(origin[key], keep, strict=True) if not k]
                    origin[key] = [v for v, k in zip(origin[key], keep, strict=True) if k]
                self.optimizer.param_groups.append(group)
                self.derived.append((group, origin, module))
                if module not in moved_modules:
                    moved_modules.append(module)
        self._grow()
        return moved_modules

    def _grow(self) -> None:
        """Each scheduler's per-group lists given an entry per module group, its user
        group's; its checkpoints keep the user's layout, as the optimizer's."""
        for scheduler in self._schedulers:
            self._grow_one(scheduler)
            saving, loading = scheduler.state_dict, scheduler.load_state_dict

            def state_dict(saving: Any = saving) -> dict[str, Any]:
                return {k: v[:self._before] if k in _PER_GROUP and isinstance(v, list) else v
                        for k, v in saving().items() if k not in _PATCHED}

            def load_state_dict(state: dict[str, Any], loading: Any = loading,
                                scheduler: Any = scheduler) -> None:
                loading(state)
                self._grow_one(scheduler)

            scheduler.state_dict, scheduler.load_state_dict = state_dict, load_state_dict

    def _grow_one(self, scheduler: Any) -> None:
        positions = {id(g): i for i, g in enumerate(self.optimizer.param_groups)}
        origins = [positions[id(origin)] for _, origin, _ in self.derived]
        for name in _PER_GROUP:
            value = getattr(scheduler, name, None)
            if isinstance(value, list) and len(value) == self._before:
                value.extend(value[i] for i in origins)

    def apply(self, factors: Mapping[str, float]) -> None:
        """Each module's group: its user group's hyperparameters as they are now (the
        user's scheduler moves them), ``key`` times the module's factor."""
        for group, origin, module in self.derived:
            for k, v in origin.items():
                if k not in _LISTS:
                    group[k] = v
            value = origin[self.key] * factors.get(module, 1.0)
            if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
                if not self._told:  # never a NaN, infinite or negative rate
                    self._told = True
                    warnings.warn(f"the schedule's {self.key} for {module} came out {value!r} "
                                  f"({origin[self.key]!r} x {factors.get(module)!r}); the "
                                  "user's value is kept", RuntimeWarning, stacklevel=2)
                value = origin[self.key]
            group[self.key] = value

    def restore(self) -> None:
        """The groups as they were before :meth:`split`, in their order; hooks removed."""
        derived = {id(g) for g, _, _ in self.derived}
        groups = self.optimizer.param_groups
        groups[:] = [g for g in groups if id(g) not in derived]
        for group in groups:
            group.update(self._original.get(id(group), {}))
        for scheduler in self._schedulers:
            for name in _PER_GROUP:
                value = getattr(scheduler, name, None)
                if isinstance(value, list):
                    del value[self._before:]
            for name in _PATCHED:
                scheduler.__dict__.pop(name, None)
        self.derived, self._original = [], {}
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- checkpoints in the user's layout -----------------------------------------------
    def _user_layout(self) -> tuple[list[int], list[list[Any]]]:
        """The user groups' positions and their parameters as the user gave them."""
        derived = {id(g) for g, _, _ in self.derived}
        groups = self.optimizer.param_groups
        keep = [i for i, g in enumerate(groups) if id(g) not in derived]
        return keep, [self._original.get(id(groups[i]), groups[i])["params"] for i in keep]

    def _saving(self, optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict()`` as the optimizer without the split would write it."""
        if not self.derived:
            return state_dict
        index = {id(p): i for i, p in enumerate(
            p for g in optimizer.param_groups for p in g["params"])}  # torch's own order
        keep, layout = self._user_layout()
        groups, state, n = [], {}, 0
        for i, params in zip(keep, layout, strict=True):
            group = dict(state_dict["param_groups"][i])
            names = self._original.get(id(optimizer.param_groups[i]), {}).get("param_names")
            if names is not None:
                group["param_names"] = list(names)
            group["params"] = []
            for p in params:
                if index[id(p)] in state_dict["state"]:
                    state[n] = state_dict["state"][index[id(p)]]
                group["params"].append(n)
                n += 1
            groups.append(group)
        return {**state_dict, "state": state, "param_groups": groups}

    def _loading(self, optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A ``state_dict`` in the user's layout, laid out as the split optimizer is (one
        in the split layout, or one that fits neither, is left to torch)."""
        self._positions = {id(g): i for i, g in enumerate(optimizer.param_groups)}
        keep, layout = self._user_layout()
        saved = state_dict.get("param_groups", [])
        if not self.derived or len(saved) != len(keep) or any(
                len(s["params"]) != len(p) for s, p in zip(saved, layout, strict=True)):
            return state_dict
        where = {}  # id(param) -> (its saved index, the saved group it belongs to)
        for s, params in zip(saved, layout, strict=True):
            where.update((id(p), (i, s)) for p, i in zip(params, s["params"], strict=True))
        groups, state, n = [], {}, 0
        for position, group in enumerate(optimizer.param_groups):
            first = where[id(group["params"][0])][1] if group["params"] else \
                saved[keep.index(position)]  # an emptied user group
            out = {k: v for k, v in first.items() if k not in _LISTS}
            if "param_names" in group:
                out["param_names"] = list(group["param_names"])
            out["params"] = []
            for p in group["params"]:
                old = where[id(p)][0]
                if old in state_dict["state"]:
                    state[n] = state_dict["state"][old]
                out["params"].append(n)
                n += 1
            groups.append(out)
        return {**state_dict, "state": state, "param_groups": groups}

    def _loaded(self, optimizer: Any) -> None:
        """After ``load_state_dict``: torch put new dicts in place of the groups, so the
        module groups and their user groups are found again by their places."""
        where, self._positions = self._positions, {}
        groups = optimizer.param_groups
        if not where or len(groups) != len(where):
            return
        self.derived = [(groups[where[id(g)]], groups[where[id(o)]], m)
                        for g, o, m in self.derived]
        self._original = {id(groups[where[k]]): v for k, v in self._original.items()}
