"""out's error by how P.V rounds (PERF.md, "fourth part"), in float64 otherwise, over the spread of
the logits, with the kernel's lazy rescale:
  e4m3 P        P x 2^4 rounded to one e4m3 (P.V at the FP8 rate), slack 4;
  hi + lo       P x 2^4 as two e4m3 (twice P.V's K), slack 4;
  fp16 P        the kernel: fp16 P, fp32 O, slack 8;
  f16 O rn/rz   fp16 P x 2^-c (O far below 65504), O rounded to fp16 after every k16 step as wgmma's
                f16 accumulator does (to nearest, as ci/microbench/f16_accumulator.cu measured on the
                H200; toward zero for contrast), rescaled at every new maximum (slack 0).
CPU torch: python ci/numerics/pv_rounding.py (a few minutes).
"""
import torch

LOG2E = 1.4426950408889634
D_QK, D_V, S_Q, S_KV, H_Q = 576, 512, 4, 8192, 64


def e4m3(x):
    return x.float().to(torch.float8_e4m3fn).double()


def f16_toward_zero(x):
    y = x.half()
    over = y.double().abs() > x.abs()
    return torch.where(over, torch.nextafter(y, torch.zeros_like(y)), y).double()


def variants(topk):
    c = max(0, (topk // 128).bit_length() - 1)  # 2^-c: sum(P) <= 128, so |O| <= 128 x 448
    return {
        "e4m3 P": (4, 2.0 ** 4, e4m3, None),
        "hi + lo": (4, 2.0 ** 4, lambda p: e4m3(p) + e4m3(p - e4m3(p)), None),
        "fp16 P": (8, 1.0, lambda p: p.half().double(), None),
        "f16 O rn": (0, 2.0 ** -c, lambda p: p.half().double(), lambda o: o.half().double()),
        "f16 O rz": (0, 2.0 ** -c, lambda p: p.half().double(), f16_toward_zero),
    }


def out_error(s, V, ref, topk, slack, p_scale, round_p, round_o):
    level = torch.full(s.shape[:2], -1e30, dtype=torch.float64)  # what the exponents subtract
    running = level.clone()
    total = torch.zeros(s.shape[:2], dtype=torch.float64)
    o = torch.zeros(*s.shape[:2], D_V, dtype=torch.float64)
    steps = 16 if round_o else 64
    for t0 in range(0, topk, 64):
        st = s[..., t0:t0 + 64]
        running = torch.maximum(running, st.amax(-1))
        move = running > level + slack
        alpha = torch.where(move, torch.exp2(level - running), torch.ones_like(running))
        level = torch.where(move, running, level)
        o, total = o * alpha[..., None], total * alpha
        if round_o:
            o = round_o(o)
        p = torch.exp2(st - level[..., None]) * p_scale
        rounded = round_p(p)
        for k0 in range(0, 64, steps):
            o = o + torch.einsum("thk,tkd->thd", rounded[..., k0:k0 + steps], V[:, t0 + k0:t0 + k0 + steps])
            if round_o:
                o = round_o(o)
        total = total + p.float().double().sum(-1)
    out = (o / total[..., None]).to(torch.bfloat16).double()
    return ((out - ref).norm() / ref.norm()).item()


def main():
    torch.manual_seed(1)
    for topk in (2048, 512):
        for scale in (0.02, 0.1, 0.3, 1.0, 4.0):
            q = e4m3(torch.randn(S_Q, H_Q, D_QK) * 1.5) * scale
            kv = e4m3(torch.randn(S_KV, D_QK) * 1.5)
            K = kv[torch.rand(S_Q, S_KV).topk(topk, dim=1).indices]
            V = K[..., :D_V]
            s = torch.einsum("thd,tkd->thk", q, K) * D_QK ** -0.5 * LOG2E
            ref = torch.einsum("thk,tkd->thd", torch.softmax(s / LOG2E, -1), V)
            errors = ", ".join(f"{name} {out_error(s, V, ref, topk, *v):.2e}" for name, v in variants(topk).items())
            print(f"topk {topk}, logit sd {(s / LOG2E).std().item():5.2f}: {errors}", flush=True)


if __name__ == "__main__":
    main()
