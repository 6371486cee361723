"""The published alpha-driven schedules, on Diffract's engine: TempBalance (per-module
learning rates), AlphaDecay (per-module weight decay) and layer-wise learning rates.

All three read each module's heavy-tailedness as Hill's estimator on the top half of its
spectrum (``pl_alpha_hill``, the authors' ``pl_fitting='median'``: with the eigenvalues
ascending, ``i = floor(N / 2)``, ``alpha = 1 + (N - i) / sum_{j >= i} ln(lambda_j /
lambda_i)``; the two agree whenever the spectrum has no zero eigenvalue, where theirs takes
the log of 0) and map it linearly onto a range of multiples of the user's value (the
authors' ``tb_linear_map``): over the analysed modules,

    factor_m = low + (alpha_m - min alpha) / (max alpha - min alpha) * (high - low)

so the module with the lightest tail (highest alpha) gets ``high`` and the heaviest
``low`` (TempBalance's ``assign_func`` also takes the authors' other mappings). A
module's ``lr`` (or ``weight_decay``) is then its user group's current value times its
factor: the user's value, and any scheduler that moves it, stay the scale.

Each schedule owns a :class:`~diffract_training.Monitor` that computes the alphas in the
background (so they equal ``diffract analyze`` of the same weights), analyses the weights
training starts from when it is attached (the authors' first assignment), and hands new
factors to the loop at the first :meth:`step` after an analysis finishes. Modules whose
alpha is undefined keep their factor; with all alphas equal every module gets the middle
of the range (the authors' ``np.interp`` would give all of them ``high``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from diffract.errors import InvalidArgumentError
from diffract_training._assign import ASSIGN, factors
from diffract_training._groups import Split, torch_optimizer
from diffract_training._setup import checkpoint_names, fsdp1_units, global_step, unwrapped
from diffract_training.monitor import Monitor

__all__ = ["AlphaDecay", "LayerwiseLR", "TempBalance", "check_schedules", "restore_states",
           "saved_states"]

#: The estimator every schedule maps.
METRIC = "pl_alpha_hill"
#: The largest factor a schedule sets (a rate a million times the user's is no schedule).
_MOST = 1e6


class _Schedule:
    """What the three schedules share; see the module's docstring."""

    key: ClassVar[str] = "lr"
    #: torch.nn module classes analysed (``Conv1D``: transformers' GPT-2 linear layer).
    types: ClassVar[tuple[str, ...]] = ("Linear", "Conv2d", "Conv1D")
    low_name: ClassVar[str] = "lr_min_ratio"
    high_name: ClassVar[str] = "lr_max_ratio"

    def __init__(self, model: Any, optimizer: Any, *, every: int, low: float, high: float,
                 remove_first: bool, remove_last: bool, min_eigenvalues: int,
                 batchnorm: bool, ramp: int = 0, pinned: Sequence[str] = (),
                 store: Any = None, background: bool = True, batchnorm_type: str = "name",
                 layernorm: bool = False, assign: str = "tb_linear_map") -> None:
        self._check(every, low, high, remove_first, remove_last, min_eigenvalues, batchnorm,
                    ramp, pinned, background, batchnorm_type, layernorm, assign)
        self.every, self.low, self.high, self.ramp = every, float(low), float(high), ramp
        self.remove_first, self.remove_last = remove_first, remove_last
        self.min_eigenvalues, self.batchnorm = min_eigenvalues, batchnorm
        self.batchnorm_type, self.layernorm, self.assign = batchnorm_type, layernorm, assign
        self._pinned = tuple(pinned)
        self._store, self._background = store, background
        self.monitor: Monitor | None = None
        self._splits: list[Split] = []
        self._hooks: list[Any] = []
        self.modules: list[str] = []  # the modules whose values this schedule sets
        self.analysed: list[str] = []  # the modules whose alphas set the range
        #: module -> (step, alpha) of the latest analysis that defined it
        self.alphas: dict[str, tuple[int, float]] = {}
        self._from: dict[str, float] = {}
        self._weights: dict[str, str] = {}  # analysed module -> its weight's logged name
        #: modules whose alphas only raise the range's top -> their weights' logged names
        self._tops: dict[str, str] = {}
        self._to: dict[str, float] = {}
        self._since = self._now = 0
        if model is not None or optimizer is not None:
            if model is None or optimizer is None:
                raise InvalidArgumentError(
                    f"{type(self).__name__} takes a model and its optimizer together (or "
                    "neither, for a callback's schedules=[...], which hands them over).")
            self.attach(model, optimizer)

    def _check(self, every: Any, low: Any, high: Any, remove_first: Any, remove_last: Any,
               min_eigenvalues: Any, batchnorm: Any, ramp: Any, pinned: Any,
               background: Any, batchnorm_type: Any, layernorm: Any,
               assign: Any) -> None:
        def whole(value: Any, least: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= least

        problems = []
        if not whole(every, 1):
            problems.append(f"every takes the steps between recomputations (a whole number "
                            f"of at least 1), got {every!r}")
        ratios = [(self.low_name, low), (self.high_name, high)]
        for name, value in ratios:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and 0 <= value <= _MOST):
                problems.append(f"{name} takes a multiple from 0 to {_MOST:g}, got {value!r}")
        if not problems and high < low:
            problems.append(f"{self.high_name} ({high!r}) is below {self.low_name} ({low!r})")
        if not whole(min_eigenvalues, 0):
            problems.append(f"min_eigenvalues takes a whole number of at least 0, got "
                            f"{min_eigenvalues!r}")
        if not whole(ramp, 0):
            problems.append(f"ramp takes a whole number of steps of at least 0, got {ramp!r}")
        elif whole(every, 1) and ramp > every:
            problems.append(f"ramp ({ramp}) is longer than every ({every}): the values would "
                            "be recomputed before they reached the last ones")
        problems += [f"{name} takes True or False, got {value!r}" for name, value in (
            ("remove_first", remove_first), ("remove_last", remove_last),
            ("batchnorm", batchnorm), ("background", background), ("layernorm", layernorm))
            if not isinstance(value, bool)]
        if batchnorm_type not in ("name", "order"):
            problems.append("batchnorm_type takes 'name' (a BatchNorm2d follows the conv "
                            "its name names, bn -> conv) or 'order' (the Conv2d just before "
                            f"it), got {batchnorm_type!r}")
        if assign not in ASSIGN:
            problems.append(f"assign_func takes one of {', '.join(ASSIGN)}, got {assign!r}")
        if isinstance(pinned, str) or not all(isinstance(p, str) and p for p in pinned):
            problems.append(f"the pinned names take a list of non-empty names, got {pinned!r}")
        if problems:
            raise InvalidArgumentError(f"{type(self).__name__}: " + "; ".join(problems) + ".")

    # -- set-up ------------------------------------------------------------------------
    def attach(self, model: Any, optimizer: Any, step: int = 0) -> None:
        """Schedule ``model``'s modules in ``optimizer`` (one torch optimizer, a wrapper of
        one, or a list of them: Muon for the matrices and AdamW for the rest), starting
        at ``step``: the groups are split, the weights analysed and the first factors set
        before this returns. Every problem is an InvalidArgumentError, before training."""

        if self.monitor is not None and not self.monitor.closed:
            raise InvalidArgumentError(f"this {type(self).__name__} is attached already: "
                                       "close() it first.")
        step = global_step(step)
        if not hasattr(model, "named_modules"):
            raise InvalidArgumentError(f"{type(self).__name__} schedules a torch module's "
                                       f"modules, got a {type(model).__name__}.")
        if fsdp1_units(model):
            raise InvalidArgumentError(
                f"{type(self).__name__} sets a value per module, and FSDP1 "
                "(FullyShardedDataParallel) hands the optimizer flat parameters that "
                "merge the modules of a unit: shard the model with FSDP2's fully_shard "
                "(torch.distributed.fsdp.fully_shard), which keeps one parameter per "
                "module. A Monitor or callback alone watches an FSDP1 model.")
        units, analysed, pinned, ranging = self._units(model)
        chains = [torch_optimizer(o) for o in (
            optimizer if isinstance(optimizer, (list, tuple)) else [optimizer])]
        optimizers = [chain[-1] for chain in chains]
        self._splits = [Split(chain, self.key) for chain in chains]
        try:
            for split in self._splits:  # checked in every optimizer before any is split
                for origin in split.holders([p for ps in units.values() for p in ps]):
                    if self.key not in origin:
                        raise InvalidArgumentError(
                            f"{type(self).__name__} sets each module's {self.key!r}, which "
                            f"the param groups of {type(split.optimizer).__name__} do not "
                            "have: give it an optimizer that takes one.")
            scheduled: list[str] = []
            for split in self._splits:
                scheduled += [m for m in split.split(units) if m not in scheduled]
            if not scheduled:
                raise InvalidArgumentError(
                    f"{type(self).__name__}: the optimizer holds no parameter of the "
                    f"{len(units)} scheduled modules ({', '.join(list(units)[:3])}...): pass "
                    "the optimizer that trains them.")
            self.modules, self.analysed = scheduled, analysed
            self._pinned_modules = pinned
            renames = checkpoint_names(model)  # the monitor's names are the checkpoint's
            self._weights = {m: renames.get(f"{m}.weight", f"{m}.weight") for m in analysed}
            self._tops = {m: renames.get(f"{m}.weight", f"{m}.weight") for m in ranging}
            self.monitor = Monitor(None, every=self.every, metrics=(METRIC,),
                                   params=[*self._weights.values(), *self._tops.values()],
                                   store=self._store,
                                   histograms=False, background=self._background, final=False)
            self.monitor.role = f"{type(self).__name__}({self._settings()})"
            self.monitor.attach(model)  # under torch.distributed: checked against the others
        except BaseException:
            if self.monitor is not None:
                self.monitor.close()
            self._undo()
            raise
        self.monitor.session.configure("esd", conv="weightwatcher")  # conv_norm 0.5, pooled
        self.monitor.on_values(self._values)
        self._hooks = [o.register_step_pre_hook(self._before_update) for o in optimizers]
        self._now = self._since = step
        self._from, self._to = {}, {}
        # The weights training starts from (every rank takes part under torch.distributed,
        # and every rank gets the same alphas at this same step, so the same factors).
        self.monitor.analyse_now(step)
        self._apply()

    def _settings(self) -> str:
        """What sets this schedule's factors, as the ranks compare it at attach."""
        return (f"{self.low_name}={self.low!r}, {self.high_name}={self.high!r}, "
                f"assign_func={self.assign}, ramp={self.ramp}, "
                f"modules={','.join(self.modules)}")

    def _units(self, model: Any) -> tuple[dict[str, list[Any]], list[str], list[str],
                                          list[str]]:
        """The scheduled modules (name -> the parameters that take its value), the ones
        analysed (in the model's order), the pinned ones, and those whose alphas only
        raise the top of the range."""
        import torch

        found = [(unwrapped(name, model), m) for name, m in model.named_modules()
                 if _is(m, self.types) and isinstance(
                     getattr(m, "weight", None), torch.Tensor) and m.weight.dim() >= 2]
        candidates = list(found)
        if self.remove_first:  # the authors drop the first and last by position, pinned
            candidates = candidates[1:]  # ones included (those keep the user's value)
        if self.remove_last:
            candidates = candidates[:-1]
        pinned = [n for n, _ in candidates if any(p in n for p in self._pinned)]
        analysed = [(n, m) for n, m in candidates if n not in pinned
                    and _eigenvalues(m.weight) >= self.min_eigenvalues]
        # The authors give pinned modules the largest alpha of every module they compute
        # (the small and the dropped ones too), and that sets the top of the range.
        ranging = [n for n, _ in found if pinned and not any(
            p in n for p in self._pinned) and n not in {a for a, _ in analysed}]
        if len(analysed) < 2:
            raise InvalidArgumentError(
                f"{type(self).__name__} balances modules against each other, and "
                f"{len(analysed)} of the model's {len(found)} "
                f"{'/'.join(self.types[:2])} modules remain to be analysed (the first and "
                f"last left out: {self.remove_first}/{self.remove_last}; at least "
                f"{self.min_eigenvalues} eigenvalues: min_eigenvalues): lower "
                "min_eigenvalues, keep the first or last, or pass a model with more.")
        units: dict[str, list[Any]] = {}
        seen: set[int] = set()
        for name, module in [*analysed, *[(n, m) for n, m in found if n in pinned]]:
            units[name] = [p for p in module.parameters(recurse=False) if id(p) not in seen]
            seen.update(id(p) for p in units[name])
        for module, leader in self._followers(model):
            if leader in units:
                units[leader] += [p for p in module.parameters(recurse=False)
                                  if id(p) not in seen]
                seen.update(id(p) for p in units[leader])
        return units, [n for n, _ in analysed], pinned, ranging

    def _followers(self, model: Any) -> list[tuple[Any, str]]:
        """(module, the module whose value it takes), as the authors' ``bn_to_conv`` and
        ``ln_to_linear``: with ``batchnorm`` a ``BatchNorm2d`` follows the conv its name
        names (``batchnorm_type='name'``: ``bn`` -> ``conv``) or the ``Conv2d`` registered
        just before it (``'order'``); with ``layernorm`` a ``LayerNorm`` follows the linear
        layer registered just before it. One registered after another of its kind, or
        before any leader, follows none (the authors' ``'order'`` fails on the latter)."""
        import torch

        named = [(unwrapped(name, model), m) for name, m in model.named_modules()]
        out: list[tuple[Any, str]] = []
        if self.batchnorm and self.batchnorm_type == "name":
            out += [(m, n.replace("bn", "conv")) for n, m in named
                    if isinstance(m, torch.nn.BatchNorm2d)]
        elif self.batchnorm:
            out += _after(named, torch.nn.BatchNorm2d, ("Conv2d",))
        if self.layernorm:
            out += _after(named, torch.nn.LayerNorm, ("Linear", "Conv1D"))
        return out

    def _undo(self) -> None:
        for split in self._splits:
            split.restore()
        self._splits = []
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    # -- the loop's side ---------------------------------------------------------------
    def step(self, global_step_: int) -> None:
        """Call once per optimizer step, after it: new factors from a finished analysis
        are applied, and at a cadence point the weights are analysed."""
        if self.monitor is None or self.monitor.closed:
            raise InvalidArgumentError(f"this {type(self).__name__} has no model: pass "
                                       "model and optimizer, or attach() them.")
        self._now = global_step(global_step_)
        self.monitor.step(self._now)
        self._apply()

    def _values(self, step: int, values: Mapping[str, Mapping[str, float]]) -> None:
        """A finished analysis (on the training thread): its alphas mapped to factors."""
        found = values.get(METRIC, {})
        alphas = {m: found[w] for m, w in self._weights.items()
                  if math.isfinite(found.get(w, math.nan))}
        self.alphas.update((m, (step, a)) for m, a in alphas.items())
        tops = [found[w] for w in self._tops.values() if math.isfinite(found.get(w, math.nan))]
        targets = self.mapping(alphas, top=max(tops, default=None))
        if not targets:
            return
        self._from = self.factors
        self._to = {**self._to, **targets,
                    **dict.fromkeys(self._pinned_modules, self.high)}
        self._since = self._now

    def mapping(self, alphas: Mapping[str, float],
                top: float | None = None) -> dict[str, float]:
        """The factor of each module of ``alphas`` (the module docstring's equation, the
        authors' ``tb_linear_map``, or TempBalance's ``assign_func``: see
        ``diffract_training._assign``); empty with fewer than two alphas. ``top``: an alpha
        the range reaches up to besides those of ``alphas`` (LayerwiseLR's pinned
        modules: the largest alpha of the modules it does not balance)."""
        return factors(self.assign, alphas, self.low, self.high, top)

    @property
    def factors(self) -> dict[str, float]:
        """Each scheduled module's factor now (1 until the first analysis; moving from
        the last factors to the new ones over ``ramp`` steps)."""
        share = 1.0 if self.ramp == 0 else min(1.0, (self._now - self._since) / self.ramp)
        return {m: self._from.get(m, 1.0) + share * (self._to.get(m, self._from.get(m, 1.0))
                                                     - self._from.get(m, 1.0))
                for m in self.modules}

    def _apply(self) -> None:
        factors = self.factors
        for split in self._splits:
            split.apply(factors)

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._apply()  # the user's scheduler may have moved the base since step()

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to carry on with the same factors."""
        return {"from": dict(self._from), "to": dict(self._to), "since": self._since,
                "now": self._now, "alphas": {m: list(v) for m, v in self.alphas.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Carry on from :meth:`state_dict`'s output, checked as the constructor's
        arguments are: every factor a finite number of at least 0 for a module this
        schedule sets, whole steps, finite alphas. On any problem nothing changes."""
        name = f"{type(self).__name__}.load_state_dict"
        keys = ("from", "to", "since", "now", "alphas")
        if not isinstance(state, Mapping) or any(k not in state for k in keys):
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise InvalidArgumentError(f"{name} takes what state_dict() returned (the keys "
                                       f"{', '.join(keys)}), got {got}.")
        problems = []
        factors: dict[str, dict[str, float]] = {}
        for key in ("from", "to"):
            table = state[key]
            if not isinstance(table, Mapping):
                problems.append(f"{key!r} is a {type(table).__name__}, not module -> factor")
                continue
            factors[key] = {}
            for module, value in table.items():
                if module not in self.modules:
                    problems.append(f"{key!r} names {module!r}, which this schedule does not "
                                    "set (a state of another model?)")
                elif isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                        math.isfinite(value) and 0 <= value <= _MOST):
                    problems.append(f"{key!r}[{module!r}] is {value!r}: a factor is a finite "
                                    f"number from 0 to {_MOST:g}")
                else:
                    factors[key][module] = float(value)
        steps = {}
        for key in ("since", "now"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"{key!r} is {value!r}, not a step (a whole number >= 0)")
            steps[key] = value
        alphas = {}
        raw = state["alphas"]
        for module, pair in (raw.items() if isinstance(raw, Mapping) else []):
            try:
                step, alpha = pair
                ok = isinstance(step, int) and step >= 0 and math.isfinite(float(alpha))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(f"'alphas'[{module!r}] is {pair!r}, not (step, finite alpha)")
            else:
                alphas[module] = (int(step), float(alpha))
        if not isinstance(raw, Mapping):
            problems.append(f"'alphas' is a {type(raw).__name__}, not module -> (step, alpha)")
        if problems:
            raise InvalidArgumentError(f"{name}: " + "; ".join(problems) + ". Nothing was "
                                       "loaded.")
        self._from, self._to = factors["from"], factors["to"]
        self._since, self._now = steps["since"], steps["now"]
        self.alphas = alphas
        self._apply()

    def close(self) -> None:
        """Stop analysing and give the optimizer its groups back as they were. Safe to
        call twice; :meth:`attach` again starts over."""
        try:
            if self.monitor is not None:
                self.monitor.close()
        finally:
            self._undo()

    def __enter__(self) -> _Schedule:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def check_schedules(front_end: str, schedules: Any) -> list[Any]:
    """A callback's ``schedules``: a list of TempBalance, AlphaDecay or LayerwiseLR built
    without a model (the callback hands over the trainer's)."""
    if isinstance(schedules, _Schedule) or not isinstance(schedules, (list, tuple)) or not all(
            isinstance(s, _Schedule) for s in schedules):
        raise InvalidArgumentError(
            f"{front_end}: schedules takes a list of TempBalance, AlphaDecay or LayerwiseLR, "
            f"got {schedules!r}.")
    if any(s.monitor is not None for s in schedules):
        raise InvalidArgumentError(
            f"{front_end}: build its schedules without model and optimizer "
            "(TempBalance(every=...)): it hands them the trainer's when training begins.")
    return list(schedules)


