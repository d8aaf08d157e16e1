"""Re-estimate the models set's candidates with the current cost model against their measured times.

    python benchmarks/perf/reestimate_models.py [benchmarks/results/models.json]

For every row of the merged results, each measured candidate (``cost_vs_measured``: rank = index into
``benchmarks/candidates_models/<case>.json``) is estimated again with ``rewrite.cost.cost``; prints per program
the measured time of the candidate the model now ranks first over the best measured one (what the default,
unprofiled ``vm.superoptimize`` would return), then the Spearman rank correlations (pooled, and the mean within
programs with 3+ candidates) and the geomean of that ratio.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import verimirage as vm
from verimirage.rewrite.cost import cost

ROOT = Path(__file__).resolve().parents[2]


def _ranks(xs: list[float]) -> list[int]:
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0] * len(xs)
    for k, i in enumerate(order):
        r[i] = k
    return r


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (ties broken by position)."""
    ra, rb = _ranks(a), _ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    num = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    den = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return num / den if den else float("nan")


def main(path: str) -> int:
    doc = json.loads(Path(path).read_text())
    pairs: list[tuple[float, float]] = []
    ratios: list[float] = []
    within: list[float] = []
    for row in doc["rows"]:
        cfile = ROOT / "benchmarks" / "candidates_models" / f"{row['case']}.json"
        cands = json.loads(cfile.read_text())["candidates"]
        meas = {c["rank"]: c["measured_us"] for c in row["cost_vs_measured"] if c.get("measured_us")}
        est = {i: cost(vm.MuGraph.parse(c["mugraph"])).time_s * 1e6 for i, c in enumerate(cands) if i in meas}
        ks = sorted(set(est) & set(meas))
        if not ks:
            continue
        pairs += [(est[k], meas[k]) for k in ks]
        first = min(ks, key=lambda k: est[k])
        ratios.append(meas[first] / min(meas[k] for k in ks))
        if len(ks) >= 3:
            within.append(spearman([est[k] for k in ks], [meas[k] for k in ks]))
        print(f"{row['case']:20s} {len(ks)} candidate(s)  first by estimate / best measured {ratios[-1]:.2f}")
    print(f"Spearman pooled {spearman([p[0] for p in pairs], [p[1] for p in pairs]):.2f} over {len(pairs)} "
          f"candidates; within programs (3+) mean {sum(within) / max(len(within), 1):.2f} over {len(within)}")
    print(f"unprofiled first candidate: geomean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x the "
          f"profiled best, worst {max(ratios):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "benchmarks" / "results" / "models.json")))
