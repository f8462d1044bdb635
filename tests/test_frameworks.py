"""The framework operators: the PyTorch custom ops (torch.compile, opcheck, CUDA graphs) and the JAX
primitive (eager and jax.jit), each against the float64 reference on fresh random data. The CPU cases
run everywhere; the CUDA ones skip without a GPU that has a kernel."""

import os
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

# JAX takes most of a GPU's memory at its first use unless told not to; the torch tests after it need it
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import sparse_mla_fp8
from sparse_mla_fp8 import _C
from harness import (D_V, Backend, assert_matches, call_args, dims_error, invoke, random_case, results_numpy,
                     seed_of, table_dims)

D_QK = table_dims()[0]


def _case(seed, s_q=6, s_kv=80, h_q=12, topk=40, sink=True, lengths=True, scales_as_arrays=(True, False)):
    """A random case with the contract's awkward parts: invalid indices (negative and >= s_kv), a row
    with none valid, topk_length, a sink, scales other than 1."""
    case = random_case(seed, s_q, s_kv, h_q, D_QK, topk)
    rng = np.random.default_rng(seed + 1)
    case.indices[0, 0, ::3] = -1
    case.indices[1, 0, ::4] = s_kv + 7
    case.indices[2, 0, :] = -5
    case.q_scale, case.kv_scale = 0.75, 1.25
    case.scales_as_arrays = scales_as_arrays
    if sink:
        case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    if lengths:
        case.topk_length = rng.integers(0, topk + 3, s_q).astype(np.int32)
    return case


# ---------------------------------------------------------------- PyTorch

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
    case = _case(seed_of("compile", kind, provide))
    torch._dynamo.reset()
    compiled = torch.compile(_call, fullgraph=True)
    kw = call_args(backend, case, provide)
    got = compiled(kw)
    if provide:
        for name, x in zip(("out", "max_logits", "lse"), got):
            assert x.data_ptr() == kw[name].data_ptr(), f"{name}: not the buffer passed"
    assert_matches(results_numpy(backend, got), case.reference(), backend.tol)
    _assert_bitwise(got, _call(call_args(backend, case, provide)))


def test_torch_compile_sglang_entry_point_and_float_scales():
    """The SGLang drop-in reaches the same operator under torch.compile, with float scales (dynamo
    passes them as symbolic floats) that change between calls without breaking the graph."""
    backend = Backend("torch-fp8", "cpu")
    torch._dynamo.reset()
    compiled = torch.compile(lambda kw: invoke(kw, api="sglang"), fullgraph=True)
    for seed, (q_scale, kv_scale) in enumerate([(0.5, 2.0), (1.5, 0.25)]):
        case = _case(seed_of("sglang", seed), scales_as_arrays=(False, False))
        case.q_scale, case.kv_scale = q_scale, kv_scale
        assert_matches(results_numpy(backend, compiled(call_args(backend, case, provide=False))),
                       case.reference(), backend.tol)


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
    case = _case(seed_of("compile-precision"))
    torch._dynamo.reset()
    compiled = torch.compile(lambda kw, precision: _call({**kw, "precision": precision}), fullgraph=True)
    got = compiled(call_args(backend, case, provide=False), "fast")
    assert_matches(results_numpy(backend, got), case.reference(), backend.tol)
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
    case = _case(seed_of("opcheck", kind, sink_and_lengths), sink=sink_and_lengths, lengths=sink_and_lengths)
    args = _op_args(backend, case)
    buffers = (backend.out_buffer((case.s_q, case.h_q, D_V)), backend.f32_buffer((case.s_q, case.h_q)),
               backend.f32_buffer((case.s_q, case.h_q)))
    torch.library.opcheck(_torch_op.prefill_op, args, test_utils=OPCHECK_TESTS[kind])
    torch.library.opcheck(_torch_op.prefill_into_op, args + buffers, test_utils=OPCHECK_TESTS[kind])
    # (opcheck runs the ops on copies of the arguments) through the dispatcher, as a compiled graph calls them
    assert_matches(results_numpy(backend, _torch_op.prefill_op(*args)), case.reference(), backend.tol)
    _torch_op.prefill_into_op(*args, *buffers)
    assert_matches(results_numpy(backend, buffers), case.reference(), backend.tol)


# ---------------------------------------------------------------- JAX

def _jax():
    jax = pytest.importorskip("jax")
    if not hasattr(_C, "xla_ffi_targets"):
        pytest.fail("jax is installed but this build has no JAX primitive: build with jax in the build environment")
    return jax


def _jax_device(platform):
    jax = _jax()
    try:
        devices = jax.devices("gpu" if platform == "cuda" else "cpu")
    except RuntimeError:
        devices = []
    if not devices:
        pytest.skip(f"JAX sees no {platform} device")
    if platform == "cuda" and not sparse_mla_fp8.supports(D_QK, device=devices[0].local_hardware_id):
        pytest.skip("the GPU has no compiled specialization")
    return devices[0]


def _jax_args(case, device, fp8):
    """(args, kwargs) of prefill() for case as JAX arrays on device: q and kv float8_e4m3fn or uint8 bytes,
    scales as 1-element arrays or floats as the case says."""
    jax = _jax()
    jnp = jax.numpy
    put = lambda a: None if a is None else jax.device_put(a, device)  # noqa: E731
    q, kv = put(case.q), put(case.kv)
    if fp8:
        q, kv = q.view(jnp.float8_e4m3fn), kv.view(jnp.float8_e4m3fn)
    scales = [put(np.array([x], np.float32)) if as_array else x
              for x, as_array in zip((case.q_scale, case.kv_scale), case.scales_as_arrays)]
    return (q, kv, put(case.indices), case.sm_scale), dict(q_scale=scales[0], kv_scale=scales[1],
                                                        attn_sink=put(case.attn_sink),
                                                        topk_length=put(case.topk_length))


