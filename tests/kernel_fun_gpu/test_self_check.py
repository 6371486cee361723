"""The self-check on first use, in Triton's interpreter: a deliberately wrong kernel
(injected here, not in the package) is caught and every later call of its kind goes to
fla with one warning; a right one engages; the verdict is keyed by the toolchain, kept on
disk when asked, never computed under CUDA-graph capture; ``warmup()`` raises on a failed
check; ``KERNEL_FUN_SELF_CHECK=0`` skips it."""

from __future__ import annotations

import logging
import os

import pytest

torch = pytest.importorskip("torch")
if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("KERNEL_FUN_INTERPRET") != "1":
    pytest.skip("runs in Triton's interpreter (TRITON_INTERPRET=1 KERNEL_FUN_INTERPRET=1)",
                allow_module_level=True)

from kernel_fun import _check, _support, _toolchain, adopt  # noqa: E402
from kernel_fun.cconv import causal_conv1d, warmup  # noqa: E402
from kernel_fun.ops.cconv import _triton as conv_triton  # noqa: E402
from kernel_fun.ops.kda import _triton as kda_triton  # noqa: E402
from kernel_fun.ops.kda.op import chunk_kda  # noqa: E402
from kernel_fun.ops.kda.reference import reference_chunk_kda  # noqa: E402


@pytest.fixture(autouse=True)
def _checks_on(monkeypatch):
    """The op-level check alone (each autotuner configuration's own check is
    test_config_check.py's)."""
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK", "1")
    monkeypatch.delenv("KERNEL_FUN_SELF_CHECK_CACHE", raising=False)
    monkeypatch.setattr(conv_triton, "config_check", lambda *args: None)


def _conv_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 40, 32, generator=gen).requires_grad_()
    w = torch.randn(32, 4, generator=gen).requires_grad_()
    return x, w


@pytest.fixture
def wrong_conv(monkeypatch):
    """A forward kernel 1% off: the kind of error a miscompile makes."""
    real = conv_triton.forward
    monkeypatch.setattr(conv_triton, "forward", lambda x, w: real(x, w) * 1.01)


@pytest.fixture
def probes(monkeypatch):
    """How many checks ran."""
    ran = []
    real = _check.verdict

    def counting(op, kind, device, probe, **kwargs):
        return real(op, kind, device, lambda: ran.append(op) or probe(), **kwargs)

    monkeypatch.setattr(_check, "verdict", counting)
    return ran


def test_a_wrong_kernel_is_caught_and_its_kind_goes_to_fla(wrong_conv, probes, caplog):
    fla = adopt.original("causal_conv1d")
    with caplog.at_level(logging.WARNING, logger="kernel_fun"):
        for seed in range(3):
            x, w = _conv_inputs(seed)
            y, _ = causal_conv1d(x, w, activation="silu")
            want, _ = fla(x=x, weight=w, activation="silu")
            assert torch.equal(y, want)  # fla's, bit for bit
    assert probes == ["causal_conv1d"]  # checked once for the kind
    failed = [r.getMessage() for r in caplog.records if "self-check failed" in r.getMessage()]
    assert len(failed) == 1
    assert "y differs from the reference by" in failed[0] and "Triton" in failed[0]


def test_a_right_kernel_engages(probes, monkeypatch):
    used = []
    real = conv_triton.forward
    monkeypatch.setattr(conv_triton, "forward", lambda x, w: used.append(1) or real(x, w))
    for seed in range(2):
        x, w = _conv_inputs(seed)
        y, _ = causal_conv1d(x, w, activation="silu")
        y.sum().backward()
    assert probes == ["causal_conv1d"]
    assert len(used) == 1 + 2  # the probe's forward, then both calls on kernel-fun's path
    assert _check.seconds and all(s > 0 for s in _check.seconds)


def test_forward_only_and_with_gradients_are_two_kinds(probes):
    x, w = _conv_inputs()
    with torch.no_grad():
        causal_conv1d(x, w, activation="silu")
    causal_conv1d(x, w, activation="silu")
    assert probes == ["causal_conv1d", "causal_conv1d"]


def test_the_verdict_is_keyed_by_the_toolchain(probes, monkeypatch):
    x, w = _conv_inputs()
    causal_conv1d(x, w, activation="silu")
    causal_conv1d(x, w, activation="silu")
    assert len(probes) == 1
    other = _toolchain.Toolchain(triton="9.9.9")
    monkeypatch.setattr(_toolchain, "current", lambda device: other)
    causal_conv1d(x, w, activation="silu")
    assert len(probes) == 2


