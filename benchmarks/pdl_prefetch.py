"""The decoder layer's launch variants timed side by side in one process (issue 23; perf/NOTES.md session 15).

    python3 benchmarks/pdl_prefetch.py [--cases decode_bs1 decode_bs8] [--variants NAME ...] [--rounds 3] [--out DIR]

Each case's committed best candidate (benchmarks/candidates/layer) is compiled (as merged launches with programmatic
dependent launch "auto", the layer harness's fastest lowering, unless the variant says otherwise) under each variant of
the code generator's options, all in one process on the same inputs:

- ``own``: codegen.PDL_EARLY_OWN_MAX_BLOCKS (a kernel of at most that many blocks lets the next one launch at its
  start; 0: only the next kernel's blocks decide, as before),
- ``pf``: codegen.PDL_PREFETCH_BYTES (each kernel prefetches into L2, before its ``gdc_wait``, up to that many bytes a
  block of the tiles it reads of the program's inputs; 0: none, as before),
- ``lb``: last-block combines (``VERIMIRAGE_LASTBLOCK``),
- ``early``: codegen.PDL_PREFETCH_EARLY_ONLY (prefetches only in a kernel the launch before it lets launch at its
  start),
- ``wrap.GEMV_TILE_N`` / ``GEMV_TILE_K`` / ``GEMV_MAX_ROWS``: the default tiles of a bare few-row product (64 / 64: as
  before session 15; 32 / 256 and one row: before session 19),
- ``chunk``: codegen.CHUNK_ROW_DOTS (a deep one-step one-row product as a loop of 16-row dots),
- ``gemv``: (stages, warps) for every weight-streaming few-row product loop (a stand-in for the tuning rules),
- ``edit``: experiment-only retilings of decode_bs1's candidate 0 (:data:`EDITS`, not verified; outputs still
  checked against float64),
- ``merge`` / ``pdl``: merged launches off, PDL off,
- ``cN`` (any N): the case's committed candidate N at the code generator's defaults.

``--kernels`` also times each kernel of those variants on its own (PDL off, launched apart, the profiler's medians).
The variants of session 19 (``main18`` ... ``n64_apart``) ran before the defaults they name changed: their rows in
benchmarks/results/layer19_h100_2026-11-27/ say what each measured.

Every variant's outputs are compared with float64 and, bit for bit, with the first variant's (the options change
where kernels wait and what they prefetch, never what they compute), and 20 repeated calls must give the same bits.
The variants are then timed in ``--rounds`` interleaved rounds (CUDA-graph replays, ``do_bench`` medians); the
median over rounds is reported. Rows go to ``--out``/pdl_prefetch.json; a table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import layer as L

import verimirage as vm
from verimirage.backend import codegen

log = logging.getLogger("pdl_prefetch")

#: name -> the code generator's settings (module ``codegen`` or ``wrap``, attribute: value), ``lb`` (last-block
#: combines), ``merge`` (merged launches) and ``pdl`` (the PDL mode); the variants of 04:32 and 04:38 ran before the
#: defaults changed (their ``before`` and ``own_*`` are the code generator of then: GEMV tiles as every product's)
def _v(own: int = 64, pf: int = 16384, early: bool = False, lb: bool = False, merge: bool = True, pdl: str = "auto",
       chunk: bool = True, gemv_stages: int = 0, gemv_warps: int = 0, **wrap: int) -> dict[str, Any]:
    return {"codegen.PDL_EARLY_OWN_MAX_BLOCKS": own, "codegen.PDL_PREFETCH_BYTES": pf,
            "codegen.PDL_PREFETCH_EARLY_ONLY": early, "codegen.CHUNK_ROW_DOTS": chunk, "lb": lb, "merge": merge,
            "pdl": pdl, "gemv": (gemv_stages, gemv_warps), **{f"wrap.{k}": x for k, x in wrap.items()}}


def _d(lb: bool = False, merge: bool = True, pdl: str = "auto", edit: tuple[str, ...] = (), cand: int = 0,
       **settings: Any) -> dict[str, Any]:
    """A variant of the code generator's defaults as they are, with only ``settings`` changed (``chunk``: codegen.
    CHUNK_ROW_DOTS, ``own``: codegen.PDL_EARLY_OWN_MAX_BLOCKS; anything else a ``wrap`` attribute), of the case's
    committed candidate ``cand`` (0: the best). :func:`_v` sets every PDL option, to its defaults of session 15 (own
    64, prefetches everywhere): not the defaults since run 20."""
    names = {"chunk": "codegen.CHUNK_ROW_DOTS", "own": "codegen.PDL_EARLY_OWN_MAX_BLOCKS",
             "small": "codegen.MERGE_SMALL_MAX_BLOCKS", "chained": "chained"}
    return {"lb": lb, "merge": merge, "pdl": pdl, "edit": edit, "cand": cand,
            **{names.get(k, f"wrap.{k}"): x for k, x in settings.items()}}


#: main's code generator before the nineteenth session's layer work: one-row products deeper than 256 in one step as a
#: broadcast multiply and sum, the GEMV tiles for one-row bare products only
MAIN18 = {"chunk": False, "GEMV_MAX_ROWS": 1, "GEMV_TILE_N": 32, "GEMV_TILE_K": 256}


#: the one-row products' default tiles before wrap.GEMV_TILE_N / GEMV_TILE_K (those of every product)
OLD_GEMV = {"GEMV_TILE_N": 64, "GEMV_TILE_K": 64}

VARIANTS: dict[str, dict[str, Any]] = {
    "before": _v(0, 0, **OLD_GEMV),  # PDL auto and merged launches as before this work
    "own": _v(64, 0, **OLD_GEMV),
    "pf64k": _v(0, 65536, **OLD_GEMV),
    "own_pf1": _v(64, 1, **OLD_GEMV),
    "own_pf8k": _v(64, 8192, **OLD_GEMV),
    "own_pf16k": _v(64, 16384, **OLD_GEMV),
    "own_pf32k": _v(64, 32768, **OLD_GEMV),
    "own_pf64k": _v(64, 65536, **OLD_GEMV),
    "own_pf256k": _v(64, 262144, **OLD_GEMV),
    "own_pf64k_lb": _v(64, 65536, lb=True, **OLD_GEMV),
    "own_pf16k_early": _v(64, 16384, True, **OLD_GEMV),
    "own_pf32k_early": _v(64, 32768, True, **OLD_GEMV),
    "own_pf64k_early": _v(64, 65536, True, **OLD_GEMV),
    "own_pf1_early": _v(64, 1, True, **OLD_GEMV),
    "gemv_only": _v(0, 0),  # the one-row product's tiles alone
    "now": _d(),  # every default of the code generator as it is
    "now_apart": _d(merge=False),
    "now_nopdl": _d(pdl="off"),
    "now_apart_nopdl": _d(merge=False, pdl="off"),
    "main18": _d(**MAIN18),
    "main18_apart": _d(merge=False, **MAIN18),
    "now_lb": _d(lb=True),
    "n32": _d(GEMV_TILE_N=32, GEMV_TILE_K=256),  # (the GEMV tiles of before this session; chunked row dots)
    "n32_apart": _d(merge=False, GEMV_TILE_N=32, GEMV_TILE_K=256),
    "k256": _d(GEMV_TILE_K=256),
    "own64": _d(own=64),
    "q64": _d(edit=("q64",)),
    "q64_kv64": _d(edit=("q64", "kv64")),
    "q64_kv64_lb": _d(lb=True, edit=("q64", "kv64")),
    # session 20: decode_bs1's candidates 1 and 2 (the former candidate 0: the q/k/v rotary regions of 2026-11-27
    # 16:33; candidate 1 those regions searched as their connected parts, the k projection's split-K combine with its
    # rotary; candidate 0 also the q projection searched with its rotary, split over K with the rotary in the combine)
    "c1": _d(cand=1),
    "c2": _d(cand=2),
    "c1_q64": _d(cand=1, edit=("q64",)),
    "c2_q64": _d(cand=2, edit=("q64",)),
    "c1_own64": _d(cand=1, own=64),
    "now_own64": _d(own=64),
    "small32": _d(small=32),  # kernels of at most 32 blocks merged whatever their warps (call 3: tuning.merge_key's
    # key 0 for them; now codegen.MERGE_SMALL_MAX_BLOCKS, which joins only launches all of whose kernels are small)
    "small0": _d(small=0),
    "attn_w8": _d(chained=(0, 8)),  # chained-product kernels (attention's) at 8 warps
    "small32_attn_w8": _d(small=32, chained=(0, 8)),
    # session 19, calls 1-2 (15:58, 16:01 UTC) ran these through _v (own 64, prefetches everywhere), and "now" /
    # "main18" / "now_lb" / "now_apart" / "main18_apart" then meant _v(...) of the same settings
    "v_now": _v(),
    "v_main18": _v(**MAIN18),  # type: ignore[arg-type]
    "gemv_s6": _v(gemv_stages=6),
    "gemv_s8": _v(gemv_stages=8),
    "gemv_w8": _v(gemv_warps=8),
    "gemv_k128": _v(GEMV_TILE_K=128),
    "gemv_k512": _v(GEMV_TILE_K=512),
    "gemv_n16": _v(GEMV_TILE_N=16),
    "gemv_n64": _v(GEMV_TILE_N=64),
    "gemv_n128": _v(GEMV_TILE_N=128),
    "n64_k128": _v(GEMV_TILE_N=64, GEMV_TILE_K=128),
    "n64_lb": _v(lb=True, GEMV_TILE_N=64),
    "n64_q64": {**_v(GEMV_TILE_N=64), "edit": ("q64",)},
    "n64_kv64": {**_v(GEMV_TILE_N=64), "edit": ("kv64",)},
    "n64_kv8": {**_v(GEMV_TILE_N=64), "edit": ("kv8",)},
    "n64_down64": {**_v(GEMV_TILE_N=64), "edit": ("down64",)},
    "n64_all64": {**_v(GEMV_TILE_N=64), "edit": ("q64", "kv64", "down64")},
    "n64_apart": _v(merge=False, GEMV_TILE_N=64),
}


def _retile(text: str, node: int, subs: tuple[tuple[str, str], ...]) -> str:
    """``text`` (a μGraph) with ``subs`` replaced inside custom node ``%node``'s header and block graph."""
    start = text.index(f"\n  %{node} = custom ")
    end = text.index("\n  }\n", start)
    seg = text[start:end]
    for a, b in subs:
        if a not in seg:
            raise ValueError(f"retile: {a!r} not in node %{node}")
        seg = seg.replace(a, b)
    return text[:start] + seg + text[end:]


