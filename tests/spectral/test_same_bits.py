"""The same value whatever path computed it (issue 26 item 2): one model's spectra, fits,
norms and bootstrap p-values have identical bits through the sequential executor, the
thread pool, the process pool, the batched path (many units per chunk) and the
unbatched one (one unit per chunk), after ``import powerlaw``, and in a run killed with
SIGKILL and resumed. Each run is a fresh process, as a user's would be: on main the
first apply of a process, a resumed run and ``import powerlaw`` each changed bits."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

FIELDS = ("esd", "weights_svals", "pl_alpha", "pl_xmin", "pl_ks_distance", "stable_rank", "log_norm",
          "matrix_entropy", "spectral_norm", "exp_lambda", "pl_pvalue", "hard_rank")

_SCRIPT = r"""
import json, sys


def main():  # under the guard below: the process pool's workers can import this file
    config = json.loads(sys.argv[3])
    if config.pop("import_powerlaw", False):
        import powerlaw  # noqa: F401  (before anything of ours)
    import numpy as np
    from diffract import Session

    model, out = sys.argv[1], sys.argv[2]
    fields = config.pop("fields")
    store = config.pop("store", None)
    opts = {"profile": "local", "path": store} if store else {}
    with Session(config=config, **opts) as s:
        if "m" not in s.models:
            s.models.add(model, model_id="m")
        s.compute.configure_kernel("pl_pvalue", n_replicates=12, seed=7)
        s.compute.apply(*fields)
        rows = s.results.export_metrics(*fields, include_arrays=True)["m"]
    arrays = {f"{p}|{f}": np.asarray(v) for p, row in rows.items() for f, v in row.items()}
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
"""


def _model(path: Path) -> None:
    """Ten matrices (same shapes for the batch path, a conv kernel, wide ones, and two
    large enough that BLAS splits their products over threads)."""
    rng = np.random.default_rng(3)
    out = {f"layer{i}.weight": (rng.standard_t(4, (160, 120)) / 12).astype(np.float32)
           for i in range(4)}
    out.update({f"big{i}.weight": (rng.standard_t(4, (512, 384)) / 20).astype(np.float32)
                for i in range(2)})
    out.update({f"wide{i}.weight": (rng.standard_normal((96, 260)) / 16).astype(np.float32)
                for i in range(3)})
    out["conv.weight"] = rng.standard_normal((64, 16, 3, 3)).astype(np.float32)
    np.savez(path, **out)


def _config(**extra) -> dict:
    base = {"fields": list(FIELDS), "parallel": {"executor": "sequential"}}
    for key, value in extra.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update(value)
        else:
            base[key] = value
    return base


def _start(tmp_path: Path, name: str, config: dict) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    out = tmp_path / f"{name}.npz"
    env = {k: v for k, v in os.environ.items() if k not in ("DIFFRACT_CONFIG",)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "m.npz"), str(out),
                             json.dumps(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, out


def _run(tmp_path: Path, name: str, config: dict) -> dict[str, np.ndarray]:
    proc, out = _start(tmp_path, name, config)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "ExecutorWarning" not in err, err[-2000:]  # the pool, where asked, is used
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _differences(a: dict, b: dict) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if a[k].shape != b[k].shape
            or a[k].tobytes() != b[k].tobytes()]  # bits, NaN included


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("same-bits")
    _model(tmp_path / "m.npz")
    pool = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                         "process_pool": {"max_workers": 2}}}
    out = {
        "sequential": _run(tmp_path, "sequential", _config()),
        "threads": _run(tmp_path, "threads", _config(parallel={"executor": "threads",
                                                               "pool_min_seconds": 0})),
        "processes": _run(tmp_path, "processes", _config(**pool)),
        "one unit per chunk": _run(tmp_path, "unbatched",
                                   _config(apply={"chunk_seconds": 1e-6})),
        "import powerlaw first": _run(tmp_path, "powerlaw", _config(import_powerlaw=True)),
    }
    # killed with SIGKILL once something is committed, then resumed by a new process
    store = tmp_path / "store"
    config = _config(store=str(store), apply={"chunk_seconds": 1e-6})
    proc, _ = _start(tmp_path, "killed", config)
    deadline = time.monotonic() + 300

    def committed() -> int:
        try:
            with sqlite3.connect(f"file:{store / 'store.sqlite'}?mode=ro", uri=True,
                                 timeout=1) as db:
                return db.execute("SELECT count(*) FROM field_values").fetchone()[0]
        except sqlite3.Error:
            return 0

    while time.monotonic() < deadline and committed() < 3 and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    out["killed and resumed"] = _run(tmp_path, "resumed", config)
    return out


@pytest.mark.parametrize("path", ["threads", "processes", "one unit per chunk",
                                  "import powerlaw first", "killed and resumed"])
def test_every_path_gives_the_sequential_bits(runs, path):
    reference = runs["sequential"]
    assert len(reference) == 10 * len(FIELDS)
    assert _differences(runs[path], reference) == []


def test_the_first_apply_of_a_process_equals_a_later_one(tmp_path):
    """Within one process: the first apply (BLAS and the pools starting) and a later
    one, in a second session, give the same bits."""
    _model(tmp_path / "m.npz")
    script = tmp_path / "twice.py"
    script.write_text(
        "import sys, numpy as np\n"
        "from diffract import Session\n"
        f"fields = {list(FIELDS)!r}\n"
        "runs = []\n"
        "for _ in range(2):\n"
        "    with Session() as s:\n"
        "        s.models.add(sys.argv[1], model_id='m')\n"
        "        s.compute.configure_kernel('pl_pvalue', n_replicates=12, seed=7)\n"
        "        s.compute.apply(*fields)\n"
        "        rows = s.results.export_metrics(*fields, include_arrays=True)['m']\n"
        "        runs.append({(p, f): np.asarray(v).tobytes() for p, r in rows.items()\n"
        "                     for f, v in r.items()})\n"
        "print('SAME' if runs[0] == runs[1] else 'DIFFERENT', len(runs[0]))\n")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "m.npz")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["SAME", str(10 * len(FIELDS))]


@pytest.fixture(scope="module")
def float32_runs(tmp_path_factory):
    """The opt-in float32 spectra, whose Gram product and eigensolver give other bits
    on one BLAS thread than on two: the pin must hold on every path (issue 36)."""
    tmp_path = tmp_path_factory.mktemp("same-bits-f32")
    _model(tmp_path / "m.npz")
    f32 = {"kernels": {"esd": {"precision": "float32"}}}
    pool = {"parallel": {"executor": "processes", "pool_min_seconds": 0,
                         "process_pool": {"max_workers": 2}}}
    return {
        "sequential": _run(tmp_path, "sequential", _config(**f32)),
        "threads": _run(tmp_path, "threads", _config(**f32, parallel={
            "executor": "threads", "pool_min_seconds": 0})),
        "processes": _run(tmp_path, "processes", _config(**f32, **pool)),
        "one unit per chunk": _run(tmp_path, "unbatched", _config(
            **f32, apply={"chunk_seconds": 1e-6})),
    }


@pytest.mark.parametrize("path", ["threads", "processes", "one unit per chunk"])
def test_float32_spectra_give_the_same_bits_on_every_path(float32_runs, runs, path):
    reference = float32_runs["sequential"]
    assert _differences(float32_runs[path], reference) == []
    # and they are float32's own: not the float64 default's bits
    assert _differences(reference, runs["sequential"]) != []