def _jax_results(result):
    jnp = _jax().numpy
    out, max_logits, lse = result
    assert (out.dtype, max_logits.dtype, lse.dtype) == (jnp.bfloat16, jnp.float32, jnp.float32)
    return (np.asarray(out.astype(jnp.float32), np.float64), np.asarray(max_logits, np.float64),
            np.asarray(lse, np.float64))


JAX_CASES = {
    "fp8-array-q-scale": dict(fp8=True, scales_as_arrays=(True, False)),
    "u8-float-scales": dict(fp8=False, scales_as_arrays=(False, False)),
    "fp8-array-scales-no-sink-no-lengths": dict(fp8=True, scales_as_arrays=(True, True), sink=False, lengths=False),
}


def _jax_check(platform, name):
    jax = _jax()
    device = _jax_device(platform)
    options = dict(JAX_CASES[name])
    fp8 = options.pop("fp8")
    case = _case(seed_of("jax", platform, name), **options)
    args, kwargs = _jax_args(case, device, fp8)
    eager = sparse_mla_fp8.prefill(*args, **kwargs)
    tol = 1e-2 if platform == "cpu" else 2e-2
    assert_matches(_jax_results(eager), case.reference(), tol)
    assert all(x.devices() == {device} for x in eager)
    # the arrays are traced; floats and absent arguments are the custom call's attributes, fixed at trace time
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array)}
    fixed = {k: v for k, v in kwargs.items() if k not in arrays}
    jitted = jax.jit(lambda q, kv, indices, kw: sparse_mla_fp8.prefill(q, kv, indices, args[3], **kw, **fixed))
    got = _jax_results(jitted(*args[:3], arrays))
    assert_matches(got, case.reference(), tol)
    for a, b in zip(_jax_results(eager), got):  # one operation, eager or jitted: the same bits
        assert np.array_equal(a, b, equal_nan=True)


@pytest.mark.parametrize("name", JAX_CASES)
def test_jax_cpu(name):
    _jax_check("cpu", name)


def test_jax_refusals():
    """Bad calls are refused at trace time with the texts of every other call, under jit too."""
    jax = _jax()
    device = _jax_device("cpu")
    case = _case(seed_of("jax-refusals"))
    args, kwargs = _jax_args(case, device, fp8=True)
    with pytest.raises(TypeError, match="indices must be int32, got float32"):
        sparse_mla_fp8.prefill(args[0], args[1], jax.numpy.zeros((case.s_q, 1, 4), "float32"), 0.1)
    with pytest.raises(ValueError, match=r"attn_sink must have shape"):
        jax.jit(lambda q, kv, i, s: sparse_mla_fp8.prefill(q, kv, i, 0.1, attn_sink=s))(
            *args[:3], jax.numpy.zeros(case.h_q + 1, "float32"))
    with pytest.raises(TypeError, match="sm_scale must be a float, got"):
        jax.jit(lambda q, kv, i, s: sparse_mla_fp8.prefill(q, kv, i, s))(*args[:3], 0.1)
    with pytest.raises(ValueError, match=re.escape('precision must be "exact" or "fast", got \'bogus\'')):
        jax.jit(lambda q, kv, i: sparse_mla_fp8.prefill(q, kv, i, 0.1, precision="bogus"))(*args[:3])
    # another framework's array beside a JAX q is refused, not left out of the custom call
    for name, value in (("attn_sink", torch.from_numpy(case.attn_sink)), ("q_scale", torch.ones(1)),
                        ("topk_length", torch.from_numpy(case.topk_length))):
        with pytest.raises(TypeError, match=f"{name} must be a JAX or NumPy array when q is a JAX array, got Tensor"):
            sparse_mla_fp8.prefill(*args, **{**kwargs, name: value})
    with pytest.raises(TypeError, match="JAX arrays cannot be written in place"):
        sparse_mla_fp8.prefill(*args, out=np.zeros((case.s_q, case.h_q, D_V), np.uint16))
    unknown = next(d for d in (128, 256, 1024) if d not in table_dims())
    with pytest.raises(ValueError, match=re.escape(dims_error(unknown))):
        sparse_mla_fp8.prefill(jax.numpy.zeros((2, 4, unknown), "uint8"), jax.numpy.zeros((8, 1, unknown), "uint8"),
                               jax.numpy.zeros((2, 1, 4), "int32"), 0.1)


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
    case = _case(seed_of("compile-cuda", provide, mode), s_q=64, s_kv=4096, h_q=128, topk=512)
    torch._dynamo.reset()
    compiled = torch.compile(_call, fullgraph=True, mode=mode)
    want = _call(call_args(backend, case, provide))
    for _ in range(3):  # (reduce-overhead records its graph on a later call than the first)
        got = [x.clone() for x in compiled(call_args(backend, case, provide))]
        assert_matches(results_numpy(backend, got), case.reference(), backend.tol)
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
    assert_matches(results_numpy(backend, result), case.reference(), backend.tol)
    first = [x.clone() for x in result]
    new = random_case(13, 32, 2048, 64, {d_qk}, 256)  # in place: the replay reads the new values
    kw["q"].view(torch.uint8).copy_(torch.from_numpy(new.q))
    graph.replay()
    torch.cuda.synchronize()
    new.kv, new.indices, new.attn_sink = case.kv, case.indices, case.attn_sink
    assert_matches(results_numpy(backend, result), new.reference(), backend.tol)
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
    case = _case(seed_of("threads"), s_q=64, s_kv=8192, h_q=64, topk=1024)
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


@pytest.mark.gpu
@pytest.mark.parametrize("name", JAX_CASES)
def test_jax_cuda(name):
    _jax_check("cuda", name)
