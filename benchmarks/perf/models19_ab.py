"""One-call A/B of a code generation change and of re-ordered candidate lists, in one process (nineteenth session).

    PYTHONPATH=$PWD python benchmarks/perf/models19_ab.py prepare OUT.json       # CPU: the items
    python benchmarks/perf/models19_ab.py run IN.json --out DIR                  # GPU: time them

Each item is a program (its source graph) and two μGraphs A and B, compiled by ``vm.compile`` with its default
configuration (``recommend``'s tiles and launch parameters per kernel). ``undo_a``: A's module is B's with the dot
operands' early conversion undone (:func:`undo_early_cast`: ``tl.reshape(vN.to(dt), s)`` back to
``tl.reshape(vN, s).to(dt)``), which ``prepare`` checks is exactly the text the base revision generates (``--base``: a
worktree of it), so one process times main's and the change's kernels side by side. Every variant is checked
against the float64 reference (bench.py's ``torch_fn``) before it is timed; then A and B are timed in turn, twice,
CUDA-graph medians over rotated input sets (bench.py's ``bench_sets``), µs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

_EARLY = re.compile(r"^(\s+[xy]\d+ = )(.*?)(\.to\(tl\.\w+\))(.*)$")


def undo_early_cast(source: str) -> str:
    """``source`` with every dot operand converted before its broadcast and reshape converted after them again."""
    out = []
    for line in source.split("\n"):
        m = _EARLY.match(line)
        if m and m.group(4) and re.match(r"v\d+$", m.group(2).rsplit("(", 1)[-1]):
            line = f"{m.group(1)}{m.group(2)}{m.group(4)}{m.group(3)}"
        out.append(line)
    return "\n".join(out)


def _unversioned(source: str) -> str:
    """A generated module without its generator version (the header's first line)."""
    return re.sub(r"\(codegen \w+\)", "(codegen)", source, count=1)


def _suite_items() -> list[dict[str, Any]]:
    """The committed candidates (suite, models set: the top 6 the harness profiles) whose default module changes."""
    import verimirage as vm
    from verimirage.backend.tuning import tuned_module

    items = []
    for f in sorted((ROOT / "benchmarks" / "candidates").glob("*.json")) + sorted(
            (ROOT / "benchmarks" / "candidates_models").glob("*.json")):
        doc = json.loads(f.read_text())
        for i, c in enumerate(doc["candidates"][:6]):
            mg = vm.MuGraph.parse(c["mugraph"])
            src = tuned_module(mg).source
            if undo_early_cast(src) == src:
                continue
            items.append({"name": f"{f.parent.name}/{f.stem}#{i}", "set": f.parent.name, "case": f.stem,
                          "a": c["mugraph"], "b": c["mugraph"], "undo_a": True, "src_b": src})
    return items


def _first(entry: Any) -> str:
    """A plan entry's first μGraph text."""
    d = entry[0] if isinstance(entry, list) else entry
    return d if isinstance(d, str) else str(d["mugraph"])


def _plan_items(old_plans: list[Path]) -> list[dict[str, Any]]:
    """The capture plans' entries whose first design differs from ``old_plans``' (same files, base revision), and
    the first designs whose default module changes."""
    import verimirage as vm
    from verimirage.backend.tuning import tuned_module

    items = []
    for old_path in old_plans:
        new = json.loads((ROOT / "benchmarks" / "results" / "capture" / old_path.name).read_text())
        old = json.loads(old_path.read_text())
        for g, (graph, designs) in enumerate(new.items()):
            b = _first(designs)
            a = _first(old[graph])
            src = tuned_module(vm.MuGraph.parse(b)).source
            name = f"{old_path.stem}#{g}"
            if a != b:
                items.append({"name": name + " (first design re-sorted)", "graph": graph, "a": a, "b": b,
                              "undo_a": False})
            if undo_early_cast(src) != src:
                items.append({"name": name, "graph": graph, "a": b, "b": b, "undo_a": True, "src_b": src})
    return items


def prepare(out: Path, base: Path, old_plans: list[Path], log_softmax_old: Path | None) -> None:
    """Write the items; check every ``undo_a`` item's A text against the base revision's (``base``)."""
    items = _suite_items() + _plan_items(old_plans)
    if log_softmax_old is not None:  # the models set's default pick before the re-sort
        import verimirage as vm  # noqa: F401

        old = json.loads(log_softmax_old.read_text())["candidates"][0]["mugraph"]
        new = json.loads((ROOT / "benchmarks/candidates_models/log_softmax.json").read_text())["candidates"][0]
        items.append({"name": "candidates_models/log_softmax first (before / after the re-sort)", "set":
                      "candidates_models", "case": "log_softmax", "a": old, "b": new["mugraph"], "undo_a": False})
    want = [it for it in items if it["undo_a"]]
    texts = json.dumps([it["a"] for it in want])
    res = subprocess.run([sys.executable, "-c", _BASE_GEN], input=texts, capture_output=True, text=True,
                         cwd=base, env={"PYTHONPATH": str(base), "PATH": "/usr/bin:/bin"}, check=True)
    for it, src in zip(want, json.loads(res.stdout), strict=True):
        if _unversioned(undo_early_cast(it.pop("src_b"))) != _unversioned(src):
            raise SystemExit(f"{it['name']}: the undone text is not the base revision's")
    for it in items:
        it.pop("src_b", None)
    out.write_text(json.dumps(items, indent=1))
    print(f"{len(items)} items ({len(want)} codegen A/B, checked against {base})")


_BASE_GEN = """
import json, sys
import verimirage as vm
from verimirage.backend.tuning import tuned_module
print(json.dumps([tuned_module(vm.MuGraph.parse(t)).source for t in json.loads(sys.stdin.read())]))
"""


def run(items_path: Path, out: Path) -> None:
    """Time every item's A and B on the GPU (see the module docstring); write ``ab.json``."""
    import bench
    import torch
    from bench import bench_sets, case_graph, rel_err, rotated_inputs, torch_fn

    import verimirage as vm
    from verimirage.backend import tuning
    from verimirage.backend.precompile import precompile

    bench.REP_MS = 100

    items = json.loads(items_path.read_text())
    orig = tuning.tuned_module

    def undone(program: Any, mode: Any = None) -> Any:
        ms = orig(program, mode)
        return dataclasses.replace(ms, source=undo_early_cast(ms.source))

    rows = []
    out.mkdir(parents=True, exist_ok=True)
    for it in items:
        t0 = time.perf_counter()
        row: dict[str, Any] = {"name": it["name"]}
        try:
            if "graph" in it:
                g, label = vm.Graph.parse(it["graph"]), ""
            else:
                models = it["set"] == "candidates_models"
                name, batch = (it["case"], 1) if models else it["case"].rsplit("_bs", 1)
                g, _ = case_graph(name, int(batch), models)
                label = name
            ins, ref, sets = rotated_inputs(g, label)
            f = torch_fn(g)
            fns = {}
            for side in ("a", "b"):
                mg = vm.MuGraph.parse(it[side])
                if side == "a" and it["undo_a"]:
                    tuning.tuned_module = undone
                try:
                    fns[side] = vm.compile(mg)
                finally:
                    tuning.tuned_module = orig
                precompile(fns[side], *ins, workers=14)
                row[f"err_{side}"] = rel_err(fns[side](*ins), ref)
            row["eager_err"] = rel_err(f(*ins), ref)
            ob = fns["b"](*ins)
            row["a_vs_b"] = rel_err(fns["a"](*ins), tuple(x.double() for x in ob) if isinstance(ob, tuple)
                                    else ob.double())
            for side in ("a", "b", "a", "b"):
                row.setdefault(f"us_{side}", []).append(bench_sets(fns[side], sets))
            row["a_us"], row["b_us"] = min(row["us_a"]), min(row["us_b"])
            row["b_over_a"] = row["b_us"] / row["a_us"]
        except Exception as e:  # report, go on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "ab.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                                 "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                                                 "rows": rows}, indent=1))


def main() -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare")
    a.add_argument("out", type=Path)
    a.add_argument("--base", type=Path, required=True)
    a.add_argument("--old-plans", type=Path, nargs="*", default=[])
    a.add_argument("--log-softmax-old", type=Path)
    r = sub.add_parser("run")
    r.add_argument("items", type=Path)
    r.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.cmd == "prepare":
        prepare(args.out, args.base, args.old_plans, args.log_softmax_old)
    else:
        run(args.items, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
