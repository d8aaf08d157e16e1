"""Make the attention probe's kernel variants (CPU; issue 22): the generated source of stored candidates and
hand edits of it that stand for codegen changes, written as modules beside this file (``attn_variants/``).

    python benchmarks/perf/attn_variants.py

Edits (text transforms of the generated kernel, each an exact rewrite of what it computes):
``r2``: every value at rank 2 (the leading size-1 dim dropped: no ``tl.reshape`` around ``tl.dot``, V loaded as the
dot's operand); ``diag``: the causal loop split into the tiles entirely below the diagonal (mask constant 1.0,
so ``where`` folds away) and the diagonal tiles (codegen 9 emits that split itself); ``rev``: row blocks in reverse
launch order (the longest first). Run 14 (``results/run14_attn_probe_h200.json``) used codegen 8 and the candidate
files of commit 1243b98 / 2b0eb25 (re-ordered since; the kernels are picked by design, the names keep their
index in run 14's files only for run 14's variants).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OUT = Path(__file__).resolve().parent / "attn_variants"


def rank2(src: str) -> str:
    """Drop the leading size-1 dim of every value of a generated kernel whose values are all (1, m, n)."""
    s = re.sub(r"\(pid0 \* 1 \+ tl\.arange\(0, 1\)\[:, None, None\]\)", "(pid0 * 1)", src)
    s = s.replace("[None, :, None]", "[:, None]").replace("[None, None, :]", "[None, :]")
    s = re.sub(r"\(1, (\d+), (\d+)\)", r"(\1, \2)", s)
    s = s.replace("axis=2", "axis=1")
    s = re.sub(r"tl\.reduce\((\w+), 2,", r"tl.reduce(\1, 1,", s)
    return s


def diag(src: str, rows: int, cols: int, mask_var: str) -> str:
    """Split the causal loop: iterations whose tile is entirely at or below the diagonal first (mask 1.0)."""
    lines = src.split("\n")
    i = next(k for k, ln in enumerate(lines) if ln.strip().startswith("for it in range(0, it_stop)"))
    j = i + 1
    while j < len(lines) and lines[j].startswith("        "):
        j += 1
    body = lines[i + 1:j]
    full = []
    for ln in body:
        if ln.strip().startswith(f"{mask_var} = "):
            shape = re.search(r", (\([\d, ]+\))\)$", ln).group(1)
            ln = f"        {mask_var} = tl.full({shape}, 1.0, tl.float32)"
        full.append(ln)
    head = [f"    it_full = tl.minimum(tl.maximum((pid1 * {rows} + 1) // {cols}, 0), it_stop)",
            "    for it in range(0, it_full):"]
    tail = ["    for it in range(it_full, it_stop):"]
    return "\n".join(lines[:i] + head + full + tail + body + lines[j:])


def rev(src: str, blocks: int) -> str:
    """Row blocks (grid axis 1) in reverse launch order."""
    return src.replace("pid1 = tl.program_id(1)", f"pid1 = {blocks - 1} - tl.program_id(1)")


def main() -> None:
    import verimirage as vm
    from verimirage.backend.codegen import generate

    OUT.mkdir(exist_ok=True)
    made = {}
    # the kernels of run 14 by their design (64x64 and 128x128 tiles causal, 64x64 softcap, bias 128x64 and 64x128)
    designs = (("causal_attention", "frange=16, grid=(16, 16)}"), ("causal_attention", "frange=8, grid=(16, 8)}"),
               ("softcap_attention", "frange=16, grid=(16, 16)}"), ("bias_attention", "frange=16, grid=(16, 8)}"),
               ("bias_attention", "frange=8, grid=(16, 16)}"))
    for case, design in designs:
        doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
        idx = next(i for i, c in enumerate(doc["candidates"]) if design in c["mugraph"])
        mg = vm.MuGraph.parse(doc["candidates"][idx]["mugraph"])
        src = generate(mg).source
        grid = tuple(int(x) for x in re.search(r"grid=\((\d+), (\d+)\)", doc["candidates"][idx]["mugraph"]).groups())
        rows = 1024 // grid[1]
        cols = 1024 // int(re.search(r"frange=(\d+)", doc["candidates"][idx]["mugraph"]).group(1))
        vs = {"gen": src, "r2": rank2(src)}
        if "it_full" in src:  # codegen >= 9 splits the loop itself
            vs["r2_rev"] = rev(vs["r2"], grid[1])
        elif "flimit" in doc["candidates"][idx]["mugraph"]:
            vs["r2_diag"] = diag(vs["r2"], rows, cols, "v3")
            vs["r2_diag_rev"] = rev(vs["r2_diag"], grid[1])
            vs["gen_diag_rev"] = rev(diag(src, rows, cols, "v3"), grid[1])
        for k, s in vs.items():
            name = f"{case}_c{idx}_{k}"
            (OUT / f"{name}.py").write_text(s)
            made[name] = {"case": case, "candidate": idx}
    (OUT / "index.json").write_text(json.dumps(made, indent=1))
    print("\n".join(made))


if __name__ == "__main__":
    main()
