"""Float64 reference of the sparse MLA prefill, in NumPy alone.

It is the yardstick of the tests and of the benchmark's accuracy figures, so it owes nothing to the
kernels or to any float8 library: the e4m3fn table below is built from the format's definition.
"""

import numpy as np

__all__ = ["e4m3_decode", "e4m3_encode", "bf16_bits_to_float32", "valid_slots", "reference_prefill"]


def _e4m3_table() -> np.ndarray:
    # e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal; there is
    # no infinity, and S.1111.111 is the only NaN, which frees S.1111.110 = 448 as the largest value.
    code = np.arange(256)
    exponent = (code >> 3) & 0xF
    mantissa = (code & 0x7) / 8.0
    magnitude = np.where(exponent == 0, mantissa * 2.0**-6, (1.0 + mantissa) * 2.0 ** (exponent - 7))
    magnitude[(code & 0x7F) == 0x7F] = np.nan
    return np.where(code & 0x80, -magnitude, magnitude)


_E4M3 = _e4m3_table()
_E4M3.flags.writeable = False


def e4m3_decode(bytes_u8: np.ndarray) -> np.ndarray:
    """float64 values of e4m3fn bytes (NaN for 0x7f and 0xff)."""
    codes = np.asarray(bytes_u8)
    if codes.dtype != np.uint8:
        raise TypeError(f"e4m3_decode takes uint8 e4m3fn bytes, got {codes.dtype}")
    return _E4M3[codes]


def e4m3_encode(x: np.ndarray) -> np.ndarray:
    """e4m3fn bytes of x: round to nearest, ties to even; beyond +-448 (infinities too) saturates to
    +-448; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    magnitude = np.where(nan, 0.0, np.minimum(np.abs(x), 448.0))
    # The binade [2^(e-1), 2^e) holds 8 values, a step of 2^(e-4) apart; zero and the subnormals share
    # the step of the lowest binade (e = -5). Counting in steps, a code is 8 per binade above the lowest
    # plus the step count, and the step count's parity is the mantissa's: rint's ties-to-even is RNE.
    mantissa, exponent = np.frexp(magnitude)
    exponent = np.where(mantissa > 0, np.maximum(exponent, -5), -5)
    steps = np.rint(np.ldexp(magnitude, 4 - exponent)).astype(np.int64)
    code = np.where(nan, 0x7F, (exponent + 5) * 8 + steps)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def bf16_bits_to_float32(bits_u16: np.ndarray) -> np.ndarray:
    """float32 values of bf16 bit patterns held in uint16 (or int16) arrays; exact, NaNs included."""
    bits = np.asarray(bits_u16)
    if bits.dtype not in (np.uint16, np.int16):
        raise TypeError(f"bf16_bits_to_float32 takes uint16 or int16 bit patterns, got {bits.dtype}")
    return (bits.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def valid_slots(indices: np.ndarray, s_kv: int, topk_length=None) -> np.ndarray:
    """bool [s_q, topk]: slot i of token t is valid iff 0 <= j < s_kv and i < topk_length[t].

    indices is [s_q, 1, topk]; a topk_length outside [0, topk] acts as if clamped.
    """
    idx = np.asarray(indices)[:, 0, :].astype(np.int64)
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        length = np.asarray(topk_length).astype(np.int64)
        valid &= np.arange(idx.shape[1])[None, :] < length[:, None]
    return valid


def _scalar(x) -> float:
    # a scale may come as a Python float or a 1-element array, as the package takes it
    return float(np.asarray(x, dtype=np.float64).reshape(()))


# Float64 elements of the gathered KV rows held at once: bounds memory for topk 2048 at d_qk 576.
_CHUNK_ELEMENTS = 1 << 23


def reference_prefill(q_u8, kv_u8, indices, sm_scale, q_scale=1.0, kv_scale=1.0, d_v=512,
                      attn_sink=None, topk_length=None):
    """(out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q]), float64, of the contract's operation
    on the dequantized inputs: q_u8 [s_q, h_q, d_qk] and kv_u8 [s_kv, 1, d_qk] e4m3fn bytes, indices
    [s_q, 1, topk]. lse is a natural log; a row with no valid slot gets out 0, max_logits -inf,
    lse +inf. Invalid slots are never read, so a NaN in a KV row that no valid slot names cannot leak.
    """
    q_u8, kv_u8, indices = np.asarray(q_u8), np.asarray(kv_u8), np.asarray(indices)
    s_q, h_q, d_qk = q_u8.shape
    s_kv, topk = kv_u8.shape[0], indices.shape[-1]
    logit_scale = float(sm_scale) * _scalar(q_scale) * _scalar(kv_scale)
    v_scale = _scalar(kv_scale)
    sink = None if attn_sink is None else np.asarray(attn_sink, dtype=np.float64)

    valid = valid_slots(indices, s_kv, topk_length)
    # every gathered row is a real one; invalid slots point at row 0 and are zeroed and masked below
    safe_rows = np.where(valid, indices[:, 0, :], 0)

    out = np.zeros((s_q, h_q, d_v))
    max_logits = np.full((s_q, h_q), -np.inf)
    lse = np.full((s_q, h_q), np.inf)
    if s_kv == 0:
        return out, max_logits, lse
    chunk = max(1, _CHUNK_ELEMENTS // max(1, topk * d_qk))
    with np.errstate(over="ignore"):  # exp(sink - max) may overflow to inf: then out is 0, as it should
        for start in range(0, s_q, chunk):
            tokens = slice(start, start + chunk)
            ok = valid[tokens]
            rows = np.where(ok[..., None], e4m3_decode(kv_u8[safe_rows[tokens], 0, :]), 0.0)
            logits = logit_scale * (e4m3_decode(q_u8[tokens]) @ rows.transpose(0, 2, 1))
            logits = np.where(ok[:, None, :], logits, -np.inf)  # [tokens, h_q, topk]
            row_max = logits.max(axis=-1, initial=-np.inf)
            nonempty = np.isfinite(row_max)
            shift = np.where(nonempty, row_max, 0.0)
            weights = np.exp(logits - shift[..., None])
            total = weights.sum(axis=-1)
            denominator = total if sink is None else total + np.exp(sink[None, :] - shift)
            values = weights @ (v_scale * rows[..., :d_v])
            out[tokens] = np.where(nonempty[..., None],
                                   values / np.where(nonempty, denominator, 1.0)[..., None], 0.0)
            max_logits[tokens] = row_max
            lse[tokens] = np.where(nonempty, shift + np.log(np.where(nonempty, total, 1.0)), np.inf)
    return out, max_logits, lse
