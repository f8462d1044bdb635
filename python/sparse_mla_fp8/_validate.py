"""Argument checks for prefill(), from metadata only (shape, dtype, device): no host sync, no launch.

Each error names the argument, what was expected and what came; the engines match on these texts.
Strides, last-dim contiguity and overlap of outputs with other arrays are left to the native module,
which sees the pointers.
"""

import math
from numbers import Real

from ._capabilities import check_dims
from ._frameworks import device_name, framework_of

_FP8 = ("float8_e4m3fn", "uint8")
_BF16 = ("bfloat16", "uint16", "int16")
_F32 = ("float32",)
_I32 = ("int32",)


def _shape_text(shape):
    return str(tuple(shape))


def _not_an_array(name, a):
    return TypeError(f"{name} must be an array (torch, NumPy, CuPy, JAX or any DLPack exporter), "
                     f"got {type(a).__name__}")


def _device_error(name, device, where):
    return ValueError(f"all arrays must be on one device: q is on {device_name(device)}, "
                      f"{name} is on {device_name(where)}")


def _checked(name, a, allowed, expected, device):
    """a's shape, after the type, dtype and device checks (written out here rather than in helpers:
    this runs for every array of every call)."""
    framework = framework_of(a)
    if framework is None:
        raise _not_an_array(name, a)
    got = framework.dtype_name(a)
    if got not in allowed:
        raise TypeError(f"{name} must be {expected}, got {got}")
    where = framework.device(a)
    if where != device:
        raise _device_error(name, device, where)
    return a.shape


def _scalar(name, x):
    if type(x) is float:
        return x
    if isinstance(x, Real) and framework_of(x) is None:
        return float(x)
    raise TypeError(f"{name} must be a float, got {type(x).__name__}")


def _scale(name, x, device):
    """A float, or a 1-element float32 array on q's device, which the kernel reads itself."""
    if type(x) is float:
        return x
    framework = framework_of(x)
    if framework is None:
        if isinstance(x, Real):
            return float(x)
        raise TypeError(f"{name} must be a float or a 1-element float32 array, got {type(x).__name__}")
    dtype = framework.dtype_name(x)
    if dtype != "float32" or math.prod(x.shape) != 1:
        error = TypeError if dtype != "float32" else ValueError
        raise error(f"{name} must be a float or a 1-element float32 array, "
                    f"got a {dtype} array of shape {_shape_text(x.shape)}")
    where = framework.device(x)
    if where != device:
        raise _device_error(name, device, where)
    return x


def _output(name, a, want, allowed, expected, device):
    if tuple(_checked(name, a, allowed, expected, device)) != want:
        raise ValueError(f"{name} must have shape {want}, got {_shape_text(a.shape)}")


def check_args(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out,
               max_logits, lse):
    """Check every argument of prefill(); returns (framework of q, device, s_q, h_q, sm_scale,
    q_scale, kv_scale) with the scales as the native module takes them."""
    framework = framework_of(q)
    if framework is None:
        raise _not_an_array("q", q)
    got = framework.dtype_name(q)
    if got not in _FP8:
        raise TypeError(f"q must be float8_e4m3fn or uint8 (e4m3fn bytes), got {got}")
    device = framework.device(q)
    if device[0] not in ("cpu", "cuda"):
        raise ValueError(f"q must be on a CPU or CUDA device, got {device_name(device)}")
    shape = q.shape
    if len(shape) != 3:
        raise ValueError(f"q must have shape [s_q, h_q, d_qk], got {_shape_text(shape)}")
    s_q, h_q, d_qk = shape
    check_dims(d_qk, d_v)
    if h_q < 1:
        raise ValueError(f"h_q must be >= 1, got {h_q}")

    shape = _checked("kv", kv, _FP8, "float8_e4m3fn or uint8 (e4m3fn bytes)", device)
    if len(shape) != 3 or shape[1] != 1 or shape[2] != d_qk:
        raise ValueError(f"kv must have shape [s_kv, 1, d_qk] = [*, 1, {d_qk}], got {_shape_text(shape)}")

    shape = _checked("indices", indices, _I32, "int32", device)
    if len(shape) != 3 or shape[0] != s_q or shape[1] != 1:
        raise ValueError(f"indices must have shape [s_q, 1, topk] = [{s_q}, 1, *], got {_shape_text(shape)}")
    if shape[2] < 1:
        raise ValueError(f"topk must be >= 1, got {shape[2]}")

    if attn_sink is not None:
        shape = _checked("attn_sink", attn_sink, _F32, "float32", device)
        if len(shape) != 1 or shape[0] != h_q:
            raise ValueError(f"attn_sink must have shape [h_q] = [{h_q}], got {_shape_text(shape)}")
    if topk_length is not None:
        shape = _checked("topk_length", topk_length, _I32, "int32", device)
        if len(shape) != 1 or shape[0] != s_q:
            raise ValueError(f"topk_length must have shape [s_q] = [{s_q}], got {_shape_text(shape)}")

    sm_scale = _scalar("sm_scale", sm_scale)
    q_scale = _scale("q_scale", q_scale, device)
    kv_scale = _scale("kv_scale", kv_scale, device)

    if out is not None:
        _output("out", out, (s_q, h_q, d_v), _BF16, "bfloat16 or uint16/int16 (bf16 bits)", device)
    if max_logits is not None:
        _output("max_logits", max_logits, (s_q, h_q), _F32, "float32", device)
    if lse is not None:
        _output("lse", lse, (s_q, h_q), _F32, "float32", device)
    return framework, device, s_q, h_q, sm_scale, q_scale, kv_scale
