"""Run the search on suite cases (CPU) and save the top candidates' μGraphs as JSON for a GPU timing run.

    python benchmarks/perf/dump_cands.py OUTDIR [--cases ...] [--batches 1 8] [--top 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", nargs="*", default=["lora", "ntrans", "gqa", "qknorm_gqa", "gated_mlp",
                                                   "rmsnorm_linear"])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    import verimirage as vm
    from verimirage.ir.serial import to_json

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for b in a.batches:
        for name in a.cases:
            t0 = time.time()
            res = vm.superoptimize(vm.benchmarks.get(name, batch=b), recheck_cache=True)  # a hit: all candidates
            for i, c in enumerate(res.candidates[: a.top]):
                (out / f"{name}_bs{b}_{i}.json").write_text(to_json(c.mugraph))
            print(name, b, f"{time.time() - t0:.0f}s", len(res.candidates), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
