"""Lazy finite-field values: a value (:class:`FV`) is two parts (:class:`Part`), each a memoised thunk.

Part of the fast finite-field engine (cross-checked against :mod:`verimirage.smt.ffref`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...ir.errors import GraphError

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

    __slots__ = ("_aff", "_deps", "_fn", "_lin", "_src", "_twin", "_val", "kind")

    def __init__(self, fn: Callable[..., np.ndarray] | None, deps: tuple[Part, ...] = (),
                 val: np.ndarray | None = None, kind: str = "i") -> None:
        self._fn = fn
        self._deps = deps
        self._val = val
        self.kind = kind
        self._src: tuple[Part, Callable[[np.ndarray], np.ndarray]] | None = None
        self._twin: Part | None = None
        #: how this (p-)part is built from other parts when that is linear in one of them (a view, a ring
        #: op, a sum, a matmul, ...): what :mod:`verimirage.smt.ff.proj` pushes a projection through
        self._lin: tuple[Any, ...] | None = None
        #: ``(source, a, b)`` when this part is ``a * source + b`` mod m (:func:`verimirage.smt.ff.meanings._affine`)
        self._aff: tuple[Part, int, int] | None = None

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
                stack.extend(reversed(todo))  # the first operand on top: an accumulator chain is
                # summed as it goes (acc_k before x_(k+1)), not every term held at once (a K-loop of 128 steps)
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
            t._aff = None
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
    memory they read (:mod:`verimirage.smt.ff.share`), which needs that memory never to change."""
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
    ``(src_shape, spec)`` describing the view for projections (:mod:`verimirage.smt.ff.proj`)."""
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
