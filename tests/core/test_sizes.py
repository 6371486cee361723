"""tools/sizes.py in CI: the core stays small, modules stay short, no import circles."""

from __future__ import annotations


def test_every_distribution_is_within_its_limits(capsys, tool):
    """The core's lines, every module's length, and no import circle anywhere."""
    sizes = tool("sizes")
    assert sizes.check() == []
    out = capsys.readouterr().out
    assert "diffract_core:" in out and "plugins/diffract_report:" in out  # all were measured


def test_the_checks_can_fail(tmp_path, tool):
    """A circle and a long module are found; a circle through an import inside a function
    too (issue 37), one through a TYPE_CHECKING block not; code lines leave docstrings and
    comments out."""
    sizes = tool("sizes")
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "__init__.py").write_text("from pkg import a\n")
    (src / "a.py").write_text("from pkg.b import g\n\n\ndef f():\n    return g()\n")
    (src / "b.py").write_text("def g():\n    from pkg import c\n    return c\n")
    (src / "c.py").write_text('"""Doc\nstring."""\n# a comment\nimport pkg.a\n\nX = 1\n')
    (src / "d.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                              "    import pkg.e\n")
    (src / "e.py").write_text("import pkg.d\n")
    mods = sizes.modules(tmp_path)
    graph = {n: sizes.imports(p, n, set(mods)) for n, p in mods.items()}
    assert graph["pkg.b"] == {"pkg.c"}  # inside a function: counted
    assert graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.d"}  # TYPE_CHECKING: not
    assert sizes.circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert sizes.code_lines((src / "c.py").read_text()) == 2
