"""A corpus of idiomatic PyTorch modules, written the way model code is written.

Each entry builds ``(module, example_inputs)`` for the torch.compile
capture (:mod:`verimirage.integrations.dynamo`): MLPs from ``nn.Linear`` with
the common activations, gated FFNs, norms + projections, attention in its
usual spellings (SDPA causal / masked / GQA, hand-written softmax), QK-norm,
rotary embeddings, soft-capped logits, a cross-entropy loss, and whole blocks
in the style of open LLM and encoder implementations. Shapes are small
(``small=True``, the default) so the CPU interpreter can run them, or
realistic (``small=False``) for GPU timings.

``names()`` lists the corpus; ``get(name, dtype=..., small=..., seed=...)``
builds one entry; ``CORPUS[name].train`` says whether a backward pass is
meaningful (every entry here has parameters or inputs that require grad).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Dims:
    """Sizes of one corpus instance."""

    batch: int
    seq: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.hidden // self.heads


SMALL = Dims(batch=2, seq=4, hidden=16, heads=2, kv_heads=1, ffn=32, vocab=24)
LARGE = Dims(batch=8, seq=512, hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=8192)
#: between the two: small enough for a CPU search of its partitions, large enough to time on a GPU
MEDIUM = Dims(batch=4, seq=128, hidden=512, heads=8, kv_heads=2, ffn=1408, vocab=4096)
#: one decoding step of 8 sequences at LARGE's widths (8 rows: the weights' bytes decide, not the arithmetic)
DECODE = Dims(batch=8, seq=1, hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=8192)


# --------------------------------------------------------------------------- building blocks


class MLP(nn.Module):
    """Linear -> activation -> Linear, with biases."""

    def __init__(self, d: int, f: int, act: nn.Module) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, f)
        self.act = act
        self.fc2 = nn.Linear(f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """Llama-style gated FFN: ``down(silu(gate(x)) * up(x))``, no biases."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GeGLU(nn.Module):
    """GeGLU FFN with one fused input projection split in two."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, 2 * f)
        self.out = nn.Linear(f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, gate = self.proj(x).chunk(2, dim=-1)
        return self.out(h * F.gelu(gate, approximate="tanh"))


class LlamaRMSNorm(nn.Module):
    """RMSNorm written out as in many LLM code bases."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


