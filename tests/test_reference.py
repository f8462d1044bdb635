"""The float64 reference itself, since every other test leans on it: the e4m3fn codec against the
format's definition (and torch's, where torch is there), and reference_prefill on cases whose answer
is known in closed form."""

import math

import numpy as np
import pytest

from harness import INT_MAX, INT_MIN
from sparse_mla_fp8.reference import bf16_bits_to_float32, e4m3_decode, e4m3_encode, reference_prefill

ALL_BYTES = np.arange(256, dtype=np.uint8)
FINITE_BYTES = ALL_BYTES[(ALL_BYTES & 0x7F) != 0x7F]


def test_decode_known_values():
    values = e4m3_decode(ALL_BYTES)
    assert values.dtype == np.float64
    for code, value in [(0x00, 0.0), (0x01, 2.0**-9), (0x07, 7 * 2.0**-9), (0x08, 2.0**-6), (0x38, 1.0),
                        (0x3C, 1.5), (0x40, 2.0), (0x7E, 448.0), (0xFE, -448.0), (0xB8, -1.0)]:
        assert values[code] == value, hex(code)
    assert math.copysign(1.0, values[0x80]) == -1.0 and values[0x80] == 0
    assert np.flatnonzero(np.isnan(values)).tolist() == [0x7F, 0xFF]
    assert (np.diff(values[:0x7F]) > 0).all()
    np.testing.assert_array_equal(values[0x80:0xFF], -values[:0x7F])


def test_encode_round_trips_every_value():
    np.testing.assert_array_equal(e4m3_encode(e4m3_decode(FINITE_BYTES)), FINITE_BYTES)


def test_encode_rounds_half_to_even_and_saturates():
    positive = e4m3_decode(ALL_BYTES[:0x7F])
    middle = (positive[:-1] + positive[1:]) / 2
    lower, upper = np.arange(0x7E), np.arange(1, 0x7F)
    even = np.where(lower % 2 == 0, lower, upper)
    np.testing.assert_array_equal(e4m3_encode(middle), even)
    np.testing.assert_array_equal(e4m3_encode(-middle), even | 0x80)
    np.testing.assert_array_equal(e4m3_encode(np.nextafter(middle, 0)), lower)
    np.testing.assert_array_equal(e4m3_encode(np.nextafter(middle, np.inf)), upper)
    np.testing.assert_array_equal(e4m3_encode([448.0, 449.0, 464.0, 500.0, 1e30, np.inf]), [0x7E] * 6)
    np.testing.assert_array_equal(e4m3_encode([-464.0, -np.inf]), [0xFE] * 2)
    assert np.isnan(e4m3_decode(e4m3_encode([np.nan, -np.nan]))).all()
    assert e4m3_encode(np.float32(1.0)).shape == () and e4m3_encode(np.float32(1.0)) == 0x38


def test_codec_agrees_with_torch():
    torch = pytest.importorskip("torch")
    as_torch = torch.from_numpy(ALL_BYTES.copy()).view(torch.float8_e4m3fn).double().numpy()
    np.testing.assert_array_equal(e4m3_decode(ALL_BYTES), as_torch)
    rng = np.random.default_rng(0)
    x = np.clip(rng.standard_normal(100_000) * np.exp2(rng.uniform(-12, 9, 100_000)), -448, 448)
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(e4m3_encode(x), theirs)


def test_bf16_bits():
    bits = np.array([0x0000, 0x8000, 0x3F80, 0xC000, 0x7F80, 0xFF80, 0x0001], np.uint16)
    got = bf16_bits_to_float32(bits)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [0.0, -0.0, 1.0, -2.0, np.inf, -np.inf, np.float32(2.0**-133)])
    assert np.isnan(bf16_bits_to_float32(np.array([0x7FC0, 0xFFFF], np.uint16))).all()


