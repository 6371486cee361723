"""`diffract track` and `results.trajectory`: a training run's checkpoints added to a store
incrementally (only what is new is computed: counted), the trajectory frame against the
stored values, sudden changes, and the bad input the command refuses."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("diffract_kernels_spectral")
pytest.importorskip("diffract_report")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

import diffract_kernels_spectral.linalg as linalg  # noqa: E402
from diffract import Session  # noqa: E402
from diffract.cli import main  # noqa: E402
from diffract_report.track import sudden  # noqa: E402

NAMES = ("layers.0.self_attn.q_proj.weight", "layers.0.mlp.up_proj.weight", "layers.1.self_attn.q_proj.weight")
SHAPES = ((40, 30), (50, 30), (40, 30))
METRICS = "stable_rank,log_norm,spectral_norm"


def _run(root: Path, steps: range, event: int | None = None, seed: int = 0,
         dtype: torch.dtype = torch.float32) -> None:
    """Checkpoints ``checkpoint-<step>/model.safetensors`` (in ``dtype``), each a small
    random walk from the previous; at ``event`` layers.1's q projection becomes a
    rank-one matrix."""
    rng = np.random.default_rng(seed)
    weights = {n: rng.standard_normal(s) / math.sqrt(s[1]) for n, s in zip(NAMES, SHAPES, strict=True)}
    for step in steps:
        for name in weights:
            weights[name] = weights[name] + 0.01 * rng.standard_normal(weights[name].shape)
        if step == event:
            weights["layers.1.self_attn.q_proj.weight"] = 3 * np.outer(rng.standard_normal(40),
                                                        rng.standard_normal(30))
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True, exist_ok=True)
        safetensors_torch.save_file({n: torch.tensor(w, dtype=dtype)
                                     for n, w in weights.items()},
                                    str(folder / "model.safetensors"))


@pytest.fixture
def decompositions(monkeypatch):
    """How many ESDs and SVDs the spectral pack computes in this process."""
    counts = {"esd": 0, "svd": 0}
    for name in counts:
        real = getattr(linalg, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(linalg, name, counted)
    return counts


def _track(*args: str) -> int:
    return main(["track", *args, "--executor", "sequential"])


class TestIncremental:
    def test_only_new_checkpoints_are_computed_and_svds_are_per_checkpoint(
            self, tmp_path, decompositions, capsys):
        _run(tmp_path / "run", range(1000, 6000, 1000))
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS) == 0
        out = capsys.readouterr().out
        assert "added 5 checkpoint(s): checkpoint-1000, checkpoint-2000" in out
        # one ESD per matrix per checkpoint for the metrics, one SVD per matrix per
        # checkpoint for the alignment of 4 'previous' and 3 'first' pairs (never per pair)
        assert decompositions == {"esd": 5 * 3, "svd": 5 * 3}
        with Session(profile="local", path=store) as s:
            pairs = {r["models"] for r in s.results.export_aggregates(
                "l_subspace_overlap", export_format="list")}
        assert pairs == {"checkpoint-1000,checkpoint-2000", "checkpoint-2000,checkpoint-3000",
                         "checkpoint-3000,checkpoint-4000", "checkpoint-4000,checkpoint-5000",
                         "checkpoint-1000,checkpoint-3000", "checkpoint-1000,checkpoint-4000",
                         "checkpoint-1000,checkpoint-5000"}

        # unchanged: nothing added, nothing computed
        decompositions.update(esd=0, svd=0)
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS) == 0
        assert "added" not in capsys.readouterr().out
        assert decompositions == {"esd": 0, "svd": 0}


    def test_a_new_checkpoint_costs_its_own_work(self, tmp_path, decompositions, capsys):
        _run(tmp_path / "all", range(1000, 7000, 1000))
        (tmp_path / "run").mkdir()
        for step in range(1000, 6000, 1000):
            os.rename(tmp_path / "all" / f"checkpoint-{step}",
                      tmp_path / "run" / f"checkpoint-{step}")
        store = str(tmp_path / "store")
        glob = str(tmp_path / "run" / "checkpoint-*")
        assert _track(glob, "--store", store, "--metrics", METRICS) == 0
        os.rename(tmp_path / "all" / "checkpoint-6000", tmp_path / "run" / "checkpoint-6000")
        decompositions.update(esd=0, svd=0)
        assert _track(glob, "--store", store, "--metrics", METRICS) == 0
        out = capsys.readouterr().out
        assert "added 1 checkpoint(s): checkpoint-6000" in out
        assert decompositions == {"esd": 3, "svd": 3}
        with Session(profile="local", path=store) as s:
            pairs = {r["models"] for r in s.results.export_aggregates(
                "l_subspace_overlap", export_format="list")}
            assert {"checkpoint-5000,checkpoint-6000", "checkpoint-1000,checkpoint-6000"} <= pairs
            # the same numbers as one uninterrupted run over the six
            incremental = s.results.trajectory("stable_rank")
        with Session() as s:
            for step in range(1000, 7000, 1000):
                s.models.add(tmp_path / "run" / f"checkpoint-{step}" / "model.safetensors",
                             f"checkpoint-{step}")
            s.compute.apply("stable_rank")
            pd.testing.assert_frame_equal(incremental, s.results.trajectory("stable_rank"))

    def test_changed_settings_recompute_through_the_stale_mechanism(
            self, tmp_path, decompositions, capsys):
        _run(tmp_path / "run", range(1000, 4000, 1000))
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", "stable_rank",
                      "--against", "none") == 0
        decompositions.update(esd=0, svd=0)
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", "stable_rank",
                      "--against", "none", "--set", "esd.precision=float32") == 0
        assert decompositions["esd"] == 3 * 3  # every checkpoint again: its ESD is stale
        # said: the ESD and the stable rank computed from it, for 3 x 3 matrices
        assert ("18 stored result(s) of esd, stable_rank were computed with another "
                "configuration") in capsys.readouterr().out


class TestStoreSize:
    """A tracked run keeps what the next checkpoint's alignment reads, not every
    checkpoint's singular vectors (issue 39 item 1): the store grew 3.9x faster than the
    run, by each checkpoint's U and V and each pair's k x k overlap matrices."""

    def _stored(self, store):
        with Session(profile="local", path=store) as s:
            ids = s.models.ordered()
            fields = {m: set(s.store.fields(m)) for m in ids}
            overlaps = [n for n in s.store.aggregate_names() if n.startswith("l_overlap@")]
            values = s.results.export_aggregates(
                "l_subspace_overlap", "avg_max_l_agreement_top", "sval_rel_change",
                export_format="list")
        return ids, fields, overlaps, sorted((r["field"], r["models"], r["param"],
                                              float(r["value"])) for r in values)

    def test_only_the_first_and_latest_vectors_stay_and_values_are_unchanged(
            self, tmp_path, decompositions, capsys):
        _run(tmp_path / "all", range(1000, 7000, 1000))
        (tmp_path / "run").mkdir()
        for step in range(1000, 6000, 1000):
            os.rename(tmp_path / "all" / f"checkpoint-{step}",
                      tmp_path / "run" / f"checkpoint-{step}")
        glob = str(tmp_path / "run" / "checkpoint-*")
        lean, kept = str(tmp_path / "lean"), str(tmp_path / "kept")
        assert _track(glob, "--store", lean, "--metrics", METRICS) == 0
        assert _track(glob, "--store", kept, "--metrics", METRICS, "--keep-vectors") == 0
        ids, fields, overlaps, values = self._stored(lean)
        assert overlaps == []  # the pairwise k x k matrices are gone
        assert [m for m in ids if "weights_lsvs" in fields[m]] == [ids[0], ids[-1]]
        assert not any("weights_rsvs" in f for f in fields.values())
        assert all("esd" in f for f in fields.values())  # the spectra stay
        kept_ids, kept_fields, kept_overlaps, kept_values = self._stored(kept)
        assert all("weights_rsvs" in f for f in kept_fields.values())  # nothing pruned
        assert values == kept_values  # bit for bit: the same vectors, before they went
        # an unchanged run computes nothing; a new checkpoint pairs with what stayed
        decompositions.update(esd=0, svd=0)
        assert _track(glob, "--store", lean, "--metrics", METRICS) == 0
        assert decompositions == {"esd": 0, "svd": 0}
        os.rename(tmp_path / "all" / "checkpoint-6000", tmp_path / "run" / "checkpoint-6000")
        assert _track(glob, "--store", lean, "--metrics", METRICS) == 0
        assert decompositions == {"esd": 3, "svd": 3}  # the new checkpoint's own, only
        assert _track(glob, "--store", kept, "--metrics", METRICS, "--keep-vectors") == 0
        ids, fields, _, values = self._stored(lean)
        assert [m for m in ids if "weights_lsvs" in fields[m]] == [ids[0], "checkpoint-6000"]
        assert values == self._stored(kept)[3]
        capsys.readouterr()


    def test_vectors_are_kept_in_float32_and_move_the_alignment_by_rounding_only(
            self, tmp_path, capsys):
        """The vectors a track keeps are float32 (half the bytes); its alignment values
        are within 1e-7 of the same run kept in float64 (float32's rounding of unit
        vectors: 8e-9 measured on these small layers), the singular values' field is
        unchanged, and the process-wide svd setting is as it was after."""
        from diffract import Session as Plain

        _run(tmp_path / "run", range(1000, 4000, 1000))
        run, f32, f64 = str(tmp_path / "run"), str(tmp_path / "f32"), str(tmp_path / "f64")
        assert _track(run, "--store", f32, "--metrics", METRICS) == 0
        with Plain() as s:
            assert s.compute.kernel_config("svd")["vectors"] == "float64"
        assert _track(run, "--store", f64, "--metrics", METRICS, "--set",
                      "svd.vectors=float64") == 0
        for store, dtype in ((f32, np.float32), (f64, np.float64)):
            with Session(profile="local", path=store) as s:
                last = s.models.ordered()[-1]
                lsvs = s.filter(model_ids=[last]).results.export_metrics("weights_lsvs")
                assert {np.asarray(v["weights_lsvs"]).dtype for v in lsvs[last].values()} \
                    == {np.dtype(dtype)}
        rounded, exact = self._stored(f32)[3], self._stored(f64)[3]
        assert [r[:3] for r in rounded] == [r[:3] for r in exact]
        assert rounded != exact  # the rounding is there ...
        for (*_, a), (*_, b) in zip(rounded, exact, strict=True):  # ... and that small
            assert abs(a - b) <= 1e-7  # measured here: 8.0e-9 (the subspace overlap 1.2e-9)
        capsys.readouterr()

    def test_a_run_keeps_the_top_tenth_of_the_vectors(self, tmp_path, capsys):
        """What stays of a checkpoint's vectors is its matrices' top tenth of directions
        (3 of 30 here), what the alignment fields read: the subspace overlap and the
        singular values' change are those of all the vectors kept, bit for bit, and so is
        the top-tenth agreement (avg_max_l_agreement_top); the agreement over every
        direction is computed where every direction's vectors are kept, and only there."""
        _run(tmp_path / "run", range(1000, 4000, 1000))
        run, tenth, full = str(tmp_path / "run"), str(tmp_path / "tenth"), str(tmp_path / "all")
        assert _track(run, "--store", tenth, "--metrics", METRICS) == 0
        assert _track(run, "--store", full, "--metrics", METRICS, "--keep-vectors",
                      "--set", "svd.vector_share=1", "--set", "l_overlap.k=3") == 0
        with Session(profile="local", path=tenth) as s:
            kept = [m for m in s.models.ordered() if "weights_lsvs" in s.store.fields(m)]
            lsvs = s.filter(model_ids=kept).results.export_metrics("weights_lsvs")
            assert {np.asarray(v["weights_lsvs"]).shape for m in kept
                    for v in lsvs[m].values()} == {(40, 3), (50, 3)}
        with Session(profile="local", path=full) as s:
            lsvs = s.results.export_metrics("weights_lsvs")
            assert {np.asarray(v["weights_lsvs"]).shape[1] for m in lsvs
                    for v in lsvs[m].values()} == {30}
        assert self._stored(tenth)[3] == self._stored(full)[3]
        with Session(profile="local", path=full) as s:
            every = s.results.export_aggregates("avg_max_l_agreement", export_format="list")
        with Session(profile="local", path=tenth) as s:
            assert s.results.export_aggregates("avg_max_l_agreement", export_format="list") == []
        assert len(every) == len(self._stored(full)[3]) // 3 and all(0 < r["value"] <= 1 for r in every)
        capsys.readouterr()

    def test_a_field_asking_for_more_vectors_than_kept_is_undefined_with_the_reason(
            self, tmp_path, capsys):
        _run(tmp_path / "run", range(1000, 3000, 1000))
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS,
                      "--set", "l_subspace.k=5") == 0
        with Session(profile="local", path=store) as s:
            notes = [n for n in s.store.notes() if n.kernel == "l_subspace"]
        assert len(notes) == 3 and {n.kind for n in notes} == {"undefined"}
        assert all("read the top 5 of 30 directions, and the SVD kept the vectors "
                   "of 3" in n.reason for n in notes)
        capsys.readouterr()

    def test_a_store_goes_on_with_the_vectors_it_was_started_with(
            self, tmp_path, decompositions, capsys):
        """A run tracked with all its vectors (as every run was before the top tenth)
        goes on so: nothing is stale, only the new checkpoint is decomposed, and it keeps
        all its vectors too."""
        _run(tmp_path / "all", range(1000, 4000, 1000))
        (tmp_path / "run").mkdir()
        for step in (1000, 2000):
            os.rename(tmp_path / "all" / f"checkpoint-{step}",
                      tmp_path / "run" / f"checkpoint-{step}")
        run, store = str(tmp_path / "run"), str(tmp_path / "store")
        assert _track(run, "--store", store, "--metrics", METRICS, "--set",
                      "svd.vector_share=1") == 0
        os.rename(tmp_path / "all" / "checkpoint-3000", tmp_path / "run" / "checkpoint-3000")
        capsys.readouterr()
        decompositions.update(esd=0, svd=0)
        assert _track(run, "--store", store, "--metrics", METRICS) == 0
        assert "another configuration" not in capsys.readouterr().out
        assert decompositions == {"esd": 3, "svd": 3}
        with Session(profile="local", path=store) as s:
            lsvs = s.filter(model_ids=["checkpoint-3000"]).results.export_metrics(
                "weights_lsvs")["checkpoint-3000"]
            assert {np.asarray(v["weights_lsvs"]).shape[1] for v in lsvs.values()} == {30}

    def test_the_first_round_prunes_checkpoint_by_checkpoint(self, tmp_path, monkeypatch):
        """Five checkpoints in one round: after each checkpoint's pairs, at most two
        checkpoints hold vectors (the first and that one), not all five until the end."""
        import diffract_report.track as track_module

        _run(tmp_path / "run", range(1000, 6000, 1000))
        held = []
        real = track_module.prune

        def prune(session, ids, *args, **kwargs):
            real(session, ids, *args, **kwargs)
            held.append(sum("weights_lsvs" in session.store.fields(m)
                            for m in session.models.ordered()))

        monkeypatch.setattr(track_module, "prune", prune)
        assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--metrics",
                      "stable_rank") == 0
        assert held == [2, 2, 2, 2]  # once per new checkpoint after the first

    def test_a_round_with_nothing_new_walks_the_store_once(self, tmp_path, monkeypatch):
        """Rerun over checkpoints all computed: staleness is checked once for the round
        (not once per apply, each reading every stamp of the store: a round over 21
        GPT-2-small checkpoints took 32 s that way, 7 s now) and the vectors are pruned
        once, not per checkpoint."""
        import diffract.compute
        import diffract.results
        import diffract_report.track as track_module

        _run(tmp_path / "run", range(1000, 6000, 1000))
        store = str(tmp_path / "s")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", "stable_rank") == 0
        calls = {"stale": 0, "prune": 0}
        for module in (diffract.compute, diffract.results):
            real_stale = module.find_stale

            def counted(*args, _real=real_stale, **kwargs):
                calls["stale"] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(module, "find_stale", counted)
        real_prune = track_module.prune

        def prune(*args, **kwargs):
            calls["prune"] += 1
            return real_prune(*args, **kwargs)

        monkeypatch.setattr(track_module, "prune", prune)
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", "stable_rank") == 0
        assert calls == {"stale": 1, "prune": 1}

    def test_without_the_first_as_reference_only_the_latest_vectors_stay(self, tmp_path):
        _run(tmp_path / "run", range(1000, 5000, 1000))
        store = str(tmp_path / "lean")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", "stable_rank",
                      "--against", "previous") == 0
        ids, fields, overlaps, values = self._stored(store)
        assert [m for m in ids if "weights_lsvs" in fields[m]] == [ids[-1]]
        assert overlaps == [] and len({r[1] for r in values}) == 3  # the 3 previous pairs

    def test_the_first_checkpoint_deleted_still_anchors_the_new_pairs(self, tmp_path):
        """A Trainer's save_total_limit deletes the first checkpoint's folder: the next
        round still compares the new checkpoint with it from what the store kept (its
        vectors, and the shapes the subspace fields read), and gets the values a run whose
        folder stayed gets."""
        _run(tmp_path / "all", range(1000, 5000, 1000))
        run, kept = tmp_path / "run", tmp_path / "kept"
        run.mkdir()
        for step in (1000, 2000, 3000):
            shutil.copytree(tmp_path / "all" / f"checkpoint-{step}", run / f"checkpoint-{step}")
        assert _track(str(run), "--store", str(tmp_path / "gone"), "--metrics", METRICS) == 0
        shutil.rmtree(run / "checkpoint-1000")
        shutil.copytree(tmp_path / "all" / "checkpoint-4000", run / "checkpoint-4000")
        assert _track(str(run), "--store", str(tmp_path / "gone"), "--metrics", METRICS) == 0
        assert _track(str(tmp_path / "all"), "--store", str(kept), "--metrics", METRICS) == 0
        values = self._stored(tmp_path / "gone")[3]
        assert values == self._stored(kept)[3]
        first = [r for r in values if r[1] == "checkpoint-1000,checkpoint-4000"]
        assert {r[0] for r in first} == {"l_subspace_overlap", "avg_max_l_agreement_top",
                                         "sval_rel_change"}
        assert all(math.isfinite(r[3]) for r in first) and len(first) == 3 * len(NAMES)


