"""The ``local`` profile: reopening, the store contract on both profiles, sources after a
reopen, schema versions, bad store input, concurrent processes."""

from __future__ import annotations

import math
import os
import re
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ApplyError, StorageError
from diffract.plugins import Batch, ModelSource, Note, ParamInfo, Provenance, RamStore

local = pytest.importorskip("diffract_storage_local")
from diffract_storage_local import LocalStore, _schema  # noqa: E402

torch = pytest.importorskip("torch")


def _model(rng, n=4):
    out = {f"layer{i}.weight": rng.standard_normal((40 + i, 30)) for i in range(n)}
    out["big"] = rng.standard_normal((300, 120))
    out["bias"] = rng.standard_normal(7)
    return out


def _everything(session) -> tuple:
    r = session.results
    return r.export_metrics(include_arrays=True), r.export_aggregates(), r.export_notes()


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN, arrays and tuples element-wise."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


FIELDS = ("frob_norm", "param_norm", "esd", "stable_rank", "pl_alpha", "weights_svals", "hard_rank")


class TestReopen:
    def test_a_reopened_store_gives_back_everything(self, tmp_path, rng):
        """Models, parameters' metadata, every field (scalars, NaN, arrays large and
        small, ints), aggregate and note come back equal after a reopen."""
        model = _model(rng)
        model["layer1.weight"][0, 0] = np.nan
        with Session(profile="local", path=tmp_path / "st") as s:
            s.models.add(model, model_id="m")
            s.compute.configure_kernel("pl_pvalue", n_replicates=3)
            s.compute.apply(*FIELDS)
            before = _everything(s)
            params = s.models.params("m")
        with Session(profile="local", path=tmp_path / "st") as s:
            assert s.model_ids == ["m"] and s.models.params("m") == params
            after = _everything(s)
            assert not any(s.compute.apply(*FIELDS).computed.values())  # all there: resume
        assert _same(before, after)
        assert math.isnan(after[0]["m"]["layer1.weight"]["frob_norm"])
        assert after[0]["m"]["big"]["weights_svals"].shape == (120,)

    def test_in_memory_weights_are_copied_unless_told_not_to(self, tmp_path):
        """A torch model's weights (bf16 kept) are copied, so fields that need them can be
        computed after a reopen; with copy_weights=False they are skipped with the reason."""
        layer = torch.nn.Linear(6, 5).to(torch.bfloat16)
        with Session(profile="local", path=tmp_path / "st") as s:
            s.models.add(layer, model_id="copied")
            s.models.add({"w": np.ones((3, 3))}, model_id="gone", copy_weights=False)
        with Session(profile="local", path=tmp_path / "st") as s:
            tensor = s.store.load_tensor("copied", "weight")
            assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, layer.weight.detach())
            s.compute.apply("frob_norm")
            rows = s.results.export_metrics("frob_norm")
            notes = {n["unit"]: (n["kind"], n["reason"]) for n in s.results.export_notes()}
        assert rows["copied"]["weight"]["frob_norm"] == pytest.approx(
            float(layer.weight.float().norm()), rel=1e-6)
        assert rows["gone"] == {}
        kind, reason = notes["gone/w"]
        assert kind == "skipped" and "were not copied into the store (copy_weights=False)" in reason

    def test_file_backed_models_are_read_again_and_a_changed_file_is_refused(self, tmp_path, rng):
        """A checkpoint file is read again after a reopen; a file replaced since it was
        added fails each parameter with what changed (never a crash)."""
        from safetensors.torch import save_file

        path = tmp_path / "model.safetensors"
        save_file({"a": torch.randn(8, 8), "b": torch.randn(4, 4)}, str(path))
        with Session(profile="local", path=tmp_path / "st") as s:
            s.models.add(path, model_id="f")
            s.compute.apply("frob_norm")
            s.results.erase("frob_norm")
        with Session(profile="local", path=tmp_path / "st") as s:
            assert s.store.source("f").kind == "file"
            s.compute.apply("frob_norm")
            assert len(s.results.export_metrics("frob_norm")["f"]) == 2
            s.results.erase("frob_norm")
            save_file({"a": torch.randn(8, 8)}, str(path))  # replaced: shorter
            with pytest.raises(ApplyError, match=r"file .*model\.safetensors' changed since "
                               r"the model was added: its size changed from \d+ to \d+ bytes"):
                s.compute.apply("frob_norm")


