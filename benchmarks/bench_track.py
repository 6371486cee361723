"""A training run tracked with ``diffract track``: 20 checkpoints of GPT-2-small's shapes,
then a 21st; SVDs counted; SIGKILL and resume; reading the run back.

Builds (once, cached under ``--dir``) 21 safetensors checkpoints of GPT-2 small's 48
weight matrices (12 blocks x ``attn.c_attn`` 768x2304, ``attn.c_proj`` 768x768,
``mlp.c_fc`` 768x3072, ``mlp.c_proj`` 3072x768, float32, stored ``[in, out]`` as GPT-2
does), each derived from the previous by a small random walk (so the alignment between
checkpoints is meaningful), the first with heavy-tailed spectra (Gaussian columns scaled
by Pareto factors). Then, each in a fresh process with the default executor:

1. ``diffract track`` over the first 20 (the full run: default metrics, alignment with
   the previous and with the first checkpoint);
2. the 21st added by the same command (target: at most 1/10 of the full run);
3. the decompositions counted in every process (a ``sitecustomize`` on the workers' path
   counts calls of the spectral pack's ``esd`` and ``svd``): one SVD per matrix per
   checkpoint, never per pair;
4. SIGKILL of ``track`` over the first ``--kill-of`` checkpoints part-way, then the same
   command again: the store's values equal the uninterrupted run's, bit for bit;
5. reading back from a reopened ``local`` store: three fields of every matrix of 20
   checkpoints, of one checkpoint (48 matrices), and ``trajectory()``, against the same
   exports from ``ram`` (the original Diffract's store exported three fields of 48
   matrices in 0.027 s: the target).

6. ``--llm N`` (default 5): ``diffract track`` over N checkpoints with OLMo-2-1B's shapes
   (bench_llm.py's geometry, bf16, each the previous plus a small random walk): the
   store's size against the checkpoints' bytes and the track's peak RSS.

7. ``--small-only``: 5, 10 and 20 checkpoints of seven 1024 x 1024 float32 matrices (28
   MiB each) and the 20 without the alignment: how far each peak lies above the
   command's own without the alignment, in checkpoints (it must not grow with the run).

    python benchmarks/bench_track.py [--dir /tmp/diffract-track-gpt2] [--kill-of 6] [--llm 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, median_time, table  # noqa: E402

SHAPES = {"attn.c_attn.weight": (768, 2304), "attn.c_proj.weight": (768, 768),
          "mlp.c_fc.weight": (768, 3072), "mlp.c_proj.weight": (3072, 768)}
BLOCKS, CHECKPOINTS, STEP = 12, 21, 1000
FIELDS = ("pl_alpha", "stable_rank", "log_norm")

COUNTER = """
import os
_path = os.environ.get("DIFFRACT_BENCH_COUNTS")
if _path:
    import diffract_kernels_spectral.linalg as _linalg

    def _counted(name, real):
        def wrapper(*args, **kwargs):
            with open(_path, "a") as f:
                f.write(name + "\\n")
            return real(*args, **kwargs)
        return wrapper

    for _name in ("esd", "svd"):
        setattr(_linalg, _name, _counted(_name, getattr(_linalg, _name)))
