"""Weights at the edges of their type's range: the spectrum of float16, bfloat16 and
float32 matrices near each type's largest value and among its subnormals equals a float64
SVD of the same values (a power-of-two rescale in the stored type overflowed to inf and
gave a spectral norm of 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffract import Session
from diffract_kernels_spectral import linalg

#: (torch dtype, largest magnitude used, a magnitude inside the subnormal range)
EDGES = {
    "float16": (torch.float16, 0.95 * 65504.0, 3e-5),
    "bfloat16": (torch.bfloat16, 1.9 * 2.0**127, 5e-39),
    "float32": (torch.float32, 1.9 * 2.0**127, 5e-39),
}


def _edge_matrix(dtype_name: str, where: str, shape=(48, 32)) -> torch.Tensor:
    dtype, top, subnormal = EDGES[dtype_name]
    rng = np.random.default_rng(7)
    values = rng.uniform(-1.0, 1.0, shape) * (top if where == "top" else subnormal)
    tensor = torch.from_numpy(values).to(dtype)
    assert torch.isfinite(tensor).all()
    if where == "bottom":  # every entry is subnormal or zero in its type
        assert (tensor.abs() < torch.finfo(dtype).tiny).all()
    return tensor


def _reference(tensor: torch.Tensor) -> np.ndarray:
    """Squared singular values, descending, of the tensor's exact values in float64."""
    return np.linalg.svd(tensor.to(torch.float64).numpy(), compute_uv=False) ** 2


CASES = [(d, w) for d in EDGES for w in ("top", "bottom")]
IDS = [f"{d}-{w}" for d, w in CASES]


class TestTheEdgesOfEachType:
    @pytest.mark.parametrize(("dtype_name", "where"), CASES, ids=IDS)
    def test_session_fields_equal_a_float64_svd(self, dtype_name, where):
        """spectral_norm, stable_rank and log_norm of an edge matrix: within 1e-10 of float64's."""
        tensor = _edge_matrix(dtype_name, where)
        lam = _reference(tensor)
        with Session() as session:
            session.models.add({"w": tensor}, model_id="m")
            report = session.compute.apply("spectral_norm", "stable_rank", "log_norm")
            row = session.results.export_metrics(export_format="dict")["m"]["w"]
        assert report.ok
        assert row["spectral_norm"] == pytest.approx(lam[0], rel=1e-10)
        assert row["stable_rank"] == pytest.approx(lam.sum() / lam[0], rel=1e-10)
        assert row["log_norm"] == pytest.approx(math.log10(lam.sum()), rel=1e-12)

    @pytest.mark.parametrize("precision", ["float64", "float32"])
    @pytest.mark.parametrize(("dtype_name", "where"), CASES, ids=IDS)
    def test_the_numpy_and_torch_spectra_equal_a_float64_svd(self, dtype_name, where, precision):
        """linalg.esd and the batched torch route: the largest eigenvalue within the precision's rounding."""
        tensor = _edge_matrix(dtype_name, where)
        lam_max = _reference(tensor)[0]
        rel = 1e-12 if precision == "float64" else 1e-5
        numpy_input = tensor.to(torch.float32).numpy() if dtype_name == "bfloat16" \
            else tensor.numpy()
        values = linalg.esd(numpy_input, precision=precision)
        assert values[-1] == pytest.approx(lam_max, rel=rel)
        (batched,) = linalg.esd_batched_torch([tensor], precision=precision, device="cpu")
        assert batched[-1] == pytest.approx(lam_max, rel=rel)


def test_starting_taichi_keeps_subnormal_numbers(tmp_path):
    """ti.init turned on flush-to-zero in its thread: every subnormal of the program became
    0 (numpy's 1e-310 * 2 too), and the subnormal spectra above came out undefined once a
    fit had started Taichi. A fresh process: subnormals survive the fitter's start."""
    import subprocess
    import sys

    pytest.importorskip("taichi")
    script = ("import numpy as np\n"
              "from diffract_kernels_spectral import _taichi\n"
              "_taichi.kernels()\n"
              "print(float((np.array([1e-310]) * 2)[0]),"
              " float((np.array([1e-40], np.float32) * np.float32(2))[0]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    f64, f32 = map(float, done.stdout.split()[-2:])
    assert f64 == 2e-310 and f32 == pytest.approx(2e-40, rel=1e-5)
