"""Kernel configuration is checked when it is set, and a mistake is never stored."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import pytest

from diffract import KernelSpec, Range, Session, kernel
from diffract.errors import (
    ApplyError,
    ConfigError,
    InvalidConfigValueError,
    KernelDefinitionError,
    UnknownConfigKeyError,
)
from diffract.plugins import get_registry


def _domains(fn):
    return {k: d.describe() for k, d in KernelSpec.from_function(fn).config_domains.items()}


class TestDomainsFromSignatures:
    def test_annotations_declare_domains(self):
        """Literal, Annotated[..., Range], Optional and unions give domains; a default's
        type is the domain of an unannotated keyword; other annotations constrain nothing."""

        def k(
            w,
            *,
            method: Literal["a", "b"] = "a",
            tail: Annotated[int, Range(ge=2)] = 50,
            frac: Annotated[float, Range(gt=0, le=1)] = 0.5,
            limit: int | None = None,  # noqa: UP007 - the old spelling must work too
            scale: float | None = None,
            either: int | str = 1,
            plain=3.0,
            anything: np.ndarray = None,
            unknown: NoSuchName = 1,  # noqa: F821 - an annotation that cannot be resolved
        ):
            return 0.0

        assert _domains(k) == {
            "method": "one of 'a', 'b'",
            "tail": "int >= 2",
            "frac": "float > 0 and <= 1",
            "limit": "int or None",
            "scale": "float or None",
            "either": "int or str",
            "plain": "float",
            "anything": "any value",
            "unknown": "int",
        }

    def test_a_default_outside_its_own_annotation_is_refused(self):
        """A default that its annotation does not admit is a definition error."""

        def k(w, *, tail: Annotated[int, Range(ge=2)] = 1, mode: Literal["x"] = "y"):
            return 0.0

        with pytest.raises(KernelDefinitionError, match=r"Kernel 'k': default\(s\) outside their own annotation: mode='y' \('y' is not one of 'x'\); tail=1 \(1 is out of range: it must be >= 2\)"):
            KernelSpec.from_function(k)

    def test_unknown_kernel_option_suggests(self):
        """A misspelt kernel option names the closest and lists them all."""
        with pytest.raises(KernelDefinitionError, match=r"@kernel got unknown option\(s\) \['produce_field'\]\. Did you mean 'produce_fields'\? Kernel options are: name, require_fields"):
            kernel(produce_field=("x",))
        assert isinstance(KernelDefinitionError("m", kernel="k"), ValueError)


class TestConfigureKernel:
    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"fit_method": "bogus"}, r"fit_method: 'bogus' is not one of 'auto', 'diffract', 'powerlaw'"),
            ({"min_tail": 1}, r"min_tail: 1 is out of range: it must be >= 2"),
            ({"min_tail": "50"}, r"min_tail: '50' is a str, expected int >= 2"),
            ({"min_tail": 50.0}, r"min_tail: 50.0 is a float, expected int"),
            ({"min_tail": True}, r"min_tail: True is a bool, expected int"),
            ({"fit_method": None}, r"fit_method: None is not allowed"),
            ({"finger_thresh": float("nan")}, r"finger_thresh: NaN is not a value it can take"),
            ({"alpha_max": float("nan")}, r"alpha_max: NaN is not a value it can take"),
            ({"finger_thresh": float("inf")}, None),
        ],
        ids=["choice", "range", "str-for-int", "float-for-int", "bool-for-int", "none",
             "nan-with-a-range", "nan-optional", "inf-where-unbounded"],
    )
    def test_bad_values_are_refused_with_what_is_allowed(self, session, values, message):
        """configure_kernel refuses a value outside its domain (a ValueError), changing nothing."""
        session.compute.configure_kernel("power_law_fit", min_tail=60)
        if message is None:  # allowed: a range open on that side takes infinity
            session.compute.configure_kernel("power_law_fit", **values)
            session.compute.configure_kernel("power_law_fit", finger_thresh=1.0)
            return
        with pytest.raises(InvalidConfigValueError, match=message) as info:
            session.compute.configure_kernel("power_law_fit", **{"min_tail": 70, **values})
        assert isinstance(info.value, ValueError) and info.value.kernel == "power_law_fit"
        config = session.compute.kernel_config("power_law_fit")
        assert config == {**config, "fit_method": "auto", "min_tail": 60}
        session.compute.configure_kernel("power_law_fit", min_tail=50)

    def test_every_problem_is_listed_sorted(self, session):
        """Several bad values are reported together, sorted by keyword."""
        with pytest.raises(InvalidConfigValueError, match=r"n_replicates: 0 is out of range.*\n  seed: -1 is out of range"):
            session.compute.configure_kernel("pl_pvalue", seed=-1, n_replicates=0)

    def test_an_int_is_a_valid_float(self, session):
        """An int where a float is declared is accepted (rtol=0)."""
        session.compute.configure_kernel("hard_rank", rtol=0)
        assert session.compute.kernel_config("hard_rank")["rtol"] == 0
        session.compute.configure_kernel("hard_rank", rtol=1e-5)


class TestInvalidConfigurationMetAtRunTime:
    def test_a_bad_value_that_slips_past_fails_and_is_retried_not_undefined(self, session, rng):
        """The reproduced case: a bogus fit_method that reaches the kernel fails the unit
        (no NaN stored); once fixed, the next apply computes pl_alpha."""
        session.models.add({"w": rng.standard_t(3, size=(120, 200))}, model_id="m")
        registry = get_registry()
        registry._config.setdefault("power_law_fit", {})["fit_method"] = "bogus"  # bypass the check
        try:
            with pytest.raises(ApplyError, match=r"power_law_fit on m/w: FitArgumentError: Unknown fit_method 'bogus'"):
                session.compute.apply("pl_alpha")
            assert "pl_alpha" not in session.results.export_metrics()["m"].get("w", {})
            assert [n["kind"] for n in session.results.export_notes()] == ["failed"]
        finally:
            registry.reset_configuration("power_law_fit")
        session.compute.apply("pl_alpha")
        assert np.isfinite(session.results.export_metrics("pl_alpha")["m"]["w"]["pl_alpha"])
        assert session.results.export_notes() == []


class TestConfigurationFile:
    def test_kernel_tables_are_checked_before_anything_applies(self, tmp_path):
        """[kernels.<name>] tables: every problem listed, nothing applied."""
        path = tmp_path / "diffract.toml"
        path.write_text(
            '[kernels.hard_rank]\nrtol = 1e-3\n\n'
            '[kernels.power_law_fit]\nfit_method = "bogus"\nmin_tail = 1\n\n'
            '[kernels.stable_rnk]\nx = 1\n'
        )
        with pytest.raises(ConfigError, match=r"(?s)Invalid kernel configuration; nothing was applied:\n"
                           r"  \[kernels.power_law_fit\]: .*fit_method: 'bogus' is not one of.*"
                           r"min_tail: 1 is out of range.*\[kernels.stable_rnk\]: Unknown kernel "
                           r"'stable_rnk'\. Did you mean 'stable_rank'\?"):
            Session(config=path)
        assert get_registry().effective_config("hard_rank")["rtol"] == 1e-5

    def test_valid_kernel_tables_configure_the_kernels(self, tmp_path):
        """A valid [kernels.<name>] table is applied when the session opens."""
        path = tmp_path / "diffract.toml"
        path.write_text('[kernels.hard_rank]\nrtol = 1e-3\n')
        with Session(config=path) as session:
            assert session.compute.kernel_config("hard_rank") == {"rtol": 1e-3}
        with pytest.raises(ConfigError, match=r"'kernels.hard_rank' must be a table"):
            Session(config={"kernels": {"hard_rank": 3}})

    def test_unknown_keyword_in_a_table(self):
        """An unknown keyword in a kernel table names the accepted ones."""
        with pytest.raises(ConfigError, match=r"Kernel 'hard_rank' has no configuration keyword 'rtl'\. Did you mean 'rtol'\?"):
            Session(config={"kernels": {"hard_rank": {"rtl": 1.0}}})
        assert issubclass(UnknownConfigKeyError, ValueError)


def test_nan_from_the_command_line_is_refused(tmp_path, capsys):
    """--set power_law_fit.finger_thresh=NaN: exit 2 naming the keyword (it used to turn
    finger clipping off without a word)."""
    pytest.importorskip("diffract_report")
    from diffract.cli import main

    np.savez(tmp_path / "m.npz", w=np.random.default_rng(0).standard_normal((30, 20)))
    assert main(["analyze", str(tmp_path / "m.npz"), "--set",
                 "power_law_fit.finger_thresh=NaN"]) == 2
    assert "finger_thresh: NaN is not a value it can take" in capsys.readouterr().err
