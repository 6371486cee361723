"""What watching a run's spectra costs the run: one small model trained the same way
without a monitor, with diffract-training's ``Monitor`` at cadences 50, 200 and 1000, and
with what a user does today at the same cadences (save a safetensors checkpoint in the
loop, then ``diffract analyze`` each one), all in one run on the same data.

The model is a small pre-norm transformer (torch's ``TransformerEncoderLayer``; 4
layers, width 256, feed-forward 1024, a 4096-token embedding and head: 26 analysed
matrices, 5.3 M parameters) trained with AdamW on random tokens, batch 16 x 64, on the
CPU. The monitor runs its defaults (``DEFAULT_METRICS``, ESD histograms for a sink) and
writes a ``local`` store, as a run would.

Printed per setting: the wall time of the training loop, its median step, its overhead,
the analysed and skipped cadence points, and for the monitor the time the loop was held
per analysed step (the cadence point plus the copies or wait before the next optimizer
step, and inline the whole analysis: ``Monitor.blocked``) against the median step. The
overhead is measured inside each run: its time beyond its own median step times the
steps (the analysis's cost shows as slower steps while it runs), because this VM's speed
drifts by 10% and more between runs minutes apart, more than the costs measured here;
the runs without a monitor give the floor of that estimate.
For save + analyze, the saving is inside the loop and ``diffract analyze`` runs after
it, one process per checkpoint, as a user would run it; both are counted.
"monitor, inline" is ``background=False`` (the loop waits for each analysis), for
comparison. The run without a monitor goes first and last.

    python benchmarks/bench_training.py [--steps 2000] [--cadences 50 200 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

VOCAB, WIDTH, LAYERS, FF, BATCH, SEQ = 1024, 128, 4, 512, 16, 32


def build(torch):
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(WIDTH, 4, FF, dropout=0.0, batch_first=True,
                                                 norm_first=True) for _ in range(LAYERS))
            self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(ids.shape[1])
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            return self.head(x)

    return Net()


def train(steps: int, on_step) -> Run:
    """``steps`` optimizer steps (``on_step(step, model)`` after each), timed one by one."""
    import torch

    model = build(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (64, BATCH, SEQ + 1), generator=gen)
    start = time.perf_counter()
    each = []
    for step in range(1, steps + 1):
        began = time.perf_counter()
        batch = data[step % len(data)]
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        on_step(step, model)
        each.append(time.perf_counter() - began)
    on_step(None, model)  # the end of training (a monitor closes here)
    return Run(time.perf_counter() - start, each)


class Run:
    """A training run's wall time and its steps' times. ``excess``: the run's time
    beyond its own median step times the steps, as a share of that: what the slow steps
    cost, measured inside the run, so the drift of this VM's speed between runs (10% and
    more over minutes) cancels. A run without a monitor gives the floor of it."""

    def __init__(self, total: float, each: list[float]) -> None:
        self.total, self.each = total, each
        self.median = statistics.median(each)

    def excess(self, extra: float = 0.0) -> float:
        typical = self.median * len(self.each)
        return (self.total + extra - typical) / typical


def with_monitor(steps: int, every: int, folder: Path,
                 background: bool = True) -> tuple[Run, object]:
    from diffract_training import Monitor

    box: dict[str, Monitor] = {}

    def on_step(step, model):
        if "m" not in box:
            box["m"] = Monitor(model, every=every, background=background,
                               store=folder / f"m{every}-{background}.diffract",
                               log=lambda values, at: None)
        if step is None:
            box["m"].close()
        else:
            box["m"].step(step)

    return train(steps, on_step), box["m"]


def with_saves(steps: int, every: int, folder: Path) -> tuple[Run, float, int]:
    from safetensors.torch import save_file

    saved: list[Path] = []

    def on_step(step, model):
        if step is not None and step % every == 0:
            path = folder / f"s{every}-{step}.safetensors"
            save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()},
                      str(path))
            saved.append(path)

    loop = train(steps, on_step)
    start = time.perf_counter()
    for path in saved:
        subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path), "-q"],
                       check=True, capture_output=True)
    return loop, time.perf_counter() - start, len(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--cadences", type=int, nargs="+", default=[50, 200, 1000])
    args = parser.parse_args()
    import torch

    header("bench_training: the cost of a monitor inside a training loop",
           ["torch", "diffract-core", "diffract-training"])
    print(f"# model: {LAYERS} layers, width {WIDTH}, ff {FF}, vocabulary {VOCAB}; batch "
          f"{BATCH} x {SEQ}; AdamW; {args.steps} steps; torch threads "
          f"{torch.get_num_threads()}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        folder = Path(tmp)
        bases = [train(args.steps, lambda step, model: None)]
        results = []
        for every in args.cadences:
            results.append(("monitor", every, *with_monitor(args.steps, every, folder)))
            if every < max(args.cadences):
                results.append(("monitor, inline", every,
                                *with_monitor(args.steps, every, folder, background=False)))
            results.append(("save + analyze", every, *with_saves(args.steps, every, folder)))
        bases.append(train(args.steps, lambda step, model: None))
    step_ms = 1000 * statistics.median(run.median for run in bases)
    print(f"# without a monitor: {', '.join(f'{r.total:.1f}' for r in bases)} s (first and "
          f"last), a step {step_ms:.1f} ms; their excess over their own median step: "
          f"{', '.join(f'{100 * r.excess():+.1f}%' for r in bases)} (the floor: noise)")
    for kind, every, run, *rest in results:
        ms = 1000 * run.median
        if kind.startswith("monitor"):
            monitor = rest[0]
            held = list(monitor.blocked.values())
            mean_ms = 1000 * sum(held) / max(len(held), 1)
            rows.append([kind, every, f"{run.total:.1f}", f"{ms:.1f}",
                         f"{100 * run.excess():+.1f}%",
                         f"{len(monitor.analysed)} / {len(monitor.skipped)}",
                         f"{mean_ms:.2f} ms = {100 * mean_ms / ms:.2f}% of a step", "-"])
        else:
            analyse, count = rest
            rows.append([kind, every, f"{run.total + analyse:.1f}", f"{ms:.1f}",
                         f"{100 * run.excess(analyse):+.1f}%", f"{count} / 0",
                         f"{1000 * (run.total - run.median * len(run.each)) / count:.1f} ms "
                         "(saving, and slow steps)", f"{analyse:.1f} s analyze"])
    table(["setting", "every", "total s", "median step ms", "overhead", "analysed / skipped",
           "loop held per analysed step", "after the loop"], rows)
    if hasattr(os, "getloadavg"):
        print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
