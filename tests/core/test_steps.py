"""Checkpoints as a time axis: steps parsed from names and trainer_state.json, given by the
caller, stored in both profiles, exported, and used for ordering instead of the id."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from diffract import KernelApplyLevel, Session
from diffract.core.steps import order, parse_name
from diffract.errors import InvalidArgumentError


@pytest.mark.parametrize("name, expected", [
    ("step-1000", {"step": 1000}), ("step1000", {"step": 1000}), ("step_1000", {"step": 1000}),
    ("checkpoint-1000", {"step": 1000}), ("global_step1000", {"step": 1000}),
    ("iter_0001000", {"step": 1000}), ("ckpt-1000", {"step": 1000}),
    ("epoch_05", {"epoch": 5}), ("model_final", {}), ("resnet50", {}),
])
def test_step_patterns(name, expected):
    assert parse_name(name) == expected


def test_order_is_by_step_not_by_string():
    steps = {"step-10000": {"step": 10000}, "step-2000": {"step": 2000}, "base": {}}
    assert order(["step-10000", "base", "step-2000"], steps) == ["step-2000", "step-10000",
                                                                 "base"]


class TestModels:
    def _model(self):
        return {"w": np.random.default_rng(0).standard_normal((6, 4))}

    def test_steps_from_paths_trainer_state_and_the_caller(self, tmp_path):
        """A folder name, a file name, trainer_state.json (which wins over the name),
        step= (which wins over everything) and step_from."""
        for folder in ("checkpoint-2000", "run-a", "run-b", "run-c"):
            (tmp_path / folder).mkdir()
            np.savez(tmp_path / folder / "model.npz", **self._model())
        (tmp_path / "run-a" / "trainer_state.json").write_text(json.dumps(
            {"global_step": 700, "epoch": 1.5, "num_input_tokens_seen": 123}))
        np.savez(tmp_path / "iter_0000300.npz", **self._model())
        with Session() as s:
            s.models.add(tmp_path / "checkpoint-2000" / "model.npz", "a")
            s.models.add(tmp_path / "iter_0000300.npz", "b")
            s.models.add(tmp_path / "run-a" / "model.npz", "c")
            s.models.add(tmp_path / "run-b" / "model.npz", "d", step=50, label="warm-up")
            s.models.add(tmp_path / "run-c" / "model.npz", "e")  # no step anywhere
            steps = s.models.steps()
            assert steps["a"] == {"step": 2000} and steps["b"] == {"step": 300}
            assert steps["c"] == {"step": 700, "epoch": 1.5, "tokens": 123}
            assert steps["d"] == {"step": 50, "label": "warm-up"} and steps["e"] == {}
            assert s.models.ordered() == ["d", "b", "c", "a", "e"]

    def test_a_step_three_folders_up_is_found_and_four_up_is_not(self, tmp_path):
        """The file's stem, then up to three folders above it: run/step-1000/hf/model/
        weights.npz has step 1000 (the third folder up); one folder deeper, none (the
        model id says nothing either)."""
        for folder in ("run/step-1000/hf/model", "run/step-2000/a/hf/model"):
            (tmp_path / folder).mkdir(parents=True)
            np.savez(tmp_path / folder / "weights.npz", **self._model())
        with Session() as s:
            s.models.add(tmp_path / "run/step-1000/hf/model/weights.npz", "near")
            s.models.add(tmp_path / "run/step-2000/a/hf/model/weights.npz", "far")
            assert s.models.steps() == {"near": {"step": 1000}, "far": {}}

    def test_trainer_state_wins_over_a_name_that_says_another_step(self, tmp_path):
        """checkpoint-500/ whose trainer_state.json says global_step 1000 (a folder copied
        or renamed): the trainer's own record wins, in Python and in `diffract track`;
        --step-from (step_from=) takes the name's instead (issue 36, steps)."""
        folder = tmp_path / "run" / "checkpoint-500"
        folder.mkdir(parents=True)
        np.savez(folder / "model.npz", **self._model())
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1000}))
        with Session() as s:
            s.models.add(folder / "model.npz", "state")
            s.models.add(folder / "model.npz", "name", step_from=r"checkpoint-(\d+)")
            assert s.models.steps() == {"state": {"step": 1000}, "name": {"step": 500}}
        run = subprocess.run([sys.executable, "-m", "diffract.cli", "track", str(folder),
                              "--store", str(tmp_path / "store"), "--metrics", "frob_norm",
                              "--against", "none", "--quiet"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        with Session(profile="local", path=tmp_path / "store") as s:
            assert list(s.models.steps().values()) == [{"step": 1000}]

    def test_step_from_and_its_errors(self, tmp_path):
        np.savez(tmp_path / "run7.npz", **self._model())
        with Session() as s:
            s.models.add(tmp_path / "run7.npz", "r", step_from=r"run(\d+)")
            assert s.models.steps()["r"] == {"step": 7}
            with pytest.raises(InvalidArgumentError,
                               match=r"step_from '.*' finds no step \(a regex group\) in"):
                s.models.add(tmp_path / "run7.npz", "q", step_from=r"x(\d+)")

    def test_pairs_tables_and_the_local_store_follow_the_step(self, tmp_path):
        """Consecutive pairs by step (step-2000 before step-10000), the step exported as a
        column, kept by the local store across a reopen."""
        with Session(profile="local", path=tmp_path / "store") as s:
            for name in ("step-10000", "step-2000", "step-300"):
                s.models.add(self._model(), name)
            s.compute.kernel(name="t_diff", apply_level=KernelApplyLevel.CROSS_MODEL)(_diff)
            reports = s.compute.apply_pairs("t_diff", pairs="consecutive")
            assert list(reports) == [("step-300", "step-2000"), ("step-2000", "step-10000")]
            s.compute.apply("frob_norm")
            rows = s.results.export_metrics("frob_norm", export_format="list")
            assert {r["model_id"]: r["step"] for r in rows} == {
                "step-10000": 10000, "step-2000": 2000, "step-300": 300}
        with Session(profile="local", path=tmp_path / "store") as s:
            assert s.models.ordered() == ["step-300", "step-2000", "step-10000"]


def _diff(weights: tuple) -> float:
    """``||W_b - W_a||_F``."""
    return float(np.linalg.norm(weights[1] - weights[0]))
