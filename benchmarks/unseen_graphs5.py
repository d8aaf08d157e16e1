"""Held-out programs, fifth set: ``vm.Graph`` programs of open LLMs at their real sizes (twentieth session).

Pieces of Phi-3, Qwen2, DeepSeek-V2, Llama-3 and Gemma-2 in no earlier set (not the suite, the models set, the
layer, held-out sets 1-4, the odd-shapes sweep), written as the models' code computes them, at the models' own sizes
(``full``, from their public configs) and as scaled-down twins of the same structure (``small``, for the tests).
Each full-size program goes through ``vm.superoptimize`` with the default options (the search cache off) on the CPU,
as the fourth set's runner does (:func:`unseen_graphs4.run_graph`: Proved, wall and CPU seconds, candidates, kernels,
the cost model's estimate against one kernel per op)::

    PYTHONPATH=. TRITON_INTERPRET=1 python benchmarks/unseen_graphs5.py [--small] [--out FILE] [NAME ...]
    python benchmarks/unseen_graphs5.py --render FILE
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import unseen_graphs4 as u4

import verimirage as vm

F16, F32 = vm.float16, vm.float32
Program = u4.Program


def _rms32(g: vm.Graph, x: Any, eps: float) -> Any:
    """Llama's RMSNorm: the variance in float32, the normalised value cast back to half (the weight applied after)."""
    x32 = g.cast(x, F32)
    return g.cast(g.mul(x32, g.rsqrt(g.shift(g.mean(g.square(x32), axis=x.type.rank - 1), eps))), F16)


def phi3_rmsnorm_fused_qkv_split(small: bool) -> vm.Graph:
    """Phi-3-mini: RMSNorm (eps 1e-5) then the fused q/k/v projection 3,072 -> 3 x 32 heads x 96 = 9,216, split into
    q, k and v (three outputs); 16 tokens."""
    t, hid = (4, 96) if small else (16, 3072)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    w = g.input("norm_w", (1, hid), F16)
    wqkv = g.input("w_qkv", (hid, 3 * hid), F16)
    qkv = g.matmul(g.mul(_rms32(g, x, 1e-5), w), wqkv)
    g.output(*(g.slice(qkv, 1, i * hid, (i + 1) * hid) for i in range(3)))
    return g


def qwen2_swiglu_ffn_8960(small: bool) -> vm.Graph:
    """Qwen2-1.5B's MLP: ``down(silu(x W_gate) * (x W_up))``, hidden 1,536, intermediate 8,960 (= 2^8 x 35), 32
    tokens."""
    t, hid, inter = (8, 48, 280) if small else (32, 1536, 8960)
    g = vm.Graph()
    x = g.input("x", (t, hid), F16)
    wg, wu = g.input("w_gate", (hid, inter), F16), g.input("w_up", (hid, inter), F16)
    wd = g.input("w_down", (inter, hid), F16)
    g.output(g.matmul(g.mul(g.silu(g.matmul(x, wg)), g.matmul(x, wu)), wd))
    return g


def deepseek_v2_lite_expert_gemv(small: bool) -> vm.Graph:
    """DeepSeek-V2-Lite: one routed expert for one decode token (a GEMV), hidden 2,048, expert intermediate 1,408,
    SwiGLU, the output times the router's weight of the expert."""
    hid, inter = (64, 44) if small else (2048, 1408)
    g = vm.Graph()
    x = g.input("x", (1, hid), F16)
    wg, wu = g.input("w_gate", (hid, inter), F16), g.input("w_up", (hid, inter), F16)
    wd = g.input("w_down", (inter, hid), F16)
    r = g.input("route_w", (1, 1), F16)
    g.output(g.mul(g.matmul(g.mul(g.silu(g.matmul(x, wg)), g.matmul(x, wu)), wd), r))
    return g


def llama3_70b_gqa_decode_32k(small: bool) -> vm.Graph:
    """Llama-3-70B decode: 64 query heads over 8 KV heads (groups of 8), head dim 128, a 32,768-token cache."""
    kv, grp, d, n = (2, 8, 16, 256) if small else (8, 8, 128, 32768)
    g = vm.Graph()
    q = g.input("q", (kv, grp, d), F16)
    k, v = g.input("k", (kv, d, n), F16), g.input("v", (kv, n, d), F16)
    g.output(g.matmul(u4._softmax(g, g.scale(g.matmul(q, k), d ** -0.5), 2), v))
    return g


