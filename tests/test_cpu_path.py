"""What only the CPU path has: one entry per instruction set, the caller's thread count, Ctrl-C."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from harness import (INT_MAX, INT_MIN, Backend, assert_refused, call_args, invoke, random_case, run_and_check,
                     seed_of, table_dims)
from sparse_mla_fp8 import _C

NUMPY = Backend("numpy", "cpu")
ISA_VARIABLE = "SPARSE_MLA_FP8_CPU_ISA"
ENTRIES = ("avx512", "avx2", "baseline")


def _hard_case(seed, s_q, h_q, topk):
    """Sink, topk_length, invalid and duplicate indices, NaN in every row no valid slot names."""
    s_kv = 700
    rng = np.random.default_rng(seed)
    case = random_case(seed, s_q, s_kv, h_q, max(table_dims()), topk)
    case.indices %= s_kv // 2  # duplicates; the upper half is poisoned below
    invalid = rng.random(case.indices.shape) < 0.2
    case.indices[invalid] = rng.choice(np.array([-1, s_kv, INT_MIN, INT_MAX], np.int32), invalid.sum())
    case.attn_sink = rng.standard_normal(h_q).astype(np.float32)
    case.topk_length = rng.integers(-2, topk + 3, s_q).astype(np.int32)
    case.poison_unreferenced_kv()
    return case


def _entry_here():
    """The entry the CPU path runs under the cap set, None where the cap names no entry (not x86-64)."""
    try:
        return _C.cpu_isa()
    except ValueError:
        return None


# h_q: one vector of heads or less, a full 16 plus tails of 1 and of 9 (past half a vector), many blocks;
# topk past one 64-row chunk and odd.
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("h_q, topk", [(3, 7), (17, 129), (25, 300), (70, 65)])
def test_each_entry_against_reference(monkeypatch, entry, h_q, topk):
    monkeypatch.setenv(ISA_VARIABLE, entry)
    if _entry_here() != entry:
        pytest.skip(f"this CPU has no {entry}")
    run_and_check(NUMPY, _hard_case(seed_of("entry", h_q, topk), 6, h_q, topk))


def test_unknown_entry_is_refused(monkeypatch):
    case = random_case(seed_of("unknown entry"), 2, 50, 3, max(table_dims()), 7)
    kw = call_args(NUMPY, case)
    monkeypatch.setenv(ISA_VARIABLE, "avx9")
    assert_refused(lambda: invoke(kw), ValueError, NUMPY, [kw["out"], kw["max_logits"], kw["lse"]],
                   match='got "avx9"', names=(ISA_VARIABLE, "baseline"))


def _threads_during(call):
    """How many threads call() started: those seen while it ran, not before, and gone when it returned
    (thread ids, since other threads of the process may come and go meanwhile)."""
    tasks = "/proc/self/task"
    before, seen, done = set(os.listdir(tasks)), set(), threading.Event()

    def sample():
        while not done.is_set():
            seen.update(os.listdir(tasks))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        call()
    finally:
        done.set()
        sampler.join()
    started = seen - before - {str(sampler.native_id)}
    assert not started & set(os.listdir(tasks)), "threads of the call outlived it"
    return len(started)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_honoured(monkeypatch, threads):
    # 240 tokens: each thread lives ~0.1-0.3 s, so a sampler that a loaded machine deschedules for a
    # while still sees it (24 tokens lived a few ms, and were missed on a loaded 2-core box)
    case = random_case(seed_of("threads"), 240, 2000, 32, max(table_dims()), 1024)
    kw = call_args(NUMPY, case)
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    assert _threads_during(lambda: invoke(kw)) == threads - 1
    torch = pytest.importorskip("torch")
    kw = call_args(Backend("torch-fp8", "cpu"), case)
    previous = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # torch's setting wins over the environment's
    torch.set_num_threads(threads)
    try:
        assert _threads_during(lambda: invoke(kw)) == threads - 1
    finally:
        torch.set_num_threads(previous)


def test_same_bits_for_any_thread_count(monkeypatch):
    # 2 tokens of 70 heads: the heads are split into more groups as threads are added
    case = _hard_case(seed_of("thread count bits"), 2, 70, 300)
    results = []
    for threads in (1, 2, 3, 8):
        monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
        results.append([NUMPY.raw(x) for x in invoke(call_args(NUMPY, case))])
    assert all(r == results[0] for r in results[1:])


def test_avx2_and_avx512_agree_bitwise(monkeypatch):
    # the same FMAs in the same order per head, 8 or 16 heads a vector
    case = _hard_case(seed_of("entries bits"), 3, 70, 300)
    results = []
    for entry in ("avx512", "avx2"):
        monkeypatch.setenv(ISA_VARIABLE, entry)
        if _entry_here() != entry:
            pytest.skip(f"this CPU has no {entry}")
        results.append([NUMPY.raw(x) for x in invoke(call_args(NUMPY, case))])
    assert results[0] == results[1]


_INTERRUPTED_CALL = textwrap.dedent("""
    import signal, sys, time
    import numpy as np
    import sparse_mla_fp8
    # Ctrl-C as an interactive Python has it, whatever this process inherited (a command started in
    # the background by a non-interactive shell ignores SIGINT, and Python then installs no handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rng = np.random.default_rng(0)
    s_q, s_kv, h_q, d_qk, topk = 2048, 8192, 16, {d_qk}, 8192  # 0.6 TFLOP: seconds at the least
    q = rng.integers(0, 0x70, (s_q, h_q, d_qk), dtype=np.uint8)
    kv = rng.integers(0, 0x70, (s_kv, 1, d_qk), dtype=np.uint8)
    indices = rng.integers(0, s_kv, (s_q, 1, topk), dtype=np.int32)
    print("calling", flush=True)
    try:
        sparse_mla_fp8.prefill(q, kv, indices, 0.05)
    except KeyboardInterrupt:
        stopped = time.monotonic()
        out = sparse_mla_fp8.prefill(q[:1], kv, indices[:1], 0.05)  # and the module still works
        print("interrupted", stopped, flush=True)
        sys.exit(0)
    print("finished", flush=True)
""")


def test_ctrl_c_stops_a_long_call():
    env = dict(os.environ, OMP_NUM_THREADS="2")
    child = subprocess.Popen([sys.executable, "-c", _INTERRUPTED_CALL.format(d_qk=max(table_dims()))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout.readline().strip() == "calling", child.stderr.read()
        time.sleep(1.0)  # well inside the call
        sent = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    finally:
        child.kill()
    words = out.split()
    assert child.returncode == 0 and words[:1] == ["interrupted"], out + err
    assert float(words[1]) - sent < 1.0, "the call went on for a second after Ctrl-C"
