"""A value on the powerlaw library's bound is never shown as an alpha (issue 32 item 1):
powerlaw 2.0 searches alpha in [0, 3], so a small spectrum whose exact MLE is larger came
out as exactly 3.0 under fit_method="auto" (10 of MiniLM's 288 heads sat on it); it is
undefined with the reason now, in the fit, the session, and the command line's outputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from diffract import Session
from diffract_kernels_spectral import fit_power_law
from diffract_kernels_spectral.errors import FitError
from tests.spectral.conftest import needs_powerlaw, pareto

pytestmark = needs_powerlaw


def _capped(rng, n=40, alpha=6.0):
    """A spectrum of n points whose exact tail exponent is far above the library's 3."""
    return np.sort(pareto(rng, n, alpha))


class TestTheLibraryBound:
    def test_the_library_alone_returns_its_bound(self, rng):
        """The premise: powerlaw 2.0 itself gives 3 within 1e-6 for this spectrum."""
        import warnings

        import powerlaw

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = powerlaw.Fit(_capped(rng), verbose=False)
        assert fit.power_law.alpha == pytest.approx(3.0, abs=1e-6)

    def test_the_fit_is_undefined_with_the_exact_mle_in_its_reason(self, rng):
        x = _capped(rng)
        with pytest.raises(FitError, match=r"the powerlaw library's fit stopped on its bound "
                                           r"alpha = 3 \(it searches \[0, 3\]; the exact MLE at "
                                           r"its xmin [\d.]+ is [\d.]+\)"):
            fit_power_law(x, min_tail=5, fit_method="powerlaw")
        exact = fit_power_law(x, min_tail=5, fit_method="diffract")  # no bound: the MLE
        assert exact.alpha > 4

    def test_an_estimate_inside_the_bound_is_kept(self, rng):
        """A spectrum with alpha 2: the library's value, unchanged, as before."""
        x = np.sort(pareto(rng, 60, 2.0))
        fit = fit_power_law(x, min_tail=5, fit_method="powerlaw")
        assert 1.5 < fit.alpha < 2.9 and fit.method == "powerlaw"

    def test_no_output_shows_the_bound_as_an_alpha(self, rng, tmp_path, capsys):
        """auto on 40 points: pl_alpha NaN with the reason in the session, the CSV and JSON."""
        from diffract.cli import main

        lam = _capped(rng)
        q, _ = np.linalg.qr(rng.standard_normal((40, 40)))
        w = q @ np.diag(np.sqrt(lam))  # a 40 x 40 matrix whose ESD is lam
        with Session() as s:
            s.models.add({"w": w}, model_id="m")
            s.compute.configure_kernel("power_law_fit", min_tail=5)
            s.compute.apply("pl_alpha", errors="record")
            value = s.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"]
            notes = [n["reason"] for n in s.results.export_notes()
                     if n["kernel"] == "power_law_fit"]
        assert math.isnan(value)
        assert any("stopped on its bound alpha = 3" in r for r in notes)
        np.savez(tmp_path / "m.npz", w=w)
        for fmt in ("csv", "json"):
            assert main(["analyze", str(tmp_path / "m.npz"), "--metrics", "pl_alpha",
                         "--set", "power_law_fit.min_tail=5", "--format", fmt]) in (0, 1)
            text = capsys.readouterr().out
            if fmt == "json":
                (row,) = json.loads(text)
                assert row["pl_alpha"] is None or math.isnan(row["pl_alpha"]), row
            else:
                assert text.splitlines()[1].split(",")[-1] in ("", "nan"), text

    def test_the_table_report_schedule_and_trajectory_say_undefined(self, rng, tmp_path,
                                                                    capsys):
        """The same capped spectrum beside a normal matrix: the terminal table prints no
        3 for it and its summary gives the reason; the report's layer table holds no
        number there; a schedule from pl_alpha leaves it out (with a warning), and the
        run's trajectory is NaN at it."""
        import re
        import warnings

        from diffract.cli import main
        from diffract_kernels_spectral import sparsity_schedule

        lam = _capped(rng)
        q, _ = np.linalg.qr(rng.standard_normal((40, 40)))
        state = {"capped.weight": q @ np.diag(np.sqrt(lam)),
                 "normal.weight": rng.standard_t(3, (300, 200))}
        np.savez(tmp_path / "m.npz", **state)
        report = tmp_path / "r.html"
        assert main(["analyze", str(tmp_path / "m.npz"), "--metrics", "pl_alpha,alpha_weighted",
                     "--set", "power_law_fit.min_tail=5", "--report", str(report)]) in (0, 1)
        out = capsys.readouterr().out
        row = next(line for line in out.splitlines() if line.startswith("capped.weight"))
        assert row.split()[2:] == ["nan", "nan"], row
        assert "stopped on its bound alpha = 3" in out
        cells = re.search(r'<tr><td data-v="capped\.weight">(.*?)</tr>', report.read_text())
        assert cells, report.read_text()[:500]
        values = re.findall(r'<td data-v="([^"]*)">', cells.group(1))
        assert values == ["40x40", "nan", "nan"], values  # shape, pl_alpha, alpha_weighted
        with Session() as s:
            s.models.add(state, model_id="m")
            s.compute.configure_kernel("power_law_fit", min_tail=5)
            s.compute.apply("pl_alpha", errors="record")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ratios = sparsity_schedule(s, "alphapruning", 0.5, metric="pl_alpha")
            assert sorted(ratios) == ["normal.weight"]
            assert any("capped.weight" in str(w.message) for w in caught)
            assert math.isnan(s.results.trajectory("pl_alpha")["capped.weight"].iloc[0])
