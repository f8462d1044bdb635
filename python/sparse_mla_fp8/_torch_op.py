"""prefill() as PyTorch custom operators, so that torch.compile traces it and CUDA graphs capture it.

Imported the first time prefill() sees a torch tensor (the caller has imported torch by then); the
import registers two operators: sparse_mla_fp8::prefill allocates its outputs, and
sparse_mla_fp8::prefill_into writes the caller's out, max_logits and lse. Their fake implementations
give the outputs' shapes and dtypes, after the same checks as a real call, so a compiled graph holds
one node and a bad call is refused at trace time.

Under torch.compile (or with tensor subclasses: fake, functional) prefill() calls the operators. On
plain tensors in eager mode it runs their implementation itself: the dispatcher's Python round trip
for a custom operator costs more than the whole call's host budget, and the result is the same.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _C, _api
from ._frameworks import framework_of
from ._validate import number


def _scale(name, x):
    """(tensor, value): a scale as the operators take it, the tensor when there is one, else the float."""
    return (x, 0.0) if isinstance(x, Tensor) else (None, number(name, x))


def _unscale(tensor, value):
    return value if tensor is None else tensor


def _run(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
         precision, out=None, max_logits=None, lse=None):
    return _api.prefill_native(q, kv, indices, sm_scale, _unscale(q_scale, q_scale_value),
                               _unscale(kv_scale, kv_scale_value), d_v, attn_sink, topk_length, out, max_logits, lse,
                               None, precision)


class _Abstract:
    """A tensor's shape and dtype as the native check reads them. A symbolic size stands as its example
    value, with no guard on it: a trace-time refusal is a courtesy, every real call is checked again."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def _abstract(t):
    """t itself for None or a float, else its _Abstract; None where a size has no example value."""
    if not isinstance(t, Tensor):
        return t
    shape = tuple(s if isinstance(s, int) else getattr(s.node, "hint", None) for s in t.shape)
    return None if None in shape else _Abstract(shape, t.dtype)


def _check(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
           precision, out=None, max_logits=None, lse=None):
    """What the real call would refuse, from shapes and dtypes (fake tensors have no data)."""
    tensors = [q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse]
    abstract = [_abstract(t) for t in tensors]
    if any(a is None and t is not None for a, t in zip(abstract, tensors)):
        return  # an unbacked size: the run-time check is the only one
    q, kv, indices, q_scale, kv_scale, attn_sink, topk_length, out, max_logits, lse = abstract
    _C.check(q, kv, indices, sm_scale, _unscale(q_scale, q_scale_value), _unscale(kv_scale, kv_scale_value),
             attn_sink, topk_length, out, max_logits, lse, d_v=d_v, precision=precision)


@torch.library.custom_op("sparse_mla_fp8::prefill", mutates_args=())
def prefill_op(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, q_scale: Optional[Tensor],
               q_scale_value: float, kv_scale: Optional[Tensor], kv_scale_value: float, d_v: int,
               attn_sink: Optional[Tensor], topk_length: Optional[Tensor],
               precision: Optional[str]) -> tuple[Tensor, Tensor, Tensor]:
    """(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32); see sparse_mla_fp8.prefill.
    A scale is its tensor when one is given, else the float beside it."""
    return _run(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink,
                topk_length, precision)


@prefill_op.register_fake
def _(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
      precision):
    _check(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
           precision)
    return _outputs(q, d_v, None, None, None)


@torch.library.custom_op("sparse_mla_fp8::prefill_into", mutates_args=("out", "max_logits", "lse"))
def prefill_into_op(q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, q_scale: Optional[Tensor],
                    q_scale_value: float, kv_scale: Optional[Tensor], kv_scale_value: float, d_v: int,
                    attn_sink: Optional[Tensor], topk_length: Optional[Tensor], precision: Optional[str], out: Tensor,
                    max_logits: Tensor, lse: Tensor) -> None:
    """sparse_mla_fp8::prefill into the caller's out, max_logits and lse."""
    _run(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
         precision, out, max_logits, lse)


@prefill_into_op.register_fake
def _(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
      precision, out, max_logits, lse):
    _check(q, kv, indices, sm_scale, q_scale, q_scale_value, kv_scale, kv_scale_value, d_v, attn_sink, topk_length,
           precision, out, max_logits, lse)


_TORCH = framework_of(torch.empty(0))  # (dynamo traces the adapter's methods, not its lookup by type)


def _outputs(q, d_v, out, max_logits, lse):
    """The given buffers, those not given allocated like q."""
    return _api._outputs(_TORCH, q, d_v, out, max_logits, lse)


_CAPTURE_HINT = ("; the first call on a device loads its kernels, which a CUDA graph capture may not allow: "
                 "call sparse_mla_fp8.prefill once on that device before capturing")


def prefill(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out, max_logits, lse, stream,
            precision):
    """sparse_mla_fp8.prefill() for torch tensors."""
    if type(q) is Tensor and not torch.compiler.is_compiling():
        try:
            return _api.prefill_native(q, kv, indices, sm_scale, q_scale, kv_scale, d_v, attn_sink, topk_length, out,
                                       max_logits, lse, stream, precision)
        except RuntimeError as e:
            if q.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"{e}{_CAPTURE_HINT}") from e
            raise
    if stream is not None:
        raise ValueError("stream cannot be given under torch.compile or with tensor subclasses: the operator runs "
                         "on torch's current stream (choose it with torch.cuda.stream)")
    args = (q, kv, indices, number("sm_scale", sm_scale), *_scale("q_scale", q_scale), *_scale("kv_scale", kv_scale),
            d_v, attn_sink, topk_length, precision)
    if out is None and max_logits is None and lse is None:
        return prefill_op(*args)
    out, max_logits, lse = _outputs(q, d_v, out, max_logits, lse)
    prefill_into_op(*args, out, max_logits, lse)
    return out, max_logits, lse
