"""What every test file shares: random cases as NumPy arrays, one Backend per array framework that mirrors
a case onto it (strides and all), and the one check of a call against the float64 reference."""

import dataclasses
import re
import zlib

import numpy as np
import pytest

import sparse_mla_fp8
from sparse_mla_fp8.reference import bf16_bits_to_float32, e4m3_decode, e4m3_encode, reference_prefill, valid_slots

INT_MIN, INT_MAX = int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max)
D_V = 512
NAN_E4M3 = (0x7F, 0xFF)
OUT_POISON = 0xFFFF  # a bf16 NaN: an element the call did not write shows up as NaN
STAT_TOL = 1e-3  # |max_logits - ref| and |lse - ref|, absolute (the contract's figure)
# precision "fast" on the GPU (CONTRACT.md): ||out - ref|| / ||ref||, and max_logits and lse
FAST_OUT_TOL, FAST_STAT_TOL = 2.5e-2, 1e-2


def table_dims():
    return sorted({c["d_qk"] for c in sparse_mla_fp8.capabilities()})


def dim(d_qk):
    """d_qk if this build compiled it, else the compiled head dim nearest to it: a case written for the
    default build's 512 and 576 runs on a build with other SPARSE_MLA_HEAD_DIMS too."""
    return min(table_dims(), key=lambda d: (abs(d - d_qk), d))


def gpu_supported(device):
    """Whether `device` runs one of this build's head dims at all."""
    return any(sparse_mla_fp8.supports(d, device=device) for d in table_dims())


def dims_error(d_qk):
    return f"sparse_mla_q8kv8_prefill_fwd supports d_qk={'/'.join(map(str, table_dims()))}, got {d_qk}"


def d_v_error(d_v):
    return f"sparse_mla_q8kv8_prefill_fwd requires d_v=512, got {d_v}"


def precision_error(value):
    return f'precision must be "exact" or "fast", got {value!r}'


def seed_of(*parts):
    """A fixed seed per test parameter, so that each case is fresh data and a failure reproduces."""
    return zlib.crc32(repr(parts).encode())


def e4m3_randn(rng, shape):
    return e4m3_encode(rng.standard_normal(shape) * 1.5)


@dataclasses.dataclass
class Case:
    """One call's inputs, as NumPy arrays of any strides; fp8 tensors are uint8 e4m3fn bytes."""
    q: np.ndarray  # [s_q, h_q, d_qk]
    kv: np.ndarray  # [s_kv, 1, d_qk]
    indices: np.ndarray  # [s_q, 1, topk] int32
    sm_scale: float
    q_scale: float = 1.0
    kv_scale: float = 1.0
    attn_sink: np.ndarray | None = None  # [h_q] float32
    topk_length: np.ndarray | None = None  # [s_q] int32
    scales_as_arrays: tuple = (False, False)  # pass q_scale / kv_scale as 1-element float32 arrays
    precision: str | None = None  # prefill's keyword; None leaves it out (the default)

    @property
    def s_q(self):
        return self.q.shape[0]

    @property
    def h_q(self):
        return self.q.shape[1]

    def reference(self, tokens=slice(None)):
        tl = None if self.topk_length is None else self.topk_length[tokens]
        return reference_prefill(self.q[tokens], self.kv, self.indices[tokens], self.sm_scale,
                                 self.q_scale, self.kv_scale, D_V, self.attn_sink, tl)

    def largest_abs_logit(self):
        """[s_q, h_q]: each row's largest |logit| over its valid slots (0 where none): the contract's
        bound on max_logits and lse in precision "exact" grows with it (3e-5 of it, where that is
        more than 1e-3)."""
        valid = valid_slots(self.indices, self.kv.shape[0], self.topk_length)
        rows = np.where(valid[..., None], e4m3_decode(self.kv[np.where(valid, self.indices[:, 0], 0), 0]), 0.0)
        logits = np.einsum("shd,std->sht", e4m3_decode(self.q), rows) * self.sm_scale * self.q_scale * self.kv_scale
        return np.abs(logits).max(axis=-1, initial=0.0)

    def poison_unreferenced_kv(self):
        """Make every KV row that no valid slot names a NaN row, so that a read of one shows."""
        used = np.zeros(self.kv.shape[0], bool)
        used[self.indices[:, 0, :][valid_slots(self.indices, self.kv.shape[0], self.topk_length)]] = True
        unused = np.flatnonzero(~used)
        self.kv[unused] = np.array(NAN_E4M3, np.uint8)[unused % 2, None, None]


