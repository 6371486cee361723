"""Opening large checkpoints of every format reads their metadata, not their weights.

Writes (once, cached under ``--dir``) one file per format with ``--gib`` GiB of float
weights in 1024x1024 float32 matrices (an ONNX model with embedded initializers is
capped at 1.9 GiB, protocol buffers' limit; one with external data has no cap; safetensors
for comparison), then, each in a fresh process, times ``models.add`` (which lists every
parameter with its shape and dtype) and counts the bytes the process read
(``/proc/self/io`` rchar). Then reads one matrix, to show a weight is one read of its
bytes.

    python benchmarks/bench_formats.py [--dir /tmp/diffract-formats-bench] [--gib 2]

``--quantized LAYERS`` instead writes a model of OLMo-2-1B's layer shapes (q, k, v, o
2048x2048; gate, up 8192x2048; down 2048x8192; 16 layers is its size) twice, in bfloat16
and as DeepSeek-V3's FP8 (float8 values, one scale per 128x128 block, the
quantization_config beside), and analyses each (stable_rank: every weight read once, its
ESD computed) in a fresh process, printing the wall time and the peak resident memory:
dequantization on read must cost no more memory than reading bf16.

    python benchmarks/bench_formats.py --quantized 4 [--dir ...]
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


QUANTIZED_PROBE = """
import json, resource, sys, time, warnings
start = time.perf_counter()
from diffract import Session
with warnings.catch_warnings(), Session(executor="sequential") as s:
    warnings.simplefilter("ignore")
    s.models.add(sys.argv[1], "m")
    s.compute.apply("stable_rank")
    n = len(s.results.export_metrics("stable_rank")["m"])
print(json.dumps({"s": time.perf_counter() - start, "matrices": n,
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def build_quantized(folder: Path, layers: int) -> dict[str, Path]:
    """The same OLMo-2-1B-shaped layers in bf16 and in FP8 with 128x128 block scales."""
    import torch
    from safetensors.torch import save_file

    shapes = {"q_proj": (2048, 2048), "k_proj": (2048, 2048), "v_proj": (2048, 2048),
              "o_proj": (2048, 2048), "gate_proj": (8192, 2048), "up_proj": (8192, 2048),
              "down_proj": (2048, 8192)}
    paths = {"bfloat16": folder / f"bf16-{layers}", "fp8 block 128x128": folder / f"fp8-{layers}"}
    if all((p / "model.safetensors").exists() for p in paths.values()):
        return paths
    gen = torch.Generator().manual_seed(0)
    bf16, fp8 = {}, {}
    for i in range(layers):
        for leaf, (rows, cols) in shapes.items():
            name = f"model.layers.{i}.mlp.{leaf}.weight"
            w = torch.randn(rows, cols, generator=gen) / cols ** 0.5
            bf16[name] = w.to(torch.bfloat16)
            tiles = w.reshape(rows // 128, 128, cols // 128, 128)
            scale = tiles.abs().amax(dim=(1, 3)) / 448.0
            fp8[name] = (tiles / scale[:, None, :, None]).reshape(rows, cols).to(
                torch.float8_e4m3fn)
            fp8[name + "_scale_inv"] = scale
    for (kind, path), state in zip(paths.items(), (bf16, fp8), strict=True):
        path.mkdir(parents=True, exist_ok=True)
        save_file(state, str(path / "model.safetensors"))
        config = {"model_type": "olmo2"}
        if kind.startswith("fp8"):
            config["quantization_config"] = {"quant_method": "fp8",
                                             "weight_block_size": [128, 128]}
        (path / "config.json").write_text(json.dumps(config))
    return paths


def quantized(folder: Path, layers: int) -> None:
    header(f"dequantized on read: {layers} OLMo-2-1B-shaped layers, bf16 against FP8 "
           "block-scaled (stable_rank of every matrix, fresh processes)", ["diffractml-formats"])
    rows, peaks = [], {}
    for kind, path in build_quantized(folder, layers).items():
        run = subprocess.run([sys.executable, "-c", QUANTIZED_PROBE, str(path)],
                             capture_output=True, text=True, check=True)
        r = json.loads(run.stdout.strip().splitlines()[-1])
        peaks[kind] = r["peak_mib"]
        size = (path / "model.safetensors").stat().st_size / 2**20
        rows.append([kind, f"{size:.0f}", r["matrices"], f"{r['s']:.1f}",
                     f"{r['peak_mib']:.0f}"])
    table(["stored as", "MiB on disk", "matrices", "s (from process start)", "peak RSS MiB"],
          rows)
    print(f"# peak RSS fp8 / bf16: {peaks['fp8 block 128x128'] / peaks['bfloat16']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default="/tmp/diffract-formats-bench")
    parser.add_argument("--gib", type=float, default=2.0)
    parser.add_argument("--quantized", type=int, metavar="LAYERS",
                        help="compare bf16 and FP8 block-scaled checkpoints of LAYERS layers")
    args = parser.parse_args()
    if args.quantized:
        quantized(Path(args.dir), args.quantized)
        return
    header("opening large checkpoints: listing reads metadata, not weights",
           ["diffractml-formats", "gguf", "h5py", "onnx"])
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
