"""Timing variants of the narrow kernel (narrow_variants.cu) beside the installed package, on the
narrow serving shapes of compare.py: µs and float64 error of each.

Usage on the GPU machine: python3 ci/probes/narrow_variants.py FATBIN PEERS_DIR"""
import sys

import cupy
import numpy as np
import torch
from triton.testing import do_bench

fatbin, peers = sys.argv[1], sys.argv[2]
sys.path.insert(0, peers)
from compare import SERVING, errors, smf, workload  # noqa: E402

VARIANTS = {"c1_cvt_cvt": 1, "c2_cvt_cvt": 2, "c2_cvt_shift": 2, "c2_shift_shift": 2, "c1_shift_shift": 1,
            "c2_raw_raw": 2}  # name: CTAs per SM
SHAPES = ["V3.2 TP8 h16", "V4-Flash TP8 h8 CSA", "V4-Flash TP4 h16 CSA", "V4-Pro TP8 h16 CSA"]


def smem(d, ctas):
    """narrow::Layout<d, 1, 0, ctas>::kBytes"""
    tile, q8, q16, sx = 64 * d, 16 * d, 32 * d, 2 * 4096
    limit = 227 * 1024 if ctas == 1 else 228 * 1024 // ctas - 1024
    buffers = min(4, (limit - (q8 + 256 + q16 + sx)) // tile)
    q16_at = (buffers * tile + q8 + (2 * buffers + 2) * 8 + 127) // 128 * 128
    return q16_at + q16 + sx


mod = cupy.RawModule(path=fatbin)
sms = torch.cuda.get_device_properties(0).multi_processor_count
null = np.uint64(0)
for name in SHAPES:
    s_q, s_kv, h_q, d, width, profile, use_sink = SERVING[name]
    q, kv, idx, tl, sink = workload(s_q, s_kv, h_q, d, width, profile)
    sk = sink if use_sink else None
    sm = d ** -0.5
    pkg = lambda: smf.prefill(q, kv, idx, sm, attn_sink=sk, topk_length=tl)
    ref_out = pkg()
    print(f"{name} | package | {do_bench(pkg, warmup=50, rep=200) * 1e3:.0f} us | "
          f"{errors(ref_out, q, kv, idx, sm, sk, tl)}", flush=True)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
    ml = torch.empty(s_q, h_q, device="cuda")
    lse = torch.empty(s_q, h_q, device="cuda")
    args = tuple(cupy.asarray(x) for x in (q.view(torch.uint8), kv.view(torch.uint8), idx))
    args += (cupy.asarray(sk) if sk is not None else null, cupy.asarray(tl) if tl is not None else null)
    args += tuple(cupy.asarray(x) for x in (out.view(torch.int16), ml, lse))
    args += (np.int64(s_q), np.int64(s_kv), np.int64(h_q), np.int64(width), np.float32(sm))
    for v, ctas in VARIANTS.items():
        fn = mod.get_function(f"narrow_{v}_d{d}")
        fn.max_dynamic_shared_size_bytes = smem(d, ctas)
        launch = lambda: fn((min(s_q, sms * ctas),), (160,), args, shared_mem=smem(d, ctas))
        out.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a.view(torch.int16),
                               b.view(torch.int32) if b.dtype == torch.float32 else b.view(torch.int16))
                   for a, b in zip((out, ml, lse), ref_out))
        err = errors((out, ml, lse), q, kv, idx, sm, sk, tl)
        print(f"{name} | {v} | {do_bench(launch, warmup=50, rep=200) * 1e3:.0f} us | {err} | "
              f"{'= package' if same else ''}", flush=True)