class NormLinear(nn.Module):
    """A norm followed by a projection."""

    def __init__(self, norm: nn.Module, d: int, n: int, bias: bool = False) -> None:
        super().__init__()
        self.norm = norm
        self.proj = nn.Linear(d, n, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Rotary helper: ``cat(-x2, x1)`` of the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(seq: int, dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of rotary embeddings, (seq, dim)."""
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Rotary(nn.Module):
    """Apply rotary embeddings to q and k (B, H, T, D)."""

    def __init__(self, seq: int, dim: int) -> None:
        super().__init__()
        cos, sin = rope_tables(seq, dim)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    cos: torch.Tensor
    sin: torch.Tensor

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos.to(q.dtype), self.sin.to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    """Multi-head / grouped-query self-attention with nn.Linear projections and SDPA.

    ``gqa``: ``"repeat_interleave"`` or ``"expand"`` for how KV heads are repeated; ``qk_norm``
    applies RMSNorm to q and k per head; ``rope`` applies rotary embeddings; ``hand``: softmax
    attention written out instead of SDPA.
    """

    def __init__(self, d: Dims, *, kv_heads: int | None = None, causal: bool = False, gqa: str = "repeat_interleave",
                 qk_norm: bool = False, rope: bool = False, hand: bool = False, bias: bool = False) -> None:
        super().__init__()
        self.h, self.kv = d.heads, kv_heads or d.heads
        self.hd = d.head_dim
        self.q_proj = nn.Linear(d.hidden, self.h * self.hd, bias=bias)
        self.k_proj = nn.Linear(d.hidden, self.kv * self.hd, bias=bias)
        self.v_proj = nn.Linear(d.hidden, self.kv * self.hd, bias=bias)
        self.o_proj = nn.Linear(self.h * self.hd, d.hidden, bias=bias)
        self.causal, self.gqa, self.hand = causal, gqa, hand
        self.q_norm = nn.RMSNorm(self.hd, eps=1e-6) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.hd, eps=1e-6) if qk_norm else None
        self.rope = Rotary(d.seq, self.hd) if rope else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.hd).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, k)
        if self.kv != self.h:
            rep = self.h // self.kv
            if self.gqa == "expand":
                k = k[:, :, None].expand(B, self.kv, rep, T, self.hd).reshape(B, self.h, T, self.hd)
                v = v[:, :, None].expand(B, self.kv, rep, T, self.hd).reshape(B, self.h, T, self.hd)
            else:
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
        if self.hand:
            s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
            if mask is not None:
                s = s + mask
            o = torch.softmax(s, dim=-1) @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal and mask is None)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.h * self.hd))


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, GQA attention with rotary, RMSNorm, SwiGLU; residuals."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d.hidden, eps=1e-5)
        self.self_attn = Attention(d, kv_heads=d.kv_heads, causal=True, rope=True)
        self.post_attention_layernorm = nn.RMSNorm(d.hidden, eps=1e-5)
        self.mlp = SwiGLU(d.hidden, d.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class GPT2Block(nn.Module):
    """GPT-2 block: LayerNorm, fused QKV with bias, causal SDPA, GELU (tanh) MLP; residuals."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d.hidden)
        self.c_attn = nn.Linear(d.hidden, 3 * d.hidden)
        self.c_proj = nn.Linear(d.hidden, d.hidden)
        self.ln_2 = nn.LayerNorm(d.hidden)
        self.mlp = MLP(d.hidden, 4 * d.hidden, nn.GELU(approximate="tanh"))
        self.h = d.heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer (BERT style): attention with an additive mask, GELU FFN, LayerNorms."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.attn = Attention(d, bias=True)
        self.ln1 = nn.LayerNorm(d.hidden, eps=1e-12)
        self.ffn = MLP(d.hidden, d.ffn, nn.GELU())
        self.ln2 = nn.LayerNorm(d.hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, mask))
        return self.ln2(x + self.ffn(x))


class SoftcapLogits(nn.Module):
    """Final norm, LM head and logit soft-capping ``c * tanh(x / c)`` (Gemma 2)."""

    def __init__(self, d: Dims, cap: float = 30.0) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(d.hidden, eps=1e-6)
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.norm(x))
        return self.cap * torch.tanh(logits / self.cap)


class CrossEntropyHead(nn.Module):
    """LM head and cross-entropy loss against integer targets."""

    def __init__(self, d: Dims) -> None:
        super().__init__()
        self.lm_head = nn.Linear(d.hidden, d.vocab, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class LoRALinear(nn.Module):
    """A frozen-shape linear layer plus a low-rank update ``B(A x) * scale``."""

    def __init__(self, d: int, n: int, r: int = 4, alpha: float = 8.0) -> None:
        super().__init__()
        self.base = nn.Linear(d, n)
        self.lora_A = nn.Linear(d, r, bias=False)
        self.lora_B = nn.Linear(r, n, bias=False)
        self.scale = alpha / r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scale


class SoftmaxHead(nn.Module):
    """A classifier head with softmax probabilities."""

    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), dim=-1)


