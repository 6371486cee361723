"""bench_training.py's ``--schedules`` and ``--held``: what the alpha-driven schedules cost
a run, and where the loop's held time per analysed step goes on a loaded machine."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

#: The tiny Llama the schedules train (every matrix has at least 128 eigenvalues, over the
#: authors' threshold of 50): 4 layers, width 128, 2.2 M parameters.
LLAMA = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
         "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
         "max_position_embeddings": 64}
#: Batches in the synthetic data: TempBalance recomputes once an epoch, so here every 200.
EPOCH = 200
#: Each schedule's cadence in its paper's runs (TempBalance: an epoch).
PAPER = {"TempBalance": EPOCH, "AlphaDecay": 500, "LayerwiseLR": 100}


def llama_run(kind: str, steps: int) -> dict:
    """One run of the tiny Llama with AdamW, with schedule ``kind`` (or ``none``)."""
    import torch
    import transformers

    from diffract_training import schedules

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    data = torch.randint(0, LLAMA["vocab_size"], (EPOCH, 8, 64),
                         generator=torch.Generator().manual_seed(1))
    began = time.perf_counter()
    schedule = None if kind == "none" else getattr(schedules, kind)(
        model, optimizer, every=PAPER[kind])
    setup = time.perf_counter() - began
    each = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        t = time.perf_counter()
        ids = data[step % EPOCH]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule is not None:
            schedule.step(step)
        each.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    out = {"total": total, "median": statistics.median(each), "setup": setup}
    if schedule is not None:
        held = list(schedule.monitor.blocked.values())[1:]  # the set-up's is not the loop's
        out.update(held=statistics.median(held) if held else 0.0,
                   analysed=len(schedule.monitor.analysed), skipped=len(schedule.monitor.skipped))
        schedule.close()
    return out


def schedules_table(pairs: int, script: str) -> tuple[list[str], list[list]]:
    """Each schedule at its paper's cadence against the same run without it, in fresh
    processes, alternating: the rows of one table."""
    rows = []
    for kind, every in PAPER.items():
        steps = max(400, 2 * every)
        got: dict[str, list[dict]] = {"none": [], kind: []}
        for pair in range(pairs):
            for run in ("none", kind) if pair % 2 == 0 else (kind, "none"):
                out = subprocess.run([sys.executable, script, "--child-schedule", run,
                                      "--steps", str(steps)],
                                     check=True, capture_output=True, text=True).stdout
                got[run].append(json.loads(out.strip().splitlines()[-1]))
        ratio = [w["total"] / n["total"] for n, w in zip(got["none"], got[kind], strict=True)]
        step = [w["median"] / n["median"] for n, w in zip(got["none"], got[kind], strict=True)]
        rows.append([kind, every, steps, pairs,
                     " ".join(f"{n['total']:.1f}/{w['total']:.1f}s"
                              for n, w in zip(got["none"], got[kind], strict=True)),
                     f"{statistics.median(ratio):.3f} ({min(ratio):.3f}..{max(ratio):.3f})",
                     f"{statistics.median(step):.3f}",
                     " ".join(f"{w['analysed']}/{w['skipped']}" for w in got[kind]),
                     f"{1000 * statistics.median(w['held'] for w in got[kind]):.2f} ms",
                     f"{statistics.median(w['setup'] for w in got[kind]):.2f} s"])
    head = ["schedule", "every", "steps", "pairs", "loop time none/with, each pair",
            "loop-time ratio (median, range)", "median-step ratio", "analysed/skipped",
            "loop held per analysed step", "set-up (first analysis)"]
    return head, rows


def held(load: int, steps: int, every: int, train, folder) -> tuple[list[str], list[list]]:
    """The monitor's held time per analysed step at no extra load and with ``load`` busy
    processes, in one run each, split into its parts: the cadence point (the snapshot's
    bookkeeping and waking the worker) and the optimizer's next step (the copies of what
    the worker had not reached, or the wait for it)."""
    import torch

    from diffract_training import Monitor

    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one OpenMP thread: with more, a loaded box's steps take
    # seconds (OpenMP's barriers wait on preempted threads), not the monitor's doing
    for extra in (0, load):
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(extra)]
        try:
            time.sleep(0.5 if extra else 0)  # the busy processes scheduled
            box: dict = {"at": {}}

            def on_step(step, model, box=box, extra=extra):
                if "m" not in box:
                    box["m"] = Monitor(model, every=every, store=folder / f"held-{extra}",
                                       histograms=True)
                if step is None:
                    box["m"].close()
                    return
                t = time.perf_counter()
                box["m"].step(step)
                if step % every == 0:
                    box["at"][step] = time.perf_counter() - t

            train(steps, on_step)
            monitor = box["m"]
            blocked = monitor.blocked
            points = [s for s in blocked if s in box["at"]]
            at = [box["at"][s] for s in points]
            after = [blocked[s] - box["at"][s] for s in points]
            copied = [monitor.copied[s] for s in points]
            load_now = ", ".join(f"{v:.1f}" for v in __import__("os").getloadavg())
            rows.append([extra, load_now, len(points),
                         f"{1000 * statistics.median(blocked[s] for s in points):.2f} "
                         f"(max {1000 * max(blocked[s] for s in points):.2f})",
                         f"{1000 * statistics.median(at):.2f}",
                         f"{1000 * statistics.median(after):.2f} "
                         f"(max {1000 * max(after):.2f})",
                         f"{statistics.median(copied) / 2**20:.1f} of "
                         f"{sum(monitor._sizes.values()) / 2**20:.1f}"])
        finally:
            for p in busy:
                p.kill()
                p.wait()
    torch.set_num_threads(threads)
    head = ["busy processes", "load average", "points", "held per point, ms (median)",
            "at the cadence point, ms", "before the next optimizer step, ms",
            "MiB the loop copied (median) of analysed"]
    return head, rows
