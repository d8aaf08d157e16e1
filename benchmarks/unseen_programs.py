"""Programs from open LLM architectures that are in no other set (suite, corpus, models, layer): a held-out check.

Each torch module is a piece of a published architecture written the way its code bases write it (Gemma's
``(1 + w)`` RMSNorm, ALiBi, sliding-window masks, partial rotary, MLA's low-rank projections, MoE routing, ...);
each ``vm.Graph`` program is the same kind of piece written against the registry. ``tests/test_unseen_programs.py``
checks capture and numerics against float64; this script prints the table BENCHMARKS.md records::

    TRITON_INTERPRET=1 python benchmarks/unseen_programs.py [--graphs] [--modules] [--train] [--budget S]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import verimirage as vm
from verimirage.benchmarks.modules import float64_reference, loss_weights

B, T, D, H, HD, FF, V = 2, 4, 16, 2, 8, 32, 24


# --------------------------------------------------------------------------- torch modules


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: computed in float32, scaled by ``1 + weight`` (the weight starts at 0)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(d) / 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class GemmaNormLinear(nn.Module):
    """Gemma RMSNorm then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = GemmaRMSNorm(D)
        self.proj = nn.Linear(D, FF, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class GemmaEmbed(nn.Module):
    """Gemma's input embedding scaled by ``sqrt(hidden)`` (in the activation dtype), then the first norm."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.norm = GemmaRMSNorm(D)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h * torch.tensor(D ** 0.5, dtype=h.dtype)
        return self.norm(h)


class GemmaMLP(nn.Module):
    """Gemma's GeGLU: ``down(gelu_tanh(gate(x)) * up(x))``, three separate projections."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, FF, bias=False)
        self.up_proj = nn.Linear(D, FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class SquaredReLUMLP(nn.Module):
    """Primer / Nemotron MLP: ``down(relu(up(x)) ** 2)``."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.square(F.relu(self.up(x))))


class ScaledResidualMLP(nn.Module):
    """MiniCPM-style depth-scaled residual ``x + alpha * mlp(norm(x))``."""

    def __init__(self, alpha: float = 1.4 / math.sqrt(8)) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D, eps=1e-5)
        self.mlp = SquaredReLUMLP()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.alpha * self.mlp(self.norm(x))


class LayerNormNoBias(nn.Module):
    """OLMo / Cohere LayerNorm without a bias, then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D, bias=False)
        self.proj = nn.Linear(D, FF, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, n, -1).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    b, n, s, hd = t.shape
    return t.transpose(1, 2).reshape(b, s, n * hd)


class _Proj(nn.Module):
    def __init__(self, kv: int | None = None) -> None:
        super().__init__()
        kv = kv or H
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.k_proj = nn.Linear(D, kv * HD, bias=False)
        self.v_proj = nn.Linear(D, kv * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.kv = kv

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _heads(self.q_proj(x), H), _heads(self.k_proj(x), self.kv), _heads(self.v_proj(x), self.kv)


class SoftcapAttention(_Proj):
    """Gemma 2 attention-score soft-capping: ``cap * tanh(s / cap)`` before a causal softmax."""

    def __init__(self, cap: float = 50.0) -> None:
        super().__init__()
        self.cap = cap
        self.register_buffer("causal", torch.ones(T, T, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        s = q @ k.transpose(-1, -2) * HD ** -0.5
        s = torch.tanh(s / self.cap) * self.cap
        s = s.masked_fill(~self.causal, float("-inf"))
        return self.o_proj(_merge(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v))


def alibi_slopes(n: int) -> torch.Tensor:
    """ALiBi's per-head slopes ``2 ** (-8 i / n)`` (n a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)])


class AlibiAttention(_Proj):
    """BLOOM / MPT ALiBi: a per-head linear bias ``slope_h * (j - i)`` on causal scores, hand-written softmax."""

    def __init__(self) -> None:
        super().__init__()
        pos = torch.arange(T)
        rel = (pos[None, :] - pos[:, None]).float()
        bias = alibi_slopes(H)[:, None, None] * rel
        bias = bias.masked_fill(rel > 0, float("-inf"))
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        s = q @ k.transpose(-1, -2) / math.sqrt(HD) + self.bias
        return self.o_proj(_merge(torch.softmax(s, dim=-1) @ v))


class SlidingWindowAttention(_Proj):
    """Mistral-style sliding-window causal attention (window 2) via SDPA with a boolean mask, GQA."""

    def __init__(self, window: int = 2) -> None:
        super().__init__(kv=1)
        i = torch.arange(T)
        keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
        self.register_buffer("keep", keep, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        k = k.expand(-1, H, -1, -1)
        v = v.expand(-1, H, -1, -1)
        return self.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, attn_mask=self.keep)))


class SlidingWindowAdditive(_Proj):
    """Sliding-window causal attention with an additive float mask (0 / -inf) built once."""

    def __init__(self, window: int = 2) -> None:
        super().__init__()
        i = torch.arange(T)
        keep = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < window)
        self.register_buffer("mask", torch.zeros(T, T).masked_fill(~keep, float("-inf")), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        s = q @ k.transpose(-1, -2) * HD ** -0.5 + self.mask
        return self.o_proj(_merge(torch.softmax(s, dim=-1) @ v))


class _RopeAttention(_Proj):
    """Causal SDPA with q and k rotated by the subclass's ``_rope``."""

    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        o = F.scaled_dot_product_attention(self._rope(q), self._rope(k), v, is_causal=True)
        return self.o_proj(_merge(o))


class PartialRotaryAttention(_RopeAttention):
    """Phi / GPT-NeoX partial rotary: only the first half of each head rotated, the rest passed through."""

    def __init__(self, rot: int = HD // 2) -> None:
        super().__init__()
        self.rot = rot
        inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
        f = torch.outer(torch.arange(T).float(), inv)
        emb = torch.cat((f, f), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        r, p = t[..., : self.rot], t[..., self.rot:]
        r1, r2 = r[..., : self.rot // 2], r[..., self.rot // 2:]
        r = r * self.cos + torch.cat((-r2, r1), dim=-1) * self.sin
        return torch.cat((r, p), dim=-1)


class MQADecode(nn.Module):
    """Multi-query attention for one decoding step: the new k/v appended to a cache (``torch.cat``)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD, bias=False)
        self.kv_proj = nn.Linear(D, 2 * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        q = self.q_proj(x).view(b, 1, H, HD).transpose(1, 2)           # (B, H, 1, HD)
        k_new, v_new = self.kv_proj(x).view(b, 1, 1, 2 * HD).split(HD, dim=-1)
        k = torch.cat((k_cache, k_new), dim=2)                        # (B, 1, S+1, HD)
        v = torch.cat((v_cache, v_new), dim=2)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HD)                 # broadcast over the one KV head
        o = torch.softmax(s, dim=-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, 1, H * HD))


class MLAProjections(nn.Module):
    """DeepSeek-V2 MLA's low-rank q and kv: down-project, RMSNorm the latent, up-project; then attention."""

    def __init__(self, q_rank: int = 8, kv_rank: int = 4) -> None:
        super().__init__()
        self.q_a = nn.Linear(D, q_rank, bias=False)
        self.q_norm = nn.RMSNorm(q_rank, eps=1e-6)
        self.q_b = nn.Linear(q_rank, H * HD, bias=False)
        self.kv_a = nn.Linear(D, kv_rank, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=1e-6)
        self.kv_b = nn.Linear(kv_rank, 2 * H * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = _heads(self.q_b(self.q_norm(self.q_a(x))), H)
        kv = self.kv_b(self.kv_norm(self.kv_a(x)))
        k, v = kv.split(H * HD, dim=-1)
        o = F.scaled_dot_product_attention(q, _heads(k, H), _heads(v, H), is_causal=True)
        return self.o_proj(_merge(o))


class MoERouter(nn.Module):
    """Mixtral / Qwen-MoE router: softmax over experts, top-k, renormalise the kept weights."""

    def __init__(self, experts: int = 8, k: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(D, experts, bias=False)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        w, _ = torch.topk(probs, self.k, dim=-1)
        return w / w.sum(dim=-1, keepdim=True)


class MoEDenseGate(nn.Module):
    """A dense-dispatch MoE (every expert run, weighted by the router's softmax): ``sum_e p_e * expert_e(x)``."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.gate = nn.Linear(D, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, D, FF) / 4)
        self.w2 = nn.Parameter(torch.randn(experts, FF, D) / 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(self.gate(x), dim=-1)                 # (N, E)
        h = F.silu(torch.einsum("nd,edf->enf", x, self.w1))     # (E, N, F)
        y = torch.einsum("enf,efd->end", h, self.w2)            # (E, N, D)
        return torch.einsum("end,ne->nd", y, p)


class T5RelBiasAttention(nn.Module):
    """T5 attention: no score scaling, a learned relative-position bias looked up by bucket (an embedding)."""

    def __init__(self, buckets: int = 8) -> None:
        super().__init__()
        self.proj = _Proj()
        self.rel = nn.Embedding(buckets, H)
        pos = torch.arange(T)
        self.register_buffer("bucket", (pos[None, :] - pos[:, None]).clamp(-buckets // 2, buckets // 2 - 1)
                             + buckets // 2, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj.qkv(x)
        bias = self.rel(self.bucket).permute(2, 0, 1)[None]        # (1, H, T, T)
        s = q @ k.transpose(-1, -2) + bias
        return self.proj.o_proj(_merge(torch.softmax(s.float(), dim=-1).type_as(s) @ v))


class T5BiasGiven(nn.Module):
    """T5 attention with the position bias passed in (as later layers receive it from the first)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = _Proj()

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj.qkv(x)
        s = q @ k.transpose(-1, -2) + bias
        return self.proj.o_proj(_merge(torch.softmax(s, dim=-1) @ v))


class ParallelBlock(nn.Module):
    """GPT-J / Falcon parallel block: ``x + attn(ln(x)) + mlp(ln(x))`` from one LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.attn = _Proj()
        self.fc_in = nn.Linear(D, FF)
        self.fc_out = nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        q, k, v = self.attn.qkv(h)
        a = self.attn.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return x + a + self.fc_out(F.gelu(self.fc_in(h)))


class GatedAttentionOutput(_Proj):
    """Qwen3-Next-style gated attention: the attention output times ``sigmoid(gate(x))`` before o_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.g_proj = nn.Linear(D, H * HD, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        o = _merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return self.o_proj(o * torch.sigmoid(self.g_proj(x)))


class OlmoQKNorm(_Proj):
    """OLMo-2 QK-norm: RMSNorm over the whole q / k projection (all heads at once) before the head split."""

    def __init__(self) -> None:
        super().__init__()
        self.q_norm = nn.RMSNorm(H * HD, eps=1e-6)
        self.k_norm = nn.RMSNorm(H * HD, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = _heads(self.q_norm(self.q_proj(x)), H)
        k = _heads(self.k_norm(self.k_proj(x)), H)
        v = _heads(self.v_proj(x), H)
        return self.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))


class ZLossHead(nn.Module):
    """PaLM z-loss on the LM head's logits: ``1e-4 * mean(logsumexp(logits) ** 2)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.logsumexp(self.lm_head(x), dim=-1)
        return 1e-4 * (z ** 2).mean()


class LabelSmoothedCE(nn.Module):
    """LM head and cross entropy with label smoothing 0.1."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, V), targets.view(-1), label_smoothing=0.1)


class TiedHeadSoftcap(nn.Module):
    """Gemma's tied LM head (the embedding matrix transposed) with final logit soft-capping."""

    def __init__(self, cap: float = 30.0) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.randn(V, D) / 4)
        self.norm = GemmaRMSNorm(D)
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(self.norm(x), self.embed)
        return torch.tanh(logits / self.cap) * self.cap


class InterleavedRotary(_RopeAttention):
    """GPT-J's rotary on interleaved pairs: ``rotate_every_two`` (``x[..., ::2]``, ``x[..., 1::2]``, stack,
    flatten) and sin/cos repeated per pair."""

    def __init__(self) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
        f = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("cos", f.cos().repeat_interleave(2, dim=-1), persistent=False)
        self.register_buffer("sin", f.sin().repeat_interleave(2, dim=-1), persistent=False)

    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        x1, x2 = t[..., ::2], t[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        return t * self.cos + rot * self.sin


class ComplexRotary(_RopeAttention):
    """LLaMA-1's rotary through complex numbers (``view_as_complex`` times a ``polar`` table)."""

    def __init__(self) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
        f = torch.outer(torch.arange(T).float(), inv)
        self.register_buffer("freqs", torch.polar(torch.ones_like(f), f), persistent=False)

    def _rope(self, t: torch.Tensor) -> torch.Tensor:
        tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(tc * self.freqs).flatten(-2).type_as(t)


class SDPAEnableGQA(_Proj):
    """GQA through SDPA's own ``enable_gqa=True`` (torch >= 2.5) instead of repeating the KV heads."""

    def __init__(self) -> None:
        super().__init__(kv=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        return self.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)))


class BloomBaddbmm(nn.Module):
    """BLOOM's scores: ``alibi.baddbmm(q, k^T, beta=1, alpha=1/sqrt(d))`` on (B*H, T, T), an additive mask."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.dense = nn.Linear(D, D)
        pos = torch.arange(T).float()
        alibi = (alibi_slopes(H)[:, None] * pos[None, :])[:, None, :]           # (H, 1, T), BLOOM's form
        self.register_buffer("alibi", alibi.repeat(B, 1, 1), persistent=False)  # (B*H, 1, T)
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        self.register_buffer("mask", torch.zeros(T, T).masked_fill(~keep, -1e4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).split(D, dim=-1)
        q = _heads(q, H).reshape(B * H, T, HD)
        k = _heads(k, H).reshape(B * H, T, HD)
        v = _heads(v, H).reshape(B * H, T, HD)
        s = self.alibi.baddbmm(batch1=q, batch2=k.transpose(1, 2), beta=1.0, alpha=HD ** -0.5) + self.mask
        o = torch.bmm(F.softmax(s, dim=-1), v).view(B, H, T, HD)
        return self.dense(_merge(o))


class QuickGELUMLP(nn.Module):
    """CLIP's QuickGELU MLP: ``x * sigmoid(1.702 x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(D, FF)
        self.fc2 = nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(h * torch.sigmoid(1.702 * h))


class FusedGateUp(nn.Module):
    """Phi-3's fused ``gate_up_proj`` chunked in two: ``down(silu(gate) * up)``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(D, 2 * FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


class NGPTNormalize(nn.Module):
    """nGPT's normalised residual: ``normalize(h + alpha * (normalize(f(h)) - h))`` with ``F.normalize``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, D, bias=False)
        self.alpha = nn.Parameter(torch.full((D,), 0.05))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        f = F.normalize(self.proj(h), dim=-1)
        return F.normalize(h + self.alpha * (f - h), dim=-1)


class EinsumAttention(_Proj):
    """Attention written with ``torch.einsum`` (``bhqd,bhkd->bhqk``) and a float additive causal mask."""

    def __init__(self) -> None:
        super().__init__()
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        self.register_buffer("mask", torch.zeros(T, T).masked_fill(~keep, float("-inf")), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * HD ** -0.5 + self.mask
        return self.o_proj(_merge(torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)))


class SigmoidRouter(nn.Module):
    """DeepSeek-V3's router: sigmoid scores plus a bias for the choice, top-k, weights renormalised and scaled."""

    def __init__(self, experts: int = 8, k: int = 2) -> None:
        super().__init__()
        self.gate = nn.Linear(D, experts, bias=False)
        self.register_buffer("bias", torch.linspace(-0.1, 0.1, experts), persistent=False)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.sigmoid(self.gate(x))
        _, idx = torch.topk(scores + self.bias, self.k, dim=-1)
        w = scores.gather(-1, idx)
        return 2.5 * w / w.sum(dim=-1, keepdim=True)


class NoAffineLayerNorm(nn.Module):
    """``F.layer_norm`` without weight or bias (as in OLMo-1's non-parametric norm), then a projection."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(D, FF, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.layer_norm(x, (D,)))


class MixedPrecisionResidual(nn.Module):
    """A float32 residual stream around a half-precision block: ``(x.float() + mlp(x.to(dtype)).float())``."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = SquaredReLUMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.mlp.up.weight
        return x.float() + self.mlp(x.to(w.dtype)).float()


# ---- the sixteenth session's held-out set: architectures in none of the sets above


class HFLlamaRotary(nn.Module):
    """HF's LlamaRotaryEmbedding (Llama 3, Qwen2, Mistral): ``cos``/``sin`` of ``inv_freq @ position_ids`` computed
    in float32 in every forward, then rotate_half on q and k."""

    def __init__(self) -> None:
        super().__init__()
        self.qk = nn.Linear(D, 2 * D, bias=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD)), persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        f = self.inv_freq[None, :, None].float().expand(pos.shape[0], -1, 1) @ pos[:, None, :].float()
        emb = torch.cat((f.transpose(1, 2), f.transpose(1, 2)), dim=-1)
        cos, sin = emb.cos().to(x.dtype).unsqueeze(2), emb.sin().to(x.dtype).unsqueeze(2)
        q, k = self.qk(x).view(B, T, 2, H, HD).unbind(2)

        def rot(t: torch.Tensor) -> torch.Tensor:
            return t * cos + torch.cat((-t[..., HD // 2:], t[..., :HD // 2]), dim=-1) * sin

        return torch.cat([rot(q), rot(k)], -1).flatten(2)


class BertEmbeddings(nn.Module):
    """BERT/RoBERTa: word + learned position + token-type embeddings, LayerNorm, and the additive mask made from
    the int64 ``attention_mask`` (``(1 - mask.to(dtype)) * finfo.min``) on one attention head."""

    def __init__(self) -> None:
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(V, D), nn.Embedding(T, D), nn.Embedding(2, D)
        self.ln = nn.LayerNorm(D, eps=1e-12)
        self.q = nn.Linear(D, D)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.word(ids) + self.token_type(types) + self.pos(torch.arange(ids.shape[1])[None]))
        ext = (1.0 - mask[:, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
        return (self.q(h) @ h.transpose(-1, -2) / math.sqrt(D) + ext).softmax(-1) @ h


class ViTBlock(nn.Module):
    """ViT (timm): a class token concatenated, a learned position embedding added, ``qkv.unbind(0)``, LayerScale."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, D) / 4)
        self.pos = nn.Parameter(torch.randn(1, T + 1, D) / 4)
        self.norm, self.qkv, self.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.ls = nn.Parameter(torch.full((D,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        n = x.shape[1]
        q, k, v = self.qkv(self.norm(x)).reshape(B, n, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, n, D)
        return x + self.ls * self.proj(a)


class RWKVChannelMix(nn.Module):
    """RWKV-4's channel mixing: the token shift ``F.pad(x, (0, 0, 1, -1))``, a squared-ReLU key, a sigmoid
    receptance gate."""

    def __init__(self) -> None:
        super().__init__()
        self.mk, self.mr = nn.Parameter(torch.rand(D)), nn.Parameter(torch.rand(D))
        self.key, self.rec = nn.Linear(D, FF, bias=False), nn.Linear(D, D, bias=False)
        self.val = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xx = F.pad(x, (0, 0, 1, -1))
        k = torch.square(torch.relu(self.key(x * self.mk + xx * (1 - self.mk))))
        return torch.sigmoid(self.rec(x * self.mr + xx * (1 - self.mr))) * self.val(k)


class DiTAdaLN(nn.Module):
    """DiT's adaLN-Zero: shift, scale and gate from ``SiLU(c) @ W``, a LayerNorm without affine modulated by them,
    and a gated residual MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ada = nn.Linear(D, 3 * D)
        self.norm = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.ada(F.silu(c)).chunk(3, dim=1)
        h = self.norm(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        return x + gate.unsqueeze(1) * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class SDGroupNormGEGLU(nn.Module):
    """Stable Diffusion's transformer in a UNet: GroupNorm over channels of ``(B, C, HW)``, proj_in, a GEGLU
    feed-forward, back to channels first with the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.gn = nn.GroupNorm(4, D, eps=1e-6)
        self.pin, self.ff, self.out = nn.Linear(D, D), nn.Linear(D, 2 * FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.ff(self.pin(self.gn(x).permute(0, 2, 1))).chunk(2, dim=-1)
        return self.out(a * F.gelu(g)).permute(0, 2, 1) + x


class LinearAttention(nn.Module):
    """Causal linear attention (Katharopoulos et al. 2020): ``elu(x) + 1`` features, running sums by ``cumsum``."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        kv = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=1)
        z = 1 / (torch.einsum("btd,btd->bt", q, torch.cumsum(k, 1)) + 1e-6)
        return torch.einsum("btd,btde->bte", q, kv) * z.unsqueeze(-1)


class SwinRelBias(nn.Module):
    """Swin: a relative position bias table indexed by a fixed index buffer (``table[index]``), added to window
    attention scores."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(2 * T - 1, H) / 4)
        self.qkv = nn.Linear(D, 3 * D)
        c = torch.arange(T)
        self.register_buffer("index", (c[:, None] - c[None, :] + T - 1).reshape(-1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(B, T, 3, H, HD).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index].view(T, T, H).permute(2, 0, 1)
        a = (q * HD ** -0.5 @ k.transpose(-2, -1) + bias.unsqueeze(0)).softmax(-1)
        return (a @ v).transpose(1, 2).reshape(B, T, D)


class MixtralSparseMoE(nn.Module):
    """Mixtral's sparse MoE block as HF writes it: softmax router, top-2, each expert run on its tokens
    (``torch.where`` of a one-hot mask), ``index_add_`` back. Dynamo cannot compile it (a data-dependent shape
    inside the expert loop): the whole forward runs eagerly."""

    def __init__(self, experts: int = 4) -> None:
        super().__init__()
        self.experts = experts
        self.gate = nn.Linear(D, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(D, FF, bias=False) for _ in range(experts))
        self.w3 = nn.ModuleList(nn.Linear(D, FF, bias=False) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(FF, D, bias=False) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(-1, D)
        w, sel = torch.topk(F.softmax(self.gate(h), dim=1, dtype=torch.float), 2, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        mask = F.one_hot(sel, num_classes=self.experts).permute(2, 1, 0)
        for e in range(self.experts):
            idx, top = torch.where(mask[e])
            cur = h[top]
            y = self.w2[e](F.silu(self.w1[e](cur)) * self.w3[e](cur)) * w[top, idx, None]
            out.index_add_(0, top, y.to(h.dtype))
        return out.view(x.shape)


class Phi2NewGELU(nn.Module):
    """Phi-2 / GPT-2's ``NewGELUActivation`` written out (``torch.pow(h, 3.0)``, tanh) in a pre-norm MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(D), nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.ln(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.fc2(h)


class T5FFNDropout(nn.Module):
    """T5 v1.0's feed-forward layer: T5LayerNorm (RMS, no mean, variance in float32), a ReLU FFN, dropout (p = 0 here,
    so that the float64 copy draws the same: the op is still ``native_dropout``) and the residual."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(D) + torch.randn(D) / 8)
        self.wi, self.wo = nn.Linear(D, FF, bias=False), nn.Linear(FF, D, bias=False)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.w * (x * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + 1e-6))
        return x + self.drop(self.wo(self.drop(F.relu(self.wi(h)))))


# ---- the seventeenth session's held-out set: whole layers of open models, written as their code bases write them


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, one_plus: bool = False) -> torch.Tensor:
    """RMSNorm in float32, back to ``x``'s dtype, times ``w`` (``1 + w``: Gemma)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return h.type_as(x) * ((1.0 + w) if one_plus else w)


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)


def _rope_tables(pos: torch.Tensor, dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's rotary tables from int64 positions, computed in every forward: ``(B, 1, T, dim)`` cos and sin."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    f = (inv[None, :, None].expand(pos.shape[0], -1, 1) @ pos[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def _rope_buffers(m: nn.Module, dim: int) -> None:
    """Rotary ``cos`` / ``sin`` tables over ``dim`` channels for ``T`` positions, as buffers of ``m``."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    emb = torch.outer(torch.arange(T).float(), inv).repeat(1, 2)
    m.register_buffer("cos", emb.cos(), persistent=False)
    m.register_buffer("sin", emb.sin(), persistent=False)


def _repeat_kv(t: torch.Tensor, n: int) -> torch.Tensor:
    """HF's ``repeat_kv``: ``(B, kv, T, hd)`` expanded and reshaped to ``(B, kv * n, T, hd)``."""
    b, kv, s, hd = t.shape
    return t[:, :, None].expand(b, kv, n, s, hd).reshape(b, kv * n, s, hd)


class Qwen2Attention(nn.Module):
    """Qwen2: biased q/k/v projections, GQA by ``repeat_kv``, HF rotary from position ids, HF's eager attention
    (an additive causal mask of ``finfo.min``, softmax in float32)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, H * HD)
        self.k_proj = nn.Linear(D, HD)
        self.v_proj = nn.Linear(D, HD)
        self.o_proj = nn.Linear(H * HD, D, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, H, HD).transpose(1, 2)
        k = self.k_proj(x).view(b, t, 1, HD).transpose(1, 2)
        v = self.v_proj(x).view(b, t, 1, HD).transpose(1, 2)
        cos, sin = _rope_tables(pos, HD, x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = _repeat_kv(k, H), _repeat_kv(v, H)
        mask = torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        s = q @ k.transpose(2, 3) * HD ** -0.5 + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        return self.o_proj((p @ v).transpose(1, 2).reshape(b, t, -1))


class Qwen3QKNorm(nn.Module):
    """Qwen3: RMSNorm over each head's dim of q and k (after the head split, before rotary), GQA through SDPA."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj = nn.Linear(D, H * HD, bias=False), nn.Linear(D, HD, bias=False)
        self.v_proj, self.o_proj = nn.Linear(D, HD, bias=False), nn.Linear(H * HD, D, bias=False)
        self.q_norm, self.k_norm = nn.Parameter(1 + torch.randn(HD) / 8), nn.Parameter(1 + torch.randn(HD) / 8)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = _rms(self.q_proj(x).view(b, t, H, HD), self.q_norm).transpose(1, 2)
        k = _rms(self.k_proj(x).view(b, t, 1, HD), self.k_norm).transpose(1, 2)
        v = self.v_proj(x).view(b, t, 1, HD).transpose(1, 2)
        cos, sin = _rope_tables(pos, HD, x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, _repeat_kv(k, H), _repeat_kv(v, H), is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


class MistralSlidingLayer(nn.Module):
    """A Mistral decoder layer: RMSNorm, GQA attention with a sliding-window boolean mask built in the forward
    (``tril`` and ``triu``), SDPA, residual, RMSNorm, SwiGLU, residual."""

    def __init__(self, window: int = 2) -> None:
        super().__init__()
        self.window = window
        self.ln1, self.ln2 = nn.Parameter(1 + torch.randn(D) / 8), nn.Parameter(1 + torch.randn(D) / 8)
        self.attn = _Proj(kv=1)
        self.gate, self.up = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        keep = torch.ones(t, t, dtype=torch.bool).tril().triu(1 - self.window)
        q, k, v = self.attn.qkv(_rms(x, self.ln1))
        a = F.scaled_dot_product_attention(q, _repeat_kv(k, H), _repeat_kv(v, H), attn_mask=keep)
        h = x + self.attn.o_proj(_merge(a))
        m = _rms(h, self.ln2)
        return h + self.down(F.silu(self.gate(m)) * self.up(m))


class Gemma2Layer(nn.Module):
    """A Gemma-2 decoder layer: sandwich norms (``(1 + w)`` RMSNorm before and after attention and MLP),
    ``query_pre_attn_scalar`` scaling, attention soft-capping ``cap * tanh(s / cap)``, a ``finfo.min`` causal mask,
    a tanh-GELU GeGLU."""

    def __init__(self, cap: float = 50.0) -> None:
        super().__init__()
        self.cap = cap
        self.norms = nn.ParameterList(nn.Parameter(torch.randn(D) / 8) for _ in range(4))
        self.attn = _Proj()
        self.gate, self.up = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = self.attn.qkv(_rms(x, self.norms[0], one_plus=True))
        s = (q * 16 ** -0.5) @ k.transpose(2, 3)
        s = torch.tanh(s / self.cap) * self.cap
        s = s + torch.full((t, t), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        h = x + _rms(self.attn.o_proj(_merge(p @ v)), self.norms[1], one_plus=True)
        m = _rms(h, self.norms[2], one_plus=True)
        f = self.down(F.gelu(self.gate(m), approximate="tanh") * self.up(m))
        return h + _rms(f, self.norms[3], one_plus=True)


class Gemma2FinalSoftcapCE(nn.Module):
    """Gemma-2's LM head: the final norm, logits soft-capped ``30 tanh(z / 30)`` in float32, cross entropy with
    padding targets ignored (``ignore_index=-100``)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(torch.randn(D) / 8)
        self.lm_head = nn.Linear(D, V, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        z = self.lm_head(_rms(x, self.norm, one_plus=True)).float()
        z = torch.tanh(z / 30.0) * 30.0
        return F.cross_entropy(z.view(-1, V), targets.view(-1), ignore_index=-100)


class Phi3Layer(nn.Module):
    """A Phi-3 decoder layer: fused ``qkv_proj`` sliced by position, rotary, causal SDPA, fused ``gate_up_proj``
    chunked, RMSNorms and residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.Parameter(1 + torch.randn(D) / 8), nn.Parameter(1 + torch.randn(D) / 8)
        self.qkv_proj = nn.Linear(D, (H + 2) * HD, bias=False)
        self.o_proj = nn.Linear(H * HD, D, bias=False)
        self.gate_up_proj = nn.Linear(D, 2 * FF, bias=False)
        self.down_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv_proj(_rms(x, self.ln1))
        q = qkv[..., : H * HD].view(b, t, H, HD).transpose(1, 2)
        k = qkv[..., H * HD: (H + 1) * HD].view(b, t, 1, HD).transpose(1, 2)
        v = qkv[..., (H + 1) * HD:].view(b, t, 1, HD).transpose(1, 2)
        cos, sin = _rope_tables(pos, HD, x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        o = F.scaled_dot_product_attention(q, _repeat_kv(k, H), _repeat_kv(v, H), is_causal=True)
        h = x + self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.gate_up_proj(_rms(h, self.ln2)).chunk(2, dim=-1)
        return h + self.down_proj(up * F.silu(gate))


class NeoXLayer(nn.Module):
    """A GPT-NeoX layer: parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``, the fused ``query_key_value``
    laid out per head (``view(b, t, H, 3 * hd)``), rotary on the first quarter of each head, exact-GELU MLP."""

    def __init__(self, rot: int = HD // 4) -> None:
        super().__init__()
        self.rot = rot
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.query_key_value, self.dense = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc_in, self.fc_out = nn.Linear(D, FF), nn.Linear(FF, D)
        _rope_buffers(self, rot)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.query_key_value(self.ln1(x)).view(b, t, H, 3 * HD).permute(0, 2, 1, 3)
        q, k, v = qkv[..., :HD], qkv[..., HD: 2 * HD], qkv[..., 2 * HD:]

        def rope(u: torch.Tensor) -> torch.Tensor:
            r, p = u[..., : self.rot], u[..., self.rot:]
            return torch.cat((r * self.cos + _rotate_half(r) * self.sin, p), dim=-1)

        o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        a = self.dense(o.permute(0, 2, 1, 3).reshape(b, t, D))
        return x + a + self.fc_out(F.gelu(self.fc_in(self.ln2(x))))


class OLMoLayer(nn.Module):
    """An OLMo-1 block: non-parametric LayerNorm (``F.layer_norm`` without weight or bias), the fused ``att_proj``
    with ``clip_qkv`` (q, k, v clamped to +-8), causal SDPA, SwiGLU written ``x, gate = chunk(2); silu(gate) * x``."""

    def __init__(self, clip: float = 8.0) -> None:
        super().__init__()
        self.clip = clip
        self.att_proj, self.attn_out = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.ff_proj, self.ff_out = nn.Linear(D, 2 * FF, bias=False), nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.att_proj(F.layer_norm(x, (D,), None, None, eps=1e-5)).clamp(min=-self.clip, max=self.clip)
        q, k, v = (_heads(u, H) for u in qkv.split(D, dim=-1))
        h = x + self.attn_out(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        u, gate = self.ff_proj(F.layer_norm(h, (D,), None, None, eps=1e-5)).chunk(2, dim=-1)
        return h + self.ff_out(F.silu(gate) * u)


class FalconMQALayer(nn.Module):
    """A Falcon-7B layer: one LayerNorm feeding attention and MLP in parallel, the fused multi-query
    ``query_key_value`` (H query heads, one k, one v), k and v broadcast over the heads, rotary, GELU MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.query_key_value = nn.Linear(D, (H + 2) * HD, bias=False)
        self.dense = nn.Linear(H * HD, D, bias=False)
        self.up, self.down = nn.Linear(D, 4 * D, bias=False), nn.Linear(4 * D, D, bias=False)
        _rope_buffers(self, HD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln(x)
        fused = self.query_key_value(h).view(b, t, H + 2, HD)
        q, k, v = fused[:, :, :-2].transpose(1, 2), fused[:, :, [-2]].transpose(1, 2), fused[:, :, [-1]]
        q, k = q * self.cos + _rotate_half(q) * self.sin, k * self.cos + _rotate_half(k) * self.sin
        o = F.scaled_dot_product_attention(q, k.expand(b, H, t, HD), v.transpose(1, 2).expand(b, H, t, HD),
                                           is_causal=True)
        return x + self.dense(o.transpose(1, 2).reshape(b, t, -1)) + self.down(F.gelu(self.up(h)))


class CLIPTextLayer(nn.Module):
    """A CLIP text-encoder layer: LayerNorm, q scaled before the product, a causal mask of ``-inf`` made in the
    forward (``torch.full(-inf).triu(1)``) added to the scores, softmax, out_proj, residual; LayerNorm and a
    QuickGELU MLP, residual."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.out_proj, self.fc1, self.fc2 = nn.Linear(D, D), nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        h = self.ln1(x)
        q, k, v = _heads(self.q_proj(h) * HD ** -0.5, H), _heads(self.k_proj(h), H), _heads(self.v_proj(h), H)
        causal = torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
        p = torch.softmax(q @ k.transpose(-1, -2) + causal, dim=-1)
        x = x + self.out_proj(_merge(p @ v))
        u = self.fc1(self.ln2(x))
        return x + self.fc2(u * torch.sigmoid(1.702 * u))


class WhisperEncoderStem(nn.Module):
    """Whisper's encoder: two Conv1d (the second of stride 2) with GELU over mel frames ``(B, mels, frames)``,
    channels last, a sinusoidal position table added, then a pre-norm encoder layer (k_proj without bias, q
    scaled, no mask), GELU MLP."""

    def __init__(self, mels: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, D, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(D, D, kernel_size=3, stride=2, padding=1)
        t = torch.arange(T)[:, None].float() / (10000 ** (torch.arange(0, D, 2).float() / D))
        self.register_buffer("pos", torch.cat([t.sin(), t.cos()], dim=1), persistent=False)
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q_proj, self.k_proj = nn.Linear(D, D), nn.Linear(D, D, bias=False)
        self.v_proj, self.out_proj = nn.Linear(D, D), nn.Linear(D, D)
        self.fc1, self.fc2 = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).permute(0, 2, 1) + self.pos
        h = self.ln1(x)
        q, k, v = _heads(self.q_proj(h) * HD ** -0.5, H), _heads(self.k_proj(h), H), _heads(self.v_proj(h), H)
        x = x + self.out_proj(_merge(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


# --------------------------------------------------------------------------- the fourth set (nineteenth session)


class MambaGatedConv(nn.Module):
    """Mamba's block around its scan: RMSNorm, ``in_proj`` to ``(x, z)``, a causal depthwise Conv1d over time
    (``padding = k - 1``, the first ``T`` outputs kept), SiLU, the gate ``x * silu(z)``, ``out_proj`` and the
    residual (the selective scan is a recurrence, as ``cumsum``: left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.Parameter(1 + torch.randn(D) / 8)
        self.in_proj = nn.Linear(D, 2 * FF, bias=False)
        self.conv1d = nn.Conv1d(FF, FF, kernel_size=4, groups=FF, padding=3)
        self.out_proj = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, z = self.in_proj(_rms(x, self.norm)).chunk(2, dim=-1)
        h = F.silu(self.conv1d(h.transpose(1, 2))[..., :x.shape[1]]).transpose(1, 2)
        return x + self.out_proj(h * F.silu(z))


class SDResBlock(nn.Module):
    """Stable Diffusion's UNet ResBlock (diffusers' ``ResnetBlock2D``): GroupNorm, SiLU, a 3x3 conv, the time
    embedding (SiLU, Linear) added per channel, GroupNorm, SiLU, a 3x3 conv, and a 1x1 conv on the skip (the
    channels change)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(4, 8, eps=1e-5), nn.GroupNorm(4, 16, eps=1e-5)
        self.conv1, self.conv2 = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.time_emb_proj = nn.Linear(D, 16)
        self.conv_shortcut = nn.Conv2d(8, 16, 1)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.conv_shortcut(x) + h


SWIN_R, SWIN_W, SWIN_S = 4, 2, 1  # tokens per side, window, shift


class SwinShiftedWindow(nn.Module):
    """Swin's shifted-window attention block: LayerNorm, ``torch.roll`` by ``-shift``, window partition (view,
    permute), attention in each window with the relative position bias its table gives through a fixed index and
    the shifted windows' -100 mask, window reverse, roll back, residual."""

    def __init__(self) -> None:
        super().__init__()
        r, w, s = SWIN_R, SWIN_W, SWIN_S
        self.norm = nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.table = nn.Parameter(torch.randn((2 * w - 1) ** 2, H) / 4)
        c = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (c[:, :, None] - c[:, None, :]).permute(1, 2, 0) + (w - 1)
        self.register_buffer("index", (rel[..., 0] * (2 * w - 1) + rel[..., 1]).reshape(-1), persistent=False)
        img = torch.zeros(1, r, r, 1)
        cnt = 0
        for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                img[:, hs, ws, :] = cnt
                cnt += 1
        mw = img.view(1, r // w, w, r // w, w, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w)
        diff = mw[:, None, :] - mw[:, :, None]
        self.register_buffer("mask", diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r, w, s = SWIN_R, SWIN_W, SWIN_S
        b, n, c = x.shape[0], w * w, D
        h = torch.roll(self.norm(x).view(b, r, r, c), shifts=(-s, -s), dims=(1, 2))
        win = h.view(b, r // w, w, r // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, n, c)
        q, k, v = self.qkv(win).reshape(-1, n, 3, H, HD).permute(2, 0, 3, 1, 4).unbind(0)
        a = (q * HD ** -0.5) @ k.transpose(-2, -1)
        a = a + self.table[self.index].view(n, n, H).permute(2, 0, 1)[None]
        nw = (r // w) ** 2
        a = (a.view(b, nw, H, n, n) + self.mask[None, :, None]).view(-1, H, n, n).softmax(-1)
        o = self.proj((a @ v).transpose(1, 2).reshape(-1, n, c))
        o = o.view(b, r // w, r // w, w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(b, r, r, c)
        return x + torch.roll(o, shifts=(s, s), dims=(1, 2)).reshape(b, r * r, c)


class BertLayerGeluTanh(nn.Module):
    """A BERT encoder layer from its embeddings: word + learned position + token-type embeddings, LayerNorm,
    self-attention with the additive mask from the int64 ``attention_mask``, output projection + LayerNorm
    residual, a GELU(tanh) intermediate and its LayerNorm residual (post-norm)."""

    def __init__(self) -> None:
        super().__init__()
        self.word, self.pos, self.token_type = nn.Embedding(V, D), nn.Embedding(T, D), nn.Embedding(2, D)
        self.ln_emb, self.ln_attn, self.ln_out = (nn.LayerNorm(D, eps=1e-12) for _ in range(3))
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.inter, self.out = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1])[None]
        x = self.ln_emb(self.word(ids) + self.token_type(types) + self.pos(pos))
        ext = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        q, k, v = _heads(self.q(x), H), _heads(self.k(x), H), _heads(self.v(x), H)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HD) + ext, dim=-1)
        x = self.ln_attn(x + self.o(_merge(a @ v)))
        return self.ln_out(x + self.out(F.gelu(self.inter(x), approximate="tanh")))


class Qwen2MoEBlock(nn.Module):
    """Qwen2-MoE's sparse block evaluated densely: a float32 softmax router, top-2 of 4 experts (weights not
    renormalised), the weights scattered back into a dense ``(tokens, experts)`` gate, every SwiGLU expert run on
    every token (stacked weights, ``einsum``), plus the shared expert gated by ``sigmoid(x @ w)``. ``topk`` and
    ``scatter`` index by data: they run in ATen, the rest in the kernels."""

    E = 4

    def __init__(self) -> None:
        super().__init__()
        e, f = self.E, FF // 2
        self.gate = nn.Linear(D, e, bias=False)
        self.w_gate, self.w_up = nn.Parameter(torch.randn(e, D, f) / 4), nn.Parameter(torch.randn(e, D, f) / 4)
        self.w_down = nn.Parameter(torch.randn(e, f, D) / 4)
        self.shared_gate_up, self.shared_down = nn.Linear(D, 2 * FF, bias=False), nn.Linear(FF, D, bias=False)
        self.shared_expert_gate = nn.Linear(D, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = x.reshape(-1, d)
        probs = F.softmax(self.gate(h), dim=1, dtype=torch.float)
        top_w, top_i = torch.topk(probs, 2, dim=-1)
        dense = torch.zeros_like(probs).scatter(1, top_i, top_w).to(h.dtype)
        up = F.silu(torch.einsum("td,edf->tef", h, self.w_gate)) * torch.einsum("td,edf->tef", h, self.w_up)
        moe = torch.einsum("tef,efd,te->td", up, self.w_down, dense)
        g, u = self.shared_gate_up(h).chunk(2, dim=-1)
        shared = torch.sigmoid(self.shared_expert_gate(h)) * self.shared_down(F.silu(g) * u)
        return (moe + shared).reshape(b, t, d)


def _t5_buckets(t: int, num_buckets: int = 8, max_distance: int = 16) -> torch.Tensor:
    """T5's bidirectional relative position buckets of a ``t x t`` attention (integer arithmetic, made in the
    forward)."""
    ctx = torch.arange(t, dtype=torch.long)[:, None]
    mem = torch.arange(t, dtype=torch.long)[None, :]
    rel = mem - ctx
    nb = num_buckets // 2
    buckets = (rel > 0).to(torch.long) * nb
    rel = torch.abs(rel)
    exact = nb // 2
    large = exact + (torch.log(rel.float() / exact) / math.log(max_distance / exact) * (nb - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, nb - 1))
    return buckets + torch.where(rel < exact, rel, large)


class T5Block(nn.Module):
    """A T5 v1.1 encoder block: T5's RMSNorm (no mean, no bias, variance in float32), attention without the
    ``1/sqrt(d)`` scale plus the relative position bias (buckets made in the forward, looked up in a learned
    table), a gated-GELU(tanh) feed-forward, pre-norm residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.Parameter(1 + torch.randn(D) / 8), nn.Parameter(1 + torch.randn(D) / 8)
        self.q, self.k, self.v, self.o = (nn.Linear(D, H * HD, bias=False) for _ in range(4))
        self.rel_bias = nn.Embedding(8, H)
        self.wi_0, self.wi_1 = nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False)
        self.wo = nn.Linear(FF, D, bias=False)

    @staticmethod
    def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + 1e-6)).to(w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._norm(x, self.ln1)
        q, k, v = _heads(self.q(h), H), _heads(self.k(h), H), _heads(self.v(h), H)
        bias = self.rel_bias(_t5_buckets(x.shape[1])).permute(2, 0, 1)[None]
        a = torch.softmax((q @ k.transpose(-1, -2) + bias).float(), dim=-1).type_as(q)
        x = x + self.o(_merge(a @ v))
        h = self._norm(x, self.ln2)
        return x + self.wo(F.gelu(self.wi_0(h), approximate="tanh") * self.wi_1(h))


def _rotate_interleaved(t: torch.Tensor) -> torch.Tensor:
    return torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).flatten(-2)


class CohereLayer(nn.Module):
    """A Cohere (Command-R) decoder layer: one LayerNorm without bias (mean-centred, weight only) feeding attention
    and the MLP in parallel (``x + attn + mlp``), per-head QK LayerNorm (weights per head), interleaved rotary from
    int64 positions (``repeat_interleave`` of the frequencies), causal SDPA, SwiGLU."""

    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.Parameter(1 + torch.randn(D) / 8)
        self.q_norm, self.k_norm = nn.Parameter(1 + torch.randn(H, HD) / 8), nn.Parameter(1 + torch.randn(H, HD) / 8)
        self.q, self.k, self.v, self.o = (nn.Linear(D, H * HD, bias=False) for _ in range(4))
        self.gate, self.up, self.down = (nn.Linear(D, FF, bias=False), nn.Linear(D, FF, bias=False),
                                         nn.Linear(FF, D, bias=False))

    @staticmethod
    def _ln(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = (h - h.mean(-1, keepdim=True)) * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) - h.mean(-1, keepdim=True)
                                                          ** 2 + 1e-5)
        return (w.to(torch.float32) * h).to(x.dtype)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self._ln(x, self.ln)
        q = self._ln(self.q(h).view(b, t, H, HD), self.q_norm).transpose(1, 2)
        k = self._ln(self.k(h).view(b, t, H, HD), self.k_norm).transpose(1, 2)
        v = _heads(self.v(h), H)
        inv = 1.0 / (10000 ** (torch.arange(0, HD, 2, dtype=torch.int64).float() / HD))
        f = pos[:, :, None].float() * inv[None, None, :]
        emb = torch.repeat_interleave(f, 2, dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        q, k = q * cos + _rotate_interleaved(q) * sin, k * cos + _rotate_interleaved(k) * sin
        attn = self.o(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        return x + attn + self.down(F.silu(self.gate(h)) * self.up(h))


class MPTAlibiBlock(nn.Module):
    """An MPT block: LayerNorm without bias, fused ``Wqkv`` split, ALiBi made in the forward (``arange(1 - T, 1)``
    times the heads' slopes ``2^(-8 h / H)``), a causal mask from ``ones().tril()`` filled with ``finfo.min``,
    softmax, out projection; GELU MLP; pre-norm residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(D, bias=False), nn.LayerNorm(D, bias=False)
        self.Wqkv, self.out_proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.up_proj, self.down_proj = nn.Linear(D, FF, bias=False), nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = self.Wqkv(self.norm_1(x)).chunk(3, dim=2)
        q, k, v = _heads(q, H), _heads(k, H), _heads(v, H)
        slopes = 1.0 / torch.pow(2, torch.arange(1, H + 1, dtype=torch.float32) * (8 / H))
        alibi = torch.arange(1 - t, 1, dtype=torch.float32).view(1, 1, 1, t) * slopes.view(1, H, 1, 1)
        s = q @ k.transpose(-1, -2) * HD ** -0.5 + alibi
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        s = s.masked_fill(~causal, torch.finfo(s.dtype).min)
        x = x + self.out_proj(_merge(torch.softmax(s, dim=-1) @ v))
        return x + self.down_proj(F.gelu(self.up_proj(self.norm_2(x))))


class MelGANResBlock(nn.Module):
    """MelGAN's residual block: LeakyReLU(0.2), ``ReflectionPad1d(dilation)``, a weight-normed dilated Conv1d,
    LeakyReLU, a weight-normed 1x1 Conv1d, and a weight-normed 1x1 shortcut (``g v / |v|`` in the forward)."""

    def __init__(self) -> None:
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.pad = nn.ReflectionPad1d(3)
        self.c1, self.c2 = wn(nn.Conv1d(8, 8, 3, dilation=3)), wn(nn.Conv1d(8, 8, 1))
        self.shortcut = wn(nn.Conv1d(8, 8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c2(F.leaky_relu(self.c1(self.pad(F.leaky_relu(x, 0.2))), 0.2))
        return self.shortcut(x) + h


@dataclass(frozen=True)
class ModuleCase:
    """One torch program: a builder and its inputs."""

    name: str
    arch: str
    make: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], list[torch.Tensor]]
    train: bool = True
    #: the session that added it (15: the first held-out set; 16: the second; 17: the third; 19: the fourth)
    since: int = 15
    #: whether Dynamo hands the backend a graph at all (False: a graph break it runs eagerly, e.g. in a loop)
    captured: bool = True


def _x(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen)]


def _ids(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randint(0, V, (B, T), generator=gen)]


def _decode(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, D, generator=gen), torch.randn(B, 1, T, HD, generator=gen),
            torch.randn(B, 1, T, HD, generator=gen)]


def _x_targets(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen), torch.randint(0, V, (B, T), generator=gen)]


def _x_bias(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen), torch.randn(1, H, T, T, generator=gen)]


def _x_rows(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B * T, D, generator=gen)]


def _x_pos(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen), (torch.arange(T) + 2).expand(B, T).contiguous()]


def _bert(gen: torch.Generator) -> list[torch.Tensor]:
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, -1] = 0
    return [torch.randint(0, V, (B, T), generator=gen), torch.randint(0, 2, (B, T), generator=gen), mask]


def _x_cond(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen), torch.randn(B, D, generator=gen)]


def _channels_first(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, D, T, generator=gen)]


def _x_pos0(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, T, D, generator=gen), torch.arange(T).expand(B, T).contiguous()]


def _x_padded_targets(gen: torch.Generator) -> list[torch.Tensor]:
    t = torch.randint(0, V, (B, T), generator=gen)
    t[0, -1] = -100
    return [torch.randn(B, T, D, generator=gen), t]


def _mel(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, 8, 2 * T, generator=gen)]


def _image_temb(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, 8, 4, 4, generator=gen), torch.randn(B, D, generator=gen)]


def _tokens(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(B, SWIN_R * SWIN_R, D, generator=gen)]


MODULES: dict[str, ModuleCase] = {c.name: c for c in [
    ModuleCase("gemma_rmsnorm_linear", "Gemma", GemmaNormLinear, _x),
    ModuleCase("gemma_embed_scale", "Gemma", GemmaEmbed, _ids),
    ModuleCase("gemma_geglu", "Gemma", GemmaMLP, _x),
    ModuleCase("gemma2_attn_softcap", "Gemma 2", SoftcapAttention, _x),
    ModuleCase("gemma_tied_head_softcap", "Gemma 2", TiedHeadSoftcap, _x),
    ModuleCase("squared_relu_mlp", "Primer/Nemotron", SquaredReLUMLP, _x),
    ModuleCase("scaled_residual", "MiniCPM", ScaledResidualMLP, _x),
    ModuleCase("layernorm_no_bias", "OLMo/Cohere", LayerNormNoBias, _x),
    ModuleCase("alibi_attention", "BLOOM/MPT", AlibiAttention, _x),
    ModuleCase("sliding_window_sdpa", "Mistral", SlidingWindowAttention, _x),
    ModuleCase("sliding_window_additive", "Mistral", SlidingWindowAdditive, _x),
    ModuleCase("partial_rotary", "Phi/GPT-NeoX", PartialRotaryAttention, _x),
    ModuleCase("mqa_kv_cache", "Falcon/PaLM", MQADecode, _decode),
    ModuleCase("mla_lowrank", "DeepSeek-V2", MLAProjections, _x),
    ModuleCase("moe_router_topk", "Mixtral", MoERouter, _x),
    ModuleCase("moe_dense_gate", "soft MoE", MoEDenseGate, _x_rows),
    ModuleCase("t5_rel_bias", "T5", T5RelBiasAttention, _x),
    ModuleCase("t5_bias_given", "T5", T5BiasGiven, _x_bias),
    ModuleCase("parallel_block", "GPT-J/Falcon", ParallelBlock, _x),
    ModuleCase("gated_attention_output", "Qwen3-Next", GatedAttentionOutput, _x),
    ModuleCase("olmo2_qk_norm", "OLMo 2", OlmoQKNorm, _x),
    ModuleCase("z_loss", "PaLM", ZLossHead, _x),
    ModuleCase("label_smoothed_ce", "generic LM", LabelSmoothedCE, _x_targets),
    ModuleCase("interleaved_rotary", "GPT-J", InterleavedRotary, _x),
    ModuleCase("complex_rotary", "LLaMA-1", ComplexRotary, _x),
    ModuleCase("sdpa_enable_gqa", "torch >= 2.5 GQA", SDPAEnableGQA, _x),
    ModuleCase("bloom_baddbmm", "BLOOM", BloomBaddbmm, _x),
    ModuleCase("quick_gelu_mlp", "CLIP", QuickGELUMLP, _x),
    ModuleCase("fused_gate_up", "Phi-3", FusedGateUp, _x),
    ModuleCase("ngpt_normalize", "nGPT", NGPTNormalize, _x),
    ModuleCase("einsum_attention", "generic", EinsumAttention, _x),
    ModuleCase("sigmoid_router", "DeepSeek-V3", SigmoidRouter, _x),
    ModuleCase("layernorm_no_affine", "OLMo-1", NoAffineLayerNorm, _x),
    ModuleCase("mixed_precision_residual", "generic", MixedPrecisionResidual, _x),
    ModuleCase("hf_llama_rotary", "Llama 3/Qwen2 (HF)", HFLlamaRotary, _x_pos, since=16),
    ModuleCase("bert_embeddings", "BERT/RoBERTa", BertEmbeddings, _bert, since=16),
    ModuleCase("vit_block", "ViT (timm)", ViTBlock, _x, since=16),
    ModuleCase("rwkv_channel_mix", "RWKV-4", RWKVChannelMix, _x, since=16),
    ModuleCase("dit_adaln", "DiT", DiTAdaLN, _x_cond, since=16),
    ModuleCase("sd_groupnorm_geglu", "Stable Diffusion UNet", SDGroupNormGEGLU, _channels_first, since=16),
    ModuleCase("linear_attention", "linear transformer", LinearAttention, _x, since=16),
    ModuleCase("swin_rel_bias", "Swin", SwinRelBias, _x, since=16),
    ModuleCase("mixtral_sparse_moe", "Mixtral (HF)", MixtralSparseMoE, _x, since=16, captured=False),
    ModuleCase("phi2_newgelu", "Phi-2/GPT-2", Phi2NewGELU, _x, since=16),
    ModuleCase("t5_ffn_dropout", "T5 v1.0", T5FFNDropout, _x, since=16),
    ModuleCase("qwen2_attention", "Qwen2", Qwen2Attention, _x_pos0, since=17),
    ModuleCase("qwen3_qk_norm", "Qwen3", Qwen3QKNorm, _x_pos0, since=17),
    ModuleCase("mistral_sliding_layer", "Mistral", MistralSlidingLayer, _x, since=17),
    ModuleCase("gemma2_layer", "Gemma 2", Gemma2Layer, _x, since=17),
    ModuleCase("gemma2_softcap_ce", "Gemma 2", Gemma2FinalSoftcapCE, _x_padded_targets, since=17),
    ModuleCase("phi3_layer", "Phi-3", Phi3Layer, _x_pos0, since=17),
    ModuleCase("neox_layer", "GPT-NeoX/Pythia", NeoXLayer, _x, since=17),
    ModuleCase("olmo_layer", "OLMo-1", OLMoLayer, _x, since=17),
    ModuleCase("falcon_mqa_layer", "Falcon-7B", FalconMQALayer, _x, since=17),
    ModuleCase("clip_text_layer", "CLIP text encoder", CLIPTextLayer, _x, since=17),
    ModuleCase("whisper_encoder_stem", "Whisper", WhisperEncoderStem, _mel, since=17),
    ModuleCase("mamba_gated_conv", "Mamba", MambaGatedConv, _x, since=19),
    ModuleCase("sd_resblock", "Stable Diffusion UNet", SDResBlock, _image_temb, since=19),
    ModuleCase("swin_shifted_window", "Swin", SwinShiftedWindow, _tokens, since=19),
    ModuleCase("bert_layer_gelu_tanh", "BERT", BertLayerGeluTanh, _bert, since=19),
    ModuleCase("qwen2_moe_block", "Qwen2-MoE", Qwen2MoEBlock, _x, since=19),
    ModuleCase("t5_block", "T5 v1.1", T5Block, _x, since=19),
    ModuleCase("cohere_layer", "Cohere Command-R", CohereLayer, _x_pos0, since=19),
    ModuleCase("mpt_alibi_block", "MPT", MPTAlibiBlock, _x, since=19),
    ModuleCase("melgan_resblock", "MelGAN", MelGANResBlock, _mel, since=19),
]}


def build(name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, list[torch.Tensor]]:
    """Module ``name`` and its inputs in ``dtype`` (integer inputs keep theirs)."""
    torch.manual_seed(seed)
    case = MODULES[name]
    xs = case.inputs(torch.Generator().manual_seed(seed + 1))
    return case.make().to(dtype), [x.to(dtype) if x.is_floating_point() else x for x in xs]


# --------------------------------------------------------------------------- vm.Graph programs


def g_gemma_rmsnorm_linear() -> vm.Graph:
    """Gemma RMSNorm with ``(1 + w)`` then a projection, fp16."""
    g = vm.Graph()
    x = g.input("x", (8, 32), vm.float16)
    w = g.input("w", (1, 32), vm.float16)
    m = g.input("m", (32, 16), vm.float16)
    g.output(g.matmul(g.mul(g.rms_norm(x), g.shift(w, 1.0)), m))
    return g


def g_squared_relu_mlp() -> vm.Graph:
    """``relu(x @ w1) ** 2 @ w2``."""
    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float16)
    w1 = g.input("w1", (16, 32), vm.float16)
    w2 = g.input("w2", (32, 16), vm.float16)
    g.output(g.matmul(g.square(g.relu(g.matmul(x, w1))), w2))
    return g


def g_geglu_tanh() -> vm.Graph:
    """Gemma's gate: ``gelu_tanh(x @ wg) * (x @ wu)``."""
    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float16)
    wg = g.input("wg", (16, 32), vm.float16)
    wu = g.input("wu", (16, 32), vm.float16)
    g.output(g.mul(g.gelu(g.matmul(x, wg)), g.matmul(x, wu)))
    return g


def g_logit_softcap() -> vm.Graph:
    """LM head with soft-capping ``30 * tanh(x @ w / 30)``."""
    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float16)
    w = g.input("w", (16, 64), vm.float16)
    g.output(g.scale(g.tanh(g.scale(g.matmul(x, w), 1 / 30)), 30.0))
    return g


def g_scaled_residual() -> vm.Graph:
    """``x + 0.5 * silu(x @ w1) @ w2``."""
    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float16)
    w1 = g.input("w1", (16, 32), vm.float16)
    w2 = g.input("w2", (32, 16), vm.float16)
    g.output(g.add(x, g.scale(g.matmul(g.silu(g.matmul(x, w1)), w2), 0.5)))
    return g


def g_layernorm_no_bias() -> vm.Graph:
    """LayerNorm without bias: ``(x - mean) * rsqrt(var + eps) * w``."""
    g = vm.Graph()
    x = g.input("x", (8, 32), vm.float16)
    w = g.input("w", (1, 32), vm.float16)
    c = g.sub(x, g.mean(x, 1))
    var = g.mean(g.square(c), 1)
    g.output(g.mul(g.mul(c, g.rsqrt(g.shift(var, 1e-5))), w))
    return g


def g_alibi_attention() -> vm.Graph:
    """One head-batch of attention with an additive (ALiBi) bias input, softmax, @ V."""
    g = vm.Graph()
    q = g.input("q", (2, 8, 16), vm.float16)
    k = g.input("k", (2, 16, 8), vm.float16)
    v = g.input("v", (2, 8, 16), vm.float16)
    bias = g.input("bias", (2, 8, 8), vm.float16)
    s = g.add(g.scale(g.matmul(q, k), 0.25), bias)
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, 2)), v))
    return g


