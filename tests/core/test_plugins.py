"""The plugin layer with real dist-infos discovered through importlib.metadata."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from diffract import Session
from diffract import __version__ as CORE
from diffract.errors import PluginConflictError, PluginLoadError, PluginWarning
from diffract.plugins import (
    get_plugin_manager,
    hookimpl,
    make_plugin_manager,
    set_plugin_manager,
)
from diffract.plugins.types import KernelSpec, StorageProfile

SITE = Path(__file__).parent.parent / "resources" / "site"


@pytest.fixture
def fake_site(monkeypatch):
    """Put the fake distributions (good, broken, clashing) on sys.path."""
    monkeypatch.syspath_prepend(str(SITE))
    for mod in ("good_pack", "broken_pack", "clash_pack"):
        monkeypatch.delitem(sys.modules, mod, raising=False)
    monkeypatch.delenv("DIFFRACT_PLUGINS", raising=False)
    monkeypatch.delenv("DIFFRACT_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("DIFFRACT_STRICT_PLUGINS", raising=False)
    return SITE


@pytest.fixture
def installed_manager():
    """Install a manager for the test, restore the previous one after (without building
    one now: with the fake site on sys.path it would load the fake plugins)."""
    from diffract.plugins import _runtime

    previous = _runtime._MANAGER
    yield lambda pm: set_plugin_manager(pm)
    set_plugin_manager(previous)


def _records(pm):
    return {r.distribution: r for r in pm.catalog().plugins}


class TestDiscovery:
    def test_good_broken_and_clashing_plugins(self, fake_site):
        """Good loads; broken warns with distribution and version; a contested name is
        used from neither provider (however the names sort), each conflict warned once."""
        with pytest.warns(PluginWarning) as caught:
            pm = make_plugin_manager()
            catalog = pm.catalog()
            pm._catalog = None
            pm.catalog()  # collecting again warns no more
        messages = [str(w.message) for w in caught]
        assert sum("broken-pack 0.3.0 (entry point 'broken-pack' = 'broken_pack') failed" in m
                   and "DIFFRACT_DISABLE_PLUGINS=broken-pack" in m for m in messages) == 1
        assert sum(f"kernel or field 'frob_norm' is provided by diffractml-core {CORE} and "
                   "clash-pack 2.0.0; neither is used" in m for m in messages) == 1
        assert sum("'abs_max' is provided by clash-pack 2.0.0 and good-pack 1.2.0" in m
                   for m in messages) == 1
        assert sum("'row_max' is provided by clash-pack 2.0.0 and good-pack 1.2.0" in m
                   for m in messages) == 1
        kernels = {k.name: k.provider for k in catalog.kernels}
        for withheld in ("frob_norm", "abs_max", "row_max", "row_max_other"):
            assert withheld not in kernels
        assert kernels["clash_only"] == "clash-pack 2.0.0"
        assert kernels["numel"].startswith("diffractml-core")
        assert "scratch" in catalog.profiles and "inline-good" in catalog.executors
        records = _records(pm)
        assert records["broken-pack"].status == "failed"
        assert "ImportError" in records["broken-pack"].reason
        assert sorted(records["good-pack"].refused) == ["abs_max", "row_max"]
        assert sorted(records["clash-pack"].refused) == ["abs_max", "frob_norm", "row_max_other"]
        assert catalog.contested["kernels"]["row_max_other"] == (
            "row_max", ("clash-pack 2.0.0", "good-pack 1.2.0"))

    def test_using_a_contested_name_names_both_providers_and_the_fix(self, fake_site,
                                                                       installed_manager):
        """apply, a dependent field and configure_kernel all raise KernelConflictError with
        both providers and the [plugins] prefer line."""
        from diffract.errors import KernelConflictError

        with pytest.warns(PluginWarning):
            installed_manager(make_plugin_manager(deny=["broken-pack"]))
            with Session() as session:
                session.models.add({"w": np.ones((2, 2))}, model_id="m")
                with pytest.raises(KernelConflictError, match=(
                        rf"'frob_norm' is provided by diffractml-core {re.escape(CORE)} and clash-pack 2.0.0, so "
                        r"neither is registered\. Pick one in the configuration \(\[plugins\] "
                        r"prefer = \{ frob_norm = \"diffractml-core\" \}\)")) as info:
                    session.compute.apply("param_norm")
                assert info.value.providers == (f"diffractml-core {CORE}", "clash-pack 2.0.0")
                with pytest.raises(KernelConflictError, match=r"'row_max_other' is withheld: "
                                   r"'row_max' is provided by clash-pack 2.0.0 and good-pack"):
                    session.compute.configure_kernel("row_max_other")
                with pytest.raises(KernelConflictError, match=r"'row_max' is provided by"):
                    session.compute.apply("row_max")
                session.compute.apply("clash_only")

    @pytest.mark.parametrize("how", ["argument", "environment", "session-config"])
    def test_prefer_picks_a_provider(self, fake_site, installed_manager, monkeypatch, how):
        """A preference (argument, DIFFRACT_PREFER or [plugins] prefer) settles a conflict:
        the preferred provider's kernel runs, the other stays withheld."""
        prefer = {"abs_max": "clash-pack", "row_max": "good_pack"}
        config = None
        with pytest.warns(PluginWarning):
            if how == "argument":
                pm = make_plugin_manager(deny=["broken-pack"], prefer=prefer)
            elif how == "environment":
                monkeypatch.setenv("DIFFRACT_PREFER", "abs_max=clash-pack, row_max=good_pack")
                pm = make_plugin_manager(deny=["broken-pack"])
            else:
                pm = make_plugin_manager(deny=["broken-pack"])
                config = {"plugins": {"prefer": prefer}}
            installed_manager(pm)
            with Session(config=config) as session:
                session.models.add({"w": np.arange(4.0).reshape(2, 2)}, model_id="m")
                session.compute.apply("abs_max", "row_max")
                row = session.results.export_metrics()["m"]["w"]
        assert row == {"abs_max": -1.0, "row_max": 5.0}  # clash-pack's abs_max, good-pack's row_max
        records = _records(pm)
        assert "abs_max" in records["good-pack"].refused
        assert "row_max_other" in records["clash-pack"].refused

    def test_strict_mode_raises(self, fake_site, monkeypatch):
        """DIFFRACT_STRICT_PLUGINS=1 turns a broken plugin into an error naming it."""
        monkeypatch.setenv("DIFFRACT_STRICT_PLUGINS", "1")
        with pytest.raises(PluginLoadError, match="Plugin broken-pack 0.3.0") as info:
            make_plugin_manager()
        assert (info.value.distribution, info.value.version) == ("broken-pack", "0.3.0")

    def test_strict_mode_raises_on_conflict(self, fake_site):
        """In strict mode a name clash is a PluginConflictError."""
        pm = make_plugin_manager(deny=["broken-pack"], strict=True)
        with pytest.raises(PluginConflictError, match="'abs_max' is provided by clash-pack 2.0.0 "
                                                      "and good-pack 1.2.0; neither is used"):
            pm.catalog()

    def test_deny_list_acts_before_import(self, fake_site, monkeypatch):
        """A denied plugin is never imported (no warning, not in sys.modules)."""
        monkeypatch.setenv("DIFFRACT_DISABLE_PLUGINS", "broken-pack,clash_pack")
        pm = make_plugin_manager()
        pm.catalog()
        assert "broken_pack" not in sys.modules and "clash_pack" not in sys.modules
        records = _records(pm)
        assert records["broken-pack"].status == "disabled"
        assert records["good-pack"].status == "loaded"

    def test_allow_list_acts_before_import(self, fake_site, monkeypatch):
        """With DIFFRACT_PLUGINS only the listed plugins are imported; the core is always there."""
        monkeypatch.setenv("DIFFRACT_PLUGINS", "good-pack")
        pm = make_plugin_manager()
        names = {k.name for k in pm.catalog().kernels}
        assert "abs_max" in names and "frob_norm" in names and "clash_only" not in names
        assert "broken_pack" not in sys.modules

    def test_session_uses_a_plugin_profile(self, fake_site, installed_manager):
        """A profile from a discovered plugin is usable by name; an unknown one suggests."""
        installed_manager(make_plugin_manager(allow=["good-pack"]))
        with Session(profile="scratch") as session:
            session.models.add({"w": __import__("numpy").ones((2, 2))}, model_id="m")
            session.compute.apply("abs_max")
            assert session.results.export_metrics()["m"]["w"]["abs_max"] == 1.0
        from diffract.errors import UnknownProfileError

        with pytest.raises(UnknownProfileError, match=r"Unknown storage profile 'scrach'\. Did you mean 'scratch'\?"):
            Session(profile="scrach")


