"""Compile generated kernels for sm_90 on a CPU machine (no GPU) and report resources.

    python benchmarks/perf/aot.py CASE [--batch 1] [--design-kw '{"cols": 32}'] [--warps 4 --stages 3 --min-m 16]

Specialises the arguments as Triton's launcher does for contiguous tensors (unit strides constexpr 1,
other strides and pointers divisible by 16 where they are), so the TTGIR/PTX is what the GPU would run.
Prints per kernel: shared memory, whether the PTX has wgmma / mma.sync / cp.async / TMA, load widths.
Run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def compile_module(ms, path: Path, warps: int, stages: int, dump: Path | None = None) -> list[dict]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from verimirage.ir.graph import node_list

    spec = importlib.util.spec_from_file_location(f"aot_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    nodes = node_list(ms.mugraph)
    res = []
    for info in ms.kernels:
        n = nodes[info.node]
        types = [nodes[a].outs[k] for a, k in n.args] + list(n.outs)
        fn = getattr(mod, info.name)
        sig = dict(info.signature)
        consts, attrs = {}, {}
        names = list(sig)
        pos = 0
        for t in types:
            attrs[(pos,)] = [["tt.divisibility", 16]]
            pos += 1
            for st in contiguous_strides(t.shape):
                if st == 1:
                    consts[names[pos]] = 1
                    sig[names[pos]] = "constexpr"
                elif st % 16 == 0:
                    attrs[(pos,)] = [["tt.divisibility", 16]]
                pos += 1
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": warps, "num_stages": stages})
        ptx = k.asm["ptx"]
        ttgir = k.asm["ttgir"]
        info_d = {
            "kernel": info.name, "grid": info.grid, "shared": k.metadata.shared,
            "wgmma": "wgmma" in ptx, "mma.sync": "mma.sync" in ptx,
            "cp.async": ptx.count("cp.async.cg") + ptx.count("cp.async.ca"), "tma": "cp.async.bulk" in ptx,
            "ld.global.v4": len(re.findall(r"ld\.global[^\n]*\.v4", ptx)),
            "ld.global": ptx.count("ld.global"), "async_copy": ttgir.count("async_copy_global_to_local"),
        }
        res.append(info_d)
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            for kind in ("ttgir", "ptx"):
                (dump / f"{info.name}.{kind}").write_text(k.asm[kind])
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("case")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--design", default=None, help="design function name in verimirage.benchmarks.designs")
    ap.add_argument("--design-kw", default="{}")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--min-m", type=int, default=64)
    ap.add_argument("--unroll", type=int, default=None)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args()
    import verimirage as vm
    from verimirage.backend.codegen import TileOptions, generate
    from verimirage.backend.runtime import write_module
    from verimirage.benchmarks import designs

    g = vm.benchmarks.get(a.case, batch=a.batch)
    kw = json.loads(a.design_kw)
    mg = getattr(designs, a.design)(g, **kw) if a.design else vm.benchmarks.expert(a.case, g, **kw)
    topts = {"dot_min_m": a.min_m}
    if a.unroll is not None:
        topts["unroll_max"] = a.unroll
    ms = generate(mg, TileOptions(**topts))
    path = write_module(ms, Path("/tmp/vm_aot"))
    for r in compile_module(ms, path, a.warps, a.stages, Path(a.dump) if a.dump else None):
        print(json.dumps(r))
    _ = math
    return 0


if __name__ == "__main__":
    sys.exit(main())
