"""Why the weighted norm-in-the-prologue kernel runs ~21 us over its unweighted twin (issue 23): launch variants.

    python benchmarks/perf/prologue_probe.py [--json OUT] [--rep-ms 50]   # GPU
    python benchmarks/perf/prologue_probe.py --sass                        # CPU: sm_90 loop instruction counts

The sixteenth session's ``weight_scale_ab.py`` timed ``rms_norm(x, w) @ W`` (fp16, K = 4096) in the new form
(``stabilise.prologue_norm_scales``: the row statistic before the loop, the operand ``x r w`` scaled in the loop)
at 41.5 / 42.9 us against 20.7 / 20.8 for the unweighted kernel (2 and 16 rows, N = 6144, 96 blocks, 64-row
``tl.dot``), and the cost model charged that gap to the 32 chunks of the statistic before the loop. But the 2-row
kernel's chunk loop is unrolled (32 independent loads) and the 16-row kernel's is a rolled loop, and both ran the
same; the for-loop's sm_90 SASS has 770 instructions a warp an iteration against 335 unweighted (the operand's
square, division, weight product and fp16 conversion over the dot's 64 padded rows). This probe times the same
μGraphs (``weight_scale_ab.json``, rank 0) under launch variants that change only that loop's work per thread: 8
warps (half the padded elements a thread) and 16-row padding (mma.sync, a quarter of the rows), each checked
against float64 first (max abs error / max |ref| <= 2e-2, fresh inputs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: (name, form, warps, stages, dot rows): ``form`` "new" (weighted, prologue statistic) or "bare" (unweighted); 0
#: warps: ``tuning.recommend``'s configuration (what ``vm.compile`` runs; 4 warps, 4 stages, 16-row mma.sync for
#: "new", 64-row wgmma for "bare")
VARIANTS = (("bare", "bare", 0, 0, 0), ("new", "new", 0, 0, 0), ("new_m64", "new", 4, 4, 64),
            ("new_m64_w8", "new", 8, 4, 64), ("new_w8", "new", 8, 4, 16))
CASES = ("rmsnorm_linear_bs1", "rmsnorm_linear_bs8")


def _rows() -> list[dict[str, Any]]:
    """``weight_scale_ab.json``'s rank-0 rows of :data:`CASES`, then ``prologue_probe.json``'s: ``rms_norm(x, w) @ W``
    at the decode layer's q projection shape (1 x 4096 x 4096), one-row products (16-row dots), in the layer's
    design (128 blocks of 32 columns, 16 steps of 256) and at 256 blocks x 32 steps, weighted and unweighted."""
    here = Path(__file__).resolve().parent
    data = json.loads((here / "weight_scale_ab.json").read_text())
    return ([r for r in data if r["case"] in CASES and r["rank"] == 0]
            + json.loads((here / "prologue_probe.json").read_text()))


def _config(warps: int, stages: int, rows: int) -> Any:
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    return None if not warps else LaunchConfig(warps, stages, TileOptions(dot_min_m=rows))


def sass() -> None:
    """The for-loops' instruction counts of each variant's kernel (sm_90, Triton's own ptxas; no GPU)."""
    import triton
    from sass_loops import compile_sm90, loops

    import verimirage as vm
    from verimirage.backend.codegen import generate
    from verimirage.backend.tuning import recommend
    from verimirage.ir.graph import node_list

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        for r in _rows():
            for name, form, warps, stages, rows in VARIANTS:
                mg = vm.MuGraph.parse(r[form])
                cfg = _config(warps, stages, rows)
                if cfg is None:
                    nodes = node_list(mg)
                    n = next(x for x in nodes if x.op == "custom")
                    cfg = recommend(n.attr("block"), [nodes[a].outs[k] for a, k in n.args])
                ms = generate(mg, cfg.tiles)
                path = Path(tmp) / f"{r['case']}_{name}.py"
                path.write_text(ms.source)
                for k in ms.kernels:
                    cub = Path(tmp) / f"{k.name}.cubin"
                    cub.write_bytes(compile_sm90(path, k.name, k.signature, cfg.num_warps, cfg.num_stages))
                    text = subprocess.run([str(nvdisasm), "-c", str(cub)], capture_output=True, text=True).stdout
                    body = [(n_, c) for n_, c in loops(text)]
                    print(f"{r['case']:20s} {name:11s} {cfg.key():20s} loops {body}")


def time_all(out: Path | None, rep_ms: int) -> None:
    import numpy as np
    import torch
    from triton.testing import do_bench_cudagraph
    from weight_scale_ab import _bare, _graph, _inputs

    import verimirage as vm

    dev = torch.cuda.get_device_name(0)
    res = []
    for r in _rows():
        shape = r["shape"]
        fns = {name: vm.compile(vm.MuGraph.parse(r[form]), config=_config(w, s, m))
               for name, form, w, s, m in VARIANTS}
        forms = {name: form for name, form, *_ in VARIANTS}
        errs: dict[str, float] = {}
        for seed in (3, 4):
            ins = _inputs(shape, seed)
            for name, fn in fns.items():
                names = ("X", "W") if forms[name] == "bare" else ("X", "G", "W")
                want = vm.evaluate(_bare(*shape) if forms[name] == "bare" else _graph(*shape),
                                   {k: ins[k] for k in names})[0]
                got = fn(*[torch.tensor(ins[k], dtype=torch.float16, device="cuda") for k in names])
                e = float(np.abs(got.double().cpu().numpy() - want).max() / np.abs(want).max())
                errs[name] = max(errs.get(name, 0.0), e)
        targs = [torch.randn(shape[0], shape[1], device="cuda", dtype=torch.float16),
                 torch.rand(shape[1], device="cuda", dtype=torch.float16) + 0.5,
                 torch.randn(shape[1], shape[2], device="cuda", dtype=torch.float16) * 0.05]
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(2):
            for name, fn in fns.items():
                a = [targs[0], targs[2]] if forms[name] == "bare" else targs
                if errs[name] > 2e-2:
                    continue
                times[name].append(1e3 * float(do_bench_cudagraph(lambda fn=fn, a=a: fn(*a), rep=rep_ms,
                                                                  return_mode="median")))
        row = {"case": r["case"], "shape": shape, "err": errs, "us": times,
               "launch": {name: fn.launch for name, fn in fns.items()}, "device": dev,
               "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        res.append(row)
        if out is not None:
            out.write_text(json.dumps(res, indent=1))
        print(r["case"], " ".join(f"{n} {min(t) if t else float('nan'):.2f}" for n, t in times.items()),
              "err", {n: f"{e:.1e}" for n, e in errs.items()}, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sass", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--rep-ms", type=int, default=50)
    a = ap.parse_args()
    if a.sass:
        sass()
    else:
        time_all(a.json, a.rep_ms)


if __name__ == "__main__":
    main()
