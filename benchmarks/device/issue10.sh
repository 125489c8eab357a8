#!/usr/bin/env bash
# Issue 10 device run (the step spine). Usage on the device machine (repo root), results in $OUT:
#   bash benchmarks/device/issue10.sh tests acceptance "speed 16x16384"
#   bash benchmarks/device/issue10.sh "speed 1x16384 4x32768" "speed 4x65536" "transformers 1x16384 16x16384"
# Fixtures are read from .carry/shared/models (code-target, prompts_long.jsonl). The parts of benchmarks/results/h200_long.json
# are kept in benchmarks/results/parts_h200_long/; assemble them with
#   python benchmarks/bench_long.py assemble benchmarks/results/parts_h200_long/*.json --vegas-variant vegas_r875 \
#     --out benchmarks/results/h200_long.json
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for stage in "$@"; do
  set -- $stage
  name=$1; shift
  tag=$(echo "$*" | tr ' ' '_')
  echo "=== $name $* $(date +%T)"
  case $name in
    tests) python -m pytest tests/test_spine_gpu.py tests/test_kernel_path.py tests/kernels/test_kernel_decode_attention.py \
             tests/kernels/test_kernel_token_sparse.py tests/kernels/test_kernel_topk_slots.py -q -p no:cacheprovider -x 2>&1 | tail -25 ;;
    kbench) python benchmarks/bench_kernels.py --ops "$@" --json "$OUT/kernels_$tag.json" 2>&1 | grep -v "it/s\]$" | tail -20 ;;
    acceptance) python benchmarks/bench_long.py acceptance --models .carry/shared/models --out "$OUT/long_acceptance.json" "$@" 2>&1 \
             | grep -v "it/s\]$" | grep -v "^Loading" | tail -40 ;;
    speed) python benchmarks/bench_long.py speed --cases "$@" --out "$OUT/long_speed_$tag.json" 2>&1 | grep -v "it/s\]$" | tail -60 ;;
    transformers) python benchmarks/bench_long.py transformers --cases "$@" --out "$OUT/long_hf_$tag.json" 2>&1 | grep -v "it/s\]$" | tail -20 ;;
    synctest) python -m pytest tests/test_spine_gpu.py -q -p no:cacheprovider -k synchronisation 2>&1 | grep -E "^E  .*AssertionError|passed|failed" | cut -c1-900 ;;
    stepdiag) python -m hf_sparse_verify.cli bench step --shape llama-3.1-8b --context 16384 --batch 16 --new-tokens 1,5,7,9 \
             --vegas-scores --json "$OUT/step_diag.json" 2>&1 | grep -v "it/s" | tail -12 ;;
    syncsites) python benchmarks/device/sync_sites.py "$@" 2>&1 | grep -v "it/s\]$" | tail -80 ;;
    kerneltests) python -m pytest tests/kernels/test_kernel_decode_attention.py -q -p no:cacheprovider 2>&1 | tail -4 ;;
    memtest) python -m pytest tests/test_spine_gpu.py -q -p no:cacheprovider -k "memory or graphs_kept" 2>&1 | tail -6 ;;
    e2efix) python benchmarks/bench_generate.py --suite fixtures --shared .carry/shared --fixture-lengths "$@" \
             --json "$OUT/h200_e2e_fixtures.json" 2>&1 | grep -v "it/s\]$" | tail -8 ;;
    *) echo "unknown stage $name" ;;
  esac
done
