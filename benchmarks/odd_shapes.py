"""Odd shapes: does a program whose dims are not powers of two get the fusions of its power-of-two twin?

Held-out programs (``benchmarks/unseen_programs.py``) and the models set's (``verimirage/benchmarks/models.py``)
at reduced but shape-representative sizes, each family once at power-of-two dims (the *twin*) and at the dims
open models use that are not: head counts 3, 5, 7, 12, 20, 40; head dims 80, 96, 112; hidden sizes 5120, 6912,
11008, 13824 (divided by 32, keeping their odd factors); vocabularies 32000 and 151936 (divided by 16 and 64);
GQA groups of 5 and 6; sequences that are not a multiple of 64. Each row is one ``vm.superoptimize`` with the
default options (the search cache off, so the search time is the search's): kernels, the cost model's estimate,
search seconds, whether the best is Proved; then the same for the twin, so a cliff is a row whose kernels (or
estimate per element) exceed its twin's.

``--modules`` adds held-out ``nn.Module`` s through ``torch.compile(backend="verimirage")`` at odd head counts
(forward, or with ``--train`` a training step; kernels of the taken partitions and the share of ATen ops
captured)::

    TRITON_INTERPRET=1 python benchmarks/odd_shapes.py [--graphs] [--modules [--train]] [--no-tails] [--out FILE]
        [NAME ...]
    python benchmarks/odd_shapes.py --render FILE [--before FILE]
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verimirage as vm
from verimirage.benchmarks import models as M
from verimirage.benchmarks.suite import attention

F16 = vm.float16


# --------------------------------------------------------------------------- program families


def heads_attention(b: int, t: int, h: int, hd: int) -> vm.Graph:
    """Causal attention over heads split from flat ``(b, t, h * hd)`` projections (a view and a transpose, as a
    captured module has them), the heads merged back and projected: the layout of every decoder's attention."""
    g = vm.Graph()
    q, k, v = (g.input(n, (b, t, h * hd), F16) for n in ("q", "k", "v"))
    wo = g.input("wo", (h * hd, h * hd), F16)

    def heads(x: Any) -> Any:
        return g.transpose(g.reshape(x, (b, t, h, hd)), 1, 2)

    s = g.scale(g.matmul(heads(q), g.transpose(heads(k), 2, 3)), hd ** -0.5)
    m = g.tril_mask((t, t))
    c = g.where(m, s, g.shift(g.scale(s, 0.0), M.MASKED))
    e = g.where(m, g.exp(g.sub(c, g.max(c, axis=3))), g.scale(c, 0.0))
    o = g.matmul(g.div(e, g.sum(e, axis=3)), heads(v))
    g.output(g.matmul(g.reshape(g.transpose(o, 1, 2), (b * t, h * hd)), wo))
    return g


def qk_norm_heads(t: int, h: int, hd: int) -> vm.Graph:
    """OLMo 2 / Qwen 3 per-head QK RMSNorm on a flat projection: ``rms_norm`` over each head's ``hd``."""
    g = vm.Graph()
    x = g.input("x", (t, h * hd), F16)
    w = g.input("w", (hd,), F16)
    g.output(g.reshape(g.rms_norm(g.reshape(x, (t, h, hd)), w), (t, h * hd)))
    return g


def gqa_decode(kv: int, group: int, hd: int, n: int) -> vm.Graph:
    """The models set's decode_gqa: ``kv`` KV heads, ``group`` query heads each, head dim ``hd``, ``n`` keys."""
    g = vm.Graph()
    q = g.input("Q", (kv, group, hd), F16)
    k = g.input("K", (kv, hd, n), F16)
    v = g.input("V", (kv, n, hd), F16)
    g.output(attention(g, q, k, v, stable=True))
    return g