@pytest.fixture(params=["ram", "local"])
def store(request, tmp_path):
    """A store of each profile with one model of two parameters."""
    st = RamStore() if request.param == "ram" else LocalStore(tmp_path / "st")
    infos = [ParamInfo("m", "a", (2, 2), "float64"), ParamInfo("m", "b", (3,), "float64")]
    st.add_model("m", infos, ModelSource("memory"), lambda name: np.ones(2), copy_weights=False)
    yield st
    st.close()


PROV = Provenance("k", "pack 1.0", '{"x": 1}')


class TestStoreContract:
    def test_commit_values_aggregates_notes(self, store):
        """Every kind of value comes back as stored; notes replace by key; names ordered."""
        values = {"f": 1.5, "i": 3, "b": True, "nan": math.nan, "arr": np.arange(6.0).reshape(2, 3),
                  "big": np.arange(20_000.0), "tup": (1.0, np.arange(3), (2, False))}
        batch = Batch(values={("m", "a", f): v for f, v in values.items()},
                      aggregates={"agg@models[m]": 2.0, "arr@models[m]": np.ones(3)},
                      notes=[Note("k", ("m",), "b", "failed", "boom")],
                      provenance={f: PROV for f in values})
        store.commit(batch)
        for field, value in values.items():
            assert _same(store.read("m", "a", field), value), field
        assert store.present("m", "f") == {"a"} and store.fields("m") == set(values)
        assert store.nbytes("m", "a", "big") == 160_000
        assert store.aggregate_names() == ["agg@models[m]", "arr@models[m]"]
        assert store.has_aggregate("agg@models[m]") and not store.has_aggregate("x@models[m]")
        assert store.stamps("m", "f")["a"].provenance == PROV
        store.commit(Batch(notes=[Note("k", ("m",), "b", "skipped", "later")],
                           cleared_notes=set()))
        assert [(n.kind, n.reason) for n in store.notes()] == [("skipped", "later")]
        store.commit(Batch(cleared_notes={("k", ("m",), "b")}))
        assert store.notes() == []
        with pytest.raises(KeyError):
            store.read("m", "b", "f")
        # one field of every parameter at once (what exports read): the same values
        store.commit(Batch(values={("m", "b", "f"): 2.5}, provenance={"f": PROV}))
        for field in values:
            together = store.read_field("m", field)
            assert together.keys() == store.present("m", field)
            assert all(_same(together[p], store.read("m", p, field)) for p in together)
        assert store.read_field("m", "f") == {"a": 1.5, "b": 2.5}
        assert store.read_field("m", "absent") == {}

    def test_a_later_commit_has_a_larger_seq_and_erase_removes(self, store):
        """Stamps order commits; erase removes values, aggregates and notes of the models."""
        store.commit(Batch(values={("m", "a", "f"): 1.0}, provenance={"f": PROV}))
        store.commit(Batch(values={("m", "b", "f"): 2.0}, aggregates={"f@models[m]": 3.0},
                           notes=[Note("k", ("m",), None, "undefined", "why")],
                           provenance={"f": PROV}))
        stamps = store.stamps("m", "f")
        assert stamps["b"].seq > stamps["a"].seq
        assert store.aggregate_stamp("f@models[m]").seq == stamps["b"].seq
        assert store.erase(["f"], ["m"], kernels=["k"]) == 3
        assert store.present("m", "f") == set() and store.aggregate_names() == []
        assert store.notes() == []


