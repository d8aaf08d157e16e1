"""The models set's picks under variants of the code generator's PDL settings, timed side by side in one process
(device tool; issue 22, sixteenth session).

    python3 benchmarks/perf/pdl_models_ab.py [--cases NAME ...] [--variants NAME ...] [--rounds 4] [--out DIR]

Each case's pick of the last models run (``benchmarks/results/models.json``'s ``verimirage_mugraph``; else the
candidate file's first) is compiled with ``VERIMIRAGE_PDL=auto`` and recommend's tiles under each variant of
:data:`VARIANTS` (codegen module attributes). Variants whose module text is the same as an earlier one's share its
compiled program and timing (``same_as``). Each distinct module is checked against float64 (bench.py's inputs and
reference), then all are timed in ``--rounds`` interleaved rounds as bench.py times them (CUDA-graph replays over the
rotated input sets, ``--rep-ms`` windows); the median over rounds is reported, and the ``again`` variant (the first
variant compiled a second time) gives the spread of one module timed twice. Rows go to ``--out``/pdl_models_ab.json;
a table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

log = logging.getLogger("pdl_models_ab")

#: name -> codegen attributes it sets (the rest keep this commit's defaults); ``counters_outside_capture`` (not a
#: codegen attribute, a measurement only): the program's last-block counters are one buffer zeroed before any capture,
#: so a captured graph holds no fill kernel for them (unsafe for graphs replayed at once on several streams; the
#: runtime's own rule gives each capture fresh ones, zeroed in the graph)
_OFF = {"PDL_PREFETCH_FIRST_MAX_BLOCKS": 0, "PDL_PREFETCH_FIRST_START": False, "PDL_START_BEFORE_EARLY_LOOP": False,
        "PDL_LASTBLOCK_BEFORE_EARLY_LOOP": False}
_LB = {"PDL_START_BEFORE_EARLY_LOOP": True, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP": True}
VARIANTS: dict[str, dict[str, Any]] = {
    # main as of the fifteenth session's close (d9baf9a)
    "main": dict(_OFF),
    "again": dict(_OFF),
    # the program's first launch prefetches where its grid is one wave
    "pf132": {**_OFF, "PDL_PREFETCH_FIRST_MAX_BLOCKS": 132},
    # this commit's defaults (PDL_PREFETCH_FIRST_START: a first launch without a loop that starts the next early)
    "now": {},
    # a split and its combine as one launch that starts the early loop after it at its start
    "lb": {**_OFF, **_LB},
    "lb_pf132": {**_OFF, **_LB, "PDL_PREFETCH_FIRST_MAX_BLOCKS": 132},
    "lb_nofill": {**_OFF, **_LB, "counters_outside_capture": True},
    # seventeenth session: a looped product kernel's blocks that share streamed tiles launched first
    # (codegen.SHARER_ORDER) against this commit's other defaults (the 10:08 UTC call also had an "evict" variant,
    # a tuning rule since removed: benchmarks/results/pdl_models_ab_h100_2026-11-27_1008.json)
    "base": {"SHARER_ORDER": False},
    "again_base": {"SHARER_ORDER": False},
    # a few-block kernel (layernorm_linear's LayerNorm, 16 blocks) lets the next launch start at its start; that one
    # prefetches its first weight tiles into L2 before its wait (16 KB a block, none, 64 KB)
    "again_now": {},
    "own64": {"PDL_EARLY_OWN_MAX_BLOCKS": 64},
    "own64_nopf": {"PDL_EARLY_OWN_MAX_BLOCKS": 64, "PDL_PREFETCH_BYTES": 0},
    "own64_pf64k": {"PDL_EARLY_OWN_MAX_BLOCKS": 64, "PDL_PREFETCH_BYTES": 65536},
}

#: the models programs whose PDL text PDL_PREFETCH_FIRST_MAX_BLOCKS changes (fifteenth session's note)
CASES = ["lora_scaled", "layernorm_linear", "activations", "qkv_bias", "gelu_mlp", "decode_gqa", "rotary_attention"]


def _suite(case: str) -> tuple[str, int] | None:
    """(program, batch) of a suite case name such as ``gqa_bs8``; None for a models-set program."""
    head, _, b = case.rpartition("_bs")
    return (head, int(b)) if head and b.isdigit() else None


def _pick(case: str) -> str:
    root = HERE.parent
    suite = _suite(case)
    doc = json.loads((root / "results" / ("latest.json" if suite else "models.json")).read_text())
    for r in doc["rows"]:
        if r["case"] == case and r.get("verimirage_mugraph"):
            return str(r["verimirage_mugraph"])
    folder, name = ("candidates", case) if suite else ("candidates_models", case)
    return str(json.loads((root / folder / f"{name}.json").read_text())["candidates"][0]["mugraph"])


def _counters_outside_capture(fn: Any, ins: list[Any]) -> None:
    """Give compiled program ``fn`` one counter buffer, zeroed now, for every call, captured or not (its lean plan
    built now with the runtime's capture check answering no): a measurement of what the graph's fill kernel costs."""
    import torch

    from verimirage.backend import runtime

    if not fn.n_counters:
        return
    fixed = torch.zeros(fn.n_counters, dtype=torch.int32, device="cuda")
    fn.module._vm_counters = lambda device, n, stream=None, reset=False: fixed
    checker = runtime._capture_checker
    runtime._capture_checker = lambda: (lambda: False)
    try:
        fn(*ins)
        fn(*ins)
    finally:
        runtime._capture_checker = checker


def run_case(case: str, variants: list[str], rounds: int, ceil: dict[str, float]) -> dict[str, Any]:
    """Compile, check and time ``case``'s pick under each of ``variants``."""
    import bench

    import verimirage as vm
    from verimirage.backend import codegen
    from verimirage.backend.codegen import LaunchConfig

    suite = _suite(case)
    name_, batch = suite if suite else (case, 1)
    g, _ = bench.case_graph(name_, batch, not suite)
    ins = bench.make_inputs(g, name_, seed=1)
    ref = bench.torch_fn(g)(*[x.double() for x in ins])
    by = bench.min_bytes(g)
    sets = [ins] + [bench.make_inputs(g, name_, seed=1 + 1000 * i) for i in range(1, bench.rotation(by, True))]
    floor = 1e6 * max(by / ceil["copy_bytes_per_s"], bench.flops(g) / ceil["bf16_flops_per_s"])
    mg = vm.MuGraph.parse(_pick(case))
    row: dict[str, Any] = {"case": case, "floor_us": floor, "rotate": len(sets), "mugraph": str(mg), "variants": {}}
    fns: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for name in variants:
        rec: dict[str, Any] = {"settings": VARIANTS[name]}
        row["variants"][name] = rec
        settings = {k: v for k, v in VARIANTS[name].items() if k.isupper()}
        owner = {k: codegen for k in settings}
        saved = {k: getattr(owner[k], k) for k in settings}
        try:
            for k, v in settings.items():
                setattr(owner[k], k, v)
            t0 = time.perf_counter()
            fn = vm.compile(mg, config=LaunchConfig(tuned=True))
            same = next((n for n, t in texts.items() if t == fn.source), None)
            if same is not None and not name.startswith("again") and not VARIANTS[name].get("counters_outside_capture"):
                rec["same_as"] = same
                continue
            if VARIANTS[name].get("counters_outside_capture"):
                _counters_outside_capture(fn, ins)
            out = fn(*ins)
            rec["compile_s"] = time.perf_counter() - t0
            rec["launches"] = len(fn.steps)
            rec["err"] = bench.rel_err(out, ref)
            rec["prefetch_lines"] = max(0, fn.source.count("_vm_prefetch(") - 1)
            rec["last_block_launches"] = fn.source.count("in the last block of each group")
            texts[name] = fn.source
            fns[name] = fn
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
            log.exception("variant %s of %s failed", name, case)
        finally:
            for k, v in saved.items():
                setattr(owner[k], k, v)
    from pdl_prefetch import time_variants

    time_variants(row["variants"], fns, rounds, floor, lambda fn: bench.bench_sets(fn, sets))
    return row


def main() -> int:
    """Run the cases' variants; write ``--out``/pdl_models_ab.json; print a table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=CASES)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--rep-ms", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; expected some of {list(VARIANTS)}")
    os.environ["VERIMIRAGE_PDL"] = "auto"
    import bench
    import torch

    if not torch.cuda.is_available():
        print("pdl_models_ab: needs a CUDA device", file=sys.stderr)
        return 2
    bench.REP_MS = args.rep_ms
    ceil = bench.ceilings()
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "torch": torch.__version__, "ceilings": ceil, "rep_ms": args.rep_ms,
                           "rounds": args.rounds, "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        doc["rows"].append(run_case(case, args.variants, args.rounds, ceil))
        (args.out / "pdl_models_ab.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['device']} {doc['date']} copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    print("| case | variant | launches | µs (rounds) | floor fraction | err |")
    print("|---|---|---|---|---|---|")
    for r in doc["rows"]:
        for name, v in r["variants"].items():
            if "same_as" in v:
                print(f"| {r['case']} | {name} | = {v['same_as']} | | | |")
            elif "us" not in v:
                print(f"| {r['case']} | {name} | - | {v.get('error', '-')} | | |")
            else:
                rs = ", ".join(f"{x:.2f}" for x in v["us_rounds"])
                print(f"| {r['case']} | {name} | {v['launches']} | **{v['us']:.2f}** ({rs}) | "
                      f"{v['floor_fraction']:.1%} | {v['err']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
