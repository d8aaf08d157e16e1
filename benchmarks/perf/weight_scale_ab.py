"""A/B of the norm-in-the-prologue weight forms on the GPU: the fourteenth session's weight tile scale
(``s = max(1, max |w_i W_ij| / 2**15)`` per loop iteration, ``scale_weight_tiles`` of main at d9baf9a: the weight tile's
rows times ``w / s`` before its ``tl.dot``) against the sixteenth's ``stabilise.prologue_norm_scales`` (the row
statistic before the loop, the operand ``x r w`` as the source rounds it, the weight tile to ``tl.dot`` as loaded),
and, as the floor, the unweighted ``rms_norm(x) @ W``'s best one-kernel lowering (the suite's rmsnorm_linear form).

    python benchmarks/perf/weight_scale_ab.py prepare   # CPU: writes weight_scale_ab.json beside this file
    python benchmarks/perf/weight_scale_ab.py time [--json OUT]   # GPU
    python benchmarks/perf/weight_scale_ab.py repeat --case ffn_gate_bs8 --form bare [--n 20] [--json OUT]   # GPU

``prepare`` lowers ``rms_norm(x, w) @ W`` (fp16, weighted) at the suite's rmsnorm_linear shapes and the decode
layer's gate projection, keeps the cost model's best two one-kernel lowerings in the new form, and writes each
lowering in both forms (the old one from ``git show d9baf9a:verimirage/rewrite/stabilise.py``). ``time`` checks
each against a float64 reference (max abs error / max |ref| <= 2e-2, two fresh input draws), then times it with
``do_bench_cudagraph`` (median of a ``--rep-ms`` graph's replays, µs), the forms alternating, twice each.
``repeat`` runs one form of one case ``--n`` times a seed on ``time``'s inputs (the other forms of the row run before
it each time, as in ``time``), at the module's own stages, at one stage and through Triton's own launcher (not
the program-wide C launcher of the lean path), and records each run's error, its worst
element and whether its output equals the first run's bit for bit: the 07:20 UTC call's bare ffn_gate_bs8 gave
3.9e-2 of float64 and the 07:23 call's 3.7e-4 with the same kernel text and inputs (/work/wt/report_nondet.md of
the sixteenth session; BENCHMARKS.md "norm in the prologue").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
DATA = Path(__file__).resolve().parent / "weight_scale_ab.json"
#: where ``repeat`` runs its programs ("cpu": Triton's interpreter, for a smoke test at a small shape)
DEVICE = "cuda"

#: (name, rows, k, n): rmsnorm_linear's bs1 / bs8 shapes, the decode layer's gate projection at bs1 and bs8
SHAPES = (("rmsnorm_linear_bs1", 2, 4096, 6144), ("rmsnorm_linear_bs8", 16, 4096, 6144),
          ("ffn_gate_bs1", 1, 4096, 14336), ("ffn_gate_bs8", 8, 4096, 14336))


def _graph(rows: int, k: int, n: int):  # type: ignore[no-untyped-def]
    import verimirage as vm

    h = vm.float16
    g = vm.Graph()
    g.output(g.matmul(g.rms_norm(g.input("X", (rows, k), h), g.input("G", (k,), h), eps=1e-5),
                      g.input("W", (k, n), h)))
    return g


def _bare(rows: int, k: int, n: int, expanded: bool = False):  # type: ignore[no-untyped-def]
    """The unweighted ``rms_norm(x) @ W``; ``expanded``: as the e-graph writes it for its one-kernel lowering,
    ``(x @ W) * rsqrt(sum(x**2) / k + eps)`` (rms-norm-expand, matmul-rowscale)."""
    import verimirage as vm

    h = vm.float16
    g = vm.Graph()
    x, w = g.input("X", (rows, k), h), g.input("W", (k, n), h)
    if expanded:
        g.output(g.mul(g.matmul(x, w), g.rsqrt(g.shift(g.scale(g.sum(g.square(x), axis=1), 1.0 / k), 1e-5))))
    else:
        g.output(g.matmul(g.rms_norm(x, eps=1e-5), w))
    return g


def prepare() -> None:
    import verimirage.rewrite.partition as P
    import verimirage.rewrite.stabilise as st
    from verimirage.pipeline import pricing

    src = subprocess.run(["git", "show", "d9baf9a:verimirage/rewrite/stabilise.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "old_stabilise.py"
        p.write_text(src)
        spec = importlib.util.spec_from_file_location("verimirage.rewrite._old_stabilise", p)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    rows_out = []
    for name, rows, k, n in SHAPES:
        g = _graph(rows, k, n)
        gn = st.norm_into_projections(g)
        assert gn is not None
        keep = P._norm_operands
        P._norm_operands = lambda low: low  # (the raw lowerings: both forms are made from each)
        try:
            raw = [low for low in P.lower_all(gn, rank=pricing.cost)[0] if low.mugraph.num_kernels == 1]
        finally:
            P._norm_operands = keep
        pairs = []
        for low in raw:
            try:
                new = st.prologue_norm_scales(low.mugraph)
            except ValueError:
                continue
            was = old.scale_weight_tiles(low.mugraph)
            if new is not None and was is not None:
                pairs.append((pricing.cost(new), new, was))
        pairs.sort(key=lambda p: p[0])  # (feasible first, then by time)
        bare = min((low.mugraph for low in P.lower_all(_bare(rows, k, n, expanded=True), rank=pricing.cost)[0]
                    if low.mugraph.num_kernels == 1 and "frange=1," not in str(low.mugraph)),
                   key=pricing.cost)  # (with a loop: a one-step form of these tiles needs 655 KB of smem)
        for rank, (c, new, was) in enumerate(pairs[:2]):
            rows_out.append({"case": name, "shape": [rows, k, n], "rank": rank, "new": str(new), "old": str(was),
                             "bare": str(bare), "cost_us": c.time_s * 1e6,
                             "cost_old_us": pricing.cost(was).time_s * 1e6,
                             "cost_bare_us": pricing.cost(bare).time_s * 1e6})
            print(f"{name} rank {rank}: cost new {rows_out[-1]['cost_us']:.1f} old {rows_out[-1]['cost_old_us']:.1f}"
                  f" bare {rows_out[-1]['cost_bare_us']:.1f}")
    DATA.write_text(json.dumps(rows_out, indent=1))


def _inputs(shape: list[int], seed: int):  # type: ignore[no-untyped-def]
    """``time``'s float64 inputs (fp16 values) of seed ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ins = {"X": rng.uniform(-1, 1, (shape[0], shape[1])), "G": rng.uniform(0.5, 1.5, shape[1]),
           "W": rng.uniform(-0.05, 0.05, (shape[1], shape[2]))}
    return {k_: v.astype(np.float16).astype(np.float64) for k_, v in ins.items()}


