"""Checkpoint files and directories: the formats models.add reads, and a clear
ModelSourceError (naming file, model and fix) for everything it cannot."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ApplyError, ModelSourceError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _state(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return {"emb.weight": torch.randn(12, 6, generator=g).to(dtype),
            "layer.weight": torch.randn(5, 6, generator=g).to(dtype),
            "layer.bias": torch.randn(5, generator=g).to(dtype),
            "steps": torch.tensor(3)}  # an integer buffer: not a weight


def _norms(session, model_id):
    session.compute.apply("frob_norm")
    return {p: r["frob_norm"] for p, r in session.results.export_metrics("frob_norm")[model_id].items()}


def _expected(state):
    return {k: float(v.double().norm()) for k, v in state.items() if v.dtype.is_floating_point}


class TestFormats:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                             ids=["fp32", "fp16", "bf16"])
    def test_safetensors_file(self, tmp_path, dtype):
        """A .safetensors file in any float dtype: parameters, dtypes, values."""
        state = _state(dtype)
        path = tmp_path / "m.safetensors"
        safetensors_torch.save_file(state, str(path))
        with Session() as s:
            names = s.models.add(path, model_id="m")
            assert names == ["emb.weight", "layer.bias", "layer.weight"]
            assert {p.dtype for p in s.models.params("m")} == {str(dtype).removeprefix("torch.")}
            got = _norms(s, "m")
            tensor = s.store.load_tensor("m", "emb.weight")
        assert tensor.dtype == dtype
        assert got == pytest.approx(_expected(state), rel=1e-6)

    @pytest.mark.parametrize("layout", ["sharded-safetensors", "single-safetensors",
                                        "sharded-torch", "single-torch"])
    def test_hugging_face_style_directories(self, tmp_path, layout):
        """A checkpoint directory: sharded with its index, or a single file."""
        state = _state()
        root = tmp_path / "ckpt"
        root.mkdir()
        floats = {k: v for k, v in state.items()}
        ext, save = ((".safetensors", lambda d, p: safetensors_torch.save_file(d, str(p)))
                     if "safetensors" in layout else (".bin", lambda d, p: torch.save(d, p)))
        stem = "model" if ext == ".safetensors" else "pytorch_model"
        if layout.startswith("sharded"):
            shards = {f"{stem}-00001-of-00002{ext}": ["emb.weight", "steps"],
                      f"{stem}-00002-of-00002{ext}": ["layer.weight", "layer.bias"]}
            weight_map = {}
            for shard, names in shards.items():
                save({n: floats[n] for n in names}, root / shard)
                weight_map.update({n: shard for n in names})
            (root / f"{stem}{ext}.index.json").write_text(json.dumps({"weight_map": weight_map}))
        else:
            save(floats, root / f"{stem}{ext}")
        with Session() as s:
            s.models.add(root, model_id="m")
            assert s.store.source("m").kind == "directory"
            assert _norms(s, "m") == pytest.approx(_expected(state), rel=1e-6)

    def test_legacy_torch_format(self, tmp_path):
        """A state dict saved in torch's legacy (non-zip) format loads, weights only."""
        state = _state()
        path = tmp_path / "legacy.pt"
        torch.save(state, path, _use_new_zipfile_serialization=False)
        with Session() as s:
            s.models.add(path, model_id="m")
            assert _norms(s, "m") == pytest.approx(_expected(state), rel=1e-6)


