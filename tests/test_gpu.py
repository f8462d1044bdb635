"""GPU-only cases: production-scale shapes, streams, arrays on different devices, the table on a GPU.
The cases shared with the CPU path run on the GPU through the CUDA params of the `backend` fixture
(test_prefill.py, test_refusals.py)."""

import re
import subprocess
import sys

import numpy as np
import pytest

import sparse_mla_fp8
from sparse_mla_fp8 import _C
from sparse_mla_fp8._frameworks import export
from conftest import PRECISIONS
from harness import (INT_MAX, INT_MIN, STAT_TOL, Backend, assert_matches, assert_refused, call_args, dim,
                     dims_error, gpu_supported, invoke, random_case, results_numpy, run_and_check, seed_of, table_dims,
                     unaligned_kv, unaligned_q)

KERNELS = _C.kernel_names()


def _forced(case, kernel):
    """case as a forced run of kernel checks it: in precision "fast" for a fast kernel (named *_fast:
    test_native.py), against that precision's bounds."""
    if kernel.endswith("_fast"):
        case.precision = "fast"
    return case

torch = pytest.importorskip("torch")
# each case is collected everywhere (a module-level skip would hide them from --collect-only) and skips
# without a GPU that has a kernel
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or not gpu_supported("cuda"),
                                                  reason="needs a CUDA GPU with a compiled specialization")]


@pytest.fixture(params=PRECISIONS)
def cuda(request):
    return Backend("torch-fp8", "cuda", request.param)


def _many_tokens_case(seed, s_q, s_kv, h_q, d_qk, topk):
    """A random case whose q rows beyond 4096 tokens repeat earlier ones (with their own indices), so
    that 70000 tokens cost seconds to make; the kernel cannot tell."""
    case = random_case(seed, min(s_q, 4096), s_kv, h_q, d_qk, topk)
    rng = np.random.default_rng(seed)
    if s_q > case.s_q:
        case.q = case.q[rng.integers(0, case.s_q, s_q)]
        case.indices = rng.integers(0, s_kv, (s_q, 1, topk), dtype=np.int32)
    return case


def _runs(h_q, topk, kernel):
    assert _C.kernel_for(h_q, topk, "exact") == kernel, f"h_q={h_q}, topk={topk} no longer runs {kernel}"


@pytest.mark.parametrize("shape, checked, kernel", [((64, 65536, 128, 576, 2048), 16, "wide"),
                                                    ((70000, 4096, 40, 512, 16), 512, "dual"),
                                                    ((70000, 4096, 16, 512, 16), 512, "narrow16"),
                                                    ((70000, 4096, 8, 576, 40), 512, "narrow8")],
                         ids=["h128_topk2048_skv65536", "sq70000_topk16", "sq70000_h16", "sq70000_h8"])
def test_large(cuda, shape, checked, kernel):
    """Every token is checked for NaN (unwritten outputs); `checked` random ones against the reference."""
    _runs(shape[2], shape[4], kernel)
    s_q, s_kv, h_q, d_qk, topk = shape
    case = _many_tokens_case(seed_of(shape), s_q, s_kv, h_q, dim(d_qk), topk)
    s_q = shape[0]
    tokens = np.unique(np.r_[0, s_q - 1, np.random.default_rng(1).choice(s_q, checked, replace=False)])
    run_and_check(cuda, case, tokens=tokens)


@pytest.mark.parametrize("h_q, topk, kernel", [(128, 2048, "wide"), (40, 2100, "split"), (40, 700, "dual")],
                         ids=["wide", "split", "dual"])
@pytest.mark.parametrize("d_qk", table_dims())
def test_full_heads_with_length_and_sink(cuda, d_qk, h_q, topk, kernel):
    _runs(h_q, topk, kernel)
    s_q, s_kv = 16, 8192
    case = random_case(seed_of("full heads", d_qk, h_q), s_q, s_kv, h_q, d_qk, topk)
    rng = np.random.default_rng(d_qk)
    case.attn_sink = rng.choice([np.inf, -np.inf, 0.0, 2.0, -2.0, 8.0], h_q).astype(np.float32)
    case.topk_length = np.r_[0, 1, 63, 64, 65, 2047, 2048, 2049, INT_MAX, INT_MIN, -1,
                             rng.integers(0, topk, s_q - 11)].astype(np.int32)
    invalid = rng.random(case.indices.shape) < 0.1
    case.indices[invalid] = rng.choice(np.array([-1, s_kv, INT_MIN, INT_MAX], np.int32), invalid.sum())
    case.poison_unreferenced_kv()
    run_and_check(cuda, case)
    first, second = invoke(call_args(cuda, case)), invoke(call_args(cuda, case))
    for a, b in zip(first, second):
        assert cuda.raw(a) == cuda.raw(b), "two runs on identical input differ"


