"""prefill() as a JAX primitive: an XLA FFI custom call to the native module's handlers (xla_ffi.cpp), on
the CPU path or on XLA's CUDA stream, with outputs that XLA allocates. It works eagerly and under
jax.jit alike.

Imported the first time prefill() sees a JAX array (the caller has imported jax by then); the import
registers the handlers with XLA. The call is checked at trace time by the same native checks as any
other call (_C.check, on shapes and dtypes), and again by the handler on XLA's buffers.

Python floats (sm_scale, and q_scale / kv_scale when they are floats) are attributes of the custom
call, compiled into it: a scale that changes from call to call is better passed as a 1-element
float32 array, which is an operand.
"""

import jax
import jax.numpy as jnp
import numpy as np

from . import _C
from ._capabilities import _set_kernel_dir, require_kernel
from ._frameworks import default_cpu_threads, framework_of
from ._validate import number, scale

_TARGET = "sparse_mla_fp8_prefill"
_OPERAND_BITS = dict(_C.XLA_OPERANDS)

for _platform, _handler in _C.xla_ffi_targets().items():
    jax.ffi.register_ffi_target(_TARGET, _handler, platform=_platform)
if _C.HAS_CUDA:
    _set_kernel_dir()  # the handler's launches load the fatbins from there


def _is_array(x):
    return isinstance(x, (jax.Array, np.ndarray))


def _require_jax_arrays(named):
    """TypeError for an array of another framework beside a JAX q: the custom call's operands are JAX (or
    NumPy) arrays, and one it cannot take would otherwise be left out of the call, or read on the host."""
    for name, x in named:
        if not _is_array(x) and framework_of(x) is not None:
            raise TypeError(f"{name} must be a JAX or NumPy array when q is a JAX array, got {type(x).__name__}")


def _require_gpu_kernel(q):
    """The clear refusal for a GPU without a kernel for q's d_qk, before XLA runs the call. Under jit the
    placement is not known yet (inputs committed to the CPU run there whatever the default device), so
    a traced q is checked by the handler only, whose launch then names the CUDA error."""
    if isinstance(q, jax.core.Tracer):
        return
    for d in q.devices():
        if d.platform == "gpu":
            require_kernel(d.local_hardware_id, q.shape[2])


def prefill(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse, stream,
            precision):
    """sparse_mla_fp8.prefill() for JAX arrays: returns new (out bf16, max_logits, lse) JAX arrays."""
    if out is not None or max_logits is not None or lse is not None:
        raise TypeError("JAX arrays cannot be written in place: with JAX arrays prefill returns new out, max_logits "
                        "and lse; leave them unset")
    if stream is not None:
        raise ValueError("stream cannot be given with JAX arrays: XLA runs the call on its own stream")
    _require_jax_arrays((("kv", kv), ("indices", indices), ("q_scale", q_scale), ("kv_scale", kv_scale),
                        ("attn_sink", attn_sink), ("topk_length", topk_length)))
    sm_scale = number("sm_scale", sm_scale)  # (a traced sm_scale is refused: it is an attribute)
    q_scale, kv_scale = (x if _is_array(x) else scale(name, x) for name, x in (("q_scale", q_scale),
                                                                                ("kv_scale", kv_scale)))
    _C.check(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, None, None, None, d_v=d_v,
             precision=precision)
    _require_gpu_kernel(q)
    operands, bits = [], 0
    for name, x in (("q_scale", q_scale), ("kv_scale", kv_scale), ("attn_sink", attn_sink),
                    ("topk_length", topk_length)):
        if _is_array(x):
            operands.append(x)
            bits |= _OPERAND_BITS[name]
    s_q, h_q = q.shape[0], q.shape[1]
    results = (jax.ShapeDtypeStruct((s_q, h_q, d_v), jnp.bfloat16), jax.ShapeDtypeStruct((s_q, h_q), jnp.float32),
               jax.ShapeDtypeStruct((s_q, h_q), jnp.float32))
    call = jax.ffi.ffi_call(_TARGET, results, vmap_method="sequential")
    out, max_logits, lse = call(
        q, kv, indices, *operands, sm_scale=np.float64(sm_scale),
        q_scale=np.float32(0.0 if _is_array(q_scale) else q_scale),
        kv_scale=np.float32(0.0 if _is_array(kv_scale) else kv_scale), operands=np.int64(bits),
        precision=precision or "", cpu_threads=np.int64(default_cpu_threads()))
    return out, max_logits, lse
