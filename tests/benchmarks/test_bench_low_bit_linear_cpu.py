"""`benchmarks/bench_low_bit_linear.py` off the GPU: the copies ``--cold`` cycles through, and the GemLite formats
built from our `quantize` (they dequantize, by GemLite's formula, to our weight). Where ``gemlite`` is installed and
there is no GPU, GemLite's own layers on our values under the Triton interpreter (in a subprocess: importing gemlite
without CUDA needs stand-ins for the CUDA queries and the Triton driver it makes at import)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import bench_low_bit_linear as bench  # noqa: E402
from benchmarks._timing import cycle_order  # noqa: E402
from hf_sparse_verify.kernels.low_bit import dequantize, quantize  # noqa: E402


def test_cold_copies_exceed_the_cold_bytes():
    assert bench.cold_copies(10**9, cold=False) == 1
    gate_up_bf16 = 14336 * 4096 * 2
    assert bench.cold_copies(gate_up_bf16, cold=True) == 3
    assert bench.cold_copies(10**9, cold=True) == 2  # at least two, even when one copy is over the bytes
    for copy_bytes in (14336 * 4096 // 2 + 4 * 14336 * 32, 1024 * 4096 // 2, 12345):
        n = bench.cold_copies(copy_bytes, cold=True)
        assert n * copy_bytes > bench.COLD_BYTES >= (n - 1) * copy_bytes


def test_cycle_order_reads_every_copy_equally_often():
    assert cycle_order(1, 20) == [0] * 20
    order = cycle_order(3, 20)
    assert order == [i % 3 for i in range(21)]
    assert cycle_order(128, 20) == list(range(128))


def test_replicate_clones_tensors_with_their_strides():
    w = torch.arange(12, dtype=torch.int8).view(3, 4)
    copies = bench.replicate((w.t(), 8), 3)
    assert len(copies) == 3 and copies[0][0] is not None
    assert copies[0][0].data_ptr() == w.data_ptr()
    ptrs = {c[0].data_ptr() for c in copies}
    assert len(ptrs) == 3
    for t, zero in copies:
        assert torch.equal(t, w.t()) and t.stride() == w.t().stride() and zero == 8


def test_gemlite_int4_inputs_dequantize_to_our_weight():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    values, scales = quantize(w, "int4", 128)
    W_q, gl_scales, zeros = bench.gemlite_int4_inputs(values, scales)
    assert W_q.dtype == torch.uint8 and int(W_q.min()) >= 0 and int(W_q.max()) <= 15 and zeros == 8
    assert gl_scales.dtype == torch.bfloat16 and gl_scales.shape == (64, 2)
    # exactly our weight with the scales GemLite stores (bf16); exactly ours with float32 scales
    ours = dequantize(values, gl_scales.float(), "int4")
    assert torch.equal(bench.gemlite_dequantize(W_q, gl_scales, zeros, 128), ours)
    W_q32, scales32, zeros32 = bench.gemlite_int4_inputs(values, scales, torch.float32)
    assert torch.equal(bench.gemlite_dequantize(W_q32, scales32, zeros32, 128), dequantize(values, scales, "int4"))
    # and a zeros tensor of 8 (HQQ's per-group form) is the same weight
    assert torch.equal(bench.gemlite_dequantize(W_q, gl_scales, torch.full_like(gl_scales, 8), 128), ours)


def test_gemlite_int8_inputs_dequantize_to_our_weight():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    values, scales = quantize(w, "int8")
    W_q, gl_scales = bench.gemlite_int8_inputs(values, scales)
    assert W_q.dtype == torch.int8 and gl_scales.dtype == torch.float32 and gl_scales.shape == (64, 1)
    assert torch.equal(bench.gemlite_dequantize(W_q, gl_scales, None, 256), dequantize(values, scales, "int8"))


#: GemLite's layers on our values, under the Triton interpreter. Float16: the interpreter (Triton 3.9) converts
#: integers to bfloat16 wrongly, in any kernel; bfloat16 is checked on the GPU, where the benchmark compares every
#: GemLite output with the reference before timing it. The interpreter has no bfloat16 atomics either.
_GEMLITE_ON_CPU = r"""
import sys, types
import torch, triton
from triton.backends.compiler import GPUTarget

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(name="cpu", multi_processor_count=4)


class _Utils:
    def get_device_properties(self, *a):
        return {"max_shared_mem": 232448, "multiprocessor_count": 4}


class _Driver:  # what gemlite asks the Triton driver at import and when autotuning (all settings tie)
    utils = _Utils()

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_benchmarker(self):
        return lambda fn, quantiles=None, **kw: [1.0] * len(quantiles) if quantiles else 1.0


triton.runtime.driver.set_active(_Driver())
sys.path.insert(0, sys.argv[1])
from benchmarks import bench_low_bit_linear as bench
from hf_sparse_verify.kernels.low_bit import quantize

gemlite = bench.import_gemlite()
gemlite.set_native_atomic_bfp16(False)
torch.manual_seed(0)
w = torch.randn(256, 512) * 0.02
for fmt, types_by_rows in (("int4", {1: "GEMV_REVSPLITK", 4: "GEMV_REVSPLITK"}),
                           ("int8", {1: "GEMV_SPLITK", 4: "GEMM_SPLITK"})):
    values, scales = quantize(w, fmt, 128)
    for rows, matmul_type in types_by_rows.items():
        x = torch.randn(rows, 512, dtype=torch.float16)
        expected = bench.expected_output(x, values, scales, fmt)
        method = bench._gemlite_method(gemlite, fmt, x, values, scales, 128, expected)
        assert method.extra["matmul_type"] == matmul_type, method.extra
        copies = bench.replicate(method.operands, 2)
        first, second = method.call(*copies[0]), method.call(*copies[1])
        err = bench.max_rel_err(first, expected)
        assert err < 5e-3, (fmt, rows, err)
        assert torch.equal(first, second), (fmt, rows)
        reads = 256 * 512 // 2 + 2 * 256 * 4 + 4 if fmt == "int4" else 256 * 512 + 4 * 256
        assert method.weight_bytes == reads, (fmt, method.weight_bytes)
        print(fmt, rows, method.extra["matmul_type"], f"{err:.2e}")
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gemlite") is None, reason="gemlite is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the benchmark checks GemLite itself")
def test_gemlite_layers_match_our_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_GEMLITE_ON_CPU), str(ROOT)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("\n") == 4, done.stdout
