"""The PyTorch custom ops (torch.compile, opcheck, CUDA graphs), against the float64 reference on fresh
random data (the JAX primitive: test_jax.py). The CPU cases run wherever torch is; the CUDA ones skip
without a GPU that has a kernel."""

import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import sparse_mla_fp8
from harness import (D_V, Backend, assert_matches, awkward_case, call_args, dims_error, invoke, random_case,
                     results_numpy, seed_of, table_dims)

D_QK = table_dims()[0]

torch = pytest.importorskip("torch")


def _kwargs(kw):
    """prefill()'s keyword arguments of call_args()' dict."""
    return {k: v for k, v in kw.items() if k not in ("q", "kv", "indices", "sm_scale")}


def _call(kw):
    return sparse_mla_fp8.prefill(kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], **_kwargs(kw))


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _assert_bitwise(a, b):
    for x, y in zip(a, b):
        assert torch.equal(_bits(x), _bits(y))


@pytest.mark.parametrize("provide", [False, True], ids=["allocated", "into"])
@pytest.mark.parametrize("kind", ["torch-fp8", "torch-u8"])
def test_torch_compile_fullgraph_cpu(kind, provide):
    """torch.compile(fullgraph=True) traces prefill() into one graph (a graph break would raise) whose
    results equal eager mode's bit for bit, and the reference's; given buffers are the ones written."""
    backend = Backend(kind, "cpu")
    case = awkward_case(seed_of("compile", kind, provide))
    torch._dynamo.reset()
    compiled = torch.compile(_call, fullgraph=True)
    kw = call_args(backend, case, provide)
    got = compiled(kw)
    if provide:
        for name, x in zip(("out", "max_logits", "lse"), got):
            assert x.data_ptr() == kw[name].data_ptr(), f"{name}: not the buffer passed"
    assert_matches(results_numpy(backend, got), case.reference(), *backend.tolerances(case.precision))
    _assert_bitwise(got, _call(call_args(backend, case, provide)))


def test_torch_compile_sglang_entry_point_and_float_scales():
    """The SGLang drop-in reaches the same operator under torch.compile, with float scales (dynamo
    passes them as symbolic floats) that change between calls without breaking the graph."""
    backend = Backend("torch-fp8", "cpu")
    torch._dynamo.reset()
    compiled = torch.compile(lambda kw: invoke(kw, api="sglang"), fullgraph=True)
    for seed, (q_scale, kv_scale) in enumerate([(0.5, 2.0), (1.5, 0.25)]):
        case = awkward_case(seed_of("sglang", seed), scales_as_arrays=(False, False))
        case.q_scale, case.kv_scale = q_scale, kv_scale
        assert_matches(results_numpy(backend, compiled(call_args(backend, case, provide=False))),
                       case.reference(), *backend.tolerances(case.precision))


def test_torch_compile_refuses_at_trace_time():
    """The fake implementation refuses what the call would, with the contract's text."""
    backend = Backend("torch-fp8", "cpu")
    unknown = next(d for d in (128, 256, 1024) if d not in table_dims())
    case = random_case(seed_of("refuse", unknown), 2, 16, 4, unknown, 8)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=re.escape(dims_error(unknown))):
        torch.compile(_call, fullgraph=True)(call_args(backend, case, provide=False))


def test_torch_compile_precision():
    """precision reaches the operator: "fast" runs (the exact kernels until fast ones exist; the CPU path
    is exact in both), and a bad value is refused at trace time with the contract's text."""
    backend = Backend("torch-fp8", "cpu")
    case = awkward_case(seed_of("compile-precision"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda kw, precision: _call({**kw, "precision": precision}), fullgraph=True)
    got = compiled(call_args(backend, case, provide=False), "fast")
    assert_matches(results_numpy(backend, got), case.reference(), *backend.tolerances(case.precision))
    with pytest.raises(Exception, match=re.escape('precision must be "exact" or "fast", got ')):  # (dynamo wraps it)
        compiled(call_args(backend, case, provide=False), "bogus")


def _op_args(backend, case):
    kw = call_args(backend, case, provide=False)
    q_scale, kv_scale = kw["q_scale"], kw["kv_scale"]
    split = lambda s: (s, 0.0) if isinstance(s, torch.Tensor) else (None, s)  # noqa: E731
    return (kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], *split(q_scale), *split(kv_scale), D_V,
            kw["attn_sink"], kw["topk_length"], None)