class TestRefusals:
    def test_a_changed_checkpoint_is_refused_with_what_changed(self, tmp_path, capsys):
        _run(tmp_path / "run", range(1000, 3000, 1000))
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS) == 0
        path = tmp_path / "run" / "checkpoint-1000" / "model.safetensors"
        data = path.read_bytes()
        path.write_bytes(data[:-4] + b"\x00\x00\x80\x3f")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS) == 2
        err = capsys.readouterr().err
        assert "checkpoint 'checkpoint-1000' changed on disk" in err and str(path) in err
        with Session(profile="local", path=store) as s:  # nothing lost
            assert s.models.ordered() == ["checkpoint-1000", "checkpoint-2000"]

    def test_two_checkpoints_with_one_step_are_refused_naming_both(self, tmp_path, capsys):
        _run(tmp_path / "run", range(1000, 3000, 1000))
        _run(tmp_path / "other", [1000])
        os.rename(tmp_path / "other" / "checkpoint-1000", tmp_path / "run" / "step-1000")
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store) == 2
        err = capsys.readouterr().err
        assert "'checkpoint-1000' and 'step-1000' both have step 1000" in err
        assert "--step-from" in err
        with Session(profile="local", path=store) as s:
            assert s.models.model_ids == []  # the round added nothing

    def test_glob_matching_nothing_and_no_step(self, tmp_path, capsys):
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "nothing-*"), "--store", store) == 2
        assert "matches no checkpoint" in capsys.readouterr().err
        _run(tmp_path / "run", [1000])
        os.rename(tmp_path / "run" / "checkpoint-1000", tmp_path / "run" / "final")
        assert _track(str(tmp_path / "run"), "--store", store) == 2
        assert "has no step" in capsys.readouterr().err
        with Session(profile="local", path=store) as s:
            assert s.models.model_ids == []  # the refused round added nothing
        assert main(["track", str(tmp_path / "run")]) == 2
        assert "--store" in capsys.readouterr().err

    def test_a_checkpoint_of_another_shape_is_analysed_alone(self, tmp_path, capsys):
        _run(tmp_path / "run", range(1000, 4000, 1000))
        odd = tmp_path / "run" / "checkpoint-2500"
        odd.mkdir()
        safetensors_torch.save_file({"layers.0.self_attn.q_proj.weight": torch.randn(40, 20)},
                                    str(odd / "model.safetensors"))
        store = str(tmp_path / "store")
        assert _track(str(tmp_path / "run"), "--store", store, "--metrics", METRICS) == 0
        out = capsys.readouterr().out
        assert ("checkpoint-2500: its parameters differ from the run's (checkpoint-1000): "
                "2 missing (layers.0.mlp.up_proj.weight, layers.1.self_attn.q_proj.weight); "
                "1 of another shape (layers.0.self_attn.q_proj.weight)") in out
        with Session(profile="local", path=store) as s:
            pairs = {r["models"] for r in s.results.export_aggregates(
                "l_subspace_overlap", export_format="list")}
            assert pairs == {"checkpoint-1000,checkpoint-2000",
                             "checkpoint-2000,checkpoint-3000",
                             "checkpoint-1000,checkpoint-3000"}
            assert not math.isnan(s.results.export_metrics("stable_rank")[
                "checkpoint-2500"]["layers.0.self_attn.q_proj.weight"]["stable_rank"])


