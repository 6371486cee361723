"""A checkpoint larger than the cache budget: frob_norm and esd of a generated bf16
GPT-style safetensors file on the ``local`` profile, with wall time and the peak
resident memory of the analysing process tree.

The checkpoint (default 4 GiB: 2560-wide, 26 blocks of qkv/out/up/down matrices and an
embedding) is written tensor by tensor, so generating it needs little memory. The
analysis runs in a child process with ``[cache] max_bytes`` = 1 GiB; its resident set
(and its children's) is sampled every 20 ms. Target: peak under 1.5 GiB.
Correctness of the fields: tests/core/test_model_files.py, tests/spectral.

    python benchmarks/bench_bigmodel.py [--gib 4] [--cache-gib 1] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header  # noqa: E402


def shapes(target_bytes: int, width: int = 2560) -> list[tuple[str, tuple[int, int]]]:
    """GPT-style parameter shapes adding up to about ``target_bytes`` of bf16."""
    out = [("embed.weight", (50257, width))]
    block = [("attn.qkv.weight", (width, 3 * width)), ("attn.out.weight", (width, width)),
             ("mlp.up.weight", (4 * width, width)), ("mlp.down.weight", (width, 4 * width))]
    per_block = sum(a * b for _, (a, b) in block) * 2
    for i in range(max(1, (target_bytes - 50257 * width * 2) // per_block)):
        out += [(f"blocks.{i}.{name}", shape) for name, shape in block]
    return out


def write_checkpoint(path: Path, layout: list[tuple[str, tuple[int, int]]]) -> int:
    """Stream a safetensors file of random bf16 tensors (N(0, 0.02) entries)."""
    meta, offset = {}, 0
    for name, shape in layout:
        size = shape[0] * shape[1] * 2
        meta[name] = {"dtype": "BF16", "shape": list(shape),
                      "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(meta).encode()
    head += b" " * (-len(head) % 8)
    rng = np.random.default_rng(0)
    with open(path, "wb") as fh:
        fh.write(len(head).to_bytes(8, "little"))
        fh.write(head)
        for _, shape in layout:
            rows = max(1, (64 << 20) // (shape[1] * 4))
            for start in range(0, shape[0], rows):
                n = min(rows, shape[0] - start)
                block = rng.standard_normal((n, shape[1]), dtype=np.float32) * np.float32(0.02)
                fh.write((block.view(np.uint32) >> 16).astype(np.uint16).tobytes())
    return path.stat().st_size


CHILD = """
import sys, time
from diffract import Session
path, store, cache = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()
config = {"cache": {"max_bytes": cache}, "parallel": {"executor": "sequential"}}
with Session(profile="local", path=store, config=config) as s:
    s.models.add(path, model_id="gpt")
    report = s.compute.apply("frob_norm", "esd")
    n = len(s.results.export_metrics("esd")["gpt"])
seconds = time.perf_counter() - start
print(f"computed {report.computed} ({n} spectra) in {seconds:.1f} s", flush=True)
"""


def _tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (from /proc)."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    stack += [int(c) for c in fh.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="checkpoint size")
    parser.add_argument("--cache-gib", type=float, default=1.0, help="[cache] max_bytes")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    header("a checkpoint larger than the cache budget: frob_norm + esd on the local profile",
           ["diffractml-core", "diffractml-storage-local", "diffractml-kernels-spectral",
            "safetensors", "torch"])
    scratch = Path(tempfile.mkdtemp(prefix="diffract-big-", dir=args.dir))
    try:
        layout = shapes(int(args.gib * (1 << 30)))
        start = time.perf_counter()
        size = write_checkpoint(scratch / "model.safetensors", layout)
        print(f"# checkpoint: {len(layout)} bf16 tensors, {size / (1 << 30):.2f} GiB, written in "
              f"{time.perf_counter() - start:.0f} s")
        cache = int(args.cache_gib * (1 << 30))
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(scratch / "model.safetensors"),
                                  str(scratch / "store"), str(cache)], stdout=subprocess.PIPE,
                                 text=True)
        peak = 0
        while child.poll() is None:
            peak = max(peak, _tree_rss(child.pid))
            time.sleep(0.02)
        out = child.stdout.read().strip()
        wall = time.perf_counter() - start
        if child.returncode:
            raise SystemExit(f"analysis failed with exit code {child.returncode}")
        print(f"# {out}")
        print(f"wall {wall:.1f} s; peak resident memory of the process tree "
              f"{peak / (1 << 30):.2f} GiB with a {args.cache_gib:g} GiB cache budget "
              f"(target < 1.5 GiB); checkpoint {size / (1 << 30):.2f} GiB")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
