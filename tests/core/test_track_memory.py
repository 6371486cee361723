"""``diffract track``'s processes hand freed decomposition buffers back to the system
(issue 62 item 4): glibc's allocator otherwise keeps every SVD and Gram buffer of a few
MiB it has freed (its mmap threshold rises to the first one's size), and a track of
small checkpoints peaked far above what it held."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="glibc's allocator and /proc/self/status")

PROBE = """
import os, sys
import diffract_report._allocator as allocator
if sys.argv[1] == "before":  # the command as it was: the allocator left as it starts
    allocator.return_freed_buffers = lambda: False
from diffract.cli import main
code = main(["track", *sys.argv[3:], "--store", sys.argv[2], "-q", "--executor",
             "sequential"])
peak = next(int(line.split()[1]) for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print(code, peak // 1024, os.environ.get("MALLOC_MMAP_THRESHOLD_"))
"""


def _checkpoints(folder):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    weights = {f"l{i}.weight": rng.standard_normal((768, 768)).astype(np.float32)
               for i in range(4)}
    paths = []
    for step in (1, 2, 3):
        path = folder / f"step-{step}"
        path.mkdir()
        save_file(weights, str(path / "model.safetensors"))
        paths.append(str(path))
        weights = {k: v + np.float32(0.01) * rng.standard_normal(v.shape, np.float32)
                   for k, v in weights.items()}
    return paths


def _track(mode, store, paths, env):
    out = subprocess.run([sys.executable, "-c", PROBE, mode, str(store), *paths],
                         capture_output=True, text=True, env=env, check=True)
    code, peak, threshold = out.stdout.split()[-3:]
    assert code == "0", out.stdout + out.stderr
    return int(peak), threshold


def test_a_small_runs_peak_drops_by_the_freed_buffers_the_allocator_kept(tmp_path):
    """Three checkpoints of four 768 x 768 matrices, tracked alike in fresh processes:
    with the threshold fixed, the peak is lower by the freed float64 buffers (about 40
    MiB here: every SVD's U, V^T and workspace of 4.5 MiB and more), and the workers the
    command would start inherit the setting."""
    paths = _checkpoints(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    before, unset = _track("before", tmp_path / "a", paths, env)
    after, inherited = _track("after", tmp_path / "b", paths, env)
    assert unset == "None" and inherited == "1048576"
    assert after < before - 15, (before, after)


def test_a_threshold_the_user_set_is_left_alone(tmp_path):
    paths = _checkpoints(tmp_path)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    _, threshold = _track("after", tmp_path / "a", paths, env)
    assert threshold == "65536"
