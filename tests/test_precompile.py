"""Issue 20: a program's Triton kernels compiled at once in a thread pool (``backend/precompile.py``).

On the CPU (Triton's interpreter) the pool is not used; the launches it would compile are checked against the
program's steps with Triton's ``JITFunction.run`` replaced by a recorder. On a GPU the kernels compile in
threads, the first call finds them in Triton's cache, and the results equal a serially compiled copy's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import verimirage as vm
from verimirage.backend import precompile as pc
from verimirage.backend import runtime
from verimirage.benchmarks.designs import expert, small_design_kw

TORCH = {vm.float16: torch.float16, vm.bfloat16: torch.bfloat16, vm.float32: torch.float32}


def _program(name: str = "gqa") -> tuple[vm.Graph, Any]:
    g = vm.benchmarks.get(name, small=True)
    return g, vm.compile(expert(name, g, **small_design_kw(name)))


def _inputs(g: vm.Graph, device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [(0.3 * torch.randn(t.shape, generator=gen)).to(TORCH[t.dtype]).to(device) for t in g.inputs]


def test_precompile_is_a_no_op_in_the_interpreter_and_checks_workers() -> None:
    g, prog = _program()
    xs = _inputs(g, "cpu")
    if runtime.interpreting():
        assert pc.precompile(prog, *xs) == 0
    with pytest.raises(ValueError, match="workers"):
        pc.precompile(prog, *xs, workers=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only: records the launches of an interpreter program")
def test_precompile_warms_every_step_with_the_first_calls_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    g, prog = _program()
    assert len({st.kernel for st in prog.steps}) >= 2
    xs = _inputs(g, "cpu")
    seen: list[tuple[str, bool, tuple[Any, ...], dict[str, Any]]] = []
    for k in prog.kernels:
        def run(*args: Any, grid: Any, warmup: bool, _name: str = k.name, **kw: Any) -> None:
            seen.append((_name, warmup, tuple(grid), kw))
            # what the launch is specialised on: each tensor's shape, dtype and strides (then its strides as ints)
            for a in args:
                assert isinstance(a, (torch.Tensor, int))

        monkeypatch.setattr(getattr(prog.module, k.name), "run", run)
    monkeypatch.setattr(pc, "_interpreting", lambda: False)

    class Pool:  # AsyncCompileMode over a pool: the recorder compiles nothing, so nothing is submitted
        def __init__(self, *a: Any) -> None:
            pass

        def __enter__(self) -> Pool:
            return self

        def __exit__(self, *a: Any) -> None:
            return None

    import triton.runtime._async_compile as ac

    monkeypatch.setattr(ac, "AsyncCompileMode", Pool)
    n = pc.precompile(prog, *xs, workers=4)
    assert n == len(prog.steps)
    assert [s[0] for s in seen] == [st.kernel for st in prog.steps]
    assert all(w for _, w, _, _ in seen), "precompile must not launch"
    assert [s[2] for s in seen] == [tuple(st.grid) for st in prog.steps]
    assert [s[3] for s in seen] == [prog.launch[st.kernel] for st in prog.steps]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["gqa", "rmsnorm_linear"])
def test_precompiled_kernels_are_cached_and_give_the_serial_results(name: str) -> None:
    g, prog = _program(name)
    _, serial = _program(name)
    xs = _inputs(g, "cuda")
    n = pc.precompile(prog, *xs, workers=8)
    kernels = {st.kernel for st in prog.steps}
    assert n == len(prog.steps) or len(kernels) < 2
    if len(kernels) >= 2:
        for k in kernels:
            jit = getattr(prog.module, k)
            assert any(cache for cache, *_ in jit.device_caches.values()), f"{k} was not compiled"
    a, b = prog(*xs), serial(*xs)
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,), strict=True):
        assert torch.equal(x, y)


def test_a_failed_precompile_left_triton_async_mode_naming_a_shut_down_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    # finding (H200 training run, 2026-11-26 21:22): one kernel's failed compilation (OutOfResources) made every later
    # compilation of the process fail with "cannot schedule new futures after shutdown": Triton's AsyncCompileMode
    # re-raises before it clears its active mode, which then names precompile's shut-down pool
    import triton.runtime._async_compile as ac

    g, prog = _program()
    xs = _inputs(g, "cpu")

    def boom() -> None:
        raise RuntimeError("out of resource: shared memory (simulated)")

    for k in prog.kernels:
        def run(*args: Any, grid: Any, warmup: bool, _name: str = k.name, **kw: Any) -> None:
            mode = ac.active_mode.get()
            assert mode is not None
            mode.submit(_name, boom, lambda kernel: None)

        monkeypatch.setattr(getattr(prog.module, k.name), "run", run)
    monkeypatch.setattr(pc, "_interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="out of resource"):
        pc.precompile(prog, *xs, workers=2)
    assert ac.active_mode.get() is None  # the next compilation compiles as usual
