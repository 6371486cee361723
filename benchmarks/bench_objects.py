"""A training run's checkpoints tracked from object storage against the same files on
disk, in one run: ``diffract track`` (default metrics, alignment with the previous and
the first checkpoint) over five checkpoints uploaded to an S3-compatible server on the
loopback address (moto's, diffract_sources_fsspec.loopback), and over their local copies,
with the Ray executor (a local Ray of 2 CPUs, started inside the timing) and the default
one. Each run is a fresh ``diffract track`` process into a fresh store; the order
alternates (disk, S3, S3, disk...) and each pair's median is shown.

Bytes moved are counted at the server: the bodies of GETs of objects (what the readers
asked for), and of listings apart, against the checkpoints' own bytes. The server runs in
this process, on this machine: the times say what reading through S3 costs here
(requests, HTTP, a copy per read), not what a remote store's bandwidth would.

    python benchmarks/bench_objects.py [--checkpoints 5] [--repeats 1]
        [--executors ray,default] [--size 1024] [--against previous,first|none]

With the alignment (the default), track needs each tensor twice: for its spectrum (the
eigenvalues of W^T W) and for its singular vectors (an SVD); the two kernels run on one
read of each tensor, so the checkpoints' bytes are moved once (1.00x; 2.00x before the
runner ran them together, commit 183fca7).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402


def _checkpoints(root: Path, n: int, size: int) -> list[Path]:
    """``n`` steps of a model of six size x size and two 4size x size matrices (float32),
    drifting from step to step as training does."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    shapes = {**{f"layers.{i}.attn.weight": (size, size) for i in range(6)},
              **{f"layers.{i}.mlp.weight": (4 * size, size) for i in range(2)}}
    weights = {k: rng.standard_t(4, size=s).astype(np.float32) for k, s in shapes.items()}
    out = []
    for step in range(1, n + 1):
        for w in weights.values():
            w += 0.05 * rng.standard_normal(w.shape).astype(np.float32)
        folder = root / f"step-{step * 100}"
        folder.mkdir(parents=True)
        save_file(weights, str(folder / "model.safetensors"))
        out.append(folder)
    return out


def _track(pattern: str, store: Path, executor: str, against: str) -> float:
    argv = [sys.executable, "-m", "diffract.cli", "track", pattern, "--store", str(store),
            "-q", "--against", against,
            *([] if executor == "default" else ["--executor", executor])]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=5)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--executors", default="ray,default")
    parser.add_argument("--against", default="previous,first",
                        help="track's --against (none: the metrics alone, no SVD)")
    args = parser.parse_args()
    header("diffract track: five checkpoints from a loopback S3 server against disk",
           ["diffractml-core", "diffractml-sources-fsspec", "s3fs", "moto", "ray"])
    from diffract_sources_fsspec.loopback import LoopbackS3

    with tempfile.TemporaryDirectory() as tmp, LoopbackS3() as s3:
        root = Path(tmp) / "run"
        folders = _checkpoints(root, args.checkpoints, args.size)
        total = sum(f.stat().st_size for d in folders for f in d.iterdir())
        for folder in folders:
            s3.put_tree(folder, f"run/{folder.name}")
        print(f"{len(folders)} checkpoints, {total / 2**20:.0f} MiB in all; server at "
              f"{s3.endpoint}; --against {args.against}; load {os.getloadavg()[0]:.2f} at "
              "the start")
        rows = []
        for executor in args.executors.split(","):
            times: dict[str, list[float]] = {"disk": [], "s3": []}
            moved = listed = 0
            for r in range(args.repeats):
                order = ("disk", "s3") if r % 2 == 0 else ("s3", "disk")
                for where in order:
                    store = Path(tmp) / f"{executor}-{where}-{r}.diffract"
                    s3.reset()
                    pattern = (str(root / "step-*") if where == "disk"
                               else "s3://runs/run/step-*")
                    times[where].append(_track(pattern, store, executor, args.against))
                    if where == "s3":
                        moved, listed = s3.object_bytes, s3.listing_bytes
            disk, obj = statistics.median(times["disk"]), statistics.median(times["s3"])
            rows.append([executor, f"{disk:.1f}", f"{obj:.1f}", f"{obj / disk:.2f}x",
                         f"{moved / 2**20:.1f}", f"{moved / total:.3f}",
                         f"{listed / 2**10:.0f}"])
        table(["executor", "disk s", "s3 s", "s3 / disk", "MiB moved", "moved / ckpts",
               "listings KiB"], rows)
        print(f"load {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
