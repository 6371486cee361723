"""Adopting kernel-fun inside fla (register or patch) and offering it through diffract.ops."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import kernel_fun
from kernel_fun import _support, adopt
from kernel_fun.cconv import causal_conv1d as ours
from tests.kernel_fun_gpu.conftest import err_ratio


def _bindings():
    import fla.modules.causal_conv1d as pkg
    import fla.modules.causal_conv1d.ops as ops
    import fla.modules.convolution as alias

    return {"ops": ops.causal_conv1d, "pkg": pkg.causal_conv1d, "alias": alias.causal_conv1d}


def _x(device, requires_grad=True):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 13, 16, generator=g).to(device).requires_grad_(requires_grad)
    w = torch.randn(16, 4, generator=g).to(device).requires_grad_(requires_grad)
    return x, w


class TestPatch:
    def test_every_binding_is_swapped_and_restored_exactly(self, device):
        """Patch mode swaps the defining module, the package, the alias and bound layers;
        restore puts back the very same objects (checked with `is`)."""
        before = _bindings()
        fla_fn = before["ops"]
        layer = types.ModuleType("fla.layers.fake_kda_layer")
        layer.causal_conv1d = fla_fn  # a layer that bound the function at import time
        sys.modules[layer.__name__] = layer
        try:
            with kernel_fun.install(mode="patch") as handle:
                assert handle.mode == "patch"
                now = _bindings()
                assert all(fn is ours for fn in now.values())
                assert layer.causal_conv1d is ours
                assert adopt.original("causal_conv1d") is fla_fn
            after = _bindings()
            assert all(after[k] is before[k] for k in before)
            assert layer.causal_conv1d is fla_fn
            handle.restore()  # idempotent
            assert _bindings()["alias"] is fla_fn
        finally:
            del sys.modules[layer.__name__]

    def test_fla_layer_runs_our_kernels_while_patched(self, device):
        """fla's ShortConvolution calls the patched op: our kernels run, values unchanged."""
        from fla.modules import ShortConvolution

        conv = ShortConvolution(16, 4, activation="silu").to(device)
        x, _ = _x(device)
        expected, _ = conv(x)
        with kernel_fun.install(mode="patch"):
            got, _ = conv(x)
        assert _support.is_warm(("fwd", (2, 13, 16), x.stride(), x.dtype, x.dtype, str(x.device)))
        assert err_ratio(expected, got) < 1e-6


class TestRegister:
    def test_registers_as_an_fla_backend_and_unregisters(self, device):
        """Register mode: fla's own causal_conv1d dispatches its fwd/bwd to kernel-fun
        for supported calls; restore removes the backend."""
        import fla.backends as backends  # noqa: F401

        fla_fn = _bindings()["ops"]
        x, w = _x(device)
        expected, _ = fla_fn(x, w, activation="silu")
        expected.sum().backward()
        gx, gw = x.grad.clone(), w.grad.clone()
        x.grad = w.grad = None
        with kernel_fun.install(mode="register") as handle:
            assert handle.mode == "register" and _bindings()["ops"] is fla_fn
            assert all(adopt.BACKEND_TYPE in r._backends for r in handle.registered)
            y, _ = fla_fn(x, w, activation="silu")
            y.sum().backward()
            key = ((2, 13, 16), x.stride(), x.dtype, w.dtype, str(x.device))
            assert _support.is_warm(("fwd", *key)) and _support.is_warm(("bwd", *key))
            # a call outside the box is rejected by the verifier and stays fla's
            fla_fn(x, w, activation=None)
        assert all(adopt.BACKEND_TYPE not in r._backends for r in handle.registered)
        assert err_ratio(expected, y) < 1e-6
        assert err_ratio(gx, x.grad) < 1e-6 and err_ratio(gw, w.grad) < 1e-6

    def test_auto_prefers_registration_when_fla_offers_it(self):
        """'auto' registers on an fla with backend dispatch (fla-core 0.6 has it)."""
        with kernel_fun.install() as handle:
            assert handle.mode == "register"
        with pytest.raises(ValueError, match="mode must be 'auto', 'register' or 'patch'"):
            kernel_fun.install(mode="monkey")


class TestDiffractOps:
    def test_resolve_picks_ours_when_supported_and_fla_otherwise(self, device):
        """diffract.ops resolves causal_conv1d per call through the diffract_ops hook."""
        from diffract import ops
        from diffract.plugins import get_catalog

        spec = next(op for op in get_catalog().ops if op.name == "causal_conv1d")
        assert spec.provider.startswith("diffractml-kernel-fun-gpu")
        x, w = _x(device, requires_grad=False)
        assert ops.resolve("causal_conv1d", x, w, activation="silu") is spec.implementation
        assert ops.resolve("causal_conv1d", x, w, activation=None) is spec.reference
        y, _ = ops.call("causal_conv1d", x, w, activation="silu")
        ref, _ = adopt.original("causal_conv1d")(x, w, activation="silu")
        assert err_ratio(ref, y) < 1e-6
        with pytest.raises(ops.UnknownOpError, match=r"No plugin offers an op named 'causal_convld'\. Did you mean 'causal_conv1d'\?"):
            ops.resolve("causal_convld", x, w)


class TestGenericDriver:
    """Adoption and the diffract_ops hook drive every op record alike: a second op, with
    its own fake fla module and package, is patched, restored and offered to Diffract."""

    @pytest.fixture
    def second_op(self, monkeypatch):
        from kernel_fun import ops

        fla_mod = types.ModuleType("fla.fake_second_op")
        ours_mod = types.ModuleType("kernel_fun_fake_second_op")

        def fla_second(x):
            return ("fla", x)

        def our_second(x):
            return ("ours", x)

        fla_mod.second_op = fla_second
        ours_mod.second_op = our_second
        ours_mod.is_supported = lambda x: (x > 0, "" if x > 0 else "x must be positive")
        monkeypatch.setitem(sys.modules, fla_mod.__name__, fla_mod)
        monkeypatch.setitem(sys.modules, ours_mod.__name__, ours_mod)
        extra = ops.OpRecord(name="second_op", package=ours_mod.__name__,
                             defining_module=fla_mod.__name__,
                             patch_table=((fla_mod.__name__, "second_op"),),
                             binding="kernel_fun.ops.cconv.binding")
        monkeypatch.setattr(ops, "RECORDS", (*ops.RECORDS, extra))
        monkeypatch.setattr(adopt, "RECORDS", (*adopt.RECORDS, extra))
        return fla_mod, fla_second, our_second

    def test_patch_swaps_and_restores_every_op(self, second_op):
        fla_mod, fla_second, our_second = second_op
        before = _bindings()
        with kernel_fun.install(mode="patch"):
            assert fla_mod.second_op is our_second
            assert adopt.original("second_op") is fla_second
            assert _bindings()["ops"] is not before["ops"]
        assert fla_mod.second_op is fla_second and _bindings() == before

    def test_the_hook_offers_every_op(self, second_op, monkeypatch):
        from kernel_fun import _diffract

        monkeypatch.setattr(_diffract, "RECORDS", (*_diffract.RECORDS, second_op_record()))
        specs = {s.name: s for s in _diffract.diffract_ops()}
        assert set(specs) == {"causal_conv1d", "chunk_kda", "second_op"}
        spec = specs["second_op"]
        assert spec.implementation(3) == ("ours", 3) and spec.reference(3) == ("fla", 3)
        assert spec.is_supported(-1) == (False, "x must be positive")


def second_op_record():
    from kernel_fun import ops

    return next(r for r in ops.RECORDS if r.name == "second_op")