def causal(h: int, n: int, hd: int) -> vm.Graph:
    """The models set's causal_attention (a constant tril mask, masked weights exactly 0)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, hd), F16), g.input("K", (h, hd, n), F16), g.input("V", (h, n, hd), F16)
    g.output(M.masked_attention(g, q, k, v, g.tril_mask((1, n, n)), zero_masked=True))
    return g


def bias_attention(h: int, n: int, hd: int) -> vm.Graph:
    """The models set's bias_attention (ALiBi-like additive bias)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, hd), F16), g.input("K", (h, hd, n), F16), g.input("V", (h, n, hd), F16)
    s = g.add(g.matmul(q, k), g.input("BIAS", (h, n, n), F16))
    e = g.exp(g.sub(s, g.max(s, axis=2)))
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def rotary(h: int, n: int, hd: int) -> vm.Graph:
    """The models set's rotary_attention."""
    g = vm.Graph()
    q, k, v = (g.input(x, (h, n, hd), F16) for x in "QKV")
    cos, sin = g.input("COS", (n, hd), F16), g.input("SIN", (n, hd), F16)
    s = g.matmul(M.rotary(g, q, cos, sin), g.transpose(M.rotary(g, k, cos, sin), 1, 2))
    e = g.exp(g.sub(s, g.max(s, axis=2)))
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def rmsnorm_linear(m: int, k: int, n: int, dt: Any = F16) -> vm.Graph:
    """Gemma's ``(1 + w)`` RMSNorm then a projection (the held-out gemma_rmsnorm_linear)."""
    g = vm.Graph()
    x, w, p = g.input("x", (m, k), dt), g.input("w", (1, k), dt), g.input("m", (k, n), dt)
    g.output(g.matmul(g.mul(g.rms_norm(x), g.shift(w, 1.0)), p))
    return g


def layernorm_linear(m: int, k: int, n: int) -> vm.Graph:
    """The models set's layernorm_linear."""
    g = vm.Graph()
    x = g.input("X", (m, k), F16)
    gamma, beta, w = g.input("G", (k,), F16), g.input("B", (k,), F16), g.input("W", (k, n), F16)
    g.output(g.matmul(M.layer_norm(g, x, gamma, beta), w))
    return g


def swiglu(m: int, k: int, h: int) -> vm.Graph:
    """The models set's swiglu_ffn (gate, up, down)."""
    g = vm.Graph()
    x = g.input("X", (m, k), F16)
    w1, w3, w2 = g.input("W1", (k, h), F16), g.input("W3", (k, h), F16), g.input("W2", (h, k), F16)
    g.output(g.matmul(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w3)), w2))
    return g


