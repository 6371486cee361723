"""What watching a run's spectra costs the run: one small model trained the same way
without a monitor, with diffractml-training's ``Monitor`` at cadences 50, 200 and 1000
(in the background, and inline for comparison), and with what a user does today at the
same cadences (save a safetensors checkpoint in the loop, then ``diffract analyze`` each
one), all in one process on the same data.

The model is a small pre-norm transformer (torch's ``TransformerEncoderLayer``; 4
layers, width 128, feed-forward 512, a 1024-token embedding and head: 18 analysed
matrices, 1.1 M parameters) trained with AdamW on random tokens, batch 16 x 32, on the
CPU. The monitor runs its defaults (``DEFAULT_METRICS``, ESD histograms for a sink) and
writes a ``local`` store, as a run would.

What a cadence point costs is estimated inside each run (``costs``): the excess of the
steps from the cadence point until a few steps after its values came back, over the
median step of the quiet rest of the same window: this VM's speed drifts by 10-30%
between identical runs minutes apart, more than the costs measured; within a window of
a few seconds it drifts far less. The run without a monitor gets the same estimate at
the same steps: its noise. Printed per setting: the
points analysed and skipped, the time the loop was held per analysed step
(``Monitor.blocked``: the cadence point plus the copies or wait before the next
optimizer step; inline, the whole analysis), the cost per analysed point, and the
overhead it makes at that cadence (that cost over ``every`` median steps; for save +
analyze also the ``diffract analyze`` of each checkpoint after the loop, one process per
checkpoint as a user runs it). The whole runs' times are printed too, drift included.

    python benchmarks/bench_training.py [--cadences 50 200 1000] [--repeats 1] [--whole 2]

The in-run estimate sees what a cadence point adds to the steps around it, not a
slowdown of every step (which the monitor once caused on the CPU: see
``diffract.plugins.one_openmp_thread``). So the whole runs are compared too, in fresh
processes, without and with the monitor alternating (``--whole PAIRS`` pairs a cadence,
each process timing its own training loop of max(400, 2 x every) steps, imports
excluded): per pair the ratio of their loop times and of their median steps, the median
over pairs printed as the whole-run overhead. Pairs adjacent in time share most of the
VM's drift; their spread, printed, is what is left of it.

``--direct N`` measures instead what one background analysis costs the loop, thread
against process, with the same in-run estimate at cadence 100, N runs of each: the
``Monitor`` (a thread), a prototype worker process (the analysed weights copied into
shared memory at the cadence point, a spawned process at nice 19 analysing them with the
monitor's metrics in its own interpreter), and no monitor at all (the estimate's noise).
The prototype is a measurement, not the product: it copies the analysed weights whole.

    python benchmarks/bench_training.py --direct 2

``--schedules PAIRS`` runs TempBalance, AlphaDecay and LayerwiseLR at their papers'
cadences on a tiny Llama against the same run without (fresh processes, alternating) and
prints the ratios; ``--held BUSY`` splits the loop's held time per analysed step into its
parts at no extra load and with BUSY busy processes (``benchmarks/_training_more.py``).

    python benchmarks/bench_training.py --schedules 2 --held 16
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _training_more  # noqa: E402
from _common import header, table  # noqa: E402

VOCAB, WIDTH, LAYERS, FF, BATCH, SEQ = 1024, 128, 4, 512, 16, 32
HEADS = 4
#: ``--size 1b``: about 0.94 B parameters (16 layers of width 2048, feed-forward 8192, a
#: 32000-token embedding and head), trained in bfloat16 on a GPU.
SIZES = {"small": (1024, 128, 4, 512, 16, 32, 4), "1b": (32000, 2048, 16, 8192, 4, 512, 16)}
#: Where the model trains, and its dtype (``--device``; bfloat16 for ``--size 1b``).
DEVICE, DTYPE = "cpu", "float32"
STEPS_DIRECT = int(os.environ.get("BENCH_TRAINING_STEPS", "1000"))


#: ``--kinds``: the settings of a run.
KINDS = {"none": "none", "monitor": "monitor", "inline": "monitor, inline",
         "saves": "save + analyze"}


def configure(size: str, device: str) -> None:
    """The model's shape, device and dtype for every run of this process."""
    global VOCAB, WIDTH, LAYERS, FF, BATCH, SEQ, HEADS, DEVICE, DTYPE
    VOCAB, WIDTH, LAYERS, FF, BATCH, SEQ, HEADS = SIZES[size]
    DEVICE, DTYPE = device, "bfloat16" if size == "1b" else "float32"


