"""Two launches against one: split reductions with their combine in the last block of each group (codegen's
``last_block``), timed on the GPU against the same candidate's split + combine launches.

For each case (a suite program at a batch, ``gqa:1``, or a models-set program, ``models:decode_gqa``), the committed
candidate (``--top-k``; only those with a split kernel and its combine) is compiled twice, ``last_block=False``
(two launches) and ``True`` (one), checked bit for bit against each other and against float64, timed by CUDA-graph
replay (``do_bench_cudagraph`` median, the two variants interleaved over ``--rounds`` rounds, each variant's
median of its rounds reported), and the one-launch program replayed ``--replays`` times in a CUDA graph on two
alternating input sets, every output's bits compared with the two-launch one's (a race would show as a count that
is no whole multiple of the replays: a fixed difference, e.g. a multiply-add contracted otherwise, repeats). The
one-kernel launch floor and PyTorch's SDPA (attention programs) are timed in the same call.

Run on the device machine (one call, ~2-3 min): ``python3 benchmarks/last_block.py --out $OUT/lb``. Writes
``last_block.json`` and ``last_block.md`` (a table) to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench
from torch_eager import min_bytes, rel_err, torch_fn

import verimirage as vm

ROOT = Path(__file__).resolve().parent
CASES = ["gqa:1", "mqa:1", "qknorm_gqa:1", "gqa_stable:1", "gqa:8", "mqa:8", "qknorm_gqa:8", "gqa_stable:8",
         "models:decode_gqa"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (an integer view of its elements)."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def run_case(spec: str, args: argparse.Namespace, ceil: dict[str, float]) -> list[dict[str, Any]]:
    """The rows of one case: one per candidate with a split/combine pair."""
    name, _, b = spec.partition(":")
    models = name == "models"
    if models:
        name = b
    g, case = bench.case_graph(name, 1 if models else int(b), models)
    directory = ROOT / ("candidates_models" if models else "candidates")
    cands, _, costs = bench.load_candidates(g, case, directory)
    ins = bench.make_inputs(g, name, seed=1)
    other = bench.make_inputs(g, name, seed=2)
    f = torch_fn(g)
    ref = f(*[x.double() for x in ins])
    floor = 1e6 * min_bytes(g) / ceil["copy_bytes_per_s"]
    base: dict[str, Any] = {"case": case, "floor_us": floor, "launch_us": ceil["launch_us"]}
    if name in bench.ATTN or name in bench.MODEL_SDPA:
        try:
            sf, sins = bench.model_sdpa_fn(name, g, ins) if models else bench.sdpa_fn(name, g, ins)
            if rel_err(sf(*sins), ref) < 2e-2:
                base["sdpa_us"] = bench.bench(lambda: sf(*sins), cudagraph=True)
        except Exception as e:  # (a baseline that does not apply: no row field)
            base["sdpa_error"] = f"{type(e).__name__}: {e}"[:200]
    rows = []
    for k, mg in enumerate(cands[: args.top_k]):
        two = vm.compile(mg, last_block=False)
        one = vm.compile(mg, last_block=True)
        if len(one.kernels) == len(two.kernels):
            continue
        row = dict(base, candidate=k, cost_us=costs[k], launches_two=len(two.steps), launches_one=len(one.steps))
        a, c = two(*ins), one(*ins)
        row["bit_equal"] = bool(torch.equal(bits(a), bits(c)))  # (NaN == NaN: the bits are compared)
        row["max_abs_diff"] = float((a.float() - c.float()).abs().max())
        row["err_two"], row["err_one"] = rel_err(a, ref), rel_err(c, ref)
        t2: list[float] = []
        t1: list[float] = []
        for _ in range(args.rounds):
            t2.append(bench.bench(lambda p=two: p(*ins), cudagraph=True))
            t1.append(bench.bench(lambda p=one: p(*ins), cudagraph=True))
        row["two_us"], row["one_us"] = statistics.median(t2), statistics.median(t1)
        row["two_rounds_us"], row["one_rounds_us"] = t2, t1
        row["speedup"] = row["two_us"] / row["one_us"]
        row["floor_fraction_two"] = max(floor, ceil["launch_us"]) / row["two_us"]
        row["floor_fraction_one"] = max(floor, ceil["launch_us"]) / row["one_us"]
        # races: many replays of the one-launch graph, inputs alternating, every output against the two launches'
        want = [a.clone(), two(*other).clone()]
        graph = vm.compile(mg, last_block=True, cuda_graph=True)
        bad = torch.zeros((), dtype=torch.int64, device="cuda")
        for i in range(args.replays):
            bad += (bits(graph(*(ins, other)[i % 2])) != bits(want[i % 2])).sum()
        torch.cuda.synchronize()
        row["replays"], row["replay_mismatches"] = args.replays, int(bad)
        row["counters_zero"] = int(one.counters(ins[0].device).abs().sum()) == 0
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(doc: dict[str, Any]) -> str:
    """The markdown table of a run."""
    out = [f"# Last-block combines: {doc['device']}, {doc['utc']}", "",
           f"CUDA-graph medians (µs), launch {doc['launch_us']:.2f} µs; {doc['rounds']} interleaved rounds each.", "",
           "| case | cand | floor µs | SDPA µs | two launches µs | one launch µs | speedup | bit-equal | "
           "replays (mismatches) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        sd = f"{r['sdpa_us']:.2f}" if "sdpa_us" in r else "-"
        out.append(f"| {r['case']} | {r['candidate']} | {r['floor_us']:.2f} | {sd} | {r['two_us']:.2f} | "
                   f"{r['one_us']:.2f} | {r['speedup']:.3f}x | {r['bit_equal']} | {r['replays']} "
                   f"({r['replay_mismatches']}) |")
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=CASES)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=int, default=100)
    p.add_argument("--replays", type=int, default=1000)
    p.add_argument("--budget-s", type=float, default=150.0, help="start no case after this many seconds")
    p.add_argument("--max-tiles", type=int, default=16,
                   help="combine blocks a group's last block may run (codegen.LASTBLOCK_MAX_TILES; 16 as measured on "
                        "2026-11-27, where the suite's 4 per group were timed)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from verimirage.backend import codegen

    codegen.LASTBLOCK_MAX_TILES = args.max_tiles
    bench.REP_MS = args.rep_ms
    t0 = time.perf_counter()
    ceil = bench.ceilings()
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
                           "launch_us": ceil["launch_us"], "copy_bytes_per_s": ceil["copy_bytes_per_s"],
                           "rounds": args.rounds, "rep_ms": args.rep_ms, "rows": [], "skipped": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.cases:
        if time.perf_counter() - t0 > args.budget_s:
            doc["skipped"].append(spec)
            continue
        try:
            doc["rows"] += run_case(spec, args, ceil)
        except Exception as e:
            doc.setdefault("errors", {})[spec] = f"{type(e).__name__}: {e}"[:500]
            print(f"{spec}: {type(e).__name__}: {e}", flush=True)
        (args.out / "last_block.json").write_text(json.dumps(doc, indent=1))
        (args.out / "last_block.md").write_text(table(doc))
    doc["wall_s"] = time.perf_counter() - t0
    (args.out / "last_block.json").write_text(json.dumps(doc, indent=1))
    (args.out / "last_block.md").write_text(table(doc))
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
