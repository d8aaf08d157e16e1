"""A LLaMA-style decoder layer as kernel graphs (issue 23): decode over a KV cache, and a causal prefill.

One layer: RMSNorm, Q/K/V projections, rotary embeddings of q and k, grouped-query attention, the output
projection and the residual, RMSNorm, the SwiGLU FFN and the residual. Real dimensions (:data:`FULL`:
hidden 4096, 32 query heads, 8 KV heads, head 128, intermediate 14336, a KV cache of 4096 positions)
and a scaled-down form (:data:`SMALL`) with the same structure for the CPU interpreter.

**How the KV cache is modelled (decode).** The cache holds the ``kv_len`` *past* positions,
``KC`` and ``VC`` of shape (batch * kv_heads, kv_len, head), in the usual (sequence, head) layout.
The new token's key and value are computed by the layer and attended to as one more position: the
softmax runs over the ``kv_len + 1`` scores in two parts (``s1 = q K_cache^T``, ``s2 = q k_new``),
sharing one row max ``m = max(max(s1), s2)``::

    o = (exp(s1 - m) V_cache + exp(s2 - m) v_new) / (sum(exp(s1 - m)) + exp(s2 - m))

which is exactly ``softmax(concat(s1, s2)) concat(V_cache, v_new)`` without copying the cache. The
layer also returns the new (rotated) key and value, for the caller to write into the cache at slot
``kv_len`` — in the PyTorch module (:mod:`.layer_module`) that write is an in-place store into a
static cache buffer of ``kv_len + 1`` slots before attention over all of them, the gpt-fast way.

**Prefill** has no past cache: causal attention over the ``tokens`` positions, the causal mask an
input ``M`` of shape (1, group * tokens, tokens) (row ``i * tokens + t`` keeps columns ``<= t``: the
``group`` query heads that share a KV head are stacked along the rows).

**Grouped-query attention (decode)** is written with one product per query head, the KV head a broadcast
batch dim (q (batch * kv_heads, group, 1, head) against K (batch * kv_heads, 1, head, kv_len)); the other
form, the group's query heads stacked as the rows of one product (``gqa="rows"``), is the same function,
but its kernels reshape padded dot rows, which the Triton lowering rejects.

Rotary tables ``COS``/``SIN`` are inputs, (rows, 1, head) with one row per token (its position);
the attention scale ``1/sqrt(head)`` is applied to q.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.builders import Tensor
from ..ir.dtypes import DType, bool_, float16
from ..ir.errors import GraphError
from ..ir.graph import Graph
from .models import masked_attention, rotary


@dataclass(frozen=True)
class LayerDims:
    """Sizes of one decoder layer."""

    hidden: int
    heads: int
    kv_heads: int
    head: int
    ffn: int
    kv_len: int
    eps: float = 1e-5
    rope_base: float = 500000.0

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    def weight_elems(self) -> int:
        """Elements of the layer's weights (projections and norm weights)."""
        d, hq, hk = self.hidden, self.heads * self.head, self.kv_heads * self.head
        return d * (hq + 2 * hk) + hq * d + 3 * d * self.ffn + 2 * d


#: LLaMA-3-8B's layer
FULL = LayerDims(hidden=4096, heads=32, kv_heads=8, head=128, ffn=14336, kv_len=4096)
#: the same structure, small enough for Triton's interpreter (multiples of 16 for every dot)
SMALL = LayerDims(hidden=64, heads=4, kv_heads=2, head=16, ffn=128, kv_len=64)

#: decode batches and prefill lengths of the benchmark's cases
DECODE_BATCHES = (1, 8, 32)
PREFILL_TOKENS = 512
SMALL_PREFILL_TOKENS = 16


def dims(small: bool = False) -> LayerDims:
    """:data:`SMALL` or :data:`FULL`."""
    return SMALL if small else FULL


