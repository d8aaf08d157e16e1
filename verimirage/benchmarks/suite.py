"""The benchmark suite: the Mirage paper's programs and shapes, as kernel graphs.

Every entry builds the full-size graph (fp16, batch 1 or 8) and a ``small``
variant with the same structure and shapes small enough for Triton's CPU
interpreter (still multiples of 16, so every ``tl.dot`` is legal on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir.builders import Tensor
from ..ir.dtypes import DType, float16
from ..ir.errors import GraphError
from ..ir.graph import Graph


@dataclass(frozen=True)
class Entry:
    """One suite program: how to build it, where it comes from, the expert kernel for it."""

    name: str
    build: Callable[[int, bool, DType], Graph]
    source: str
    expert: str
    expert_kernels: int


def attention(g: Graph, q: Tensor, k: Tensor, v: Tensor, stable: bool) -> Tensor:
    """softmax(Q K) V over the last axis (``stable``: the row max subtracted before exp)."""
    a = g.matmul(q, k)
    if stable:
        a = g.sub(a, g.max(a, axis=2))
    e = g.exp(a)
    return g.matmul(g.div(e, g.sum(e, axis=2)), v)


def _attn_builder(heads: int, rows: int, small_heads: int, small_rows: int, stable: bool = False, qknorm: bool = False):
    def build(batch: int, small: bool, dtype: DType) -> Graph:
        h = (small_heads if small else heads) * batch
        n = small_rows if small else rows
        d = 16 if small else 64
        kv = 128 if small else 4096
        g = Graph()
        q = g.input("Q", (h, n, d), dtype)
        k = g.input("K", (h, d, kv), dtype)
        v = g.input("V", (h, kv, d), dtype)
        if qknorm:
            q = g.rms_norm(q, axis=2)
            k = g.rms_norm(k, axis=1)
        g.output(attention(g, q, k, v, stable))
        return g

    return build


def _rmsnorm_linear(batch: int, small: bool, dtype: DType) -> Graph:
    m, k, n = (2 * batch, 64, 96) if small else (2 * batch, 4096, 6144)
    g = Graph()
    x = g.input("X", (m, k), dtype)
    w = g.input("W", (k, n), dtype)
    g.output(g.matmul(g.rms_norm(x), w))
    return g


def _lora(batch: int, small: bool, dtype: DType) -> Graph:
    m, k, n, r = (16 * batch, 32, 64, 16) if small else (16 * batch, 256, 4096, 16)
    g = Graph()
    x = g.input("X", (m, k), dtype)
    w = g.input("W", (k, n), dtype)
    a = g.input("A", (k, r), dtype)
    b = g.input("B", (r, n), dtype)
    g.output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b)))
    return g


def _gated_mlp(batch: int, small: bool, dtype: DType) -> Graph:
    m, k, n = (8 * batch, 64, 64) if small else (8 * batch, 4096, 4096)
    g = Graph()
    x = g.input("X", (m, k), dtype)
    w1 = g.input("W1", (k, n), dtype)
    w2 = g.input("W2", (k, n), dtype)
    g.output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _ntrans(batch: int, small: bool, dtype: DType) -> Graph:
    m, d = (8 * batch, 64) if small else (8 * batch, 4096)
    g = Graph()
    x = g.input("X", (m, d), dtype)
    h = g.input("H", (m, d), dtype)
    alpha = g.input("alpha", (m, d), dtype)
    g.output(g.add(g.rms_norm(h), x), g.rms_norm(g.add(x, g.mul(alpha, x))))
    return g


_ATTN_SRC = "Mirage (arXiv 2405.05751) benchmark suite"
_ENTRIES = [
    Entry(
        "gqa",
        _attn_builder(2, 256, 2, 32),
        f"{_ATTN_SRC}: grouped-query attention decoding, Q (2b,256,64), K (2b,64,4096), V (2b,4096,64)",
        "FlashDecoding / FlashInfer: split-KV partial softmax-weighted sums + a combine kernel",
        2,
    ),
    Entry(
        "mha",
        _attn_builder(32, 16, 4, 16),
        f"{_ATTN_SRC}: multi-head attention decoding, Q (32b,16,64), K (32b,64,4096), V (32b,4096,64)",
        "FlashDecoding: split-KV + combine",
        2,
    ),
    Entry(
        "mqa",
        _attn_builder(1, 1024, 1, 64),
        f"{_ATTN_SRC}: multi-query attention, Q (b,1024,64), K (b,64,4096), V (b,4096,64)",
        "FlashAttention: one kernel, online softmax over KV tiles",
        1,
    ),
    Entry(
        "qknorm_gqa",
        _attn_builder(2, 256, 2, 32, qknorm=True),
        f"{_ATTN_SRC}: GQA with RMSNorm over the head dim of Q and K",
        "QK-norm fused into the FlashDecoding prologue",
        2,
    ),
    Entry(
        "gqa_stable",
        _attn_builder(2, 256, 2, 32, stable=True),
        "gqa with the numerically safe softmax (row max subtracted before exp)",
        "FlashDecoding with running max and rescale, split-KV + combine",
        2,
    ),
    Entry(
        "mha_stable",
        _attn_builder(32, 16, 4, 16, stable=True),
        "mha with the numerically safe softmax (row max subtracted before exp)",
        "FlashDecoding with running max and rescale, split-KV + combine",
        2,
    ),
    Entry(
        "rmsnorm_linear",
        _rmsnorm_linear,
        f"{_ATTN_SRC}: RMSNorm followed by a Linear, X (2b,4096), W (4096,6144)",
        "one kernel: the matmul on raw X with the 1/rms row scaling as its epilogue",
        1,
    ),
    Entry(
        "lora",
        _lora,
        f"{_ATTN_SRC}: LoRA, X (16b,256), W (256,4096), A (256,16), B (16,4096); O = XW + (XA)B",
        "one kernel: concat([X, XA]) @ concat([W; B]) (concat-matmul fusion)",
        1,
    ),
    Entry(
        "gated_mlp",
        _gated_mlp,
        f"{_ATTN_SRC}: gated MLP, X (8b,4096), W1, W2 (4096,4096); O = silu(XW1) * XW2",
        "one kernel: both matmuls share X tiles, silu and the product as the epilogue",
        1,
    ),
    Entry(
        "ntrans",
        _ntrans,
        f"{_ATTN_SRC}: normalized-transformer step, X, H, alpha (8b,4096); outputs rms_norm(H)+X and "
        "rms_norm(X+alpha*X)",
        "one kernel, one block per row computing both norms",
        1,
    ),
]

SUITE: dict[str, Entry] = {e.name: e for e in _ENTRIES}


def names() -> list[str]:
    """Names of the suite's programs."""
    return list(SUITE)


def entry(name: str) -> Entry:
    """The suite entry ``name``."""
    try:
        return SUITE[name]
    except KeyError:
        raise GraphError(f"benchmarks: unknown program {name!r}; expected one of {names()}") from None


def get(name: str, batch: int = 1, small: bool = False, dtype: DType = float16) -> Graph:
    """The suite program ``name`` at ``batch`` (full size, or ``small`` for the CPU interpreter)."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise GraphError(f"benchmarks.get: batch {batch!r}; expected a positive int (the suite uses 1 and 8)")
    g = entry(name).build(batch, small, dtype)
    g.check()
    return g
