"""The three hooks users extend next: model formats, parameter views and commands,
provided by a scratch plugin discovered through a real dist-info, and the conflicts two
plugins make."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diffract import KernelExecutionProtocol, Session
from diffract.errors import InvalidArgumentError, ModelSourceError, PluginWarning
from diffract.plugins import make_plugin_manager, set_plugin_manager

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "resources" / "site_hooks"
PARALLEL = KernelExecutionProtocol.PARALLEL


@pytest.fixture
def scratch(monkeypatch):
    """The scratch pack installed (its dist-info on sys.path), the clash pack left out;
    the process's plugin manager restored afterwards."""
    from diffract.plugins import _runtime

    monkeypatch.syspath_prepend(str(SITE))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SITE), os.environ.get("PYTHONPATH", "")]))
    for name in ("DIFFRACT_PLUGINS", "DIFFRACT_STRICT_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DIFFRACT_DISABLE_PLUGINS", "scratch-clash")  # worker processes too
    previous = _runtime._MANAGER
    set_plugin_manager(make_plugin_manager())
    import scratch_pack

    scratch_pack.ScratchReader.reads.clear()
    yield scratch_pack
    set_plugin_manager(previous)


def _cli(*args, site=True, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("DIFFRACT_")}
    if site:
        full["PYTHONPATH"] = os.pathsep.join([str(SITE), full.get("PYTHONPATH", "")])
    full.update(env)
    return subprocess.run([sys.executable, "-m", "diffract.cli", *args], capture_output=True,
                          text=True, env=full, timeout=120)


@pytest.fixture
def weights(rng):
    return {"a.weight": rng.standard_normal((6, 4)), "b.weight": rng.standard_normal((3, 5)),
            "b.bias": rng.standard_normal(3)}


class TestModelFormat:
    def test_models_add_reads_a_file_with_the_plugins_format(self, scratch, tmp_path, weights):
        """A file recognised by its magic bytes (any suffix) is read by the plugin's
        reader; its format is recorded; values equal numpy's."""
        path = tmp_path / "model.txt"
        scratch.save(path, weights)
        with Session() as s:
            assert s.models.add(path, "m") == ["a.weight", "b.weight", "b.bias"]
            assert s.store.source("m").format == "scratch"
            s.compute.apply("frob_norm")
            got = s.results.export_metrics("frob_norm")["m"]
        for name, w in weights.items():
            assert got[name]["frob_norm"] == pytest.approx(np.linalg.norm(w), rel=1e-12)

    def test_a_format_can_be_named_and_an_unknown_name_is_refused(self, scratch, tmp_path,
                                                                  weights):
        """format= picks a reader; a name nobody provides lists the installed ones."""
        path = tmp_path / "model.txt"
        scratch.save(path, weights)
        with Session() as s:
            s.models.add(path, "m", format="scratch")
            with pytest.raises(ModelSourceError, match=r"no model format 'tflite' is installed\. "
                                                       r"Installed: .*scratch"):
                s.models.add(path, "n", format="tflite")
            with pytest.raises(InvalidArgumentError, match="format='npz' applies to checkpoint"):
                s.models.add(weights, "o", format="npz")

    def test_an_unknown_file_gets_one_message_with_the_installed_formats(self, tmp_path):
        """Suffixes of every installed format, and where more formats come from."""
        path = tmp_path / "model.tflite"
        path.write_bytes(b"\x08\x07")
        with Session() as s, pytest.raises(ModelSourceError) as info:
            s.models.add(path, "m")
        text = str(info.value)
        assert "unsupported file type '.tflite': use .safetensors, .pt, .pth, .bin, .npz" in text
        assert "More formats come from plugins with a diffract_model_formats hook" in text

    def test_without_any_format_a_file_names_the_distribution_to_install(self, tmp_path,
                                                                        weights):
        """With no format installed (only the core), the message names diffractml-formats;
        in-memory models still work."""
        from diffract.plugins import _runtime

        previous = _runtime._MANAGER
        set_plugin_manager(make_plugin_manager(autoload=False))
        try:
            with Session() as s:
                with pytest.raises(ModelSourceError,
                                   match=r"No model format is available: diffractml-formats "
                                         r"is installed but not loaded"):
                    s.models.add(tmp_path, "m")
                s.models.add(weights, "mem")
                assert s.models.params("mem")[0].name == "a.weight"
        finally:
            set_plugin_manager(previous)


