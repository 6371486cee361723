"""kernel-fun's self-check on a lent GPU, first thing: the toolchain the gate reads, the
known-bad table's verdict for it, and the self-check's verdict and cost per kind for
both ops at a Kimi layer's shapes (``warmup`` runs the check and raises when it fails).

    KERNEL_FUN_SELF_CHECK_CACHE=$OUT/verdicts.json python benchmarks/gpu_self_check.py
"""

from __future__ import annotations

import json
import sys

import torch

from kernel_fun import _check, _toolchain
from kernel_fun.cconv import warmup as conv_warmup
from kernel_fun.kda import warmup as kda_warmup


def main() -> int:
    device = torch.device("cuda")
    toolchain = _toolchain.current(device)
    print("# toolchain:", toolchain.describe())
    for op in ("causal_conv1d", "chunk_kda"):
        print(f"# known-bad table, {op}:", _toolchain.refusal(op, toolchain) or "not listed")
    failed = 0
    cases = [("causal_conv1d", lambda: conv_warmup(B=2, T=2048, D=(2048,), W=4)),
             ("chunk_kda", lambda: kda_warmup(B=1, T=2048, H=16, K=128, V=128, options=[
                 {}, {"use_gate_in_kernel": True, "use_qk_l2norm_in_kernel": True,
                      "use_beta_sigmoid_in_kernel": True, "safe_gate": True,
                      "lower_bound": -5.0}]))]
    for name, run in cases:
        before = len(_check.seconds)
        try:
            seconds = run()
            verdict = "passed"
        except RuntimeError as exc:
            seconds, verdict, failed = float("nan"), f"FAILED: {exc}", failed + 1
        checks = _check.seconds[before:]
        print(json.dumps({"op": name, "verdict": verdict, "warmup_s": seconds,
                          "checks_s": [round(s, 3) for s in checks]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
