"""Make the seventeenth session's A/B of the compute-bound attention programs (issue 22, attn17) for
``attn_probe.py`` (``ATTN_VARIANTS=attn17_variants``), each a module under ``attn17_variants/``:

    python benchmarks/perf/attn17_variants.py

For causal_attention, softcap_attention and rotary_attention candidate 0 (each program's committed first, the
profiled pick of run 23):

* ``gen``: the kernel main generates now (since 22c14af the floored online softmax's exp is
  ``tl.exp2((x - m) * log2e)`` again: codegen 11's form);
* ``texp``: the same kernel with that exp as ``tl.exp(x - m)``, i.e. what main generated for the floored candidates
  between d5f2c31/a0126a5 (11:09 UTC) and 22c14af (``_max_shift`` did not see through ``RUNNING_MAX_FLOOR``'s
  clamp): the before of the A/B (sm_90 SASS, w4 s2: causal's loop 331 instructions, the tl.exp form adds the
  non-ftz ex2's fix-up, about 3 an element);
* causal ``rev``: the row blocks launched longest first (the row-block program id reversed), a launch-order
  hypothesis for the causal imbalance (1 to 16 iterations a block, two 64-row blocks an SM);
* causal and softcap ``zig``: the row blocks launched longest half first, then the shortest half from the
  shortest (:func:`zigzag_rows`): the hypothesis that the causal kernels are bound by the most loaded SM (row ``r``
  beside row ``r + 8``: up to 24 iterations an SM against a mean of 16.5), not by the longest block's latency;
* causal ``qka``: the next tile's ``Q K`` issued before this tile's softmax (:func:`qk_ahead`), the hypothesis that
  the 64 x 64 loop is latency-bound (one warpgroup a block, two blocks an SM: 331 instructions an iteration at
  ~0.6 µs an iteration measured, where issue alone would take ~0.2);
* rotary ``v16``: V (P @ V's operand) loaded as fp16 without the fp32 round trip the rank-3 emission writes
  (sm_90 w4 s2: loop 914 -> 902 instructions, STS 8 -> 4, barriers 4 -> 3, but 219 -> 242 registers).

Run on the device (about 60-90 s: ~26 kernels compiled by 12 workers, each float64-checked, then timed):
``python3 benchmarks/perf/attn17_variants.py && ATTN_VARIANTS=attn17_variants ATTN_FA=0 ATTN_CFGS="4,2 4,3 8,2"
python3 benchmarks/perf/attn_probe.py --out $OUT/attn17 --budget-s 110``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).resolve().parent / "attn17_variants"
_L2E = re.escape("1.4426950408889634")


def tl_exp(src: str) -> str:
    """The softmax terms' ``tl.exp2((x - m) * log2e)`` (not the ``*_prev`` rescale) as ``tl.exp(x - m)``."""
    def sub(m: re.Match[str]) -> str:
        a, b = m.group(1), m.group(2)
        return m.group(0) if a.endswith("_prev") else f"tl.exp({a} - {b})"
    out = re.sub(rf"tl\.exp2\(\((\w+) - (\w+)\) \* {_L2E}\)", sub, src)
    assert out != src, "no softmax exp2 to rewrite"
    return out


def reversed_rows(src: str) -> str:
    """The row-block program id counted from the last row block: the longest causal row blocks launch first."""
    m = re.search(r"def forward.*?\[\((\d+), (\d+)\)\]", src, re.S)
    assert m, "no 2-d grid"
    out = src.replace("pid1 = tl.program_id(1)\n", f"pid1 = {int(m.group(2)) - 1} - tl.program_id(1)\n", 1)
    assert out != src, "no row-block program id"
    return out


def v_fp16(src: str) -> str:
    """V's tile (the loaded input P @ V reads: the second operand of the dot with an accumulator) loaded without
    the ``.to(tl.float32)`` the emission adds (the dot takes it ``.to(tl.float16)``)."""
    m = re.search(r"(\w+) = tl\.reshape\((\w+), \((\d+), (\d+)\)\)\.to\(tl\.float16\)\n\s+\w+ = tl\.reshape\("
                  r"tl\.dot\(\w+, \1, ", src)
    assert m, "no P @ V with a reshaped V"
    v = m.group(2)
    out = re.sub(rf"(\n\s+{v} = tl\.load\([^\n]*\))\.to\(tl\.float32\)\n", r"\1\n", src, count=1)
    assert out != src, "V's load is not converted"
    return out


