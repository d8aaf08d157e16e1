"""The reference finite-field evaluator: what the certificate checker runs.

Short and plain on purpose. The fast engine (:mod:`verimirage.smt.ff`: shared products, projections,
GPU products, fused exp, threads) is an accelerator for the search; it is tested against this module
value for value (tests/test_ffref.py). Nothing of it is used here; it reads its degree analysis from here
(:func:`quotient_info`, :func:`degree_bound`: one analysis, the checker's).

A value is one int64 array ``v`` of shape ``(2, *batch, *shape)``: ``v[0]`` holds the residues mod
``p``, ``v[1]`` the residues mod ``q``, or ``-1`` where the q-part has no meaning. The leading axis is
one more batch axis to the graph evaluator (:func:`verimirage.ir.interpret.run`), which does all data
movement (tiles, grids, for-loops, placing outputs) exactly as for float64.

Meanings (those documented in :mod:`verimirage.smt.ff`):

* the field of a trial seed: ``p = 2q + 1`` a safe prime in ``[2**20, 2**21)``, ``g = h**2 mod p != 1``
  (so ``g`` has order ``q``), a 62-bit oracle key;
* ``add, sub, mul, square, scale, shift, sum, mean, matmul``: the ring operations mod p and mod q;
  constants are exact rationals; ``div`` multiplies by the inverse, the inverse of 0 being 0;
* ``exp(x) = g ** (q-part of x) mod p``, with no meaningful q-part; exp of a meaningless q-part is a
  *violation* (counted; the trial then answers unknown);
* ``gelu, relu, sqrt``: a keyed random function (splitmix64) of the p-residue gives both parts;
  ``rsqrt`` is the inverse of ``sqrt``'s;
* ``sigmoid(x) = 1 / (1 + exp(-x))`` in the p-part, the q-part a keyed random function of the p-residue; both
  parts that function where the argument has no meaningful q-part (:func:`_sigmoid_op`);
* the composite ops (``rms_norm``, ``silu``, ``tanh``, ``neg``, ``transpose``, ``minimum``, ``min``, ``pow``'s exact
  exponents): their
  compositions (:data:`verimirage.ir.interpret.COMPOSITES`), e.g. ``tanh(x) = 2 sigmoid(2x) - 1`` in both parts;
* ``log``: the p-part is a keyed random function of the p-residue (as for ``gelu``); the q-part is the
  discrete log: ``k`` for a p-residue ``+-g**k``, meaningless for 0 (:func:`_log_table`); a program in
  which an exp reads a log's value is not tested (:func:`exp_after_log`: ``exp(log y)`` is ``+-y`` there);
* ``max, maximum``: the largest (p-residue, q-part) pair, a meaningless q-part being the smallest;
* ``concat``: data movement;
* a q-result is meaningless where an operand's is (for matmul: anywhere in the row or column read).

Exactness: residues are below ``2**21``, so an elementwise product is below ``2**42`` and a reduction of n
residues stays below ``2**63`` for any n an array can have (int64); matmuls are exact float64 products in
contraction chunks of ``2**11`` (:func:`_matmul`), both parts in one product.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache, lru_cache, reduce
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph, input_types, node_list, output_refs, output_types
from ..ir.interpret import expand, run
from ..ir.ops import LAYOUT_MEANINGS, OPAQUE, TensorType, get_op, neg_axis, opaque_key, reshape_groups, tril
from .consts import const_fraction
from .verdict import Outcome

P_MIN, P_MAX = 1 << 20, 1 << 21
#: the contraction chunk of :func:`_matmul` (2**11 products below 2**42 sum below 2**53)
CHUNK = 1 << 11
_QBITS = 21  # (p, q+1) packed as p << 21 | (q + 1) orders pairs lexicographically (q + 1 <= 2**20)


# --------------------------------------------------------------------------- fields


@cache
def safe_primes() -> tuple[int, ...]:
    """The safe primes ``p = 2q + 1`` (q prime) with ``2**20 <= p < 2**21``, ascending."""
    is_prime = np.ones(P_MAX, dtype=bool)
    is_prime[:2], is_prime[4::2] = False, False
    for i in range(3, math.isqrt(P_MAX) + 1, 2):  # (odd multiples only: the even ones are out already)
        if is_prime[i]:
            is_prime[i * i :: 2 * i] = False
    p = np.arange(P_MIN + 1, P_MAX, 2)
    return tuple(p[is_prime[p] & is_prime[(p - 1) // 2]].tolist())


@dataclass(frozen=True)
class Field:
    """One trial's field: primes ``p = 2q + 1``, ``g`` of order ``q`` mod p, oracle ``key``."""

    p: int
    q: int
    g: int
    key: int


