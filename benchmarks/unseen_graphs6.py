"""Held-out programs, sixth set: ``vm.Graph`` programs of open LLMs at their real sizes (twenty-first session).

Pieces of Qwen3, Falcon, Whisper, Mixtral, DeepSeek-V3, GPT-2 XL, BERT, CLIP and Cohere (Aya 23) in no earlier set
(not the suite, the models set, the layer, held-out sets 1-5, the odd-shapes sweep): per-head QK RMSNorm, multi-query
attention over 71 heads, cross-attention over 1,500 encoder states with its projections, top-k routing weights
renormalised over the chosen experts (the choice a boolean mask input: the registry has no top-k), a sigmoid router,
a low-rank query with a norm between its factors, a post-LN residual, attention over 257 tokens, a LayerNorm without
bias. Each is written as the model's code computes it, at the model's own sizes (``full``, from its public config)
and as a scaled-down twin of the same structure (``small``, for the tests). Each full-size program goes through
``vm.superoptimize`` with the default options (the search cache off) on the CPU, as the fourth set's runner does
(:func:`unseen_graphs4.run_graph`)::

    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/unseen_graphs6.py [--small] [--out FILE] [NAME ...]
    python benchmarks/unseen_graphs6.py --render FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import unseen_graphs4 as u4

import verimirage as vm
from verimirage.benchmarks import models as M

F16, F32 = vm.float16, vm.float32
Program = u4.Program


def qwen3_qk_norm_gqa_decode(small: bool) -> vm.Graph:
    """Qwen3-8B decode: the new token's 32 query heads (as 8 KV groups of 4), each RMSNormed over its 128 channels in
    float32 (eps 1e-6) times the shared ``q_norm`` weight, rotated (rotary, one position), then attention over the
    8 KV heads' 4,096-token cache (its keys normed and rotated when they were written)."""
    kv, grp, d, n = (2, 4, 16, 64) if small else (8, 4, 128, 4096)
    g = vm.Graph()
    q = g.input("q", (kv, grp, d), F16)
    w = g.input("q_norm_w", (1, 1, d), F16)
    cos, sin = g.input("cos", (1, 1, d), F16), g.input("sin", (1, 1, d), F16)
    k, v = g.input("k", (kv, d, n), F16), g.input("v", (kv, n, d), F16)
    q32 = g.cast(q, F32)
    qn = g.mul(w, g.cast(g.mul(q32, g.rsqrt(g.shift(g.mean(g.square(q32), axis=2), 1e-6))), F16))
    s = g.scale(g.matmul(M.rotary(g, qn, cos, sin), k), d ** -0.5)
    g.output(g.matmul(u4._softmax(g, s, 2), v))
    return g


def falcon7b_mqa_decode(small: bool) -> vm.Graph:
    """Falcon-7B decode: multi-query attention, 71 query heads (a prime) over one KV head of 64, a 2,048-token
    cache."""
    h, d, n = (7, 16, 64) if small else (71, 64, 2048)
    g = vm.Graph()
    q = g.input("q", (1, h, d), F16)
    k, v = g.input("k", (1, d, n), F16), g.input("v", (1, n, d), F16)
    g.output(g.matmul(u4._softmax(g, g.scale(g.matmul(q, k), d ** -0.5), 2), v))
    return g


def whisper_cross_attention(small: bool) -> vm.Graph:
    """Whisper large-v3's decoder cross-attention over the prompt's 4 tokens: the biased query projection (1,280)
    scaled by ``64 ** -0.5``, 20 heads of 64 attending to the encoder's 1,500 states (keys and values projected once
    per utterance: inputs), no mask, then the biased output projection."""
    t, h, d, n = (4, 2, 16, 30) if small else (4, 20, 64, 1500)
    g = vm.Graph()
    x = g.input("x", (t, h * d), F16)
    wq, bq = g.input("w_q", (h * d, h * d), F16), g.input("b_q", (1, h * d), F16)
    k, v = g.input("k_enc", (h, d, n), F16), g.input("v_enc", (h, n, d), F16)
    wo, bo = g.input("w_o", (h * d, h * d), F16), g.input("b_o", (1, h * d), F16)
    q = g.transpose(g.reshape(g.scale(g.add(g.matmul(x, wq), bq), d ** -0.5), (t, h, d)), 0, 1)
    o = g.matmul(u4._softmax(g, g.matmul(q, k), 2), v)
    g.output(g.add(g.matmul(g.reshape(g.transpose(o, 0, 1), (t, h * d)), wo), bo))
    return g


