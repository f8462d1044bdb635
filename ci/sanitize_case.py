"""Small prefills for compute-sanitizer: invalid and duplicate indices, a sink, topk_length, odd h_q/topk.
Each configuration names the kernel the registry runs it with (asserted), and every kernel of the
registry also runs forced on one more. The 300- and 140-token configurations have more work items
than SMs (the dual kernel's 300 more than its CTAs), so that CTAs of the persistent grid take
several, some empty (token 2 has no slots, and CTA 2 takes token 134 after it); a hazard may show
only in some orders of events, so the wide kernels' runs on several seeds. The narrow kernels run
h_q 1, 5, 8 (heads as N), 12, 16 (one M tile of 16 heads), 17 and 32 (two), also on 140 and 300 tokens.
`python3 ci/sanitize_case.py 32` runs only the configurations with h_q <= 32."""
import sys

MULTI_ITEM_SEEDS = 4


def configurations(kernel_names):
    """(d_qk, h_q, topk, s_q, seed, kernel, forced): forced runs the kernel, else it is the registry's
    choice (tests/test_native.py checks that on the CPU, where this script cannot run)."""
    cases = [(576, 70, 100, 3, 0, "wide", False), (512, 16, 64, 3, 0, "narrow16", False),
             (512, 70, 2100, 300, 0, "fallback", False), (576, 40, 2100, 140, 0, "split", False),
             (576, 40, 1100, 140, 0, "dual_fast", False), (512, 40, 600, 300, 0, "dual", False),
             (512, 40, 600, 300, 0, "dual_fast", False),
             (576, 70, 300, 140, 2, "wide_fast", False)]
    cases += [(576, 70, 100, 300, seed, "wide", False) for seed in range(MULTI_ITEM_SEEDS)]
    cases += [(512, 70, 200, 300, seed, "wide_fast", False) for seed in range(MULTI_ITEM_SEEDS // 2)]
    cases += [(576, 70, 300, 140, 1, name, True) for name in kernel_names]
    cases += [(576, 1, 100, 300, 0, "narrow8", False), (512, 8, 640, 140, 0, "narrow8", False),
              (576, 5, 130, 140, 1, "narrow8", False), (512, 12, 640, 140, 0, "narrow16", False),
              (576, 17, 130, 140, 0, "narrow32", False), (512, 32, 64, 300, 1, "narrow32", False)]
    return cases


def precision_of(kernel):
    """the precision a configuration's call asks for: a fast kernel's (tests/test_native.py's table)"""
    return "fast" if kernel.endswith("_fast") else "exact"


def main(max_heads):
    import torch

    import sparse_mla_fp8
    from sparse_mla_fp8 import _C

    dev = torch.device("cuda")
    cases = configurations(_C.kernel_names())
    if max_heads is not None:
        cases = [c for c in cases if c[1] <= max_heads]
    for d_qk, h_q, topk, s_q, seed, kernel, forced in cases:
        if not forced:
            assert _C.kernel_for(h_q, topk, precision_of(kernel)) == kernel, (h_q, topk, kernel)
        torch.manual_seed(seed)
        s_kv = 200
        q = (torch.randn(s_q, h_q, d_qk, device=dev) * 1.5).to(torch.float8_e4m3fn)
        kv = (torch.randn(s_kv, 1, d_qk, device=dev) * 1.5).to(torch.float8_e4m3fn)
        indices = torch.randint(-10, s_kv + 10, (s_q, 1, topk), device=dev, dtype=torch.int32)
        indices[0, 0, :4] = torch.tensor([-(2**31), 2**31 - 1, 5, 5], dtype=torch.int32)
        topk_length = torch.randint(0, topk + 1, (s_q,), device=dev, dtype=torch.int32)
        topk_length[:3] = torch.tensor([topk, topk // 2, 0], dtype=torch.int32)
        sink = torch.randn(h_q, device=dev)
        out, max_logits, lse = sparse_mla_fp8.prefill(q, kv, indices, d_qk**-0.5, attn_sink=sink,
                                                      topk_length=topk_length, precision=precision_of(kernel),
                                                      _force_kernel=kernel if forced else None)
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all()
    print(f"sanitize case ran ({len(cases)} prefills; {', '.join(_C.kernel_names())} each forced once)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