def saved_states(schedules: Sequence[_Schedule]) -> dict[str, Any]:
    """What a callback keeps of its schedules in a checkpoint (JSON: floats round-trip)."""
    return {"schedules": [{"kind": type(s).__name__, "state": s.state_dict()}
                          for s in schedules]}


def restore_states(front_end: str, schedules: Sequence[_Schedule], saved: Any,
                   where: str) -> bool:
    """Each schedule carries on from its saved state (after it was attached to the
    resumed run); under torch.distributed every rank takes rank 0's, so that a rank that
    could not read the checkpoint still sets the same factors. False where nothing was
    saved (``saved`` None on rank 0)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and \
            dist.get_world_size() > 1:
        box = [saved]
        dist.broadcast_object_list(box, src=0)
        saved = box[0]
    if saved is None:
        return False
    entries = saved.get("schedules") if isinstance(saved, Mapping) else None
    kinds = [type(s).__name__ for s in schedules]
    if not isinstance(entries, list) or [e.get("kind") if isinstance(e, Mapping) else None
                                         for e in entries] != kinds:
        got = [e.get("kind") for e in entries if isinstance(e, Mapping)] \
            if isinstance(entries, list) else None
        raise InvalidArgumentError(
            f"{front_end}: {where} holds the state of schedules {got}, and this run has "
            f"{kinds}: resume with the schedules of the run that wrote it (or remove "
            "the file to start them over).")
    for schedule, entry in zip(schedules, entries, strict=True):
        schedule.load_state_dict(entry.get("state"))
    return True


def _after(named: list[tuple[str, Any]], follower: type,
           leaders: tuple[str, ...]) -> list[tuple[Any, str]]:
    """Each ``follower`` module with the leader registered just before it, where the
    module of those two kinds just before it is a leader (``named``: the model's
    ``named_modules`` in order)."""
    out: list[tuple[Any, str]] = []
    previous: str | None = None  # the latest leader, None after a follower
    for name, module in named:
        if _is(module, leaders):
            previous = name
        elif isinstance(module, follower):
            if previous is not None:
                out.append((module, previous))
            previous = None
    return out


def _is(module: Any, kinds: tuple[str, ...]) -> bool:
    """Whether ``module`` is of a class named in ``kinds`` or of a subclass of one, as the
    authors' ``isinstance(m, nn.Linear)``: ``nn.MultiheadAttention``'s ``out_proj`` is a
    ``NonDynamicallyQuantizableLinear``, FSDP2's ``fully_shard`` makes ``FSDPLinear``."""
    return any(cls.__name__ in kinds for cls in type(module).__mro__)


