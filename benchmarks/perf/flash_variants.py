"""Make session 12's attention probe variants (CPU; issue 22): codegen 11's kernels of stored candidates (the
softmax's exp as exp2 with log2(e) folded in) and hand edits of the causal kernel's block order that stand for
codegen changes, written as modules under ``flash_variants/`` for ``attn_probe.py`` (``ATTN_VARIANTS``).

    python benchmarks/perf/flash_variants.py

Edits of causal candidate 0 (64 x 64 tiles, grid (16 heads, 16 row blocks), head the fastest launch axis):
``rev``: row blocks in reverse launch order (the longest first); ``swaprev``: the row block the fastest launch axis,
longest first; ``pair``: grid (16, 8), each program runs row block 15 - r and then r (17 iterations each).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).resolve().parent / "flash_variants"


def rev(src: str, blocks: int) -> str:
    return src.replace("pid1 = tl.program_id(1)", f"pid1 = {blocks - 1} - tl.program_id(1)")


def swaprev(src: str, blocks: int) -> str:
    s = src.replace("pid0 = tl.program_id(0)", "pid0 = tl.program_id(1)")
    return s.replace("pid1 = tl.program_id(1)", f"pid1 = {blocks - 1} - tl.program_id(0)")


def pair(src: str, heads: int, blocks: int) -> str:
    lines = src.split("\n")
    i = next(k for k, ln in enumerate(lines) if ln.strip() == "pid1 = tl.program_id(1)")
    j = i + 1
    while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
        j += 1
    body = ["    " + ln if ln.strip() else ln for ln in lines[i + 1:j]]
    head = ["    for pr in tl.static_range(2):",
            f"        pid1 = (tl.program_id(1) * (2 * pr - 1) + {blocks - 1} * (1 - pr))"]
    s = "\n".join(lines[:i] + head + body + lines[j:])
    return s.replace(f"[({heads}, {blocks})](", f"[({heads}, {blocks // 2})](")


def main() -> None:
    import verimirage as vm
    from verimirage.backend.codegen import generate

    OUT.mkdir(exist_ok=True)
    made = {}
    for case, idxs in (("causal_attention", (0, 1, 2, 3)), ("bias_attention", (0, 1))):
        doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
        for idx in idxs:
            text = doc["candidates"][idx]["mugraph"]
            src = generate(vm.MuGraph.parse(text)).source
            vs = {"e2": src}
            grid = re.search(r"grid=\((\d+), (\d+)\)}", text)
            if case == "causal_attention" and idx == 0 and grid:
                h, b = int(grid.group(1)), int(grid.group(2))
                vs.update(e2_rev=rev(src, b), e2_swaprev=swaprev(src, b), e2_pair=pair(src, h, b))
            for k, s in vs.items():
                name = f"{case}_c{idx}_{k}"
                (OUT / f"{name}.py").write_text(s)
                made[name] = {"case": case, "candidate": idx}
    (OUT / "index.json").write_text(json.dumps(made, indent=1))
    print("\n".join(made))


if __name__ == "__main__":
    main()
