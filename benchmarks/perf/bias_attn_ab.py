"""bias_attention's designs and kernel-text variants timed side by side in one process (device tool; issue 22,
seventeenth session).

    python3 benchmarks/perf/bias_attn_ab.py [--variants NAME ...] [--rounds 3] [--rep-ms 30] [--out DIR]

``main`` is the models set's pick (candidate 1: 64 x 64 tiles, 256 blocks) compiled by ``vm.compile`` with recommend's
tiles and ``VERIMIRAGE_PDL=auto``, as bench.py runs it (with ``codegen.SHARER_ORDER`` off, as main had it before the
seventeenth session; the calls of 10:05-10:17 UTC also had a tuning rule ``EVICT_SIDE_STREAM``, since removed,
off). Every other variant runs a stored candidate's generated module
(no PDL) through its own ``forward`` with the warps and stages it names, after an edit of the kernel's text
(:data:`EDITS`; ``direct`` is the unedited module at the tuned launch, the baseline of that family). The two
``pattern_*`` rows time only the bias stream: the same grid and loop reading BIAS tiles into a ``tl.dot`` with a
constant operand (pipelined like the kernel's loads), in the kernel's tile order (``tile``: 64 rows x 128 bytes a
step) and as contiguous 8 KB runs (``contig``). Each variant is checked against float64 (the pattern rows against
their own sums), then all are timed in ``--rounds`` interleaved rounds (CUDA-graph replays over bench.py's rotated
input sets); the median over rounds is reported.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

log = logging.getLogger("bias_attn_ab")
L2E = "1.4426950408889634"


def _sub(old: str, new: str) -> Any:
    def edit(src: str) -> str:
        if old not in src:
            raise ValueError(f"edit: {old!r} not in the kernel")
        return src.replace(old, new)
    return edit


def _bias_load(extra: str) -> Any:
    """Add ``extra`` to the bias tile's ``tl.load`` (the load of ``a3_ptr``)."""
    def edit(src: str) -> str:
        lines = src.split("\n")
        for i, ln in enumerate(lines):
            if ln.lstrip().startswith("v3 = tl.load(a3_ptr"):
                head, tail = ln.rsplit(").to(tl.float32)", 1)
                lines[i] = f"{head}{extra}).to(tl.float32){tail}"
                return "\n".join(lines)
        raise ValueError("edit: no bias load")
    return edit


def _kv_last(src: str) -> str:
    out = []
    for ln in src.split("\n"):
        s = ln.lstrip()
        if s.startswith(("v1 = tl.load(a1_ptr", "v2 = tl.load(a2_ptr")):
            head, tail = ln.rsplit(").to(tl.float32)", 1)
            ln = f'{head}, eviction_policy="evict_last").to(tl.float32){tail}'
        out.append(ln)
    return _bias_load(', eviction_policy="evict_first"')("\n".join(out))


def _chain(*fs: Any) -> Any:
    def edit(src: str) -> str:
        for f in fs:
            src = f(src)
        return src
    return edit


def _eye(bias_first: bool) -> Any:
    """The bias tile added by the tensor cores: loaded as a (64, 64) fp16 ``tl.dot`` operand and multiplied by a
    constant identity into the scores' accumulator (no conversion to fp32, no add in the registers)."""
    def edit(src: str) -> str:
        lines = src.split("\n")
        for i, ln in enumerate(lines):
            if ln.lstrip().startswith("v3 = tl.load(a3_ptr"):
                lines[i] = ("        b3 = tl.load(a3_ptr + (pid0 * 1) * a3_s0 + (pid1 * 64 + tl.arange(0, 64)[:, None])"
                            " * a3_s1 + (it * 64 + tl.arange(0, 64)[None, :]) * a3_s2)")
        src = "\n".join(lines)
        dot = "tl.dot(x2, y3, tl.dot(b3, eye))" if bias_first else "tl.dot(b3, eye, tl.dot(x2, y3))"
        src = _sub("        d1 = tl.reshape(tl.dot(x2, y3), (1, 64, 64))\n        v5 = (v3 + d1)",
                   f"        d1 = tl.reshape({dot}, (1, 64, 64))\n        v5 = d1")(src)
        eye = "    eye = (tl.arange(0, 64)[:, None] == tl.arange(0, 64)[None, :]).to(tl.float16)"
        return src.replace("    for it in range(0, 16):", f"{eye}\n    for it in range(0, 16):", 1)
    return edit