def _eigenvalues(weight: Any) -> int:
    """How many eigenvalues the authors' ESD of ``weight`` has (a convolution's kernel
    positions pooled)."""
    shape = tuple(weight.shape)
    return min(shape[:2]) * math.prod(shape[2:])


class TempBalance(_Schedule):
    """Per-module learning rates from alpha: TempBalance (Zhou et al., "Temperature
    Balancing, Layer-wise Weight Analysis, and Neural Network Training", NeurIPS 2023;
    code: YefanZhou/TempBalance, ``tempbalance.py``).

    Every ``every`` steps (the paper: once an epoch, so give the steps of one) each
    ``Linear`` and ``Conv2d`` module's learning rate becomes the user's times a factor in
    ``[lr_min_ratio, lr_max_ratio]``, linear in its alpha (``get_layer_temps``,
    ``tb_linear_map``: ``np.interp(alpha, [min, max], [0.5 lr, 1.5 lr])``); a higher alpha
    (a less trained module) learns faster. As the authors: the first and last such
    modules are left at the user's value (``remove_first_layer``/``remove_last_layer``),
    and any with fewer than 50 eigenvalues (``eigs_thresh``); a module's bias takes its
    weight's rate, a ``BatchNorm2d`` the rate of the conv its name names (``bn`` ->
    ``conv``; ``batchnorm_type='order'``: of the ``Conv2d`` registered just before it), a
    ``LayerNorm`` with ``layernorm=True`` that of the linear layer registered just before
    it; convolutions' spectra are their kernel positions' pooled, scaled by 1/2
    (``conv_norm``). ``assign_func`` picks the authors' other mappings: ``'tb_sqrt'`` and
    ``'tb_log2'`` (factors of mean 1, proportional to sqrt or log2 of alpha; the ratios
    are not read) and ``'tb_step'`` (by rank); see ``diffract_training._assign``."""

    def __init__(self, model: Any = None, optimizer: Any = None, *, every: int,
                 lr_min_ratio: float = 0.5, lr_max_ratio: float = 1.5,
                 remove_first: bool = True, remove_last: bool = True,
                 min_eigenvalues: int = 50, batchnorm: bool = True,
                 batchnorm_type: str = "name", layernorm: bool = False,
                 assign_func: str = "tb_linear_map", store: Any = None,
                 background: bool = True) -> None:
        super().__init__(model, optimizer, every=every, low=lr_min_ratio, high=lr_max_ratio,
                         remove_first=remove_first, remove_last=remove_last,
                         min_eigenvalues=min_eigenvalues, batchnorm=batchnorm,
                         batchnorm_type=batchnorm_type, layernorm=layernorm, store=store,
                         background=background, assign=assign_func)


