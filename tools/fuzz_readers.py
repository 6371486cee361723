"""Byte-mutation fuzzing of the model formats and side files: every file a reader refuses
must be refused with a ModelSourceError (the documented error, naming the file), never
another exception, and a file it accepts must read every tensor or refuse that tensor
the same way.

    python tools/fuzz_readers.py [--formats onnx,gguf,flax,keras,config,trainer_state,
                                            adapter,adapter_config,hub_ref,hub_index]
                                 [--seconds 60] [--seed 0]

Keras/HDF5 files are opened in a child process (the HDF5 C library is not ours: a crash
there must show as a failure, not take the fuzzer down). The test suite runs a bounded,
seeded version of each (tests/formats/test_fuzz_readers.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

FORMATS = ("onnx", "gguf", "flax", "keras", "config", "trainer_state", "adapter",
           "adapter_config", "hub_ref", "hub_index")
#: Side files read through a Hugging Face cache (the cache is the fuzzed file's
#: ``models--org--x`` folder's parent; the model is added by its id).
HUB = ("hub_ref", "hub_index")


def _onnx(folder: Path) -> Path:
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 6)).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float16), "c"),
             helper.make_tensor("bf", TensorProto.BFLOAT16, [2, 3], [1.0] * 6),
             helper.make_tensor("typed", TensorProto.FLOAT, [3, 2], [2.0] * 6)]
    nodes = [helper.make_node("Gemm", ["x", "b"], ["h"], transB=1),
             helper.make_node("MatMul", ["h", "c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
    path = folder / "m.onnx"
    save(helper.make_model(graph), str(path))
    return path


def _gguf(folder: Path) -> Path:
    import gguf

    rng = np.random.default_rng(0)
    path = folder / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_head_count(2)
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((8, 32)).astype(np.float32))
    writer.add_tensor("tok.weight", rng.standard_normal((4, 32)).astype(np.float16))
    q8 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("blk.0.ffn.weight", gguf.quants.quantize(
        rng.standard_normal((2, 32)).astype(np.float32), q8), raw_dtype=q8)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _flax(folder: Path) -> Path:
    import msgpack

    def ext(a: np.ndarray, dtype: str | None = None) -> object:
        return msgpack.ExtType(1, msgpack.packb((a.shape, dtype or a.dtype.name, a.tobytes()),
                                                use_bin_type=True))

    rng = np.random.default_rng(0)
    flat = rng.standard_normal(12).astype(np.float32)
    tree = {"params": {"Dense_0": {"kernel": ext(rng.standard_normal((3, 4)).astype("f4"))},
                       "E": {"embedding": ext(rng.standard_normal((5, 2)).astype("f2"))},
                       "Q": {"w": ext(np.arange(6, dtype=np.uint8).reshape(2, 3),
                                      "float8_e4m3fn")},
                       "Big": {"w": {"__msgpack_chunked_array__": True, "shape": (3, 4),
                                     "chunks": {"0": ext(flat[:6]), "1": ext(flat[6:])}}}},
            "step": 3}
    path = folder / "m.msgpack"
    path.write_bytes(msgpack.packb(tree, use_bin_type=True))
    return path


def _keras(folder: Path) -> Path:
    import h5py

    path = folder / "m.weights.h5"
    with h5py.File(path, "w") as h5:
        h5.create_dataset("layers/dense/vars/0", data=np.ones((4, 6), np.float32))
        h5.create_dataset("layers/dense/vars/1", data=np.ones(6, np.float32))
        h5.create_dataset("layers/c/vars/0", data=np.ones((8, 8), np.float32), chunks=(4, 4),
                          compression="gzip")
    return path


def _hf_folder(folder: Path, side: str, text: str) -> Path:
    """A Hugging Face-style folder whose side file ``side`` holds ``text``; the path the
    mutations go to is that side file."""
    import torch
    from safetensors.torch import save_file

    ck = folder / "checkpoint-100"
    ck.mkdir()
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.ones(8, 8),
               "model.layers.0.self_attn.k_proj.weight": torch.ones(4, 8)},
              str(ck / "model.safetensors"))
    (ck / side).write_text(text)
    return ck / side


def _config(folder: Path) -> Path:
    return _hf_folder(folder, "config.json", json.dumps(
        {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 1,
         "hidden_size": 8, "head_dim": 4, "architectures": ["LlamaForCausalLM"]}))


def _trainer_state(folder: Path) -> Path:
    return _hf_folder(folder, "trainer_state.json", json.dumps(
        {"global_step": 100, "epoch": 0.5, "num_input_tokens_seen": 4096,
         "log_history": [{"loss": 1.5, "step": 50}, {"loss": 1.2, "step": 100}]}))


def _peft(folder: Path) -> Path:
    """A PEFT adapter folder (two LoRA pairs, one of a convolution); its weights file."""
    import torch
    from safetensors.torch import save_file

    ad = folder / "adapter"
    ad.mkdir()
    save_file({"base_model.model.q.lora_A.weight": torch.ones(2, 8),
               "base_model.model.q.lora_B.weight": torch.ones(6, 2),
               "base_model.model.c.lora_A.weight": torch.ones(2, 3, 3, 3),
               "base_model.model.c.lora_B.weight": torch.ones(4, 2, 1, 1)},
              str(ad / "adapter_model.safetensors"))
    (ad / "adapter_config.json").write_text(json.dumps(
        {"r": 2, "lora_alpha": 4, "use_rslora": False, "target_modules": ["q", "c"]}))
    return ad / "adapter_model.safetensors"


def _hub(folder: Path, mutated: str) -> Path:
    """A Hugging Face cache holding ``org/x`` (sharded, files linking into blobs/); the
    file the mutations go to: ``refs/main`` or the snapshot's shard index (a blob)."""
    import hashlib

    import torch
    from safetensors.torch import save as save_bytes

    repo = folder / "cache" / "models--org--x"
    commit = "c" * 40
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    files = {"a.safetensors": save_bytes({"q.weight": torch.ones(8, 8)}),
             "b.safetensors": save_bytes({"k.weight": torch.ones(4, 8)}),
             "model.safetensors.index.json": json.dumps({"weight_map": {
                 "q.weight": "a.safetensors", "k.weight": "b.safetensors"}}).encode()}
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return (repo / "refs" / "main" if mutated == "ref"
            else (snapshot / "model.safetensors.index.json").resolve())


