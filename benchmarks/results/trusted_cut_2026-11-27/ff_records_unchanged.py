"""Recompute the finite-field record of every committed certificate (and of a composed one's sub-certificates)
from its two programs and compare it with the stored one: a change of the degree analysis that changes no record
needs no re-made certificate.

Run from a checkout's root: ``python benchmarks/results/trusted_cut_2026-11-27/ff_records_unchanged.py``.
"""

import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
from verimirage.ir.graph import Graph, MuGraph
from verimirage.smt.certificate import ff_record


def main() -> None:
    bad = n = 0
    for p in sorted(glob.glob("proofs/*.json")) + sorted(glob.glob("benchmarks/candidates/layer_np/proofs/*.json")):
        d = json.loads(Path(p).read_text())
        for i, c in enumerate(d.get("certificates") or [d]):
            r = ff_record(Graph.parse(c["graph_text"]), MuGraph.parse(c["mugraph_text"]))
            n += 1
            if json.dumps(r, sort_keys=True) != json.dumps(c["ff"], sort_keys=True):
                bad += 1
                print("DIFF", p, i, c["ff"]["per_trial_bound"], r["per_trial_bound"])
    print(f"{n} records recomputed; {bad} differ")


if __name__ == "__main__":
    main()