def mixtral_router_top2_renorm(small: bool) -> vm.Graph:
    """Mixtral-8x7B's routing weights for a 512-token prefill: the gate projection (hidden 4,096 -> 8 experts), the
    softmax in float32, the two chosen experts' weights renormalised to sum to 1 (the choice, ``topk``'s, a boolean
    mask input), cast back to half."""
    t, hid, e = (16, 64, 8) if small else (512, 4096, 8)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("w_gate", (hid, e), F16)
    chosen = g.input("topk_mask", (t, e), vm.bool)
    p = u4._softmax(g, g.cast(g.matmul(x, w), F32), 1)
    kept = g.where(chosen, p, g.scale(p, 0.0))
    g.output(g.cast(g.div(kept, g.sum(kept, axis=1)), F16))
    return g


def deepseek_v3_sigmoid_router(small: bool) -> vm.Graph:
    """DeepSeek-V3's router for 64 tokens: the gate in float32 (hidden 7,168 -> 256 experts), sigmoid scores, the
    eight chosen experts' scores (the choice a boolean mask input: group-limited top-k) normalised by their sum
    (``+ 1e-20``) and scaled by the routed scaling factor 2.5."""
    t, hid, e = (8, 64, 32) if small else (64, 7168, 256)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("w_gate", (hid, e), F16)
    chosen = g.input("topk_mask", (t, e), vm.bool)
    s = g.sigmoid(g.matmul(g.cast(x, F32), g.cast(w, F32)))
    kept = g.where(chosen, s, g.scale(s, 0.0))
    g.output(g.scale(g.div(kept, g.shift(g.sum(kept, axis=1), 1e-20)), 2.5))
    return g


def deepseek_v3_q_lowrank(small: bool) -> vm.Graph:
    """DeepSeek-V3's MLA query for 16 tokens: the down projection (7,168 -> rank 1,536), RMSNorm (eps 1e-6) times its
    weight, the up projection to 128 heads x 192, split into the no-rope (128) and rope (64) parts (two outputs)."""
    t, hid, r, h, nope, rope = (4, 64, 24, 4, 16, 8) if small else (16, 7168, 1536, 128, 128, 64)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    wa = g.input("w_q_a", (hid, r), F16)
    wn = g.input("q_a_norm_w", (r,), F16)
    wb = g.input("w_q_b", (r, h * (nope + rope)), F16)
    q = g.reshape(g.matmul(g.rms_norm(g.matmul(x, wa), wn, eps=1e-6), wb), (t, h, nope + rope))
    g.output(g.slice(q, 2, 0, nope), g.slice(q, 2, nope, nope + rope))
    return g


def gpt2_xl_mlp_block(small: bool) -> vm.Graph:
    """GPT-2 XL's MLP half-block for 64 tokens: ``x + c_proj(gelu_new(c_fc(ln_2(x))))``, LayerNorm with bias (eps
    1e-5), hidden 1,600 (= 2^6 x 25), inner 6,400, biased projections."""
    t, hid, inter = (8, 40, 160) if small else (64, 1600, 6400)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    gamma, beta = g.input("ln_w", (hid,), F16), g.input("ln_b", (hid,), F16)
    w1, b1 = g.input("w_fc", (hid, inter), F16), g.input("b_fc", (1, inter), F16)
    w2, b2 = g.input("w_proj", (inter, hid), F16), g.input("b_proj", (1, hid), F16)
    h = g.gelu(g.add(g.matmul(M.layer_norm(g, x, gamma, beta), w1), b1))
    g.output(g.add(x, g.add(g.matmul(h, w2), b2)))
    return g


