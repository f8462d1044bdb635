"""prefill() reaches the native module once per call: a valid call goes through once, a refused one
raises the native module's error from that one call, and an error of any other kind comes out as it
was raised (no path that swallows it and tries again)."""

import numpy as np
import pytest

import sparse_mla_fp8
from harness import Backend, assert_refused, call_args, dim, invoke, random_case, run_and_check

NUMPY = Backend("numpy", "cpu")
# torch tensors go through the custom operator's implementation in eager mode (_torch_op.py), which
# must keep to one native call as well
BACKENDS = [pytest.param(("numpy", "cpu"), id="numpy"), pytest.param(("torch-fp8", "cpu"), id="torch-cpu")]


class _CountingC:
    """sparse_mla_fp8._C with its calls counted by name (and, given `fail`, prefill raising it)."""

    def __init__(self, real, fail=None):
        self._real, self._fail, self.calls = real, fail, []

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if name not in ("prefill", "check"):
            return attr

        def counted(*args, **kwargs):
            self.calls.append(name)
            if name == "prefill" and self._fail is not None:
                raise self._fail
            return attr(*args, **kwargs)
        return counted


@pytest.fixture
def native(monkeypatch):
    def install(fail=None):
        counting = _CountingC(sparse_mla_fp8._api._C, fail)
        monkeypatch.setattr(sparse_mla_fp8._api, "_C", counting)
        return counting
    return install


def _case():
    case = random_case(11, 3, 200, 5, dim(576), 40)
    case.attn_sink = np.random.default_rng(11).standard_normal(5).astype(np.float32)
    return case


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("provide", [True, False], ids=["provided", "allocated"])
def test_valid_call_goes_through_once(native, provide, kind):
    c = native()
    run_and_check(Backend(*kind), _case(), provide=provide)
    # with outputs to allocate, the call is checked on shapes first (_C.check), then run
    assert c.calls == (["prefill"] if provide else ["check", "prefill"])


@pytest.mark.parametrize("kind", BACKENDS)
def test_refused_call_is_checked_once(native, kind):
    c = native()
    backend = Backend(*kind)
    kw = call_args(backend, _case())
    kw["indices"] = backend.put(backend.numpy(kw["indices"]).astype(np.int64))
    assert_refused(lambda: invoke(kw), TypeError, backend, [kw["out"], kw["max_logits"], kw["lse"]],
                   names=["indices", "int64"])
    assert c.calls == ["prefill"]


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("error", [RuntimeError("no kernel image"), ValueError("q is odd"), TypeError("odd")],
                         ids=lambda e: type(e).__name__)
def test_native_errors_come_out_as_raised(native, error, kind):
    c = native(fail=error)
    with pytest.raises(type(error)) as info:
        invoke(call_args(Backend(*kind), _case()))
    assert info.value is error and c.calls == ["prefill"]
