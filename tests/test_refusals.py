"""Every refusal of the contract, on every backend: the error type, its text (exact where the contract
fixes it, else the argument it must name), and nothing written to any buffer the caller passed."""

import numpy as np
import pytest

from harness import (D_V, INT_MAX, Backend, assert_refused, call_args, d_v_error, dim, dims_error, e4m3_randn,
                     embedded, invoke, precision_error, random_case, run_and_check, table_dims)

S_Q, S_KV, H_Q, D_QK, TOPK = 4, 100, 8, dim(576), 16
_RNG = np.random.default_rng(0)


UNKNOWN_D_QK = next(d for d in (128, 64, 256, 1024) if d not in table_dims())


def _fp8(b, shape):
    return b.put(e4m3_randn(_RNG, shape), fp8=True)


def _zeros(b, shape, dtype):
    return b.put(np.zeros(shape, dtype))


def _overlapping_stats(b, kw):
    both = b.f32_buffer((S_Q, H_Q + 1))
    return {"max_logits": both[:, :H_Q], "lse": both[:, 1:]}


def _lse_over_sink(b, kw):
    lse = b.f32_buffer((S_Q, H_Q))
    return {"lse": lse, "attn_sink": lse[1]}


def _max_logits_over_q_scale(b, kw):
    both = b.f32_buffer((S_Q, H_Q + 1))
    return {"max_logits": both[:, :H_Q], "q_scale": both[0, H_Q:]}  # between max_logits' rows


def _lse_over_kv_scale(b, kw):
    lse = b.f32_buffer((S_Q, H_Q))
    return {"lse": lse, "kv_scale": lse[1, 2:3]}


def _d_qk_not_in_table(b, kw):
    return {"q": _fp8(b, (S_Q, H_Q, UNKNOWN_D_QK)), "kv": _fp8(b, (S_KV, 1, UNKNOWN_D_QK))}


