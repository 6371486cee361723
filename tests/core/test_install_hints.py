"""What to install when something is missing (issue 33 item 4): the distribution's name
for the package index and its folder for a checkout (where these distributions are
installed from today), for a command, a field of any pack of this repository (in Python
too) and a format; the table behind it is what the installed plugins provide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diffract.errors import install_hint, provider_of

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import distributions  # noqa: E402


def test_the_table_is_what_the_installed_plugins_provide():
    """distributions.json equals what tools/distributions.py reads from the plugins and
    the repository's folders now (run it after adding a field, a command, a format)."""
    shipped = json.loads((ROOT / "diffract_core/src/diffract/distributions.json").read_text())
    assert shipped == distributions.table()
    for name, entry in shipped.items():  # each folder is that distribution's
        assert f'name = "{name}"' in (ROOT / entry["path"] / "pyproject.toml").read_text()
    assert provider_of("fields", "pl_alpha") == "diffractml-kernels-spectral"
    assert provider_of("fields", "alpha") == "diffractml-kernels-spectral"  # an alias
    assert provider_of("fields", "avg_max_l_agreement") == "diffractml-kernels-alignment"
    assert provider_of("commands", "track") == "diffractml-report"
    assert provider_of("formats", "gguf") == "diffractml-formats"
    assert provider_of("fields", "frob_norm") is None  # the core's own


def test_both_forms_and_extras(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)  # as where none is installed
    assert install_hint("diffractml-report") == (
        "pip install diffractml-report (from a checkout of Diffract: pip install "
        "./plugins/diffract_report)")
    assert install_hint("diffractml-kernels-spectral", "taichi") == (
        "pip install 'diffractml-kernels-spectral[taichi]' (from a checkout of Diffract: "
        "pip install './diffract_kernels_spectral[taichi]')")
    assert install_hint("somebody-elses-pack") == "pip install somebody-elses-pack"


def test_an_installed_distribution_left_out_is_loaded_not_installed(tmp_path):
    """Installed but not loaded (autoload=False, allow=, the environment variables): the
    hint says how to load it, not to pip install what is there (issue 77.5)."""
    assert install_hint("diffractml-formats") == (
        "diffractml-formats is installed but not loaded (make_plugin_manager(autoload=False), "
        "allow=, deny=, DIFFRACT_PLUGINS or DIFFRACT_DISABLE_PLUGINS left it out): "
        "make_plugin_manager(allow=[..., 'diffractml-formats']) loads it")
    code = ("from diffract import Session\n"
            "from diffract.plugins import make_plugin_manager, set_plugin_manager\n"
            "set_plugin_manager(make_plugin_manager(autoload=False))\n"
            "try:\n"
            f"    Session().models.add({str(tmp_path / 'x.safetensors')!r}, 'm')\n"
            "except Exception as exc:\n"
            "    print(exc)\n")
    (tmp_path / "x.safetensors").write_bytes(b"\x00" * 16)
    run = _python(code)
    assert "No model format is available: diffractml-formats is installed but not loaded" \
        in run.stdout, run.stdout + run.stderr


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.mark.parametrize(("field", "dist", "folder"), [
    ("pl_alpha", "diffractml-kernels-spectral", "./diffract_kernels_spectral"),
    ("alpha", "diffractml-kernels-spectral", "./diffract_kernels_spectral"),
    ("l_subspace_overlap", "diffractml-kernels-alignment", "./diffract_kernels_alignment"),
])
def test_apply_of_a_field_whose_pack_is_missing_names_it(field, dist, folder):
    code = ("import numpy as np\nfrom diffract import Session\n"
            "from diffract.errors import UnknownFieldError\n"
            "with Session() as s:\n"
            "    s.models.add({'w': np.eye(4)}, model_id='m')\n"
            "    try:\n"
            f"        s.compute.apply({field!r})\n"
            "    except UnknownFieldError as exc:\n"
            "        print(exc)\n")
    run = _python(code, DIFFRACT_DISABLE_PLUGINS=dist)
    assert run.returncode == 0, run.stderr
    assert (f"Unknown field {field!r} requested. {field!r} comes from {dist}, which is not "
            f"installed (or is disabled by DIFFRACT_PLUGINS/DIFFRACT_DISABLE_PLUGINS): "
            f"{dist} is installed but not loaded") in run.stdout, run.stdout
    assert f"make_plugin_manager(allow=[..., {dist!r}]) loads it" in run.stdout


def test_analyze_of_a_metric_whose_pack_is_missing_names_both_forms(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path / "m.safetensors"
    save_file({"w": np.eye(8, dtype=np.float32)}, str(path))
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path),
                          "--metrics", "pl_alpha"], capture_output=True, text=True,
                         env={**os.environ,
                              "DIFFRACT_DISABLE_PLUGINS": "diffractml-kernels-spectral"},
                         timeout=300)
    assert run.returncode == 2, run.stderr
    assert ("Metric 'pl_alpha' comes from diffractml-kernels-spectral, which is not installed: "
            "diffractml-kernels-spectral is installed but not loaded") in run.stderr, run.stderr
