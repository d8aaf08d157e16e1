"""Search time and kernel counts for every suite graph at batch 1 and 8 (CPU; no GPU needed).

Usage: python benchmarks/search_times.py [--small] [--names gqa,lora] [--batches 1,8] [--top-k K]
       python benchmarks/search_times.py --set models [--names gelu_mlp,decode_gqa] [--json FILE]

Each row runs ``vm.superoptimize`` (search + verification with ``vm.verify``; default options unless
``--top-k`` is given; never served from the search cache) and reports the wall time (and the process CPU
time; phases as ``wall/CPU`` seconds), the best
candidate's kernel count against the expert design's, its estimated time, the number of μGraphs
lowered, how many candidates were verified (and why verification stopped) and the search phases.
If the verifier is not installed, the script says so and falls back to a float64 spot check (clearly
marked in the output). The load average before and after each row is printed, with the wall and the process CPU time
(all threads) of each search: on a shared machine the CPU seconds compare well, the wall seconds do not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import time

import numpy as np

import verimirage as vm


def _float64_check(a: vm.Graph, b: vm.Graph):  # type: ignore[no-untyped-def]
    from verimirage.smt.verdict import Proved, Refuted

    rng = np.random.default_rng(0)
    ins = {t.name: rng.uniform(-1, 1, t.shape) for t in a.inputs}
    pairs = zip(vm.evaluate(a, ins), vm.evaluate(b, ins), strict=True)
    ok = all(np.allclose(x, y, rtol=1e-6, atol=1e-6) for x, y in pairs)
    return Proved("float64 spot check (NOT a proof)") if ok else Refuted("float64 outputs differ")


def _ir_check_only(a: vm.Graph, b: vm.Graph):  # type: ignore[no-untyped-def]
    from verimirage.smt.verdict import Proved

    b.check()
    return Proved("IR check only (--search-only): NOT verified")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--set", choices=["suite", "models"], default="suite",
                    help="the Mirage suite (batches 1 and 8) or the models set (one size each)")
    ap.add_argument("--small", action="store_true", help="the small (CPU-interpreter) variants")
    ap.add_argument("--names", default=None, help="default: every program of the set")
    ap.add_argument("--json", default=None, help="also write the rows (and load averages) to this JSON file")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--top-k", type=int, default=None, help="default: superoptimize's default")
    ap.add_argument("--search-only", action="store_true",
                    help="skip vm.verify (IR checks only): measures the search alone, results NOT verified")
    args = ap.parse_args()
    models = args.set == "models"
    if args.names is None:
        args.names = ",".join(vm.benchmarks.model_names() if models else vm.benchmarks.names())
    have_verify = importlib.util.find_spec("verimirage.smt.verify") is not None
    verifier = None if have_verify else _float64_check
    if args.search_only:
        verifier = _ir_check_only
    print(f"# search times ({args.set} set, {'small' if args.small else 'full-size'} graphs, "
          f"top_k={args.top_k if args.top_k is not None else 'default'})")
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}; "
          "verification: " + ("none (--search-only; IR checks only)" if args.search_only else
                              "vm.verify" if have_verify else "float64 spot check (vm.verify not available)"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cores)")
    print()
    print("| graph | batch | seconds | CPU s | load | kernels (expert) | est. time | lowered | verified | stop "
          "| phases (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    opts = {} if args.top_k is None else {"top_k": args.top_k}
    times = []
    cpus = []
    rows = []
    load_before = os.getloadavg()
    for name in args.names.split(","):
        for batch in ([1] if models else (int(b) for b in args.batches.split(","))):
            g = (vm.benchmarks.get_model(name, small=args.small) if models
                 else vm.benchmarks.get(name, batch=batch, small=args.small))
            load = os.getloadavg()[0]
            c0 = time.process_time()
            t0 = time.perf_counter()
            res = vm.superoptimize(g, progress=False, verifier=verifier, cache=False, **opts)
            dt = time.perf_counter() - t0
            cpu = time.process_time() - c0
            times.append(dt)
            cpus.append(cpu)
            b = res.best
            cpu_ph = res.report.phase_cpu_seconds
            phases = " ".join(f"{k[:3]}={v:.2f}" + (f"/{cpu_ph[k]:.2f}" if k in cpu_ph else "")
                              for k, v in res.report.phase_seconds.items() if v >= 0.005)
            expert = "-" if models else vm.benchmarks.entry(name).expert_kernels
            kern = f"{b.num_kernels} ({expert})" if b else "none"
            est = f"{b.cost.time_s * 1e6:.1f} us" if b else "-"
            stop = res.report.stop_reason.split(" (")[0]
            print(f"| {name} | {batch} | {dt:.2f} | {cpu:.2f} | {load:.1f} | {kern} | {est} | {res.report.lowered} | "
                  f"{res.report.verified} | {stop} | {phases} |", flush=True)
            rows.append({"graph": name, "batch": None if models else batch, "seconds": round(dt, 2),
                         "cpu_seconds": round(cpu, 2),
                         "kernels": b.num_kernels if b else None, "verified": res.report.verified, "stop": stop,
                         "phases": {k: round(v, 2) for k, v in res.report.phase_seconds.items()},
                         "phases_cpu": {k: round(v, 2) for k, v in res.report.phase_cpu_seconds.items()},
                         "load_1min_before": round(load, 2)})
    print()
    print(f"median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} searches (wall); "
          f"CPU median {statistics.median(cpus):.2f} s, max {max(cpus):.2f} s (process time, all threads)")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        doc = {"set": args.set, "small": args.small, "top_k": args.top_k, "machine": platform.machine(),
               "cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
               "median_s": round(statistics.median(times), 2), "max_s": round(max(times), 2),
               "cpu_median_s": round(statistics.median(cpus), 2), "cpu_max_s": round(max(cpus), 2), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