def geglu(m: int, k: int, h: int) -> vm.Graph:
    """The models set's geglu (exact GELU gate times up)."""
    g = vm.Graph()
    x = g.input("X", (m, k), F16)
    w1, w2 = g.input("W1", (k, h), F16), g.input("W2", (k, h), F16)
    g.output(g.mul(M.gelu_exact(g, g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def squared_relu(m: int, k: int, h: int) -> vm.Graph:
    """The held-out squared_relu_mlp."""
    g = vm.Graph()
    x, w1, w2 = g.input("x", (m, k), F16), g.input("w1", (k, h), F16), g.input("w2", (h, k), F16)
    g.output(g.matmul(g.square(g.relu(g.matmul(x, w1))), w2))
    return g


def residual_rmsnorm(m: int, d: int) -> vm.Graph:
    """The models set's residual_rmsnorm (both outputs)."""
    g = vm.Graph()
    x, r, w = g.input("X", (m, d), F16), g.input("R", (m, d), F16), g.input("W", (d,), F16)
    h = g.add(x, r)
    g.output(h, g.rms_norm(h, w, eps=1e-6))
    return g


def qkv_bias(m: int, k: int, n: int) -> vm.Graph:
    """The models set's qkv_bias."""
    g = vm.Graph()
    x, w, b = g.input("X", (m, k), F16), g.input("W", (k, n), F16), g.input("BIAS", (n,), F16)
    g.output(g.add(g.matmul(x, w), b))
    return g


def lora(m: int, k: int, n: int, r: int) -> vm.Graph:
    """The models set's lora_scaled."""
    g = vm.Graph()
    x, w = g.input("X", (m, k), F16), g.input("W", (k, n), F16)
    a, b = g.input("A", (k, r), F16), g.input("B", (r, n), F16)
    g.output(g.add(g.matmul(x, w), g.scale(g.matmul(g.matmul(x, a), b), 2.0)))
    return g


def vocab(kind: str) -> Callable[[int, int], vm.Graph]:
    """The models set's logsumexp / log_softmax / cross_entropy over ``v`` entries for ``b`` rows."""
    def build(b: int, v: int) -> vm.Graph:
        g = vm.Graph()
        x = g.input("X", (b, v), F16)
        if kind == "cross_entropy":
            g.output(M.cross_entropy(g, x, g.input("T", (b, v), F16)))
        else:
            g.output((M.logsumexp if kind == "logsumexp" else M.log_softmax)(g, x, 1))
        return g
    return build


def logit_softcap(m: int, k: int, v: int, dt: Any = F16) -> vm.Graph:
    """The held-out logit_softcap (an LM head soft-capped)."""
    g = vm.Graph()
    x, w = g.input("x", (m, k), dt), g.input("w", (k, v), dt)
    g.output(g.scale(g.tanh(g.scale(g.matmul(x, w), 1 / 30)), 30.0))
    return g


def group_norm(n: int, c: int, ln: int, groups: int) -> vm.Graph:
    """The models set's group_norm."""
    g = vm.Graph()
    x = g.input("X", (n, c, ln), F16)
    g.output(M.group_norm(g, x, groups, g.input("G", (c, 1), F16), g.input("B", (c, 1), F16)))
    return g


def moe_router(t: int, d: int, e: int) -> vm.Graph:
    """The held-out router softmax over ``e`` experts."""
    g = vm.Graph()
    x, w = g.input("x", (t, d), F16), g.input("w", (d, e), F16)
    lg = g.matmul(x, w)
    ex = g.exp(g.sub(lg, g.max(lg, 1)))
    g.output(g.div(ex, g.sum(ex, 1)))
    return g


#: family -> (builder, the power-of-two twin's dims, [(odd dims, what they stand for)])
FAMILIES: dict[str, tuple[Callable[..., vm.Graph], tuple[int, ...], list[tuple[tuple[int, ...], str]]]] = {
    "heads_attention": (heads_attention, (1, 16, 4, 64), [
        ((1, 16, 3, 64), "3 heads"), ((1, 16, 5, 64), "5 heads"), ((1, 16, 7, 64), "7 heads"),
        ((1, 16, 12, 64), "12 heads"), ((1, 16, 4, 80), "head dim 80"), ((1, 16, 4, 96), "head dim 96"),
        ((1, 16, 4, 112), "head dim 112"), ((1, 16, 5, 128), "5 x 128 (Llama-2-13B / 8)"),
        ((1, 12, 4, 64), "12 tokens")]),
    "qk_norm_heads": (qk_norm_heads, (16, 4, 64), [
        ((16, 3, 64), "3 heads"), ((16, 5, 128), "5 x 128"), ((16, 20, 64), "20 heads"), ((16, 40, 16), "40 heads"),
        ((16, 4, 80), "head dim 80"), ((16, 4, 96), "head dim 96")]),
    "gqa_decode": (gqa_decode, (2, 4, 128, 256), [
        ((2, 5, 128, 256), "group 5"), ((2, 6, 128, 256), "group 6"), ((2, 7, 128, 256), "group 7 (Qwen2 28/4)"),
        ((2, 4, 80, 256), "head dim 80"), ((2, 4, 96, 256), "head dim 96"), ((2, 4, 128, 200), "200 keys")]),
    "causal_attention": (causal, (2, 128, 64), [
        ((2, 100, 64), "100 tokens"), ((3, 128, 64), "3 heads"), ((2, 128, 80), "head dim 80"),
        ((2, 128, 96), "head dim 96"), ((2, 80, 112), "80 tokens, head dim 112")]),
    "bias_attention": (bias_attention, (2, 64, 64), [
        ((2, 50, 64), "50 tokens"), ((3, 64, 64), "3 heads"), ((2, 64, 80), "head dim 80")]),
    "rotary_attention": (rotary, (2, 64, 64), [
        ((2, 50, 64), "50 tokens"), ((2, 64, 80), "head dim 80"), ((2, 64, 96), "head dim 96")]),
    "rmsnorm_linear": (rmsnorm_linear, (16, 128, 128), [
        ((16, 160, 160), "hidden 5120 / 32"), ((16, 216, 128), "hidden 6912 / 32"), ((16, 128, 344), "11008 / 32"),
        ((16, 432, 128), "13824 / 32"), ((5, 128, 128), "5 tokens")]),
    "layernorm_linear": (layernorm_linear, (16, 128, 128), [
        ((16, 160, 160), "hidden 5120 / 32"), ((16, 216, 216), "6912 / 32")]),
    "swiglu_ffn": (swiglu, (16, 128, 512), [
        ((16, 128, 344), "11008 / 32"), ((16, 160, 432), "5120, 13824 / 32"), ((16, 128, 448), "14336 / 32")]),
    "geglu": (geglu, (16, 128, 512), [((16, 128, 344), "11008 / 32"), ((16, 96, 384), "3072, 12288 / 32")]),
    "squared_relu_mlp": (squared_relu, (16, 128, 512), [((16, 160, 640), "5120 / 32 (x4)")]),
    "residual_rmsnorm": (residual_rmsnorm, (64, 128), [((64, 160), "5120 / 32"), ((64, 216), "6912 / 32"),
                                                        ((50, 128), "50 tokens")]),
    "qkv_bias": (qkv_bias, (16, 128, 256), [((16, 112, 144), "Qwen2-7B 3584, 4608 / 32"),
                                             ((16, 160, 240), "5120, 40 x 128 x 1.5 / 32")]),
    "lora_scaled": (lora, (16, 128, 128, 16), [((16, 160, 160, 16), "5120 / 32"), ((16, 128, 128, 12), "rank 12")]),
    "logsumexp": (vocab("logsumexp"), (4, 2048), [((4, 2000), "32000 / 16"), ((4, 2374), "151936 / 64")]),
    "log_softmax": (vocab("log_softmax"), (4, 2048), [((4, 2000), "32000 / 16"), ((4, 2374), "151936 / 64")]),
    "cross_entropy": (vocab("cross_entropy"), (4, 2048), [((4, 2000), "32000 / 16"), ((4, 2374), "151936 / 64")]),
    "logit_softcap": (logit_softcap, (8, 128, 2048), [((8, 128, 2000), "32000 / 16"),
                                                       ((8, 160, 2374), "151936 / 64")]),
    "group_norm": (group_norm, (2, 32, 64, 8), [((2, 30, 64, 5), "5 groups of 6"), ((2, 36, 64, 6), "6 groups"),
                                                ((2, 32, 50, 8), "50 positions")]),
    "moe_router_softmax": (moe_router, (16, 128, 8), [((16, 128, 6), "6 experts"), ((16, 160, 60), "60 experts")]),
    # full-size dims with few factors of two (the reductions above keep odd factors but can lose twos)
    "vit_clip_attention": (causal, (12, 256, 64), [((12, 197, 64), "ViT-B/16: 197 tokens (prime)"),
                                                    ((12, 77, 64), "CLIP text: 77 tokens (7 x 11)")]),
    "lm_head_softcap": (logit_softcap, (16, 768, 32768), [((16, 768, 50257), "GPT-2 vocabulary 50257 (29 x 1733)"),
                                                          ((8, 64, 1155), "1155 columns (3 x 5 x 7 x 11)"),
                                                          ((16, 2048, 151936), "Qwen2 vocabulary 151936, full")]),
    "token_rows_linear": (rmsnorm_linear, (64, 768, 3072), [((77, 768, 3072), "77 tokens"),
                                                             ((197, 768, 3072), "197 tokens"),
                                                             ((1000, 768, 3072), "1000 tokens"),
                                                             ((1023, 768, 3072), "1023 tokens (3 x 11 x 31)")]),
    "long_causal_attention": (causal, (2, 1024, 64), [((2, 1000, 64), "1000 tokens"),
                                                       ((2, 1023, 64), "1023 tokens (3 x 11 x 31)")]),
    "lm_head_rows": (logit_softcap, (64, 768, 4096), [((197, 768, 4096), "197 tokens"),
                                                      ((1023, 768, 4096), "1023 tokens")]),
}


def _cost_elems(g: vm.Graph) -> int:
    return sum(math.prod(t.shape) for t in g.inputs)


def run_graph(family: str, dims: tuple[int, ...], what: str, tails: bool = True) -> dict[str, Any]:
    """One search: kernels, the estimate, search seconds, Proved (or the error). ``tails=False``: without masked
    tail tiles (the partitioner's block counts all divide their dims, as before the seventeenth session)."""
    build = FAMILIES[family][0]
    g = build(*dims)
    row: dict[str, Any] = {"family": family, "dims": list(dims), "what": what, "in_elems": _cost_elems(g)}
    t0 = time.perf_counter()
    try:
        res = vm.superoptimize(g, cache=False, tails=tails)
    except Exception as e:  # a row, not a crash: the sweep goes on
        row.update(search_s=round(time.perf_counter() - t0, 2), error=f"{type(e).__name__}: {e}"[:300])
        return row
    best = res.best
    row.update(search_s=round(time.perf_counter() - t0, 2), kernels=best.mugraph.num_kernels,
               est_us=round(best.cost.time_s * 1e6, 2), proved=isinstance(best.verdict, vm.Proved))
    return row


#: held-out modules at odd head counts: (name, (B, T, D, H, HD) twin, [odd dims])
MODULE_CASES: list[tuple[str, tuple[int, ...], list[tuple[int, ...]]]] = [
    ("mla_lowrank", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8), (1, 4, 40, 5, 8)]),
    ("olmo2_qk_norm", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8), (1, 4, 40, 5, 8)]),
    ("partial_rotary", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8)]),
    ("sdpa_enable_gqa", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8)]),
    ("parallel_block", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8)]),
    ("gemma2_attn_softcap", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8)]),
    ("alibi_attention", (1, 4, 16, 2, 8), [(1, 4, 24, 3, 8)]),
    ("mla_lowrank", (1, 4, 32, 4, 8), [(1, 3, 32, 4, 8)]),  # 3 tokens: a sequence that is no power of two
]


