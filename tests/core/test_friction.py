"""The Python side of first-use friction (issue 15, section 5): a compact apply report,
one warning for undefined values, hints when a kernel and a field are confused, exports
without arrays unless asked, and the plugin guide's example working as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

from diffract import Session
from diffract.cli import main
from diffract.errors import (
    InvalidArgumentError,
    UndefinedValuesWarning,
    UnknownFieldError,
    UnknownKernelError,
)

pytest.importorskip("diffract_kernels_spectral")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def many_biases(rng):
    """Forty 1-D parameters (every matrix kernel skips them) and two matrices, one of
    them with a NaN (undefined in every spectral field)."""
    arrays = {f"b{i}": rng.standard_normal(8) for i in range(40)}
    arrays["w"] = rng.standard_normal((30, 20))
    bad = rng.standard_normal((30, 20))
    bad[3, 4] = np.nan
    arrays["nan_w"] = bad
    return arrays


class TestApplyReport:
    def test_repr_is_compact_and_summary_groups_reasons(self, session, many_biases):
        """A report over many skipped parameters prints as one line; summary() groups the
        forty identical skips into one line per kernel; reasons() holds every unit."""
        session.models.add(many_biases, model_id="m")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedValuesWarning)
            report = session.compute.apply("stable_rank", "log_norm")
        text = repr(report)
        assert "\n" not in text and len(text) < 200
        assert re.fullmatch(r"ApplyReport\(computed=\d+, failed=0, undefined=\d+, "
                            r"skipped=\d+; \.summary\(\) for reasons\)", text)
        skipped = report.reasons("skipped")
        assert sum(len(u) for u in skipped.values()) == len(report.skipped) >= 40
        per_kernel = {}
        for (kind, kernel, _), units in skipped.items():
            assert kind == "skipped"
            per_kernel.setdefault(kernel, set()).update(units)
        assert all({f"m/b{i}" for i in range(40)} <= units for units in per_kernel.values())
        summary = report.summary()
        assert len(summary.splitlines()) < 15
        assert re.search(r"skipped: \d+ unit\(s\), \d+ distinct reason\(s\)", summary)
        assert re.search(r"and 39 more: ", summary)  # forty biases, one line
        assert "undefined:" in summary and "nan_w" in summary

    def test_one_warning_per_apply_for_undefined_values(self, session, many_biases):
        session.models.add(many_biases, model_id="m")
        with pytest.warns(UndefinedValuesWarning, match=r"report\.summary\(\)") as caught:
            session.compute.apply("stable_rank", "log_norm", "pl_alpha")
        assert len([w for w in caught if w.category is UndefinedValuesWarning]) == 1
        # nothing recomputed, so nothing new to warn about
        with warnings.catch_warnings():
            warnings.simplefilter("error", UndefinedValuesWarning)
            session.compute.apply("stable_rank")

    def test_no_warning_when_everything_is_defined(self, session, rng):
        session.models.add({"w": rng.standard_normal((20, 10))}, model_id="m")
        with warnings.catch_warnings():
            warnings.simplefilter("error", UndefinedValuesWarning)
            session.compute.apply("stable_rank")


class TestKernelFieldConfusion:
    def test_a_kernel_name_where_a_field_is_expected(self, session, arrays):
        session.models.add(arrays, model_id="m")
        kernel = session.registry.producer("pl_alpha").name
        outputs = session.registry.get(kernel).produce_fields
        assert kernel != "pl_alpha" and kernel not in outputs
        with pytest.raises(UnknownFieldError) as err:
            session.compute.apply(kernel)
        assert f"{kernel!r} is a kernel; request the field(s) it produces" in str(err.value)
        assert all(repr(f) in str(err.value) for f in outputs)

    def test_a_field_name_where_a_kernel_is_expected(self, session):
        kernel = session.registry.producer("pl_alpha").name
        with pytest.raises(UnknownKernelError,
                           match=rf"'pl_alpha' is a field; kernel '{kernel}' produces it"):
            session.compute.configure_kernel("pl_alpha", xmin="peak")

    def test_a_plain_typo_still_gets_did_you_mean(self, session):
        with pytest.raises(UnknownKernelError, match="Did you mean"):
            session.compute.configure_kernel("frob_nrm")


class TestFieldsAsAList:
    """Every call that takes field names takes them one by one or as one list (a list of
    metrics kept in a variable); anything else that is not a name is refused naming the
    call, not a TypeError from deep inside (``apply(["a"])`` said "unhashable type")."""

    def test_a_list_is_the_same_as_the_names_one_by_one(self, session, arrays):
        session.models.add(arrays, model_id="m")
        session.models.add(arrays, model_id="n")
        fields = ["stable_rank", "frob_norm"]
        report = session.compute.apply(fields)
        assert set(report.requested) == set(fields) and report.computed
        assert session.results.export_metrics(fields) == session.results.export_metrics(
            *fields)
        assert session.results.to_pandas(tuple(fields)).equals(
            session.results.to_pandas(*fields))
        assert session.results.export(fields) == session.results.export(*fields)
        session.compute.apply(["param_norm"])
        aggregates = session.results.export_aggregates(["param_norm"])
        assert aggregates and aggregates == session.results.export_aggregates("param_norm")
        assert session.results.stale(fields) == []
        pairs = session.compute.apply_pairs(["l_overlap"], pairs="first")
        assert set(pairs) == {("m", "n")} and pairs[("m", "n")].computed
        norms = session.results.export_metrics("frob_norm")
        assert sum(len(params) for params in norms.values()) == 8  # 4 parameters, 2 models
        assert session.results.erase(["frob_norm"]) == 8
        assert session.results.export_metrics("frob_norm") == {"m": {}, "n": {}}

    @pytest.mark.parametrize("call", ["compute.apply", "compute.apply_pairs",
                                      "results.export_metrics", "results.to_pandas",
                                      "results.export", "results.export_aggregates",
                                      "results.stale", "results.erase"])
    def test_what_is_not_a_name_is_refused_naming_the_call(self, session, arrays, call):
        session.models.add(arrays, model_id="m")
        api, method = call.split(".")
        fn = getattr(getattr(session, api), method)
        for bad in (None, 3, ["stable_rank", 3]):
            with pytest.raises(InvalidArgumentError,
                               match=rf"{method}\(\) takes field names, as {method}\('a', "
                                     rf"'b'\) or {method}\(\['a', 'b'\]\); got "):
                fn(bad)


class TestExportArrays:
    @pytest.fixture
    def filled(self, session, arrays):
        session.models.add(arrays, model_id="m")
        session.compute.apply("weights_svals", "stable_rank")
        return session

    def test_no_fields_leaves_array_fields_out(self, filled, arrays):
        rows = filled.results.export_metrics()["m"]
        assert rows["layer0.weight"].keys() >= {"stable_rank"}
        assert not any("weights_svals" in row for row in rows.values())
        every = filled.results.export_metrics(include_arrays=True)["m"]
        np.testing.assert_allclose(every["layer0.weight"]["weights_svals"],
                                   np.linalg.svd(arrays["layer0.weight"], compute_uv=False),
                                   rtol=1e-10)
        named = filled.results.export_metrics("weights_svals")["m"]
        assert named["layer0.weight"]["weights_svals"].shape == (8,)

    def test_csv_has_no_stringified_arrays(self, filled, arrays, tmp_path):
        text = filled.results.export_metrics(export_format="csv")
        assert "[" not in text and "stable_rank" in text.splitlines()[0]
        with pytest.raises(InvalidArgumentError, match=r"'weights_svals' holds arrays.*json"):
            filled.results.export_metrics("weights_svals", export_format="csv",
                                          path=tmp_path / "x.csv")
        assert not (tmp_path / "x.csv").exists()
        records = json.loads(filled.results.export_metrics("weights_svals", export_format="json"))
        (row,) = [r for r in records if r["param"] == "layer0.weight"]
        np.testing.assert_allclose(row["weights_svals"],
                                   np.linalg.svd(arrays["layer0.weight"], compute_uv=False),
                                   rtol=1e-10)


class TestCliFriction:
    def test_kernels_verbose_shows_the_whole_first_paragraph(self, capsys):
        from diffract.plugins import get_registry

        spec = next(s for s in get_registry().kernels()
                    if len(s.doc.strip().split("\n\n")[0].splitlines()) > 1)
        first_line = spec.doc.strip().splitlines()[0]
        second_line = spec.doc.strip().splitlines()[1].strip()
        assert main(["kernels", "-v"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert " ".join(first_line.split()) in out
        assert " ".join(second_line.split()) in out

    def test_catalog_with_an_unknown_plugin_is_an_error(self, capsys):
        assert main(["catalog", "--plugins", "diffractml-kernels-spectral,no-such-pack"]) == 2
        err = capsys.readouterr().err
        assert "no-such-pack" in err and "diffract plugins" in err
        assert "diffractml-kernels-spectral" in err.split("Installed:")[1]

    def test_catalog_with_a_known_plugin_is_fine(self, capsys):
        assert main(["catalog", "--plugins", "diffractml-kernels-spectral"]) == 0
        assert "pl_alpha" in capsys.readouterr().out


def _code_blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


class TestPluginGuide:
    def test_the_guides_example_works_next_to_every_installed_pack(self, tmp_path, rng):
        """docs/plugins.md's kernel and hooks, written out as the guide says and
        registered next to all the installed plugins: no name is refused, and the
        numbers are numpy's."""
        from diffract.plugins import make_plugin_manager, set_plugin_manager

        blocks = _code_blocks(ROOT / "docs" / "plugins.md", "python")
        kernels_src = next(b for b in blocks if b.startswith("# my_diffract_pack/kernels.py"))
        plugin_src = next(b for b in blocks if b.startswith("# my_diffract_pack/plugin.py"))
        toml = _code_blocks(ROOT / "docs" / "plugins.md", "toml")[0]
        assert "[build-system]" in toml and "build-backend" in toml
        package = types.ModuleType("my_diffract_pack")
        package.__path__ = []
        kernels = types.ModuleType("my_diffract_pack.kernels")
        sys.modules.update({"my_diffract_pack": package, "my_diffract_pack.kernels": kernels})
        try:
            exec(compile(kernels_src, "kernels.py", "exec"), kernels.__dict__)
            plugin = types.ModuleType("my_diffract_pack.plugin")
            exec(compile(plugin_src, "plugin.py", "exec"), plugin.__dict__)
            pm = make_plugin_manager(strict=True)  # every installed plugin, conflicts fatal
            pm.register_plugin(plugin, distribution="my-diffract-pack", version="0.1.0")
            previous = set_plugin_manager(pm)
            try:
                w = rng.standard_normal((12, 7))
                with Session() as s:
                    s.models.add({"w": w}, model_id="m")
                    fields = s.registry.get("col_norm_stats").produce_fields
                    s.compute.apply(*fields)
                    row = s.results.export_metrics()["m"]["w"]
                cols = np.linalg.norm(w, axis=0)
                assert row[fields[0]] == pytest.approx(cols.mean(), rel=1e-12)
                assert row[fields[1]] == pytest.approx(cols.std(), rel=1e-12)
                assert not any(pm.catalog().contested.values())
            finally:
                set_plugin_manager(previous)
        finally:
            for name in ("my_diffract_pack", "my_diffract_pack.kernels"):
                sys.modules.pop(name, None)


    def test_the_guides_format_view_rule_and_command_work(self, tmp_path, rng, capsys):
        """docs/plugins.md's three examples of the new hooks, registered next to every
        installed plugin: the format reads a directory of .npy files, the view rule's
        heads are the slices numpy gives, the command is listed and runs."""
        from diffract.cli import main
        from diffract.plugins import make_plugin_manager, set_plugin_manager

        blocks = _code_blocks(ROOT / "docs" / "plugins.md", "python")
        pm = make_plugin_manager(strict=True)
        for name in ("my_formats", "my_views", "my_commands"):
            source = next(b for b in blocks if b.startswith(f"# {name}/plugin.py"))
            module = types.ModuleType(f"{name}.plugin")
            exec(compile(source, f"{name}/plugin.py", "exec"), module.__dict__)
            pm.register_plugin(module, distribution=name.replace("_", "-"), version="0.1.0")
        q, v = rng.standard_normal((16, 8)), rng.standard_normal((4, 8))
        (tmp_path / "ckpt").mkdir()
        np.save(tmp_path / "ckpt" / "attn.q_proj.weight.npy", q)
        np.save(tmp_path / "ckpt" / "attn.v_proj.weight.npy", v)
        previous = set_plugin_manager(pm)
        try:
            assert not any(pm.catalog().contested.values())
            with Session() as s:
                names = s.models.add(tmp_path / "ckpt", "m", views={"q-heads": {"heads": 4}})
                assert s.store.source("m").format == "npy-directory"
                assert names == ["attn.q_proj.weight",
                                 *(f"attn.q_proj.weight[head={h}]" for h in range(4)),
                                 "attn.v_proj.weight"]
                s.compute.apply("frob_norm")
                rows = s.results.export_metrics("frob_norm")["m"]
            for h in range(4):
                assert rows[f"attn.q_proj.weight[head={h}]"]["frob_norm"] == pytest.approx(
                    np.linalg.norm(q[4 * h:4 * (h + 1)]), rel=1e-12)
            capsys.readouterr()
            with pytest.raises(SystemExit):
                main(["--help"])
            assert "norms" in capsys.readouterr().out
            assert main(["norms", str(tmp_path / "ckpt")]) == 0
            out = capsys.readouterr().out
            assert f"attn.v_proj.weight\t{np.linalg.norm(v):.6g}" in out
        finally:
            set_plugin_manager(previous)