def _pf(dist: int) -> Any:
    """An L2 prefetch of the bias tile ``dist`` iterations ahead (one per 128-byte line: a row of the tile), issued
    at the top of each iteration: the pipeline's asynchronous copies then find it in L2."""
    line = ("        _vm_prefetch(a3_ptr + (pid0 * 1) * a3_s0 + (pid1 * 64 + tl.arange(0, 64)[:, None]) * a3_s1"
            f" + (tl.minimum(it + {dist}, 15) * 64 + tl.arange(0, 1)[None, :]) * a3_s2)")
    helper = ('@triton.jit\ndef _vm_prefetch(p):\n    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", '
              '[p], dtype=tl.int32, is_pure=False, pack=1)\n\n\n@triton.jit\ndef k4(')

    def edit(src: str) -> str:
        src = src.replace("    for it in range(0, 16):\n", f"    for it in range(0, 16):\n{line}\n", 1)
        return src.replace("@triton.jit\ndef k4(", helper, 1)
    return edit


#: text edits of the 64 x 64 design's kernel (candidate 1)
EDITS: dict[str, Any] = {
    "direct": None,
    "evict": _bias_load(', eviction_policy="evict_first"'),
    "kvlast": _kv_last,
    "swap": _chain(_sub("pid0 = tl.program_id(0)", "pid0 = tl.program_id(9)"),
                   _sub("pid1 = tl.program_id(1)", "pid1 = tl.program_id(0)"),
                   _sub("pid0 = tl.program_id(9)", "pid0 = tl.program_id(1)")),
    "ffma": _sub(f"tl.exp2((v5 - v7) * {L2E})", f"tl.exp2(v5 * {L2E} - v7 * {L2E})"),
    "nobias": _sub("v5 = (v3 + d1)", "v5 = d1"),
    "eye": _eye(False),
    "eye2": _eye(True),
    "eye_swap": _chain(_eye(False), _sub("pid0 = tl.program_id(0)", "pid0 = tl.program_id(9)"),
                       _sub("pid1 = tl.program_id(1)", "pid1 = tl.program_id(0)"),
                       _sub("pid0 = tl.program_id(9)", "pid0 = tl.program_id(1)")),
    "pf4": _pf(4),
    "pf6": _pf(6),
    "pf8": _pf(8),
    "pf6_swap": _chain(_pf(6), _sub("pid0 = tl.program_id(0)", "pid0 = tl.program_id(9)"),
                       _sub("pid1 = tl.program_id(1)", "pid1 = tl.program_id(0)"),
                       _sub("pid0 = tl.program_id(9)", "pid0 = tl.program_id(1)")),
    "biasacc": _chain(_sub("d1 = tl.reshape(tl.dot(x2, y3), (1, 64, 64))",
                           "d1 = tl.reshape(tl.dot(x2, y3, tl.reshape(v3, (64, 64))), (1, 64, 64))"),
                      _sub("v5 = (v3 + d1)", "v5 = d1")),
}

#: name -> (candidate index, warps, stages, edit name); ``main`` and ``pattern_*`` are special
VARIANTS: dict[str, tuple[int, int, int, str]] = {
    "main": (1, 0, 0, ""),
    "direct": (1, 4, 4, "direct"),
    "evict": (1, 4, 4, "evict"),
    "kvlast": (1, 4, 4, "kvlast"),
    "swap": (1, 4, 4, "swap"),
    "ffma": (1, 4, 4, "ffma"),
    "nobias": (1, 4, 4, "nobias"),
    "biasacc": (1, 4, 4, "biasacc"),
    "eye": (1, 4, 4, "eye"),
    "eye2": (1, 4, 4, "eye2"),
    "eye_swap": (1, 4, 4, "eye_swap"),
    "eye_s3": (1, 4, 3, "eye"),
    "pf4": (1, 4, 4, "pf4"),
    "pf6": (1, 4, 4, "pf6"),
    "pf8": (1, 4, 4, "pf8"),
    "pf6_swap": (1, 4, 4, "pf6_swap"),
    "pf6_s3": (1, 4, 3, "pf6"),
    "c1_s3": (1, 4, 3, "direct"),
    "c1_s5": (1, 4, 5, "direct"),
    "c0_w8s4": (0, 8, 4, "direct"),
    "c3_w4s2": (3, 4, 2, "direct"),
    "c3_w8s3": (3, 8, 3, "direct"),
    "pattern_tile": (1, 4, 4, ""),
    "pattern_contig": (1, 4, 4, ""),
}