def _one_row_case(sink=None):
    """One token, one head, d_qk = d_v = 4; kv row 1 is the only valid slot's row, rows 0 and 2 are NaN."""
    q = e4m3_encode([[[1.0, 2.0, 0.5, -1.0]]])
    kv = e4m3_encode([[[np.nan] * 4], [[0.5, 1.0, 2.0, 4.0]], [[np.nan] * 4]])
    s = 0.25 * 3.0 * 2.0 * (0.5 + 2.0 + 1.0 - 4.0)  # sm_scale * q_scale * kv_scale * dot
    v = 2.0 * np.array([0.5, 1.0, 2.0, 4.0])
    return (q, kv), s, v, dict(sm_scale=0.25, q_scale=3.0, kv_scale=2.0, d_v=4, attn_sink=sink)


def _stats(out, max_logits, lse):
    return out[0, 0], max_logits[0, 0], lse[0, 0]


def test_single_valid_slot_among_invalid_ones():
    (q, kv), s, v, kw = _one_row_case()
    indices = np.array([[[INT_MIN, 1, 3, -1, INT_MAX, 2]]], np.int32)
    out, max_logit, lse = _stats(*reference_prefill(q, kv, indices, topk_length=np.array([5], np.int32), **kw))
    np.testing.assert_allclose(out, v, rtol=1e-15)
    assert max_logit == pytest.approx(s, rel=1e-15) and lse == pytest.approx(s, rel=1e-15)


def test_duplicates_count_separately():
    (q, kv), s, v, kw = _one_row_case()
    out, max_logit, lse = _stats(*reference_prefill(q, kv, np.array([[[1, 1, 1]]], np.int32), **kw))
    np.testing.assert_allclose(out, v, rtol=1e-15)
    assert max_logit == pytest.approx(s) and lse == pytest.approx(s + math.log(3))


@pytest.mark.parametrize("sink", [-1.5, np.inf, -np.inf])
def test_sink(sink):
    (q, kv), s, v, kw = _one_row_case(np.array([sink], np.float32))
    out, max_logit, lse = _stats(*reference_prefill(q, kv, np.array([[[1]]], np.int32), **kw))
    np.testing.assert_allclose(out, v * math.exp(s) / (math.exp(s) + math.exp(sink)), rtol=1e-15)
    assert max_logit == pytest.approx(s) and lse == pytest.approx(s)


@pytest.mark.parametrize("length", [0, -1, INT_MIN])
def test_rows_without_valid_slot(length):
    (q, kv), _, _, kw = _one_row_case(np.array([2.0], np.float32))
    out, max_logit, lse = _stats(*reference_prefill(
        q, kv, np.array([[[1, 0, 2]]], np.int32), topk_length=np.array([length], np.int32), **kw))
    assert (out == 0).all() and max_logit == -np.inf and lse == np.inf


def test_no_tokens():
    out, max_logits, lse = reference_prefill(np.zeros((0, 3, 8), np.uint8), np.zeros((5, 1, 8), np.uint8),
                                             np.zeros((0, 1, 2), np.int32), 1.0, d_v=4)
    assert out.shape == (0, 3, 4) and max_logits.shape == lse.shape == (0, 3)


def test_chunks_and_strides_do_not_matter():
    """Token chunks (topk 2048 x d_qk 576 spans several) and strided inputs give what one token alone does."""
    rng = np.random.default_rng(0)
    q = e4m3_encode(rng.standard_normal((3, 10, 576)) * 1.5).transpose(1, 0, 2)  # [10, 3, 576], strided
    kv = e4m3_encode(rng.standard_normal((4000, 1, 576)) * 1.5)
    indices = rng.integers(-100, 4100, (10, 1, 2048), dtype=np.int32)
    length = rng.integers(-10, 2100, 10).astype(np.int32)
    sink = np.array([0.5, np.inf, -np.inf], np.float32)
    whole = reference_prefill(q, kv, indices, 0.05, attn_sink=sink, topk_length=length)
    for t in range(10):
        alone = reference_prefill(np.ascontiguousarray(q[t:t + 1]), kv, indices[t:t + 1], 0.05, attn_sink=sink,
                                  topk_length=length[t:t + 1])
        for a, b in zip(whole, alone):
            np.testing.assert_array_equal(a[t:t + 1], b)
