"""diffractml-core alone, as `pip install diffractml-core` leaves it: numpy, attrs and pluggy,
no torch, no rich, no matplotlib, no other distribution of this repository."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from diffract import __version__ as CORE

ROOT = Path(__file__).resolve().parents[2]
#: What diffractml-core depends on (import names and their distributions' files).
DEPENDENCIES = ("numpy", "numpy.libs", "attr", "attrs", "pluggy")


@pytest.fixture(scope="module")
def core_alone(tmp_path_factory) -> Path:
    """A folder holding only diffractml-core's dependencies (links into this
    environment's site-packages) and the core's sources."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder = tmp_path_factory.mktemp("core-alone")
    for entry in site.iterdir():
        base = entry.name.split("-")[0]
        if entry.name in DEPENDENCIES or (entry.name.endswith(".dist-info")
                                          and base.lower() in DEPENDENCIES):
            (folder / entry.name).symlink_to(entry)
    (folder / "diffract").symlink_to(ROOT / "diffract_core" / "src" / "diffract")
    for module in ("_diffract_launch.py", "_diffract_shared.py"):
        (folder / module).symlink_to(ROOT / "diffract_core" / "src" / module)
    return folder


def _python(folder: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with nothing but ``folder`` importable (no site-packages, no
    PYTHONPATH, no user site)."""
    prelude = f"import sys; sys.path[:] = [{str(folder)!r}] + [p for p in sys.path if " \
              "'site-packages' not in p and p != '']\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DIFFRACT_", "PYTHON"))}
    return subprocess.run([sys.executable, "-S", "-E", "-s", "-c", prelude + code],
                          capture_output=True, text=True, env=env, timeout=120)


def test_the_core_alone_runs_a_session_and_its_own_commands(core_alone):
    """import diffract, a session on numpy weights, `diffract plugins` and `diffract
    kernels`; torch, rich, matplotlib and every plugin stay absent."""
    run = _python(core_alone, """
import numpy as np
from diffract import Session
from diffract.cli import main
with Session() as s:
    s.models.add({"w": np.arange(6.0).reshape(2, 3)}, model_id="m")
    s.compute.apply("frob_norm")
    print("norm", s.results.export_metrics("frob_norm")["m"]["w"]["frob_norm"])
print("plugins", main(["plugins"]))
print("kernels", main(["kernels"]))
for name in ("torch", "rich", "matplotlib", "diffract_formats", "diffract_report"):
    assert name not in sys.modules, name
    try:
        __import__(name)
    except ImportError:
        continue
    raise AssertionError(f"{name} is importable: the environment is not the core alone")
""")
    assert run.returncode == 0, run.stderr
    norm = float(next(line for line in run.stdout.splitlines() if line.startswith("norm"))
                 .split()[1])
    assert norm == pytest.approx(55 ** 0.5, rel=1e-12)  # ||[[0, 1, 2], [3, 4, 5]]||_F
    assert f"diffractml-core {CORE}: loaded" in run.stdout and "plugins 0" in run.stdout
    assert "frob_norm" in run.stdout and "kernels 0" in run.stdout


def test_the_core_alone_names_what_to_install(core_alone, tmp_path):
    """`diffract analyze` names diffractml-report; a checkpoint file names
    diffractml-formats; both exit cleanly."""
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x00" * 16)
    run = _python(core_alone, f"""
from diffract.cli import main
print("analyze", main(["analyze", {str(path)!r}]))
from diffract import Session
from diffract.errors import ModelSourceError
with Session() as s:
    try:
        s.models.add({str(path)!r}, model_id="m")
    except ModelSourceError as exc:
        print("add:", exc)
""")
    assert run.returncode == 0, run.stderr
    assert "analyze 2" in run.stdout
    assert ("the 'analyze' command comes from the diffractml-report distribution, which is not "
            "installed") in run.stderr and "pip install diffractml-report" in run.stderr
    assert "No model format is available: pip install diffractml-formats" in run.stdout


def test_no_core_module_imports_another_distribution_of_the_repository():
    """Plugins import the core, never the other way (issue 37): not at the top of a
    module, and not inside a function either (where a pack once hid behind a call-time
    ImportError). Every import statement of the core's sources is read."""
    import ast

    ours = {p.name for p in (ROOT / "plugins").iterdir() if p.is_dir()}
    ours |= {"diffract_kernels_spectral", "diffract_kernels_alignment", "kernel_fun"}
    found = []
    for path in sorted((ROOT / "diffract_core" / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ours]
    assert "diffract_report" in ours and "diffract_formats" in ours  # the list is real
    assert found == [], found
