"""The native module re-checks what it is given, so that a caller who bypasses the Python layer gets an
exception, never a crash or a write into its buffers; and it chooses the GPU kernel itself (the
registry, kernels/registry.h), so no caller can pair a call with another d_qk's kernel."""

import importlib.util
import pathlib
import re

import numpy as np
import pytest

from harness import Backend, assert_refused, call_args, dim, precision_error, random_case
from sparse_mla_fp8 import _C

S_Q, H_Q, D_QK = 3, 5, dim(576)
NUMPY = Backend("numpy", "cpu")


def _args():
    case = random_case(2, S_Q, 64, H_Q, D_QK, 9)
    case.attn_sink = np.zeros(H_Q, np.float32)
    case.topk_length = np.full(S_Q, 9, np.int32)
    kw = call_args(NUMPY, case)
    kw["sm_scale"] = float(kw["sm_scale"])
    return kw


def _positional(kw):
    return [kw[k] for k in ("q", "kv", "indices", "sm_scale", "q_scale", "kv_scale", "attn_sink", "topk_length",
                            "out", "max_logits", "lse")]


def _call(kw):
    return _C.prefill(*_positional(kw), 0)


BAD = {
    "q_float32": lambda kw: {"q": np.zeros(kw["q"].shape, np.float32)},
    "indices_int64": lambda kw: {"indices": kw["indices"].astype(np.int64)},
    "out_float32": lambda kw: {"out": np.zeros(kw["out"].shape, np.float32)},
    "kv_other_d_qk": lambda kw: {"kv": kw["kv"][..., :D_QK - 64]},
    "indices_other_s_q": lambda kw: {"indices": kw["indices"][:-1]},
    "q_last_dim_strided": lambda kw: {"q": np.zeros((S_Q, H_Q, 2 * D_QK), np.uint8)[..., ::2]},
    "max_logits_is_lse": lambda kw: {"max_logits": kw["lse"]},
    "lse_over_attn_sink": lambda kw: {"attn_sink": kw["lse"][0]},
    "q_scale_float64_array": lambda kw: {"q_scale": np.ones(1, np.float64)},
    "q_scale_two_elements": lambda kw: {"q_scale": np.ones(2, np.float32)},
    "lse_over_kv_scale": lambda kw: {"kv_scale": kw["lse"][1, 1:2]},
    "out_read_only": lambda kw: {"out": np.frombuffer(kw["out"].tobytes(), np.uint16).reshape(kw["out"].shape)},
    "q_not_an_array": lambda kw: {"q": kw["q"].tolist()},
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


def test_native_takes_no_kernel_from_the_caller():
    """The kernel and its fatbin follow from the checked call: _C.prefill takes no fatbin or kernel name
    (it once did, and ran d_qk 512 arrays with the 576 fatbin it was handed, reading past each row)."""
    kw = _args()
    with pytest.raises(TypeError):
        _C.prefill(kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], kw["q_scale"], kw["kv_scale"], kw["attn_sink"],
                   kw["topk_length"], kw["out"], kw["max_logits"], kw["lse"], 0, "sparse_mla_fp8_d576.fatbin",
                   "sparse_mla_fp8_prefill_d576")
    assert "fatbin" not in _C.prefill.__doc__


# (h_q, topk) -> the kernel that runs it: the bounds of each kernel's takes() (kernels/sm90/*/config.h)
KERNEL_OF = {
    (128, 2048): "wide", (65, 1): "wide", (128, 2049): "fallback", (300, 16384): "fallback",
    (64, 255): "dual", (64, 256): "dual", (33, 1023): "dual", (64, 1024): "dual", (64, 2048): "dual",
    (64, 2049): "split", (33, 4096): "split",
    (64, 4097): "fallback", (33, 16): "dual", (64, 1): "dual", (1, 1): "narrow8", (8, 1 << 20): "narrow8",
    (9, 1): "narrow16", (16, 16): "narrow16", (16, 1 << 20): "narrow16", (17, 4096): "narrow32", (32, 1): "narrow32",
    (32, 1 << 20): "narrow32",
}


# where precision "fast" runs another kernel than KERNEL_OF's
FAST_KERNEL_OF = {(128, 2048): "wide_fast", (65, 1): "wide_fast", (64, 255): "dual_fast", (64, 256): "dual_fast",
                  (33, 1023): "dual_fast", (64, 1024): "dual_fast", (64, 2048): "dual_fast", (33, 16): "dual_fast",
                  (64, 1): "dual_fast"}


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_kernel_for(precision):
    """The fast kernels come first for the calls they take; the exact kernels take the rest of both
    precisions."""
    names = _C.kernel_names()
    assert names[-1] == "fallback" and len(set(names)) == len(names), names
    table = {**KERNEL_OF, **FAST_KERNEL_OF} if precision == "fast" else KERNEL_OF
    for (h_q, topk), kernel in table.items():
        assert _C.kernel_for(h_q, topk, precision) == kernel, (h_q, topk)
    assert set(KERNEL_OF.values()) | set(FAST_KERNEL_OF.values()) == set(names)


