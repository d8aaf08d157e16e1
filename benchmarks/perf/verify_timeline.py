"""Timeline of one cold ``vm.verify`` of a suite pair: when each thread runs the target, the candidate, input
draws and big products (seconds from the start). ``python benchmarks/perf/verify_timeline.py [NAME] [BATCH]``.

A diagnostic for verimirage/smt/PERF.md: where a trial's time goes once trials run in parallel.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import verimirage as vm
from verimirage.smt import ff
from verimirage.smt import verify as V
from verimirage.smt.ff import products as FFprod

EVENTS: list[tuple[str, str, float, float]] = []
T0 = [0.0]


def _timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            EVENTS.append((threading.current_thread().name, name, t - T0[0], time.perf_counter() - T0[0]))

    return wrapper


def main(argv: list[str]) -> None:
    """Run one warm-up verify, then one cold verify with the timeline printed."""
    name = argv[0] if argv else "gqa"
    batch = int(argv[1]) if len(argv) > 1 else 8
    g = vm.benchmarks.get(name, batch=batch)
    m = vm.benchmarks.expert(name, g)
    vm.verify(g, m)
    ff.FFReference.outputs = _timed("target", ff.FFReference.outputs)  # type: ignore[method-assign]
    ff.observe = _timed("observe", ff.observe)
    FFprod._blocked_matmul = _timed("blocked", FFprod._blocked_matmul)
    ff.FFReference.inputs = _timed("inputs", ff.FFReference.inputs)  # type: ignore[method-assign]
    V._RECENT.clear()
    gc.collect()
    T0[0] = time.perf_counter()
    v = vm.verify(g, m)
    total = time.perf_counter() - T0[0]
    print(f"{name} b{batch}: {type(v).__name__} in {total:.3f} s "
          f"({', '.join(f'{e.name} {e.seconds:.3f} s' for e in v.evidence)})")
    for thread, what, t0, t1 in sorted(EVENTS, key=lambda e: e[2]):
        print(f"  {thread:22s} {what:8s} {t0:7.3f} -> {t1:7.3f} ({t1 - t0:.3f})")


if __name__ == "__main__":
    main(sys.argv[1:])
