"""The op registry: every op is defined once here.

Each :class:`OpDef` carries the op's properties (as data, so that rewriting and
checking read the same facts), its shape rule, and its meaning in every
semantic domain. This file is part of the trusted core (what the certificate
checker imports): the domains (``"ref"`` float64 reference in :mod:`.reference`,
``"ff"`` finite field, ``"abstract"`` Z3 expressions, ``"egglog"`` constructor,
``"triton"`` lowering, ``"torch"``) register their meaning with :func:`implements`
from their own modules, and a test asserts that every op has every domain (or
is on the reviewed exception list :data:`.opfacts.DOMAIN_EXCEPTIONS`). Layout ops (data
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
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
    REGROUPS = enum.auto()  # merges or splits dims in row-major order (a view: tiles walk each group's leading dims)
    CONSTANT = enum.auto()  # no operands, a function of its attributes: computed inside each kernel that reads it


class Level(enum.Flag):
    """IR levels an op may appear at."""

    KERNEL = enum.auto()
    BLOCK = enum.auto()
    THREAD = enum.auto()
    ALL = KERNEL | BLOCK | THREAD


ShapeRule = Callable[[Sequence[TensorType], dict[str, Any]], TensorType]
DomainFn = Callable[..., Any]

#: Semantic domains every op must have (unless listed in :data:`.opfacts.DOMAIN_EXCEPTIONS`). ``"torch"`` is the op's
#: meaning written with torch's own functions (:mod:`verimirage.testing.torch_ref`), a second reference.
DOMAINS: tuple[str, ...] = ("ref", "ff", "abstract", "egglog", "triton", "torch")


#: facts of an op that the certificate checker does not read (index rules, reductions, padding, homogeneity,
#: families, e-graph shapes, scaling operands, attribute kinds, fp32 accumulators), and the value when none is stated:
#: :mod:`.opfacts` holds and documents them and puts them on :class:`OpDef` (``op.index``, ``op.reduce``, ...) with
#: the methods ``op.index_map``, ``op.block_attrs``, ``op.attr_kind`` (importing :mod:`verimirage.ir` imports it;
#: the checker's process never does)
LAZY_FACTS: dict[str, Any] = {"index": None, "reduce": None, "pad": None, "homog": None, "family": None,
                              "egg_shape": None, "scales_with": (), "attr_kinds": {}, "accumulates": None}


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
    #: per-package facts that are not meanings (e.g. ``"block"``: the backend's default block graph)
    hooks: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: the :data:`LAZY_FACTS` stated for this op (read them as attributes: ``op.index``, ``op.reduce``, ...)
    facts: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    if TYPE_CHECKING:  # (the facts and methods :mod:`.opfacts` puts on the class)
        def __getattr__(self, name: str) -> Any: ...

    def has(self, prop: Prop) -> bool:
        """Whether the op has property ``prop``."""
        return bool(self.props & prop)

    def egg_attrs(self) -> tuple[str, ...]:
        """The attributes an e-graph term carries (kernel level: block-only ones left out)."""
        return tuple(a for a in self.attrs if a not in self.hooks.get("block_only", ()))

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


def get_op(name: str) -> OpDef:
    """The registered op ``name``; GraphError naming the known ops otherwise."""
    try:
        return OPS[name]
    except (KeyError, TypeError):
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
    """``axis`` normalised to 0..rank-1, or GraphError (a rank-0 operand has none: ir.limits keeps those out)."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise GraphError(f"{op}: {what} must be an int, got {axis!r}")
    a = int(axis)
    if not -t.rank <= a < t.rank:
        raise GraphError(f"{op}: operand {t} has no {what} {a}; expected -{t.rank} <= {what} < {t.rank}")
    return a % t.rank


def unary_rule(name: str) -> ShapeRule:
    """The shape rule of unary elementwise ops (the operand's type)."""
    return lambda ts, attrs: ts[0]


def binary_rule(name: str) -> ShapeRule:
    """The shape rule of broadcasting binary ops (one dtype, numpy broadcasting)."""
    return lambda ts, attrs: TensorType(dtype=_same_dtype(name, ts), shape=broadcast_shapes(name, ts))