def test_fast_kernels_are_named_so():
    """A kernel that only precision "fast" runs is named *_fast (the GPU tests check a forced one
    against that precision's bounds), and no other is."""
    calls = [(h_q, topk) for h_q in range(1, 140) for topk in (1, 255, 256, 1023, 1024, 2048, 2049, 4096, 4097)]
    exact = {_C.kernel_for(h_q, topk, "exact") for h_q, topk in calls}
    fast = {_C.kernel_for(h_q, topk, "fast") for h_q, topk in calls}
    assert fast - exact == {name for name in _C.kernel_names() if name.endswith("_fast")}


def test_sanitize_configurations_name_the_registry_choice():
    """ci/sanitize_case.py asserts which kernel each configuration runs only on a GPU: its table is
    checked against the registry here, so that a change of the registry cannot leave it stale."""
    path = pathlib.Path(__file__).parent.parent / "ci" / "sanitize_case.py"
    spec = importlib.util.spec_from_file_location("sanitize_case", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for d_qk, h_q, topk, s_q, seed, kernel, forced in module.configurations(_C.kernel_names()):
        if not forced:
            assert _C.kernel_for(h_q, topk, module.precision_of(kernel)) == kernel, (h_q, topk, kernel)


def test_kernel_for_default_precision():
    assert all(_C.kernel_for(h_q, topk) == _C.kernel_for(h_q, topk, "exact") for h_q, topk in KERNEL_OF)


@pytest.mark.parametrize("precision", ["Exact", "", 0, b"exact"])
def test_kernel_for_refuses_other_precisions(precision):
    with pytest.raises(ValueError, match=f'precision must be "exact" or "fast", got {re.escape(repr(precision))}'):
        _C.kernel_for(64, 64, precision)


@pytest.mark.parametrize("name", ["nope", "", "sparse_mla_fp8_prefill_d576_wide"])
def test_force_kernel_refuses_unknown_names(name):
    kw = _args()
    assert_refused(lambda: _C.prefill(*_positional(kw), 0, name), ValueError, NUMPY,
                   [x for x in kw.values() if hasattr(x, "shape")], match="no kernel named")


def test_force_kernel_refused_on_the_cpu():
    kw = _args()
    assert_refused(lambda: _C.prefill(*_positional(kw), 0, "wide"), ValueError, NUMPY,
                   [x for x in kw.values() if hasattr(x, "shape")], match="arrays are on the CPU")


def test_native_runs_no_tokens():
    """s_q = 0: checked, then nothing to run (an empty array's strides are whatever its exporter wrote)."""
    kw = _args()
    for name in ("q", "indices", "out", "max_logits", "lse", "topk_length"):
        kw[name] = kw[name][:0]
    _call(kw)


class _Abstract:
    """What JAX and torch trace with: a shape and a dtype, no data."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def _abstract(kw, dtype_name=str):
    return {k: _Abstract(v.shape, dtype_name(v.dtype)) if isinstance(v, np.ndarray) else v for k, v in kw.items()}


def _check(kw, **keywords):
    return _C.check(kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], kw["q_scale"], kw["kv_scale"],
                    kw["attn_sink"], kw["topk_length"], kw["out"], kw["max_logits"], kw["lse"], **keywords)


@pytest.mark.parametrize("outputs", [True, False], ids=["outputs", "no_outputs"])
def test_check_takes_abstract_arrays(outputs):
    kw = _abstract(_args())
    if not outputs:
        kw.update(out=None, max_logits=None, lse=None)
    _check(kw)
    _check(kw, precision="fast")
    torch_named = _abstract(_args(), lambda dt: {"uint8": "torch.float8_e4m3fn", "uint16": "torch.bfloat16"}.get(
        str(dt), "torch." + str(dt)))
    _check(torch_named)


ABSTRACT_BAD = {  # the refusals that need no data, as prefill words them
    "q_float32": (lambda kw: {"q": _Abstract(kw["q"].shape, "float32")}, TypeError, "q must be float8_e4m3fn"),
    "kv_other_d_qk": (lambda kw: {"kv": _Abstract((64, 1, D_QK - 64), "uint8")}, ValueError, "kv must have shape"),
    "out_shape": (lambda kw: {"out": _Abstract((S_Q, H_Q, 256), "uint16")}, ValueError, "out must have shape"),
    "d_qk": (lambda kw: {"q": _Abstract((S_Q, H_Q, 128), "uint8"), "kv": _Abstract((64, 1, 128), "uint8")},
             ValueError, "sparse_mla_q8kv8_prefill_fwd supports d_qk="),
    "topk_length_dtype": (lambda kw: {"topk_length": _Abstract((S_Q,), "int64")}, TypeError, "topk_length must be"),
    "q_scale_shape": (lambda kw: {"q_scale": _Abstract((2,), "float32")}, ValueError, "q_scale must have 1 element"),
    "q_no_shape": (lambda kw: {"q": object()}, TypeError, "q must be an array"),
}


@pytest.mark.parametrize("bad", ABSTRACT_BAD)
def test_check_refuses_abstract_arrays(bad):
    changes, exc, text = ABSTRACT_BAD[bad]
    kw = _abstract(_args())
    kw.update(changes(kw))
    with pytest.raises(exc, match=re.escape(text)):
        _check(kw)


def test_check_refuses_precision():
    with pytest.raises(ValueError, match=re.escape(precision_error("FAST"))):
        _check(_abstract(_args()), precision="FAST")
