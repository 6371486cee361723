"""The diffract console script."""

from __future__ import annotations

import subprocess
import sys

from diffract.cli import main


class TestCli:
    def test_plugins_lists_distributions_and_registrations(self, capsys):
        """`diffract plugins` shows each distribution, version and what it registers."""
        assert main(["plugins"]) == 0
        out = capsys.readouterr().out
        assert "diffract-core 0.1.0: loaded" in out
        assert "    kernels: frob_norm, numel, param_norm, total_numel" in out
        assert "diffract-example-pack 0.1.0 (entry point diffract-example-pack): loaded" in out

    def test_kernels_verbose(self, capsys):
        """`diffract kernels -v` shows level, inputs, outputs, configuration and formula."""
        assert main(["kernels", "-v"]) == 0
        out = capsys.readouterr().out
        assert "param_norm  [IN_MODEL, SEQUENTIAL]  from diffract-core 0.1.0" in out
        assert "    requires: frob_norm" in out
        assert "config:   ord=2.0" in out

    def test_demo_trains_analyses_compares_and_reports(self, tmp_path):
        """`diffract demo`: trains, saves checkpoints, analyses and compares them, writes
        plots and a report, and says where they went."""
        run = subprocess.run([sys.executable, "-m", "diffract.cli", "demo", "--out",
                              str(tmp_path / "d")], capture_output=True, text=True,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        out = run.stdout
        assert "trained a 4-layer MLP for 400 steps" in out
        assert "step0400: 4 weight matrices" in out and "pl_alpha" in out
        assert sorted(p.name for p in (tmp_path / "d" / "checkpoints").iterdir()) == [
            "step0000.pt", "step0100.pt", "step0400.pt"]
        report = tmp_path / "d" / "report.html"
        assert f"{tmp_path / 'd' / 'report.html'}  (open it in a browser" in out
        text = report.read_text()
        assert "<table" in text and "data:image/png;base64," in text
        assert "Traceback" not in run.stderr and "Warning" not in run.stderr
        try:
            import diffract_kernels_alignment  # noqa: F401
        except ImportError:
            return
        assert "step0000 -> step0100" in out and "compare-sval_rel_change" in text
        assert (tmp_path / "d" / "plots" / "compare_sval_rel_change.png").stat().st_size > 1000


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run the console script with the fake plugins of tests/resources/site installed."""
    import os
    from pathlib import Path

    site = Path(__file__).parent.parent / "resources" / "site"
    full = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    full.update(PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env)
    return subprocess.run([sys.executable, "-m", "diffract.cli", *args], capture_output=True,
                          text=True, env=full)


class TestCliWithBrokenPlugins:
    def test_strict_mode_prints_one_clean_paragraph(self):
        """Under DIFFRACT_STRICT_PLUGINS=1 a broken plugin is one error paragraph (exit 2),
        not a traceback."""
        run = _cli("plugins", env={"DIFFRACT_STRICT_PLUGINS": "1"})
        assert run.returncode == 2
        assert "Traceback" not in run.stderr
        assert run.stderr.startswith("diffract plugins: error: Plugin broken-pack 0.3.0 (entry point")
        assert len(run.stderr.strip().splitlines()) == 1

    def test_conflicts_are_listed_and_each_warning_printed_once(self):
        """Without strict mode: every warning once on stderr, conflicts listed on stdout
        with the line that picks a provider."""
        run = _cli("plugins", env={})
        assert run.returncode == 0, run.stderr
        warnings = [line for line in run.stderr.splitlines() if "PluginWarning" in line]
        assert len(warnings) == len(set(warnings)) == 4  # broken, frob_norm, abs_max, row_max
        assert "Conflicts (neither provider is used until one is preferred):" in run.stdout
        assert ("  'abs_max': clash-pack 2.0.0 and good-pack 1.2.0\n"
                "    pick one: [plugins] prefer = { abs_max = \"clash-pack\" }  "
                "(or DIFFRACT_PREFER=abs_max=clash-pack)") in run.stdout
        assert "    withheld (conflicts): frob_norm, abs_max, row_max_other" in run.stdout
