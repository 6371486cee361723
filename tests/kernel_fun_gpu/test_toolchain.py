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
    ("3.7.1", "12.8", "causal_conv1d", "pull/1262"),  # stock 3.7.1: its ptxas 12.8.93
    ("3.7.1", "12.8.93", "chunk_kda", "pull/1262"),
    ("3.7.1", "13.0", "chunk_kda", "pull/1262"),
    ("3.7.1", "13.1", "causal_conv1d", None),
    # triton #10787: PTX 8.5-8.9 (ptxas 12.5-12.9) with plain shared stores: all but 3.8.x
    ("3.7.1", "12.9", "chunk_kda", "pull/10787"),
    ("3.9.0", "12.9", "causal_conv1d", "pull/10787"),  # TRITON_PTXAS_BLACKWELL_PATH -> 12.9
    ("3.9.0", "12.5", "chunk_kda", "pull/10787"),
    ("3.9.0", "12.4", "chunk_kda", None),  # PTX 8.4
    ("3.9.0", "13.4", "chunk_kda", None),  # stock 3.9.0: PTX 9.4
    ("3.8.0", "12.9", "chunk_kda", None),  # stock 3.8.0 emits st.shared::cta
    ("3.8.0", "12.8", "causal_conv1d", "pull/1262"),
    ("3.9.0", None, "chunk_kda", "could not be read"),  # fail closed, not open
    ("3.8.0", "release ?", "causal_conv1d", "could not be read"),
])
def test_the_table_refuses_the_listed_combinations_on_hopper(triton, ptxas, op, refused):
    reason = refusal(op, Toolchain(triton=triton, ptxas=ptxas if ptxas != "release ?" else None,
                                   **H100))
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason and "uses fla" in reason


def test_other_architectures_are_not_refused_whole():
    for arch in ((8, 0), (10, 0), (12, 0)):
        tc = Toolchain(triton="3.5.0", ptxas="12.8", arch=arch)
        assert refusal("chunk_kda", tc) is None
    assert refusal("chunk_kda", Toolchain(triton="3.5.0")) is None  # the CPU interpreter


def test_ptx_follows_the_ptxas_as_triton_picks_it():
    assert [Toolchain(ptxas=v).ptx for v in ("12.4", "12.5", "12.8", "12.9", "13.0", "13.4")] \
        == ["8.4", "8.5", "8.7", "8.8", "9.0", "9.4"]
    assert Toolchain(ptxas=None).ptx is None and Toolchain(ptxas="11.8").ptx is None
    assert "PTX 8.8" in Toolchain(ptxas="12.9", **H100).describe()


def _fake_ptxas(tmp_path, name, release):
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    tool.chmod(0o755)
    return str(tool)


def test_the_ptxas_read_is_the_one_triton_compiles_with(tmp_path, monkeypatch):
    """Triton 3.9 compiles sm_90 with ptxas-blackwell and honours only
    TRITON_PTXAS_BLACKWELL_PATH there; 3.8 uses ptxas below sm_100 (TRITON_PTXAS_PATH).
    The table reads the one that compiles, overrides included."""
    import triton
    from triton.backends.nvidia import compiler

    bundled = _toolchain._ptxas((9, 0))
    assert bundled is not None
    old = _fake_ptxas(tmp_path, "ptxas-old", "12.9")
    monkeypatch.setenv("TRITON_PTXAS_PATH", old)
    monkeypatch.delenv("TRITON_PTXAS_BLACKWELL_PATH", raising=False)
    three_nine = version(triton.__version__) >= (3, 9)
    assert _toolchain._ptxas((9, 0)) == (bundled if three_nine else "12.9")
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", old)
    assert _toolchain._ptxas((10, 0)) == "12.9"
    assert _toolchain._ptxas((9, 0)) == "12.9"
    if three_nine:  # 3.9 + a 12.9 ptxas on H100: PTX 8.8 with plain stores, refused
        bad = Toolchain(triton=triton.__version__, ptxas=_toolchain._ptxas((9, 0)), **H100)
        assert "pull/10787" in refusal("chunk_kda", bad)
    assert hasattr(compiler, "get_ptxas")


B200 = {"device": "NVIDIA B200", "arch": (10, 0), "ptxas": "13.1", "cuda": "12.8",
        "fla": "0.6.0"}


def _kda_launches(toolchain, K=128, V=128):
    from kernel_fun.ops.kda import _triton as kt

    return {name: kt.launch_settings(getattr(kt, name), K, V, toolchain) for name in kt.LAUNCH}


