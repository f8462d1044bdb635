"""The source tree under plain CMake, as the README's rebuild story uses it: the architectures configure
refuses, and a CPU-only build installed with `cmake --install` that imports and computes. These test
the source tree, not the installed package (ci/release.sh leaves them out: marker source_build)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import venv

import pytest

SOURCE = pathlib.Path(__file__).resolve().parents[1]
pytestmark = [
    pytest.mark.source_build,
    pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake"),
    pytest.mark.skipif(not (SOURCE / "CMakeLists.txt").is_file(), reason="needs the source tree"),
]


def _cmake(*args, env=None, timeout=120):
    run = subprocess.run(["cmake", *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)
    run.text = " ".join((run.stdout + run.stderr).split())  # CMake wraps its messages
    return run


def _env_with_python(prefix):
    """The environment of a shell in which the venv (or installation) at `prefix` is active."""
    return {**os.environ, "VIRTUAL_ENV": str(prefix), "PATH": f"{prefix}/bin{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("archs", ["100a", "89", "90", "90a;100a", "90a;80"])
def test_configure_refuses_arch(tmp_path, archs):
    run = _cmake("-S", SOURCE, "-B", tmp_path, f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
    assert run.returncode != 0, run.text
    bad = archs.split(";")[-1]
    assert f'CMAKE_CUDA_ARCHITECTURES="{archs}" names {bad}, which the kernels cannot run on' in run.text
    assert "supported only as 90a or 90a-real (H100, H200)" in run.text
    assert not (tmp_path / "_manifest.json").exists()


def test_configure_refuses_ptx_only(tmp_path):
    run = _cmake("-S", SOURCE, "-B", tmp_path, "-DCMAKE_CUDA_ARCHITECTURES=90a-virtual")
    assert run.returncode != 0
    assert "builds SASS only" in run.text and "90a or 90a-real, not 90a-virtual" in run.text


_CPU_CALL = """
import numpy as np, sparse_mla_fp8
from sparse_mla_fp8.reference import e4m3_encode, reference_prefill
rng = np.random.default_rng(11)
q = e4m3_encode(rng.standard_normal((3, 5, 512)) * 1.5)
kv = e4m3_encode(rng.standard_normal((64, 1, 512)) * 1.5)
indices = rng.integers(-4, 70, (3, 1, 40), dtype=np.int32)  # some out of range: masked
out, max_logits, lse = sparse_mla_fp8.prefill(q, kv, indices, 512 ** -0.5, q_scale=0.9, kv_scale=1.1)
ref_out, ref_max, ref_lse = reference_prefill(q, kv, indices, 512 ** -0.5, q_scale=0.9, kv_scale=1.1)
out = sparse_mla_fp8.bf16_to_float32(out)
print(sparse_mla_fp8.__file__)
print(sparse_mla_fp8.__version__)
print(np.linalg.norm(out - ref_out) / np.linalg.norm(ref_out), np.abs(lse - ref_lse).max(),
      np.abs(max_logits - ref_max).max())
"""


def test_cmake_install_imports_and_runs(tmp_path):
    pytest.importorskip("nanobind", reason="building needs nanobind in this Python")
    build, prefix = tmp_path / "build", tmp_path / "prefix"
    # A first configure from an environment without nanobind fails, naming the interpreter and the fix...
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    run = _cmake("-S", SOURCE, "-B", build, "-DSPARSE_MLA_CUDA=OFF", env=_env_with_python(bare))
    assert run.returncode != 0
    assert f"nanobind not found by {bare}/bin/python" in run.text, run.text
    assert "-m pip install nanobind" in run.text
    # ...and after the user switches to one that has it, the next configure uses that one, not the
    # interpreter of the failed run
    run = _cmake("-S", SOURCE, "-B", build, "-DSPARSE_MLA_CUDA=OFF", env=_env_with_python(sys.prefix))
    assert run.returncode == 0, run.text
    cache = (build / "CMakeCache.txt").read_text()
    assert "CMAKE_BUILD_TYPE:STRING=Release" in cache  # the default without -DCMAKE_BUILD_TYPE
    assert str(bare) not in cache

    run = _cmake("--build", build, "-j2", timeout=900)
    assert run.returncode == 0, run.text
    run = _cmake("--install", build, "--prefix", prefix)
    assert run.returncode == 0, run.text

    site = prefix / f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    # -S: no site hooks, so an editable install of this Python's cannot answer the import; NumPy's
    # folder comes after the prefix, so an installed copy there cannot either.
    numpy = pytest.importorskip("numpy")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.path.dirname(os.path.dirname(numpy.__file__))])}
    call = subprocess.run([sys.executable, "-S", "-c", _CPU_CALL], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert call.returncode == 0, call.stderr
    where, version, errors = call.stdout.splitlines()
    assert pathlib.Path(where).is_relative_to(site / "sparse_mla_fp8")
    assert version == _pyproject_version()
    out_rel, lse_abs, max_abs = map(float, errors.split())
    assert out_rel <= 1e-2 and lse_abs <= 1e-3 and max_abs <= 1e-3, errors


def _pyproject_version():
    return re.search(r'^version = "([^"]+)"$', (SOURCE / "pyproject.toml").read_text(), re.MULTILINE).group(1)
