"""Plugins use the public plugin API only: nothing under diffract.core.* is imported by
the repository's own plugins, the example pack or the test packs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_TREES = ["plugins", "examples", "tests/resources/site", "tests/resources/site_hooks", "diffract_kernels_spectral/src",
                "kernel_fun_gpu/src"]


def _core_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diffract.core"):
            found.append(f"{where}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno}: import {a.name}"
                      for a in node.names if a.name.startswith("diffract.core")]
    return found


def test_plugins_import_nothing_from_diffract_core():
    """Every plugin-side module imports from diffract, diffract.plugins or diffract.errors."""
    files = [p for tree in PLUGIN_TREES for p in (ROOT / tree).rglob("*.py")]
    assert len(files) > 20
    offenders = [line for f in files for line in _core_imports(f)]
    assert offenders == []


def test_the_scan_sees_a_core_import(tmp_path):
    """The scan itself finds both import forms (so the test above can fail)."""
    bad = tmp_path / "probe.py"
    bad.write_text("import diffract.core.models\nfrom diffract.core.storage import RamStore\n")
    assert len(_core_imports(bad)) == 2