def _production_conv_configs(monkeypatch):
    """The conv autotuners' configurations on a GPU (the interpreter has one of 1 warp)."""
    from kernel_fun.ops.cconv import _triton as ct

    monkeypatch.setattr(ct, "_INTERPRET", False)
    monkeypatch.setattr(ct, "FWD_CONFIGS", ct._configs(ct.FWD_MAX_TILE, ct.FWD_PER_THREAD))
    monkeypatch.setattr(ct, "BWD_CONFIGS", ct._configs(ct.BWD_MAX_TILE, ct.BWD_PER_THREAD))
    return ct


def test_blackwell_before_triton_3_8_runs_no_8_warp_kernel(monkeypatch):
    """triton #10590 / fla #1229: stock Triton 3.7.1 on a B200 would run 7 of KDA's 10
    kernels and half the conv configurations with 8 warps. The gate keeps both ops and
    steers them to 4 warps; from Triton 3.8 the 8-warp launches stand."""
    ct = _production_conv_configs(monkeypatch)
    old = Toolchain(triton="3.7.1", **B200)
    plain = _kda_launches(None)
    assert sum(c["num_warps"] == 8 for c in plain.values()) == 7
    steered = _kda_launches(old)
    assert all(c["num_warps"] != 8 for c in steered.values())
    assert _kda_launches(Toolchain(triton="3.8.0", **B200)) == plain
    for configs, name in ((ct.FWD_CONFIGS, "_fwd_kernel"), (ct.BWD_CONFIGS, "_bwd_kernel")):
        kept = _toolchain.allowed("causal_conv1d", name, configs, old)
        assert kept and all(c.num_warps != 8 for c in kept)
        assert len(kept) < len(configs)
        with monkeypatch.context() as m:  # the autotuner's prune asks the call's device
            m.setattr(_toolchain, "current", lambda device: old)
            assert ct._known_good(name)(configs, {"x": torch.empty(1)}) == kept
    assert refusal("chunk_kda", old) is None and refusal("causal_conv1d", old) is None


def test_hopper_bk32_with_4_warps_is_steered_under_triton_3_6_to_3_8():
    """triton #11366 names _intra_fwd's tiling (BK=32, 4 warps) on sm_90 under 3.6-3.8."""
    hopper = {**H100, "ptxas": "13.1"}
    for triton_version, moved in (("3.7.1", True), ("3.8.0", True), ("3.9.0", False),
                                  ("3.5.1", False)):
        got = _kda_launches(Toolchain(triton=triton_version, **hopper))["_intra_fwd_kernel"]
        assert (got["num_warps"], got["BK"]) == ((8, 32) if moved else (4, 32)), triton_version


def test_the_delta_rule_backward_avoids_4_warps_on_hopper():
    """fla #984 / #988: a LAUNCH change to 4 warps for a delta-rule backward kernel is
    steered back on sm_90 (whatever the versions); the gate backward is not concerned."""
    from kernel_fun.ops.kda import _triton as kt

    tc = Toolchain(triton="3.9.0", **{**H100, "ptxas": "13.4"})
    settings = {"BV": 32, "num_warps": 4}
    got, entry = _toolchain.steer("chunk_kda", "_dv_bwd_kernel", settings, tc)
    assert got["num_warps"] == 8 and "pull/988" in entry["source"]
    assert _toolchain.steer("chunk_kda", "_gate_bwd_kernel", {"BK": 64, "num_warps": 4},
                            tc)[1] is None
    assert kt.launch_settings(kt._dv_bwd_kernel, 128, 128, tc)["num_warps"] == 8


def test_the_fused_wy_backward_at_bk32_changes_tile_on_b200():
    """fla #807 (Hopper, 4 warps) and #1109 (B200, 4 or 8 warps) for the fused WY/dqkg
    backward at BK=32 (ours: _dk_bwd_kernel, which runs BK=32 at K=32)."""
    b200 = Toolchain(triton="3.9.0", **B200)
    got = _kda_launches(b200, K=32)["_dk_bwd_kernel"]
    assert (got["BK"], got["num_warps"]) not in ((32, 4), (32, 8))
    assert got["BK"] == 16  # no 32-wide tile with 4 or 8 warps: a 16-wide one
    hopper = Toolchain(triton="3.9.0", **{**H100, "ptxas": "13.4"})
    got, entry = _toolchain.steer("chunk_kda", "_dk_bwd_kernel", {"BK": 32, "num_warps": 4},
                                  hopper)
    assert got == {"BK": 32, "num_warps": 8} and entry is not None
    hits = [e["source"] for e in _toolchain.KNOWN_BAD if "launch" in e
            and _toolchain._holds(e, "chunk_kda", hopper)
            and _toolchain._matches(e["launch"], "_dk_bwd_kernel", {"BK": 32, "num_warps": 4})]
    assert any(h.endswith("issues/807") for h in hits), hits