def field_of(seed: int) -> Field:
    """The field a trial seed (an int in ``[0, 2**62)``) determines."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 1 << 62:
        raise GraphError(f"ffref: trial seed {seed!r}; expected an int in [0, 2**62)")
    rng = np.random.default_rng(seed)
    ps = safe_primes()
    p = ps[int(rng.integers(len(ps)))]
    q = (p - 1) // 2
    g = 1
    while g == 1:
        g = pow(int(rng.integers(2, p - 1)), 2, p)
    return Field(p, q, g, int(rng.integers(1, 1 << 62)))


@lru_cache(maxsize=2)
def _exp_table(f: Field) -> np.ndarray:
    """``g ** k mod p`` for every ``k`` in ``[0, q)`` (read-only; int32, half the cache footprint of int64):
    ``g ** (i * B + j) = (g ** B) ** i * g ** j`` for ``j < B = 2**10``."""
    b = 1 << 10
    low = np.array([pow(f.g, j, f.p) for j in range(b)], dtype=np.int64)
    high = np.array([pow(f.g, b * i, f.p) for i in range(-(-f.q // b))], dtype=np.int64)
    t = (high[:, None] * low[None, :] % f.p).reshape(-1)[: f.q].astype(np.int32)
    t.flags.writeable = False
    return t


@lru_cache(maxsize=2)
def _log_table(f: Field) -> np.ndarray:
    """The q-part of ``log`` for every p-residue: ``k`` at ``g**k`` and at ``-g**k`` (every nonzero residue is
    one of these: -1 is no power of g, whose order q is odd), ``-1`` (meaningless) at 0."""
    e = _exp_table(f)
    t = np.empty(f.p, dtype=np.int64)
    t[e] = t[f.p - e] = np.arange(f.q, dtype=np.int64)
    t[0] = -1
    t.flags.writeable = False
    return t


#: ops whose meaning reads an operand's q-part through exp (at kernel, block or thread level)
_EXP_READERS = frozenset({"exp", "sigmoid", "tanh", "silu", "rescaled_sum"})


def _subs(n: Any) -> list[Any]:
    """The programs node ``n`` holds (a custom kernel's block graph, a fused thread graph)."""
    return [v for _, v in n.attrs if hasattr(v, "nodes") and not isinstance(v, (str, bytes))]


def ops_in(g: Any) -> set[str]:
    """The ops ``g`` applies at any level (in its kernels' block graphs and their thread graphs)."""
    return {n.op for n in node_list(g)}.union(*(ops_in(s) for n in node_list(g) for s in _subs(n)))


def _log_flow(g: Any, taint_in: Sequence[bool]) -> tuple[bool, list[bool]]:
    """Whether an exp of ``g`` reads a value computed from a log, and which nodes' values are (``taint_in``:
    those of ``g``'s operands, by a block input's ``arg`` or a thread input's ``index``)."""
    tainted: list[bool] = []
    square: list[bool] = []  # values that are squares in the field (g**k): exp(log y) is y exactly for them
    for n in node_list(g):
        square.append(n.op in ("exp", "square") or (n.op in ("mul", "div", "reciprocal") and bool(n.args)
                                                     and all(square[a] for a, _ in n.args)))
        t = any(tainted[a] for a, _ in n.args)
        if n.op in ("input", "arg") and not n.args:
            k = n.attr("arg" if n.op == "input" else "index")
            t = isinstance(k, int) and k < len(taint_in) and taint_in[k]
        for sub in _subs(n):
            bad, ts = _log_flow(sub, [tainted[a] for a, _ in n.args])
            if bad:
                return True, tainted
            t = t or any(ts)
        if n.op in _EXP_READERS and t:
            return True, tainted
        tainted.append(t or (n.op == "log" and not square[n.args[0][0]]))
    return False, tainted


def exp_after_log(g: Graph) -> bool:
    """Whether an exp in ``g`` (at any level) reads a value computed from a log (a custom kernel's or fused
    node's results count as computed from a log when any of its values is). There ``log``'s discrete-log
    q-part makes ``exp(log y)`` equal ``y`` or ``-y`` by the residue's sign class, not ``y``: such programs
    are not tested (unknown). A log of an exp's value (or of a product, quotient, reciprocal or square of
    such values: a square ``g**k`` in the field) is exact there, ``exp(log y) = y``, and does not count."""
    return _log_flow(g, ())[0]


def residue(c: Fraction, m: int) -> int:
    """The residue of the rational ``c`` mod the prime ``m`` (a denominator divisible by ``m``: 0)."""
    d = c.denominator % m
    return c.numerator * pow(d, -1, m) % m if d else 0


# --------------------------------------------------------------------------- array helpers


def _stack(p: np.ndarray | int, q: np.ndarray | int) -> np.ndarray:
    """The value ``(2, *shape)`` of p-part ``p`` and q-part ``q`` (broadcast together)."""
    out = np.empty((2, *np.broadcast_shapes(np.shape(p), np.shape(q))), dtype=np.int64)
    out[0], out[1] = p, q
    return out


def _inv(x: np.ndarray, m: int) -> np.ndarray:
    """The inverse mod the prime ``m`` elementwise (``x ** (m - 2)`` by square and multiply: the inverse of 0
    is 0)."""
    r, b, e = np.ones_like(x), x % m, m - 2
    while e:
        r, b, e = r * b % m if e & 1 else r, b * b % m, e >> 1
    return r


def _qmark(q: np.ndarray, *operands: np.ndarray) -> np.ndarray:
    """``q``, meaningless (-1) wherever an operand's q-part is."""
    return np.where(reduce(np.logical_or, [o < 0 for o in operands]), -1, q)


def _matmul(x: np.ndarray, y: np.ndarray, m: int | np.ndarray) -> np.ndarray:
    """Exact ``x @ y mod m`` of residues below ``2**21`` (int64, batch dims broadcast; ``m`` may be an array of
    moduli broadcast against the result, e.g. one per part of a value: both parts in one product).

    Float64 products of integers are exact while every partial sum stays below ``2**53``: each product of
    residues is below ``2**42``, so a contraction chunk of :data:`CHUNK` (``2**11``) of them sums below
    ``2**53``."""
    out = np.zeros((), dtype=np.int64)
    for s in range(0, max(x.shape[-1], 1), CHUNK):
        c = slice(s, s + CHUNK)
        r = np.matmul(x[..., c].astype(np.float64), y[..., c, :].astype(np.float64)).astype(np.int64)
        out = r if s == 0 else out + r
        out %= m  # (in place)
    return out


def _mix(x: np.ndarray, key: int, salt: int) -> np.ndarray:
    """A keyed 64-bit mix (splitmix64's finaliser) of non-negative ints."""
    z = x.astype(np.uint64) + np.uint64((key ^ (salt * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


# --------------------------------------------------------------------------- op meanings


class NeedsQParts(Exception):
    """An evaluation without q-parts met an op whose p-part reads one (exp): evaluate again with them."""


class RefFF:
    """The reference finite-field domain of one trial for :func:`verimirage.ir.interpret.run`."""

    name = "ffref"
    composes = True  # (the composite ops as their compositions: :data:`verimirage.ir.interpret.COMPOSITES`)

    def __init__(self, fld: Field, q_parts: bool = True, p_unread: frozenset[int] = frozenset()) -> None:
        self.field = fld
        #: the result types (ids) of matmuls whose p-parts nothing reads (:func:`_p_unread`)
        self.p_unread = p_unread
        #: False: every q-part is left meaningless (-1), for programs in which no p-part reads one (no exp:
        #: every other meaning computes a p-part from p-parts only); an exp then raises :class:`NeedsQParts`
        self.q_parts = q_parts
        #: elements where exp met a meaningless q-part
        self.violations = 0

    def _no_q(self, x: np.ndarray) -> bool:
        """Whether the q-part of a result read from ``x`` is meaningless everywhere (as is every q-part when
        :attr:`q_parts` is False)."""
        return not self.q_parts or bool(x[1].max(initial=-1) < 0)

    def apply(self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType],
              out_type: TensorType) -> np.ndarray:
        """Result of ``op`` (GraphError for an op with no meaning here: the checker fails closed)."""
        fn = MEANINGS.get(op)
        if fn is None:
            raise GraphError(f"ffref: op {op!r} has no reference finite-field meaning")
        args = [np.asarray(a, dtype=np.int64) for a in args]
        if op == "matmul":  # (its p-part left out where only exps read it: :func:`_p_unread`)
            return self.matmul(args[0], args[1], p=id(out_type) not in self.p_unread)
        return fn(self, args, attrs, in_types)

    def ring(self, kind: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``x kind y`` for kind add, sub, mul, div."""
        f = self.field
        yp, yq = y[0], y[1]
        if kind == "div":
            kind, yp, yq = "mul", _inv(yp, f.p), _inv(np.maximum(yq, 0), f.q)
        op = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[kind]
        out = np.empty((2, *np.broadcast_shapes(x[0].shape, yp.shape)), dtype=np.int64)
        np.remainder(op(x[0], yp, out=out[0]), f.p, out=out[0])
        # (a q-part meaningless everywhere in an operand is so in the result)
        out[1] = -1 if self._no_q(x) or self._no_q(y) else _qmark(op(x[1], yq) % f.q, x[1], y[1])
        return out

    def const(self, kind: str, x: np.ndarray, c: Fraction) -> np.ndarray:
        """``x * c`` (kind mul) or ``x + c`` (kind add) for a rational constant ``c``."""
        f = self.field
        op = np.multiply if kind == "mul" else np.add
        q = -1 if self._no_q(x) else _qmark(op(x[1], residue(c, f.q)) % f.q, x[1])
        return _stack(op(x[0], residue(c, f.p)) % f.p, q)

    def exp(self, x: np.ndarray) -> np.ndarray:
        """``g ** (q-part of x) mod p``; no meaningful q-part."""
        if not self.q_parts:
            raise NeedsQParts("exp reads a q-part")
        self.violations += int(np.count_nonzero(x[1] < 0))
        return _stack(np.take(_exp_table(self.field), x[1], mode="clip"), -1)  # (clip: -1 reads g ** 0)

    def oracle(self, name: str, x: np.ndarray, inverse: bool = False) -> np.ndarray:
        """The per-trial random function ``name`` of the p-residue (``inverse``: its inverses)."""
        f = self.field
        z = _mix(x[0], f.key, _SALT[name] if name in _SALT else 16 + zlib.crc32(name.encode()))
        p = (z % np.uint64(f.p)).astype(np.int64)
        if not self.q_parts:
            return _stack(_inv(p, f.p) if inverse else p, -1)
        q = ((z >> np.uint64(21)) % np.uint64(f.q)).astype(np.int64)
        return _stack(_inv(p, f.p), _inv(q, f.q)) if inverse else _stack(p, q)

    def recip(self, x: np.ndarray) -> np.ndarray:
        """``(x * 0 + 1) / x`` (the inverse of 0 being 0; meaningless q-parts stay so)."""
        return self.ring("div", self.const("add", self.const("mul", x, Fraction(0)), Fraction(1)), x)

    def sum(self, x: np.ndarray, ax: int) -> np.ndarray:
        """Sum along array axis ``ax`` (negative), kept with size 1."""
        # exact: a sum of n residues below 2**21 is below 2**63 for any n an array can have (< 2**42)
        q = -1 if self._no_q(x) else np.where((x[1] < 0).any(axis=ax, keepdims=True), -1,
                                              x[1].sum(axis=ax, keepdims=True) % self.field.q)
        return _stack(x[0].sum(axis=ax, keepdims=True) % self.field.p, q)

    def matmul(self, x: np.ndarray, y: np.ndarray, p: bool = True) -> np.ndarray:
        """``x @ y`` in both parts (a q-part meaningless where the row or column read has one that is; ``p``
        False: a product whose p-part nothing reads, left 0)."""
        f = self.field
        if self._no_q(x) or self._no_q(y):
            return _stack(_matmul(x[0], y[0], f.p), -1)
        bx, by = (x[1] < 0).any(axis=-1)[..., :, None], (y[1] < 0).any(axis=-2)[..., None, :]
        r, k = max(x.ndim, y.ndim), slice(1 - p, 2)  # (parts' axis first, batch dims right-aligned; k: parts made)
        x, y = (v[k].reshape(v[k].shape[:1] + (1,) * (r - v.ndim) + v.shape[1:]) for v in (x, y))
        out = _matmul(np.maximum(x, 0), np.maximum(y, 0), np.array([f.p, f.q])[k].reshape((-1,) + (1,) * (r - 1)))
        out = out if p else _stack(0, out[0])
        if bx.any() or by.any():
            np.copyto(out[1], -1, where=bx | by)
        return out


def _key(x: np.ndarray) -> np.ndarray:
    """(p-residue, q-part) packed so that integer order is their lexicographic order."""
    return (x[0] << _QBITS) | (x[1] + 1)


def _unkey(k: np.ndarray) -> np.ndarray:
    return _stack(k >> _QBITS, (k & ((1 << _QBITS) - 1)) - 1)


_SALT = {"silu": 1, "gelu": 2, "relu": 3, "sqrt": 4}


Meaning = Callable[[RefFF, list[np.ndarray], dict[str, Any], Sequence[TensorType]], np.ndarray]


def _axis(attrs: dict[str, Any], in_types: Sequence[TensorType], name: str = "axis") -> int:
    return neg_axis(attrs[name], in_types[0].rank)


def _concat(d: RefFF, args: list[np.ndarray], attrs: dict[str, Any], it: Sequence[TensorType]) -> np.ndarray:
    r = it[0].rank
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - r] for a in args))
    return np.concatenate([np.broadcast_to(a, batch + a.shape[a.ndim - r :]) for a in args], axis=_axis(attrs, it))


MEANINGS: dict[str, Meaning] = {
    "add": lambda d, a, at, it: d.ring("add", a[0], a[1]),
    "sub": lambda d, a, at, it: d.ring("sub", a[0], a[1]),
    "mul": lambda d, a, at, it: d.ring("mul", a[0], a[1]),
    "div": lambda d, a, at, it: d.ring("div", a[0], a[1]),
    "square": lambda d, a, at, it: d.ring("mul", a[0], a[0]),
    "scale": lambda d, a, at, it: d.const("mul", a[0], const_fraction(at["c"])),
    "shift": lambda d, a, at, it: d.const("add", a[0], const_fraction(at["c"])),
    "exp": lambda d, a, at, it: d.exp(a[0]),
    "sqrt": lambda d, a, at, it: d.oracle("sqrt", a[0]),
    "rsqrt": lambda d, a, at, it: d.oracle("sqrt", a[0], inverse=True),
    "maximum": lambda d, a, at, it: _unkey(np.maximum(_key(a[0]), _key(a[1]))),
    "max": lambda d, a, at, it: _unkey(_key(a[0]).max(axis=_axis(at, it), keepdims=True)),
    "sum": lambda d, a, at, it: d.sum(a[0], _axis(at, it)),
    "mean": lambda d, a, at, it: d.const("mul", d.sum(a[0], _axis(at, it)),
                                         Fraction(1, it[0].shape[at["axis"]])),
    "matmul": lambda d, a, at, it: d.matmul(a[0], a[1]),
    "concat": _concat,
    "reciprocal": lambda d, a, at, it: d.recip(a[0]),
    # m * a + (1 - m) * b: exact on masks m in {0, 1}
    "where": lambda d, a, at, it: d.ring("add", d.ring("mul", a[0], a[1]), d.ring(
        "mul", d.const("add", d.const("mul", a[0], Fraction(-1)), Fraction(1)), a[2])),
    "cast": lambda d, a, at, it: a[0],
    "tril_mask": lambda d, a, at, it: np.stack([tril(at["shape"], at["offset"])] * 2),  # 0 and 1 in both parts
}
for _op in OPAQUE:  # no exact image: a random function (its salt: _SALT, else 16 + crc32 of its name)
    MEANINGS[_op] = lambda d, a, at, it, _op=_op: d.oracle(opaque_key(_op, at), a[0])  # type: ignore[misc]
# log: a random function in the p-part, the discrete log (exp's inverse) in the q-part
MEANINGS["log"] = lambda d, a, at, it: _stack(d.oracle("log", a[0])[0], _log_table(d.field)[a[0][0]])


def _sigmoid_op(d: RefFF, x: np.ndarray) -> np.ndarray:
    """sigmoid: p-part ``1 / (1 + exp(-x))`` exactly (``1 + exp(-x)`` is never 0: exp's values have odd order
    q), q-part a random function (both parts it where x has no q-part)."""
    o = d.oracle("sigmoid", x)
    return o if (x[1] < 0).all() else _stack(d.recip(d.const("add", d.exp(d.const("mul", x, Fraction(-1))),
                                                                 Fraction(1)))[0], o[1])


MEANINGS["sigmoid"] = lambda d, a, at, it: _sigmoid_op(d, a[0])


for _op, _fn in LAYOUT_MEANINGS.items():  # layout ops: the IR's data movement, of each part
    MEANINGS[_op] = lambda d, a, at, it, _fn=_fn, _op=_op: _fn(a, at, it, [get_op(_op).infer(it, at)])  # type: ignore[misc]


# --------------------------------------------------------------------------- the trials


def trial_inputs(g: Graph, fld: Field, seed: int, q_parts: bool = True) -> dict[str, np.ndarray]:
    """Uniform random residues for every input of ``g``: input ``i`` (in name order), part ``k`` (0: mod p,
    1: mod q) from its own stream ``[seed, 0x5EED, k, i]`` (``q_parts=False``: q-parts meaningless, -1)."""
    out = {}
    for i, (name, t) in enumerate(sorted(input_types(g).items())):
        v = np.empty((2, *t.shape), dtype=np.int64)
        v[0] = np.random.default_rng([seed, 0x5EED, 0, i]).integers(0, fld.p, size=t.shape, dtype=np.int32)
        v[1] = np.random.default_rng([seed, 0x5EED, 1, i]).integers(0, fld.q, size=t.shape, dtype=np.int32) \
            if q_parts else -1
        out[name] = v
    return out


def evaluate(g: Graph, inputs: dict[str, np.ndarray], fld: Field,
             q_parts: bool = True) -> tuple[list[np.ndarray], int]:
    """Every output of ``g`` (arrays ``(2, *shape)``) in ``fld`` on ``inputs``, and the violation count
    (``q_parts=False``: see :class:`RefFF`)."""
    d = RefFF(fld, q_parts, _p_unread(g))
    outs = zip(run(g, inputs, d), output_types(g), strict=True)
    return [np.broadcast_to(np.asarray(o), (2, *t.shape)) for o, t in outs], d.violations


def _p_unread(g: Any, readers: dict[tuple[int, str], set[str]] | None = None) -> frozenset[int]:
    """The ids of the result types of the matmuls (at any level of ``g``) that only exps read: their p-parts are
    never read (exp reads the q-part). :func:`run` passes a node's own result type to :meth:`RefFF.apply`;
    reads are keyed by (type object, op), so two matmuls that share a type have the readers of both."""
    readers = {} if readers is None else readers
    ns = node_list(g)
    for (a, k), op in [*((r, n.op) for n in ns for r in n.args), *((r, "output") for r in output_refs(g))]:
        readers.setdefault((id(ns[a].outs[k]), ns[a].op), set()).add(op)
    for sub in (s for n in ns for s in _subs(n)):
        _p_unread(sub, readers)
    return frozenset(t for (t, op), ops in readers.items() if op == "matmul" and ops == {"exp"})


def degree_bound(g: Graph) -> tuple[int, int]:
    """``(degree, atoms)`` of :func:`quotient_info`, for :func:`per_trial_bound`. Why it bounds what the evidence
    needs: with each atom (exp / oracle node) a fresh variable, every output and atom argument is ``N / D`` in the
    inputs and atoms with ``max(deg N, deg D) <= degree`` (:func:`quotient_info`: products add degrees, a sum over ``k``
    denominator classes is put over their common denominator, data movement keeps them). Programs that differ
    give ``Na Db - Nb Da``, a nonzero polynomial of degree ``<= 2 * degree``: a random point is a root with
    probability ``<= 2 * degree / q`` (Schwartz-Zippel); ``atoms + 1`` more, per node, for atom arguments that
    meet and divisors that vanish (a probability only where :func:`states_probability`). Tested against sympy
    (tests/test_redteam_held12.py). A per-node rule per op, once taken beside it, is not sound alone
    (``sum_j x_j / y_j`` has degree ``n``, it said 2) and only over-counted (benchmarks/results/degree_models_*)."""
    degree, atoms, _ = quotient_info(g)
    return degree, atoms


#: the rule by which :func:`quotient_info` models each op it knows, a rational function of its operands (ring
#: operations, data movement, orders); any other op is an atom (exp, the oracles). ff.degree reads it
DEGREE_RULES = {o: r.split()[0] for r in ("add sub maximum mul div", "scale cast square shift", "sum mean max",
                "loop_sum rescaled_sum", "loop_max running_max", "reciprocal", "where", "matmul", "concat")
                for o in r.split()} | dict.fromkeys(LAYOUT_MEANINGS, "layout")


def quotient_info(g: Graph) -> tuple[int, int, int]:
    """``(degree, atoms, applications)``: a degree bound of ``g``'s outputs (and of every exp / oracle argument)
    sound for sums of quotients: each value is ``N / D`` with ``deg N <= n``, ``deg D <= d``, ``D`` a function of a
    class (one of ``k[axis]``) of each axis' index; a reduction along an axis of ``k`` classes gives ``n + (k - 1) d``
    over ``k d``. Layout ops keep ``(n, d)`` and move the classes (merged axes: their product; a split axis: every
    index its own class); a kernel's result: its block's classes times the blocks along each dim; a loop's: every
    index its own class. ``atoms``: exp / oracle nodes; ``applications``: their element-wise applications plus
    element-wise divisions weighted by their divisor's degree (the fast engine's ``degree_info`` is this)."""
    opaque = [0, 0, 0]  # max argument degree of an atom, atom nodes, element-wise applications
    V = tuple[int, int, dict[int, int]]  # (n, d, {axis: classes of the denominator along it, when > 1})

    def deg(v: V) -> int:
        return max(v[0], v[1])

    def full(shape: Sequence[int]) -> dict[int, int]:
        return {a: s for a, s in enumerate(shape) if s > 1}

    def refine(out: Sequence[int], *ks: dict[int, int]) -> dict[int, int]:
        # the classes of a product of denominators: the pairs of classes, at most the axis' size
        r = {a: math.prod(k.get(a, 1) for k in ks) for a in range(len(out))}
        return {a: min(c, out[a]) for a, c in r.items() if c > 1 and out[a] > 1}

    def align(v: V, shape: Sequence[int], out: Sequence[int]) -> dict[int, int]:
        off = len(out) - len(shape)
        return refine(out, {a + off: c for a, c in v[2].items() if a < len(shape) and shape[a] != 1})

    def allaxes(v: V, shape: Sequence[int]) -> V:
        return (v[0], v[1], full(shape) if v[1] else {})

    def reduce(v: V, ax: int, m: int) -> V:
        n, d, vary = v
        k = min(vary.get(ax, 1), m)
        if d and k > 1:
            n, d = n + (k - 1) * d, k * d
        return (n, d, {a: c for a, c in vary.items() if a != ax})

    def layout(n: Any, v: V, shape: Sequence[int], out: Sequence[int]) -> V:
        # data movement: the same (n, d); the denominator's classes follow the elements
        if not v[1] or not v[2]:
            return (v[0], v[1], {})
        k = v[2]
        if n.op == "permute" and len(shape) == len(out):
            return (v[0], v[1], refine(out, {j: k.get(i, 1) for j, i in enumerate(n.attr("dims"))}))
        if n.op == "broadcast_to" and len(shape) <= len(out):
            return (v[0], v[1], align(v, shape, out))
        if n.op == "slice" and len(shape) == len(out):
            return (v[0], v[1], refine(out, k))
        if n.op == "reshape" and math.prod(shape) == math.prod(out):
            r: dict[int, int] = {}
            for old, new in reshape_groups(tuple(shape), tuple(out)):
                c = math.prod(k.get(i, 1) for i in old)
                if c > 1:  # one new axis: the tuples of classes; several: every index its own class
                    r.update({new[0]: c} if len(new) == 1 else {j: out[j] for j in new})
            return (v[0], v[1], refine(out, r))
        return allaxes(v, out)  # (not remapped: varying along every axis)

    def walk(nodes: Sequence[Any], in_vals: list[V], reps: int, frange: int,
             post: list[bool] | None) -> tuple[list[V], dict[tuple[int, int], V]]:
        vals: list[V] = []  # each node's first result; ``more``: a kernel's results, each its own
        more: dict[tuple[int, int], V] = {}
        for i, n in enumerate(nodes):
            a = [more.get((j, k), vals[j]) for j, k in n.args]
            shapes = [nodes[j].outs[k].shape for j, k in n.args]
            out = n.outs[0].shape if n.outs else ()
            rank = len(out)
            times = reps * (frange if post is not None and not post[i] else 1)
            elems = math.prod(out) * times
            if n.op in ("input", "arg"):
                idx = n.attr("arg") if n.op == "input" and n.attr("arg") is not None else n.attr("index")
                known = idx is not None and idx < len(in_vals)
                v = in_vals[idx] if known else (1, 0, {})
                vals.append((v[0], v[1], refine(out, v[2])))  # (a tile of a kernel operand: a box of it)
                continue
            if n.op in ("custom", "fused"):
                blk = n.attr("block" if n.op == "custom" else "thread")
                outs, inner = (walk(blk.nodes, a, reps * blk.num_blocks, blk.frange, blk.post_loop())
                               if n.op == "custom" else walk(blk.nodes, a, times, 1, None))
                top = (max((v[0] for v in outs), default=1), max((v[1] for v in outs), default=0))
                if n.op == "fused":
                    vals.append(allaxes((*top, {}), out))
                else:  # result k: its block node's classes, times the blocks along each dim (each block its own)
                    for k, (r, om, t) in enumerate(zip(blk.outputs, blk.omaps, n.outs, strict=True)):
                        own = inner.get(r, outs[r[0]])[2]
                        by = {d: own.get(d, 1) * math.prod(blk.grid[x] for x, e in enumerate(om.dims) if e == d)
                              for d in range(len(t.shape))}
                        more[(i, k)] = (*top, refine(t.shape, by) if top[1] else {})
                    vals.append(more.get((i, 0), (*top, {})))
                continue
            sub = expand(n.op, [nodes[j].outs[k] for j, k in n.args], n.attr_dict)
            if sub is not None:  # a composite op: its composition's quotient (one more level of the same walk)
                vals.append(walk(sub, a, times, 1, None)[0][-1])
            elif (rule := DEGREE_RULES.get(n.op)) == "reciprocal":  # 1 / (N / D) = D / N divides by N
                x = a[0]
                vals.append((x[1], x[0], refine(out, x[2], full(shapes[0]) if x[0] else {})))
                opaque[2] += elems * max(1, deg(x))
            elif rule == "layout":
                vals.append(layout(n, a[0], shapes[0], out))
            elif rule == "where":  # m a + (1 - m) b over the common denominator Da Db
                m, x, y = a
                vary = refine(out, *(align(v, s, out) for v, s in zip(a, shapes, strict=True)))
                vals.append((deg(m) + max(x[0] + y[1], y[0] + x[1]), x[1] + y[1] + m[1], vary))
            elif rule == "add":  # add, sub, maximum, mul, div
                x, y = a
                vx, vy = align(x, shapes[0], out), align(y, shapes[1], out)
                if n.op == "mul":
                    vals.append((x[0] + y[0], x[1] + y[1], refine(out, vx, vy)))
                elif n.op == "div":  # x / y = (Nx Dy) / (Dx Ny); each element's divisor may vanish in the field
                    ny = align((0, 0, full(shapes[1])), shapes[1], out) if y[0] else {}
                    vals.append((x[0] + y[1], x[1] + y[0], refine(out, vx, vy, ny)))
                    opaque[2] += elems * max(1, deg(y))
                else:
                    vals.append((max(x[0] + y[1], y[0] + x[1]), x[1] + y[1], refine(out, vx, vy)))
            elif rule == "scale":  # scale, cast: (n, d); square: (2 n, 2 d); shift: (max(n, d), d)
                x = a[0]
                vals.append({"square": (2 * x[0], 2 * x[1], x[2]), "shift": (deg(x), x[1], x[2])}.get(n.op, x))
            elif rule == "sum":  # sum, mean, max
                ax = n.attr("axis") % len(shapes[0])
                if n.op == "max":  # an element of any class along ax: every other axis' classes times it
                    kx = a[0][2].get(ax, 1)
                    vals.append((a[0][0], a[0][1], refine(out, {b: a[0][2].get(b, 1) * kx for b in range(rank)})))
                else:
                    vals.append(reduce(a[0], ax, shapes[0][ax]))
            elif rule == "matmul":
                x, y = a
                ra, rb = len(shapes[0]), len(shapes[1])
                kx, ky = x[2].get(ra - 1, 1), y[2].get(rb - 2, 1)
                vary = refine(out, {ax + rank - ra: c for ax, c in x[2].items() if ax < ra - 2 and shapes[0][ax] != 1},
                              {ax + rank - rb: c for ax, c in y[2].items() if ax < rb - 2 and shapes[1][ax] != 1},
                              {rank - 2: x[2].get(ra - 2, 1), rank - 1: y[2].get(rb - 1, 1)})
                r = reduce((x[0] + y[0], x[1] + y[1], {0: kx * ky}), 0, shapes[0][-1])
                vals.append((r[0], r[1], vary))
            elif rule == "concat":
                ax = n.attr("axis") % rank
                parts = [align(x, s, out) for x, s in zip(a, shapes, strict=True)]
                along = sum(max(1, p.get(ax, 1)) for p in parts) if any(x[1] for x in a) else 1
                vary = refine(out, *({b: c for b, c in p.items() if b != ax} for p in parts), {ax: along})
                vals.append((max(x[0] for x in a), max(x[1] for x in a), vary))
            elif rule == "loop_sum":  # loop_sum, rescaled_sum
                x = a[0]
                n_, d_ = (x[0] + (frange - 1) * x[1], frange * x[1]) if x[1] else (x[0], 0)
                if n.op == "rescaled_sum":  # acc * exp(m_prev - m) + x: one more atom factor, its argument a
                    n_ += 1 + a[1][0]  # difference of two of m's values (degree deg m + its denominator's)
                    opaque[:2] = [max(opaque[0], deg(a[1]) + a[1][1]), opaque[1] + 1]
                    opaque[2] += elems * frange
                vals.append(allaxes((n_, d_, {}), out))
            elif rule == "loop_max":  # loop_max, running_max (an element of any iteration: every index its own class)
                vals.append(allaxes(a[0], out))
            else:  # exp, the oracles, and any op not in DEGREE_RULES: a fresh atom per node
                arg = max((deg(x) for x in a), default=1)
                opaque[0] = max(opaque[0], arg)
                opaque[1] += 1
                opaque[2] += elems * max(1, arg)
                vals.append((1, 0, {}))
        return vals, more

    vals, more = walk(node_list(g), [], 1, 1, None)
    out = max((deg(more.get((i, k), vals[i])) for i, k in output_refs(g)), default=1)
    return max(out, opaque[0], 1), opaque[1], opaque[2]


_MAX_LIKE = frozenset({"maximum", "max", "minimum", "min", "loop_max", "running_max"})


def states_probability(g: Graph) -> bool:
    """Whether ``g``'s per-node model bound is a probability: no element-wise exp / oracle application or
    division (:func:`quotient_info`) and no max-like op (an order on residues) at any level."""
    return quotient_info(g)[2] == 0 and not ops_in(g) & _MAX_LIKE


def per_trial_bound(a: Graph, b: Graph) -> float:
    """The chance that one trial finds two different programs equal: ``(2 * degree + opaque + 1) / q``
    for the smallest ``q`` (at most 1)."""
    (da, oa), (db, ob) = degree_bound(a), degree_bound(b)
    q_min = (safe_primes()[0] - 1) // 2
    return min(1.0, (2 * max(da, db) + oa + ob + 1) / q_min)


def trials_needed(per_trial: float, target_log2: float = 60.0, minimum: int = 2) -> int:
    """Independent trials so that ``per_trial ** n <= 2**-target_log2`` (0 when ``per_trial >= 1``)."""
    return 0 if per_trial >= 1 else max(minimum, math.ceil(target_log2 / -math.log2(per_trial)))


@dataclass(frozen=True)
class RefResult:
    """What :func:`ref_test` found: ``PROVED`` (equal on every trial), ``REFUTED`` (``output``, ``index``, ``trial``)
    or ``UNKNOWN``."""

    outcome: Outcome
    reason: str
    seeds: tuple[int, ...]
    per_trial_bound: float
    bound: float
    output: int | None = None
    index: tuple[int, ...] | None = None
    trial: int | None = None


def reads_q_parts(g: Graph) -> bool:
    """Whether a p-part of ``g`` may read a q-part: whether ``g`` holds an op of :data:`_EXP_READERS` anywhere
    (a guess that saves time only: an exp met without q-parts raises :class:`NeedsQParts`)."""
    return bool(ops_in(g) & _EXP_READERS)


def _workers(inputs_bytes: int, trials: int) -> int:
    """Trials evaluated at once: two when the machine has two cores and a trial's inputs take at most 256 MiB
    (each trial holds its own arrays: gqa_bs8's check peaks at 2.3 GB with two, 1.3 GB with one), else one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores, trials, 1 + (inputs_bytes <= 256 << 20)))


def ref_test(a: Graph, b: Graph, seeds: Sequence[int], *, part: str = "p") -> RefResult:
    """Evaluate ``a`` and ``b`` in the field of each seed on the same random inputs and compare every
    element of every output's p-part (``part="q"``: q-part, see below). ``bound``: ``per_trial_bound **
    len(seeds)`` when all are equal. Trials are independent (each has its own field, inputs and domain); two
    may run at once on threads, and the answer is the lowest-numbered trial's that is not equal, whatever the
    order they finish in.

    ``part="q"`` (the q-world comparison, for programs with log): compares the q-parts, where log is exp's
    exact inverse, and answers unknown where an output's q-part is meaningless. Comparing ``P.q`` is comparing
    ``exp(P)`` (``g`` has order q), and exp is injective on the reals, so it tests ``P = Q`` as the p-part
    comparison does. A program where an exp reads a log's value (:func:`exp_after_log`) is unknown in
    either mode."""
    seeds = tuple(seeds)
    per = per_trial_bound(a, b)
    if exp_after_log(a) or exp_after_log(b):
        return RefResult(Outcome.UNKNOWN, "an exp reads a value computed by log (exp(log y) is +-y in the field's "
                         "model of log): not tested", seeds, per, 1.0)
    pi = {"p": 0, "q": 1}[part]

    q_parts = pi == 1 or reads_q_parts(a) or reads_q_parts(b)  # (the q-world comparison reads them all)

    def trial(ti: int) -> RefResult | None:
        s = seeds[ti]
        fld = field_of(s)
        try:  # the p-parts compared do not depend on q-parts unless an exp reads them
            ins = trial_inputs(a, fld, s, q_parts)
            (oa, va), (ob, vb) = evaluate(a, ins, fld, q_parts), evaluate(b, ins, fld, q_parts)
        except NeedsQParts:  # (an exp that reads_q_parts did not see: never answered without q-parts)
            ins = trial_inputs(a, fld, s)
            (oa, va), (ob, vb) = evaluate(a, ins, fld), evaluate(b, ins, fld)
        for k, (x, y) in enumerate(zip(oa, ob, strict=True)):
            if pi == 1 and ((x[1] < 0).any() or (y[1] < 0).any()):
                return RefResult(Outcome.UNKNOWN, f"output {k} has no meaningful q-part in trial {ti}: the q-world "
                                 "comparison cannot test it", seeds[: ti + 1], per, 1.0, trial=ti)
            if not np.array_equal(x[pi], y[pi]):
                idx = tuple(int(v) for v in np.argwhere(x[pi] != y[pi])[0])
                return RefResult(Outcome.REFUTED, f"output {k} differs at index {idx} in trial {ti} (p={fld.p})",
                                 seeds[: ti + 1], per, 1.0, k, idx, ti)
        if va + vb:
            return RefResult(Outcome.UNKNOWN, f"a program applies exp to a value with no meaningful q-part "
                             f"({va + vb} elements in trial {ti})", seeds[: ti + 1], per, 1.0, trial=ti)
        return None

    nbytes = sum(16 * t.numel for t in input_types(a).values())
    with concurrent.futures.ThreadPoolExecutor(_workers(nbytes, len(seeds))) as pool:
        for r in pool.map(trial, range(len(seeds))):
            if r is not None:
                return r
    if per >= 1 or not seeds:
        return RefResult(Outcome.UNKNOWN, "degree too high for a meaningful bound" if seeds else "no trials", seeds,
                         per, 1.0)
    bound = per ** len(seeds)
    how = " in the q-world (log as exp's inverse); per-node model bound" if pi else "; false-accept bound"
    return RefResult(Outcome.PROVED, f"{len(seeds)} trial(s) equal{how} {bound:.3g}", seeds, per, bound)
