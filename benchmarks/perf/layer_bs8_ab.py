"""A/B of the decoder layer at batch 8 (issue 23) between two source trees, in one device call.

Each run is its own process that imports ``verimirage`` and ``benchmarks/layer.py`` from one tree (``--tree``),
compiles that tree's candidate 0 of ``decode_bs8`` (from ``--cands``, default the tree's
``benchmarks/candidates/layer``) as ``benchmarks/layer.py gpu`` does (PDL "auto"; merged launches and apart), captures
it in a CUDA graph and times the replays (``layer._bench``: ``do_bench`` median), checks every output against the
float64 reference of the same inputs, and records each kernel's device time (PDL off, the profiler).
``drive`` runs A B A B (or A B C A B with ``--c-cands``: tree B's code on another candidate file) one after
another, each under its own time limit, and writes one JSON file of all the rows plus a short table.

    python3 benchmarks/perf/layer_bs8_ab.py drive --a . --b .carry/layerbs8 --out $OUT/ab

Raw rows: ``OUT/ab.json``, the runs' log tails ``OUT/ab.log``; the table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CASE = "decode_bs8"


def one(tree: Path, cands: Path, out: Path, label: str, kernels: bool, small: bool = False) -> None:
    """Time ``cands``' candidate 0 with ``tree``'s code (this process imports only that tree's package). ``small``:
    the scaled-down layer on the CPU (kernels in Triton's interpreter, no CUDA graph): a dry run of these steps."""
    sys.path[:0] = [str(tree.resolve()), str((tree / "benchmarks").resolve())]
    import copy

    import layer  # the tree's benchmarks/layer.py
    import torch

    import verimirage as vm
    from verimirage.benchmarks.layer_module import DecodeLayer, make_case

    row: dict[str, Any] = {"label": label, "tree": str(tree), "cands": str(cands), "verimirage": vm.__file__}
    cuda = torch.cuda.is_available()
    c = make_case(CASE, small=small, dtype=torch.float16 if cuda else torch.float32, device="cuda" if cuda else "cpu",
                  seed=0)
    m, xs, g, gins = c["module"], c["inputs"], c["graph"], c["graph_inputs"]
    if not cuda:  # (the dry run: the graph's kernels take fp16 inputs, the module runs in float32)
        gins = {k: v.half() if v.is_floating_point() else v for k, v in gins.items()}
    d = layer.dims(small)
    with torch.no_grad():
        m64 = copy.deepcopy(m).double()
        ref = m64(*[x.double() for x in xs])
        assert isinstance(m64, DecodeLayer)
        ref_new = tuple(cc[:, :, d.kv_len].reshape(-1, 1, d.head) for cc in (m64.k_cache, m64.v_cache))
        del m64
    if cuda:
        torch.cuda.empty_cache()
    ordered = [gins[t.name] for t in g.inputs]
    _, mgs, _ = layer.load(cands, CASE, small)
    mg = mgs[0]
    row["kernels"] = mg.num_kernels
    for merged in (True, False):
        key = "merged" if merged else "apart"
        try:
            with layer._pdl("auto"), layer._merge(merged):
                fn = vm.compile(mg, cuda_graph=cuda)
            if cuda:
                layer._precompile(fn, ordered)
            outs = fn(*ordered)
            outs = outs if isinstance(outs, tuple) else (outs,)
            err = max(layer._rel(outs[0].clone(), ref), layer._rel(tuple(o.clone() for o in outs[1:]), ref_new))
            us = layer._bench(lambda fn=fn: fn(*(fn.static_inputs or ordered)), cudagraph=False)
            row[key] = {"us": us, "err": err, "launches": len(fn.steps), "module": fn.module_digest}
        except Exception as e:
            row[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
    if kernels:
        per: dict[str, float] = {}
        with layer._pdl("off"), layer._merge(False):
            plain = vm.compile(mg)
        if cuda:
            layer._precompile(plain, ordered)
        layer._kernels(lambda: plain(*ordered), per)
        row["kernels_us"] = per
    out.write_text(json.dumps(row, indent=1))


def drive(args: argparse.Namespace) -> int:
    out = Path(args.out)  # OUT/ab.json and OUT/ab.log (the device tool brings back at most 8 files)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    logs: list[str] = []
    me = Path(__file__).resolve()
    runs = [("A", Path(args.a), None), ("B", Path(args.b), None)]
    if args.c_cands:
        runs.append(("C", Path(args.b), Path(args.c_cands)))
    order = runs + [r for r in runs if r[0] != "C"] * (args.rounds - 1)  # (C: once)
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for i, (label, tree, cands) in enumerate(order):
        if time.time() - t0 > args.budget_s:
            print(f"skipping {label} (round {i // len(runs) + 1}): past {args.budget_s} s", flush=True)
            continue
        f = work / f"{label}_{i}.json"
        cmd = [sys.executable, str(me), "one", "--tree", str(tree), "--out", str(f), "--label", label,
               "--cands", str(cands or tree / "benchmarks" / "candidates" / "layer")]
        if i < len(runs):
            cmd.append("--kernels")  # each variant's kernels once (the first round)
        if args.small:
            cmd.append("--small")
        t1 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.run_timeout_s, check=False)
        logs.append(f"== {label} {i}\n{p.stdout[-3000:]}{p.stderr[-5000:]}")
        if f.is_file():
            r = json.loads(f.read_text())
            r["wall_s"] = time.time() - t1
            rows.append(r)
        else:
            rows.append({"label": label, "error": f"rc {p.returncode}: {p.stderr[-600:]}"})
        print(f"{label}: {time.time() - t1:.0f} s", {k: rows[-1].get(k) for k in ("merged", "apart", "error")},
              flush=True)
    doc = {"case": CASE, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    try:
        import torch

        doc["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)"
    except Exception:
        pass
    (out.parent / f"{out.name}.json").write_text(json.dumps(doc, indent=1))
    (out.parent / f"{out.name}.log").write_text("\n".join(logs))
    print(f"device {doc.get('device')} · {doc['date']}")
    for label, _, _ in runs:
        mine = [r for r in rows if r.get("label") == label]
        for key in ("merged", "apart"):
            us = [r[key]["us"] for r in mine if "us" in r.get(key, {})]
            errs = [r[key]["err"] for r in mine if "err" in r.get(key, {})]
            if us:
                print(f"{label} {key}: median {statistics.median(us):.2f} us, runs {[round(u, 2) for u in us]}, "
                      f"err max {max(errs):.2e}")
    ks = {r["label"]: r["kernels_us"] for r in rows if "kernels_us" in r}
    names = sorted({n for k in ks.values() for n in k}, key=lambda n: (len(n), n))
    print("kernel " + " ".join(f"{lab:>8}" for lab in ks))
    for n in names:
        print(f"{n:<12} " + " ".join(f"{ks[lab].get(n, float('nan')):8.2f}" for lab in ks))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["drive", "one"])
    ap.add_argument("--a", default=".", help="drive: tree A (main)")
    ap.add_argument("--b", default=".carry/layerbs8", help="drive: tree B (the branch)")
    ap.add_argument("--c-cands", default=None, help="drive: also tree B's code on this candidate directory (C)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=130.0, help="drive: start no run after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=90.0)
    ap.add_argument("--out", required=True, help="drive: OUT/NAME writes OUT/NAME.json and OUT/NAME.log; one: a file")
    ap.add_argument("--work", default="/tmp/layer_bs8_ab", help="drive: each run's own row")
    ap.add_argument("--tree", default=".")
    ap.add_argument("--cands", default=None)
    ap.add_argument("--label", default="")
    ap.add_argument("--kernels", action="store_true")
    ap.add_argument("--small", action="store_true", help="the scaled-down layer on the CPU (a dry run)")
    args = ap.parse_args()
    if args.mode == "drive":
        return drive(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    one(Path(args.tree), Path(args.cands or Path(args.tree) / "benchmarks" / "candidates" / "layer"), Path(args.out),
        args.label, args.kernels, args.small)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
