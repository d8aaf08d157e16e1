"""Rule research measurement (issue 25): synthesize a ruleset over the issue's ops, check how many built-in
rules in those ops it rediscovers, then sweep the suite with the synthesized ruleset in place of the built-in
``algebra`` theory, serially, in a pool of worker processes and on Ray (local), and compare the tables.

    python benchmarks/rules_sweep.py [--depth 2] [--full] [--no-ray] [--out benchmarks/results/rules_sweep]
    python benchmarks/rules_sweep.py --processes 0 --no-serial --also-full --loto \\
        --extra-synth add,mul,neg:3 --out OUT          # a many-core machine (benchmarks/rules_sweep_device.sh)

Writes under ``--out``: ``synthesis.txt`` (report, rules, rediscovery), ``sweep.csv`` (serial), ``sweep_pool.csv``
(``--processes``), ``sweep_ray.csv``, ``sweep_full_pool.csv`` (``--also-full``), ``loto.csv`` (``--loto``),
``synth_<ops>_d<depth>.txt`` (``--extra-synth``) and ``summary.json`` (wall times, the machine, which programs
reach the baseline's best cost, which rules the synthesized set misses). ``summary.json`` is rewritten after
every phase, so a run stopped on a time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import logging
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import verimirage as vm
from verimirage.pipeline.synth import DEFAULT_OPS, in_scope, rediscovered
from verimirage.rewrite.rules import all_builtin_rules

log = logging.getLogger("rules_sweep")


def machine() -> dict[str, Any]:
    """The machine this runs on: cores, CPU model, GPU (nvidia-smi, if any), Python, date."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = ""
    with contextlib.suppress(OSError, IndexError, subprocess.SubprocessError):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=False).stdout.strip().splitlines()[0]
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return {"cores": cores, "cpu": cpu, "gpu": gpu, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "load_before": os.getloadavg()[0]}


def _same_best(table: Any, programs: list[str], summary: dict[str, Any], key: str) -> None:
    same, worse = [], []
    for prog in programs:
        b, s = table.best(prog, "builtin"), table.best(prog, "synthesized")
        (same if abs(b.best_cost_us - s.best_cost_us) <= 1e-9 * max(1.0, b.best_cost_us) else worse).append(prog)
    summary[f"{key}_same_best_cost"] = same
    summary[f"{key}_different_best_cost"] = {
        prog: {"builtin": table.best(prog, "builtin").best_cost_us,
               "synthesized": table.best(prog, "synthesized").best_cost_us,
               "builtin_rules": table.best(prog, "builtin").rules_best} for prog in worse}


