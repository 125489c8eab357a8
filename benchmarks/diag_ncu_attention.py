"""One call each of the token-sparse draft attention and the 7-token split-KV verify (with and without Vegas scores)
at 4 x 64K (Llama-3.1-8B heads, bf16), three times, for Nsight Compute. Run on the device with PDL off:

    HF_SPARSE_VERIFY_PDL=0 ncu --kernel-name regex:"_token_sparse_fwd|_split_kernel|_weights_kernel" --launch-skip 6 \
        --launch-count 4 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section Occupancy --section LaunchStats python benchmarks/diag_ncu_attention.py

(`results/h200_ncu_4x64k_attention.txt`: the fourth to seventh matching launches: weights, split without scores,
token-sparse, split with scores).
"""

import math

import torch

from hf_sparse_verify.kernels.decode_attention import decode_attention
from hf_sparse_verify.kernels.token_sparse.kernel import token_sparse_attention_triton

B, C, H, HK, D = 4, 65536, 32, 8, 128


@torch.no_grad()
def main() -> None:
    g = torch.Generator("cuda").manual_seed(0)
    k = torch.randn(B, HK, C + 16, D, generator=g, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    n = math.ceil(0.07 * (C - 64))
    index = torch.stack(
        [torch.randperm(C - 64, device="cuda", generator=g)[:n].sort().values for _ in range(B)]
    ).int()
    count = torch.full((B,), n, dtype=torch.int32, device="cuda")
    recent = torch.full((B,), C - 64, device="cuda")
    q1 = torch.randn(B, H, 1, D, generator=g, device="cuda", dtype=torch.bfloat16)
    s1 = torch.full((B,), C - 1, device="cuda")
    q7 = torch.randn(B, H, 7, D, generator=g, device="cuda", dtype=torch.bfloat16)
    s7 = torch.full((B,), C - 7, device="cuda")
    pad = torch.zeros(B, dtype=torch.long, device="cuda")
    for _ in range(3):
        token_sparse_attention_triton(q1, k, v, index, count, recent, s1, D**-0.5)
        decode_attention(q7, k, v, s7, pad, D**-0.5, collect="two_rows", weights=True)
        decode_attention(q7, k, v, s7, pad, D**-0.5)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
