"""``diffract demo``: a real (small) training run, tracked as ``diffract track`` tracks one.

1. Trains an MLP (64 -> 192 -> 192 -> 192 -> 10) with Adam on labels from a random
   teacher network, for 600 steps: a linear learning-rate warm-up, then a cosine decay.
   One event is planted: for steps 375-379 the learning rate of ``fc2`` alone is 100
   times what it should be (a misconfigured parameter group). A checkpoint (torch file,
   ``step-NNNN.pt``) is saved every 50 steps from step 100: 11 checkpoints.
2. Tracks them into a durable store (``<out>/store``) exactly as ``diffract track
   <out>/run --store <out>/store --report <out>/report.html`` does: every metric per
   checkpoint, the alignment of each with its predecessor and with the first, the layers
   that moved most, and the sudden changes, among which the event (at step 400, the first
   checkpoint after it, in ``fc2``) is the one most metrics flag.
3. Prints the last checkpoint's per-layer table, writes its plots, and says where
   everything went and how to go on (a new checkpoint is one more ``diffract track``).

Only public API is used: the same steps work from a notebook.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["EVENT", "run_demo", "train_run"]

#: Per-layer metrics the demo tracks when installed (the WeightWatcher-like set).
METRICS = ("pl_alpha", "alpha_weighted", "stable_rank", "log_norm", "spectral_norm",
           "mp_softrank", "num_spikes")
#: The planted event: the learning rate of ``layer`` times ``factor`` for ``steps``;
#: ``seen_at`` is the first checkpoint after it.
EVENT = {"layer": "fc2.weight", "steps": (375, 380), "factor": 100.0, "seen_at": 400}
#: Training length, the first checkpoint, the checkpoint interval, the warm-up.
STEPS, FIRST, EVERY, WARMUP = 600, 100, 50, 50
#: A file in a demo's folder that marks it as the demo's.
MARKER = ".diffract-demo"
#: What a demo writes (``checkpoints`` by earlier versions): a rerun replaces these.
OUTPUTS = (MARKER, "run", "store", "plots", "report.html", "checkpoints")


def train_run(folder: Path, seed: int = 0, width: int = 192) -> list[tuple[Path, float]]:
    """Train the model described in the module docstring, saving a checkpoint every
    :data:`EVERY` steps from :data:`FIRST`; returns (file, training loss then)."""
    from collections import OrderedDict

    import torch

    threads = torch.get_num_threads()
    # One thread: these small products gain nothing from two, and on a loaded machine
    # torch's threads wait on each other (600 steps: 2.9 s on one, 35 s on two at load 3)
    torch.set_num_threads(1)
    try:
        return _train(torch, OrderedDict, folder, seed, width)
    finally:
        torch.set_num_threads(threads)


def _train(torch: Any, OrderedDict: Any, folder: Path, seed: int,
           width: int) -> list[tuple[Path, float]]:
    torch.manual_seed(seed)
    teacher = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(),
                                  torch.nn.Linear(128, 10))
    model = torch.nn.Sequential(OrderedDict([
        ("fc1", torch.nn.Linear(64, width)), ("act1", torch.nn.ReLU()),
        ("fc2", torch.nn.Linear(width, width)), ("act2", torch.nn.ReLU()),
        ("fc3", torch.nn.Linear(width, width)), ("act3", torch.nn.ReLU()),
        ("out", torch.nn.Linear(width, 10))]))
    groups = [{"params": list(module.parameters()), "name": f"{name}.weight"}
              for name, module in model.named_children() if list(module.parameters())]
    base_lr = 3e-3
    optimizer = torch.optim.Adam(groups, lr=base_lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    loss = math.nan
    first, last = EVENT["steps"]
    for step in range(STEPS + 1):
        if step >= FIRST and step % EVERY == 0:
            path = folder / f"step-{step:04d}.pt"
            torch.save(model.state_dict(), path)
            saved.append((path, loss))
        if step == STEPS:
            break
        lr = base_lr * min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        for group in optimizer.param_groups:
            spiked = group["name"] == EVENT["layer"] and first <= step < last
            group["lr"] = lr * (EVENT["factor"] if spiked else 1.0)
        x = torch.randn(256, 64)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        optimizer.zero_grad()
        out = loss_fn(model(x), y)
        out.backward()
        optimizer.step()
        loss = float(out.detach())
    return saved


def _fresh(out: Path) -> None:
    """Make ``out`` the demo's: new, empty, or an earlier demo's (whose outputs, and only
    they, are replaced). A folder holding anything else is refused: nothing is lost."""
    if out.exists() and not out.is_dir():
        from diffract_report._inputs import UsageError

        raise UsageError(f"{out} is a file: give --out a new or empty folder.")
    if out.exists():
        others = sorted(p.name for p in out.iterdir() if p.name not in OUTPUTS)
        if others:
            from diffract_report._inputs import UsageError

            raise UsageError(f"{out} holds files that are not an earlier demo's "
                             f"({', '.join(others[:3])}): give --out a new or empty folder.")
        for name in OUTPUTS:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by diffract demo; a rerun replaces this folder\n")


def run_demo(out: str | Path = "diffract-demo", print_fn: Any = print) -> dict[str, Any]:
    """Run the demo, writing under ``out``; returns the flagged changes, the metrics and
    the paths written."""
    import argparse

    from diffract.session import Session
    from diffract_report import report, viz
    from diffract_report.summary import summarize, summary_lines
    from diffract_report.track import configure_track, sudden, track

    started = time.perf_counter()
    out = Path(out)
    _fresh(out)
    checkpoints = train_run(out / "run")
    first, last = EVENT["steps"]
    print_fn(f"Diffract demo: trained a 4-layer MLP for {STEPS} steps in "
             f"{time.perf_counter() - started:.1f} s (learning-rate warm-up over {WARMUP} "
             f"steps, then cosine decay; loss {checkpoints[0][1]:.3f} at step {FIRST}, "
             f"{checkpoints[-1][1]:.3f} at step {STEPS}).\nThe planted event: for steps "
             f"{first}-{last - 1} the learning rate of {EVENT['layer']} was "
             f"{EVENT['factor']:g}x too high. {len(checkpoints)} checkpoints in "
             f"{out / 'run'}.\n")
    with Session(profile="ram") as probe:
        known = set(probe.compute.list_available_metrics())
    metrics = [m for m in METRICS if m in known] or ["frob_norm"]
    parser = argparse.ArgumentParser()
    configure_track(parser)
    args = parser.parse_args([str(out / "run"), "--store", str(out / "store"), "--metrics",
                              ",".join(metrics), "--report", str(out / "report.html"),
                              "--quiet"])
    print_fn(f"$ diffract track {out / 'run'} --store {out / 'store'} --report "
             f"{out / 'report.html'}")
    code = track(args, say=print_fn)
    flagged = []
    written: list[Path] = [out / "report.html"]
    with Session(profile="local", path=out / "store") as session:
        for field in metrics:
            flagged += [(step, column, field) for step, column, _, _ in
                        sudden(session.results.trajectory(field), args.mad)]
        final = session.models.ordered()[-1]
        rows = session.results.export_metrics(*metrics)[final]
        shapes = {p.name: p.shape for p in session.models.params(final)}
        table = [[name, "x".join(map(str, shapes[name])), *(row.get(m) for m in metrics)]
                 for name, row in rows.items() if len(shapes[name]) >= 2]
        print_fn(f"\n{final}: {len(table)} weight matrices")
        print_fn(report.format_table(["parameter", "shape", *metrics], table))
        for record in summarize(session, [final]):  # why a value is undefined, as analyze
            if record["layers"]:
                print_fn("\n" + "\n".join(summary_lines(record)))
        try:
            written += viz.plot_model(session, final, out / "plots")
        except Exception as exc:  # noqa: BLE001 - plots are optional
            print_fn(f"(no plots: {exc})")
    print_fn(f"\nDone in {time.perf_counter() - started:.1f} s. Wrote:")
    print_fn(f"  {out / 'run'}/  ({len(checkpoints)} checkpoints)")
    print_fn(f"  {out / 'store'}/  (every metric of every checkpoint; reopen it with "
             f"Session(profile='local', path=...))")
    plots = [p for p in written if p.suffix == ".png"]
    if plots:
        print_fn(f"  {out / 'plots'}/  ({len(plots)} PNG plots of {final})")
    print_fn(f"  {out / 'report.html'}  (open it in a browser; it works offline)")
    print_fn(f"Next: a new checkpoint in {out / 'run'} is one more `diffract track "
             f"{out / 'run'} --store {out / 'store'}` (only it is computed); in Python, "
             "session.results.trajectory('stable_rank') is the steps x layers table.")
    return {"flagged": flagged, "metrics": metrics, "written": written, "exit": code}
