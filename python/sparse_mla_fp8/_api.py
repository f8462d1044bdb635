"""The public entry points: check, look up the kernel, allocate what the caller did not give, launch."""

from . import _C
from ._capabilities import check_dims, require_kernel
from ._frameworks import export, framework_of, stream_handle
from ._validate import check_args


def prefill(q, kv, indices, sm_scale, *, q_scale=1.0, kv_scale=1.0, d_v=512, attn_sink=None,
            topk_length=None, out=None, max_logits=None, lse=None, stream=None, _force_kernel=None):
    """FP8 sparse MLA prefill: each query token attends to the `topk` KV rows its indices name.

    q [s_q, h_q, d_qk] and kv [s_kv, 1, d_qk] are float8_e4m3fn (or uint8 holding e4m3fn bytes) with
    per-tensor scales q_scale and kv_scale (a float, or a 1-element float32 array on the device, read
    by the kernel: no host sync). indices [s_q, 1, topk] int32; a slot is valid iff
    0 <= index < s_kv and slot < topk_length[t] (topk_length [s_q] int32, optional, clamped to
    [0, topk]). attn_sink [h_q] float32, optional. V is the first d_v = 512 columns of each KV row.

    Returns (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q]) in q's framework; lse and
    max_logits are natural-log, float32. out is torch.bfloat16 for torch, and a uint16 array of bf16
    bit patterns for NumPy and CuPy, which have no bf16 (see bf16_to_float32). JAX arrays are
    accepted as inputs, but JAX cannot write in place: JAX callers pass out, max_logits and lse from
    a framework with writable arrays (CuPy, torch), and get those back.

    The launch goes to the inputs' device on `stream` (an int cudaStream_t, or an object with
    __cuda_stream__() or .cuda_stream; default: torch's current stream for torch tensors, else the
    legacy default stream). CPU arrays run the same operation on the CPU, on torch.get_num_threads()
    threads for torch tensors, else OMP_NUM_THREADS or all the cores this process may use; Ctrl-C
    interrupts it.

    (_force_kernel, for the tests: the name of a kernel of the registry to run instead of the one the
    native module would choose.)
    """
    args = (q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse,
            stream, _force_kernel)
    # The native module checks every array from its DLPack metadata before it launches, so a call
    # with plain arguments needs no checks in Python (they cost more than the launch). Anything else
    # (bad input, an int scale, an object that is not an array) takes the checked path, which words
    # each error as the contract does, so both paths accept and refuse the same calls.
    try:
        result = _prefill_plain(*args)
    except Exception:
        result = None
    return _prefill_checked(*args) if result is None else result


def _prefill_plain(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits,
                   lse, stream, force_kernel):
    """prefill() for a float sm_scale, float or array scales and arrays of known frameworks, left to
    the native checks; None for any other call."""
    framework = framework_of(q)
    if framework is None or type(sm_scale) is not float:
        return None
    device = framework.device(q)
    s_q, h_q, d_qk = q.shape
    check_dims(d_qk, d_v)
    if s_q == 0:
        return None  # the checked path returns empty outputs, after its checks
    _require_kernel(device, d_qk)
    handle = stream_handle(stream, framework, q, device)
    out, max_logits, lse = _outputs(framework, q, s_q, h_q, d_v, out, max_logits, lse)
    exported = []
    for a in (q, kv, indices, sm_scale, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse):
        if a is None or type(a) is float:
            exported.append(a)
            continue
        a_framework = framework_of(a)
        if a_framework is None:
            return None  # nanobind would take some non-arrays (buffers) that the checks refuse
        exported.append(a_framework.export(a))
    _C.prefill(*exported, handle, force_kernel, cpu_threads=_cpu_threads(framework, device))
    return out, max_logits, lse


def _prefill_checked(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits,
                     lse, stream, force_kernel):
    framework, device, s_q, h_q, sm_scale, q_scale, kv_scale = check_args(
        q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse)
    _require_kernel(device, q.shape[2])
    handle = stream_handle(stream, framework, q, device)
    out, max_logits, lse = _outputs(framework, q, s_q, h_q, d_v, out, max_logits, lse)
    if s_q:
        _C.prefill(export(q), export(kv), export(indices), sm_scale, export(q_scale), export(kv_scale),
                   export(attn_sink), export(topk_length), export(out), export(max_logits), export(lse),
                   handle, force_kernel, cpu_threads=_cpu_threads(framework, device))
    return out, max_logits, lse


def _require_kernel(device, d_qk):
    """ValueError unless a CUDA device has a kernel for d_qk (the native module chooses which)."""
    if device[0] == "cuda":
        require_kernel(device[1], d_qk)


def _cpu_threads(framework, device):
    """The thread count for the CPU path; 0 (unused) for a CUDA device."""
    return framework.cpu_threads() if device[0] == "cpu" else 0


def _outputs(framework, q, s_q, h_q, d_v, out, max_logits, lse):
    """The caller's output buffers, those not given allocated in q's framework."""
    if out is None:
        out = framework.empty(q, (s_q, h_q, d_v), "bf16")
    if max_logits is None:
        max_logits = framework.empty(q, (s_q, h_q), "float32")
    if lse is None:
        lse = framework.empty(q, (s_q, h_q), "float32")
    return out, max_logits, lse


def sparse_mla_q8kv8_prefill_fwd(q, kv, indices, sm_scale, q_scale, kv_scale, d_v=512, attn_sink=None,
                                 topk_length=None, *, out=None, max_logits=None, lse=None):
    """Drop-in for SGLang's function of this name (torch tensors, current stream):
    returns (out, max_logits, lse). See prefill()."""
    return prefill(q, kv, indices, sm_scale, q_scale=q_scale, kv_scale=kv_scale, d_v=d_v,
                   attn_sink=attn_sink, topk_length=topk_length, out=out, max_logits=max_logits, lse=lse)
