"""tools/sizes.py in CI: the core stays small, modules stay short, no import circles."""

from __future__ import annotations


def test_every_distribution_is_within_its_limits(capsys, tool):
    """The core's lines, every module's length, and no import circle anywhere."""
    sizes = tool("sizes")
    assert sizes.check() == []
    out = capsys.readouterr().out
    assert "diffract_core:" in out and "plugins/diffract_report:" in out  # all were measured


def test_the_checks_can_fail(tmp_path, tool):
    """A circle and a long module are found; code lines leave docstrings and comments out."""
    sizes = tool("sizes")
    src = tmp_path / "pkg"
    src.mkdir()
    (src / "__init__.py").write_text("from pkg import a\n")
    (src / "a.py").write_text("from pkg.b import g\n\n\ndef f():\n    return g()\n")
    (src / "b.py").write_text("import pkg.a\n\n\ndef g():\n    from pkg import c\n    return c\n")
    (src / "c.py").write_text('"""Doc\nstring."""\n# a comment\nimport pkg.a\n\nX = 1\n')
    mods = sizes.modules(tmp_path)
    graph = {n: sizes.imports(p, n, set(mods)) for n, p in mods.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}  # c: inside a function
    assert sizes.circles(graph) == [["pkg.a", "pkg.b"]]
    assert sizes.code_lines((src / "c.py").read_text()) == 2
