"""kernel-fun's interpreter tests under a second Triton: the set-up installs the newest
(3.9.0, which dropped tl.make_block_ptr and tl.advance) and ./dev test puts 3.8.0 (what
torch 2.14 pins) beside it; this runs the kernels' correctness tests again with 3.8.0
first on the path, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    os.environ.get("KERNEL_FUN_TEST_GPU") == "1",
    reason=("the interpreter tests under a second Triton are the CPU machine's; on "
            "a GPU the suite runs compiled"))
SECOND = "3.8.0"
#: The kernels against their float64 / fla references, fla's fixes, the toolchain table.
TESTS = [
    "tests/kernel_fun_gpu/test_cconv.py::TestAgainstReferences",
    "tests/kernel_fun_gpu/test_cconv_fla_fixes.py",
    "tests/kernel_fun_gpu/test_kda.py::TestAgainstFlaNaive::test_outputs_state_and_gradients",
    "tests/kernel_fun_gpu/test_kda.py::TestAgainstFlaNaive::test_gate_in_the_op[softplus]",
    "tests/kernel_fun_gpu/test_kda.py::TestAgainstFlaNaive::test_gate_in_the_op[lower-bound]",
    "tests/kernel_fun_gpu/test_toolchain.py",
]


def test_the_kernels_hold_under_the_second_triton():
    import triton

    if triton.__version__ == SECOND:
        pytest.skip(f"the set-up's Triton is {SECOND} itself")
    where = Path(sys.prefix) / f"triton-{SECOND}"
    if not (where / ".complete").exists():
        pytest.fail(f"Triton {SECOND} is not installed beside the set-up's at {where}: "
                    "`./dev test` installs it (or pip install --no-deps --target "
                    f"{where} triton=={SECOND}, then touch {where}/.complete)")
    env = dict(os.environ, TRITON_INTERPRET="1", KERNEL_FUN_INTERPRET="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(where), os.environ.get("PYTHONPATH"))
                                          if p))
    seen = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__)"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert seen.stdout.strip() == SECOND, seen.stdout + seen.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout.splitlines()[-1]
