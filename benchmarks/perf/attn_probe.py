"""One-call GPU probe of the attention kernels (issue 22): stored candidates' generated kernels, hand edits of
them that stand for codegen changes (``attn_variants.py`` writes them), a hand-written FlashAttention-style
causal kernel as a reference for what Triton reaches, and SDPA, all in one process.

    python benchmarks/perf/attn_probe.py --out DIR [--workers 12]

Every variant is first checked against a float64 reference (rel. Frobenius error <= 2e-3, fp16) on fresh
inputs; then timed with ``triton.testing.do_bench_cudagraph`` (median, µs). Prints a table; writes probe.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: the variant modules (``ATTN_VARIANTS``: another folder, e.g. ``flash_variants`` of flash_variants.py)
VAR = HERE / os.environ.get("ATTN_VARIANTS", "attn_variants")
#: ``ATTN_FA=0``: without the hand-written FlashAttention kernels
WITH_FA = os.environ.get("ATTN_FA", "1") != "0"
H, N, D = 16, 1024, 64
#: (warps, stages) each variant is timed under; ``ATTN_CFGS="4,3 4,5 8,3"`` for others
CFGS = [tuple(int(v) for v in c.split(",")) for c in os.environ.get("ATTN_CFGS", "4,2 4,3 8,2 8,3").split()]
#: ``ATTN_TWICE=1``: every variant timed a second time after all were timed once (``us2``: the spread of an A/B)
TWICE = os.environ.get("ATTN_TWICE", "0") != "0"


def _mod(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def inputs(case: str, seed: int) -> dict[str, Any]:
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: (0.3 * torch.randn(*s, generator=g, device="cuda")).half()  # noqa: E731
    if case.startswith("rotary"):  # K as (heads, keys, d); cos / sin of random angles
        ang = torch.rand(N, D, generator=g, device="cuda") * 6.28
        return {"Q": r(H, N, D), "K": r(H, N, D), "V": r(H, N, D), "COS": ang.cos().half(), "SIN": ang.sin().half()}
    d = {"Q": r(H, N, D), "K": r(H, D, N), "V": r(H, N, D)}
    if case.startswith("bias"):
        d["BIAS"] = r(H, N, N)
    return d


def reference(case: str, x: dict[str, Any]) -> Any:
    import torch
    q, k, v = (x[n].double() for n in "QKV")
    if case.startswith("rotary"):
        c, sn = x["COS"].double(), x["SIN"].double()
        rot = lambda t: torch.cat((-t[..., D // 2:], t[..., :D // 2]), -1)  # noqa: E731
        q, k = q * c + rot(q) * sn, (k * c + rot(k) * sn).transpose(-1, -2)
    s = q @ k
    if case.startswith("softcap"):
        s = 50.0 * torch.tanh(s / 50.0)
    if case.startswith("bias"):
        s = s + x["BIAS"].double()
    if case.startswith(("causal", "softcap", "fa")):
        s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v


# ---------------------------------------------------------------- a hand-written causal FlashAttention forward
def _fa_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def fa_causal(Q, K, V, O, sqh, sqm, skh, skd, svh, svn, soh, som,
                  BM: tl.constexpr, BN: tl.constexpr, DH: tl.constexpr, REV: tl.constexpr, EXP2: tl.constexpr,
                  NANMAX: tl.constexpr):
        h = tl.program_id(0)
        mb = tl.program_id(1)
        if REV:
            mb = tl.num_programs(1) - 1 - mb
        rm = mb * BM + tl.arange(0, BM)
        rd = tl.arange(0, DH)
        q = tl.load(Q + h * sqh + rm[:, None] * sqm + rd[None, :])
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, DH), tl.float32)
        sc = 1.4426950408889634 if EXP2 else 1.0
        full = (mb * BM + 1) // BN
        hi = tl.cdiv((mb + 1) * BM, BN)
        for t in range(0, full):
            rn = t * BN + tl.arange(0, BN)
            k = tl.load(K + h * skh + rd[:, None] * skd + rn[None, :])
            s = tl.dot(q, k) * sc
            if NANMAX:
                m_new = tl.maximum(m_i, tl.max(s, 1), propagate_nan=tl.PropagateNan.ALL)
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1))
            if EXP2:
                p = tl.math.exp2(s - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            else:
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + h * svh + rn[:, None] * svn + rd[None, :])
            acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
            m_i = m_new
        for t in range(full, hi):
            rn = t * BN + tl.arange(0, BN)
            k = tl.load(K + h * skh + rd[:, None] * skd + rn[None, :])
            s = tl.dot(q, k) * sc
            s = tl.where(rn[None, :] <= rm[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if EXP2:
                p = tl.math.exp2(s - m_new[:, None])
                alpha = tl.math.exp2(m_i - m_new)
            else:
                p = tl.exp(s - m_new[:, None])
                alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + h * svh + rn[:, None] * svn + rd[None, :])
            acc = tl.dot(p.to(tl.float16), v, acc * alpha[:, None])
            m_i = m_new
        tl.store(O + h * soh + rm[:, None] * som + rd[None, :], (acc / l_i[:, None]).to(tl.float16))

    return fa_causal


FA_VARIANTS = [dict(BM=bm, BN=bn, REV=rev, EXP2=e2, NANMAX=nm)
               for bm, bn in ((64, 64), (128, 64), (128, 128), (64, 128))
               for rev in (0, 1) for e2, nm in ((1, 0), (0, 1))]


def fa_fn(x: dict[str, Any], kw: dict[str, Any], cfg: tuple[int, int]) -> Any:
    import torch
    k = _fa_kernel()
    q, kk, v = x["Q"], x["K"], x["V"]
    o = torch.empty_like(q)
    grid = (H, N // kw["BM"])

    def run() -> Any:
        k[grid](q, kk, v, o, q.stride(0), q.stride(1), kk.stride(0), kk.stride(1), v.stride(0), v.stride(1),
                o.stride(0), o.stride(1), DH=D, num_warps=cfg[0], num_stages=cfg[1], **kw)
        return o
    return run


def gen_fn(name: str, x: dict[str, Any], cfg: tuple[int, int]) -> Any:
    m = _mod(VAR / f"{name}.py")
    for k in m.LAUNCH:
        m.LAUNCH[k] = {"num_warps": cfg[0], "num_stages": cfg[1]}
    args = [x[n] for n in ("Q", "K", "V", "BIAS", "COS", "SIN") if n in x]
    return lambda: m.forward(*args)[0]


def jobs() -> list[tuple[str, str, Any, tuple[int, int]]]:
    idx = json.loads((VAR / "index.json").read_text())
    out = []
    for name, meta in idx.items():
        for cfg in CFGS:
            out.append((meta["case"], name, None, cfg))
    for kw in FA_VARIANTS if WITH_FA else []:
        for cfg in ((4, 2), (4, 3), (8, 2), (8, 3)):
            name = "fa_bm{BM}_bn{BN}_rev{REV}_exp2{EXP2}_nanmax{NANMAX}".format(**kw)
            out.append(("fa_causal", name, kw, cfg))
    return out


def make(job: tuple[str, str, Any, tuple[int, int]], x: dict[str, Any]) -> Any:
    _case, name, kw, cfg = job
    return fa_fn(x, kw, cfg) if kw is not None else gen_fn(name, x, cfg)


def warm(job: tuple[str, str, Any, tuple[int, int]]) -> str:
    import torch
    try:
        make(job, inputs(job[0], 1))()
        torch.cuda.synchronize()
        return ""
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]


def sdpa(case: str, x: dict[str, Any]) -> Any:
    """SDPA on the probe's inputs (scale 1; K made (heads, kv, d) contiguous outside the timing)."""
    import torch
    F = torch.nn.functional
    q, v = x["Q"].unsqueeze(0), x["V"].unsqueeze(0)
    kt = x["K"].transpose(-1, -2).contiguous().unsqueeze(0)
    if case == "causal_attention":
        return lambda: F.scaled_dot_product_attention(q, kt, v, is_causal=True, scale=1.0)[0]
    b = x["BIAS"].unsqueeze(0)
    return lambda: F.scaled_dot_product_attention(q, kt, v, attn_mask=b, scale=1.0)[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=420.0)
    a = ap.parse_args()
    import torch
    from triton.testing import do_bench_cudagraph
    t0 = time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    js = jobs()
    import multiprocessing as mp
    with ProcessPoolExecutor(a.workers, mp_context=mp.get_context("spawn")) as ex:
        errs = list(ex.map(warm, js, chunksize=1))
    print(f"warm: {len(js)} jobs in {time.time() - t0:.0f} s, {sum(1 for e in errs if e)} failed", flush=True)

    def tm(fn: Any) -> float:
        return 1e3 * float(do_bench_cudagraph(fn, rep=200, return_mode="median"))

    rows: list[dict[str, Any]] = []
    base: dict[str, Any] = {}
    for case in ("causal_attention", "bias_attention"):
        x = inputs(case, 3)
        f = sdpa(case, x)
        ref = reference(case, x)
        err = float((f().double() - ref).norm() / ref.norm())
        base[case] = [tm(f), tm(f)]
        rows.append({"case": case, "name": "sdpa", "cfg": None, "err": err, "us": base[case][0], "us2": base[case][1]})
    print("sdpa", base, flush=True)
    for job, e in zip(js, errs, strict=True):
        case, name, _kw, cfg = job
        row: dict[str, Any] = {"case": case, "name": name, "cfg": list(cfg)}
        rows.append(row)
        if e:
            row["error"] = e
            continue
        if time.time() - t0 > a.budget_s:
            row["error"] = "budget"
            continue
        try:
            worst = 0.0
            for seed in (11, 12):
                x = inputs(case, seed)
                rc = "causal_attention" if case == "fa_causal" else case
                ref = reference(rc, x)
                got = make(job, x)()
                worst = max(worst, float((got.double() - ref).norm() / ref.norm()))
            row["err"] = worst
            if not math.isfinite(worst) or worst > 2e-3:
                row["error"] = f"wrong: rel err {worst:.2e}"
                continue
            x = inputs(case, 3)
            f = make(job, x)
            row["us"] = tm(f)
        except Exception as ex:
            row["error"] = f"{type(ex).__name__}: {ex}"[:300]
    if TWICE:
        for job, row in zip(js, rows[len(base):], strict=True):
            if "us" in row and time.time() - t0 <= a.budget_s:
                row["us2"] = tm(make(job, inputs(job[0], 3)))
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    (a.out / "probe.json").write_text(json.dumps(doc, indent=1))
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if "us" in r and ((r["case"], r["name"]) not in best or r["us"] < best[(r["case"], r["name"])]["us"]):
            best[(r["case"], r["name"])] = r
    print(doc["device"], doc["date"])
    for (c, n), r in sorted(best.items(), key=lambda kv: (kv[0][0], kv[1]["us"])):
        print(f"{c:18s} {n:42s} {r['cfg']!s:8s} {r['us']:7.2f} {r.get('us2', float('nan')):7.2f}  "
              f"err {r.get('err', 0):.1e}")
    bad = [r for r in rows if "error" in r]
    print(f"{len(bad)} failed/skipped:", [(r['name'], r['cfg'], r['error'][:60]) for r in bad][:12])
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
