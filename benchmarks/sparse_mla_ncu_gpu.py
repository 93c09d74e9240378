"""Sparse MLA at 128 heads x batch 64 under Nsight Compute: the kernels the Triton tiles pick (rows as
M, 32-row tiles) and the heads-as-M tile (64 heads, 64 rows, 8 warps, 2 stages), each twice (the
first call of each compiles). Run under ncu, profiling the second pair:

    ncu --set detailed -k regex:sparse_mla --launch-skip 2 --launch-count 2 \\
        python3 benchmarks/sparse_mla_ncu_gpu.py > sparse-mla-ncu.txt

The cache is 65536 rows (75 MB), so the L2 holds much of it: the profile is about the SM, not DRAM.
Both are given as configs, so the Gluon kernel (`gluon_sparse_mla`) is not picked.
"""

import torch

from rooftop.engine.kernels import triton_sparse_mla


def main() -> None:
    torch.manual_seed(0)
    tokens, heads, topk, rank, width = 64, 128, 2048, 512, 576
    kv = torch.randn(1024, 64, width, device="cuda", dtype=torch.bfloat16)
    slots = torch.stack([torch.randperm(65536, device="cuda")[:topk] for _ in range(tokens)])
    q = torch.randn(tokens, heads, rank, device="cuda", dtype=torch.bfloat16)
    q_rope = torch.randn(tokens, heads, width - rank, device="cuda", dtype=torch.bfloat16)
    rows = triton_sparse_mla.default_config(tokens, heads, topk)
    heads_as_m = {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "rows_as_m": False,
                  "prefetch": True, "splits": 1}
    for cfg in (rows, heads_as_m, rows, heads_as_m):
        triton_sparse_mla.sparse_mla(q, kv, slots, rank, 0.07, config=cfg, q_rope=q_rope)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
