"""The idiomatic module corpus through ``backend="verimirage"``: correctness, coverage and (on a GPU) timings.

Usage::

    python benchmarks/corpus_capture.py [names,...|all] [--train] [--json out.json] [--budget S]
    python benchmarks/corpus_capture.py all --gpu --json out.json   # on a GPU: timings too

On a CPU (kernels in Triton's interpreter, small shapes) each module is
compiled with the eager fallback and compared against a float64 copy of
itself: outputs and, with ``--train``, the gradients of every parameter and
float input. The report's coverage (ATen compute ops in verimirage kernels)
and every op left behind with its reason are printed and written as JSON.

With ``--gpu`` (a CUDA machine) each module is also timed with CUDA graphs
(``torch.cuda.graphs``) against ``torch.compile`` default and max-autotune.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verimirage.benchmarks import modules as corpus
from verimirage.integrations.dynamo import backend
from verimirage.integrations.report import Report

log = logging.getLogger("corpus_capture")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max() / (b.detach().double().abs().max() + 1e-6))


def run_one(name: str, *, train: bool, budget: float, device: str, small: bool, dtype: torch.dtype) -> dict[str, Any]:
    """Compile, run and compare one corpus module; a dict of results."""
    torch._dynamo.reset()
    t0 = time.perf_counter()
    model, xs = corpus.get(name, small=small, dtype=dtype, device=device)
    ref = copy.deepcopy(model).double()
    xr = [x.detach().double() if x.is_floating_point() else x for x in xs]
    rep = Report()
    fallback = "inductor" if device == "cuda" else "eager"
    cm = torch.compile(model, backend=backend(report=rep, time_budget_s=budget, fallback=fallback))
    res: dict[str, Any] = {"name": name, "train": train}
    try:
        if train:
            xs = [x.detach().requires_grad_() if x.is_floating_point() else x for x in xs]
            xr = [x.requires_grad_() if x.is_floating_point() else x for x in xr]
            out, want = cm(*xs), ref(*xr)
            res["requires_grad"] = bool(out.requires_grad)
            out.float().sum().backward()
            want.sum().backward()
            pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)]
            pairs += [(a.grad, b.grad) for a, b in zip(xs, xr, strict=True) if a.is_floating_point()]
            res["grad_err"] = max((_rel(a, b) for a, b in pairs if b is not None and a is not None), default=0.0)
            res["grads_missing"] = sum((a is None) != (b is None) for a, b in pairs)
        else:
            with torch.no_grad():
                out, want = cm(*xs), ref(*xr)
        res["out_err"] = _rel(out, want)
    except Exception as e:  # recorded, not raised: one module must not stop the run
        log.exception("%s failed", name)
        res["error"] = f"{type(e).__name__}: {e}"
    res["seconds"] = time.perf_counter() - t0
    taken, total = rep.counts
    res.update(coverage=rep.coverage, taken=taken, total=total,
               partitions=[{"name": p.name, "ops": p.ops, "taken": p.taken, "reason": p.reason,
                            "kernels": len(p.kernels)} for p in rep.partitions],
               left=[{"graph": rep.graphs[r.graph], "op": r.op, "reason": rep.reason_of(r), "detail": r.detail}
                     for r in rep.left])
    return res


def time_one(name: str, *, budget: float, profile: bool) -> dict[str, Any]:
    """GPU forward timings (``triton.testing.do_bench``, µs): eager, torch.compile default, verimirage backend."""
    from triton.testing import do_bench

    model, xs = corpus.get(name, small=False, dtype=torch.float16, device="cuda")
    res: dict[str, Any] = {"name": name}
    with torch.no_grad():
        want = model(*xs)
        res["eager_us"] = do_bench(lambda: model(*xs)) * 1e3
        torch._dynamo.reset()
        cm = torch.compile(model)
        cm(*xs)
        res["compile_us"] = do_bench(lambda: cm(*xs)) * 1e3
        torch._dynamo.reset()
        rep = Report()
        vm_m = torch.compile(model, backend=backend(report=rep, time_budget_s=budget, profile=profile))
        got = vm_m(*xs)
        res["verimirage_us"] = do_bench(lambda: vm_m(*xs)) * 1e3
        res["out_err"] = _rel(got, want)
        res["coverage"] = rep.coverage
        res["partitions"] = [{"ops": p.ops, "taken": p.taken, "reason": p.reason, "measured_us": p.measured_us,
                              "fallback_us": p.fallback_us} for p in rep.partitions]
    return res


def _no_search() -> None:
    """Replace the search by the lifted graph itself (each op its own kernel): for machines without egglog."""
    import types

    import verimirage as vm

    vm.__dict__["superoptimize"] = lambda g, **kw: types.SimpleNamespace(candidates=[g], best=g)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="?", default="all")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--time", action="store_true", help="GPU forward timings (fp16, large shapes)")
    ap.add_argument("--profile", action="store_true", help="keep a partition only where it beats its ATen ops")
    ap.add_argument("--no-search", action="store_true", help="each lifted op its own kernel (no egglog needed)")
    args = ap.parse_args(argv)
    if args.no_search:
        _no_search()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    names = corpus.names() if args.names == "all" else args.names.split(",")
    device = "cuda" if args.gpu else "cpu"
    results = []
    if args.time:
        for name in names:
            try:
                r = time_one(name, budget=args.budget, profile=args.profile)
            except Exception as e:
                log.exception("%s failed", name)
                r = {"name": name, "error": f"{type(e).__name__}: {e}"}
            results.append(r)
            print(json.dumps(r), flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    for name in names:
        r = run_one(name, train=args.train, budget=args.budget, device=device, small=not args.gpu,
                    dtype=torch.float32)
        results.append(r)
        print(f"{name:24s} {r['taken']:3d}/{r['total']:3d} ops  out_err {r.get('out_err', float('nan')):.1e}  "
              f"grad_err {r.get('grad_err', 0.0):.1e}  {r['seconds']:.0f}s  {r.get('error', '')}", flush=True)
        for x in r["left"]:
            print(f"      left {x['graph']:9s} {x['op']:45s} {(x['reason'] or '')[:90]}", flush=True)
    taken = sum(r["taken"] for r in results)
    total = sum(r["total"] for r in results)
    print(f"TOTAL {taken}/{total} = {taken / max(total, 1):.3f}")
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else []
        keep = [o for o in old if (o["name"], o["train"]) not in {(r["name"], r["train"]) for r in results}]
        args.json.write_text(json.dumps(keep + results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
