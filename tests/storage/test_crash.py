"""Crash safety: SIGKILL an apply on a ``local`` store at many points; after each kill the
store opens, holds only complete values equal to an uninterrupted run's, and applying
again finishes with identical results."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffract_storage_local")
if not hasattr(signal, "SIGKILL"):  # pragma: no cover
    pytest.skip("needs SIGKILL", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
# Multi-output kernels first: a non-atomic commit shows as half a kernel's outputs.
FIELDS = ("t_slow", "weights_svals", "frob_norm", "param_norm", "esd", "stable_rank", "numel")

CHILD = textwrap.dedent("""
    import sys
    from diffract import Session
    from tests.resources.kernels import slow_pair

    path, model = sys.argv[1], sys.argv[2]
    config = {"apply": {"chunk_seconds": 0.05}, "parallel": {"executor": "sequential"}}
    with Session(profile="local", path=path, config=config) as s:
        s.compute.kernel(name="t_slow", produce_fields=("t_slow", "t_slow_max"))(slow_pair)
        s.compute.configure_kernel("t_slow", delay=0.005)
        if "m" not in s.model_ids:
            s.models.add(model, model_id="m")
        print("started", flush=True)
        s.compute.apply(*sys.argv[3:], progress=lambda p: print("chunk", p.kernel, flush=True))
        print("done", flush=True)
""")


def _run(path: Path, model: Path, kill_after: tuple[int, float] | None) -> bool:
    """Run the child. With ``kill_after = (n, seconds)``, SIGKILL it that many seconds
    after its n-th committed chunk (so kills land in a kernel's work or in the following
    commit, in every step of the plan). True when it finished on its own."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(model), *FIELDS],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started", child.stderr.read()
    if kill_after is not None:
        chunks, seconds = kill_after
        for _ in range(chunks):
            if not child.stdout.readline().startswith("chunk"):
                break
        else:
            time.sleep(seconds)
            child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=300)
    if kill_after is None:
        assert child.returncode == 0 and out.strip().endswith("done"), err
    return child.returncode == 0


def _contents(path: Path):
    """Every stored value and note of a store, opened here (the child is dead)."""
    from diffract_storage_local import LocalStore

    store = LocalStore(path)
    try:
        values = {}
        for field in store.fields("m"):
            for param in store.present("m", field):
                values[(field, param)] = np.array(store.read("m", param, field))
        aggregates = {name: store.read_aggregate(name) for name in store.aggregate_names()}
        notes = {(n.kernel, n.unit): n.kind for n in store.notes()}
        referenced = {str(p) for p in (path / "arrays").rglob("*.np*")}
    finally:
        store.close()
    return values, aggregates, notes, referenced


@pytest.mark.slow
def test_sigkill_at_twenty_points_loses_nothing_committed(tmp_path):
    """24 kills at seeded random moments of one long apply (each just after a committed
    chunk: inside the next chunk's work or its commit): each time the store opens with
    only complete values equal to the reference; the last run completes it."""
    rng = np.random.default_rng(8)
    arrays = {f"p{i:03d}": rng.standard_normal((48, 40)) for i in range(200)}
    arrays.update({f"wide{i}": rng.standard_normal((200, 150)) for i in range(4)})
    arrays["bias"] = rng.standard_normal(16)
    model = tmp_path / "model.npz"
    np.savez(model, **arrays)

    _run(tmp_path / "reference", model, None)
    ref_values, ref_aggregates, ref_notes, _ = _contents(tmp_path / "reference")
    assert len(ref_values) > 700 and "failed" not in ref_notes.values()

    path = tmp_path / "crashed"
    kills = 0
    finished = False
    while not finished and kills < 24:
        finished = _run(path, model, (int(rng.integers(1, 6)), float(rng.uniform(0.0, 0.06))))
        if finished:
            break
        kills += 1
        values, aggregates, notes, _ = _contents(path)
        for key, value in values.items():  # complete and equal: nothing half-written
            assert np.array_equal(value, ref_values[key], equal_nan=True), key
        for name, value in aggregates.items():
            assert np.array_equal(value, ref_aggregates[name], equal_nan=True), name
        assert "failed" not in notes.values()
        for (field, param) in values:  # every output of a multi-output kernel or none
            if field == "weights_svals":
                assert ("weights_lsvs", param) in values and ("weights_rsvs", param) in values
            if field in ("t_slow", "t_slow_max"):
                assert ("t_slow", param) in values and ("t_slow_max", param) in values
    assert kills == 24, f"only {kills} kills before the apply finished: give it more work"
    _run(path, model, None)
    values, aggregates, notes, files = _contents(path)
    assert values.keys() == ref_values.keys() and aggregates.keys() == ref_aggregates.keys()
    for key, value in values.items():
        assert np.array_equal(value, ref_values[key], equal_nan=True), key
    assert notes == ref_notes
    _, _, _, files_after_clean = _contents(path)  # opened alone: unreferenced files removed
    assert len(files_after_clean) == sum(1 for p in (path / "arrays").rglob("*") if p.is_file())
    assert os.path.getsize(path / "store.sqlite") > 0
