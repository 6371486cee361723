"""The gate's table of toolchains known to compile Triton kernels wrong, decided on the CPU
with faked versions: each listed combination refused with its source, its neighbours
accepted; and the ops' gates consult it for the device a call runs on."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_fun import _toolchain  # noqa: E402
from kernel_fun._toolchain import Toolchain, refusal, version  # noqa: E402

H100 = {"device": "NVIDIA H100", "arch": (9, 0), "cuda": "12.8", "fla": "0.6.0"}


@pytest.mark.parametrize(("triton", "ptxas", "op", "refused"), [
    ("3.4.0", "13.1", "chunk_kda", "issues/640"),
    ("3.6.2", "13.1", "chunk_kda", "issues/640"),
    ("3.7.0+git3f2a", "13.1", "chunk_kda", "issues/640"),
    ("3.7.1", "13.1", "chunk_kda", None),
    ("3.3.1", "13.1", "chunk_kda", None),
    ("3.5.0", "13.1", "causal_conv1d", None),  # the BK=64 miscompile is KDA's tiles
    ("3.7.1", "12.8", "causal_conv1d", "pull/1262"),
    ("3.7.1", "12.8.93", "chunk_kda", "pull/1262"),
    ("3.7.1", "12.9", "chunk_kda", None),
    ("3.7.1", "13.0", "chunk_kda", "pull/1262"),
    ("3.7.1", "13.1", "causal_conv1d", None),
    ("3.7.1", None, "chunk_kda", None),  # not known: left to the self-check
])
def test_the_table_refuses_the_listed_combinations_on_hopper(triton, ptxas, op, refused):
    reason = refusal(op, Toolchain(triton=triton, ptxas=ptxas, **H100))
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason and "uses fla" in reason


def test_other_architectures_are_not_refused():
    for arch in ((8, 0), (10, 0), None):
        tc = Toolchain(triton="3.5.0", ptxas="12.8", arch=arch)
        assert refusal("chunk_kda", tc) is None


def test_versions_are_read_by_their_leading_numbers():
    assert version("3.7.1+gitabc") == (3, 7, 1)
    assert version("v13.0") == (13, 0)
    assert version("release") is None and version(None) is None


def test_the_gates_consult_the_table_for_the_call_device(monkeypatch):
    from kernel_fun.ops.cconv.op import is_supported

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KERNEL_FUN_INTERPRET", "1")
    x = torch.randn(1, 8, 4)
    w = torch.randn(4, 4)
    assert is_supported(x, w, activation="silu") == (True, "")
    bad = Toolchain(triton="3.7.1", ptxas="12.8", **H100)
    monkeypatch.setattr(_toolchain, "current", lambda device: bad)
    ok, reason = is_supported(x, w, activation="silu")
    assert not ok and "pull/1262" in reason and "NVIDIA H100" in reason