# torch's schema check compares inputs before and after with allclose, which float8 tensors lack:
# with fp8 inputs it runs every test but that one (the uint8 cases run it on the same op).
OPCHECK_TESTS = {"torch-u8": ("test_schema", "test_autograd_registration", "test_faketensor",
                              "test_aot_dispatch_dynamic"),
                 "torch-fp8": ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")}


@pytest.mark.parametrize("kind", OPCHECK_TESTS)
@pytest.mark.parametrize("sink_and_lengths", [True, False])
def test_torch_opcheck(kind, sink_and_lengths):
    from sparse_mla_fp8 import _torch_op

    backend = Backend(kind, "cpu")
    case = awkward_case(seed_of("opcheck", kind, sink_and_lengths), sink=sink_and_lengths, lengths=sink_and_lengths)
    args = _op_args(backend, case)
    buffers = (backend.out_buffer((case.s_q, case.h_q, D_V)), backend.f32_buffer((case.s_q, case.h_q)),
               backend.f32_buffer((case.s_q, case.h_q)))
    torch.library.opcheck(_torch_op.prefill_op, args, test_utils=OPCHECK_TESTS[kind])
    torch.library.opcheck(_torch_op.prefill_into_op, args + buffers, test_utils=OPCHECK_TESTS[kind])
    # (opcheck runs the ops on copies of the arguments) through the dispatcher, as a compiled graph calls them
    assert_matches(results_numpy(backend, _torch_op.prefill_op(*args)), case.reference(),
                   *backend.tolerances(case.precision))
    _torch_op.prefill_into_op(*args, *buffers)
    assert_matches(results_numpy(backend, buffers), case.reference(), *backend.tolerances(case.precision))


# ---------------------------------------------------------------- on the GPU

def _torch_cuda():
    if not torch.cuda.is_available() or not sparse_mla_fp8.supports(D_QK, device="cuda"):
        pytest.skip("needs a CUDA GPU with a compiled specialization")
    return Backend("torch-fp8", "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])  # reduce-overhead: inductor's CUDA graphs
@pytest.mark.parametrize("provide", [False, True], ids=["allocated", "into"])
def test_torch_compile_fullgraph_cuda(provide, mode):
    backend = _torch_cuda()
    case = awkward_case(seed_of("compile-cuda", provide, mode), s_q=64, s_kv=4096, h_q=128, topk=512)
    torch._dynamo.reset()
    compiled = torch.compile(_call, fullgraph=True, mode=mode)
    want = _call(call_args(backend, case, provide))
    for _ in range(3):  # (reduce-overhead records its graph on a later call than the first)
        got = [x.clone() for x in compiled(call_args(backend, case, provide))]
        assert_matches(results_numpy(backend, got), case.reference(), *backend.tolerances(case.precision))
        _assert_bitwise(got, want)


_FIRST_CALL_CAPTURED = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np, torch, sparse_mla_fp8
    from harness import Backend, assert_matches, call_args, invoke, random_case, results_numpy
    backend = Backend("torch-fp8", "cuda")
    case = random_case(11, 32, 2048, 64, {d_qk}, 256)
    case.attn_sink = np.random.default_rng(12).standard_normal(64).astype(np.float32)
    kw = call_args(backend, case, provide={provide})
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # the process's first prefill() call
        result = invoke(kw)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(results_numpy(backend, result), case.reference(), *backend.tolerances(case.precision))
    first = [x.clone() for x in result]
    new = random_case(13, 32, 2048, 64, {d_qk}, 256)  # in place: the replay reads the new values
    kw["q"].view(torch.uint8).copy_(torch.from_numpy(new.q))
    graph.replay()
    torch.cuda.synchronize()
    new.kv, new.indices, new.attn_sink = case.kv, case.indices, case.attn_sink
    assert_matches(results_numpy(backend, result), new.reference(), *backend.tolerances(case.precision))
    print("captured first call: ok")
""")


@pytest.mark.gpu
@pytest.mark.parametrize("provide", [False, True], ids=["allocated", "into"])
def test_cuda_graph_capture_as_first_call(provide, tmp_path):
    """In a fresh process, the first prefill() is inside a CUDA graph capture (the fatbin is loaded then):
    it is captured and replays correct results, including after q changes in place."""
    _torch_cuda()
    code = _FIRST_CALL_CAPTURED.format(tests=os.path.dirname(os.path.abspath(__file__)), d_qk=D_QK,
                                       provide=provide)
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "captured first call: ok" in run.stdout


@pytest.mark.gpu
def test_threads_on_their_own_streams():
    """8 threads, each calling on its own stream, all give the single-threaded result bit for bit."""
    backend = _torch_cuda()
    case = awkward_case(seed_of("threads"), s_q=64, s_kv=8192, h_q=64, topk=1024)
    want = _call(call_args(backend, case))
    torch.cuda.synchronize()
    results, errors = [None] * 8, []

    def work(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                kw = call_args(backend, case)
                stream.synchronize()
                outputs = [_call(kw) for _ in range(4)]
            stream.synchronize()
            results[i] = outputs
        except Exception as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for outputs in results:
        for got in outputs:
            _assert_bitwise(got, want)
