"""Side by side and while files move: two `diffract track` runs on one store, --watch over a
folder that goes away and comes back, checkpoints a Trainer deletes, a checkpoint rewritten
with its size and modification time restored, exports while a track writes, and a view's
file changing between add and apply. Every test waits for events (a line printed, a
process ending), never for a time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from diffract import Session
from diffract.errors import ApplyError

ENV = {**{k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"},
       "PYTHONUNBUFFERED": "1"}


def _checkpoint(run: Path, step: int, size=(120, 80), layers: int = 4) -> Path:
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(step)
    save_file({f"l{i}.weight": torch.randn(*size, generator=gen) for i in range(layers)},
              str(folder / "model.safetensors"))
    return folder


def _track(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "diffract.cli", "track", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or ENV)


def _values(store: Path) -> dict:
    with Session(profile="local", path=store) as s:
        return {"steps": {m: s.models.steps()[m]["step"] for m in s.model_ids},
                "metrics": s.results.export_metrics("frob_norm", "stable_rank"),
                "pairs": {k: np.asarray(v).tolist()
                          for k, v in s.results.export_aggregates().items()}}


def _rows(store: Path) -> tuple[int, int]:
    """(rows of field values, distinct (model, parameter, field) among them)."""
    import sqlite3

    with sqlite3.connect(store / "store.sqlite") as db:
        columns = [r[1] for r in db.execute("PRAGMA table_info(field_values)")]
        key = ", ".join(c for c in columns if c in ("model_id", "param", "param_name", "name",
                                                    "field"))
        total = db.execute("SELECT count(*) FROM field_values").fetchone()[0]
        distinct = db.execute(f"SELECT count(*) FROM (SELECT DISTINCT {key} FROM "
                              "field_values)").fetchone()[0]
    return total, distinct


class TestTwoTracksOnOneStore:
    def test_two_tracks_at_once_lose_and_double_nothing(self, tmp_path):
        """Both finish (exit 0); the store equals a single track's, each value stored once."""
        run = tmp_path / "run"
        for step in range(100, 700, 100):
            _checkpoint(run, step, size=(300, 200))
        args = [str(run / "checkpoint-*"), "--metrics", "frob_norm,stable_rank"]
        both = [_track(*args, "--store", str(tmp_path / "shared")) for _ in range(2)]
        results = [p.communicate(timeout=600) for p in both]
        for proc, (_, err) in zip(both, results, strict=True):
            assert proc.returncode == 0, err
            assert "Traceback" not in err
        alone = _track(*args, "--store", str(tmp_path / "alone"))
        _, err = alone.communicate(timeout=600)
        assert alone.returncode == 0, err
        assert _values(tmp_path / "shared") == _values(tmp_path / "alone")
        total, distinct = _rows(tmp_path / "shared")
        assert total == distinct == _rows(tmp_path / "alone")[0]


    def test_a_round_waits_for_the_other_tracks_round(self, tmp_path):
        """Found by CI: one track erased the vectors the other's pairs were reading (exit
        1). Rounds on one store take turns: with the round lock held elsewhere, a track
        says it waits, and finishes (exit 0) once it is released."""
        run = tmp_path / "run"
        _checkpoint(run, 100)
        store = tmp_path / "s"
        first = _track(str(run / "checkpoint-*"), "--store", str(store), "--metrics",
                       "frob_norm")
        assert first.communicate(timeout=600) and first.returncode == 0
        _checkpoint(run, 200)
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl, sys; fh = open(sys.argv[1], 'a'); "
             "fcntl.flock(fh, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
             str(store / ".track.lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True)
        assert holder.stdout.readline() == "held\n"
        second = _track(str(run / "checkpoint-*"), "--store", str(store), "--metrics",
                        "frob_norm", env={**ENV, "PYTHONUNBUFFERED": "1"})
        said = [second.stdout.readline()]
        assert "waiting for another diffract track" in said[0], said
        holder.stdin.close()  # the other round ends
        holder.wait(timeout=60)
        out, err = second.communicate(timeout=600)
        assert second.returncode == 0, err
        assert "added 1 checkpoint(s): checkpoint-200" in out

    def test_a_model_added_by_another_process_meanwhile_is_a_duplicate(self, tmp_path):
        """Found by CI under load: between a session's check that a model is new and its
        commit, the other track committed the same checkpoint; the store raised a
        StorageError, which track reported as fatal (exit 2). It is a DuplicateModelError,
        which track skips, and nothing of the second add is written."""
        from diffract.errors import DuplicateModelError

        path = _checkpoint(tmp_path / "run", 100) / "model.safetensors"
        with Session(profile="local", path=tmp_path / "s") as first, \
                Session(profile="local", path=tmp_path / "s") as second:
            real = second.store.model_ids
            second.store.model_ids = lambda: []  # its check ran before the other's commit
            first.models.add(path, "checkpoint-100")
            with pytest.raises(DuplicateModelError, match="already in the store"):
                second.models.add(path, "checkpoint-100")
            second.store.model_ids = real
            assert second.store.model_ids() == ["checkpoint-100"]
            assert len(second.models.params("checkpoint-100")) == 4


class TestFilesThatMove:
    def test_watch_survives_the_folder_going_away_and_coming_back(self, tmp_path):
        """--watch over a run folder that is removed and recreated with a new checkpoint."""
        run = tmp_path / "run"
        _checkpoint(run, 100)
        _checkpoint(run, 200)
        proc = _track(str(run / "checkpoint-*"), "--store", str(tmp_path / "s"), "--metrics",
                      "frob_norm", "--watch", "0.05")
        lines = []

        def wait_for(text: str) -> None:
            for line in proc.stdout:
                lines.append(line)
                if text in line:
                    return
            raise AssertionError(f"the track ended before {text!r}: {lines} "
                                 f"{proc.stderr.read()}")

        try:
            wait_for("added 2 checkpoint(s)")
            shutil.rmtree(run)
            wait_for("matches no checkpoint")
            wait_for("Watching for it again")
            _checkpoint(run, 300)
            wait_for("added 1 checkpoint(s): checkpoint-300")
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert sorted(_values(tmp_path / "s")["steps"].values()) == [100, 200, 300]

    def test_checkpoints_a_trainer_deletes_keep_their_results(self, tmp_path):
        """save_total_limit deletes old checkpoints: track goes on, the run keeps every step."""
        run = tmp_path / "run"
        for step in (100, 200, 300):
            _checkpoint(run, step)
        store = str(tmp_path / "s")
        first = _track(str(run / "checkpoint-*"), "--store", store, "--metrics", "frob_norm")
        assert first.communicate(timeout=600) and first.returncode == 0
        before = _values(tmp_path / "s")["metrics"]
        shutil.rmtree(run / "checkpoint-100")
        _checkpoint(run, 400)
        again = _track(str(run / "checkpoint-*"), "--store", store, "--metrics", "frob_norm")
        out, err = again.communicate(timeout=600)
        assert again.returncode == 0, err
        assert "added 1 checkpoint(s): checkpoint-400" in out
        after = _values(tmp_path / "s")
        assert sorted(after["steps"].values()) == [100, 200, 300, 400]
        assert after["metrics"]["checkpoint-100"] == before["checkpoint-100"]

    def test_a_rewrite_with_size_and_mtime_restored_is_detected(self, tmp_path):
        """The same size, the old modification time put back (touch -r): still refused."""
        path = _checkpoint(tmp_path, 100) / "model.safetensors"
        with Session(profile="local", path=tmp_path / "s") as s:
            s.models.add(path, "m")
        stat = path.stat()
        data = bytearray(path.read_bytes())
        data[-4:] = b"\x00\x00\x80\x7f"  # the last float becomes +inf; same length
        path.write_bytes(bytes(data))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
        with Session(profile="local", path=tmp_path / "s") as s:
            with pytest.raises(ApplyError, match=r"changed since the model was added: it was "
                                                 r"written to or its status changed"):
                s.compute.apply("frob_norm")
        moved = _checkpoint(tmp_path / "other", 100) / "model.safetensors"
        with Session(profile="local", path=tmp_path / "t") as s:
            s.models.add(path, "m")
        os.replace(moved, path)  # another file of the same size under the name
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with Session(profile="local", path=tmp_path / "t") as s:
            with pytest.raises(ApplyError, match=r"it was replaced by another file \(its inode "
                                                 r"changed\)"):
                s.compute.apply("frob_norm")

    def test_a_view_whose_file_changes_between_add_and_apply(self, tmp_path):
        """Head views of a rewritten file fail with the reason; no value of the new bytes is stored."""
        folder = tmp_path / "ck"
        folder.mkdir()
        q = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
        save_file({"model.layers.0.self_attn.q_proj.weight": q}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text('{"num_attention_heads": 2, "hidden_size": 8}')
        with Session(profile="local", path=tmp_path / "s") as s:
            s.models.add(folder, "m", views=["heads"])
            save_file({"model.layers.0.self_attn.q_proj.weight": q * 2},
                      str(folder / "model.safetensors"))
            report = s.compute.apply("frob_norm", errors="record")
            failed = {u for (_, _, reason), units in report.reasons("failed").items()
                      for u in units if "changed since the model was added" in reason}
            assert failed == {"m/model.layers.0.self_attn.q_proj.weight",
                              "m/model.layers.0.self_attn.q_proj.weight[head=0]",
                              "m/model.layers.0.self_attn.q_proj.weight[head=1]"}
            assert s.results.export_metrics("frob_norm").get("m", {}) == {}


class TestExportsWhileTracking:
    def test_exports_read_a_consistent_store_while_a_track_writes(self, tmp_path):
        """Exports in a loop until the track ends: each succeeds and holds only final values."""
        run = tmp_path / "run"
        for step in range(100, 900, 100):
            _checkpoint(run, step, size=(300, 200))
        store = tmp_path / "s"
        (tmp_path / "chunks.toml").write_text("[apply]\nchunk_seconds = 0.01\n")
        proc = _track(str(run / "checkpoint-*"), "--store", str(store), "--metrics",
                      "frob_norm,stable_rank", env={**ENV, "DIFFRACT_CONFIG": str(
                          tmp_path / "chunks.toml")})
        seen = []
        while proc.poll() is None:
            if (store / "store.sqlite").exists():
                try:
                    with Session(profile="local", path=store, read_only=True) as s:
                        seen.append(s.results.export_metrics("frob_norm", "stable_rank"))
                except Exception as exc:  # noqa: BLE001 - what the test looks for
                    if "does not exist" in str(exc) or "is not a Diffract store" in str(exc):
                        continue  # the store is being created
                    raise
        _, err = proc.communicate()
        assert proc.returncode == 0, err
        final = _values(store)["metrics"]
        assert seen, "no export ran while the track wrote"
        for snapshot in seen:
            for model, rows in snapshot.items():
                for param, row in rows.items():
                    for field, value in row.items():
                        if not (isinstance(value, float) and np.isnan(value)):
                            assert value == final[model][param][field]
