"""Finite-field semantics of every registry op (domain ``"ff"``) and the randomized equivalence test.

Values
------
A tensor's finite-field value (:class:`FV`) has two *parts*: residues mod ``p``
and residues mod ``q``, where ``q`` is a prime dividing ``p - 1`` (we use safe
primes ``p = 2q + 1``, ``2**20 <= p < 2**21``). The pair is the fingerprint of
a real value under the ring maps to Z_p and Z_q. A q-residue of ``-1`` marks a
q-part that has no meaning (see exp); a value whose q-part is ``None`` has no
meaningful q-part anywhere (what ``exp`` returns).

Each part is computed **on demand** (:class:`Part`, a memoised thunk over the
parts it reads). The test asks only for the p-parts of the outputs, so a part
that cannot reach an output's p-part is never computed: the p-part of ``Q K^T``
in attention (exp reads only the q-part), the q-part of ``V`` (it never reaches
an exp), every q-part of a program without exp. Which part an op reads is part
of its meaning below ("reads"); nothing else decides what is computed, so a
part a result depends on is always computed (tests/test_verify.py checks
programs where q-parts do reach an exp through every kind of op).

Op meanings
-----------
* ``add, sub, mul, neg, square, scale, shift, matmul, sum, mean``: ring
  operations in both parts (each part reads the same part of the operands);
  constants ``c`` are exact rationals
  (:func:`verimirage.smt.consts.const_fraction`) mapped into Z_p and Z_q.
* ``div``: multiplication by the modular inverse; **division by zero is defined
  as multiplication by 0** (the inverse of 0 is taken to be 0), in each part.
* ``exp(x) = g ** (x mod q) mod p`` with ``g`` of order ``q`` in Z_p*, so
  ``exp(a + b) = exp(a) * exp(b)`` holds exactly (a table of ``g**k`` for k in
  [0, q), built once per field and cached). Its p-part reads the q-part of
  ``x``; the result has no meaningful q-part. If ``exp`` is applied to a value
  whose q-part has no meaning (e.g. ``exp(exp(x))``), the field records a
  *q-violation* and the test can only answer Unknown.
* ``silu, gelu, relu, sqrt``: per-trial random functions (a keyed 64-bit mix)
  of the p-residue of the argument, giving both parts of the result (both read
  the p-part). ``rsqrt(x)`` is the inverse of ``sqrt(x)`` (so ``rsqrt =
  1/sqrt`` exactly). ``rms_norm(x) = x * rsqrt(mean(x*x) + eps)`` with that
  ``rsqrt`` (times the weight).
* ``max``, ``maximum``: a genuine total order on values: lexicographic on
  (p-residue, q-part), a meaningless q-part counting as the smallest. It is
  associative, commutative and idempotent, so a tiled max equals the flat max,
  and programs that subtract *some* max before ``exp`` (stable softmax, online
  softmax) test equal to the unshifted ones, as they are in real arithmetic.
  The p-part of the result is the max of the p-parts (reads p only); its
  q-part reads both parts.
* ``concat``, ``transpose``: data movement (each part separately).

The test compares the p-parts of the outputs, by default through a random
bilinear projection ``sum(O * U * r) mod p`` per output (:func:`observe`,
:mod:`verimirage.smt.ffproj`: the projection is pushed back through the ops
linear in one operand, so e.g. attention's ``P V`` is never formed), which
adds ``2 / p`` to the per-trial bound. The stated bound (which divides
by the smaller prime q) bounds the p-part polynomial identity test alone, so
it holds whatever q-parts are computed. Inputs get independent uniform residues
per (trial, input, part) from separate streams, so every part of every input
has the same value whichever parts are computed and in which order.

Matmuls are exact: residues in [0, p) are multiplied with float64 BLAS in
chunks of at most 2048 along the contraction dim, so every partial sum is an
integer below 2**53. Grid axes that only one operand varies along (a block's
replicated tile) are folded into the rows or columns of one product.

Speed
-----
For a search, :class:`FFReference` evaluates the *target* once per trial (seed)
and keeps its outputs, so each candidate costs one program evaluation per
trial; exp tables are cached per field. Trial inputs are kept too: always when
small, else within the sharing budget when every trial's fit in half of it. The
target's big products (exp fused or not) are kept too, and a candidate product
whose operand rows and columns are, element for element, rows and columns of a
kept one is taken from it instead of recomputed (:mod:`verimirage.smt.ffshare`). In a
process that has started CUDA, big products (exp fused or not) run on the GPU
and come back into host arrays (:mod:`verimirage.smt.ffgpu`). See
``verimirage/smt/PERF.md``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import ctypes
import dataclasses
import gc
import glob
import logging
import math
import os
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs
from ..ir.interpret import run
from ..ir.ops import FAMILY_EXP, OPS, POW_EXACT_MAX, Prop, TensorType, implements, neg_axis
from . import ffgpu, ffshare
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


@lru_cache(maxsize=16)
def _exp_table_f32(p: int, q: int, g: int) -> np.ndarray:
    """:func:`_exp_table` as float32 (exact: the entries are below 2**21 < 2**24), half the cache footprint
    of int64 or float64 for the random gathers of :func:`_exp_gather`."""
    t = _exp_table(p, q, g).astype(np.float32)
    t.flags.writeable = False
    return t


#: elements per chunk of :func:`_exp_gather` (its float32 buffer stays in L1/L2)
_GATHER_CHUNK = 1 << 14


def _gather_into(table: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[:] = table[src]`` for flat ``src`` (int64) and ``dst`` (float64) views, in cache-sized chunks
    through a float32 buffer."""
    buf = np.empty(min(_GATHER_CHUNK, src.size), dtype=np.float32)
    for s in range(0, src.size, _GATHER_CHUNK):
        n = min(_GATHER_CHUNK, src.size - s)
        np.take(table, src[s : s + n], out=buf[:n])
        dst[s : s + n] = buf[:n]


