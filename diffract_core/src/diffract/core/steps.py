"""Checkpoints as a time axis: a model's training step (and tokens seen, epoch, label).

The step is parsed from the checkpoint's name by default: the file's stem, then each
folder above it, up to three levels (``step-1000``, ``step1000``, ``step_1000``,
``checkpoint-1000``, ``global_step1000``, ``iter_0001000``, ``ckpt-1000``; ``epoch_05``
gives epoch 5, which orders like a step when there is none), or, for an in-memory model,
from its id; a Hugging Face ``trainer_state.json`` beside the weights (``global_step``,
``epoch``, ``num_input_tokens_seen``) wins over the name, and what the caller passes
(``models.add(..., step=)``, ``--step-from REGEX``) wins over both. Models are ordered by
step where they have one (:func:`order`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from diffract.core.sources import url_scheme

__all__ = ["PATTERNS", "Step", "order", "parse_name", "read_step"]

#: Name patterns, searched in each name component: (kind, regex with one number group).
PATTERNS = (
    ("step", r"(?:^|[^a-z])(?:global[_-]?step|step|checkpoint|ckpt|iter(?:ation)?)[_-]?(\d+)"),
    ("epoch", r"(?:^|[^a-z])epoch[_-]?(\d+)"),
)

#: What a model's step record holds.
Step = dict[str, Any]


def parse_name(name: str) -> Step:
    """``{"step": n}`` or ``{"epoch": n}`` from one name, or ``{}``."""
    low = name.lower()
    for kind, pattern in PATTERNS:
        found = re.search(pattern, low)
        if found:
            return {kind: int(found.group(1))}
    return {}


def _from_path(path: Path) -> Step:
    parts = [path.stem if path.is_file() else path.name, *(p.name for p in path.parents)][:4]
    for part in parts:
        found = parse_name(part)
        if found:
            return found
    return {}


def _trainer_state(path: Path) -> Step:
    from diffract.core.sources import inside, read_json_file
    from diffract.errors import ModelSourceError

    state = (path if path.is_dir() else path.parent) / "trainer_state.json"
    if not state.is_file():
        return {}
    data = read_json_file(inside(state.parent, state.name))  # a bad one fails, saying why
    if not isinstance(data, dict):
        raise ModelSourceError(f"{str(state)!r} holds no JSON object; fix or remove it (the "
                               "step then comes from the folder's name)", model_id=None)
    out: Step = {}
    for key, field, kinds in (("step", "global_step", int), ("epoch", "epoch", (int, float)),
                              ("tokens", "num_input_tokens_seen", int)):
        if isinstance(data.get(field), kinds) and not isinstance(data[field], bool):
            out[key] = data[field]
    return out


def read_step(source: Any, model_id: str, given: Mapping[str, Any],
              step_from: str | None = None) -> Step:
    """The step record of a model: ``given`` (step, tokens, epoch, label), over a match
    of ``step_from`` (a regex with one group, searched in the path or id), over
    ``trainer_state.json``, over the name."""
    text = str(source) if isinstance(source, (str, Path)) else model_id
    record: Step = {}
    if isinstance(source, (str, Path)):
        path = Path(source)
        record.update(_from_path(path))
        record.update({} if url_scheme(text) else _trainer_state(path))
    else:
        record.update(parse_name(model_id))
    if step_from is not None:
        from diffract.core.scope import name_pattern

        found = name_pattern(step_from, "step_from").search(text)
        if found is None or not found.groups():
            raise ValueError(f"step_from {step_from!r} finds no step (a regex group) in "
                             f"{text!r}")
        record["step"] = int(found.group(1))
    record.update({k: v for k, v in given.items() if v is not None})
    if "step" not in record and "epoch" in record:
        record["step"] = record["epoch"]
    return record


def order(model_ids: Sequence[str], steps: Mapping[str, Step]) -> list[str]:
    """Models with a step by step (ties keep their order), then the others as given."""
    stepped = [m for m in model_ids if steps.get(m, {}).get("step") is not None]
    others = [m for m in model_ids if m not in stepped]
    return sorted(stepped, key=lambda m: steps[m]["step"]) + others
