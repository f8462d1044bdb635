"""The capability table: which (arch, d_qk, d_v) this build compiled, where its fatbins are, and
whether a device can run them (which kernel of a fatbin runs a call, the native module chooses). The
table is `_manifest.json`, which CMake installs beside the native module; the CPU path serves the same
(d_qk, d_v) pairs as the GPU kernels.

Everything here is looked up once per process and cached, since prefill() asks on every call.
"""

import functools
import json
import os

from . import _C

# Where CMake installed _C, the manifest and the fatbins. Not this file's folder: an editable install
# imports the Python files from the source tree and the built ones from site-packages.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(_C.__file__))
_OP = "sparse_mla_q8kv8_prefill_fwd"  # the engines match on errors that start with this name


@functools.cache
def manifest():
    with open(os.path.join(_PACKAGE_DIR, "_manifest.json")) as f:
        return json.load(f)


def _specializations():
    return manifest()["specializations"]


def capabilities():
    """The compiled specializations: dicts of arch ("sm_90a", or None in a CPU-only build), d_qk, d_v,
    and fatbin (absolute path, or None)."""
    return [
        {"arch": s["arch"], "d_qk": s["d_qk"], "d_v": s["d_v"],
         "fatbin": s["fatbin"] and os.path.join(_PACKAGE_DIR, s["fatbin"])}
        for s in _specializations()
    ]


@functools.cache
def _d_v_of():
    return {s["d_qk"]: s["d_v"] for s in _specializations()}


def _dims_text(dims):
    return "/".join(str(d) for d in sorted(dims))


def check_dims(d_qk, d_v):
    """prefill()'s errors for head dims that this build has no kernel for (the native module words them)."""
    _C.check_dims(d_qk, d_v)


@functools.cache
def cuda_devices():
    """_C.cuda_devices(), once per process; raises RuntimeError when there is no driver or GPU."""
    return _C.cuda_devices()


def _gpu(index):
    try:
        gpus = cuda_devices()
    except RuntimeError as e:
        raise ValueError(f"cuda:{index} is not usable: {e}") from e
    for gpu in gpus:
        if gpu["index"] == index:
            return gpu
    raise ValueError(f"cuda:{index} does not exist: {len(gpus)} CUDA device(s) found")


def arch_of(gpu):
    return f"sm_{gpu['major']}{gpu['minor']}"


def _runs_on(spec_arch, gpu):
    # "sm_90a" code runs on compute capability 9.0 only; the suffix names arch-specific features.
    return spec_arch is not None and spec_arch[3:].rstrip("af") == f"{gpu['major']}{gpu['minor']}"


# The kernels use wgmma and setmaxnreg, which exist only in sm_90a: compute capability 9.0's
# arch-specific target (CMake's "90a"). Another GPU cannot run them from any build.
_KERNEL_ARCH = "sm_90a"


def _no_kernel(index, d_qk, gpu):
    compiled = {}
    for s in _specializations():
        if s["arch"] is not None:
            compiled.setdefault(s["arch"], []).append(s["d_qk"])
    built = "; ".join(f"{arch} with d_qk={_dims_text(dims)}" for arch, dims in compiled.items())
    has = f"this build has {built or 'no GPU kernels (CPU-only build, no CUDA compiler found)'}"
    where = f"{_OP} has no kernel for d_qk={d_qk} on cuda:{index} ({gpu['name']}, {arch_of(gpu)})"
    if not _runs_on(_KERNEL_ARCH, gpu):
        return ValueError(f"{where}: the kernels are {_KERNEL_ARCH}-only (compute capability 9.0: H100, H200), "
                          f"so no build runs on {arch_of(gpu)}; {has}")
    dims = _dims_text(set(_d_v_of()) | {d_qk}).replace("/", ";")
    return ValueError(f"{where}: {has}; build it with: cmake -B build -DCMAKE_CUDA_ARCHITECTURES=90a "
                      f'-DSPARSE_MLA_HEAD_DIMS="{dims}"')


def _find_kernel(index, d_qk):
    if not _C.HAS_CUDA:
        # A CPU-only native module cannot query the GPU, so its arch is unknown; the kernels are SM90a.
        raise ValueError(
            f"{_OP} has no kernel for cuda:{index} (arch unknown): this is a CPU-only build "
            "(no CUDA compiler found); build with CUDA: cmake -B build -DCMAKE_CUDA_ARCHITECTURES=90a "
            f'-DSPARSE_MLA_HEAD_DIMS="{_dims_text(_d_v_of()).replace("/", ";")}"')
    gpu = _gpu(index)
    if not any(s["d_qk"] == d_qk and _runs_on(s["arch"], gpu) for s in _specializations()):
        raise _no_kernel(index, d_qk, gpu)
    _set_kernel_dir()


@functools.cache
def _set_kernel_dir():
    # the native module loads the fatbin of a call's d_qk from here, and chooses its kernel itself
    _C.set_kernel_dir(_PACKAGE_DIR)


_has_kernel = set()  # the (device index, d_qk) found to have a kernel


def require_kernel(index, d_qk):
    """ValueError unless this build has a kernel for d_qk that CUDA device `index` runs. A d_qk the
    table lacks is check_dims' to refuse, in the words the contract fixes."""
    key = (index, d_qk)
    if key not in _has_kernel and d_qk in _d_v_of():
        _find_kernel(index, d_qk)
        _has_kernel.add(key)


def _parse_device(device):
    """None, "cpu", "cuda", "cuda:N", N or a torch.device -> None, ("cpu", 0) or ("cuda", N).
    A bare "cuda" means device 0."""
    if device is None:
        return None
    if isinstance(device, int) and not isinstance(device, bool):
        return ("cuda", device)
    if isinstance(device, str):
        kind, _, index = device.partition(":")
    elif isinstance(getattr(device, "type", None), str):  # torch.device, without importing torch
        kind, index = device.type, device.index
    else:
        raise TypeError(f'device must be None, "cpu", "cuda", "cuda:N", an int or a torch.device, got {device!r}')
    if kind == "cpu":
        return ("cpu", 0)
    if kind == "cuda":
        try:
            return ("cuda", int(index or 0))
        except ValueError:
            pass
    raise ValueError(f'device must be "cpu", "cuda" or "cuda:N", got {device!r}')


def check_config(d_qk, d_v=512, device=None):
    """Raise the errors prefill() would raise for these dims on this device (None: dims only)."""
    check_dims(d_qk, d_v)
    device = _parse_device(device)
    if device is not None and device[0] == "cuda":
        require_kernel(device[1], d_qk)


def supports(d_qk, d_v=512, device=None):
    """Whether prefill() runs with these dims on this device (None: dims only)."""
    try:
        check_config(d_qk, d_v, device)
    except ValueError:
        return False
    return True