class TestAtomicity:
    def test_a_commit_that_fails_midway_stores_nothing_of_its_batch(self, tmp_path):
        """A failure after some rows were written (a note the database refuses) rolls the
        whole batch back, files included; earlier commits stay."""
        st = LocalStore(tmp_path / "st")
        st.add_model("m", [ParamInfo("m", "a", (2,), "float64")], ModelSource("memory"),
                     lambda n: np.ones(2), copy_weights=False)
        st.commit(Batch(values={("m", "a", "kept"): 1.0}))
        bad = Batch(values={("m", "a", "x"): 2.0, ("m", "a", "big"): np.arange(50_000.0)},
                    notes=[Note("k", ("m",), "a", "failed", None)])  # reason NOT NULL
        with pytest.raises(StorageError, match=r"NOT NULL constraint failed: notes.reason"):
            st.commit(bad)
        assert st.fields("m") == {"kept"} and st.read("m", "a", "kept") == 1.0
        assert [p for p in (tmp_path / "st" / "arrays").rglob("*") if p.is_file()] == []
        with pytest.raises(KeyError, match="unknown model"):
            st.commit(Batch(values={("nope", "a", "x"): 1.0}))
        st.close()

    def test_files_of_a_chunk_that_never_committed_are_removed_by_a_lone_opener(self, tmp_path):
        """Array files no row names, left by a writer that did not close (its marker is
        still in .writers/), are deleted when the store is opened by no other process,
        and kept otherwise; a store whose writers all closed is not walked at open."""
        from diffract_storage_local._directory import TRACKED, WRITERS

        LocalStore(tmp_path / "st").close()
        assert (tmp_path / "st" / TRACKED).exists()
        st = LocalStore(tmp_path / "st")
        orphan = tmp_path / "st" / "arrays" / "ab" / "abcdef.npy"
        orphan.parent.mkdir()
        np.save(orphan, np.ones(3))
        unmarked = LocalStore(tmp_path / "st")  # alone? no: st holds it; nothing is deleted
        unmarked.close()
        st.close()
        LocalStore(tmp_path / "st").close()  # alone, but no writer left a marker: no walk
        assert orphan.exists()
        (tmp_path / "st" / WRITERS).mkdir(exist_ok=True)
        (tmp_path / "st" / WRITERS / "4242-dead").touch()  # what a killed writer leaves
        st = LocalStore(tmp_path / "st")  # alone: walks, deletes, clears the marker
        other = LocalStore(tmp_path / "st")
        other.close()
        st.close()
        assert not orphan.exists() and not any((tmp_path / "st" / WRITERS).iterdir())

    def test_a_writer_leaves_a_marker_until_it_closes(self, tmp_path):
        from diffract_storage_local._directory import WRITERS

        st = LocalStore(tmp_path / "st")
        st.add_model("m", [ParamInfo("m", "a", (2,), "float64")], ModelSource("memory"),
                     lambda name: np.ones(2), copy_weights=False)
        st.commit(Batch(values={("m", "a", "big"): np.arange(20_000.0)}))
        assert len(list((tmp_path / "st" / WRITERS).iterdir())) == 1
        other = LocalStore(tmp_path / "st")  # a reader writes nothing: no marker of its own
        assert other.read("m", "a", "big")[-1] == 19_999.0
        other.close()
        assert len(list((tmp_path / "st" / WRITERS).iterdir())) == 1
        st.close()
        assert list((tmp_path / "st" / WRITERS).iterdir()) == []
        reopened = LocalStore(tmp_path / "st")  # the file it wrote is kept
        assert reopened.read("m", "a", "big")[-1] == 19_999.0
        reopened.close()


class TestSchema:
    def test_an_older_schema_is_migrated(self, tmp_path):
        """A version-1 store (no provenance) opens, migrated to the current version."""
        root = tmp_path / "old"
        (root / "arrays").mkdir(parents=True)
        db = sqlite3.connect(root / "store.sqlite")
        db.executescript(_schema.V1 + "INSERT INTO meta VALUES ('schema_version', '1');")
        db.execute("INSERT INTO models VALUES ('m', 1, ?, 0)", (ModelSource("memory").to_json(),))
        db.execute("INSERT INTO params VALUES ('m', 'w', 0, '[2]', 'float64')")
        db.execute("INSERT INTO field_values VALUES ('m', 'f', 'w', 'f', NULL, 2.5, NULL, NULL, 8)")
        db.commit()
        db.close()
        st = LocalStore(root)
        assert st.read("m", "w", "f") == 2.5 and st.stamps("m", "f") == {}
        assert _schema.version_of(st.db) == _schema.SCHEMA_VERSION
        st.close()

    def test_a_newer_schema_is_refused(self, tmp_path):
        """A store written by a newer version is refused with the upgrade command."""
        LocalStore(tmp_path / "st").close()
        db = sqlite3.connect(tmp_path / "st" / "store.sqlite")
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
        db.commit()
        db.close()
        with pytest.raises(StorageError, match=r"written by a newer diffractml-storage-local "
                           r"\(schema 99; this one reads up to \d+\)\. Upgrade: pip install -U"):
            LocalStore(tmp_path / "st")