class TestViews:
    def test_views_are_parameters_named_after_their_parent_read_as_slices(self, scratch,
                                                                          tmp_path, weights):
        """Each view is a parameter ``<parent>[<label>]`` with view_of metadata; its
        fields equal numpy's on the slice. Analysing a parameter with its views reads the
        parameter once; a view read on its own asks the reader for its slice only."""
        path = tmp_path / "m.txt"
        scratch.save(path, weights)
        with Session() as s:
            names = s.models.add(path, "m", views={"blocks": {"parts": 2, "axis": 1}})
            assert names == ["a.weight", "a.weight[block=0]", "a.weight[block=1]",
                             "b.weight", "b.bias"]  # each parameter, then its views
            info = {p.name: p for p in s.models.params("m")}["a.weight[block=1]"]
            assert info.shape == (6, 2) and info.parent == "a.weight"
            scratch.ScratchReader.reads.clear()
            s.compute.apply("frob_norm")
            rows = s.results.export_metrics("frob_norm")["m"]
            reads = list(scratch.ScratchReader.reads)
            table = s.results.export_metrics("frob_norm", export_format="list")
        assert rows["a.weight[block=1]"]["frob_norm"] == pytest.approx(
            np.linalg.norm(weights["a.weight"][:, 2:4]), rel=1e-12)
        assert sorted(reads, key=str) == [("a.weight", None), ("b.bias", None),
                                          ("b.weight", None)]  # each once, whole
        meta = {r["param"]: r.get("meta.view_of") for r in table}
        assert meta["a.weight[block=0]"] == "a.weight" and meta["a.weight"] is None
        with Session() as s:
            s.models.add(path, "m", views={"blocks": {"parts": 2, "axis": 1}})
            scratch.ScratchReader.reads.clear()
            s.store.load_weights("m", "a.weight[block=1]")
        assert scratch.ScratchReader.reads == [("a.weight", ((0, 6, 1), (2, 4, 1)))]

    def test_filters_and_exports_accept_a_views_name(self, scratch, weights):
        """A view's name works as an exact filter (its brackets are not a glob), in
        param_ids, and in erase."""
        with Session() as s:
            s.models.add(weights, "m", views=["blocks"])
            view = s.filter(param_names="a.weight[block=1]")
            view.compute.apply("frob_norm")
            assert list(view.results.export_metrics("frob_norm")["m"]) == ["a.weight[block=1]"]
            both = s.filter(param_ids=["m/a.weight[block=0]", "m/a.weight[block=1]"])
            both.compute.apply("frob_norm")
            assert set(s.results.export_metrics("frob_norm")["m"]) == {"a.weight[block=0]",
                                                                        "a.weight[block=1]"}
            s.results.erase("frob_norm")
            assert s.results.export_metrics("frob_norm") == {"m": {}}

    def test_an_aggregate_over_the_model_leaves_the_views_out(self, scratch, weights):
        """A view is part of its parent: whole-model aggregates are the same with views."""
        values = []
        for views in (None, ["blocks"]):
            with Session() as s:
                s.models.add(weights, "m", views=views)
                s.compute.apply("param_norm")
                values.append(s.results.export_aggregates("param_norm"))
        assert values[0] == values[1]

    def test_views_survive_a_reopen_of_the_durable_store(self, scratch, tmp_path, weights):
        """The source records the views: reopened, a store reads them without the rule."""
        path = tmp_path / "m.txt"
        scratch.save(path, weights)
        store = tmp_path / "store"
        with Session(profile="local", path=store) as s:
            s.models.add(path, "m", views={"blocks": {"parts": 3}})
        set_plugin_manager(make_plugin_manager())
        with Session(profile="local", path=store) as s:
            s.compute.apply("frob_norm")
            got = s.results.export_metrics("frob_norm")["m"]["a.weight[block=2]"]["frob_norm"]
        assert got == pytest.approx(np.linalg.norm(weights["a.weight"][4:6]), rel=1e-12)

    def test_views_of_a_file_are_read_in_worker_processes(self, scratch, tmp_path, weights):
        """PARALLEL kernels in the process pool: the workers read the views from the file
        themselves (rebuilt from the source record) and store what numpy gives."""
        from tests.resources import kernels as test_kernels

        path = tmp_path / "m.txt"
        scratch.save(path, weights)
        pool = {"parallel": {"executor": "processes", "pool_min_seconds": 0}}
        with Session(config=pool) as s:
            for name, fn in (("t_sq", test_kernels.squared_sum), ("t_pid", test_kernels.worker_pid)):
                s.compute.kernel(name=name, execution_protocol=PARALLEL)(fn)
            s.models.add(path, "m", views=["blocks"])
            s.compute.apply("t_sq", "t_pid")
            rows = s.results.export_metrics("t_sq", "t_pid")["m"]
        block = rows["a.weight[block=1]"]
        assert block["t_sq"] == pytest.approx(np.square(weights["a.weight"][3:6]).sum(), rel=1e-12)
        assert block["t_pid"] != os.getpid()

    @pytest.mark.parametrize("views, message", [
        (["rows"], r"no view rule 'rows' is installed \(installed: (\w+, )*blocks"),
        ({"blocks": {"parts": 2, "axes": 1}}, r"view rule 'blocks': unknown option\(s\) \['axes'\]"),
        ({"blocks": {"axis": 2}}, r"view rule 'blocks': axis must be 0 or 1, got 2"),
    ])
    def test_unknown_rules_and_bad_options_are_refused_before_reading(self, scratch, weights,
                                                                     views, message):
        with Session() as s:
            with pytest.raises(InvalidArgumentError, match=message):
                s.models.add(weights, "m", views=views)
            assert s.model_ids == []

    def test_a_rule_returning_what_does_not_fit_is_named(self, scratch, weights, monkeypatch):
        """A view outside its parent, a bad label or a clash names the rule and the
        parameter; nothing is added."""
        from diffract.plugins import View

        cases = [([View("x", (7,))], r"'blocks' gave 'a.weight' \(6, 4\) the view 'x', which "
                                     r"does not fit: index 7 is outside axis 0 of size 6"),
                 ([View("a[0]", (0,))], r"a label is non-empty and holds no '\[' or '\]'"),
                 ([View("r", (0,)), View("r", (1,))], r"the views give two parameters the "
                                                      r"name\(s\) \['a.weight\[r\]'\]"),
                 (["not a view"], r"returned a str for 'a.weight', not a View")]
        for returned, message in cases:
            monkeypatch.setattr(scratch, "blocks", lambda p, c, o, r=returned: r)
            set_plugin_manager(make_plugin_manager())
            with Session() as s:
                with pytest.raises(ModelSourceError, match=message):
                    s.models.add({"a.weight": weights["a.weight"]}, "m", views=["blocks"])
                assert s.model_ids == []


