"""Each schedule's factors against its authors' mapping, transcribed here from how their
code builds a table of every module it computes (YefanZhou/TempBalance's
``tempbalance.py``, hed-ucas/AlphaDecay's ``WeightDecayUnbalance.py``,
hed-ucas/Layer-wise-Learning-Rate's ``olmo/LRUnbalance.py``) and run on the same alphas:
every module's learning rate or weight decay in the optimizer, for each option that
changes the mapping. The transcription is in this file's words, step by step as the
authors' table goes: rows in the model's order; LayerwiseLR's embedding and head rows take
the largest alpha of all rows (the small ones and those dropped next included); the first
and last rows dropped by position; rows under ``eigs_thresh`` eigenvalues dropped;
``np.interp`` over what remains; every module not in the table at the user's value."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from diffract_training import AlphaDecay, LayerwiseLR, TempBalance  # noqa: E402
from tests.training.test_schedules import _engine_alphas, _matrices  # noqa: E402
from tests.training.test_schedules import _llama as schedules_llama  # noqa: E402

LR, WD = 1e-3, 0.1


def _llama():
    """test_schedules' tiny Llama (2 key-value heads of 16: k_proj and v_proj have 32
    eigenvalues, under eigs_thresh), its matrices' alphas spread apart as training does."""
    model = schedules_llama()
    with torch.no_grad():
        for i, p in enumerate(p for p in model.parameters() if p.dim() == 2):
            p.mul_(torch.linspace(0.2, 1 + 0.3 * (i % 5), p.shape[1]) ** (1 + i % 3))
    return model


def _alphas(model) -> dict[str, float]:
    """pl_alpha_hill of every matrix (diffract analyze's), by module."""
    table = _engine_alphas(_matrices(model))
    return {n.removesuffix(".weight"): a for n, a in table.items()}


def authors_mapping(rows, *, low, high, remove_first, remove_last, eigs_thresh,
                    pinned=(), assign="tb_linear_map") -> dict[str, float]:
    """``rows``: (module, alpha, eigenvalue count) of every module the authors compute,
    in the model's order. Returns module -> factor for the modules their table keeps."""
    table = [{"name": n, "alpha": a, "eigs": e} for n, a, e in rows]
    marked = [r for r in table if any(p in r["name"] for p in pinned)]
    for r in marked:  # LRUnbalance: alpha and eigs_num -1, then each column's maximum
        r["alpha"], r["eigs"] = -1.0, -1
    if marked:
        top_alpha = max(r["alpha"] for r in table)
        top_eigs = max(r["eigs"] for r in table)
        for r in marked:
            r["alpha"], r["eigs"] = top_alpha, top_eigs
    if remove_first:
        table = table[1:]
    if remove_last:
        table = table[:-1]
    table = [r for r in table if r["eigs"] >= eigs_thresh]
    scores = np.array([r["alpha"] for r in table])
    n = len(scores)
    if assign == "tb_linear_map":
        factors = np.interp(scores, [scores.min(), scores.max()], [low, high])
    elif assign in ("tb_sqrt", "tb_log2"):  # TempBalance's, over the user's rate 1
        g = np.sqrt if assign == "tb_sqrt" else np.log2
        factors = g(scores) / np.sum(g(scores)) * n
    else:  # tb_step: the i-th of the argsort gets low + (high - low) i / n, put back
        order = np.argsort(scores)
        steps = [low + (high - low) * i / n for i in range(n)]
        factors = [f for _, f in sorted(zip(order, steps, strict=True), key=lambda t: t[0])]
    return {r["name"]: float(f) for r, f in zip(table, factors, strict=True)}


def _rows(model, types, alphas):
    rows = []
    for name, module in model.named_modules():
        if type(module).__name__ in types:
            shape = tuple(module.weight.shape)
            rows.append((name, alphas[name], min(shape[:2]) * math.prod(shape[2:])))
    return rows


def _value_of(optimizer, param, key):
    return next(g[key] for g in optimizer.param_groups if any(p is param for p in g["params"]))


CASES = [
    ("TempBalance", {}, ),
    ("TempBalance", {"remove_first": False, "remove_last": False}),
    ("TempBalance", {"min_eigenvalues": 20, "lr_min_ratio": 0.25, "lr_max_ratio": 2.0}),
    ("TempBalance", {"assign_func": "tb_sqrt"}),
    ("TempBalance", {"assign_func": "tb_log2", "remove_first": False}),
    ("TempBalance", {"assign_func": "tb_step", "lr_min_ratio": 0.25, "lr_max_ratio": 2.0}),
    ("AlphaDecay", {}),
    ("AlphaDecay", {"remove_first": False, "min_eigenvalues": 20}),
    ("LayerwiseLR", {}),  # k_proj/v_proj raise the top though not balanced
    ("LayerwiseLR", {"remove_first": True, "remove_last": True}),  # embed/head at 1x
    ("LayerwiseLR", {"remove_first": True}),  # the head alone pinned
    ("LayerwiseLR", {"min_eigenvalues": 20}),
    ("LayerwiseLR", {"head_name": "no_such_module", "lr_max_ratio": 3.0}),  # head balanced
]


@pytest.mark.parametrize(("kind", "options"), CASES,
                         ids=[f"{k}-{'-'.join(o) or 'defaults'}" for k, o in CASES])
def test_factors_are_the_authors_mapping_of_the_same_alphas(kind, options):
    model = _llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    alphas = _alphas(model)
    schedule_type = {"TempBalance": TempBalance, "AlphaDecay": AlphaDecay,
                     "LayerwiseLR": LayerwiseLR}[kind]
    extra = {"ramp": 0} if kind == "LayerwiseLR" else {}
    schedule = schedule_type(model, optimizer, every=10, background=False, **extra,
                             **options)
    try:
        assert {m: a for m, (_, a) in schedule.alphas.items()} == {
            m: alphas[m] for m in schedule.analysed}
        low, high = schedule.low, schedule.high
        pinned = ((options.get("embed_name", "embed"), options.get("head_name", "head"))
                  if kind == "LayerwiseLR" else ())
        want = authors_mapping(
            _rows(model, schedule.types, alphas), low=low, high=high, pinned=pinned,
            remove_first=options.get("remove_first", kind != "LayerwiseLR"),
            remove_last=options.get("remove_last", kind != "LayerwiseLR"),
            eigs_thresh=options.get("min_eigenvalues", 50),
            assign=options.get("assign_func", "tb_linear_map"))
        assert len(set(want.values())) > 2  # a mapping, not one value for all
        key, base = ("weight_decay", WD) if kind == "AlphaDecay" else ("lr", LR)
        for name, module in model.named_modules():
            if type(module).__name__ not in schedule.types:
                continue
            got = _value_of(optimizer, module.weight, key) / base
            assert got == pytest.approx(want.get(name, 1.0), rel=1e-12, abs=1e-15), name
    finally:
        schedule.close()
