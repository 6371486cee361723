"""``diffract demo``: analyse a small torch model with every installed kernel.

Builds a small network (embedding, two linear blocks, a convolution, a norm), adds it
and a perturbed copy (a second "checkpoint") to a ``ram`` session, applies every field
the installed kernels offer (per parameter and per model on both; pairwise on the
pair) and prints the scalar results as tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from diffract.core.compute._enums import KernelApplyLevel

__all__ = ["build_demo_model", "run_demo"]


#: Columns shown first when their fields are installed; at most MAX_COLUMNS in all.
PREFERRED = (
    "frob_norm", "stable_rank", "hard_rank", "log_norm", "pl_alpha", "pl_xmin", "pl_n_tail",
    "pl_ks_distance", "pl_pvalue", "alpha_weighted", "num_spikes",
)
MAX_COLUMNS = 12


def build_demo_model(seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Embedding(512, 128),
        torch.nn.Linear(128, 384),
        torch.nn.GELU(),
        torch.nn.Linear(384, 128),
        torch.nn.LayerNorm(128),
        torch.nn.Unflatten(-1, (8, 16)),
        torch.nn.Conv1d(8, 32, kernel_size=3),
    )


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.4g}"
    return str(value)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (hasattr(value, "shape") and value.shape == ())


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table with aligned columns."""
    cells = [list(header)] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_demo(print_fn: Any = print) -> dict[str, Any]:
    """Run the demo; returns the exported metrics and aggregates."""
    import torch

    from diffract.session import Session

    model = build_demo_model()
    later = build_demo_model()
    with torch.no_grad():
        for p in later.parameters():
            p.add_(0.01 * torch.randn_like(p))

    started = time.perf_counter()
    with Session(profile="ram") as session:
        session.models.add(model, model_id="step0")
        session.models.add(later, model_id="step1")
        kernels = session.registry.kernels()
        local = [
            f for k in kernels if k.apply_level is not KernelApplyLevel.CROSS_MODEL
            for f in k.produce_fields
        ]
        pairwise = [
            f for k in kernels if k.apply_level is KernelApplyLevel.CROSS_MODEL
            for f in k.produce_fields
        ]
        session.compute.apply(*local, errors="record")
        if pairwise:
            session.filter(model_ids=["step0", "step1"]).compute.apply(*pairwise, errors="record")
        metrics = session.results.export_metrics()
        aggregates = session.results.export_aggregates()
        notes = session.results.export_notes()
    elapsed = time.perf_counter() - started

    per_param = metrics["step0"]
    scalar_fields = sorted(
        {f for row in per_param.values() for f, v in row.items() if _is_scalar(v)}
    )
    shown = [f for f in PREFERRED if f in scalar_fields]
    shown += [f for f in scalar_fields if f not in shown][: max(0, MAX_COLUMNS - len(shown))]
    rows = [[name] + [row.get(f, "") for f in shown] for name, row in per_param.items()]
    print_fn(f"Diffract demo: {len(per_param)} parameters of model 'step0', "
             f"{len(kernels)} kernels installed, {elapsed:.2f} s\n")
    print_fn(format_table(["parameter", *shown], rows))
    hidden = sorted(set(scalar_fields) - set(shown))
    if hidden:
        print_fn(f"(also computed: {', '.join(hidden)}; see session.results.export_metrics())")
    agg_rows = [[n, v] for n, v in aggregates.items() if _is_scalar(v)]
    if agg_rows:
        print_fn("\nAggregates")
        print_fn(format_table(["name", "value"], agg_rows))
    undefined = [n for n in notes if n["kind"] != "skipped"]
    skipped = len(notes) - len(undefined)
    if skipped:
        print_fn(f"\n{skipped} unit(s) skipped by kernel restrictions (1-D parameters).")
    if undefined:
        print_fn(f"{len(undefined)} value(s) undefined or failed, e.g.:")
        for note in undefined[:5]:
            print_fn(f"  {note['kernel']} on {note['unit']}: {note['kind']}: {note['reason']}")
    return {"metrics": metrics, "aggregates": aggregates, "notes": notes}
