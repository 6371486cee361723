"""The training example runs and reports each layer against the first checkpoint."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffract_kernels_alignment")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alignment_training.py"


def test_the_training_example_prints_agreement_per_checkpoint(capsys):
    """A short run prints one row per later checkpoint with a value per layer, and the
    first layer drifts away from its initial directions."""
    spec = importlib.util.spec_from_file_location("alignment_training", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--steps", "60", "--every", "20"])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["step00020", "step00040", "step00060"]
    agreement = [float(r[1]) for r in rows]  # layer 0: avg_l_agreement
    subspace = [float(r[3]) for r in rows]  # layer 0: l_subspace_overlap
    assert all(0.0 < v < 1.0 for v in agreement + subspace)
    assert agreement == sorted(agreement, reverse=True)  # decays with training
    assert subspace == sorted(subspace, reverse=True)
