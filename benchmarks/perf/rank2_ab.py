"""A/B of the rank-2 emission (``TileOptions.rank2``) on the stored causal / softcap candidates (issue 22).

    python benchmarks/perf/rank2_ab.py [--cases causal_attention softcap_attention] [--top 3]

Each (candidate, tile option, warps/stages) is checked against a float64 reference (rel. Frobenius <= 2e-3, two
fresh input draws), then timed with ``do_bench_cudagraph`` (median, µs). Prints one line per variant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="*", default=["causal_attention", "softcap_attention"])
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    import torch
    from triton.testing import do_bench_cudagraph

    import verimirage as vm
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    h, n, d = 16, 1024, 64
    for case in a.cases:
        doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
        for ci, c in enumerate(doc["candidates"][:a.top]):
            mg = vm.MuGraph.parse(c["mugraph"])
            for r2 in (True, False):
                for w, s in ((4, 2), (4, 3), (8, 3)):
                    cfg = LaunchConfig(num_warps=w, num_stages=s, tiles=TileOptions(dot_min_m=16, rank2=r2))
                    fn = vm.compile(mg, config=cfg)
                    worst = 0.0
                    for seed in (1, 2):
                        g = torch.Generator(device="cuda").manual_seed(seed)
                        q, v = (0.3 * torch.randn(h, n, d, generator=g, device="cuda")).half(), \
                            (0.3 * torch.randn(h, n, d, generator=g, device="cuda")).half()
                        k = (0.3 * torch.randn(h, d, n, generator=g, device="cuda")).half()
                        sc = q.double() @ k.double()
                        if case == "softcap_attention":
                            sc = 50.0 * torch.tanh(sc / 50.0)
                        sc = sc.masked_fill(~torch.ones(n, n, dtype=torch.bool, device="cuda").tril(), float("-inf"))
                        ref = torch.softmax(sc, -1) @ v.double()
                        out = fn(q, k, v)
                        out = out[0] if isinstance(out, (tuple, list)) else out
                        worst = max(worst, float((out.double() - ref).norm() / ref.norm()))
                    us = 1e3 * float(do_bench_cudagraph(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v), rep=200,
                                                        return_mode="median")) if worst <= 2e-3 else float("nan")
                    print(f"{case} cand {ci} rank2={r2} w{w} s{s}: {us:7.2f} us  err {worst:.1e}", flush=True)


if __name__ == "__main__":
    main()
