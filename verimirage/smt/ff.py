"""Finite-field semantics of every registry op (domain ``"ff"``) and the randomized equivalence test.

Values
------
A tensor's finite-field value is an int64 array with one extra *leading* axis
of size 2: ``v[0]`` holds residues mod ``p`` and ``v[1]`` residues mod ``q``,
where ``q`` is a prime dividing ``p - 1`` (we use safe primes ``p = 2q + 1``,
``p < 2**21``). The pair is the fingerprint of a real value under the ring maps
to Z_p and Z_q. ``v[1] == -1`` marks a q-part that has no meaning (see exp).

Op meanings
-----------
* ``add, sub, mul, neg, square, scale, shift, matmul, sum, mean``: ring
  operations in both parts; constants ``c`` are exact rationals
  (:func:`verimirage.smt.consts.const_fraction`) mapped into Z_p and Z_q.
* ``div``: multiplication by the modular inverse; **division by zero is defined
  as multiplication by 0** (the inverse of 0 is taken to be 0), in each part.
* ``exp(x) = g ** (x mod q) mod p`` with ``g`` of order ``q`` in Z_p*, so
  ``exp(a + b) = exp(a) * exp(b)`` holds exactly. The result has no meaningful
  q-part (it is marked -1). If ``exp`` is applied to a value whose q-part has no
  meaning (e.g. ``exp(exp(x))``), the field records a *q-violation* and the test
  can only answer Unknown.
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

Matmuls are exact: residues are centred in (-p/2, p/2) and multiplied with
float64 BLAS in chunks of the contraction dim small enough that every partial
sum is an integer below 2**53.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list
from ..ir.interpret import run
from ..ir.ops import OPS, Prop, TensorType, implements, neg_axis
from .consts import const_fraction

log = logging.getLogger(__name__)

P_MAX = 1 << 21
_CHUNK = 1 << 13  # (p/2)**2 * 8192 < 2**53 for p < 2**21


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


@dataclass
class Field:
    """One trial's field: primes ``p``, ``q`` (q | p-1), generator ``g`` of order ``q``, oracle key."""

    p: int
    q: int
    g: int
    key: int
    q_violations: int = 0
    _exp_table: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def from_seed(cls, seed: int) -> Field:
        """The field a trial seed determines (prime, generator and oracle key)."""
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
        return cls(p, q, g, key)

    def exp_table(self) -> np.ndarray:
        """``g**k mod p`` for k in [0, q)."""
        if self._exp_table is None:
            b = 1024
            small = np.empty(b, dtype=np.int64)
            acc = 1
            for i in range(b):
                small[i] = acc
                acc = acc * self.g % self.p
            gb = acc
            nb = self.q // b + 1
            big = np.empty(nb, dtype=np.int64)
            acc = 1
            for i in range(nb):
                big[i] = acc
                acc = acc * gb % self.p
            self._exp_table = (big[:, None] * small[None, :] % self.p).reshape(-1)[: self.q]
        return self._exp_table

    def const(self, c: Fraction) -> tuple[int, int]:
        """The residues of rational ``c`` mod p and mod q (denominator 0 mod a prime: residue 0)."""
        def res(m: int) -> int:
            d = c.denominator % m
            return c.numerator * (pow(d, -1, m) if d else 0) % m

        return res(self.p), res(self.q)


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


def _pq(f: Field, pv: np.ndarray, qv: np.ndarray) -> np.ndarray:
    return np.stack(np.broadcast_arrays(pv, qv))


def _qok(*qs: np.ndarray) -> np.ndarray:
    ok = qs[0] >= 0
    for x in qs[1:]:
        ok = ok & (x >= 0)
    return ok


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
    pv = (z % np.uint64(f.p)).astype(np.int64)
    qv = ((z >> np.uint64(21)) % np.uint64(f.q)).astype(np.int64)
    return _pq(f, pv, qv)


def _scale_by(x: np.ndarray, c: Fraction) -> np.ndarray:
    f = current_field()
    cp, cq = f.const(c)
    ok = x[1] >= 0
    return _pq(f, x[0] * cp % f.p, np.where(ok, x[1] * cq % f.q, -1))


# --------------------------------------------------------------------------- op meanings


