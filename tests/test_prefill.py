"""prefill() against the float64 reference on every backend (NumPy, torch fp8/uint8 on CPU and CUDA,
CuPy): shapes, index edge cases, topk_length, sinks, strides, scales, caller buffers, determinism."""

import dataclasses

import numpy as np
import pytest

from harness import (D_V, INT_MAX, INT_MIN, OUT_POISON, assert_matches, call_args, dim, embedded, invoke,
                     random_case, results_numpy, run_and_check, seed_of, table_dims, unaligned_kv, unaligned_q)

SHAPES = [  # (s_q, s_kv, h_q, d_qk, topk): odd h_q and topk, topk > s_kv (so duplicates), 64/128 multiples;
    # d_qk as in the default build (dim() maps it onto the table of others)
    (3, 50, 1, 512, 1),
    (5, 200, 3, 576, 7),
    (4, 300, 17, 512, 100),
    (2, 1000, 70, 576, 300),
    (7, 64, 1, 576, 300),
    (1, 9, 70, 512, 7),
    (6, 500, 17, 576, 1),
    (3, 400, 3, 512, 300),
    (2, 256, 128, 576, 128),
    (3, 128, 64, 512, 64),
    (2, 300, 130, 512, 70),  # the wide kernel's second head block: 2 heads
    (2, 500, 200, 576, 130),  # and 72: its second warpgroup's 8
    (3, 2000, 40, 576, 2100),  # the split kernel (h_q <= 64, topk past 2048)
    (3, 2000, 40, 512, 600),  # the dual kernel (h_q 33 to 64, topk up to 2048; also the topk 300 ones)
]


