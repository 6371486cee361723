"""One "inside" rule for every reader (issue 56 item 1): a Hugging Face cache id resolves
to a 40-hex commit under its repository's ``snapshots/``, and every file a reader opens
(weights, shard indexes, ``config.json``, ``trainer_state.json``, ``adapter_config.json``,
a DCP ``.metadata`` and OLMo's ``model_and_optim/``, a ZeRO step folder) resolves inside
the checkpoint's folder or its cache repository. Each case links or points out of it at a
valid file and checks that the add is refused with a ModelSourceError naming what, and
that no file outside is ever opened (Python's audit hook sees every ``open``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from diffract import Session  # noqa: E402
from diffract.cli import main  # noqa: E402
from diffract.errors import ModelSourceError  # noqa: E402
from diffract.plugins import inside  # noqa: E402

COMMIT = "c" * 40
#: Paths opened by the code under test (the audit hook stays for the process; it records
#: only inside :func:`_recording`, so a test's own writes of its files are not counted).
_OPENED: list[str] = []
_RECORDING = [False]


def _audit(event: str, args: tuple) -> None:
    if _RECORDING[0] and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


@contextlib.contextmanager
def _recording():
    _RECORDING[0] = True
    try:
        yield
    finally:
        _RECORDING[0] = False


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every checkpoint and cache, holding valid files a hostile link
    points at; the test fails if the code under test opens any file under it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    _OPENED.clear()
    yield folder
    touched = sorted({p for p in _OPENED if Path(os.path.abspath(p)).is_relative_to(folder)
                      or Path(p).resolve().is_relative_to(folder.resolve())})
    assert not touched, f"opened outside the checkpoint: {touched}"


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"layers.0.q_proj.weight": rng.standard_normal((24, 16)).astype(np.float32)}


def _snapshot_folder(folder: Path, seed: int = 0) -> Path:
    """A plain Hugging Face-style folder (model.safetensors + config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_numpy.save_file(_weights(seed), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def _cache(root: Path, repo_id: str = "org/x") -> Path:
    """A cache holding ``repo_id`` at main (links into blobs/); returns the repo folder."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    files = {"config.json": json.dumps({"model_type": "llama"}).encode(),
             "model.safetensors": safetensors_numpy.save(_weights())}
    for name, data in files.items():
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(Path("../..") / "blobs" / blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return repo


def _add(what, **options) -> dict[str, np.ndarray]:
    with _recording(), Session() as s:
        s.models.add(what, "m", **options)
        return {p.name: np.asarray(s.store.load_weights("m", p.name))
                for p in s.models.params("m")}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """The cache HF_HUB_CACHE names, the working directory beside it."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "cache"


class TestTheRule:
    def test_a_file_of_the_folder_and_a_cache_blob_are_inside(self, tmp_path):
        """The folder's own files, and a snapshot's links into its repository's blobs."""
        folder = _snapshot_folder(tmp_path / "ck")
        assert inside(folder, "model.safetensors") == (folder / "model.safetensors").resolve()
        repo = _cache(tmp_path / "cache")
        snapshot = repo / "snapshots" / COMMIT
        assert inside(snapshot, "config.json").parent == (repo / "blobs").resolve()

    @pytest.mark.parametrize("name", ["../x.json", "/etc/passwd", "a/../../x.json"])
    def test_names_out_of_the_folder_are_refused(self, tmp_path, name):
        """``..`` and absolute names, whether the target exists or not."""
        (tmp_path / "ck").mkdir()
        with pytest.raises(ModelSourceError, match=r"outside the checkpoint's folder"):
            inside(tmp_path / "ck", name)

    def test_a_link_out_of_the_folder_is_refused_naming_where_it_leads(self, tmp_path,
                                                                      outside):
        """A link to a file elsewhere; the message says where it resolves."""
        folder = _snapshot_folder(tmp_path / "ck")
        (outside / "config.json").write_text("{}")
        (folder / "config.json").unlink()
        (folder / "config.json").symlink_to(outside / "config.json")
        with pytest.raises(ModelSourceError, match=r"'config.json' resolves to .*outside.*"
                                                   r"outside the checkpoint's folder.*copy"):
            inside(folder, "config.json")

    def test_a_snapshot_that_is_a_link_out_of_its_repository_is_refused(self, tmp_path,
                                                                       outside):
        """A snapshots/<commit> folder linking elsewhere widens nothing."""
        repo = _cache(tmp_path / "cache")
        _snapshot_folder(outside / "snap")
        (repo / "snapshots" / ("d" * 40)).symlink_to(outside / "snap")
        with pytest.raises(ModelSourceError, match=r"outside the checkpoint's folder"):
            inside(repo / "snapshots" / ("d" * 40), "model.safetensors")


class TestCacheRefs:
    @pytest.mark.parametrize("ref", ["../../../outside/snap", "ABS"])
    def test_a_ref_naming_a_path_is_refused(self, cache, outside, ref):
        """refs/main holding a relative or absolute path (huggingface_hub joins it onto
        snapshots/ unchecked): refused, saying the ref is no commit."""
        repo = _cache(cache)
        _snapshot_folder(outside / "snap", seed=5)
        text = str(outside / "snap") if ref == "ABS" else ref
        (repo / "refs" / "main").write_text(text)
        with pytest.raises(ModelSourceError, match=r"refs/main.*not a 40-hex commit"):
            _add("org/x")

    def test_the_command_line_refuses_it_with_exit_2(self, cache, outside, capsys):
        repo = _cache(cache)
        _snapshot_folder(outside / "snap", seed=5)
        (repo / "refs" / "main").write_text("../../../outside/snap")
        with _recording():
            assert main(["analyze", "org/x", "--metrics", "stable_rank"]) == 2
        err = capsys.readouterr().err
        assert "not a 40-hex commit" in err and "Traceback" not in err

    def test_a_snapshot_linking_out_of_the_cache_is_refused(self, cache, outside):
        repo = _cache(cache)
        _snapshot_folder(outside / "snap", seed=5)
        os.rename(repo / "snapshots" / COMMIT, repo / "old")
        (repo / "snapshots" / COMMIT).symlink_to(outside / "snap")
        with pytest.raises(ModelSourceError, match=r"outside the checkpoint's folder"):
            _add("org/x")

    def test_a_snapshot_config_linking_out_is_refused(self, cache, outside):
        """A valid JSON outside would have been the model's configuration."""
        repo = _cache(cache)
        (outside / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
        link = repo / "snapshots" / COMMIT / "config.json"
        link.unlink()
        link.symlink_to(outside / "config.json")
        with pytest.raises(ModelSourceError, match=r"'config.json' resolves to .*outside"):
            _add("org/x", views=["heads"])

    def test_a_ref_in_the_cache_still_reads(self, cache):
        """The honest layout: main, the commit itself, and a ref under refs/pr/."""
        repo = _cache(cache)
        (repo / "refs" / "pr").mkdir()
        (repo / "refs" / "pr" / "1").write_text(COMMIT + "\n")
        want = _weights()
        for name in ("org/x", f"org/x@{COMMIT}", "org/x@pr/1", "org/x@cccccccc"):
            got = _add(name)
            assert np.array_equal(got["layers.0.q_proj.weight"], want["layers.0.q_proj.weight"])


class TestSideFiles:
    def test_an_index_linking_out_is_refused_before_it_is_read(self, tmp_path, outside):
        folder = tmp_path / "ck"
        folder.mkdir()
        safetensors_numpy.save_file(_weights(), str(outside / "shard.safetensors"))
        (outside / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"layers.0.q_proj.weight": "shard.safetensors"}}))
        (folder / "model.safetensors.index.json").symlink_to(
            outside / "model.safetensors.index.json")
        with pytest.raises(ModelSourceError, match=r"index.json' resolves to .*outside"):
            _add(folder)

    def test_a_config_beside_a_single_file_linking_out_is_refused(self, tmp_path, outside):
        folder = tmp_path / "ck"
        folder.mkdir()
        safetensors_numpy.save_file(_weights(), str(folder / "w.safetensors"))
        (outside / "config.json").write_text(json.dumps({"num_attention_heads": 2}))
        (folder / "config.json").symlink_to(outside / "config.json")
        with pytest.raises(ModelSourceError, match=r"'config.json' resolves to .*outside"):
            _add(folder / "w.safetensors", views=["heads"])

    def test_a_trainer_state_linking_out_is_refused(self, tmp_path, outside):
        folder = _snapshot_folder(tmp_path / "checkpoint-10")
        (outside / "trainer_state.json").write_text(json.dumps({"global_step": 999}))
        (folder / "trainer_state.json").symlink_to(outside / "trainer_state.json")
        with pytest.raises(ModelSourceError, match=r"trainer_state.json' resolves to .*"
                                                   r"outside"):
            _add(folder)

    def test_a_trainer_state_of_the_folder_still_gives_the_step(self, tmp_path):
        folder = _snapshot_folder(tmp_path / "checkpoint-10")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 12}))
        with Session() as s:
            s.models.add(folder, "m")
            assert s.models.steps()["m"]["step"] == 12

    def test_an_adapter_config_linking_out_is_refused(self, tmp_path, outside):
        folder = tmp_path / "adapter"
        folder.mkdir()
        rng = np.random.default_rng(0)
        safetensors_numpy.save_file({
            "base_model.model.q.lora_A.weight": rng.standard_normal((2, 8)).astype("f4"),
            "base_model.model.q.lora_B.weight": rng.standard_normal((6, 2)).astype("f4")},
            str(folder / "adapter_model.safetensors"))
        (outside / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
        (folder / "adapter_config.json").symlink_to(outside / "adapter_config.json")
        with _recording(), Session() as s, pytest.raises(
                ModelSourceError, match=r"adapter_config.json. "
                                                                   r"resolves to .*outside"):
            s.models.add_lora(folder, "m")


torch = pytest.importorskip("torch")


def _dcp(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6, bias=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(folder))
    return folder


class TestDcp:
    def test_a_metadata_linking_out_is_refused(self, tmp_path, outside):
        _dcp(outside / "other")
        folder = tmp_path / "step-1"
        folder.mkdir()
        for f in (outside / "other").iterdir():  # the shards inside, the metadata not
            if f.name != ".metadata":
                (folder / f.name).write_bytes(f.read_bytes())
        (folder / ".metadata").symlink_to(outside / "other" / ".metadata")
        with pytest.raises(ModelSourceError, match=r"\.metadata' resolves to .*outside"):
            _add(folder)

    def test_model_and_optim_linking_out_is_refused(self, tmp_path, outside):
        _dcp(outside / "other")
        folder = tmp_path / "step-1"
        folder.mkdir()
        (folder / "model_and_optim").symlink_to(outside / "other")
        with pytest.raises(ModelSourceError, match=r"'model_and_optim/.metadata' resolves to .*outside"):
            _add(folder)

    def test_model_and_optim_inside_still_reads(self, tmp_path):
        _dcp(tmp_path / "step-1" / "model_and_optim")
        assert list(_add(tmp_path / "step-1")) == ["weight"]


@pytest.mark.parametrize("level", ["refs", "refs/main", "snapshots", "blobs", "blob",
                                   "snapshot file"])
def test_a_link_out_at_any_level_of_the_cache_is_refused(cache, outside, level):
    """Each level of a cached model (the refs folder and a ref, the snapshots folder, the
    blobs folder, one blob, one of a snapshot's links) replaced by a link to a copy
    outside the repository: refused, nothing outside opened."""
    import shutil

    repo = _cache(cache)
    snapshot = repo / "snapshots" / COMMIT
    config_blob = (snapshot / "config.json").resolve()
    target = {"refs": repo / "refs", "refs/main": repo / "refs" / "main",
              "snapshots": repo / "snapshots", "blobs": repo / "blobs", "blob": config_blob,
              "snapshot file": snapshot / "model.safetensors"}[level]
    copy = outside / "copy"
    if target.is_dir() and not target.is_symlink():
        shutil.copytree(target, copy, symlinks=True)
        shutil.rmtree(target)
    else:
        copy.write_bytes(target.read_bytes())
        target.unlink()
    target.symlink_to(copy)
    with pytest.raises(ModelSourceError, match=r"resolves to .*outside.*outside the "
                                               r"checkpoint's folder"):
        _add("org/x", views=["heads"], view_options={"heads": 2})
