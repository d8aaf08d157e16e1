"""A/B of batchnorm_relu's tile widths on the GPU (issue 22): 64-wide tiles (128-byte rows, the stored candidates)
against tiles spanning whole channel rows (3,136 fp16, 6,272 contiguous bytes; 8 / 4 / 2 channels a block are one
contiguous run of 50 / 25 / 12.5 KB).

    python benchmarks/perf/bn_rows_ab.py [--json OUT]

The whole-row variants are built here from the graph (not searched, not verified: a measurement probe). Each variant
and launch configuration is checked against a float64 reference (max abs error <= 2e-2 on fp16 outputs of magnitude
~4, two input draws), then timed with ``do_bench_cudagraph`` (median, µs), next to eager PyTorch and torch.compile
(max-autotune) in the same process. On the CPU (no CUDA) it only builds the variants and prints their cost estimates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

N, C, HW = 32, 256, 3136


def variant(nb: int, cb: int, wb: int) -> str:
    """μGraph text: blocks of ``nb`` images x ``cb`` channels x ``wb`` columns (whole rows when wb == 3136)."""
    grid: list[int] = []
    imap: list[int] = []
    for dim, (size, per) in enumerate(((N, nb), (C, cb), (HW, wb))):
        if per < size:
            grid.append(size // per)
            imap.append(dim)

    def tup(xs: list) -> str:
        return f"({', '.join(map(str, xs))}{',' if len(xs) == 1 else ''})"

    # MEAN etc. are (C, 1): only the grid axis that splits the channels splits them
    pmap = tup(["0" if d == 1 else "None" for d in imap])
    im, gr = tup(imap), tup(grid)
    omap = im
    t = f"f16[{nb},{cb},{wb}]"
    p = f"f16[{cb},1]"
    params = "\n".join(
        f"    %{i} = input {{arg={i}, fmap=None, imap={pmap}, shape=({C}, 1)}} : {p}" for i in range(1, 5))
    return f"""mugraph {{
  %0 = input {{name='X'}} : f16[{N},{C},{HW}]
  %1 = input {{name='MEAN'}} : f16[{C},1]
  %2 = input {{name='VAR'}} : f16[{C},1]
  %3 = input {{name='G'}} : f16[{C},1]
  %4 = input {{name='B'}} : f16[{C},1]
  %5 = custom %0, %1, %2, %3, %4 {{frange=1, grid={gr}}} : f16[{N},{C},{HW}] {{
    %0 = input {{arg=0, fmap=None, imap={im}, shape=({N}, {C}, {HW})}} : {t}
{params}
    %5 = sub %0, %1 : {t}
    %6 = shift %2 {{c=1e-05}} : {p}
    %7 = rsqrt %6 : {p}
    %8 = mul %5, %7 : {t}
    %9 = mul %8, %3 : {t}
    %10 = add %9, %4 : {t}
    %11 = relu %10 : {t}
    output %11 {{omap={omap}}}
  }}
  return %5
}}"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    import verimirage as vm
    from verimirage.pipeline.pricing import cost

    doc = json.loads((ROOT / "benchmarks" / "candidates_models" / "batchnorm_relu.json").read_text())
    variants = {"stored cand 0 (64-wide)": vm.MuGraph.parse(doc["candidates"][0]["mugraph"])}
    for nb, cb, wb in ((1, 8, HW), (1, 4, HW), (1, 2, HW), (1, 1, HW), (32, 8, 64)):
        variants[f"tile {nb}x{cb}x{wb}"] = vm.MuGraph.parse(variant(nb, cb, wb))
    for k, mg in variants.items():
        print(f"{k:28s} est {cost(mg).time_s * 1e6:6.1f} us", flush=True)
    try:
        import torch
        if not torch.cuda.is_available():
            return
    except ImportError:
        return
    from triton.testing import do_bench_cudagraph

    from verimirage.backend.codegen import LaunchConfig, TileOptions

    def inputs(seed: int) -> list:
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(N, C, HW, generator=g, device="cuda").half()
        mean = (0.1 * torch.randn(C, 1, generator=g, device="cuda")).half()
        var = (0.5 + torch.rand(C, 1, generator=g, device="cuda")).half()
        gam = (1 + 0.1 * torch.randn(C, 1, generator=g, device="cuda")).half()
        bet = (0.1 * torch.randn(C, 1, generator=g, device="cuda")).half()
        return [x, mean, var, gam, bet]

    def ref(x, mean, var, gam, bet):
        x, mean, var, gam, bet = (t.double() for t in (x, mean, var, gam, bet))
        return torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * gam + bet)

    def eager(x, mean, var, gam, bet):
        return torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * gam + bet)

    rows = []
    args = inputs(0)
    t_eager = 1e3 * float(do_bench_cudagraph(lambda: eager(*args), rep=200, return_mode="median"))
    comp = torch.compile(eager, mode="max-autotune")
    comp(*args)
    t_ind = 1e3 * float(do_bench_cudagraph(lambda: comp(*args), rep=200, return_mode="median"))
    print(f"eager {t_eager:.2f} us, torch.compile max-autotune {t_ind:.2f} us", flush=True)
    rows.append({"variant": "eager", "us": t_eager})
    rows.append({"variant": "inductor", "us": t_ind})
    for k, mg in variants.items():
        for w in (4, 8):
            cfg = LaunchConfig(num_warps=w, num_stages=1, tiles=TileOptions())
            try:
                fn = vm.compile(mg, config=cfg)
                err = 0.0
                for seed in (1, 2):
                    xs = inputs(seed)
                    out = fn(*xs)
                    out = out[0] if isinstance(out, (tuple, list)) else out
                    err = max(err, float((out.double() - ref(*xs)).abs().max()))
                us = 1e3 * float(do_bench_cudagraph(lambda fn=fn: fn(*args), rep=200, return_mode="median")) \
                    if err <= 2e-2 else float("nan")
            except Exception as e:  # a variant the backend cannot launch: report it, keep going
                err, us = float("nan"), float("nan")
                print(f"{k} w{w}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            rows.append({"variant": k, "warps": w, "us": us, "err": err, "est_us": cost(mg).time_s * 1e6})
            print(f"{k:28s} w{w}: {us:7.2f} us  err {err:.1e}  (est {cost(mg).time_s * 1e6:.1f})", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
