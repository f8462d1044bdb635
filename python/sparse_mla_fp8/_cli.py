"""The command line of sparse-mla-fp8 (also `python -m sparse_mla_fp8`): info, demo and bench.

info:  the build, its capability table, its GPU kernels and which one runs each benchmark shape, the
       GPUs found and whether each can run it.
demo:  one prefill checked against the float64 reference and timed; exits 1 if the accuracy misses
       the bounds of docs/SPEC.md.
bench: the benchmark shapes (or --shape ...) timed with CUDA events: µs, TFLOP/s, the fraction of
       torch's FP8 GEMM rate measured in the same run, and the kernel each shape ran; then the host
       overhead per call. Comparisons with other libraries are made side by side, in one run, outside
       the package.
       bench --cpu: the CPU path beside the plain PyTorch version (gather, fp32 einsum, softmax) on
       the same inputs and threads, timed in turns in one run.
"""

import argparse
import json
import statistics
import sys
import time

from . import _C, __version__, bf16_to_float32, capabilities, check_config, prefill, supports
from ._capabilities import arch_of, cuda_devices, manifest

# (s_q, s_kv, h_q, d_qk, topk): the six benchmark shapes of docs/SPEC.md.
BENCH_SHAPES = [
    (4096, 8192, 128, 576, 2048),
    (4096, 32768, 128, 576, 2048),
    (4096, 65536, 128, 576, 2048),
    (4096, 8192, 64, 512, 512),
    (4096, 32768, 64, 512, 512),
    (4096, 32768, 128, 512, 1024),
]
DEMO_GPU_SHAPE = (1024, 32768, 128, 2048)  # s_q, s_kv, h_q, topk (d_qk: 576 if built)
DEMO_CPU_SHAPE = (8, 4096, 16, 256)
OUT_REL_LIMIT, LSE_ABS_LIMIT = 1e-2, 1e-3  # docs/SPEC.md's bounds for the exact mode
PRECISION = "exact"  # prefill()'s default, which info reports and bench times
D_V = 512


def _label(shape):
    return ", ".join(map(str, shape))


def _kernel(shape):
    """The GPU kernel that runs a (s_q, s_kv, h_q, d_qk, topk) shape at PRECISION."""
    return _C.kernel_for(shape[2], shape[4], PRECISION)


def flops(s_q, h_q, d_qk, topk):
    return 2 * s_q * h_q * topk * (d_qk + D_V)


def _dims(dims):
    return "/".join(str(d) for d in sorted(dims))


# ---------------------------------------------------------------------------------------------- info

def _cuda_build(m):
    return f"CUDA {m['cuda_version']}, CMAKE_CUDA_ARCHITECTURES={m['cmake_cuda_architectures']}"


def _version_text():
    m = manifest()
    built = _cuda_build(m) if m["cuda"] else "CPU-only build"
    return f"sparse-mla-fp8 {__version__} ({built}; d_qk {_dims({c['d_qk'] for c in capabilities()})})"


def info(args):
    m = manifest()
    print(f"sparse_mla_fp8 {__version__}  ({_C.__file__})")
    if m["cuda"]:
        print(f"built with {_cuda_build(m)}")
    else:
        print("CPU-only build: no GPU kernels; the CPU path serves the table's head dims")
    print("JAX primitive (XLA FFI): " + ("built" if hasattr(_C, "xla_ffi_targets") else
                                         "not built (no jaxlib at build time): JAX arrays need output buffers "
                                         "from another framework"))
    print(f"CPU path: {_cpu_entry()}")
    print("capability table:")
    print(f"  {'arch':<8} {'d_qk':>5} {'d_v':>5}  fatbin")
    for c in capabilities():
        print(f"  {c['arch'] or '-':<8} {c['d_qk']:>5} {c['d_v']:>5}  {c['fatbin'] or '-'}")
    print(f"GPU kernels, in the order the launch tries them: {', '.join(_C.kernel_names())}")
    for shape in BENCH_SHAPES:
        print(f"  {_label(shape):<30} runs {_kernel(shape)}")
    print("GPUs:")
    try:
        gpus = cuda_devices()
    except RuntimeError as e:
        print(f"  none usable: {e}")
        return 0
    if not gpus:
        print("  none (this build does not query CUDA)" if not _C.HAS_CUDA else "  none")
    dims = sorted({c["d_qk"] for c in capabilities()})
    for gpu in gpus:
        head = f"  cuda:{gpu['index']}  {gpu['name']}  {arch_of(gpu)}  {gpu['sm_count']} SMs: "
        runs = [d for d in dims if supports(d, D_V, gpu["index"])]
        if runs:
            print(head + f"runs d_qk={_dims(runs)}")
            continue
        try:
            check_config(dims[0], D_V, gpu["index"])
        except ValueError as e:
            print(head + f"cannot run it: {e}")
    return 0