def test_no_launch_left_refuses_the_op(monkeypatch):
    """When the table rules out every launch of a kernel, the gate sends the op to fla."""
    from kernel_fun.ops.kda import _triton as kt

    everything = {"ops": ("chunk_kda", "causal_conv1d"), "arch": ((10, 0),), "when": {},
                  "launch": {"num_warps": (2, 4, 8)}, "why": "all warps", "source": "test"}
    monkeypatch.setattr(_toolchain, "KNOWN_BAD", (*_toolchain.KNOWN_BAD, everything))
    tc = Toolchain(triton="3.9.0", **B200)
    with pytest.raises(LookupError, match="all warps"):
        kt.launch_settings(kt._intra_fwd_kernel, 64, 64, tc)
    assert "all warps" in kt.launch_problem(64, 64, tc)
    ct = _production_conv_configs(monkeypatch)
    assert "rules out every configuration" in ct.launch_problem(tc)


def test_integer_abs_concerns_no_kernel_of_ours():
    """triton #11032 miscompiles an integer abs on sm_100: no kernel of ours takes one, so
    the table has no entry (docs/kernel_fun.md says so); this test keeps it true."""
    import inspect
    import re

    from kernel_fun.ops.cconv import _triton as ct
    from kernel_fun.ops.kda import _triton as kt

    for module in (ct, kt):
        assert not re.search(r"\babs\(|\.abs\b", inspect.getsource(module))


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


def test_the_ops_launch_what_the_table_steers_to(monkeypatch, caplog):
    """Plumbing: a call runs its kernels with the steered settings of its device's
    toolchain (faked B200 with Triton 3.7.1; the interpreter ignores warps, so the log
    and the launch arguments say it)."""
    import logging

    from kernel_fun.kda import chunk_kda
    from kernel_fun.ops.kda import _triton as kt

    monkeypatch.setattr(_toolchain, "current", lambda device: Toolchain(triton="3.7.1", **B200))
    seen = {}
    real = kt.launch_settings

    def spy(kernel, K, V, toolchain=None):  # what _launch asks for, and gets
        seen[kernel.fn.__name__] = got = real(kernel, K, V, toolchain)
        assert toolchain is not None and toolchain.arch == (10, 0)
        return got

    monkeypatch.setattr(kt, "launch_settings", spy)
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 16, 1, 16, generator=g) for _ in range(2))
    v = torch.randn(1, 16, 1, 16, generator=g)
    gate = -torch.rand(1, 16, 1, 16, generator=g)
    beta = torch.rand(1, 16, 1, generator=g)
    with caplog.at_level(logging.INFO, logger="kernel_fun"):
        o, _ = chunk_kda(q, k, v, gate, beta)
    assert o.shape == (1, 16, 1, 16) and "_scan_fwd_kernel" in seen
    assert all(c["num_warps"] != 8 for c in seen.values())
    assert any("runs with" in r.getMessage() and "issues/10590" in r.getMessage()
               for r in caplog.records)


def test_the_docs_table_names_every_entry():
    """docs/kernel_fun.md's known-bad table names the thread of every KNOWN_BAD entry."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "kernel_fun.md").read_text()
    for entry in _toolchain.KNOWN_BAD:
        number = re.search(r"/(\d+)$", entry["source"]).group(1)
        assert f"#{number}" in text, entry["source"]


def test_current_reads_the_ptxas_not_torchs_cuda(tmp_path, monkeypatch):
    """On a (faked) H100 whose torch was built with CUDA 12.8, the toolchain's ptxas is the
    one Triton compiles sm_90 with (here a fake 12.6 through both overrides), not 12.8."""
    fake = _fake_ptxas(tmp_path, "ptxas-fake", "12.6")
    monkeypatch.setenv("TRITON_PTXAS_PATH", fake)
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    tc = _toolchain.current(torch.device("cuda", 0))
    assert (tc.arch, tc.cuda, tc.ptxas, tc.ptx) == ((9, 0), "12.8", "12.6", "8.5")
    reason = refusal("causal_conv1d", tc)  # PTX 8.5: plain shared stores but in 3.8.x
    assert reason is None if tc.triton.startswith("3.8.") else "pull/10787" in reason
