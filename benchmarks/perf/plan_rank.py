"""How well the cost model's order of a capture plan's designs matches their measured times (twentieth session).

    PYTHONPATH=$PWD python benchmarks/perf/plan_rank.py prepare OUT.json [--per-plan 12] [--designs 3] [--also P#G]
    python benchmarks/perf/plan_rank.py run IN.json --out DIR [--rounds 3] [--rep-ms 20] [--prewarm 15]

``prepare`` (CPU) takes, from each capture plan (``benchmarks/results/capture/plan_{decode,medium}_fp16.json``), every
``len // per_plan``-th entry with at least two designs (and the entries ``--also`` names, ``plan_medium_fp16#43``),
its first ``--designs`` designs in plan order (sorted by the cost model: ``corpus_capture.py --sort-plan``) and each
one's current estimate. ``run`` (GPU) compiles each design with its default configuration, checks it against the
float64 reference, and times the designs of an entry in ``--rounds`` interleaved rounds (CUDA-graph medians over
rotated input sets, bench.py's ``bench_sets``); it reports per entry the first design's time over the best, and over
all entries their geomean and the Spearman correlation of estimate and time within entries. ``--prewarm N`` first
compiles every design in N worker processes (bench.py's pool: Triton's disk cache then holds them) and ``--budget-s``
starts no entry after that many seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

PLANS = ("plan_decode_fp16", "plan_medium_fp16")


def _designs(entry: Any) -> list[str]:
    return [d if isinstance(d, str) else str(d["mugraph"]) for d in (entry if isinstance(entry, list) else [entry])]


def prepare(per_plan: int, designs: int, also: list[str]) -> list[dict[str, Any]]:
    """The sampled entries (see the module docstring)."""
    import verimirage as vm
    from verimirage.pipeline.pricing import cost

    items = []
    for plan in PLANS:
        doc = json.loads((ROOT / "benchmarks" / "results" / "capture" / f"{plan}.json").read_text())
        entries = list(doc.items())
        step = max(1, len(entries) // per_plan)
        picks = {g for g in range(0, len(entries), step)} | {int(a.split("#")[1]) for a in also if a.startswith(plan)}
        for g in sorted(picks):
            graph, entry = entries[g]
            ds = _designs(entry)[:designs]
            if len(ds) < 2:
                continue
            items.append({"name": f"{plan}#{g}", "graph": graph, "designs": ds,
                          "est_us": [cost(vm.MuGraph.parse(d)).time_s * 1e6 for d in ds]})
    return items


def run(items_path: Path, out: Path, rounds: int, rep_ms: int, prewarm: int = 0, budget_s: float | None = None
        ) -> None:
    """Time every sampled entry's designs; write ``out``/plan_rank.json."""
    import bench
    import torch
    from bench import bench_sets, rel_err, rotated_inputs, spearman

    import verimirage as vm

    t_start = time.perf_counter()
    bench.REP_MS = rep_ms
    if prewarm:
        items = json.loads(items_path.read_text())
        bench.prewarm([(it["graph"], "", 1, list(it["designs"]), [0]) for it in items], prewarm)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rounds": rounds,
                           "rep_ms": rep_ms, "rows": []}
    out.mkdir(parents=True, exist_ok=True)
    for it in json.loads(items_path.read_text()):
        if budget_s is not None and time.perf_counter() - t_start > budget_s:
            doc.setdefault("not_run", []).append(it["name"])
            continue
        t0 = time.perf_counter()
        row: dict[str, Any] = {"name": it["name"], "est_us": it["est_us"]}
        try:
            g = vm.Graph.parse(it["graph"])
            ins, ref, sets = rotated_inputs(g, "")
            fns: list[Any] = []
            for d in it["designs"]:  # (a design that fails to compile or run is reported; the others are timed)
                try:
                    fn = vm.compile(vm.MuGraph.parse(d))
                    row.setdefault("err", []).append(rel_err(fn(*ins), ref))
                    fns.append(fn)
                except Exception as e:
                    row.setdefault("err", []).append(None)
                    row.setdefault("design_errors", {})[len(fns)] = f"{type(e).__name__}: {str(e)[:200]}"
                    fns.append(None)
            times: list[list[float]] = [[] for _ in fns]
            for _ in range(rounds):
                for i, fn in enumerate(fns):
                    if fn is not None:
                        times[i].append(bench_sets(fn, sets))
            row["us_rounds"] = times
            row["us"] = [statistics.median(t) if t else None for t in times]
            ok_us = [u for u in row["us"] if u is not None]
            if row["us"][0] is not None:
                row["first_over_best"] = row["us"][0] / min(ok_us)
            pairs = [(e, u) for e, u in zip(it["est_us"], row["us"], strict=True) if u is not None]
            row["spearman"] = spearman([e for e, _ in pairs], [u for _, u in pairs]) if len(pairs) > 1 else None
        except Exception as e:  # report, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["s"] = round(time.perf_counter() - t0, 1)
        doc["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "us_rounds"}), flush=True)
        ok = [r for r in doc["rows"] if "first_over_best" in r]
        doc["first_over_best_geomean"] = math.exp(statistics.fmean(math.log(r["first_over_best"]) for r in ok))
        sp = [r["spearman"] for r in ok if r["spearman"] is not None]
        doc["within_spearman_mean"] = statistics.fmean(sp) if sp else None
        doc["end_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        (out / "plan_rank.json").write_text(json.dumps(doc, indent=1))
    (out / "plan_rank.json").write_text(json.dumps(doc, indent=1))


def main() -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("out", type=Path)
    a.add_argument("--per-plan", type=int, default=12)
    a.add_argument("--designs", type=int, default=3)
    a.add_argument("--also", nargs="*", default=["plan_medium_fp16#43"])
    r = sub.add_parser("run")
    r.add_argument("items", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--rep-ms", type=int, default=20)
    r.add_argument("--prewarm", type=int, default=0, help="compile every design in this many worker processes first")
    r.add_argument("--budget-s", type=float, default=None, help="start no entry after this many seconds")
    args = p.parse_args()
    if args.cmd == "prepare":
        items = prepare(args.per_plan, args.designs, args.also)
        args.out.write_text(json.dumps(items, indent=1))
        print(f"{len(items)} entries, {sum(len(i['designs']) for i in items)} designs")
        return 0
    run(args.items, args.out, args.rounds, args.rep_ms, args.prewarm, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