"""


def build(folder: Path) -> list[Path]:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    paths = [folder / f"checkpoint-{(i + 1) * STEP}" for i in range(CHECKPOINTS)]
    if all((p / "model.safetensors").exists() for p in paths):
        return paths
    rng = np.random.default_rng(0)
    weights = {}
    for block in range(BLOCKS):
        for name, (rows, cols) in SHAPES.items():
            scale = (rng.pareto(2.5, size=cols) + 1.0).astype(np.float32)
            weights[f"h.{block}.{name}"] = (rng.standard_normal((rows, cols), dtype=np.float32)
                                            * scale / np.sqrt(rows, dtype=np.float32))
    for path in paths:
        for w in weights.values():
            w += 0.02 * rng.standard_normal(w.shape, dtype=np.float32) / np.sqrt(w.shape[0])
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: torch.from_numpy(v) for k, v in weights.items()},
                  str(path / "model.safetensors"))
        print(f"# built {path}", flush=True)
    return paths


def track(paths: list[Path], store: Path, counts: Path, kill_after: float | None = None,
          extra: list[str] | None = None) -> dict:
    """``diffract track`` in a fresh process; wall time and the decompositions counted."""
    counts.write_text("")
    env = dict(os.environ, DIFFRACT_BENCH_COUNTS=str(counts),
               PYTHONPATH=os.pathsep.join([str(counts.parent / "site"),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("DIFFRACT_STRICT_PLUGINS", None)
    command = ["/usr/bin/time", "-f", "peak-kib %M", sys.executable, "-m", "diffract.cli",
               "track", *map(str, paths), "--store", str(store), "--quiet", *(extra or [])]
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if kill_after is None and proc.returncode != 0:
        raise SystemExit(f"track failed ({proc.returncode}):\n{out}\n{err}")
    calls = counts.read_text().split()
    peak = [int(line.split()[1]) for line in err.splitlines() if line.startswith("peak-kib ")]
    return {"wall": wall, "esd": calls.count("esd"), "svd": calls.count("svd"),
            "code": proc.returncode, "out": out, "peak_mib": peak[-1] / 1024 if peak else 0.0}


def size(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def values(store: Path, model_ids: list[str]) -> dict:
    """Every stored scalar of those models and every pair aggregate among them."""
    from diffract import Session

    with Session(profile="local", path=store) as s:
        view = s.filter(model_ids=model_ids)
        table_ = view.results.export_metrics()
        pairs = {(r["field"], r["models"], r["param"]): r["value"] for r in
                 view.results.export_aggregates(export_format="list")
                 if r["param"] is not None and not hasattr(r["value"], "shape")}
    return {"metrics": table_, "pairs": pairs}


def same(a: dict, b: dict) -> bool:
    import math

    def eq(x, y) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return x == y or (math.isnan(x) and math.isnan(y))
        if hasattr(x, "shape") or hasattr(y, "shape"):
            import numpy as np

            return np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        return x == y

    if a["pairs"].keys() != b["pairs"].keys():
        return False
    if not all(eq(a["pairs"][k], b["pairs"][k]) for k in a["pairs"]):
        return False
    for model, params in a["metrics"].items():
        for param, fields in params.items():
            other = b["metrics"].get(model, {}).get(param, {})
            if fields.keys() != other.keys() or not all(eq(v, other[k])
                                                       for k, v in fields.items()):
                return False
    return a["metrics"].keys() == b["metrics"].keys()


def _reads(session, first: str) -> dict:
    """The timed reads of one session (every checkpoint, and the first alone)."""
    one = session.filter(model_ids=[first])
    return {
        "export 3 fields, 20 x 48 matrices": lambda: session.results.export_metrics(*FIELDS),
        "export 3 fields, 48 matrices": lambda: one.results.export_metrics(*FIELDS),
        "trajectory(pl_alpha), 20 x 48": lambda: session.results.trajectory("pl_alpha"),
        "to_pandas 3 fields, 20 x 48": lambda: session.results.to_pandas(*FIELDS),
    }


def read_back(store: Path, repeats: int) -> list[list]:
    from diffract import Session

    rows = []
    opened, session = median_time(lambda: Session(profile="local", path=store), 1)
    with session as s:
        first = s.models.ordered()[0]
        runs = _reads(s, first)
        with Session(profile="ram") as ram:
            ram.merge(s)
            ram_runs = _reads(ram, first)
            for name, fn in runs.items():
                cold = median_time(fn, 1)[0]
                warm = median_time(fn, repeats)[0]
                ram_time = median_time(ram_runs[name], repeats)[0]
                rows.append([name, f"{cold:.4f}", f"{warm:.4f}", f"{ram_time:.4f}",
                             f"{0.027 / warm:.1f}x"])
    rows.append(["open the store", f"{opened:.4f}", "", "", ""])

    def reopened(model_ids: int) -> None:
        with Session(profile="local", path=store) as s:
            ids = s.models.ordered()[:model_ids]
            s.filter(model_ids=ids).results.export_metrics(*FIELDS)

    for label, count in (("reopen + export 3 fields, 48 matrices", 1),
                         ("reopen + export 3 fields, 20 x 48", 20)):
        cold = median_time(lambda c=count: reopened(c), 1)[0]
        warm = median_time(lambda c=count: reopened(c), repeats)[0]
        rows.append([label, f"{cold:.4f}", f"{warm:.4f}", "", f"{0.027 / warm:.1f}x"])
    return rows


def build_llm(folder: Path, count: int, layers: int, vocab: int) -> list[Path]:
    """``count`` checkpoints with OLMo-2-1B's shapes (bench_llm.py's geometry: hidden
    2048, MLP 8192; ``layers`` blocks, ``vocab`` rows of each embedding; bf16, four
    shards), each the previous plus a small random walk; built once, a shard at a time
    (every checkpoint's copy of one shard in memory together)."""
    import json

    import numpy as np
    import torch
    from bench_llm import CONFIG, shapes
    from safetensors.torch import save_file

    paths = [folder / f"checkpoint-{(i + 1) * STEP}" for i in range(count)]
    if all((p / "model.safetensors.index.json").exists() for p in paths):
        return paths
    names = list(shapes(layers, vocab).items())
    quarter = -(-len(names) // 4)
    shards = [names[k:k + quarter] for k in range(0, len(names), quarter)]
    weight_map = {}
    rng = np.random.default_rng(1)
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        versions: list[dict] = [{} for _ in paths]
        for name, (rows, cols) in shard:
            scale = (1 + rng.pareto(2.5, cols)).astype(np.float32) / np.sqrt(cols)
            w = rng.standard_normal((rows, cols), dtype=np.float32) * scale
            for version in versions:
                w += 0.02 * rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)
                version[name] = torch.from_numpy(w).to(torch.bfloat16)
            weight_map[name] = file
        for path, version in zip(paths, versions, strict=True):
            path.mkdir(parents=True, exist_ok=True)
            save_file(version, str(path / file))
        print(f"# built shard {k + 1} of {len(shards)} of {count} checkpoints", flush=True)
    for path in paths:
        (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        (path / "config.json").write_text(json.dumps(
            {**CONFIG, "num_hidden_layers": layers, "vocab_size": vocab}))
    return paths


def llm_run(root: Path, count: int, layers: int, vocab: int, counts: Path) -> None:
    """``diffract track`` over ``count`` OLMo-2-1B-shaped checkpoints: its store's size
    against the checkpoints' bytes, and its peak RSS."""
    paths = build_llm(root / f"llm-run-{layers}x{vocab}", count, layers, vocab)
    store = root / "work" / "llm-store"
    subprocess.run(["rm", "-rf", str(store)], check=True)
    run = track(paths, store, counts)
    from bench_llm import shapes

    run_bytes = sum(size(p) for p in paths)
    stored = size(store)
    # what stays for the later steps: the float32 left vectors of the top tenth of each
    # matrix's directions, U [N, ceil(min(N, M) / 10)], of the first and the latest checkpoint
    kept = 2 * sum(4 * rows * -(-min(rows, cols) // 10)
                   for rows, cols in shapes(layers, vocab).values())
    print(f"# {count} OLMo-2-1B-shaped checkpoints ({layers} layers, vocabulary {vocab:,}; "
          f"{run_bytes / 2**30:.1f} GiB of bf16): "
          f"track {run['wall']:.0f} s, {run['svd']} SVDs, peak RSS {run['peak_mib']:.0f} MiB; "
          f"store {stored / 2**20:.0f} MiB, {stored / run_bytes:.3f} of the checkpoints; "
          f"of it the top-tenth float32 left vectors of the first and the latest, "
          f"{kept / 2**20:.0f} MiB: {kept / (run_bytes / count):.3f} of one checkpoint "
          f"(target <= 1), the rest {(stored - kept) / 2**20:.0f} MiB")


def small_run(root: Path, counts: Path) -> None:
    """The peak of tracks of 5, 10 and 20 small checkpoints (and of 20 without the
    alignment), each in a fresh process: what the command holds beyond one checkpoint."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    weights = {f"layer{i}.weight": (rng.standard_normal((1024, 1024))
                                    * rng.pareto(2.0, 1024)[None, :]).astype(np.float32)
               for i in range(7)}
    paths = []
    for step in range(1, 21):
        path = root / "small" / f"step-{50 * step}"
        if not (path / "model.safetensors").exists():
            path.mkdir(parents=True, exist_ok=True)
            save_file(weights, str(path / "model.safetensors"))
        paths.append(path)
        weights = {k: v + np.float32(0.01) * rng.standard_normal(v.shape, np.float32)
                   for k, v in weights.items()}
    one = size(paths[0]) / 2**20
    runs = {}
    for n, against in ((20, "none"), (5, None), (10, None), (20, None)):
        store = root / "work" / f"small-{n}-{against}"
        subprocess.run(["rm", "-rf", str(store)], check=True)
        runs[(n, against)] = track(paths[:n], store, counts,
                                   extra=["--against", against] if against else [])
    plain = runs[(20, "none")]["peak_mib"]  # the command without the alignment's SVDs
    table([f"track of {one:.0f} MiB checkpoints", "wall s", "peak RSS MiB",
           "above --against none, in checkpoints"],
          [[f"{n} checkpoints" + (", --against none" if against else ""),
            f"{run['wall']:.1f}", f"{run['peak_mib']:.0f}",
            f"{(run['peak_mib'] - plain) / one:.1f}"] for (n, against), run in runs.items()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/diffract-track-gpt2")
    parser.add_argument("--kill-of", type=int, default=6,
                        help="checkpoints in the SIGKILL-and-resume check (default 6)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--llm", type=int, default=5, metavar="N",
                        help="then track N OLMo-2-1B-shaped checkpoints (default 5; 0 skips: "
                             "about an hour here, 14 GiB of disk)")
    parser.add_argument("--llm-layers", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--llm-vocab", type=int, default=100352, help=argparse.SUPPRESS)
    parser.add_argument("--llm-only", action="store_true", help="only the --llm run")
    parser.add_argument("--small-only", action="store_true",
                        help="only the peak of tracks of small checkpoints (5, 10, 20)")
    parser.add_argument("--read-back", metavar="STORE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.read_back:  # in a process of its own, so that its peak memory is its own
        table(["read back (reopened local store)", "first s", "median s", "ram s",
               "vs 0.027 s"], read_back(Path(args.read_back), args.repeats))
        return
    header("diffract track: the peak of small runs" if args.small_only else
           "diffract track: 20 GPT-2-small checkpoints, then a 21st",
           ["diffractml-core", "diffractml-report", "numpy"])
    root = Path(args.dir)
    work = root / "work"
    (work / "site").mkdir(parents=True, exist_ok=True)
    (work / "site" / "sitecustomize.py").write_text(COUNTER)
    counts = work / "counts.txt"
    if args.llm_only:
        llm_run(root, args.llm, args.llm_layers, args.llm_vocab, counts)
        return
    if args.small_only:
        small_run(root, counts)
        return
    paths = build(root / "run")
    store = work / "store"
    subprocess.run(["rm", "-rf", str(store), str(work / "killed")], check=True)

    full = track(paths[:20], store, counts)
    after_20 = size(store)
    added = track(paths, store, counts)
    after_21 = size(store)
    rows = [["track 20 checkpoints", f"{full['wall']:.1f}", full["esd"], full["svd"],
             "20 x 48 = 960", f"{full['peak_mib']:.0f}"],
            ["track: add the 21st", f"{added['wall']:.1f}", added["esd"], added["svd"],
             "48", f"{added['peak_mib']:.0f}"]]
    print()
    table(["run", "wall s", "ESDs", "SVDs", "SVDs expected", "peak RSS MiB"], rows)
    one = size(paths[0])
    run_bytes = sum(size(p) for p in paths[:20])
    print(f"# store after 20 checkpoints: {after_20 / 2**20:.0f} MiB, {after_20 / run_bytes:.3f} "
          f"of their {run_bytes / 2**20:.0f} MiB (target <= 0.10); the 21st grew it by "
          f"{(after_21 - after_20) / 2**20:.1f} MiB, {(after_21 - after_20) / one:.4f} of its "
          f"{one / 2**20:.0f} MiB (target <= 0.02)")
    ratio = added["wall"] / full["wall"]
    print(f"# the 21st costs {ratio:.3f} of the full run (target <= 0.1); SVDs once per "
          f"matrix per checkpoint: {full['svd'] == 960 and added['svd'] == 48}")

    part = paths[:args.kill_of]
    killed = work / "killed"
    whole = track(part, work / "whole", counts)
    cut = track(part, killed, counts, kill_after=0.5 * whole["wall"])
    resumed = track(part, killed, counts)
    ids = [p.name for p in part]
    equal = same(values(killed, ids), values(work / "whole", ids))
    print(f"# SIGKILL after {0.5 * whole['wall']:.1f} s of a {whole['wall']:.1f} s track over "
          f"{len(part)} checkpoints (exit {cut['code']}), then rerun ({resumed['wall']:.1f} "
          f"s, {resumed['svd']} SVDs): the store equals the uninterrupted run's: {equal}")
    subprocess.run(["rm", "-rf", str(work / "whole")], check=True)

    print()
    reading = subprocess.run(["/usr/bin/time", "-f", "peak-kib %M", sys.executable, __file__,
                              "--read-back", str(store), "--repeats", str(args.repeats)],
                             capture_output=True, text=True)
    print(reading.stdout, end="")
    peak = [line for line in reading.stderr.splitlines() if line.startswith("peak-kib ")]
    print(f"# read-back peak RSS: {int(peak[-1].split()[1]) / 1024:.0f} MiB" if peak
          else f"# read-back failed:\n{reading.stderr[-2000:]}")
    if args.llm:
        print(flush=True)
        llm_run(root, args.llm, args.llm_layers, args.llm_vocab, counts)


if __name__ == "__main__":
    main()