class _HandPlugin:
    @hookimpl
    def diffract_kernels(self):
        def hand_made(weights):
            """Sum of entries."""
            return float(weights.sum())

        yield KernelSpec.from_function(hand_made)

    @hookimpl
    def diffract_storage_profiles(self):
        yield "not a record"


class TestEmbedding:
    def test_autoload_off_and_register_by_hand(self, installed_manager, fake_site):
        """A host builds a manager with autoload off: no entry points, its own plugins, core built-ins."""
        pm = make_plugin_manager(autoload=False)
        pm.register_plugin(_HandPlugin(), distribution="host-tool", version="9.9")
        with pytest.warns(PluginWarning, match="Plugin host-tool 9.9: hook diffract_storage_profiles yielded a str"):
            catalog = pm.catalog()
        names = {k.name for k in catalog.kernels}
        assert "hand_made" in names and "frob_norm" in names and "abs_max" not in names
        installed_manager(pm)
        with Session() as session:
            session.models.add({"w": __import__("numpy").full((2, 2), 2.0)}, model_id="m")
            session.compute.apply("hand_made")
            assert session.results.export_metrics()["m"]["w"]["hand_made"] == 8.0

    def test_example_pack_is_installed_and_discovered(self, example_pack):
        """The example pack under examples/ is installed by the set-up and found by entry point."""
        record = next(r for r in get_plugin_manager().catalog().plugins if r.distribution == "diffractml-example-pack")
        assert record.status == "loaded" and record.provides["kernels"] == ["row_norm_stats", "max_row_norm"]
        import numpy as np

        w = np.arange(12.0).reshape(3, 4)
        with Session() as session:
            session.models.add({"w": w, "b": np.ones(3)}, model_id="m")
            session.compute.apply("max_row_norm")
            rows = session.results.export_metrics()["m"]
            agg = session.results.export_aggregates("max_row_norm")
        norms = np.linalg.norm(w, axis=1)
        assert rows["w"]["row_norm_mean"] == pytest.approx(norms.mean())
        assert rows["w"]["row_norm_std"] == pytest.approx(norms.std())
        assert "b" not in rows
        assert agg == {"max_row_norm@models[m]": pytest.approx(norms.mean())}


