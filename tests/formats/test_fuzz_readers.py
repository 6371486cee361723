"""One error family for the newer readers and the side files: a seeded fuzz run per
reader (tools/fuzz_readers.py; bounded here, longer as a script) and the cases found by
hand, each of which was a raw exception (AttributeError, TypeError, OSError, numpy's
messages) or a silently wrong shape before."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ModelSourceError

pytest.importorskip("onnx")
pytest.importorskip("msgpack")


@pytest.mark.parametrize(("kind", "count"), [("onnx", 1500), ("gguf", 800), ("flax", 1500),
                                             ("keras", 400), ("config", 300),
                                             ("trainer_state", 300), ("adapter", 400),
                                             ("adapter_config", 300), ("hub_ref", 300),
                                             ("hub_index", 300), ("quant_fp8", 600),
                                             ("quant_gptq", 600),
                                             ("quant_compressed", 600)])
def test_fuzzed_files_fail_only_with_the_documented_error(tool, kind, count):
    """Mutated files of each kind: a ModelSourceError or a clean read, never another exception."""
    fuzz = tool("fuzz_readers")
    if kind == "gguf":
        pytest.importorskip("gguf")
    if kind == "keras":
        pytest.importorskip("h5py")
        tried, refused, unexpected = fuzz.run_in_child(kind, count, seed=1)
    else:
        tried, refused, unexpected = fuzz.run(kind, count, 600.0, seed=1)
    assert unexpected == []
    assert tried == count and 0 < refused
    # mutations break many files, not all (a ref is a commit or broken: nearly every one)
    assert refused < tried or kind == "hub_ref"


def _add(path: Path, **options) -> dict[str, np.ndarray]:
    with Session() as s:
        s.models.add(path, "m", **options)
        return {p.name: np.asarray(s.store.load_weights("m", p.name))
                for p in s.models.params("m")}


# -- ONNX --------------------------------------------------------------------------------
def _onnx_with(tmp_path: Path, dims=(4, 6), external: dict | None = None, data=None) -> Path:
    """A model with one float initializer 'w', written field by field (onnx's helpers
    refuse the lies these tests need)."""
    from onnx import TensorProto, helper

    tensor = TensorProto()
    tensor.name, tensor.data_type = "w", TensorProto.FLOAT
    tensor.dims.extend(dims)
    if external:
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in external.items():
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        (tmp_path / "w.bin").write_bytes(np.ones(24, np.float32).tobytes())
    else:
        tensor.raw_data = data if data is not None else np.ones(
            int(np.prod(dims)), np.float32).tobytes()
    graph = helper.make_graph([], "g", [], [], initializer=[tensor])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


class TestOnnx:
    @pytest.mark.parametrize(("external", "why"), [
        ({"location": "w.bin", "offset": "-8"}, "offset '-8', not a byte count"),
        ({"location": "w.bin", "offset": "eight"}, "offset 'eight', not a byte count"),
        ({"location": "w.bin", "offset": "99999999999999999999999"}, r"declares bytes"),
        ({"location": "w.bin", "length": str(2**62)}, r"declares bytes 0 to 4611686018427387904"),
        ({"location": "w.bin", "length": "8"}, r"declares bytes 0 to 8 .* \(96 bytes\)"),
    ], ids=["negative", "text", "overflowing", "2^62-length", "short-length"])
    def test_external_offsets_and_lengths_are_checked_at_add(self, tmp_path, external, why):
        """Negative, text, overflowing and lying external ranges: refused when the model is added."""
        with pytest.raises(ModelSourceError, match=r"not a readable ONNX model: initializer 'w' .*" + why):
            _add(_onnx_with(tmp_path, external=external))

    def test_a_good_external_range_still_reads(self, tmp_path):
        values = _add(_onnx_with(tmp_path, external={"location": "w.bin", "offset": "0",
                                                      "length": "96"}))
        np.testing.assert_array_equal(values["w"], np.ones((4, 6)))

    @pytest.mark.parametrize(("dims", "why"), [
        ((4, -1), "a dimension of -1"),
        ((2**40, 2**40), r"holds 96 bytes of raw data for dims"),
        ((1,) * 10001, "10001 dimensions, more than 32"),
    ], ids=["minus-one", "int64-overflow", "rank-10001"])
    def test_impossible_dims_are_refused(self, tmp_path, dims, why):
        """-1 (listed as 18446744073709551615 before), overflowing products, rank 10001."""
        with pytest.raises(ModelSourceError, match=why):
            _add(_onnx_with(tmp_path, dims=dims, data=np.ones(24, np.float32).tobytes()))

    def test_fields_of_the_wrong_wire_type(self, tmp_path):
        """An initializer name sent as a varint: a named refusal, not AttributeError."""
        from diffract_formats._wire import protobuf_fields  # noqa: F401 - the walker used

        path = _onnx_with(tmp_path)
        blob = bytearray(path.read_bytes())
        at = blob.index(b"\x42\x01w")  # field 8 (name), wire 2, length 1, "w"
        blob[at:at + 3] = b"\x40\x07"  # field 8 as a varint (7)
        path.write_bytes(bytes(blob))
        with pytest.raises(ModelSourceError, match="field 8 of a tensor has wire type 0, not 2"):
            _add(path)


# -- Flax --------------------------------------------------------------------------------
def _flax_file(path: Path, tree: dict) -> Path:
    import msgpack

    path.write_bytes(msgpack.packb({"params": tree}, use_bin_type=True))
    return path


def _ext(shape, dtype: str, data: bytes):
    import msgpack

    return msgpack.ExtType(1, msgpack.packb((shape, dtype, data), use_bin_type=True))


class TestFlax:
    @pytest.mark.parametrize("shape", [[4.7, 4.2], "44", [True, 4], [-4, -4]],
                             ids=["floats", "a-string", "a-bool", "negative"])
    def test_shapes_that_are_not_integers_are_refused(self, tmp_path, shape):
        """[4.7, 4.2] and "44" were read as (4, 4): refused, naming the array."""
        path = _flax_file(tmp_path / "m.msgpack", {"D": {"kernel": _ext(
            shape, "float32", np.ones(16, np.float32).tobytes())}})
        with pytest.raises(ModelSourceError, match=r"array 'params.D.kernel' has shape .*not a "
                                                   r"list of non-negative integers"):
            _add(path)

    def test_fp8_arrays_read_as_safetensors_reads_them(self, tmp_path):
        """float8_e4m3fn (which Flax writes) is read as float32, equal to the safetensors path."""
        import torch

        values = torch.tensor([[0.5, -1.0, 2.0], [448.0, 0.0, -0.125]]).to(torch.float8_e4m3fn)
        bits = values.view(torch.uint8).numpy()
        path = _flax_file(tmp_path / "m.msgpack", {"Q": {"w": _ext(
            [2, 3], "float8_e4m3fn", bits.tobytes())}})
        got = _add(path)["params.Q.w"]
        np.testing.assert_array_equal(got, values.to(torch.float32).numpy())

    def test_a_map_used_as_a_key_and_an_unknown_dtype(self, tmp_path):
        """Unhashable keys and dtypes numpy does not know: named refusals, not TypeError."""
        import msgpack

        blob = msgpack.packb({"params": {"a": 1}}, use_bin_type=True)
        blob = blob.replace(b"\xa1a", b"\x81\xa1a\x01")  # the key "a" becomes a map {"a": 1}
        (tmp_path / "k.msgpack").write_bytes(blob)
        with pytest.raises(ModelSourceError, match="a msgpack map key that is a map"):
            _add(tmp_path / "k.msgpack")
        path = _flax_file(tmp_path / "d.msgpack", {"D": {"w": _ext([2, 2], "float7_odd",
                                                                 b"\x00" * 4)}})
        with pytest.raises(ModelSourceError, match="has dtype 'float7_odd', not one Diffract reads"):
            _add(path)

    def test_the_chunked_layout_flax_writes(self, tmp_path):
        """A chunked array's shape as a map {"0": 24, "1": 21} and more than ten chunks, numbered."""
        flat = np.arange(24 * 21, dtype=np.float32)
        parts = np.array_split(flat, 12)
        chunked = {"__msgpack_chunked_array__": True, "shape": {"0": 24, "1": 21},
                   "chunks": {str(i): _ext(list(p.shape), "float32", p.tobytes())
                              for i, p in enumerate(parts)}}
        got = _add(_flax_file(tmp_path / "m.msgpack", {"Big": {"w": chunked}}))["params.Big.w"]
        np.testing.assert_array_equal(got, flat.reshape(24, 21))


