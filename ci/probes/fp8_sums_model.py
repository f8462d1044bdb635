"""A float64 model of FP8 wgmma's sums and what it predicts for max_logits and lse (CPU only).

The model of one FP8 K step (32 products of e4m3 values, which are exact): the products, and with a
chain of K steps on the tensor cores the accumulator too, are aligned to the largest of them and cut
toward zero `bits` bits below its leading bit, then added exactly; each sum of `steps` K steps is
added into fp32 ("promotion"). Calibrated against the GPU (PERF.md, "Accuracy model of FP8 sums"):
bits = 12 gives the exact kernels' lse at q_scale x kv_scale 4 (promoted every K step, 0.9-1.0e-3
measured) and with two K steps per sum (1.6-1.8e-3), and errors like SGLang's at compare.py's
inputs (one chain over d_qk). ci/probes/fp8_accumulator.py measures the sums directly (`ci/gpu.sh
accum`); refit `bits` to it.

Each configuration: a row of h_q x topk logits of randn x 1.5 e4m3 values, scaled so that the
logits' standard deviation is `spread` (2.25 at compare.py's inputs; CONTRACT.md's fast mode asks
for 0.05 to 9); `exact` of the largest terms recomputed exactly as the exact kernels do for the max
(0: max_logits and lse straight from the tensor-core logits). Prints the worst row's lse and
max_logits errors against float64.

Usage: python3 ci/probes/fp8_sums_model.py [--bits 12] [--rows 128]"""
import argparse

import ml_dtypes
import numpy as np

KSTEP = 32


def e4m3_randn(rng, shape):
    return (rng.standard_normal(shape) * 1.5).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def cut(x, bits):
    """x's terms (last axis) aligned to the largest and cut toward zero `bits` bits below it."""
    top = np.abs(x).max(-1, keepdims=True)
    quantum = 2.0 ** (np.floor(np.log2(np.where(top > 0, top, 1.0))) - bits)
    return np.trunc(x / quantum) * quantum


def tensor_core_dots(q, k, bits, steps):
    """q [R, D] x k [S, D] as FP8 wgmma sums them: chains of `steps` K steps, each chain's result
    added into fp32."""
    p = (q[:, None, :] * k[None, :, :]).reshape(q.shape[0], k.shape[0], -1, KSTEP)
    out = np.zeros(p.shape[:2], np.float32)
    for first in range(0, p.shape[2], steps):
        acc = np.zeros(p.shape[:2])
        for ks in range(first, min(first + steps, p.shape[2])):
            acc = cut(np.concatenate([p[:, :, ks, :], acc[..., None]], -1), bits).sum(-1)
        out = (out + acc.astype(np.float32)).astype(np.float32)
    return out.astype(np.float64)


def worst_errors(h_q, topk, d_qk, spread, bits, steps, exact, rows, seed=0):
    """The worst row's |lse error| and |max_logits error| over `rows` rows."""
    rng = np.random.default_rng(seed)
    scale = spread / (1.5 ** 2 * d_qk ** 0.5)
    lse_err, max_err = 0.0, 0.0
    for _ in range(0, rows, h_q):
        q, k = e4m3_randn(rng, (h_q, d_qk)), e4m3_randn(rng, (topk, d_qk))
        ref = q @ k.T * scale
        got = tensor_core_dots(q, k, bits, steps) * scale
        ref_max = ref.max(1, keepdims=True)
        ref_lse = ref_max[:, 0] + np.log(np.exp(ref - ref_max).sum(1))
        order = np.argsort(-got, axis=1)[:, :max(exact, 1)]
        r = np.arange(h_q)[:, None]
        if exact:
            got[r, order] = ref[r, order]
        got_max = got[r[:, 0], order[:, 0]]
        got_lse = got_max + np.log(np.exp(got - got_max[:, None]).sum(1))
        lse_err = max(lse_err, np.abs(got_lse - ref_lse).max())
        max_err = max(max_err, np.abs(got_max - ref_max[:, 0]).max())
    return lse_err, max_err


# (what, h_q, topk, d_qk, spread, K steps per sum, exact terms)
CONFIGS = [
    ("exact kernels, compare.py's inputs", 128, 2048, 576, 2.25, 1, 1),
    ("exact kernels, q_scale x kv_scale 4", 128, 2048, 576, 9.0, 1, 1),
    ("exact, two K steps per sum, scales 4", 128, 2048, 576, 9.0, 2, 1),
    ("one chain over d_qk (SGLang), compare.py's inputs", 128, 2048, 576, 2.25, 18, 0),
    ("one chain over d_qk, spread 9", 64, 600, 576, 9.0, 18, 0),
    ("one chain over d_qk, spread 9, exact max", 64, 600, 576, 9.0, 18, 1),
    ("one chain (pair_fast, d_qk 512), spread 9", 64, 600, 512, 9.0, 16, 0),
    ("4 K steps per sum (dual_fast, d_qk 512), spread 9", 64, 600, 512, 9.0, 4, 0),
    ("4 K steps per sum, spread 9, exact max", 64, 600, 512, 9.0, 4, 1),
    ("3 K steps per sum (dual_fast, d_qk 576), spread 9, exact max", 64, 600, 576, 9.0, 3, 1),
    ("2 K steps per sum, spread 9", 64, 600, 512, 9.0, 2, 0),
    ("two chains (wide_fast, d_qk 576: 9 K steps each), spread 9, exact max", 64, 600, 576, 9.0, 9, 1),
    ("two chains (wide_fast, d_qk 512: 8 K steps each), spread 9, exact max", 64, 600, 512, 9.0, 8, 1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bits", type=float, default=12)
    ap.add_argument("--rows", type=int, default=128)
    args = ap.parse_args()
    print(f"bits {args.bits:g}, worst of {args.rows} rows: lse, max_logits")
    for what, h_q, topk, d_qk, spread, steps, exact in CONFIGS:
        lse, mx = worst_errors(h_q, topk, d_qk, spread, args.bits, steps, exact, max(args.rows, h_q))
        print(f"{lse:8.1e} {mx:8.1e}  {what}", flush=True)


if __name__ == "__main__":
    main()