_COL64 = (("f16[256,32]", "f16[256,64]"), ("f16[1,32]", "f16[1,64]"))
#: experiment-only retilings of decode_bs1's candidate 0 (NOT verified: timed to decide what the search should be
#: made to pick; every output is still compared with float64): name -> (node, substitutions) edits
EDITS: dict[str, tuple[tuple[int, tuple[tuple[str, str], ...]], ...]] = {
    "q64": ((15, (("grid=(128,)", "grid=(64,)"), *_COL64)),),
    "down64": ((28, (("grid=(128,)", "grid=(64,)"), *_COL64)),),
    "kv64": tuple((n, (("grid=(32, 4)", "grid=(16, 4)"), ("f16[1024,32]", "f16[1024,64]"), ("f16[1,32]", "f16[1,64]")))
                  for n in (16, 19)) + tuple((n, (("grid=(32,)", "grid=(16,)"), ("f16[1,32]", "f16[1,64]")))
                                             for n in (17, 20)),
    "kv8": tuple((n, (("grid=(32, 4)", "grid=(32, 8)"), ("f16[1,1024]", "f16[1,512]"), ("f16[1024,32]", "f16[512,32]"),
                      ("f16[4,1024]", "f16[8,1024]"))) for n in (16, 19))
    + tuple((n, (("frange=4", "frange=8"), ("shape=(4, 1024)", "shape=(8, 1024)"))) for n in (17, 20)),
}