def run_module(name: str, dims: tuple[int, ...], train: bool = False) -> dict[str, Any]:
    """One held-out module at dims ``(B, T, D, H, HD)`` (the script's module-level sizes), forward or (``train``)
    a training step (forward and backward graphs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import unseen_programs as up

    saved = (up.B, up.T, up.D, up.H, up.HD)
    up.B, up.T, up.D, up.H, up.HD = dims
    try:
        r = up.run_module(name, train=train, opts={"time_budget_s": 60.0, "fallback": "eager", "candidates": 1,
                                                   "search": {"cache": False}})
    finally:
        up.B, up.T, up.D, up.H, up.HD = saved
    keep = ("coverage", "taken", "kernels", "secs", "max_err", "error")
    return {"module": name, "dims": list(dims), "train": train, **{k: r.get(k) for k in keep}}


# --------------------------------------------------------------------------- the table


def _key(r: dict[str, Any]) -> tuple[str, str]:
    return (r.get("family") or r.get("module") or "", json.dumps(r["dims"]) + (" train" if r.get("train") else ""))


def _head(head: str, before: bool) -> list[str]:
    """A table's header and rule lines (with a "kernels before" column when ``before``)."""
    head += " kernels before |" if before else ""
    return [head, "|" + "---|" * (head.count("|") - 1)]


