"""The package as a whole: what importing it loads, its CLI, its exports."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import sparse_mla_fp8
from harness import table_dims
from sparse_mla_fp8.reference import bf16_bits_to_float32


def _python(code_or_args, tmp_path):
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    # from an empty folder, so that what is imported is the installed package
    return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_import_loads_no_framework(tmp_path):
    run = _python("import sys, sparse_mla_fp8; "
                  "print(sorted(m for m in ('torch', 'jax', 'jaxlib', 'cupy') if m in sys.modules))", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


def _info_table(stdout):
    """(arch, d_qk, d_v, fatbin) of each row under "capability table:" in `info`'s output."""
    lines = stdout.splitlines()
    start = lines.index("capability table:") + 2  # past the column names
    rows = []
    for line in lines[start:]:
        fields = line.split()
        if not line.startswith(" ") or len(fields) != 4:
            break
        rows.append((fields[0], int(fields[1]), int(fields[2]), fields[3]))
    return rows


def test_cli_info(tmp_path):
    run = _python(["-m", "sparse_mla_fp8", "info"], tmp_path)
    assert run.returncode == 0, run.stderr
    rows = _info_table(run.stdout)
    assert sorted({d_qk for _, d_qk, _, _ in rows}) == table_dims(), run.stdout
    assert {d_v for _, _, d_v, _ in rows} == {sparse_mla_fp8._C.D_V}, run.stdout


def test_cli_info_kernels(tmp_path):
    """info lists the registry in order and the kernel of each benchmark shape, as kernel_for answers."""
    from sparse_mla_fp8._cli import BENCH_SHAPES

    run = _python(["-m", "sparse_mla_fp8", "info"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"in the order the launch tries them: {', '.join(sparse_mla_fp8._C.kernel_names())}\n" in run.stdout
    for s_q, s_kv, h_q, d_qk, topk in BENCH_SHAPES:
        line = f"{s_q}, {s_kv}, {h_q}, {d_qk}, {topk}"
        assert f"{line:<30} runs {sparse_mla_fp8._C.kernel_for(h_q, topk, 'exact')}\n" in run.stdout, run.stdout


def test_cli_version(tmp_path):
    run = _python(["-m", "sparse_mla_fp8", "--version"], tmp_path)
    assert run.returncode == 0, run.stderr
    dims = "/".join(map(str, table_dims()))
    assert run.stdout.startswith(f"sparse-mla-fp8 {sparse_mla_fp8.__version__} ("), run.stdout
    assert run.stdout.rstrip().endswith(f"; d_qk {dims})"), run.stdout


def test_cli_names_its_program(tmp_path):
    run = _python(["-m", "sparse_mla_fp8", "--help"], tmp_path)
    assert run.returncode == 0 and run.stdout.startswith("usage: python -m sparse_mla_fp8 "), run.stdout
    script = shutil.which("sparse-mla-fp8", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("no sparse-mla-fp8 script beside this Python (not installed by pip)")
    run = subprocess.run([script, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith("usage: sparse-mla-fp8 "), run.stdout


def test_cli_demo_help_describes_it(tmp_path):
    run = _python(["-m", "sparse_mla_fp8", "demo", "--help"], tmp_path)
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())
    assert "checks it against the float64 reference" in text and "Exits 1 if" in text, text


def test_exports():
    for name in ("prefill", "sparse_mla_q8kv8_prefill_fwd", "check_config", "supports", "capabilities",
                 "bf16_to_float32"):
        assert callable(getattr(sparse_mla_fp8, name)), name
    assert isinstance(sparse_mla_fp8.__version__, str) and sparse_mla_fp8.__version__


def test_bf16_to_float32_numpy():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    want = bf16_bits_to_float32(bits)
    got = sparse_mla_fp8.bf16_to_float32(bits)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == bits.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(sparse_mla_fp8.bf16_to_float32(bits.view(np.int16)).view(np.uint32),
                                  want.view(np.uint32))


def test_bf16_to_float32_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 100).bfloat16()
    got = sparse_mla_fp8.bf16_to_float32(x)
    assert got.dtype == torch.float32 and torch.equal(got, x.float())
    assert torch.equal(sparse_mla_fp8.bf16_to_float32(x.view(torch.int16)), x.float())
