"""GPU cases of the narrow-head kernel (h_q <= 32: one CTA per token and all its heads, fp32 O): every
head count, odd ones included, with a sink, topk_length and invalid indices, against the float64
reference at the contract's "exact" accuracy; tokens past the SM count, tokens without slots, topks no
tile divides, long rows, and bitwise determinism; tokens claimed from a counter, in CUDA graphs and on
two streams at once."""

import numpy as np
import pytest

from sparse_mla_fp8 import _C
from harness import (INT_MAX, INT_MIN, Backend, assert_matches, call_args, gpu_supported, invoke, random_case,
                     results_numpy, run_and_check, seed_of, table_dims, unaligned_kv, unaligned_q)

torch = pytest.importorskip("torch")
# each case is collected everywhere (a module-level skip would hide them from --collect-only) and skips
# without a GPU that has a kernel
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or not gpu_supported("cuda"),
                                                  reason="needs a CUDA GPU with a compiled specialization")]
EXACT_OUT_TOL = 1e-2  # CONTRACT.md, "exact": out rel-L2 (the harness allows any GPU kernel 2e-2)


def _runs(h_q, topk):
    kernel = "narrow8" if h_q <= 8 else "narrow16" if h_q <= 16 else "narrow32"
    assert _C.kernel_for(h_q, topk, "exact") == kernel == _C.kernel_for(h_q, topk, "fast"), (h_q, topk)


@pytest.fixture
def cuda():
    backend = Backend("torch-fp8", "cuda")
    backend.tol = EXACT_OUT_TOL
    return backend


def _serving_like(case, rng, invalid_fraction=0.1):
    """A sink with the infinities, topk_length at and past its bounds, invalid indices of every kind,
    and NaN in every kv row that no valid slot names."""
    s_q, h_q, topk = case.s_q, case.h_q, case.indices.shape[-1]
    s_kv = case.kv.shape[0]
    case.attn_sink = rng.choice([np.inf, -np.inf, 0.0, 2.0, -2.0, 8.0], h_q).astype(np.float32)
    edge = np.array([0, 1, 63, 64, 65, topk, topk + 1, INT_MAX, INT_MIN, -1], np.int64)
    case.topk_length = np.r_[edge, rng.integers(0, topk + 1, max(0, s_q - edge.size))][:s_q].astype(np.int32)
    invalid = rng.random(case.indices.shape) < invalid_fraction
    case.indices[invalid] = rng.choice(np.array([-1, s_kv, INT_MIN, INT_MAX], np.int32), invalid.sum())
    case.poison_unreferenced_kv()
    return case


@pytest.mark.parametrize("h_q", range(1, 33))
@pytest.mark.parametrize("d_qk", table_dims())
def test_every_head_count(cuda, d_qk, h_q):
    _runs(h_q, 333)
    case = random_case(seed_of("narrow", d_qk, h_q), 12, 3000, h_q, d_qk, 333)
    run_and_check(cuda, _serving_like(case, np.random.default_rng(h_q)))


@pytest.mark.parametrize("h_q, topk", [(8, 640), (16, 1152), (24, 200), (32, 70)])
@pytest.mark.parametrize("d_qk", table_dims())
def test_more_tokens_than_sms(cuda, d_qk, h_q, topk):
    """The grid is persistent (one CTA per SM): each CTA takes several tokens in turn, across which the
    ring of kv tiles and the Q tile run on; tokens without slots (topk_length 0) sit between."""
    _runs(h_q, topk)
    s_q, s_kv = 300, 5000
    case = random_case(seed_of("narrow items", d_qk, h_q), s_q, s_kv, h_q, d_qk, topk)
    rng = np.random.default_rng(d_qk + h_q)
    case.topk_length = np.where(rng.random(s_q) < 0.2, 0, rng.integers(1, topk + 1, s_q)).astype(np.int32)
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    invalid = rng.random(case.indices.shape) < 0.05
    case.indices[invalid] = -1
    case.poison_unreferenced_kv()
    run_and_check(cuda, case)