def random_case(seed, s_q, s_kv, h_q, d_qk, topk):
    """randn x 1.5 cast to e4m3 for q and kv; indices uniform in [0, s_kv), duplicates allowed."""
    rng = np.random.default_rng(seed)
    return Case(q=e4m3_randn(rng, (s_q, h_q, d_qk)), kv=e4m3_randn(rng, (s_kv, 1, d_qk)),
                indices=rng.integers(0, s_kv, (s_q, 1, topk), dtype=np.int32), sm_scale=d_qk ** -0.5)


def awkward_case(seed, s_q=6, s_kv=80, h_q=12, topk=40, sink=True, lengths=True, scales_as_arrays=(True, False)):
    """A random case with the contract's awkward parts: invalid indices (negative and >= s_kv), a row
    with none valid, topk_length, a sink, scales other than 1; d_qk the table's first."""
    case = random_case(seed, s_q, s_kv, h_q, table_dims()[0], topk)
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


def embedded(a, root_shape, select, fill):
    """a copied into the view select(root) of a bigger array filled with `fill`: the same values under
    other strides, with poison in the gaps that a wrong stride would read or write."""
    root = np.full(root_shape, fill, a.dtype)
    view = select(root)
    view[...] = a
    return view


def unaligned_q(case):
    """q's rows off the 16-byte grid (the kernels' byte-copy path): the first 1 byte past it, each row
    3 bytes past the one before."""
    s_q, h_q, d_qk = case.q.shape
    case.q = embedded(case.q, (s_q, h_q, d_qk + 3), lambda r: r[:, :, 1:1 + d_qk], 0x7F)


def unaligned_kv(case):
    """kv's rows off the 16-byte grid: row stride d_qk + 5, from 3 bytes past it."""
    s_kv, _, d_qk = case.kv.shape
    case.kv = embedded(case.kv, (s_kv, 1, d_qk + 5), lambda r: r[:, :, 3:3 + d_qk], 0x7F)


def _layout(a):
    """(flat root, offset, strides), in elements, of a NumPy view, so that a backend can rebuild the same
    view over its own copy of the root: a test of strides must reach the library with those strides."""
    root = a if a.base is None else a.base
    if not isinstance(root, np.ndarray) or root.dtype != a.dtype or not root.flags.c_contiguous:
        root = a = np.ascontiguousarray(a)
    offset = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return root.reshape(-1), offset // a.itemsize, tuple(s // a.itemsize for s in a.strides)


