"""Hostile files for the readers added since the first pass (Keras/HDF5, ONNX, GGUF, Flax)
and the side files beside checkpoints: nothing is read outside the file, declared sizes
are checked against the bytes stored, and every refusal is a ModelSourceError naming the
file and the problem."""

from __future__ import annotations

import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ModelSourceError

h5py = pytest.importorskip("h5py")


def _add(path: Path, **options) -> list[str]:
    with Session() as s:
        return s.models.add(path, "m", **options)


def _values(path: Path) -> dict[str, np.ndarray]:
    with Session() as s:
        s.models.add(path, "m")
        return {p.name: np.asarray(s.store.load_weights("m", p.name))
                for p in s.models.params("m")}


def _refused_peak(path: Path, match: str) -> int:
    """Adding ``path`` is refused with ``match``; the peak of traced memory meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(ModelSourceError, match=match):
            _add(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def secret(tmp_path) -> Path:
    """A file outside the checkpoint's folder that a hostile file points at."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    path = outside / "secret.h5"
    with h5py.File(path, "w") as h5:
        h5["data"] = np.full((4, 4), 7.0, np.float32)
    (outside / "passwd").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 40)
    return path


def _weights_file(path: Path, build) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as h5:
        h5.create_dataset("layers/ok/vars/0", data=np.ones((3, 3), np.float32))
        build(h5)
    return path


class TestHdf5OutsideTheFile:
    def test_external_storage_is_refused_naming_where_it_points(self, tmp_path, secret):
        """A dataset stored in another file (as /etc/passwd was read as weights): refused."""
        passwd = str(secret.parent / "passwd")
        path = _weights_file(tmp_path / "ck" / "m.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", shape=(4, 76), dtype="f4",
            external=[(passwd, 0, h5py.h5f.UNLIMITED)]))
        with pytest.raises(ModelSourceError, match=r"dataset '/layers/dense/vars/0' stores its "
                           r"bytes in \[.*passwd.*\(HDF5 external storage\); Diffract reads "
                           r"only bytes inside the file itself"):
            _add(path)

    def test_a_virtual_dataset_is_refused(self, tmp_path, secret):
        """A virtual dataset mapping another .h5: refused, naming the file it maps."""
        def build(h5):
            layout = h5py.VirtualLayout(shape=(4, 4), dtype="f4")
            layout[:] = h5py.VirtualSource(str(secret), "data", shape=(4, 4))
            h5.create_virtual_dataset("layers/dense/vars/0", layout)

        path = _weights_file(tmp_path / "ck" / "m.weights.h5", build)
        with pytest.raises(ModelSourceError, match=r"is a virtual dataset mapping \[.*secret\.h5"):
            _add(path)

    @pytest.mark.parametrize("layout", ["keras3", "keras2"])
    def test_an_external_link_is_refused(self, tmp_path, secret, layout):
        """An external link, in the Keras 3 tree or named by Keras 2's weight_names: refused."""
        def build(h5):
            if layout == "keras3":
                h5["layers/dense/vars/0"] = h5py.ExternalLink(str(secret), "/data")
                return
            h5.attrs["layer_names"] = [b"dense"]
            group = h5.create_group("dense")
            group.attrs["weight_names"] = [b"dense/kernel:0"]
            group["dense/kernel:0"] = h5py.ExternalLink(str(secret), "/data")

        path = _weights_file(tmp_path / "ck" / "m.h5", build)
        with pytest.raises(ModelSourceError, match=r"links to other files \(.*secret\.h5:/data\)"):
            _add(path)

    def test_the_same_inside_a_keras_archive(self, tmp_path, secret):
        """A .keras archive whose weights file holds an external link: refused the same way."""
        inner = _weights_file(tmp_path / "w" / "model.weights.h5", lambda h5: h5.__setitem__(
            "layers/dense/vars/0", h5py.ExternalLink(str(secret), "/data")))
        with zipfile.ZipFile(tmp_path / "m.keras", "w") as archive:
            archive.write(inner, "model.weights.h5")
        with pytest.raises(ModelSourceError, match="links to other files"):
            _add(tmp_path / "m.keras")

    def test_soft_links_and_ordinary_datasets_inside_the_file_still_read(self, tmp_path):
        """The checks refuse nothing an ordinary weights file holds."""
        path = _weights_file(tmp_path / "m.weights.h5", lambda h5: h5.__setitem__(
            "layers/alias", h5py.SoftLink("/layers/ok")))
        values = _values(path)
        np.testing.assert_array_equal(values["layers.ok.vars.0"], np.ones((3, 3)))


