"""The decoder layer of :mod:`.layer` as PyTorch modules, written the way model code is written.

:class:`DecodeLayer` keeps a static KV cache as buffers of ``kv_len + 1`` slots (the gpt-fast way):
each step writes the new token's rotated key and value in place into the last slot and attends over all
slots with ``F.scaled_dot_product_attention(..., enable_gqa=True)``. :class:`PrefillLayer` attends
causally over its tokens. Both run under ``torch.compile`` (Inductor, or ``backend="verimirage"``).

:func:`graph_inputs` maps a module's parameters and cache, plus the step's inputs, onto the inputs of
the kernel graph :func:`verimirage.benchmarks.layer.get_layer` builds (weights transposed to (in, out),
the cache's past ``kv_len`` positions as ``KC``/``VC``), so the graph and the module compute the same
function on the same numbers; :func:`make_case` builds both with seeded random weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ir.graph import Graph
from .layer import LayerDims, causal_mask, dims, get_layer, rope_angles
from .modules import SwiGLU, rotate_half


class DecoderLayer(nn.Module):
    """Pre-norm LLaMA decoder layer: RMSNorm, GQA attention with rotary embeddings, RMSNorm, SwiGLU."""

    def __init__(self, d: LayerDims) -> None:
        super().__init__()
        self.d = d
        self.input_layernorm = nn.RMSNorm(d.hidden, eps=d.eps)
        self.q_proj = nn.Linear(d.hidden, d.heads * d.head, bias=False)
        self.k_proj = nn.Linear(d.hidden, d.kv_heads * d.head, bias=False)
        self.v_proj = nn.Linear(d.hidden, d.kv_heads * d.head, bias=False)
        self.o_proj = nn.Linear(d.heads * d.head, d.hidden, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(d.hidden, eps=d.eps)
        self.mlp = SwiGLU(d.hidden, d.ffn)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (n, heads, head), k and v (n, kv_heads, head) of ``x`` (n, hidden); q and k rotated."""
        d, n = self.d, x.shape[0]
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(n, d.heads, d.head)
        k = self.k_proj(h).view(n, d.kv_heads, d.head)
        v = self.v_proj(h).view(n, d.kv_heads, d.head)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def _tail(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + self.o_proj(attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecodeLayer(DecoderLayer):
    """One decode step for ``batch`` sequences; ``forward(x (batch, hidden), cos, sin (batch, 1, head))``.

    The cache buffers ``k_cache``/``v_cache`` (batch, kv_heads, kv_len + 1, head) hold the past positions in
    their first ``kv_len`` slots; the step writes its token into the last slot, then attends over all.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor

    def __init__(self, d: LayerDims, batch: int) -> None:
        super().__init__(d)
        shape = (batch, d.kv_heads, d.kv_len + 1, d.head)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The layer's output (batch, hidden); the new key and value land in the cache's last slot."""
        d, b = self.d, x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        self.k_cache[:, :, d.kv_len:].copy_(k.unsqueeze(2))
        self.v_cache[:, :, d.kv_len:].copy_(v.unsqueeze(2))
        o = F.scaled_dot_product_attention(q.unsqueeze(2), self.k_cache, self.v_cache, enable_gqa=True)
        return self._tail(x, o.reshape(b, d.heads * d.head))


class PrefillLayer(DecoderLayer):
    """The layer over ``tokens`` positions of one sequence, causal; ``forward(x (tokens, hidden), cos, sin)``."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The layer's output (tokens, hidden)."""
        d, t = self.d, x.shape[0]
        q, k, v = self._qkv(x, cos, sin)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                           enable_gqa=True)
        return self._tail(x, o.transpose(0, 1).reshape(t, d.heads * d.head))


def _case(case: str) -> tuple[str, int]:
    kind, _, n = case.rpartition("_")
    return kind, int(n[2:] if n.startswith("bs") else n)


def build_module(case: str, small: bool = False, *, seed: int = 0) -> DecoderLayer:
    """The module of ``case`` (``decode_bs<N>`` / ``prefill_<T>``) in float32 on the CPU, seeded random
    weights (norm weights ``1 + 0.1 randn``) and, for decode, a random cache (``randn``)."""
    d = dims(small)
    kind, n = _case(case)
    torch.manual_seed(seed)
    m: DecoderLayer = DecodeLayer(d, n) if kind == "decode" else PrefillLayer(d)
    with torch.no_grad():
        for norm in (m.input_layernorm, m.post_attention_layernorm):
            assert norm.weight is not None
            norm.weight.copy_(1.0 + 0.1 * torch.randn(d.hidden))
        if isinstance(m, DecodeLayer):
            m.k_cache.normal_()
            m.v_cache.normal_()
    return m.eval()


def step_inputs(case: str, small: bool = False, *, seed: int = 1, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """``[x, cos, sin]`` of one step: ``x`` randn; decode positions ``kv_len`` (every sequence's new token),
    prefill positions ``0 .. tokens-1``."""
    d = dims(small)
    kind, n = _case(case)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d.hidden, generator=gen)
    pos = [d.kv_len] * n if kind == "decode" else list(range(n))
    ang = torch.tensor(rope_angles(pos, d.head, d.rope_base), dtype=torch.float64).unsqueeze(1)
    return [t.to(device=device, dtype=dtype) for t in (x, ang.cos(), ang.sin())]


def graph_inputs(module: DecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> dict[str, torch.Tensor]:
    """The kernel graph's inputs (by name) for ``module`` and one step's ``x, cos, sin``, in ``x``'s dtype."""
    d, dt = module.d, x.dtype

    def w(lin: nn.Linear) -> torch.Tensor:
        return lin.weight.detach().t().contiguous().to(dt)

    norm1, norm2 = module.input_layernorm.weight, module.post_attention_layernorm.weight
    assert norm1 is not None and norm2 is not None
    out = {"X": x, "G1": norm1.detach().to(dt), "WQ": w(module.q_proj), "WK": w(module.k_proj),
           "WV": w(module.v_proj), "WO": w(module.o_proj), "G2": norm2.detach().to(dt),
           "WG": w(module.mlp.gate_proj), "WU": w(module.mlp.up_proj), "WD": w(module.mlp.down_proj),
           "COS": cos, "SIN": sin}
    if isinstance(module, DecodeLayer):
        b = x.shape[0]
        for name, c in (("KC", module.k_cache), ("VC", module.v_cache)):
            out[name] = c[:, :, : d.kv_len].reshape(b * d.kv_heads, d.kv_len, d.head).to(dt).contiguous()
    else:
        t = x.shape[0]
        out["M"] = torch.tensor(causal_mask(d.group, t), device=x.device).unsqueeze(0)
    return out


def make_case(case: str, small: bool = False, *, dtype: torch.dtype = torch.float32,
              device: str | torch.device = "cpu", seed: int = 0) -> dict[str, Any]:
    """Module, step inputs, graph and the graph's inputs of ``case``, all on ``device`` in ``dtype``."""
    m = build_module(case, small, seed=seed).to(device=device, dtype=dtype)
    xs = step_inputs(case, small, seed=seed + 1, dtype=dtype, device=device)
    g: Graph = get_layer(case, small)
    return {"module": m, "inputs": xs, "graph": g, "graph_inputs": graph_inputs(m, *xs)}


__all__ = ["DecodeLayer", "DecoderLayer", "PrefillLayer", "build_module", "graph_inputs", "make_case", "step_inputs"]
