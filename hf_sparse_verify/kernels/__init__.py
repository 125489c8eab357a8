"""Triton kernels (one folder per op, each with a plain-PyTorch reference). The engine currently runs the
``reference`` attention backend of `hf_sparse_verify.attention`; kernels register further backends there."""
