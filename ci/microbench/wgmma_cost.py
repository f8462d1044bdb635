"""Runs ci/microbench/wgmma_cost.cu's kernels on cuda:0 and prints cycles per wgmma (PERF.md, v5).

Usage: python ci/microbench/wgmma_cost.py wgmma_cost.fatbin
"""
import sys

import torch

import sparse_mla_fp8._C as _C

fatbin = sys.argv[1]
dev = torch.device("cuda")
s_q, s_kv, h_q, d, topk = 132, 256, 64, 576, 64
q = (torch.randn(s_q, h_q, d, device=dev)).to(torch.float8_e4m3fn)
kv = (torch.randn(s_kv, 1, d, device=dev)).to(torch.float8_e4m3fn)
idx = torch.randint(0, s_kv, (s_q, 1, topk), device=dev, dtype=torch.int32)
out = torch.empty(s_q, h_q, 512, device=dev, dtype=torch.bfloat16)
ml = torch.empty(s_q, h_q, device=dev)
lse = torch.zeros_like(ml)  # cycles of each warpgroup land in lse[cta, 0:2]
st = torch.cuda.current_stream().cuda_stream
kernels = [("rs32", 32), ("rs32c2", 32), ("rs64", 64), ("rs128", 128), ("ss32", 32), ("ss64", 64), ("ss256", 256),
           ("qk_cw", 32), ("qk_nw", 32), ("qk_cn", 32), ("qk_nn", 32)]
for name, n in kernels:
    for _ in range(2):
        _C.prefill(q, kv, idx, d**-0.5, 1.0, 1.0, None, None, out, ml, lse, st, fatbin, name)
    torch.cuda.synchronize()
    cyc = lse[:, :2].double().mean().item()
    n_mma = 32 * 36
    flop = 2 * n_mma * 64 * n * 16 * 2
    print(f"{name:7s} N={n:3d}: {cyc/n_mma:7.1f} clk per wgmma per warpgroup, {flop/cyc:7.0f} FLOP/clk/SM (peak 4096)")
