"""Compile a program's Triton kernels at once, in a thread pool, before its first call.

A compiled program's kernels are compiled by Triton's JIT at their first launch, one after another; most of
that time is ``ptxas`` (about 1.4 s a kernel on the lent H200s), a separate process. :func:`precompile`
submits every kernel's compilation for the arguments its first call will pass (the same tensors' dtypes,
strides and alignment, so the same specialisation and cache key as that launch) through Triton's
``AsyncCompileMode`` to a thread pool, and waits for all of them: the compilations run side by side and the
first call finds every kernel in Triton's cache. The binaries are those the first call would have compiled
(the same source, options and key); only the order of compilation changes. Nothing runs on the GPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)


def precompile(program: Any, *args: Any, workers: int = 8, **kwargs: Any) -> int:
    """Compile the kernels of ``program`` (a :class:`~verimirage.backend.runtime.CompiledProgram`) for a call
    ``program(*args, **kwargs)`` in ``workers`` threads; returns how many kernels were submitted.

    A no-op (0) in Triton's interpreter, with ``workers <= 1`` or for a program of fewer than two kernels.
    Raises what a compilation raises (the caller's first call would raise it too)."""
    if workers < 1:
        raise ValueError(f"precompile: workers={workers!r}; expected >= 1")
    steps = list(getattr(program, "steps", ()))
    if _interpreting() or workers == 1 or len({st.kernel for st in steps}) < 2:
        return 0
    xs = program._bind(tuple(args), kwargs)
    return _submit(program, xs, workers)


def _interpreting() -> bool:
    from .runtime import interpreting

    return interpreting()


def _submit(program: Any, xs: Sequence[Any], workers: int) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from triton.runtime import _async_compile

    device = xs[0].device
    bufs: dict[int, Any] = {}

    def value(ref: tuple[str, int]) -> Any:
        from .runtime import value_of

        return value_of(ref, xs, bufs, program.views, getattr(program, "counters", None))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vm-compile") as pool:
        mode = _async_compile.AsyncCompileMode(pool)
        try:
            with mode:
                n = _warm(program, value, bufs, device)
        finally:
            # Triton's AsyncCompileMode.__exit__ re-raises a failed compilation before it clears the active mode, which
            # then names this shut-down pool: every later compilation in the process would fail with "cannot
            # schedule new futures after shutdown" (seen in the H200 training run of 2026-11-26 21:22)
            if _async_compile.active_mode.get() is mode:
                _async_compile.active_mode.set(None)
    log.debug("precompiled %d kernel(s) in %.2f s with %d thread(s)", n, time.perf_counter() - t0, workers)
    return n


def _warm(program: Any, value: Any, bufs: dict[int, Any], device: Any) -> int:
    """Submit (``warmup=True``) every step's kernel of ``program`` for its first call's arguments."""
    n = 0
    for st, jit, call in first_calls(program, value, bufs, device):
        jit.run(*call, grid=st.grid, warmup=True, **program.launch[st.kernel])
        n += 1
    return n


def first_calls(program: Any, value: Any, bufs: dict[int, Any], device: Any) -> Iterator[tuple[Any, Any, list[Any]]]:
    """Every launch step of ``program`` with its kernel (the ``JITFunction``) and the arguments its first call
    passes it: the inputs ``value`` resolves and fresh (aligned, contiguous) buffers for the step's outputs, put in
    ``bufs``, as the first call allocates them (so the same specialisation as that launch)."""
    import torch

    for st in program.steps:
        jit = getattr(program.module, st.kernel)
        for bi, shape, dt in st.outs:
            bufs[bi] = torch.empty(shape, device=device, dtype=getattr(torch, dt))
        call: list[Any] = []
        for ref, rank in (*st.args, *((("buf", bi), len(shape)) for bi, shape, _ in st.outs)):
            t = value(ref)
            call.append(t)
            call += [t.stride(d) for d in range(rank)]
        yield st, jit, call