class TestTrajectory:
    def test_frame_equals_stored_values_by_param_ptype_and_view(self, tmp_path):
        _run(tmp_path / "run", (3000, 1000, 20000))
        with Session() as s:
            for step in (20000, 1000, 3000):  # added out of order
                s.models.add(tmp_path / "run" / f"checkpoint-{step}" / "model.safetensors",
                             f"checkpoint-{step}", views=["heads"],
                             view_options={"heads": 5, "head_dim": 8})
            s.compute.apply("stable_rank")
            stored = s.results.export_metrics("stable_rank")
            frame = s.results.trajectory("stable_rank")
            assert list(frame.index) == [1000, 3000, 20000] and frame.index.name == "step"
            assert sorted(frame.columns) == sorted(NAMES)
            for step in (1000, 3000, 20000):
                for name in NAMES:
                    assert frame.loc[step, name] == stored[f"checkpoint-{step}"][name][
                        "stable_rank"]
            views = s.results.trajectory("stable_rank", by="view")
            assert len(views.columns) == 10  # the two q projections, 5 heads each
            assert views.loc[3000, "layers.1.self_attn.q_proj.weight[head=4]"] == stored["checkpoint-3000"][
                "layers.1.self_attn.q_proj.weight[head=4]"]["stable_rank"]
            by_type = s.results.trajectory("stable_rank", by="ptype")
            ptypes = {p.name: p.ptype for p in s.models.params("checkpoint-1000")}
            for ptype in by_type.columns:
                members = [n for n in NAMES if ptypes[n] == ptype]
                assert by_type.loc[1000, ptype] == pytest.approx(
                    np.mean([stored["checkpoint-1000"][n]["stable_rank"] for n in members]),
                    rel=1e-12)
            # the alias and a subset of models
            assert s.results.trajectory("stable_rank").equals(frame)
            sub = s.filter(model_ids=["checkpoint-3000", "checkpoint-1000"])
            assert list(sub.results.trajectory("stable_rank").index) == [1000, 3000]

    def test_an_undefined_parameter_is_left_out_of_its_types_mean(self):
        """by="ptype": the mean of the type's defined values; a parameter whose value is
        undefined (NaN weights: stable_rank has no value) is left out, not a NaN mean."""
        rng = np.random.default_rng(3)
        weights = {f"layers.{i}.self_attn.q_proj.weight": rng.standard_normal((12, 8))
                   for i in range(3)}
        weights["layers.0.self_attn.q_proj.weight"][0, 0] = np.nan
        with Session() as s:
            s.models.add(weights, "m", step=5)
            s.compute.apply("stable_rank", errors="record")
            stored = s.results.export_metrics("stable_rank")["m"]
            by_type = s.results.trajectory("stable_rank", by="ptype")
        assert math.isnan(stored["layers.0.self_attn.q_proj.weight"]["stable_rank"])
        defined = [stored[f"layers.{i}.self_attn.q_proj.weight"]["stable_rank"] for i in (1, 2)]
        assert list(by_type.columns) == ["attention"]
        assert by_type.loc[5, "attention"] == pytest.approx(np.mean(defined), rel=1e-12)

    def test_models_without_a_step_are_indexed_by_id(self):
        rng = np.random.default_rng(0)
        with Session() as s:
            s.models.add({"w": rng.standard_normal((20, 10))}, "b")
            s.models.add({"w": rng.standard_normal((20, 10))}, "a")
            s.compute.apply("stable_rank")
            frame = s.results.trajectory("stable_rank")
            assert frame.index.name == "model_id" and list(frame.index) == ["b", "a"]
            with pytest.raises(Exception, match="by must be"):
                s.results.trajectory("stable_rank", by="layer")


