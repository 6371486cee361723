"""Store throughput: the ``local`` and ``ram`` profiles against raw np.save/np.load.

Writes and reads back 10,000 scalar fields (committed 1,000 per chunk, as the runner
does) and 100 arrays of 64 MiB (4 per chunk) on each store, and the same arrays with
np.save/np.load as the floor. Reads touch every byte (a sum), so a memory-mapped read
pays for its pages. Correctness: tests/storage/test_local.py (TestStoreContract).

    python benchmarks/bench_store.py [--arrays 100] [--array-mib 64] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402


def _store(kind: str, root: Path):
    from diffract_storage_local import LocalStore

    from diffract.plugins import ModelSource, ParamInfo, RamStore

    store = RamStore() if kind == "ram" else LocalStore(root / "store")
    store.add_model("m", [ParamInfo("m", f"p{i}", (1,), "float64") for i in range(1000)],
                    ModelSource("memory"), lambda name: np.zeros(1), copy_weights=False)
    return store


def _scalars(store) -> tuple[float, float]:
    from diffract.plugins import Batch, Provenance

    prov = Provenance("k", "bench", "{}")
    start = time.perf_counter()
    for f in range(10):
        store.commit(Batch(values={("m", f"p{i}", f"f{f}"): float(i * f) for i in range(1000)},
                           provenance={f"f{f}": prov}))
    write = time.perf_counter() - start
    start = time.perf_counter()
    total = 0.0
    for f in range(10):
        for i in range(1000):
            total += store.read("m", f"p{i}", f"f{f}")
    read = time.perf_counter() - start
    assert total == sum(i * f for f in range(10) for i in range(1000))
    return write, read


def _arrays_store(store, arrays: list[np.ndarray]) -> tuple[float, float]:
    from diffract.plugins import Batch

    start = time.perf_counter()
    for k in range(0, len(arrays), 4):
        store.commit(Batch(values={("m", f"p{i}", "big"): arrays[i] for i in range(k, k + 4)
                                   if i < len(arrays)}))
    write = time.perf_counter() - start
    start = time.perf_counter()
    sums = [float(np.sum(store.read("m", f"p{i}", "big"))) for i in range(len(arrays))]
    read = time.perf_counter() - start
    assert sums == [float(np.sum(a)) for a in arrays]
    return write, read


def _arrays_raw(root: Path, arrays: list[np.ndarray]) -> tuple[float, float]:
    root.mkdir()
    start = time.perf_counter()
    for i, a in enumerate(arrays):
        np.save(root / f"{i}.npy", a)
    write = time.perf_counter() - start
    start = time.perf_counter()
    sums = [float(np.sum(np.load(root / f"{i}.npy"))) for i in range(len(arrays))]
    read = time.perf_counter() - start
    assert sums == [float(np.sum(a)) for a in arrays]
    return write, read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=100)
    parser.add_argument("--array-mib", type=int, default=64)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    header("store throughput: local vs ram vs raw np.save/np.load",
           ["diffractml-core", "diffractml-storage-local", "numpy"])
    n = args.array_mib * (1 << 20) // 8
    rng = np.random.default_rng(0)
    base = rng.standard_normal(n)
    arrays = [base + i for i in range(args.arrays)]  # distinct contents, one RNG draw
    scratch = Path(tempfile.mkdtemp(prefix="diffract-bench-", dir=args.dir))
    try:
        rows = []
        results = {}
        for kind in ("local", "ram"):
            root = scratch / kind
            root.mkdir()
            store = _store(kind, root)
            results[(kind, "scalars")] = _scalars(store)
            results[(kind, "arrays")] = _arrays_store(store, arrays)
            store.close()
            del store
        results[("raw", "arrays")] = _arrays_raw(scratch / "raw", arrays)
        gib = args.arrays * args.array_mib / 1024
        for (kind, what), (write, read) in results.items():
            if what == "scalars":
                rows.append([kind, "10,000 scalars", f"{write:.2f} s", f"{read:.2f} s", "", ""])
            else:
                rows.append([kind, f"{args.arrays} x {args.array_mib} MiB", f"{write:.2f} s",
                             f"{read:.2f} s", f"{gib / write:.2f} GiB/s",
                             f"{gib / read:.2f} GiB/s"])
        table(["store", "what", "write", "read", "write rate", "read rate"], rows)
        lw, lr = results[("local", "arrays")]
        rw, rr = results[("raw", "arrays")]
        print(f"local / raw np.save+np.load for arrays: write {lw / rw:.2f}x, read {lr / rr:.2f}x, "
              f"both {(lw + lr) / (rw + rr):.2f}x (target <= 1.5x)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
