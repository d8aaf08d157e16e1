"""layernorm_linear and the models picks that pass a ``tl.dot`` operand between kernels: the picks with that operand
stored in fp32 (before) and in its dtype (``codegen.DOT_OPERAND_STORAGE``), and one-kernel LayerNorm-folded designs
(device tool; issue 22, eighteenth session, lnfold).

    python3 benchmarks/perf/lnfold_ab.py [--cases layernorm_linear ...] [--folds] [--baselines layernorm_linear]
        [--again layernorm_linear] [--rounds 3] [--rep-ms 40] [--out DIR]

Each case's pick of the last models run (``benchmarks/results/models.json``'s ``verimirage_mugraph``) is compiled with
``VERIMIRAGE_PDL=auto`` and recommend's tiles under each code generator variant of :data:`VARIANTS` (module texts
that are the same share one timing); ``--folds`` adds the one-kernel designs of ``lnfold_ab_in.json`` (built on the
CPU from ``LN(x) W = ((x g) W - mu (g W)) * rstd + b W``, the row statistics as loop sums beside the product) for
layernorm_linear. Every module is checked against float64 on bench.py's inputs; layernorm_linear's also on inputs
whose rows have a mean far from 0 (``X + 2`` and ``X + 16`` at std 0.5, and rows of 64 with every 97th element
64.0625). Then all are timed in interleaved rounds as bench.py times them (CUDA-graph replays over rotated input
sets); eager and ``torch.compile`` (bench.INDUCTOR_MODE) for the ``--baselines`` cases in the same process. Rows go
to ``--out``/lnfold_ab.json; a table is printed last."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

#: name -> codegen module attributes it sets (the rest keep this commit's defaults)
VARIANTS: dict[str, dict[str, Any]] = {
    "f32store": {"DOT_OPERAND_STORAGE": False},
    "f16store": {"DOT_OPERAND_STORAGE": True},
    "f32store_again": {"DOT_OPERAND_STORAGE": False},
}
CASES = ["layernorm_linear", "lora_scaled", "gelu_mlp", "swiglu_ffn"]


def _probes(case: str, ins: list[Any]) -> dict[str, list[Any]]:
    """The input sets each module is checked on (layernorm_linear: also rows with a mean far from 0)."""
    import torch

    out = {"std": ins}
    if case == "layernorm_linear":
        x = ins[0]
        out["mean2"] = [x + 2.0, *ins[1:]]
        out["mean16"] = [x + 16.0, *ins[1:]]
        near = torch.full_like(x, 64.0)
        near[:, ::97] += 0.0625
        out["near64"] = [torch.where(torch.arange(x.shape[0], device=x.device)[:, None] % 2 == 0, near, x), *ins[1:]]
    return out


def run_case(case: str, args: argparse.Namespace, ceil: dict[str, float]) -> dict[str, Any]:
    """Compile, check and time ``case``'s variants (and baselines)."""
    import bench
    import torch

    import verimirage as vm
    from verimirage.backend import codegen
    from verimirage.backend.codegen import LaunchConfig

    g, _ = bench.case_graph(case, 1, True)
    ins = bench.make_inputs(g, case, seed=1)
    f = bench.torch_fn(g)
    by = bench.min_bytes(g)
    sets = [ins] + [bench.make_inputs(g, case, seed=1 + 1000 * i) for i in range(1, bench.rotation(by, True))]
    floor = 1e6 * max(by / ceil["copy_bytes_per_s"], bench.flops(g) / ceil["bf16_flops_per_s"])
    probes = _probes(case, ins)
    refs = {k: f(*[t.double() for t in v]) for k, v in probes.items()}
    models = json.loads((HERE.parent / "results" / "models.json").read_text())
    pick = next(r["verimirage_mugraph"] for r in models["rows"] if r["case"] == case)
    todo: list[tuple[str, str, dict[str, Any]]] = [(n, pick, s) for n, s in VARIANTS.items()
                                                   if case in args.again or not n.endswith("again")]
    if args.folds and case == "layernorm_linear":
        todo += [(k, v["mugraph"], {}) for k, v in json.loads((HERE / "lnfold_ab_in.json").read_text()).items()]
    row: dict[str, Any] = {"case": case, "floor_us": floor, "rotate": len(sets), "variants": {}}
    fns: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for name, text, settings in todo:
        rec: dict[str, Any] = {"settings": settings}
        row["variants"][name] = rec
        saved = {k: getattr(codegen, k) for k in settings}
        try:
            for k, v in settings.items():
                setattr(codegen, k, v)
            fn = vm.compile(vm.MuGraph.parse(text), config=LaunchConfig(tuned=True))
            same = next((n for n, t in texts.items() if t == fn.source), None)
            if same is not None and not name.endswith("again"):
                rec["same_as"] = same
                continue
            rec["launches"] = len(fn.steps)
            for k, v in probes.items():
                out = fn(*v)
                out = out if isinstance(out, torch.Tensor) else out[0]
                rec[f"err_{k}"] = bench.rel_err(out, refs[k])
                rec[f"nonfinite_{k}"] = int((~torch.isfinite(out)).sum())
            texts[name] = fn.source
            fns[name] = fn
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
        finally:
            for k, v in saved.items():
                setattr(codegen, k, v)
    if case in args.baselines:
        row["variants"]["eager"] = {"err_std": bench.rel_err(f(*ins), refs["std"])}
        fns["eager"] = f
    for r in range(args.rounds):
        for name, fn in fns.items():
            row["variants"][name].setdefault("us_rounds", []).append(bench.bench_sets(fn, sets))
        print(case, f"round {r}:", {n: round(v["us_rounds"][-1], 2) for n, v in row["variants"].items()
                                    if "us_rounds" in v}, flush=True)
    if case in args.baselines:
        t0 = time.perf_counter()
        cf = torch.compile(f, mode=bench.INDUCTOR_MODE)
        rec = {"err_std": bench.rel_err(cf(*ins), refs["std"])}
        rec["us_rounds"] = [bench.bench_sets(cf, sets) for _ in range(args.rounds)]
        rec["compile_s"] = time.perf_counter() - t0
        row["variants"]["inductor"] = rec
    for rec in row["variants"].values():
        if rec.get("us_rounds"):
            rec["us"] = sorted(rec["us_rounds"])[len(rec["us_rounds"]) // 2]
            rec["floor_fraction"] = floor / rec["us"]
    return row


def main() -> int:
    """Run the cases; write ``--out``/lnfold_ab.json; print a table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=CASES)
    ap.add_argument("--folds", action="store_true")
    ap.add_argument("--baselines", nargs="*", default=["layernorm_linear"])
    ap.add_argument("--again", nargs="*", default=["layernorm_linear"], help="cases whose first variant is timed twice")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    os.environ.setdefault("VERIMIRAGE_PDL", "auto")
    import bench
    import torch

    bench.REP_MS = args.rep_ms
    ceil = bench.ceilings()
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "torch": torch.__version__, "ceilings": ceil, "rep_ms": args.rep_ms,
                           "rounds": args.rounds, "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        doc["rows"].append(run_case(case, args, ceil))
        (args.out / "lnfold_ab.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['device']} {doc['date']} copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    print("| case | variant | launches | µs (rounds) | of floor | err | err mean2 / mean16 / near64 (nonfinite) |")
    print("|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        for name, v in r["variants"].items():
            if "same_as" in v:
                print(f"| {r['case']} | {name} | = {v['same_as']} | | | | |")
                continue
            rounds = ", ".join(f"{u:.2f}" for u in v.get("us_rounds", []))
            frac = f"{100 * v['floor_fraction']:.1f}%" if "floor_fraction" in v else ""
            far = " / ".join(f"{v[k]:.1e}" for k in ("err_mean2", "err_mean16", "err_near64") if k in v)
            nf = f" ({v['nonfinite_near64']})" if "nonfinite_near64" in v else ""
            err = f"{v['err_std']:.1e}" if "err_std" in v else v.get("error", "")
            print(f"| {r['case']} | {name} | {v.get('launches', '')} | {rounds} | {frac} | {err} | {far}{nf} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
