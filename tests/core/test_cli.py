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

    def test_demo_prints_a_table(self):
        """`diffract demo` analyses a torch model and prints per-parameter fields."""
        out = subprocess.run([sys.executable, "-m", "diffract.cli", "demo"], capture_output=True,
                             text=True, check=True).stdout
        assert "Diffract demo: 9 parameters of model 'step0'" in out
        assert "parameter" in out and "frob_norm" in out and "1.weight" in out
        assert "param_norm@models[step0]" in out