def _exp_gather(table: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``table[idx]`` as float64, for a float32 table and int64 indices in range.

    Gathered in cache-sized chunks through a float32 buffer, walking ``idx`` in its memory order (a
    transposed view is not copied first); the result has ``idx``'s memory layout. On 16.7M random
    indices into a 2**20-entry table this ran ~3x faster than one ``np.take`` into float64."""
    out = np.empty_like(idx, dtype=np.float64)  # same stride order as idx
    src = idx.ravel(order="K")
    dst = out.ravel(order="K")
    if idx.size < _GATHER_CHUNK or not (np.may_share_memory(src, idx) and np.may_share_memory(dst, out)):
        np.copyto(out, np.take(table, idx), casting="safe")
        return out
    _gather_into(table, src, dst)
    return out


@dataclass
class Field:
    """One trial's field: primes ``p``, ``q`` (q | p-1), generator ``g`` of order ``q``, oracle key.

    ``q_violations`` counts elements where exp met a meaningless q-part.
    """

    p: int
    q: int
    g: int
    key: int
    q_violations: int = 0

    @classmethod
    def from_seed(cls, seed: int) -> Field:
        """The field a trial seed determines (prime, generator and oracle key)."""
        p, q, g, key = _field_params(int(seed))
        return cls(p, q, g, key)

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
    """The finite-field domain for :func:`verimirage.ir.interpret.run` (one field per instance).

    Values are :class:`FV`; ops build the parts of their result lazily (see the module docstring).
    """

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


# --------------------------------------------------------------------------- lazy values


class Part:
    """One part (p- or q-residues) of a value: an array computed on first :meth:`get`.

    ``fn(*deps' arrays)`` computes it; afterwards the thunk and its operands are released, so an
    intermediate array lives only until the last part that reads it is computed. ``kind`` is the
    array's dtype: ``"i"`` (int64) or ``"f"`` (float64); both hold the residues exactly (they are
    below 2**21); ``"u"`` (uint64) is the oracles' raw random bits, read only by their two parts.
    :func:`as_kind` gives the same part in the other kind (a cached twin: a data-movement view of a
    part is the same view of its source's twin, so an input is converted once per trial, whatever
    the tiles and programs that read it).
    """

    __slots__ = ("_deps", "_fn", "_lin", "_src", "_twin", "_val", "kind")

    def __init__(self, fn: Callable[..., np.ndarray] | None, deps: tuple[Part, ...] = (),
                 val: np.ndarray | None = None, kind: str = "i") -> None:
        self._fn = fn
        self._deps = deps
        self._val = val
        self.kind = kind
        self._src: tuple[Part, Callable[[np.ndarray], np.ndarray]] | None = None
        self._twin: Part | None = None
        #: how this (p-)part is built from other parts when that is linear in one of them (a view, a ring
        #: op, a sum, a matmul, ...): what :mod:`verimirage.smt.ffproj` pushes a projection through
        self._lin: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, a: np.ndarray) -> Part:
        """An already computed part."""
        a = np.asarray(a)
        if a.dtype == np.float64:
            return cls(None, (), a, "f")
        return cls(None, (), a.astype(np.int64, copy=False), "i")

    @property
    def ready(self) -> bool:
        """Whether the array has been computed."""
        return self._val is not None

    def get(self) -> np.ndarray:
        """The array (computing it and, first, every part it reads that is not computed yet)."""
        v = self._val
        if v is not None:
            return v
        stack: list[Part] = [self]
        while stack:  # iterative post-order: long accumulator chains need no deep recursion
            t = stack[-1]
            if t._val is not None:
                stack.pop()
                continue
            todo = [d for d in t._deps if d._val is None]
            if todo:
                stack.extend(todo)
                continue
            fn = t._fn
            assert fn is not None
            with np.errstate(over="ignore"):
                val = fn(*[d._val for d in t._deps])
            if val.dtype != _DTYPE[t.kind]:
                raise GraphError(f"ff: a part of kind {t.kind!r} computed a {val.dtype} array")
            t._val = val
            t._fn = None
            t._deps = ()
            t._lin = None
            stack.pop()
        assert self._val is not None
        return self._val


_DTYPE = {"i": np.dtype(np.int64), "f": np.dtype(np.float64), "u": np.dtype(np.uint64)}


def as_kind(part: Part, kind: str) -> Part:
    """``part`` as an array of ``kind`` ("i": int64, "f": float64), computed at most once."""
    if part.kind == kind:
        return part
    if part._twin is None:
        if part._src is not None:
            src, fn = part._src
            part._twin = _view(as_kind(src, kind), fn)
        else:
            dt = np.float64 if kind == "f" else np.int64
            part._twin = Part(lambda a: _frozen(a.astype(dt)), (part,), kind=kind)
    return part._twin


def _frozen(x: np.ndarray) -> np.ndarray:
    """``x``, made read-only. Inputs and their twins are: products of views of them may be shared by the
    memory they read (:mod:`verimirage.smt.ffshare`), which needs that memory never to change."""
    x.flags.writeable = False
    return x


def _lazy(fn: Callable[..., np.ndarray], *deps: Part) -> Part:
    """An int64 part computed by ``fn`` from the int64 arrays of ``deps``."""
    return Part(fn, tuple(as_kind(d, "i") for d in deps))


def _lazy_f(fn: Callable[..., np.ndarray], *deps: Part) -> Part:
    """An int64 part computed by ``fn`` from the float64 arrays of ``deps``."""
    return Part(fn, tuple(as_kind(d, "f") for d in deps))


def _view(part: Part, fn: Callable[[np.ndarray], np.ndarray],
          lin: tuple[Any, ...] | None = None) -> Part:
    """A data-movement view of ``part`` (same kind; done now when the part is computed). ``lin``:
    ``(src_shape, spec)`` describing the view for projections (:mod:`verimirage.smt.ffproj`)."""
    if part.ready:
        v = Part.of(fn(part.get()))
    else:
        v = Part(fn, (part,), kind=part.kind)
        if lin is not None:
            v._lin = ("view", part, *lin)
    v._src = (part, fn)
    return v


def ints(part: Part) -> np.ndarray:
    """The int64 array of ``part``."""
    return as_kind(part, "i").get()


_SHAPE_PROBE = np.empty((), dtype=np.int8)


class FV:
    """A finite-field value: ``p`` and ``q`` parts (``q=None``: no meaningful q-part anywhere).

    Every part's array has exactly ``shape``. ``qmarks``: the q-part may contain ``-1`` (meaningless
    elements); when False it holds residues in [0, q) only. The evaluator moves data with the
    array methods below, applied to each part.
    """

    __slots__ = ("p", "q", "qmarks", "shape")

    def __init__(self, shape: Sequence[int], p: Part, q: Part | None, qmarks: bool = False) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.p = p
        self.q = q
        self.qmarks = bool(qmarks and q is not None)

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def _map(self, shape: Sequence[int], fn: Callable[[np.ndarray], np.ndarray], spec: tuple[Any, ...]) -> FV:
        return FV(shape, _view(self.p, fn, (self.shape, spec)), None if self.q is None else _view(self.q, fn),
                  self.qmarks)

    def reshape(self, *shape: Any) -> FV:
        """Row-major reshape of each part."""
        new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        new = np.broadcast_to(_SHAPE_PROBE, self.shape).reshape(new).shape
        return self._map(new, lambda a: a.reshape(new), ("reshape",))

    def transpose(self, *perm: Any) -> FV:
        """Axes permuted (each part)."""
        p = tuple(perm[0]) if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else tuple(perm)
        return self._map(tuple(self.shape[a] for a in p), lambda a: a.transpose(p), ("transpose", p))

    def __getitem__(self, idx: Any) -> FV:
        shape = np.broadcast_to(_SHAPE_PROBE, self.shape)[idx].shape
        return self._map(shape, lambda a: a[idx], ("getitem", idx))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        name = func.__name__
        if name == "take":
            return _fv_take(*args, **kwargs)
        if name == "expand_dims":
            x, axis = args[0], kwargs.get("axis", args[1] if len(args) > 1 else None)
            shape = np.expand_dims(np.broadcast_to(_SHAPE_PROBE, x.shape), axis).shape
            return x._map(shape, lambda a: np.expand_dims(a, axis), ("expand_dims", axis))
        if name == "broadcast_to":
            x, shape = args[0], tuple(kwargs.get("shape", args[1] if len(args) > 1 else None))
            return x._map(shape, lambda a: np.broadcast_to(a, shape), ("broadcast_to",))
        raise GraphError(f"numpy function {name} is not supported on finite-field values")

    def __repr__(self) -> str:
        return f"FV{self.shape}{'' if self.q is not None else ' p-only'}"


def _fv_take(x: FV, indices: Any, axis: int | None = None) -> FV:
    if axis is None or not isinstance(indices, (int, np.integer)):
        raise GraphError("finite-field values support np.take of one index along an axis only")
    ax = axis % x.ndim
    idx = (slice(None),) * ax + (int(indices),)
    return x[idx]


def fv_of(a: np.ndarray) -> FV:
    """A computed value from an array in the stacked form: ``a[0]`` p-residues, ``a[1]`` (if present)
    q-residues with ``-1`` for meaningless ones."""
    a = np.asarray(a, dtype=np.int64)
    if a.shape[0] == 2:
        return FV(a.shape[1:], Part.of(a[0]), Part.of(a[1]), bool((a[1] < 0).any()))
    return FV(a.shape[1:], Part.of(a[0]), None)


def stacked(x: FV) -> np.ndarray:
    """``x`` as one array ``(2, *shape)``: p-residues and q-residues (``-1`` where meaningless)."""
    out = np.empty((2, *x.shape), dtype=np.int64)
    out[0] = ints(x.p)
    if x.q is None:
        out[1] = -1
    else:
        out[1] = ints(x.q)
    return out


# --------------------------------------------------------------------------- helpers on arrays


def _mark(out_q: np.ndarray, *qs: np.ndarray) -> np.ndarray:
    """Set ``out_q`` to -1 wherever any operand's q-part is meaningless (-1); returns ``out_q``."""
    bad = qs[0] < 0
    for x in qs[1:]:
        bad = bad | (x < 0)
    if bad.any():
        out_q[np.broadcast_to(bad, out_q.shape)] = -1
    return out_q


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


_MOD_CHUNK = 1 << 16


def _modi(x: np.ndarray, m: int) -> np.ndarray:
    """``x %= m`` in place for an int64 array ``x`` (any sign); returns ``x``.

    Computed as ``x - (x // m) * m`` over cache-sized chunks: numpy's integer ``//`` by a scalar is
    several times faster than its ``%`` (which is slowest on negative values)."""
    if x.size < _MOD_CHUNK or not x.flags.writeable:
        x %= m
        return x
    flat = x.ravel(order="K")
    if not np.shares_memory(flat, x):
        x %= m
        return x
    k = np.empty(min(_MOD_CHUNK, flat.size), dtype=np.int64)
    for s in range(0, flat.size, _MOD_CHUNK):
        xs = flat[s : s + _MOD_CHUNK]
        ks = k[: xs.size]
        np.floor_divide(xs, m, out=ks)
        ks *= m
        xs -= ks
    return x


def _f2i_mod(c: np.ndarray, m: int) -> np.ndarray:
    """The int64 residues mod ``m`` of a C-contiguous float64 array ``c`` of integers below 2**53 in
    absolute value, written over ``c``'s own memory (``c`` is consumed), in cache-sized chunks."""
    if c.size < _MOD_CHUNK or not (c.flags.c_contiguous and c.flags.writeable):
        return _modi(c.astype(np.int64), m)
    src = c.reshape(-1)
    dst = src.view(np.int64)
    t = np.empty(min(_MOD_CHUNK, src.size), dtype=np.int64)
    k = np.empty_like(t)
    for s in range(0, src.size, _MOD_CHUNK):
        n = min(_MOD_CHUNK, src.size - s)
        ts, ks = t[:n], k[:n]
        np.copyto(ts, src[s : s + n], casting="unsafe")  # exact: integers below 2**53
        np.floor_divide(ts, m, out=ks)
        ks *= m
        np.subtract(ts, ks, out=dst[s : s + n])
    return dst.reshape(c.shape)


