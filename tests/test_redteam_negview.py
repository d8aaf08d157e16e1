"""Red-team finding (lean path and checked path): a negative-bit view (``torch._neg_view(t)``: its values are
``-t``, its memory holds ``t``) passed every input check (shape, dtype, device, strides) and the kernels read its
memory: ``vm.compile(exp)(torch._neg_view(t))`` returned ``exp(t)`` (max error 11 on randn inputs), silently.
The checked path now materialises such an input (``resolve_neg``); the lean path's Python signature check (which
decides where PyTorch's C tensor guard says no, and alone without it) treats it, and a negative-bit ``out=``
tensor, as a miss, so the checked path serves them (``copy_`` into an ``out=`` view writes through the bit)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import runtime

torch = pytest.importorskip("torch")


def test_neg_view_input_was_misread() -> None:
    g = vm.Graph()
    x = g.input("x", (4, 8), vm.float32)
    g.output(g.exp(x))
    fn = vm.compile(g)
    dev = "cpu" if runtime.interpreting() else "cuda"  # (the lean C launcher's path on a GPU)
    t = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(dev)
    ref = np.exp(-t.double().cpu().numpy())
    for _ in range(2):  # the first call plans the lean path, the second takes it
        y = fn(torch._neg_view(t))
        np.testing.assert_allclose(y.double().cpu().numpy(), ref, rtol=1e-5)
    out = torch._neg_view(torch.empty(4, 8, device=dev))  # out= a negative-bit view: its values must read exp(-t)
    fn(torch._neg_view(t), out=out)
    np.testing.assert_allclose(out.double().cpu().numpy(), ref, rtol=1e-5)


def _lean_checks(returns: list[tuple[str, int]], buf_meta: dict[int, Any], xs: list[Any]) -> dict[str, Any]:
    """The lean plan's generated ``run``/``run_out`` for a plan with no kernels (only the signature checks), on
    the CPU, with no C tensor guard (the Python check alone decides, as where the guard said no)."""
    plan = runtime._LeanPlan.__new__(runtime._LeanPlan)
    plan.signature = [(tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0) for x in xs]
    plan.guard = plan.out_guard = None
    plan.c_plan = None
    plan.device = xs[0].device
    plan.returned_bufs = [bi for bi in buf_meta]
    prog = SimpleNamespace(input_names=[f"i{k}" for k in range(len(xs))], returns=returns, steps=[], views=[])
    src, env = plan._source(prog, [], buf_meta, {}, 0, {bi for bi in buf_meta})  # type: ignore[arg-type]
    hooks = SimpleNamespace(calls=False)
    env.update(MISS=runtime._MISS, DEV=-1, get_device=lambda: -1, get_stream=lambda d: 0, HOOK_IN=hooks,
               HOOK_OUT=hooks, bump=lambda ts: None, DEVICE=plan.device, capturing=lambda: False)
    ns: dict[str, Any] = {}
    exec(compile(src, "<lean test>", "exec"), env, ns)
    return ns


def test_lean_signature_check_misses_on_neg_views() -> None:
    t = torch.randn(4, 8)
    ns = _lean_checks([("in", 0)], {}, [t])
    got = ns["run"](t)  # the same signature: served (an output that is an input comes back as a copy, e1fd63c)
    assert got is not runtime._MISS and torch.equal(got, t)
    assert ns["run"](torch._neg_view(t)) is runtime._MISS
    ns = _lean_checks([("buf", 0)], {0: ((4, 8), torch.float32)}, [t])
    o = torch.empty(4, 8)
    assert ns["run_out"](o, t) is o
    assert ns["run_out"](torch._neg_view(o), t) is runtime._MISS
    assert ns["run_out"](o, torch._neg_view(t)) is runtime._MISS
    assert ns["run_out"](t, t) is runtime._MISS  # out= the input itself (overlap): the checked path
