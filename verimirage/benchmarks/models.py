"""The "models" section: pieces of real models written with the ops they use (issue 21).

Not the Mirage suite (``suite.py``): these programs exercise log, tanh, erf, masks and layout ops.
Each entry builds a full-size graph and a ``small`` one for the CPU interpreter. The helpers below
(:func:`logsumexp`, :func:`rotary`, ...) take the choices a program could get wrong as arguments, so
the mutation corpus (tests/cases/corpus.py) plants its bugs through them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ..ir.builders import Tensor
from ..ir.dtypes import DType, bool_, float16
from ..ir.errors import GraphError
from ..ir.graph import Graph
from .suite import attention

INV_SQRT2 = 1.0 / math.sqrt(2.0)
#: the value masked-out attention logits take (exp of it is 0 in fp16 and fp32)
MASKED = -30000.0


def logsumexp(g: Graph, x: Tensor, axis: int, *, stable: bool = True) -> Tensor:
    """``log(sum(exp(x), axis))`` (kept dim); ``stable``: the max-shifted form ``m + log(sum(exp(x - m)))``."""
    if not stable:
        return g.log(g.sum(g.exp(x), axis=axis))
    m = g.max(x, axis=axis)
    return g.add(m, g.log(g.sum(g.exp(g.sub(x, m)), axis=axis)))


def log_softmax(g: Graph, x: Tensor, axis: int, *, stable: bool = True) -> Tensor:
    """``x - logsumexp(x)``."""
    return g.sub(x, logsumexp(g, x, axis, stable=stable))


def cross_entropy(g: Graph, logits: Tensor, onehot: Tensor, *, stable: bool = True) -> Tensor:
    """Mean over rows of ``-sum(onehot * log_softmax(logits))`` (shape (1, 1))."""
    nll = g.sum(g.mul(onehot, g.neg(log_softmax(g, logits, 1, stable=stable))), axis=1)
    return g.mean(nll, axis=0)


def masked_attention(g: Graph, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, cap: float | None = None,
                     act: str = "tanh", zero_masked: bool = False) -> Tensor:
    """softmax(where(mask, Q K, MASKED)) V over the last axis, row-max stabilised; ``cap``: tanh soft-capping
    ``cap * act(s / cap)`` of the logits first (``act`` is the op used: tanh).

    ``zero_masked``: the masked elements' weights are exactly 0, ``e = where(mask, exp(c - max c), 0)`` with
    ``c = where(mask, s, MASKED)`` (the softmax over the kept elements alone, as SDPA computes it with a boolean
    or causal mask). In floats the two forms agree wherever a row keeps an element whose logit is above
    ``MASKED`` (``exp(MASKED - m)`` is 0); over the reals (the verifier's semantics) only this form gives the
    masked elements no weight at all, so only here can a kernel skip a tile the mask sets entirely false. A
    row the mask sets entirely false is ``0 / 0`` here (NaN), the uniform average of V in the other form; a row
    whose kept logits all lie more than ~80 (fp32; ~700 in float64) below ``MASKED`` underflows to ``0 / 0``
    here (the row max is ``MASKED``), where SDPA's ``-inf`` fill keeps it finite."""
    s = g.matmul(q, k)
    if cap is not None:
        s = g.scale(g.apply(act, [g.scale(s, 1.0 / cap)]), cap)
    c = g.where(mask, s, g.shift(g.scale(s, 0.0), MASKED))
    e = g.exp(g.sub(c, g.max(c, axis=2)))
    if zero_masked:
        e = g.where(mask, e, g.scale(c, 0.0))
    return g.matmul(g.div(e, g.sum(e, axis=2)), v)


def rotary(g: Graph, x: Tensor, cos: Tensor, sin: Tensor, *, sign: float = -1.0) -> Tensor:
    """Rotary embedding of ``x`` (..., D): ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) =
    concat(sign * x2, x1)`` (``sign = -1`` is the real one)."""
    d = x.type.shape[-1]
    ax = x.type.rank - 1
    x1, x2 = g.slice(x, ax, 0, d // 2), g.slice(x, ax, d // 2, d)
    rot = g.concat([g.scale(x2, sign) if sign != -1.0 else g.neg(x2), x1], axis=ax)
    return g.add(g.mul(x, cos), g.mul(rot, sin))


def layer_norm(g: Graph, x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last axis: ``(x - mean) * rsqrt(var + eps) * gamma + beta``."""
    ax = x.type.rank - 1
    xc = g.sub(x, g.mean(x, axis=ax))
    var = g.mean(g.square(xc), axis=ax)
    return g.add(g.mul(g.mul(xc, g.rsqrt(g.shift(var, eps))), gamma), beta)


def gelu_exact(g: Graph, x: Tensor) -> Tensor:
    """``0.5 x (1 + erf(x / sqrt 2))`` (torch's default GELU)."""
    return g.mul(g.scale(x, 0.5), g.shift(g.erf(g.scale(x, INV_SQRT2)), 1.0))


def group_norm(g: Graph, x: Tensor, groups: int, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    """GroupNorm of ``x`` (N, C, L): mean and centred variance per group of C / groups channels (a reshape to
    (N, groups, C / groups * L) and back), then a per-channel scale and shift (gamma, beta: (C, 1))."""
    n, c, ln = x.type.shape
    y = g.reshape(x, (n, groups, c // groups * ln))
    yc = g.sub(y, g.mean(y, axis=2))
    y = g.mul(yc, g.rsqrt(g.shift(g.mean(g.square(yc), axis=2), eps)))
    return g.add(g.mul(g.reshape(y, (n, c, ln)), gamma), beta)


def batch_norm_inference(g: Graph, x: Tensor, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor,
                         eps: float = 1e-5) -> Tensor:
    """BatchNorm in inference: per-channel ``(x - mean) * rsqrt(var + eps) * gamma + beta``."""
    return g.add(g.mul(g.mul(g.sub(x, mean), g.rsqrt(g.shift(var, eps))), gamma), beta)


def mish(g: Graph, x: Tensor) -> Tensor:
    """``x * tanh(softplus(x))``."""
    return g.mul(x, g.tanh(g.softplus(x)))


def hardswish(g: Graph, x: Tensor) -> Tensor:
    """``x * relu6(x + 3) / 6``."""
    return g.mul(x, g.scale(g.clamp(g.shift(x, 3.0), 0.0, 6.0), 1.0 / 6.0))


# --------------------------------------------------------------------------- the programs


def _group_norm(small: bool, dt: DType) -> Graph:
    n, c, ln, groups = (2, 32, 16, 8) if small else (16, 512, 1024, 32)
    g = Graph()
    x = g.input("X", (n, c, ln), dt)
    gamma, beta = g.input("G", (c, 1), dt), g.input("B", (c, 1), dt)
    g.output(group_norm(g, x, groups, gamma, beta))
    return g


def _batch_norm(small: bool, dt: DType) -> Graph:
    n, c, hw = (2, 16, 64) if small else (32, 256, 3136)
    g = Graph()
    x = g.input("X", (n, c, hw), dt)
    mean, var = g.input("MEAN", (c, 1), dt), g.input("VAR", (c, 1), dt)
    gamma, beta = g.input("G", (c, 1), dt), g.input("B", (c, 1), dt)
    g.output(g.relu(batch_norm_inference(g, x, mean, var, gamma, beta)))
    return g


def _activations(small: bool, dt: DType) -> Graph:
    m, k, n = (16, 32, 32) if small else (16, 4096, 4096)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w = g.input("W", (k, n), dt)
    h = g.matmul(x, w)
    g.output(mish(g, h), hardswish(g, h), g.mul(h, g.sigmoid(h)))
    return g



#: tokens of the prefill / training-step variants of the vocabulary programs (issue 22's "512-4096 for prefill": a
#: loss or a log-probability over every position of a 2048-token sequence, Llama-2's 32,000-entry vocabulary)
PREFILL_TOKENS = 2048


def _lse(small: bool, dt: DType, tokens: int = 16) -> Graph:
    b, v = (4, 64) if small else (tokens, 32000)
    g = Graph()
    x = g.input("X", (b, v), dt)
    g.output(logsumexp(g, x, 1))
    return g


def _log_softmax(small: bool, dt: DType, tokens: int = 16) -> Graph:
    b, v = (4, 64) if small else (tokens, 32000)
    g = Graph()
    x = g.input("X", (b, v), dt)
    g.output(log_softmax(g, x, 1))
    return g


def _cross_entropy(small: bool, dt: DType, tokens: int = 16) -> Graph:
    b, v = (4, 64) if small else (tokens, 32000)
    g = Graph()
    x = g.input("X", (b, v), dt)
    t = g.input("T", (b, v), dt)  # one-hot targets
    g.output(cross_entropy(g, x, t))
    return g


def _lse_prefill(small: bool, dt: DType) -> Graph:
    return _lse(small, dt, PREFILL_TOKENS)


def _log_softmax_prefill(small: bool, dt: DType) -> Graph:
    return _log_softmax(small, dt, PREFILL_TOKENS)


def _cross_entropy_prefill(small: bool, dt: DType) -> Graph:
    return _cross_entropy(small, dt, PREFILL_TOKENS)


def _attn_inputs(g: Graph, small: bool, dt: DType) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    h, n, d = (2, 16, 16) if small else (16, 1024, 64)
    q = g.input("Q", (h, n, d), dt)
    k = g.input("K", (h, d, n), dt)
    v = g.input("V", (h, n, d), dt)
    m = g.input("M", (1, n, n), bool_)  # the causal mask (lower triangle true)
    return q, k, v, m


def _causal_inputs(g: Graph, small: bool, dt: DType) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Q, K^T, V and the causal mask as a constant (``tril_mask``: a kernel may skip its tiles above the
    diagonal, verified; see :mod:`verimirage.rewrite.causal`)."""
    h, n, d = (2, 64, 16) if small else (16, 1024, 64)
    q = g.input("Q", (h, n, d), dt)
    k = g.input("K", (h, d, n), dt)
    v = g.input("V", (h, n, d), dt)
    return q, k, v, g.tril_mask((1, n, n))


def _causal(small: bool, dt: DType) -> Graph:
    g = Graph()
    g.output(masked_attention(g, *_causal_inputs(g, small, dt), zero_masked=True))
    return g


def _softcap(small: bool, dt: DType) -> Graph:
    g = Graph()
    g.output(masked_attention(g, *_causal_inputs(g, small, dt), cap=50.0, zero_masked=True))
    return g


def _rotary(small: bool, dt: DType) -> Graph:
    h, n, d = (2, 16, 16) if small else (16, 1024, 64)
    g = Graph()
    q = g.input("Q", (h, n, d), dt)
    k = g.input("K", (h, n, d), dt)
    v = g.input("V", (h, n, d), dt)
    cos = g.input("COS", (n, d), dt)
    sin = g.input("SIN", (n, d), dt)
    qr, kr = rotary(g, q, cos, sin), rotary(g, k, cos, sin)
    s = g.matmul(qr, g.transpose(kr, 1, 2))
    s = g.sub(s, g.max(s, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def _layernorm_linear(small: bool, dt: DType) -> Graph:
    m, k, n = (16, 64, 32) if small else (16, 4096, 4096)
    g = Graph()
    x = g.input("X", (m, k), dt)
    gamma, beta = g.input("G", (k,), dt), g.input("B", (k,), dt)
    w = g.input("W", (k, n), dt)
    g.output(g.matmul(layer_norm(g, x, gamma, beta), w))
    return g


def _gelu_mlp(small: bool, dt: DType) -> Graph:
    m, k, h = (16, 32, 64) if small else (16, 4096, 16384)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w1, w2 = g.input("W1", (k, h), dt), g.input("W2", (h, k), dt)
    g.output(g.matmul(gelu_exact(g, g.matmul(x, w1)), w2))
    return g


def _geglu(small: bool, dt: DType) -> Graph:
    m, k, h = (16, 32, 64) if small else (16, 4096, 11008)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w1, w2 = g.input("W1", (k, h), dt), g.input("W2", (k, h), dt)
    g.output(g.mul(gelu_exact(g, g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _swiglu_ffn(small: bool, dt: DType) -> Graph:
    # Llama-3-8B / Mistral-7B: hidden 4096, intermediate 14336 (3.5x), 16 decode tokens
    m, k, h = (16, 32, 64) if small else (16, 4096, 14336)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w1, w3, w2 = g.input("W1", (k, h), dt), g.input("W3", (k, h), dt), g.input("W2", (h, k), dt)
    g.output(g.matmul(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w3)), w2))
    return g


def _residual_rmsnorm(small: bool, dt: DType) -> Graph:
    # the pre-norm residual stream of a prefill of 2048 tokens (Llama-3-8B hidden 4096): h = x + r, rmsnorm(h) * w
    m, d = (16, 64) if small else (2048, 4096)
    g = Graph()
    x, r = g.input("X", (m, d), dt), g.input("R", (m, d), dt)
    w = g.input("W", (d,), dt)
    h = g.add(x, r)
    g.output(h, g.rms_norm(h, w, eps=1e-6))
    return g


def _qkv_bias(small: bool, dt: DType) -> Graph:
    # Qwen2-7B: hidden 3584, 28 query heads and 4 KV heads of 128 -> 3584 + 2 * 512 = 4608 outputs, with bias
    m, k, n = (16, 64, 96) if small else (16, 3584, 4608)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w, b = g.input("W", (k, n), dt), g.input("BIAS", (n,), dt)
    g.output(g.add(g.matmul(x, w), b))
    return g


def _decode_gqa(small: bool, dt: DType) -> Graph:
    # Llama-3-8B decode: 8 KV heads, 4 query heads each, head dim 128, a 16k KV cache; max-shifted softmax
    h, n, d, kv = (2, 4, 16, 128) if small else (8, 4, 128, 16384)
    g = Graph()
    q = g.input("Q", (h, n, d), dt)
    k = g.input("K", (h, d, kv), dt)
    v = g.input("V", (h, kv, d), dt)
    g.output(attention(g, q, k, v, stable=True))
    return g


def _bias_attention(small: bool, dt: DType) -> Graph:
    # prefill with an additive bias on the logits (ALiBi / T5 relative position), 16 heads, 1024 tokens, dim 64
    h, n, d = (2, 16, 16) if small else (16, 1024, 64)
    g = Graph()
    q = g.input("Q", (h, n, d), dt)
    k = g.input("K", (h, d, n), dt)
    v = g.input("V", (h, n, d), dt)
    bias = g.input("BIAS", (h, n, n), dt)
    s = g.add(g.matmul(q, k), bias)
    s = g.sub(s, g.max(s, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def _lora_scaled(small: bool, dt: DType) -> Graph:
    # a LoRA adapter of rank 16 on a 4096x4096 projection, scaled by alpha / r = 2, 16 decode tokens
    m, k, n, r = (16, 32, 64, 16) if small else (16, 4096, 4096, 16)
    g = Graph()
    x = g.input("X", (m, k), dt)
    w = g.input("W", (k, n), dt)
    a, b = g.input("A", (k, r), dt), g.input("B", (r, n), dt)
    g.output(g.add(g.matmul(x, w), g.scale(g.matmul(g.matmul(x, a), b), 2.0)))
    return g


def relu_chain(layers: int, m: int = 16, d: int = 256, dtype: DType = float16) -> Graph:
    """``relu(... relu(x @ W0) ... @ W{layers-1})``: the program-length probe of the region search."""
    g = Graph()
    h = g.input("x", (m, d), dtype)
    for w in [g.input(f"w{i}", (d, d), dtype) for i in range(layers)]:
        h = g.relu(g.matmul(h, w))
    g.output(h)
    return g


@dataclass(frozen=True)
class Model:
    """One models-section program."""

    name: str
    build: Callable[[bool, DType], Graph]
    source: str


_MODELS = [
    Model("logsumexp", _lse, "logsumexp over a 32k vocabulary, max-shifted"),
    Model("log_softmax", _log_softmax, "log-softmax over a 32k vocabulary"),
    Model("cross_entropy", _cross_entropy, "cross-entropy with one-hot targets, mean over rows"),
    Model("logsumexp_prefill", _lse_prefill, "logsumexp over a 32k vocabulary for 2048 tokens (prefill / training)"),
    Model("log_softmax_prefill", _log_softmax_prefill, "log-softmax over a 32k vocabulary for 2048 tokens"),
    Model("cross_entropy_prefill", _cross_entropy_prefill,
          "cross-entropy with one-hot targets over 2048 tokens x 32k vocabulary (a training step's loss)"),
    Model("causal_attention", _causal, "attention with a causal mask (a constant tril_mask; masked weights exactly 0)"),
    Model("softcap_attention", _softcap, "causal attention with tanh soft-capping of the logits (cap 50)"),
    Model("rotary_attention", _rotary, "rotary embedding of Q and K (slice, negate, concat, cos/sin) then attention"),
    Model("layernorm_linear", _layernorm_linear, "LayerNorm (centred variance, gamma, beta) then a Linear"),
    Model("gelu_mlp", _gelu_mlp, "MLP with exact (erf) GELU"),
    Model("geglu", _geglu, "GeGLU: gelu(X W1) * (X W2)"),
    Model("group_norm", _group_norm, "GroupNorm: reshape to groups, mean and centred variance, per-channel affine"),
    Model("batchnorm_relu", _batch_norm, "BatchNorm in inference (per-channel scale and shift) then ReLU"),
    Model("activations", _activations, "a Linear then mish, hardswish and x * sigmoid(x) (SiLU written out)"),
    Model("swiglu_ffn", _swiglu_ffn, "SwiGLU FFN with the down projection, (silu(X W1) * X W3) W2, 16x4096, 14336"),
    Model("residual_rmsnorm", _residual_rmsnorm,
          "fused residual add + RMSNorm with weight, both outputs (the stream and the normed), 2048x4096"),
    Model("qkv_bias", _qkv_bias, "QKV projection with bias (Qwen2-7B GQA: 3584 -> 4608), 16 tokens"),
    Model("decode_gqa", _decode_gqa, "GQA decode over a 16k KV cache: 8 KV heads x 4 queries, head dim 128"),
    Model("bias_attention", _bias_attention, "prefill attention with an additive bias on the logits (ALiBi-like)"),
    Model("lora_scaled", _lora_scaled, "LoRA of rank 16 with scale alpha / r = 2 on a 4096x4096 projection"),
]
MODELS: dict[str, Model] = {m.name: m for m in _MODELS}


def model_names() -> list[str]:
    """Names of the models-section programs."""
    return list(MODELS)


def get_model(name: str, small: bool = False, dtype: DType = float16) -> Graph:
    """The models-section program ``name`` (full size, or ``small`` for the CPU interpreter)."""
    if name not in MODELS:
        raise GraphError(f"benchmarks: unknown model {name!r}; expected one of {model_names()}")
    g = MODELS[name].build(small, dtype)
    g.check()
    return g
