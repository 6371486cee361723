"""Compile every chunk_kda Triton kernel for a GPU architecture on a machine without a GPU,
and print registers, spills and shared memory per kernel.

    .venv/bin/python tools/compile_kda.py [--arch 90] [--K 128] [--V 256] [--dtype bf16]

Triton's interpreter (what the tests use) never lowers a kernel to PTX, so a kernel can
pass every CPU test and still fail to compile, or spill registers, on the device. This
runs Triton's real compiler (and the ptxas that ships with it) for sm_<arch> with the
production shape's constants, so both show up before a GPU is lent.
"""

from __future__ import annotations

import argparse
import os
import sys

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("unset TRITON_INTERPRET: this compiles the real kernels")


#: Shared memory one block may use (KB), by architecture.
SMEM_KB = {80: 163, 86: 99, 89: 99, 90: 227, 100: 227, 120: 99}


def _resources(cubin: bytes) -> tuple[str, str]:
    """Registers and spill bytes (stores) of a cubin, read by the cuobjdump Triton ships."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True,
                             text=True).stdout
    regs = re.search(r"REG:(\d+)", out)
    spills = re.search(r"STACK:(\d+)", out)
    return (regs.group(1) if regs else "?"), (spills.group(1) if spills else "?")


def _signature(fn, constexprs: dict, dtype: str) -> dict[str, str]:
    """Triton's signature of a KDA kernel: pointers in the inputs' dtype for q, k, v, o, do
    and the operands the scans and the backward keep in it (the rest float32)."""
    in_io = {"q", "k", "v", "o", "do", "w", "u", "qg", "kd", "h", "dlt", "dh", "dd"}
    scalars = {"T": "i32", "NT": "i32", "scale": "fp32", "lower_bound": "fp32"}
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in scalars:
            sig[name] = scalars[name]
        else:
            sig[name] = ("*" + dtype) if name in in_io else "*fp32"
    return sig


def variants(K: int, V: int, H: int, HV: int, dtype: str, toolchain=None) -> list[tuple]:
    """Every KDA kernel variant the op launches: ``(fn, signature, constexprs, options)``,
    with LAUNCH's settings for K and V (steered as the gate would under ``toolchain``)."""
    from kernel_fun.ops.kda import _triton as kt

    gate = dict(GATE=True, HAS_A=True, HAS_BIAS=True, LOWER=False)
    every = dict(H=H, HV=HV, K=K, V=V, BT=kt.BT, BC=kt.BC, NK=2)
    kinds = [
        (kt._gate_cumsum_kernel, gate),
        (kt._intra_fwd_kernel, {}),
        (kt._solve_fwd_kernel, {}),
        (kt._scan_fwd_kernel, dict(HAS_H0=True, STORE_FINAL=True, OUTPUT=True, SAVE=False)),
        (kt._scan_fwd_kernel, dict(HAS_H0=True, STORE_FINAL=False, OUTPUT=False, SAVE=True)),
        (kt._scan_fwd_kernel, dict(HAS_H0=True, STORE_FINAL=True, OUTPUT=True, SAVE=True)),
        (kt._scan_bwd_kernel, dict(HAS_DHT=True, HAS_H0=True)),
        (kt._dv_bwd_kernel, {}),
        (kt._dk_bwd_kernel, {}),
        (kt._dm_bwd_kernel, {}),
        (kt._intra_bwd_kernel, {}),
        (kt._gate_bwd_kernel, gate),
    ]
    out = []
    for kernel, flags in kinds:
        cfg = kt.launch_settings(kernel, K, V, toolchain)
        options = {"num_warps": cfg.pop("num_warps", 4)}
        if "num_stages" in cfg:
            options["num_stages"] = cfg.pop("num_stages")
        constexprs = {n: v for n, v in every.items() if n in kernel.arg_names}
        constexprs.update(cfg, **flags)
        out.append((kernel, _signature(kernel, constexprs, dtype), constexprs, options))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--K", type=int, default=128)
    parser.add_argument("--V", type=int, default=256)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--HV", type=int, default=16)
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--set", action="append", default=[], metavar="KERNEL:KEY=VAL,...",
                        help="try other settings, e.g. _scan_fwd_kernel:num_warps=8,BV=32")
    args = parser.parse_args()

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    K, V, H, HV = args.K, args.V, args.H, args.HV
    target = GPUTarget("cuda", args.arch, 32)
    print(f"# sm_{args.arch}, K={K} V={V} H={H} HV={HV}, q/k/v {args.dtype}; "
          f"triton {triton.__version__}")
    print(f"{'kernel':<24} {'variant':<28} {'regs':>5} {'stack':>6} {'smem KB':>8} {'warps':>5}")
    failed = 0
    for fn, sig, constexprs, options in variants(K, V, H, HV, args.dtype):
        for item in args.set:
            name, _, pairs = item.partition(":")
            if name == fn.__name__:
                for pair in pairs.split(","):
                    key, _, val = pair.partition("=")
                    if key in ("num_warps", "num_stages"):
                        options[key] = int(val)
                    else:
                        constexprs[key] = int(val)
        warps = options["num_warps"]
        variant = ",".join(k for k, v in constexprs.items() if v is True) or "-"
        try:
            compiled = triton.compile(ASTSource(fn, sig, constexprs), target=target,
                                      options=options)
            regs, spills = _resources(compiled.asm["cubin"])
            smem = compiled.metadata.shared / 1024
            over = smem > SMEM_KB.get(args.arch, 227)
            failed += over
            print(f"{fn.__name__:<24} {variant[:28]:<28} {regs:>5} {spills:>6} "
                  f"{smem:>8.1f} {warps:>5}" + ("  MORE SHARED MEMORY THAN A BLOCK GETS" * over))
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"{fn.__name__:<24} {variant[:28]:<28} FAILED: {str(exc).splitlines()[0][:200]}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
