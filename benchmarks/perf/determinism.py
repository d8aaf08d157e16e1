"""Run every committed candidate's compiled program many times on one set of inputs and count distinct outputs.

Every kernel verimirage generates is deterministic by construction (each block writes its own tiles; split
reductions combine their partials in a fixed order), so on a GPU each program must give the same bits on every
run. More than one distinct output means a race below the generator (Triton's pipelining: BENCHMARKS.md, "A wrong
result under pipelining") or in our launch path. GPU only::

    python benchmarks/perf/determinism.py --runs 30 --per-file 1 --json OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # (run as a file: this checkout's verimirage, not whatever else is installed)
    sys.path.insert(0, str(ROOT))


def committed(per_file: int, root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, rank, μGraph text) of the first ``per_file`` candidates of every committed candidate and proof file."""
    files = sorted(glob.glob(str(root / "benchmarks" / "candidates*" / "**" / "*.json"), recursive=True)
                   + glob.glob(str(root / "proofs" / "*.json")))
    seen: set[str] = set()
    out = []
    for f in files:
        doc = json.loads(Path(f).read_text())
        cands = doc.get("candidates") if isinstance(doc, dict) else None
        if cands is None:
            cands = [doc] if isinstance(doc, dict) and doc.get("mugraph") else []
        for r, c in enumerate(cands[:per_file]):
            t = c.get("mugraph") if isinstance(c, dict) else None
            if isinstance(t, str) and t not in seen:
                seen.add(t)
                out.append((str(Path(f).relative_to(root)), r, t))
    return out


def _bits(x):  # type: ignore[no-untyped-def]
    import torch

    if x.dtype == torch.bool:
        return x
    return x.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def run_one(mg_text: str, runs: int, max_elems: int = 1 << 28) -> dict | None:
    """Compile one μGraph, run it ``runs`` times on one set of random inputs (a large fp16 product in between every
    other run), and count the runs whose output differs bit for bit from the first; None where its inputs exceed
    ``max_elems``."""
    import torch

    import verimirage as vm

    mg = vm.MuGraph.parse(mg_text)
    g = torch.Generator(device="cuda").manual_seed(7)
    ins = []
    for x in mg.inputs:
        ty = x.type
        dt = getattr(torch, str(ty.dtype).split(".")[-1])
        if dt == torch.bool:
            ins.append(torch.rand(ty.shape, generator=g, device="cuda") < 0.5)
        else:
            ins.append((torch.randn(ty.shape, generator=g, device="cuda") * 0.5).to(dt))
    if sum(x.numel() for x in ins) > max_elems:
        return None
    prog = vm.compile(mg)
    junk = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    first = None
    differing = diff_elems = 0
    for i in range(runs):
        if i % 2:
            junk @ junk
        outs = prog(*ins)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        cur = [o.detach().clone() for o in outs]
        torch.cuda.synchronize()
        if first is None:
            first = cur
            continue
        d = sum(int((_bits(x) != _bits(y)).sum()) for x, y in zip(cur, first, strict=True))
        if d:
            differing += 1
            diff_elems = max(diff_elems, d)
    return {"runs": runs, "runs_differing": differing, "max_differing_elems": diff_elems, "launch": prog.launch}


def main() -> None:
    import torch

    import verimirage as vm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--per-file", type=int, default=1)
    ap.add_argument("--max-elems", type=int, default=1 << 28, help="skip programs with more input elements")
    ap.add_argument("--only", nargs="*", default=None, help="substrings of the files to run")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose committed candidates are run")
    a = ap.parse_args()
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    res = {"device": torch.cuda.get_device_name(0), "utc": now, "codegen": vm.__file__, "rows": []}
    for f, r, t in committed(a.per_file, a.root.resolve()):
        if a.only and not any(s in f for s in a.only):
            continue
        t0 = time.time()
        row: dict = {"file": f, "rank": r}
        try:
            got = run_one(t, a.runs, a.max_elems)
            if got is None:
                continue
            row.update(got)
            row["s"] = round(time.time() - t0, 2)
        except Exception as e:  # (a probe: record and go on)
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
        if a.json is not None:
            a.json.write_text(json.dumps(res, indent=1))
    bad = [x for x in res["rows"] if x.get("runs_differing")]
    print(f"{len(res['rows'])} programs, {len(bad)} not deterministic", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