@pytest.mark.parametrize("provide", [True, False], ids=["provided", "allocated"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_random_shapes(backend, shape, provide):
    s_q, s_kv, h_q, d_qk, topk = shape
    run_and_check(backend, random_case(seed_of(shape), s_q, s_kv, h_q, dim(d_qk), topk), provide=provide)


@pytest.mark.parametrize("d_qk", table_dims())
def test_invalid_and_duplicate_indices(backend, d_qk):
    s_kv = 300
    case = random_case(seed_of("indices", d_qk), 6, s_kv, 17, d_qk, 100)
    rng = np.random.default_rng(d_qk)
    case.indices %= s_kv // 2  # valid slots name the lower half only: the upper half goes NaN below
    bad = np.array([-1, -2, -s_kv, s_kv, s_kv + 1, INT_MIN, INT_MIN + 1, INT_MAX, INT_MAX - 1], np.int32)
    replace = rng.random(case.indices.shape) < 0.3
    case.indices[replace] = rng.choice(bad, replace.sum())
    case.indices[:, :, :10] = 7  # one row in ten slots of every token: each slot counts
    case.indices[1, 0, ::2] = case.indices[1, 0, 1::2]  # every valid row of token 1 twice
    case.poison_unreferenced_kv()
    run_and_check(backend, case)


LENGTHS = {  # topk_length per token, for topk = 100
    "zero": lambda rng, s_q: np.zeros(s_q),
    "beyond_topk": lambda rng, s_q: np.r_[INT_MAX, 101, 100 + rng.integers(1, 10_000, s_q - 2)],
    "negative": lambda rng, s_q: np.r_[INT_MIN, -1, -rng.integers(1, 10_000, s_q - 2)],
    "mixed": lambda rng, s_q: np.r_[INT_MIN, -1, 0, 1, 33, 99, 100, 101, INT_MAX][rng.permutation(s_q)],
}


@pytest.mark.parametrize("kind", LENGTHS)
def test_topk_length(backend, kind):
    s_q, s_kv, topk = 9, 400, 100
    case = random_case(seed_of("topk_length", kind), s_q, s_kv, 3, dim(576), topk)
    case.topk_length = LENGTHS[kind](np.random.default_rng(7), s_q).astype(np.int32)
    # Slots past a token's length name rows of the upper half, which no valid slot names: NaN rows.
    beyond = np.arange(topk) >= case.topk_length[:, None].astype(np.int64)
    case.indices[:, 0, :] = case.indices[:, 0, :] % (s_kv // 2) + np.where(beyond, s_kv // 2, 0)
    case.poison_unreferenced_kv()
    run_and_check(backend, case)


SINKS = {  # attn_sink per head
    "finite": lambda rng, h_q: rng.standard_normal(h_q) * 3,
    "+inf": lambda rng, h_q: np.full(h_q, np.inf),
    "-inf": lambda rng, h_q: np.full(h_q, -np.inf),
    "mixed": lambda rng, h_q: rng.choice([np.inf, -np.inf, 0.0, -3.0, 5.0, 30.0, 1e30], h_q),
}


@pytest.mark.parametrize("kind", SINKS)
def test_attn_sink(backend, kind):
    case = random_case(seed_of("sink", kind), 5, 300, 17, dim(576), 100)
    case.attn_sink = SINKS[kind](np.random.default_rng(3), case.h_q).astype(np.float32)
    out, max_logits, lse = run_and_check(backend, case)
    plain = results_numpy(backend, invoke(call_args(backend, dataclasses.replace(case, attn_sink=None))))
    # the sink never changes max_logits or lse, and a sink of -inf changes nothing at all
    np.testing.assert_array_equal(max_logits, plain[1])
    np.testing.assert_array_equal(lse, plain[2])
    if kind == "-inf":
        np.testing.assert_array_equal(out, plain[0])


@pytest.mark.parametrize("with_sink", [False, True], ids=["no_sink", "sink"])
def test_rows_without_valid_slot(backend, with_sink):
    topk = 50
    case = random_case(seed_of("empty rows", with_sink), 6, 100, 17, dim(512), topk)
    case.indices[0] = -1
    case.indices[2, 0] = np.array([INT_MIN, INT_MAX, 100, -100, 100_000], np.int32)[np.arange(topk) % 5]
    case.indices[5, 0] = 100 + np.arange(topk)
    if with_sink:
        case.attn_sink = np.random.default_rng(2).standard_normal(case.h_q).astype(np.float32)
    case.poison_unreferenced_kv()
    out, max_logits, lse = run_and_check(backend, case)
    empty = [0, 2, 5]
    assert (out[empty] == 0).all() and np.isneginf(max_logits[empty]).all() and np.isposinf(lse[empty]).all()


@pytest.mark.parametrize("provide", [True, False], ids=["provided", "allocated"])
def test_no_tokens(backend, provide):
    case = random_case(0, 0, 50, 3, dim(576), 7)
    case.attn_sink = np.zeros(3, np.float32)
    case.topk_length = np.zeros(0, np.int32)
    run_and_check(backend, case, provide=provide)


def _q_every_other_head(case):
    s_q, h_q, d_qk = case.q.shape
    case.q = embedded(case.q, (s_q, 2 * h_q + 1, d_qk), lambda r: r[:, 1::2], 0x7F)


def _q_head_major(case):  # a transpose-permuted view, last dim still contiguous
    s_q, h_q, d_qk = case.q.shape
    case.q = embedded(case.q, (h_q, s_q, d_qk), lambda r: r.transpose(1, 0, 2), 0x7F)


def _kv_padded_rows(case):  # row stride larger than d_qk
    s_kv, _, d_qk = case.kv.shape
    case.kv = embedded(case.kv, (s_kv, 1, d_qk + 96), lambda r: r[:, :, 32:32 + d_qk], 0x7F)


def _kv_interleaved(case):  # the second of two latent rows per token
    s_kv, _, d_qk = case.kv.shape
    case.kv = embedded(case.kv, (s_kv, 2, d_qk), lambda r: r[:, 1:], 0xFF)


def _small_arrays_strided(case):  # indices, attn_sink and topk_length as views with gaps
    s_q, _, topk = case.indices.shape
    case.indices = embedded(case.indices, (s_q, 3, topk + 5), lambda r: r[:, 1:2, 2:2 + topk], INT_MAX)
    case.attn_sink = embedded(case.attn_sink, (2 * case.h_q,), lambda r: r[::2], np.nan)
    case.topk_length = embedded(case.topk_length, (3 * s_q,), lambda r: r[1::3], INT_MIN)


LAYOUTS = {f.__name__[1:]: f for f in
           (_q_every_other_head, _q_head_major, _kv_padded_rows, _kv_interleaved, _small_arrays_strided)}
LAYOUTS.update(q_unaligned=unaligned_q, kv_unaligned=unaligned_kv)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_strided_inputs(backend, layout):
    case = random_case(seed_of("layout", layout), 5, 300, 17, dim(576), 100)
    rng = np.random.default_rng(5)
    case.attn_sink = rng.standard_normal(case.h_q).astype(np.float32)
    case.topk_length = rng.integers(-5, 110, case.s_q).astype(np.int32)
    LAYOUTS[layout](case)
    run_and_check(backend, case)


@pytest.mark.parametrize("as_arrays", [(False, False), (True, True), (True, False), (False, True)],
                         ids=["floats", "arrays", "q_array", "kv_array"])
def test_scales(backend, as_arrays):
    case = random_case(seed_of("scales", as_arrays), 4, 300, 17, dim(512), 100)
    case.q_scale, case.kv_scale, case.scales_as_arrays = 0.37, 1.9, as_arrays
    run_and_check(backend, case)


def test_scalar_types(backend):
    """Scales given as ints or NumPy scalars give the bits that floats give."""
    case = random_case(seed_of("scalar types"), 3, 200, 5, dim(512), 40)
    case.sm_scale, case.q_scale, case.kv_scale = 0.0625, 0.5, 2.0
    want = invoke(call_args(backend, case))
    for sm_scale, q_scale, kv_scale in ((np.float32(0.0625), 0.5, 2), (0.0625, np.float64(0.5), np.float32(2.0))):
        kw = call_args(backend, case)
        kw.update(sm_scale=sm_scale, q_scale=q_scale, kv_scale=kv_scale)
        for a, b in zip(want, invoke(kw)):
            assert backend.raw(a) == backend.raw(b)


def test_strided_outputs(backend):
    case = random_case(4, 5, 300, 17, dim(576), 100)
    s_q, h_q = case.s_q, case.h_q
    out_root = backend.out_buffer((s_q, 2 * h_q, D_V + 64))
    max_logits_root = backend.f32_buffer((s_q, 3 * h_q))
    lse_root = backend.f32_buffer((h_q, s_q))
    kw = call_args(backend, case, provide=False)
    kw.update(out=out_root[:, 1::2, 32:32 + D_V], max_logits=max_logits_root[:, ::3], lse=lse_root.T)
    result = invoke(kw)
    for name, x in zip(("out", "max_logits", "lse"), result):
        assert backend.address(x) == backend.address(kw[name]), name
    assert_matches(results_numpy(backend, result), case.reference(), *backend.tolerances(case.precision))
    # what lies between the views' elements keeps its poison
    gap = np.ones(out_root.shape, bool)
    gap[:, 1::2, 32:32 + D_V] = False
    assert (backend.numpy(out_root)[gap] == OUT_POISON).all()
    gap = np.ones(max_logits_root.shape, bool)
    gap[:, ::3] = False
    assert np.isnan(backend.numpy(max_logits_root)[gap]).all()


def test_out_rows_4_byte_aligned(backend):
    # rows that start 4 bytes past a 16-byte boundary: the kernel stores O 4 bytes at a time there
    case = random_case(6, 3, 300, 70, dim(512), 100)
    s_q, h_q = case.s_q, case.h_q
    out_root = backend.out_buffer((s_q, h_q, D_V + 2))
    kw = call_args(backend, case, provide=False)
    kw.update(out=out_root[:, :, 2:], max_logits=backend.f32_buffer((s_q, h_q)), lse=backend.f32_buffer((s_q, h_q)))
    result = invoke(kw)
    assert_matches(results_numpy(backend, result), case.reference(), *backend.tolerances(case.precision))
    assert (backend.numpy(out_root)[:, :, :2] == OUT_POISON).all()


@pytest.mark.parametrize("h_q", [70, 40])  # the wide kernels, the dual ones (in each precision)
def test_deterministic(backend, h_q):
    """the same bits from two calls, on more tokens than CTAs (those of the persistent grid take several)"""
    case = random_case(5, 300, 2000, h_q, dim(576), 300)
    case.attn_sink = np.random.default_rng(5).standard_normal(case.h_q).astype(np.float32)
    first = invoke(call_args(backend, case))
    second = invoke(call_args(backend, case))
    for a, b in zip(first, second):
        assert backend.raw(a) == backend.raw(b)


@pytest.mark.parametrize("provide", [True, False], ids=["provided", "allocated"])
@pytest.mark.parametrize("as_arrays", [True, False], ids=["tensor_scales", "float_scales"])
def test_sglang_drop_in(torch_backend, as_arrays, provide):
    case = random_case(6, 5, 300, 17, dim(576), 100)
    rng = np.random.default_rng(6)
    case.q_scale, case.kv_scale, case.scales_as_arrays = 0.5, 1.5, (as_arrays, as_arrays)
    case.attn_sink = rng.standard_normal(case.h_q).astype(np.float32)
    case.topk_length = rng.integers(0, 120, case.s_q).astype(np.int32)
    run_and_check(torch_backend, case, provide=provide, api="sglang")


@pytest.mark.parametrize("seed", range(12))
def test_everything_at_once(backend, seed):
    """Random mixes of the cases above: shape, invalid indices, topk_length, sink, scales, a layout."""
    rng = np.random.default_rng(seed)
    s_q, s_kv = int(rng.integers(1, 9)), int(rng.integers(1, 2000))
    h_q, topk = int(rng.choice([1, 2, 3, 17, 64, 70, 128])), int(rng.choice([1, 2, 7, 64, 100, 129, 300]))
    case = random_case(seed_of("mix", seed), s_q, s_kv, h_q, int(rng.choice(table_dims())), topk)
    invalid = rng.random(case.indices.shape) < rng.uniform(0, 0.5)
    case.indices[invalid] = rng.choice(np.array([-1, s_kv, INT_MIN, INT_MAX], np.int32), invalid.sum())
    layout = rng.choice(list(LAYOUTS))
    strided_small = layout == "small_arrays_strided"
    if strided_small or rng.random() < 0.5:
        case.topk_length = rng.integers(-3, topk + 3, s_q).astype(np.int32)
    if strided_small or rng.random() < 0.5:
        case.attn_sink = rng.choice([np.inf, -np.inf, 0.0, 1.0, -4.0], h_q).astype(np.float32)
    case.q_scale, case.kv_scale = rng.uniform(0.25, 2.0, 2)
    case.scales_as_arrays = tuple(rng.random(2) < 0.5)
    case.poison_unreferenced_kv()
    LAYOUTS[layout](case)
    run_and_check(backend, case, provide=bool(rng.random() < 0.5))


@pytest.mark.parametrize("precision", [None, "exact", "fast"], ids=["default", "exact", "fast"])
def test_precision(backend, precision):
    """Both modes within the contract on every backend; the CPU path computes exactly for both."""
    case = random_case(seed_of("precision", precision), 4, 500, 17, dim(576), 130)
    rng = np.random.default_rng(8)
    case.attn_sink = rng.standard_normal(case.h_q).astype(np.float32)
    case.topk_length = rng.integers(0, 140, case.s_q).astype(np.int32)
    case.precision = precision
    got = run_and_check(backend, case)
    if backend.device == "cpu":
        exact = results_numpy(backend, invoke(call_args(backend, dataclasses.replace(case, precision="exact"))))
        for a, b in zip(got, exact):
            np.testing.assert_array_equal(a, b)
