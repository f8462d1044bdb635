"""The capability table and the init-time gate of serving engines: capabilities(), supports(),
check_config(). Dims are read from the table, as a build with other dims must still pass."""

import ctypes
import os
import pathlib
import re
import subprocess
import sys

import pytest

import sparse_mla_fp8
from harness import d_v_error, dim, dims_error, table_dims
from sparse_mla_fp8 import _C, _capabilities

UNKNOWN_D_QK = next(d for d in (128, 64, 256, 1024) if d not in table_dims())


def _no_gpu():
    try:
        return not sparse_mla_fp8._C.cuda_devices()
    except RuntimeError:  # no driver or no usable GPU
        return True


def test_table_entries():
    table = sparse_mla_fp8.capabilities()
    assert table
    for entry in table:
        assert {"arch", "d_qk", "d_v", "fatbin"} <= set(entry), entry
        assert entry["d_v"] == _C.D_V  # the d_v the native module checks calls against (the kernels')
        assert (entry["arch"] is None) == (entry["fatbin"] is None), entry
        if entry["arch"] is not None:
            assert re.fullmatch(r"sm_\d+a?", entry["arch"]), entry
            assert os.path.isabs(entry["fatbin"]) and os.path.isfile(entry["fatbin"]), entry


def test_table_matches_the_native_module():
    """The table (CMake's manifest) and the native module's checks (compiled in) name the same dims: a
    stale manifest or module beside the other would refuse what the table offers, or the reverse."""
    assert table_dims() == sorted(_C.head_dims())


def _driver_loads():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(not sparse_mla_fp8._C.HAS_CUDA, reason="a CPU-only build does not ask CUDA")
def test_no_driver_is_named(tmp_path):
    if _driver_loads():
        pytest.skip("a CUDA driver is installed")
    with pytest.raises(RuntimeError, match=re.escape("no CUDA driver found (libcuda.so.1 cannot be loaded)")):
        sparse_mla_fp8._C.cuda_devices()
    with pytest.raises(ValueError, match="no CUDA driver found"):
        sparse_mla_fp8.check_config(576, device="cuda")
    run = subprocess.run([sys.executable, "-m", "sparse_mla_fp8", "info"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and "no CUDA driver found" in run.stdout, run.stdout + run.stderr
    assert "insufficient" not in run.stdout


def test_default_dims():
    """CMake's default is the contract's 512 and 576 (a build with other SPARSE_MLA_HEAD_DIMS follows
    its own table, above)."""
    cmake = pathlib.Path(__file__).parent.parent / "CMakeLists.txt"
    if not cmake.is_file():
        pytest.skip("not run from a source tree")
    default = re.search(r'set\(SPARSE_MLA_HEAD_DIMS "([^"]*)"', cmake.read_text()).group(1)
    assert default.split(";") == ["512", "576"]


@pytest.mark.parametrize("device", [None, "cpu"])
def test_supports(device):
    for d_qk in table_dims():
        assert sparse_mla_fp8.supports(d_qk, device=device) is True
        assert sparse_mla_fp8.supports(d_qk, 512, device) is True
        assert sparse_mla_fp8.supports(d_qk, d_v=256, device=device) is False
    assert sparse_mla_fp8.supports(UNKNOWN_D_QK, device=device) is False


def test_supports_cuda_without_gpu():
    if not _no_gpu():
        pytest.skip("a GPU is present: test_gpu.py covers it")
    assert sparse_mla_fp8.supports(table_dims()[0], device="cuda") is False


@pytest.mark.parametrize("device", [None, "cpu"])
def test_check_config(device):
    for d_qk in table_dims():
        assert sparse_mla_fp8.check_config(d_qk=d_qk, d_v=512, device=device) is None
    with pytest.raises(ValueError, match=re.escape(dims_error(UNKNOWN_D_QK))):
        sparse_mla_fp8.check_config(d_qk=UNKNOWN_D_QK, d_v=512, device=device)
    with pytest.raises(ValueError, match=re.escape(d_v_error(256))):
        sparse_mla_fp8.check_config(d_qk=dim(576), d_v=256, device=device)


def test_check_config_torch_device():
    torch = pytest.importorskip("torch")
    assert sparse_mla_fp8.check_config(dim(576), device=torch.device("cpu")) is None
    with pytest.raises(ValueError, match=re.escape(dims_error(UNKNOWN_D_QK))):
        sparse_mla_fp8.check_config(UNKNOWN_D_QK, device=torch.device("cpu"))


@pytest.mark.parametrize("gpu", [{"name": "NVIDIA B200", "major": 10, "minor": 0},
                                 {"name": "NVIDIA A100", "major": 8, "minor": 0}])
def test_no_kernel_on_another_arch(gpu):
    """The kernels are sm_90a-only: on another GPU the error says so and suggests no build for its arch
    (it once suggested -DCMAKE_CUDA_ARCHITECTURES=100a, a build that cannot compile them)."""
    message = str(_capabilities._no_kernel(0, 576, gpu))
    assert "sm_90a-only" in message and gpu["name"] in message, message
    assert "CMAKE_CUDA_ARCHITECTURES" not in message, message


def test_no_kernel_for_a_dim_on_hopper():
    """On an sm_90 GPU, a d_qk this build lacks: the error names what is compiled and the 90a build."""
    message = str(_capabilities._no_kernel(0, UNKNOWN_D_QK, {"name": "NVIDIA H200", "major": 9, "minor": 0}))
    assert "-DCMAKE_CUDA_ARCHITECTURES=90a " in message and f"d_qk={UNKNOWN_D_QK}" in message, message
    assert "this build has" in message, message
