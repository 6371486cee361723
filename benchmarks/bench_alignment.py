"""avg_l_agreement and the top-tenth subspace overlap over the 48 matrices of two
GPT-2-small-shaped checkpoints (the second a perturbation of the first; by default
with a decaying low-rank signal over noise, ``--weights gaussian`` for pure noise), with
the full
SVD and with the top-k randomized SVD: wall time and peak memory of each run.

Each mode runs in a fresh child process so its peak resident memory is its own
(``VmHWM``; ``ru_maxrss`` keeps the parent's peak across exec). There is no peer that
computes these fields; the comparison is full versus top-k, and the agreement of their
results. Correctness: tests/alignment.

    python benchmarks/bench_alignment.py [--top-k 32] [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

CHILD = """
import json, resource, sys, time
import numpy as np
from diffract import Session

layers, top_k, k, kind = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
shapes = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]
rng = np.random.default_rng(0)
a, b = {}, {}
for i in range(layers):
    for j, (rows, cols) in enumerate(shapes):
        w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)
        if kind == "spiked":  # a rank-64 signal with decaying strengths over the noise
            left = rng.standard_normal((rows, 64)) / np.sqrt(rows)
            right = rng.standard_normal((64, cols)) / np.sqrt(cols)
            strength = 0.02 * np.sqrt(max(rows, cols)) * np.geomspace(8, 1.5, 64)
            w += ((left * strength) @ right).astype(np.float32)
        a[f"h.{i}.{j}"] = w
        b[f"h.{i}.{j}"] = w + (rng.standard_normal((rows, cols)) * 0.004).astype(np.float32)
start = time.perf_counter()
config = {"parallel": {"executor": "sequential"}}
with Session(config=config) as s:
    s.models.add(a, model_id="a")
    s.models.add(b, model_id="b")
    s.compute.configure_kernel("svd", top_k=top_k)
    s.compute.configure_kernel("l_subspace", k=k)
    s.filter(["a", "b"]).compute.apply("avg_l_agreement", "l_subspace_overlap")
    out = s.results.export_aggregates("avg_l_agreement", "l_subspace_overlap")
seconds = time.perf_counter() - start
peak = 1024 * next(int(line.split()[1]) for line in open("/proc/self/status")
                  if line.startswith("VmHWM:"))  # ru_maxrss would keep the parent's peak
print(json.dumps({"seconds": seconds, "peak": peak, "values": out}))
"""


def run(layers: int, top_k: int, k: int, kind: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(layers), str(top_k), str(k), kind],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=32, help="svd top_k of the fast mode")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--weights", choices=["spiked", "gaussian"], default="spiked",
                        help="spiked: a decaying rank-64 signal over Gaussian noise, as trained "
                        "layers have; gaussian: pure noise, a flat spectrum (the randomized "
                        "SVD's worst case: its top-k subspace is then not well defined)")
    args = parser.parse_args()
    header("alignment of two GPT-2-small-shaped checkpoints: full SVD vs top-k",
           ["diffract-core", "diffract-kernels-spectral", "diffract-kernels-alignment", "numpy"])
    full = run(args.layers, 0, args.top_k, args.weights)
    fast = run(args.layers, args.top_k, args.top_k, args.weights)
    print(f"# weights: {args.weights}; {args.layers} layers x 4 matrices")
    rows = []
    for name, r in (("full SVD", full), (f"top_k={args.top_k}", fast)):
        rows.append([name, f"{r['seconds']:.1f} s", f"{r['peak'] / (1 << 20):.0f} MiB"])
    table(["mode", "wall", "peak memory"], rows)
    subspace = [n for n in full["values"] if n.startswith("l_subspace_overlap")]
    diff = max(abs(full["values"][n] - fast["values"][n]) for n in subspace)
    print(f"speed-up {full['seconds'] / fast['seconds']:.1f}x; top-{args.top_k} subspace overlap "
          f"equal to the full SVD's within {diff:.1e} on {len(subspace)} matrices "
          "(avg_l_agreement averages over all directions with the full SVD, over the top "
          f"{args.top_k} with top_k, so those differ by definition)")


if __name__ == "__main__":
    main()
