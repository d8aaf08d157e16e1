"""The decode layer's attention as one region (issue 23): its split-KV (flash-decoding) lowerings against the four
kernels the region split gave it, timed on their own.

    python benchmarks/perf/attn_split_ab.py prepare [--case decode_bs1]   # CPU: the variants' μGraphs (egglog host)
    python benchmarks/perf/attn_split_ab.py gpu [--out DIR]                # GPU: each one CUDA graph, median µs

``prepare`` lowers the layer's attention (graph nodes 39..58: Q K^T, the max joined with the new token's score,
the shifted exps, P @ V with the new token's term, the sums, the division) with :func:`partition.lower_all`, keeps
the cheapest split-KV form of each (grid, loop, splits) shape named in :data:`SHAPES`, and the composition of the
three regions' μGraphs of the certificate the layer's earlier candidate had (``attn4``: Q K^T, the softmax, P @ V and
its combine), each checked to compute the region (``vm.evaluate`` in float64); it writes them to
``attn_split_ab_in.json`` beside this file. ``gpu`` times each as one CUDA-graph replay (median) and each kernel by
the profiler, its error against the ``attn4`` form's output."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
HERE = Path(__file__).resolve().parent
IN = HERE / "attn_split_ab_in.json"
NODES = list(range(39, 59))
#: (grid labels and parts, loop steps, splits, combine in one tile): the split-KV shapes timed (labels: 0 the KV
#: heads, 11 the query heads of a group); the first is the layer's candidate of 07:26
SHAPES = [(((0, 8),), 1, 32, False), (((0, 8),), 1, 32, True), (((0, 8),), 4, 32, True), (((0, 8),), 1, 16, True),
          (((0, 8),), 8, 16, True), (((0, 8), (11, 2)), 4, 16, True), (((0, 8), (11, 2)), 8, 32, True),
          (((0, 8), (11, 2)), 1, 32, True), (((0, 8),), 16, 8, True)]


def prepare(case: str) -> None:
    """Write the variants (see the module docstring)."""
    import numpy as np

    import verimirage as vm
    from verimirage.benchmarks.layer import get_layer
    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline import pricing
    from verimirage.rewrite import partition as P
    from verimirage.smt.certify import read_certificate
    from verimirage.smt.glue import compose, region_of

    g = get_layer(case, False)
    reg = region_of(g, NODES).graph
    lows, _ = P.lower_all(reg, rank=pricing.cost)
    out: list[dict[str, Any]] = []
    for grid, fr, sp, whole in SHAPES:
        got = [lo for lo in lows if lo.config is not None and lo.config.grid == grid and lo.config.frange == fr
               and lo.config.splits == sp and lo.config.combine_whole == whole and "partition.cut" not in lo.steps]
        if got:
            lo = min(got, key=lambda lo: pricing.cost(lo.mugraph).time_s)
            out.append({"name": f"g{'x'.join(str(p) for _, p in grid)}_f{fr}_s{sp}{'_w' if whole else ''}",
                        "mugraph": str(lo.mugraph),
                        "cost_us": pricing.cost(lo.mugraph).time_s * 1e6})
    cert = read_certificate((ROOT / "benchmarks" / "candidates" / "layer" / "proofs" /
                             f"layer_{case}_attn4.json").read_text())
    ops = [i for i, n in enumerate(reg.nodes) if n.op != "input"]  # the region's ops, in the layer's order
    at = dict(zip(NODES, ops, strict=True))
    regs, mgs = [], []
    for r in cert.regions:
        if set(r["nodes"]) <= set(NODES):
            sub = cert.certificates[r["certificate"]]
            rg = region_of(reg, [at[i] for i in r["nodes"]])
            assert str(rg.graph) == sub["graph_text"], "the old region is not the same program"
            regs.append(rg)
            mgs.append(MuGraph.parse(sub["mugraph_text"]))
    old = compose(reg, regs, mgs)
    out.insert(0, {"name": "attn4", "mugraph": str(old), "cost_us": pricing.cost(old).time_s * 1e6})
    rng = np.random.default_rng(0)
    xs = {t.name: rng.uniform(-1, 1, t.shape) for t in reg.inputs}
    want = vm.evaluate(reg, xs)
    for v in out:
        got = vm.evaluate(MuGraph.parse(v["mugraph"]), xs)
        assert all(np.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(got, want, strict=True)), v["name"]
    IN.write_text(json.dumps({"case": case, "graph": str(reg), "variants": out}, indent=1))
    for v in out:
        print(f"{v['name']:20s} {MuGraph.parse(v['mugraph']).num_kernels} kernels  {v['cost_us']:.2f} us est.")


def gpu(out_dir: Path, deadline_s: float) -> None:
    """Time the variants (see the module docstring); results to ``out_dir/attn_split_ab.json`` after each."""
    import layer as harness
    import torch

    import verimirage as vm

    t0 = time.time()
    doc = json.loads(IN.read_text())
    g = vm.Graph.parse(doc["graph"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    ins = [(torch.rand(t.shape, generator=gen, device="cuda", dtype=torch.float32) * 2 - 1).half() for t in g.inputs]
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                         time.gmtime()),
                           "case": doc["case"], "rows": []}
    ref = None
    out_dir.mkdir(parents=True, exist_ok=True)
    for v in doc["variants"]:
        if time.time() - t0 > deadline_s:
            res["stopped"] = f"deadline after {len(res['rows'])} variants"
            break
        mg = vm.MuGraph.parse(v["mugraph"])
        row: dict[str, Any] = {"name": v["name"], "kernels": mg.num_kernels, "cost_us": v["cost_us"]}
        try:
            fn = vm.compile(mg, cuda_graph=True)
            harness._precompile(fn, ins)
            o = fn(*ins)
            o = (o if isinstance(o, tuple) else (o,))[0].float().clone()
            ref = o if ref is None else ref
            row["err"] = float((o - ref).norm() / ref.norm())
            row["us"] = harness._bench(lambda fn=fn: fn(*(fn.static_inputs or ins)), cudagraph=False)
            per: dict[str, float] = {}
            plain = vm.compile(mg)
            harness._kernels(lambda plain=plain: plain(*ins), per)
            row["kernels_us"] = per
        except Exception as e:  # (a variant that fails to compile or run is recorded, not fatal)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        res["rows"].append(row)
        print(row, flush=True)
        (out_dir / "attn_split_ab.json").write_text(json.dumps(res, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["prepare", "gpu"])
    ap.add_argument("--case", default="decode_bs1")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--deadline-s", type=float, default=60.0)
    a = ap.parse_args()
    if a.mode == "prepare":
        prepare(a.case)
    else:
        gpu(a.out, a.deadline_s)


if __name__ == "__main__":
    main()