class ResidualMLP(nn.Module):
    """``x + mlp(layer_norm(x))``."""

    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.mlp = MLP(d, f, nn.GELU(approximate="tanh"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


class MaxNormalize(nn.Module):
    """Projection, then subtract the row max (``x.max(dim, keepdim=True).values``) and exponentiate."""

    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return torch.exp(y - y.max(dim=-1, keepdim=True).values)


# --------------------------------------------------------------------------- the corpus


@dataclass(frozen=True)
class Entry:
    """A corpus entry: how to build the module and its inputs."""

    name: str
    build: Callable[[Dims], tuple[nn.Module, Callable[[Dims, torch.Generator], list[torch.Tensor]]]]
    doc: str
    train: bool = True


def _x(d: Dims, gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(d.batch, d.seq, d.hidden, generator=gen)]


def _x2(d: Dims, gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(d.batch * d.seq, d.hidden, generator=gen)]


def _x_mask(d: Dims, gen: torch.Generator) -> list[torch.Tensor]:
    keep = torch.rand(d.batch, 1, 1, d.seq, generator=gen) > 0.25
    keep[..., 0] = True
    mask = torch.zeros(d.batch, 1, 1, d.seq).masked_fill(~keep, -1e4)
    return [torch.randn(d.batch, d.seq, d.hidden, generator=gen), mask]


def _x_targets(d: Dims, gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(d.batch, d.seq, d.hidden, generator=gen),
            torch.randint(0, d.vocab, (d.batch, d.seq), generator=gen)]


def _e(name: str, doc: str, make: Callable[[Dims], nn.Module],
       inputs: Callable[[Dims, torch.Generator], list[torch.Tensor]] = _x) -> Entry:
    return Entry(name, lambda d: (make(d), inputs), doc)


CORPUS: dict[str, Entry] = {
    e.name: e
    for e in [
        _e("mlp_relu", "nn.Sequential(Linear, ReLU, Linear) on (N, C)",
           lambda d: nn.Sequential(nn.Linear(d.hidden, d.ffn), nn.ReLU(), nn.Linear(d.ffn, d.hidden)), _x2),
        _e("mlp_gelu", "MLP with exact GELU on (B, T, C)", lambda d: MLP(d.hidden, d.ffn, nn.GELU())),
        _e("mlp_gelu_tanh", "MLP with tanh GELU", lambda d: MLP(d.hidden, d.ffn, nn.GELU(approximate="tanh"))),
        _e("mlp_silu", "MLP with SiLU", lambda d: MLP(d.hidden, d.ffn, nn.SiLU())),
        _e("mlp_sigmoid", "MLP with sigmoid", lambda d: MLP(d.hidden, d.ffn, nn.Sigmoid()), _x2),
        _e("mlp_tanh", "MLP with tanh", lambda d: MLP(d.hidden, d.ffn, nn.Tanh()), _x2),
        _e("mlp_leaky_relu", "MLP with LeakyReLU(0.1)", lambda d: MLP(d.hidden, d.ffn, nn.LeakyReLU(0.1)), _x2),
        _e("mlp_relu_3d", "MLP with ReLU on (B, T, C)", lambda d: MLP(d.hidden, d.ffn, nn.ReLU())),
        _e("swiglu", "Llama SwiGLU FFN", lambda d: SwiGLU(d.hidden, d.ffn)),
        _e("geglu", "GeGLU FFN with a fused, chunked input projection", lambda d: GeGLU(d.hidden, d.ffn)),
        _e("layernorm_linear", "nn.LayerNorm + nn.Linear",
           lambda d: NormLinear(nn.LayerNorm(d.hidden), d.hidden, d.ffn)),
        _e("rmsnorm_linear", "nn.RMSNorm + nn.Linear",
           lambda d: NormLinear(nn.RMSNorm(d.hidden, eps=1e-6), d.hidden, d.ffn)),
        _e("llama_rmsnorm_linear", "hand-written RMSNorm + nn.Linear",
           lambda d: NormLinear(LlamaRMSNorm(d.hidden), d.hidden, d.ffn)),
        _e("residual_mlp", "x + MLP(LayerNorm(x))", lambda d: ResidualMLP(d.hidden, d.ffn)),
        _e("lora", "Linear plus a LoRA update", lambda d: LoRALinear(d.hidden, d.ffn), _x2),
        _e("softmax_head", "Linear + torch.softmax", lambda d: SoftmaxHead(d.hidden, d.vocab)),
        _e("max_normalize", "Linear, minus the row max (.max(keepdim=True).values), exp",
           lambda d: MaxNormalize(d.hidden, d.vocab)),
        _e("sdpa", "multi-head attention with F.scaled_dot_product_attention", lambda d: Attention(d)),
        _e("sdpa_causal", "causal multi-head attention (SDPA is_causal)", lambda d: Attention(d, causal=True)),
        _e("sdpa_mask", "attention with an additive padding mask", lambda d: Attention(d, bias=True), _x_mask),
        _e("gqa_repeat_interleave", "GQA, KV heads repeated with repeat_interleave",
           lambda d: Attention(d, kv_heads=d.kv_heads, causal=True)),
        _e("gqa_expand", "GQA, KV heads repeated with expand + reshape",
           lambda d: Attention(d, kv_heads=d.kv_heads, causal=True, gqa="expand")),
        _e("hand_attention", "attention written out: q @ k^T / sqrt(d), torch.softmax, @ v",
           lambda d: Attention(d, hand=True)),
        _e("qk_norm_attention", "attention with RMSNorm on q and k per head (QK-norm)",
           lambda d: Attention(d, qk_norm=True, causal=True)),
        _e("rotary_attention", "attention with rotary embeddings", lambda d: Attention(d, rope=True, causal=True)),
        _e("softcap_logits", "RMSNorm, LM head, logit soft-capping", lambda d: SoftcapLogits(d)),
        _e("cross_entropy", "LM head and F.cross_entropy", lambda d: CrossEntropyHead(d), _x_targets),
        _e("llama_block", "Llama-style decoder block", lambda d: LlamaBlock(d)),
        _e("gpt2_block", "GPT-2 block", lambda d: GPT2Block(d)),
        _e("encoder_layer", "BERT-style post-norm encoder layer with a padding mask",
           lambda d: EncoderLayer(d), _x_mask),
    ]
}


def names() -> list[str]:
    """The corpus's module names."""
    return list(CORPUS)


def get(name: str, *, dtype: torch.dtype = torch.float32, small: bool = True, seed: int = 0,
        device: str | torch.device = "cpu", dims: Dims | None = None) -> tuple[nn.Module, list[torch.Tensor]]:
    """Build corpus entry ``name``: ``(module, example_inputs)`` in ``dtype`` (integer inputs keep theirs).

    Sizes: ``dims`` if given, else :data:`SMALL` (``small=True``) or :data:`LARGE`.
    """
    if name not in CORPUS:
        raise KeyError(f"unknown corpus module {name!r}; known: {names()}")
    d = dims if dims is not None else SMALL if small else LARGE
    torch.manual_seed(seed)
    model, inputs = CORPUS[name].build(d)
    gen = torch.Generator().manual_seed(seed + 1)
    xs = inputs(d, gen)
    model = model.to(device=device, dtype=dtype)
    xs = [x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device) for x in xs]
    return model, xs


__all__ = ["CORPUS", "LARGE", "MEDIUM", "SMALL", "Dims", "Entry", "get", "names"]


def loss_weights(out: torch.Tensor) -> torch.Tensor:
    """Fixed random weights (seed 7) in ``out``'s shape and dtype: a training check's loss is ``sum(out * w)``, so
    every output element gets its own gradient."""
    g = torch.Generator().manual_seed(7)
    return torch.rand(out.shape, generator=g, dtype=torch.float64).to(out.dtype)


def float64_reference(model: nn.Module, xs: list[torch.Tensor], *, train: bool) -> tuple[torch.Tensor, list[Any]]:
    """A float64 copy of ``model`` run on ``xs`` (floating inputs widened): its output and, with ``train``, the
    gradients of ``sum(out * loss_weights(out))`` for its parameters and then its floating inputs (none without)."""
    ref = copy.deepcopy(model).double()
    xr = [x.detach().double() if x.is_floating_point() else x for x in xs]
    if not train:
        with torch.no_grad():
            return ref(*xr), []
    xr = [x.requires_grad_() if x.is_floating_point() else x for x in xr]
    out = ref(*xr)
    (out * loss_weights(out).double()).sum().backward()
    return out, [p.grad for p in ref.parameters()] + [x.grad for x in xr if x.is_floating_point()]
