"""Make session 13's attention probe variants (CPU or the device; issue 22) for ``attn_probe.py``
(``ATTN_VARIANTS=flash13_variants``), each a module under ``flash13_variants/``:

    python benchmarks/perf/flash13_variants.py

* causal_attention candidate 0: ``diff``, the generated kernel (the softmax's exp as ``exp2((x - m) * log2e)``, the
  difference first, 3c4025c); ``fused``, the same with ``exp2(x * log2e - m * log2e)`` (codegen 11 before that fix,
  which overflowed to NaN at finite logits above 2.3e38): what the safe form costs.
* softcap_attention candidate 0: ``tanh2``, the generated kernel (the tanh helper's ``exp2``); ``tanh1``, the helper
  with ``tl.exp`` (as run 11 timed it: ex2 with the denormal fix-up); ``sigm``, ``2 sigmoid(2x) - 1`` (the tanh
  before 2594b11, inaccurate near 0: a reference for what the accurate helper costs).
* rotary_attention candidate 4 (the one-kernel design): ``gen`` and ``vr2`` as for bias (sm_90 SASS: 915 -> 900
  instructions, STS 8 -> 4, barriers 4 -> 3; not yet timed).
* bias_attention candidates 0 and 1: ``gen``, the generated kernels (the probe sweeps their pipeline stages and
  warps); ``vr2``, P @ V's V tile loaded at rank 2 as the dot's operand (the rest of the kernel at rank 3: the bias
  tile keeps its asynchronous copy; sm_90 SASS of candidate 0: no shared-memory round trip of V, 755 -> 747
  instructions an iteration).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).resolve().parent / "flash13_variants"
_L2E = "1.4426950408889634"


def fused(src: str) -> str:
    """The element exp (not the ``*_prev`` rescale) as ``exp2(x * log2e - m * log2e)``."""
    def sub(m: re.Match[str]) -> str:
        a, b = m.group(1), m.group(2)
        return m.group(0) if a.endswith("_prev") else f"tl.exp2({a} * {_L2E} - {b} * {_L2E})"
    return re.sub(rf"tl\.exp2\(\((\w+) - (\w+)\) \* {re.escape(_L2E)}\)", sub, src)


def helper(src: str, body: str) -> str:
    """``src`` with the ``_vm_tanh`` helper's body replaced."""
    i = src.index("def _vm_tanh(x):\n")
    j = src.index("\n\n", i)
    return src[:i] + "def _vm_tanh(x):\n" + body + src[j:]


def v_rank2(src: str) -> str | None:
    """The rank-3 tile that a ``tl.reshape(v, (r, c)).to(tl.float16)`` hands to ``tl.dot`` loaded at rank 2; None
    when codegen already loads it so (bias_attention's 128 x 64 design since session 13)."""
    m = re.search(r"(\w+) = tl\.reshape\((\w+), \((\d+), (\d+)\)\)\.to\(tl\.float16\)\n"
                  r"\s+\w+ = tl\.reshape\(tl\.dot\(\w+, \1, ", src)  # P @ V: the dot with an accumulator
    if m is None:
        return None
    y, v = m.group(1), m.group(2)
    load = re.search(rf"{v} = tl\.load\((\w+) \+ \(pid0 \* 1 \+ tl\.arange\(0, 1\)\[:, None, None\]\) "
                     rf"\* (\w+) \+ \((.*?)\[None, :, None\]\) \* (\w+) \+ "
                     rf"\((.*?)\[None, None, :\]\) \* (\w+)\)\.to\(tl\.float32\)", src)
    assert load, "V's load is not the rank-3 form"
    p, s0, e1, s1, e2, s2 = load.groups()
    new = f"{v} = tl.load({p} + (pid0 * 1) * {s0} + ({e1}[:, None]) * {s1} + ({e2}[None, :]) * {s2})"
    src = src.replace(load.group(0), new)
    return src.replace(m.group(0).split("\n")[0], f"{y} = {v}")


def main() -> None:
    import verimirage as vm
    from verimirage.backend.codegen import generate

    OUT.mkdir(exist_ok=True)
    made = {}
    for case, idxs in (("causal_attention", (0,)), ("softcap_attention", (0,)), ("bias_attention", (0, 1)),
                       ("rotary_attention", (4,))):
        doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
        for idx in idxs:
            src = generate(vm.MuGraph.parse(doc["candidates"][idx]["mugraph"])).source
            if case == "causal_attention":
                vs = {"diff": src, "fused": fused(src)}
            elif case == "softcap_attention":
                cur = src[src.index("def _vm_tanh(x):\n") + 17:src.index("\n\n", src.index("def _vm_tanh(x):\n"))]
                assert "tl.exp2(a * -2.8853900817779268)" in cur, "the generated tanh is not the exp2 form"
                vs = {"tanh2": src,
                      "tanh1": helper(src, cur.replace("tl.exp2(a * -2.8853900817779268)", "tl.exp(-2.0 * a)")),
                      "sigm": helper(src, "    return 2.0 * tl.sigmoid(2.0 * x) - 1.0")}
            else:
                vs = {"gen": src}
                if (r2 := v_rank2(src)) is not None:
                    vs["vr2"] = r2
            for k, s in vs.items():
                name = f"{case}_c{idx}_{k}"
                (OUT / f"{name}.py").write_text(s)
                made[name] = {"case": case, "candidate": idx}
    (OUT / "index.json").write_text(json.dumps(made, indent=1))
    print("\n".join(made))


if __name__ == "__main__":
    main()
