#!/usr/bin/env bash
# Issue 13 device run (fused MoE experts). Usage on the device machine (repo root), results in $OUT:
#   bash benchmarks/device/issue13.sh tests layer stepab   # ~6-8 min: correctness, layer vs floor, step A/B
#   bash benchmarks/device/issue13.sh sweep profile        # tile sweep, where a captured step's time goes
#   bash benchmarks/device/issue13.sh kernels step         # registry kernel bench; the issue-3 step bench
# The code-moe test reads the fixtures at .carry/shared/models (skipped with a message where absent).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HF_SPARSE_VERIFY_SHARED=$PWD/.carry/shared
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
moe() { python benchmarks/bench_moe_experts.py --sections "$1" --json "$OUT/issue13_$1.json" 2>&1 | grep -v "it/s"; }
for stage in "$@"; do
  echo "=== $stage $(date +%T)"
  case $stage in
    # compiled kernels vs reference, capture/replay, float32 greedy equality on 4 families + code-moe, then the
    # existing MoE graph-path tests (now on the fused experts)
    tests) python -m pytest tests/test_moe_gpu.py tests/test_moe_experts.py -q -p no:cacheprovider -rs 2>&1 | tail -25
           python -m pytest tests/test_kernel_path.py -q -p no:cacheprovider -k "qwen3_moe" 2>&1 | tail -5 ;;
    # one Qwen3-30B-A3B experts layer, T = 1, 8, 16: ours / batched_mm / grouped_mm vs unique experts' bytes / 4.3 TB/s
    layer) moe layer ;;
    # tile sweep of the fused op (prints the best TILES for kernel.py)
    sweep) moe sweep | grep -v '^{"tiles"' ;;
    # qwen3-30b-a3b step, 1K context, widths 1..16: fused experts vs batched_mm side by side, against the floors
    stepab) moe step ;;
    # CUDA kernels of the captured decode and 8-token steps
    profile) moe profile ;;
    kernels) python benchmarks/bench_kernels.py --ops fused_experts --json "$OUT/issue13_kernels.json" 2>&1 | grep -v "it/s" | cut -c1-220 ;;
    # the step bench as issue 3 ran it (fused experts are now the CUDA default), with transformers alongside
    step) python -m hf_sparse_verify.cli bench step --shape qwen3-30b-a3b --context 1024 --new-tokens 1,2,4,8,16 --json "$OUT/issue13_step_moe.json" 2>&1 | grep -v "it/s" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