def repeat(out: Path | None, case: str, form: str, n: int, rank: int) -> None:
    """Run ``form`` of ``case`` ``n`` times a seed (each run after the row's other forms), at the module's stages and
    at one stage; record each run's error against float64, its worst element and whether it equals the first run's
    output bit for bit (see the module's docstring)."""
    import datetime

    import numpy as np
    import torch

    import verimirage as vm
    from verimirage.backend.codegen import LaunchConfig

    r = next(r for r in json.loads(DATA.read_text()) if r["case"] == case and r["rank"] == rank)
    shape = r["shape"]
    forms = ("old", "new", "bare")
    fns = {f: vm.compile(vm.MuGraph.parse(r[f])) for f in forms}
    own = fns[form]
    one = {k.name: LaunchConfig(num_warps=own.launch[k.name]["num_warps"], num_stages=1) for k in own.kernels}
    # (a program of its own for the Triton-launcher variant: its lean plan, made on its first call, then reads
    # VERIMIRAGE_LAUNCHER; the others launch through the program-wide C launcher)
    variants = {"own": own, "stages1": vm.compile(vm.MuGraph.parse(r[form]), per_kernel=one),
                "triton_launcher": vm.compile(vm.MuGraph.parse(r[form]))}
    names = {f: tuple(fns[f].input_names) for f in forms}
    dev = torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE
    res: dict[str, Any] = {"case": case, "form": form, "shape": shape, "device": dev,
                           "launch": {v: fn.launch for v, fn in variants.items()}, "runs": []}
    launcher = os.environ.get("VERIMIRAGE_LAUNCHER")
    for seed in (1, 2):
        ins = _inputs(shape, seed)
        host = {k_: torch.tensor(v, dtype=torch.float16) for k_, v in ins.items()}  # (copied afresh each run)
        want = vm.evaluate(_bare(*shape) if form == "bare" else _graph(*shape), {k_: ins[k_] for k_ in names[form]})[0]
        for variant, fn in variants.items():
            first = None
            os.environ["VERIMIRAGE_LAUNCHER"] = "triton" if variant == "triton_launcher" else "c"
            for i in range(n):
                for f in forms:  # (the row's order in ``time``: each form on fresh device tensors, ``form`` last)
                    if f != form:
                        fns[f](*[host[k_].to(DEVICE, copy=True) for k_ in names[f]])
                got = fn(*[host[k_].to(DEVICE, copy=True) for k_ in names[form]])
                g64 = got.double().cpu().numpy()
                first = g64 if first is None else first
                d = np.abs(g64 - want)
                at = np.unravel_index(int(np.argmax(d)), d.shape)
                res["runs"].append({"seed": seed, "variant": variant, "i": i,
                                    "err": float(d.max() / np.abs(want).max()),
                                    "worst": [int(x) for x in at], "got": float(g64[at]), "want": float(want[at]),
                                    "differs_from_first": int(np.count_nonzero(g64 != first)),
                                    "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")})
                print(json.dumps(res["runs"][-1]), flush=True)
                if out is not None:
                    out.write_text(json.dumps(res, indent=1))
    if launcher is None:
        os.environ.pop("VERIMIRAGE_LAUNCHER", None)
    else:
        os.environ["VERIMIRAGE_LAUNCHER"] = launcher