class TestBadStoreInput:
    def test_a_file_a_foreign_directory_and_a_corrupt_database(self, tmp_path):
        """Each is refused with what to do; nothing is created there."""
        (tmp_path / "file").write_text("x")
        with pytest.raises(StorageError, match=r"is a file, not a Diffract store directory"):
            LocalStore(tmp_path / "file")
        (tmp_path / "dir").mkdir()
        (tmp_path / "dir" / "notes.txt").write_text("x")
        with pytest.raises(StorageError, match=r"is not a Diffract store \(it has no store.sqlite "
                           r"but holds \['notes.txt'\]\)"):
            LocalStore(tmp_path / "dir")
        assert sorted(p.name for p in (tmp_path / "dir").iterdir()) == ["notes.txt"]
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "store.sqlite").write_bytes(b"not a database at all" * 100)
        with pytest.raises(StorageError, match=r"is corrupt or not a Diffract store"):
            LocalStore(tmp_path / "bad")

    def test_an_unwritable_location(self):
        """A location that cannot be created says so."""
        with pytest.raises(StorageError, match=r"Cannot create the store at '/proc/diffract-st'"):
            LocalStore("/proc/diffract-st")

    def test_a_full_disk_stores_nothing_of_the_chunk(self, tmp_path, rng, monkeypatch):
        """A write that fails (disk full, simulated) stores nothing of its chunk and keeps
        everything committed before; freed, apply resumes."""
        import builtins

        from diffract_storage_local import _directory as store_module  # writes the arrays

        with Session(profile="local", path=tmp_path / "st", config={"apply": {"chunk_seconds": 1e-6}}) as s:
            s.models.add(_model(rng), model_id="m")
            s.compute.apply("frob_norm")
            real_open = builtins.open

            def full(path, mode="r", *args, **kwargs):
                if "w" in mode and str(path).endswith(".tmp"):
                    raise OSError(28, "No space left on device")
                return real_open(path, mode, *args, **kwargs)

            monkeypatch.setattr(store_module, "open", full, raising=False)
            with pytest.raises(StorageError, match=r"Cannot write an array into the store .*No "
                               r"space left on device.*nothing of this chunk was stored"):
                s.compute.apply("weights_lsvs")
            assert "weights_lsvs" not in s.results.export_metrics(include_arrays=True)["m"]["big"]
            assert len(s.results.export_metrics("frob_norm")["m"]) == 6
            monkeypatch.undo()
            s.compute.apply("weights_lsvs")
            assert s.results.export_metrics(include_arrays=True)["m"]["big"]["weights_lsvs"].shape == (300, 120)


WRITER = textwrap.dedent("""
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    db.execute("COMMIT")
""")

READER = textwrap.dedent("""
    import sys
    from diffract import Session
    with Session(profile="local", path=sys.argv[1]) as s:
        for _ in range(30):
            rows = s.results.export_metrics("frob_norm").get("m", {})
            assert all(v["frob_norm"] > 0 for v in rows.values())
    print("read ok", flush=True)
""")