def _attention_block_inputs(g: Graph, d: LayerDims, rows: int, dt: DType) -> dict[str, Tensor]:
    hq, hk = d.heads * d.head, d.kv_heads * d.head
    return {
        "X": g.input("X", (rows, d.hidden), dt),
        "G1": g.input("G1", (d.hidden,), dt),
        "WQ": g.input("WQ", (d.hidden, hq), dt),
        "WK": g.input("WK", (d.hidden, hk), dt),
        "WV": g.input("WV", (d.hidden, hk), dt),
        "WO": g.input("WO", (hq, d.hidden), dt),
        "G2": g.input("G2", (d.hidden,), dt),
        "WG": g.input("WG", (d.hidden, d.ffn), dt),
        "WU": g.input("WU", (d.hidden, d.ffn), dt),
        "WD": g.input("WD", (d.ffn, d.hidden), dt),
        "COS": g.input("COS", (rows, 1, d.head), dt),
        "SIN": g.input("SIN", (rows, 1, d.head), dt),
    }


def _qkv(g: Graph, d: LayerDims, w: dict[str, Tensor], rows: int) -> tuple[Tensor, Tensor, Tensor]:
    """RMSNorm, projections, rotary: q (rows, heads, head) scaled by 1/sqrt(head), k and v (rows, kv_heads, head)."""
    h = g.rms_norm(w["X"], w["G1"], eps=d.eps)
    q = g.reshape(g.matmul(h, w["WQ"]), (rows, d.heads, d.head))
    k = g.reshape(g.matmul(h, w["WK"]), (rows, d.kv_heads, d.head))
    v = g.reshape(g.matmul(h, w["WV"]), (rows, d.kv_heads, d.head))
    q = g.scale(rotary(g, q, w["COS"], w["SIN"]), 1.0 / math.sqrt(d.head))
    k = rotary(g, k, w["COS"], w["SIN"])
    return q, k, v


def _tail(g: Graph, d: LayerDims, w: dict[str, Tensor], attn: Tensor) -> Tensor:
    """Output projection, residual, RMSNorm, SwiGLU FFN, residual."""
    x1 = g.add(w["X"], g.matmul(attn, w["WO"]))
    h2 = g.rms_norm(x1, w["G2"], eps=d.eps)
    f = g.mul(g.silu(g.matmul(h2, w["WG"])), g.matmul(h2, w["WU"]))
    return g.add(x1, g.matmul(f, w["WD"]))


def decode_layer(batch: int, small: bool = False, dtype: DType = float16, *, gqa: str = "broadcast") -> Graph:
    """One decode step of the layer for ``batch`` sequences over a KV cache of ``kv_len`` past positions.

    Inputs: the layer's weights (``W*``: (in, out)), ``X`` (batch, hidden), ``COS``/``SIN``, the cache
    ``KC``/``VC`` (batch * kv_heads, kv_len, head). Outputs: the layer's output (batch, hidden), and the
    new key (rotated) and value (batch * kv_heads, 1, head) to write into the cache. ``gqa``: how the
    query heads sharing a KV head meet it: ``"rows"`` (stacked as the rows of one product) or
    ``"broadcast"`` (one product per query head, the KV head broadcast over the group).
    """
    if gqa not in ("rows", "broadcast"):
        raise GraphError(f"decode_layer: gqa={gqa!r}; expected 'rows' or 'broadcast'")
    d = dims(small)
    g = Graph()
    w = _attention_block_inputs(g, d, batch, dtype)
    kc = g.input("KC", (batch * d.kv_heads, d.kv_len, d.head), dtype)
    vc = g.input("VC", (batch * d.kv_heads, d.kv_len, d.head), dtype)
    q, k, v = _qkv(g, d, w, batch)
    bk = batch * d.kv_heads
    kn = g.reshape(k, (bk, 1, d.head))
    vn = g.reshape(v, (bk, 1, d.head))
    if gqa == "rows":  # the group's query heads as the rows of one product with their KV head
        qg = g.reshape(q, (bk, d.group, d.head))  # query head kv * group + i uses KV head kv
        kct, knt, vcb, vnb = g.transpose(kc, 1, 2), g.transpose(kn, 1, 2), vc, vn
    else:  # "broadcast": one row per query head, the KV head broadcast over the group (a batch dim)
        qg = g.reshape(q, (bk, d.group, 1, d.head))
        kct = g.reshape(g.transpose(kc, 1, 2), (bk, 1, d.head, d.kv_len))
        knt = g.reshape(g.transpose(kn, 1, 2), (bk, 1, d.head, 1))
        vcb = g.reshape(vc, (bk, 1, d.kv_len, d.head))
        vnb = g.reshape(vn, (bk, 1, 1, d.head))
    ax = qg.type.rank - 1
    s1 = g.matmul(qg, kct)  # (..., kv_len): the cached positions
    s2 = g.matmul(qg, knt)  # (..., 1): the new position
    m = g.maximum(g.max(s1, axis=ax), s2)
    e1, e2 = g.exp(g.sub(s1, m)), g.exp(g.sub(s2, m))
    o = g.div(g.add(g.matmul(e1, vcb), g.mul(e2, vnb)), g.add(g.sum(e1, axis=ax), e2))
    out = _tail(g, d, w, g.reshape(o, (batch, d.heads * d.head)))
    g.output(out, kn, vn)
    return g


