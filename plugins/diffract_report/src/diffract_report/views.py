"""Readings of parameter views (heads, experts...): what each rule split, a field
summarised over each parameter's views, heads ranked by how much they moved.

Views are parameters named ``<parent>[<label>]`` with metadata ``view_of`` and ``view``
(diffractml-views adds them); everything here reads stored results only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from diffract_report.summary import grouped, median

__all__ = ["head_grid", "head_moves", "rank_heads", "split_lines", "undefined_reasons",
           "view_params", "view_summary"]


def view_params(session: Any, model_id: str) -> list[Any]:
    """The parameters and views of ``model_id`` in ``session``'s scope (a filtered view's
    own: ``--layers`` keeps the views of the layers it keeps, not the others')."""
    root = getattr(session, "session", session)
    scope = getattr(session, "scope", None)
    return scope.params(root.store, model_id) if scope is not None else \
        root.models.params(model_id)


def split_lines(session: Any, model_id: str) -> list[str]:
    """One line per view rule: how many parameters it split, and their names with the
    layer numbers folded (``model.layers.*.self_attn.q_proj.weight``)."""
    params = view_params(session, model_id)
    stored = [p for p in params if p.parent is None]
    by_rule: dict[str, dict[str, int]] = {}
    for p in params:
        if p.parent is not None:
            rule = p.meta_dict.get("view_rule", "?")
            by_rule.setdefault(rule, {}).setdefault(p.parent, 0)
            by_rule[rule][p.parent] += 1
    lines = []
    for rule, parents in sorted(by_rule.items()):
        shapes = sorted({re.sub(r"\.\d+\.", ".*.", name) for name in parents})
        lines.append(f"{model_id}: {rule} split {len(parents)} of {len(stored)} parameters "
                     f"into {sum(parents.values())} views ({', '.join(shapes[:6])}"
                     f"{', ...' if len(shapes) > 6 else ''})")
    return lines


def view_summary(session: Any, model_id: str, field: str) -> list[dict[str, Any]]:
    """Per parameter with views: its number of views, how many hold a number in
    ``field`` (``defined``), its mean, median, min and max over them (NaN where none
    does), and the labels of the views at the min and the max (``head=3``; the first
    where several tie)."""
    rows = session.results.export_metrics(field).get(model_id, {})
    groups: dict[str, list[tuple[float, str]]] = {}
    counts: dict[str, int] = {}
    for p in view_params(session, model_id):
        if p.parent is None:
            continue
        value = rows.get(p.name, {}).get(field)
        groups.setdefault(p.parent, [])
        counts[p.parent] = counts.get(p.parent, 0) + 1
        if isinstance(value, (int, float, np.number)) and math.isfinite(value):
            groups[p.parent].append((float(value), p.name[len(p.parent) + 1:-1]))
    out = []
    for parent, pairs in groups.items():
        v = np.asarray([value for value, _ in pairs])
        stats = ((float(v.mean()), median(v), float(v.min()), float(v.max()),
                  pairs[int(np.argmin(v))][1], pairs[int(np.argmax(v))][1])
                 if v.size else (math.nan,) * 4 + ("", ""))
        out.append(dict(zip(("parameter", "views", "defined", "mean", "median", "min", "max",
                             "min_view", "max_view"),
                            (parent, counts[parent], len(v), *stats), strict=True)))
    return out


def undefined_reasons(session: Any, model_id: str, field: str) -> list[tuple[int, str]]:
    """Why ``field`` is undefined or was skipped on views of ``model_id``: (count,
    reason) pairs, most frequent first, the reasons grouped by their text with each
    view's own name taken out and the range of each number that varies shown."""
    root = getattr(session, "session", session)
    producer = root.registry.producer(field)
    if producer is None:
        return []
    views = {f"{model_id}/{p.name}": p.name for p in view_params(session, model_id)
             if p.parent is not None}
    reasons = []
    for note in session.results.export_notes():
        name = views.get(note["unit"])
        if name is not None and note["kernel"] == producer.name \
                and note["kind"] in ("undefined", "skipped"):
            reasons.append(note["reason"].replace(name, "<view>"))
    return [(n, r) for r, n in grouped(reasons).items()]


