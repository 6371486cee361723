"""``diffract demo``: the main job end to end, on the CPU in well under a minute.

1. Trains a small MLP on a synthetic task (a random teacher network labels Gaussian
   inputs) for a few hundred steps, saving checkpoints along the way (torch files).
2. Analyses every checkpoint with the installed per-layer metrics (the spectral pack's
   WeightWatcher-like set when installed) and prints the last one's table and summary.
3. Compares consecutive checkpoints with the alignment pack when it is installed.
4. Writes the plots and a one-file HTML report, and prints where everything went.

Only the public API is used: the same steps work from a notebook.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["run_demo", "train_checkpoints"]

#: Per-layer metrics the demo computes when installed (the WeightWatcher-like set).
METRICS = ("pl_alpha", "alpha_weighted", "stable_rank", "log_norm", "spectral_norm",
           "mp_softrank", "num_spikes")
#: Pairwise metrics between consecutive checkpoints (alignment pack).
PAIRWISE = ("avg_max_l_agreement", "l_subspace_overlap", "sval_rel_change")
#: Steps at which a checkpoint is saved.
SAVE_AT = (0, 100, 400)


def train_checkpoints(folder: Path, steps: Sequence[int] = SAVE_AT, seed: int = 0,
                      width: int = 256) -> list[tuple[Path, float]]:
    """Train a 4-layer MLP (64 -> width -> width -> width -> 10) with Adam on labels
    from a random teacher, saving the state dict at each of ``steps``; returns (file,
    training loss at that step)."""
    import torch

    torch.manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                  torch.nn.Linear(128, 10))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    loss = float("nan")
    for step in range(max(steps) + 1):
        if step in steps:
            path = folder / f"step{step:04d}.pt"
            torch.save(model.state_dict(), path)
            saved.append((path, loss))
        x = torch.randn(256, 64)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        optimizer.zero_grad()
        out = loss_fn(model(x), y)
        out.backward()
        optimizer.step()
        loss = float(out.detach())
    return saved


def run_demo(out: str | Path = "diffract-demo", print_fn: Any = print) -> dict[str, Any]:
    """Run the demo, writing under ``out``; returns the summaries and the paths written."""
    import warnings

    from diffract.errors import UndefinedValuesWarning
    from diffract.session import Session
    from diffract_report import report, viz

    started = time.perf_counter()
    out = Path(out)
    checkpoints = train_checkpoints(out / "checkpoints")
    trained = time.perf_counter() - started
    print_fn(f"Diffract demo: trained a 4-layer MLP for {SAVE_AT[-1]} steps in {trained:.1f} s "
             f"(loss {checkpoints[1][1]:.3f} at step {SAVE_AT[1]}, {checkpoints[-1][1]:.3f} at "
             f"step {SAVE_AT[-1]}); checkpoints in {out / 'checkpoints'}")
    written: list[Path] = []
    with Session(profile="ram") as session, warnings.catch_warnings():
        warnings.simplefilter("ignore", UndefinedValuesWarning)  # the summary says why
        known = set(session.compute.list_available_metrics())
        metrics = [m for m in METRICS if m in known] or [
            m for m in ("frob_norm", "numel") if m in known]
        pairwise = [m for m in PAIRWISE if m in known]
        ids = []
        for path, _ in checkpoints:
            session.models.add(str(path), model_id=path.stem)
            ids.append(path.stem)
        session.compute.apply(*metrics, errors="record")
        last = ids[-1]
        rows = session.results.export_metrics(*metrics)[last]
        shapes = {p.name: p.shape for p in session.models.params(last)}
        table = [[name, "x".join(map(str, shapes[name])), *(row.get(m) for m in metrics)]
                 for name, row in rows.items() if len(shapes[name]) >= 2]
        print_fn(f"\n{last}: {len(table)} weight matrices")
        print_fn(report.format_table(["parameter", "shape", *metrics], table))
        summaries = report.summarize(session)
        if any(r["layers"] for r in summaries):
            print_fn("\nAlpha across training (WeightWatcher's reading: 2-6 well trained):")
            print_fn(report.format_table(
                ["checkpoint", "alpha mean", "alpha median", "share < 2", "share > 6"],
                [[r["model_id"], r["alpha_mean"], r["alpha_median"],
                  r["share_over_trained"], r["share_under_trained"]] for r in summaries]))
        sections = []
        if pairwise:
            session.compute.apply_pairs(*pairwise, pairs="consecutive", errors="record")
            print_fn("\nHow the layers moved between checkpoints (alignment pack):")
            for field in pairwise:
                layers, pairs, matrix = report.pair_matrix(session, field)
                print_fn(f"{field}:")
                print_fn(report.format_table(["parameter", *pairs],
                                      [[layer, *matrix[i]] for i, layer in enumerate(layers)]))
                try:
                    fig = viz.heatmap_figure(matrix, layers, pairs, field)
                except Exception as exc:  # noqa: BLE001 - no matplotlib: tables only
                    print_fn(f"(no heat map: {exc})")
                    continue
                written.append(viz.save_png(fig, out / "plots" / f"compare_{field}.png"))
                sections.append(f"<h2>{field}</h2>" + report.figure_html(fig, field)
                                + report.html_table(
                                    ["parameter", *pairs],
                                    [[layer, *matrix[i]] for i, layer in enumerate(layers)],
                                    table_id=f"compare-{field}"))
        else:
            print_fn("\n(pip install diffract-kernels-alignment to compare the checkpoints)")
        try:
            written += viz.plot_model(session, last, out / "plots")
        except Exception as exc:  # noqa: BLE001 - plots are optional
            print_fn(f"(no plots: {exc})")
        elapsed = time.perf_counter() - started
        written.append(report.write_html(session, out / "report.html", metrics=metrics,
                                         seconds=elapsed, command="diffract demo",
                                         sections=sections))
    print_fn(f"\nDone in {time.perf_counter() - started:.1f} s. Wrote:")
    print_fn(f"  {out / 'checkpoints'}/  ({len(checkpoints)} checkpoints)")
    plots = [p for p in written if p.suffix == ".png"]
    if plots:
        print_fn(f"  {out / 'plots'}/  ({len(plots)} PNG plots)")
    print_fn(f"  {out / 'report.html'}  (open it in a browser; it works offline)")
    print_fn(f"Next: diffract analyze {checkpoints[-1][0]} --report my-report.html")
    return {"summaries": summaries, "written": written, "metrics": metrics}
