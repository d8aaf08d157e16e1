"""Skinny GEMMs at decode shapes on this GPU: what kernel form streams the weights at the copy bandwidth (issue 23).

    python benchmarks/perf/gemv_probe.py --out DIR [--budget-s 480] [--cases decode_bs1 decode_bs8]

One call, in this order (results written to ``DIR/gemv_probe.json`` after every step, a table last):

1. the copy bandwidth (a 1 GiB device-to-device copy, bytes read + written);
2. per-kernel device times (torch profiler, medians over 10 calls) of the decoder layer's stored decode
   candidates (``benchmarks/candidates/layer/<case>.json``, as ``vm.compile`` launches them);
3. ``torch.mm`` (cuBLAS) at the layer's projection shapes;
4. hand-written Triton variants, every one checked against float64 before it is timed:

   * ``fma2d`` (1 row): a ``(BK, BN)`` fp32 accumulator of ``x[:, None] * w`` over the K loop, one
     ``tl.sum`` over K at the end (no cross-thread reduction inside the loop);
   * ``cur3d`` (1 row): what ``backend/codegen.py`` emits today for a 1-row product, ``tl.sum(x[:, :, None] *
     w[None], axis=1)`` every iteration;
   * ``dot16``: ``tl.dot`` with the rows padded to 16, pipelined (``num_stages``);

   each over a split-K factor S (S > 1: fp32 partials and a combine kernel, both in the timed graph), column
   tile BN, K tile BK and warps. Two-weight shapes (gate/up) carry both products and the SiLU-gated product
   as the epilogue (in the combine kernel when split).

Weights are rotated over enough copies that every replay reads them from device memory (>= 300 MB a graph);
times are medians of 7 timed replays of a CUDA graph of those launches, per launch set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


@triton.jit
def _fma2d(x_ptr, w_ptr, w2_ptr, o_ptr, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, BN: tl.constexpr,
           BK: tl.constexpr, TWO: tl.constexpr, DIRECT: tl.constexpr, STATIC: tl.constexpr):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BK, BN), tl.float32)
    acc2 = tl.zeros((BK, BN), tl.float32)
    if STATIC:
        for it in tl.static_range(0, KS // BK):
            rk = ps * KS + it * BK + tl.arange(0, BK)
            x = tl.load(x_ptr + rk).to(tl.float32)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
            acc += x[:, None] * w
            if TWO:
                w2 = tl.load(w2_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
                acc2 += x[:, None] * w2
    else:
        for it in range(0, KS // BK):
            rk = ps * KS + it * BK + tl.arange(0, BK)
            x = tl.load(x_ptr + rk).to(tl.float32)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
            acc += x[:, None] * w
            if TWO:
                w2 = tl.load(w2_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
                acc2 += x[:, None] * w2
    y = tl.sum(acc, axis=0)
    if DIRECT:
        if TWO:
            y2 = tl.sum(acc2, axis=0)
            y = y * tl.sigmoid(y) * y2
        tl.store(o_ptr + rn, y.to(tl.float16))
    else:
        tl.store(o_ptr + ps * N + rn, y)
        if TWO:
            y2 = tl.sum(acc2, axis=0)
            tl.store(o_ptr + (ps + tl.num_programs(1)) * N + rn, y2)


@triton.jit
def _cur3d(x_ptr, w_ptr, w2_ptr, o_ptr, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, BN: tl.constexpr,
           BK: tl.constexpr, TWO: tl.constexpr, DIRECT: tl.constexpr, STATIC: tl.constexpr):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((1, BN), tl.float32)
    acc2 = tl.zeros((1, BN), tl.float32)
    if STATIC:
        for it in tl.static_range(0, KS // BK):
            rk = ps * KS + it * BK + tl.arange(0, BK)
            x = tl.load(x_ptr + rk[None, :]).to(tl.float32)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
            acc = tl.sum(x[:, :, None] * w[None, :, :], axis=1) + acc
            if TWO:
                w2 = tl.load(w2_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
                acc2 = tl.sum(x[:, :, None] * w2[None, :, :], axis=1) + acc2
    else:
        for it in range(0, KS // BK):
            rk = ps * KS + it * BK + tl.arange(0, BK)
            x = tl.load(x_ptr + rk[None, :]).to(tl.float32)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
            acc = tl.sum(x[:, :, None] * w[None, :, :], axis=1) + acc
            if TWO:
                w2 = tl.load(w2_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
                acc2 = tl.sum(x[:, :, None] * w2[None, :, :], axis=1) + acc2
    if DIRECT:
        if TWO:
            acc = acc * tl.sigmoid(acc) * acc2
        tl.store(o_ptr + rn[None, :], acc.to(tl.float16))
    else:
        tl.store(o_ptr + ps * N + rn[None, :], acc)
        if TWO:
            tl.store(o_ptr + (ps + tl.num_programs(1)) * N + rn[None, :], acc2)


@triton.jit
def _dot16(x_ptr, w_ptr, w2_ptr, o_ptr, M, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, BM: tl.constexpr,
           BN: tl.constexpr, BK: tl.constexpr, TWO: tl.constexpr, DIRECT: tl.constexpr):
    pn = tl.program_id(0)
    ps = tl.program_id(1)
    rm = tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    acc2 = tl.zeros((BM, BN), tl.float32)
    for it in range(0, KS // BK):
        rk = ps * KS + it * BK + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
        w = tl.load(w_ptr + rk[:, None] * N + rn[None, :])
        acc = tl.dot(x, w, acc)
        if TWO:
            w2 = tl.load(w2_ptr + rk[:, None] * N + rn[None, :])
            acc2 = tl.dot(x, w2, acc2)
    mk = rm[:, None] < M
    if DIRECT:
        if TWO:
            acc = acc * tl.sigmoid(acc) * acc2
        tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=mk)
    else:
        tl.store(o_ptr + (ps * M + rm[:, None]) * N + rn[None, :], acc, mask=mk)
        if TWO:
            tl.store(o_ptr + ((ps + tl.num_programs(1)) * M + rm[:, None]) * N + rn[None, :], acc2, mask=mk)


@triton.jit
def _combine(p_ptr, o_ptr, M, N: tl.constexpr, S: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr,
             TWO: tl.constexpr):
    pn = tl.program_id(0)
    rm = tl.arange(0, BM)
    rn = pn * BC + tl.arange(0, BC)
    mk = rm[:, None] < M
    acc = tl.zeros((BM, BC), tl.float32)
    acc2 = tl.zeros((BM, BC), tl.float32)
    for s in tl.static_range(0, S):
        acc += tl.load(p_ptr + (s * M + rm[:, None]) * N + rn[None, :], mask=mk, other=0.0)
        if TWO:
            acc2 += tl.load(p_ptr + ((s + S) * M + rm[:, None]) * N + rn[None, :], mask=mk, other=0.0)
    if TWO:
        acc = acc * tl.sigmoid(acc) * acc2
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=mk)


def _graph_time(fns: list[Any], reps: int = 7, inner: int = 5) -> float:
    """Median µs of one pass over ``fns`` (a list of launch closures), as CUDA-graph replays."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            for f in fns:
                f()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(ts)