# (id, changes(backend, good arguments) -> the arguments to replace, exception, fixed text, names)
REFUSALS = [
    # dtypes
    ("q_float32", lambda b, kw: {"q": _zeros(b, (S_Q, H_Q, D_QK), np.float32)}, TypeError, None, ["q", "float32"]),
    ("kv_float32", lambda b, kw: {"kv": _zeros(b, (S_KV, 1, D_QK), np.float32)}, TypeError, None,
     ["kv", "float32"]),
    ("q_int8", lambda b, kw: {"q": _zeros(b, (S_Q, H_Q, D_QK), np.int8)}, TypeError, None, ["q", "int8"]),
    ("indices_int64", lambda b, kw: {"indices": _zeros(b, (S_Q, 1, TOPK), np.int64)}, TypeError, None,
     ["indices", "int64"]),
    ("attn_sink_float64", lambda b, kw: {"attn_sink": _zeros(b, (H_Q,), np.float64)}, TypeError, None,
     ["attn_sink", "float64"]),
    ("topk_length_int64", lambda b, kw: {"topk_length": _zeros(b, (S_Q,), np.int64)}, TypeError, None,
     ["topk_length", "int64"]),
    ("q_scale_float64_array", lambda b, kw: {"q_scale": _zeros(b, (1,), np.float64)}, TypeError, None,
     ["q_scale"]),
    ("kv_scale_int32_array", lambda b, kw: {"kv_scale": _zeros(b, (1,), np.int32)}, TypeError, None,
     ["kv_scale"]),
    ("q_scale_str", lambda b, kw: {"q_scale": "1.0"}, TypeError, None, ["q_scale"]),
    ("out_float32", lambda b, kw: {"out": b.f32_buffer((S_Q, H_Q, D_V))}, TypeError, None, ["out", "float32"]),
    ("max_logits_float64", lambda b, kw: {"max_logits": _zeros(b, (S_Q, H_Q), np.float64)}, TypeError, None,
     ["max_logits", "float64"]),
    ("lse_int32", lambda b, kw: {"lse": _zeros(b, (S_Q, H_Q), np.int32)}, TypeError, None, ["lse", "int32"]),
    # not arrays
    ("q_list", lambda b, kw: {"q": np.zeros((S_Q, H_Q, D_QK), np.uint8).tolist()}, TypeError, None, ["q"]),
    ("indices_list", lambda b, kw: {"indices": [[[0] * TOPK]] * S_Q}, TypeError, None, ["indices"]),
    ("attn_sink_list", lambda b, kw: {"attn_sink": [0.0] * H_Q}, TypeError, None, ["attn_sink"]),
    # buffers that nanobind could read but that are not DLPack arrays
    ("kv_memoryview", lambda b, kw: {"kv": memoryview(np.zeros((S_KV, 1, D_QK), np.uint8))}, TypeError, None,
     ["kv"]),
    ("q_scale_memoryview", lambda b, kw: {"q_scale": memoryview(np.ones(1, np.float32))}, TypeError, None,
     ["q_scale"]),
    # shapes
    ("q_2d", lambda b, kw: {"q": _fp8(b, (S_Q * H_Q, D_QK))}, ValueError, None, ["q"]),
    ("q_4d", lambda b, kw: {"q": _fp8(b, (S_Q, H_Q, 1, D_QK))}, ValueError, None, ["q"]),
    ("kv_two_heads", lambda b, kw: {"kv": _fp8(b, (S_KV, 2, D_QK))}, ValueError, None, ["kv"]),
    ("kv_other_d_qk", lambda b, kw: {"kv": _fp8(b, (S_KV, 1, D_QK - 64))}, ValueError, None, ["kv"]),
    ("kv_2d", lambda b, kw: {"kv": _fp8(b, (S_KV, D_QK))}, ValueError, None, ["kv"]),
    ("indices_s_q", lambda b, kw: {"indices": _zeros(b, (S_Q + 1, 1, TOPK), np.int32)}, ValueError, None,
     ["indices"]),
    ("indices_two_heads", lambda b, kw: {"indices": _zeros(b, (S_Q, 2, TOPK), np.int32)}, ValueError, None,
     ["indices"]),
    ("indices_2d", lambda b, kw: {"indices": _zeros(b, (S_Q, TOPK), np.int32)}, ValueError, None, ["indices"]),
    ("attn_sink_shape", lambda b, kw: {"attn_sink": _zeros(b, (H_Q + 1,), np.float32)}, ValueError, None,
     ["attn_sink"]),
    ("attn_sink_2d", lambda b, kw: {"attn_sink": _zeros(b, (1, H_Q), np.float32)}, ValueError, None,
     ["attn_sink"]),
    ("topk_length_shape", lambda b, kw: {"topk_length": _zeros(b, (S_Q + 1,), np.int32)}, ValueError, None,
     ["topk_length"]),
    ("q_scale_two_elements", lambda b, kw: {"q_scale": _zeros(b, (2,), np.float32)}, ValueError, None,
     ["q_scale"]),
    ("out_d_v", lambda b, kw: {"out": b.out_buffer((S_Q, H_Q, 256))}, ValueError, None, ["out"]),
    ("out_2d", lambda b, kw: {"out": b.out_buffer((S_Q * H_Q, D_V))}, ValueError, None, ["out"]),
    ("max_logits_shape", lambda b, kw: {"max_logits": b.f32_buffer((S_Q, H_Q + 1))}, ValueError, None,
     ["max_logits"]),
    ("lse_transposed", lambda b, kw: {"lse": b.f32_buffer((H_Q, S_Q))}, ValueError, None, ["lse"]),
    ("h_q_zero", lambda b, kw: {"q": _fp8(b, (S_Q, 0, D_QK)), "attn_sink": None, "out": None,
                                "max_logits": None, "lse": None}, ValueError, None, ["h_q"]),
    ("topk_zero", lambda b, kw: {"indices": _zeros(b, (S_Q, 1, 0), np.int32)}, ValueError, None, ["topk"]),
    # head dims: the contract's fixed texts
    ("d_qk_not_in_table", _d_qk_not_in_table, ValueError, dims_error(UNKNOWN_D_QK), []),
    ("d_v_256", lambda b, kw: {"d_v": 256}, ValueError, d_v_error(256), []),
    ("d_v_576", lambda b, kw: {"d_v": 576}, ValueError, d_v_error(576), []),
    # last dim not contiguous
    ("q_last_dim_strided", lambda b, kw: {"q": b.put(embedded(
        e4m3_randn(_RNG, (S_Q, H_Q, D_QK)), (S_Q, H_Q, 2 * D_QK), lambda r: r[..., ::2], 0), fp8=True)},
     ValueError, None, ["q"]),
    ("kv_last_dim_strided", lambda b, kw: {"kv": b.put(embedded(
        e4m3_randn(_RNG, (S_KV, 1, D_QK)), (S_KV, 1, 2 * D_QK), lambda r: r[..., 1::2], 0), fp8=True)},
     ValueError, None, ["kv"]),
    ("indices_last_dim_strided", lambda b, kw: {"indices": b.put(embedded(
        np.zeros((S_Q, 1, TOPK), np.int32), (S_Q, 1, 3 * TOPK), lambda r: r[..., ::3], INT_MAX))},
     ValueError, None, ["indices"]),
    ("out_last_dim_strided", lambda b, kw: {"out": b.out_buffer((S_Q, H_Q, 2 * D_V))[..., ::2]},
     ValueError, None, ["out"]),
    # overlapping outputs, with each other and with an input
    ("max_logits_is_lse", lambda b, kw: {"max_logits": kw["lse"]}, ValueError, None, ["max_logits", "lse"]),
    ("max_logits_overlaps_lse", _overlapping_stats, ValueError, None, ["max_logits", "lse"]),
    ("lse_overlaps_attn_sink", _lse_over_sink, ValueError, None, ["lse", "attn_sink"]),
    ("max_logits_overlaps_q_scale", _max_logits_over_q_scale, ValueError, None, ["max_logits", "q_scale"]),
    ("lse_overlaps_kv_scale", _lse_over_kv_scale, ValueError, None, ["lse", "kv_scale"]),
    # precision: the contract's fixed text
    ("precision_unknown", lambda b, kw: {"precision": "fastest"}, ValueError, precision_error("fastest"), []),
    ("precision_capitalised", lambda b, kw: {"precision": "Exact"}, ValueError, precision_error("Exact"), []),
    ("precision_empty", lambda b, kw: {"precision": ""}, ValueError, precision_error(""), []),
    ("precision_nul", lambda b, kw: {"precision": "exact\0"}, ValueError, precision_error("exact\0"), []),
    ("precision_not_a_string", lambda b, kw: {"precision": 1}, ValueError, precision_error(1), []),
]


