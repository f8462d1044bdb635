"""How Hopper's FP8 wgmma sums, for precision "fast" (fp8_accumulator.cu runs the wgmmas):
1. the add into the accumulator: C + x for small x, f32 and f16 (round to nearest or toward zero?);
2. the sum inside one K step: 2^L + 31 terms of 2^-n (which terms does it keep?);
3. random e4m3 dot products (randn x 1.5, K = 512) summed over 16 K steps on the tensor cores, over 4
   and promoted in float64, or promoted every step: bias and RMS against float64;
4. an e4m3 P (softmax weights scaled by 2^s) times V into an f16 accumulator over 64 K steps (2048
   slots), against float64 and against a float64 simulation that rounds to f16 after every K step.

Usage on the GPU machine: ci/gpu.sh accum (it builds the fatbin), or
python3 ci/probes/fp8_accumulator.py FATBIN"""
import sys

import cupy
import numpy as np
import torch

mod = cupy.RawModule(path=sys.argv[1])
M, N, KSTEP = 64, 8, 32


def e4m3(x):
    return torch.as_tensor(np.asarray(x, np.float32)).to(torch.float8_e4m3fn)


def value(t):
    return t.float().numpy().astype(np.float64)


def run(acc, steps, a, b, c=None):
    """D = C + A B^T by a chain of `steps` wgmmas (a: 64 x K, b: 8 x K e4m3 tensors), float64."""
    ga = cupy.asarray(np.ascontiguousarray(a.view(torch.uint8).numpy()))
    gb = cupy.asarray(np.ascontiguousarray(b.view(torch.uint8).numpy()))
    c = np.zeros((M, N)) if c is None else np.broadcast_to(c, (M, N))
    gc = cupy.asarray(c.astype(np.float32))
    gd = cupy.zeros((M, N), cupy.float32)
    mod.get_function(f"chain_{acc}_{steps}")((1,), (128,), (ga, gb, gc, gd))
    cupy.cuda.runtime.deviceSynchronize()
    return cupy.asnumpy(gd).astype(np.float64)


def one_hot(rows, first, k=KSTEP):
    x = np.zeros((rows, k), np.float32)
    x[:, 0] = first
    return x


print("1. C + x into the accumulator (x one product; RN: to nearest, even; RZ: toward zero)")
x = np.array([0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.5], np.float32)
for acc, c in (("f16", 1024.0), ("f32", 2.0 ** 23)):
    cs, xs = np.concatenate([np.full(8, c), np.full(8, -c)]), np.concatenate([x, -x])
    got = run(acc, 1, e4m3(one_hot(M, np.resize(xs, M))), e4m3(one_hot(N, 1.0)),
              np.resize(cs, M)[:, None])
    for i in range(16):
        exact = cs[i] + xs[i]
        print(f"  {acc} C {cs[i]:+.0f} x {xs[i]:+.2f}: got C {got[i, 0] - cs[i]:+.2f}"
              f" (RN C {np.round(exact) - cs[i]:+.2f}, RZ C {np.trunc(exact) - cs[i]:+.2f})")

print("2. one K step: 2^L + 31 terms of 2^-n, C = 0: the part of the small terms kept")
for acc in ("f32", "f16"):
    a = np.ones((M, KSTEP), np.float32)
    a[:, 0] = 2.0 ** (np.arange(M) % 8)  # L = 8 + row % 8 with b's leading 256
    b = np.ones((N, KSTEP), np.float32)
    b[:, 0] = 256.0
    b[:, 1:] = (2.0 ** -np.arange(N, dtype=np.float32))[:, None]
    got = run(acc, 1, e4m3(a), e4m3(b))
    lead = (a[:, 0] * 256.0)[:, None]
    kept = (got - lead) / (31 * 2.0 ** -np.arange(N))[None]
    for row in range(4 if acc == "f16" else 8):
        print(f"  {acc} 2^{8 + row}: kept " + " ".join(f"n={n}:{kept[row, n]:.2f}" for n in range(N)))

print("3. random dot products, K 512 (randn x 1.5 e4m3), 40 x 512 of them: error / RMS(dot)")
rng = np.random.default_rng(0)
stats = {"16 steps on the tensor cores": [], "4 x 4, promoted": [], "16 x 1, promoted": []}
for _ in range(40):
    a = e4m3(rng.standard_normal((M, 512)) * 1.5)
    b = e4m3(rng.standard_normal((N, 512)) * 1.5)
    exact = value(a) @ value(b).T
    scale = np.sqrt(np.mean(exact ** 2))
    def promoted(steps):  # sums of `steps` K steps each, added in float64
        k = KSTEP * steps
        return sum(run("f32", steps, a[:, g:g + k], b[:, g:g + k]) for g in range(0, 512, k))
    sums = {"16 steps on the tensor cores": run("f32", 16, a, b), "4 x 4, promoted": promoted(4),
            "16 x 1, promoted": promoted(1)}
    for k, got in sums.items():
        stats[k].append((got - exact) / scale)
for k, errs in stats.items():
    e = np.concatenate([x.ravel() for x in errs])
    print(f"  {k}: mean {e.mean():+.2e}, RMS {np.sqrt(np.mean(e ** 2)):.2e}, max {np.abs(e).max():.2e}")

print("4. e4m3 P (exp(logit - max) x 2^s, logits randn x spread) . V (randn x 1.5), 2048 slots, f16"
      " accumulator: relative L2 error against float64, and against float64 rounded to f16 after each K step")
for spread in (0.5, 2.0, 9.0):
    for s in (-4, 0, 4, 8):
        logits = rng.standard_normal((M, 2048)) * spread
        p = e4m3(np.exp(logits - logits.max(axis=1, keepdims=True)) * 2.0 ** s)
        v = e4m3(rng.standard_normal((N, 2048)) * 1.5)
        got = run("f16", 64, p, v)
        pv, vv = value(p), value(v)
        exact = pv @ vv.T
        sim = np.zeros((M, N))
        for g in range(64):
            step = pv[:, g * KSTEP:(g + 1) * KSTEP] @ vv[:, g * KSTEP:(g + 1) * KSTEP].T
            sim = (sim + step).astype(np.float16).astype(np.float64)
        norm = np.linalg.norm(exact)
        rms = norm / np.sqrt(exact.size)
        print(f"  spread {spread} s {s:+d}: max |D| {np.abs(exact).max():.3g}, error {np.linalg.norm(got - exact) / norm:.2e},"
              f" the RN-per-step simulation's {np.linalg.norm(sim - exact) / norm:.2e},"
              f" mean signed {np.mean(got - exact) / rms:+.2e}")
