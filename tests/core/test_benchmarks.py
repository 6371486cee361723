"""The benchmark scripts still run, at their smallest sizes: they are how the docs'
speed and precision figures are made, and one of them (bench_alignment --precision)
failed for a while with nothing to notice. Each run must end with the line its docs
quote (a ratio or the comparison), not only exit 0. Timings are not looked at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffract_kernels_spectral")
pytest.importorskip("torch")

BENCH = Path(__file__).parents[2] / "benchmarks"

RUNS = {  # script and arguments: a piece of output that shows it did its comparison
    "alignment": (["bench_alignment.py", "--layers", "1", "--top-k", "8"],
                  "top-k SVD's values equal the full SVD's within"),
    "esd-precision": (["bench_esd_precision.py", "--shapes", "64x128", "--no-svd64"],
                      "gram float64 (default)"),
    "dcp-chunks": (["bench_dcp_chunks.py", "--sizes", "1000", "--pairwise-max", "100"],
                   "models.add s"),
    "executors": (["bench_executors.py", "--matrices", "4", "--rows", "64", "--cols", "128",
                   "--repeats", "1", "--modes", "sequential,processes"], "same alphas"),
    "store": (["bench_store.py", "--arrays", "3", "--array-mib", "1"],
              "local / raw np.save+np.load for arrays"),
    "pvalue": (["bench_pvalue.py", "--replicates", "10", "--repeats", "1"],
               "alpha interval (xmin searched)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_benchmark_runs(name, tmp_path):
    argv, shows = RUNS[name]
    done = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert shows in done.stdout, done.stdout[-2000:]


def test_the_precision_benchmark_orders_its_rows():
    """bench_alignment --precision (it failed for a while after l_overlap took the
    singular values): float32 vectors move the subspace overlap less than float16 ones,
    and both less than the bfloat16 rounding of the weights does."""
    pytest.importorskip("diffract_kernels_alignment")
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_alignment.py"), "--precision", "--layers", "1",
         "--shapes", "120x300,300x120"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    labels = ("vectors in float32", "vectors in float16", "the weights unrounded")
    rows = {label: float(line.split()[-2]) for line in done.stdout.splitlines()
            for label in labels if line.strip().startswith(label)}
    assert len(rows) == 3, done.stdout
    assert 0 < rows[labels[0]] < rows[labels[1]] < rows[labels[2]], done.stdout
    assert "more than float16 vectors do" in done.stdout
