"""Held-out programs, fourth set: ``vm.Graph`` programs of open LLMs at their real sizes (nineteenth session).

Pieces of open models in no other set (not the suite, the models set, the layer, the earlier held-out sets, whose
graph programs are small, nor the odd-shapes sweep, whose sizes are reduced), each written as the model's code
computes it, at the model's own sizes (``full``) and as a scaled-down twin of the same structure (``small``, for
the interpreter in the tests). Each full-size program goes through ``vm.superoptimize`` with the default options
(the search cache off) on the CPU: whether the best candidate is Proved, the search + verification wall time (the
bar: a full-size program within 60 s, a layer within 5 min), the candidates, and the cost model's estimate of the
best against the source's one-kernel-per-op form::

    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/unseen_graphs4.py [--small] [--out FILE] [NAME ...]
    python benchmarks/unseen_graphs4.py --render FILE

Not expressible and so not here: a top-k (the router's renormalisation over its two largest weights needs an
index op; the registry has none), an embedding lookup (the rows are the program's input instead).
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verimirage as vm
from verimirage.benchmarks import models as M

F16, F32 = vm.float16, vm.float32


def _softmax(g: vm.Graph, s: Any, axis: int) -> Any:
    """The max-shifted softmax along ``axis``."""
    e = g.exp(g.sub(s, g.max(s, axis=axis)))
    return g.div(e, g.sum(e, axis=axis))


def _causal_softmax(g: vm.Graph, s: Any, n: int) -> Any:
    """Softmax of ``s`` (..., n, n) under the causal mask, masked weights exactly 0 (SDPA's ``is_causal``)."""
    ax = s.type.rank - 1
    m = g.tril_mask((n, n))
    c = g.where(m, s, g.shift(g.scale(s, 0.0), M.MASKED))
    e = g.where(m, g.exp(g.sub(c, g.max(c, axis=ax))), g.scale(c, 0.0))
    return g.div(e, g.sum(e, axis=ax))


# --------------------------------------------------------------------------- the programs


def mla_absorbed_decode(small: bool) -> vm.Graph:
    """DeepSeek-V2 MLA decode with the absorbed projections: each head's no-rope query times its ``W_UK`` gives a
    query in the 512-wide latent space; the heads, as rows, attend to the shared latent cache (``c_kv``) plus the
    shared 64-wide rope keys; the latent output times each head's ``W_UV``. 128 heads, a 4,096-token cache."""
    h, nope, lat, rope, dv, n = (4, 16, 32, 8, 16, 64) if small else (128, 128, 512, 64, 128, 4096)
    g = vm.Graph()
    q_nope = g.input("q_nope", (h, 1, nope), F16)
    q_rope = g.input("q_rope", (1, h, rope), F16)
    w_uk = g.input("w_uk", (h, nope, lat), F16)
    w_uv = g.input("w_uv", (h, lat, dv), F16)
    ckv = g.input("c_kv", (1, n, lat), F16)
    kr = g.input("k_rope", (1, n, rope), F16)
    q_lat = g.reshape(g.matmul(q_nope, w_uk), (1, h, lat))
    s = g.add(g.matmul(q_lat, g.transpose(ckv, 1, 2)), g.matmul(q_rope, g.transpose(kr, 1, 2)))
    p = _softmax(g, g.scale(s, (nope + rope) ** -0.5), 2)
    o_lat = g.reshape(g.matmul(p, ckv), (h, 1, lat))
    g.output(g.matmul(o_lat, w_uv))
    return g


def sliding_window_decode(small: bool) -> vm.Graph:
    """Mistral-7B decode with its 4,096-token sliding window over an 8,192-token cache: 8 KV heads of 4 queries,
    head dim 128, the window a boolean mask input (keys outside it weigh exactly 0)."""
    kv, grp, d, n = (2, 4, 16, 128) if small else (8, 4, 128, 8192)
    g = vm.Graph()
    q = g.input("q", (kv, grp, d), F16)
    k = g.input("k", (kv, d, n), F16)
    v = g.input("v", (kv, n, d), F16)
    mask = g.input("window", (1, 1, n), vm.bool)
    s = g.scale(g.matmul(q, k), d ** -0.5)
    c = g.where(mask, s, g.shift(g.scale(s, 0.0), M.MASKED))
    e = g.where(mask, g.exp(g.sub(c, g.max(c, axis=2))), g.scale(c, 0.0))
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def alibi_decode(small: bool) -> vm.Graph:
    """MPT-7B / BLOOM ALiBi decode: 32 heads of 128, a 4,096-token cache; the bias ``slope_h * j`` made from the
    per-head slopes and the key positions in float32 (the softmax is shift-invariant, so ``j`` stands for ``j - i``),
    the scores and the softmax in float32, the weights cast back to half for ``@ V``."""
    h, d, n = (4, 16, 64) if small else (32, 128, 4096)
    g = vm.Graph()
    q = g.input("q", (h, 1, d), F16)
    k = g.input("k", (h, d, n), F16)
    v = g.input("v", (h, n, d), F16)
    slopes = g.input("slopes", (h, 1, 1), F32)
    pos = g.input("positions", (1, 1, n), F32)
    s = g.add(g.scale(g.cast(g.matmul(q, k), F32), d ** -0.5), g.mul(slopes, pos))
    g.output(g.matmul(g.cast(_softmax(g, s, 2), F16), v))
    return g


def partial_rotary_attention(small: bool) -> vm.Graph:
    """Phi-2 (hidden 2,560): 32 heads of 80, rotary on the first 32 channels of each head only (partial rotary
    factor 0.4), the rest passed through; causal attention over a 1,024-token prefill."""
    h, t, d, r = (2, 32, 20, 8) if small else (32, 1024, 80, 32)
    g = vm.Graph()
    q, k, v = (g.input(x, (h, t, d), F16) for x in "qkv")
    cos, sin = g.input("cos", (t, r), F16), g.input("sin", (t, r), F16)

    def rot(x: Any) -> Any:
        return g.concat([M.rotary(g, g.slice(x, 2, 0, r), cos, sin), g.slice(x, 2, r, d)], 2)

    s = g.scale(g.matmul(rot(q), g.transpose(rot(k), 1, 2)), d ** -0.5)
    g.output(g.matmul(_causal_softmax(g, s, t), v))
    return g


def qk_layernorm_attention(small: bool) -> vm.Graph:
    """Cohere (Command R+) QK-norm: a LayerNorm without bias over each head's 128 channels of q and k, with a weight
    per head, before causal attention; 32 heads, a 1,024-token prefill."""
    h, t, d = (2, 32, 16) if small else (32, 1024, 128)
    g = vm.Graph()
    q, k, v = (g.input(x, (h, t, d), F16) for x in "qkv")
    wq, wk = g.input("wq", (h, 1, d), F16), g.input("wk", (h, 1, d), F16)

    def ln(x: Any, w: Any) -> Any:
        xc = g.sub(x, g.mean(x, axis=2))
        return g.mul(g.mul(xc, g.rsqrt(g.shift(g.mean(g.square(xc), axis=2), 1e-5))), w)

    s = g.scale(g.matmul(ln(q, wq), g.transpose(ln(k, wk), 1, 2)), d ** -0.5)
    g.output(g.matmul(_causal_softmax(g, s, t), v))
    return g


def gemma_embed_norm_qkv(small: bool) -> vm.Graph:
    """Gemma-2-9B's first step: the embedding rows scaled by ``sqrt(hidden)`` rounded to the activation dtype (the
    residual stream, an output), then Gemma's RMSNorm in float32 times ``(1 + w)`` and the fused q/k/v projection
    (16 heads of 256 and 2 x 8 KV heads: 3,584 -> 8,192) for 16 tokens."""
    t, hid, out = (4, 56, 128) if small else (16, 3584, 8192)
    g = vm.Graph()
    emb = g.input("emb_rows", (t, hid), F16)
    w = g.input("norm_w", (1, hid), F16)
    wqkv = g.input("w_qkv", (hid, out), F16)
    h = g.scale(emb, float(np.float16(math.sqrt(hid))))
    x = g.cast(h, F32)
    y = g.mul(g.mul(x, g.rsqrt(g.shift(g.mean(g.square(x), axis=1), 1e-6))), g.shift(g.cast(w, F32), 1.0))
    g.output(h, g.matmul(g.cast(y, F16), wqkv))
    return g


def geglu_tanh_ffn(small: bool) -> vm.Graph:
    """Gemma-2-9B's MLP: ``down(gelu_tanh(x W_gate) * (x W_up))``, hidden 3,584, intermediate 14,336, 16 tokens."""
    t, hid, inter = (8, 56, 224) if small else (16, 3584, 14336)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    wg, wu = g.input("w_gate", (hid, inter), F16), g.input("w_up", (hid, inter), F16)
    wd = g.input("w_down", (inter, hid), F16)
    g.output(g.matmul(g.mul(g.gelu(g.matmul(x, wg)), g.matmul(x, wu)), wd))
    return g


def gptj_parallel_decode_layer(small: bool) -> vm.Graph:
    """A GPT-J-6B decode layer (no rotary): one LayerNorm feeding attention and the MLP in parallel,
    ``x + attn(ln(x)) + mlp(ln(x))``; 16 heads of 256, the new key and value appended to a 2,047-token cache
    (``concat``), MLP 16,384 with the tanh GELU and biases; batch 1."""
    hid, h, d, n, inter = (32, 2, 16, 15, 128) if small else (4096, 16, 256, 2047, 16384)
    g = vm.Graph()
    x = g.input("x", (1, hid), F16)
    gamma, beta = g.input("ln_w", (hid,), F16), g.input("ln_b", (hid,), F16)
    wq, wk, wv, wo = (g.input(f"w_{c}", (hid, hid), F16) for c in "qkvo")
    kc, vc = g.input("k_cache", (h, d, n), F16), g.input("v_cache", (h, n, d), F16)
    w1, b1 = g.input("w_fc", (hid, inter), F16), g.input("b_fc", (1, inter), F16)
    w2, b2 = g.input("w_proj", (inter, hid), F16), g.input("b_proj", (1, hid), F16)
    ln = M.layer_norm(g, x, gamma, beta)
    q = g.reshape(g.matmul(ln, wq), (h, 1, d))
    k = g.concat([kc, g.reshape(g.matmul(ln, wk), (h, d, 1))], 2)
    v = g.concat([vc, g.reshape(g.matmul(ln, wv), (h, 1, d))], 1)
    o = g.matmul(_softmax(g, g.scale(g.matmul(q, k), d ** -0.5), 2), v)
    attn = g.matmul(g.reshape(o, (1, hid)), wo)
    mlp = g.add(g.matmul(g.gelu(g.add(g.matmul(ln, w1), b1)), w2), b2)
    g.output(g.add(g.add(x, attn), mlp))
    return g


def moe_router_64(small: bool) -> vm.Graph:
    """OLMoE-1B-7B's router over a 2,048-token prefill: hidden 2,048, 64 experts, the softmax in float32 (the dense
    gate; the top-8 that follows has no op)."""
    t, hid, e = (32, 64, 16) if small else (2048, 2048, 64)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("w_router", (hid, e), F16)
    g.output(_softmax(g, g.cast(g.matmul(x, w), F32), 1))
    return g


def t5_rmsnorm_linear(small: bool) -> vm.Graph:
    """T5 v1.1 XXL's T5LayerNorm (no mean subtracted, the variance in float32, the result cast back to half before
    the weight) then the query projection, 4,096 -> 4,096, over 512 encoder tokens."""
    t, d = (16, 64) if small else (512, 4096)
    g = vm.Graph()
    x = g.input("x", (t, d), F16)
    w = g.input("w", (1, d), F16)
    wq = g.input("w_q", (d, d), F16)
    x32 = g.cast(x, F32)
    y = g.cast(g.mul(x32, g.rsqrt(g.shift(g.mean(g.square(x32), axis=1), 1e-6))), F16)
    g.output(g.matmul(g.mul(y, w), wq))
    return g


def gemma2_final_softcap_logsoftmax(small: bool) -> vm.Graph:
    """Gemma-2's final logits in float32 soft-capped at 30 (``30 tanh(z / 30)``), then the log-softmax of the loss;
    the 256,000-entry vocabulary, a 128-token chunk of a prefill."""
    t, voc = (8, 512) if small else (128, 256000)
    g = vm.Graph()
    z = g.input("logits", (t, voc), F32)
    c = g.scale(g.tanh(g.scale(z, 1 / 30.0)), 30.0)
    g.output(M.log_softmax(g, c, 1))
    return g


def gemma2_attention_softcap_fp32(small: bool) -> vm.Graph:
    """Gemma-2-9B's attention in float32: scores scaled by ``query_pre_attn_scalar ** -0.5`` (256), soft-capped at
    50, causal; 16 heads of 256 (the KV heads repeated), a 1,024-token prefill."""
    h, t, d = (2, 32, 16) if small else (16, 1024, 256)
    g = vm.Graph()
    q, k, v = g.input("q", (h, t, d), F32), g.input("k", (h, d, t), F32), g.input("v", (h, t, d), F32)
    s = g.scale(g.matmul(q, k), d ** -0.5)
    s = g.scale(g.tanh(g.scale(s, 1 / 50.0)), 50.0)
    g.output(g.matmul(_causal_softmax(g, s, t), v))
    return g


def qwen2_gqa_decode_group7(small: bool) -> vm.Graph:
    """Qwen2-7B decode: 28 query heads over 4 KV heads (groups of 7), head dim 128, an 8,192-token cache."""
    kv, grp, d, n = (2, 7, 16, 64) if small else (4, 7, 128, 8192)
    g = vm.Graph()
    q = g.input("q", (kv, grp, d), F16)
    k, v = g.input("k", (kv, d, n), F16), g.input("v", (kv, n, d), F16)
    g.output(g.matmul(_softmax(g, g.scale(g.matmul(q, k), d ** -0.5), 2), v))
    return g


def qwen25_rmsnorm_qkv_bias(small: bool) -> vm.Graph:
    """Qwen2.5-14B: RMSNorm then the fused biased q/k/v projection, hidden 5,120 -> 40 x 128 + 2 x 8 x 128 = 7,168,
    16 tokens."""
    t, hid, out = (4, 80, 112) if small else (16, 5120, 7168)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("norm_w", (hid,), F16)
    wqkv, b = g.input("w_qkv", (hid, out), F16), g.input("b_qkv", (out,), F16)
    g.output(g.add(g.matmul(g.rms_norm(x, w, eps=1e-6), wqkv), b))
    return g


def qwen25_sampling_softmax(small: bool) -> vm.Graph:
    """Qwen2.5-7B sampling: half-precision logits over the 152,064-entry vocabulary, in float32 divided by the
    temperature 0.7, softmax; 64 sequences."""
    t, voc = (4, 1188) if small else (64, 152064)
    g = vm.Graph()
    z = g.input("logits", (t, voc), F16)
    g.output(_softmax(g, g.scale(g.cast(z, F32), 1 / 0.7), 1))
    return g


def qwen2_cross_entropy(small: bool) -> vm.Graph:
    """Qwen2-0.5B's loss over its 151,936-entry vocabulary: cross entropy with one-hot targets, 512 tokens."""
    t, voc = (8, 2374) if small else (512, 151936)
    g = vm.Graph()
    z = g.input("logits", (t, voc), F16)
    g.output(M.cross_entropy(g, z, g.input("onehot", (t, voc), F16)))
    return g


@dataclass(frozen=True)
class Program:
    """One program of the set: its builder (``small`` -> graph), the model it is from, and whether it is a layer
    (the bar: 5 minutes, not 60 s)."""

    build: Callable[[bool], vm.Graph]
    source: str
    layer: bool = False


PROGRAMS: dict[str, Program] = {
    "mla_absorbed_decode": Program(mla_absorbed_decode, "DeepSeek-V2"),
    "sliding_window_decode": Program(sliding_window_decode, "Mistral-7B"),
    "alibi_decode": Program(alibi_decode, "MPT-7B / BLOOM"),
    "partial_rotary_attention": Program(partial_rotary_attention, "Phi-2"),
    "qk_layernorm_attention": Program(qk_layernorm_attention, "Cohere Command R+"),
    "gemma_embed_norm_qkv": Program(gemma_embed_norm_qkv, "Gemma-2-9B"),
    "geglu_tanh_ffn": Program(geglu_tanh_ffn, "Gemma-2-9B"),
    "gptj_parallel_decode_layer": Program(gptj_parallel_decode_layer, "GPT-J-6B", layer=True),
    "moe_router_64": Program(moe_router_64, "OLMoE-1B-7B"),
    "t5_rmsnorm_linear": Program(t5_rmsnorm_linear, "T5 v1.1 XXL"),
    "gemma2_final_softcap_logsoftmax": Program(gemma2_final_softcap_logsoftmax, "Gemma-2"),
    "gemma2_attention_softcap_fp32": Program(gemma2_attention_softcap_fp32, "Gemma-2-9B"),
    "qwen2_gqa_decode_group7": Program(qwen2_gqa_decode_group7, "Qwen2-7B"),
    "qwen25_rmsnorm_qkv_bias": Program(qwen25_rmsnorm_qkv_bias, "Qwen2.5-14B"),
    "qwen25_sampling_softmax": Program(qwen25_sampling_softmax, "Qwen2.5-7B"),
    "qwen2_cross_entropy": Program(qwen2_cross_entropy, "Qwen2-0.5B"),
}


def build(name: str, small: bool = False, programs: dict[str, Program] | None = None) -> vm.Graph:
    """Program ``name`` at its full size (or its scaled-down twin), checked (``programs``: another set's)."""
    g = (PROGRAMS if programs is None else programs)[name].build(small)
    g.check()
    return g


def program_inputs(g: vm.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs as the model gives them: standard normal / 2 for activations and weights; the sliding window's last half
    of the keys kept; ALiBi's slopes ``2 ** (-8 (i + 1) / h)`` and key positions ``0 .. n - 1``; one-hot targets."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for t in g.inputs:
        shape = tuple(t.shape)
        if t.dtype == vm.bool:
            out[t.name] = np.broadcast_to(np.arange(shape[-1]) >= shape[-1] // 2, shape).copy()
        elif t.name == "slopes":
            out[t.name] = 2.0 ** (-8.0 * (np.arange(shape[0]) + 1) / shape[0]).reshape(shape)
        elif t.name == "positions":
            out[t.name] = np.arange(shape[-1], dtype=np.float64).reshape(shape)
        elif t.name == "onehot":
            out[t.name] = np.eye(shape[1])[rng.integers(0, shape[1], shape[0])]
        else:
            out[t.name] = rng.standard_normal(shape) / 2
    return out


def unfused_estimate_s(g: vm.Graph) -> float:
    """The cost model's estimate of ``g`` as one kernel per op (the source's own form), as the backend launches."""
    from verimirage.pipeline.pricing import cost

    return float(cost(vm.MuGraph.from_graph(g)).time_s)


def run(name: str, small: bool = False) -> dict[str, Any]:
    """One ``vm.superoptimize`` (default options, the search cache off): a row of the table."""
    return run_graph(name, build(name, small), small)


def run_graph(name: str, g: vm.Graph, small: bool = False) -> dict[str, Any]:
    """:func:`run` of program ``name`` built as ``g`` (also the later held-out sets' runner)."""
    row: dict[str, Any] = {"name": name, "small": small, "load_before": round(os.getloadavg()[0], 2)}
    c0, t0 = time.process_time(), time.perf_counter()
    try:
        res = vm.superoptimize(g, cache=False, progress=False)
    except Exception as e:  # a row, not a crash: the sweep goes on
        row.update(search_s=round(time.perf_counter() - t0, 2), error=f"{type(e).__name__}: {e}"[:400])
        return row
    row.update(search_s=round(time.perf_counter() - t0, 2), cpu_s=round(time.process_time() - c0, 2),
               load_after=round(os.getloadavg()[0], 2))
    rep = res.report
    row.update(candidates=len(res.candidates), verified=rep.verified, lowered=rep.lowered,
               stop=rep.stop_reason.split(" (")[0], phases={k: round(v, 2) for k, v in rep.phase_seconds.items()},
               phases_cpu={k: round(v, 2) for k, v in rep.phase_cpu_seconds.items()},
               rejected=[r for _, r in rep.rejected][:5], split=rep.split)
    best = res.best
    base = unfused_estimate_s(g)
    row.update(unfused_kernels=vm.MuGraph.from_graph(g).num_kernels, unfused_us=round(base * 1e6, 2))
    if best is None:
        row.update(proved=False)
        return row
    row.update(proved=isinstance(best.verdict, vm.Proved), verdict=type(best.verdict).__name__,
               kernels=best.mugraph.num_kernels, est_us=round(best.cost.time_s * 1e6, 2),
               speedup=round(base / best.cost.time_s, 2))
    return row


def render(rows: list[dict[str, Any]], programs: dict[str, Program] | None = None) -> str:
    """The markdown table of :func:`run` rows (``programs``: the set they are of; this one by default)."""
    programs = PROGRAMS if programs is None else programs
    out = ["| program | from | Proved | search + verify s (CPU s) | load | candidates (verified) | kernels | "
           "est. µs | one kernel per op: kernels, est. µs | speedup est. |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        src = programs[r["name"]].source if r["name"] in programs else ""
        if "error" in r:
            out.append(f"| {r['name']} | {src} | error | {r['search_s']:.1f} | {r['load_before']} | - | - | - | - | "
                       f"{r['error'][:100]} |")
            continue
        out.append(f"| {r['name']} | {src} | {'yes' if r.get('proved') else 'no'} | {r['search_s']:.1f} "
                   f"({r['cpu_s']:.1f}) | {r['load_before']}-{r['load_after']} | {r['candidates']} ({r['verified']}) "
                   f"| {r.get('kernels', '-')} | {r.get('est_us', '-')} | {r['unfused_kernels']}, {r['unfused_us']} "
                   f"| {r.get('speedup', '-')}x |")
    return "\n".join(out)


def main(argv: list[str] | None = None, programs: dict[str, Program] | None = None,
         builder: Callable[[str, bool], vm.Graph] | None = None, doc: str | None = None) -> int:
    """Print one row per program (a dict per line), or with ``--render FILE`` the markdown table of such lines
    (``programs``, ``builder``, ``doc``: another set's; this one's by default)."""
    programs = PROGRAMS if programs is None else programs
    builder = build if builder is None else builder
    ap = argparse.ArgumentParser(description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--small", action="store_true", help="the scaled-down twins")
    ap.add_argument("--out", help="also append the rows to this file")
    ap.add_argument("--render", help="print the markdown table of a file of printed rows")
    a = ap.parse_args(argv)
    if a.render:
        rows = [ast.literal_eval(ln) for ln in Path(a.render).read_text().splitlines() if ln.startswith("{")]
        print(render(rows, programs))
        return 0
    import subprocess

    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(vm.__file__).parent).stdout.strip()
    head = (f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} {platform.machine()} {os.cpu_count()} cores, "
            f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}, verimirage {vm.__file__} at {rev}")
    print(head, flush=True)
    for n in a.names or list(programs):
        r = run_graph(n, builder(n, a.small), a.small)
        print(r, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(f"{r}\n")
    print(f"# load after {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