def build(torch):
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.blocks = torch.nn.ModuleList(
                torch.nn.TransformerEncoderLayer(WIDTH, HEADS, FF, dropout=0.0,
                                                 batch_first=True, norm_first=True)
                for _ in range(LAYERS))
            self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            mask = torch.nn.Transformer.generate_square_subsequent_mask(
                ids.shape[1], device=ids.device, dtype=x.dtype)
            for block in self.blocks:
                x = block(x, src_mask=mask, is_causal=True)
            return self.head(x)

    return Net()


def train(steps: int, on_step) -> Run:
    """``steps`` optimizer steps (``on_step(step, model)`` after each), timed one by one."""
    import torch

    model = build(torch).to(device=DEVICE, dtype=getattr(torch, DTYPE))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (64, BATCH, SEQ + 1), generator=gen).to(DEVICE)
    sync = torch.cuda.synchronize if DEVICE.startswith("cuda") else (lambda: None)
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
        sync()  # a step's time is its device's work too
        each.append(time.perf_counter() - began)
    on_step(None, model)  # the end of training (a monitor closes here)
    return Run(time.perf_counter() - start, each)


class Run:
    """A training run's wall time, its steps' times and their median."""

    def __init__(self, total: float, each: list[float]) -> None:
        self.total, self.each = total, each
        self.median = statistics.median(each)


def with_monitor(steps: int, every: int, folder: Path,
                 background: bool = True) -> tuple[Run, object, dict[int, int]]:
    """A run with a ``Monitor``: (run, monitor, {cadence point: the step at which its
    values reached the sink}), the latter bounding the steps the analysis could slow."""
    from diffract_training import Monitor

    box: dict = {"now": 0, "reached": {}}

    def sink(values, at):
        box["reached"][at] = box["now"]

    def on_step(step, model):
        if "m" not in box:
            box["m"] = Monitor(model, every=every, background=background,
                               store=folder / f"m{every}-{background}.diffract", log=sink)
        if step is None:
            box["m"].close()
        else:
            box["now"] = step
            box["m"].step(step)

    return train(steps, on_step), box["m"], box["reached"]


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


def with_process(steps: int, every: int) -> tuple[Run, dict[int, int], int, float]:
    """The prototype worker process: (run, {analysed point: the step its answer was
    read}, skipped, seconds the loop copied)."""
    import multiprocessing

    import torch

    from diffract_training import DEFAULT_METRICS

    box: dict = {"busy": None, "reached": {}, "skipped": 0, "copy": 0.0}

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
        if box["busy"] is not None and (step is None or conn.poll()):
            conn.recv()
            box["reached"][box["busy"]], box["busy"] = step or steps, None
        if step is None:
            conn.send(None)
            box["proc"].join()
        elif step % every == 0:
            if box["busy"] is not None:
                box["skipped"] += 1
                return
            began = time.perf_counter()
            with torch.no_grad():
                for name, target in box["shared"].items():
                    target.copy_(box["live"][name])
            box["copy"] += time.perf_counter() - began
            conn.send(step)
            box["busy"] = step

    run = train(steps, on_step)
    return run, box["reached"], box["skipped"], box["copy"]


def with_saves(steps: int, every: int, folder: Path) -> tuple[Run, float, int]:
    """Today's way: a safetensors checkpoint saved in the loop at each cadence point,
    then ``diffract analyze`` of each, one process per checkpoint, as a user runs it:
    (run, seconds of the analyses after the loop, checkpoints)."""
    from safetensors.torch import save_file

    saved: list[Path] = []

    def on_step(step, model):
        if step is not None and step % every == 0:
            path = folder / f"s{every}-{step}.safetensors"
            save_file({k: v.detach().cpu().contiguous()
                       for k, v in model.state_dict().items()}, str(path))
            saved.append(path)

    loop = train(steps, on_step)
    start = time.perf_counter()
    for path in saved:
        subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path), "-q"],
                       check=True, capture_output=True)
    return loop, time.perf_counter() - start, len(saved)