def gemma2_27b_softcap_gqa_decode(small: bool) -> vm.Graph:
    """Gemma-2-27B decode: 32 query heads over 16 KV heads (pairs), head dim 128, scores scaled by
    ``query_pre_attn_scalar ** -0.5`` (144) and soft-capped at 50 in half precision, the softmax in float32 cast back
    (as the model's eager attention), a 4,096-token cache."""
    kv, grp, d, n = (2, 2, 16, 128) if small else (16, 2, 128, 4096)
    g = vm.Graph()
    q = g.input("q", (kv, grp, d), F16)
    k, v = g.input("k", (kv, d, n), F16), g.input("v", (kv, n, d), F16)
    s = g.scale(g.matmul(q, k), 144 ** -0.5)
    c = g.scale(g.tanh(g.scale(s, 1 / 50.0)), 50.0)
    g.output(g.matmul(g.cast(u4._softmax(g, g.cast(c, F32), 2), F16), v))
    return g


def llama3_residual_rmsnorm(small: bool) -> vm.Graph:
    """Llama-3-8B between attention and MLP: the residual add (the new residual stream, an output) then RMSNorm
    (eps 1e-5, the variance in float32) times the weight; hidden 4,096, 64 tokens."""
    t, hid = (8, 64) if small else (64, 4096)
    g = vm.Graph()
    x, a = g.input("x", (t, hid), F16), g.input("attn_out", (t, hid), F16)
    w = g.input("norm_w", (1, hid), F16)
    h = g.add(x, a)
    g.output(h, g.mul(_rms32(g, h, 1e-5), w))
    return g


def deepseek_v2_kv_decompress(small: bool) -> vm.Graph:
    """DeepSeek-V2's KV decompression for a prefill chunk: the 512-wide latent ``c_kv`` RMSNormed (eps 1e-6, times
    its weight), projected to 128 heads x (128 no-rope key + 128 value) = 32,768, split into the keys and values
    (two outputs); 32 tokens."""
    t, lat, h, dk = (4, 32, 4, 8) if small else (32, 512, 128, 128)
    g = vm.Graph()
    c = g.input("c_kv", (t, lat), F16)
    w = g.input("kv_norm_w", (lat,), F16)
    wkv = g.input("w_kv_b", (lat, h * 2 * dk), F16)
    kv = g.reshape(g.matmul(g.rms_norm(c, w, eps=1e-6), wkv), (t, h, 2 * dk))
    g.output(g.slice(kv, 2, 0, dk), g.slice(kv, 2, dk, 2 * dk))
    return g


def deepseek_v2_moe_combine(small: bool) -> vm.Graph:
    """DeepSeek-V2's MoE output: the six routed experts' outputs weighted by their router weights and summed, plus
    the shared experts' output and the residual; hidden 5,120, 16 tokens."""
    k, t, hid = (6, 4, 64) if small else (6, 16, 5120)
    g = vm.Graph()
    y = g.input("expert_out", (k, t, hid), F16)
    w = g.input("route_w", (k, t, 1), F16)
    shared, x = g.input("shared_out", (t, hid), F16), g.input("x", (t, hid), F16)
    g.output(g.add(x, g.add(shared, g.reshape(g.sum(g.mul(y, w), axis=0), (t, hid)))))
    return g


PROGRAMS: dict[str, u4.Program] = {
    "phi3_rmsnorm_fused_qkv_split": Program(phi3_rmsnorm_fused_qkv_split, "Phi-3-mini"),
    "qwen2_swiglu_ffn_8960": Program(qwen2_swiglu_ffn_8960, "Qwen2-1.5B"),
    "deepseek_v2_lite_expert_gemv": Program(deepseek_v2_lite_expert_gemv, "DeepSeek-V2-Lite"),
    "llama3_70b_gqa_decode_32k": Program(llama3_70b_gqa_decode_32k, "Llama-3-70B"),
    "gemma2_27b_softcap_gqa_decode": Program(gemma2_27b_softcap_gqa_decode, "Gemma-2-27B"),
    "llama3_residual_rmsnorm": Program(llama3_residual_rmsnorm, "Llama-3-8B"),
    "deepseek_v2_kv_decompress": Program(deepseek_v2_kv_decompress, "DeepSeek-V2"),
    "deepseek_v2_moe_combine": Program(deepseek_v2_moe_combine, "DeepSeek-V2"),
}


def build(name: str, small: bool = False) -> vm.Graph:
    """Program ``name`` at its full size (or its scaled-down twin), checked."""
    return u4.build(name, small, PROGRAMS)


if __name__ == "__main__":
    raise SystemExit(u4.main(programs=PROGRAMS, builder=build, doc=__doc__))
