"""GPU validation of the Triton backend: every suite expert design at full size.

For each suite program (batch 1): build the expert μGraph, compile it with
``vm.compile``, check it against the float64 reference (``vm.evaluate`` on the
suite graph, inputs upcast), and time the whole program and each kernel with
``triton.testing.do_bench`` (median). For context it also times the plain
suite graph (every op its own generated kernel) and PyTorch eager on the same
inputs, checks CUDA-graph capture, and runs ``profile.select`` on one program.

    python benchmarks/gpu_check.py --out results.json        # on a GPU machine
    python benchmarks/gpu_check.py --small                   # CPU smoke test (interpreter, no timing)

fp16 everywhere except qknorm_gqa, run in bf16: its softmax has no max
subtraction and its scores (unit-RMS q and k, head dim 64) reach e^30, beyond
fp16's range.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verimirage.backend.runtime import ensure_mode

ensure_mode()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import verimirage as vm  # noqa: E402
from verimirage.benchmarks.designs import expert, small_design_kw  # noqa: E402

TOL = {"f16": 1e-2, "bf16": 5e-2, "f32": 1e-4}


def torch_eager(g: vm.Graph, ins: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The kernel graph run op by op with PyTorch (the eager baseline)."""
    env: dict[int, torch.Tensor] = {}
    for i, n in enumerate(g.nodes):
        a = [env[j] for j, _ in n.args]
        at = n.attr_dict
        op = n.op
        if op == "input":
            v = ins[at["name"]]
        elif op == "matmul":
            v = a[0] @ a[1]
        elif op in ("add", "sub", "mul", "div", "maximum"):
            v = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
                 "maximum": torch.maximum}[op](a[0], a[1])
        elif op in ("sum", "mean"):
            v = getattr(torch, op)(a[0], dim=at["axis"], keepdim=True)
        elif op == "max":
            v = torch.amax(a[0], dim=at["axis"], keepdim=True)
        elif op == "rms_norm":
            x = a[0].float()
            v = (x * torch.rsqrt(x.pow(2).mean(dim=at["axis"], keepdim=True) + at["eps"])).to(a[0].dtype)
            if len(a) == 2:
                shape = [1] * x.dim()
                shape[at["axis"]] = -1
                v = v * a[1].view(shape)
        elif op == "exp":
            v = torch.exp(a[0])
        elif op == "silu":
            v = torch.nn.functional.silu(a[0])
        elif op == "gelu":
            v = torch.nn.functional.gelu(a[0], approximate="tanh")
        elif op == "relu":
            v = torch.relu(a[0])
        elif op == "sqrt":
            v = torch.sqrt(a[0])
        elif op == "rsqrt":
            v = torch.rsqrt(a[0])
        elif op == "square":
            v = a[0] * a[0]
        elif op == "neg":
            v = -a[0]
        elif op == "scale":
            v = a[0] * at["c"]
        elif op == "shift":
            v = a[0] + at["c"]
        elif op == "concat":
            v = torch.cat(a, dim=at["axis"])
        elif op == "transpose":
            v = a[0].transpose(at["a"], at["b"])
        else:
            raise ValueError(f"torch_eager: op {op}")
        env[i] = v
    return [env[i] for i, _ in g.outputs_refs]


def rel_err(outs: Any, ref: list[np.ndarray]) -> float:
    outs = outs if isinstance(outs, tuple) else (outs,)
    worst = 0.0
    for o, r in zip(outs, ref, strict=True):
        got = o.detach().double().cpu().numpy()
        if not np.isfinite(got).all():
            return math.inf
        worst = max(worst, float(np.abs(got - r).max() / max(np.abs(r).max(), 1e-30)))
    return worst


def bench(fn: Any, timing: bool) -> float | None:
    if not timing:
        return None
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))


