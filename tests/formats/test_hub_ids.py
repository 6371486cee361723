"""Hugging Face model ids from the local cache (issue 35 item 2): a cache laid out as
huggingface_hub lays it (``refs/``, ``blobs/``, ``snapshots/<commit>/`` links), found from
HF_HUB_CACHE or HF_HOME, by revision (a ref, a commit or a unique prefix of one); an id
that is not cached says how to fetch it; a local path of the same name wins."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

safetensors_numpy = pytest.importorskip("safetensors.numpy")

from diffract import Session  # noqa: E402
from diffract.cli import main  # noqa: E402
from diffract.errors import ModelSourceError  # noqa: E402
from diffract_formats import hub_cache  # noqa: E402

COMMITS = {"main": "a" * 40, "v1": "b" * 40}


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"layers.0.q_proj.weight": rng.standard_normal((24, 16)).astype(np.float32),
            "layers.0.up_proj.weight": rng.standard_normal((40, 16)).astype(np.float32)}


def _blob(repo: Path, data: bytes) -> str:
    name = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "blobs" / name).write_bytes(data)
    return name


def _cache(root: Path, repo_id: str = "org/tiny", sharded: bool = False) -> dict:
    """A cache holding ``repo_id`` at two revisions (main and v1), each snapshot's files
    links into blobs/; returns each revision's weights."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    out = {}
    for seed, (ref, commit) in enumerate(COMMITS.items()):
        weights = _weights(seed)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        files = {"config.json": json.dumps({"model_type": "llama"}).encode()}
        if sharded:
            names = sorted(weights)
            index = {"weight_map": {}}
            for i, name in enumerate(names):
                shard = f"model-0000{i + 1}-of-00002.safetensors"
                files[shard] = safetensors_numpy.save({name: weights[name]})
                index["weight_map"][name] = shard
            files["model.safetensors.index.json"] = json.dumps(index).encode()
        else:
            files["model.safetensors"] = safetensors_numpy.save(weights)
        for name, data in files.items():
            (snapshot / name).symlink_to(Path("../..") / "blobs" / _blob(repo, data))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        out[ref] = weights
    return out


def _read(name: str) -> dict[str, np.ndarray]:
    with Session() as s:
        s.models.add(name, "m")
        return {p.name: np.asarray(s.store.load_weights("m", p.name))
                for p in s.models.params("m")}


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("sharded", [False, True])
def test_an_id_reads_its_snapshot_by_revision(tmp_path, monkeypatch, sharded):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    want = _cache(tmp_path / "cache", sharded=sharded)
    assert _same(_read("org/tiny"), want["main"])
    assert _same(_read("org/tiny@v1"), want["v1"])
    assert _same(_read(f"org/tiny@{COMMITS['v1']}"), want["v1"])
    with Session() as s:
        s.models.add("org/tiny", "m")
        assert s.models.list()[0]["source"] == str(
            tmp_path / "cache" / "models--org--tiny" / "snapshots" / COMMITS["main"])


def test_hf_home_and_the_default_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    want = _cache(tmp_path / "home" / "hub")
    assert _same(_read("org/tiny"), want["main"])
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    want = _cache(tmp_path / "xdg" / "huggingface" / "hub", "org/other")
    assert _same(_read("org/other"), want["main"])


def test_an_id_not_cached_says_how_to_fetch_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _cache(tmp_path / "cache")
    with pytest.raises(ModelSourceError, match=r"`hf download org/missing`.*downloads nothing"):
        _read("org/missing")
    with pytest.raises(ModelSourceError, match=r"`hf download org/tiny --revision v9`"):
        _read("org/tiny@v9")


def test_a_local_path_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _cache(tmp_path / "cache")
    local = _weights(7)
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    safetensors_numpy.save_file(local, str(tmp_path / "org" / "tiny" / "model.safetensors"))
    monkeypatch.chdir(tmp_path)
    assert _same(_read("org/tiny"), local)


def test_names_that_are_no_ids_are_left_to_the_path_rules():
    for name in ("a/b/c", "../x/y", "/abs/path", "org/", "a//b", "org/../etc", "x"):
        assert hub_cache.locate(name) is None


def test_the_command_line_takes_an_id(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _cache(tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", "org/tiny@v1", "--metrics", "stable_rank", "--executor",
                 "sequential"]) == 0
    out = capsys.readouterr().out
    assert "layers.0.q_proj.weight" in out and "tiny" in out
    assert main(["analyze", "org/missing", "--metrics", "stable_rank"]) != 0
    assert "hf download org/missing" in capsys.readouterr().err


def test_a_short_commit_resolves_when_unique_and_is_refused_when_ambiguous(tmp_path,
                                                                          monkeypatch):
    """``org/name@bbbbbbb`` (git's 7 digits) reads that commit's snapshot; a prefix two
    cached commits share is refused, naming both; one no commit has is not cached."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    want = _cache(tmp_path / "cache")
    assert _same(_read("org/tiny@bbbbbbb"), want["v1"])
    twin = tmp_path / "cache" / "models--org--tiny" / "snapshots" / ("b" * 39 + "c")
    twin.mkdir()
    with pytest.raises(ModelSourceError, match=r"revision 'bbbbbbb' is ambiguous .*: 2 "
                                               rf"commits start with it \({'b' * 40}, "
                                               rf"{'b' * 39}c\); give more digits"):
        _read("org/tiny@bbbbbbb")
    assert _same(_read("org/tiny@" + "b" * 40), want["v1"])
    with pytest.raises(ModelSourceError, match=r"not in the local Hugging Face cache"):
        _read("org/tiny@1234567")
