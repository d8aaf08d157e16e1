"""Products one program computed, reused by another in the same finite-field trial.

A candidate's tiles often compute the same dot products as the target: a split-KV attention kernel
multiplies the rows of ``Q`` by the columns of ``K^T`` that the target's ``Q K^T`` multiplies, only
grouped into other tiles. Within one trial both programs read the same inputs, so the candidate can
take those entries from the target's product instead of recomputing them (and the exp of them, when
the product was computed with exp fused in: see ``_matmul_mod``'s epilogue).

Nothing about the programs' structure is assumed. A product is the array
``out[b, i, j] = epi(A[b, i, :] . B[b, :, j])`` of its folded operands ``A`` (batch, rows, K) and
``B`` (batch, K, cols), ``epi`` elementwise (a reduction mod m, or that and an exp lookup) and named by
a *tag*. A candidate product with the same tag reuses a stored one when each of its batch items ``c``
has a stored batch item ``t`` such that every candidate row of ``A[c]`` **is equal to** a row of the
stored ``A[t]`` and every candidate column of ``B[c]`` to a column of the stored ``B[t]``: equal
operands give equal dot products, so the reused entries are exactly what the candidate would have
computed. That equality is established one of two ways, and any failure means "not found" (the
candidate computes its product itself):

* **by address** (:func:`find_aliased`, tried first, before the candidate's operands are folded or
  copied): both operands are views of the same read-only arrays as the stored operands (inputs and
  their twins are read-only, so that memory never changes) and every row and column starts where one of
  the stored ones does, with the same stride along K. Then they are the same memory; no value is read.
* **by value** (:func:`find`): rows and columns are paired through exact integer fingerprints (dot
  products with fixed small weights, exact in float64), and the pairing is then **compared element by
  element**, so a fingerprint collision is not a match.

The reused entries come back as a strided read-only view of the stored array when the pairing is
affine along each axis of the candidate's tile layout (the usual case: tiles are slices), or else as a
gathered copy. Stored arrays are read-only.

Memory: a store keeps the products of the target of an :class:`~verimirage.smt.ff.FFReference`, per
trial, within one process-wide budget (``$VERIMIRAGE_FF_SHARE_BYTES``, default an eighth of the memory, at
least 2 GiB; 0 turns sharing off), counting the products, copied operands, and once the trial that made an
entry is over, the inputs its operands are views of. The same budget holds the trials' input values a
reference keeps for later candidates (:meth:`Store.hold_inputs`), so that those read the same arrays and
find products by address. The least recently used entries are dropped first.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: environment variable: bytes of shared products and held inputs kept process-wide (default:
#: :func:`default_budget`)
BUDGET_ENV = "VERIMIRAGE_FF_SHARE_BYTES"
#: the default budget is an eighth of the machine's memory, and at least this
MIN_DEFAULT_BUDGET = 2 << 30
#: fingerprint weights are below 2**_W_BITS: with residues below 2**21 and K <= 2048 a fingerprint is an
#: integer below 2**44, exact in float64, and a batch index fits above it in an int64 key
_W_BITS = 12
_FP_BITS = 44
#: a product is shared by value only when it has at least this many times as many elements as its operands:
#: finding it reads the operands about three times (fingerprints, the exact comparison; ~1 ns an element here), while
#: computing it costs ~6-10 ns an element of the product (K = 64, the reduction, an exp lookup). A thin
#: product (a few rows of a big operand, as in multi-head attention at batch 8) is not worth it
MIN_GAIN = 0.5


def worth_sharing(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the product of folded operands ``a`` (n, R, K) and ``b`` (n, K, C) is big enough, next to
    its operands, to be worth storing and looking up."""
    n, r, _ = a.shape
    return n * r * b.shape[-1] >= MIN_GAIN * (a.size + b.size)


