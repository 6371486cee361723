"""Stale aggregates when a session holds several models (issue 26 item 4): which
whole-model and cross-model values ``results.stale()`` names after a configuration
change, and that ``apply(recompute="stale")`` recomputes exactly those, to the values a
fresh session computes under the new configuration."""

from __future__ import annotations

import numpy as np
import pytest

from diffract import Session

pytest.importorskip("diffract_kernels_spectral")
pytest.importorskip("diffract_kernels_alignment")



def _models(rng) -> dict[str, dict[str, np.ndarray]]:
    base = {f"w{i}": rng.standard_t(3, (90, 70)) for i in range(2)}
    return {name: {k: v + scale * rng.standard_normal(v.shape) for k, v in base.items()}
            for name, scale in (("a", 0.0), ("b", 0.3), ("c", 0.6))}


def _apply_pairs_and_models(s) -> None:
    s.compute.apply("model_pl_alpha_norm")
    for pair in (["a", "b"], ["a", "c"]):
        s.filter(pair).compute.apply("l_subspace_overlap")


@pytest.fixture
def session(rng):
    models = _models(rng)
    with Session() as s:
        for name, weights in models.items():
            s.models.add(weights, model_id=name)
        _apply_pairs_and_models(s)
        yield s, models
        s.registry.reset_configuration()


def _fresh(models, **config) -> dict:
    """The aggregates of a new session under ``config`` (the registry is process-wide:
    its configuration is reset afterwards)."""
    with Session() as s:
        for name, weights in models.items():
            s.models.add(weights, model_id=name)
        for kernel, values in config.items():
            s.compute.configure_kernel(kernel, **values)
        try:
            _apply_pairs_and_models(s)
            return s.results.export_aggregates()
        finally:
            s.registry.reset_configuration()


def test_whole_model_aggregates_of_every_model_go_stale_and_are_recomputed(session):
    s, models = session
    before = s.results.export_aggregates()
    assert s.results.stale() == []
    s.compute.configure_kernel("esd_scale", normalize="greater_dim")
    stale = s.results.stale("model_pl_alpha_norm")
    whole = sorted(r["unit"] for r in stale if r["kernel"] == "model_pl_alpha_norm")
    assert whole == ["a", "b", "c"]  # every model's aggregate, none forgotten
    assert len([r for r in stale if r["kernel"] == "esd"]) == 6
    report = s.compute.apply("model_pl_alpha_norm", recompute="stale")
    assert report.ok
    after = s.results.export_aggregates()
    assert s.results.stale("model_pl_alpha_norm") == []
    want = _fresh(models, esd_scale={"normalize": "greater_dim"})  # resets the registry
    names = [n for n in want if n.startswith("model_pl_alpha_norm")]
    assert len(names) == 3
    for name in names:
        assert after[name] == want[name], name
    assert all(after[n] != before[n] for n in names)  # lambda / N changes sum lambda^alpha


def test_cross_model_aggregates_go_stale_per_pair_and_only_in_scope(session):
    s, models = session
    s.compute.configure_kernel("l_subspace", k=5)
    units = sorted(r["unit"] for r in s.results.stale("l_subspace_overlap")
                   if r["kernel"] == "l_subspace")
    assert units == ["[a,b]/w0", "[a,b]/w1", "[a,c]/w0", "[a,c]/w1"]
    in_scope = sorted(r["unit"] for r in s.filter(["a", "b"]).results.stale("l_subspace_overlap"))
    assert in_scope == ["[a,b]/w0", "[a,b]/w1"]  # the pair with c is out of this scope
    s.filter(["a", "b"]).compute.apply("l_subspace_overlap", recompute="stale")
    left = sorted(r["unit"] for r in s.results.stale("l_subspace_overlap"))
    assert left == ["[a,c]/w0", "[a,c]/w1"]  # recomputed exactly the pair in scope
    s.filter(["a", "c"]).compute.apply("l_subspace_overlap", recompute="stale")
    assert s.results.stale() == []
    got = s.results.export_aggregates()
    want = _fresh(models, l_subspace={"k": 5})
    overlap = [n for n in want if n.startswith("l_subspace_overlap")]
    assert len(overlap) == 4
    assert {n: got[n] for n in overlap} == {n: want[n] for n in overlap}


def test_an_option_a_kernel_gained_since_keeps_its_results_current_at_its_default(
        tmp_path, rng):
    """A pack's upgrade that adds an option (at a default that computes what it did
    before) leaves the results it stored current; set to another value, they are stale."""
    from diffract.plugins import reset_registry

    weights = {"w": rng.standard_normal((20, 10))}
    path = str(tmp_path / "store")
    with Session(profile="local", path=path) as s:
        s.models.add(weights, model_id="m")

        @s.compute.kernel("scaled")
        def scaled(tensor, *, factor: float = 2.0) -> float:
            return factor * float(np.abs(np.asarray(tensor)).sum())

        s.compute.apply("scaled")
    reset_registry()
    with Session(profile="local", path=path) as s:

        @s.compute.kernel("scaled")
        def scaled_v2(tensor, *, factor: float = 2.0, power: float = 1.0) -> float:
            return factor * float((np.abs(np.asarray(tensor)) ** power).sum())

        assert s.results.stale() == []
        s.compute.configure_kernel("scaled", power=2.0)
        assert [u["kernel"] for u in s.results.stale()] == ["scaled"]
        s.compute.configure_kernel("scaled", power=1.0, factor=3.0)
        assert [u["kernel"] for u in s.results.stale()] == ["scaled"]