class TestSudden:
    def _frame(self, n: int = 12, seed: int = 0) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        walk = np.cumsum(0.01 * rng.standard_normal((n, 3)), axis=0) + 2.0
        return pd.DataFrame(walk, index=[100 * (i + 1) for i in range(n)],
                            columns=["a", "b", "c"])

    def test_an_event_is_flagged_at_its_step_and_column_only(self):
        frame = self._frame()
        frame.loc[700:, "b"] += 0.5
        flags = sudden(frame, 10)
        assert [(step, column) for step, column, _, _ in flags] == [(700, "b")]
        assert flags[0][2] == pytest.approx(0.5, abs=0.05)

    def test_a_change_is_judged_against_the_others_not_itself(self):
        """Changes 0, 0, .1, .1, 1: the others' median is .05 and MAD .05, so the last is
        19 MADs (flagged at k=10); counted in its own history it would be 9."""
        frame = pd.DataFrame({"a": [5.0, 5.0, 5.0, 5.1, 5.2, 6.2]}, index=range(6))
        [(step, column, change, size)] = sudden(frame, 10)
        assert (step, column) == (5, "a") and size == pytest.approx(19, rel=1e-6)

    def test_noise_and_short_histories_are_not_flagged(self):
        assert sudden(self._frame(), 10) == []
        short = self._frame(n=5)
        short.loc[400:, "a"] += 5.0
        assert sudden(short, 10) == []  # 4 changes: too few to judge one against 3
        flat = pd.DataFrame({"a": [1.0] * 10})
        flat.iloc[6:, 0] += 1e-9  # float noise on a flat series
        assert sudden(flat, 10) == []
        assert sudden(self._frame(), 0.01)  # and a tiny k flags the noise


