"""One-call A/B of code generator settings on chosen designs, in one process (twentieth session).

    PYTHONPATH=$PWD python benchmarks/perf/models20_ab.py prepare OUT.json        # CPU: the items
    python benchmarks/perf/models20_ab.py run IN.json --out DIR [--rounds 4]      # GPU: time them

An item is a program (a models-set or suite case, or a capture plan entry's graph), one design (μGraph) of it, a PDL
mode and variants: settings of :mod:`verimirage.backend.codegen` (module attributes) under which ``vm.compile``
generates the design (default launch configuration: ``recommend``'s tiles and launch parameters per kernel).
``prepare`` keeps only the items whose variants generate different module text (checked on the CPU, the PDL mode
forced on), so every timed pair differs. ``run`` compiles each variant, checks it against the float64 reference
(bench.py's ``torch_fn``) and bit for bit against the first variant (the settings change where kernels convert or
wait, never what they compute), then times the variants in ``--rounds`` interleaved rounds, CUDA-graph medians over
rotated input sets (bench.py's ``bench_sets``, ``--rep-ms`` windows); each variant's median over rounds is reported.

Sets of this session (:func:`items`):

- ``own64``: ``PDL_EARLY_OWN_MAX_BLOCKS`` 0 (the default) against 64, PDL "auto": the committed candidates whose text it
  changes (models set and suite; every other committed candidate's PDL text is the same under both).
- ``rcast``: ``EARLY_CAST_BESIDE_CARRIED`` False (codegen 16-17's early casts) against True, PDL off (the suite's and
  the capture plans' default): the suite's candidate 0 (the unprofiled default) and last picks whose text changes,
  and the capture plans' first designs whose text changes (at most ``PLAN_ITEMS``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

#: set name -> (PDL mode, {variant: codegen settings}); the first variant is the reference of the bit comparison
SETS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "own64": ("auto", {"own0": {}, "own64": {"PDL_EARLY_OWN_MAX_BLOCKS": 64}}),
    "rcast": ("", {"guard": {"EARLY_CAST_BESIDE_CARRIED": False}, "carried": {"EARLY_CAST_BESIDE_CARRIED": True}}),
}
#: at most this many capture plan entries in ``rcast`` (their first designs, in plan order)
PLAN_ITEMS = 3


def _source(mugraph: str, pdl: str, settings: dict[str, Any]) -> str:
    """The module text ``vm.compile`` generates for ``mugraph`` under ``settings`` with PDL mode ``pdl`` (on the CPU:
    the runtime's PDL mode forced, the interpreter would drop it)."""
    import verimirage as vm
    from verimirage.backend import codegen, runtime

    saved = {k: getattr(codegen, k) for k in settings}
    wanted = runtime._pdl_wanted
    runtime._pdl_wanted = lambda: pdl
    try:
        for k, v in settings.items():
            setattr(codegen, k, v)
        return str(vm.compile(vm.MuGraph.parse(mugraph)).source)
    finally:
        runtime._pdl_wanted = wanted
        for k, v in saved.items():
            setattr(codegen, k, v)


def _differs(mugraph: str, pdl: str, variants: dict[str, dict[str, Any]]) -> bool:
    return len({_source(mugraph, pdl, s) for s in variants.values()}) > 1


def items() -> list[dict[str, Any]]:
    """This session's items (see the module docstring)."""
    out: list[dict[str, Any]] = []
    pdl, variants = SETS["own64"]
    for folder in ("candidates_models", "candidates"):
        for f in sorted((ROOT / "benchmarks" / folder).glob("*.json")):
            if f.name.endswith(".plan.json"):
                continue
            for i, c in enumerate(json.loads(f.read_text())["candidates"]):
                if _differs(c["mugraph"], pdl, variants):
                    out.append({"name": f"{f.stem}#{i}", "set": "own64", "folder": folder, "case": f.stem,
                                "mugraph": c["mugraph"]})
    pdl, variants = SETS["rcast"]
    picks = {r["case"]: r.get("verimirage_mugraph")
             for r in json.loads((ROOT / "benchmarks" / "results" / "latest.json").read_text())["rows"]}
    for f in sorted((ROOT / "benchmarks" / "candidates").glob("*.json")):
        if f.name.endswith(".plan.json"):
            continue
        cands = [c["mugraph"] for c in json.loads(f.read_text())["candidates"]]
        for i in sorted({0, *([cands.index(picks[f.stem])] if picks.get(f.stem) in cands else [])}):
            if _differs(cands[i], pdl, variants):
                out.append({"name": f"{f.stem}#{i}" + (" (pick)" if cands[i] == picks.get(f.stem) else ""),
                            "set": "rcast", "folder": "candidates", "case": f.stem, "mugraph": cands[i]})
    n = 0
    for f in sorted((ROOT / "benchmarks" / "results" / "capture").glob("plan_*_fp16.json")):
        for g, (graph, designs) in enumerate(json.loads(f.read_text()).items()):
            d = designs[0] if isinstance(designs, list) else designs
            mg = d if isinstance(d, str) else str(d["mugraph"])
            if n < PLAN_ITEMS and _differs(mg, pdl, variants):
                out.append({"name": f"{f.stem}#{g}", "set": "rcast", "graph": graph, "mugraph": mg})
                n += 1
    return out


def run(items_path: Path, out: Path, rounds: int, rep_ms: int) -> None:
    """Compile, check and time every item's variants (see the module docstring); write ``out``/ab.json."""
    import bench
    import torch
    from bench import bench_sets, case_graph, rel_err, rotated_inputs, torch_fn

    import verimirage as vm
    from verimirage.backend import codegen
    from verimirage.backend.precompile import precompile

    bench.REP_MS = rep_ms
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "start_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rounds": rounds,
                           "rep_ms": rep_ms, "rows": []}
    out.mkdir(parents=True, exist_ok=True)
    for it in json.loads(items_path.read_text()):
        t0 = time.perf_counter()
        pdl, variants = SETS[it["set"]]
        row: dict[str, Any] = {"name": it["name"], "set": it["set"], "pdl": pdl or "off", "variants": {}}
        try:
            if "graph" in it:
                g, label = vm.Graph.parse(it["graph"]), ""
            else:
                models = it["folder"] == "candidates_models"
                name, batch = (it["case"], "1") if models else it["case"].rsplit("_bs", 1)
                g, _ = case_graph(name, int(batch), models)
                label = name
            ins, ref, sets = rotated_inputs(g, label)
            f = torch_fn(g)
            os.environ["VERIMIRAGE_PDL"] = pdl
            fns: dict[str, Any] = {}
            first = None
            for vname, settings in variants.items():
                saved = {k: getattr(codegen, k) for k in settings}
                try:
                    for k, v in settings.items():
                        setattr(codegen, k, v)
                    fn = vm.compile(vm.MuGraph.parse(it["mugraph"]))
                finally:
                    for k, v in saved.items():
                        setattr(codegen, k, v)
                precompile(fn, *ins, workers=14)
                o = fn(*ins)
                rec = {"err": rel_err(o, ref), "launches": len(fn.steps)}
                outs = o if isinstance(o, tuple) else (o,)
                if first is None:
                    first = [x.clone() for x in outs]
                else:
                    rec["bits_equal_first"] = all(torch.equal(a, b) for a, b in zip(first, outs, strict=True))
                row["variants"][vname] = rec
                fns[vname] = fn
            row["eager_err"] = rel_err(f(*ins), ref)
            for _ in range(rounds):
                for vname, fn in fns.items():
                    row["variants"][vname].setdefault("us_rounds", []).append(bench_sets(fn, sets))
            for rec in row["variants"].values():
                rec["us"] = statistics.median(rec["us_rounds"])
            a, b = (row["variants"][v]["us"] for v in variants)
            row["second_over_first"] = b / a
        except Exception as e:  # report, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            os.environ.pop("VERIMIRAGE_PDL", None)
        row["s"] = round(time.perf_counter() - t0, 1)
        doc["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "variants"}
                         | {v: round(r.get("us", 0), 3) for v, r in row["variants"].items()}), flush=True)
        doc["end_utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        (out / "ab.json").write_text(json.dumps(doc, indent=1))


def main() -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("out", type=Path)
    r = sub.add_parser("run")
    r.add_argument("items", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--rounds", type=int, default=4)
    r.add_argument("--rep-ms", type=int, default=30)
    args = p.parse_args()
    if args.cmd == "prepare":
        its = items()
        args.out.write_text(json.dumps(its, indent=1))
        print(f"{len(its)} items: " + ", ".join(it["name"] for it in its))
        return 0
    run(args.items, args.out, args.rounds, args.rep_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