def test_warmup_raises_when_the_check_fails(wrong_conv):
    with pytest.raises(RuntimeError, match="self-check against the reference failed"):
        warmup(B=1, T=24, D=16, W=4, dtype=torch.float32, device="cpu")


def test_switched_off_the_check_does_not_run(wrong_conv, probes, monkeypatch):
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK", "0")
    x, w = _conv_inputs()
    y, _ = causal_conv1d(x, w, activation="silu")
    want, _ = adopt.original("causal_conv1d")(x=x, weight=w, activation="silu")
    assert probes == [] and not torch.allclose(y, want)  # the wrong kernel ran: the risk


def test_verdicts_kept_on_disk_are_read_back(wrong_conv, probes, monkeypatch, tmp_path):
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK_CACHE", str(tmp_path / "verdicts.json"))
    x, w = _conv_inputs()
    causal_conv1d(x, w, activation="silu")
    assert len(probes) == 1 and (tmp_path / "verdicts.json").is_file()
    _check.reset_for_tests()  # another process (another rank) on the same toolchain
    y, _ = causal_conv1d(x, w, activation="silu")
    assert len(probes) == 1  # read, not checked again
    assert torch.equal(y, adopt.original("causal_conv1d")(x=x, weight=w, activation="silu")[0])


def test_no_check_runs_under_capture(probes, monkeypatch):
    x, w = _conv_inputs()
    monkeypatch.setattr(_support, "is_capturing", lambda: True)
    reason = _check.verdict("causal_conv1d", ("a kind",), x.device, lambda: None)
    assert reason is not None and "capture" in reason and probes == []


def test_a_wrong_kda_kernel_is_caught(monkeypatch, caplog):
    """chunk_kda's check, with a gate cumulative sum one step short injected."""
    real = kda_triton.gate_cumsum
    monkeypatch.setattr(kda_triton, "gate_cumsum",
                        lambda g, *rest: real(g, *rest) - g.float())
    sent = []

    def fla_stand_in(**kw):  # fla's chunk_kda does not run in the interpreter
        sent.append(1)
        keep = ("q", "k", "v", "g", "beta", "initial_state", "output_final_state")
        return reference_chunk_kda(**{n: kw[n] for n in keep})

    monkeypatch.setattr(adopt, "original", lambda name: fla_stand_in)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 20, 1, 16, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(1, 20, 1, 16, generator=gen), dim=-1)
    v = torch.randn(1, 20, 1, 16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, 20, 1, 16, generator=gen) + 2)
    beta = torch.rand(1, 20, 1, generator=gen)
    with caplog.at_level(logging.WARNING, logger="kernel_fun"):
        for _ in range(2):
            o, _ = chunk_kda(q, k, v, g, beta)
    assert sent == [1, 1]
    failed = [r.getMessage() for r in caplog.records if "self-check failed" in r.getMessage()]
    assert len(failed) == 1 and "o differs from the reference" in failed[0]


def test_a_call_fla_would_give_flashkda_goes_to_fla(monkeypatch):
    """Without gradients fla dispatches a FlashKDA-shaped call to FlashKDA (a fused
    CUTLASS forward, when installed): kernel-fun must not take it from fla."""
    flash_kda = pytest.importorskip("fla.ops.kda.backends.flash_kda")
    from kernel_fun.ops.kda.op import is_supported

    monkeypatch.setattr(flash_kda.FlashKDABackend, "is_available", classmethod(lambda c: True))
    B, T, H, K = 1, 16, 2, 128
    x = {n: torch.randn(B, T, H, K, dtype=torch.bfloat16) for n in ("q", "k", "v", "g")}
    beta = torch.randn(B, T, H, dtype=torch.bfloat16)
    opts = {"use_gate_in_kernel": True, "use_qk_l2norm_in_kernel": True,
            "use_beta_sigmoid_in_kernel": True, "safe_gate": True, "lower_bound": -5.0,
            "state_v_first": True, "A_log": torch.zeros(H), "dt_bias": torch.zeros(H * K)}
    with torch.inference_mode():
        ok, reason = is_supported(x["q"], x["k"], x["v"], x["g"], beta, **opts)
    assert not ok and "FlashKDA" in reason
    assert is_supported(x["q"], x["k"], x["v"], x["g"], beta, **opts) == (True, "")
    monkeypatch.setenv("FLA_FLASH_KDA", "0")  # switched off in fla: ours again
    with torch.inference_mode():
        assert is_supported(x["q"], x["k"], x["v"], x["g"], beta, **opts) == (True, "")