def _head(label: str) -> int | None:
    found = re.search(r"(?:^|,)head=(\d+)$", label)
    return int(found.group(1)) if found else None


def head_grid(session: Any, model_id: str, field: str) -> tuple[list[str], list[int], Any]:
    """(parameters, head numbers, matrix parameter x head of ``field``; NaN where a
    head has none) over the head views; fused parts are rows of their own
    (``c_attn.weight[part=q]``)."""
    rows = session.results.export_metrics(field).get(model_id, {})
    cells: dict[tuple[str, int], float] = {}
    order: list[str] = []
    for p in view_params(session, model_id):
        label = p.meta_dict.get("view", "")
        head = _head(label)
        if p.parent is None or head is None:
            continue
        part = re.search(r"part=(\w+)", label)
        row = f"{p.parent}[part={part.group(1)}]" if part else p.parent
        if row not in order:
            order.append(row)
        value = rows.get(p.name, {}).get(field)
        cells[(row, head)] = float(value) if isinstance(value, (int, float)) else math.nan
    heads = sorted({h for _, h in cells})
    matrix = np.full((len(order), len(heads)), np.nan)
    for (row, head), value in cells.items():
        matrix[order.index(row), heads.index(head)] = value
    return order, heads, matrix


#: A head's change is read on both sides of its matrix: what it writes (the left
#: singular subspace) and what it reads (the right one). See docs/alignment.md.
SIDES = ("l_subspace_overlap", "r_subspace_overlap")


def rank_heads(session: Any, pair: Sequence[str], fields: Sequence[str],
               by: Sequence[str] | str = SIDES) -> list[dict[str, Any]]:
    """The head views of a compared pair, most changed first: ranked by
    ``change = 1 - min(by)``, the share of the head's top singular subspace that moved on
    the side that moved most (by default its output side, ``l_subspace_overlap``, and its
    input side, ``r_subspace_overlap``: a q/k/v head's own output space barely moves when
    what it attends to does, an output projection's input space when what it writes
    does), with ``fields`` beside it. A side not computed is left out of the minimum;
    heads with neither are left out."""
    a, b = pair
    sides = [by] if isinstance(by, str) else list(by)
    wanted = list(dict.fromkeys([*sides, *fields]))
    records = session.results.export_aggregates(*wanted, export_format="list")
    table: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["models"] == f"{a},{b}" and r["param"] and "[" in r["param"] \
                and _head(r["param"].rsplit("[", 1)[1].rstrip("]")) is not None \
                and np.ndim(r["value"]) == 0:
            table.setdefault(r["param"], {})[r["field"]] = float(r["value"])
    ranked = []
    for name, values in table.items():
        overlaps = [values[s] for s in sides if math.isfinite(values.get(s, math.nan))]
        if overlaps:
            ranked.append({"head": name, "change": 1.0 - min(overlaps), **values})
    return sorted(ranked, key=lambda r: -r["change"])


def head_moves(session: Any, by: Sequence[str] | str = SIDES) -> list[dict[str, Any]]:
    """Over a tracked run: every head's change between each checkpoint and the one
    before it (``1 - min(by)``, as :func:`rank_heads` ranks a pair), with the later
    checkpoint's step; the largest changes first. Pairs without ``by`` give nothing."""
    root = getattr(session, "session", session)
    ids = root.models.ordered(session.model_ids)
    steps = {m: s.get("step") for m, s in root.models.steps().items()}
    moves = []
    for before, after in zip(ids, ids[1:], strict=False):
        for r in rank_heads(session, (before, after), (), by):
            moves.append({"step": steps.get(after), "from_step": steps.get(before),
                          "checkpoint": after, "head": r["head"], "change": r["change"]})
    return sorted(moves, key=lambda r: -r["change"])