PATTERN_SRC = '''
import triton
import triton.language as tl


@triton.jit
def rd(b_ptr, o_ptr, CONTIG: tl.constexpr):
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    r = tl.arange(0, 64)[:, None]
    c = tl.arange(0, 64)[None, :]
    ones = tl.full((64, 64), 1.0, tl.float16)
    acc = tl.zeros((64, 64), tl.float32)
    base = b_ptr + pid0 * 1048576 + pid1 * 65536
    for it in range(0, 16):
        if CONTIG:
            t = tl.load(base + it * 4096 + r * 64 + c)
        else:
            t = tl.load(base + r * 1024 + it * 64 + c)
        acc = tl.dot(t, ones, acc)
    tl.store(o_ptr + (pid0 * 16 + pid1) * 64 + tl.arange(0, 64), tl.sum(acc, axis=1) / 64.0)
'''


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    """Compile, check and time the variants; write ``--out``/bias_attn_ab.json; print a table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=30)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--dry", action="store_true", help="generate and edit the modules only (CPU)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ["VERIMIRAGE_PDL"] = "auto"
    import verimirage as vm
    from verimirage.backend import codegen, tuning

    # (the edits apply to the modules as main generated them before the seventeenth session's rule)
    codegen.SHARER_ORDER = False

    cands = json.loads((HERE.parent / "candidates_models" / "bias_attention.json").read_text())["candidates"]
    tmp = Path(tempfile.mkdtemp(prefix="bias_attn_ab_"))
    texts: dict[str, str] = {}
    for name in args.variants:
        idx, _, _, edit = VARIANTS[name]
        if name == "main" or name.startswith("pattern"):
            continue
        src = tuning.tuned_module(vm.MuGraph.parse(cands[idx]["mugraph"]), {}).source
        texts[name] = EDITS[edit](src) if EDITS.get(edit) else src
        (tmp / f"v_{name}.py").write_text(texts[name])
    if args.dry:
        print(tmp)
        return 0
    import bench
    import torch

    from verimirage.backend.codegen import LaunchConfig

    bench.REP_MS = args.rep_ms
    ceil = bench.ceilings()
    g, _ = bench.case_graph("bias_attention", 1, True)
    ins = bench.make_inputs(g, "bias_attention", seed=1)
    ref = bench.torch_fn(g)(*[x.double() for x in ins])
    by = bench.min_bytes(g)
    sets = [ins] + [bench.make_inputs(g, "bias_attention", seed=1 + 1000 * i)
                    for i in range(1, bench.rotation(by, True))]
    floor = 1e6 * max(by / ceil["copy_bytes_per_s"], bench.flops(g) / ceil["bf16_flops_per_s"])
    (tmp / "pattern.py").write_text(PATTERN_SRC)
    pat = _load(tmp / "pattern.py", "bias_pattern")
    recs: dict[str, dict[str, Any]] = {}
    fns: dict[str, Any] = {}
    for name in args.variants:
        idx, w, s, _ = VARIANTS[name]
        rec: dict[str, Any] = {"candidate": idx, "warps": w, "stages": s}
        recs[name] = rec
        t0 = time.perf_counter()
        try:
            if name == "main":
                fn = vm.compile(vm.MuGraph.parse(cands[idx]["mugraph"]), config=LaunchConfig(tuned=True))
                rec["err"] = bench.rel_err(fn(*ins), ref)
            elif name.startswith("pattern"):
                contig = name.endswith("contig")
                o = torch.empty(16 * 16 * 64, device="cuda", dtype=torch.float32)

                def fn(*xs: Any, _o: Any = o, _c: bool = contig) -> Any:
                    pat.rd[(16, 16)](xs[3], _o, CONTIG=_c, num_warps=4, num_stages=4)
                    return _o
                b = ins[3].float().reshape(16, 16, 64 * 1024)
                want = (b.reshape(16, 16, 16, 64, 64).sum(dim=(2, 4)) if contig
                        else b.reshape(16, 16, 64, 16, 64).sum(dim=(3, 4)))
                got = fn(*ins).reshape(16, 16, 64)
                rec["err"] = float((got - want).norm() / want.norm())
            else:
                mod = _load(tmp / f"v_{name}.py", f"bias_v_{name}")
                kname = next(iter(mod.LAUNCH))
                mod.LAUNCH[kname] = {"num_warps": w, "num_stages": s}
                fn = mod.forward
                rec["err"] = bench.rel_err(fn(*ins), ref)
            torch.cuda.synchronize()
            rec["compile_s"] = time.perf_counter() - t0
            fns[name] = fn
        except Exception as e:
            rec["error"] = f"{type(e).__name__}: {e}"[:300]
            log.exception("variant %s failed", name)
    from pdl_prefetch import time_variants

    time_variants(recs, fns, args.rounds, floor, lambda fn: bench.bench_sets(fn, sets))
    doc = {"device": torch.cuda.get_device_name(),
           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
           "ceilings": ceil, "floor_us": floor, "rep_ms": args.rep_ms, "rounds": args.rounds, "rotate": len(sets),
           "variants": recs, "texts": texts}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bias_attn_ab.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['device']} {doc['date']} copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s floor {floor:.2f} us")
    print("| variant | cand | w | s | µs (rounds) | of floor | err | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in recs.items():
        if "us" not in r:
            print(f"| {name} | {r['candidate']} | {r['warps']} | {r['stages']} | {r.get('error', '-')} | | | |")
            continue
        rs = ", ".join(f"{x:.2f}" for x in r["us_rounds"])
        print(f"| {name} | {r['candidate']} | {r['warps']} | {r['stages']} | **{r['us']:.2f}** ({rs}) | "
              f"{r['floor_fraction']:.1%} | {r['err']:.1e} | {r['compile_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