class TestReadRows:
    @pytest.mark.parametrize("index", [((2, 5, 1),), (3,), ((0, 9, 1), (1, 3, 1)),
                                       ((1, 8, 3), 2), ((0, 9, 2),)],
                             ids=["rows", "one-row", "columns", "stepped-rows-one-column",
                                  "every-other-row"])
    def test_slices_equal_numpy_and_never_read_the_whole_array(self, rng, index):
        """read_rows gives array[index]; a column slice is read in blocks of rows, never
        all nine rows in one call."""
        from diffract.plugins import read_rows, to_slices

        array = rng.standard_normal((9, 4, 3))
        calls = []

        def rows(start, stop):
            calls.append((start, stop))
            return array[start:stop].copy()

        got = read_rows(array.shape, index, rows, block_bytes=2 * 4 * 3 * 8, itemsize=8)
        np.testing.assert_array_equal(got, array[to_slices(index)])
        assert all(stop - start <= 3 for start, stop in calls)


class TestCommands:
    def test_a_plugin_command_is_listed_and_runs(self):
        """`diffract --help` lists the plugin's command; it builds its own arguments."""
        listing = _cli("--help", DIFFRACT_DISABLE_PLUGINS="scratch-clash")
        assert listing.returncode == 0 and "scratch" in listing.stdout
        assert "say how many formats are installed" in listing.stdout
        run = _cli("scratch", "--shout", DIFFRACT_DISABLE_PLUGINS="scratch-clash")
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("SCRATCH: ") and "FORMATS" in run.stdout

    def test_two_plugins_claiming_a_format_or_command_are_both_withheld(self, monkeypatch):
        """Neither provider is used; the message is the kernels' one; the core's own
        command cannot be taken over."""
        monkeypatch.syspath_prepend(str(SITE))
        with pytest.warns(PluginWarning) as caught:
            catalog = make_plugin_manager(strict=False).catalog()
        messages = {str(w.message) for w in caught}
        assert "scratch" not in catalog.formats and "scratch" not in catalog.commands
        for what in ("model format", "command"):
            assert (f"Conflicting plugins: {what} 'scratch' is provided by scratch-clash 0.2.0 "
                    "and scratch-pack 0.1.0; neither is used. Pick one with [plugins] prefer = "
                    "{ scratch = \"<distribution>\" } in the configuration (or DIFFRACT_PREFER), "
                    "or uninstall one.") in messages
        assert any("command 'plugins' is one of diffract's own" in m for m in messages)
        assert catalog.commands["plugins"].provider.startswith("diffractml-core")
        run = _cli("scratch")
        assert run.returncode == 2
        assert "command 'scratch' is provided by scratch-clash 0.2.0 and scratch-pack 0.1.0" \
            in run.stderr

    def test_a_command_of_a_distribution_not_installed_names_it(self):
        """Hiding diffractml-report: `diffract analyze` says what to install (exit 2)."""
        run = _cli("analyze", "x.safetensors", site=False,
                   DIFFRACT_DISABLE_PLUGINS="diffractml-report")
        assert run.returncode == 2
        assert run.stderr.strip() == (
            "diffract: error: the 'analyze' command comes from the diffractml-report "
            "distribution, which is not installed (or is disabled by DIFFRACT_PLUGINS/"
            "DIFFRACT_DISABLE_PLUGINS): diffractml-report is installed but not loaded "
            "(make_plugin_manager(autoload=False), allow=, deny=, DIFFRACT_PLUGINS or "
            "DIFFRACT_DISABLE_PLUGINS left it out): make_plugin_manager(allow=[..., "
            "'diffractml-report']) loads it.")