def test_a_link_planted_in_the_cache_folder_is_not_written_through(probes, monkeypatch,
                                                                    tmp_path):
    """Anyone who can write the cache's folder cannot turn the cache into a write of
    another file: the temporary file is created exclusively (O_EXCL, no links followed,
    0600) under an unguessable name, and a cache path that is a link is not used."""
    target = tmp_path / "precious"
    target.write_text("keep")
    cache = tmp_path / "verdicts.json"
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK_CACHE", str(cache))
    # the old name: .<name>.<pid>.part, predictable; a link there must not be followed
    (tmp_path / f".verdicts.json.{os.getpid()}.part").symlink_to(target)
    x, w = _conv_inputs()
    causal_conv1d(x, w, activation="silu")
    assert target.read_text() == "keep" and cache.is_file() and not cache.is_symlink()
    assert oct(cache.stat().st_mode & 0o777) == oct(0o600)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == [
        f".verdicts.json.{os.getpid()}.part"]  # only the planted one
    # the cache itself a link to another file: not used, not written
    cache.unlink()
    cache.symlink_to(target)
    _check.reset_for_tests()
    _support.reset_for_tests()
    causal_conv1d(x, w, activation="silu")
    assert target.read_text() == "keep" and len(probes) == 2


def test_a_cache_path_that_is_no_regular_file_is_no_cache_and_replaced_by_nothing(
        probes, monkeypatch, tmp_path):
    """``KERNEL_FUN_SELF_CHECK_CACHE=/dev/null`` (a natural "no disk cache") replaced the
    device node with a regular file. A FIFO of the test's own stands in for it here (the
    same kind of path, and a broken check replaces only the test's file)."""
    import stat

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    node = tmp_path / "node"
    os.mkfifo(node)
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK_CACHE", str(node))
    x, w = _conv_inputs()
    causal_conv1d(x, w, activation="silu")
    _check.reset_for_tests()  # another process: nothing of this one's
    _support.reset_for_tests()
    causal_conv1d(x, w, activation="silu")
    assert len(probes) == 2  # checked again: nothing was kept
    assert stat.S_ISFIFO(os.lstat(node).st_mode)  # not replaced by a regular file
    assert [p.name for p in tmp_path.iterdir()] == ["node"]


@pytest.mark.parametrize("content", ["[" * 100_000, "not json", "[1, 2]", '{"k": 3}'])
def test_an_unreadable_cache_is_empty_and_the_check_runs(probes, monkeypatch, tmp_path,
                                                         content):
    cache = tmp_path / "verdicts.json"
    cache.write_text(content)
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK_CACHE", str(cache))
    x, w = _conv_inputs()
    y, _ = causal_conv1d(x, w, activation="silu")
    assert len(probes) == 1 and torch.isfinite(y).all()


def test_a_pass_cached_for_another_toolchain_does_not_skip_the_check(wrong_conv, probes,
                                                                     monkeypatch, tmp_path):
    """The key holds the op, the kind and the whole toolchain (device, arch, Triton,
    ptxas, CUDA, fla): a cache claiming every kind passed on another toolchain (another
    device, another ptxas) skips nothing here, and the wrong kernel is caught."""
    import dataclasses
    import json

    x, w = _conv_inputs()
    cache = tmp_path / "verdicts.json"
    monkeypatch.setenv("KERNEL_FUN_SELF_CHECK_CACHE", str(cache))
    causal_conv1d(x, w, activation="silu")  # writes this toolchain's (failed) verdict
    (key,) = json.loads(cache.read_text())
    op, kind, chain = json.loads(key)
    forged = {}
    for field in ("device", "arch", "triton", "ptxas", "cuda", "fla"):
        other = list(chain)
        other[[f.name for f in dataclasses.fields(_toolchain.Toolchain)].index(field)] = "x"
        forged[json.dumps([op, kind, other])] = None  # "passed" on that toolchain
    cache.write_text(json.dumps(forged))
    _check.reset_for_tests()
    y, _ = causal_conv1d(x, w, activation="silu")
    assert len(probes) == 2  # checked again here
    assert torch.equal(y, adopt.original("causal_conv1d")(x=x, weight=w, activation="silu")[0])