def edited(mg: Any, names: tuple[str, ...]) -> Any:
    """``mg`` with the :data:`EDITS` ``names`` applied."""
    from verimirage.ir.graph import MuGraph

    text = str(mg)
    for name in names:
        for node, subs in EDITS[name]:
            text = _retile(text, node, subs)
    return MuGraph.parse(text) if names else mg


def _chained_patch(stages: int, warps: int) -> Any:
    """A stand-in for ``tuning._measured`` that launches every kernel whose product consumes another's (attention's P @
    V after Q K^T) with ``stages`` / ``warps`` (0: as the rules give), to measure."""
    from verimirage.backend import tuning

    orig = tuning._measured

    def patched(bg: Any, arg_types: Any) -> Any:
        from dataclasses import replace

        c = orig(bg, arg_types)
        if tuning.kernel_shape(bg, arg_types).chained:
            c = replace(c, num_stages=stages or c.num_stages, num_warps=warps or c.num_warps)
        return c

    return orig, patched


def _gemv_patch(stages: int, warps: int) -> Any:
    """A stand-in for ``tuning._measured`` that launches every weight-streaming few-row product loop (16-row dots,
    eight or more K steps, no chained products) with ``stages`` / ``warps`` (0: as the rules give), to measure."""
    from verimirage.backend import tuning

    orig = tuning._measured

    def patched(bg: Any, arg_types: Any) -> Any:
        from dataclasses import replace

        c = orig(bg, arg_types)
        s = tuning.kernel_shape(bg, arg_types)
        if s.matmuls and s.dot_rows <= 16 and s.frange >= 8 and not s.chained:
            c = replace(c, num_stages=stages or c.num_stages, num_warps=warps or c.num_warps)
        return c

    return orig, patched