def per_kernel_times(cp: Any, xs: dict[str, torch.Tensor], timing: bool) -> dict[str, float | None]:
    """Median time of each kernel of a compiled program, replaying its recorded launch."""
    mod = cp.module
    calls: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {}
    originals = {k.name: getattr(mod, k.name) for k in cp.kernels}

    class Rec:
        def __init__(self, name: str, k: Any) -> None:
            self.name, self.k = name, k

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kw: Any) -> Any:
                calls[self.name] = (grid, args, kw)
                return self.k[grid](*args, **kw)

            return launch

    try:
        for name, k in originals.items():
            setattr(mod, name, Rec(name, k))
        cp(**xs)
    finally:
        for name, k in originals.items():
            setattr(mod, name, k)
    out = {}
    for name, (grid, args, kw) in calls.items():
        k = originals[name]
        out[name] = bench(lambda k=k, grid=grid, args=args, kw=kw: k[grid](*args, **kw), timing)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="small shapes (CPU interpreter smoke test)")
    ap.add_argument("--out", default="gpu_check.json")
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    dev = "cuda" if gpu else "cpu"
    timing = gpu and not args.small
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if gpu else "cpu (Triton interpreter)",
        "capability": list(torch.cuda.get_device_capability()) if gpu else None,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "programs": {},
    }
    for name in vm.benchmarks.names():
        dtype = vm.bfloat16 if name == "qknorm_gqa" else vm.float16
        tdt = getattr(torch, dtype.torch_name)
        rec: dict[str, Any] = {"dtype": dtype.short}
        t0 = time.perf_counter()
        try:
            g = vm.benchmarks.get(name, batch=1, small=args.small, dtype=dtype)
            kw = small_design_kw(name) if args.small else {}
            mg = expert(name, g, **kw)
            gen = torch.Generator().manual_seed(0)
            cpu_in = {t.name: (0.3 * torch.randn(t.shape, generator=gen)).to(tdt) for t in g.inputs}
            xs = {k: v.to(dev) for k, v in cpu_in.items()}
            ref = vm.evaluate(g, cpu_in)
            cp = vm.compile(mg)
            out = cp(**xs)
            if gpu:
                torch.cuda.synchronize()
            rec["kernels"] = len(cp.kernels)
            rec["rel_err"] = rel_err(out, ref)
            rec["tol"] = TOL[dtype.short]
            rec["ok"] = rec["rel_err"] <= rec["tol"]
            rec["ms"] = bench(lambda cp=cp, xs=xs: cp(**xs), timing)
            rec["kernel_ms"] = per_kernel_times(cp, xs, timing)
            plain = vm.compile(g)
            rec["plain_kernels"] = len(plain.kernels)
            rec["plain_rel_err"] = rel_err(plain(**xs), ref)
            rec["plain_ms"] = bench(lambda p=plain, xs=xs: p(**xs), timing)
            rec["eager_rel_err"] = rel_err(tuple(torch_eager(g, xs)), ref)
            rec["eager_ms"] = bench(lambda g=g, xs=xs: torch_eager(g, xs), timing)
        except Exception as e:
            rec["ok"] = False
            rec["error"] = f"{type(e).__name__}: {e}"[:3000]
            rec["trace"] = traceback.format_exc()[-3000:]
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        info["programs"][name] = rec
        print(name, {k: v for k, v in rec.items() if k != "trace"}, flush=True)
        Path(args.out).write_text(json.dumps(info, indent=1))

    if gpu:
        try:  # CUDA-graph capture of a two-kernel program
            g = vm.benchmarks.get("gqa_stable", batch=1, small=args.small)
            cp = vm.compile(expert("gqa_stable", g))
            xs = [0.3 * torch.randn(t.shape, device="cuda").half() for t in g.inputs]
            eager_out = cp(*xs)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = cp(*xs)
            graph.replay()
            torch.cuda.synchronize()
            info["cuda_graph"] = {"ok": bool(torch.equal(out, eager_out))}
        except Exception as e:
            info["cuda_graph"] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        try:  # selection: expert vs plain, two configs
            from verimirage.backend.codegen import LaunchConfig
            from verimirage.backend.profile import select

            g = vm.benchmarks.get("gated_mlp", batch=1)
            res = select(g, [expert("gated_mlp", g), g], configs=[LaunchConfig(4, 2), LaunchConfig(8, 3)],
                         cache_root=Path("/tmp/vm_select"))
            info["select"] = [{"candidate": ["expert", "plain"][t.index], "config": t.config.key(), "ms": t.ms,
                               "error": t.error} for t in res]
            again = select(g, [expert("gated_mlp", g), g], configs=[LaunchConfig(4, 2), LaunchConfig(8, 3)],
                           cache_root=Path("/tmp/vm_select"))
            info["select_cached_same"] = [t.ms for t in again] == [t.ms for t in res]
        except Exception as e:
            info["select"] = {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-2000:]}
    Path(args.out).write_text(json.dumps(info, indent=1))
    ok = all(r.get("ok") for r in info["programs"].values())
    print("ALL OK" if ok else "FAILURES", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