def env_int(name: str, default: int, minimum: int, error: type[ValueError] = ValueError) -> int:
    """The whole number in environment variable ``name`` (``default`` when unset or blank); ``error``
    naming the variable and what was expected when it is not a whole number >= ``minimum``."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = minimum - 1
    if v < minimum:
        raise error(f"${name}={raw!r}: expected a whole number >= {minimum}")
    return v


def default_budget() -> int:
    """An eighth of the machine's physical memory, at least :data:`MIN_DEFAULT_BUDGET` (2 GiB; also when the
    memory size is unknown). A machine with room holds more trials' inputs (multi-head attention's are ~1 GB
    a trial at batch 8) for a search's later candidates."""
    try:
        phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # not POSIX
        phys = 0
    return max(MIN_DEFAULT_BUDGET, phys // 8)


def budget() -> int:
    """Bytes of shared products and held inputs kept process-wide (``$VERIMIRAGE_FF_SHARE_BYTES``, default
    :func:`default_budget`; 0: none)."""
    return env_int(BUDGET_ENV, default_budget(), 0)


_WEIGHTS: dict[int, np.ndarray] = {}


def _weights(k: int) -> np.ndarray:
    w = _WEIGHTS.get(k)
    if w is None:
        w = np.random.default_rng([0x5AA4E, k]).integers(1, 1 << _W_BITS, size=k).astype(np.float64)
        w.flags.writeable = False
        _WEIGHTS[k] = w
    return w


def _row_keys(a: np.ndarray) -> np.ndarray:
    """Exact fingerprints of the rows of ``a`` (n, R, K) as int64 (n, R)."""
    return np.matmul(a, _weights(a.shape[-1])).astype(np.int64)


def _col_keys(b: np.ndarray) -> np.ndarray:
    """Exact fingerprints of the columns of ``b`` (n, K, C) as int64 (n, C)."""
    return np.matmul(_weights(b.shape[-2]), b).astype(np.int64)


def _lookup(sorted_keys: np.ndarray, order: np.ndarray, keys: np.ndarray) -> np.ndarray | None:
    """Positions (in the unsorted array) of ``keys``, or None if one is missing."""
    if sorted_keys.size == 0:
        return None
    pos = np.searchsorted(sorted_keys, keys)
    np.minimum(pos, sorted_keys.size - 1, out=pos)
    if not np.array_equal(sorted_keys[pos], keys):
        return None
    return order[pos]


def _owner(x: np.ndarray) -> np.ndarray | None:
    """The array that owns ``x``'s memory, or None (memory not owned by a numpy array)."""
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x if x.flags.owndata else None


def _home(x: np.ndarray) -> tuple[np.ndarray, int] | None:
    """``(owner, byte offset)`` of a C-contiguous view ``x`` of a **read-only** array (inputs are, see
    ``ff._frozen``): memory that cannot change, so equal addresses mean equal values. None otherwise."""
    o = _owner(x)
    if o is None or o.flags.writeable or not x.flags.c_contiguous or x.dtype != o.dtype:
        return None
    return o, _addr(x) - _addr(o)


def _addr(x: np.ndarray) -> int:
    return int(x.__array_interface__["data"][0])


def _lattice(dims: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """``sum(x_k * strides[k])`` at every multi-index ``x`` of ``dims``, as an int64 array of shape ``dims``."""
    out = np.zeros(tuple(dims), dtype=np.int64)
    for ax, (d, st) in enumerate(zip(dims, strides, strict=True)):
        shape = [1] * len(dims)
        shape[ax] = d
        out = out + np.arange(d, dtype=np.int64).reshape(shape) * st
    return out


def _offsets(x: np.ndarray) -> np.ndarray:
    """Byte offsets from ``x``'s first element of every element along all axes but the last (flat, C order)."""
    return _lattice(x.shape[:-1], x.strides[:-1]).reshape(-1)


def _one_per_row(x: np.ndarray) -> np.ndarray | None:
    """``x[:, 0]`` when every row of ``x`` (2-D) holds one value throughout, else None."""
    first = x[:, 0]
    return first if np.array_equal(x, np.broadcast_to(first[:, None], x.shape)) else None


@dataclass(eq=False)
class Entry:
    """A stored product: its tag, folded operands and (read-only) result ``out`` (n, R, C)."""

    tag: Hashable
    a: np.ndarray
    b: np.ndarray
    out: np.ndarray
    _rows: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)
    _cols: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)
    #: where ``a`` and ``b`` lie in read-only memory (:func:`_home`), for :meth:`match_aliased`
    a_home: tuple[np.ndarray, int] | None = field(init=False, repr=False)
    b_home: tuple[np.ndarray, int] | None = field(init=False, repr=False)
    #: whether the operands that are views of inputs count against the budget: not while the trial that made
    #: the entry runs (its inputs are alive anyway), yes once the entry outlives it (see :meth:`Store.prune`)
    pinning: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.a_home = _home(self.a)
        self.b_home = _home(self.b)

    @property
    def nbytes(self) -> int:
        """Bytes this entry accounts for: the product, copied operands, and (when :attr:`pinning`) the
        inputs its operands are views of."""
        n = self.out.nbytes
        for x, home in ((self.a, self.a_home), (self.b, self.b_home)):
            if home is None or self.pinning:
                n += x.nbytes
        return int(n)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted row fingerprints (global row index b * R + i) and their order."""
        if self._rows is None:
            k = _row_keys(self.a).reshape(-1)
            o = np.argsort(k, kind="stable")
            self._rows = (k[o], o)
        return self._rows

    def cols(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted (batch, column fingerprint) keys (global column index b * C + j) and their order."""
        if self._cols is None:
            n = self.b.shape[0]
            k = (_col_keys(self.b) + (np.arange(n, dtype=np.int64)[:, None] << _FP_BITS)).reshape(-1)
            o = np.argsort(k, kind="stable")
            self._cols = (k[o], o)
        return self._cols

    def match(self, a: np.ndarray, b: np.ndarray, layout: Layout) -> np.ndarray | None:
        """This product's entries for the folded operands ``a`` (n, R, K) and ``b`` (n, K, C) of a
        product laid out as ``layout`` (see :func:`find`), or None. Found when, for every c, i, j,
        ``a[c, i] == self.a[bt[c], ri[c, i]]`` and ``b[c, :, j] == self.b[bt[c], :, ci[c, j]]`` for some
        ``bt, ri, ci``: these are guessed from fingerprints, then checked exactly."""
        n_t, r_t, k = self.a.shape
        c_t = self.b.shape[-1]
        n, r, kk = a.shape
        if kk != k or b.shape[:2] != (n, k) or n_t >= 1 << (63 - _FP_BITS):
            return None
        rows = _lookup(*self.rows(), _row_keys(a).reshape(-1))
        if rows is None:
            return None
        rows = rows.reshape(n, r)
        bt = _one_per_row(rows // r_t)
        if bt is None:
            return None
        cols = _lookup(*self.cols(), (_col_keys(b) + (bt[:, None] << _FP_BITS)).reshape(-1))
        if cols is None:
            return None
        ri = rows % r_t
        ci = cols.reshape(n, -1) % c_t
        batch_dims, row_dims, col_dims = layout
        ks = np.arange(k, dtype=np.int64)
        # the pairing is only a guess until the operands are compared element by element
        a_t = _take(self.a, bt * (r_t * k), batch_dims, [(ri * k, row_dims), (ks, [k])])
        if not np.array_equal(a_t, a.reshape(a_t.shape)):
            return None
        b_t = _take(self.b, bt * (k * c_t), batch_dims, [(ks * c_t, [k]), (ci, col_dims)])
        if not np.array_equal(b_t, b.reshape(b_t.shape)):
            return None
        return self._entries(bt, ri, ci, layout)

    def _entries(self, bt: np.ndarray, ri: np.ndarray, ci: np.ndarray, layout: Layout) -> np.ndarray:
        """``out[bt[c], ri[c, i], ci[c, j]]`` shaped ``(*batch_dims, *row_dims, *col_dims)`` (see :func:`_take`)."""
        _, r_t, c_t = self.out.shape
        batch_dims, row_dims, col_dims = layout
        return _take(self.out, bt * (r_t * c_t), batch_dims, [(ri * c_t, row_dims), (ci, col_dims)])

    def match_aliased(self, rows: np.ndarray, cols: np.ndarray, layout: Layout) -> np.ndarray | None:
        """This product's entries for a product whose operands are views of the same read-only memory as
        this one's: ``rows`` (..., K) holds the left operand's rows and ``cols`` (..., K) the right
        operand's columns (all axes but the last in the folded order, see :func:`find_aliased`). Found
        when every row (column) lies exactly where one of this product's does, in the same batch item:
        then it *is* that row (column), so no value is compared. None otherwise."""
        assert self.a_home is not None and self.b_home is not None
        n_t, r_t, k = self.a.shape
        c_t = self.b.shape[-1]
        n = math.prod(layout[0])
        if rows.shape[-1] != k or cols.shape[-1] != k or n_t >= 1 << 40:
            return None
        if rows.dtype != self.a.dtype or cols.dtype != self.b.dtype or self.a.itemsize != self.b.itemsize:
            return None  # (a reinterpretation of the same memory is not the same values)
        # (the strides of C-contiguous operands, from their shapes: numpy may give size-1 axes any stride)
        item = self.a.itemsize
        s1, t1 = k * item, c_t * item
        s0, t0 = r_t * s1, k * t1
        if k > 1 and (rows.strides[-1] != item or cols.strides[-1] != t1):
            return None
        # rows: offset d = bt * s0 + r * s1 in this product's left operand, 0 <= r < r_t
        d = (_addr(rows) - _addr(self.a_home[0]) - self.a_home[1]) + _offsets(rows)
        bt_r, rem = np.divmod(d, s0)
        ri, bad = np.divmod(rem, s1)
        if bad.any() or (d < 0).any() or (bt_r >= n_t).any() or (ri >= r_t).any():
            return None
        bt = _one_per_row(bt_r.reshape(n, -1))
        if bt is None:
            return None
        ri = ri.reshape(n, -1)
        # columns: offset d = bt * t0 + c * item in the right operand (K, C) per item, 0 <= c < c_t
        d = (_addr(cols) - _addr(self.b_home[0]) - self.b_home[1]) + _offsets(cols)
        bt_c, rem = np.divmod(d, t0)
        ci, bad = np.divmod(rem, item)
        if bad.any() or (d < 0).any() or (ci >= c_t).any():
            return None
        if not np.array_equal(bt_c.reshape(n, -1), np.broadcast_to(bt[:, None], (n, ci.size // n))):
            return None
        return self._entries(bt, ri, ci.reshape(n, -1), layout)


#: how a product's axes factor: (batch dims, row dims, column dims), each product equal to the folded size
Layout = tuple[Sequence[int], Sequence[int], Sequence[int]]


def _affine(v: np.ndarray, dims: Sequence[int]) -> tuple[int, list[int]] | None:
    """``(v0, strides)`` when ``v`` (flat, length prod(dims)) is ``v0 + sum(x_k * strides[k])`` over
    the multi-index ``x`` of ``dims`` (C order), else None."""
    dims = [int(d) for d in dims]
    t = v.reshape(dims)
    v0 = int(t.reshape(-1)[0]) if t.size else 0
    strides = []
    for ax, d in enumerate(dims):
        idx = [0] * len(dims)
        idx[ax] = min(1, d - 1)
        strides.append(int(t[tuple(idx)]) - v0 if d > 1 else 0)
    if not np.array_equal(t, v0 + _lattice(dims, strides)):
        return None
    return v0, strides


def _take(src: np.ndarray, base: np.ndarray, batch_dims: Sequence[int],
          axes: Sequence[tuple[np.ndarray, Sequence[int]]]) -> np.ndarray:
    """The elements ``src.flat[base[c] + sum_a offs_a[c, x_a]]`` (``offs_a`` is (n, L_a) or (L_a,)) as an
    array of shape ``(*batch_dims, *dims_0, *dims_1, ...)``: a read-only strided view of ``src`` when
    the offsets are affine along each of those dims (per-c offsets equal up to a per-c shift), else a
    gathered copy. Every offset must be a valid flat index of ``src``."""
    flat = src.reshape(-1)
    n = base.shape[0]
    shape = [*batch_dims] + [d for _, dims in axes for d in dims]
    offs2 = [o.reshape(1, -1) if o.ndim == 1 else o for o, _ in axes]  # (n or 1, L_a)
    starts = base + sum(o[:, 0] for o in offs2)
    rel = [o - o[:, :1] for o in offs2]
    if all(r.shape[0] == 1 or np.array_equal(r, np.broadcast_to(r[:1], r.shape)) for r in rel):
        parts = [_affine(starts, batch_dims)] + [_affine(r[0], dims) for r, (_, dims) in zip(rel, axes, strict=True)]
        if all(p is not None for p in parts):
            v0 = parts[0][0] if parts[0] is not None else 0  # (the other parts start at 0)
            strides = list(itertools.chain.from_iterable(p[1] for p in parts if p is not None))
            if min(strides, default=0) >= 0:  # (negative strides would need the view to start elsewhere)
                item = flat.itemsize
                return np.lib.stride_tricks.as_strided(flat[v0:], shape=shape,
                                                       strides=[s * item for s in strides], writeable=False)
    idx = base.reshape([n] + [1] * len(axes))
    for i, o in enumerate(offs2):
        idx = idx + o.reshape([o.shape[0]] + [o.shape[1] if j == i else 1 for j in range(len(axes))])
    return np.take(flat, idx).reshape(shape)


@dataclass(eq=False)
class Held:
    """A trial's input values kept for later candidates, counted against the budget like a product."""

    value: Any
    nbytes: int


class _Budget:
    """The process-wide byte budget of stored entries and held inputs (least recently used dropped first)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.used = 0
        #: id -> (entry, the list holding it, the bytes it was counted for)
        self.lru: OrderedDict[int, tuple[Entry | Held, list[Any], int]] = OrderedDict()

    def add(self, entry: Entry | Held, owner: list[Any]) -> bool:
        """Count ``entry`` (dropping the least recently used others as needed) and append it to ``owner``;
        False (nothing done) when it alone exceeds the budget."""
        cap = budget()
        n = entry.nbytes
        if n > cap:
            return False
        with self.lock:
            self._evict(cap - n)
            owner.append(entry)
            self.lru[id(entry)] = (entry, owner, n)
            self.used += n
        return True

    def _evict(self, room: int) -> None:
        while self.used > room and self.lru:
            _, (old, lst, n) = self.lru.popitem(last=False)
            self.used -= n
            with contextlib.suppress(ValueError):
                lst.remove(old)

    def recount(self, entry: Entry | Held) -> None:
        """Count ``entry`` again at its current :attr:`Entry.nbytes` (dropping it, or older ones, if over)."""
        cap = budget()
        with self.lock:
            item = self.lru.pop(id(entry), None)
            if item is None:
                return
            _, owner, n = item
            self.used -= n
            n = entry.nbytes
            if n > cap:
                with contextlib.suppress(ValueError):
                    owner.remove(entry)
                return
            self._evict(cap - n)
            self.lru[id(entry)] = (entry, owner, n)
            self.used += n

    def touch(self, entry: Entry | Held) -> None:
        with self.lock:
            if id(entry) in self.lru:
                self.lru.move_to_end(id(entry))

    def drop(self, entries: list[Any], owner: list[Any] | None = None) -> None:
        """Drop ``entries`` from the budget and from ``owner`` (default: ``entries`` itself, emptied)."""
        with self.lock:
            for e in list(entries):
                item = self.lru.pop(id(e), None)
                if item is not None:
                    self.used -= item[2]
                if owner is not None:
                    with contextlib.suppress(ValueError):
                        owner.remove(e)
            if owner is None:
                entries.clear()

    def drop_all(self, by_seed: dict[int, list[Entry]] | dict[int, list[Held]]) -> None:
        for lst in by_seed.values():
            self.drop(lst)
        by_seed.clear()


_BUDGET = _Budget()
#: how many products were stored, found by value or by address (reused) and looked up in vain, process-wide
#: (for tests and tuning)
STATS = {"stored": 0, "found": 0, "aliased": 0, "missed": 0}
_STATS_LOCK = threading.Lock()


def _count(key: str) -> None:
    with _STATS_LOCK:
        STATS[key] += 1


def held_bytes() -> int:
    """Bytes of stored products and held inputs counted now (process-wide)."""
    return _BUDGET.used


class Store:
    """The products of one program per trial seed (those big enough to be worth keeping), and the trials'
    input values when they are kept within the budget (:meth:`hold_inputs`)."""

    def __init__(self) -> None:
        self._by_seed: dict[int, list[Entry]] = {}
        self._inputs: dict[int, list[Held]] = {}
        weakref.finalize(self, _BUDGET.drop_all, self._by_seed)
        weakref.finalize(self, _BUDGET.drop_all, self._inputs)

    def entries(self, seed: int) -> list[Entry]:
        """The (live) list of entries of ``seed``."""
        return self._by_seed.setdefault(seed, [])

    def drop(self, seed: int) -> None:
        """Drop the entries of ``seed``."""
        self.prune(seed, lambda _: False)

    def prune(self, seed: int, keep: Callable[[Entry], bool]) -> None:
        """Once the trial of ``seed`` is done: drop its entries for which ``keep`` is false, and count the
        inputs the others are views of (they now keep those alive)."""
        lst = self._by_seed.get(seed)
        if lst is not None:
            _BUDGET.drop([e for e in list(lst) if not keep(e)], lst)
            for e in list(lst):
                if not e.pinning:
                    e.pinning = True
                    _BUDGET.recount(e)

    def clear(self) -> None:
        """Drop every entry and held input."""
        _BUDGET.drop_all(self._by_seed)
        _BUDGET.drop_all(self._inputs)

    def hold_inputs(self, seed: int, value: Any, nbytes: int) -> bool:
        """Keep ``value`` (the input values of trial ``seed``, ``nbytes`` of memory) within the budget, so
        that later candidates read the same arrays (and find products by address); False when it does not
        fit. Held again (a later candidate may have computed more of them), they are counted again. Like
        products, held inputs are dropped least recently used first."""
        lst = self._inputs.setdefault(seed, [])
        for h in list(lst):
            if h.value is value:
                if h.nbytes != nbytes:
                    h.nbytes = nbytes
                    _BUDGET.recount(h)
                return bool(lst)
        return _BUDGET.add(Held(value, nbytes), lst)

    def held_input_bytes(self, but: int | None = None) -> int:
        """Bytes of the input values held now, for every seed but ``but``."""
        return sum(h.nbytes for s, lst in list(self._inputs.items()) if s != but for h in list(lst))

    def held_inputs(self, seed: int) -> Any | None:
        """The input values held for ``seed`` (:meth:`hold_inputs`), or None."""
        held = list(self._inputs.get(seed, ()))  # (a copy: another thread may drop it meanwhile)
        if not held:
            return None
        h = held[0]
        _BUDGET.touch(h)
        return h.value


@dataclass(frozen=True)
class _Scope:
    store: list[Entry] | None
    find: Sequence[Entry]


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("verimirage_ff_share", default=None)


@contextlib.contextmanager
def storing(entries: list[Entry]) -> Iterator[None]:
    """Inside: big products are stored in ``entries`` (within the budget); none are looked up."""
    tok = _SCOPE.set(_Scope(entries, ()))
    try:
        yield
    finally:
        _SCOPE.reset(tok)


@contextlib.contextmanager
def finding(entries: Sequence[Entry]) -> Iterator[None]:
    """Inside: big products are first looked up in ``entries``; none are stored."""
    tok = _SCOPE.set(_Scope(None, tuple(entries)))
    try:
        yield
    finally:
        _SCOPE.reset(tok)


def find(tag: Hashable, a: np.ndarray, b: np.ndarray, layout: Layout) -> np.ndarray | None:
    """The product of folded operands ``a`` (n, R, K) and ``b`` (n, K, C) under ``tag``, from an entry of
    the current :func:`finding` scope, shaped ``(*batch_dims, *row_dims, *col_dims)`` for ``layout =
    (batch_dims, row_dims, col_dims)`` (how its batch, row and column axes factor into tile axes), or
    None. A strided read-only view of the entry when the pairing is affine along those dims (tiles that
    are slices), else a gathered copy."""
    scope = _SCOPE.get()
    if scope is None or not scope.find or a.size == 0 or b.size == 0 or not worth_sharing(a, b):
        return None
    for e in reversed(scope.find):
        if e.tag == tag:
            r = e.match(a, b, layout)
            if r is not None:
                _BUDGET.touch(e)
                _count("found")
                return r
    _count("missed")
    return None


def find_aliased(tag: Hashable, rows: np.ndarray, cols: np.ndarray, layout: Layout) -> np.ndarray | None:
    """Like :func:`find`, before the operands are folded (or copied): ``rows`` is the left operand with its
    axes ordered (batch, row axes, K) and ``cols`` the right one ordered (batch, column axes, K), as views.
    Found only when both are views of the same read-only arrays as a stored product's operands and every
    row and column lies where one of that product's does (see :meth:`Entry.match_aliased`); this reads no
    operand value, so it is tried first, and for products of any size."""
    scope = _SCOPE.get()
    if scope is None or not scope.find or rows.size == 0 or cols.size == 0:
        return None
    oa, ob = _owner(rows), _owner(cols)
    if oa is None or ob is None or oa.flags.writeable or ob.flags.writeable:
        return None
    for e in reversed(scope.find):
        if e.tag == tag and e.a_home is not None and e.b_home is not None and e.a_home[0] is oa \
                and e.b_home[0] is ob:
            r = e.match_aliased(rows, cols, layout)
            if r is not None:
                _BUDGET.touch(e)
                _count("aliased")
                return r
    return None


def store(tag: Hashable, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """Keep ``out`` (made read-only) as the product of ``a`` and ``b`` under ``tag`` when the current
    scope is :func:`storing` and the budget allows."""
    scope = _SCOPE.get()
    if scope is None or scope.store is None:
        return
    if math.prod(out.shape) == 0:
        return
    e = Entry(tag, a, b, out)
    if not worth_sharing(a, b) and (e.a_home is None or e.b_home is None):
        return  # (found by address, a product is worth keeping whatever its shape)
    out.flags.writeable = False
    if _BUDGET.add(e, scope.store):
        _count("stored")