def _good_case():
    case = random_case(1, S_Q, S_KV, H_Q, D_QK, TOPK)
    case.attn_sink = np.zeros(H_Q, np.float32)
    case.topk_length = np.full(S_Q, TOPK, np.int32)
    return case


def _buffers(kw):
    return [x for x in kw.values() if hasattr(x, "shape") and not isinstance(x, memoryview)]


@pytest.mark.parametrize("changes, exc, text, names", [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused(backend, changes, exc, text, names):
    kw = call_args(backend, _good_case())
    kw.update(changes(backend, kw))
    assert_refused(lambda: invoke(kw), exc, backend, _buffers(kw), match=text, names=names)


def test_good_arguments_pass(backend):
    """The refusals above change one argument of this call, which goes through and is right."""
    run_and_check(backend, _good_case())


@pytest.mark.parametrize("provide", [True, False], ids=["provided", "allocated"])
def test_refused_with_outputs_missing(backend, provide):
    """A refusal of a call that gives only some outputs (prefill allocates the others) writes none of them."""
    kw = call_args(backend, _good_case(), provide)
    kw.update(max_logits=backend.f32_buffer((S_Q, H_Q)), precision="exact ")
    assert_refused(lambda: invoke(kw), ValueError, backend, _buffers(kw), match=precision_error("exact "))


def test_read_only_out():
    """A NumPy output that cannot be written: a TypeError naming it (not nanobind's signature dump)."""
    numpy = Backend("numpy", "cpu")
    kw = call_args(numpy, _good_case())
    for name in ("out", "max_logits", "lse"):
        given = {**kw, name: kw[name].copy()}
        given[name].flags.writeable = False
        assert_refused(lambda: invoke(given), TypeError, numpy, _buffers(given), names=[name, "read-only"])


def test_sglang_fixed_texts(torch_backend):
    kw = call_args(torch_backend, _good_case())
    assert_refused(lambda: invoke({**kw, "d_v": 256}, api="sglang"), ValueError, torch_backend, _buffers(kw),
                   match=d_v_error(256))
    assert_refused(lambda: invoke({**kw, "precision": "fp8"}, api="sglang"), ValueError, torch_backend,
                   _buffers(kw), match=precision_error("fp8"))
    kw.update(_d_qk_not_in_table(torch_backend, kw))
    assert_refused(lambda: invoke(kw, api="sglang"), ValueError, torch_backend, _buffers(kw),
                   match=dims_error(UNKNOWN_D_QK))


def test_out_overlapping_q():
    """out over the bytes of q (NumPy: the one framework where two dtypes over one buffer are plain)."""
    case = _good_case()
    q_bytes = S_Q * H_Q * D_QK
    root = np.zeros(max(q_bytes, S_Q * H_Q * D_V * 2), np.uint8)
    q = root[:q_bytes].reshape(S_Q, H_Q, D_QK)
    q[...] = case.q
    out = root[:S_Q * H_Q * D_V * 2].view(np.uint16).reshape(S_Q, H_Q, D_V)
    numpy = Backend("numpy", "cpu")
    kw = {**call_args(numpy, case), "q": q, "out": out}
    assert_refused(lambda: invoke(kw), ValueError, numpy, _buffers(kw), names=["out", "q"])


def test_outputs_with_overlapping_elements():
    """An output two of whose elements share memory (a broadcast view, stride 0) is refused: two CTAs
    would write one place. NumPy's writable strided view and torch's expand both reach the check."""
    case = _good_case()
    numpy = Backend("numpy", "cpu")
    kw = {**call_args(numpy, case),
          "lse": np.lib.stride_tricks.as_strided(np.zeros(H_Q, np.float32), (S_Q, H_Q), (0, 4), writeable=True)}
    assert_refused(lambda: invoke(kw), ValueError, numpy, _buffers(kw), names=["lse", "overlap"])
    torch = pytest.importorskip("torch")
    cpu = Backend("torch-fp8", "cpu")
    kw = call_args(cpu, case)
    kw["out"] = kw["out"][:, :1].expand(S_Q, H_Q, D_V)
    assert_refused(lambda: invoke(kw), ValueError, cpu, _buffers(kw), names=["out", "overlap"])
