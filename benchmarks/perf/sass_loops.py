"""Instruction counts of the for-loops of generated kernels in sm_90 SASS, on a CPU machine (no GPU; issue 22).

    python benchmarks/perf/sass_loops.py [--cases causal_attention bias_attention rotary_attention] [--top 1]
        [--warps 4 --stages 3] [--tl-exp]

Generates each stored candidate's module (``benchmarks/candidates_models``; ``--set suite``: ``benchmarks/
candidates``), compiles its kernels for sm_90 as Triton's launcher specialises them (unit strides constexpr,
pointers and other strides divisible by 16), disassembles the cubin with the ``nvdisasm`` Triton ships, and prints
per loop (a backward branch) its length and the counts of the instructions that matter for attention (HGMMA, MUFU,
FMUL/FFMA/FADD, FMNMX, FSETP, SHFL, LDGSTS, BAR, LDS/STS). ``--tl-exp`` rewrites codegen 11's exp2 form back to
``tl.exp`` (codegen 10) for a before/after. Run without TRITON_INTERPRET.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
KEYS = ("HGMMA", "HMMA", "MUFU", "FMUL", "FFMA", "FADD", "FMNMX", "FSETP", "FSEL", "SHFL", "F2FP", "LDGSTS", "BAR",
        "LDS", "LDSM", "STS")
_L2E = r"1\.4426950408889634"


def back_to_exp(src: str) -> str:
    """Codegen 11's ``tl.exp2(x * LOG2E - m * LOG2E)`` and the rescale's ``tl.exp2((a - b) * LOG2E)`` as codegen
    10 wrote them (``tl.exp(x - m)``)."""
    s = re.sub(rf"tl\.exp2\((\w+) \* {_L2E} - (\w+) \* {_L2E}\)", r"tl.exp(\1 - \2)", src)
    return re.sub(rf"tl\.exp2\(\((\w+) - (\w+)\) \* {_L2E}\)", r"tl.exp(\1 - \2)", s)


def loops(sass: str) -> list[tuple[int, dict[str, int]]]:
    """(instructions, counts) of each loop of ``sass`` (nvdisasm text): the span from a label to a branch back."""
    labels: dict[str, int] = {}
    ins: list[tuple[str, str]] = []
    for ln in sass.split("\n"):
        m = re.match(r"^\.(L_x_\d+):", ln.strip())
        if m:
            labels[m.group(1)] = len(ins)
            continue
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)(.*)", ln)
        if m:
            ins.append((m.group(2), m.group(3)))
    out = []
    for i, (op, rest) in enumerate(ins):
        t = re.search(r"(L_x_\d+)", rest) if op.startswith("BRA") else None
        if t and labels.get(t.group(1), i) < i:
            c = Counter(o.split(".")[0] for o, _ in ins[labels[t.group(1)]:i + 1])
            out.append((i + 1 - labels[t.group(1)], {k: c[k] for k in KEYS if c[k]}))
    return out


def compile_sm90(path: Path, kernel: str, signature: dict[str, str], warps: int, stages: int) -> bytes:
    """The cubin of ``kernel`` of the module at ``path`` for sm_90, specialised as Triton's launcher does for
    contiguous tensors: each tensor's last stride the constant 1, pointers and the other strides divisible by 16."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sig = dict(signature)
    consts: dict[str, int] = {}
    attrs: dict[tuple[int, ...], list[list[object]]] = {}
    names = list(sig)
    for i, n in enumerate(names):
        m = re.fullmatch(r"(\w+)_s(\d+)", n)
        if n.endswith("_ptr"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif m and f"{m.group(1)}_s{int(m.group(2)) + 1}" not in sig:
            consts[n] = 1
            sig[n] = "constexpr"
        elif m:
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(getattr(mod, kernel), sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    return bytes(k.asm["cubin"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=("models", "suite"), default="models")
    ap.add_argument("--cases", nargs="*", default=["causal_attention", "bias_attention", "rotary_attention"])
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--tl-exp", action="store_true", help="rewrite the exp2 form back to tl.exp (codegen 10)")
    a = ap.parse_args()
    import triton

    import verimirage as vm
    from verimirage.backend.codegen import generate

    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    folder = ROOT / "benchmarks" / ("candidates_models" if a.set == "models" else "candidates")
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases:
            doc = json.loads((folder / f"{case}.json").read_text())
            for idx, c in enumerate(doc["candidates"][:a.top]):
                ms = generate(vm.MuGraph.parse(c["mugraph"]))
                src = back_to_exp(ms.source) if a.tl_exp else ms.source
                path = Path(tmp) / f"{case}_{idx}.py"
                path.write_text(src)
                for kernel, signature in ((k.name, k.signature) for k in ms.kernels):
                    cub = Path(tmp) / f"{case}_{idx}_{kernel}.cubin"
                    cub.write_bytes(compile_sm90(path, kernel, signature, a.warps, a.stages))
                    sass = subprocess.run([str(nvdisasm), "-c", str(cub)], capture_output=True, text=True).stdout
                    for n, counts in loops(sass):
                        print(f"{case} cand {idx} {kernel} w{a.warps}s{a.stages}: loop of {n} instructions {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
