"""Every warning Diffract gives is said at the user's own line (issue 33 item 3): the
file and line of the call in the user's code, never a line of Diffract's packages, its
plugins or pluggy; from the command line, with no source line printed at all."""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from diffract import Session
from diffract.errors import (
    DiffractWarning,
    ModelWarning,
    PartialOutputWarning,
    PluginWarning,
    UndefinedValuesWarning,
)


def _said_here(caught, category, line):
    """The one warning of ``category`` in ``caught`` points at ``line`` of this file."""
    mine = [w for w in caught if issubclass(w.category, category)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert (mine[0].filename, mine[0].lineno) == (__file__, line), (mine[0].filename,
                                                                       mine[0].lineno)


def _line_after() -> int:
    """The line after the caller's (where the call under test is written)."""
    return inspect.currentframe().f_back.f_lineno + 1


def _state():
    rng = np.random.default_rng(0)
    return {"a.weight": torch.from_numpy(rng.standard_normal((12, 8))),
            "b.weight": torch.from_numpy(rng.standard_normal((8, 8)))}


def test_a_reader_warning_from_models_add(tmp_path):
    """A training checkpoint read through the formats plugin (a hook called by pluggy)."""
    path = tmp_path / "ck.pt"
    torch.save({"model": _state(), "step": 3}, path)
    with Session() as s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_after()
        s.models.add(path, model_id="m")
    _said_here(caught, ModelWarning, line)


def test_a_delta_warning_from_models_add():
    base = {k: v.numpy() for k, v in _state().items()}
    tuned = {"a.weight": base["a.weight"] + 0.1, "c.weight": np.ones((3, 3))}
    with Session() as s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.models.add(base, model_id="base")
        line = _line_after()
        s.models.add(tuned, model_id="ft", base_model_id="base")
    _said_here(caught, ModelWarning, line)


def test_undefined_values_and_partial_outputs_from_apply():
    with Session() as s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.models.add({"flat.weight": np.ones((60, 60)), "ok.weight": np.eye(60)},
                     model_id="m")
        line = _line_after()
        s.compute.apply("pl_alpha")
        _said_here(caught, UndefinedValuesWarning, line)
        s.results.erase("pl_alpha")
        caught.clear()
        line = _line_after()
        s.compute.apply("pl_alpha")
        _said_here(caught, PartialOutputWarning, line)


def test_a_pack_warning_from_sparsity_schedule():
    from diffract_kernels_spectral import sparsity_schedule

    rng = np.random.default_rng(1)
    with Session() as s, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s.models.add({"flat.weight": np.ones((80, 80)),
                      **{f"l{i}.weight": rng.standard_t(3, (200, 120)) for i in range(3)}},
                     model_id="m")
        s.compute.apply("pl_alpha_hill", errors="record")
        caught.clear()
        line = _line_after()
        sparsity_schedule(s, "alphapruning", 0.5)
    _said_here(caught, DiffractWarning, line)


def test_a_plugin_warning_from_session(monkeypatch):
    monkeypatch.setenv("DIFFRACT_PREFER", "no-equals-sign")
    monkeypatch.delenv("DIFFRACT_STRICT_PLUGINS", raising=False)
    from diffract.plugins import _runtime

    monkeypatch.setattr(_runtime, "_MANAGER", None, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_after()
        with Session():
            pass
    mine = [w for w in caught if issubclass(w.category, PluginWarning)]
    if not mine:
        pytest.skip("the plugin manager of this process was built before the variable")
    _said_here(caught, PluginWarning, line)


def test_the_command_line_prints_no_internal_source_line(tmp_path):
    path = tmp_path / "ck.pt"
    torch.save({"model": _state(), "step": 3}, path)
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(path),
                          "--metrics", "stable_rank", "--quiet"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    told = [line for line in run.stderr.splitlines() if "ModelWarning" in line]
    assert told == ["ModelWarning: ck.pt is a training checkpoint: its state dict is entry "
                    "'model' (entries ['model', 'step']); pass key= (diffract analyze --key) "
                    "to read another"], run.stderr
    assert "warn(" not in run.stderr and ".py:" not in run.stderr, run.stderr