def _extra(a: argparse.Namespace, summary: dict[str, Any], out: Path, save: Any) -> None:
    """The ``--extra-synth`` runs: synthesis over other op sets or depths, with their rediscovery counts."""
    for spec in a.extra_synth:
        ops_text, _, depth_text = spec.partition(":")
        ops = [o for o in ops_text.split(",") if o]
        depth = int(depth_text or a.depth)
        t0 = time.perf_counter()
        ex = vm.rules.synthesize(ops=ops, depth=depth, seed=a.seed, progress=False, time_budget_s=a.synth_budget,
                                 processes=a.processes, max_terms=a.max_terms)
        wall = round(time.perf_counter() - t0, 1)
        label = f"synth_{'-'.join(ops)}_d{depth}"
        sub = [r for r in all_builtin_rules() if in_scope(r, ops)]
        hit = rediscovered(ex, sub) if sub else {}
        summary[label] = {"wall_s": wall, "phases_s": {k: round(v, 1) for k, v in ex.report.seconds.items()},
                          "terms": ex.report.terms, "proposed": ex.report.proposed, "proved": len(ex.report.proved),
                          "refuted": len(ex.report.refuted), "unknown": len(ex.report.unknown),
                          "untried": ex.report.untried, "rules": len(ex.rules), "rediscovered": hit}
        (out / f"{label}.txt").write_text(str(ex.report) + "\n\nrules:\n" + "\n".join(str(r) for r in ex.rules) + "\n")
        save()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--full", action="store_true", help="full-size programs (default: the small shapes)")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="also run in a pool of N worker processes (0: one per core): the synthesis's proofs and a "
                        "pool sweep")
    p.add_argument("--no-serial", action="store_true", help="skip the serial sweep (with --processes)")
    p.add_argument("--also-full", action="store_true", help="with --processes: also the full-size sweep in the pool")
    p.add_argument("--loto", action="store_true",
                   help="with --processes: also the leave-one-theory-out sweep (small shapes) in the pool")
    p.add_argument("--extra-synth", action="append", default=[], metavar="OPS:DEPTH",
                   help="also synthesize over these comma-separated ops at this depth, e.g. add,mul,neg:3 "
                        "(repeatable; in the pool with --processes)")
    p.add_argument("--synth-budget", type=float, default=None, metavar="S",
                   help="time budget of each synthesis's proofs in seconds (default: none)")
    p.add_argument("--programs", nargs="*", default=None, help="suite programs (default: all ten)")
    p.add_argument("--max-terms", type=int, default=20000,
                   help="terms per shape environment of each synthesis (default 20000: depth 3 over the eight ops "
                        "would need millions, so such a run stops at depth 2; a warning says so)")
    p.add_argument("--only-extra", action="store_true",
                   help="only the --extra-synth runs (no main synthesis, no sweep)")
    p.add_argument("--out", default="benchmarks/results/rules_sweep")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("verimirage.pipeline.saturate", "verimirage.pipeline.superopt", "verimirage.rewrite.saturate",
                 "verimirage.smt"):
        logging.getLogger(name).setLevel(logging.WARNING)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.no_serial and a.processes is None:
        p.error("--no-serial needs --processes (some sweep must run)")
    summary: dict[str, Any] = {"machine": machine(), "depth": a.depth, "seed": a.seed, "full": a.full,
                               "processes": a.processes}

    def save() -> None:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    if a.only_extra:
        _extra(a, summary, out, save)
        print(json.dumps(summary, indent=2))
        return
    t0 = time.perf_counter()
    rs = vm.rules.synthesize(ops=DEFAULT_OPS, depth=a.depth, seed=a.seed, progress=False,
                             time_budget_s=a.synth_budget, processes=a.processes, max_terms=a.max_terms)
    summary["synthesis_s"] = round(time.perf_counter() - t0, 1)
    summary["synthesis_phases_s"] = {k: round(v, 1) for k, v in rs.report.seconds.items()}
    targets = [r for r in all_builtin_rules() if in_scope(r, DEFAULT_OPS)]
    found = rediscovered(rs, targets)
    summary["rediscovered"] = found
    summary["rediscovered_fraction"] = round(sum(found.values()) / len(found), 3)
    summary["rules"] = len(rs.rules)
    summary["synthesis_counts"] = {"terms": rs.report.terms, "proposed": rs.report.proposed,
                                   "proved": len(rs.report.proved), "refuted": len(rs.report.refuted),
                                   "unknown": len(rs.report.unknown), "untried": rs.report.untried}
    (out / "synthesis.txt").write_text(str(rs.report) + "\n\nrules:\n" + "\n".join(str(r) for r in rs.rules)
                                       + "\n\nrediscovered:\n" + "\n".join(f"  {k}: {v}" for k, v in found.items())
                                       + "\n")
    save()

    # the default rules with the built-in algebra theory replaced by the synthesized rules
    variants = {"builtin": {}, "synthesized": {"disable_rules": ["algebra"], "extra_rules": [rs]}}
    programs = a.programs or vm.benchmarks.names()
    tables: dict[str, Any] = {}
    if a.processes is not None:
        t0 = time.perf_counter()
        pooled = vm.rules.sweep(programs, variants, seed=a.seed, small=not a.full, processes=a.processes,
                                progress=False)
        summary["sweep_pool_s"] = round(time.perf_counter() - t0, 1)
        pooled.write_csv(out / "sweep_pool.csv")
        tables["pool"] = pooled
        _same_best(pooled, programs, summary, "pool")
        save()
    # depth-3 (or other) syntheses: after the headline sweep, before the longer sweeps
    _extra(a, summary, out, save)
    if a.processes is not None:
        if a.loto:
            t0 = time.perf_counter()
            loto = vm.rules.sweep(programs, None, seed=a.seed, small=True, processes=a.processes, progress=False)
            summary["loto_pool_s"] = round(time.perf_counter() - t0, 1)
            summary["loto_searches"] = len(loto.rows)
            loto.write_csv(out / "loto.csv")
            save()
        if a.also_full:
            t0 = time.perf_counter()
            full = vm.rules.sweep(programs, variants, seed=a.seed, small=False, processes=a.processes, progress=False)
            summary["sweep_full_pool_s"] = round(time.perf_counter() - t0, 1)
            full.write_csv(out / "sweep_full_pool.csv")
            _same_best(full, programs, summary, "full_pool")
            save()
    if not a.no_serial:
        t0 = time.perf_counter()
        serial = vm.rules.sweep(programs, variants, seed=a.seed, small=not a.full, progress=False)
        summary["sweep_serial_s"] = round(time.perf_counter() - t0, 1)
        serial.write_csv(out / "sweep.csv")
        tables["serial"] = serial
        _same_best(serial, programs, summary, "serial")
        if "pool" in tables:
            summary["pool_table_identical"] = serial.same_results(tables["pool"])
        save()
    if not a.no_ray and importlib.util.find_spec("ray") is not None:
        t0 = time.perf_counter()
        on_ray = vm.rules.sweep(programs, variants, seed=a.seed, small=not a.full, ray=True, progress=False)
        summary["sweep_ray_s"] = round(time.perf_counter() - t0, 1)
        on_ray.write_csv(out / "sweep_ray.csv")
        base = tables.get("serial", tables.get("pool"))
        if base is not None:
            summary["ray_table_identical"] = base.same_results(on_ray)
        save()
    summary["machine"]["load_after"] = os.getloadavg()[0]
    save()
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