class AlphaDecay(_Schedule):
    """Per-module weight decay from alpha: AlphaDecay (He et al., 2025; code:
    hed-ucas/AlphaDecay, ``LLaMa-pretraining/WeightDecayUnbalance.py``).

    Every ``every`` steps (the paper's LLaMA runs: 500) each ``Linear`` module's weight
    decay becomes the user's times a factor in ``[wd_min_ratio, wd_max_ratio]`` (the
    LLaMA scripts' 0.6666 and 5), linear in its alpha (``alpha_positively_with_WD``,
    ``tb_linear_map``): a heavy-tailed module (low alpha, one that has learned features)
    is decayed less. The first and last modules are left at the user's value, and those
    with fewer than 50 eigenvalues, as the authors; a group the user gave no decay (a
    no-decay group of biases) keeps none. A ``BatchNorm2d`` takes the decay of the conv
    its name names (``bn`` -> ``conv``), a ``LayerNorm`` with ``layernorm=True`` that of
    the linear layer registered just before it."""

    key = "weight_decay"
    low_name, high_name = "wd_min_ratio", "wd_max_ratio"

    def __init__(self, model: Any = None, optimizer: Any = None, *, every: int = 500,
                 wd_min_ratio: float = 0.6666, wd_max_ratio: float = 5.0,
                 remove_first: bool = True, remove_last: bool = True,
                 min_eigenvalues: int = 50, batchnorm: bool = True, layernorm: bool = False,
                 store: Any = None, background: bool = True) -> None:
        super().__init__(model, optimizer, every=every, low=wd_min_ratio, high=wd_max_ratio,
                         remove_first=remove_first, remove_last=remove_last,
                         min_eigenvalues=min_eigenvalues, batchnorm=batchnorm,
                         layernorm=layernorm, store=store, background=background)