# -- GGUF --------------------------------------------------------------------------------
def test_a_gguf_tensor_whose_shape_its_blocks_do_not_divide(tmp_path, tool):
    """A Q8_0 tensor re-declared with 48 columns (blocks of 32): a named refusal at add."""
    pytest.importorskip("gguf")
    path = tool("fuzz_readers")._gguf(tmp_path)
    blob = bytearray(path.read_bytes())
    name = b"blk.0.ffn.weight"
    at = blob.index(name) + len(name)  # then n_dims (u32), the dims (u64 each), the type
    assert int.from_bytes(blob[at + 4:at + 12], "little") == 32
    blob[at + 4:at + 12] = (48).to_bytes(8, "little")
    path.write_bytes(bytes(blob))
    with pytest.raises(ModelSourceError, match=r"(blk.0.ffn.weight.* blocks of 32 do not "
                                               r"divide|row size \(48\) is not a multiple)"):
        _add(path)


# -- views on a configuration ------------------------------------------------------------
@pytest.mark.parametrize("heads", [True, 12.0, "12", -4])
def test_a_head_count_that_is_not_a_positive_integer_is_refused(tmp_path, heads):
    """num_attention_heads: true was one head covering the matrix: refused, naming the key."""
    import torch
    from safetensors.torch import save_file

    save_file({"model.layers.0.self_attn.q_proj.weight": torch.ones(24, 24)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": heads,
                                                      "hidden_size": 24}))
    with pytest.raises(ModelSourceError) as caught:
        _add(tmp_path, views=["heads"])
    assert (f"num_attention_heads is {heads!r} in {tmp_path / 'config.json'}, not a positive "
            'integer; fix it there or pass view_options={"heads": N}') in str(caught.value)