class Backend:
    """One array framework on one device: builds its arrays, poisoned outputs, and reads results back."""

    def __init__(self, kind, device, precision=None):
        # device: "cpu", "cuda" or "cuda:N"; precision: prefill's keyword for the cases that leave it
        # out (None: the default)
        self.kind, self.device, self.precision = kind, device, precision
        self.tol = 1e-2 if device == "cpu" else 2e-2  # ||out - ref|| / ||ref||
        if kind.startswith("torch"):
            self.torch = pytest.importorskip("torch")
            if device != "cpu" and not self.torch.cuda.is_available():
                pytest.skip("no CUDA device visible to torch")
        elif kind == "cupy":
            self.cupy = pytest.importorskip("cupy")
            try:
                gpus = self.cupy.cuda.runtime.getDeviceCount()
            except self.cupy.cuda.runtime.CUDARuntimeError:  # no driver
                gpus = 0
            if not gpus:
                pytest.skip("no CUDA device visible to CuPy")
        if device != "cpu" and not gpu_supported(device):
            pytest.skip(f"{device} has no compiled specialization")

    def tolerances(self, precision=None):
        """(out, max_logits and lse) bounds of a call in `precision` (None: the backend's); the CPU
        path computes exactly in both modes."""
        if (precision or self.precision) == "fast" and self.device != "cpu":
            return FAST_OUT_TOL, FAST_STAT_TOL
        return self.tol, STAT_TOL

    def put(self, a, fp8=False):
        """a (NumPy, any strides) on this backend with the same strides; fp8: a holds e4m3fn bytes, and
        torch-fp8 gets a float8_e4m3fn view of them."""
        if a is None or self.kind == "numpy":
            return a
        flat, offset, strides = _layout(a)
        if self.kind == "cupy":
            flat = self.cupy.asarray(flat)
            return self.cupy.lib.stride_tricks.as_strided(
                flat[offset:], a.shape, tuple(s * a.itemsize for s in strides))
        torch = self.torch
        flat = torch.from_numpy(flat).to(self.device)
        if fp8 and self.kind == "torch-fp8":
            flat = flat.view(torch.float8_e4m3fn)
        return torch.as_strided(flat, a.shape, strides, offset)

    def scale(self, x):
        return self.put(np.array([x], np.float32))

    def out_buffer(self, shape):
        """bf16 output poisoned with NaN bit patterns: bfloat16 for torch, uint16 bits otherwise."""
        if self.kind == "numpy":
            return np.full(shape, OUT_POISON, np.uint16)
        if self.kind == "cupy":
            return self.cupy.full(shape, OUT_POISON, self.cupy.uint16)
        torch = self.torch
        return torch.full(shape, -1, dtype=torch.int16, device=self.device).view(torch.bfloat16)

    def f32_buffer(self, shape):
        if self.kind == "numpy":
            return np.full(shape, np.nan, np.float32)
        if self.kind == "cupy":
            return self.cupy.full(shape, np.nan, self.cupy.float32)
        return self.torch.full(shape, float("nan"), dtype=self.torch.float32, device=self.device)

    def numpy(self, x):
        """A NumPy copy of x; bf16 comes back as its uint16 bit patterns, fp8 as uint8 bytes."""
        if self.kind == "numpy":
            return np.array(x)
        if self.kind == "cupy":
            return self.cupy.asnumpy(x)
        torch = self.torch
        x = x.detach()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).cpu().numpy().view(np.uint16)
        if x.dtype == torch.float8_e4m3fn:
            return x.view(torch.uint8).cpu().numpy()
        return x.cpu().numpy()

    def raw(self, x):
        """x's bytes: what a refused call must leave untouched."""
        return self.numpy(x).tobytes()

    def address(self, x):
        if self.kind == "numpy":
            return x.__array_interface__["data"][0]
        return x.data.ptr if self.kind == "cupy" else x.data_ptr()

    def has_nan(self, x):
        """Whether x holds a NaN (bf16 bits included), computed where x lives."""
        if self.kind.startswith("torch"):
            return bool(self.torch.isnan(x).any())
        if x.dtype == np.uint16:
            return bool(((x & 0x7FFF) > 0x7F80).any())
        return bool((x != x).any())

    def rows(self, x, tokens):
        """x[tokens] for a slice or a NumPy array of token numbers, taken on x's device."""
        if isinstance(tokens, slice) or self.kind == "numpy":
            return x[tokens]
        if self.kind == "cupy":
            return x[self.cupy.asarray(tokens)]
        return x[self.torch.as_tensor(tokens, device=x.device)]

    def check_types(self, result, s_q, h_q):
        """prefill returns (out, max_logits, lse) in the inputs' framework and device, with these dtypes."""
        assert isinstance(result, tuple) and len(result) == 3, type(result)
        out, ml, lse = result
        assert tuple(out.shape) == (s_q, h_q, D_V) and tuple(ml.shape) == tuple(lse.shape) == (s_q, h_q)
        if self.kind.startswith("torch"):
            torch = self.torch
            want = torch.device(self.device)
            assert all(isinstance(x, torch.Tensor) and x.device.type == want.type
                       and want.index in (None, x.device.index) for x in result)
            assert (out.dtype, ml.dtype, lse.dtype) == (torch.bfloat16, torch.float32, torch.float32)
        else:
            module = np if self.kind == "numpy" else self.cupy
            assert all(isinstance(x, module.ndarray) for x in result)
            assert (out.dtype, ml.dtype, lse.dtype) == (np.uint16, np.float32, np.float32)


def call_args(backend, case, provide=True):
    """prefill's arguments for case on backend; provide: pass poisoned out, max_logits and lse."""
    q_scale, kv_scale = (backend.scale(x) if as_array else x
                         for x, as_array in zip((case.q_scale, case.kv_scale), case.scales_as_arrays))
    kw = dict(q=backend.put(case.q, fp8=True), kv=backend.put(case.kv, fp8=True),
              indices=backend.put(case.indices), sm_scale=case.sm_scale, q_scale=q_scale,
              kv_scale=kv_scale, attn_sink=backend.put(case.attn_sink),
              topk_length=backend.put(case.topk_length))
    precision = case.precision or backend.precision
    if precision is not None:
        kw["precision"] = precision
    if provide:
        kw.update(out=backend.out_buffer((case.s_q, case.h_q, D_V)),
                  max_logits=backend.f32_buffer((case.s_q, case.h_q)),
                  lse=backend.f32_buffer((case.s_q, case.h_q)))
    return kw


def invoke(kw, api="prefill"):
    """Call the package with call_args()' dict; api "sglang" uses the SGLang drop-in's argument order."""
    kw = dict(kw)
    head = [kw.pop(k) for k in ("q", "kv", "indices", "sm_scale")]
    if api == "prefill":
        return sparse_mla_fp8.prefill(*head, **kw)
    # SGLang's order, all positional up to topk_length
    head += [kw.pop("q_scale"), kw.pop("kv_scale"), kw.pop("d_v", D_V), kw.pop("attn_sink", None),
             kw.pop("topk_length", None)]
    return sparse_mla_fp8.sparse_mla_q8kv8_prefill_fwd(*head, **kw)


