"""GPU probe of the models set's memory- and launch-bound programs (issue 22, membound): which tiles and launch
configurations the vocabulary programs, batchnorm_relu and qkv_bias want.

    python benchmarks/perf/membound_probe.py --build          # here (CPU): write the variants file
    python benchmarks/perf/membound_probe.py --out DIR        # on the GPU: check and time every variant
    python benchmarks/perf/membound_probe.py --out DIR --programs batchnorm_relu qkv_bias log_softmax logsumexp

``--build`` collects, per program, the μGraphs worth timing: the stored (verified) candidates of
``benchmarks/candidates_models`` and, as measurement probes only (not verified), further lowerings of the
search's own partitioner (``partition.lower_all``: column splits of cross_entropy up to 128, whole-row
batchnorm tiles from ``bn_rows_ab.variant``). Each (μGraph, launch configuration) is compiled (in a process pool
first, to fill Triton's cache), checked against a float64 reference of the program on fresh random inputs
(relative error <= 2e-2, every output element written: outputs are poisoned with NaN first), then timed with
``do_bench_cudagraph`` (median µs), next to eager PyTorch in the same process and the cost of one tiny kernel
replayed in a CUDA graph (the launch floor). Results: ``DIR/membound_probe.json`` and a table printed last.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))

VARIANTS = Path(__file__).resolve().parent / "membound_probe_in.json"
log = logging.getLogger("membound_probe")

#: (warps, stages, unroll_max) swept for matmul-free kernels
REDUCE_CFGS = [(4, 1, 16), (8, 1, 16), (16, 1, 16), (32, 1, 16)]


def build() -> None:
    import verimirage as vm
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import hoist_row_constants

    out: list[dict[str, Any]] = []

    def add(prog: str, label: str, mg: Any, cfgs: list[tuple[int, int, int]]) -> None:
        out.append({"program": prog, "label": label, "mugraph": str(mg), "est_us": cost(mg).time_s * 1e6,
                    "configs": cfgs})

    cdir = ROOT / "benchmarks" / "candidates_models"
    for prog in ("cross_entropy", "logsumexp", "log_softmax", "cross_entropy_prefill", "logsumexp_prefill",
                 "log_softmax_prefill"):
        f = cdir / f"{prog}.json"
        if not f.exists():  # (not searched yet: the partitioner's four best-estimated lowerings, unverified)
            gp = vm.benchmarks.get_model(prog)
            gp = (hoist_row_constants(gp) or gp) if prog.startswith("cross") else gp
            lows = sorted(lower_all(gp, cuts=False, rank=cost)[0],
                          key=lambda lo: cost(lo.mugraph).time_s)
            for i, lo in enumerate([lo for lo in lows if not cost(lo.mugraph).infeasible][:4]):
                add(prog, f"low{i}", lo.mugraph, REDUCE_CFGS)
            continue
        seen: set[str] = set()
        for i, c in enumerate(json.loads(f.read_text())["candidates"][:5]):
            if c["mugraph"] in seen:
                continue
            seen.add(c["mugraph"])
            add(prog, f"cand{i}", vm.MuGraph.parse(c["mugraph"]), REDUCE_CFGS)
    # cross_entropy's earlier first candidate (16 blocks of whole rows, 2 kernels), as committed before the cut
    import subprocess

    old = subprocess.run(["git", "show", "8ca993b:benchmarks/candidates_models/cross_entropy.json"], cwd=ROOT,
                         capture_output=True, text=True)
    if old.returncode == 0:
        add("cross_entropy", "rows16", vm.MuGraph.parse(json.loads(old.stdout)["candidates"][0]["mugraph"]),
            REDUCE_CFGS)
    # the cross-entropies cut at the per-token loss (partition._reduced_reductions): rows over blocks
    for prog in ("cross_entropy", "cross_entropy_prefill"):
        gp = vm.benchmarks.get_model(prog)
        for tag, g2 in (("cut", gp), ("hcut", hoist_row_constants(gp))):
            lows = [lo for lo in lower_all(g2, rank=cost)[0]
                    if "partition.cut" in lo.steps and not cost(lo.mugraph).infeasible]
            lows.sort(key=lambda lo: cost(lo.mugraph).time_s)
            for i, lo in enumerate(lows[:3 if tag == "hcut" else 1]):
                add(prog, f"{tag}{i}", lo.mugraph, [(4, 1, 16), (8, 1, 16), (16, 1, 16), (32, 1, 16)])
    # cross_entropy's column splits: more blocks, the combine's loop unrolled or not
    g = hoist_row_constants(vm.benchmarks.get_model("cross_entropy"))
    assert g is not None
    lows, _ = lower_all(g, max_splits=128, cuts=False, rank=cost)
    for lo in lows:
        s = str(lo.mugraph)
        for splits, tile in ((32, 1000), (64, 500), (128, 250)):
            if f"frange=1, grid=(1, {splits})" in s and f"f16[16,{tile}]" in s:
                add("cross_entropy", f"split{splits}", lo.mugraph, [(4, 1, 16), (4, 1, 128), (8, 1, 128)])
    # batchnorm_relu: the stored first candidate and whole-row tiles
    from bn_rows_ab import HW, variant

    bn = json.loads((cdir / "batchnorm_relu.json").read_text())["candidates"]
    add("batchnorm_relu", "cand0 32x8x64", vm.MuGraph.parse(bn[0]["mugraph"]), [(4, 1, 16), (8, 1, 16), (16, 1, 16)])
    for nb, cb, wb in ((1, 8, HW), (1, 4, HW), (1, 2, HW), (1, 1, HW), (32, 4, 64), (32, 16, 64), (2, 8, HW)):
        add("batchnorm_relu", f"tile {nb}x{cb}x{wb}", vm.MuGraph.parse(variant(nb, cb, wb)),
            [(4, 1, 16), (8, 1, 16), (16, 1, 16)])
    # qkv_bias: the stored first two candidates at deeper pipelines
    qk = json.loads((cdir / "qkv_bias.json").read_text())["candidates"]
    for i in (0,):
        add("qkv_bias", f"cand{i}", vm.MuGraph.parse(qk[i]["mugraph"]),
            [(4, 3, 16), (4, 4, 16), (4, 5, 16), (4, 6, 16), (8, 4, 16), (8, 6, 16)])
    uniq: dict[str, dict[str, Any]] = {}
    for e in out:
        uniq.setdefault(e["mugraph"], e)
    out = list(uniq.values())
    best: dict[str, float] = {}
    for e in out:
        best[e["program"]] = min(best.get(e["program"], float("inf")), e["est_us"])
    out = [e for e in out if e["est_us"] <= 3 * best[e["program"]]]  # (not the 7- and 10-kernel log-softmaxes)
    order = ["cross_entropy", "batchnorm_relu", "logsumexp", "log_softmax", "cross_entropy_prefill",
             "logsumexp_prefill", "log_softmax_prefill", "qkv_bias"]
    out.sort(key=lambda e: order.index(e["program"]))  # (stable: the most telling first, if the call is cut short)
    VARIANTS.write_text(json.dumps(out, indent=1))
    for e in out:
        print(f"{e['program']:22s} {e['label']:18s} est {e['est_us']:8.2f} us  x{len(e['configs'])} configs")


def _config(w: int, s: int, u: int) -> Any:
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    return LaunchConfig(w, s, TileOptions(dot_min_m=16, unroll_max=u))


def _inputs(g: Any, name: str, seed: int) -> list[Any]:
    from bench import make_inputs

    return make_inputs(g, name, seed)


def _warm(job: tuple[str, str, list[tuple[int, int, int]]]) -> int:
    """Compile and run once each configuration of one variant (fills Triton's disk cache)."""
    import torch

    import verimirage as vm

    prog, mgtext, cfgs = job
    g = vm.benchmarks.get_model(prog)
    ins = _inputs(g, prog, 0)
    n = 0
    for c in cfgs:
        try:
            vm.compile(vm.MuGraph.parse(mgtext), config=_config(*c))(*ins)
            torch.cuda.synchronize()
            n += 1
        except Exception:
            pass
    return n


def run(out_dir: Path, workers: int, programs: list[str] | None = None) -> None:
    import multiprocessing as mp

    import torch
    from bench import bench, launch_overhead, rel_err, torch_fn
    from triton.testing import do_bench_cudagraph

    import verimirage as vm

    variants = [v for v in json.loads(VARIANTS.read_text()) if programs is None or v["program"] in programs]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        done = sum(pool.map(_warm, [(v["program"], v["mugraph"], v["configs"]) for v in variants], chunksize=1))
    log.info("prewarm: %d kernels in %.1f s", done, time.perf_counter() - t0)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rows": [], "baselines": {}}
    doc["launch_us"] = launch_overhead()
    import triton
    import triton.language as tl

    @triton.jit
    def _empty(p):
        pass

    z = torch.zeros(1, device="cuda")
    doc["empty_kernel_us"] = 1e3 * float(do_bench_cudagraph(lambda: _empty[(1,)](z), rep=200, return_mode="median"))
    _ = tl
    cache: dict[str, Any] = {}
    for v in variants:
        prog = v["program"]
        if prog not in cache:
            g = vm.benchmarks.get_model(prog)
            ins = _inputs(g, prog, 1)
            f = torch_fn(g)
            ref = f(*[x.double() for x in ins])
            fresh = _inputs(g, prog, 7)
            cache[prog] = (g, ins, ref, fresh, f(*[x.double() for x in fresh]))
            doc["baselines"][prog] = {"eager_us": bench(lambda f=f, ins=ins: f(*ins), cudagraph=True)}
        g, ins, ref, fresh, want = cache[prog]
        mg = vm.MuGraph.parse(v["mugraph"])
        for c in v["configs"]:
            row = {"program": prog, "label": v["label"], "config": c, "est_us": v["est_us"]}
            try:
                fn = vm.compile(mg, config=_config(*c))
                row["err"] = rel_err(fn(*fresh), want)
                row["err_seed1"] = rel_err(fn(*ins), ref)
                if max(row["err"], row["err_seed1"]) < 2e-2:
                    row["us"] = bench(lambda fn=fn, ins=ins: fn(*ins), cudagraph=True)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            doc["rows"].append(row)
            log.info("%s", row)
        (out_dir / "membound_probe.json").write_text(json.dumps(doc, indent=1))
    print(f"launch floor: tiny add {doc['launch_us']:.2f} us, empty kernel {doc['empty_kernel_us']:.2f} us")
    for prog, b in doc["baselines"].items():
        print(f"{prog:22s} eager {b['eager_us']:.2f}")
    for r in doc["rows"]:
        us = r.get("us")
        print(f"{r['program']:22s} {r['label']:18s} w{r['config'][0]} s{r['config'][1]} u{r['config'][2]:<4d}"
              f" {'-' if us is None else f'{us:8.2f}'} est {r['est_us']:7.2f} {r.get('error', '')[:60]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--programs", nargs="*", default=None,
                    help="only these programs' variants (run 15 spent most of its 185 s compiling all 124 first)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.build:
        build()
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        run(a.out, a.workers, a.programs)


if __name__ == "__main__":
    main()
