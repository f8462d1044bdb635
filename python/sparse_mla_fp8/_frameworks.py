"""The caller's framework: recognise it from an array's type, read an array's device from metadata
only, allocate outputs with it, find its current stream, convert bf16 bits to float32.

A framework's module is imported only inside its adapter, which is built the first time an array of
that framework is seen: by then the caller has imported it, so the package never loads torch, CuPy
or JAX on its own.
"""

import os

# A device is (kind, index): ("cpu", 0), ("cuda", N), or another DLPack kind the kernels do not run on.
_DLPACK_KINDS = {1: "cpu", 2: "cuda"}


def default_cpu_threads():
    """Threads for the CPU path outside torch: OMP_NUM_THREADS (its first level, as OpenMP reads it)
    where it is a positive integer, else the cores this process may run on."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _DLPack:
    """Any DLPack exporter (JAX, or a framework we have no adapter for): it can be read, not allocated."""

    def __init__(self, module):
        self.module = module

    def device(self, a):
        kind, index = a.__dlpack_device__()
        kind = int(kind)
        return (_DLPACK_KINDS.get(kind, f"dlpack-device-type-{kind}"), 0 if kind == 1 else int(index))

    def dtype_name(self, a):
        return getattr(a.dtype, "name", None) or str(a.dtype)

    def empty(self, like, shape, dtype):
        raise TypeError(
            f"prefill cannot allocate outputs for {self.module} arrays, which are not writable in place: "
            "JAX callers must pass out, max_logits and lse buffers from a framework with writable arrays "
            "(e.g. CuPy or torch)")

    def default_stream(self, a, device):
        return 0

    def cpu_threads(self):
        return default_cpu_threads()

    def export(self, a):
        return a

    def bf16_to_float32(self, a):
        # numpy, CuPy and JAX arrays all take string dtypes in astype/view and shift elementwise.
        name = self.dtype_name(a)
        if name in ("uint16", "int16"):
            return (a.astype("uint32") << 16).view("float32")
        if name == "bfloat16":
            return a.astype("float32")
        raise TypeError(f"bf16_to_float32 takes bfloat16 or uint16/int16 (bf16 bits), got {name}")


class _Bf16Bits(_DLPack):
    # NumPy and CuPy have no bf16: out is a uint16 array of bf16 bit patterns.
    def __init__(self, module, xp):
        super().__init__(module)
        self._xp = xp
        self._dtypes = {"bf16": xp.uint16, "float32": xp.float32}

    def dtype_name(self, a):
        return a.dtype.name


class _NumPy(_Bf16Bits):
    def __init__(self, module):
        import numpy

        super().__init__(module, numpy)

    def device(self, a):
        return ("cpu", 0)

    def empty(self, like, shape, dtype):
        return self._xp.empty(shape, self._dtypes[dtype])


class _CuPy(_Bf16Bits):
    def __init__(self, module):
        import cupy

        super().__init__(module, cupy)

    def device(self, a):
        return ("cuda", a.device.id)

    def empty(self, like, shape, dtype):
        with self._xp.cuda.Device(like.device.id):
            return self._xp.empty(shape, self._dtypes[dtype])

    def default_stream(self, a, device):
        # CuPy's convention, as torch's for torch: the stream the caller made current on that device
        return self._xp.cuda.get_current_stream(device[1]).ptr

    def export(self, a):
        # stream=-1: no ordering for CuPy to add, as torch's to_dlpack adds none. The launch goes to CuPy's
        # current stream, or to the caller's stream=, whose ordering is the caller's. (No stream would
        # make the legacy default stream wait on the current one: an event per array, and an error
        # under a graph capture.)
        return a.__dlpack__(stream=-1)


class _Torch:
    def __init__(self, module):
        import torch
        import torch.utils.dlpack

        self._torch = torch
        self._dtypes = {"bf16": torch.bfloat16, "float32": torch.float32}
        self._names = {}
        self._devices = {}
        # Tensor.__dlpack__ and __dlpack_device__ run Python-level checks, ~3 µs a call; to_dlpack is
        # the same export in C (no stream sync either), and the native module takes its capsule as is.
        self.export = torch.utils.dlpack.to_dlpack
        # torch.cuda.current_stream() builds a Stream object, ~3 µs; the raw query (what torch's own
        # compiler uses) returns the handle at once. CPU-only builds of torch lack it, and need neither.
        self._current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
            lambda index: torch.cuda.current_stream(index).cuda_stream)

    def device(self, a):
        d = a.device
        device = self._devices.get(d)
        if device is None:
            device = self._devices[d] = (d.type, d.index or 0)
        return device

    def dtype_name(self, a):
        dt = a.dtype
        name = self._names.get(dt)
        if name is None:
            name = self._names[dt] = str(dt).removeprefix("torch.")
        return name

    def empty(self, like, shape, dtype):
        return self._torch.empty(shape, dtype=self._dtypes[dtype], device=like.device)

    def default_stream(self, a, device):
        return self._current_stream(device[1]) if device[0] == "cuda" else 0

    def cpu_threads(self):
        return self._torch.get_num_threads()  # what torch.set_num_threads set, as torch's own CPU ops

    def bf16_to_float32(self, a):
        torch = self._torch
        if a.dtype == torch.bfloat16:
            return a.float()
        if a.dtype in (torch.uint16, torch.int16):
            # Sign extension fills only the high half, which the shift discards.
            return (a.view(torch.int16).to(torch.int32) << 16).view(torch.float32)
        raise TypeError(f"bf16_to_float32 takes bfloat16 or uint16/int16 (bf16 bits), got {self.dtype_name(a)}")


_ADAPTER_CLASSES = {"torch": _Torch, "numpy": _NumPy, "cupy": _CuPy}
_adapters = {}  # top-level module name -> adapter
_by_type = {}  # array type -> adapter, or None for a non-array


def _adapter_for_type(tp):
    if not hasattr(tp, "__dlpack_device__"):
        return None
    module = tp.__module__.partition(".")[0]
    adapter = _adapters.get(module)
    if adapter is None:
        adapter = _adapters[module] = _ADAPTER_CLASSES.get(module, _DLPack)(module)
    return adapter


def framework_of(x):
    """The adapter of x's framework, or None when x is not an array."""
    tp = type(x)
    try:
        return _by_type[tp]
    except KeyError:
        adapter = _by_type[tp] = _adapter_for_type(tp)
        return adapter


def export(x):
    """What the native module is given for x: a DLPack capsule or exporter for an array, x itself
    for anything else (None, a float)."""
    framework = framework_of(x)
    return x if framework is None else framework.export(x)


def stream_handle(stream, framework, q, device):
    """The cudaStream_t, as an int, that the launch goes to."""
    if stream is None:
        return framework.default_stream(q, device)
    if isinstance(stream, int):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        return int(protocol()[1])
    handle = getattr(stream, "cuda_stream", None)
    if handle is not None:
        return int(handle)
    raise TypeError(
        "stream must be an int (cudaStream_t), an object with __cuda_stream__() or .cuda_stream, "
        f"got {type(stream).__name__}")


def bf16_to_float32(a):
    """float32 copy of a bf16 array, in a's framework: a torch bfloat16 tensor, or a uint16/int16
    array of bf16 bit patterns (what prefill returns for NumPy and CuPy, which have no bf16)."""
    framework = framework_of(a)
    if framework is None:
        raise TypeError(f"bf16_to_float32 takes an array, got {type(a).__name__}")
    return framework.bf16_to_float32(a)
