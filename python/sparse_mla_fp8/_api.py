"""The public entry points: the Python side of a call (the arguments' types, the caller's framework,
allocation, the stream, the CPU threads), then the native module, which checks the whole call and
runs it."""

from . import _C
from ._capabilities import require_kernel
from ._frameworks import export, framework_of, stream_handle
from ._validate import not_an_array, number, require_arrays, scale


def prefill(q, kv, indices, sm_scale, *, q_scale=1.0, kv_scale=1.0, d_v=512, attn_sink=None,
            topk_length=None, out=None, max_logits=None, lse=None, stream=None, precision=None,
            _force_kernel=None):
    """FP8 sparse MLA prefill: each query token attends to the `topk` KV rows its indices name.

    q [s_q, h_q, d_qk] and kv [s_kv, 1, d_qk] are float8_e4m3fn (or uint8 holding e4m3fn bytes) with
    per-tensor scales q_scale and kv_scale (a float, or a 1-element float32 array on the device, read
    by the kernel: no host sync). indices [s_q, 1, topk] int32; a slot is valid iff
    0 <= index < s_kv and slot < topk_length[t] (topk_length [s_q] int32, optional, clamped to
    [0, topk]). attn_sink [h_q] float32, optional. V is the first d_v = 512 columns of each KV row.

    Returns (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q]) in q's framework; lse and
    max_logits are natural-log, float32. out is torch.bfloat16 for torch, and a uint16 array of bf16
    bit patterns for NumPy and CuPy, which have no bf16 (see bf16_to_float32). torch tensors go
    through the PyTorch custom operators (_torch_op.py: torch.compile, CUDA graphs), JAX arrays through
    the XLA FFI primitive (_jax.py: eager and jax.jit, outputs allocated by XLA, so no out, max_logits
    or lse; a build without jax has none, and JAX callers pass those buffers from another framework).

    precision: "exact" or "fast" (None: the default, "exact"). "fast" runs a fast kernel where one
    takes the call (wide_fast: h_q above 64, topk up to 2048; dual_fast: h_q 33 to 64, topk up to
    2048) and the exact kernels elsewhere; the CPU path computes exactly for both.

    The launch goes to the inputs' device on `stream` (an int cudaStream_t, or an object with
    __cuda_stream__() or .cuda_stream; default: the current stream of torch for torch tensors, of
    CuPy for CuPy arrays, else the legacy default stream). CPU arrays run the same operation on the
    CPU, on torch.get_num_threads() threads for torch tensors, else OMP_NUM_THREADS or all the cores
    this process may use; Ctrl-C interrupts it.

    (_force_kernel, for the tests: the name of a kernel of the registry to run instead of the one the
    native module would choose.)
    """
    args = (q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse, stream,
            precision)
    if _force_kernel is not None:  # a test of the native launch: no framework operator in between
        return prefill_native(*args, _force_kernel)
    try:
        route = _routes[type(q)]
    except KeyError:
        route = _routes[type(q)] = _route_of(type(q))
    return route(*args)


_routes = {}  # array type -> the prefill that takes it


def _route_of(tp):
    """torch and JAX arrays go to their framework's operator (registered on this first sight of one),
    every other array to the native module straight away."""
    module = tp.__module__.partition(".")[0]
    if module == "torch":
        from ._torch_op import prefill as route
    elif module in ("jax", "jaxlib") and hasattr(_C, "xla_ffi_targets"):  # (a build without jax has none)
        from ._jax import prefill as route
    else:
        route = prefill_native
    return route


def prefill_native(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
                   stream, precision, _force_kernel=None):
    """prefill() through the native module, for arrays of any framework that can be written in place."""
    framework = framework_of(q)
    if framework is None:
        raise not_an_array("q", q)
    require_arrays((("kv", kv), ("indices", indices), ("attn_sink", attn_sink), ("topk_length", topk_length),
                    ("out", out), ("max_logits", max_logits), ("lse", lse)))
    sm_scale = number("sm_scale", sm_scale)
    q_scale = scale("q_scale", q_scale)
    kv_scale = scale("kv_scale", kv_scale)
    if out is None or max_logits is None or lse is None:
        # the whole call checked on shapes and dtypes before anything is allocated for it
        _C.check(q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse,
                 d_v=d_v, precision=precision)
        out, max_logits, lse = _outputs(framework, q, d_v, out, max_logits, lse)
    device = framework.device(q)
    if device[0] == "cuda":
        require_kernel(device[1], q.shape[2] if len(q.shape) == 3 else None)  # other shapes: refused natively
        cpu_threads = 0
    else:
        cpu_threads = framework.cpu_threads()
    _C.prefill(export(q), export(kv), export(indices), sm_scale, export(q_scale), export(kv_scale),
               export(attn_sink), export(topk_length), export(out), export(max_logits), export(lse),
               stream_handle(stream, framework, q, device), _force_kernel, d_v=d_v, precision=precision,
               cpu_threads=cpu_threads)
    return out, max_logits, lse


def _outputs(framework, q, d_v, out, max_logits, lse):
    """The caller's output buffers, those not given allocated in q's framework."""
    s_q, h_q, _ = q.shape
    if out is None:
        out = framework.empty(q, (s_q, h_q, d_v), "bf16")
    if max_logits is None:
        max_logits = framework.empty(q, (s_q, h_q), "float32")
    if lse is None:
        lse = framework.empty(q, (s_q, h_q), "float32")
    return out, max_logits, lse


def sparse_mla_q8kv8_prefill_fwd(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None,
                                 topk_length=None, *, out=None, max_logits=None, lse=None, precision=None):
    """Drop-in for SGLang's function of this name (torch tensors, current stream):
    returns (out, max_logits, lse). See prefill()."""
    return prefill(q, kv, indices, sm_scale, q_scale=q_scale, kv_scale=kv_scale, d_v=d_v,
                   attn_sink=attn_sink, topk_length=topk_length, out=out, max_logits=max_logits, lse=lse,
                   precision=precision)
