"""The op registry: every op is defined once here.

Each :class:`OpDef` carries the op's properties (as data, so that rewriting and
checking read the same facts), its shape rule, and its meaning in every
semantic domain. This file is part of the trusted core (what the certificate
checker imports): the domains (``"ref"`` float64 reference in :mod:`.reference`,
``"ff"`` finite field, ``"abstract"`` Z3 expressions, ``"egglog"`` constructor,
``"triton"`` lowering, ``"torch"``) register their meaning with :func:`implements`
from their own modules, and a test asserts that every op has every domain (or
is on the reviewed exception list :data:`DOMAIN_EXCEPTIONS`). Layout ops (data
movement) have one meaning for every array domain, written here.

Conventions for domain implementations
--------------------------------------
A domain function is called as ``fn(args, attrs, in_types, out_types)``:

* ``args`` are the operand values. A value is an array whose *trailing* dims
  are the logical tensor (``in_types[i].shape``); any dims before them are
  batch dims (grid blocks of a block graph, or a domain's own leading axes)
  that the op must treat as a batch. For ops with the ``BROADCAST`` property
  the evaluator has already aligned the operands' logical ranks (inserting
  size-1 dims), so numpy broadcasting is correct.
* ``attrs`` is a dict; axes in it are non-negative and relative to the
  logical rank. Use :func:`neg_axis` to address them on batched arrays.
* It returns one value (every registry op has one result except ``custom``,
  which the evaluator handles).
"""

from __future__ import annotations

