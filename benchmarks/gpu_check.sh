#!/usr/bin/env bash
# The GPU check, as one script for a lent CUDA machine (not yet run: no GPU has been lent
# to this project so far). Run from the repository root; results go to $OUT (or
# ./gpu-results), one log per step, written as the step runs. Needs torch with CUDA,
# triton, fla-core, pytest, attrs, pluggy and numpy importable (carry wheels when the
# machine has no network); the spectral step needs scipy and threadpoolctl too.
#
#   benchmarks/gpu_check.sh                 # every step, in this order:
#   benchmarks/gpu_check.sh tests bench-kda # or only the steps named
#
#   selfcheck    the toolchain kernel-fun's gate reads, the known-bad table's verdict, and
#                the self-check's verdicts and cost at a Kimi layer's shapes     <= 120 s
#   tests        kernel-fun's tests on the device (both ops; fp16, fp32 and bf16, bf16
#                against fla's own kernels too)                           <= 240 s
#   bench-kda    chunk_kda against fla: totals, then GPU time per kernel   <= 300 s
#   bench-cconv  causal_conv1d against fla (and kernel-fun 0.2.0)          <= 120 s
#   spectral     the spectral pack's GPU routes against its numpy path      <= 120 s
#   training     diffractml-training on the device: its test (values against the saved
#                checkpoint on the CPU), then bench_training on a 0.94 B bfloat16 model
#                at the default cadence (loop held, cost per point, overhead)  <= 300 s
#
# One device command may run 10 minutes and a session has about 15 minutes of device
# time, start-up included: run "selfcheck tests bench-kda" first, then the rest in a second call.
set -uo pipefail
OUT=${OUT:-./gpu-results}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(selfcheck tests bench-kda bench-cconv spectral training)
python3 -m pip install -q --no-deps --no-build-isolation -e diffract_core -e kernel_fun_gpu 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
kf=""; [ -d .whl/kf020 ] && kf="--kf020 .whl/kf020"
export TRITON_DEFAULT_FP_FUSION=1
for step in "${steps[@]}"; do
  start=$(date +%s)
  case "$step" in
    selfcheck)
      KERNEL_FUN_SELF_CHECK_CACHE="$OUT/verdicts.json" timeout 120 python3 \
        benchmarks/gpu_self_check.py 2>&1 | tee "$OUT/selfcheck.log" ;;
    tests)
      KERNEL_FUN_TEST_GPU=1 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernel_fun_gpu \
        2>&1 | tee "$OUT/tests.log" ;;
    bench-kda)
      timeout 300 python3 benchmarks/bench_kda.py $kf 2>&1 | tee "$OUT/bench_kda.log" ;;
    bench-cconv)
      timeout 120 python3 benchmarks/bench_cconv.py $kf 2>&1 | tee "$OUT/bench.log" ;;
    spectral)
      python3 -m pip install -q --no-deps --no-build-isolation -e diffract_kernels_spectral 2>&1 | tail -2
      timeout 120 python3 benchmarks/gpu_spectral_check.py --device cuda 2>&1 | tee "$OUT/spectral.log" ;;
    training)
      python3 -m pip install -q --no-deps --no-build-isolation -e diffract_kernels_spectral \
        -e plugins/diffract_training -e plugins/diffract_storage_local 2>&1 | tail -2
      timeout 60 python3 -m pytest -q -p no:cacheprovider tests/training/test_gpu.py \
        2>&1 | tee "$OUT/training_test.log"
      timeout 270 python3 benchmarks/bench_training.py --size 1b --device cuda --cadences 200 \
        --steps 600 --kinds none,monitor,inline 2>&1 | tee "$OUT/bench_training.log" ;;
    *) echo "unknown step $step (selfcheck, tests, bench-kda, bench-cconv, spectral, training)"; exit 2 ;;
  esac
  echo "# step $step: $(( $(date +%s) - start )) s" | tee -a "$OUT/steps.log"
done
