"""What watching a run's spectra costs the run: one small model trained the same way
without a monitor, with diffract-training's ``Monitor`` at cadences 50, 200 and 1000, and
with what a user does today at the same cadences (save a safetensors checkpoint in the
loop, then ``diffract analyze`` each one), all in one run on the same data.

The model is a small pre-norm transformer (torch's ``TransformerEncoderLayer``; 4
layers, width 256, feed-forward 1024, a 4096-token embedding and head: 26 analysed
matrices, 5.3 M parameters) trained with AdamW on random tokens, batch 16 x 64, on the
CPU. The monitor runs its defaults (``DEFAULT_METRICS``, ESD histograms for a sink) and
writes a ``local`` store, as a run would.

Printed per setting: the wall time of the training loop, its overhead over the run
without a monitor, the analysed and skipped cadence points, and for the monitor the
seconds the loop was held per analysed step (the cadence point plus the copies or wait
before the next optimizer step: ``Monitor.blocked``) against the mean training step.
For save + analyze, the saving is inside the loop and ``diffract analyze`` runs after
it, one process per checkpoint, as a user would run it; both are counted.
"monitor, inline" is ``background=False`` (the loop waits for each analysis), for
comparison. The run without a monitor goes first and after each cadence's runs; the
overheads are against the median of those, and their spread is printed (this VM's
run-to-run noise is several percent).

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


def train(steps: int, on_step) -> float:
    """Seconds of ``steps`` optimizer steps (``on_step(step, model)`` after each)."""
    import torch

    model = build(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (64, BATCH, SEQ + 1), generator=gen)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        batch = data[step % len(data)]
        logits = model(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        on_step(step, model)
    on_step(None, model)  # the end of training (a monitor closes here)
    return time.perf_counter() - start


def with_monitor(steps: int, every: int, folder: Path,
                 background: bool = True) -> tuple[float, object]:
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


def with_saves(steps: int, every: int, folder: Path) -> tuple[float, float, int]:
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
    base = statistics.median(bases)
    step_ms = 1000 * base / args.steps
    print(f"# without a monitor, before and after each cadence's runs: "
          f"{', '.join(f'{b:.1f}' for b in bases)} s; overheads against their median "
          f"{base:.1f} s (a step {step_ms:.1f} ms); the spread of these is the noise")
    for kind, every, loop, *rest in results:
        if kind.startswith("monitor"):
            monitor = rest[0]
            held = list(monitor.blocked.values())
            mean_ms = 1000 * sum(held) / max(len(held), 1)
            rows.append([kind, every, f"{loop:.1f}", f"{100 * (loop - base) / base:+.1f}%",
                         f"{len(monitor.analysed)} / {len(monitor.skipped)}",
                         f"{mean_ms:.2f} ms = {100 * mean_ms / step_ms:.2f}% of a step",
                         "-"])
        else:
            analyse, count = rest
            total = loop + analyse
            rows.append([kind, every, f"{total:.1f}", f"{100 * (total - base) / base:+.1f}%",
                         f"{count} / 0", f"{1000 * (loop - base) / count:.1f} ms saving "
                         "(the loop's own time)", f"{analyse:.1f} s analyze"])
    table(["setting", "every", "total s", "overhead", "analysed / skipped",
           "loop held per analysed step", "after the loop"], rows)
    if hasattr(os, "getloadavg"):
        print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