def results_numpy(backend, result, tokens=slice(None)):
    """(out, max_logits, lse) of `tokens` as float64 NumPy arrays."""
    out, ml, lse = (backend.rows(x, tokens) for x in result)
    return (bf16_bits_to_float32(backend.numpy(out)).astype(np.float64),
            backend.numpy(ml).astype(np.float64), backend.numpy(lse).astype(np.float64))


def assert_matches(got, ref, tol, stat_tol=STAT_TOL):
    """The contract's accuracy: ||out - ref|| / ||ref|| <= tol, |max_logits - ref| and |lse - ref| <=
    stat_tol (a number, or one per row) with the infinities of empty rows exact; plus no NaN anywhere
    (poisoned outputs that were not written are NaN), exact zeros where the reference is 0, and no
    single row far off."""
    out, ml, lse = got
    r_out, r_ml, r_lse = ref
    assert out.shape == r_out.shape and ml.shape == r_ml.shape and lse.shape == r_lse.shape
    for name, g, r in (("max_logits", ml, r_ml), ("lse", lse, r_lse)):
        inf = np.isinf(r)
        bad = np.flatnonzero(g[inf] != r[inf])
        assert bad.size == 0, f"{name}: {bad.size} rows should be {r[inf][bad[:4]]}, got {g[inf][bad[:4]]}"
        err, bound = np.abs(g[~inf] - r[~inf]), np.broadcast_to(stat_tol, r.shape)[~inf]
        if not np.all(err <= bound):
            worst = np.argmax(np.where(np.isnan(err), np.inf, err / bound))  # a NaN row first
            raise AssertionError(f"{name}: max abs error {np.nanmax(err, initial=0)}, NaN in {np.isnan(err).sum()} "
                                 f"rows; worst against its bound: {err[worst]:.3g} where {bound[worst]:.3g} is allowed")
    assert np.isfinite(out).all(), f"out: {np.count_nonzero(~np.isfinite(out))} non-finite elements"
    zero_rows = (r_out == 0).all(axis=-1)
    assert (out[zero_rows] == 0).all(), "out is not 0 in rows with no valid slot or a +inf sink"
    norm = np.linalg.norm(r_out)
    if norm == 0:
        return
    rel = np.linalg.norm(out - r_out) / norm
    assert rel <= tol, f"out: ||out - ref|| / ||ref|| = {rel:.3g} > {tol}"
    # a few wrong rows hide in a global norm: none may be off by more than 10x tol of a typical row
    row_err = np.linalg.norm(out - r_out, axis=-1) / (norm / np.sqrt(zero_rows.size))
    assert row_err.max() <= 10 * tol, f"out: worst row error {row_err.max():.3g} of a typical row norm"


def run_and_check(backend, case, *, provide=True, api="prefill", tokens=slice(None), force_kernel=None):
    """Run case on backend (with the GPU kernel force_kernel, if given), check the types, that provided
    buffers are the ones returned, and the values of `tokens` (all by default) against the reference;
    returns the (out, max_logits, lse) it got."""
    kw = call_args(backend, case, provide)
    if force_kernel is not None:
        kw["_force_kernel"] = force_kernel
    result = invoke(kw, api)
    backend.check_types(result, case.s_q, case.h_q)
    if provide and case.s_q:
        for name, x in zip(("out", "max_logits", "lse"), result):
            assert backend.address(x) == backend.address(kw[name]), f"{name}: not the buffer passed"
    for name, x in zip(("out", "max_logits", "lse"), result):  # every token, even where tokens are a few
        assert not backend.has_nan(x), f"{name} holds NaN: unwritten, or a NaN KV row leaked"
    got = results_numpy(backend, result, tokens)
    assert_matches(got, case.reference(tokens), *backend.tolerances(case.precision))
    return got


def assert_refused(call, exc, backend, buffers, *, match=None, names=()):
    """call() raises exc, whose text contains `match` (a literal) and names every one of `names`, and
    leaves every buffer's bytes as they were."""
    before = [backend.raw(b) for b in buffers]
    with pytest.raises(exc, match=None if match is None else re.escape(match)) as info:
        call()
    message = str(info.value)
    for name in names:
        assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message), f"{name!r} not named in: {message}"
    for i, (b, snapshot) in enumerate(zip(buffers, before)):
        assert backend.raw(b) == snapshot, f"buffer {i} was written by a refused call"
