"""Time ``vm.verify`` on suite pairs: ``python benchmarks/verify_perf.py [NAMES|all] [BATCH] [REPEATS]``.

For each suite graph ``g`` (full size) and its expert design ``m``, prints the best of REPEATS of a
cold ``vm.verify(g, m)`` (recent targets forgotten first, so the target's trials are evaluated too)
and of a warm one right after (only the candidate is evaluated), wall and process-CPU seconds, with
the finite-field trial count and stated bound. See verimirage/smt/PERF.md. (A benchmark of the whole package:
it lives here, not in ``verimirage.smt``, which imports only ``verimirage.ir``.)
"""

from __future__ import annotations

import gc
import sys
import time


def main(argv: list[str]) -> None:
    """Run the timing loop (arguments as in the module docstring)."""
    import verimirage as vm
    from verimirage.smt import verify as V

    names = argv[0].split(",") if argv and argv[0] != "all" else vm.benchmarks.names()
    batch = int(argv[1]) if len(argv) > 1 else 8
    reps = int(argv[2]) if len(argv) > 2 else 3
    for n in names:
        g = vm.benchmarks.get(n, batch=batch)
        m = vm.benchmarks.expert(n, g)
        cold: list[tuple[float, float]] = []
        warm: list[tuple[float, float]] = []
        v = None
        for _ in range(reps):
            for store in (cold, warm):
                if store is cold:
                    V._RECENT.clear()
                    gc.collect()
                t, c = time.perf_counter(), time.process_time()
                v = vm.verify(g, m)
                store.append((time.perf_counter() - t, time.process_time() - c))
                if not isinstance(v, vm.Proved):
                    raise SystemExit(f"{n}: {v.summary()}")
        assert v is not None
        ff = dict(v.evidence[0].params)
        print(f"{n:15s} b{batch} cold {min(cold)[0]:6.2f}s (cpu {min(c for _, c in cold):6.2f}) "
              f"warm {min(warm)[0]:6.2f}s (cpu {min(c for _, c in warm):6.2f}) "
              f"trials {ff['trials']} bound {ff['false_accept_bound']:.3g} products on {ff.get('products_on', 'cpu')}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
