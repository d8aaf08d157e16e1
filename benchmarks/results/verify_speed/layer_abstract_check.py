"""One abstract check (no time budget) of a decoder layer against its unfused μGraph; CPU and wall seconds.

    PYTHONPATH=<checkout> python benchmarks/results/verify_speed/layer_abstract_check.py decode_bs1 small|full [prof]

Run with the PYTHONPATH of two checkouts (before and after a change) to compare them (README.md here).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.smt import verify as V


def main() -> None:
    case, size = sys.argv[1], sys.argv[2]
    g = vm.benchmarks.get_layer(case, small=size == "small")
    mg = MuGraph.from_graph(g)
    pr = cProfile.Profile() if sys.argv[3:] == ["prof"] else None
    t0, c0 = time.perf_counter(), time.process_time()
    if pr:
        pr.enable()
    r = V._abstract_check_within(g, mg, timeout_s=600.0, cancel=None)
    if pr:
        pr.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(r.outcome, r.reason[:200], len(r.queries), f"{wall:.2f}s cpu {cpu:.2f}")
    if pr:
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