def bert_large_output_post_ln(small: bool) -> vm.Graph:
    """BERT-large's BertOutput over a 512-token sequence: the intermediate (4,096) projected back to 1,024 with bias,
    the residual added, then LayerNorm (eps 1e-12) after the sum (post-LN)."""
    t, hid, inter = (16, 32, 128) if small else (512, 1024, 4096)
    g = vm.Graph()
    hmid = g.input("intermediate", (t, inter), F16)
    x = g.input("x", (t, hid), F16)
    w, b = g.input("w_out", (inter, hid), F16), g.input("b_out", (1, hid), F16)
    gamma, beta = g.input("ln_w", (hid,), F16), g.input("ln_b", (hid,), F16)
    g.output(M.layer_norm(g, g.add(g.add(g.matmul(hmid, w), b), x), gamma, beta, eps=1e-12))
    return g


def clip_vit_l14_attention(small: bool) -> vm.Graph:
    """CLIP ViT-L/14's self-attention at 224 px: 257 tokens (256 patches and the class token: a prime), 16 heads of
    64, the query scaled by ``64 ** -0.5``, no mask."""
    h, t, d = (2, 17, 16) if small else (16, 257, 64)
    g = vm.Graph()
    q, k, v = g.input("q", (h, t, d), F16), g.input("k", (h, d, t), F16), g.input("v", (h, t, d), F16)
    g.output(g.matmul(u4._softmax(g, g.matmul(g.scale(q, d ** -0.5), k), 2), v))
    return g


def aya23_layernorm_qkv(small: bool) -> vm.Graph:
    """Aya-23-8B (Cohere's architecture): CohereLayerNorm (no bias; mean and centred variance in float32, eps 1e-5,
    times the weight in float32, cast back) then the fused q/k/v projection, 4,096 -> 32 x 128 + 2 x 8 x 128 =
    6,144, 16 tokens."""
    t, hid, out = (4, 64, 96) if small else (16, 4096, 6144)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("ln_w", (1, hid), F16)
    wqkv = g.input("w_qkv", (hid, out), F16)
    x32 = g.cast(x, F32)
    xc = g.sub(x32, g.mean(x32, axis=1))
    y = g.mul(g.cast(w, F32), g.mul(xc, g.rsqrt(g.shift(g.mean(g.square(xc), axis=1), 1e-5))))
    g.output(g.matmul(g.cast(y, F16), wqkv))
    return g


PROGRAMS: dict[str, u4.Program] = {
    "qwen3_qk_norm_gqa_decode": Program(qwen3_qk_norm_gqa_decode, "Qwen3-8B"),
    "falcon7b_mqa_decode": Program(falcon7b_mqa_decode, "Falcon-7B"),
    "whisper_cross_attention": Program(whisper_cross_attention, "Whisper large-v3"),
    "mixtral_router_top2_renorm": Program(mixtral_router_top2_renorm, "Mixtral-8x7B"),
    "deepseek_v3_sigmoid_router": Program(deepseek_v3_sigmoid_router, "DeepSeek-V3"),
    "deepseek_v3_q_lowrank": Program(deepseek_v3_q_lowrank, "DeepSeek-V3"),
    "gpt2_xl_mlp_block": Program(gpt2_xl_mlp_block, "GPT-2 XL"),
    "bert_large_output_post_ln": Program(bert_large_output_post_ln, "BERT-large"),
    "clip_vit_l14_attention": Program(clip_vit_l14_attention, "CLIP ViT-L/14"),
    "aya23_layernorm_qkv": Program(aya23_layernorm_qkv, "Aya-23-8B (Cohere)"),
}


def build(name: str, small: bool = False) -> vm.Graph:
    """Program ``name`` at its full size (or its scaled-down twin), checked."""
    return u4.build(name, small, PROGRAMS)


def program_inputs(g: vm.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """:func:`unseen_graphs4.program_inputs`, with a router's choice (``topk_mask``) as ``topk`` makes it: per row,
    the experts of the ``k`` largest logits of a random draw (``k`` 2 for 8 experts, else 8)."""
    out = u4.program_inputs(g, seed)
    rng = np.random.default_rng(seed + 1)
    for t in g.inputs:
        if t.name == "topk_mask":
            rows, e = tuple(t.shape)
            k = 2 if e <= 8 else 8
            top = np.argsort(rng.standard_normal((rows, e)), axis=1)[:, -k:]
            m = np.zeros((rows, e), dtype=bool)
            np.put_along_axis(m, top, True, axis=1)
            out[t.name] = m
    return out


if __name__ == "__main__":
    raise SystemExit(u4.main(programs=PROGRAMS, builder=build, doc=__doc__))
