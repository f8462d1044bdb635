import os

import pytest

# JAX takes most of a GPU's memory at its first use unless told not to; the torch tests need it too
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import sparse_mla_fp8
from harness import Backend

# Every case of the shared suite runs on each framework and device, and on the GPU in both precisions
# (the CPU path computes exactly in both); CUDA ones skip without a GPU that has a compiled
# specialization, and torch/CuPy ones without those frameworks.
PRECISIONS = ("exact", "fast")
BACKENDS = [
    pytest.param(("numpy", "cpu"), id="numpy"),
    pytest.param(("torch-fp8", "cpu"), id="torch-fp8-cpu"),
    pytest.param(("torch-u8", "cpu"), id="torch-u8-cpu"),
] + [pytest.param((kind, "cuda", precision), id=f"{kind}-cuda-{precision}", marks=pytest.mark.gpu)
     for kind in ("torch-fp8", "torch-u8", "cupy") for precision in PRECISIONS]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU with a compiled specialization")
    config.addinivalue_line("markers", "source_build: runs CMake on the source tree (ci/release.sh, which "
                                       "tests installed wheels, leaves these out)")


def pytest_report_header(config):
    # which copy is under test: an installed wheel, an editable install or a plain cmake install
    return f"sparse_mla_fp8 from {os.path.dirname(sparse_mla_fp8.__file__)}, native part {sparse_mla_fp8._C.__file__}"


@pytest.fixture(params=BACKENDS)
def backend(request):
    return Backend(*request.param)


@pytest.fixture(params=[p for p in BACKENDS if p.id.startswith("torch")])
def torch_backend(request):
    return Backend(*request.param)
