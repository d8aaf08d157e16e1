"""The decoder layer's kernels one by one (issue 23): what each stored candidate's kernel is and how it is lowered.

    python benchmarks/perf/layer_kernels.py [--cases decode_bs1 ...] [--measured benchmarks/results/layer.json]

For every kernel of each case's first stored candidate (``benchmarks/candidates/layer/<case>.json``): its grid and
loop length, the launch configuration ``tuning.recommend`` gives it (what ``vm.compile`` launches without profiling),
how its products are lowered (row dots: one-row products as 16-row ``tl.dot``; full ``tl.dot``; degenerate
products as a broadcast multiply and ``tl.sum``, which Triton does not software-pipeline), the cost model's
estimate and bytes, and (``--measured``) the per-kernel device time a GPU run recorded under the kernel's name
(``k<node index>``). CPU only: no GPU, no Triton compile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from verimirage.backend.codegen import _KernelGen  # noqa: E402
from verimirage.backend.tuning import recommend  # noqa: E402
from verimirage.backend.wrap import to_kernels  # noqa: E402
from verimirage.ir.graph import MuGraph, node_list  # noqa: E402
from verimirage.ir.ops import OPS, Prop  # noqa: E402
from verimirage.pipeline.pricing import block_cost  # noqa: E402


def describe(bg: Any, arg_types: list[Any]) -> dict[str, Any]:
    """The lowering facts of one block graph (see the module docstring)."""
    outs = bg.result_types(arg_types)
    cfg = recommend(bg, arg_types)
    kg = _KernelGen(bg, arg_types, outs, "k", cfg.tiles)
    kg.generate()
    degenerate = 0
    for i, n in enumerate(bg.nodes):
        if OPS[n.op].has(Prop.CONTRACTION) and not kg.row_dot_node(bg.nodes, i):
            ta = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
            tb = bg.nodes[n.args[1][0]].outs[n.args[1][1]]
            if not (ta.shape[-2] > 1 and ta.shape[-1] > 1 and tb.shape[-1] > 1):
                degenerate += 1
    kc = block_cost(bg, arg_types, outs)
    return {"grid": list(bg.grid), "frange": bg.frange, "config": cfg.key(), "row_dots": kg.row_dots,
            "full_dots": kg.full_dots, "degenerate_products": degenerate, "est_us": kc.time_s * 1e6,
            "bytes": kc.bytes, "ops": [n.op for n in bg.nodes if n.op not in ("input",)][:12]}


def case_kernels(case: str, cand_dir: Path, measured: dict[str, float] | None) -> list[dict[str, Any]]:
    """One row per kernel of ``case``'s first candidate."""
    doc = json.loads((cand_dir / f"{case}.json").read_text())
    mg = to_kernels(MuGraph.parse(doc["candidates"][0]["mugraph"]))
    nodes = node_list(mg)
    rows = []
    for i, n in enumerate(nodes):
        if n.op != "custom":
            continue
        ats = [nodes[a].outs[k] for a, k in n.args]
        r = {"kernel": f"k{i}", **describe(n.attr("block"), ats)}
        if measured is not None:
            r["measured_us"] = measured.get(f"k{i}")
        rows.append(r)
    return rows


def aot(case: str, cand_dir: Path, names: list[str]) -> list[dict[str, Any]]:
    """Compile ``case``'s kernels (``names``; all when empty) for sm_90 as ``vm.compile`` launches them by default."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    from aot import compile_module

    from verimirage.backend.runtime import write_module
    from verimirage.backend.tuning import tuned_module

    doc = json.loads((cand_dir / f"{case}.json").read_text())
    mg = MuGraph.parse(doc["candidates"][0]["mugraph"])
    ms = tuned_module(mg)
    path = write_module(ms, Path("/tmp/vm_aot_layer"))
    nodes = node_list(ms.mugraph)
    out = []
    for info in ms.kernels:
        if names and info.name not in names:
            continue
        n = nodes[info.node]
        cfg = recommend(n.attr("block"), [nodes[a].outs[k] for a, k in n.args])
        res = compile_module(_Only(ms, info), path, cfg.num_warps, cfg.num_stages)
        out += res
    return out


class _Only:
    """A module source seen as having one kernel (for :func:`aot.compile_module`)."""

    def __init__(self, ms: Any, info: Any) -> None:
        self.mugraph = ms.mugraph
        self.kernels = (info,)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=["decode_bs1", "decode_bs8", "decode_bs32"])
    ap.add_argument("--candidates", type=Path, default=ROOT / "benchmarks" / "candidates" / "layer")
    ap.add_argument("--measured", type=Path, default=None, help="a layer.json with verimirage_kernels_us")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--aot", nargs="*", default=None,
                    help="also compile these kernels (names, or none for all) for sm_90 with their recommended "
                    "configuration (no GPU needed; run without TRITON_INTERPRET) and report shared memory, "
                    "mma.sync / wgmma and cp.async counts")
    args = ap.parse_args()
    meas: dict[str, dict[str, float]] = {}
    if args.measured is not None:
        for row in json.loads(args.measured.read_text())["rows"]:
            meas[row["case"]] = row.get("verimirage_kernels_us") or {}
    out = {}
    for case in args.cases:
        rows = case_kernels(case, args.candidates, meas.get(case) if args.measured else None)
        if args.aot is not None:
            for r in aot(case, args.candidates, args.aot):
                next(x for x in rows if x["kernel"] == r["kernel"]).update(r)
        out[case] = rows
        print(f"== {case}")
        for r in rows:
            m = r.get("measured_us")
            print(f"{r['kernel']:>4} grid {r['grid']!s:12s} it {r['frange']:3d} {r['config']:18s} "
                  f"row {r['row_dots']} dot {r['full_dots']} deg {r['degenerate_products']} "
                  f"est {r['est_us']:7.1f} MB {r['bytes'] / 1e6:7.1f} meas {m if m is None else round(m, 1)} "
                  f"{' '.join(r['ops'])}")
            if "shared" in r:
                print(f"      sm_90: shared {r['shared']} B, mma.sync {r['mma.sync']}, wgmma {r['wgmma']}, "
                      f"cp.async {r['cp.async']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