def test_the_command_line_names_the_file_and_its_own_option(tmp_path, capsys):
    """The same refusal from the shell: exit 2, the file, --view-option (not Python)."""
    import torch
    from safetensors.torch import save_file

    from diffract.cli import main

    save_file({"model.layers.0.self_attn.q_proj.weight": torch.ones(24, 24)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 3,
                                                      "num_key_value_heads": 1.5,
                                                      "hidden_size": 24}))
    assert main(["analyze", str(tmp_path / "model.safetensors"), "--views", "heads"]) == 2
    err = capsys.readouterr().err
    assert (f"num_key_value_heads is 1.5 in {tmp_path / 'config.json'}, not a positive "
            "integer; fix it there or pass --view-option kv_heads=N") in err
    assert "view_options" not in err


def test_a_gguf_array_declaring_more_items_than_the_file_holds(tmp_path, tool):
    """An array of 3 ints re-declared with 2^60 items (2 KB file): the gguf library loops
    over the declared length past the file's end and grew a fuzzing process to 23 GB
    (OOM-killed); the header is walked with its counts checked first."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("llama.rope.dimension_sections", [1, 2, 3])
    writer.add_tensor("w", np.ones((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    blob = bytearray(path.read_bytes())
    key = b"llama.rope.dimension_sections"
    at = blob.index(key) + len(key) + 4 + 4  # the value type (array), the item type (int32)
    assert int.from_bytes(blob[at:at + 8], "little") == 3
    blob[at:at + 8] = (1 << 60).to_bytes(8, "little")
    path.write_bytes(bytes(blob))
    with pytest.raises(ModelSourceError, match=r"an array declares 1152921504606846976 items "
                                               r"of 4 bytes, more than the \d+ bytes left"):
        _add(path)
