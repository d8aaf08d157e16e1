"""The abstract-expression domain (``"abstract"``): every registry op on symbolic tensors.

A value is a :class:`Sym`: a shape and a function from symbolic indices
(:mod:`verimirage.smt.expr` affine index expressions) to the canonical
expression of that element. :class:`Sym` supports the array operations the
generic evaluator (:mod:`verimirage.ir.interpret`) uses for tiling —
``reshape``, ``transpose``, ``np.take``, ``np.expand_dims``,
``np.broadcast_to`` — lazily, so block graphs, grids and for-loops are
evaluated by the *same* evaluator as every other domain, at full size, and a
partitioned reduction shows up as sums over adjacent index ranges that the
normaliser merges.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph, input_types, output_types
from ..ir.interpret import run
from ..ir.ops import OPAQUE, OPS, Prop, TensorType, implements, neg_axis, opaque_key, reshape_groups
from . import defined as D
from . import expr as E
from .consts import const_fraction

Idx = tuple  # tuple of Aff


class Sym:
    """A lazily indexed symbolic tensor."""

    __slots__ = ("_fn", "_memo", "shape")

    def __init__(self, shape: Sequence[int], fn: Callable[[Idx], E.Poly]) -> None:
        self.shape = tuple(int(s) for s in shape)
        self._fn = fn
        self._memo: dict[Idx, E.Poly] = {}

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    def at(self, idx: Idx) -> E.Poly:
        """The canonical expression of element ``idx`` (size-1 dims read index 0)."""
        if len(idx) != self.ndim:
            raise E.AbstractionError(f"index of length {len(idx)} into a rank-{self.ndim} value")
        idx = tuple(E.a_const(0) if n == 1 else i for i, n in zip(idx, self.shape, strict=True))
        r = self._memo.get(idx)
        if r is None:
            r = self._fn(idx)
            self._memo[idx] = r
        return r

    # -- the array protocol the evaluator uses
    def reshape(self, *shape: Any) -> Sym:
        """Row-major reshape (splits, merges, size-1 dims)."""
        new = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        old = self.shape
        if math.prod(new) != math.prod(old):
            raise E.AbstractionError(f"reshape {old} -> {new}")
        if new == old:
            return self
        groups = reshape_groups(old, new)
        src = self

        def fn(idx: Idx) -> E.Poly:
            oi: list = [E.a_const(0)] * len(old)
            for odims, ndims in groups:
                flat = E.a_const(0)
                stride = 1
                for j in reversed(ndims):
                    flat = E.a_add(flat, idx[j], stride)
                    stride *= new[j]
                stride = 1
                for d in reversed(odims):
                    oi[d] = E.a_mod(E.a_floordiv(flat, stride), old[d])
                    stride *= old[d]
            return src.at(tuple(oi))

        return Sym(new, fn)

    def transpose(self, *perm: Any) -> Sym:
        """Axes permuted: result axis j is axis ``perm[j]``."""
        p = tuple(perm[0]) if len(perm) == 1 and isinstance(perm[0], (tuple, list)) else tuple(perm)
        src = self

        def fn(idx: Idx) -> E.Poly:
            oi: list = [None] * len(p)
            for j, a in enumerate(p):
                oi[a] = idx[j]
            return src.at(tuple(oi))

        return Sym(tuple(self.shape[a] for a in p), fn)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        name = func.__name__
        if name == "take":
            return _take(*args, **kwargs)
        if name == "expand_dims":
            return _expand_dims(*args, **kwargs)
        if name == "broadcast_to":
            return _broadcast_to(*args, **kwargs)
        raise E.AbstractionError(f"numpy function {name} is not supported on symbolic tensors")

    def __repr__(self) -> str:
        return f"Sym{self.shape}"


def _take(a: Sym, i: Any, axis: int) -> Sym:
    ax, c = axis % a.ndim, E.a_const(int(i))
    return Sym(a.shape[:ax] + a.shape[ax + 1 :], lambda idx: a.at((*idx[:ax], c, *idx[ax:])))


def _expand_dims(a: Sym, axis: int) -> Sym:
    ax = axis % (a.ndim + 1)
    return Sym((*a.shape[:ax], 1, *a.shape[ax:]), lambda idx: a.at(idx[:ax] + idx[ax + 1 :]))


def _project(idx: Idx, shape: tuple[int, ...]) -> Idx:
    """The index into an operand of ``shape`` broadcast to ``len(idx)`` dims."""
    return idx[len(idx) - len(shape) :]


def _broadcast_to(a: Sym, shape: Sequence[int], subok: bool = False) -> Sym:
    shape = tuple(shape)
    return a if shape == a.shape else Sym(shape, lambda idx: a.at(_project(idx, a.shape)))


def _bshape(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


# --------------------------------------------------------------------------- reductions with range splitting


def reduce_over(n: int, body: Callable[[str], E.Poly], combine: str, lo: int = 0) -> E.Poly:
    """``sum`` or ``max`` over a fresh index in ``[lo, lo+n)`` of ``body(var)``, splitting the range
    where a piecewise value (concat) needs it."""
    d = E.der()
    v = d.fresh(lo, lo + n)
    try:
        x = body(v)
    except E.NeedSplit as e:
        pts = E.split_points(e, v, (lo, lo + n))
        if pts is None or v not in E.a_vars(e.idx):
            raise
        cuts = [lo] + [p for p in pts if lo < p < lo + n] + [lo + n]
        d.use("concat-split")
        parts = [reduce_over(b - a, body, combine, a) for a, b in itertools.pairwise(cuts) if b > a]
        *_, out = itertools.accumulate(parts, E.p_add if combine == "sum" else E.p_maximum)
        D.provenance(out, D.s_add if combine == "sum" else D.s_max, parts)
        return out
    out = E.p_sum(v, x) if combine == "sum" else E.p_max_over(v, x)
    D.provenance(out, D.s_min, [x])
    return out


# --------------------------------------------------------------------------- op meanings


def _ew(f: Callable[..., E.Poly]) -> Callable[..., Sym]:
    """An elementwise op: ``f(x, ..., attrs)`` of its operands' elements at each index (operands broadcast)."""
    def fn(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
        return Sym(_bshape(*(a.shape for a in args)), lambda idx: f(*(a.at(_project(idx, a.shape)) for a in args),
                                                                    attrs))

    return fn


def _law(name: str, v: E.Poly) -> E.Poly:
    E.der().use(name)
    return v


#: the elementwise ops' meanings on elements (``attrs`` last; the :data:`~verimirage.ir.ops.OPAQUE` ops, ``pow``'s
#: exponents with no composition among them, are :func:`uninterpreted`)
ELEMENTWISE: dict[str, Callable[..., E.Poly]] = {
    "add": lambda x, y, at: E.p_add(x, y), "sub": lambda x, y, at: E.p_add(x, y, -1),
    "mul": lambda x, y, at: E.p_mul(x, y), "div": lambda x, y, at: E.p_div(x, y),
    "maximum": lambda x, y, at: E.p_maximum(x, y), "exp": lambda x, at: E.p_exp(x),
    "square": lambda x, at: E.p_mul(x, x), "sqrt": lambda x, at: E.p_sqrt(x),
    "rsqrt": lambda x, at: _law("rsqrt-def", E.p_atom(("sqrt", x), -1)),
    "scale": lambda x, at: E.p_scale(x, const_fraction(at["c"])),
    "shift": lambda x, at: E.p_add(x, E.p_const(const_fraction(at["c"]))),
    "log": lambda x, at: E.p_log(x),  # (uninterpreted, after its argument's exp factors are taken out: law log-exp)
    "reciprocal": lambda x, at: E.p_div(E.p_const(1), x),
    "sigmoid": lambda x, at: E.p_div(E.p_const(1), E.p_add(E.p_const(1), E.p_exp(E.p_scale(x, -1)))),
}
for _op, _f in ELEMENTWISE.items():
    implements("abstract", _op)(_ew(_f))


def uninterpreted(op: str) -> Callable[..., Sym]:
    """The ``"abstract"`` meaning of a unary op as an uninterpreted function named by :func:`opaque_key`: equal
    arguments give equal results, nothing else is assumed."""
    return _ew(lambda x, at: E.p_fn(opaque_key(op, at), x))


for _op in OPAQUE:
    implements("abstract", _op)(uninterpreted(_op))
implements("abstract", "cast")(lambda args, attrs, it, ot: args[0])


@implements("abstract", "slice")
def _abs_slice(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
    """Element i along the axis is element start + i of the operand."""
    a = args[0]
    pos = a.ndim + neg_axis(attrs["axis"], in_types[0].rank)
    start, stop = int(attrs["start"]), int(attrs["stop"])

    def fn(idx: Idx) -> E.Poly:
        return a.at((*idx[:pos], E.a_add(E.a_const(start), idx[pos], 1), *idx[pos + 1:]))

    return Sym((*a.shape[:pos], stop - start, *a.shape[pos + 1:]), fn)


@implements("abstract", "where")
def _abs_where(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
    """``m * a + (1 - m) * b`` (exact for masks in {0, 1})."""
    m, a, b = args
    shape = _bshape(_bshape(m.shape, a.shape), b.shape)

    def elem(idx: Idx) -> E.Poly:
        mv = m.at(_project(idx, m.shape))
        one_minus = E.p_add(E.p_const(1), E.p_scale(mv, -1))
        d = E.der()
        d.guard += 1  # (a condition inside a branch is no requirement of the program where the other is taken)
        try:
            av, bv = a.at(_project(idx, a.shape)), b.at(_project(idx, b.shape))
        finally:
            d.guard -= 1
        return E.p_add(E.p_mul(mv, av), E.p_mul(one_minus, bv))

    return Sym(shape, elem)


#: the name of the atom a causal mask's element is where its index ranges leave it undecided
TRIL_ATOM = "tril_mask(offset={})"


@implements("abstract", "tril_mask")
def _abs_tril(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
    """1 where ``j <= i + offset`` for all indices in range, 0 where for none; else the column range is split where
    the rows' range decides it, and the undecided band is the atom ``tril_mask(offset=o)[i, j]``."""
    off = int(attrs["offset"])

    def elem(idx: Idx) -> E.Poly:
        (ilo, ihi), (jlo, jhi) = E.interval(idx[-2]), E.interval(idx[-1])
        if jhi - ilo <= off or jlo - ihi > off:
            return _law("tril-select", E.p_const(int(jhi - ilo <= off)))
        pts = tuple(p for p in (ilo + off + 1, ihi + off + 1) if jlo < p <= jhi)
        if pts:
            raise E.NeedSplit(idx[-1], pts)
        return E.p_atom(("in", TRIL_ATOM.format(off), (idx[-2], idx[-1])))

    return Sym(attrs["shape"], elem)


def _reduce(kind: str) -> Callable[..., Sym]:
    def fn(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
        a = args[0]
        pos = a.ndim + neg_axis(attrs["axis"], in_types[0].rank)
        n = a.shape[pos]
        shape = (*a.shape[:pos], 1, *a.shape[pos + 1:])

        def elem(idx: Idx) -> E.Poly:
            body = lambda v: a.at((*idx[:pos], E.a_var(v), *idx[pos + 1:]))  # noqa: E731
            r = reduce_over(n, body, "max" if kind == "max" else "sum")
            if kind == "mean":
                m = _law("mean-def", E.p_scale(r, Fraction(1, n)))
                D.provenance(m, D.s_same, [r])
                r = m
            return r

        return Sym(shape, elem)

    return fn


for _k in ("sum", "mean", "max"):
    implements("abstract", _k)(_reduce(_k))


@implements("abstract", "matmul")
def _abs_matmul(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
    a, b = args
    batch = _bshape(a.shape[:-2], b.shape[:-2])
    shape = (*batch, a.shape[-2], b.shape[-1])
    k = a.shape[-1]

    def elem(idx: Idx) -> E.Poly:
        bi = idx[:-2]
        ba = _project(bi, a.shape[:-2]) if a.ndim > 2 else ()
        bb = _project(bi, b.shape[:-2]) if b.ndim > 2 else ()

        def body(v: str) -> E.Poly:
            r = E.a_var(v)
            x, y = a.at((*ba, idx[-2], r)), b.at((*bb, r, idx[-1]))
            xy = E.p_mul(x, y)
            D.provenance(xy, D.s_mul, [x, y])
            return xy

        return reduce_over(k, body, "sum")

    return Sym(shape, elem)


@implements("abstract", "concat")
def _abs_concat(args: list[Sym], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Sym:
    r = in_types[0].rank
    lead = max(a.ndim - r for a in args)
    batch = _bshape(*(a.shape[: a.ndim - r] for a in args))
    ax = attrs["axis"]
    pos = lead + ax
    sizes = [t.shape[ax] for t in in_types]
    shape = list(batch + tuple(in_types[0].shape))
    shape[pos] = sum(sizes)
    offs = [sum(sizes[:i]) for i in range(len(sizes))]

    def elem(idx: Idx) -> E.Poly:
        pieces = []
        for a, o, n in zip(args, offs, sizes, strict=True):
            def fn(i: E.Aff, a: Sym = a) -> E.Poly:
                full = (*idx[:pos], i, *idx[pos + 1:])
                return a.at(_project(full, a.shape))

            pieces.append((o, o + n, fn))
        return E.p_cat(idx[pos], pieces)  # type: ignore[arg-type]

    return Sym(tuple(shape), elem)


class AbstractDomain:
    """The abstract domain for :func:`verimirage.ir.interpret.run`."""

    name = "abstract"
    composes = True  # (the composite ops as their compositions: :data:`verimirage.ir.interpret.COMPOSITES`)

    def apply(self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType],
              out_type: TensorType) -> Any:
        fn = OPS[op].domains.get("abstract")
        if fn is None:
            raise GraphError(f"op {op!r} has no meaning in the 'abstract' domain")
        r = D.RULES.get(op)
        if r is None:
            raise E.AbstractionError(f"op {op!r} has no definedness rule (verimirage.smt.defined)")
        res = fn(args, attrs, in_types, [out_type])
        return self.composed(op, args, attrs, res, r)

    def composed(self, op: str, args: list[Any], attrs: dict[str, Any], res: Any, r: D.Rule | None = None) -> Any:
        """``res``, recording ``op``'s definedness rule on each element (a composite op, ``r`` None: only its own sign
        fact, e.g. tanh's, beside its composition's, which records the conditions)."""
        r = D.Rule(None, D.RULES[op].sign) if r is None and op in D.RULES else r
        if r is not None and (r.conds is not None or r.sign is not None):
            _instrument(op, r, res, args, attrs)
        return res


def _instrument(op: str, r: D.Rule, res: Any, args: list[Any], attrs: dict[str, Any]) -> None:
    """Make each element of the elementwise ``op``'s result ``res`` record its definedness conditions and
    provenance (:func:`verimirage.smt.defined.note`) when it is first derived."""
    if not isinstance(res, Sym) or any(res is a for a in args):
        if r.conds is not None:
            raise E.AbstractionError(f"op {op!r}: a partial op's result must be a new symbolic value")
        return
    if not OPS[op].has(Prop.ELEMENTWISE):
        raise E.AbstractionError(f"op {op!r}: definedness rules apply to elementwise ops only")
    inner = res._fn

    def fn(idx: Idx) -> E.Poly:
        v = inner(idx)
        xs = [a.at(_project(idx, a.shape)) if isinstance(a, Sym) else a for a in args]
        D.note(op, r, attrs, xs, v)
        return v

    res._fn = fn


# --------------------------------------------------------------------------- derivation of outputs


#: a case: a box of output indices (per free variable, ``[lo, hi)``) on which expressions are derived
Case = tuple[tuple[int, int], ...]
#: one program's derivation: per output and case its expression, the laws the normaliser used, per output and case
#: what the derivation recorded for definedness (:mod:`verimirage.smt.defined`)
Derived = tuple[list[list[E.Poly]], set[str], list[list[D.Defs]]]


def out_var(k: int) -> str:
    """The free variable naming output index ``k``."""
    return f"_o{k}"


def _outputs_sym(g: Graph) -> list[Sym]:
    inputs = {name: Sym(t.shape, lambda idx, name=name: E.p_atom(("in", name, idx)))  # type: ignore[misc]
              for name, t in input_types(g).items()}
    return run(g, inputs, AbstractDomain())


def derive_on(g: Graph, case: Case, k: int, room: list[int] | None = None) -> tuple[E.Poly, frozenset[str], D.Defs]:
    """Output ``k``'s expression at the index ``(_o0, _o1, ...)`` restricted to ``case`` (one it holds at one value:
    that constant), the laws used and what was recorded for definedness; :class:`~verimirage.smt.expr.NeedSplit` where
    the case must be split. ``room``: the nodes its terms may have, shared with other cases (``Derivation.room``)."""
    d = E.Derivation() if room is None else E.Derivation(room=room)
    tok = E.activate(d)
    try:
        d.ranges.update((out_var(j), r) for j, r in enumerate(case))
        o = _outputs_sym(g)[k]
        idx = (E.a_var(out_var(j)) if hi - lo > 1 else E.a_const(lo) for j, (lo, hi) in enumerate(case))
        return o.at(tuple(idx)), frozenset(d.laws), D.defs_of(d)
    finally:
        E.deactivate(tok)


def _split(ns: E.NeedSplit, c: Case) -> tuple[int, list[int]]:
    """Where to cut case ``c`` for ``ns`` (a concat read at ``4*_o0 + _o1``): the first output index of the read that
    :func:`~verimirage.smt.expr.split_points` cuts, else whose values lie in different pieces, else the first halved.
    Sound whatever the cuts: they partition ``c``, :func:`~verimirage.smt.expr.p_cat` takes only a provable piece."""
    d = E.Derivation(ranges={**ns.ranges, **{out_var(j): r for j, r in enumerate(c)}})
    js = [j for j, (lo, hi) in enumerate(c) if out_var(j) in E.a_vars(ns.idx) and hi - lo > 1]
    tok = E.activate(d)
    try:
        for j in js:
            (lo, hi), v = c[j], out_var(j)
            cuts = [p for p in E.split_points(ns, v, (lo, hi)) or () if lo < p < hi]
            if not cuts:  # (the pieces its values lie in one at a time: {a}, or {a, b} undecided)
                at = [{sum(p <= i for p in ns.points) for i in E.interval(E.subst(ns.idx, v, E.a_const(x)))}
                      for x in range(lo, hi)]
                cuts = [lo + i for i in range(1, hi - lo) if len(at[i]) > 1 or at[i] != at[i - 1]]
            if cuts:
                return j, [lo, *cuts, hi]
    finally:
        E.deactivate(tok)
    if js:
        return js[0], [c[js[0]][0], sum(c[js[0]]) // 2, c[js[0]][1]]
    raise E.AbstractionError(f"piecewise value at {E.pretty(ns.idx)} cannot be resolved")


def derive_all(gs: Sequence[Graph]) -> tuple[list[list[Case]], list[Derived]]:
    """Every output of the programs ``gs`` (of the same output types) on the coarsest cases (boxes of its indices) on
    which each of them derives, a case split where :func:`_split` cuts it: per output its cases, per program its
    :data:`Derived`."""
    cases: list[list[Case]] = []
    out: list[Derived] = [([], set(), []) for _ in gs]
    room = E.Derivation().room  # (the nodes all cases' terms may have: each case's cut is paid for, no cut is free)
    for k, t in enumerate(output_types(gs[0])):
        todo: list[Case] = [tuple((0, n) for n in t.shape)]
        done: dict[Case, list[tuple[E.Poly, frozenset[str], D.Defs]]] = {}
        while todo:
            c = todo.pop()
            try:
                done[c] = [derive_on(g, c, k, room) for g in gs]
            except E.NeedSplit as ns:
                j, cuts = _split(ns, c)
                todo += [(*c[:j], r, *c[j + 1:]) for r in itertools.pairwise(cuts)]
            if len(done) + len(todo) > 64:
                raise E.AbstractionError("too many piecewise cases")
        cases.append(sorted(done))
        for i, (exprs, laws, defs) in enumerate(out):
            exprs.append([done[c][i][0] for c in cases[-1]])
            laws.update(*(done[c][i][1] for c in cases[-1]))
            defs.append([done[c][i][2] for c in cases[-1]])
    return cases, out
