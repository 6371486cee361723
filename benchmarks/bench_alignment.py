"""avg_l_agreement and the top-tenth subspace overlap over the 48 matrices of two
GPT-2-small-shaped checkpoints (the second a perturbation of the first; by default
with a decaying low-rank signal over noise, ``--weights gaussian`` for pure noise), with
the full
SVD and with the top-k randomized SVD: wall time and peak memory of each run.

Each mode runs in a fresh child process so its peak resident memory is its own
(``VmHWM``; ``ru_maxrss`` keeps the parent's peak across exec). There is no peer that
computes these fields; the comparison is full versus top-k, and the agreement of their
results. Correctness: tests/alignment.

``--precision`` measures instead what the precision of the stored vectors does to the
fields ``diffract track`` computes (``l_subspace_overlap``, ``avg_max_l_agreement``),
against float64 vectors of the same bfloat16 weights, beside what the bfloat16 rounding
of the weights themselves does to them (float64 vectors of the unrounded weights): the
vectors need no more precision than the weights carry.

    python benchmarks/bench_alignment.py [--top-k 32] [--layers 12]
    python benchmarks/bench_alignment.py --precision [--layers 4] [--shapes 768x2304,...]
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
    s.compute.configure_kernel("l_overlap", k=k)  # the top k: defined under top_k too
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


def _pair(rows: int, cols: int, rng) -> tuple:
    """Two float32 checkpoints of one matrix: a decaying rank-64 signal over noise, and
    the same after a small update."""
    import numpy as np

    w = rng.standard_normal((rows, cols)) * 0.02
    left = rng.standard_normal((rows, 64)) / np.sqrt(rows)
    right = rng.standard_normal((64, cols)) / np.sqrt(cols)
    w += (left * 0.02 * np.sqrt(max(rows, cols)) * np.geomspace(8, 1.5, 64)) @ right
    return w.astype(np.float32), (w + rng.standard_normal((rows, cols)) * 0.004).astype(
        np.float32)


def precision(layers: int, shapes: list[tuple[int, int]]) -> None:
    import numpy as np
    import torch
    from diffract_kernels_alignment.kernels import l_overlap, l_subspace, max_l_agreement

    from diffract_kernels_spectral.kernels import svd

    header("the stored vectors' precision and the alignment fields (bfloat16 weights)",
           ["diffractml-kernels-spectral", "diffractml-kernels-alignment", "numpy", "torch"])

    def bf16(w):
        return torch.from_numpy(w).bfloat16().float().numpy()

    def fields(wa, wb, vectors):
        (ua, sa, _), (ub, sb, _) = (svd(w, vectors=vectors) for w in (wa, wb))
        pair, svals, shapes = (ua, ub), (sa, sb), (wa.shape, wb.shape)
        subspace = l_subspace(pair, svals, shapes)[0]
        agreement = float(np.mean(max_l_agreement(l_overlap(pair, svals, shapes))))
        return np.array([subspace, agreement])

    rng = np.random.default_rng(0)
    worst = {name: np.zeros(2) for name in ("float32", "float16", "weights")}
    for _ in range(layers):
        for rows, cols in shapes:
            a, b = _pair(rows, cols, rng)
            ra, rb = bf16(a), bf16(b)
            exact = fields(ra, rb, "float64")
            for name, got in (("float32", fields(ra, rb, "float32")),
                              ("float16", fields(ra, rb, "float16")),
                              ("weights", fields(a, b, "float64"))):
                worst[name] = np.maximum(worst[name], np.abs(got - exact))
    print(f"# {layers} x {len(shapes)} matrices ({', '.join(f'{r}x{c}' for r, c in shapes)}); "
          "largest change of each field against float64 vectors of the bfloat16 weights")
    labels = {"float32": "vectors in float32", "float16": "vectors in float16",
              "weights": "the weights unrounded (float32), float64 vectors"}
    table(["what changes", "l_subspace_overlap", "avg_max_l_agreement"],
          [[labels[n], f"{w[0]:.1e}", f"{w[1]:.1e}"] for n, w in worst.items()])
    ratio = worst["weights"] / np.maximum(worst["float16"], 1e-300)
    print(f"the bfloat16 rounding of the weights moves the fields {ratio[0]:.0f}x and "
          f"{ratio[1]:.0f}x more than float16 vectors do")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=32, help="svd top_k of the fast mode")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--weights", choices=["spiked", "gaussian"], default="spiked",
                        help="spiked: a decaying rank-64 signal over Gaussian noise, as trained "
                        "layers have; gaussian: pure noise, a flat spectrum (the randomized "
                        "SVD's worst case: its top-k subspace is then not well defined)")
    parser.add_argument("--precision", action="store_true",
                        help="what the stored vectors' precision does to the fields instead")
    parser.add_argument("--shapes", default="768x2304,768x768,768x3072,3072x768,2048x8192",
                        help="the matrices of --precision, ROWSxCOLS,...")
    args = parser.parse_args()
    if args.precision:
        precision(args.layers, [tuple(int(n) for n in shape.split("x"))
                                for shape in args.shapes.split(",")])
        return
    header("alignment of two GPT-2-small-shaped checkpoints: full SVD vs top-k",
           ["diffractml-core", "diffractml-kernels-spectral", "diffractml-kernels-alignment",
            "numpy"])
    full = run(args.layers, 0, args.top_k, args.weights)
    fast = run(args.layers, args.top_k, args.top_k, args.weights)
    print(f"# weights: {args.weights}; {args.layers} layers x 4 matrices")
    rows = []
    for name, r in (("full SVD", full), (f"top_k={args.top_k}", fast)):
        rows.append([name, f"{r['seconds']:.1f} s", f"{r['peak'] / (1 << 20):.0f} MiB"])
    table(["mode", "wall", "peak memory"], rows)
    diffs = {field: max(abs(full["values"][n] - fast["values"][n])
                        for n in full["values"] if n.startswith(field))
             for field in ("l_subspace_overlap", "avg_l_agreement")}
    count = sum(n.startswith("l_subspace_overlap") for n in full["values"])
    print(f"speed-up {full['seconds'] / fast['seconds']:.1f}x; over the top {args.top_k} "
          f"directions (l_subspace.k = l_overlap.k = {args.top_k}) on {count} matrices the "
          f"top-k SVD's values equal the full SVD's within "
          + ", ".join(f"{d:.1e} ({field})" for field, d in diffs.items()))


if __name__ == "__main__":
    main()