def _quantized(folder: Path, scheme: str) -> Path:
    """A quantized checkpoint of ``scheme`` (fp8 blocks, GPTQ, compressed-tensors'
    pack-quantized); the mutations go to its config.json (the quantization_config)."""
    import torch
    from safetensors.torch import save_file

    ck = folder / f"q-{scheme}"
    ck.mkdir()
    if scheme == "fp8":
        tensors = {"l.weight": torch.ones(64, 64).to(torch.float8_e4m3fn),
                   "l.weight_scale_inv": torch.ones(1, 2)}
        q = {"quant_method": "fp8", "weight_block_size": [64, 32]}
    elif scheme == "gptq":
        tensors = {"l.qweight": torch.zeros(8, 8, dtype=torch.int32),
                   "l.qzeros": torch.zeros(2, 1, dtype=torch.int32),
                   "l.scales": torch.ones(2, 8, dtype=torch.float16),
                   "l.g_idx": torch.arange(64, dtype=torch.int32) // 32}
        q = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
             "checkpoint_format": "gptq"}
    else:
        tensors = {"l.weight_packed": torch.zeros(8, 2, dtype=torch.int32),
                   "l.weight_scale": torch.ones(8, 1), "l.weight_shape": torch.tensor([8, 16])}
        q = {"quant_method": "compressed-tensors", "format": "pack-quantized",
             "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "channel",
                                                 "symmetric": True}, "targets": ["Linear"]}}}
    save_file(tensors, str(ck / "model.safetensors"))
    (ck / "config.json").write_text(json.dumps({"model_type": "llama",
                                                "quantization_config": q}))
    return ck / "config.json"


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "quant_fp8": lambda folder: _quantized(folder, "fp8"),
    "quant_gptq": lambda folder: _quantized(folder, "gptq"),
    "quant_compressed": lambda folder: _quantized(folder, "compressed"),
    "onnx": _onnx, "gguf": _gguf, "flax": _flax, "keras": _keras, "config": _config,
    "trainer_state": _trainer_state, "adapter": _peft,
    "adapter_config": lambda folder: _peft(folder).parent / "adapter_config.json",
    "hub_ref": lambda folder: _hub(folder, "ref"),
    "hub_index": lambda folder: _hub(folder, "index")}