def test_storage_profile_records_are_frozen():
    """Hook records are frozen attrs values."""
    p = StorageProfile("x", lambda o: None)
    with pytest.raises(AttributeError):
        p.name = "y"  # type: ignore[misc]


class TestEntryPointScan:
    """``entry_points`` reads dist-info folders itself (no ``importlib.metadata`` import
    at start-up); what it finds is what ``importlib.metadata`` finds."""

    @staticmethod
    def _both(group):
        import importlib.metadata as md

        from diffract.plugins._manager import entry_points

        ours = sorted(entry_points(group))
        theirs = sorted((e.name, e.value, e.dist.name, e.dist.version)
                        for e in md.entry_points(group=group))
        return ours, theirs

    @pytest.mark.parametrize("group", ["diffract", "console_scripts", "pytest11"])
    def test_same_as_importlib_metadata(self, fake_site, group):
        ours, theirs = self._both(group)
        assert ours == theirs and ours

    def test_first_distribution_of_a_name_wins(self, fake_site, tmp_path, monkeypatch):
        """A second copy of a distribution later on the path is not read, as
        importlib.metadata skips it; its comments and other groups are ignored."""
        for where, module in ((tmp_path / "a", "first_mod"), (tmp_path / "b", "second_mod")):
            info = where / "twin_pack-2.0.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text("Metadata-Version: 2.1\nName: Twin.Pack\n"
                                           "Version: 2.0\n\nbody: not a header\n")
            (info / "entry_points.txt").write_text(
                f"# a comment\n[other]\nx = nope\n[diffract]\ntwin = {module}:hook\n")
        monkeypatch.syspath_prepend(str(tmp_path / "b"))
        monkeypatch.syspath_prepend(str(tmp_path / "a"))
        ours, theirs = self._both("diffract")
        assert ours == theirs
        assert ("twin", "first_mod:hook", "Twin.Pack", "2.0") in ours
        assert not any(v.startswith("second_mod") for _, v, _, _ in ours)

    def test_a_zip_on_the_path_is_left_to_importlib_metadata(self, fake_site, tmp_path,
                                                            monkeypatch):
        import zipfile

        archive = tmp_path / "zipped.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("zip_pack-1.0.dist-info/METADATA",
                       "Metadata-Version: 2.1\nName: zip-pack\nVersion: 1.0\n")
            z.writestr("zip_pack-1.0.dist-info/entry_points.txt", "[diffract]\nzp = zip_pack\n")
        monkeypatch.syspath_prepend(str(archive))
        ours, theirs = self._both("diffract")
        assert ours == theirs and ("zp", "zip_pack", "zip-pack", "1.0") in ours