def test_ctrl_c_during_watch_leaves_a_store_that_resumes(tmp_path):
    _run(tmp_path / "run", range(1000, 4000, 1000))
    store = tmp_path / "store"
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    proc = subprocess.Popen([sys.executable, "-m", "diffract.cli", "track",
                             str(tmp_path / "run"), "--store", str(store), "--metrics",
                             METRICS, "--watch", "0.2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("sudden") or "moved most" in line:
            break  # the first round is reported; Ctrl-C lands wherever the watch is
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (lines, out, err)
    assert "interrupted" in err and "Traceback" not in err
    with Session(profile="local", path=store) as s:
        assert s.models.ordered() == ["checkpoint-1000", "checkpoint-2000", "checkpoint-3000"]
        assert s.results.trajectory("stable_rank").notna().all().all()


def test_the_report_of_a_run_tracked_with_head_views(tmp_path, capsys):
    """--report: per metric a layers x steps heat map holding the trajectory's numbers,
    the by-type lines, views x steps with --views heads, the alignment curves, the
    movers and the sudden changes with the planted event's step and layer first."""
    import html
    import json
    import re

    pytest.importorskip("diffract_views")
    _run(tmp_path / "run", range(1000, 9000, 1000), event=6000)
    report = tmp_path / "run.html"
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--metrics",
                  METRICS, "--views", "heads", "--view-option", "heads=5",
                  "--view-option", "head_dim=8", "--report", str(report)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    top = lines[next(i for i, line in enumerate(lines) if line.startswith("sudden")) + 1]
    assert top.startswith("  step 6000  layers.1.self_attn.q_proj.weight: ")
    text = report.read_text()
    for title in ("stable_rank per layer and step", "stable_rank by layer type (mean)",
                  "stable_rank per view and step", "l_subspace_overlap, mean over the layers"):
        assert title in text, title
    charts = [json.loads(html.unescape(c))
              for c in re.findall(r"<div class=chart data-chart='([^']*)'", text)]
    heat = next(p["heat"] for c in charts for p in c["panels"]
                if p.get("title") == "stable_rank per layer and step")
    with Session(profile="local", path=tmp_path / "store") as s:
        frame = s.results.trajectory("stable_rank")
    assert heat["cols"] == [str(step) for step in frame.index]
    row = heat["rows"].index("layers.0.mlp.up_proj.weight")
    assert heat["z"][row] == pytest.approx(list(frame["layers.0.mlp.up_proj.weight"]),
                                           rel=1e-4)  # the report keeps 5 digits
    views = next(p["heat"] for c in charts for p in c["panels"]
                 if p.get("title") == "stable_rank per view and step")
    assert len(views["rows"]) == 10 and "layers.1.self_attn.q_proj.weight[head=4]" in \
        views["rows"]
    sudden_table = text[text.index('<table class="sortable" id="sudden">'):]
    first_row = sudden_table[sudden_table.index("<tbody><tr") + 7:]
    first_row = first_row[:first_row.index("</tr>")]
    assert ">6000<" in first_row and "layers.1.self_attn.q_proj.weight" in first_row
    assert '<table class="sortable" id="movers">' in text


def test_a_categorical_field_is_not_ranked_by_movement(tmp_path, capsys):
    """pl_fit_quality holds words: no 'moved most ... undefined' line for it, and no
    heat map of it in the report; the numeric fields beside it still are."""
    _run(tmp_path / "run", range(1000, 5000, 1000))
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--metrics",
                  "pl_fit_quality,stable_rank", "--against", "none",
                  "--report", str(tmp_path / "r.html")) == 0
    out = capsys.readouterr().out
    assert "stable_rank moved most" in out and "pl_fit_quality moved most" not in out
    text = (tmp_path / "r.html").read_text()
    assert "stable_rank per layer and step" in text
    assert "pl_fit_quality per layer and step" not in text


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_out_writes_the_trajectories_and_the_alignment(tmp_path, capsys, fmt):
    """track --out DIR (issue 33 item 9): it accepted --out, --format and --plot and did
    nothing with them. Each numeric metric's trajectory is written, equal to
    results.trajectory(); the pairs' alignment as CSV; --plot is refused with where the
    charts are; --format json without --out is refused."""
    import json

    _run(tmp_path / "run", range(1000, 4000, 1000))
    out = tmp_path / "out"
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--metrics",
                  "stable_rank,pl_fit_quality", "--out", str(out), "--format", fmt) == 0
    ext = "csv" if fmt == "table" else "json"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [f"trajectory-stable_rank.{ext}", "alignment.csv"])  # no words-valued trajectory
    with Session(profile="local", path=tmp_path / "s") as s:
        frame = s.results.trajectory("stable_rank")
        pairs = s.results.export_aggregates("l_subspace_overlap", export_format="list")
    if fmt == "json":
        written = json.loads((out / "trajectory-stable_rank.json").read_text())
        got = pd.DataFrame.from_dict(written, orient="index")
        got.index = got.index.astype(int)
    else:
        got = pd.read_csv(out / "trajectory-stable_rank.csv", index_col="step")
    pd.testing.assert_frame_equal(got, frame, check_names=False, check_column_type=False)
    rows = pd.read_csv(out / "alignment.csv")
    assert len(rows[rows["field"] == "l_subspace_overlap"]) == len(pairs) == 3 * 3
    capsys.readouterr()
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--plot",
                  str(tmp_path / "p")) == 2
    assert "--report FILE.html" in capsys.readouterr().err
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--format",
                  "json") == 2
    assert "give --out DIR" in capsys.readouterr().err