def _reduce_rule(name: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        (t,) = ts
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
        raise _err("matmul", ts, f"the contraction dims to match (a.shape[-1] = {a.shape[-1]}, b.shape[-2] = "
                   f"{b.shape[-2]})")
    dt = _same_dtype("matmul", ts)
    batch = broadcast_shapes("matmul", [TensorType(a.shape[:-2], dt), TensorType(b.shape[:-2], dt)])
    return TensorType((*batch, a.shape[-2], b.shape[-1]), dt)


def _rms_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ts[0]
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
    if any(t.rank != r for t in ts):
        raise _err("concat", ts, "operands of one rank")
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


def _attr_rule(op: str, *keys: str) -> ShapeRule:
    def rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
        vals = [check_constant(f"{op}: {k}", attrs.get(k)) for k in keys]  # finite, float32-representable
        if op == "clamp" and vals[0] > vals[1]:
            raise GraphError(f"clamp: lo={vals[0]} > hi={vals[1]}; expected lo <= hi")
        return ts[0]

    return rule


def neg_axis(axis: int, rank: int) -> int:
    """A non-negative logical ``axis`` of a rank-``rank`` tensor as a negative array axis."""
    return axis - rank


# --------------------------------------------------------------------------- registration


def define_op(name: str, arity: int | None, props: Prop, shape_rule: ShapeRule | None, ref: DomainFn | None,
              doc: str, attrs: tuple[str, ...] = (), levels: Level = Level.ALL, min_args: int = 1,
              **facts: Any) -> OpDef:
    """Register a new op (the one place an op is declared); ``ref``: its float64 meaning, if not registered with
    :func:`implements`; ``facts`` are :class:`OpDef` fields or :data:`LAZY_FACTS` (elementwise ops get the
    broadcasting index rule and e-graph shape unless given others)."""
    if name in OPS:
        raise ValueError(f"op {name!r} registered twice")
    lazy = {k: facts.pop(k) for k in list(facts) if k in LAZY_FACTS}
    op = OPS[name] = OpDef(name, arity, attrs, props, levels, shape_rule, doc, min_args, **facts)
    op.facts.update(lazy)
    if ref is not None:
        op.domains["ref"] = ref
    return op


_def = define_op

_EW = Prop.ELEMENTWISE
_U = _EW | Prop.UNARY
_B = _EW | Prop.BINARY | Prop.BROADCAST
_KB = Level.KERNEL | Level.BLOCK


def _unary(name: str, doc: str, **facts: Any) -> OpDef:
    rule = facts.pop("shape_rule_override", None) or unary_rule(name)
    return define_op(name, 1, _U | facts.pop("props", Prop.NONE), rule, None, doc, **facts)


_unary("exp", "e**x", props=Prop.EXPONENTIAL)
_unary("silu", "x * sigmoid(x)")
_unary("gelu", "GELU, tanh approximation")
_unary("relu", "max(x, 0)")
_unary("sqrt", "square root")
_unary("rsqrt", "1 / sqrt(x)")
_unary("square", "x * x")
_unary("neg", "-x", props=Prop.LINEAR)

define_op("scale", 1, _U | Prop.LINEAR, _attr_rule("scale", "c"), None, "x * c for a Python constant c", attrs=("c",))
define_op("shift", 1, _U, _attr_rule("shift", "c"), None, "x + c for a Python constant c", attrs=("c",))

define_op("add", 2, _B | Prop.COMMUTATIVE | Prop.ASSOCIATIVE | Prop.LINEAR, binary_rule("add"), None, "a + b")
define_op("sub", 2, _B | Prop.LINEAR | Prop.DIFFERENCE, binary_rule("sub"), None, "a - b")
define_op("mul", 2, _B | Prop.COMMUTATIVE | Prop.ASSOCIATIVE, binary_rule("mul"), None, "a * b")
define_op("div", 2, _B | Prop.NORMALISES, binary_rule("div"), None, "a / b")
define_op("maximum", 2, _B | Prop.COMMUTATIVE | Prop.ASSOCIATIVE, binary_rule("maximum"), None, "elementwise max(a, b)")


def _reduction(name: str, doc: str, **facts: Any) -> OpDef:
    return _def(name, 1, Prop.REDUCTION | facts.pop("props", Prop.NONE), _reduce_rule(name), None, doc,
                ("axis",), _KB, **facts)


_reduction("sum", "sum along axis", props=Prop.LINEAR)
_reduction("mean", "mean along axis", props=Prop.LINEAR)
_reduction("max", "max along axis")


_def("matmul", 2, Prop.BROADCAST | Prop.LINEAR | Prop.CONTRACTION, _matmul_rule, None,
     "(..., m, k) @ (..., k, n), leading dims broadcast", levels=_KB)
_def("rms_norm", None, Prop.NORMALISES, _rms_rule, None, "x / sqrt(mean(x**2, axis) + eps) [* weight]",
     ("axis", "eps"), _KB)
_def("concat", None, Prop.CONCAT, _concat_rule, None, "concatenate along axis", ("axis",), _KB)
_def("transpose", 1, Prop.NONE, _transpose_rule, None, "swap axes a and b", ("a", "b"), _KB)

# ---- ops real models use (issue 21): transcendental unaries are opaque in the finite field


#: integer exponents up to this size are exact powers in the finite field (larger: opaque)
POW_EXACT_MAX = 8

_TRANSCENDENTAL: list[tuple[str, str]] = [
    ("log", "natural logarithm (partial: x > 0)"),
    ("tanh", "hyperbolic tangent"),
    ("sigmoid", "1 / (1 + e**-x)"),
    ("erf", "the error function (exact GELU is 0.5 x (1 + erf(x / sqrt 2)))"),
    ("softplus", "log(1 + e**x)"),
    ("abs", "|x|"), ("sin", "sine (rotary tables a model computes)"), ("cos", "cosine"),
]
for _name, _doc in _TRANSCENDENTAL:
    _unary(_name, _doc)
_unary("reciprocal", "1 / x")
define_op("pow", 1, _U, _attr_rule("pow", "c"), None,
          "x ** c for a Python constant c", attrs=("c",))
define_op("clamp", 1, _U, _attr_rule("clamp", "lo", "hi"), None,
          "min(max(x, lo), hi) (hardtanh: lo=-1, hi=1; relu6: lo=0, hi=6)", attrs=("hi", "lo"))
define_op("leaky_relu", 1, _U, _attr_rule("leaky_relu", "slope"), None,
          "x if x >= 0 else slope * x", attrs=("slope",))
define_op("step", 1, _U, _attr_rule("step", "c"), None,
          "1 where x > c else 0 (the mask of ReLU's and LeakyReLU's gradients: threshold_backward)", attrs=("c",))
define_op("minimum", 2, _B | Prop.COMMUTATIVE | Prop.ASSOCIATIVE, binary_rule("minimum"), None,
          "elementwise min(a, b)")
_reduction("min", "min along axis")


define_op("greater", 1, _U, lambda ts, at: TensorType(_attr_rule("greater", "c")(ts, at).shape, DType.bool), None,
          "x > c as a vm.bool mask (a comparison where reads)", attrs=("c",))


#: ops with no exact meaning in the checks: in the finite field and the abstract expressions alike, a function of the
#: argument named by :func:`opaque_key` (a random one, an uninterpreted one), the same in both programs
OPAQUE = ("gelu", "relu", "erf", "softplus", "abs", "clamp", "leaky_relu", "step", "sin", "cos", "greater", "pow")


def opaque_key(op: str, attrs: dict[str, Any]) -> str:
    """The name of the function standing for :data:`OPAQUE` op ``op`` with ``attrs``: ``op(k=v, ...)``."""
    return f"{op}({', '.join(f'{k}={attrs[k]!r}' for k in sorted(attrs))})" if attrs else op


def _where_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    dt = _same_dtype("where", ts[1:])
    return TensorType(broadcast_shapes("where", ts), dt)


define_op("where", 3, _EW | Prop.BROADCAST, _where_rule, None,
          "a where mask else b (mask: a vm.bool tensor; m * a + (1 - m) * b for m in {0, 1})",
          hooks={"mask_args": (0,)})


def _tril_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    shape, off = attrs.get("shape"), attrs.get("offset")
    if ts or type(off) is not int or abs(off) >> 62 or not isinstance(shape, tuple) or len(shape) < 2 or min(shape) < 1:
        raise _err("tril_mask", ts, f"no operands, a shape of >= 2 dims, an int offset (< 2**62); got {shape}, {off}")
    return TensorType(shape, DType.bool)


def tril(shape: Sequence[int], offset: int) -> np.ndarray:
    """The causal mask: 1 (int64) where column ``j <= i + offset`` for row ``i`` of the last two dims, else 0."""
    return np.broadcast_to(np.less_equal.outer(-np.arange(shape[-2]), offset - np.arange(shape[-1])) * 1, shape)


define_op("tril_mask", 0, Prop.CONSTANT, _tril_rule, lambda a, at, it, ot: tril(at["shape"], at["offset"]),
          "the causal mask (..., n, m): true where column j <= row i + offset (torch.ones(n, m).tril(offset))",
          ("offset", "shape"), Level.KERNEL, 0)


def _cast_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    dt = DType.parse(str(attrs.get("dtype")))
    if dt is DType.bool:
        raise GraphError("cast: to vm.bool; expected vm.float16, vm.bfloat16 or vm.float32")
    return TensorType(ts[0].shape, dt)


_unary("cast", "x rounded to dtype (the real-valued meaning is x)", attrs=("dtype",), shape_rule_override=_cast_rule)

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
    """At block level (``src``: the kernel operand's full shape), the result tile: a kept dim (a reshape's
    one-to-one dims, a broadcast's right-aligned ones) takes the operand tile's size, every other dim is whole
    (the index rules of :mod:`.opfacts` keep them out of the grid)."""
    src = _ints(op, "src", attrs["src"])
    if len(src) != t.rank:
        raise GraphError(f"{op}: block-level src {src} does not match the operand tile {t}")
    if op == "reshape":
        kept = [(og[0], ng[0]) for og, ng in reshape_groups(src, full) if len(og) == len(ng) == 1]
    else:
        kept = [(j, j + len(full) - len(src)) for j in range(len(src))]
    out = list(full)
    for j, o in kept:
        if src[j] != 1:
            out[o] = t.shape[j]
    return tuple(out)


def _reshape_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
    shape = _ints("reshape", "shape", attrs.get("shape"))
    n = math.prod(_ints("reshape", "src", attrs["src"])) if "src" in attrs else t.numel
    if any(s <= 0 for s in shape) or math.prod(shape) != n:
        raise _err("reshape", ts, f"a shape of positive dims with {n} elements, got {shape}")
    if "src" in attrs and math.prod(shape := _tile_shape("reshape", t, attrs, shape)) != t.numel:
        raise _err("reshape", ts, f"a result tile of the operand tile's {t.numel} elements, got {shape}")
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


def _slice_rule(ts: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    (t,) = ts
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


_LAYOUT: dict[str, Any] = {"levels": _KB}
_def("permute", 1, Prop.NONE, _permute_rule, _layout_permute, "reorder dims: result dim j is operand dim dims[j]",
     ("dims",), **_LAYOUT)
# at block level a reshape / broadcast_to also records ``src``, the kernel operand's full shape, so that
# its shape attribute (the full result) and the tile it makes can both be read (see _tile_shape)
_def("reshape", 1, Prop.REGROUPS, _reshape_rule, _layout_reshape, "row-major reshape (view)", ("shape", "src"),
     hooks={"block_only": ("src",)}, **_LAYOUT)
_def("broadcast_to", 1, Prop.NONE, _broadcast_rule, _layout_broadcast, "numpy broadcast to shape (expand)",
     ("shape", "src"), hooks={"block_only": ("src",)}, **_LAYOUT)
_def("slice", 1, Prop.NONE, _slice_rule, _layout_slice, "elements start..stop-1 along axis (narrow)",
     ("axis", "start", "stop"), **_LAYOUT)
#: the layout ops' meaning: data movement, the same on every array value (float64, finite field, abstract: that
#: domain registers its own slice over this one, :mod:`verimirage.smt.abstract`)
LAYOUT_MEANINGS = {n: OPS[n].domains["ref"] for n in ("permute", "reshape", "broadcast_to", "slice")}
for _name, _fn in LAYOUT_MEANINGS.items():
    OPS[_name].domains.update(ff=_fn, abstract=_fn)
for _name in ("permute", "reshape", "broadcast_to", "slice", "concat", "transpose"):
    OPS[_name].hooks["any_dtype"] = True

# Loop constructs of block graphs. Their meaning is the evaluator's (ir.interpret), written once
# in terms of registry ops (add, maximum, sub, exp, mul), so every domain gets them for free.
_def("loop_sum", 1, Prop.LOOP, unary_rule("loop_sum"), None, "sum over for-loop iterations", levels=Level.BLOCK)
_def("loop_max", 1, Prop.LOOP, unary_rule("loop_max"), None, "max over for-loop iterations", levels=Level.BLOCK)
_def("running_max", 1, Prop.LOOP, unary_rule("running_max"), None,
     "max of this and all earlier iterations' values (in the loop body)", levels=Level.BLOCK)
_def("rescaled_sum", 2, Prop.LOOP | Prop.BROADCAST, _rescaled_rule, None,
     "acc = acc * exp(m_prev - m) + x over iterations, m a running_max (online softmax)", levels=Level.BLOCK)

# Structural ops: their meaning is the evaluator's.
for _name, _doc, _lv in [
    ("input", "a kernel input (kernel level) or a tile of a kernel input (block level)", _KB),
    ("arg", "a thread graph's operand", Level.THREAD),
    ("custom", "a kernel holding a block graph", Level.KERNEL),
    ("fused", "a thread graph of fused elementwise ops", Level.BLOCK),
]:
    _def(_name, None, Prop.STRUCTURAL, None, None, _doc, levels=_lv, min_args=0)

LOOP_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.LOOP))