def time_all(out: Path | None, max_rank: int, rep_ms: int) -> None:
    import datetime

    import numpy as np
    import torch
    from triton.testing import do_bench_cudagraph

    import verimirage as vm

    rows = json.loads(DATA.read_text())
    dev = torch.cuda.get_device_name(0)
    res = []
    for r in rows:
        g = _graph(*r["shape"])
        if r["rank"] > max_rank:
            continue
        forms = ("old", "new", "bare")
        fns = {f: vm.compile(vm.MuGraph.parse(r[f])) for f in forms}
        errs = {f: 0.0 for f in forms}
        seed_errs: dict[str, list[float]] = {f: [] for f in forms}
        for seed in (1, 2):
            ins = _inputs(r["shape"], seed)
            for f, fn in fns.items():
                names = ("X", "W") if f == "bare" else ("X", "G", "W")
                want = vm.evaluate(_bare(*r["shape"]) if f == "bare" else g, {k_: ins[k_] for k_ in names})[0]
                dev_ins = [torch.tensor(ins[k_], dtype=torch.float16, device="cuda") for k_ in names]
                got64 = fn(*dev_ins).double().cpu().numpy()
                seed_errs[f].append(float(np.abs(got64 - want).max() / np.abs(want).max()))
                errs[f] = max(errs[f], seed_errs[f][-1])
        targs = [torch.randn(r["shape"][0], r["shape"][1], device="cuda", dtype=torch.float16),
                 torch.rand(r["shape"][1], device="cuda", dtype=torch.float16) + 0.5,
                 torch.randn(r["shape"][1], r["shape"][2], device="cuda", dtype=torch.float16) * 0.05]
        times: dict[str, list[float]] = {f: [] for f in forms}
        for _ in range(2):
            for f in forms:
                a = [targs[0], targs[2]] if f == "bare" else targs
                times[f].append(1e3 * float(do_bench_cudagraph(lambda fn=fns[f], a=a: fn(*a), rep=rep_ms,
                                                               return_mode="median")))
        row = {**{k_: r[k_] for k_ in ("case", "shape", "rank", "cost_us", "cost_old_us", "cost_bare_us")},
               "err": errs, "err_seeds": seed_errs,
               "old_us": times["old"], "new_us": times["new"], "bare_us": times["bare"], "device": dev,
               "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        res.append(row)
        if out is not None:
            out.write_text(json.dumps(res, indent=1))
        ok = all(e <= 2e-2 for e in errs.values())
        print(f"{r['case']:20s} rank {r['rank']} old {times['old'][0]:7.2f} {times['old'][1]:7.2f}  new "
              f"{times['new'][0]:7.2f} {times['new'][1]:7.2f}  bare {times['bare'][0]:7.2f} {times['bare'][1]:7.2f}"
              f" us  err old {errs['old']:.1e} new {errs['new']:.1e} bare {errs['bare']:.1e}"
              f"{'' if ok else '  WRONG'}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["prepare", "time", "repeat"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--max-rank", type=int, default=1, help="time: the lowerings of cost rank up to this (0: best)")
    ap.add_argument("--rep-ms", type=int, default=100, help="time: do_bench_cudagraph's window")
    ap.add_argument("--case", default="ffn_gate_bs8", help="repeat: the row's case")
    ap.add_argument("--form", default="bare", choices=["old", "new", "bare"], help="repeat: the form run again")
    ap.add_argument("--rank", type=int, default=0, help="repeat: the row's rank")
    ap.add_argument("--n", type=int, default=20, help="repeat: runs a seed and variant")
    a = ap.parse_args()
    if a.mode == "prepare":
        prepare()
    elif a.mode == "repeat":
        repeat(a.json, a.case, a.form, a.n, a.rank)
    else:
        time_all(a.json, a.max_rank, a.rep_ms)


if __name__ == "__main__":
    main()
