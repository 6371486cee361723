#!/usr/bin/env bash
# The GPU check of kernel-fun, as one script for a lent CUDA machine (not yet run: no GPU
# has been lent to this project so far): both ops' tests on the device (bf16 included),
# then both ops' benchmarks against fla, then the spectral pack's GPU routes. Run from the repository root; results go to
# $OUT (or ./gpu-results). Needs torch with CUDA, triton, fla-core, pytest, attrs, pluggy
# and numpy importable (carry wheels when the machine has no network).
set -uo pipefail
OUT=${OUT:-./gpu-results}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e diffract_core -e kernel_fun_gpu 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
# Correctness on the device: fp16, fp32 and bf16 against fla and a PyTorch reference.
KERNEL_FUN_TEST_GPU=1 python3 -m pytest -q -p no:cacheprovider tests/kernel_fun_gpu 2>&1 | tee "$OUT/tests.log"
# Speed against fla (and kernel-fun 0.2.0 when its wheel sits in .whl/kf020).
kf=""; [ -d .whl/kf020 ] && kf="--kf020 .whl/kf020"
python3 benchmarks/bench_cconv.py $kf 2>&1 | tee "$OUT/bench.log"
# chunk_kda against fla: totals at the production shape and fla-style shapes, then GPU
# time per kernel of one forward+backward (which stage to tune or hand to fla).
timeout 420 python3 benchmarks/bench_kda.py $kf 2>&1 | tee "$OUT/bench_kda.log"
# The spectral pack's GPU routes (esd, svals, svd, esd_rand batched on the device) against
# its numpy path: agreement and times (needs scipy and threadpoolctl too).
python3 -m pip install -q --no-deps --no-build-isolation -e diffract_kernels_spectral 2>&1 | tail -2
python3 benchmarks/gpu_spectral_check.py --device cuda 2>&1 | tee "$OUT/spectral.log"
