#!/usr/bin/env bash
# Issue 3 device run: GPU tests of the kernels and the graph path, then the step / kernel / e2e benchmarks.
# Usage on the device machine (repo root): bash benchmarks/device/issue3.sh STAGE... ; results go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HF_SPARSE_VERIFY_SHARED=$PWD/.carry/shared
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
hsv() { python -m hf_sparse_verify.cli "$@"; }
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    tests) python -m pytest tests/kernels tests/test_kernel_path.py -q -x -p no:cacheprovider 2>&1 | tail -25 ;;
    diag) python -m pytest tests/test_kernel_path.py -q -x -p no:cacheprovider -W error::RuntimeWarning -k "cuda_graph_path and draft_model" 2>&1 | grep -E "capturing|Error|passed|failed" | head -20 ;;
    lossless) python -m pytest tests/test_lossless.py -q -x -p no:cacheprovider -k "greedy_equals" 2>&1 | tail -5 ;;
    step8b) hsv bench step --shape llama-3.1-8b --context 1024,65536 --new-tokens 1,2,4,8,16 --vegas-scores --json "$OUT/h200_step_8b.json" 2>&1 | grep -v "it/s" ;;
    batch) hsv bench step --shape llama-3.1-8b --context 16384 --new-tokens 1,5 --batch 8,32 --repeats 5 --json "$OUT/h200_step_8b_batch.json" 2>&1 | grep -v "it/s" ;;
    moe) hsv bench step --shape qwen3-30b-a3b --context 1024 --new-tokens 1,2,4,8,16 --json "$OUT/h200_step_moe.json" 2>&1 | grep -v "it/s" ;;
    kernels) python benchmarks/bench_kernels.py ${KERNEL_OPS:+--ops $KERNEL_OPS} --json "$OUT/h200_kernels.json" 2>&1 | grep -v "it/s" | cut -c1-220 ;;
    e2e8b) python benchmarks/bench_generate.py --suite 8b --contexts-8b 1024 32768 --json "$OUT/h200_e2e_8b.json" 2>&1 | tail -12 ;;
    e2efix) python benchmarks/bench_generate.py --suite fixtures --shared .carry/shared --check-fp32 --json "$OUT/h200_e2e_fixtures.json" 2>&1 | tail -16 ;;
    vegas) python benchmarks/bench_vegas.py --suite speed --shared .carry/shared --speed-prompts 1 --big-contexts 32768 --json "$OUT/h200_vegas_speed_graphs.json" 2>&1 | grep -v "it/s" | tail -14 ;;
    profile) python benchmarks/diag_step_profile.py --context 1024 --new-tokens 1 --json "$OUT/h200_profile_1k.json" ;;
    profile64) python benchmarks/diag_step_profile.py --context 65536 --new-tokens 16 --json "$OUT/h200_profile_64k_16.json" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
