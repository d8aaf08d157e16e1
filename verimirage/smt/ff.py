"""Finite-field semantics of every registry op (domain ``"ff"``) and the randomized equivalence test.

Values
------
A tensor's finite-field value is an int64 array with one extra *leading* axis
of size 2 or 1. With size 2, ``v[0]`` holds residues mod ``p`` and ``v[1]``
residues mod ``q``, where ``q`` is a prime dividing ``p - 1`` (we use safe
primes ``p = 2q + 1``, ``2**20 <= p < 2**21``). The pair is the fingerprint of
a real value under the ring maps to Z_p and Z_q. ``v[1] == -1`` marks a q-part
that has no meaning (see exp). A leading axis of size **1** is the compact form
of "no element has a meaningful q-part" (the same value as a size-2 array whose
``v[1]`` is all -1); it is what ``exp`` returns, and it lets every op skip the
q-part work that could never be used.

Op meanings
-----------
* ``add, sub, mul, neg, square, scale, shift, matmul, sum, mean``: ring
  operations in both parts; constants ``c`` are exact rationals
  (:func:`verimirage.smt.consts.const_fraction`) mapped into Z_p and Z_q.
* ``div``: multiplication by the modular inverse; **division by zero is defined
  as multiplication by 0** (the inverse of 0 is taken to be 0), in each part.
* ``exp(x) = g ** (x mod q) mod p`` with ``g`` of order ``q`` in Z_p*, so
  ``exp(a + b) = exp(a) * exp(b)`` holds exactly (a table of ``g**k`` for k in
  [0, q), built once per field and cached). The result has no meaningful
  q-part. If ``exp`` is applied to a value whose q-part has no meaning (e.g.
  ``exp(exp(x))``), the field records a *q-violation* and the test can only
  answer Unknown.
* ``silu, gelu, relu, sqrt``: per-trial random functions (a keyed 64-bit mix)
  of the p-residue of the argument, giving both parts of the result.
  ``rsqrt(x)`` is the inverse of ``sqrt(x)`` (so ``rsqrt = 1/sqrt`` exactly).
  ``rms_norm(x) = x * rsqrt(mean(x*x) + eps)`` with that ``rsqrt`` (times the weight).
* ``max``, ``maximum``: a genuine total order on values: lexicographic on
  (p-residue, q-part), a meaningless q-part counting as the smallest. It is
  associative, commutative and idempotent, so a tiled max equals the flat max,
  and programs that subtract *some* max before ``exp`` (stable softmax, online
  softmax) test equal to the unshifted ones, as they are in real arithmetic.
* ``concat``, ``transpose``: data movement.

p-only mode
-----------
When neither program applies ``exp`` (nor ``rescaled_sum``, which does), no
q-part can ever reach an exp, so the test runs in *p-only* mode: inputs get no
q-part and every value is p-only. The p-part computation is unchanged, and the
stated bound (which divides by the smaller prime q) still holds: it bounds the
p-part polynomial identity test alone.

Matmuls are exact: residues in [0, p) are multiplied with float64 BLAS in
chunks of at most 2048 along the contraction dim, so every partial sum is an
integer below 2**53; the p- and q-parts go through one batched BLAS call.

Speed
-----
For a search, :class:`FFReference` evaluates the *target* once per trial (seed)
and keeps its outputs, so each candidate costs one program evaluation per
trial; exp tables are cached per field. See ``verimirage/smt/PERF.md``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs
from ..ir.interpret import run
from ..ir.ops import OPS, Prop, TensorType, batched_matmul, implements, neg_axis
from .consts import const_fraction

log = logging.getLogger(__name__)

P_MAX = 1 << 21
#: contraction chunk: (P_MAX - 1)**2 * 2048 < 2**53, so float64 partial sums of residue products are exact
_CHUNK = 1 << 11
#: per trial, the target's inputs are kept by :class:`FFReference` when they take at most this many bytes
INPUT_CACHE_BYTES = 24 << 20


def _sieve(n: int) -> np.ndarray:
    s = np.ones(n, dtype=bool)
    s[:2] = False
    for i in range(2, int(n**0.5) + 1):
        if s[i]:
            s[i * i :: i] = False
    return s


_SAFE: np.ndarray | None = None


def safe_primes() -> np.ndarray:
    """Safe primes p = 2q + 1 (q prime) with 2**20 <= p < 2**21."""
    global _SAFE
    if _SAFE is None:
        s = _sieve(P_MAX)
        qs = np.nonzero(s[: P_MAX // 2])[0]
        ps = 2 * qs + 1
        ok = (ps < P_MAX) & (ps >= P_MAX // 2)
        ps = ps[ok]
        _SAFE = ps[s[ps]]
    return _SAFE


@lru_cache(maxsize=16)
def _exp_table(p: int, q: int, g: int) -> np.ndarray:
    """``g**k mod p`` for k in [0, q) (read-only; cached per field)."""
    b = 1024
    small = np.empty(b, dtype=np.int64)
    acc = 1
    for i in range(b):
        small[i] = acc
        acc = acc * g % p
    gb = acc
    nb = q // b + 1
    big = np.empty(nb, dtype=np.int64)
    acc = 1
    for i in range(nb):
        big[i] = acc
        acc = acc * gb % p
    t = (big[:, None] * small[None, :] % p).reshape(-1)[:q].copy()
    t.flags.writeable = False
    return t


@dataclass
class Field:
    """One trial's field: primes ``p``, ``q`` (q | p-1), generator ``g`` of order ``q``, oracle key.

    ``p_only``: values carry no q-part (see the module docstring); ``q_violations`` counts
    elements where exp met a meaningless q-part.
    """

    p: int
    q: int
    g: int
    key: int
    q_violations: int = 0
    p_only: bool = False

    @classmethod
    def from_seed(cls, seed: int, *, p_only: bool = False) -> Field:
        """The field a trial seed determines (prime, generator and oracle key)."""
        p, q, g, key = _field_params(int(seed))
        return cls(p, q, g, key, p_only=p_only)

    def exp_table(self) -> np.ndarray:
        """``g**k mod p`` for k in [0, q) (cached per field)."""
        return _exp_table(self.p, self.q, self.g)

    def const(self, c: Fraction) -> tuple[int, int]:
        """The residues of rational ``c`` mod p and mod q (denominator 0 mod a prime: residue 0)."""
        return _const_res(c, self.p, self.q)


@lru_cache(maxsize=256)
def _field_params(seed: int) -> tuple[int, int, int, int]:
    rng = np.random.default_rng(seed)
    ps = safe_primes()
    p = int(ps[rng.integers(len(ps))])
    q = (p - 1) // 2
    while True:
        h = int(rng.integers(2, p - 1))
        g = pow(h, 2, p)
        if g != 1:
            break
    key = int(rng.integers(1, 1 << 62))
    return p, q, g, key


@lru_cache(maxsize=4096)
def _const_res(c: Fraction, p: int, q: int) -> tuple[int, int]:
    def res(m: int) -> int:
        d = c.denominator % m
        return c.numerator * (pow(d, -1, m) if d else 0) % m

    return res(p), res(q)


_FIELD: contextvars.ContextVar[Field | None] = contextvars.ContextVar("verimirage_ff_field", default=None)


def current_field() -> Field:
    """The field of the finite-field evaluation in progress."""
    f = _FIELD.get()
    if f is None:
        raise GraphError("ff domain: no field is active; evaluate through verimirage.smt.ff.FFDomain")
    return f


class FFDomain:
    """The finite-field domain for :func:`verimirage.ir.interpret.run` (one field per instance)."""

    name = "ff"

    def __init__(self, fld: Field) -> None:
        self.field = fld

    def apply(
        self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType], out_type: TensorType
    ) -> Any:
        fn = OPS[op].domains.get("ff")
        if fn is None:
            raise GraphError(f"op {op!r} has no meaning in the 'ff' domain")
        tok = _FIELD.set(self.field)
        try:
            return fn(args, attrs, in_types, [out_type])
        finally:
            _FIELD.reset(tok)


# --------------------------------------------------------------------------- helpers


def _has_q(x: np.ndarray) -> bool:
    return x.shape[0] == 2


def with_q(x: np.ndarray) -> np.ndarray:
    """``x`` in the size-2 form (a p-only value gets the q-part -1 everywhere)."""
    if x.shape[0] == 2:
        return x
    out = np.empty((2, *x.shape[1:]), dtype=np.int64)
    out[0] = x[0]
    out[1] = -1
    return out


def _empty(parts: int, *shapes: tuple[int, ...]) -> np.ndarray:
    return np.empty((parts, *np.broadcast_shapes(*shapes)), dtype=np.int64)


def _mark_bad(out_q: np.ndarray, *qs: np.ndarray) -> None:
    """Set ``out_q`` to -1 wherever any operand's q-part is meaningless (-1)."""
    bad = qs[0] < 0
    for x in qs[1:]:
        bad = bad | (x < 0)
    if bad.any():
        out_q[np.broadcast_to(bad, out_q.shape)] = -1