def _cpu_entry():
    """The CPU path's instruction set and the threads a NumPy call would get."""
    from ._frameworks import default_cpu_threads

    try:
        entry = _C.cpu_isa()
    except ValueError as e:  # SPARSE_MLA_FP8_CPU_ISA names no entry: every CPU call says so too
        return str(e)
    threads = default_cpu_threads()
    return (f"{entry} entry, {threads} thread{'s' * (threads != 1)} for NumPy arrays "
            "(torch tensors: torch.get_num_threads())")


# ---------------------------------------------------------------------------------------- torch side

def _torch_cuda():
    """torch, if it is installed and sees a GPU; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _torch_inputs(torch, s_q, s_kv, h_q, d_qk, topk, device):
    """q and kv as randn * 1.5 in e4m3, and topk distinct random KV rows per query token."""
    q = (torch.randn(s_q, h_q, d_qk, device=device) * 1.5).to(torch.float8_e4m3fn)
    kv = (torch.randn(s_kv, 1, d_qk, device=device) * 1.5).to(torch.float8_e4m3fn)
    indices = torch.empty(s_q, 1, topk, dtype=torch.int32, device=device)
    rows = max(1, (1 << 28) // s_kv)  # chunks of 1 GiB of random keys
    for start in range(0, s_q, rows):
        keys = torch.rand(min(rows, s_q - start), s_kv, device=device)
        indices[start:start + rows, 0] = keys.topk(topk, dim=1).indices
    return q, kv, indices


def _event_median_us(torch, fn, iters, warmup=3):
    """Median over `iters` calls of fn(i) timed with CUDA events, after warm-up."""
    for i in range(warmup):
        fn(i)
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for i, (start, end) in enumerate(pairs):
        start.record()
        fn(i)
        end.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(start.elapsed_time(end) for start, end in pairs)


# ---------------------------------------------------------------------------------------------- demo

def _has_kernel(d_qk, device):
    """Whether device runs d_qk; says why not on stderr."""
    try:
        check_config(d_qk, D_V, device)
    except ValueError as e:
        print(f"no GPU kernel: {e}", file=sys.stderr)
        return False
    return True


def _errors(out, max_logits, lse, ref):
    import numpy as np

    ref_out, ref_max, ref_lse = ref
    rel = float(np.linalg.norm(out - ref_out) / np.linalg.norm(ref_out))
    return rel, float(np.max(np.abs(lse - ref_lse))), float(np.max(np.abs(max_logits - ref_max)))


def _demo_gpu(torch, device, d_qk):
    from .reference import reference_prefill

    s_q, s_kv, h_q, topk = DEMO_GPU_SHAPE
    torch.manual_seed(0)
    q, kv, indices = _torch_inputs(torch, s_q, s_kv, h_q, d_qk, topk, device)
    q_scale = torch.tensor([0.9], device=device)
    kv_scale = torch.tensor([1.1], device=device)
    sink = torch.randn(h_q, device=device) * 2 + 8  # near lse, so it moves the output
    sm_scale = d_qk ** -0.5
    out, max_logits, lse = prefill(q, kv, indices, sm_scale, q_scale=q_scale, kv_scale=kv_scale, attn_sink=sink)
    tokens = torch.linspace(0, s_q - 1, 16, device=device).long()
    ref = reference_prefill(q.view(torch.uint8)[tokens].cpu().numpy(), kv.view(torch.uint8).cpu().numpy(),
                            indices[tokens].cpu().numpy(), sm_scale, q_scale=0.9, kv_scale=1.1,
                            attn_sink=sink.cpu().numpy())
    errors = _errors(out[tokens].float().cpu().numpy(), max_logits[tokens].cpu().numpy(),
                     lse[tokens].cpu().numpy(), ref)
    us = _event_median_us(torch, lambda i: prefill(q, kv, indices, sm_scale, q_scale=q_scale, kv_scale=kv_scale,
                                                   attn_sink=sink, out=out, max_logits=max_logits, lse=lse), 20)
    where = f"{torch.cuda.get_device_name(device)} (cuda:{device}), CUDA events, median of 20"
    return (s_q, s_kv, h_q, d_qk, topk), where, "16 tokens", errors, us


def _demo_cpu(d_qk):
    import numpy as np

    from .reference import e4m3_encode, reference_prefill

    s_q, s_kv, h_q, topk = DEMO_CPU_SHAPE
    rng = np.random.default_rng(0)
    q = e4m3_encode(rng.standard_normal((s_q, h_q, d_qk)) * 1.5)
    kv = e4m3_encode(rng.standard_normal((s_kv, 1, d_qk)) * 1.5)
    indices = np.argsort(rng.random((s_q, s_kv)), axis=1)[:, None, :topk].astype(np.int32)
    sink = (rng.standard_normal(h_q) * 2 + 8).astype(np.float32)
    sm_scale = d_qk ** -0.5
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out, max_logits, lse = prefill(q, kv, indices, sm_scale, q_scale=0.9, kv_scale=1.1, attn_sink=sink)
        times.append(time.perf_counter() - start)
    ref = reference_prefill(q, kv, indices, sm_scale, q_scale=0.9, kv_scale=1.1, attn_sink=sink)
    errors = _errors(bf16_to_float32(out), max_logits, lse, ref)
    us = 1e6 * statistics.median(times)
    return (s_q, s_kv, h_q, d_qk, topk), "CPU, wall clock, median of 3", "all tokens", errors, us


def demo(args):
    d_qk = 576 if supports(576) else min(c["d_qk"] for c in capabilities())  # DeepSeek-V3.2's, if built
    torch = _torch_cuda()
    if torch is not None and _has_kernel(d_qk, torch.cuda.current_device()):
        result = _demo_gpu(torch, torch.cuda.current_device(), d_qk)
    else:
        result = _demo_cpu(d_qk)
    shape, where, checked, (rel, lse_err, max_err), us = result
    s_q, s_kv, h_q, d_qk, topk = shape
    print(f"prefill s_q={s_q} s_kv={s_kv} h_q={h_q} d_qk={d_qk} topk={topk}, q_scale 0.9, kv_scale 1.1, a sink")
    print(f"on {where}: {us:.1f} µs per call, {flops(s_q, h_q, d_qk, topk) / us / 1e6:.3g} TFLOP/s")
    ok = rel <= OUT_REL_LIMIT and lse_err <= LSE_ABS_LIMIT and max_err <= LSE_ABS_LIMIT
    print(f"against the float64 reference ({checked}): out rel {rel:.2e} (<= {OUT_REL_LIMIT:g}), "
          f"lse max abs {lse_err:.2e}, max_logits max abs {max_err:.2e} (<= {LSE_ABS_LIMIT:g})")
    print("accuracy: within the bounds of docs/SPEC.md" if ok else "accuracy: MISSES the bounds of docs/SPEC.md")
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------- bench

def _fp8_gemm_tflops(torch, iters):
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    # _scaled_mm wants its second operand column-major: the transpose of a row-major tensor.
    us = _event_median_us(torch, lambda i: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                                             out_dtype=torch.bfloat16), iters)
    return 2 * n ** 3 / us / 1e6


def _bench_shape(torch, shape, iters):
    s_q, s_kv, h_q, d_qk, topk = shape
    per_set = s_q * h_q * d_qk + s_kv * d_qk + 4 * s_q * topk + 2 * s_q * h_q * D_V + 8 * s_q * h_q
    free, _ = torch.cuda.mem_get_info()
    # Rotating input sets keeps one call's KV and q out of L2 for the next, as in a real model.
    sets = [_torch_inputs(torch, *shape, torch.cuda.current_device())
            for _ in range(max(1, min(3, int(0.5 * free) // per_set)))]
    scale = torch.ones(1, device="cuda")
    outs = [prefill(q, kv, idx, d_qk ** -0.5, q_scale=scale, kv_scale=scale) for q, kv, idx in sets]

    def call(i):
        (q, kv, idx), (out, mx, lse) = sets[i % len(sets)], outs[i % len(outs)]
        prefill(q, kv, idx, d_qk ** -0.5, q_scale=scale, kv_scale=scale, out=out, max_logits=mx, lse=lse)

    return _event_median_us(torch, call, iters), len(sets)


def _host_overhead_us(torch, d_qk, allocate, calls=1000, passes=3):
    """Per prefill() call, on a shape whose kernel is the smallest there is, with the outputs
    allocated by prefill() or given by the caller: the host time to issue the calls, and the wall
    time until they are done (best of `passes`, as other processes disturb single passes). When the
    two differ, the GPU set the pace."""
    q, kv, indices = _torch_inputs(torch, 1, 1, 1, d_qk, 1, "cuda")
    outputs = {} if allocate else dict(zip(("out", "max_logits", "lse"), prefill(q, kv, indices, 1.0)))
    for _ in range(10):
        prefill(q, kv, indices, 1.0, **outputs)
    best = None
    for _ in range(passes):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            prefill(q, kv, indices, 1.0, **outputs)
        issued = time.perf_counter()
        torch.cuda.synchronize()
        figures = (1e6 * (issued - start) / calls, 1e6 * (time.perf_counter() - start) / calls)
        best = figures if best is None or figures[1] < best[1] else best
    return best


def _shape_arg(text):
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 5:
        raise argparse.ArgumentTypeError(f"expected s_q,s_kv,h_q,d_qk,topk, got {text!r}")
    return shape


def bench(args):
    if args.cpu:
        return _bench_cpu(args)
    args.iters = args.iters or 20
    torch = _torch_cuda()
    if torch is None:
        print("bench needs torch with a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.current_device()
    smallest = min(c["d_qk"] for c in capabilities())
    if not _has_kernel(smallest, device):
        return 2
    gemm = _fp8_gemm_tflops(torch, args.iters)
    name = torch.cuda.get_device_name(device)
    print(f"{name} (cuda:{device}), torch {torch.__version__}, median of {args.iters} CUDA-event timings")
    print(f"torch FP8 GEMM 8192^3 (_scaled_mm, e4m3 -> bf16): {gemm:.0f} TFLOP/s")
    print(f"{'s_q, s_kv, h_q, d_qk, topk':<30} {'kernel':>8} {'µs':>8} {'TFLOP/s':>8} {'of FP8 GEMM':>11}")
    rows = []
    for shape in args.shape or BENCH_SHAPES:
        s_q, s_kv, h_q, d_qk, topk = shape
        if not _has_kernel(d_qk, device):
            continue
        us, sets = _bench_shape(torch, shape, args.iters)
        tflops = flops(s_q, h_q, d_qk, topk) / us / 1e6
        rows.append({"shape": dict(zip(("s_q", "s_kv", "h_q", "d_qk", "topk"), shape)), "kernel": _kernel(shape),
                     "precision": PRECISION, "us": us, "tflops": tflops, "fraction_of_fp8_gemm": tflops / gemm,
                     "input_sets": sets})
        print(f"{_label(shape):<30} {_kernel(shape):>8} {us:>8.1f} {tflops:>8.1f} {tflops / gemm:>11.2f}")
        torch.cuda.empty_cache()
    overhead = {}
    for allocate in (False, True):
        issue, wall = _host_overhead_us(torch, smallest, allocate)
        outputs = "outputs allocated" if allocate else "outputs given"
        overhead[outputs] = {"issue_us": issue, "wall_us": wall}
        print(f"host overhead per prefill() call (s_q=1, h_q=1, topk=1, {outputs}, best of 3 x 1000 calls): "
              f"{issue:.1f} µs to issue, {wall:.1f} µs until done")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "version": __version__, "iters": args.iters,
                       "fp8_gemm_tflops": gemm, "shapes": rows, "host_overhead_per_call": overhead}, f, indent=2)
    return 0


def _bench_cpu(args):
    from ._bench_cpu import SHAPES, bench_cpu

    rows = bench_cpu(args.shape or SHAPES, args.iters or 7, args.threads)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_isa": _C.cpu_isa(), "version": __version__, "shapes": rows}, f, indent=2)
    return 0


INFO_HELP = """Prints the version, how the package was built (CUDA version and architectures, or CPU only),
its capability table (arch, d_qk, d_v, fatbin), its GPU kernels, the CPU path's entry and threads,
and each GPU found, with the head dims it runs
or why it cannot."""
DEMO_HELP = f"""Runs one prefill on random e4m3 inputs (q_scale 0.9, kv_scale 1.1, an attention sink), checks
it against the float64 reference and prints its time, TFLOP/s and errors. On the GPU when torch
sees one this build has a kernel for (s_q {DEMO_GPU_SHAPE[0]}, s_kv {DEMO_GPU_SHAPE[1]}, h_q {DEMO_GPU_SHAPE[2]}, \
d_qk 576 if built, topk {DEMO_GPU_SHAPE[3]};
16 tokens checked), else on the CPU with NumPy (s_q {DEMO_CPU_SHAPE[0]}, s_kv {DEMO_CPU_SHAPE[1]}, h_q {DEMO_CPU_SHAPE[2]}, \
topk {DEMO_CPU_SHAPE[3]}; all checked).
Exits 1 if out's relative error exceeds {OUT_REL_LIMIT:g} or that of lse or max_logits {LSE_ABS_LIMIT:g} absolute
(the exact mode's bounds in docs/SPEC.md)."""
BENCH_HELP = """Times prefill() with CUDA events on the benchmark shapes (rotating input sets, outputs given)
beside torch's FP8 GEMM rate measured in the same run, and prints for each shape µs, TFLOP/s,
the fraction of that rate and the kernel that ran; then the host overhead per call.
Needs torch with a CUDA GPU. With --cpu: the CPU path beside the plain PyTorch version of it
(gather, fp32 einsum, softmax) on the same inputs and threads, timed in turns in one run."""


def _describe(text):
    return {"description": text, "formatter_class": argparse.RawDescriptionHelpFormatter}


def main(argv=None, prog=None):
    """The `sparse-mla-fp8` script; `python -m sparse_mla_fp8` passes its own prog name."""
    parser = argparse.ArgumentParser(prog=prog, **_describe(__doc__))
    parser.add_argument("--version", action="version", version=_version_text())
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="the build, its capability table and the GPUs found", **_describe(INFO_HELP))
    commands.add_parser("demo", help="one checked and timed prefill (GPU if possible, else CPU)",
                        **_describe(DEMO_HELP))
    b = commands.add_parser("bench", help="time the benchmark shapes (torch + CUDA)", **_describe(BENCH_HELP))
    b.add_argument("--shape", action="append", type=_shape_arg, metavar="S_Q,S_KV,H_Q,D_QK,TOPK",
                   help="a shape to time instead of the six of docs/SPEC.md (repeatable)")
    b.add_argument("--json", metavar="PATH", help="write every figure to PATH")
    b.add_argument("--iters", type=int, help="timed calls per shape (default 20; 7 with --cpu)")
    b.add_argument("--cpu", action="store_true",
                   help="time the CPU path instead, beside the plain PyTorch version in the same run (shapes of "
                        "about a second; torch optional)")
    b.add_argument("--threads", type=int, help="with --cpu: threads for both (default: torch's setting, else "
                                               "OMP_NUM_THREADS, else every core)")
    args = parser.parse_args(argv)
    return {"info": info, "demo": demo, "bench": bench}[args.command](args)