class TestHdf5DeclaredSizes:
    def test_a_fill_value_dataset_is_refused_without_allocating(self, tmp_path):
        """(100000, 100000) declared in a 10 kB file (37 GiB when read): refused at add, in bounded memory."""
        path = _weights_file(tmp_path / "m.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", shape=(100_000, 100_000), dtype="f4", fillvalue=1.0))
        assert path.stat().st_size < 100_000
        peak = _refused_peak(path, r"dataset '/layers/dense/vars/0' declares 40000000000 bytes "
                                   r"but stores none of them: HDF5 would return its fill "
                                   r"value, a constant, not weights")
        assert peak < 50_000_000

    def test_chunked_datasets_with_no_chunks_and_compression_bombs(self, tmp_path):
        """Unwritten chunks, and zeros compressed beyond 1024:1, are refused; a real compressed weight reads."""
        path = _weights_file(tmp_path / "a.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", shape=(100_000, 100_000), dtype="f4", chunks=(1000, 1000),
            compression="gzip"))
        with pytest.raises(ModelSourceError, match="stores none of them"):
            _add(path)
        path = _weights_file(tmp_path / "b.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", data=np.zeros((4096, 8192), np.float32), chunks=(512, 8192),
            compression="gzip", compression_opts=9))
        with pytest.raises(ModelSourceError, match=r"compressed into \d+, more than 1024 to 1"):
            _add(path)
        rng = np.random.default_rng(0)
        weights = rng.standard_normal((64, 32)).astype(np.float32)
        path = _weights_file(tmp_path / "c.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", data=weights, chunks=(16, 32), compression="gzip"))
        np.testing.assert_array_equal(_values(path)["layers.dense.kernel"], weights.T)

    def test_an_archive_member_compressed_beyond_the_cap(self, tmp_path):
        """A .keras whose model.weights.h5 inflates 1024-fold: refused from the zip's directory."""
        inner = _weights_file(tmp_path / "w" / "model.weights.h5", lambda h5: h5.create_dataset(
            "layers/dense/vars/0", data=np.zeros((4096, 8192), np.float32)))
        with zipfile.ZipFile(tmp_path / "m.keras", "w", zipfile.ZIP_DEFLATED,
                             compresslevel=9) as archive:
            archive.write(inner, "model.weights.h5")
        with pytest.raises(ModelSourceError, match="model.weights.h5 declares .* more than 1024 to 1"):
            _add(tmp_path / "m.keras")


def _archive(path: Path, config: bytes) -> Path:
    inner = _weights_file(path.parent / "w" / "model.weights.h5", lambda h5: None)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(inner, "model.weights.h5")
        archive.writestr("config.json", config)
    return path


class TestSideFiles:
    def test_a_keras_config_that_inflates_is_read_in_bounded_memory(self, tmp_path):
        """A 200 MB config.json compressed to kilobytes: refused past 16 MiB, memory bounded."""
        path = _archive(tmp_path / "m.keras", b'{"a": "' + b"x" * 200_000_000 + b'"}')
        assert path.stat().st_size < 2_000_000
        peak = _refused_peak(path, r"config.json' is larger than 16 MiB, the most Diffract "
                                   r"reads of a side file")
        assert peak < 60_000_000

    @pytest.mark.parametrize("text", [b"[" * 200_000 + b"]" * 200_000,
                                      b'{"a":' * 150 + b"1" + b"}" * 150, b"{nope"],
                             ids=["200k-deep", "150-deep", "not-json"])
    def test_deep_or_broken_side_files_are_errors_naming_them(self, tmp_path, text):
        """config.json in an archive, beside a Hugging Face checkpoint, an adapter's config: named errors."""
        import torch
        from safetensors.torch import save_file

        with pytest.raises(ModelSourceError, match=r"config.json' (nests values deeper than 100 "
                           r"levels|is not JSON Diffract can read)"):
            _add(_archive(tmp_path / "m.keras", text))
        folder = tmp_path / "hf"
        folder.mkdir()
        save_file({"model.layers.0.self_attn.q_proj.weight": torch.ones(8, 8)},
                  str(folder / "model.safetensors"))
        (folder / "config.json").write_bytes(text)
        with pytest.raises(ModelSourceError, match=r"Model 'm': .*config.json' (nests|is not JSON)"):
            _add(folder, views=["heads"])

    @pytest.mark.parametrize("state", [b"[1, 2]", b"[" * 100_000 + b"]" * 100_000,
                                       b'{"global_step": true}', b"{", b"x" * (17 << 20)],
                             ids=["a-list", "100k-deep", "a-bool-step", "not-json", "17-MiB"])
    def test_a_bad_trainer_state_fails_its_checkpoint_and_track_goes_on(self, tmp_path, state, capsys):
        """trainer_state.json: a list, deep, a bool step, broken or huge: that checkpoint fails
        with the reason; the other checkpoints are tracked (exit 1)."""
        import torch
        from safetensors.torch import save_file

        from diffract.cli import main

        run = tmp_path / "run"
        for step in (100, 200, 300):
            folder = run / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            save_file({"w": torch.randn(16, 8, generator=torch.Generator().manual_seed(step))},
                      str(folder / "model.safetensors"))
        (run / "checkpoint-200" / "trainer_state.json").write_bytes(state)
        if state == b'{"global_step": true}':  # a bool is no step: the folder's name holds
            with Session() as s:
                s.models.add(run / "checkpoint-200", "m")
                assert s.models.steps()["m"]["step"] == 200
            return
        store = tmp_path / "store"
        code = main(["track", str(run / "checkpoint-*"), "--store", str(store), "--metrics",
                     "frob_norm"])
        out = capsys.readouterr()
        assert code == 1, out.err
        assert "checkpoint-200" in out.err and "trainer_state.json" in out.err
        assert "Traceback" not in out.err
        with Session(profile="local", path=store) as s:
            assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == [100, 300]
