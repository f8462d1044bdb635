"""`bench --cpu`: the CPU path beside the straightforward PyTorch version of the same operation (gather
the rows, fp32 einsum, softmax with the sink, einsum), on the same inputs and threads, timed in turns
in one run, so that a machine shared with other work slows both alike."""

import os
import statistics
import time

from . import _C, prefill
from ._frameworks import default_cpu_threads

# (s_q, s_kv, h_q, d_qk, topk): the shape of issue 21's report (TP8-sharded V3.2 heads), all 128 heads
# of V3.2, and V4-Flash's 64 heads at d_qk 512: each a second or so of the PyTorch version on 2 cores.
SHAPES = [(64, 4096, 16, 576, 2048), (16, 4096, 128, 576, 2048), (128, 8192, 64, 512, 512)]
D_V = 512
Q_SCALE, KV_SCALE = 0.9, 1.1


def torch_prefill(torch, q, kv, indices, sm_scale, attn_sink):
    """The obvious PyTorch code for inputs whose every slot is valid: (out bf16, max_logits, lse)."""
    rows = kv[:, 0].float()[indices[:, 0].long()]  # [s_q, topk, d_qk]
    logits = torch.einsum("shd,skd->shk", q.float(), rows) * (sm_scale * Q_SCALE * KV_SCALE)
    lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - torch.logaddexp(lse, attn_sink)[..., None])  # the sink joins the denominator
    out = torch.einsum("shk,skd->shd", p, rows[..., :D_V]) * KV_SCALE
    return out.bfloat16(), logits.amax(dim=-1), lse


def _inputs(xp, shape, seed):
    """randn x 1.5 in e4m3 and topk distinct random rows per token, as torch tensors (xp = torch) or
    NumPy arrays of e4m3 bytes (xp = None)."""
    import numpy as np

    from .reference import e4m3_encode

    s_q, s_kv, h_q, d_qk, topk = shape
    rng = np.random.default_rng(seed)
    q = e4m3_encode(rng.standard_normal((s_q, h_q, d_qk)) * 1.5)
    kv = e4m3_encode(rng.standard_normal((s_kv, 1, d_qk)) * 1.5)
    indices = np.argsort(rng.random((s_q, s_kv)), axis=1)[:, None, :topk].astype(np.int32)
    sink = (rng.standard_normal(h_q) * 2 + 8).astype(np.float32)  # near lse, so that it moves the output
    if xp is None:
        return q, kv, indices, sink
    fp8 = xp.float8_e4m3fn
    return (xp.from_numpy(q).view(fp8), xp.from_numpy(kv).view(fp8), xp.from_numpy(indices),
            xp.from_numpy(sink))


def _seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _agreement(torch, ours, theirs):
    """||out - out'|| / ||out'|| and the largest |lse - lse'| between the two versions' results."""
    out, _, lse = ours
    ref_out, _, ref_lse = theirs
    rel = (torch.linalg.norm(out.float() - ref_out.float()) / torch.linalg.norm(ref_out.float())).item()
    return rel, (lse - ref_lse).abs().max().item()


def bench_cpu(shapes, iters, threads):
    """Prints one row per shape; returns the rows as dicts."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        if threads:
            torch.set_num_threads(threads)  # the CPU path follows torch's setting for torch tensors
        threads = torch.get_num_threads()
    else:
        threads = threads or default_cpu_threads()
        os.environ["OMP_NUM_THREADS"] = str(threads)  # what the CPU path reads for NumPy inputs
    print(f"CPU path ({_C.cpu_isa()}) on {threads} thread(s), wall clock, median of {iters} calls"
          + (f"; PyTorch {torch.__version__} on the same inputs and threads, timed in turns with it"
             if torch is not None else "; no PyTorch installed: its version is not timed"))
    print(f"{'s_q, s_kv, h_q, d_qk, topk':<30} {'ms':>8} {'GFLOP/s':>8}"
          + (f" {'PyTorch ms':>10} {'speedup':>8} {'out rel':>8} {'lse abs':>8}" if torch is not None else ""))
    rows = []
    for shape in shapes:
        s_q, s_kv, h_q, d_qk, topk = shape
        q, kv, indices, sink = _inputs(torch, shape, seed=sum(shape))
        sm_scale = d_qk ** -0.5
        ours = lambda: prefill(q, kv, indices, sm_scale, q_scale=Q_SCALE, kv_scale=KV_SCALE, attn_sink=sink)
        theirs = lambda: torch_prefill(torch, q, kv, indices, sm_scale, sink)
        calls = [ours] if torch is None else [ours, theirs]
        for call in calls:  # warm-up: allocators, thread pools, caches
            call()
        times = [[_seconds(call) for call in calls] for _ in range(iters)]
        ms = [1e3 * statistics.median(t[i] for t in times) for i in range(len(calls))]
        gflops = 2 * s_q * h_q * topk * (d_qk + D_V) / ms[0] / 1e6
        row = {"shape": dict(zip(("s_q", "s_kv", "h_q", "d_qk", "topk"), shape)), "threads": threads,
               "ms": ms[0], "gflops": gflops}
        line = f"{', '.join(map(str, shape)):<30} {ms[0]:>8.1f} {gflops:>8.1f}"
        if torch is not None:
            rel, lse_abs = _agreement(torch, ours(), theirs())
            row.update(torch_ms=ms[1], speedup=ms[1] / ms[0], out_rel=rel, lse_abs=lse_abs)
            line += f" {ms[1]:>10.1f} {ms[1] / ms[0]:>7.2f}x {rel:>8.1e} {lse_abs:>8.1e}"
        print(line, flush=True)
        rows.append(row)
    return rows