def _items_case(seed, s_q, s_kv, h_q, d_qk, topk):
    """A random case with tokens of random topk_length (a fifth of them 0), a sink, and a tenth of the
    indices invalid."""
    case = random_case(seed, s_q, s_kv, h_q, d_qk, topk)
    rng = np.random.default_rng(seed)
    case.topk_length = np.where(rng.random(s_q) < 0.2, 0, rng.integers(1, topk + 1, s_q)).astype(np.int32)
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    invalid = rng.random(case.indices.shape) < 0.1
    case.indices[invalid] = rng.choice(np.array([-1, s_kv, INT_MIN, INT_MAX], np.int32), invalid.sum())
    case.poison_unreferenced_kv()
    return case


@pytest.mark.parametrize("h_q, topk, kernel", [(70, 150, "wide"), (40, 2100, "split"), (40, 600, "dual")],
                         ids=["wide", "split", "dual"])
@pytest.mark.parametrize("d_qk", table_dims())
def test_more_items_than_sms(cuda, d_qk, h_q, topk, kernel):
    """The grid is persistent: with 300 items (a token and its 128 heads in the wide kernel, its 64 in
    the split and dual ones) each CTA takes several in turn (the dual kernel runs two CTAs per SM),
    and the items without slots (topk_length 0) sit between others."""
    _runs(h_q, topk, kernel)
    run_and_check(cuda, _items_case(seed_of("items", d_qk, h_q), 300, 2000, h_q, d_qk, topk))


@pytest.mark.parametrize("h_q, topk, kernel", [(128, 2048, "wide"), (128, 2049, "fallback"), (64, 1, "dual"),
                                              (64, 256, "dual"), (64, 2048, "dual"), (64, 2049, "split"),
                                              (64, 4096, "split"), (64, 4097, "fallback")],
                         ids=["wide", "wide+1", "dual_min", "dual", "dual_max", "split", "split_max", "split_max+1"])
def test_f16_kernels_topk_bounds(cuda, h_q, topk, kernel):
    """The wide, dual and split kernels keep O in f16 registers, rounded at every k16 step; the worst
    case is a token whose slots all name one kv row (every step rounds the same way). At their
    largest topk (2048 slots per warpgroup) that stays within the contract; one slot more goes to the
    64-head kernel."""
    _runs(h_q, topk, kernel)
    s_q, s_kv, d_qk = 6, 8192, table_dims()[-1]
    case = random_case(seed_of("f16 bound", h_q, topk), s_q, s_kv, h_q, d_qk, topk)
    case.indices[::2] = case.indices[::2, :, :1]  # even tokens: one row in every slot
    run_and_check(cuda, case)


@pytest.mark.parametrize("scales", [(2.0, 2.0), (4.0, 1.0)], ids=["2x2", "4x1"])
@pytest.mark.parametrize("h_q, topk", [(128, 2048), (64, 2048), (64, 1000), (64, 100), (16, 2048), (8, 640)])
def test_exact_at_large_logits(h_q, topk, scales):
    """Precision "exact" within CONTRACT.md's bound where q_scale x kv_scale = 4 makes the logits large
    (|logit| ~40 at most): max_logits and lse within 1e-3 or 3e-5 x the row's largest |logit|,
    whichever is more, on each kernel's calls (wide, split, dual, narrow16, narrow8), with a sink and
    topk_length."""
    d_qk = table_dims()[-1]
    case = random_case(seed_of("large logits", h_q, topk, scales), 4, 4000, h_q, d_qk, topk)
    case.q_scale, case.kv_scale = scales
    rng = np.random.default_rng(6)
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    case.topk_length = rng.integers(1, topk + 1, case.s_q).astype(np.int32)
    case.precision = "exact"
    backend = Backend("torch-fp8", "cuda")
    got = results_numpy(backend, invoke(call_args(backend, case)))
    assert_matches(got, case.reference(), backend.tol, np.maximum(STAT_TOL, 3e-5 * case.largest_abs_logit()))


