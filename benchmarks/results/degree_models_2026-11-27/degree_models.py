"""Both degree models of the finite-field bound, for every committed certificate (issue 24).

The per-trial bound is ``(2 * degree + opaque + 1) / q_min``. main (4c4e766..) takes ``degree`` as the larger of
the per-node model (``ffref.node_degree``'s rule per op) and the quotient model (``ffref.quotient_info``, sums of
quotients ``N / D``), and ``opaque`` as the per-node model's count of opaque nodes. This prints, per pair, both
models' degree and opaque count, the recorded per-trial bound and trials, and what the record would be with
each model alone. Run from the root of a checkout whose ``ffref._degrees`` still holds both models (main a9ef032,
before the per-node model went): ``python benchmarks/results/degree_models_2026-11-27/degree_models.py``.
"""

import glob
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
from verimirage.ir.graph import Graph, MuGraph
from verimirage.smt import ffref
from verimirage.smt.certificate import MAX_TRIALS

# main's _degrees, returning the per-node model's own degree too (the last line changed only)
src = Path(ffref.__file__).read_text()
old = "    return (quotient, opaque[1], opaque[2]), (max(node_model, quotient), node_opaque[1])\n"
assert old in src, "this checkout has no per-node model"
mod = types.ModuleType("ffref_both")
mod.__dict__.update(ffref.__dict__)
new = "    return (quotient, opaque[1], opaque[2]), (node_model, node_opaque[1])\n"
exec(compile(src.replace(old, new), "x", "exec"), mod.__dict__)
Q_MIN = (ffref.safe_primes()[0] - 1) // 2


def per(deg: int, opq: int) -> tuple[float, int]:
    p = min(1.0, (2 * deg + opq + 1) / Q_MIN)
    return p, ffref.trials_needed(p)


def certs() -> list[tuple[str, dict]]:
    out = []
    files = sorted(glob.glob("proofs/*.json")) + sorted(glob.glob("benchmarks/candidates/layer_np/proofs/*.json")) \
        + sorted(glob.glob("tests/cases/certificates/*.json"))
    for p in files:
        d = json.loads(Path(p).read_text())
        subs = d.get("certificates") or [d]
        out += [(f"{Path(p).stem}" + (f"#{i}" if len(subs) > 1 else ""), c) for i, c in enumerate(subs)]
    for p in sorted(glob.glob("benchmarks/results/capture/plan_*.json")):
        for items in json.loads(Path(p).read_text()).values():
            for j, it in enumerate(items if isinstance(items, list) else []):
                if isinstance(it, dict) and isinstance(it.get("certificate"), str):
                    d = json.loads(it["certificate"])
                    subs = d.get("certificates") or [d]
                    out += [(f"{Path(p).stem}:{len(out)}.{j}.{i}", c) for i, c in enumerate(subs)]
    return out


def main() -> None:
    print("name | node deg a,b | node opq | quot deg a,b | atoms | recorded per, trials | node-only per, trials | "
          "quot-only per, trials (atoms counted) | same record")
    same = n = 0
    for name, c in certs():
        if "graph_text" not in c:
            continue
        g, m = Graph.parse(c["graph_text"]), MuGraph.parse(c["mugraph_text"])
        (qa, aa, _), (na, oa) = mod._degrees(g)
        (qb, ab, _), (nb, ob) = mod._degrees(m)
        rec = c["ff"]["per_trial_bound"], c["ff"]["trials"]
        node = per(max(na, nb), oa + ob)
        quot = per(max(qa, qb), aa + ab)
        now = per(max(na, nb, qa, qb), oa + ob)
        if now[0] != rec[0]:  # (a record today's checker rejects: stale)
            print(f"{name} | STALE: recorded {rec[0]:.3g}, today's {now[0]:.3g}")
            continue
        n += 1
        same += quot == rec
        print(f"{name} | {na},{nb} | {oa + ob} | {qa},{qb} | {aa + ab} | {rec[0]:.3g}, {rec[1]} | "
              f"{node[0]:.3g}, {node[1]} | {quot[0]:.3g}, {quot[1]} | {'yes' if quot == rec else 'NO'}")
    print(f"{n} records; quotient model alone gives the same per-trial bound for {same}; MAX_TRIALS {MAX_TRIALS}")


if __name__ == "__main__":
    main()