def test_track_and_compare_agree_on_every_field_name_they_share(tmp_path, capsys):
    """One definition per field name (issue 64 item 2): the same pair of checkpoints,
    tracked (the top tenth of the vectors kept, float32) and compared (every vector):
    every alignment field both store has the same value (float32's rounding apart), the
    top-tenth agreement has its own name, and avg_max_l_agreement (over every direction)
    is computed by track only where it keeps every direction's vectors, then equal."""
    from diffract.plugins import reset_registry

    _run(tmp_path / "run", range(1000, 3000, 1000))
    pair = [str(tmp_path / "run" / f"checkpoint-{s}") for s in (1000, 2000)]
    fields = ("avg_max_l_agreement", "avg_max_l_agreement_top", "l_subspace_overlap",
              "sval_rel_change")
    stores = {"track": str(tmp_path / "t"), "track-all": str(tmp_path / "ta"),
              "compare": str(tmp_path / "c")}
    assert _track(str(tmp_path / "run"), "--store", stores["track"], "--metrics",
                  METRICS) == 0
    reset_registry()
    assert _track(str(tmp_path / "run"), "--store", stores["track-all"], "--metrics",
                  METRICS, "--set", "svd.vector_share=1") == 0
    reset_registry()
    assert main(["compare", *pair, "--store", stores["compare"], "--metrics",
                 ",".join(fields), "--executor", "sequential"]) == 0
    capsys.readouterr()
    values = {}
    for name, store in stores.items():
        with Session(profile="local", path=store) as s:
            values[name] = {(r["field"], r["param"]): r["value"] for r in
                            s.results.export_aggregates(*fields, export_format="list")}
    compared = values["compare"]
    assert {f for f, _ in compared} == set(fields)
    assert {f for f, _ in values["track"]} == set(fields) - {"avg_max_l_agreement"}
    assert {f for f, _ in values["track-all"]} == set(fields)
    for name in ("track", "track-all"):
        for key, value in values[name].items():
            assert value == pytest.approx(compared[key], abs=1e-7), (name, key)
    top = {p: v for (f, p), v in compared.items() if f == "avg_max_l_agreement_top"}
    every = {p: v for (f, p), v in compared.items() if f == "avg_max_l_agreement"}
    assert all(abs(top[p] - every[p]) > 1e-3 for p in top)  # two numbers, two names


