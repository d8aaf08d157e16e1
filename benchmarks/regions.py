"""Search + verification by regions (issue 22 "no size cliff", issue 23 "search that scales to a layer").

Usage: python benchmarks/regions.py [--cases chain5,chain8,chain16,decode_bs1] [--small] [--check-cert]
                                    [--out benchmarks/results/regions.json]

Each case runs ``vm.superoptimize`` with the default options (``split="auto"``; never served from the search
cache) and records the wall and CPU time of the search + the whole-program verification + the certificate,
the kernels of the best candidate and of each region, and, with ``--check-cert``, the independent checker's
verdict on the certificate and its time. Cases: ``chainN`` (``relu(x @ W_i)``, N layers, 16x256 fp16, the
issue's program) and ``decode_bsB`` / ``prefill_T`` (the LLaMA decoder layer of
:mod:`verimirage.benchmarks.layer`, full size unless ``--small``). The load average before and after is
recorded: the machine is shared, the timings are wall times on it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import verimirage as vm
from verimirage.benchmarks.models import relu_chain


def program(case: str, small: bool) -> vm.Graph:
    """The graph of ``case``."""
    if case.startswith("chain"):
        return relu_chain(int(case[5:]), d=64 if small else 256)
    return vm.benchmarks.get_layer(case, small=small)


def run(case: str, small: bool, check_cert: bool) -> dict[str, Any]:
    """One case's row."""
    g = program(case, small)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    res = vm.superoptimize(g, cache=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    rep, best = res.report, res.best
    row: dict[str, Any] = {
        "case": case, "small": small, "ops": sum(1 for n in g.nodes if n.op != "input"),
        "search_verify_s": round(wall, 1), "cpu_s": round(cpu, 1),
        "phases_s": {k: round(v, 2) for k, v in rep.phase_seconds.items()},
        "stop": rep.stop_reason, "split": rep.split,
        "regions": [{"ops": r.ops, "kernels": r.kernels, "cost_us": round(r.cost_us, 2), "how": r.how}
                    for r in rep.regions],
        "kernels": best.num_kernels if best else None,
        "verdict": type(best.verdict).__name__ if best else None,
        "certificate": best is not None and best.certificate is not None,
        "cost_us": round(best.cost.time_s * 1e6, 2) if best else None,
        "load_before": round(load0, 1),
    }
    if check_cert and best is not None and best.certificate is not None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "cert.json"
            best.certificate.save(p)
            t0 = time.perf_counter()
            v = vm.check_certificate(p)
            row["check_cert"] = type(v).__name__
            row["check_cert_s"] = round(time.perf_counter() - t0, 1)
    row["load_after"] = round(os.getloadavg()[0], 1)
    return row


def main() -> None:
    """Run the cases and write the JSON rows."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="chain5,chain8,chain16,decode_bs1")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--check-cert", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = []
    for case in a.cases.split(","):
        row = run(case, a.small, a.check_cert)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.out:
        meta = {"machine": f"{platform.node()} ({os.cpu_count()} CPUs, shared)", "date": time.strftime("%Y-%m-%d"),
                "python": platform.python_version()}
        Path(a.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
