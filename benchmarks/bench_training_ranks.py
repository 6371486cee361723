"""The analysis of a step spread over the ranks: one process against two (torch.distributed
on gloo, the CPU), the same run, in one invocation.

A tiny Llama (transformers' ``LlamaForCausalLM`` built from a config: 4 layers, width 256,
feed-forward 688, 4 heads, 2 key-value heads, a 2048-token vocabulary: 30 analysed
matrices, 4.2 M parameters) trained with AdamW on random tokens (batch 8 x 64 per rank)
under DDP, watched by a ``Monitor`` with its defaults (background analysis, a ``local``
store on rank 0) every ``--every`` steps. Each rank gets the machine's cores divided by
the ranks as its threads, as each rank would get a GPU of its own. Per analysed step:

- ``latency``: seconds from the cadence point (the ``monitor.step`` that took the step)
  to its values reaching rank 0's sink, the moment they can be logged and a schedule
  can act on them;
- ``analysis``: seconds the slowest rank's worker spent on its share of that step;
- ``held``: the longest time any rank's loop was held for that step
  (``Monitor.blocked``: the cadence point, the copies before the next optimizer step,
  and, under torch.distributed, the collectives that gather the shares).

Printed: the medians for 1 and 2 processes and their ratios (2 over 1), for each of
``--repeats`` alternating pairs. A ratio below 1 for latency is the spread paying off;
held time under torch.distributed includes a small collective per step while a step is
in flight.

    python benchmarks/bench_training_ranks.py [--every 20] [--steps 100] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _rank(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    import transformers

    from diffract_training import Monitor

    os.environ["RANK"] = str(args.rank)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.world))
    if args.world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=args.rank, world_size=args.world)
    config = transformers.LlamaConfig(vocab_size=2048, hidden_size=256,
                                      intermediate_size=688, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if args.world > 1 else model
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    arrived: dict[int, float] = {}
    monitor = Monitor(model, every=args.every, store=Path(args.out) / "run.diffract",
                      log=lambda values, step: arrived.setdefault(step, time.perf_counter()))
    taken: dict[int, float] = {}
    gen = torch.Generator().manual_seed(args.rank)
    times = []
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        ids = torch.randint(0, 2048, (8, 64), generator=gen)
        wrapped(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        now = time.perf_counter()
        times.append(now - began)
        if monitor.step(step):
            taken[step] = now
    monitor.close()
    record = {"taken": taken, "arrived": arrived, "blocked": monitor.blocked,
              "skipped": monitor.skipped, "step": statistics.median(times),
              "worked": {s: snap.worked for s, snap in monitor._taken.items()}}
    Path(args.out, f"rank{args.rank}.json").write_text(json.dumps(record))
    if args.world > 1:  # then leave without the interpreter's teardown, where gloo's
        dist.barrier()  # C++ threads sometimes abort a finished rank ("terminate called
        dist.destroy_process_group()  # without an active exception")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(world: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as out:
        port = str(_free_port())
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // world))}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world",
                                   str(world), "--port", port, "--out", out, "--every",
                                   str(args.every), "--steps", str(args.steps)], env=env)
                 for r in range(world)]
        if any(p.wait() for p in procs):
            raise SystemExit(f"a rank failed ({world} processes)")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    zero = ranks[0]
    steps = [s for s in zero["arrived"] if s in zero["taken"]]
    latency = [zero["arrived"][s] - zero["taken"][s] for s in steps]
    held = [max(r["blocked"].get(s, 0.0) for r in ranks) for s in steps]
    worked = [max(r["worked"].get(s, 0.0) for r in ranks) for s in steps]
    return {"analysed": len(steps), "skipped": len(zero["skipped"]),
            "latency": statistics.median(latency), "held": statistics.median(held),
            "worked": statistics.median(worked), "step": zero["step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rank", type=int, default=-1)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--port", default="")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.rank >= 0:
        _rank(args)
        return
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; every={args.every}, "
          f"{args.steps} steps")
    print(f"{'pair':>4} {'ranks':>5} {'analysed':>8} {'skipped':>7} {'step s':>7} "
          f"{'analysis s':>10} {'latency s':>9} {'held s':>7}")
    ratios = []
    for pair in range(args.repeats):
        one, two = _run(1, args), _run(2, args)
        for world, got in ((1, one), (2, two)):
            print(f"{pair:>4} {world:>5} {got['analysed']:>8} {got['skipped']:>7} "
                  f"{got['step']:>7.3f} {got['worked']:>10.3f} {got['latency']:>9.3f} "
                  f"{got['held']:>7.4f}")
        ratios.append([two[k] / one[k] for k in ("worked", "latency", "held")])
    for i, name in enumerate(("analysis (slowest rank)", "latency", "held")):
        print(f"2 ranks over 1, {name}: " + ", ".join(f"{r[i]:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
