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

``--direct N`` measures instead what one background analysis costs the loop, thread
against process: N pairs of runs at cadence 50 (each beside a run without a monitor of the
same length, the two taking turns first) for the ``Monitor`` (a thread) and for a
prototype worker process (the analysed weights copied into shared memory at the cadence
point, a spawned process at nice 19 analysing them with the monitor's metrics in its own
interpreter). The prototype is a measurement, not the product: it copies the analysed
weights whole.

    python benchmarks/bench_training.py --direct 4
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
STEPS_DIRECT = int(os.environ.get("BENCH_TRAINING_STEPS", "400"))


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


def _worker(conn, shared, metrics) -> None:
    """The prototype's process: analyse the shared weights whenever told a step."""
    os.nice(19)
    from diffract import Session

    with Session() as session:
        while (step := conn.recv()) is not None:
            model_id = f"step-{step}"
            session.models.add(shared, model_id, copy_weights=False)
            session.compute.apply(*metrics, "esd", errors="record", progress=False)
            conn.send(len(session.results.export_metrics(*metrics)[model_id]))
            session.models.erase(model_id)


def with_process(steps: int, every: int) -> tuple[Run, int, int, float]:
    """The prototype worker process: (run, analysed, skipped, seconds the loop copied)."""
    import multiprocessing

    import torch

    from diffract_training import DEFAULT_METRICS

    box: dict = {"busy": False, "analysed": 0, "skipped": 0, "copy": 0.0}

    def on_step(step, model):
        if "proc" not in box:
            ctx = multiprocessing.get_context("spawn")
            box["shared"] = {n: p.detach().clone().share_memory_()
                             for n, p in model.named_parameters() if p.dim() >= 2}
            box["live"] = dict(model.named_parameters())
            box["conn"], child = ctx.Pipe()
            box["proc"] = ctx.Process(target=_worker, args=(child, box["shared"],
                                                            DEFAULT_METRICS))
            box["proc"].start()
        conn = box["conn"]
        if box["busy"] and conn.poll():
            conn.recv()
            box["busy"], box["analysed"] = False, box["analysed"] + 1
        if step is None:
            if box["busy"]:
                conn.recv()
                box["analysed"] += 1
            conn.send(None)
            box["proc"].join()
        elif step % every == 0:
            if box["busy"]:
                box["skipped"] += 1
                return
            began = time.perf_counter()
            with torch.no_grad():
                for name, target in box["shared"].items():
                    target.copy_(box["live"][name])
            box["copy"] += time.perf_counter() - began
            conn.send(step)
            box["busy"] = True

    run = train(steps, on_step)
    return run, box["analysed"], box["skipped"], box["copy"]


def direct(pairs: int) -> None:
    """Thread against process: the loop's cost of one background analysis at cadence 50."""
    steps, every = STEPS_DIRECT, 50
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        for kind in ("thread (Monitor)", "process (prototype)"):
            costs, counts = [], []
            for i in range(pairs):
                def watched(i=i, kind=kind):
                    if kind.startswith("thread"):
                        run, monitor = with_monitor(steps, every, Path(tmp) / f"{i}")
                        return run, len(monitor.analysed)
                    run, analysed, _, _ = with_process(steps, every)
                    return run, analysed
                if i % 2:
                    (run, analysed), base = watched(), train(steps, lambda s, m: None)
                else:
                    base = train(steps, lambda s, m: None)
                    run, analysed = watched()
                costs.append((run.total - base.total) / max(analysed, 1))
                counts.append(analysed)
            rows.append([kind, " ".join(f"{c:+.2f}" for c in costs),
                         f"{statistics.median(costs):+.2f} s", " ".join(map(str, counts))])
    table(["background analysis in", "loop cost per analysis, each pair (s)", "median",
           "analysed per run"], rows)


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
    parser.add_argument("--direct", type=int, metavar="PAIRS",
                        help="the cost of one background analysis, thread against process")
    args = parser.parse_args()
    import torch

    header("bench_training: the cost of a monitor inside a training loop",
           ["torch", "diffract-core", "diffract-training"])
    if args.direct:
        direct(args.direct)
        if hasattr(os, "getloadavg"):
            print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
        return
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
