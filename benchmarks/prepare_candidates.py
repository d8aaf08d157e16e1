"""Search and verify every suite case here (a CPU machine); write the candidates for the GPU harness.

    python benchmarks/prepare_candidates.py [--cases ...] [--batches 1 8] [--top-k 6] [--variants 1]
                                            [--out benchmarks/candidates]
    python benchmarks/prepare_candidates.py --set models [--cases ...]   # the models set (issue 22)
    python benchmarks/prepare_candidates.py --set models --floor [--cases ...]  # floor stored online softmaxes

One JSON file per case: the graph's text, the search time and the verified candidates (μGraph text, cost
estimate, rules): the ``top_k`` distinct kernel structures first, then up to ``variants`` verified
loop-range siblings of each (``vm.superoptimize(variants=...)``).
``benchmarks/bench.py --candidates DIR`` profiles them on the GPU and keeps the fastest.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import verimirage as vm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=["suite", "models"], default="suite",
                    help="the Mirage suite (batches 1 and 8) or the models set (one size each; case = its name)")
    ap.add_argument("--cases", nargs="*", default=None)
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 8])
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--variants", type=int, default=1, help="loop-range siblings per structure (superoptimize)")
    ap.add_argument("--time-budget-s", type=float, default=240.0, help="superoptimize's time budget")
    ap.add_argument("--verify-budget-s", type=float, default=120.0,
                    help="superoptimize's estimated verification budget (its default, half the time budget, "
                    "keeps batch-8 attention to ~3 candidates)")
    ap.add_argument("--rerank", action="store_true",
                    help="no search: re-estimate the candidates already in the files with the current cost model "
                    "and order them by it (what the default vm.superoptimize would return first among them)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default benchmarks/candidates (suite) or benchmarks/candidates_models (models)")
    ap.add_argument("--floor", action="store_true",
                    help="no search: re-derive the stored candidates' online softmax in the current lowering's "
                    "floored form (verimirage.rewrite.floor; red team 17), verify each again, re-estimate its cost")
    args = ap.parse_args()
    models = args.set == "models"
    if args.cases is None:
        args.cases = vm.benchmarks.model_names() if models else vm.benchmarks.names()
    if args.out is None:
        args.out = Path(__file__).resolve().parent / ("candidates_models" if models else "candidates")
    batches = [1] if models else args.batches
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rerank:
        return rerank(args.out, [name if models else f"{name}_bs{b}" for b in batches for name in args.cases])
    if args.floor:
        return floor(args.out, [name if models else f"{name}_bs{b}" for b in batches for name in args.cases])
    rows = []
    for b in batches:
        for name in args.cases:
            g = vm.benchmarks.get_model(name) if models else vm.benchmarks.get(name, batch=b)
            case = name if models else f"{name}_bs{b}"
            t0 = time.perf_counter()
            res = vm.superoptimize(g, top_k=args.top_k, variants=args.variants, time_budget_s=args.time_budget_s,
                                  verify_budget_s=args.verify_budget_s, cache=False)
            dt = time.perf_counter() - t0
            doc = {
                "case": case,
                "graph": str(g),
                "search_s": dt,
                "top_k": args.top_k,
                "variants": args.variants,
                "report": str(res.report),
                "time_budget_s": args.time_budget_s,
                "verify_budget_s": args.verify_budget_s,
                "candidates": [
                    {"mugraph": str(c.mugraph), "kernels": c.num_kernels, "cost_us": c.cost.time_s * 1e6,
                     "rules": list(c.rules), "verdict": c.verdict.summary() if hasattr(c.verdict, "summary")
                     else str(c.verdict)}
                    for c in res.candidates
                ],
            }
            (args.out / f"{case}.json").write_text(json.dumps(doc, indent=1))
            rows.append((doc["case"], dt, [c.num_kernels for c in res.candidates]))
            logging.info("%s: %.1f s, %d candidate(s) %s", doc["case"], dt, len(res.candidates), rows[-1][2])
    for case, dt, ks in rows:
        print(f"{case:24s} {dt:6.1f} s  kernels {ks}")
    return 0 if all(ks for _, _, ks in rows) else 1


def floor(directory: Path, cases: list[str]) -> int:
    """Floor each case file's stored online softmaxes (:func:`verimirage.rewrite.floor.floor_running_maxes`: the
    form today's lowering makes, no search), verify each changed candidate again (a candidate that does not verify is
    dropped, logged) and re-estimate its cost; the order is kept. Files with nothing to floor are left as they are."""
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.floor import floor_running_maxes

    bad = 0
    for case in cases:
        path = directory / f"{case}.json"
        doc = json.loads(path.read_text())
        g = vm.Graph.parse(doc["graph"])
        kept, changed = [], 0
        for c in doc["candidates"]:
            mg = vm.MuGraph.parse(c["mugraph"])
            new = floor_running_maxes(mg)
            if new is not mg:
                t0 = time.perf_counter()
                v = vm.verify(g, new)
                if not isinstance(v, vm.Proved):
                    logging.warning("%s: a floored candidate does not verify (%s); dropped", case, v.reason[:200])
                    bad += 1
                    continue
                c.update(mugraph=str(new), cost_us=cost(new).time_s * 1e6, verdict=v.summary() if hasattr(
                    v, "summary") else str(v))
                changed += 1
                logging.info("%s: floored and verified in %.1f s", case, time.perf_counter() - t0)
            kept.append(c)
        if changed:
            doc["candidates"] = kept
            doc["floored"] = ("online softmaxes floored (verimirage.rewrite.floor, red team 17) and verified again; "
                              "cost_us re-estimated, order kept")
            path.write_text(json.dumps(doc, indent=1))
        print(f"{case:24s} floored {changed} of {len(doc['candidates'])}")
    return 1 if bad else 0


def rerank(directory: Path, cases: list[str]) -> int:
    """Re-estimate each case file's verified candidates with the current cost model; order them by it (stable)."""
    from verimirage.pipeline.pricing import cost

    for case in cases:
        path = directory / f"{case}.json"
        doc = json.loads(path.read_text())
        old = [c["mugraph"] for c in doc["candidates"]]
        for c in doc["candidates"]:
            c["cost_us"] = cost(vm.MuGraph.parse(c["mugraph"])).time_s * 1e6
        doc["candidates"].sort(key=lambda c: c["cost_us"])
        doc["reranked"] = "cost_us re-estimated and the candidates re-ordered by the cost model of this commit"
        path.write_text(json.dumps(doc, indent=1))
        moved = [old.index(c["mugraph"]) for c in doc["candidates"]]
        print(f"{case:24s} new order (old ranks) {moved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