def _apply(settings: dict[str, Any]) -> dict[str, Any]:
    """Set ``settings`` (but ``lb``) on the modules; returns the values they replaced."""
    from verimirage.backend import tuning, wrap

    mods = {"codegen": codegen, "wrap": wrap, "tuning": tuning}
    old = {}
    for key, val in settings.items():
        if key in ("gemv", "chained"):
            if any(val):
                orig, patched = (_gemv_patch if key == "gemv" else _chained_patch)(*val)
                old.setdefault("tuning._measured", orig)
                tuning._measured = patched
            continue
        if key in ("lb", "merge", "pdl", "edit", "cand"):
            continue
        mod, attr = key.split(".")
        old[key] = getattr(mods[mod], attr)
        setattr(mods[mod], attr, val)
    return old


def run_case(case: str, variants: list[str], rounds: int, copy_rate: float,
             kernel_variants: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile, check and time ``case``'s best candidate under each of ``variants``."""
    import torch

    from verimirage.benchmarks.layer_module import make_case

    c = make_case(case, small=False, dtype=torch.float16, device="cuda", seed=0)
    m, xs, gins, g = c["module"], c["inputs"], c["graph_inputs"], c["graph"]
    with torch.no_grad():
        import copy

        m64 = copy.deepcopy(m).double()
        ref = m64(*[x.double() for x in xs])
        del m64
    torch.cuda.empty_cache()
    ordered = [gins[t.name] for t in g.inputs]
    _, cands, _ = L.load(L.DEFAULT_CANDIDATES, case, small=False)
    d = L.dims(False)
    kv = sum(t.numel() * t.element_size() for n, t in gins.items() if n in ("KC", "VC"))
    floor = 1e6 * (2 * d.weight_elems() + kv) / copy_rate
    row: dict[str, Any] = {"case": case, "floor_us": floor, "variants": {}}
    fns: dict[str, Any] = {}
    first: Any = None
    for name in variants:
        settings = VARIANTS[name]
        mg = cands[settings.get("cand", 0)]
        rec: dict[str, Any] = {"settings": settings}
        row["variants"][name] = rec
        saved = _apply(settings)
        try:
            lb = bool(settings.get("lb"))
            with L._pdl(settings.get("pdl", "auto")), L._merge(bool(settings.get("merge", True))):
                t0 = time.perf_counter()
                fn = vm.compile(edited(mg, settings.get("edit", ())), cuda_graph=True, last_block=lb)
                L._precompile(fn, ordered)
            outs = fn(*ordered)
            out0 = (outs if isinstance(outs, tuple) else (outs,))[0].clone()
            rec["compile_s"] = time.perf_counter() - t0
            rec["launches"] = len(fn.steps)
            rec["err"] = L._rel(out0, ref)
            if first is None:
                first = out0
            rec["same_bits_as_first"] = bool(torch.equal(out0.view(torch.int16), first.view(torch.int16)))
            rec["repeat_same"] = all(bool(torch.equal(
                (o if isinstance(o, tuple) else (o,))[0].view(torch.int16), out0.view(torch.int16)))
                for o in (fn(*(fn.static_inputs or ordered)) for _ in range(20)))
            rec["prefetch_lines"] = max(0, fn.source.count("_vm_prefetch(") - 1)  # (less the helper's definition)
            rec["launch"] = {k: {a: b for a, b in v.items() if a in ("num_warps", "num_stages")}
                             for k, v in getattr(fn, "launch", {}).items()}
            fns[name] = fn
            if name in kernel_variants:  # each kernel's own time: PDL off, launched apart, the profiler's medians
                with L._pdl("off"), L._merge(False):
                    plain = vm.compile(edited(mg, settings.get("edit", ())), last_block=lb)
                rec["kernels_us"] = L._kernel_medians(lambda p=plain: p(*ordered))
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:400]
            log.exception("variant %s of %s failed", name, case)
        finally:
            _apply(saved)
    time_variants(row["variants"], fns, rounds, floor,
                  lambda fn: L._bench(lambda: fn(*(fn.static_inputs or ordered)), cudagraph=False))
    return row