def test_a_kernel_with_undefined_inputs_runs_where_its_input_is_undefined():
    """By default a unit whose input is undefined is undefined without running; a kernel
    declared with undefined_inputs=True receives the stored NaN and decides."""
    import math

    import numpy as np

    from diffract import FieldUndefined, Session

    with Session() as s:
        @s.compute.kernel()
        def half_or_refuse(weights) -> float:
            if weights.shape[0] > 2:
                raise FieldUndefined("too tall")
            return float(weights.sum()) / 2

        @s.compute.kernel()
        def plain(half_or_refuse: float) -> float:
            return 1.0

        @s.compute.kernel(undefined_inputs=True)
        def verdict(half_or_refuse: float) -> str:
            return "missing" if math.isnan(half_or_refuse) else "fine"

        s.models.add({"ok": np.ones((2, 2)), "tall": np.ones((3, 2))}, model_id="m")
        s.compute.apply("plain", "verdict")
        rows = s.results.export_metrics("plain", "verdict")["m"]
        notes = {(n["kernel"], n["unit"]): n["reason"] for n in s.results.export_notes()}
    assert rows["ok"] == {"plain": 1.0, "verdict": "fine"}
    assert math.isnan(rows["tall"]["plain"]) and rows["tall"]["verdict"] == "missing"
    assert notes[("plain", "m/tall")] == "input 'half_or_refuse' is undefined: too tall"
    assert ("verdict", "m/tall") not in notes