def render(rows: list[dict[str, Any]], before: list[dict[str, Any]] | None = None) -> str:
    """A markdown table: each odd row next to its twin (and, with ``before``, the kernels it had then)."""
    old = {_key(r): r for r in before or []}
    out = []
    twins = {f: list(spec[1]) for f, spec in FAMILIES.items()}
    graphs = [r for r in rows if "family" in r]
    if graphs:
        out += _head("| family | dims | stands for | kernels | est. µs | search s | Proved | twin kernels | "
                     "twin est. µs |", bool(before))
        by = {_key(r): r for r in graphs}
        for r in graphs:
            tw = by.get((r["family"], json.dumps(twins.get(r["family"], []))), {})

            def cell(x: dict[str, Any], k: str) -> str:
                return "err" if "error" in x else str(x.get(k, "-"))
            line = (f"| {r['family']} | {tuple(r['dims'])} | {r['what']} | {cell(r, 'kernels')} | {cell(r, 'est_us')} |"
                    f" {r['search_s']} | {'-' if 'error' in r else ('yes' if r['proved'] else 'no')} | "
                    f"{cell(tw, 'kernels')} | {cell(tw, 'est_us')} |")
            if before:
                line += f" {cell(old.get(_key(r), {}), 'kernels')} |"
            out.append(line)
        out.append("")
    mods = [r for r in rows if "module" in r]
    if mods:
        out += _head("| module | (B, T, D, H, HD) | step | captured | partitions, kernels | s | max error |",
                     bool(before))
        for r in mods:
            step = "training" if r.get("train") else "forward"
            if r.get("error"):
                out.append(f"| {r['module']} | {tuple(r['dims'])} | {step} | error: {r['error'][:80]} |")
                continue
            line = (f"| {r['module']} | {tuple(r['dims'])} | {step} | {r['coverage']:.0%} | {r['taken']}, "
                    f"{r['kernels']} | "
                    f"{r['secs']:.0f} | {r['max_err']:.0e} |")
            if before:
                line += f" {old.get(_key(r), {}).get('kernels', '-')} |"
            out.append(line)
    return "\n".join(out)


