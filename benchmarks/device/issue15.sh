#!/usr/bin/env bash
# Issue 15 device run on a multi-GPU kind (nvidia-h200-x2 / -x4): device maps and tensor parallelism.
# Usage on the device machine (repo root, .carry carried): bash benchmarks/device/issue15.sh STAGE... ; results in $OUT.
# Stages:
#   tests    tests/test_placement.py (two-GPU kernel and device-map equality, offload, TP on CPU)
#   map      8B shape, float32, balanced over every GPU: equality of all strategies      -> h200xN_device_map.json
#   mapfix   code-target fixture forced over two GPUs (max_memory): equality             -> h200xN_device_map_fixture.json
#   maptime  8B shape, bf16, balanced map, warm calls: tokens/s against plain generate   -> h200xN_device_map_bf16.json
#   tpeq     tp_plan="auto" under torchrun, float32, 8B and Qwen3-30B-A3B shapes (4 layers): equality
#   tpstep   tp_plan="auto", bf16, K = 0 and K = 4 verify step times at 1K beside plain transformers
#            (8B: all 32 layers; Qwen3-30B-A3B: $MOE_LAYERS layers, default 48)
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD HF_SPARSE_VERIFY_SHARED=$PWD/.carry/shared
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
N=$(python -c "import torch; print(torch.cuda.device_count())")
TAG=h200x$N
MOE_LAYERS=${MOE_LAYERS:-48}
tp() { torchrun --nproc-per-node "$N" benchmarks/check_tensor_parallel.py "$@"; }
for stage in "$@"; do
  echo "=== $stage $(date +%T) on $N GPUs"
  case $stage in
    tests) python -m pytest tests/test_placement.py -q -p no:cacheprovider 2>&1 | tail -15 ;;
    map) python benchmarks/check_device_map.py --json "$OUT/${TAG}_device_map.json" 2>&1 | grep -v "it/s" | tail -30 ;;
    mapfix) python benchmarks/check_device_map.py --model .carry/shared/models/code-target \
        --max-memory '{"0": "30MiB", "1": "8GiB"}' --json "$OUT/${TAG}_device_map_fixture.json" 2>&1 | tail -8 ;;
    maptime) python benchmarks/check_device_map.py --dtype bfloat16 --warm --new-tokens 64 \
        --json "$OUT/${TAG}_device_map_bf16.json" 2>&1 | grep -v "it/s" | tail -8 ;;
    tpeq)
      tp --shape llama-3.1-8b --layers 4 --json "$OUT/${TAG}_tensor_parallel_8b_equality.json" 2>&1 | grep -v "it/s" | tail -16
      tp --shape qwen3-30b-a3b --layers 4 --json "$OUT/${TAG}_tensor_parallel_moe_equality.json" 2>&1 | grep -v "it/s" | tail -16 ;;
    tpstep)
      tp --shape llama-3.1-8b --dtype bfloat16 --steps --no-equality --context 1024 \
        --json "$OUT/${TAG}_tensor_parallel_8b_steps.json" 2>&1 | grep -v "it/s" | tail -30
      tp --shape qwen3-30b-a3b --layers "$MOE_LAYERS" --dtype bfloat16 --steps --no-equality --context 1024 \
        --json "$OUT/${TAG}_tensor_parallel_moe_steps.json" 2>&1 | grep -v "it/s" | tail -30 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