def mutate(blob: bytes, rng: random.Random) -> bytes:
    """1-4 mutations anywhere: bit flips, interesting bytes (0, 0xff, 0x7f, JSON and
    msgpack/protobuf markers), insertions, deletions, a large little-endian integer."""
    out = bytearray(blob)
    for _ in range(rng.randint(1, 4)):
        kind, at = rng.random(), rng.randrange(0, max(len(out), 1))
        if kind < 0.35 and out:
            out[at] ^= 1 << rng.randrange(8)
        elif kind < 0.6 and out:
            out[at] = rng.choice(b'\x00\xff\x7f\x80\xc0\xde\xdf\xdc\xc7\xd8[]{}":,-9e0tn')
        elif kind < 0.75:
            out[at:at] = rng.choice([b"\xff" * rng.randint(1, 9), b"\x80" * 10, b"[" * 64,
                                     b"{", b'"x":', b"-1", b"1e999", b"\xde\xff\xff"])
        elif kind < 0.9 and out:
            del out[at:at + rng.randint(1, 8)]
        else:
            width = rng.choice([2, 4, 8])
            out[at:at + width] = rng.randrange(0, 1 << (8 * width)).to_bytes(width, "little")
    return bytes(out)


def _exercise(kind: str, path: Path) -> None:
    """Open, list and read everything the way the core does for ``kind``."""
    import os

    from diffract import Session

    if kind in HUB:
        before = os.environ.get("HF_HUB_CACHE")
        os.environ["HF_HUB_CACHE"] = str(next(p for p in path.parents if p.name == "cache"))
        try:
            with Session() as s:
                s.models.add("org/x", "m")
                for p in s.models.params("m"):
                    s.store.load_weights("m", p.name)
        finally:  # the test suite runs this in its own process
            if before is None:
                del os.environ["HF_HUB_CACHE"]
            else:
                os.environ["HF_HUB_CACHE"] = before
        return
    if kind in ("config", "trainer_state", "adapter", "adapter_config") or \
            kind.startswith("quant_"):
        with Session() as s:
            views = {"views": ["heads"]} if kind == "config" else {}
            s.models.add(path.parent, "m", **views)
            for p in s.models.params("m"):
                s.store.load_weights("m", p.name)
        return
    from diffract.plugins import get_catalog

    fmt = get_catalog().formats[{"flax": "flax", "keras": "keras"}.get(kind, kind)]
    reader = fmt.open(str(path))
    for entry in reader.entries():
        reader.read_numpy(entry.name) if hasattr(reader, "read_numpy") else reader.read(
            entry.name)
    if hasattr(reader, "config"):
        reader.config()


def run(kind: str, iterations: int | None, seconds: float,
        seed: int) -> tuple[int, int, list[str]]:
    """(files tried, files refused, unexpected errors as text) for one format."""
    from diffract.errors import EmptyModelError, ModelSourceError

    rng = random.Random(seed)
    tried = refused = 0
    unexpected: list[str] = []
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = BUILDERS[kind](Path(folder))
        blob = path.read_bytes()
        deadline = time.monotonic() + seconds
        while (iterations is None or tried < iterations) and time.monotonic() < deadline:
            mutated = mutate(blob, rng)
            path.write_bytes(mutated)
            tried += 1
            try:
                _exercise(kind, path)
            except (ModelSourceError, EmptyModelError):  # EmptyModelError: nothing to read
                refused += 1
            except Exception as exc:  # noqa: BLE001 - what the fuzzer is looking for
                unexpected.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]} "
                                  f"<- seed {seed}, file {tried}")
    return tried, refused, unexpected


def run_in_child(kind: str, iterations: int, seed: int,
                 timeout: float = 600) -> tuple[int, int, list[str]]:
    """:func:`run` in a child process (for HDF5, whose C library could crash it)."""
    done = subprocess.run([sys.executable, __file__, "--formats", kind, "--iterations",
                           str(iterations), "--seed", str(seed), "--json"],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode not in (0, 1):
        return 0, 0, [f"{kind}: the child died with code {done.returncode}: "
                      f"{done.stderr[-500:]}"]
    tried, refused, unexpected = json.loads(done.stdout.strip().splitlines()[-1])
    return tried, refused, unexpected


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    failed = False
    for kind in args.formats.split(","):
        if kind == "keras" and not args.json:
            tried, refused, unexpected = run_in_child(kind, args.iterations or 10**9,
                                                      args.seed, args.seconds + 600)
        else:
            tried, refused, unexpected = run(kind, args.iterations, args.seconds, args.seed)
        if args.json:
            print(json.dumps([tried, refused, unexpected]))
            return 1 if unexpected else 0
        print(f"{kind}: {tried} mutated files, {refused} refused (a documented error), "
              f"{len(unexpected)} other exceptions")
        for line in unexpected[:20]:
            print("  " + line)
        failed = failed or bool(unexpected)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
