"""The narrow kernel's gather floor on the serving shapes: its ring alone (narrow_gather.cu), at ring
depths 2-4 and 1-2 CTAs per SM, on the index rows compare.py builds. Prints µs and TB/s (bytes of the
valid rows gathered into shared memory) per shape and configuration.

Usage on the GPU machine: ci/gpu.sh floor (it builds the fatbin), or
python3 ci/probes/narrow_gather.py FATBIN PEERS_DIR"""
import sys

import cupy
import numpy as np
import torch
from triton.testing import do_bench

fatbin, peers = sys.argv[1], sys.argv[2]
sys.path.insert(0, peers)
from compare import SERVING, workload  # noqa: E402

CONFIGS = [(2, 1), (3, 1), (4, 1), (2, 2)]  # (ring depth, CTAs per SM)
SHAPES = ["V3.2 TP8 h16", "V4-Flash TP8 h8 CSA", "V4-Pro TP8 h16 CSA"]
LANDING = 64  # slots per tile
THREADS = 4 * 32 + 2 * 32  # narrow::Shape<16>::kThreads: 4 consumer warps, 2 producer warps

mod = cupy.RawModule(path=fatbin)


def smem(entry):
    """the entry's shared memory (narrow::Layout's kGatherBytes), from the fatbin"""
    return int(cupy.ndarray((1,), cupy.int32, memptr=mod.get_global(f"{entry}_smem")).get()[0])


sms = torch.cuda.get_device_properties(0).multi_processor_count
for name in SHAPES:
    s_q, s_kv, h_q, d, width, profile, _ = SERVING[name]
    q, kv, idx, tl, _ = workload(s_q, s_kv, h_q, d, width, profile)
    valid = (idx[:, 0] >= 0) & (idx[:, 0] < s_kv)
    if tl is not None:
        valid &= torch.arange(width, device=idx.device)[None] < tl[:, None]
    nbytes = int(valid.sum()) * d
    qa, kva, ia = (cupy.asarray(x) for x in (q.view(torch.uint8), kv.view(torch.uint8), idx))
    ta = cupy.asarray(tl) if tl is not None else np.uint64(0)
    for buffers, ctas in CONFIGS:
        entry = f"narrow_gather_d{d}_b{buffers}_c{ctas}"
        fn, nbytes_smem = mod.get_function(entry), smem(entry)
        fn.max_dynamic_shared_size_bytes = nbytes_smem
        args = (qa, kva, ia, ta, np.int64(s_q), np.int64(s_kv), np.int64(h_q), np.int64(width),
                np.int64(q.stride(0)), np.int64(q.stride(1)), np.int64(kv.stride(0)), np.int64(idx.stride(0)))
        launch = lambda: fn((min(s_q, sms * ctas),), (THREADS,), args, shared_mem=nbytes_smem)
        launch()
        cupy.cuda.Device().synchronize()
        ms = do_bench(launch, warmup=50, rep=200, return_mode="median")
        print(f"gather floor | {name} | ring {buffers} x {LANDING} rows, {ctas} CTA/SM | {ms * 1e3:.0f} us | "
              f"{nbytes / ms / 1e9:.2f} TB/s ({nbytes / 1e9:.2f} GB)", flush=True)
