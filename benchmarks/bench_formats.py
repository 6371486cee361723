"""Opening large checkpoints of every format reads their metadata, not their weights.

Writes (once, cached under ``--dir``) one file per format with ``--gib`` GiB of float
weights in 1024x1024 float32 matrices (an ONNX model with embedded initializers is
capped at 1.9 GiB, protocol buffers' limit; one with external data has no cap; safetensors
for comparison), then, each in a fresh process, times ``models.add`` (which lists every
parameter with its shape and dtype) and counts the bytes the process read
(``/proc/self/io`` rchar). Then reads one matrix, to show a weight is one read of its
bytes.

    python benchmarks/bench_formats.py [--dir /tmp/diffract-formats-bench] [--gib 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

SIDE = 1024
PROBE = """
import json, sys, time
start = time.perf_counter()
from diffract import Session
with Session() as s:
    s.models.add(sys.argv[1], "m")
    listed = time.perf_counter() - start
    params = s.models.params("m")
    io = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
    before = int(io["rchar"])
    t = time.perf_counter()
    s.store.load_weights("m", params[len(params) // 2].name)
    one = time.perf_counter() - t
    io = dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())
print(json.dumps({"listed": listed, "params": len(params), "read_mib": before / 2**20,
                  "one": one, "one_mib": (int(io["rchar"]) - before) / 2**20}))
"""


def _matrices(gib: float) -> list[np.ndarray]:
    count = max(1, int(gib * 2**30 / (SIDE * SIDE * 4)))
    block = np.random.default_rng(0).standard_normal((SIDE, SIDE)).astype(np.float32)
    return [block + np.float32(i) for i in range(count)]


def build(folder: Path, gib: float) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"safetensors": folder / "m.safetensors", "gguf (F32)": folder / "m.gguf",
             "keras (HDF5)": folder / "m.weights.h5", "flax (msgpack)": folder / "m.msgpack",
             "onnx (embedded)": folder / "m.onnx", "onnx (external data)": folder / "x.onnx"}
    if all(p.exists() for p in paths.values()):
        return paths
    weights = _matrices(gib)
    names = [f"layers.{i}.weight" for i in range(len(weights))]

    import torch
    from safetensors.torch import save_file

    save_file({n: torch.from_numpy(w) for n, w in zip(names, weights, strict=True)},
              str(paths["safetensors"]))

    import gguf

    writer = gguf.GGUFWriter(str(paths["gguf (F32)"]), "llama")
    for n, w in zip(names, weights, strict=True):
        writer.add_tensor(n, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    import h5py

    with h5py.File(paths["keras (HDF5)"], "w") as h5:
        for i, w in enumerate(weights):
            h5.create_dataset(f"layers/dense_{i}/vars/0", data=w)

    import msgpack

    def ext(a: np.ndarray) -> object:
        return msgpack.ExtType(1, msgpack.packb((a.shape, a.dtype.name, a.tobytes()),
                                                use_bin_type=True))

    with open(paths["flax (msgpack)"], "wb") as fh:
        fh.write(msgpack.packb({"params": {f"Dense_{i}": {"kernel": ext(w)}
                                           for i, w in enumerate(weights)}},
                               use_bin_type=True))

    import onnx
    from onnx import helper, numpy_helper

    def model(ws: list[np.ndarray]) -> object:
        inits = [numpy_helper.from_array(w, n) for n, w in zip(names, ws, strict=False)]
        nodes = [helper.make_node("MatMul", ["x", n], [f"y{i}"])
                 for i, n in enumerate(names[:len(ws)])]
        graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
        return helper.make_model(graph)

    embedded = weights[:max(1, int(1.9 * 2**30 / (SIDE * SIDE * 4)))]
    onnx.save(model(embedded), str(paths["onnx (embedded)"]))
    onnx.save(model(weights), str(paths["onnx (external data)"]), save_as_external_data=True,
              all_tensors_to_one_file=True, location="x.data")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/diffract-formats-bench")
    parser.add_argument("--gib", type=float, default=2.0)
    args = parser.parse_args()
    header("opening large checkpoints: listing reads metadata, not weights",
           ["diffract-formats", "gguf", "h5py", "onnx"])
    rows = []
    for kind, path in build(Path(args.dir), args.gib).items():
        data = path.with_suffix(".data")
        size = (path.stat().st_size + (data.stat().st_size if path.stem == "x" else 0)) / 2**30
        run = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True,
                             text=True, check=True)
        r = json.loads(run.stdout)
        rows.append([kind, f"{size:.2f}", r["params"], f"{r['listed']:.3f}",
                     f"{r['read_mib']:.1f}", f"{r['one']:.3f}", f"{r['one_mib']:.1f}"])
    print()
    table(["format", "GiB", "params", "add s (from process start)", "MiB read by then",
           "read one s", "MiB read for it"], rows)
    print("# MiB read by then counts every read of the process, its imports included; a "
          "matrix is 4.0 MiB")


if __name__ == "__main__":
    main()
