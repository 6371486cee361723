"""Every kernel-fun kernel, in every configuration the gate can pick, compiles for sm_90
and sm_100 with Triton's real compiler and bundled ptxas on this CPU machine
(tools/compile_kernels.py): none fails, overflows shared memory or spills past the budget,
and docs/kernel_fun.md's table has a row for each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    os.environ.get("KERNEL_FUN_TEST_GPU") == "1",
    reason=("compiling ahead of time is for machines without a GPU; on one the "
            "suite compiles and runs every kernel"))


def test_every_kernel_and_configuration_compiles_for_hopper_and_blackwell(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "KERNEL_FUN_INTERPRET")}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    tool = ROOT / "tools" / "compile_kernels.py"
    runs = {arch: subprocess.Popen(  # one process an architecture, side by side
        [sys.executable, str(tool), "--arch", str(arch), "--json", str(tmp_path / f"{arch}.json")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for arch in (90, 100)}
    outputs = {arch: run.communicate(timeout=1200)[0] for arch, run in runs.items()}
    for arch, run in runs.items():
        assert run.returncode == 0, outputs[arch][-4000:]
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        env_now = os.environ.pop("TRITON_INTERPRET", None)  # the tool's module refuses it
        import compile_kernels
    finally:
        if env_now is not None:
            os.environ["TRITON_INTERPRET"] = env_now
        sys.path.remove(str(ROOT / "tools"))
    docs = (ROOT / "docs" / "kernel_fun.md").read_text()
    for arch in (90, 100):
        result = json.loads((tmp_path / f"{arch}.json").read_text())
        assert not compile_kernels.problems(result, compile_kernels.MAX_SPILL)
        kernels = {row[1] for row in result["rows"]}
        assert {"_fwd_kernel", "_bwd_kernel", "_scan_fwd_kernel", "_dk_bwd_kernel"} <= kernels
        assert sum(row[1] == "_scan_fwd_kernel" for row in result["rows"]) == 6
        for _, kernel, label, *_ in result["rows"]:
            assert f"| `{kernel}` | {label} |" in docs, (kernel, label)
