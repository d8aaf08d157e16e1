"""A focused GPU experiment: given verified candidates of a few cases, time each under a list of launch configs.

    python benchmarks/perf/focus.py --out DIR [--rep-ms 50] [--cases lora_bs1 lora_bs8]

Cases and candidates (μGraph texts; each is re-verified nowhere here: they come from files written on the CPU
machine after ``vm.verify`` proved them, and ``profile.select`` checks every (candidate, config) against the
float64 reference before timing it):

* mha_bs8 / mha_stable_bs8: ``cands/mha_tiles_bs8.json`` (1 or 2 heads per block x KV tiles of 64, 128, 256
  keys), against SDPA in the same run;
* lora_bs1 / lora_bs8: the candidates of ``benchmarks/candidates`` (their concat-fusion designs did not
  compile before codegen 4).

Writes ``focus.json`` (every timing, the ceilings, SDPA) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def configs(kind: str) -> list[Any]:
    from verimirage.backend.codegen import LaunchConfig, TileOptions
    from verimirage.backend.profile import DEFAULT_CONFIGS

    if kind == "lora":
        return list(DEFAULT_CONFIGS[:3])
    out = []
    for w, s, b1, e1 in ((4, 2, True, False), (4, 3, True, False), (4, 3, False, False), (4, 2, False, False),
                         (8, 2, True, False), (4, 2, True, True), (4, 3, True, True)):
        out.append(LaunchConfig(w, s, TileOptions(dot_min_m=16, dot_batch1=b1, evict_once=e1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rep-ms", type=int, default=50)
    ap.add_argument("--cases", nargs="*", default=None, help="only these cases (default: all four)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import torch
    from bench import bench as time_us
    from bench import ceilings, make_inputs, sdpa_fn
    from torch_eager import rel_err, torch_fn

    import verimirage as vm
    from verimirage.backend.profile import select

    args.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                           "torch": torch.__version__, "ceilings": ceilings(), "cases": {}}
    mha = json.loads((ROOT / "benchmarks/perf/cands/mha_tiles_bs8.json").read_text())
    plan: list[tuple[str, str, int, list[str]]] = []
    for case in ("mha_bs8", "mha_stable_bs8"):
        plan.append((case, case.rsplit("_bs", 1)[0], 8, [c["mugraph"] for c in mha[case]]))
    for b in (1, 8):
        d = json.loads((ROOT / f"benchmarks/candidates/lora_bs{b}.json").read_text())
        plan.append((f"lora_bs{b}", "lora", b, [c["mugraph"] for c in d["candidates"]]))
    if args.cases:
        plan = [p for p in plan if p[0] in args.cases]
    for case, name, batch, texts in plan:
        t0 = time.perf_counter()
        g = vm.benchmarks.get(name, batch=batch)
        ins = make_inputs(g, name, seed=batch)
        named = {t.name: x for t, x in zip(g.inputs, ins, strict=True)}
        cands = [vm.MuGraph.parse(t) for t in texts]
        rows = select(g, cands, inputs=named, cache=False, configs=configs(name), rep_ms=args.rep_ms)
        entry: dict[str, Any] = {"timings": [
            {"candidate": t.index, "grids": [list(k) for k in _grids(cands[t.index])], "config": t.config.key(),
             "us": None if t.ms is None else 1e3 * t.ms, "error": t.error} for t in rows]}
        if name in ("mha", "mha_stable"):
            ref = torch_fn(g)(*[x.double() for x in ins])
            sf, sins = sdpa_fn(name, g, ins)
            entry["sdpa_err"] = rel_err(sf(*sins), ref)
            entry["sdpa_us"] = time_us(lambda sf=sf, sins=sins: sf(*sins), cudagraph=True)
            best = next((t for t in rows if t.ok), None)
            if best is not None:  # the winner re-timed the way the harness times every variant
                fn = vm.compile(cands[best.index], config=best.config)
                entry["best_retimed_us"] = time_us(lambda fn=fn, ins=ins: fn(*ins), cudagraph=True)
                entry["sdpa_us_after"] = time_us(lambda sf=sf, sins=sins: sf(*sins), cudagraph=True)
        entry["wall_s"] = time.perf_counter() - t0
        doc["cases"][case] = entry
        (args.out / "focus.json").write_text(json.dumps(doc, indent=1))
        ok = [t for t in entry["timings"] if t["us"] is not None]
        logging.info("%s: %d/%d ok, best %s, sdpa %s, %.0fs", case, len(ok), len(entry["timings"]),
                     ok[0] if ok else None, entry.get("sdpa_us"), entry["wall_s"])
    return 0


def _grids(m: Any) -> list[tuple[int, ...]]:
    return [n.attr("block").grid for n in m.nodes if n.op == "custom"]


if __name__ == "__main__":
    sys.exit(main())