def zigzag_rows(src: str) -> str:
    """Row blocks launched so that the second wave pairs short rows with the first wave's long ones: launch rows
    ``R-1 .. R/2`` first (the longest), then ``0 .. R/2-1``. With ``H`` heads the fastest launch axis, block ``b`` of
    the first ``NUM_SMS`` lands on its own SM and block ``b + NUM_SMS`` beside it (breadth-first dispatch): 16 x 16
    blocks of 64 rows on 132 SMs carry 17-18 iterations an SM instead of up to 24 (row ``r`` beside ``r + 8``)."""
    m = re.search(r"def forward.*?\[\((\d+), (\d+)\)\]", src, re.S)
    assert m, "no 2-d grid"
    r = int(m.group(2))
    new = (f"pid1 = tl.where(tl.program_id(1) < {r // 2}, {r - 1} - tl.program_id(1), "
           f"tl.program_id(1) - {r // 2})\n")
    out = src.replace("pid1 = tl.program_id(1)\n", new, 1)
    assert out != src, "no row-block program id"
    return out


_ZIG = re.compile(r"pid1 = tl\.where\(tl\.program_id\(1\) < \d+, \d+ - tl\.program_id\(1\), "
                  r"tl\.program_id\(1\) - \d+\)\n")


def no_zig(src: str) -> str:
    """The inverse of :func:`zigzag_rows`: the row-block program id as main generated it before codegen emitted the
    balanced order itself (``_KernelGen.causal_row_axis``, landed by attn18)."""
    out, n = _ZIG.subn("pid1 = tl.program_id(1)\n", src)
    assert n == 1, "no balanced row-block order to undo"
    return out


def candidate0(case: str) -> str:
    """The kernel module this checkout generates for ``case``'s committed candidate 0 (benchmarks/candidates_models)."""
    import verimirage as vm
    from verimirage.backend.codegen import generate

    doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
    return generate(vm.MuGraph.parse(doc["candidates"][0]["mugraph"])).source


def write_variants(out: Path, variants: dict[str, dict[str, str]]) -> None:
    """Each ``variants[case][k]`` as ``out/{case}_c0_{k}.py``, and the ``index.json`` attn_probe.py reads."""
    out.mkdir(exist_ok=True)
    made = {}
    for case, vs in variants.items():
        for k, s in vs.items():
            name = f"{case}_c0_{k}"
            (out / f"{name}.py").write_text(s)
            made[name] = {"case": case, "candidate": 0}
    (out / "index.json").write_text(json.dumps(made, indent=1))
    print("\n".join(made))


def qk_ahead(src: str) -> str:
    """The loop over the tiles below the diagonal issues the next tile's ``Q K`` product before this tile's softmax
    (the scores carried into the next iteration, FlashAttention 3's intra-warpgroup overlap written as text): the
    tensor cores may run ``Q K_(i+1)`` while the softmax of tile ``i`` runs on the FMA and MUFU pipes, where Triton
    keeps the product asynchronous. One wasted product a block (the diagonal loop recomputes its own). Every
    ``K`` tile read is inside the tensor: the loop runs ``it < it_full <= it_stop - 1 <= 15``."""
    head = "    for it in range(0, it_full):\n"
    i = src.index(head)
    j = src.index("\n    for it in range(it_full, it_stop):", i)
    body = src[i:j]
    load = re.search(r"\n        v1 = (tl\.load\([^\n]*\))\.to\(tl\.float32\)", body)
    assert load and "it * 64" in load.group(1), "no K load in the first loop"
    k0 = load.group(1).replace("it * 64", "0 * 64")
    k1 = load.group(1).replace("it * 64", "(it + 1) * 64")
    body = body.replace(load.group(0), "")
    old = "        y3 = v1.to(tl.float16)\n        d1 = tl.dot(x2, y3)\n"
    assert old in body, "no Q K product in the first loop"
    body = body.replace(old, f"        d1 = d1n\n        d1n = tl.dot(x2, {k1}.to(tl.float16))\n")
    pre = f"    d1n = tl.dot(v0.to(tl.float16), {k0}.to(tl.float16))\n"
    return src[:i] + pre + body + src[j:]


def main() -> None:
    variants = {}
    for case in ("causal_attention", "softcap_attention", "rotary_attention"):
        src = candidate0(case)
        if _ZIG.search(src):  # (main emits the balanced order since attn18: the variants start from the old one)
            src = no_zig(src)
        vs = {"gen": src, "texp": tl_exp(src)}
        if case in ("causal_attention", "softcap_attention"):
            vs["zig"] = zigzag_rows(src)
        if case == "causal_attention":
            vs["rev"] = reversed_rows(src)
            vs["qka"] = qk_ahead(src)
        if case == "rotary_attention":
            vs["v16"] = v_fp16(src)
        variants[case] = vs
    write_variants(OUT, variants)


if __name__ == "__main__":
    main()
