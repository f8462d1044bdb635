"""The JAX primitive (XLA FFI), eager and under jax.jit, against the float64 reference on fresh random
data; torch is not needed. The CPU cases run wherever jax is; the CUDA ones skip without a GPU that
has a kernel."""

import re

import numpy as np
import pytest

import sparse_mla_fp8
from sparse_mla_fp8 import _C
from harness import D_V, assert_matches, awkward_case, dims_error, seed_of, table_dims

D_QK = table_dims()[0]


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
    case = awkward_case(seed_of("jax", platform, name), **options)
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
    case = awkward_case(seed_of("jax-refusals"))
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
    with pytest.raises(TypeError, match="JAX arrays cannot be written in place"):
        sparse_mla_fp8.prefill(*args, out=np.zeros((case.s_q, case.h_q, D_V), np.uint16))
    unknown = next(d for d in (128, 256, 1024) if d not in table_dims())
    with pytest.raises(ValueError, match=re.escape(dims_error(unknown))):
        sparse_mla_fp8.prefill(jax.numpy.zeros((2, 4, unknown), "uint8"), jax.numpy.zeros((8, 1, unknown), "uint8"),
                               jax.numpy.zeros((2, 1, 4), "int32"), 0.1)



def test_jax_refuses_another_frameworks_array():
    """A torch array beside a JAX q is refused, not left out of the custom call."""
    _jax()
    torch = pytest.importorskip("torch")
    case = awkward_case(seed_of("jax-foreign"))
    args, kwargs = _jax_args(case, _jax_device("cpu"), fp8=True)
    for name, value in (("attn_sink", torch.from_numpy(case.attn_sink)), ("q_scale", torch.ones(1)),
                        ("topk_length", torch.from_numpy(case.topk_length))):
        with pytest.raises(TypeError, match=f"{name} must be a JAX or NumPy array when q is a JAX array, got Tensor"):
            sparse_mla_fp8.prefill(*args, **{**kwargs, name: value})


@pytest.mark.gpu
@pytest.mark.parametrize("name", JAX_CASES)
def test_jax_cuda(name):
    _jax_check("cuda", name)