class TestConcurrency:
    def test_readers_while_a_writer_applies_and_a_second_writer_times_out(self, tmp_path, rng):
        """Two reading processes run while this one applies; a writer blocked longer
        than the timeout gets a clear error, and the store stays usable."""
        path = tmp_path / "st"
        with Session(profile="local", path=path) as s:
            s.models.add(_model(rng, 30), model_id="m")
        readers = [subprocess.Popen([sys.executable, "-c", READER, str(path)],
                                    stdout=subprocess.PIPE, text=True) for _ in range(2)]
        with Session(profile="local", path=path) as s:
            s.compute.apply("frob_norm", "esd")
        assert [r.communicate(timeout=120)[0].strip() for r in readers] == ["read ok"] * 2
        blocker = subprocess.Popen([sys.executable, "-c", WRITER, str(path / "store.sqlite"), "3"],
                                   stdout=subprocess.PIPE, text=True)
        assert blocker.stdout.readline().strip() == "locked"
        with Session(profile="local", path=path, timeout=0.5) as s:
            with pytest.raises(StorageError, match=r"locked by another writer for more than 0.5 s"):
                s.compute.apply("stable_rank")
            assert s.results.export_metrics("stable_rank")["m"] == {}
        blocker.wait(timeout=30)
        with Session(profile="local", path=path) as s:
            s.compute.apply("stable_rank")
            assert len(s.results.export_metrics("stable_rank")["m"]) == 31

    def test_a_store_open_in_a_killed_process_reopens(self, tmp_path, rng):
        """A process killed with the store open (and a write transaction pending) leaves a
        store that opens and is complete."""
        path = tmp_path / "st"
        with Session(profile="local", path=path) as s:
            s.models.add(_model(rng), model_id="m")
            s.compute.apply("frob_norm")
        blocker = subprocess.Popen([sys.executable, "-c", WRITER, str(path / "store.sqlite"), "60"],
                                   stdout=subprocess.PIPE, text=True)
        assert blocker.stdout.readline().strip() == "locked"
        blocker.kill()
        blocker.wait()
        with Session(profile="local", path=path) as s:
            assert len(s.results.export_metrics("frob_norm")["m"]) == 6
            s.compute.apply("stable_rank")
        assert os.path.exists(path / "store.sqlite")


