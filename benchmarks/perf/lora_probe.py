"""How fast can one kernel do LoRA (``X @ W + (X @ A) @ B``) on this GPU? A focused experiment for issue 8.

    python benchmarks/perf/lora_probe.py --out DIR

Times, under CUDA-graph replay (``triton.testing.do_bench_cudagraph``, as the harness times every variant; W,
2 MB, stays in L2 between replays there) and with ``do_bench`` (L2 flushed before each call):

* launch floors: an empty Triton kernel, and PyTorch's one-element ``add_`` the harness calls "one launch";
* bytes floors: kernels that only read what LoRA must read (W, B, X, A) and write its output, tiled like LoRA;
* hand-written LoRA kernels over a grid of tile shapes, K-loop depths, warps and stages;
* verimirage's stored candidates at their default launch configs.

Every LoRA variant is checked against the float64 product before it is timed. Writes ``lora_probe.json``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _read_tiles(x_ptr, w_ptr, a_ptr, b_ptr, o_ptr, M, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # the loads and the store of a LoRA tile, with a sum in place of the products
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        rk = k + tl.arange(0, BK)
        w = tl.load(w_ptr + rk[:, None] * N + rn[None, :]).to(tl.float32)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0).to(tl.float32)
        acc += tl.sum(w, 0)[None, :] + tl.sum(x, 1)[:, None]
    b = tl.load(b_ptr + tl.arange(0, R)[:, None] * N + rn[None, :]).to(tl.float32)
    acc += tl.sum(b, 0)[None, :]
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=rm[:, None] < M)


@triton.jit
def _lora(x_ptr, w_ptr, a_ptr, b_ptr, o_ptr, M, N: tl.constexpr, K: tl.constexpr, R: tl.constexpr,
          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr, XA_FIRST: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rr = tl.arange(0, R)
    acc = tl.zeros((BM, BN), tl.float32)
    xa = tl.zeros((BM, R), tl.float32)
    if XA_FIRST:
        # X @ A over all of K first (X and A are tiny and shared by every block), then the wide product
        for k in tl.range(0, K, BK, num_stages=STAGES):
            rk = k + tl.arange(0, BK)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
            a = tl.load(a_ptr + rk[:, None] * R + rr[None, :])
            xa = tl.dot(x, a, xa)
        b = tl.load(b_ptr + rr[:, None] * N + rn[None, :])
        acc = tl.dot(xa.to(tl.float16), b, acc)
        for k in tl.range(0, K, BK, num_stages=STAGES):
            rk = k + tl.arange(0, BK)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :])
            acc = tl.dot(x, w, acc)
    else:
        for k in tl.range(0, K, BK, num_stages=STAGES):
            rk = k + tl.arange(0, BK)
            x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=rm[:, None] < M, other=0.0)
            w = tl.load(w_ptr + rk[:, None] * N + rn[None, :])
            a = tl.load(a_ptr + rk[:, None] * R + rr[None, :])
            acc = tl.dot(x, w, acc)
            xa = tl.dot(x, a, xa)
        b = tl.load(b_ptr + rr[:, None] * N + rn[None, :])
        acc = tl.dot(xa.to(tl.float16), b, acc)
    tl.store(o_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=rm[:, None] < M)


def _time(fn: Any, flushed: bool = False) -> dict[str, float]:
    from triton.testing import do_bench, do_bench_cudagraph

    t = {"graph_us": 1e3 * float(do_bench_cudagraph(fn, rep=60, return_mode="median"))}
    if flushed:
        t["flushed_us"] = 1e3 * float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
    return t


def _lora_configs(m: int) -> list[tuple[int, ...]]:
    """(bm, bn, bk, warps, stages, xa_first) to try: about a hundred per batch size."""
    out = []
    for bm, bn, bk in itertools.product((16, 32, 64, 128), (32, 64, 128), (64, 128, 256)):
        if bm > max(16, m) or bm * bn > 128 * 64:
            continue
        for warps, stages, xa_first in itertools.product((1, 2, 4, 8), (1, 2, 3), (False, True)):
            if (bk == 256 and stages > 1) or (bm * bn >= 64 * 64 and warps < 4) or (bm * bn <= 16 * 64 and warps > 4):
                continue
            if xa_first and (bk != 64 or warps not in (2, 4)):
                continue
            if m > 16 and (bk == 128 or stages == 2):  # fewer shapes at batch 8: compiling dominates the run
                continue
            out.append((bm, bn, bk, warps, stages, xa_first))
    return out


def probe(batch: int) -> dict[str, Any]:
    """Every variant for one batch size (M = 16 * batch rows)."""
    import verimirage as vm

    m, k, n, r = 16 * batch, 256, 4096, 16
    gen = torch.Generator(device="cuda").manual_seed(batch)
    x, w, a, b = (0.5 * torch.randn(s, device="cuda", generator=gen, dtype=torch.float32) for s in
                  ((m, k), (k, n), (k, r), (r, n)))
    x, w, a, b = (t.half() for t in (x, w, a, b))
    ref = x.double() @ w.double() + (x.double() @ a.double()) @ b.double()
    out = torch.empty((m, n), device="cuda", dtype=torch.float16)
    rows: list[dict[str, Any]] = []
    for bm, bn, bk in itertools.product((16, 32, 64, 128), (32, 64, 128), (64, 128, 256)):
        if bm > max(16, m):
            continue
        grid = (triton.cdiv(m, bm), n // bn)
        try:
            rows.append({"kind": "read", "bm": bm, "bn": bn, "bk": bk, "grid": list(grid), **_time(
                lambda grid=grid, bm=bm, bn=bn, bk=bk: _read_tiles[grid](x, w, a, b, out, m, n, k, r, bm, bn, bk))})
        except Exception as e:
            rows.append({"kind": "read", "bm": bm, "bn": bn, "bk": bk, "error": repr(e)[:300]})
    for bm, bn, bk, warps, stages, xa_first in _lora_configs(m):
        grid = (triton.cdiv(m, bm), n // bn)
        cfg = {"kind": "lora", "bm": bm, "bn": bn, "bk": bk, "warps": warps, "stages": stages,
               "xa_first": xa_first, "grid": list(grid)}

        def fn(grid=grid, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, xa_first=xa_first) -> None:
            _lora[grid](x, w, a, b, out, m, n, k, r, bm, bn, bk, stages, xa_first, num_warps=warps)
        try:
            out.zero_()
            fn()
            torch.cuda.synchronize()
            err = float((out.double() - ref).norm() / ref.norm())
            if not err < 2e-3:
                rows.append({**cfg, "error": f"rel err {err}"})
                continue
            rows.append({**cfg, "err": err, **_time(fn)})
        except Exception as e:
            rows.append({**cfg, "error": repr(e)[:300]})
    cands = json.loads((ROOT / f"benchmarks/candidates/lora_bs{batch}.json").read_text())["candidates"]
    named = {"X": x, "W": w, "A": a, "B": b}
    for i, c in enumerate(cands):
        mg = vm.MuGraph.parse(c["mugraph"])
        try:
            f = vm.compile(mg)
            got = f(**named)
            got = got[0] if isinstance(got, (tuple, list)) else got
            err = float((got.double() - ref).norm() / ref.norm())
            rows.append({"kind": "verimirage", "candidate": i, "err": err, **_time(lambda f=f: f(**named))})
        except Exception as e:
            rows.append({"kind": "verimirage", "candidate": i, "error": repr(e)[:300]})
    # the best few of each kind again with a flushed L2 (do_bench), for the bytes-from-DRAM view
    for kind in ("read", "lora"):
        for t in sorted((t for t in rows if t["kind"] == kind and "graph_us" in t), key=lambda t: t["graph_us"])[:3]:
            grid = tuple(t["grid"])
            if kind == "read":
                t.update(_time(lambda t=t, grid=grid: _read_tiles[grid](x, w, a, b, out, m, n, k, r, t["bm"], t["bn"],
                                                                      t["bk"]), flushed=True))
            else:
                t.update(_time(lambda t=t, grid=grid: _lora[grid](x, w, a, b, out, m, n, k, r, t["bm"], t["bn"],
                                                                t["bk"], t["stages"], t["xa_first"],
                                                                num_warps=t["warps"]), flushed=True))
    return {"m": m, "rows": rows}


def main() -> int:
    """Run the probe for batch 1 and 8; write the JSON."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    z = torch.ones(32, device="cuda")
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                           "torch": torch.__version__, "triton": triton.__version__,
                           "empty_triton": _time(lambda: _empty[(1,)](z)),
                           "torch_add": _time(lambda: z.add_(1.0)), "batches": {}}
    for batch in (1, 8):
        doc["batches"][str(batch)] = probe(batch)
        (args.out / "lora_probe.json").write_text(json.dumps(doc, indent=1))
        rows = [t for t in doc["batches"][str(batch)]["rows"] if "graph_us" in t]
        for kind in ("read", "lora", "verimirage"):
            best = sorted((t for t in rows if t["kind"] == kind), key=lambda t: t["graph_us"])[:3]
            print(batch, kind, json.dumps(best), flush=True)
    print("empty", doc["empty_triton"], "add", doc["torch_add"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