def _read(path: str) -> list[dict[str, Any]]:
    return [ast.literal_eval(ln) for ln in Path(path).read_text().splitlines() if ln.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep (a dict per line, to stdout and ``--out``), or ``--render`` a file of such lines."""
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="families / modules to run (default: all)")
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--modules", action="store_true")
    ap.add_argument("--train", action="store_true", help="with --modules: training steps, not forwards")
    ap.add_argument("--out", help="append the rows to this file too")
    ap.add_argument("--no-tails", action="store_true", help="search without masked tail tiles (the 'before')")
    ap.add_argument("--render")
    ap.add_argument("--before", help="with --render: the rows of an earlier run, for a 'kernels before' column")
    a = ap.parse_args(argv)
    if a.render:
        print(render(_read(a.render), _read(a.before) if a.before else None))
        return 0

    def emit(row: dict[str, Any]) -> None:
        print(row, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(repr(row) + "\n")

    if a.graphs or not a.modules:
        for fam, (_, twin, odd) in FAMILIES.items():
            if a.names and fam not in a.names:
                continue
            for dims, what in [(twin, "twin (powers of two)"), *odd]:
                emit(run_graph(fam, dims, what, not a.no_tails))
    if a.modules:
        for name, twin, odd in MODULE_CASES:
            if a.names and name not in a.names:
                continue
            for dims in [twin, *odd]:
                emit(run_module(name, dims, a.train))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
