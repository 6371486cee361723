"""User patterns run in linear time: --layers/--exclude, re: filters, view-rule patterns and
--step-from are matched by RE2, so a pattern that makes Python's backtracking ``re`` take
exponential time (``(a|a)*$`` on a 41-character name took more than 20 s) answers at once,
with the same result ``re`` gives; what RE2 cannot run is refused with the reason."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from diffract import Session
from diffract.errors import InvalidArgumentError
from diffract.plugins import name_pattern

#: The issue's cases: each backtracks exponentially in Python's ``re`` on "a" * n + "!".
CATASTROPHIC = [r"^(a|a)*$", r"((a+))+$", r"(a|aa)+$", r"(?:a|a)+$", r"(a+)+b", r"^(a*)*$",
                r"^(a|a?)+$", r"(.*a){12}$"]


def overlapping_alternations(rng: random.Random, count: int) -> list[str]:
    """Random nests of alternations whose branches overlap (``a``, ``aa``, ``a?``, ``a*``)
    under ``+``/``*``: the shape that defeats backtracking engines."""
    atoms = ["a", "aa", "a?", "a*", "a+", "(?:a|aa)", "[ab]", "."]
    out = []
    for _ in range(count):
        pattern = "|".join(rng.sample(atoms, rng.randint(2, 4)))
        for _ in range(rng.randint(1, 3)):
            pattern = f"({pattern}){rng.choice('+*')}"
        out.append(pattern + rng.choice(["$", "b", "!x", ""]))
    return out


_EVERY_ENTRY_POINT = r"""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from diffract import Session
from diffract.cli import main

tmp = Path(sys.argv[1])
name = "a" * 41 + "x"  # 42 characters: hours for the patterns below under Python's re
save_file({name: torch.ones(4, 4), "q_proj.weight": torch.ones(8, 4)}, str(tmp / "m.safetensors"))
patterns = sys.argv[2:]
for p in patterns:
    # --layers keeps nothing (exit 2, "leave no parameter"); --exclude drops nothing
    assert main(["analyze", str(tmp / "m.safetensors"), "--layers", p, "--metrics",
                 "frob_norm"]) == 2, p
    assert main(["analyze", str(tmp / "m.safetensors"), "--exclude", p, "--metrics",
                 "frob_norm", "--format", "csv"]) == 0, p
with Session() as s:
    s.models.add(tmp / "m.safetensors", "m")
    s.compute.apply("frob_norm")
    for p in patterns:
        found = s.filter(param_names="re:" + p).results.export_metrics("frob_norm")
        assert not any(found.values()), (p, found)
    # a view rule's own pattern, searched in every parameter's name
    s.models.add(tmp / "m.safetensors", "v", views=["heads"],
                 view_options={"heads": 2, "head_dim": 4, "patterns": {"q": r"(a+)+b|q_proj"}})
    views = [p.name for p in s.models.params("v") if "[" in p.name]
    assert views == ["q_proj.weight[head=0]", "q_proj.weight[head=1]"], views
folder = tmp / ("a" * 41 + "x") / "step-7"
folder.mkdir(parents=True)
save_file({"w": torch.ones(4, 4)}, str(folder / "model.safetensors"))
with Session() as s:
    s.models.add(folder, "stepped", step_from=r"(?:a|a)+x/step-(\d+)")
    assert s.models.steps()["stepped"]["step"] == 7, s.models.steps()