@pytest.mark.parametrize("spread", [0.05, 0.5, 2.0, 9.0])
@pytest.mark.parametrize("h_q, topk", [(64, 600), (64, 2048), (128, 2048), (16, 300)])
def test_fast_at_logit_spreads(h_q, topk, spread):
    """Precision "fast" within its bounds (out 2.5e-2, max_logits and lse 1e-2) whatever the logits'
    spread (their standard deviation, set by sm_scale; the values are randn x 1.5), as CONTRACT.md
    asks from 0.05 to 9, with a sink and short rows."""
    d_qk = table_dims()[-1]
    case = random_case(seed_of("spread", spread, h_q), 6, 4000, h_q, d_qk, topk)
    case.sm_scale = spread / (1.5 ** 2 * d_qk ** 0.5)
    rng = np.random.default_rng(5)
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    case.topk_length = rng.integers(1, topk + 1, case.s_q).astype(np.int32)
    case.precision = "fast"
    run_and_check(Backend("torch-fp8", "cuda", "fast"), case)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d_qk", table_dims())
def test_every_kernel(cuda, d_qk, kernel):
    """Each kernel of the registry, forced, on one call that none of them has a reason to refuse: a
    partial block of heads (two blocks for the 64-head kernels), a topk that is no multiple of a
    tile, tokens with short and empty topk_length, invalid indices and a sink, and more items than
    SMs. The kernels the registry chooses are asserted per case above; this runs every
    one of them whatever it is chosen for."""
    case = _forced(_items_case(seed_of("every kernel", d_qk, kernel), 200, 3000, 70, d_qk, 300), kernel)
    run_and_check(cuda, case, force_kernel=kernel)


