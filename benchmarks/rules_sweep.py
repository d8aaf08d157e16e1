"""Rule research measurement (issue 25): synthesize a ruleset over the issue's ops, check how many built-in
rules in those ops it rediscovers, then sweep the suite with the synthesized ruleset in place of the built-in
``algebra`` theory, serially and on Ray (local), and compare the tables.

    python benchmarks/rules_sweep.py [--depth 2] [--full] [--no-ray] [--out benchmarks/results/rules_sweep]

Writes ``synthesis.txt`` (report, rules, rediscovery), ``sweep.csv`` (serial), ``sweep_ray.csv`` and
``summary.json`` (wall times, which programs reach the baseline's best cost, which rules the synthesized set
misses) under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

import verimirage as vm
from verimirage.pipeline.synth import DEFAULT_OPS, in_scope, rediscovered
from verimirage.rewrite.rules import all_builtin_rules

log = logging.getLogger("rules_sweep")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--full", action="store_true", help="full-size programs (default: the small shapes)")
    p.add_argument("--out", default="benchmarks/results/rules_sweep")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for name in ("verimirage.rewrite.saturate", "verimirage.pipeline.superopt", "verimirage.smt"):
        logging.getLogger(name).setLevel(logging.WARNING)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, object] = {"cores": os.cpu_count(), "depth": a.depth, "seed": a.seed, "full": a.full}

    t0 = time.perf_counter()
    rs = vm.rules.synthesize(ops=DEFAULT_OPS, depth=a.depth, seed=a.seed, progress=False)
    summary["synthesis_s"] = round(time.perf_counter() - t0, 1)
    targets = [r for r in all_builtin_rules() if in_scope(r, DEFAULT_OPS)]
    found = rediscovered(rs, targets)
    summary["rediscovered"] = found
    summary["rediscovered_fraction"] = round(sum(found.values()) / len(found), 3)
    summary["rules"] = len(rs.rules)
    (out / "synthesis.txt").write_text(str(rs.report) + "\n\nrules:\n" + "\n".join(str(r) for r in rs.rules)
                                       + "\n\nrediscovered:\n" + "\n".join(f"  {k}: {v}" for k, v in found.items())
                                       + "\n")

    # the default rules with the built-in algebra theory replaced by the synthesized rules
    variants = {"builtin": {}, "synthesized": {"disable_rules": ["algebra"], "extra_rules": [rs]}}
    programs = vm.benchmarks.names()
    t0 = time.perf_counter()
    serial = vm.rules.sweep(programs, variants, seed=a.seed, small=not a.full, progress=False)
    summary["sweep_serial_s"] = round(time.perf_counter() - t0, 1)
    serial.write_csv(out / "sweep.csv")
    same, worse = [], []
    for prog in programs:
        b, s = serial.best(prog, "builtin"), serial.best(prog, "synthesized")
        (same if abs(b.best_cost_us - s.best_cost_us) <= 1e-9 * max(1.0, b.best_cost_us) else worse).append(prog)
    summary["same_best_cost"] = same
    summary["different_best_cost"] = {
        prog: {"builtin": serial.best(prog, "builtin").best_cost_us,
               "synthesized": serial.best(prog, "synthesized").best_cost_us,
               "builtin_rules": serial.best(prog, "builtin").rules_best} for prog in worse}
    if not a.no_ray and importlib.util.find_spec("ray") is not None:
        t0 = time.perf_counter()
        on_ray = vm.rules.sweep(programs, variants, seed=a.seed, small=not a.full, ray=True, progress=False)
        summary["sweep_ray_s"] = round(time.perf_counter() - t0, 1)
        on_ray.write_csv(out / "sweep_ray.csv")
        summary["ray_table_identical"] = serial.same_results(on_ray)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