def test_kernels_verbose_survives_a_closed_pipe():
    """`diffract kernels -v | head -1`: no BrokenPipeError traceback."""
    run = subprocess.run(f"{sys.executable} -m diffract.cli kernels -v | head -1",
                         shell=True, capture_output=True, text=True)
    assert run.returncode == 0 and "Traceback" not in run.stderr


class TestFirstHourMessages:
    """Issue 77.5: what a new user's mistakes are answered with."""

    def test_a_missing_adapter_is_said_as_models_add_says_a_missing_file(self, session):
        from diffract.errors import ModelSourceError

        with pytest.raises(ModelSourceError, match=r"Model 'l': the file does not exist \(a "
                                                   r"PEFT adapter.*\('missing'\)") as caught:
            session.models.add_lora("missing/", "l")
        assert "torch.load" not in str(caught.value)

    def test_a_store_path_that_holds_none_is_said_when_nothing_was_written(self, tmp_path):
        pytest.importorskip("diffract_storage_local")
        from diffract.errors import DiffractWarning, StorageError

        with pytest.warns(DiffractWarning, match=r"No store was at .*typo.* nothing was "
                                                 r"written to it"), \
                Session(profile="local", path=str(tmp_path / "typo")) as s:
            assert s.results.export_metrics() == {}
        with warnings.catch_warnings():  # a store that was written to: nothing said
            warnings.simplefilter("error", DiffractWarning)
            with Session(profile="local", path=str(tmp_path / "new")) as s:
                s.models.add({"w": np.ones((4, 4))}, "m")
            with Session(profile="local", path=str(tmp_path / "new")) as s:
                assert s.model_ids == ["m"]
        with pytest.raises(StorageError, match="There is no Diffract store at .*none.* to "
                                               "open read-only"):
            Session(profile="local", path=str(tmp_path / "none"), read_only=True)

    def test_analyze_of_a_folder_of_checkpoints_hints_a_command_that_runs(self, tmp_path,
                                                                           capsys):
        from safetensors.numpy import save_file

        for step in (1, 2):
            folder = tmp_path / "run" / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            save_file({"w": np.eye(8, dtype=np.float32)}, str(folder / "model.safetensors"))
        assert main(["analyze", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        hint = re.search(r"diffract (track \S+ --store \S+)", err)
        assert hint, err
        import shlex  # the command it names runs as given

        assert main(shlex.split(hint.group(1))) == 0
        assert (tmp_path / "run.diffract" / "store.sqlite").is_file()