@pytest.mark.parametrize("d_qk", table_dims())
def test_native_launch_takes_the_fatbin_of_d_qk(cuda, d_qk):
    """A direct _C.prefill call (no Python layer but the kernel folder) runs the kernel of its own
    d_qk: the native module derives it from the arrays it checked."""
    sparse_mla_fp8.check_config(d_qk, device="cuda")  # the kernel folder is known from here on
    case = random_case(seed_of("native", d_qk), 8, 1000, 20, d_qk, 200)
    kw = call_args(cuda, case)
    args = [export(kw[k]) for k in ("q", "kv", "indices")] + [float(kw["sm_scale"])]
    args += [export(kw[k]) for k in ("q_scale", "kv_scale", "attn_sink", "topk_length", "out", "max_logits", "lse")]
    _C.prefill(*args, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    got = results_numpy(cuda, (kw["out"], kw["max_logits"], kw["lse"]))
    assert_matches(got, case.reference(), *cuda.tolerances("exact"))  # _C.prefill's default precision


@pytest.mark.parametrize("unaligned", [unaligned_q, unaligned_kv], ids=["q", "kv"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d_qk", table_dims())
def test_unaligned_rows(cuda, d_qk, kernel, unaligned):
    """q or kv rows off the 16-byte grid (params.rows_16b_aligned false): each kernel's byte copies,
    forced on a call like test_every_kernel's (fewer tokens: the layout is the point here)."""
    case = _forced(_items_case(seed_of("unaligned", d_qk, kernel, unaligned.__name__), 40, 3000, 70, d_qk, 300), kernel)
    unaligned(case)
    kw = call_args(cuda, case)
    assert cuda.address(kw["q"]) % 16 or cuda.address(kw["kv"]) % 16, "the layout reached the GPU aligned"
    run_and_check(cuda, case, force_kernel=kernel)


class _Protocol:  # only __cuda_stream__, as CUDA Python and other libraries export it
    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.cuda_stream)


class _Attribute:  # only .cuda_stream
    def __init__(self, stream):
        self.cuda_stream = stream.cuda_stream


STREAMS = {
    "torch_stream": lambda s: s,
    "int": lambda s: s.cuda_stream,
    "protocol": _Protocol,
    "attribute": _Attribute,
    "current": None,  # no argument, inside `with torch.cuda.stream(s)`: torch's current stream
}


@pytest.mark.parametrize("how", STREAMS)
def test_stream(cuda, how):
    """q becomes valid only once a slow copy queued on the side stream ends: a launch on any other
    stream (e.g. the legacy default one, which does not wait for torch's non-blocking streams) reads
    NaN."""
    case = random_case(seed_of("stream", how), 8, 4096, 64, dim(576), 256)
    kw = call_args(cuda, case)
    q_bytes = kw["q"].view(torch.uint8)
    good_q = q_bytes.clone()
    q_bytes.fill_(0x7F)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # some 50 ms
        q_bytes.copy_(good_q)
        if STREAMS[how] is None:
            result = invoke(kw)
    if STREAMS[how] is not None:
        result = invoke({**kw, "stream": STREAMS[how](side)})
    side.synchronize()
    assert_matches(results_numpy(cuda, result), case.reference(), *cuda.tolerances(case.precision))


_SPIN_THEN_COPY = r"""
extern "C" __global__ void spin_then_copy(const unsigned char* src, unsigned char* dst, long long n, long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {}
    for (long long i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"""


def test_cupy_current_stream():
    """CuPy arrays, no stream named, inside `with stream:` of a non-blocking CuPy stream: q becomes valid
    only once a slow kernel queued there ends, so a launch on any other stream reads NaN."""
    cupy = pytest.importorskip("cupy")
    backend = Backend("cupy", "cuda")
    case = random_case(seed_of("cupy stream"), 8, 4096, 64, dim(576), 256)
    kw = call_args(backend, case)
    q = kw["q"]
    assert q.flags.c_contiguous
    good_q = q.copy()
    q.fill(0x7F)
    cupy.cuda.runtime.deviceSynchronize()
    spin = cupy.RawKernel(_SPIN_THEN_COPY, "spin_then_copy")
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        spin((1,), (256,), (good_q, q, np.int64(q.size), np.int64(100_000_000)))  # some 50 ms
        result = invoke(kw)
    side.synchronize()
    assert_matches(results_numpy(backend, result), case.reference(), *backend.tolerances(case.precision))


MIXED = {  # one array on the CPU, the others on the GPU
    "q": lambda kw: {"q": kw["q"].cpu()},
    "kv": lambda kw: {"kv": kw["kv"].cpu()},
    "indices": lambda kw: {"indices": kw["indices"].cpu()},
    "attn_sink": lambda kw: {"attn_sink": kw["attn_sink"].cpu()},
    "topk_length": lambda kw: {"topk_length": kw["topk_length"].cpu()},
    "q_scale": lambda kw: {"q_scale": torch.ones(1)},
    "out": lambda kw: {"out": kw["out"].cpu()},
    "lse": lambda kw: {"lse": kw["lse"].cpu()},
}


@pytest.mark.parametrize("on_cpu", MIXED)
def test_mixed_devices(cuda, on_cpu):
    case = random_case(3, 4, 100, 8, dim(576), 16)
    case.attn_sink = np.zeros(8, np.float32)
    case.topk_length = np.full(4, 16, np.int32)
    case.scales_as_arrays = (True, True)
    kw = call_args(cuda, case)
    kw.update(MIXED[on_cpu](kw))
    buffers = [x for x in kw.values() if isinstance(x, torch.Tensor)]
    assert_refused(lambda: invoke(kw), ValueError, cuda, buffers, names=[on_cpu, "cpu"])


def test_inputs_on_another_gpu():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    backend = Backend("torch-fp8", "cuda:1")
    with torch.cuda.device(0):
        run_and_check(backend, random_case(9, 4, 500, 70, dim(576), 300))


def test_table_on_gpu(tmp_path):
    assert any(entry["arch"] == "sm_90a" for entry in sparse_mla_fp8.capabilities())
    for device in ("cuda", "cuda:0", 0, torch.device("cuda")):
        for d_qk in table_dims():
            assert sparse_mla_fp8.supports(d_qk, device=device) is True
            assert sparse_mla_fp8.check_config(d_qk, 512, device) is None
    unknown = next(d for d in (128, 64, 256, 1024) if d not in table_dims())
    assert sparse_mla_fp8.supports(unknown, device="cuda") is False
    with pytest.raises(ValueError, match=re.escape(dims_error(unknown))):
        sparse_mla_fp8.check_config(unknown, device="cuda")
    info = subprocess.run([sys.executable, "-m", "sparse_mla_fp8", "info"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert info.returncode == 0, info.stderr
    assert torch.cuda.get_device_name(0) in info.stdout, info.stdout