print("done")
"""


class TestLinearTime:
    def test_every_entry_point_answers_catastrophic_patterns(self, tmp_path):
        """--layers, --exclude, re: filters, view patterns and step_from on a 42-character name."""
        # A child process, so that a backtracking engine fails the test at the timeout
        # instead of hanging the suite (the linear engine answers in milliseconds).
        done = subprocess.run(
            [sys.executable, "-c", _EVERY_ENTRY_POINT, str(tmp_path), *CATASTROPHIC],
            capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip().endswith("done")

    def test_patterns_are_compiled_by_a_linear_time_engine(self):
        """name_pattern compiles with RE2, not Python's re."""
        import re2

        compiled = name_pattern(r"(a|aa)+$")
        assert not isinstance(compiled, re.Pattern)
        assert type(compiled) is type(re2.compile("x"))

    def test_overlapping_alternations_agree_with_re_on_short_names(self):
        """300 generated patterns: RE2 finds what re finds on short names, and answers on long ones."""
        rng = random.Random(3)
        # two characters at most: triply nested loops take re seconds already on "aab"
        names = ["", "a", "b", "ab", "aa", "ba", "a!", "xa", "bb", "!"]
        patterns = overlapping_alternations(rng, 300)
        for pattern in patterns:
            ours, theirs = name_pattern(pattern), re.compile(pattern)
            for name in names:  # short enough for re's backtracking
                # whether it matches (all a filter asks); spans can differ where an
                # empty iteration of a nested loop ends Python's match early
                assert (ours.search(name) is None) == (theirs.search(name) is None), (
                    pattern, name)
        long_name = "a" * 5000 + "!"
        matched = sum(name_pattern(p).search(long_name) is not None for p in patterns)
        assert 0 < matched < len(patterns)  # the long names were matched, both ways


class TestRefused:
    @pytest.mark.parametrize(("pattern", "why"), [
        (r"(a)\1", "invalid escape sequence"),
        (r"(?=a)b", "invalid perl operator"),
        (r"(?<!a)b", "invalid perl operator"),
        (r"(unclosed", "missing )"),
    ], ids=["backreference", "lookahead", "lookbehind", "unbalanced"])
    def test_what_re2_cannot_run_is_refused_with_the_reason(self, pattern, why):
        """Backreferences, lookarounds and syntax errors: InvalidArgumentError naming the pattern."""
        with pytest.raises(InvalidArgumentError, match=re.escape(f"{pattern!r}") + ".*" + re.escape(why)):
            name_pattern(pattern, "param_names")

    def test_the_command_line_refuses_with_exit_2(self, tmp_path, capsys):
        """--layers with a lookahead: exit 2, the flag and the reason on stderr."""
        import numpy as np

        from diffract.cli import main

        np.savez(tmp_path / "m.npz", w=np.ones((4, 4), np.float32))
        assert main(["analyze", str(tmp_path / "m.npz"), "--layers", "(?=w)w"]) == 2
        err = capsys.readouterr().err
        assert "--layers '(?=w)w' is not a regular expression Diffract can run" in err
        assert "no backreferences or lookarounds" in err

    def test_a_view_pattern_that_is_not_a_string_or_not_re2_is_refused(self, tmp_path):
        """view_options patterns are checked by the same engine before anything is added."""
        import numpy as np

        np.savez(tmp_path / "m.npz", **{"q_proj.weight": np.ones((8, 4), np.float32)})
        with Session() as s:
            for bad, why in ((r"(?=q)q", "invalid perl operator"), (7, "must be a regular expression")):
                with pytest.raises(InvalidArgumentError, match=re.escape(why)):
                    s.models.add(tmp_path / "m.npz", "m", views=["heads"],
                                 view_options={"heads": 2, "patterns": {"q": bad}})
            assert s.models.model_ids == []



def test_view_patterns_are_searched_anywhere_in_a_name():
    """A model whose attention no default names (Meta's original wq/wk/wv/wo under
    ``layers.N.attention``): patterns that name the module, not the whole path, find
    its 2 layers x 4 weights x 4 heads = 32 head views (anchored at a name's start,
    they found none and the model was refused)."""
    pytest.importorskip("diffract_views")
    import numpy as np

    rng = np.random.default_rng(0)
    weights = {f"layers.{i}.attention.w{k}.weight": rng.standard_normal((32, 32))
               for i in range(2) for k in "qkvo"}
    patterns = {k: rf"attention\.w{k}\.weight$" for k in "qkvo"}
    with Session() as s:
        s.models.add(weights, "m", views=["heads"],
                     view_options={"heads": 4, "kv_heads": 4, "patterns": patterns})
        views = [p for p in s.models.params("m") if p.parent is not None]
        assert len(views) == 32
        first = s.store.load_weights("m", "layers.1.attention.wk.weight[head=2]")
    np.testing.assert_array_equal(first, weights["layers.1.attention.wk.weight"][16:24])