def test_an_exported_array_survives_its_file_being_truncated(tmp_path):
    """Exports hand out memory the caller owns (they were memory maps of the store's
    .npy files: truncating one killed the reader with SIGBUS). In a subprocess, so a bus
    error shows as its exit status."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import glob, os, numpy as np
        from diffract import Session
        path = {str(tmp_path / "st")!r}
        with Session(profile="local", path=path) as s:
            s.models.add({{"w": np.random.default_rng(0).standard_normal((300, 200))}}, "m")
            s.compute.apply("weights_lsvs")  # 300 x 200 float64: an array file
        with Session(profile="local", path=path) as s:
            esd = s.results.export_metrics("weights_lsvs")["m"]["w"]["weights_lsvs"]
        for f in glob.glob(os.path.join(path, "arrays", "*", "*.npy")):
            os.truncate(f, 200)
        print(float(np.sum(esd)) > 0, type(esd).__name__)
        from diffract.errors import StorageError
        with Session(profile="local", path=path) as s:
            try:
                s.results.export_metrics("weights_lsvs")
            except StorageError as exc:
                print("refused:", "Erase the field and apply again" in str(exc))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr)
    assert run.stdout.split("\n")[:2] == ["True ndarray", "refused: True"]


def test_flipped_bytes_in_any_array_file_are_caught_by_its_checksum(tmp_path):
    """Every array file carries the CRC32 of its bytes in its name and every read checks
    it: a flipped byte in a stored weight copy or a result is a StorageError naming the
    file (76 of 120 flips used to give silently wrong values), and erase + apply
    recovers the result."""
    from diffract.errors import StorageError

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((300, 200))}
    path = tmp_path / "st"
    with Session(profile="local", path=path) as s:
        s.models.add(weights, "m")  # the weights are copied into the store
        s.compute.apply("weights_lsvs")
        good = s.results.export_metrics("weights_lsvs")["m"]["w"]["weights_lsvs"].copy()
    files = sorted((path / "arrays").rglob("*.np[yz]"))
    # the weight copy, U and V^T
    assert len(files) == 3 and all(re.search(r"-[0-9a-f]{8}\.npy$", f.name) for f in files)
    originals = {f: f.read_bytes() for f in files}
    for trial in range(60):
        target = files[trial % 3]
        data = bytearray(originals[target])
        data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        target.write_bytes(bytes(data))
        with Session(profile="local", path=path) as s, pytest.raises(
                StorageError, match=re.escape(target.name) + ".*fails its checksum"):
            s.store.load_weights("m", "w")
            s.results.export_metrics("weights_lsvs", "weights_rsvs")
        target.write_bytes(originals[target])
    with Session(profile="local", path=path) as s:
        np.testing.assert_array_equal(s.store.load_weights("m", "w"), weights["w"])
        s.results.erase("weights_lsvs", "weights_rsvs", "weights_svals")
        s.compute.apply("weights_lsvs")
        np.testing.assert_array_equal(
            s.results.export_metrics("weights_lsvs")["m"]["w"]["weights_lsvs"], good)


def _small_store(path, rng=None) -> None:
    rng = rng or np.random.default_rng(0)
    with Session(profile="local", path=path) as s:
        s.models.add({"w": rng.standard_normal((300, 200)), "v": rng.standard_normal((6, 5))},
                     model_id="m")
        s.compute.apply("frob_norm", "esd")


class TestOneErrorFamily:
    """Issue 25 item 11: a damaged store is a StorageError with what to do, never
    sqlite3's, ValueError or KeyError (each reproduced on main first)."""

    def test_a_database_corrupted_after_its_header(self, tmp_path):
        """Garbage in the middle of the database passes the open's checks; the first
        query that meets it was a raw sqlite3.DatabaseError."""
        _small_store(tmp_path / "st")
        db = tmp_path / "st" / "store.sqlite"
        size = db.stat().st_size
        with open(db, "r+b") as fh:
            fh.seek(size // 2)
            fh.write(np.random.default_rng(1).bytes(size - size // 2))
        with pytest.raises(StorageError, match=r"store.sqlite' is corrupt .*malformed.*Restore "
                           r"it from a copy"):
            with Session(profile="local", path=tmp_path / "st") as s:
                s.results.export_metrics()

    @pytest.mark.parametrize("version", ["'banana'", "0", "-3", "''"])
    def test_a_schema_version_that_is_no_version(self, tmp_path, version):
        """'banana' was a ValueError and 0 a KeyError from the migrations."""
        LocalStore(tmp_path / "st").close()
        db = sqlite3.connect(tmp_path / "st" / "store.sqlite")
        db.execute(f"UPDATE meta SET value = {version} WHERE key = 'schema_version'")
        db.commit()
        db.close()
        with pytest.raises(StorageError, match=r"is corrupt: its schema version is .*, not a "
                           r"version number"):
            LocalStore(tmp_path / "st")

    def test_a_lock_that_is_a_directory(self, tmp_path):
        """``.lock`` made a directory was an IsADirectoryError; nothing else is touched."""
        _small_store(tmp_path / "st")
        (tmp_path / "st" / ".lock").unlink()
        (tmp_path / "st" / ".lock").mkdir()
        with pytest.raises(StorageError, match=r"\.lock' is not a file .*Remove it"):
            LocalStore(tmp_path / "st")
        (tmp_path / "st" / ".lock").rmdir()
        with Session(profile="local", path=tmp_path / "st") as s:
            assert s.results.export_metrics("frob_norm")["m"]["v"]["frob_norm"] > 0


_READ_ONLY_SCRIPT = r"""
import sys
import numpy as np
from diffract import Session
from diffract.errors import StorageError

path, mode = sys.argv[1], sys.argv[2]
opts = {"read_only": True} if mode == "explicit" else {}
with Session(profile="local", path=path, **opts) as s:
    print("RO", s.store.read_only)
    print("ESD", s.results.export_metrics("esd")["m"]["w"]["esd"].shape)
    print("FROB", s.results.export_metrics("frob_norm")["m"]["v"]["frob_norm"])
    print("STALE", s.results.stale())
    print("PROV", sorted(s.results.provenance("frob_norm", "m", "w")))
    for what, call in [("apply", lambda: s.compute.apply("stable_rank")),
                       ("add", lambda: s.models.add({"u": np.ones((2, 2))}, model_id="n")),
                       ("erase", lambda: s.results.erase("frob_norm"))]:
        try:
            call()
            print(what.upper(), "DONE")
        except StorageError as exc:
            print(what.upper(), "REFUSED", exc)
"""


class TestReadOnlyStores:
    """Issue 25 item 12: a store that cannot be written opens read-only: exports,
    stale() and provenance() work, apply/add/erase say why they cannot, nothing changes."""

    @staticmethod
    def _check(out: str, why: str) -> None:
        lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
        assert lines["RO"] == "True" and lines["ESD"] == "(200,)", out
        assert float(lines["FROB"]) > 0 and lines["STALE"] == "[]", out
        assert lines["PROV"] == "['config', 'kernel', 'provider']", out
        for what in ("APPLY", "ADD", "ERASE"):
            assert lines[what].startswith("REFUSED The store at "), out
            assert f"is read-only ({why}): exports, stale() and provenance() work" in lines[what]

    def _run(self, store, mode, wrap=None):
        script = store.parent / "ro.py"
        script.write_text(_READ_ONLY_SCRIPT)
        cmd = [sys.executable, str(script), str(store), mode]
        return subprocess.run(wrap(cmd) if wrap else cmd, capture_output=True, text=True,
                              timeout=120)

    @staticmethod
    def _snapshot(root):
        """Every file's bytes (SQLite's -wal/-shm, which a reader may create, aside)."""
        return {p: p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and not p.name.endswith(("-wal", "-shm"))}

    def test_read_only_true(self, tmp_path):
        _small_store(tmp_path / "st")
        before = self._snapshot(tmp_path / "st")
        done = self._run(tmp_path / "st", "explicit")
        assert done.returncode == 0, done.stderr[-2000:]
        self._check(done.stdout, "opened with read_only=True")
        assert self._snapshot(tmp_path / "st") == before

    def test_a_read_only_file_system(self, tmp_path):
        """A read-only bind mount (a real EROFS): on main the open failed on ``.lock``."""
        import shlex
        import shutil

        if shutil.which("unshare") is None or subprocess.run(
                ["unshare", "-m", "sh", "-c", f"mount --bind {tmp_path} {tmp_path}"],
                capture_output=True).returncode != 0:
            pytest.skip("needs unshare -m and mount (a private mount namespace)")
        _small_store(tmp_path / "st")
        before = self._snapshot(tmp_path / "st")
        st = shlex.quote(str(tmp_path / "st"))

        def wrap(cmd):
            return ["unshare", "-m", "sh", "-c", f"mount --bind {st} {st} && mount -o "
                    f"remount,bind,ro {st} && exec {shlex.join(cmd)}"]

        done = self._run(tmp_path / "st", "auto", wrap)
        assert done.returncode == 0, done.stderr[-2000:]
        self._check(done.stdout, "its directory cannot be written by this user or on this "
                                 "file system")
        assert self._snapshot(tmp_path / "st") == before

    def test_read_only_needs_an_existing_store(self, tmp_path):
        with pytest.raises(StorageError, match=r"There is no Diffract store at .* to open "
                           r"read-only"):
            LocalStore(tmp_path / "none", read_only=True)
        assert not (tmp_path / "none").exists()
        with pytest.raises(StorageError, match=r"read_only must be True, False or None"):
            LocalStore(tmp_path / "none", read_only="yes")


def test_a_meta_tensor_fails_only_its_parameter_in_both_profiles(tmp_path):
    """A parameter on the meta device (no data) refused the whole add to the local
    profile, naming nothing; now both profiles add the model and fail that parameter
    alone with the reason, the others' values equal; after a reopen it is skipped."""
    gen = torch.Generator().manual_seed(0)
    state = {f"l{i}.weight": torch.randn(6, 5, generator=gen) for i in range(3)}
    state["ghost.weight"] = torch.empty(5, 5, device="meta")
    outcomes = []
    for profile, opts in [("ram", {}), ("local", {"path": tmp_path / "st"})]:
        with Session(profile=profile, **opts) as s:
            s.models.add(state, model_id="m")
            report = s.compute.apply("frob_norm", errors="record")
            outcomes.append(({f.unit: f.reason for f in report.failures},
                             s.results.export_metrics("frob_norm")))
    assert outcomes[0] == outcomes[1]
    failures, values = outcomes[0]
    assert list(failures) == ["m/ghost.weight"]
    assert "the parameter is on the meta device and has no data" in failures["m/ghost.weight"]
    assert sorted(values["m"]) == ["l0.weight", "l1.weight", "l2.weight"]
    with Session(profile="local", path=tmp_path / "st") as s:
        s.results.erase("frob_norm")
        report = s.compute.apply("frob_norm")
        assert [u.unit for u in report.skipped] == ["m/ghost.weight"]
        assert "had no data when it was added" in report.skipped[0].reason
        assert s.results.export_metrics("frob_norm") == values


@pytest.mark.parametrize("sync", ["normal", "full"])
def test_sync_full_fsyncs_every_array_file_and_its_folder(tmp_path, monkeypatch, sync):
    """sync="full" survives a power loss only if each array file, and the rename that
    names it, reach the disk before the row that points at them commits: every file
    written is fsynced, then its folder (issue 36, store); "normal" fsyncs no array file."""
    import os
    import stat

    if not os.path.exists("/proc/self/fd"):
        pytest.skip("names the fsynced files through /proc/self/fd (Linux)")
    synced = []
    real = os.fsync

    def recording(fd):
        mode = os.fstat(fd).st_mode
        target = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(("dir" if stat.S_ISDIR(mode) else "file", target))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    rng = np.random.default_rng(0)
    with Session(profile="local", path=tmp_path / "store", sync=sync) as s:
        s.models.add({f"w{i}": rng.standard_normal((120, 100)) for i in range(3)}, "m")
        s.compute.apply("esd", "weights_svals")
    files = sorted(str(p) for p in (tmp_path / "store" / "arrays").rglob("*.np[yz]"))
    assert len(files) >= 3  # the SVDs' vectors (96 and 80 KB each) go to files
    arrays = {t for kind, t in synced if kind == "file" and "/arrays/" in t}
    folders = {t for kind, t in synced if kind == "dir"}
    if sync == "normal":
        assert arrays == set() and folders == set()
        return
    # each file was fsynced under its temporary name, then its folder after the rename
    assert len(arrays) == len(files)
    assert all(os.path.basename(t).startswith(".") and t.endswith(".tmp") for t in arrays)
    assert folders == {str(os.path.dirname(f)) for f in files}


def test_a_flipped_bit_in_a_stored_tuple_is_a_storage_error_naming_its_file(tmp_path):
    """A tuple-valued result large enough for a file is an .npz whose name carries its
    CRC32: a flipped bit anywhere is a StorageError naming the file (not numpy's or
    zipfile's own error), and erase + apply recovers it (issue 36, store)."""
    from diffract.errors import StorageError

    def pair(weights):
        return ((np.arange(20000.0), np.ones(30000)),)

    path = tmp_path / "st"
    with Session(profile="local", path=path) as s:
        s.models.add({"w": np.ones((4, 4))}, model_id="m")
        s.compute.kernel()(pair)
        s.compute.apply("pair")
    (target,) = (path / "arrays").rglob("*.npz")
    assert re.search(r"-[0-9a-f]{8}\.npz$", target.name)
    original = target.read_bytes()
    rng = np.random.default_rng(3)
    for _ in range(12):
        data = bytearray(original)
        data[int(rng.integers(0, len(data)))] ^= 1 << int(rng.integers(0, 8))
        target.write_bytes(bytes(data))
        with Session(profile="local", path=path) as s, pytest.raises(
                StorageError, match=re.escape(target.name) + ".*fails its checksum"):
            s.compute.kernel()(pair)
            s.results.export_metrics("pair", include_arrays=True)
    with Session(profile="local", path=path) as s:
        s.compute.kernel()(pair)
        s.results.erase("pair")
        s.compute.apply("pair")
        (value,) = s.results.export_metrics("pair", include_arrays=True)["m"]["w"].values()
        np.testing.assert_array_equal(value[0], np.arange(20000.0))