def prefill_layer(tokens: int, small: bool = False, dtype: DType = float16) -> Graph:
    """The layer over ``tokens`` positions of one sequence, causal, no past cache.

    Inputs: the weights, ``X`` (tokens, hidden), ``COS``/``SIN``, the causal mask ``M`` (1, group * tokens,
    tokens). Outputs: the layer's output (tokens, hidden) and the keys (rotated) and values
    (tokens, kv_heads, head) for the cache.
    """
    d = dims(small)
    g = Graph()
    w = _attention_block_inputs(g, d, tokens, dtype)
    mask = g.input("M", (1, d.group * tokens, tokens), bool_)
    q, k, v = _qkv(g, d, w, tokens)
    qg = g.reshape(g.permute(q, (1, 0, 2)), (d.kv_heads, d.group * tokens, d.head))
    kt = g.permute(k, (1, 2, 0))  # (kv_heads, head, tokens)
    vt = g.permute(v, (1, 0, 2))  # (kv_heads, tokens, head)
    o = masked_attention(g, qg, kt, vt, mask)  # (kv_heads, group * tokens, head)
    o = g.permute(g.reshape(o, (d.heads, tokens, d.head)), (1, 0, 2))
    out = _tail(g, d, w, g.reshape(o, (tokens, d.heads * d.head)))
    g.output(out, k, v)
    return g


def layer_cases(small: bool = False) -> list[str]:
    """The layer benchmark's case names: ``decode_bs1``, ``decode_bs8``, ``decode_bs32``, ``prefill_512``
    (``prefill_16`` when ``small``)."""
    t = SMALL_PREFILL_TOKENS if small else PREFILL_TOKENS
    return [f"decode_bs{b}" for b in DECODE_BATCHES] + [f"prefill_{t}"]


def get_layer(case: str, small: bool = False, dtype: DType = float16) -> Graph:
    """The decoder-layer program of ``case`` (see :func:`layer_cases`; any ``decode_bsN`` / ``prefill_T``)."""
    kind, _, n = case.rpartition("_")
    num = n[2:] if n.startswith("bs") else n
    bad = kind not in ("decode", "prefill") or (kind == "decode") != n.startswith("bs")
    if bad or not num.isdigit() or int(num) < 1:
        raise GraphError(f"benchmarks.get_layer: unknown case {case!r}; expected 'decode_bs<N>' or 'prefill_<T>', "
                         f"e.g. {layer_cases(small)}")
    g = decode_layer(int(num), small, dtype) if kind == "decode" else prefill_layer(int(num), small, dtype)
    g.check()
    return g


def causal_mask(group: int, tokens: int) -> list[list[bool]]:
    """The prefill mask ``M[0]`` as nested lists: row ``i * tokens + t`` keeps columns ``<= t``."""
    return [[j <= r % tokens for j in range(tokens)] for r in range(group * tokens)]


def rope_angles(positions: list[int], head: int, base: float) -> list[list[float]]:
    """Rotary angles (len(positions), head): ``pos * base^(-2i/head)`` for the two halves (the LLaMA layout)."""
    inv = [base ** (-2.0 * i / head) for i in range(head // 2)]
    return [[p * f for f in inv] * 2 for p in positions]
