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

    python benchmarks/bench_training.py [--cadences 50 200 1000] [--repeats 2]
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
    """A training run's wall time, its steps' times and their median."""

    def __init__(self, total: float, each: list[float]) -> None:
        self.total, self.each = total, each
        self.median = statistics.median(each)


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
    parser.add_argument("--cadences", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import torch

    header("bench_training: the cost of a monitor inside a training loop",
           ["torch", "diffract-core", "diffract-training"])
    print(f"# model: {LAYERS} layers, width {WIDTH}, ff {FF}, vocabulary {VOCAB}; batch "
          f"{BATCH} x {SEQ}; AdamW; torch threads {torch.get_num_threads()}; each cadence's "
          f"runs {args.repeats} times, in turn, {', '.join(map(str, args.cadences))} -> "
          f"{', '.join(str(length(c)) for c in args.cadences)} steps a run")
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        folder = Path(tmp)
        for every in args.cadences:
            steps = length(every)
            kinds = ["none", "monitor", "monitor, inline", "save + analyze"]
            if every >= 1000:
                kinds.remove("monitor, inline")  # the inline cost is read at 50 and 200
            got: dict[str, list] = {k: [] for k in kinds}
            for repeat in range(args.repeats):
                turn = kinds[repeat % len(kinds):] + kinds[:repeat % len(kinds)]
                for kind in turn:  # each kind first in one repeat: the drift evens out
                    got[kind].append(run_one(kind, steps, every, folder / f"{every}-{repeat}"))
            for kind in kinds[1:]:
                ratios = [total / base[0] - 1 for total, base in
                          zip((g[0] for g in got[kind]), got["none"], strict=True)]
                held, analysed, skipped, extra = got[kind][-1][1:]
                rows.append([kind, every, steps,
                             " ".join(f"{100 * r:+.1f}%" for r in ratios),
                             f"{100 * statistics.median(ratios):+.1f}%",
                             f"{analysed} / {skipped}", held, extra])
            rows.append(["none", every, steps,
                         " ".join(f"{g[0]:.1f}s" for g in got["none"]), "-", "-", "-", "-"])
    table(["setting", "every", "steps", "overhead per repeat", "median", "analysed / skipped",
           "loop held per analysed step", "after the loop"], rows)
    if hasattr(os, "getloadavg"):
        print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


def length(every: int) -> int:
    """Steps of one run at cadence ``every``: at least 400, at least two analyses."""
    return max(400, 2 * every)


def run_one(kind: str, steps: int, every: int, folder: Path) -> tuple:
    """(seconds, loop held, analysed, skipped, after the loop) of one run of ``kind``."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "none":
        return train(steps, lambda step, model: None).total, "-", "-", "-", "-"
    if kind == "save + analyze":
        run, analyse, count = with_saves(steps, every, folder)
        held = (run.total - run.median * len(run.each)) / count
        return (run.total + analyse, f"{1000 * held:.1f} ms (saving, and slow steps)",
                count, 0, f"{analyse:.1f} s analyze")
    run, monitor = with_monitor(steps, every, folder, background=kind == "monitor")
    held = list(monitor.blocked.values())
    mean_ms = 1000 * sum(held) / max(len(held), 1)
    return (run.total, f"{mean_ms:.2f} ms = {100 * mean_ms / (1000 * run.median):.2f}% of a "
            "step", len(monitor.analysed), len(monitor.skipped), "-")


if __name__ == "__main__":
    main()