class TestErrors:
    def _refused(self, source, match):
        with Session() as s:
            with pytest.raises(ModelSourceError, match=match) as info:
                s.models.add(source, model_id="m")
            assert s.model_ids == []  # nothing half-added
        assert info.value.model_id == "m"
        assert "weights_only=False" not in str(info.value)
        return info.value

    def test_truncated_and_lying_safetensors(self, tmp_path):
        """A truncated file and a header that lies about its length name the file."""
        path = tmp_path / "m.safetensors"
        safetensors_torch.save_file(_state(), str(path))
        data = path.read_bytes()
        (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 40])
        self._refused(tmp_path / "cut.safetensors",
                      r"Model 'm': not a readable safetensors file: .* export it again \('.*cut\.safetensors'\)")
        lying = (10**9).to_bytes(8, "little") + data[8:]
        (tmp_path / "lie.safetensors").write_bytes(lying)
        self._refused(tmp_path / "lie.safetensors", r"not a readable safetensors file")

    def test_missing_shard_and_directory_for_a_file(self, tmp_path):
        """An index naming an absent shard; a directory named like a file; an empty one."""
        root = tmp_path / "ckpt"
        root.mkdir()
        safetensors_torch.save_file({"a": torch.ones(2, 2)}, str(root / "s1.safetensors"))
        (root / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
        self._refused(root, r"the shard index lists 1 missing shard\(s\): \['s2.safetensors'\]")
        (tmp_path / "x.safetensors").mkdir()
        self._refused(tmp_path / "x.safetensors", r"this is a directory, not a checkpoint file")
        (tmp_path / "empty").mkdir()
        self._refused(tmp_path / "empty", r"not a checkpoint directory any installed format reads \(huggingface: a Hugging Face-style checkpoint directory holding model.safetensors.index.json")

    def test_a_pickle_that_is_not_a_plain_state_dict_names_the_global(self, tmp_path):
        """A checkpoint holding arbitrary objects names the offending global and how to
        save a plain state dict; it is never unpickled."""
        path = tmp_path / "obj.pt"
        torch.save({"w": torch.ones(2), "extra": argparse.Namespace(a=1)}, path)
        self._refused(path, r"cannot read obj.pt with torch.load\(weights_only=True\): it holds "
                            r"a pickled argparse.Namespace, not a plain state dict of tensors\. "
                            r"Diffract never unpickles arbitrary objects: save model.state_dict\(\)")

    def test_unknown_extension_and_missing_file(self, tmp_path):
        """Unsupported file types list the supported ones; a missing file says so."""
        (tmp_path / "m.ckpt").write_bytes(b"x")
        self._refused(tmp_path / "m.ckpt", r"unsupported file type '.ckpt': use .safetensors, .pt, .pth, .bin, .npz, .gguf, .onnx, .keras, .h5, .hdf5, .msgpack, or a checkpoint directory .* More formats come from plugins with a diffract_model_formats hook")
        self._refused(tmp_path / "nope.safetensors", r"the file does not exist")


class TestChangedFiles:
    def test_a_file_truncated_after_it_was_added_fails_its_parameters(self, tmp_path):
        """Truncating a memory-mapped checkpoint after add is detected before reading:
        each parameter fails with what changed; the process (and other models) survive."""
        path = tmp_path / "m.safetensors"
        safetensors_torch.save_file(_state(), str(path))
        with Session() as s:
            s.models.add(path, model_id="m")
            s.models.add({"w": np.ones((2, 2))}, model_id="other")
            with open(path, "r+b") as fh:
                fh.truncate(path.stat().st_size // 2)
            with pytest.raises(ApplyError, match=r"3 unit\(s\) failed") as info:
                s.compute.apply("frob_norm")
            reasons = {f.unit: f.reason for f in info.value.report.failures}
            assert set(reasons) == {"m/emb.weight", "m/layer.weight", "m/layer.bias"}
            assert all("changed since the model was added: its size changed" in r
                       for r in reasons.values())
            assert s.results.export_metrics("frob_norm")["other"]["w"]["frob_norm"] == 2.0


@pytest.fixture
def halves():
    """A view rule registered by hand: a 2-D parameter in two halves of rows or columns
    (option ``axis``)."""
    from diffract.plugins import (
        View,
        ViewRule,
        _runtime,
        hookimpl,
        make_plugin_manager,
        set_plugin_manager,
    )

    class Halves:
        @hookimpl
        def diffract_param_views(self):
            def split(param, config, options):
                axis = options.get("axis", 0)
                size = param.shape[axis] // 2
                return [View(f"half={i}", (slice(i * size, (i + 1) * size),) if axis == 0
                             else (slice(None), slice(i * size, (i + 1) * size)))
                        for i in range(2)]
            yield ViewRule("halves", split)

    previous = _runtime._MANAGER
    manager = make_plugin_manager()
    manager.register_plugin(Halves(), distribution="test-halves")
    set_plugin_manager(manager)
    yield
    set_plugin_manager(previous)


class TestViewsOfFiles:
    @pytest.mark.parametrize("axis", [0, 1], ids=["rows", "columns"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                             ids=["fp32", "fp16", "bf16"])
    def test_safetensors_slices_read_only_their_rows(self, tmp_path, halves, monkeypatch, dtype,
                                                     axis):
        """A view of a safetensors parameter equals torch's slice (numpy and as stored),
        and a row view reads only its rows."""
        from diffract_formats._safetensors import SafetensorsFile

        w = torch.randn(64, 48, generator=torch.Generator().manual_seed(1)).to(dtype)
        path = tmp_path / "m.safetensors"
        safetensors_torch.save_file({"w": w, "other": torch.ones(3, 3, dtype=dtype)}, str(path))
        calls = []
        rows = SafetensorsFile.rows
        monkeypatch.setattr(SafetensorsFile, "rows", lambda self, name, a, b, **kw:
                            calls.append((name, a, b)) or rows(self, name, a, b, **kw))
        with Session() as s:
            s.models.add(path, "m", views={"halves": {"axis": axis}})
            calls.clear()
            got = s.store.load_weights("m", "w[half=1]")
            weights_calls = list(calls)
            raw = s.store.load_tensor("m", "w[half=1]")
        want = w[32:] if axis == 0 else w[:, 24:]
        np.testing.assert_array_equal(got, want.float().numpy())
        assert raw.dtype == dtype and torch.equal(raw, want)
        if axis == 0:
            assert weights_calls == [("w", 32, 64)]
        else:
            assert weights_calls and all(name == "w" for name, _, _ in weights_calls)


class TestTrainingCheckpoints:
    def _save(self, path, **entries):
        torch.save(entries, path)
        return path

    def test_the_one_state_dict_of_a_training_checkpoint_is_read_and_named(self, tmp_path):
        """{"model": state_dict, "optimizer": ..., "step": ...}: the state dict is read,
        with a warning naming its entry."""
        from diffract.errors import ModelWarning

        state = _state()
        path = self._save(tmp_path / "ck.pt", model=state, step=7,
                          optimizer={"state": {0: {"exp_avg": torch.ones(3)}}})
        with Session() as s:
            with pytest.warns(ModelWarning, match=r"ck.pt is a training checkpoint: its state "
                                                  r"dict is entry 'model'"):
                s.models.add(path, model_id="m")
            assert _norms(s, "m") == pytest.approx(_expected(state), rel=1e-6)

    def test_several_state_dicts_need_a_key_which_a_reopen_keeps(self, tmp_path):
        """model and ema: refused with both names; key= picks one, also after a reopen of
        the durable store; a key that holds no state dict is named; formats without the
        option refuse it."""
        state, ema = _state(), {k: v * 2 for k, v in _state().items()}
        path = self._save(tmp_path / "two.pt", model=state, ema=ema)
        with Session() as s:
            with pytest.raises(ModelSourceError, match=r"two.pt is a training checkpoint with "
                                                       r"several state dicts: \['ema', 'model'\]; "
                                                       r"choose one with key=NAME"):
                s.models.add(path, model_id="m")
            with pytest.raises(ModelSourceError, match=r"two.pt has no entry 'opt' holding a "
                                                       r"state dict; the entries that do: "
                                                       r"\['ema', 'model'\]"):
                s.models.add(path, model_id="m", key="opt")
        store = tmp_path / "store"
        with Session(profile="local", path=store) as s:
            s.models.add(path, model_id="m", key="ema")
        with Session(profile="local", path=store) as s:
            assert _norms(s, "m") == pytest.approx(_expected(ema), rel=1e-6)
        other = tmp_path / "m.npz"
        np.savez(other, w=np.ones((2, 2)))
        with Session() as s, pytest.raises(ModelSourceError,
                                           match=r"model format 'npz' \(diffractml-formats .*\) "
                                                 r"takes no option\(s\) \['key'\]"):
            s.models.add(other, model_id="m", key="model")

    def test_the_command_line_takes_key(self, tmp_path):
        """diffract analyze --key ema reads that state dict."""
        import os
        import subprocess
        import sys

        path = self._save(tmp_path / "two.pt", model=_state(), ema=_state())
        env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
        run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path),
                              "--key", "ema", "--metrics", "frob_norm", "--format", "json"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert {r["param"] for r in json.loads(run.stdout)} == {"emb.weight", "layer.weight",
                                                                "layer.bias"}
        bad = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path)],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert bad.returncode == 2 and "several state dicts: ['ema', 'model']" in bad.stderr
