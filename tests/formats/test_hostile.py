"""Hostile and malformed checkpoints (issue 25's adversarial pass, reproduced first): each
case failed on main (a file outside the checkpoint read, memory or time without bound, a
raw exception, a silent drop) and must be refused or handled with the documented error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diffract import Session
from diffract.errors import ModelSourceError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")


def _shard(path: Path, names: list[str], seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    safetensors_torch.save_file({n: torch.randn(6, 4, generator=gen) for n in names}, str(path))


def _index(folder: Path, weight_map: object) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _add(path: Path, **options) -> list[str]:
    with Session() as s:
        s.models.add(path, "m", format_options=options or None)
        return [p.name for p in s.models.params("m")]


class TestShardsOutsideTheDirectory:
    def test_dotdot_absolute_and_symlinked_shards_are_refused(self, tmp_path):
        _shard(tmp_path / "outside.safetensors", ["b"])
        (tmp_path / "ckpt").mkdir()
        _shard(tmp_path / "ckpt" / "a.safetensors", ["a"])
        for target in ("../outside.safetensors", str(tmp_path / "outside.safetensors")):
            _index(tmp_path / "ckpt", {"a": "a.safetensors", "b": target})
            with pytest.raises(ModelSourceError, match="outside the checkpoint directory"):
                _add(tmp_path / "ckpt")
        os.symlink(tmp_path / "outside.safetensors", tmp_path / "ckpt" / "b.safetensors")
        _index(tmp_path / "ckpt", {"a": "a.safetensors", "b": "b.safetensors"})
        with pytest.raises(ModelSourceError, match=r"shard 'b.safetensors' resolves to .*"
                                                   r"outside\.safetensors"):
            _add(tmp_path / "ckpt")
        assert _add(tmp_path / "ckpt", allow_outside=True) == ["a", "b"]  # when meant

    def test_a_shard_linked_to_proc_self_mem_or_etc_passwd(self, tmp_path):
        (tmp_path / "ckpt").mkdir()
        _shard(tmp_path / "ckpt" / "a.safetensors", ["a"])
        for target in ("/proc/self/mem", "/etc/passwd"):
            link = tmp_path / "ckpt" / "b.safetensors"
            link.unlink(missing_ok=True)
            os.symlink(target, link)
            _index(tmp_path / "ckpt", {"a": "a.safetensors", "b": "b.safetensors"})
            with pytest.raises(ModelSourceError, match="outside the checkpoint directory"):
                _add(tmp_path / "ckpt")

    def test_a_hugging_face_cache_snapshot_links_into_its_blobs(self, tmp_path):
        repo = tmp_path / "models--org--name"
        (repo / "blobs").mkdir(parents=True)
        _shard(repo / "blobs" / "0123abcd", ["a"])
        snapshot = repo / "snapshots" / "f00d"
        snapshot.mkdir(parents=True)
        os.symlink("../../blobs/0123abcd", snapshot / "model.safetensors")
        assert _add(snapshot) == ["a"]

    @pytest.mark.parametrize("weight_map", [["a", "b"], {"a": 3}, {"a": ["x"]}, "a"])
    def test_a_weight_map_that_is_not_names_to_files(self, tmp_path, weight_map):
        _index(tmp_path / "ckpt", weight_map)
        with pytest.raises(ModelSourceError, match="must map tensor names to shard file"):
            _add(tmp_path / "ckpt")

    def test_a_deeply_nested_index(self, tmp_path):
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(
            '{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}")
        with pytest.raises(ModelSourceError, match="unreadable shard index"):
            _add(tmp_path / "ckpt")
