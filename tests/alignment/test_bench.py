"""benchmarks/bench_alignment.py --precision runs (it failed for a while after l_overlap
took the singular values, with nothing to notice) and shows what it claims: float32
vectors move the subspace overlap less than float16 ones, and both less than the
bfloat16 rounding of the weights does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffract_kernels_alignment")
pytest.importorskip("torch")

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "bench_alignment.py"


def test_the_precision_benchmark_runs_and_orders_its_rows():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--precision", "--layers", "1",
         "--shapes", "120x300,300x120"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        for label in ("vectors in float32", "vectors in float16", "the weights unrounded"):
            if line.strip().startswith(label):
                rows[label] = [float(x) for x in line.split()[-2:]]
    assert len(rows) == 3, done.stdout
    f32, f16, weights = (rows[k][0] for k in ("vectors in float32", "vectors in float16",
                                               "the weights unrounded"))
    assert 0 < f32 < f16 < weights, done.stdout
    assert "more than float16 vectors do" in done.stdout
