"""The committed metric catalog is what the registry generates."""

from __future__ import annotations

from pathlib import Path

from diffract.cli import main
from diffract.plugins import make_plugin_manager
from diffract_report.catalog import render_catalog

#: The repository's own kernel packs (the catalog documents them with the core).
REPO_PACKS = ["diffractml-kernels-spectral", "diffractml-kernels-alignment"]
CATALOG = Path(__file__).parents[2] / "docs" / "metrics.md"


def test_committed_catalog_matches_the_registry():
    """docs/metrics.md equals a fresh rendering: regenerate it with the command in README."""
    fresh = render_catalog(make_plugin_manager(allow=REPO_PACKS).catalog().kernels)
    assert CATALOG.read_text() == fresh, (
        "docs/metrics.md is stale: run `diffract catalog --plugins "
        + ",".join(REPO_PACKS) + " -o docs/metrics.md`"
    )


def test_catalog_lists_each_field_with_its_formula(tmp_path):
    """Every produced field appears in the index; each kernel section holds its docstring."""
    out = tmp_path / "m.md"
    assert main(["catalog", "--plugins", ",".join(REPO_PACKS), "-o", str(out)]) == 0
    text = out.read_text()
    assert "| `pl_alpha` | [power_law_fit](#power_law_fit) | PARAMETER | `esd` |" in text
    assert "``sum_i lambda_i / lambda_max = ||W||_F^2 / ||W||_2^2``." in text
    assert "- configuration: `rtol=1e-05`" in text