def g_z_loss() -> vm.Graph:
    """``logsumexp(x @ w) ** 2`` per row, stable form (row max subtracted)."""
    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float32)
    w = g.input("w", (16, 64), vm.float32)
    lg = g.matmul(x, w)
    m = g.max(lg, 1)
    lse = g.add(g.log(g.sum(g.exp(g.sub(lg, m)), 1)), m)
    g.output(g.square(lse))
    return g


def g_moe_router() -> vm.Graph:
    """Router softmax over 8 experts (the top-k has no registry op)."""
    g = vm.Graph()
    x = g.input("x", (16, 32), vm.float16)
    w = g.input("w", (32, 8), vm.float16)
    lg = g.matmul(x, w)
    e = g.exp(g.sub(lg, g.max(lg, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    return g


def g_partial_rotary() -> vm.Graph:
    """Rotate the first half of each row (``r * cos + rotate_half(r) * sin``), pass the rest through."""
    g = vm.Graph()
    q = g.input("q", (8, 16), vm.float16)
    cos = g.input("cos", (8, 8), vm.float16)
    sin = g.input("sin", (8, 8), vm.float16)
    r, p = g.slice(q, 1, 0, 8), g.slice(q, 1, 8, 16)
    rh = g.concat([g.neg(g.slice(r, 1, 4, 8)), g.slice(r, 1, 0, 4)], 1)
    g.output(g.concat([g.add(g.mul(r, cos), g.mul(rh, sin)), p], 1))
    return g


def g_gated_attention_output() -> vm.Graph:
    """``(attn @ wo-input) * sigmoid(x @ wg)``: the gate on the attention output."""
    g = vm.Graph()
    o = g.input("o", (8, 16), vm.float16)
    x = g.input("x", (8, 16), vm.float16)
    wg = g.input("wg", (16, 16), vm.float16)
    wo = g.input("wo", (16, 16), vm.float16)
    g.output(g.matmul(g.mul(o, g.sigmoid(g.matmul(x, wg))), wo))
    return g


def g_mla_down_up() -> vm.Graph:
    """MLA's low-rank path: ``rms_norm(x @ wa) * w @ wb``."""
    g = vm.Graph()
    x = g.input("x", (8, 32), vm.float16)
    wa = g.input("wa", (32, 8), vm.float16)
    nw = g.input("nw", (8,), vm.float16)
    wb = g.input("wb", (8, 32), vm.float16)
    g.output(g.matmul(g.rms_norm(g.matmul(x, wa), nw), wb))
    return g


def g_mqa_decode() -> vm.Graph:
    """MQA decoding: 4 query heads against one shared K/V (broadcast over the head batch)."""
    g = vm.Graph()
    q = g.input("q", (4, 1, 16), vm.float16)
    k = g.input("k", (1, 16, 32), vm.float16)
    v = g.input("v", (1, 32, 16), vm.float16)
    e = g.exp(g.scale(g.matmul(q, k), 0.25))
    g.output(g.matmul(g.div(e, g.sum(e, 2)), v))
    return g


def g_label_smoothed_ce_rows() -> vm.Graph:
    """Label-smoothing term per row: ``-(1/V) * sum(log_softmax(x))``, stable."""
    g = vm.Graph()
    x = g.input("x", (8, 64), vm.float32)
    m = g.max(x, 1)
    lse = g.add(g.log(g.sum(g.exp(g.sub(x, m)), 1)), m)
    g.output(g.scale(g.sum(g.sub(x, lse), 1), -1 / 64))
    return g


GRAPHS: dict[str, Callable[[], vm.Graph]] = {
    "gemma_rmsnorm_linear": g_gemma_rmsnorm_linear,
    "squared_relu_mlp": g_squared_relu_mlp,
    "geglu_tanh": g_geglu_tanh,
    "logit_softcap": g_logit_softcap,
    "scaled_residual": g_scaled_residual,
    "layernorm_no_bias": g_layernorm_no_bias,
    "alibi_attention": g_alibi_attention,
    "z_loss": g_z_loss,
    "moe_router_softmax": g_moe_router,
    "partial_rotary": g_partial_rotary,
    "gated_attention_output": g_gated_attention_output,
    "mla_down_up": g_mla_down_up,
    "mqa_decode": g_mqa_decode,
    "label_smoothed_ce_rows": g_label_smoothed_ce_rows,
}

#: per output dtype: relative tolerance of a kernel's output against the float64 reference
GRAPH_TOL = {"float16": 2e-2, "float32": 1e-4}


def graph_inputs(g: vm.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs (scaled so fp16 stays well inside its range)."""
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) / 2 for t in g.inputs}


def graph_error(g: vm.Graph, cand: Any, inputs: dict[str, np.ndarray]) -> float:
    """Largest error of the compiled candidate over the float64 reference's largest magnitude (or over 1)."""
    ref = vm.evaluate(g, inputs)
    fn = vm.compile(cand)
    dt = {vm.float16: torch.float16, vm.float32: torch.float32}
    xs = [torch.from_numpy(inputs[t.name]).to(dt[t.dtype]) for t in g.inputs]
    out = fn(*xs)
    outs = out if isinstance(out, (list, tuple)) else [out]
    err = 0.0
    for o, r in zip(outs, ref, strict=True):
        err = max(err, float(np.abs(o.double().numpy() - r).max()) / max(1.0, float(np.abs(r).max())))
    return err


def run_graph(name: str, budget: float) -> dict[str, Any]:
    """Superoptimize, compile and compare one graph program; a row of the table."""
    g = GRAPHS[name]()
    t0 = time.perf_counter()
    try:
        res = vm.superoptimize(g, time_budget_s=budget)
    except Exception as e:
        return {"name": name, "search_s": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"}
    secs = time.perf_counter() - t0
    best = res.best
    row: dict[str, Any] = {"name": name, "search_s": secs, "kernels": best.mugraph.num_kernels,
                           "proved": isinstance(best.verdict, vm.Proved), "candidates": len(res.candidates)}
    row["max_err"] = graph_error(g, best, graph_inputs(g))
    return row


# --------------------------------------------------------------------------- torch runs


def reference(model: nn.Module, xs: list[torch.Tensor], train: bool) -> tuple[torch.Tensor, list[Any]]:
    """The float64 copy's output and (``train``) gradients of parameters and float inputs."""
    return float64_reference(model, xs, train=train)


def compiled(model: nn.Module, xs: list[torch.Tensor], train: bool, opts: dict[str, Any],
             rep: Any) -> tuple[torch.Tensor, list[Any]]:
    """The backend's output and gradients, as :func:`reference`."""
    from verimirage.integrations.dynamo import backend

    torch._dynamo.reset()
    cm = torch.compile(model, backend=backend(report=rep, **opts))
    if not train:
        with torch.no_grad():
            return cm(*xs), []
    xs = [x.detach().requires_grad_() if x.is_floating_point() else x for x in xs]
    out = cm(*xs)
    (out.double() * loss_weights(out).double()).sum().backward()
    return out, [p.grad for p in model.parameters()] + [x.grad for x in xs if x.is_floating_point()]


def rel_err(got: Any, want: Any) -> float:
    """Largest difference over the reference's largest magnitude (or over 1)."""
    w = want.detach().double()
    return float((got.detach().double() - w).abs().max()) / max(1.0, float(w.abs().max()))


def run_module(name: str, *, train: bool, opts: dict[str, Any], dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Compile and compare one module; a row of the table (``eager_err``: eager PyTorch's own error in ``dtype``
    against the float64 copy, the yardstick for ``max_err`` in half precision)."""
    from verimirage.integrations.report import Report

    model, xs = build(name, dtype=dtype)
    want, wgrads = reference(model, xs, train)
    with torch.no_grad():
        eager_err = rel_err(model(*xs), want)
    rep = Report()
    t0 = time.perf_counter()
    try:
        got, grads = compiled(model, xs, train, opts, rep)
    except Exception as e:
        return {"name": name, "train": train, "error": f"{type(e).__name__}: {e}"}
    secs = time.perf_counter() - t0
    errs = [rel_err(got, want)] + [rel_err(g, w) for g, w in zip(grads, wgrads, strict=True)
                                   if g is not None and w is not None]
    missing = sum((g is None) != (w is None) for g, w in zip(grads, wgrads, strict=True))
    taken = [p for p in rep.partitions if p.taken]
    left = sorted({f"{r.op}: {rep.reason_of(r)}" for r in rep.left})
    return {"name": name, "train": train, "secs": secs, "coverage": rep.coverage, "taken": len(taken),
            "graphs": len(rep.graphs),
            "kernels": sum(len(p.kernels) for p in taken), "max_err": max(errs), "eager_err": eager_err,
            "grads_missing": missing,
            "left": left}


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown tables of :func:`run_graph` rows and :func:`run_module` rows (forward and training rows of a module
    side by side)."""
    out: list[str] = []
    graphs = [r for r in rows if "search_s" in r]
    if graphs:
        out += ["| program | kernels | Proved | search s | max error |", "|---|---|---|---|---|"]
        for r in graphs:
            if "error" in r:
                out.append(f"| {r['name']} | - | - | {r['search_s']:.1f} | {r['error'][:80]} |")
                continue
            out.append(f"| {r['name']} | {r['kernels']} | {'yes' if r['proved'] else 'no'} | {r['search_s']:.1f} | "
                       f"{r['max_err']:.1e} |")
        out.append("")
    mods: dict[str, dict[bool, dict[str, Any]]] = {}
    for r in rows:
        if "train" in r:
            mods.setdefault(r["name"], {})[bool(r["train"])] = r
    if mods:
        out += ["| module | from | captured (fwd / train) | partitions, kernels (fwd / train) | s (fwd / train) | "
                "max error (fwd / train) | left to the fallback |", "|---|---|---|---|---|---|---|"]

        def cell(fw: dict[str, Any] | None, tr: dict[str, Any] | None, f: Callable[[dict[str, Any]], str]) -> str:
            return " / ".join("-" if r is None else ("error" if "error" in r else f(r)) for r in (fw, tr))

        for name, by in mods.items():
            fw, tr = by.get(False), by.get(True)
            left = sorted({x for r in (fw, tr) if r and "left" in r for x in r["left"]})
            arch = MODULES[name].arch if name in MODULES else ""
            out.append(" | ".join([
                f"| {name}", arch,
                cell(fw, tr, lambda r: "no graph" if r.get("graphs") == 0 else format(r["coverage"], ".0%")),
                cell(fw, tr, lambda r: f"{r['taken']}, {r['kernels']}"),
                cell(fw, tr, lambda r: format(r["secs"], ".0f")),
                cell(fw, tr, lambda r: format(r["max_err"], ".0e")),
                ("; ".join(left) or "-") + " |"]))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print one row per program (a dict per line), or with ``--render FILE`` the markdown of such lines."""
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*")
    ap.add_argument("--render", help="print the markdown tables of a file of printed rows")
    ap.add_argument("--graphs", action="store_true")
    ap.add_argument("--modules", action="store_true")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--dtype", default="float32", help="torch dtype of the modules (float16, bfloat16)")
    ap.add_argument("--since", type=int, default=0, help="only the modules a session at least this late added")
    a = ap.parse_args(argv)
    if a.render:
        import ast

        rows = [ast.literal_eval(ln) for ln in Path(a.render).read_text().splitlines() if ln.startswith("{")]
        print(render(rows))
        return 0
    if a.graphs:
        for n in a.names or list(GRAPHS):
            r = run_graph(n, a.budget)
            print(r, flush=True)
    if a.modules:
        opts = {"time_budget_s": a.budget, "fallback": "eager", "candidates": 1}
        for n in a.names or [k for k, c in MODULES.items() if c.since >= a.since]:
            r = run_module(n, train=a.train, opts=opts, dtype=getattr(torch, a.dtype))
            print(r, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
