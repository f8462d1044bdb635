"""The native module re-checks what it is given, so that a caller who bypasses the Python layer gets an
exception, never a crash or a write into its buffers."""

import numpy as np
import pytest

from harness import Backend, assert_refused, call_args, random_case
from sparse_mla_fp8 import _C

S_Q, H_Q, D_QK = 3, 5, 576
NUMPY = Backend("numpy", "cpu")


def _args():
    case = random_case(2, S_Q, 64, H_Q, D_QK, 9)
    case.attn_sink = np.zeros(H_Q, np.float32)
    case.topk_length = np.full(S_Q, 9, np.int32)
    kw = call_args(NUMPY, case)
    kw["sm_scale"] = float(kw["sm_scale"])
    return kw


def _call(kw):
    return _C.prefill(kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], kw["q_scale"], kw["kv_scale"],
                      kw["attn_sink"], kw["topk_length"], kw["out"], kw["max_logits"], kw["lse"], 0, "", "")


BAD = {
    "q_float32": lambda kw: {"q": np.zeros(kw["q"].shape, np.float32)},
    "indices_int64": lambda kw: {"indices": kw["indices"].astype(np.int64)},
    "out_float32": lambda kw: {"out": np.zeros(kw["out"].shape, np.float32)},
    "kv_other_d_qk": lambda kw: {"kv": kw["kv"][..., :512]},
    "indices_other_s_q": lambda kw: {"indices": kw["indices"][:-1]},
    "q_last_dim_strided": lambda kw: {"q": np.zeros((S_Q, H_Q, 2 * D_QK), np.uint8)[..., ::2]},
    "max_logits_is_lse": lambda kw: {"max_logits": kw["lse"]},
    "lse_over_attn_sink": lambda kw: {"attn_sink": kw["lse"][0]},
    "q_scale_float64_array": lambda kw: {"q_scale": np.ones(1, np.float64)},
    "q_scale_two_elements": lambda kw: {"q_scale": np.ones(2, np.float32)},
}


@pytest.mark.parametrize("bad", BAD)
def test_native_refuses(bad):
    kw = _args()
    kw.update(BAD[bad](kw))
    assert_refused(lambda: _call(kw), (TypeError, ValueError), NUMPY,
                   [x for x in kw.values() if hasattr(x, "shape")])


def test_native_runs_good_arguments():
    kw = _args()
    _call(kw)
    assert not np.isnan(kw["lse"]).any()