def _inv(x: np.ndarray, m: int) -> np.ndarray:
    """Modular inverse elementwise (x**(m-2)); the inverse of 0 is 0 (documented)."""
    r = np.ones_like(x)
    b = x % m
    e = m - 2
    while e:
        if e & 1:
            r = r * b % m
        b = b * b % m
        e >>= 1
    return r


def _mix(x: np.ndarray, key: int, salt: int) -> np.ndarray:
    """A keyed 64-bit mixing function (splitmix64 finaliser) of non-negative ints."""
    z = x.astype(np.uint64) + np.uint64((key ^ (salt * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


_SALT = {"silu": 1, "gelu": 2, "relu": 3, "sqrt": 4}


def _oracle(name: str, x: np.ndarray) -> np.ndarray:
    f = current_field()
    z = _mix(x[0], f.key, _SALT[name])
    out = np.empty((1 if f.p_only else 2, *x.shape[1:]), dtype=np.int64)
    out[0] = z % np.uint64(f.p)
    if not f.p_only:
        out[1] = (z >> np.uint64(21)) % np.uint64(f.q)
    return out


def _scale_by(x: np.ndarray, c: Fraction) -> np.ndarray:
    f = current_field()
    cp, cq = f.const(c)
    out = np.empty_like(x)
    np.multiply(x[0], cp, out=out[0])
    out[0] %= f.p
    if _has_q(x):
        np.multiply(x[1], cq, out=out[1])
        out[1] %= f.q
        _mark_bad(out[1], x[1])
    return out


# --------------------------------------------------------------------------- op meanings


def _ring(kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    f = current_field()
    parts = 2 if _has_q(a) and _has_q(b) else 1
    out = _empty(parts, a.shape[1:], b.shape[1:])
    if kind == "div":
        np.multiply(a[0], _inv(b[0], f.p), out=out[0])
    else:
        _UFUNC[kind](a[0], b[0], out=out[0])
    out[0] %= f.p
    if parts == 2:
        if kind == "div":
            np.multiply(a[1], _inv(np.maximum(b[1], 0), f.q), out=out[1])
        else:
            _UFUNC[kind](a[1], b[1], out=out[1])
        out[1] %= f.q
        _mark_bad(out[1], a[1], b[1])
    return out


_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _binop(kind: str):
    def fn(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
        return _ring(kind, args[0], args[1])

    return fn


for _k in ("add", "sub", "mul", "div"):
    implements("ff", _k)(_binop(_k))


@implements("ff", "maximum")
def _ff_maximum(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    a, b = args
    if not _has_q(a) and not _has_q(b):
        return np.maximum(a, b)  # equal p-residues are equal values here
    a, b = with_q(a), with_q(b)
    # lexicographic order on (p-residue, q-part), an invalid q-part (-1) being the smallest
    take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] >= b[1]))
    return np.where(take_a, a, b)


@implements("ff", "neg")
def _ff_neg(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _scale_by(args[0], Fraction(-1))


@implements("ff", "square")
def _ff_square(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _ring("mul", args[0], args[0])


@implements("ff", "scale")
def _ff_scale(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _scale_by(args[0], const_fraction(attrs["c"]))


def _shift_by(x: np.ndarray, c: Fraction) -> np.ndarray:
    f = current_field()
    cp, cq = f.const(c)
    out = np.empty_like(x)
    np.add(x[0], cp, out=out[0])
    out[0] %= f.p
    if _has_q(x):
        np.add(x[1], cq, out=out[1])
        out[1] %= f.q
        _mark_bad(out[1], x[1])
    return out


@implements("ff", "shift")
def _ff_shift(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _shift_by(args[0], const_fraction(attrs["c"]))


@implements("ff", "exp")
def _ff_exp(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    x = args[0]
    if not _has_q(x):
        f.q_violations += int(x[0].size)
        return np.ones((1, *x.shape[1:]), dtype=np.int64)
    xq = x[1]
    bad = xq < 0
    if bad.any():
        f.q_violations += int(bad.sum())
        xq = np.maximum(xq, 0)
    return f.exp_table()[xq][None]


for _u in ("silu", "gelu", "relu", "sqrt"):
    implements("ff", _u)(lambda args, attrs, it, ot, _n=_u: _oracle(_n, args[0]))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    f = current_field()
    s = _oracle("sqrt", x)
    s[0] = _inv(s[0], f.p)
    if _has_q(s):
        s[1] = _inv(s[1], f.q)
    return s


@implements("ff", "rsqrt")
def _ff_rsqrt(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _rsqrt(args[0])


def _reduce_sum(x: np.ndarray, ax: int) -> np.ndarray:
    f = current_field()
    pv = x[0].sum(axis=ax, keepdims=True)
    out = np.empty((x.shape[0], *pv.shape), dtype=np.int64)
    np.remainder(pv, f.p, out=out[0])
    if _has_q(x):
        ok = (x[1] >= 0).all(axis=ax, keepdims=True)
        if ok.all():
            np.remainder(x[1].sum(axis=ax, keepdims=True), f.q, out=out[1])
        else:
            out[1] = np.where(ok, np.maximum(x[1], 0).sum(axis=ax, keepdims=True) % f.q, -1)
    return out


@implements("ff", "sum")
def _ff_sum(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _reduce_sum(args[0], neg_axis(attrs["axis"], in_types[0].rank))


@implements("ff", "mean")
def _ff_mean(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    ax = attrs["axis"]
    s = _reduce_sum(args[0], neg_axis(ax, in_types[0].rank))
    return _scale_by(s, Fraction(1, in_types[0].shape[ax]))


@implements("ff", "max")
def _ff_max(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    x = args[0]
    ax = neg_axis(attrs["axis"], in_types[0].rank)
    if not _has_q(x):
        return x.max(axis=ax, keepdims=True)
    # order: p-residue, then q-part (so the result does not depend on the order of the elements)
    key = x[0] * (f.q + 1) + (x[1] + 1)
    i = np.expand_dims(np.argmax(key, axis=ax), ax)
    return np.stack([np.take_along_axis(x[0], i, ax), np.take_along_axis(x[1], i, ax)])


def _matmul_mod(af: np.ndarray, bf: np.ndarray, mods: Sequence[int]) -> np.ndarray:
    """Exact ``af @ bf`` reduced mod ``mods[i]`` along the leading axis; operands are float64 residues
    in [0, max(mods)) with max(mods) <= 2**21, so each chunk's float64 sums are exact integers."""
    k = af.shape[-1]
    out: np.ndarray | None = None
    for s in range(0, k, _CHUNK):
        if k <= _CHUNK:
            part = batched_matmul(af, bf)
        else:
            part = batched_matmul(af[..., s : s + _CHUNK], bf[..., s : s + _CHUNK, :])
        pi = part.astype(np.int64)
        out = pi if out is None else out + pi
        if (s // _CHUNK) % 512 == 511:  # keep the int64 sum of chunk results below 2**63
            for i, m in enumerate(mods):
                out[i] %= m
    assert out is not None
    for i, m in enumerate(mods):
        out[i] %= m
    return out


def _modmatmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact ``a @ b mod m`` of int residue arrays (m <= 2**21)."""
    return _matmul_mod(np.asarray(a % m, dtype=np.float64)[None], np.asarray(b % m, dtype=np.float64)[None], (m,))[0]


@implements("ff", "matmul")
def _ff_matmul(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    a, b = args
    if a.ndim != b.ndim:  # align batch dims after the leading (p, q) axis
        r = max(a.ndim, b.ndim)
        a = a.reshape(a.shape[:1] + (1,) * (r - a.ndim) + a.shape[1:])
        b = b.reshape(b.shape[:1] + (1,) * (r - b.ndim) + b.shape[1:])
    if not (_has_q(a) and _has_q(b)):
        return _matmul_mod(a[:1].astype(np.float64), b[:1].astype(np.float64), (f.p,))
    a_bad = a[1] < 0
    b_bad = b[1] < 0
    any_a, any_b = bool(a_bad.any()), bool(b_bad.any())
    af = a.astype(np.float64)
    bf = b.astype(np.float64)
    if any_a:
        np.maximum(af[1], 0, out=af[1])
    if any_b:
        np.maximum(bf[1], 0, out=bf[1])
    out = _matmul_mod(af, bf, (f.p, f.q))
    if any_a or any_b:
        bad = a_bad.any(axis=-1)[..., :, None] | b_bad.any(axis=-2)[..., None, :]
        out[1][np.broadcast_to(bad, out[1].shape)] = -1
    return out


@implements("ff", "rms_norm")
def _ff_rms(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    x = args[0]
    rank = in_types[0].rank
    ax = attrs["axis"]
    sq = _ring("mul", x, x)
    ms = _scale_by(_reduce_sum(sq, neg_axis(ax, rank)), Fraction(1, in_types[0].shape[ax]))
    ms = _shift_by(ms, const_fraction(attrs["eps"]))
    y = _ring("mul", x, _rsqrt(ms))
    if len(args) == 2:
        w = args[1]
        nax = neg_axis(ax, rank)
        w = w.reshape(w.shape + (1,) * (-nax - 1))
        y = _ring("mul", y, w)
    return y


@implements("ff", "concat")
def _ff_concat(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    r = in_types[0].rank
    ax = neg_axis(attrs["axis"], r)
    if any(_has_q(a) for a in args) and not all(_has_q(a) for a in args):
        args = [with_q(a) for a in args]
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - r] for a in args))
    full = [np.broadcast_to(a, batch + a.shape[a.ndim - r :]) for a in args]
    return np.concatenate(full, axis=ax)


@implements("ff", "transpose")
def _ff_transpose(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    r = in_types[0].rank
    return np.swapaxes(args[0], neg_axis(attrs["a"], r), neg_axis(attrs["b"], r))


# --------------------------------------------------------------------------- the randomized test


def degree_bound(g: Graph) -> tuple[int, int]:
    """(degree, opaque) for the stated bound: a rational-function degree bound of the outputs and the
    number of exp / nonlinear-unary nodes, treating each such node's result as a fresh variable."""
    deg_opaque = [0, 0]

    def walk(nodes: Sequence[Any], in_deg: list[int]) -> list[int]:
        d: list[int] = []
        for n in nodes:
            a = [d[i] for i, _ in n.args]
            if n.op in ("input", "arg"):
                idx = n.attr("arg") if n.op == "input" and n.attr("arg") is not None else n.attr("index")
                d.append(in_deg[idx] if idx is not None and idx < len(in_deg) else 1)
                continue
            if n.op == "custom":
                outs = walk(n.attr("block").nodes, a)
                d.append(max(outs) if outs else 1)
                continue
            if n.op == "fused":
                d.append(max(walk(n.attr("thread").nodes, a) or [1]))
                continue
            if n.op in ("exp", "silu", "gelu", "relu", "sqrt", "rsqrt"):
                deg_opaque[1] += 1
                deg_opaque[0] = max(deg_opaque[0], a[0])
                d.append(1)
            elif n.op in ("mul", "div", "matmul", "rescaled_sum"):
                d.append(sum(a) + (1 if n.op == "rescaled_sum" else 0))
            elif n.op == "square":
                d.append(2 * a[0])
            elif n.op == "rms_norm":
                deg_opaque[1] += 1
                d.append(sum(a) + 2 * a[0] + 1)
            else:
                d.append(max(a) if a else 1)
        return d

    nodes = node_list(g)
    ds = walk(nodes, [])
    out = max((ds[i] for i, _ in output_refs(g)), default=1)
    return max(out, deg_opaque[0]), deg_opaque[1]


@dataclass(frozen=True)
class FFResult:
    """Outcome of the finite-field test."""

    outcome: str  # "equal" | "differ" | "unknown"
    reason: str
    p: tuple[int, ...]
    q: tuple[int, ...]
    g: tuple[int, ...]
    seeds: tuple[int, ...]
    trials: int
    per_trial_bound: float
    bound: float
    seconds: float
    output: int | None = None
    index: tuple[int, ...] | None = None
    inputs: dict[str, np.ndarray] | None = None
    field_trial: int | None = None



def uses_exp(g: Graph) -> bool:
    """Whether ``g`` applies ``exp`` anywhere (``rescaled_sum`` does, inside block graphs)."""

    def walk(nodes: Sequence[Any]) -> bool:
        for n in nodes:
            if n.op in ("exp", "rescaled_sum"):
                return True
            if n.op == "custom" and walk(n.attr("block").nodes):
                return True
            if n.op == "fused" and walk(n.attr("thread").nodes):
                return True
        return False

    return walk(node_list(g))


def trial_inputs(g: Graph, fld: Field, seed: int, *, q_part: bool = True) -> dict[str, np.ndarray]:
    """Fresh uniform random residues for every input of ``g``, from ``seed``.

    The p-parts come from one stream and the q-parts from another (inputs in name order), so the
    p-parts are the same whether or not q-parts are made (``q_part=False``: p-only values).
    """
    rng_p = np.random.default_rng([seed, 0x5EED, 0])
    rng_q = np.random.default_rng([seed, 0x5EED, 1])
    vals = {}
    for t in sorted(g.inputs, key=lambda t: str(t.name)):
        v = np.empty((2 if q_part else 1, *tuple(t.shape)), dtype=np.int64)
        v[0] = rng_p.integers(0, fld.p, size=t.shape, dtype=np.int64)
        if q_part:
            v[1] = rng_q.integers(0, fld.q, size=t.shape, dtype=np.int64)
        vals[str(t.name)] = v
    return vals


def trials_needed(per_trial: float, target_log2: float = 60.0, minimum: int = 2) -> int:
    """Independent trials so that ``per_trial ** n <= 2**-target_log2``."""
    if per_trial >= 1:
        return 0
    return max(minimum, math.ceil(target_log2 / -math.log2(per_trial)))


def default_seeds(seed: int, n: int) -> tuple[int, ...]:
    """The first ``n`` trial seeds derived from ``seed`` (a prefix of one fixed stream)."""
    return tuple(int(s) for s in np.random.default_rng([seed, 0xF1E1D]).integers(0, 1 << 62, size=n))


def _first_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, ...] | None:
    """Index (with the leading part axis) of the first element where values differ, or None.

    p-residues are compared everywhere, q-parts where both are meaningful."""
    x0, y0 = np.broadcast_arrays(x[0], y[0])
    if not np.array_equal(x0, y0):
        i = np.argwhere(x0 != y0)[0]
        return (0, *tuple(int(v) for v in i))
    if _has_q(x) and _has_q(y):
        x1, y1 = np.broadcast_arrays(x[1], y[1])
        diff = (x1 != y1) & (x1 >= 0) & (y1 >= 0)
        if diff.any():
            return (1, *tuple(int(v) for v in np.argwhere(diff)[0]))
    return None


def _nbytes(g: Graph, parts: int) -> int:
    return sum(8 * parts * math.prod(t.shape) for t in g.inputs)


class FFReference:
    """A target program's finite-field evaluations, cached per trial seed, to test many candidates.

    Each candidate costs one evaluation per trial: the target's outputs (and, when small, its inputs)
    are computed once per seed and mode (p-only or not) and reused. Seeds are a fixed stream from
    ``seed``, so every candidate is tested on the same trials.
    """

    def __init__(self, target: Graph, *, seed: int = 0, target_log2: float = 60.0) -> None:
        self.target = target
        self.seed = seed
        self.target_log2 = target_log2
        self.degree, self.opaque = degree_bound(target)
        self.uses_exp = uses_exp(target)
        self._outs: dict[tuple[int, bool], tuple[list[np.ndarray], int]] = {}
        self._inputs: dict[tuple[int, bool], dict[str, np.ndarray]] = {}

    def inputs(self, s: int, fld: Field) -> dict[str, np.ndarray]:
        """The trial inputs for seed ``s`` in ``fld``'s mode (cached when small)."""
        key = (s, fld.p_only)
        ins = self._inputs.get(key)
        if ins is None:
            ins = trial_inputs(self.target, fld, s, q_part=not fld.p_only)
            if _nbytes(self.target, 1 if fld.p_only else 2) <= INPUT_CACHE_BYTES:
                self._inputs[key] = ins
        return ins

    def outputs(self, s: int, p_only: bool, inputs: Mapping[str, np.ndarray] | None = None
                ) -> tuple[list[np.ndarray], int]:
        """The target's outputs for seed ``s`` and its q-violation count (cached). ``inputs``: this
        trial's inputs when the caller already has them."""
        key = (s, p_only)
        r = self._outs.get(key)
        if r is None:
            fld = Field.from_seed(s, p_only=p_only)
            with np.errstate(over="ignore"):
                outs = run(self.target, inputs if inputs is not None else self.inputs(s, fld), FFDomain(fld))
            r = ([np.asarray(o) for o in outs], fld.q_violations)
            self._outs[key] = r
        return r

    def compare(self, cand: Graph, *, seeds: Sequence[int] | None = None, trials: int | None = None) -> FFResult:
        """Evaluate ``cand`` on the target's trials and compare every output (see :func:`ff_test`)."""
        return self._compare(cand, seeds, trials)

    def _compare(self, cand: Graph, seeds: Sequence[int] | None, trials: int | None) -> FFResult:
        t0 = time.perf_counter()
        db, ob = degree_bound(cand)
        deg = max(self.degree, db)
        opaque = self.opaque + ob
        q_min = int(safe_primes()[0] - 1) // 2
        per = min(1.0, (2 * deg + opaque + 1) / q_min)
        if seeds is None:
            n = trials if trials is not None else trials_needed(per, self.target_log2)
            seeds = default_seeds(self.seed, max(n, 1))
        seeds = tuple(int(s) for s in seeds)
        p_only = not (self.uses_exp or uses_exp(cand))
        ps: list[int] = []
        qs: list[int] = []
        gs: list[int] = []
        for ti, s in enumerate(seeds):
            fld = Field.from_seed(s, p_only=p_only)
            ps.append(fld.p)
            qs.append(fld.q)
            gs.append(fld.g)
            ins = self.inputs(s, fld)
            outs_a, viol_a = self.outputs(s, p_only, ins)
            with np.errstate(over="ignore"):
                outs_b = run(cand, ins, FFDomain(fld))
            common = dict(p=tuple(ps), q=tuple(qs), g=tuple(gs), seeds=seeds[: ti + 1], trials=ti + 1,
                          per_trial_bound=per)
            for k, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
                d = _first_difference(x, np.asarray(y))
                if d is not None:
                    idx = d[1:]
                    full = trial_inputs(self.target, Field.from_seed(s), s)
                    return FFResult("differ", f"output {k} differs at index {idx} in trial {ti} (p={fld.p}"
                                    f"{', q-part' if d[0] else ''})", bound=1.0, seconds=time.perf_counter() - t0,
                                    output=k, index=idx, inputs=full, field_trial=ti,
                                    **common)  # type: ignore[arg-type]
            viol = viol_a + fld.q_violations
            if viol:
                return FFResult("unknown", f"a program applies exp to a value with no meaningful q-part "
                                f"({viol} elements in trial {ti}): the exp algebra cannot be tested",
                                bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
        bound = per ** len(seeds)
        outcome = "equal" if per < 1 else "unknown"
        reason = (f"{len(seeds)} trial(s) equal{' (p-only: no exp)' if p_only else ''}; "
                  f"false-accept bound {bound:.3g}" if outcome == "equal"
                  else "degree too high for a meaningful bound")
        return FFResult(outcome, reason, tuple(ps), tuple(qs), tuple(gs), seeds, len(seeds), per, bound,
                        time.perf_counter() - t0)


def ff_test(
    a: Graph, b: Graph, *, seeds: Sequence[int] | None = None, seed: int = 0, trials: int | None = None,
    target_log2: float = 60.0, reference: FFReference | None = None,
) -> FFResult:
    """Evaluate ``a`` and ``b`` in fresh random fields on fresh random inputs; compare every output.

    The stated bound (per trial ``(2 * degree + opaque + 1) / q``, independent trials multiplied)
    models exp and the nonlinear unary ops as fresh random values (the model of Mirage's analysis).
    ``reference``: an :class:`FFReference` of ``a`` (same seed) whose cached outputs are reused.
    """
    if reference is None or reference.seed != seed or reference.target_log2 != target_log2 or (
            reference.target is not a and str(reference.target) != str(a)):
        reference = FFReference(a, seed=seed, target_log2=target_log2)
    return reference.compare(b, seeds=seeds, trials=trials)


def ff_domain_ops() -> list[str]:
    """Registry ops with an ff meaning (for tests)."""
    return sorted(n for n, o in OPS.items() if "ff" in o.domains and not o.has(Prop.STRUCTURAL))


def run_ff(g: Graph, inputs: Mapping[str, np.ndarray], fld: Field) -> list[np.ndarray]:
    """Evaluate ``g`` in field ``fld`` on ff input values (arrays with the leading (p, q) axis);
    outputs in the size-2 form (a meaningless q-part is -1)."""
    with np.errstate(over="ignore"):
        return [with_q(np.asarray(o)) for o in run(g, inputs, FFDomain(fld))]