import enum
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from .dtypes import DType
from .errors import GraphError
from .limits import check_constant


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of a tensor (or a tile, at block level)."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        """Number of dims."""
        return len(self.shape)

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(map(str, self.shape))}]"


class Prop(enum.Flag):
    """Properties of ops, read by the rewriter, the checks and codegen."""

    NONE = 0
    ELEMENTWISE = enum.auto()  # result[i] depends on operand[i] only (with broadcasting)
    UNARY = enum.auto()
    BINARY = enum.auto()
    COMMUTATIVE = enum.auto()
    ASSOCIATIVE = enum.auto()
    BROADCAST = enum.auto()  # operands broadcast like numpy (ranks are aligned first)
    REDUCTION = enum.auto()  # reduces one axis, keeping it with size 1
    LINEAR = enum.auto()  # linear in each operand
    LOOP = enum.auto()  # for-loop construct of block graphs (stateful; the evaluator runs it)
    STRUCTURAL = enum.auto()  # inputs, custom kernels, fused thread graphs: no tensor meaning
    CONTRACTION = enum.auto()  # a matrix product (tl.dot): accumulates over a for-loop like a sum
    EXPONENTIAL = enum.auto()  # f(a + b) = f(a) * f(b): a shift of the argument becomes a scaling
    DIFFERENCE = enum.auto()  # a - b: subtracting a (running) max makes a max-shifted value
    CONCAT = enum.auto()  # joins its operands along ``axis`` (block matrices; loaded piecewise by codegen)
    NORMALISES = enum.auto()  # divides by a data-dependent size (the result may not scale with the input)


class Level(enum.Flag):
    """IR levels an op may appear at."""

    KERNEL = enum.auto()
    BLOCK = enum.auto()
    THREAD = enum.auto()
    ALL = KERNEL | BLOCK | THREAD


ShapeRule = Callable[[Sequence[TensorType], dict[str, Any]], TensorType]
DomainFn = Callable[..., Any]

#: Semantic domains every op must have (unless listed in DOMAIN_EXCEPTIONS). ``"torch"`` is the op's
#: meaning written with torch's own functions (:mod:`verimirage.testing.torch_ref`), a second reference.
DOMAINS: tuple[str, ...] = ("ref", "ff", "abstract", "egglog", "triton", "torch")


@dataclass(frozen=True)
class IndexMap:
    """How an op's operand dims line up with its result dims (an einsum-like signature of one node).

    * ``links``: ``(operand, operand dim, result dim)``: the operand dim is walked together with the
      result dim (a size-1 operand dim broadcasts);
    * ``reduced``: groups of operand dims walked together and reduced away (a reduction's axis, a
      matmul's contraction dims);
    * ``whole_in`` / ``whole_out``: operand / result dims that must stay whole in one tile (a
      normalised axis, a concat or slice axis); a result dim no link reaches is a fresh index;
    * ``matrix``: the result dims ``(m, n)`` of a matrix product (its contraction is ``reduced[0]``).

    Every client that lines dims up (partitioning, codegen's tile shapes, the batch-dim analysis)
    reads this one rule.
    """

    links: tuple[tuple[int, int, int], ...] = ()
    reduced: tuple[tuple[tuple[int, int], ...], ...] = ()
    whole_in: tuple[tuple[int, int], ...] = ()
    whole_out: tuple[int, ...] = ()
    matrix: tuple[int, int] | None = None

    def linked(self) -> set[int]:
        """Result dims some operand dim reaches."""
        return {o for _, _, o in self.links}


IndexRule = Callable[[Sequence[TensorType], dict[str, Any], TensorType], IndexMap]


@dataclass(frozen=True)
class Reduce:
    """What a reduction does: ``combine`` (the binary op merging partial results), the block-level loop
    op accumulating it over for-loop iterations (None: the axis is reduced in one tile), the value
    padded positions must hold (the combine's identity), and whether the result is divided by the
    axis length (mean)."""

    combine: str
    loop: str | None
    identity: float
    mean: bool = False


@dataclass(frozen=True)
class Degree:
    """Finite-field degree facts of one node: the degree of its result as a rational function of the
    inputs, how many opaque (keyed random function) applications it makes, and the largest degree of
    an argument of those applications."""

    result: int
    opaque: int = 0
    inner: int = 0


DegreeRule = Callable[[list[int], dict[str, Any]], Degree]
#: homogeneity degree of the result from the operands' (None: not homogeneous)
HomogRule = Callable[[list[Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class OpDef:
    """One op: name, arity, attributes, properties, shape rule and domain meanings."""

    name: str
    arity: int | None  # None: variadic (at least ``min_args``)
    attrs: tuple[str, ...]
    props: Prop
    levels: Level
    shape_rule: ShapeRule | None
    doc: str
    min_args: int = 1
    domains: dict[str, DomainFn] = field(default_factory=dict, compare=False, hash=False)
    #: kind of each attribute (``"int"``, ``"float"``, ``"axis"``, ``"ints"``, ``"axes"``, ``"dtype"``): how
    #: builders normalise it and how egglog holds it; attributes not named here are floats
    attr_kinds: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    #: which operand dims line up with which result dims (None: structural ops)
    index: IndexRule | None = field(default=None, compare=False, hash=False)
    #: reductions: how partial results combine (see :class:`Reduce`)
    reduce: Reduce | None = field(default=None, compare=False, hash=False)
    #: ops mixing elements along ``attrs["axis"]`` that are not reductions (rms_norm): the value padded
    #: positions of operand 0 must hold along that axis
    pad: float | None = field(default=None, compare=False, hash=False)
    #: finite-field degree rule (see :class:`Degree`)
    degree: DegreeRule | None = field(default=None, compare=False, hash=False)
    #: homogeneity rule (positive scaling of the inputs), None: homogeneous only if constant
    homog: HomogRule | None = field(default=None, compare=False, hash=False)
    #: the non-polynomial "family" of the op for pruning partial programs (None: polynomial or data movement)
    family: str | None = None
    #: e-graph shape propagation: "same" (the operand's shape), "broadcast", "reduce", or "custom" (the
    #: egglog package writes its own rules) or None (only lifted terms have shapes)
    egg_shape: str | None = None
    #: operands in which the op is homogeneous of degree 1 (f(.., c*x, ..) = c * f(.., x, ..)): a value
    #: rescaled by the online softmax stays rescaled through them
    scales_with: tuple[int, ...] = ()
    #: per-package facts that are not meanings (e.g. ``"block"``: the backend's default block graph)
    hooks: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def has(self, prop: Prop) -> bool:
        """Whether the op has property ``prop``."""
        return bool(self.props & prop)

    def index_map(self, in_types: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
        """The op's :class:`IndexMap` on operands of ``in_types``; GraphError for ops without one."""
        if self.index is None:
            raise GraphError(f"{self.name}: has no index rule (structural op); expected a tensor op")
        return self.index(in_types, attrs, out)

    def block_attrs(self, attrs: dict[str, Any], full_in_types: Sequence[TensorType]) -> dict[str, Any]:
        """The attributes of this op inside a block graph whose operands are tiles of ``full_in_types``."""
        out = dict(attrs)
        if "src" in self.hooks.get("block_only", ()):
            out["src"] = tuple(full_in_types[0].shape)
        return out

    def egg_attrs(self) -> tuple[str, ...]:
        """The attributes an e-graph term carries (kernel level: block-only ones left out)."""
        return tuple(a for a in self.attrs if a not in self.hooks.get("block_only", ()))

    def attr_kind(self, key: str) -> str:
        """The kind of attribute ``key`` (see :attr:`attr_kinds`)."""
        return self.attr_kinds.get(key, "float")

    def degree_of(self, args: list[int], attrs: dict[str, Any]) -> Degree:
        """Finite-field degree facts on operands of degrees ``args`` (default: opaque unary)."""
        if self.degree is None:
            return Degree(1, 1, max(args, default=1))
        return self.degree(args, attrs)

    def infer(self, in_types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        """Result type of the op on operands of ``in_types``; raises GraphError."""
        n = len(in_types)
        if self.arity is not None and n != self.arity:
            raise GraphError(f"{self.name}: takes {self.arity} operand(s), got {n}")
        if self.arity is None and n < self.min_args:
            raise GraphError(f"{self.name}: takes at least {self.min_args} operand(s), got {n}")
        if self.shape_rule is None:
            raise GraphError(f"{self.name}: has no shape rule (structural op)")
        masks = self.hooks.get("mask_args", ())
        for i, t in enumerate(in_types):
            if self.hooks.get("any_dtype") and all(u.dtype == in_types[0].dtype for u in in_types):
                break  # data movement: masks may be sliced, joined, permuted, reshaped, broadcast
            if (t.dtype is DType.bool) != (i in masks):
                want = "a vm.bool mask" if i in masks else "a floating-point tensor (vm.bool is for where's mask)"
                raise GraphError(f"{self.name}: operand {i} is {t}; expected {want}")
        return self.shape_rule(in_types, attrs)


OPS: dict[str, OpDef] = {}

#: (op, domain) pairs that are reviewed exceptions to "every op has every domain", with reasons.
DOMAIN_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    OPS[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    """The registered op ``name``; GraphError naming the known ops otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown op {name!r}; known ops: {sorted(OPS)}") from None


def implements(domain: str, *names: str) -> Callable[[DomainFn], DomainFn]:
    """Decorator registering ``fn`` as the meaning of ops ``names`` in ``domain``."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")

    def deco(fn: DomainFn) -> DomainFn:
        for n in names:
            get_op(n).domains[domain] = fn
        return fn

    return deco


#: modules holding a domain's meanings that the IR loads on first need (:func:`meaning`)
DOMAIN_HOMES: dict[str, str] = {"ref": "verimirage.ir.reference"}


def meaning(op: str, domain: str) -> DomainFn | None:
    """The meaning of registry op ``op`` in ``domain`` (None: it has none), loading the domain's home first."""
    fn = get_op(op).domains.get(domain)
    if fn is None and domain in DOMAIN_HOMES:
        importlib.import_module(DOMAIN_HOMES[domain])
        fn = OPS[op].domains.get(domain)
    return fn


def exempt(domain: str, name: str, reason: str) -> None:
    """Record that op ``name`` has, on purpose, no meaning in ``domain``."""
    DOMAIN_EXCEPTIONS[(name, domain)] = reason


def missing_domains() -> list[tuple[str, str]]:
    """(op, domain) pairs with neither a meaning nor a reviewed exception."""
    for home in DOMAIN_HOMES.values():
        importlib.import_module(home)
    return [
        (op.name, d)
        for op in OPS.values()
        for d in DOMAINS
        if d not in op.domains and (op.name, d) not in DOMAIN_EXCEPTIONS
    ]


# --------------------------------------------------------------------------- shape rules


def _shapes(ts: Sequence[TensorType]) -> str:
    return ", ".join(str(t) for t in ts)


def _err(op: str, ts: Sequence[TensorType], expected: str) -> GraphError:
    return GraphError(f"{op}: operands {_shapes(ts)}; expected {expected}")


def _same_dtype(op: str, ts: Sequence[TensorType]) -> DType:
    dts = {t.dtype for t in ts}
    if len(dts) != 1:
        raise _err(op, ts, "operands of one dtype (no implicit casts)")
    return ts[0].dtype


def broadcast_shapes(op: str, ts: Sequence[TensorType]) -> tuple[int, ...]:
    """numpy broadcasting of the operands' shapes, or GraphError."""
    rank = max(t.rank for t in ts)
    out = []
    for i in range(rank):
        dims = {t.shape[i - rank + t.rank] for t in ts if i - rank + t.rank >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise _err(op, ts, "shapes that broadcast (numpy rules: equal dims or 1)")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def check_axis(op: str, t: TensorType, axis: Any, what: str = "axis") -> int:
    """``axis`` normalised to 0..rank-1, or GraphError."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise GraphError(f"{op}: {what} must be an int, got {axis!r}")
    a = int(axis)
    if not -t.rank <= a < t.rank:
        raise GraphError(f"{op}: operand {t} has no {what} {a}; expected -{t.rank} <= {what} < {t.rank}")
    return a % t.rank


def _unary_rule(name: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        return ts[0]

    return rule


def _binary_rule(name: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        dt = _same_dtype(name, ts)
        return TensorType(broadcast_shapes(name, ts), dt)

    return rule


def _reduce_rule(name: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = ts
        if t.rank == 0:
            raise _err(name, ts, "an operand of rank >= 1")
        a = check_axis(name, t, attrs["axis"])
        shape = list(t.shape)
        shape[a] = 1
        return TensorType(tuple(shape), t.dtype)

    return rule


def _matmul_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    a, b = ts
    if a.rank < 2 or b.rank < 2:
        raise _err("matmul", ts, "operands of rank >= 2 (..., m, k) and (..., k, n)")
    if a.shape[-1] != b.shape[-2]:
        raise _err(
            "matmul", ts, f"the contraction dims to match (a.shape[-1] = {a.shape[-1]}, b.shape[-2] = {b.shape[-2]})"
        )
    dt = _same_dtype("matmul", ts)
    batch = broadcast_shapes("matmul", [TensorType(a.shape[:-2], dt), TensorType(b.shape[:-2], dt)])
    return TensorType((*batch, a.shape[-2], b.shape[-1]), dt)


def _scale_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    check_constant("scale/shift", attrs.get("c"))
    return ts[0]


def _rms_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ts[0]
    if x.rank == 0:
        raise _err("rms_norm", ts, "an operand of rank >= 1")
    a = check_axis("rms_norm", x, attrs["axis"])
    check_constant("rms_norm: eps", attrs.get("eps"), nonnegative=True)
    if len(ts) == 2:
        w = ts[1]
        if w.shape != (x.shape[a],):
            raise _err("rms_norm", ts, f"a weight of shape ({x.shape[a]},) (the size of axis {a})")
        _same_dtype("rms_norm", ts)
    return x


def _concat_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    r = ts[0].rank
    if any(t.rank != r for t in ts) or r == 0:
        raise _err("concat", ts, "operands of one rank >= 1")
    a = check_axis("concat", ts[0], attrs["axis"])
    for t in ts:
        if t.shape[:a] + t.shape[a + 1 :] != ts[0].shape[:a] + ts[0].shape[a + 1 :]:
            raise _err("concat", ts, f"equal sizes on every dim but the concat axis {a}")
    dt = _same_dtype("concat", ts)
    shape = list(ts[0].shape)
    shape[a] = sum(t.shape[a] for t in ts)
    return TensorType(tuple(shape), dt)


def _transpose_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    a = check_axis("transpose", t, attrs["a"], "axis a")
    b = check_axis("transpose", t, attrs["b"], "axis b")
    shape = list(t.shape)
    shape[a], shape[b] = shape[b], shape[a]
    return TensorType(tuple(shape), t.dtype)


def _rescaled_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ts[0]
    if broadcast_shapes("rescaled_sum", ts) != x.shape:
        raise _err("rescaled_sum", ts, "a running max that broadcasts to the accumulated value")
    return x


def neg_axis(axis: int, rank: int) -> int:
    """A non-negative logical ``axis`` of a rank-``rank`` tensor as a negative array axis."""
    return axis - rank


# --------------------------------------------------------------------------- index rules


def index_broadcast(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """Elementwise ops: every operand dim (right-aligned, numpy broadcasting) walks with the result dim."""
    r = out.rank
    return IndexMap(links=tuple((i, j, j + r - t.rank) for i, t in enumerate(ts) for j in range(t.rank)))


def index_reduce(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """Reductions along ``axis`` (kept with size 1)."""
    ax = attrs["axis"]
    return IndexMap(links=tuple((0, j, j) for j in range(ts[0].rank) if j != ax), reduced=(((0, ax),),))


def _index_matmul(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    a, b = ts
    r = out.rank
    links = [(0, j, j + r - a.rank) for j in range(a.rank - 2)] + [(1, j, j + r - b.rank) for j in range(b.rank - 2)]
    links += [(0, a.rank - 2, r - 2), (1, b.rank - 1, r - 1)]
    return IndexMap(links=tuple(links), reduced=(((0, a.rank - 1), (1, b.rank - 2)),), matrix=(r - 2, r - 1))


def _index_rms(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    ax = attrs["axis"]
    links = [(0, j, j) for j in range(ts[0].rank)] + ([(1, 0, ax)] if len(ts) == 2 else [])
    return IndexMap(links=tuple(links), whole_out=(ax,))


def _index_concat(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    ax = attrs["axis"]
    links = tuple((i, j, j) for i, t in enumerate(ts) for j in range(t.rank) if j != ax)
    return IndexMap(links=links, whole_in=tuple((i, ax) for i in range(len(ts))), whole_out=(ax,))


def _index_transpose(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    a, b = attrs["a"], attrs["b"]
    return IndexMap(links=tuple((0, b if j == a else a if j == b else j, j) for j in range(out.rank)))


# --------------------------------------------------------------------------- degree and homogeneity rules


def _deg_max(a: list[int], attrs: dict[str, Any]) -> Degree:
    return Degree(max(a) if a else 1)


def _deg_sum(a: list[int], attrs: dict[str, Any]) -> Degree:
    return Degree(sum(a))


def _deg_opaque(a: list[int], attrs: dict[str, Any]) -> Degree:
    """A keyed random function of its argument: a fresh variable of degree 1."""
    return Degree(1, 1, max(a, default=1))


def _h_add(args: list[Any], attrs: dict[str, Any]) -> Any:
    """add-like ops: homogeneous of the common degree of the operands that depend on the input."""
    dep = [k for d, k in args if d]
    if len(dep) != len(args) and any(k != 0 for k in dep):
        return None  # x + c is not homogeneous unless x has degree 0
    return dep[0] if all(k == dep[0] for k in dep) and dep[0] is not None else None


def _h_first(args: list[Any], attrs: dict[str, Any]) -> Any:
    """Positively homogeneous of degree 1 in the first operand (neg, scale, relu, reductions, layouts)."""
    return args[0][1]


def _h_mul(args: list[Any], attrs: dict[str, Any]) -> Any:
    ks = [k for _, k in args]
    return None if any(k is None for k in ks) else sum(ks, Fraction(0))


def _h_div(args: list[Any], attrs: dict[str, Any]) -> Any:
    ks = [k for _, k in args]
    return None if any(k is None for k in ks) else ks[0] - ks[1]


def _h_times(c: Fraction) -> HomogRule:
    def rule(args: list[Any], attrs: dict[str, Any]) -> Any:
        k = args[0][1]
        return None if k is None else c * k

    return rule


def _h_rms(args: list[Any], attrs: dict[str, Any]) -> Any:
    if args[0][1] is None or (len(args) == 2 and args[1][1] is None):
        return None
    return args[1][1] if len(args) == 2 and args[1][0] else Fraction(0)


# --------------------------------------------------------------------------- registration


def _def(
    name: str,
    arity: int | None,
    props: Prop,
    rule: ShapeRule | None,
    ref: DomainFn | None,
    doc: str,
    attrs: tuple[str, ...] = (),
    levels: Level = Level.ALL,
    min_args: int = 1,
    **facts: Any,
) -> OpDef:
    levels = facts.pop("levels", levels)
    op = _register(OpDef(name, arity, attrs, props, levels, rule, doc, min_args, **facts))
    if ref is not None:
        op.domains["ref"] = ref
    return op


def define_op(
    name: str,
    arity: int | None,
    props: Prop,
    shape_rule: ShapeRule | None,
    ref: DomainFn | None,
    doc: str,
    *,
    attrs: tuple[str, ...] = (),
    levels: Level = Level.ALL,
    min_args: int = 1,
    **facts: Any,
) -> OpDef:
    """Register a new op (the one place an op is declared); ``facts`` are :class:`OpDef` fields.

    Elementwise ops get the broadcasting index rule and e-graph shape rule unless given others.
    """
    if props & Prop.ELEMENTWISE:
        facts.setdefault("index", index_broadcast)
        facts.setdefault("egg_shape", "same" if props & Prop.UNARY else "broadcast")
    return _def(name, arity, props, shape_rule, ref, doc, attrs, levels, min_args, **facts)


_EW = Prop.ELEMENTWISE
_U = _EW | Prop.UNARY
_B = _EW | Prop.BINARY | Prop.BROADCAST
_KB = Level.KERNEL | Level.BLOCK
_FLOAT_C = {"c": "float"}


def _unary(name: str, doc: str, **facts: Any) -> OpDef:
    rule = facts.pop("shape_rule_override", None) or unary_rule(name)
    return define_op(name, 1, _U | facts.pop("props", Prop.NONE), rule, None, doc, **facts)


def unary_rule(name: str) -> ShapeRule:
    """The shape rule of unary elementwise ops (the operand's type)."""
    return _unary_rule(name)


def binary_rule(name: str) -> ShapeRule:
    """The shape rule of broadcasting binary ops (one dtype, numpy broadcasting)."""
    return _binary_rule(name)


_unary("exp", "e**x", props=Prop.EXPONENTIAL, family="exp", degree=_deg_opaque)
_unary("silu", "x * sigmoid(x)", family="silu", degree=_deg_opaque)
_unary("gelu", "GELU, tanh approximation", family="gelu", degree=_deg_opaque)
_unary("relu", "max(x, 0)", family="relu", degree=_deg_opaque, homog=_h_first)
_unary("sqrt", "square root", family="sqrt", degree=_deg_opaque, homog=_h_times(Fraction(1, 2)))
_unary("rsqrt", "1 / sqrt(x)", family="sqrt", degree=_deg_opaque,
       homog=_h_times(Fraction(-1, 2)))
_unary("square", "x * x", degree=lambda a, at: Degree(2 * a[0]), homog=_h_times(Fraction(2)))
_unary("neg", "-x", props=Prop.LINEAR, degree=_deg_max, homog=_h_first, scales_with=(0,))

define_op(
    "scale",
    1,
    _U | Prop.LINEAR,
    _scale_rule,
    None,
    "x * c for a Python constant c",
    attrs=("c",),
    attr_kinds=_FLOAT_C,
    degree=_deg_max,
    homog=_h_first,
    scales_with=(0,),
)
define_op(
    "shift",
    1,
    _U,
    _scale_rule,
    None,
    "x + c for a Python constant c",
    attrs=("c",),
    attr_kinds=_FLOAT_C,
    degree=_deg_max,
)

_BINARY: list[tuple[str, Prop, str, DegreeRule, HomogRule, str | None, tuple[int, ...]]] = [
    ("add", Prop.COMMUTATIVE | Prop.ASSOCIATIVE | Prop.LINEAR, "a + b", _deg_max, _h_add, None, ()),
    ("sub", Prop.LINEAR | Prop.DIFFERENCE, "a - b", _deg_max, _h_add, None, ()),
    ("mul", Prop.COMMUTATIVE | Prop.ASSOCIATIVE, "a * b", _deg_sum, _h_mul, None, (0, 1)),
    ("div", Prop.NORMALISES, "a / b", _deg_sum, _h_div, None, (0,)),
    ("maximum", Prop.COMMUTATIVE | Prop.ASSOCIATIVE, "elementwise max(a, b)", _deg_max, _h_add, "max",
     ()),
]
for _name, _p, _doc, _dg, _hg, _fam, _sw in _BINARY:
    define_op(_name, 2, _B | _p, _binary_rule(_name), None, _doc, degree=_dg, homog=_hg, family=_fam,
              scales_with=_sw)

_AXIS = {"axis": "axis"}


def _reduction(name: str, doc: str, red: Reduce, **facts: Any) -> OpDef:
    return _def(name, 1, Prop.REDUCTION | facts.pop("props", Prop.NONE), _reduce_rule(name), None, doc,
                ("axis",), _KB, attr_kinds=_AXIS, index=index_reduce, reduce=red, degree=_deg_max, homog=_h_first,
                egg_shape="reduce", **facts)


_reduction("sum", "sum along axis", Reduce("add", "loop_sum", 0.0), props=Prop.LINEAR, scales_with=(0,))
_reduction("mean", "mean along axis", Reduce("add", "loop_sum", 0.0, mean=True), props=Prop.LINEAR)
_reduction("max", "max along axis", Reduce("maximum", "loop_max", -math.inf), family="max")


_def(
    "matmul",
    2,
    Prop.BROADCAST | Prop.LINEAR | Prop.CONTRACTION,
    _matmul_rule,
    None,
    "(..., m, k) @ (..., k, n), leading dims broadcast",
    levels=_KB,
    index=_index_matmul,
    scales_with=(0, 1),
    degree=_deg_sum,
    homog=_h_mul,
    egg_shape="custom",
)
_def(
    "rms_norm",
    None,
    Prop.NORMALISES,
    _rms_rule,
    None,
    "x / sqrt(mean(x**2, axis) + eps) [* weight]",
    ("axis", "eps"),
    _KB,
    attr_kinds={"axis": "axis", "eps": "float"},
    index=_index_rms,
    pad=0.0,
    degree=lambda a, at: Degree(sum(a) + 2 * a[0] + 1, 1, 0),
    homog=_h_rms,
    family="sqrt",
    egg_shape="same",
)
_def("concat", None, Prop.CONCAT, _concat_rule, None, "concatenate along axis", ("axis",), _KB,
     attr_kinds=_AXIS, index=_index_concat, degree=_deg_max, homog=_h_add, egg_shape="custom",
     hooks={"triton_needs": ("_padded",)})
_def("transpose", 1, Prop.NONE, _transpose_rule, None, "swap axes a and b", ("a", "b"), _KB,
     attr_kinds={"a": "axis", "b": "axis"}, index=_index_transpose, degree=_deg_max, homog=_h_first,
     egg_shape="custom")

# ---- ops real models use (issue 21): transcendental unaries are opaque in the finite field


def _finite_attr(op: str, key: str, v: Any) -> float:
    return check_constant(f"{op}: {key}", v)  # finite and float32-representable (verimirage.ir.limits)


def _attr_rule(op: str, *keys: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        vals = [_finite_attr(op, k, attrs.get(k)) for k in keys]
        if op == "clamp" and vals[0] > vals[1]:
            raise GraphError(f"clamp: lo={vals[0]} > hi={vals[1]}; expected lo <= hi")
        return ts[0]

    return rule


def _deg_pow(a: list[int], attrs: dict[str, Any]) -> Degree:
    c = attrs["c"]
    if float(c).is_integer() and abs(c) <= POW_EXACT_MAX:
        return Degree(max(1, int(abs(c))) * a[0])
    return _deg_opaque(a, attrs)


#: integer exponents up to this size are exact powers in the finite field (larger: opaque)
POW_EXACT_MAX = 8

_TRANSCENDENTAL: list[tuple[str, str, str, HomogRule | None]] = [
    ("log", "natural logarithm (partial: x > 0)", "log", None),
    ("tanh", "hyperbolic tangent", "tanh", None),
    ("sigmoid", "1 / (1 + e**-x)", "sigmoid", None),
    ("erf", "the error function (exact GELU is 0.5 x (1 + erf(x / sqrt 2)))", "erf", None),
    ("softplus", "log(1 + e**x)", "softplus", None),
    ("abs", "|x|", "abs", _h_first),
]
for _name, _doc, _fam, _hgo in _TRANSCENDENTAL:
    _unary(_name, _doc, family=_fam, degree=_deg_opaque, homog=_hgo)
for _name in ("sigmoid", "tanh", "silu"):  # exact through exp in the verifier's domains: 1 / (1 + exp(-x))
    OPS[_name].hooks["uses_exp"] = True
_unary("reciprocal", "1 / x", degree=_deg_max, homog=_h_times(Fraction(-1)))
define_op("pow", 1, _U, _attr_rule("pow", "c"), None,
          "x ** c for a Python constant c", attrs=("c",), attr_kinds=_FLOAT_C, degree=_deg_pow,
          homog=lambda args, attrs: None if args[0][1] is None else Fraction(attrs["c"]) * args[0][1])
define_op("clamp", 1, _U, _attr_rule("clamp", "lo", "hi"), None,
          "min(max(x, lo), hi) (hardtanh: lo=-1, hi=1; relu6: lo=0, hi=6)", attrs=("hi", "lo"),
          attr_kinds={"lo": "float", "hi": "float"}, family="clamp", degree=_deg_opaque)
define_op("leaky_relu", 1, _U, _attr_rule("leaky_relu", "slope"), None,
          "x if x >= 0 else slope * x", attrs=("slope",), attr_kinds={"slope": "float"}, family="leaky_relu",
          degree=_deg_opaque, homog=_h_first)
define_op("step", 1, _U, _attr_rule("step", "c"), None,
          "1 where x > c else 0 (the mask of ReLU's and LeakyReLU's gradients: threshold_backward)", attrs=("c",),
          attr_kinds=_FLOAT_C, family="step", degree=_deg_opaque)
define_op("minimum", 2, _B | Prop.COMMUTATIVE | Prop.ASSOCIATIVE, _binary_rule("minimum"), None,
          "elementwise min(a, b)", degree=_deg_max, homog=_h_add, family="max")
_reduction("min", "min along axis", Reduce("minimum", None, math.inf), family="max")



def _where_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    dt = _same_dtype("where", ts[1:])
    return TensorType(broadcast_shapes("where", ts), dt)


def _h_where(args: list[Any], attrs: dict[str, Any]) -> Any:
    if args[0][0]:
        return None
    return _h_add([a for a in args[1:] if a[0]] or args[1:2], attrs)


define_op("where", 3, _EW | Prop.BROADCAST, _where_rule, None,
          "a where mask else b (mask: a vm.bool tensor; m * a + (1 - m) * b for m in {0, 1})",
          degree=lambda a, at: Degree(max(a[0] + a[1], a[0] + a[2])), homog=_h_where,
          hooks={"mask_args": (0,)})


def _cast_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    dt = DType.parse(str(attrs.get("dtype")))
    if dt is DType.bool:
        raise GraphError("cast: to vm.bool; expected vm.float16, vm.bfloat16 or vm.float32")
    return TensorType(ts[0].shape, dt)


_unary("cast", "x rounded to dtype (the real-valued meaning is x)", attrs=("dtype",),
       attr_kinds={"dtype": "dtype"}, degree=_deg_max, homog=_h_first, shape_rule_override=_cast_rule)

# ---- layout ops (kernel and block level): data movement, one meaning for every array domain


def _ints(op: str, key: str, v: Any) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                   for x in v):
        raise GraphError(f"{op}: {key}={v!r}; expected a tuple of ints")
    return tuple(int(x) for x in v)


def _permute_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    dims = _ints("permute", "dims", attrs.get("dims"))
    if sorted(dims) != list(range(t.rank)):
        raise _err("permute", ts, f"dims to be a permutation of 0..{t.rank - 1}, got {dims}")
    return TensorType(tuple(t.shape[d] for d in dims), t.dtype)


def _tile_shape(op: str, t: TensorType, attrs: dict[str, Any], full: tuple[int, ...]) -> tuple[int, ...]:
    """At block level (``src``: the kernel operand's full shape), the result tile: kept dims take the
    operand tile's size, every other dim is whole (the index rule keeps them out of the grid)."""
    src = _ints(op, "src", attrs["src"])
    if len(src) != t.rank:
        raise GraphError(f"{op}: block-level src {src} does not match the operand tile {t}")
    out = list(full)
    for _a, j, o in OPS[op].index_map([TensorType(src, t.dtype)], attrs, TensorType(full, t.dtype)).links:
        if src[j] != 1:
            out[o] = t.shape[j]
    return tuple(out)


def _reshape_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    shape = _ints("reshape", "shape", attrs.get("shape"))
    n = math.prod(_ints("reshape", "src", attrs["src"])) if "src" in attrs else t.numel
    if any(s <= 0 for s in shape) or math.prod(shape) != n:
        raise _err("reshape", ts, f"a shape of positive dims with {n} elements, got {shape}")
    if "src" in attrs:
        shape = _tile_shape("reshape", t, attrs, shape)
    return TensorType(shape, t.dtype)


def _broadcast_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    shape = _ints("broadcast_to", "shape", attrs.get("shape"))
    src = _ints("broadcast_to", "src", attrs["src"]) if "src" in attrs else t.shape
    lead = len(shape) - len(src)
    if lead < 0 or any(s != shape[j + lead] and s != 1 for j, s in enumerate(src)) or min(shape, default=1) <= 0:
        raise _err("broadcast_to", ts, f"a shape {shape} the operand broadcasts to (numpy rules)")
    if "src" in attrs:
        shape = _tile_shape("broadcast_to", t, attrs, shape)
    return TensorType(shape, t.dtype)


def _index_broadcast_to(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """Operand dims line up right-aligned; the dims it is broadcast along stay whole in a tile."""
    src = tuple(attrs["src"]) if "src" in attrs else ts[0].shape
    lead = out.rank - len(src)
    links = tuple((0, j, j + lead) for j in range(len(src)) if src[j] != 1 or out.shape[j + lead] == 1)
    linked = {o for _, _, o in links}
    return IndexMap(links=links, whole_out=tuple(o for o in range(out.rank) if o not in linked))


def _slice_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    if t.rank == 0:
        raise _err("slice", ts, "an operand of rank >= 1")
    ax = check_axis("slice", t, attrs["axis"])
    start, stop = attrs.get("start"), attrs.get("stop")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)) or \
            not 0 <= start < stop <= t.shape[ax]:  # type: ignore[operator]
        raise _err("slice", ts, f"0 <= start < stop <= {t.shape[ax]} on axis {ax}, got start={start}, stop={stop}")
    shape = list(t.shape)
    shape[ax] = stop - start  # type: ignore[operator]
    return TensorType(tuple(shape), t.dtype)


def _lead(x: Any, t: TensorType) -> int:
    return len(x.shape) - t.rank


def _layout_permute(args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
    x = args[0]
    lead = _lead(x, it[0])
    return x.transpose(list(range(lead)) + [lead + d for d in attrs["dims"]])


def _layout_reshape(args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
    x = args[0]
    return x.reshape(tuple(x.shape[: _lead(x, it[0])]) + tuple(ot[0].shape))


def _layout_broadcast(args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
    x = args[0]
    lead = _lead(x, it[0])
    shape = tuple(ot[0].shape)
    y = x.reshape(tuple(x.shape[:lead]) + (1,) * (len(shape) - it[0].rank) + tuple(x.shape[lead:]))
    return np.broadcast_to(y, tuple(y.shape[:lead]) + shape)


def _layout_slice(args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
    x = args[0]
    pos = _lead(x, it[0]) + attrs["axis"]
    return x[(slice(None),) * pos + (slice(attrs["start"], attrs["stop"]),)]


def reshape_groups(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Row-major reshape ``old -> new`` as groups of dims (size-1 dims left out) whose sizes multiply
    to the same number."""
    o = [i for i, n in enumerate(old) if n != 1]
    nn = [j for j, n in enumerate(new) if n != 1]
    groups = []
    i = j = 0
    while i < len(o) or j < len(nn):
        og, ng = [o[i]], [nn[j]]
        po, pn = old[o[i]], new[nn[j]]
        i += 1
        j += 1
        while po != pn:
            if po < pn:
                og.append(o[i])
                po *= old[o[i]]
                i += 1
            else:
                ng.append(nn[j])
                pn *= new[nn[j]]
                j += 1
        groups.append((og, ng))
    return groups


def _index_permute(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    return IndexMap(links=tuple((0, d, j) for j, d in enumerate(attrs["dims"])))


def _index_reshape(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """Dims a reshape keeps (one old dim is one new dim) walk together; merged or split dims stay whole."""
    links, whole_in, whole_out = [], [], []
    src = tuple(attrs["src"]) if "src" in attrs else ts[0].shape
    for og, ng in reshape_groups(src, tuple(attrs["shape"])):
        if len(og) == 1 and len(ng) == 1:
            links.append((0, og[0], ng[0]))
        else:
            whole_in += [(0, d) for d in og]
            whole_out += ng
    return IndexMap(links=tuple(links), whole_in=tuple(whole_in), whole_out=tuple(whole_out))


def _index_slice(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    ax = attrs["axis"]
    return IndexMap(links=tuple((0, j, j) for j in range(out.rank) if j != ax), whole_in=((0, ax),),
                    whole_out=(ax,))


_LAYOUT: dict[str, Any] = {"degree": _deg_max, "homog": _h_first, "levels": _KB, "egg_shape": "custom"}
_def("permute", 1, Prop.NONE, _permute_rule, _layout_permute, "reorder dims: result dim j is operand dim dims[j]",
     ("dims",), attr_kinds={"dims": "ints"}, index=_index_permute, **_LAYOUT)
# at block level a reshape / broadcast_to also records ``src``, the kernel operand's full shape, so that
# its shape attribute (the full result) and the tile it makes can both be read (see _tile_shape)
_BLOCK_SRC = {"triton_needs": ("_padded",), "block_only": ("src",)}
_def("reshape", 1, Prop.NONE, _reshape_rule, _layout_reshape, "row-major reshape (view)", ("shape", "src"),
     attr_kinds={"shape": "ints", "src": "ints"}, index=_index_reshape, hooks=dict(_BLOCK_SRC), **_LAYOUT)
_def("broadcast_to", 1, Prop.NONE, _broadcast_rule, _layout_broadcast, "numpy broadcast to shape (expand)",
     ("shape", "src"), attr_kinds={"shape": "ints", "src": "ints"}, index=_index_broadcast_to,
     hooks=dict(_BLOCK_SRC), **_LAYOUT)
_def("slice", 1, Prop.NONE, _slice_rule, _layout_slice, "elements start..stop-1 along axis (narrow)",
     ("axis", "start", "stop"), attr_kinds={"axis": "axis", "start": "int", "stop": "int"}, index=_index_slice,
     hooks={"triton_needs": ("_padded",)}, **_LAYOUT)
for _name in ("permute", "reshape", "broadcast_to"):
    OPS[_name].domains["ff"] = OPS[_name].domains["ref"]  # data movement: the same on every array value
    OPS[_name].domains["abstract"] = OPS[_name].domains["ref"]
OPS["slice"].domains["ff"] = _layout_slice
for _name in ("permute", "reshape", "broadcast_to", "slice", "concat", "transpose"):
    OPS[_name].hooks["any_dtype"] = True

# Loop constructs of block graphs. Their meaning is the evaluator's (ir.interpret), written once
# in terms of registry ops (add, maximum, sub, exp, mul), so every domain gets them for free.
_LOOP: dict[str, Any] = {"index": index_broadcast, "degree": _deg_max}
_def("loop_sum", 1, Prop.LOOP, _unary_rule("loop_sum"), None, "sum over for-loop iterations", levels=Level.BLOCK,
     **_LOOP)
_def("loop_max", 1, Prop.LOOP, _unary_rule("loop_max"), None, "max over for-loop iterations", levels=Level.BLOCK,
     family="max", **_LOOP)
_def(
    "running_max",
    1,
    Prop.LOOP,
    _unary_rule("running_max"),
    None,
    "max of this and all earlier iterations' values (in the loop body)",
    levels=Level.BLOCK,
    family="max",
    **_LOOP,
)
_def(
    "rescaled_sum",
    2,
    Prop.LOOP | Prop.BROADCAST,
    _rescaled_rule,
    None,
    "acc = acc * exp(m_prev - m) + x over iterations, m a running_max (online softmax)",
    levels=Level.BLOCK,
    index=index_broadcast,
    degree=lambda a, at: Degree(sum(a) + 1),
    family="exp",
    hooks={"family_arg": 1},
)
OPS["rms_norm"].hooks["family_arg"] = 0

# Structural ops: their meaning is the evaluator's.
for _name, _doc, _lv in [
    ("input", "a kernel input (kernel level) or a tile of a kernel input (block level)", _KB),
    ("arg", "a thread graph's operand", Level.THREAD),
    ("custom", "a kernel holding a block graph", Level.KERNEL),
    ("fused", "a thread graph of fused elementwise ops", Level.BLOCK),
]:
    _def(_name, None, Prop.STRUCTURAL, None, None, _doc, levels=_lv, min_args=0)

for _name in ("loop_sum", "loop_max", "running_max", "rescaled_sum", "input", "arg", "custom", "fused"):
    for _d in ("ref", "ff", "abstract", "torch"):
        exempt(_d, _name, "structural/loop op: the graph evaluator gives its meaning for every domain")
    exempt("egglog", _name, "the e-graph holds kernel-level terms; block structure is made by the lowering")

#: the family of ops applying ``exp`` (the finite field's exp needs q-parts; see :mod:`verimirage.smt.ff`)
FAMILY_EXP = "exp"

#: which families of a target program may account for an atom of each family in a partial program
#: (:mod:`verimirage.smt.prune`); a family not listed is accounted for by itself only
FAMILY_COVERS: dict[str, tuple[str, ...]] = {
    "max": ("max", "exp", "relu", "clamp", "leaky_relu", "abs"),
    "exp": ("exp", "sigmoid", "tanh", "silu"),  # sigmoid-def writes sigmoid with an exp
    "sigmoid": ("sigmoid", "silu", "tanh", "gelu", "exp"),
    "tanh": ("tanh", "sigmoid", "silu", "gelu", "exp"),
    "softplus": ("softplus", "log", "exp"),
    "log": ("log", "softplus"),
}

STRUCTURAL_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.STRUCTURAL))
LOOP_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.LOOP))
ELEMENTWISE_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.ELEMENTWISE))
UNARY_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.UNARY))
BINARY_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.BINARY))
REDUCTION_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.REDUCTION))
