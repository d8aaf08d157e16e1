"""Make the eighteenth session's A/B of the compute-bound attention programs (issue 22, attn18) for
``attn_probe.py`` (``ATTN_VARIANTS=attn18_variants``), each a module under ``attn18_variants/``:

    python benchmarks/perf/attn18_variants.py

Candidate 0 of causal_attention, softcap_attention and rotary_attention as this checkout generates it, plus text
variants that stand for codegen or design changes:

* causal and softcap ``zig``: the kernel this checkout generates, whose causal row blocks launch in the balanced
  order (codegen ``_KernelGen.causal_row_axis``: rows ``R-1 .. R/2`` first, then ``0 .. R/2-1``);
  ``nozig``: the same kernel with the row-block program id as main generated it before (``tl.program_id(1)``);
* softcap ``zig_nopoly``: the tanh helper without its small-argument polynomial (``(1 - e) / (1 + e)`` for every
  argument): what the helper's odd polynomial (evaluated in every lane) costs (codegen's ``_vm_tanh_logit`` since
  attn18; ``zig`` then has the accurate helper put back, as main generated it at the call);
  ``zig_rcp``: the helper's division as ``rcp.approx.ftz`` (inline asm, GPU only) times the numerator: what
  ``div.full.f32``'s refinement costs;
* rotary ``gen``; ``split``: Q and K rotated once by a small
  pre-kernel (fp16, the layout of the inputs, one launch for both) followed by the one-kernel design's loop without
  its rotations (two launches; the numerics are the same: the one-kernel design rounds the rotated tiles to fp16
  before its products too); ``split64``: the same with 64-row blocks (256 blocks, two an SM);
  (attn17's ``v16``, V loaded as fp16, compiles to the resources of ``rcast`` below: 244 registers, 72 KB);
  ``rcast``: every dot operand's fp16 conversion put inside its reshape (``tl.reshape(x.to(tl.float16), s)``
  for ``tl.reshape(x, s).to(tl.float16)``; a codegen change that would let the compiler fold V's load-time
  ``.to(tl.float32)`` away, as it does at rank 2); ``pcast``: ``rcast`` plus the rotated K tile converted before
  its transpose (the permute through shared memory moves fp16, not fp32); ``split_pcast``: ``split`` so.

Run on the device (about 60-90 s):
``python3 benchmarks/perf/attn18_variants.py && ATTN_VARIANTS=attn18_variants ATTN_FA=0 ATTN_CFGS="4,2 8,2" ATTN_TWICE=1
python3 benchmarks/perf/attn_probe.py --out $OUT/attn18 --budget-s 110``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
OUT = Path(__file__).resolve().parent / "attn18_variants"

from attn17_variants import candidate0, no_zig, write_variants  # noqa: E402


def tanh_nopoly(src: str) -> str:
    """The tanh helper's result ``(1 - e) / (1 + e)`` for every argument (no small-argument polynomial)."""
    old = "    return tl.where(a < 0.3125, p, tl.where(x < 0.0, -r, r))\n"
    assert old in src, "no tanh helper"
    return src.replace(old, "    return tl.where(x < 0.0, -r, r)\n")


def tanh_accurate(src: str) -> str:
    """A kernel module whose soft cap's tanh codegen emits as ``_vm_tanh_logit`` (since attn18) with the accurate
    ``_vm_tanh`` instead: the helper as main generated it before."""
    from verimirage.backend.lowering import HELPERS

    short, full = HELPERS["_vm_tanh_logit"].rstrip("\n"), HELPERS["_vm_tanh"].rstrip("\n")
    assert short in src, "no short tanh helper"
    return src.replace(short, full).replace("_vm_tanh_logit(", "_vm_tanh(")


def tanh_rcp(src: str) -> str:
    """The tanh helper's division as an approximate reciprocal (``rcp.approx.ftz.f32``) times the numerator."""
    old = "    r = (1.0 - e) / (1.0 + e)\n"
    assert old in src, "no tanh helper's division"
    new = ('    r = (1.0 - e) * tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [1.0 + e], '
           "dtype=tl.float32, is_pure=True, pack=1)\n")
    return src.replace(old, new)


_PRE = '''

@triton.jit
def _rot_rows(x_ptr, o_ptr, c_ptr, s_ptr, h, rb, ROWS: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    r = rb * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.arange(0, D)[None, :]
    x = tl.load(x_ptr + h * N * D + r * D + c).to(tl.float32)
    xr = tl.load(x_ptr + h * N * D + r * D + (c + D // 2) % D).to(tl.float32) * tl.where(c < D // 2, -1.0, 1.0)
    y = x * tl.load(c_ptr + r * D + c).to(tl.float32) + xr * tl.load(s_ptr + r * D + c).to(tl.float32)
    tl.store(o_ptr + h * N * D + r * D + c, y.to(tl.float16))


@triton.jit
def krot(q_ptr, k_ptr, qo_ptr, ko_ptr, c_ptr, s_ptr, ROWS: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    """Q and K (heads, N, D), contiguous, rotated (x * cos + rotate_half(x) * sin) into fp16 copies."""
    if tl.program_id(2) == 0:
        _rot_rows(q_ptr, qo_ptr, c_ptr, s_ptr, tl.program_id(1), tl.program_id(0), ROWS, N, D)
    else:
        _rot_rows(k_ptr, ko_ptr, c_ptr, s_ptr, tl.program_id(1), tl.program_id(0), ROWS, N, D)
'''


