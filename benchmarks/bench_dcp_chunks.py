"""Adding a torch.distributed.checkpoint whose tensors have many chunks (one per rank).

Writes a DCP folder whose one tensor is stored as N chunks (one row per rank, or a square
grid of ranks), then times ``models.add`` in this process: the metadata read by the safe
unpickler, every chunk checked against its file, and the tiling check (the chunks cover
the tensor exactly once). Beside it, the tiling check alone, and the pairwise check the
reader used before (every pair of chunks compared) on the same chunks where it finishes
in minutes (its time grows with N squared: the ratio is printed where both ran).

    python benchmarks/bench_dcp_chunks.py [--sizes 1000,10000,100000] [--pairwise-max 4000]
"""

from __future__ import annotations

import argparse
import itertools
import math
import pickle
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402


def write(folder: Path, n: int, grid: bool) -> tuple[tuple[int, ...], list]:
    """A DCP folder whose tensor ``w`` is n chunks of [1, 8] rows (or a grid of square
    blocks of 4 x 4); its bytes are one sparse file (adding reads the metadata only)."""
    import torch
    import torch.distributed.checkpoint.metadata as meta
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    side = math.isqrt(n) if grid else n
    shape = (4 * side, 4 * side) if grid else (n, 8)
    places = ([((4 * i, 4 * j), (4, 4)) for i, j in itertools.product(range(side), repeat=2)]
              if grid else [((i, 0), (1, 8)) for i in range(n)])
    chunks = [meta.ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
              for o, s in places]
    data = meta.Metadata(
        state_dict_metadata={"w": meta.TensorStorageMetadata(
            meta.TensorProperties(dtype=torch.float32), torch.Size(shape), chunks)},
        storage_data={meta.MetadataIndex("w", torch.Size(o)): _StorageInfo(
            "__0_0.distcp", 64 * i, 64) for i, (o, _) in enumerate(places)})
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(pickle.dumps(data))
    with open(folder / "__0_0.distcp", "wb") as fh:
        fh.truncate(64 * len(places))
    return shape, places


def pairwise(shape: tuple[int, ...], places: list) -> bool:
    """The check the reader made before: every pair of chunks compared."""
    boxes = [p for p in places if math.prod(p[1])]
    covered = sum(math.prod(s) for _, s in boxes)
    return covered == math.prod(shape) and not any(
        all(a < b + m and b < a + k for a, k, b, m in zip(ao, an, bo, bn, strict=True))
        for i, (ao, an) in enumerate(boxes) for bo, bn in boxes[i + 1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--pairwise-max", type=int, default=4000,
                        help="run the pairwise check up to this many chunks")
    args = parser.parse_args()
    header("DCP tensors of many chunks: models.add, the tiling check, the pairwise check",
           ["torch", "numpy"])
    from diffract import Session
    from diffract_formats.dcp_reader import _tiling_problem

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in map(int, args.sizes.split(",")):
            for grid in (False, True):
                folder = Path(tmp) / f"{n}-{grid}"
                shape, places = write(folder, n, grid)
                start = time.perf_counter()
                with warnings.catch_warnings(), Session() as s:
                    s.models.add(folder, "m")
                added = time.perf_counter() - start
                start = time.perf_counter()
                assert _tiling_problem(shape, places) is None
                ours = time.perf_counter() - start
                peer = ratio = "-"
                if len(places) <= args.pairwise_max:
                    start = time.perf_counter()
                    assert pairwise(shape, places)
                    took = time.perf_counter() - start
                    peer, ratio = f"{took:.3f}", f"{took / ours:.0f}x"
                rows.append([len(places), "grid" if grid else "rows", f"{added:.2f}",
                             f"{ours:.4f}", peer, ratio])
    table(["chunks", "layout", "models.add s", "tiling s", "pairwise s", "pairwise/ours"],
          rows)


if __name__ == "__main__":
    main()