class LayerwiseLR(_Schedule):
    """Layer-wise learning rates from alpha (LLR; "One LR Doesn't Fit All: Heavy-Tail
    Guided Layerwise Learning Rates for LLMs", arXiv 2605.22297; code:
    hed-ucas/Layer-wise-Learning-Rate, ``olmo/LRUnbalance.py``), tested there with AdamW
    and Muon.

    Every ``every`` steps (the README's runs: 100) each ``Linear``, ``Conv2d`` and
    ``Embedding`` module's learning rate becomes the user's times a factor in
    ``[lr_min_ratio, lr_max_ratio]`` (the README's 1 and 5), linear in its alpha
    (``alpha_positively_with_lr``, ``tb_linear_map``), reached linearly over ``ramp``
    steps (``linear_steps``, 50; the authors interpolate the rates themselves, which
    differs from this by the base schedule's own change over those steps). Modules whose
    names hold ``embed`` or ``head`` (``embed_name``/``head_name``) are not analysed and
    take the top of the range, as the authors give them the largest alpha of every module
    they compute: so the alphas of the modules left at the user's value (fewer than 50
    eigenvalues, ``eigs_thresh``, and a first or last one left out) count towards the top
    of the range too, as theirs (with 2 key-value heads ``k_proj``/``v_proj`` are such
    modules). The first and last modules are kept (the configs' ``remove_first_layer:
    False``); left out, they keep the user's value, pinned or not, as the authors'. A
    ``LayerNorm`` with ``layernorm=True`` takes the rate of the linear layer registered
    just before it (LLaMA's and OLMo's RMSNorm is no ``LayerNorm``). With Muon for the
    matrices and AdamW for the rest, pass both optimizers as a list."""

    types = ("Linear", "Conv2d", "Conv1D", "Embedding")

    def __init__(self, model: Any = None, optimizer: Any = None, *, every: int = 100,
                 lr_min_ratio: float = 1.0, lr_max_ratio: float = 5.0, ramp: int = 50,
                 embed_name: str = "embed", head_name: str = "head",
                 remove_first: bool = False, remove_last: bool = False,
                 min_eigenvalues: int = 50, layernorm: bool = False, store: Any = None,
                 background: bool = True) -> None:
        super().__init__(model, optimizer, every=every, low=lr_min_ratio, high=lr_max_ratio,
                         remove_first=remove_first, remove_last=remove_last,
                         min_eigenvalues=min_eigenvalues, batchnorm=False, ramp=ramp,
                         pinned=[embed_name, head_name], store=store, background=background,
                         layernorm=layernorm)