def split(src: str, rows: int = 128) -> str:
    """Q and K rotated once by a pre-kernel (``krot``), then candidate 0's loop without its rotations."""
    lines = src.split("\n")
    drop_q = ("v3 = ", "v4 = ", "v7 = ", "v11 = ", "v12 = ")
    drop_k = ("v5 = ", "v6 = ", "v14 = ", "v18 = ", "v19 = ")
    out = []
    for ln in lines:
        s = ln.strip()
        if ln.startswith("    v") and s.startswith(drop_q):
            continue
        if ln.startswith("        v") and s.startswith(drop_k):
            continue
        if s == "v13 = (v7 + v12)":
            ln = "    v13 = v0"
        if s == "v20 = (v14 + v19)":
            ln = "        v20 = v1"
        out.append(ln)
    text = "\n".join(out)
    assert "    v13 = v0\n" in text and "        v20 = v1\n" in text, "not the rotary one-kernel design"
    assert text.count("tl.load(") == 3, "rotation loads left"
    if rows != 128:
        i, j = text.index("@triton.jit\ndef k5"), text.index("# launch parameters")
        body = text[i:j].replace("128", str(rows))
        text = text[:i] + body + text[j:]
        text = text.replace("k5[(8, 16)]", f"k5[({1024 // rows}, 16)]")
    i = text.index("\n# launch parameters")
    text = text[:i] + _PRE + text[i:]
    call = "    k5[("
    k = text.index(call)
    pre = ("    QR = torch.empty_like(Q)\n    KR = torch.empty_like(K)\n"
           "    krot[(1024 // 64, 16, 2)](Q, K, QR, KR, COS, SIN, ROWS=64, N=1024, D=64, num_warps=4)\n")
    text = text[:k] + pre + text[k:]
    line_end = text.index("\n", k + len(pre))
    launch = text[k + len(pre):line_end]
    launch = launch.replace("](Q, Q.stride(0), Q.stride(1), Q.stride(2), K, K.stride(0), K.stride(1), K.stride(2),",
                            "](QR, QR.stride(0), QR.stride(1), QR.stride(2), KR, KR.stride(0), KR.stride(1), "
                            "KR.stride(2),", 1)
    assert "](QR," in launch, "unexpected launch line"
    return text[:k + len(pre)] + launch + text[line_end:]


_RESHAPE_CAST = re.compile(r"tl\.reshape\((\w+), (\([\d, ]+\))\)\.to\(tl\.float16\)")


def reshape_cast(src: str) -> str:
    """Every ``tl.reshape(x, s).to(tl.float16)`` as ``tl.reshape(x.to(tl.float16), s)``."""
    out, n = _RESHAPE_CAST.subn(r"tl.reshape(\1.to(tl.float16), \2)", src)
    assert n >= 2, "no reshaped dot operand"
    return out


def permute_cast(src: str) -> str:
    """``reshape_cast`` plus each transposed dot operand converted to fp16 before its ``tl.permute``."""
    out = reshape_cast(src)
    m = re.search(r"\n(\s+)(\w+) = tl\.permute\((\w+), (\([\d, ]+\))\)\n", out)
    assert m, "no permute"
    ind, v, x, perm = m.groups()
    out = out.replace(m.group(0), f"\n{ind}{v} = tl.permute({x}.to(tl.float16), {perm})\n", 1)
    return out.replace(f"tl.reshape({v}.to(tl.float16),", f"tl.reshape({v},", 1)


def main() -> None:
    variants = {}
    for case in ("causal_attention", "softcap_attention", "rotary_attention"):
        src = candidate0(case)
        if "_vm_tanh_logit(" in src:  # (the short form is codegen's since attn18: the variants start from before)
            src = tanh_accurate(src)
        if case == "rotary_attention":
            vs = {"gen": src, "rcast": reshape_cast(src), "pcast": permute_cast(src), "split": split(src),
                  "split64": split(src, 64), "split_pcast": permute_cast(split(src))}
        else:
            vs = {"zig": src, "nozig": no_zig(src)}
        if case == "softcap_attention":
            vs["zig_nopoly"] = tanh_nopoly(src)
            vs["zig_rcp"] = tanh_rcp(src)
        variants[case] = vs
    write_variants(OUT, variants)


if __name__ == "__main__":
    main()