def time_variants(recs: dict[str, dict[str, Any]], fns: dict[str, Any], rounds: int, floor: float,
                  time_one: Any) -> None:
    """Time each of ``fns`` (by variant name) ``rounds`` times, interleaved (a drift of the card's clocks reaches every
    variant alike), with ``time_one(fn)`` (µs): each variant's ``recs[name]`` gets ``us_rounds``, their median ``us``
    and ``floor_fraction`` (``floor`` over it)."""
    for _ in range(rounds):
        for name, fn in fns.items():
            recs[name].setdefault("us_rounds", []).append(time_one(fn))
    for name in fns:
        recs[name]["us"] = statistics.median(recs[name]["us_rounds"])
        recs[name]["floor_fraction"] = floor / recs[name]["us"]


def main() -> int:
    """Run the cases' variants; write ``--out``/pdl_prefetch.json; print a table."""
    import torch

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["decode_bs1", "decode_bs8"])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", nargs="*", default=[], help="variants whose kernels are also timed one by one")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for v in args.variants:  # ``cN``: the case's committed candidate N at the defaults (any N)
        if re.fullmatch(r"c\d+", v) and v not in VARIANTS:
            VARIANTS[v] = _d(cand=int(v[1:]))
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variants {bad}; expected some of {list(VARIANTS)}")
    if not torch.cuda.is_available():
        print("pdl_prefetch: needs a CUDA device", file=sys.stderr)
        return 2
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    b = torch.empty_like(a)
    copy_rate = 2 * n / (L._bench(lambda: b.copy_(a), cudagraph=False) * 1e-6)
    doc: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "torch": torch.__version__, "copy_bytes_per_s": copy_rate, "rows": []}
    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        doc["rows"].append(run_case(case, args.variants, args.rounds, copy_rate, tuple(args.kernels)))
        (args.out / "pdl_prefetch.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['device']} {doc['date']} copy {copy_rate / 1e12:.2f} TB/s")
    print("| case | variant | launches | µs (rounds) | floor fraction | err | same bits | repeat same |")
    print("|---|---|---|---|---|---|---|---|")
    for r in doc["rows"]:
        for name, v in r["variants"].items():
            if "us" not in v:
                print(f"| {r['case']} | {name} | - | {v.get('error', '-')} | | | | |")
                continue
            rs = ", ".join(f"{x:.1f}" for x in v["us_rounds"])
            print(f"| {r['case']} | {name} | {v['launches']} | **{v['us']:.1f}** ({rs}) | {v['floor_fraction']:.0%} | "
                  f"{v['err']:.1e} | {v['same_bits_as_first']} | {v['repeat_same']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
