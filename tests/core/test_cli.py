"""The diffract console script."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from diffract import __version__ as CORE
from diffract.cli import main


class TestCli:
    def test_plugins_lists_distributions_and_registrations(self, capsys, example_pack):
        """`diffract plugins` shows each distribution, version and what it registers."""
        assert main(["plugins"]) == 0
        out = capsys.readouterr().out
        assert f"diffractml-core {CORE}: loaded" in out
        assert "    kernels: frob_norm, numel, param_norm, total_numel" in out
        assert "diffractml-example-pack 0.1.0 (entry point diffractml-example-pack): loaded" in out

    def test_kernels_verbose(self, capsys, example_pack):
        """`diffract kernels -v` shows level, inputs, outputs, configuration and formula."""
        assert main(["kernels", "-v"]) == 0
        out = capsys.readouterr().out
        assert f"param_norm  [IN_MODEL, SEQUENTIAL]  from diffractml-core {CORE}" in out
        assert "    requires: frob_norm" in out
        assert "config:   ord=2.0" in out

    @pytest.mark.slow
    def test_demo_is_a_tracked_run_whose_planted_event_is_found(self, tmp_path):
        """`diffract demo`: trains with a planted learning-rate spike in one layer, tracks
        the checkpoints into a store, and the sudden change that most metrics flag is at
        the first checkpoint after the spike, in that layer: in what it prints, in the
        store and in the report. A rerun replaces its own folder; another is refused."""
        pytest.importorskip("diffract_kernels_spectral")
        from diffract import Session
        from diffract_report.demo import EVENT
        from diffract_report.track import sudden

        run = subprocess.run([sys.executable, "-m", "diffract.cli", "demo", "--out",
                              str(tmp_path / "d")], capture_output=True, text=True,
                             cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        out = run.stdout
        assert "Traceback" not in run.stderr and "Warning" not in run.stderr
        assert "trained a 4-layer MLP for 600 steps" in out
        assert "the learning rate of fc2.weight was 100x too high" in out
        assert sorted(p.name for p in (tmp_path / "d" / "run").iterdir()) == [
            f"step-{s:04d}.pt" for s in range(100, 601, 50)]
        assert "added 11 checkpoint(s): step-0100, step-0150" in out
        lines = out.splitlines()
        top = lines[next(i for i, line in enumerate(lines) if line.startswith("sudden")) + 1]
        assert top.startswith(f"  step {EVENT['seen_at']}  {EVENT['layer']}: ")
        assert "step-0600: 4 weight matrices" in out
        # the output layer's 10 eigenvalues are too few for a tail: its NaN says why
        table = out[out.index("step-0600: 4 weight matrices"):]
        assert re.search(r"^out\.weight +10x192 +nan ", table, re.M)
        assert "no alpha for 1 layer(s):\n    1 x only 10 positive point(s), fewer than " \
               "min_tail=50" in table

        votes: dict[tuple[int, str], int] = {}
        with Session(profile="local", path=tmp_path / "d" / "store") as s:
            assert len(s.models.ordered()) == 11
            for field in ("pl_alpha", "stable_rank", "log_norm", "spectral_norm",
                          "mp_softrank", "alpha_weighted"):
                for step, layer, _, _ in sudden(s.results.trajectory(field), 10.0):
                    votes[(int(step), layer)] = votes.get((int(step), layer), 0) + 1
        event = (EVENT["seen_at"], EVENT["layer"])
        assert max(votes, key=votes.get) == event and votes[event] >= 4
        assert all(n < 3 for key, n in votes.items() if key != event), votes

        text = (tmp_path / "d" / "report.html").read_text()
        sudden_table = text[text.index('<table class="sortable" id="sudden">'):]
        sudden_table = sudden_table[:sudden_table.index("</table>")]
        first_row = sudden_table[sudden_table.index("<tr", sudden_table.index("</thead>")):]
        first_row = first_row[:first_row.index("</tr>")]
        assert f">{EVENT['seen_at']}<" in first_row and EVENT["layer"] in first_row
        assert "l_subspace_overlap, mean over the layers" in text
        assert "stable_rank per layer and step" in text

        again = subprocess.run([sys.executable, "-m", "diffract.cli", "demo", "--out",
                                str(tmp_path / "d")], capture_output=True, text=True)
        assert again.returncode == 0, again.stderr
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "notes.txt").write_text("keep")
        refused = subprocess.run([sys.executable, "-m", "diffract.cli", "demo", "--out",
                                  str(tmp_path / "mine")], capture_output=True, text=True)
        assert refused.returncode == 2 and "not an earlier demo's" in refused.stderr
        assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


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


def test_the_demo_trains_on_one_thread_and_gives_the_threads_back(tmp_path, monkeypatch):
    """Its small products on one torch thread (on two, a loaded machine made 600 steps
    take 35 s instead of 3), the caller's thread count restored after, even on error."""
    torch = pytest.importorskip("torch")
    from diffract_report import demo

    seen = []
    monkeypatch.setattr(demo, "STEPS", 120)
    real = demo._train
    monkeypatch.setattr(demo, "_train", lambda *a: seen.append(torch.get_num_threads())
                        or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        saved = demo.train_run(tmp_path / "run")
        assert seen == [1] and torch.get_num_threads() == 2
        assert [p.name for p, _ in saved] == ["step-0100.pt"]
        monkeypatch.setattr(demo, "_train", lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            demo.train_run(tmp_path / "again")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
