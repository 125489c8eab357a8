"""Triton kernels, one folder per op. Each folder holds:

- ``naive.py``: the plain-PyTorch reference (the definition the kernel is tested against);
- ``kernel.py``: the Triton kernel(s) and a launch function;
- ``op.py``: the public function, registered with ``torch.library.custom_op`` (plus a fake), so CUDA-graph
  capture and ``torch.compile`` see one opaque op;
- ``bench.py``: the op's entry in the benchmark registry (`hf_sparse_verify.kernels.bench_registry`).

Tests live in ``tests/kernels/``; on a machine without a GPU they run the Triton kernels under
``TRITON_INTERPRET=1`` at small odd shapes.
"""