def test_views_asked_of_a_store_without_them_say_so(tmp_path, capsys):
    """`track --store S --views heads` on a store whose checkpoints were added without
    views says that a store's models keep the views they were added with (it said
    nothing); with views in the store, no such line."""
    _run(tmp_path / "run", (1000, 2000))
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--metrics",
                  "stable_rank") == 0
    capsys.readouterr()
    assert _track("--store", str(tmp_path / "s"), "--views", "heads") == 0
    out = capsys.readouterr().out
    assert (f"--views heads: the checkpoints in {tmp_path / 's'} were added without views"
            in out), out
    assert _track(str(tmp_path / "run"), "--store", str(tmp_path / "v"), "--views", "heads",
                  "--view-option", "heads=5", "--view-option", "head_dim=8") == 0
    capsys.readouterr()
    assert _track("--store", str(tmp_path / "v"), "--views", "heads") == 0
    assert "added without views" not in capsys.readouterr().out


def test_track_reads_at_most_one_checkpoint_at_a_time(tmp_path):
    """The chunks in flight share the largest checkpoint's bytes (counted as the chunker
    counts a read: bfloat16 as the float32 it is read as), unless [cache] max_bytes sets
    the bound."""
    from diffract_report.track import _one_checkpoint_in_memory

    small = {"a": torch.ones(1024, 1024), "b": torch.ones(512, 1024, dtype=torch.bfloat16)}
    large = {"a": torch.ones(2048, 2048), "b": torch.ones(2048, 2048, dtype=torch.bfloat16)}
    with Session() as s:
        s.models.add(small, "small")
        s.models.add(large, "large")
        _one_checkpoint_in_memory(s, ["small", "large"])
        assert s.cache.max_bytes == 2 * 2048 * 2048 * 4
        assert s.cache.read_budget() <= 2 * 2048 * 2048 * 4 // 3
    with Session(config={"cache": {"max_bytes": 1 << 30}}) as s:
        s.models.add(small, "small")
        _one_checkpoint_in_memory(s, ["small"])
        assert s.cache.max_bytes == 1 << 30