#: Steps after an analysis's values came back that still count against it (the last
#: of its slowed steps, caches refilled).
SETTLE = 3


def costs(run: Run, reached: dict[int, int], every: int) -> list[float]:
    """What each cadence point cost the loop, estimated inside the run: the excess of its
    steps, from the cadence point's own step to ``SETTLE`` steps after its values came
    back, over the median step of the rest of the window (at most its second half, at
    least a fifth of it): this VM's speed drifts by 10-30% between runs minutes apart,
    by far less within a window. ``reached`` maps each point to the step its values
    came back (the point itself for an analysis inside the step). A point whose
    analysis left less than a fifth of its window quiet is left out (the caller counts
    them: the cadence is too short for the estimate)."""
    out = []
    for point, back in sorted(reached.items()):
        end = back + SETTLE
        quiet = run.each[max(end, point + every // 2): point + every - 1]  # to the next
        if len(quiet) < every // 5:
            continue
        base = statistics.median(quiet)
        out.append(sum(t - base for t in run.each[point - 1: end]))
    return out


def direct(repeats: int) -> None:
    """Thread against process: what one background analysis costs the loop at cadence
    100, in-run (``costs``), beside the same estimate in a run without a monitor."""
    steps, every = STEPS_DIRECT, 100
    points = {p: p for p in range(every, steps, every)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        got: dict[str, list[float]] = {}
        counts: dict[str, list[int]] = {}
        for i in range(repeats):
            for kind in ("none (placebo)", "thread (Monitor)", "process (prototype)"):
                if kind.startswith("none"):
                    run, reached = train(steps, lambda s, m: None), points
                elif kind.startswith("thread"):
                    run, _, reached = with_monitor(steps, every, Path(tmp) / f"{i}")
                else:
                    run, reached, _, _ = with_process(steps, every)
                got.setdefault(kind, []).extend(costs(run, reached, every))
                counts.setdefault(kind, []).append(len(reached))
        for kind, values in got.items():
            if not values:
                rows.append([kind, "-", "-", 0, " ".join(map(str, counts[kind]))])
                continue
            rows.append([kind, f"{1000 * statistics.median(values):+.0f} ms",
                         f"{1000 * min(values):+.0f}..{1000 * max(values):+.0f}",
                         len(values), " ".join(map(str, counts[kind]))])
    table(["background analysis in", "loop cost per analysis (median)", "range (ms)",
           "points estimated", "analysed per run"], rows)


def whole(pairs: int, every: int, steps: int, size: str, device: str) -> list:
    """``pairs`` runs without and with the monitor at cadence ``every``, alternating, each
    in a fresh process: a row of the whole-run table."""
    got: dict[str, list[dict]] = {"none": [], "monitor": []}
    for pair in range(pairs):
        for kind in ("none", "monitor") if pair % 2 == 0 else ("monitor", "none"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--cadences", str(every),
                 "--steps", str(steps), "--size", size, "--device", device],
                check=True, capture_output=True, text=True).stdout
            got[kind].append(json.loads(out.strip().splitlines()[-1]))
    totals = [m["total"] / n["total"] - 1 for n, m in zip(got["none"], got["monitor"],
                                                          strict=True)]
    medians = [m["median"] / n["median"] - 1 for n, m in zip(got["none"], got["monitor"],
                                                             strict=True)]
    return [every, steps, pairs,
            " ".join(f"{n['total']:.1f}/{m['total']:.1f}s"
                     for n, m in zip(got["none"], got["monitor"], strict=True)),
            " ".join(f"{m['analysed']}/{m['skipped']}" for m in got["monitor"]),
            f"{100 * statistics.median(totals):+.1f}% ({100 * min(totals):+.1f}.."
            f"{100 * max(totals):+.1f})",
            f"{100 * statistics.median(medians):+.1f}% ({100 * min(medians):+.1f}.."
            f"{100 * max(medians):+.1f})"]


def child(kind: str, every: int, steps: int) -> None:
    """One run of ``whole``'s, in this process: its loop's time on the last line, JSON."""
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        if kind == "none":
            run, analysed, skipped = train(steps, lambda step, model: None), 0, 0
        else:
            run, monitor, _ = with_monitor(steps, every, Path(tmp))
            analysed, skipped = len(monitor.analysed), len(monitor.skipped)
    print(json.dumps({"total": run.total, "median": run.median, "analysed": analysed,
                      "skipped": skipped}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cadences", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--direct", type=int, metavar="REPEATS",
                        help="the cost of one background analysis, thread against process")
    parser.add_argument("--size", choices=sorted(SIZES), default="small",
                        help="the model: small (CPU) or 1b (about 0.94 B parameters, bfloat16)")
    parser.add_argument("--device", default="cpu", help="where it trains (cuda on a GPU box)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"the settings to run, of {','.join(KINDS)} (default: all)")
    parser.add_argument("--steps", type=int, help="steps a run (default: 4 x every, >= 400)")
    parser.add_argument("--whole", type=int, default=2, metavar="PAIRS",
                        help="whole runs without and with the monitor in fresh processes, "
                        "alternating: PAIRS pairs a cadence (0: none; default 2)")
    parser.add_argument("--schedules", type=int, metavar="PAIRS",
                        help="TempBalance, AlphaDecay and LayerwiseLR at their papers' "
                        "cadences on a tiny Llama, against the same run without, in fresh "
                        "processes alternating: PAIRS pairs each")
    parser.add_argument("--held", type=int, metavar="BUSY",
                        help="the loop's held time per analysed step, split into its parts, "
                        "at no extra load and with BUSY busy processes (cadence 50)")
    parser.add_argument("--child", choices=("none", "monitor"), help=argparse.SUPPRESS)
    parser.add_argument("--child-schedule", help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure(args.size, args.device)
    if args.child:
        child(args.child, args.cadences[0], args.steps)
        return
    if args.child_schedule:
        print(json.dumps(_training_more.llama_run(args.child_schedule, args.steps)))
        return
    if args.schedules or args.held:
        header("bench_training: what the schedules cost, and the loop's held time",
               ["torch", "transformers", "diffractml-core", "diffractml-training"])
        if args.schedules:
            print(f"# tiny Llama {_training_more.LLAMA}, AdamW, batch 8 x 64, CPU; each "
                  "schedule's set-up (its first analysis) is outside the loop's time")
            table(*_training_more.schedules_table(args.schedules, __file__))
        if args.held:
            with tempfile.TemporaryDirectory(prefix="diffract-bench-held-") as tmp:
                table(*_training_more.held(args.held, args.steps or 400, 50, train,
                                           Path(tmp)))
        if hasattr(os, "getloadavg"):
            print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
        return
    import torch

    header("bench_training: the cost of a monitor inside a training loop",
           ["torch", "diffractml-core", "diffractml-training"])
    if args.direct:
        direct(args.direct)
        if hasattr(os, "getloadavg"):
            print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
        return
    where = torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "CPU"
    unknown = sorted(set(args.kinds.split(",")) - set(KINDS))
    if unknown or "none" not in args.kinds.split(","):
        parser.error(f"--kinds takes {','.join(KINDS)} and needs none (the estimate's noise "
                     f"is read from it); got {args.kinds!r}")
    print(f"# model: {LAYERS} layers, width {WIDTH}, ff {FF}, vocabulary {VOCAB}; {DTYPE} on "
          f"{where}; batch {BATCH} x {SEQ}; AdamW; torch threads {torch.get_num_threads()}; "
          f"{args.repeats} run(s) of each kind per cadence, cadences "
          f"{', '.join(map(str, args.cadences))} -> "
          f"{', '.join(str(args.steps or length(c)) for c in args.cadences)} steps a run")
    rows = []
    with tempfile.TemporaryDirectory(prefix="diffract-bench-training-") as tmp:
        folder = Path(tmp)
        for every in args.cadences:
            steps = args.steps or length(every)
            kinds = [KINDS[k] for k in args.kinds.split(",")]
            got: dict[str, list[Measured]] = {k: [] for k in kinds}
            for repeat in range(args.repeats):
                turn = kinds[repeat % len(kinds):] + kinds[:repeat % len(kinds)]
                for kind in turn:
                    got[kind].append(measure(kind, steps, every, folder / f"{every}-{repeat}"))
            for kind in kinds:
                rows.append(summarise(kind, every, steps, got[kind]))
    table(["setting", "every", "steps", "analysed / skipped", "loop held per analysed step",
           "cost per analysis (in-run)", "overhead", "run time (drift included)"], rows)
    if args.whole and "monitor" in args.kinds.split(","):
        print(f"# whole runs, without / with the monitor (background, defaults), each in a "
              f"fresh process, alternating; {args.whole} pair(s) a cadence")
        table(["every", "steps", "pairs", "loop time none/monitor, each pair",
               "analysed/skipped", "whole-run overhead: loop time", "median step"],
              [whole(args.whole, every, args.steps or max(400, 2 * every), args.size,
                     args.device)
               for every in args.cadences])
    print("# cost per analysis: the excess of the steps from the cadence point until "
          f"{SETTLE} steps after its values came back, over the median of the same "
          "window's quiet half (the row 'none' is the same estimate where nothing ran: "
          "its noise); overhead: that cost per analysed step over the time between "
          "cadence points (every x the median step), plus, for save + analyze, the "
          "analyses after the loop")
    if hasattr(os, "getloadavg"):
        print("# load average at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


def length(every: int) -> int:
    """Steps of one run at cadence ``every``: at least 400, and three points each with
    the whole window after it that ``costs`` reads."""
    return max(400, 4 * every)


class Measured:
    """One run of a kind: its run, the in-run costs, what the loop was held, what came
    after the loop (save + analyze's analyses), and the points analysed and skipped."""

    def __init__(self, run: Run, costs: list[float], held: list[float] | None = None,
                 after: float = 0.0, analysed: int = 0, skipped: int = 0) -> None:
        self.run, self.costs, self.held, self.after = run, costs, held, after
        self.analysed, self.skipped = analysed, skipped


def measure(kind: str, steps: int, every: int, folder: Path) -> Measured:
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "none":
        run = train(steps, lambda step, model: None)
        return Measured(run, costs(run, {p: p for p in range(every, steps, every)}, every))
    if kind == "save + analyze":
        run, after, count = with_saves(steps, every, folder)
        return Measured(run, costs(run, {p: p for p in range(every, steps + 1, every)},
                                   every), after=after / count, analysed=count)
    run, monitor, reached = with_monitor(steps, every, folder, background=kind == "monitor")
    return Measured(run, costs(run, reached, every), list(monitor.blocked.values()),
                    analysed=len(monitor.analysed), skipped=len(monitor.skipped))


def summarise(kind: str, every: int, steps: int, runs: list[Measured]) -> list:
    each = [c for m in runs for c in m.costs]
    step = statistics.median(t for m in runs for t in m.run.each)
    cost = statistics.median(each) if each else math.nan
    after = statistics.mean(m.after for m in runs)
    overhead = (cost + after) / (every * step)
    held = [h for m in runs for h in (m.held or [])]
    held_text = "-" if kind == "none" else (
        f"{1000 * statistics.median(held):.2f} ms = "
        f"{100 * statistics.median(held) / step:.2f}% of a step (max "
        f"{1000 * max(held):.2f} ms)" if held else "(saving)")
    cost_text = f"{1000 * cost:+.0f} ms ({len(each)} points, {1000 * min(each):+.0f}.." \
        f"{1000 * max(each):+.0f})" if each else "- (no point left a quiet window: raise " \
        "the cadence)"
    if after:
        cost_text += f" + {after:.2f} s analyze"
    return [kind, every, steps,
            "-" if kind == "none" else " ".join(f"{m.analysed}/{m.skipped}" for m in runs),
            held_text, cost_text, f"{100 * overhead:+.2f}%" if each else "-",
            " ".join(f"{m.run.total:.1f}s" for m in runs)]


if __name__ == "__main__":
    main()
