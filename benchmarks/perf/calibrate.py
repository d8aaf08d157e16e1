"""Rank agreement of the cost model with H100 sweep timings (benchmarks/perf/results/run{3,4,5}_sweep.json).

    python benchmarks/perf/calibrate.py [--grid]

For every measured (case, batch, design) the best time over its launch configs is compared with
``verimirage.rewrite.cost.cost`` of the same μGraph; prints Spearman's rank correlation per case group
and overall. ``--grid`` also tries a few Hardware parameter values (block bandwidth, row-run exponent).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
RUNS = ("run3_sweep.json", "run4_sweep.json", "run5_sweep.json")


def samples() -> list[tuple[str, object, float]]:
    import sweep

    best: dict[str, tuple[str, object, float]] = {}
    for f in RUNS:
        d = json.loads((ROOT / "benchmarks" / "perf" / "results" / f).read_text())
        if "H100" not in d["meta"]["device"]:
            continue
        for r in d["rows"]:
            if "us" not in r or r.get("baseline") or r["design"] in (None, "json"):
                continue
            key = json.dumps([r["case"], r["batch"], r["design"], r["kw"]], sort_keys=True)
            if key not in best or r["us"] < best[key][2]:
                _g, mg, _cfg = sweep.build(r)
                best[key] = (f"{r['case']}_bs{r['batch']}", mg, r["us"])
    return list(best.values())


def spearman(xs: list[float], ys: list[float]) -> float:
    import numpy as np

    rx = np.argsort(np.argsort(xs))
    ry = np.argsort(np.argsort(ys))
    if len(xs) < 3:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def report(data: list[tuple[str, object, float]], hw: object) -> float:
    from verimirage.pipeline.pricing import cost

    groups: dict[str, tuple[list[float], list[float]]] = {}
    for case, mg, us in data:
        c = cost(mg, hw)  # type: ignore[arg-type]
        est = float("inf") if c.infeasible else c.time_s * 1e6
        xs, ys = groups.setdefault(case, ([], []))
        xs.append(est)
        ys.append(us)
    total = 0.0
    n = 0
    for case, (xs, ys) in sorted(groups.items()):
        rho = spearman(xs, ys)
        if rho == rho:
            total += rho * len(xs)
            n += len(xs)
        print(f"  {case:22} n={len(xs):3} spearman={rho:+.2f}")
    return total / max(n, 1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", action="store_true")
    a = ap.parse_args()
    from verimirage.rewrite.cost import H100

    data = samples()
    print(f"{len(data)} measured designs; current model:")
    print(f"weighted mean spearman {report(data, H100):+.3f}")
    if a.grid:
        for bb in (1e10, 2e10, 4e10):
            hw = replace(H100, block_bandwidth=bb)
            print(f"block_bandwidth={bb:g}: {report(data, hw):+.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