def copy_bw() -> float:
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    us = _graph_time([lambda: b.copy_(a)], inner=3)
    return 2 * n / (us * 1e-6)


def candidate_kernels(case: str) -> dict[str, Any]:
    """Per-kernel device times of the stored candidate of ``case`` (profiler medians over 10 calls)."""
    from torch.profiler import ProfilerActivity, profile

    import verimirage as vm
    from verimirage.benchmarks.layer_module import make_case

    d = json.loads((ROOT / "benchmarks/candidates/layer" / f"{case}.json").read_text())
    mg = vm.MuGraph.parse(d["candidates"][0]["mugraph"])
    c = make_case(case, small=False, dtype=torch.float16, device="cuda", seed=0)
    g, gins = c["graph"], c["graph_inputs"]
    ordered = [gins[t.name] for t in g.inputs]
    fn = vm.compile(mg)
    for _ in range(3):
        fn(*ordered)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn(*ordered)
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")):
            per.setdefault(e.name, []).append(e.device_time)
    rows = {k: statistics.median(v) for k, v in per.items()}
    gfn = vm.compile(mg, cuda_graph=True)
    args = gfn.static_inputs or ordered
    for _ in range(5):
        gfn(*args)
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):  # gfn replays its own CUDA graph: timed directly, 20 replays per sample
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            gfn(*args)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / 20)
    torch.cuda.empty_cache()
    return {"case": case, "kernels_us": rows, "kernel_sum_us": sum(rows.values()), "graph_us": statistics.median(ts)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def run_variant(form: str, m: int, k: int, n: int, two: bool, s: int, bn: int, bk: int, warps: int, stages: int,
                ws: list[tuple[torch.Tensor, torch.Tensor | None]], x: torch.Tensor,
                ref: torch.Tensor) -> dict[str, Any]:
    ks = k // s
    direct = s == 1
    bm = max(16, triton.next_power_of_2(m))
    nw = 2 if two else 1
    out = torch.empty((m, n), dtype=torch.float16, device="cuda")
    part = torch.empty((s * nw, m, n), dtype=torch.float32, device="cuda")
    static = ks // bk <= 16
    bc = 128 if n % 128 == 0 else 64

    def launch(w: torch.Tensor, w2: torch.Tensor | None) -> None:
        dst = out if direct else part
        w2_ = w2 if w2 is not None else w
        if form == "fma2d":
            _fma2d[(n // bn, s)](x, w, w2_, dst, k, n, ks, bn, bk, two, direct, static, num_warps=warps, num_stages=1)
        elif form == "cur3d":
            _cur3d[(n // bn, s)](x, w, w2_, dst, k, n, ks, bn, bk, two, direct, static, num_warps=warps, num_stages=1)
        else:
            _dot16[(n // bn, s)](x, w, w2_, dst, m, k, n, ks, bm, bn, bk, two, direct, num_warps=warps,
                                 num_stages=stages)
        if not direct:
            _combine[(n // bc,)](part, out, m, n, s, max(1, triton.next_power_of_2(m)), bc, two, num_warps=4)

    out.fill_(float("nan"))
    launch(*ws[0])
    torch.cuda.synchronize()
    err = _rel(out, ref)
    row = {"form": form, "m": m, "k": k, "n": n, "two": two, "split": s, "bn": bn, "bk": bk, "warps": warps,
           "stages": stages, "blocks": (n // bn) * s, "err": err}
    if not err < 5e-3:
        row["error"] = "wrong result"
        return row
    us = _graph_time([lambda w=w, w2=w2: launch(w, w2) for w, w2 in ws]) / len(ws)
    row["us"] = us
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--cases", nargs="*", default=["decode_bs1", "decode_bs8"])
    ap.add_argument("--only-candidates", action="store_true", help="steps 1-2 only (no kernel sweep)")
    args = ap.parse_args()
    t_start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.UTC)
                           .strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__, "triton": triton.__version__,
                           "timing": "CUDA-graph replays (median of 7, 5 passes each), weights rotated past L2",
                           "candidates": [], "mm": [], "variants": []}

    def save() -> None:
        (args.out / "gemv_probe.json").write_text(json.dumps(doc, indent=1))

    doc["copy_bytes_per_s"] = bw = copy_bw()
    save()
    for case in args.cases:
        try:
            doc["candidates"].append(candidate_kernels(case))
        except Exception as e:
            doc["candidates"].append({"case": case, "error": f"{type(e).__name__}: {e}"[:400]})
            traceback.print_exc()
        save()
    # (k, n, two weights): WQ/WO, WK/WV, gate+up, down, fused QKV
    shapes = [] if args.only_candidates else [(4096, 14336, True), (14336, 4096, False), (4096, 4096, False),
                                              (4096, 1024, False), (4096, 6144, False)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    plans: list[tuple[str, int, int, int, int, int]] = []  # (form, m, bn, bk, warps, stages)
    plans += [("fma2d", 1, 64, 64, 4, 1), ("fma2d", 1, 128, 32, 4, 1), ("fma2d", 1, 128, 64, 8, 1),
              ("fma2d", 1, 256, 32, 8, 1)]
    plans += [("dot16", 8, 64, 128, 4, 4), ("dot16", 8, 128, 128, 4, 3), ("dot16", 8, 64, 256, 4, 3)]
    plans += [("dot16", 1, 64, 128, 4, 4), ("dot16", 1, 128, 128, 4, 3)]
    plans += [("cur3d", 1, 64, 64, 4, 1), ("cur3d", 1, 128, 32, 8, 1)]
    plans += [("dot16", 16, 64, 128, 4, 4), ("dot16", 16, 128, 128, 4, 3)]
    for k, n, two in shapes:
        if time.time() - t_start > args.budget_s:
            break
        wbytes = k * n * 2 * (2 if two else 1)
        reps = max(1, math.ceil(300e6 / wbytes))
        ws = []
        for _ in range(reps):
            w = (torch.randn(k, n, device="cuda", generator=gen) / math.sqrt(k)).half()
            w2 = (torch.randn(k, n, device="cuda", generator=gen) / math.sqrt(k)).half() if two else None
            ws.append((w, w2))
        for m in (1, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=gen).half()
            w, w2 = ws[0]
            ref = x.double() @ w.double()
            if two:
                ref = torch.nn.functional.silu(ref) * (x.double() @ w2.double())
            # cuBLAS
            fns = [lambda w=w, w2=w2, x=x: (x @ w, x @ w2) if w2 is not None else x @ w for w, w2 in ws]
            us = _graph_time(fns) / len(ws)
            doc["mm"].append({"m": m, "k": k, "n": n, "two": two, "us": us, "floor_us": 1e6 * wbytes / bw,
                              "bw_fraction": wbytes / (us * 1e-6) / bw})
            for form, pm, bn, bk, warps, stages in plans:
                if pm != m or n % bn:
                    continue
                for s in (1, 2, 4, 8, 16, 32):
                    blocks = (n // bn) * s
                    if k % s or (k // s) % bk or not 100 <= blocks <= 1100:
                        continue
                    if form == "cur3d" and blocks not in sorted({(n // bn) * t for t in (1, 2, 4, 8, 16, 32)
                                                                if 200 <= (n // bn) * t <= 600})[:1]:
                        continue
                    if time.time() - t_start > args.budget_s:
                        break
                    try:
                        row = run_variant(form, m, k, n, two, s, bn, bk, warps, stages, ws, x, ref)
                    except Exception as e:
                        row = {"form": form, "m": m, "k": k, "n": n, "split": s, "bn": bn, "bk": bk,
                               "error": f"{type(e).__name__}: {e}"[:300]}
                    if "us" in row:
                        row["floor_us"] = 1e6 * wbytes / bw
                        row["bw_fraction"] = wbytes / (row["us"] * 1e-6) / bw
                    doc["variants"].append(row)
            save()
        del ws
        torch.cuda.empty_cache()
    doc["wall_s"] = time.time() - t_start
    save()
    print(f"device {doc['device']}  copy {bw / 1e12:.2f} TB/s  wall {doc['wall_s']:.0f} s")
    for c in doc["candidates"]:
        if "kernels_us" in c:
            print(c["case"], f"graph {c['graph_us']:.1f} us, kernel sum {c['kernel_sum_us']:.1f}:",
                  " ".join(f"{k}={v:.1f}" for k, v in c["kernels_us"].items()))
        else:
            print(c)
    for r in doc["mm"]:
        print(f"mm  m{r['m']:<2} {r['k']}x{r['n']}{'x2' if r['two'] else ''} {r['us']:.1f} us  {r['bw_fraction']:.0%}")
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in doc["variants"]:
        if "us" not in r:
            continue
        key = (r["form"], r["m"], r["k"], r["n"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    for _key, r in sorted(best.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[0][1], kv[0][0])):
        print(f"{r['form']:5s} m{r['m']:<2} {r['k']}x{r['n']}{'x2' if r['two'] else ''} S{r['split']} bn{r['bn']} "
              f"bk{r['bk']} w{r['warps']} s{r['stages']} blocks {r['blocks']}: {r['us']:.1f} us {r['bw_fraction']:.0%}")
    bad = [r for r in doc["variants"] if "error" in r]
    print(f"{len(doc['variants'])} variants, {len(bad)} failed", [(r['form'], r.get('error'))for r in bad[:5]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