def _binop(kind: str):
    def fn(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
        f = current_field()
        a, b = args
        if kind == "add":
            pv, qv = a[0] + b[0], a[1] + b[1]
        elif kind == "sub":
            pv, qv = a[0] - b[0], a[1] - b[1]
        elif kind == "mul":
            pv, qv = a[0] * b[0], a[1] * b[1]
        else:  # div
            pv, qv = a[0] * _inv(b[0], f.p), a[1] * _inv(np.maximum(b[1], 0), f.q)
        ok = _qok(a[1], b[1])
        return _pq(f, pv % f.p, np.where(ok, qv % f.q, -1))

    return fn


for _k in ("add", "sub", "mul", "div"):
    implements("ff", _k)(_binop(_k))


@implements("ff", "maximum")
def _ff_maximum(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    a, b = np.broadcast_arrays(*args)
    # lexicographic order on (p-residue, q-part), an invalid q-part (-1) being the smallest
    take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] >= b[1]))
    pv = np.where(take_a, a[0], b[0])
    qv = np.where(take_a, a[1], b[1])
    return _pq(f, pv, qv)


@implements("ff", "neg")
def _ff_neg(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _scale_by(args[0], Fraction(-1))


@implements("ff", "square")
def _ff_square(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _binop("mul")([args[0], args[0]], attrs, in_types, out_types)


@implements("ff", "scale")
def _ff_scale(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _scale_by(args[0], const_fraction(attrs["c"]))


@implements("ff", "shift")
def _ff_shift(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    x = args[0]
    cp, cq = f.const(const_fraction(attrs["c"]))
    return _pq(f, (x[0] + cp) % f.p, np.where(x[1] >= 0, (x[1] + cq) % f.q, -1))


@implements("ff", "exp")
def _ff_exp(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    x = args[0]
    bad = x[1] < 0
    if bad.any():
        f.q_violations += int(bad.sum())
    pv = f.exp_table()[np.maximum(x[1], 0)]
    return _pq(f, pv, np.full_like(pv, -1))


for _u in ("silu", "gelu", "relu", "sqrt"):
    implements("ff", _u)(lambda args, attrs, it, ot, _n=_u: _oracle(_n, args[0]))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    f = current_field()
    s = _oracle("sqrt", x)
    return _pq(f, _inv(s[0], f.p), _inv(s[1], f.q))


@implements("ff", "rsqrt")
def _ff_rsqrt(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return _rsqrt(args[0])


def _reduce_sum(x: np.ndarray, ax: int) -> np.ndarray:
    f = current_field()
    pv = x[0].sum(axis=ax, keepdims=True) % f.p
    ok = (x[1] >= 0).all(axis=ax, keepdims=True)
    qv = np.where(ok, np.maximum(x[1], 0).sum(axis=ax, keepdims=True) % f.q, -1)
    return _pq(f, pv, qv)


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
    # order: p-residue, then q-part (so the result does not depend on the order of the elements)
    key = x[0] * (f.q + 1) + (x[1] + 1)
    i = np.expand_dims(np.argmax(key, axis=ax), ax)
    return _pq(f, np.take_along_axis(x[0], i, ax), np.take_along_axis(x[1], i, ax))


def _centred(x: np.ndarray, m: int) -> np.ndarray:
    return np.where(x > m // 2, x - m, x).astype(np.float64)


def _modmatmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    k = a.shape[-1]
    ac, bc = _centred(a, m), _centred(b, m)
    out = None
    for s in range(0, k, _CHUNK):
        part = np.fmod(np.matmul(ac[..., s : s + _CHUNK], bc[..., s : s + _CHUNK, :]), m)
        out = part if out is None else np.fmod(out + part, m)
    assert out is not None
    return out.astype(np.int64) % m


@implements("ff", "matmul")
def _ff_matmul(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    f = current_field()
    a, b = args
    pv = _modmatmul(a[0], b[0], f.p)
    a_bad = (a[1] < 0).any(axis=-1)
    b_bad = (b[1] < 0).any(axis=-2)
    qv = _modmatmul(np.maximum(a[1], 0), np.maximum(b[1], 0), f.q)
    bad = a_bad[..., :, None] | b_bad[..., None, :]
    return _pq(f, pv, np.where(bad, -1, qv))


@implements("ff", "rms_norm")
def _ff_rms(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    x = args[0]
    rank = in_types[0].rank
    ax = attrs["axis"]
    sq = _binop("mul")([x, x], {}, None, None)
    ms = _scale_by(_reduce_sum(sq, neg_axis(ax, rank)), Fraction(1, in_types[0].shape[ax]))
    ms = _ff_shift([ms], {"c": attrs["eps"]}, None, None)
    y = _binop("mul")([x, _rsqrt(ms)], {}, None, None)
    if len(args) == 2:
        w = args[1]
        nax = neg_axis(ax, rank)
        w = w.reshape(w.shape + (1,) * (-nax - 1))
        y = _binop("mul")([y, w], {}, None, None)
    return y


@implements("ff", "concat")
def _ff_concat(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    r = in_types[0].rank
    ax = neg_axis(attrs["axis"], r)
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
    from ..ir.graph import output_refs

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


def trial_inputs(g: Graph, fld: Field, seed: int) -> dict[str, np.ndarray]:
    """Fresh uniform random residues for every input of ``g`` (both parts), from ``seed``."""
    rng = np.random.default_rng([seed, 0x5EED])
    vals = {}
    for t in g.inputs:
        pv = rng.integers(0, fld.p, size=t.shape, dtype=np.int64)
        qv = rng.integers(0, fld.q, size=t.shape, dtype=np.int64)
        vals[str(t.name)] = np.stack([pv, qv])
    return vals


def trials_needed(per_trial: float, target_log2: float = 60.0, minimum: int = 2) -> int:
    """Independent trials so that ``per_trial ** n <= 2**-target_log2``."""
    if per_trial >= 1:
        return 0
    return max(minimum, math.ceil(target_log2 / -math.log2(per_trial)))


def ff_test(
    a: Graph, b: Graph, *, seeds: Sequence[int] | None = None, seed: int = 0, trials: int | None = None,
    target_log2: float = 60.0,
) -> FFResult:
    """Evaluate ``a`` and ``b`` in fresh random fields on fresh random inputs; compare every output.

    The stated bound (per trial ``(2 * degree + opaque + 1) / q``, independent trials multiplied)
    models exp and the nonlinear unary ops as fresh random values (the model of Mirage's analysis).
    """
    t0 = time.perf_counter()
    da, oa = degree_bound(a)
    db, ob = degree_bound(b)
    deg = max(da, db)
    opaque = oa + ob
    q_min = int(safe_primes()[0] - 1) // 2
    per = min(1.0, (2 * deg + opaque + 1) / q_min)
    if seeds is None:
        n = trials if trials is not None else trials_needed(per, target_log2)
        if n == 0:
            n = 1
        seeds = [int(s) for s in np.random.default_rng([seed, 0xF1E1D]).integers(0, 1 << 62, size=n)]
    seeds = tuple(int(s) for s in seeds)
    ps, qs, gs = [], [], []
    for ti, s in enumerate(seeds):
        fld = Field.from_seed(s)
        ps.append(fld.p)
        qs.append(fld.q)
        gs.append(fld.g)
        ins = trial_inputs(a, fld, s)
        dom = FFDomain(fld)
        with np.errstate(over="ignore"):
            outs_a = run(a, ins, dom)
            outs_b = run(b, ins, dom)
        common = dict(p=tuple(ps), q=tuple(qs), g=tuple(gs), seeds=seeds[: ti + 1], trials=ti + 1,
                      per_trial_bound=per)
        for k, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
            x, y = np.broadcast_arrays(np.asarray(x), np.asarray(y))
            diff = x[0] != y[0]
            both = (x[1] >= 0) & (y[1] >= 0)
            diff = diff | (both & (x[1] != y[1]))
            if diff.any():
                idx = tuple(int(i) for i in np.argwhere(diff)[0])
                return FFResult("differ", f"output {k} differs at index {idx} in trial {ti} (p={fld.p})",
                                bound=1.0, seconds=time.perf_counter() - t0, output=k, index=idx, inputs=ins,
                                field_trial=ti, **common)  # type: ignore[arg-type]
        if fld.q_violations:
            return FFResult("unknown", f"a program applies exp to a value with no meaningful q-part "
                            f"({fld.q_violations} elements in trial {ti}): the exp algebra cannot be tested",
                            bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
    bound = per ** len(seeds)
    outcome = "equal" if per < 1 else "unknown"
    reason = (f"{len(seeds)} trial(s) equal; false-accept bound {bound:.3g}" if outcome == "equal"
              else "degree too high for a meaningful bound")
    return FFResult(outcome, reason, tuple(ps), tuple(qs), tuple(gs), seeds, len(seeds), per, bound,
                    time.perf_counter() - t0)


def ff_domain_ops() -> list[str]:
    """Registry ops with an ff meaning (for tests)."""
    return sorted(n for n, o in OPS.items() if "ff" in o.domains and not o.has(Prop.STRUCTURAL))


def run_ff(g: Graph, inputs: Mapping[str, np.ndarray], fld: Field) -> list[np.ndarray]:
    """Evaluate ``g`` in field ``fld`` on ff input values (arrays with the leading (p, q) axis)."""
    with np.errstate(over="ignore"):
        return run(g, inputs, FFDomain(fld))