def _claims_case(h_q, label):
    """Six tokens a CTA or more (each CTA past its first token claims the next from the call's counter),
    short rows of uneven lengths with tokens without slots between, a sink, invalid indices."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    case = random_case(seed_of("narrow claims", label, h_q), 12 * sms + 5, 3000, h_q, table_dims()[-1], 130)
    rng = np.random.default_rng(h_q)
    case.topk_length = np.where(rng.random(case.s_q) < 0.1, 0, rng.integers(1, 131, case.s_q)).astype(np.int32)
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    case.indices[rng.random(case.indices.shape) < 0.05] = -1
    case.poison_unreferenced_kv()
    return case


@pytest.mark.parametrize("h_q", [3, 16, 29])
def test_items_claimed_bitwise(cuda, h_q):
    """Which CTA computes a token depends on the CTAs' timing once they claim tokens from a counter: the
    results are right and the same bit for bit on every run."""
    _runs(h_q, 130)
    case = _claims_case(h_q, "runs")
    run_and_check(cuda, case)
    first = [cuda.raw(x) for x in invoke(call_args(cuda, case))]
    for _ in range(2):
        assert [cuda.raw(x) for x in invoke(call_args(cuda, case))] == first, "two runs on identical input differ"


@pytest.mark.parametrize("h_q", [8, 16])
def test_items_claimed_graph_replays(cuda, h_q):
    """A CUDA graph of a call that claims tokens holds the counter's allocation, zeroing and release:
    every replay claims from zero (a counter left at its end would skip every token past the grid)."""
    case = _claims_case(h_q, "graph")
    kw = call_args(cuda, case)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = invoke(kw)
    for _ in range(2):
        for x in result:  # poisoned before each replay
            x.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(results_numpy(cuda, result), case.reference(), cuda.tol)


def test_items_claimed_on_two_streams(cuda):
    """Two calls at once on two streams, each claiming from its own counter, give the results each
    gives alone, bit for bit."""
    cases = [_claims_case(h_q, "streams") for h_q in (16, 8)]
    want = [[cuda.raw(x) for x in invoke(call_args(cuda, case))] for case in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    for _ in range(3):
        kws = [call_args(cuda, case) for case in cases]  # fresh poisoned outputs each time
        results = []
        for kw, stream in zip(kws, streams):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                results.append(invoke(kw))
        torch.cuda.synchronize()
        assert [[cuda.raw(x) for x in r] for r in results] == want


@pytest.mark.parametrize("h_q", [1, 16, 17])
def test_long_rows_one_kv_row(cuda, h_q):
    """O sums in fp32, so no topk bound: 8192 slots that all name one kv row (every P.V step adds the
    same terms) and a token of all-distinct rows stay exact."""
    _runs(h_q, 8192)
    d_qk = table_dims()[-1]
    case = random_case(seed_of("narrow long", h_q), 3, 20000, h_q, d_qk, 8192)
    case.indices[0] = case.indices[0, :, :1]
    run_and_check(cuda, case)


@pytest.mark.parametrize("h_q", [5, 16, 31])
def test_bitwise_deterministic(cuda, h_q):
    _runs(h_q, 700)
    case = random_case(seed_of("narrow det", h_q), 300, 4000, h_q, table_dims()[-1], 700)
    kw = call_args(cuda, _serving_like(case, np.random.default_rng(h_q)))
    first = [cuda.raw(x) for x in invoke(kw)]
    for _ in range(2):
        assert [cuda.raw(x) for x in invoke(call_args(cuda, case))] == first, "two runs on identical input differ"


@pytest.mark.parametrize("h_q", [5, 9])
def test_unaligned_rows(cuda, h_q):
    """q and kv rows off the 16-byte grid take the producer's byte copies; out rows off it (the host
    asks for bf16 pairs), the 4-byte stores (narrow8's are 4-byte ones always)."""
    d_qk = table_dims()[0]
    _runs(h_q, 150)
    case = _serving_like(random_case(seed_of("narrow unaligned"), 5, 700, h_q, d_qk, 150), np.random.default_rng(5))
    unaligned_q(case)
    unaligned_kv(case)
    kw = call_args(cuda, case)
    out = torch.full((case.s_q, h_q, 514), -1, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    kw["out"] = out[:, :, 2:]
    assert_matches(results_numpy(cuda, invoke(kw)), case.reference(), cuda.tol)
