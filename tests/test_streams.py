"""The stream a launch goes to when the caller names none: the current stream of the inputs'
framework on their device (torch's for torch tensors, CuPy's for CuPy arrays), else the legacy default
stream; a named stream as it is given. The GPU side (work queued on such a stream) is in test_gpu.py."""

import sys
import types

import numpy as np
import pytest

from sparse_mla_fp8 import _frameworks
from sparse_mla_fp8._frameworks import framework_of, stream_handle


@pytest.fixture
def fake_cupy(monkeypatch):
    """A stand-in for the cupy module with a current stream per device, for boxes without CuPy: only
    the stream lookup is exercised, never a launch."""
    current = {0: 0x1000, 1: 0x2000}
    cupy = types.ModuleType("cupy")
    cupy.uint16, cupy.float32 = np.uint16, np.float32
    cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda device_id=-1: types.SimpleNamespace(ptr=current[device_id]))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return current


def test_cupy_default_is_its_current_stream(fake_cupy):
    cupy = _frameworks._ADAPTER_CLASSES["cupy"]("cupy")
    for index, handle in fake_cupy.items():
        assert stream_handle(None, cupy, None, ("cuda", index)) == handle


def test_named_stream_wins(fake_cupy):
    cupy = _frameworks._ADAPTER_CLASSES["cupy"]("cupy")

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x3000)

    assert stream_handle(0x4000, cupy, None, ("cuda", 1)) == 0x4000
    assert stream_handle(Protocol(), cupy, None, ("cuda", 1)) == 0x3000
    assert stream_handle(types.SimpleNamespace(cuda_stream=0x5000), cupy, None, ("cuda", 1)) == 0x5000
    with pytest.raises(TypeError, match="stream must be"):
        stream_handle("0x4000", cupy, None, ("cuda", 1))


def test_cupy_arrays_exported_without_stream_ordering(fake_cupy):
    """CuPy's __dlpack__ is asked for no ordering (stream -1): the launch is on CuPy's current stream
    already, or on the caller's."""
    cupy = _frameworks._ADAPTER_CLASSES["cupy"]("cupy")

    class Array:
        def __dlpack__(self, *, stream=None):
            return ("capsule", stream)

    assert cupy.export(Array()) == ("capsule", -1)


def test_numpy_and_cpu_tensors_get_the_legacy_stream():
    a = np.zeros(1)
    assert stream_handle(None, framework_of(a), a, ("cpu", 0)) == 0
    torch = pytest.importorskip("torch")
    t = torch.zeros(1)
    assert stream_handle(None, framework_of(t), t, ("cpu", 0)) == 0