def _mix(x: np.ndarray, key: int, salt: int) -> np.ndarray:
    """A keyed 64-bit mixing function (splitmix64 finaliser) of non-negative ints."""
    z = x.astype(np.uint64) + np.uint64((key ^ (salt * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def _ring_arr(kind: str, x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """``x op y mod m`` of residue arrays (broadcasting)."""
    if kind == "div":
        r = np.multiply(x, _inv(y, m))
    else:
        r = _UFUNC[kind](x, y)
    return _modi(r, m)


def _ring_q(kind: str, x: np.ndarray, y: np.ndarray, q: int, marks: bool) -> np.ndarray:
    """The q-part of ``x op y``; ``marks``: an operand may hold -1 (the result is -1 there)."""
    if not marks:
        return _ring_arr(kind, x, y, q)
    r = _ring_arr(kind, x, np.maximum(y, 0) if kind == "div" else y, q)
    return _mark(r, x, y)


# --------------------------------------------------------------------------- op meanings (on FV)


def _ring(kind: str, a: FV, b: FV) -> FV:
    f = current_field()
    shape = np.broadcast_shapes(a.shape, b.shape)
    p = _lazy(lambda x, y, m=f.p: _ring_arr(kind, x, y, m), a.p, b.p)
    p._lin = ("ring", kind, a.p, a.shape, b.p, b.shape)
    if a.q is None or b.q is None:
        return FV(shape, p, None)
    marks = a.qmarks or b.qmarks
    q = _lazy(lambda x, y, m=f.q: _ring_q(kind, x, y, m, marks), a.q, b.q)
    return FV(shape, p, q, marks)


def _binop(kind: str) -> Callable[..., FV]:
    def fn(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
        return _ring(kind, args[0], args[1])

    return fn


for _k in ("add", "sub", "mul", "div"):
    implements("ff", _k)(_binop(_k))


def _affine(x: FV, c: Fraction, kind: str) -> FV:
    """``x * c`` (kind "mul") or ``x + c`` (kind "add") for a rational constant ``c``."""
    f = current_field()
    cp, cq = f.const(c)
    uf = _UFUNC[kind]

    def part(cm: int, m: int, marks: bool) -> Callable[[np.ndarray], np.ndarray]:
        def fn(v: np.ndarray) -> np.ndarray:
            r = _modi(uf(v, cm), m)
            return _mark(r, v) if marks else r

        return fn

    p = _lazy(part(cp, f.p, False), x.p)
    if kind == "mul":
        p._lin = ("scale", x.p, cp)
    q = None if x.q is None else _lazy(part(cq, f.q, x.qmarks), x.q)
    return FV(x.shape, p, q, x.qmarks)


@implements("ff", "maximum")
def _ff_maximum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    a, b = args
    shape = np.broadcast_shapes(a.shape, b.shape)
    p = _lazy(np.maximum, a.p, b.p)  # equal p-residues: either operand gives the same p-residue
    if a.q is None and b.q is None:
        return FV(shape, p, None)

    a_has, b_has = a.q is not None, b.q is not None

    # lexicographic order on (p-residue, q-part), a meaningless q-part (-1, or no q-part) being the smallest
    def qpart(ap: np.ndarray, bp: np.ndarray, *qs: np.ndarray) -> np.ndarray:
        it = iter(qs)
        aq = next(it) if a_has else np.int64(-1)
        bq = next(it) if b_has else np.int64(-1)
        take_a = (ap > bp) | ((ap == bp) & (aq >= bq))
        return np.where(take_a, aq, bq).astype(np.int64, copy=False)

    deps = [a.p, b.p] + ([a.q] if a.q is not None else []) + ([b.q] if b.q is not None else [])
    return FV(shape, p, _lazy(qpart, *deps), a.qmarks or b.qmarks or not (a_has and b_has))


@implements("ff", "neg")
def _ff_neg(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], Fraction(-1), "mul")


@implements("ff", "square")
def _ff_square(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _ring("mul", args[0], args[0])


@implements("ff", "scale")
def _ff_scale(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], const_fraction(attrs["c"]), "mul")


@implements("ff", "shift")
def _ff_shift(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], const_fraction(attrs["c"]), "add")


def _exp(x: FV) -> FV:
    f = current_field()
    shape = x.shape
    if x.q is None:
        def none() -> np.ndarray:
            f.q_violations += math.prod(shape)
            return np.ones(shape, dtype=np.int64)  # (the test answers Unknown)

        return FV(shape, Part(none), None)
    marks = x.qmarks
    lin = x.q._lin
    if not marks and lin is not None and lin[0] == "matmul" and not x.q.ready:
        # exp of a product's q-part: each row block of the float64 product is reduced mod q and looked up
        # while in cache (the product's int64 q-part is never formed; if another op reads it, it is made then)
        tag = ("exp", f.p, f.q, f.g)
        epi = exp_epilogue(f.p, f.q, f.g)
        fused = Part(lambda av, bv: _matmul_mod(av, bv, f.q, epi=(epi, np.float64, tag)),
                     (as_kind(lin[1], "f"), as_kind(lin[3], "f")), kind="f")
        return FV(shape, fused, None)

    def fn(xq: np.ndarray) -> np.ndarray:
        if marks:
            bad = xq < 0
            if bad.any():
                f.q_violations += int(bad.sum())
                xq = np.maximum(xq, 0)
        return _exp_gather(_exp_table_f32(f.p, f.q, f.g), xq)

    # float64 residues: its readers are mostly a sum and a matmul (an int64 twin is made if needed)
    return FV(shape, Part(fn, (as_kind(x.q, "i"),), kind="f"), None)


@implements("ff", "exp")
def _ff_exp(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _exp(args[0])


_SALT = {"silu": 1, "gelu": 2, "relu": 3, "sqrt": 4}


def _salt(name: str) -> int:
    """The oracle salt of function ``name``: fixed for the first four, else a stable hash of the name
    (which includes the op's attributes, so ``leaky_relu(0.1)`` and ``leaky_relu(0.2)`` differ)."""
    if name in _SALT:
        return _SALT[name]
    return 16 + zlib.crc32(name.encode())


def opaque_key(op: str, attrs: dict[str, Any]) -> str:
    """The name of the random function standing for ``op`` with ``attrs`` (shared by both programs)."""
    if not attrs:
        return op
    return f"{op}({', '.join(f'{k}={attrs[k]!r}' for k in sorted(attrs))})"


def opaque(op: str) -> Callable[..., FV]:
    """The ``"ff"`` meaning of a unary op with no exact algebraic image (tanh, erf, log, ...): a fixed
    random function of its argument, drawn per trial (keyed by the field's key) and shared by both
    programs, so agreement holds for *every* function in its place. :func:`degree_bound` counts each
    application as opaque (a fresh variable) through the op's registry degree rule."""

    def fn(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
        return _oracle(opaque_key(op, attrs), args[0])

    return fn


def _oracle(name: str, x: FV, inverse: bool = False) -> FV:
    """A per-trial random function of ``x``'s p-residue giving both parts (``inverse``: their inverses)."""
    f = current_field()
    salt = _salt(name)
    z = Part(lambda v, k=f.key, s=salt: _mix(v, k, s), (as_kind(x.p, "i"),), kind="u")  # raw bits

    def part(shift: int, m: int) -> Callable[[np.ndarray], np.ndarray]:
        def fn(zz: np.ndarray) -> np.ndarray:
            r = ((zz >> np.uint64(shift)) % np.uint64(m)).astype(np.int64)
            return _inv(r, m) if inverse else r

        return fn

    return FV(x.shape, Part(part(0, f.p), (z,)), Part(part(21, f.q), (z,)))


for _u in ("silu", "gelu", "relu", "sqrt"):
    implements("ff", _u)(lambda args, attrs, it, ot, _n=_u: _oracle(_n, args[0]))


@implements("ff", "rsqrt")
def _ff_rsqrt(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _oracle("sqrt", args[0], inverse=True)


# tanh stays a random function: an exact tanh (through exp) would have no q-part, and soft-capped logits
# feed an exp (Gemma's attention), which needs one
for _u in ("log", "tanh", "erf", "softplus", "abs", "clamp", "leaky_relu"):
    implements("ff", _u)(opaque(_u))


def _sigmoid(x: FV) -> FV:
    """1 / (1 + exp(-x)): exact, since exp is (1 + exp(-x) is never 0: exp's values have odd order q)."""
    e = _exp(_affine(x, Fraction(-1), "mul"))
    return _reciprocal(_affine(e, Fraction(1), "add"))


@implements("ff", "sigmoid")
def _ff_sigmoid(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _sigmoid(args[0])


def _ones_like(x: FV) -> FV:
    return _affine(_affine(x, Fraction(0), "mul"), Fraction(1), "add")


def _reciprocal(x: FV) -> FV:
    return _ring("div", _ones_like(x), x)


@implements("ff", "reciprocal")
def _ff_reciprocal(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _reciprocal(args[0])


@implements("ff", "pow")
def _ff_pow(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """Integer exponents up to POW_EXACT_MAX: exact products (negative: of the inverse); x**0.5 and
    x**-0.5 are sqrt and rsqrt's random function; other exponents: a random function keyed by ``c``."""
    x = args[0]
    c = float(attrs["c"])
    if c.is_integer() and abs(c) <= POW_EXACT_MAX:
        k = int(abs(c))
        if k == 0:
            return _ones_like(x)
        y = x
        for _ in range(k - 1):
            y = _ring("mul", y, x)
        return _reciprocal(y) if c < 0 else y
    if c in (0.5, -0.5):
        return _oracle("sqrt", x, inverse=c < 0)
    return _oracle(opaque_key("pow", attrs), x)


@implements("ff", "minimum")
def _ff_minimum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """The smaller operand in the order ``maximum`` uses: ``a + b - maximum(a, b)`` (exactly the operand
    ``maximum`` did not pick, in both parts)."""
    a, b = args
    return _ring("sub", _ring("add", a, b), _ff_maximum(args, attrs, in_types, out_types))


@implements("ff", "min")
def _ff_min(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """The min along the axis in the order of ``max`` (p-residue, then q-part; a meaningless q-part the
    smallest), so a tiled min equals the flat one and ``minimum`` of partial mins."""
    x = args[0]
    ax = neg_axis(attrs["axis"], in_types[0].rank)
    shape = list(x.shape)
    shape[ax] = 1
    p = _lazy(lambda v: v.min(axis=ax, keepdims=True), x.p)
    if x.q is None:
        return FV(shape, p, None)
    return FV(shape, p, _lazy(lambda vp, vq: _min_q(vp, vq, ax), x.p, x.q), x.qmarks)


def _min_q(vp: np.ndarray, vq: np.ndarray, ax: int) -> np.ndarray:
    """The q-part of the min along ``ax``: the smallest q-part among the elements of smallest p-residue."""
    vp, vq = np.broadcast_arrays(vp, vq)
    ax %= vp.ndim
    low = vp.min(axis=ax, keepdims=True)
    big = np.iinfo(np.int64).max
    return np.where(vp == low, vq, big).min(axis=ax, keepdims=True)


@implements("ff", "where")
def _ff_where(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """``m * a + (1 - m) * b``: exact on masks m in {0, 1} (the only values a vm.bool input takes), so two
    programs equal as polynomials in m are equal for every mask."""
    m, a, b = args
    one_minus = _affine(_affine(m, Fraction(-1), "mul"), Fraction(1), "add")
    return _ring("add", _ring("mul", m, a), _ring("mul", one_minus, b))


implements("ff", "cast")(lambda args, attrs, it, ot: args[0])  # real-valued meaning: the value itself


def _sum_mod(v: np.ndarray, ax: int, m: int) -> np.ndarray:
    """``v.sum(axis=ax) mod m`` (keepdims) of int64 or float64 residues (exact: a float64 sum of
    fewer than 2**32 residues below 2**21 is an integer below 2**53)."""
    if v.dtype == np.float64 and v.shape[ax] < 1 << 32:
        r = v.sum(axis=ax, keepdims=True).astype(np.int64)
    else:
        r = v.astype(np.int64, copy=False).sum(axis=ax, keepdims=True)
    return _modi(r, m)


def _reduce_sum(x: FV, ax: int) -> FV:
    f = current_field()
    shape = list(x.shape)
    shape[ax] = 1

    def qfn(v: np.ndarray) -> np.ndarray:
        ok = (v >= 0).all(axis=ax, keepdims=True)
        return np.where(ok, np.maximum(v, 0).sum(axis=ax, keepdims=True) % f.q, -1)

    p = Part(lambda v, m=f.p: _sum_mod(v, ax, m), (x.p,))  # reads the part in whichever kind it is
    p._lin = ("sum", x.p, x.shape, ax)
    if x.q is None:
        q = None
    elif x.qmarks:
        q = _lazy(qfn, x.q)
    else:
        q = Part(lambda v, m=f.q: _sum_mod(v, ax, m), (x.q,))
    return FV(shape, p, q, x.qmarks)


@implements("ff", "sum")
def _ff_sum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _reduce_sum(args[0], neg_axis(attrs["axis"], in_types[0].rank))


@implements("ff", "mean")
def _ff_mean(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    ax = attrs["axis"]
    s = _reduce_sum(args[0], neg_axis(ax, in_types[0].rank))
    return _affine(s, Fraction(1, in_types[0].shape[ax]), "mul")


@implements("ff", "max")
def _ff_max(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    x = args[0]
    ax = neg_axis(attrs["axis"], in_types[0].rank)
    shape = list(x.shape)
    shape[ax] = 1
    p = _lazy(lambda v: v.max(axis=ax, keepdims=True), x.p)
    if x.q is None:
        return FV(shape, p, None)
    return FV(shape, p, _lazy(lambda vp, vq: _max_q(vp, vq, ax), x.p, x.q), x.qmarks)


def _max_q(vp: np.ndarray, vq: np.ndarray, ax: int) -> np.ndarray:
    """The q-part of the max along ``ax`` (keepdims) of the values with p-residues ``vp`` and q-parts ``vq``
    (``-1``: meaningless), in the order (p-residue, then q-part), so the result does not depend on the
    order of the elements: the q-part at the largest p-residue, or where that p-residue occurs more than
    once along ``ax``, the largest q-part among those elements."""
    vp, vq = np.broadcast_arrays(vp, vq)
    ax %= vp.ndim
    i = np.expand_dims(np.argmax(vp, axis=ax), ax)
    top = np.take_along_axis(vp, i, ax)
    out = np.take_along_axis(vq, i, ax)
    ties = np.count_nonzero(vp == top, axis=ax, keepdims=True) > 1
    if ties.any():
        where = np.nonzero(ties)
        rows = tuple(w for d, w in enumerate(where) if d != ax)
        sub_p, sub_q = np.moveaxis(vp, ax, -1)[rows], np.moveaxis(vq, ax, -1)[rows]
        out[where] = np.where(sub_p == top[where][:, None], sub_q, -2).max(axis=-1)
    return out


# --------------------------------------------------------------------------- matmul


def _find_openblas() -> Any:
    try:
        libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "*openblas*"))
        for path in libs:
            lib = ctypes.CDLL(path)
            for suffix in ("scipy_openblas_{}_num_threads64_", "openblas_{}_num_threads"):
                get = getattr(lib, suffix.format("get"), None)
                set_ = getattr(lib, suffix.format("set"), None)
                if get is not None and set_ is not None:
                    get.restype = ctypes.c_int
                    set_.argtypes = [ctypes.c_int]
                    return get, set_
    except OSError:
        pass
    return None


_BLAS: Any = None
_BLAS_SEARCHED = False


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    """Run numpy's OpenBLAS on one thread inside (on a small shared machine a threaded OpenBLAS spends
    more time waking and waiting for its threads than it saves on the many mid-size products here)."""
    global _BLAS, _BLAS_SEARCHED
    if not _BLAS_SEARCHED:
        _BLAS_SEARCHED = True
        _BLAS = _find_openblas()
    if _BLAS is None:
        yield
        return
    get, set_ = _BLAS
    n = get()
    if n == 1:
        yield
        return
    set_(1)
    try:
        yield
    finally:
        set_(n)


def _as_float(a: np.ndarray, perm: Sequence[int], shape: tuple[int, ...]) -> np.ndarray:
    """``a.transpose(perm)`` as a C-contiguous float64 array of ``shape`` (a view when it can be)."""
    t = a.transpose(perm)
    if t.dtype == np.float64:
        return np.ascontiguousarray(t).reshape(shape)
    out = np.empty(t.shape, dtype=np.float64)
    np.copyto(out, t, casting="unsafe")
    return out.reshape(shape)


#: a product with at least this many elements is computed in row blocks of about this many (its float64 block
#: stays in cache while it is reduced, instead of a second pass over a product-sized array)
_BLOCK_ELEMS = 1 << 17


def _blocked_matmul(af: np.ndarray, bf: np.ndarray, out: np.ndarray,
                    epi: Callable[[np.ndarray, np.ndarray], None]) -> None:
    """``epi(af[i, rows] @ bf[i], out[i, rows])`` over row blocks of about :data:`_BLOCK_ELEMS` elements."""
    n_both, rows, _ = af.shape
    cols = bf.shape[-1]
    step = max(1, min(rows, _BLOCK_ELEMS // max(cols, 1)))
    buf = np.empty((step, cols), dtype=np.float64)
    for i in range(n_both):
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            tb = buf[: r1 - r0]
            np.matmul(af[i, r0:r1], bf[i], out=tb)
            epi(tb, out[i, r0:r1])


def exp_epilogue(p: int, q: int, g: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """The block epilogue of an exp-fused product (for :func:`_blocked_matmul`): ``dst = g ** (tb mod q) mod p``
    for a float64 block ``tb`` of the product and a C-contiguous float64 ``dst``."""
    table = _exp_table_f32(p, q, g)

    def epi(tb: np.ndarray, dst: np.ndarray) -> None:
        idx = np.empty(tb.shape, dtype=np.int64)
        _f2i_into(tb, q, idx)
        assert dst.flags.c_contiguous  # (a row block of the fresh product array: reshape is a view)
        # through a float32 table and a small buffer: a float64 table gathered straight into the result
        # ran 2.86 s instead of 1.83 s on the gqa b8 pair (one thread), though faster in isolation
        _gather_into(table, idx.reshape(-1), dst.reshape(-1))

    return epi


def _f2i_into(tb: np.ndarray, m: int, dst: np.ndarray) -> None:
    """``dst[...] = tb mod m`` for a float64 block of integers below 2**53 and an int64 ``dst``."""
    np.copyto(dst, tb, casting="unsafe")
    _modi(dst, m)


def _matmul_mod(a: np.ndarray, b: np.ndarray, m: int,
                epi: tuple[Callable[[np.ndarray, np.ndarray], None], Any, tuple[Any, ...]] | None = None
                ) -> np.ndarray:
    """Exact ``a @ b mod m`` of residue arrays in [0, m), m <= 2**21, with broadcast batch dims.

    Batch axes along which only ``a`` varies are folded into its rows, those along which only ``b``
    varies into its columns; each remaining batch item is one float64 BLAS product per contraction
    chunk of at most 2048 (exact: every partial sum is an integer below 2**53). The result is an
    int64 array of the broadcast shape (possibly a transposed view). ``epi``: ``(fn, dtype, tag)``: instead,
    ``fn(block, dst)`` writes the result of each float64 block of the product (integers below 2**53, not
    reduced) into ``dst`` of the result, an array of ``dtype`` (a contraction of at most 2048 only);
    ``tag`` names what ``fn`` computes (with every parameter it depends on).

    Big products (computed in row blocks) are shared between the programs of a trial
    (:mod:`verimirage.smt.ffshare`): inside :func:`~verimirage.smt.ffshare.storing` they are kept
    (read-only), inside :func:`~verimirage.smt.ffshare.finding` they are first looked up.
    """
    nd = max(a.ndim, b.ndim)
    a = a.reshape((1,) * (nd - a.ndim) + a.shape)
    b = b.reshape((1,) * (nd - b.ndim) + b.shape)
    nb = nd - 2
    both = [t for t in range(nb) if a.shape[t] == b.shape[t] and a.shape[t] > 1]
    a_only = [t for t in range(nb) if a.shape[t] > 1 and b.shape[t] == 1]
    b_only = [t for t in range(nb) if b.shape[t] > 1 and a.shape[t] == 1]
    bad = [t for t in range(nb) if a.shape[t] != b.shape[t] and a.shape[t] != 1 and b.shape[t] != 1]
    if bad:
        raise GraphError(f"ff matmul: batch dims {a.shape[:-2]} and {b.shape[:-2]} do not broadcast")
    ones_a = [t for t in range(nb) if t not in both and t not in a_only]
    ones_b = [t for t in range(nb) if t not in both and t not in b_only]
    mm, kk = a.shape[-2:]
    nn = b.shape[-1]
    n_both = math.prod(a.shape[t] for t in both)
    n_a = math.prod(a.shape[t] for t in a_only)
    n_b = math.prod(b.shape[t] for t in b_only)
    out: np.ndarray | None = None
    big = n_both * n_a * mm * n_b * nn >= _BLOCK_ELEMS and n_a * mm * n_b * nn >= _BLOCK_ELEMS // 4
    if epi is not None and kk > _CHUNK:
        raise GraphError(f"ff matmul: a block epilogue needs a contraction of at most {_CHUNK}, got {kk}")
    # (both, a_only, M, b_only, N): the batch axes in their order, then M, N
    r_shape = ([a.shape[t] for t in both] + [a.shape[t] for t in a_only] + [mm]
               + [b.shape[t] for t in b_only] + [nn])
    layout = ([a.shape[t] for t in both], [a.shape[t] for t in a_only] + [mm], [b.shape[t] for t in b_only] + [nn])
    blocked = kk <= _CHUNK and (big or epi is not None)
    fn, dt, tag = epi if epi is not None else ((lambda tb, dst: _f2i_into(tb, m, dst)), np.int64, ("mod", m))
    # the same dot products, computed by another program of this trial: first by where the operands lie (views
    # of the same read-only inputs), before they are folded or copied
    r = ffshare.find_aliased(tag, a.transpose([*both, *a_only, *ones_a, nb, nb + 1]),
                             b.transpose([*both, *ones_b, *b_only, nb + 1, nb]), layout) if blocked else None
    if r is not None:
        return _unfold(r, a.shape, b.shape, both, a_only, b_only, nb, mm, nn)
    af = _as_float(a, [*both, *a_only, *ones_a, nb, nb + 1], (n_both, n_a * mm, kk))
    bf = _as_float(b, [*both, *ones_b, nb, *b_only, nb + 1], (n_both, kk, n_b * nn))
    with _one_blas_thread():
        if blocked:
            # then by value (checked operand by operand)
            r = ffshare.find(tag, af, bf, layout)
            if r is None:
                out = ffgpu.product(af, bf, tag, _CHUNK)  # (on a GPU, when there is one)
                if out is None:
                    out = np.empty((n_both, n_a * mm, n_b * nn), dtype=dt)
                    _blocked_matmul(af, bf, out, fn)
                ffshare.store(tag, af, bf, out)
        elif kk <= _CHUNK:
            out = _f2i_mod(np.matmul(af, bf), m)
        else:
            out = ffgpu.product(af, bf, ("mod", m), _CHUNK)
            if out is None:
                out = _chunked_matmul_mod(af, bf, m)
    if r is None:
        assert out is not None
        r = out.reshape(r_shape)
    return _unfold(r, a.shape, b.shape, both, a_only, b_only, nb, mm, nn)


def _chunked_matmul_mod(af: np.ndarray, bf: np.ndarray, m: int) -> np.ndarray:
    """``af @ bf mod m`` (int64) of ``(n, M, K)`` and ``(n, K, N)`` float64 residues, one float64 product per
    contraction chunk of :data:`_CHUNK` (exact), summed in int64."""
    out: np.ndarray | None = None
    kk = af.shape[-1]
    for s in range(0, kk, _CHUNK):
        pi = np.matmul(af[..., s : s + _CHUNK], bf[:, s : s + _CHUNK, :]).astype(np.int64)
        out = pi if out is None else np.add(out, pi, out=out)
        if (s // _CHUNK) % 512 == 511:  # keep the int64 sum of chunk results below 2**63
            _modi(out, m)
    assert out is not None
    return _modi(out, m)


def _unfold(r: np.ndarray, a_shape: tuple[int, ...], b_shape: tuple[int, ...], both: list[int], a_only: list[int],
            b_only: list[int], nb: int, mm: int, nn: int) -> np.ndarray:
    """A product laid out (both, a_only, M, b_only, N) as the broadcast shape (batch axes in order, M, N)."""
    order = both + a_only + b_only  # the batch axis each of r's leading axes stands for
    pos = {t: i for i, t in enumerate(both + a_only)}
    pos.update({t: len(both) + len(a_only) + 1 + i for i, t in enumerate(b_only)})
    m_ax = len(both) + len(a_only)
    n_ax = r.ndim - 1
    perm = [pos[t] for t in sorted(order)] + [m_ax, n_ax]
    r = r.transpose(perm)
    full = (*tuple(max(a_shape[t], b_shape[t]) for t in range(nb)), mm, nn)
    return r.reshape(full)


def _modmatmul(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact ``a @ b mod m`` of int residue arrays (m <= 2**21)."""
    return _matmul_mod(np.asarray(a % m, dtype=np.int64), np.asarray(b % m, dtype=np.int64), m)


def _matmul_q(x: np.ndarray, y: np.ndarray, q: int, marks: bool) -> np.ndarray:
    """The q-part of ``x @ y``: a row of ``x`` or column of ``y`` with a meaningless element gives
    meaningless results."""
    if not marks:
        return _matmul_mod(x, y, q)
    x_bad = np.asarray(x < 0)
    y_bad = np.asarray(y < 0)
    out = np.array(_matmul_mod(np.maximum(x, 0), np.maximum(y, 0), q))
    bad = np.asarray(x_bad.any(axis=-1))[..., :, None] | np.asarray(y_bad.any(axis=-2))[..., None, :]
    if bad.any():
        out[np.broadcast_to(bad, out.shape)] = -1
    return out


def _row_scaling(part: Part, shape: tuple[int, ...]) -> tuple[Part, Part, str] | None:
    """``(base, scale, "mul" | "div")`` when ``part`` (of ``shape``) is ``base op scale`` with ``scale``
    constant along the last axis (a row scaling, which a matmul may apply to its product instead)."""
    lin = part._lin
    if lin is None or lin[0] != "ring" or lin[1] not in ("mul", "div") or len(shape) < 2:
        return None
    _, kind, x, xs, y, ys = lin
    if ys[-1] == 1 and xs == shape:
        return x, y, kind
    if kind == "mul" and xs[-1] == 1 and ys == shape:
        return y, x, kind
    return None


@implements("ff", "matmul")
def _ff_matmul(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    f = current_field()
    a, b = args
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    rs = _row_scaling(a.p, a.shape)
    if rs is not None and not a.p.ready:
        # a = base op s with s constant along the contraction: (base op s) @ b == (base @ b) op s, exactly
        base, sc, op = rs

        def scaled(x: np.ndarray, y: np.ndarray, sv: np.ndarray, m: int = f.p) -> np.ndarray:
            prod = _matmul_mod(x, y, m)
            return _modi(np.multiply(prod, _inv(sv, m) if op == "div" else sv), m)

        p = Part(scaled, (as_kind(base, "f"), as_kind(b.p, "f"), as_kind(sc, "i")))
    else:
        p = _lazy_f(lambda x, y, m=f.p: _matmul_mod(x, y, m), a.p, b.p)
    p._lin = ("matmul", a.p, a.shape, b.p, b.shape)
    if a.q is None or b.q is None:
        return FV(shape, p, None)
    marks = a.qmarks or b.qmarks
    qp = _lazy_f(lambda x, y, m=f.q: _matmul_q(x, y, m, marks), a.q, b.q)
    if a.shape[-1] <= _CHUNK:
        qp._lin = ("matmul", a.q, a.shape, b.q, b.shape)  # read by a fused exp (see _exp)
    return FV(shape, p, qp, marks)


@implements("ff", "rms_norm")
def _ff_rms(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    x = args[0]
    rank = in_types[0].rank
    ax = attrs["axis"]
    nax = neg_axis(ax, rank)
    ms = _affine(_reduce_sum(_ring("mul", x, x), nax), Fraction(1, in_types[0].shape[ax]), "mul")
    ms = _affine(ms, const_fraction(attrs["eps"]), "add")
    y = _ring("mul", x, _oracle("sqrt", ms, inverse=True))
    if len(args) == 2:
        w = args[1]
        y = _ring("mul", y, w.reshape(w.shape + (1,) * (-nax - 1)))
    return y


@implements("ff", "concat")
def _ff_concat(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    r = in_types[0].rank
    ax = neg_axis(attrs["axis"], r)
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - r] for a in args))
    shapes = [batch + a.shape[a.ndim - r :] for a in args]
    out_shape = list(shapes[0])
    out_shape[ax] = sum(s[ax] for s in shapes)

    def cat(*vs: np.ndarray) -> np.ndarray:
        return np.concatenate([np.broadcast_to(v, s) for v, s in zip(vs, shapes, strict=True)], axis=ax)

    p = _lazy(cat, *(a.p for a in args))
    p._lin = ("concat", tuple(a.p for a in args), tuple(a.shape for a in args), ax % len(out_shape))
    if all(a.q is None for a in args):
        return FV(out_shape, p, None)
    qs = [a.q if a.q is not None else Part.of(np.broadcast_to(np.int64(-1), a.shape)) for a in args]
    marks = any(a.qmarks or a.q is None for a in args)
    return FV(out_shape, p, _lazy(cat, *qs), marks)


@implements("ff", "transpose")
def _ff_transpose(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    r = in_types[0].rank
    x = args[0]
    i, j = neg_axis(attrs["a"], r) % x.ndim, neg_axis(attrs["b"], r) % x.ndim
    perm = list(range(x.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return x.transpose(perm)


# --------------------------------------------------------------------------- the randomized test


#: ops the finite-field test models by an order on residues (max) or a keyed random function of a residue:
#: on them the test is evidence, not a probability (e.g. residues are >= 0, so ``maximum(x, 0) = x``)
ORDER_ORACLE_OPS = frozenset({"max", "maximum", "loop_max", "running_max", "relu", "sqrt", "rsqrt", "silu", "gelu",
                              "rms_norm"})


@dataclass(frozen=True)
class DegreeInfo:
    """What the stated bounds of the finite-field test read off a program (:func:`degree_info`).

    ``degree``: a bound on the degree of every output as a rational function ``N / D`` (``max(deg N, deg D)``)
    of the inputs and the atoms, each exp / oracle *node* one atom; ``opaque``: the number of such nodes
    (the per-node model of the trial count). ``applications``: element-wise applications of those ops plus
    element-wise divisions weighted by their divisor's degree (each element is a separate application: the
    figure the honest, element-wise bound counts). ``order_oracle``: the ops of :data:`ORDER_ORACLE_OPS` it uses.
    """

    degree: int
    opaque: int
    applications: int
    order_oracle: tuple[str, ...]


def _order_or_oracle(op: str, attrs: dict[str, Any], nargs: int) -> bool:
    """Whether the registry models ``op`` in the field by an order (max-like) or a keyed random function."""
    d = OPS[op]
    if d.has(Prop.STRUCTURAL) or d.has(Prop.LOOP) or d.has(Prop.EXPONENTIAL):
        return False
    return d.family == "max" or d.degree_of([1] * nargs, attrs).opaque > 0


def _exact_degree(op: str, attrs: dict[str, Any], a: list[Any], shapes: list[Any], rank: int,
                  align: Callable[..., frozenset[int]]) -> tuple[Any, int] | None:
    """``(N, D, varying axes)`` of the ops added for real models whose field meaning is exact (cast, where,
    reciprocal, integer powers, minimum/min as the order's other operand), and the divisor degree each
    element divides by (0: none); None for every other op (handled by :func:`degree_info` itself)."""
    def deg(v: Any) -> int:
        return int(max(v[0], v[1]))

    if op == "cast":
        return a[0], 0
    if op == "where":  # m a + (1 - m) b over the common denominator Da Db
        m, x, y = a
        vary = frozenset().union(*(align(v, s, rank) for v, s in zip(a, shapes, strict=True)))
        return (deg(m) + max(x[0] + y[1], y[0] + x[1]), x[1] + y[1] + m[1], vary), 0
    if op == "minimum":  # a + b - maximum(a, b): add-like, as maximum
        x, y = a
        vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
        return (max(x[0] + y[1], y[0] + x[1]), x[1] + y[1], vx | vy), 0
    if op == "min":
        ax = attrs["axis"] % len(shapes[0])
        return (a[0][0], a[0][1], frozenset(a[0][2] - {ax})), 0
    if op == "reciprocal":  # Dx / Nx: every element divides by its numerator
        x = a[0]
        nx = frozenset(ax for ax, sz in enumerate(shapes[0]) if sz != 1)
        return (x[1], x[0], x[2] | (nx if x[0] else frozenset())), max(1, deg(x))
    if op == "pow":
        c = float(attrs["c"])
        if not (c.is_integer() and abs(c) <= POW_EXACT_MAX):
            return None  # an oracle (or sqrt's): an atom
        k, x = int(abs(c)), a[0]
        if k == 0:
            return (0, 0, frozenset()), 0
        if c > 0:
            return (k * x[0], k * x[1], x[2]), 0
        nx = frozenset(ax for ax, sz in enumerate(shapes[0]) if sz != 1)
        return (k * x[1], k * x[0], x[2] | (nx if x[0] else frozenset())), k * max(1, deg(x))
    return None


def degree_info(g: Graph) -> DegreeInfo:
    """The degree bounds of ``g`` (:class:`DegreeInfo`).

    Sound for sums of quotients: each value is tracked as ``N / D`` with ``deg N <= n``, ``deg D <= d`` and the
    axes along which ``D`` may differ between elements; a reduction of ``m`` elements along such an axis
    puts them over a common denominator (``n + (m - 1) d``, ``m d``); one along an axis ``D`` is constant on
    keeps ``d`` (the softmax normaliser). Values coming out of a kernel's blocks, or a loop's iterations, are
    taken to vary along every axis.
    """
    opaque = [0, 0, 0]  # max argument degree of an atom, atom nodes, element-wise applications
    orders: set[str] = set()
    V = tuple[int, int, frozenset[int]]  # (n, d, axes where the denominator may vary)

    def deg(v: V) -> int:
        return max(v[0], v[1])

    def align(v: V, shape: Sequence[int], out_rank: int) -> frozenset[int]:
        off = out_rank - len(shape)
        return frozenset(a + off for a in v[2] if shape[a] != 1)

    def allaxes(v: V, rank: int) -> V:
        return (v[0], v[1], frozenset(range(rank)) if v[1] else frozenset())

    def reduce(v: V, ax: int, m: int) -> V:
        n, d, vary = v
        if d and ax in vary:
            n, d = n + (m - 1) * d, m * d
        return (n, d, frozenset(vary - {ax}))

    def walk(nodes: Sequence[Any], in_vals: list[V], reps: int, frange: int, post: list[bool] | None) -> list[V]:
        vals: list[V] = []
        for i, n in enumerate(nodes):
            a = [vals[j] for j, _ in n.args]
            shapes = [nodes[j].outs[k].shape for j, k in n.args]
            out = n.outs[0].shape if n.outs else ()
            rank = len(out)
            times = reps * (frange if post is not None and not post[i] else 1)
            elems = math.prod(out) * times
            if n.op in ("input", "arg"):
                idx = n.attr("arg") if n.op == "input" and n.attr("arg") is not None else n.attr("index")
                v = in_vals[idx] if idx is not None and idx < len(in_vals) else (1, 0, frozenset())
                vals.append(allaxes(v, rank) if n.op == "input" and post is not None else v)
                continue
            if n.op == "custom":
                blk = n.attr("block")
                outs = walk(blk.nodes, a, reps * blk.num_blocks, blk.frange, blk.post_loop())
                vals.append(allaxes(max(outs, key=deg) if outs else (1, 0, frozenset()), rank))
                continue
            if n.op == "fused":
                outs = walk(n.attr("thread").nodes, a, times, 1, None)
                vals.append(allaxes(max(outs, key=deg) if outs else (1, 0, frozenset()), rank))
                continue
            if n.op in ORDER_ORACLE_OPS or _order_or_oracle(n.op, n.attr_dict, len(a)):
                orders.add(n.op)
            exact = _exact_degree(n.op, n.attr_dict, a, shapes, rank, align)
            if exact is not None:  # registry ops with an exact polynomial / rational meaning
                v, divided = exact
                vals.append(v)
                opaque[2] += elems * divided
                continue
            if n.op in ("mul", "div"):
                x, y = a
                vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
                if n.op == "mul":
                    vals.append((x[0] + y[0], x[1] + y[1], vx | vy))
                else:  # x / y = (Nx Dy) / (Dx Ny); each element's divisor may vanish in the field
                    ny = frozenset(ax + rank - len(shapes[1]) for ax, s in enumerate(shapes[1]) if s != 1)
                    vals.append((x[0] + y[1], x[1] + y[0], vx | vy | (ny if y[0] else frozenset())))
                    opaque[2] += elems * max(1, deg(y))
            elif n.op in ("add", "sub", "maximum"):
                x, y = a
                vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
                vals.append((max(x[0] + y[1], y[0] + x[1]), x[1] + y[1], vx | vy))
            elif n.op == "square":
                vals.append((2 * a[0][0], 2 * a[0][1], a[0][2]))
            elif n.op in ("neg", "scale", "running_max"):
                vals.append(a[0])
            elif n.op == "shift":
                vals.append((deg(a[0]), a[0][1], a[0][2]))
            elif n.op == "transpose":
                i0, i1 = n.attr("a") % rank, n.attr("b") % rank
                sw = {i0: i1, i1: i0}
                vals.append((a[0][0], a[0][1], frozenset(sw.get(x, x) for x in a[0][2])))
            elif n.op in ("sum", "mean", "max"):
                ax = n.attr("axis") % len(shapes[0])
                v = a[0] if n.op == "max" else reduce(a[0], ax, shapes[0][ax])
                vals.append((v[0], v[1], frozenset(v[2] - {ax})))
            elif n.op == "matmul":
                x, y = a
                ra, rb = len(shapes[0]), len(shapes[1])
                kx, ky = ra - 1, rb - 2
                vary = frozenset(ax + rank - ra for ax in x[2] if ax < ra - 2 and shapes[0][ax] != 1)
                vary |= frozenset(ax + rank - rb for ax in y[2] if ax < rb - 2 and shapes[1][ax] != 1)
                vary |= ({rank - 2} if ra - 2 in x[2] else set()) | ({rank - 1} if rb - 1 in y[2] else set())
                pv: V = (x[0] + y[0], x[1] + y[1], frozenset({0}) if (kx in x[2] or ky in y[2]) else frozenset())
                r = reduce(pv, 0, shapes[0][-1])
                vals.append((r[0], r[1], frozenset(vary)))
            elif n.op == "concat":
                nd = max(x[0] for x in a), max(x[1] for x in a)
                vary = frozenset().union(*(x[2] for x in a))
                ax = n.attr("axis") % rank
                vals.append((nd[0], nd[1], vary | ({ax} if nd[1] else frozenset())))
            elif n.op in ("loop_sum", "rescaled_sum"):
                x = a[0]
                n_, d_ = (x[0] + (frange - 1) * x[1], frange * x[1]) if x[1] else (x[0], 0)
                if n.op == "rescaled_sum":  # acc * exp(m_prev - m) + x: one more atom factor
                    n_ += 1 + a[1][0]
                    opaque[1] += 1
                    opaque[2] += elems * frange
                vals.append((n_, d_, frozenset(range(rank)) if d_ else frozenset()))
            elif n.op == "loop_max":
                vals.append(allaxes(a[0], rank))
            elif n.op == "rms_norm":
                # x * rsqrt(mean(x*x) + eps) [* w]: the rsqrt an atom
                opaque[0] = max(opaque[0], 2 * deg(a[0]))
                opaque[1] += 1
                opaque[2] += (elems // max(1, shapes[0][n.attr("axis") % rank])) * max(1, 2 * deg(a[0]))
                vary = frozenset().union(*(align(x, s, rank) for x, s in zip(a, shapes, strict=True)))
                vals.append((sum(x[0] for x in a) + 1, sum(x[1] for x in a), vary))
            else:  # exp, the oracles, and any op not known here: a fresh atom per node
                arg = max((deg(x) for x in a), default=1)
                opaque[0] = max(opaque[0], arg)
                opaque[1] += 1
                opaque[2] += elems * max(1, arg)
                vals.append((1, 0, frozenset()))
        return vals

    nodes = node_list(g)
    vals = walk(nodes, [], 1, 1, None)
    out = max((deg(vals[i]) for i, _ in output_refs(g)), default=1)
    return DegreeInfo(max(out, opaque[0], 1), opaque[1], opaque[2], tuple(sorted(orders)))


def _node_model_degree(g: Graph) -> tuple[int, int]:
    """The per-node model's (degree, opaque) as first written (kept so that recorded bounds stay the same
    where it is at least the sound degree of :func:`degree_info`)."""
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
            dg = OPS[n.op].degree_of(a, n.attr_dict)
            deg_opaque[1] += dg.opaque
            if dg.opaque:
                deg_opaque[0] = max(deg_opaque[0], dg.inner)
            d.append(dg.result)
        return d

    nodes = node_list(g)
    ds = walk(nodes, [])
    out = max((ds[i] for i, _ in output_refs(g)), default=1)
    return max(out, deg_opaque[0]), deg_opaque[1]


def degree_bound(g: Graph) -> tuple[int, int]:
    """(degree, opaque) for the per-node model bound: a rational-function degree bound of the outputs, sound
    for sums of quotients (:func:`degree_info`; never below the figure first used, so recorded bounds stay),
    and the number of exp / nonlinear-unary nodes, treating each such node's result as a fresh variable."""
    d0, o0 = _node_model_degree(g)
    return max(d0, degree_info(g).degree), o0


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
    #: whether the outputs were compared through random bilinear projections (:mod:`verimirage.smt.ffproj`)
    projected: bool = False
    #: where the big products ran (:func:`verimirage.smt.ffgpu.describe`)
    device: str = "cpu"
    #: the false-accept probability this test states (None: it states none; ``bound`` is then the per-node
    #: model's figure only): element-wise applications counted, and only for programs without order or
    #: oracle ops (:func:`stated_bound`)
    stated_bound: float | None = None
    #: why no probability is stated, or how the stated one was made
    bound_note: str = ""



def uses_exp(g: Graph) -> bool:
    """Whether ``g`` applies ``exp`` anywhere (``rescaled_sum`` does, inside block graphs)."""

    def walk(nodes: Sequence[Any]) -> bool:
        for n in nodes:
            if n.op in OPS and (OPS[n.op].family == FAMILY_EXP or OPS[n.op].hooks.get("uses_exp")):
                return True
            if n.op == "custom" and walk(n.attr("block").nodes):
                return True
            if n.op == "fused" and walk(n.attr("thread").nodes):
                return True
        return False

    return walk(node_list(g))


_GEN_CHUNK = 1 << 20


def _input_part(shape: tuple[int, ...], seed: int, index: int, part: int, m: int) -> Part:
    def gen() -> np.ndarray:
        # float64 (inputs mostly feed matmuls, which read float64 residues), filled in chunks of int32 draws
        rng = np.random.default_rng([seed, 0x5EED, part, index])
        out = np.empty(shape, dtype=np.float64)
        flat = out.reshape(-1)
        for s in range(0, flat.size, _GEN_CHUNK):
            n = min(_GEN_CHUNK, flat.size - s)
            flat[s : s + n] = rng.integers(0, m, size=n, dtype=np.int32)
        return _frozen(out)

    return Part(gen, kind="f")


def input_values(g: Graph, fld: Field, seed: int) -> dict[str, FV]:
    """Fresh uniform random residues for every input of ``g``, from ``seed``, as lazy values.

    Each (input, part) has its own stream (inputs in name order), so a part has the same value
    whether or not, and in whichever order, the other parts are made.
    """
    vals = {}
    for i, t in enumerate(sorted(g.inputs, key=lambda t: str(t.name))):
        shape = tuple(t.shape)
        vals[str(t.name)] = FV(shape, _input_part(shape, seed, i, 0, fld.p), _input_part(shape, seed, i, 1, fld.q))
    return vals


def trial_inputs(g: Graph, fld: Field, seed: int, *, q_part: bool = True) -> dict[str, np.ndarray]:
    """The inputs of :func:`input_values` as arrays ``(2, *shape)`` (p- and q-residues), or
    ``(1, *shape)`` with ``q_part=False``; the p-parts are the same either way."""
    out = {}
    for k, v in input_values(g, fld, seed).items():
        out[k] = stacked(v) if q_part else ints(v.p)[None]
    return out


#: the largest false-accept bound a ``Proved`` verdict may rest on (fewer trials, e.g. ``trials=1``, give Unknown)
MAX_ACCEPTABLE_BOUND = 2.0**-40


def stated_bound(infos: Sequence[DegreeInfo], trials: int, project: bool) -> tuple[float | None, str]:
    """The false-accept probability the test states after ``trials`` equal trials of programs with
    ``infos`` (:func:`degree_info`), with the reason; None where it states none.

    Per trial ``(2 * degree + applications + 1) / q + projection``: every element-wise exp / oracle
    application and every element's divisor counts (an atom's argument may coincide with another's, a
    divisor may vanish, in each element separately). Programs with max / relu / sqrt-family ops get no
    probability at all: residues are ordered (``maximum(x, 0) = x`` holds in every field) and the oracles are
    keyed functions of one residue, so the field test is evidence there, not a bound. Nor does a figure above
    :data:`MAX_ACCEPTABLE_BOUND`."""
    orders = sorted({o for i in infos for o in i.order_oracle})
    if orders:
        return None, (f"no probability stated: {', '.join(orders)} are modelled by an order on residues or keyed "
                      "oracles (the field test is evidence there, not a bound)")
    deg = max(i.degree for i in infos)
    apps = sum(i.applications for i in infos)
    q_min = int(safe_primes()[0] - 1) // 2
    per = min(1.0, (2 * deg + apps + 1) / q_min + (projection_bound() if project else 0.0))
    bound = per ** max(trials, 0)
    if bound > MAX_ACCEPTABLE_BOUND:
        return None, (f"no probability stated: {apps} element-wise exp/division application(s) at degree {deg} "
                      f"give {bound:.3g} after {trials} trial(s) (above {MAX_ACCEPTABLE_BOUND:.3g}); the "
                      "per-node model bound is not a probability for them")
    return bound, f"element-wise: degree {deg}, {apps} application(s), {trials} trial(s)"


def trials_needed(per_trial: float, target_log2: float = 60.0, minimum: int = 2) -> int:
    """Independent trials so that ``per_trial ** n <= 2**-target_log2``."""
    if per_trial >= 1:
        return 0
    return max(minimum, math.ceil(target_log2 / -math.log2(per_trial)))


def default_seeds(seed: int, n: int) -> tuple[int, ...]:
    """The first ``n`` trial seeds derived from ``seed`` (a prefix of one fixed stream)."""
    return tuple(int(s) for s in np.random.default_rng([seed, 0xF1E1D]).integers(0, 1 << 62, size=n))


def _first_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first element where the p-residues ``x`` and ``y`` differ, or None."""
    x0, y0 = np.broadcast_arrays(x, y)
    if np.array_equal(x0, y0):
        return None
    return tuple(int(v) for v in np.argwhere(x0 != y0)[0])


def held_bytes(values: Mapping[str, FV]) -> int:
    """Bytes of the arrays computed so far for the parts of ``values`` (and their int/float twins)."""
    n = 0
    for v in values.values():
        for part in (v.p, v.q):
            while part is not None:
                if part._val is not None:
                    n += part._val.nbytes
                part = part._twin
    return n


def _nbytes(g: Graph) -> int:
    return sum(8 * 2 * math.prod(t.shape) for t in g.inputs)


def _run_lazy(g: Graph, inputs: Mapping[str, FV], fld: Field) -> list[FV]:
    return list(run(g, inputs, FFDomain(fld)))


#: environment variable: the most threads the finite-field test runs trials on (default: usable cores, at most 4)
THREADS_ENV = "VERIMIRAGE_FF_THREADS"
#: the trials of one test in flight at once hold at most about this many bytes of input values
PARALLEL_BYTES = 6 << 30


def ff_workers(trials: int, nbytes: int) -> int:
    """How many trials to evaluate at once: usable cores (or ``$VERIMIRAGE_FF_THREADS``), at most
    ``trials``, and few enough that the trials' input values (``nbytes`` each) stay under
    :data:`PARALLEL_BYTES` together."""
    n = ffshare.env_int(THREADS_ENV, 0, 1, GraphError)
    if not n:
        try:
            n = min(4, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            n = min(4, os.cpu_count() or 1)
    return max(1, min(n, trials, PARALLEL_BYTES // max(1, nbytes)))


@contextlib.contextmanager
def collect_here() -> Iterator[None]:
    """Hold automatic garbage collection off until the block ends, so that worker threads started inside
    it never run a collection; cyclic garbage waits for the next collection on whichever thread allocates
    after the block (normally the caller's). Objects that must be freed on the thread that made them
    (egglog's e-graphs, left in cycles by a search) are otherwise dropped by a worker thread that happens
    to trigger a collection, which egglog refuses (and leaks them). No collection is forced here: a full
    one costs ~0.2 s in a process with torch, Z3 and egglog loaded, more than a small verification."""
    if not gc.isenabled():  # nested, or the caller manages collection itself
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _run_trials(trial: Callable[[int], FFResult | None], n: int, workers: int) -> FFResult | None:
    """Run ``trial(0) .. trial(n - 1)`` (``workers`` at a time) and return the first (lowest-index)
    non-None result, or None. No trial starts after an earlier one returned a result (those already
    running finish); the answer does not depend on ``workers`` (trials are independent and deterministic)."""
    with _one_blas_thread(), collect_here():  # once for all threads: per-call set/restore would race
        if workers <= 1:
            for ti in range(n):
                r = trial(ti)
                if r is not None:
                    return r
            return None
        ctx = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vm-ff") as pool:
            # a window of ``workers`` trials in flight, collected in order: trial ti + workers starts
            # only once trial ti is known to have passed
            futs = {ti: pool.submit(ctx.copy().run, trial, ti) for ti in range(min(workers, n))}
            for ti in range(n):
                r = futs.pop(ti).result()
                if r is not None:
                    for f in futs.values():
                        f.cancel()
                    return r
                if ti + workers < n:
                    futs[ti + workers] = pool.submit(ctx.copy().run, trial, ti + workers)
        return None


#: per (trial, output): the stream of a projection's random factors (:func:`observe`)
_PROJ_SALT = 0x9B0F


def projection_factors(shape: tuple[int, ...], seed: int, k: int, m: int) -> list[np.ndarray]:
    """The random factors ``U`` (over ``shape[:-1]``) and ``r`` (over the last axis) of output ``k``'s
    projection in the trial of ``seed``: residues uniform in [0, m), each of rank ``len(shape)``."""
    rng = np.random.default_rng([seed, _PROJ_SALT, k])
    r = rng.integers(0, m, size=(1,) * (len(shape) - 1) + shape[-1:], dtype=np.int64)
    if len(shape) < 2:
        return [r]
    return [rng.integers(0, m, size=(*shape[:-1], 1), dtype=np.int64), r]


def observe(out: FV, seed: int, k: int, fld: Field, project: bool) -> np.ndarray:
    """What the test compares of output ``k``: its p-residues, or (``project``, rank >= 1) the residue
    ``sum(O * U * r) mod p`` of :func:`projection_factors`, pushed through ``O``'s linear operations."""
    if not project or not out.shape:
        return ints(out.p)
    from .ffproj import project as _project

    return np.array([_project(out.p, out.shape, projection_factors(out.shape, seed, k, fld.p), fld.p)],
                    dtype=np.int64)


def projection_bound() -> float:
    """What comparing projections adds to the per-trial bound: ``2 / p`` for the smallest prime ``p``."""
    return 2.0 / float(safe_primes()[0])


class FFReference:
    """A target program's finite-field evaluations, cached per trial seed, to test many candidates.

    Each candidate costs one evaluation per trial: the target's compared values (and, when small,
    its inputs) are computed once per seed and reused. Seeds are a fixed stream from ``seed``, so
    every candidate is tested on the same trials. ``project``: compare random bilinear projections
    of the outputs (:func:`observe`; the default) instead of every element. ``keep_shared``: keep the
    target's big products for the candidates of later :meth:`compare` calls (within the process-wide budget of
    :mod:`verimirage.smt.ffshare`); a one-off comparison drops each trial's when the trial is done, so that
    the next trial's arrays reuse their memory.
    """

    def __init__(self, target: Graph, *, seed: int = 0, target_log2: float = 60.0, project: bool = True,
                 keep_shared: bool = True) -> None:
        self.target = target
        #: keep the target's big products for later candidates (False: drop a trial's once its candidate is done)
        self.keep_shared = keep_shared
        self.seed = seed
        self.target_log2 = target_log2
        self.project = project
        self.degree, self.opaque = degree_bound(target)
        self.info = degree_info(target)
        self.uses_exp = uses_exp(target)
        self._outs: dict[int, tuple[list[np.ndarray], int]] = {}
        self._inputs: dict[int, dict[str, FV]] = {}
        #: the target's big products per seed, which candidates reuse (:mod:`verimirage.smt.ffshare`)
        self.shared = ffshare.Store()

    def inputs(self, s: int, fld: Field) -> dict[str, FV]:
        """The trial inputs for seed ``s`` (lazy values; kept when small, or held by :meth:`hold_inputs`)."""
        ins = self._inputs.get(s)
        if ins is None:
            ins = self.shared.held_inputs(s)
        if ins is None:
            ins = input_values(self.target, fld, s)
            if _nbytes(self.target) <= INPUT_CACHE_BYTES:
                self._inputs[s] = ins
        return ins

    def hold_inputs(self, s: int, ins: dict[str, FV], trials: int) -> bool:
        """After a trial of seed ``s``: keep its inputs ``ins`` (those computed) for later candidates, within the
        budget of :mod:`verimirage.smt.ffshare`, when ``trials`` trials' worth of them take at most half of
        it (more would evict each other, and the products, before a later candidate reads them). Whether
        they are kept."""
        if s in self._inputs:
            return True
        n = held_bytes(ins)
        return n * trials <= ffshare.budget() // 2 and self.shared.hold_inputs(s, ins, n)

    def outputs(self, s: int, inputs: Mapping[str, FV] | None = None) -> tuple[list[np.ndarray], int]:
        """The target's compared values (:func:`observe`) for seed ``s`` and its q-violation count
        (cached). ``inputs``: this trial's inputs when the caller already has them."""
        r = self._outs.get(s)
        if r is None:
            fld = Field.from_seed(s)
            with ffshare.storing(self.shared.entries(s)):
                outs = _run_lazy(self.target, inputs if inputs is not None else self.inputs(s, fld), fld)
                r = ([observe(o, s, k, fld, self.project) for k, o in enumerate(outs)], fld.q_violations)
            self._outs[s] = r
        return r

    def full_outputs(self, s: int, inputs: Mapping[str, FV]) -> list[np.ndarray]:
        """The target's output p-parts for seed ``s``, every element (not cached)."""
        fld = Field.from_seed(s)
        return [ints(o.p) for o in _run_lazy(self.target, inputs, fld)]

    def compare(self, cand: Graph, *, seeds: Sequence[int] | None = None, trials: int | None = None) -> FFResult:
        """Evaluate ``cand`` on the target's trials and compare every output (see :func:`ff_test`)."""
        return self._compare(cand, seeds, trials)

    def _compare(self, cand: Graph, seeds: Sequence[int] | None, trials: int | None) -> FFResult:
        t0 = time.perf_counter()
        db, ob = degree_bound(cand)
        deg = max(self.degree, db)
        opaque = self.opaque + ob
        q_min = int(safe_primes()[0] - 1) // 2
        per = min(1.0, (2 * deg + opaque + 1) / q_min + (projection_bound() if self.project else 0.0))
        if seeds is None:
            n = trials if trials is not None else trials_needed(per, self.target_log2)
            seeds = default_seeds(self.seed, max(n, 1))
        seeds = tuple(int(s) for s in seeds)
        p_only = not (self.uses_exp or uses_exp(cand))
        where, failed = ffgpu.describe(), ffgpu.failures()
        ps = tuple(Field.from_seed(s).p for s in seeds)
        qs = tuple(Field.from_seed(s).q for s in seeds)
        gs = tuple(Field.from_seed(s).g for s in seeds)

        def trial(ti: int) -> FFResult | None:
            s = seeds[ti]
            fld = Field.from_seed(s)
            ins = self.inputs(s, fld)
            outs_a, viol_a = self.outputs(s, ins)
            with ffshare.finding(self.shared.entries(s)):
                r = candidate_trial(ti, s, fld, ins, outs_a, viol_a)
            if not self.keep_shared:
                self.shared.drop(s)  # (no later candidate will read them; later trials reuse the memory)
            elif not self.hold_inputs(s, ins, len(seeds)):
                # later candidates get new input arrays, so they find these products by value only: keep those
                # worth it (a thin product, found by address only, would just hold its inputs' memory)
                self.shared.prune(s, lambda e: ffshare.worth_sharing(e.a, e.b))
            else:
                self.shared.prune(s, lambda e: True)  # (count the inputs they are views of)
            return r

        def candidate_trial(ti: int, s: int, fld: Field, ins: dict[str, FV], outs_a: list[np.ndarray],
                            viol_a: int) -> FFResult | None:
            outs_b = _run_lazy(cand, ins, fld)
            common = dict(p=ps[: ti + 1], q=qs[: ti + 1], g=gs[: ti + 1], seeds=seeds[: ti + 1], trials=ti + 1,
                          per_trial_bound=per, projected=self.project, device=where)
            for k, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
                idx = _first_difference(x, observe(y, s, k, fld, self.project))
                if idx is not None and self.project and y.shape:
                    # the projections differ: the outputs differ somewhere; find where, every element computed
                    idx = _first_difference(self.full_outputs(s, ins)[k], ints(y.p))
                    if idx is None:
                        raise RuntimeError(f"ff: the projections of output {k} differ in trial {ti} but the "
                                           "outputs are equal (a bug in verimirage.smt.ffproj)")
                if idx is not None:
                    full = trial_inputs(self.target, fld, s)
                    return FFResult("differ", f"output {k} differs at index {idx} in trial {ti} (p={fld.p})",
                                    bound=1.0, seconds=time.perf_counter() - t0, output=k, index=idx,
                                    inputs=full, field_trial=ti, **common)  # type: ignore[arg-type]
            del outs_b
            viol = viol_a + fld.q_violations
            if viol:
                return FFResult("unknown", f"a program applies exp to a value with no meaningful q-part "
                                f"({viol} elements in trial {ti}): the exp algebra cannot be tested",
                                bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
            return None

        stop = _run_trials(trial, len(seeds), ff_workers(len(seeds), _nbytes(self.target)))
        if ffgpu.failures() > failed:
            where += " (some products on the CPU: the device failed)"
        if stop is not None:
            return dataclasses.replace(stop, seconds=time.perf_counter() - t0, device=where)
        bound = per ** len(seeds)
        outcome = "equal" if per < 1 else "unknown"
        stated, note = stated_bound((self.info, degree_info(cand)), len(seeds), self.project)
        reason = (f"{len(seeds)} trial(s) equal{' (p-only: no exp)' if p_only else ''}; per-node model "
                  f"bound {bound:.3g}; " + (f"false-accept bound {stated:.3g}" if stated is not None else note)
                  if outcome == "equal" else "degree too high for a meaningful bound")
        return FFResult(outcome, reason, ps, qs, gs, seeds, len(seeds), per, bound,
                        time.perf_counter() - t0, projected=self.project, device=where,
                        stated_bound=stated if outcome == "equal" else None, bound_note=note)


def ff_test(
    a: Graph, b: Graph, *, seeds: Sequence[int] | None = None, seed: int = 0, trials: int | None = None,
    target_log2: float = 60.0, reference: FFReference | None = None, project: bool = True,
) -> FFResult:
    """Evaluate ``a`` and ``b`` in fresh random fields on fresh random inputs; compare every output.

    The stated bound (per trial ``(2 * degree + opaque + 1) / q``, independent trials multiplied)
    models exp and the nonlinear unary ops as fresh random values (the model of Mirage's analysis).
    ``project`` (the default): each output is compared through a random bilinear projection
    (:func:`observe`), which adds ``2 / p`` per trial; otherwise element by element.
    ``reference``: an :class:`FFReference` of ``a`` (same seed) whose cached outputs are reused.
    """
    if reference is None or reference.seed != seed or reference.target_log2 != target_log2 or (
            reference.project != project) or (reference.target is not a and str(reference.target) != str(a)):
        reference = FFReference(a, seed=seed, target_log2=target_log2, project=project, keep_shared=False)
    return reference.compare(b, seeds=seeds, trials=trials)


def ff_domain_ops() -> list[str]:
    """Registry ops with an ff meaning (for tests)."""
    return sorted(n for n, o in OPS.items() if "ff" in o.domains and not o.has(Prop.STRUCTURAL))


def run_ff(g: Graph, inputs: Mapping[str, np.ndarray], fld: Field) -> list[np.ndarray]:
    """Evaluate ``g`` in field ``fld`` on input arrays in the stacked form (leading axis: p-residues,
    then, if present, q-residues with -1 where meaningless); every part of every output is computed
    and returned in the stacked form ``(2, *shape)`` (a meaningless q-part is -1)."""
    outs = _run_lazy(g, {k: fv_of(v) for k, v in inputs.items()}, fld)
    return [stacked(o) for o in outs]
