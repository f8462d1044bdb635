"""A float64 model of precision "fast"'s P.V and where its reference may sit (CPU only).

The model of dual_fast's and wide_fast's rows (f16_o.cuh, softmax_e4m3 and follow_ref): per 32-slot
half tile, each row's reference R is set so that P = 2^(s - R) <= 2^8 and the row sum P may reach
stays within O's f16 budget; P is rounded to e4m3 and added into an f16 O that rounds once per
half tile (as FP8 wgmma's f16 accumulator does per K step); O and the sum are rescaled when R moves,
and out is O over the unrounded sum. Logits of randn x `spread` (base e; 2.25 at compare.py's inputs),
V of randn x 1.5 in e4m3. Prints, per policy for R, how often some row of a warp (16 rows) moves
its reference, which is how often the warp rescales O, and out's mean rel-L2 error against float64:
  - `max`: R a whole number k of binades below the row's max (what the kernels do);
  - `max+d`: R moved d binades further up (P's scale 2^-d lower), still with every move of the max;
  - `ceil`: R = ceil(max) - k, on whole binades of its own, so that it moves only when the max crosses
    one;
  - `warp+h`: as `ceil`, but the rows of a warp move only when one of them must, all at once, each h
    binades above what it needs.

Usage: python3 ci/probes/fast_reference_model.py [--tiles 16] [--rows 60]"""
import argparse
import math

import ml_dtypes
import numpy as np

HALF = 32  # slots of a half tile
WARP_ROWS = 16
BUDGET = 65504 / (448 * 1.07)  # the row sum O may reach (softmax_e4m3's kOBudget)
MAX_P_BITS = 8


def e4m3(x):
    return x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def run(policy, shift, halves, warps, spread, cols=64, seed=1):
    rng = np.random.default_rng(seed)
    errors, moves, steps = [], 0, 0
    for _ in range(warps):
        s = rng.standard_normal((WARP_ROWS, halves * HALF)) * spread / math.log(2)  # base 2
        v = e4m3(rng.standard_normal((halves * HALF, cols)) * 1.5)
        p = np.exp2(s - s.max(1, keepdims=True))
        want = p @ v / p.sum(1, keepdims=True)
        row_max = np.full(WARP_ROWS, -np.inf)
        ref = np.full(WARP_ROWS, -np.inf)
        total = np.zeros(WARP_ROWS)  # relative to 2^ref
        o = np.zeros((WARP_ROWS, cols), np.float16)
        for h in range(halves):
            block = s[:, HALF * h:HALF * (h + 1)]
            row_max = np.maximum(row_max, block.max(1))
            need = np.empty(WARP_ROWS)
            for r in range(WARP_ROWS):
                seen = 0.0 if ref[r] == -np.inf else total[r] * 2.0 ** (ref[r] - row_max[r])
                k = min(MAX_P_BITS, math.floor(math.log2(BUDGET / (seen + HALF))))
                top = row_max[r] if policy == "max" else math.ceil(row_max[r])
                need[r] = top - k + (shift if policy == "max" else 0)
            if policy == "warp":
                new = need + shift if ((need > ref) | (ref == -np.inf)).any() else ref
            else:
                new = need
            moves += bool(((new != ref) & (ref != -np.inf)).any())
            steps += 1
            alpha = np.where(ref == -np.inf, 0.0, 2.0 ** (ref - new))
            o = (o.astype(np.float64) * alpha[:, None]).astype(np.float16)
            total, ref = total * alpha, new
            p = np.exp2(block - ref[:, None])
            assert (p.max(1) <= 2.0 ** MAX_P_BITS * (1 + 1e-9)).all()
            total += p.sum(1)
            assert (total <= BUDGET * (1 + 1e-9)).all(), "O's budget"
            o = (o.astype(np.float64) + e4m3(p) @ v[HALF * h:HALF * (h + 1)]).astype(np.float16)
        got = o.astype(np.float64) / total[:, None]
        errors.append(np.linalg.norm(got - want) / np.linalg.norm(want))
    return moves / steps, float(np.mean(errors))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiles", type=int, default=16, help="half tiles of a row (16: topk 512)")
    ap.add_argument("--rows", type=int, default=60, help="warps of 16 rows")
    ap.add_argument("--spread", type=float, default=2.25)
    args = ap.parse_args()
    for policy, shift in [("max", 0), ("max", 0.25), ("max", 0.5), ("max", 1), ("ceil", 0), ("warp", 1), ("warp", 2)]:
        moved, error = run(policy, shift, args.tiles, args.rows, args.spread)
        name = policy if policy == "ceil" else f"{policy}+{shift:g}"
        print(f"{name:10s} warp rescales in {moved:.0%} of the half tiles, out rel-L2 {error:.2e}")


if __name__ == "__main__":
    main()
