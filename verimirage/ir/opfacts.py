"""Facts of the registry's ops that rewriting, partitioning, pruning and code generation read, and the
certificate checker does not: index rules, how reductions combine, padding, homogeneity, families, e-graph
shapes, scaling operands and attribute kinds; the methods :func:`index_map`, :func:`block_attrs`,
:func:`attr_kind`; and the audit that every op has a meaning in every domain (:func:`missing_domains`, with its
reviewed exceptions).

They are read as attributes of an op (``OPS["sum"].reduce``, ``op.index_map(...)``), which :func:`install` puts
on :class:`~.ops.OpDef` when this module is imported (importing :mod:`verimirage.ir` does); the checker's
process, which imports :mod:`.ops` for shapes, degrees and meanings, never loads it. An op declared elsewhere
states its facts as keywords of :func:`~.ops.define_op`; the table below states the registry's own.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .errors import GraphError
from .ops import DOMAINS, LAZY_FACTS, OPS, OpDef, Prop, TensorType, reshape_groups


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


#: ``index``: which operand dims line up with which result dims (None: structural ops)
IndexRule = Callable[[Sequence[TensorType], dict[str, Any], TensorType], IndexMap]
#: ``homog``: the homogeneity degree of the result (positive scaling of the inputs) from the operands'
#: ``(depends on the input, degree)`` pairs; None: homogeneous only if constant
HomogRule = Callable[[list[Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class Reduce:
    """``reduce``, what a reduction does: ``combine`` (the binary op merging partial results), the
    block-level loop op accumulating it over for-loop iterations (None: the axis is reduced in one tile),
    the value padded positions must hold (the combine's identity), and whether the result is divided by
    the axis length (mean).

    The other facts: ``pad``, for ops mixing elements along ``attrs["axis"]`` that are not reductions
    (rms_norm), the value padded positions of operand 0 must hold along that axis; ``family``, the
    non-polynomial family of the op for pruning partial programs (None: polynomial or data movement);
    ``egg_shape``, e-graph shape propagation: "same" (the operand's shape), "broadcast", "reduce", or
    "custom" (the egglog package writes its own rules) or None (only lifted terms have shapes);
    ``scales_with``, operands in which the op is homogeneous of degree 1 (a value rescaled by the online
    softmax stays rescaled through them); ``accumulates``, the op's fp32 accumulator (:class:`Accumulates`).
    """

    combine: str
    loop: str | None
    identity: float
    mean: bool = False


@dataclass(frozen=True)
class Accumulates:
    """``accumulates``: an intermediate value the op's lowering keeps in fp32 that its result does not show when it
    overflows: the reduction ``reduce`` (an op's name) along ``attrs["axis"]`` of the elementwise op ``term`` of
    operand ``operand`` (None: the operand itself), each rounded to fp32 (rms_norm: the sum of ``x * x``,
    ``backend/lowering.py``; an inf sum gives ``x * rsqrt(inf) = 0``, finite and not the op's value; mean: the sum
    of ``x``, inf in fp32 for bf16 or fp32 rows near the dtype's largest value whose mean is finite). The
    floating-point check (:mod:`verimirage.pipeline.fpsafe`) counts such an accumulator overflowing as the op's
    result overflowing."""

    term: str | None
    reduce: str = "sum"
    operand: int = 0


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


def _index_broadcast_to(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """Operand dims line up right-aligned; the dims it is broadcast along stay whole in a tile."""
    src = tuple(attrs["src"]) if "src" in attrs else ts[0].shape
    lead = out.rank - len(src)
    links = tuple((0, j, j + lead) for j in range(len(src)) if src[j] != 1 or out.shape[j + lead] == 1)
    linked = {o for _, _, o in links}
    return IndexMap(links=links, whole_out=tuple(o for o in range(out.rank) if o not in linked))


def _index_slice(ts: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    ax = attrs["axis"]
    return IndexMap(links=tuple((0, j, j) for j in range(out.rank) if j != ax), whole_in=((0, ax),),
                    whole_out=(ax,))


# --------------------------------------------------------------------------- homogeneity rules


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


def _h_pow(args: list[Any], attrs: dict[str, Any]) -> Any:
    return None if args[0][1] is None else Fraction(attrs["c"]) * args[0][1]


def _h_where(args: list[Any], attrs: dict[str, Any]) -> Any:
    if args[0][0]:
        return None
    return _h_add([a for a in args[1:] if a[0]] or args[1:2], attrs)


# --------------------------------------------------------------------------- families

#: the family of ops applying ``exp`` (the finite field's exp needs q-parts; see :mod:`verimirage.smt.ff`)
FAMILY_EXP = "exp"

#: which families of a target program may account for an atom of each family in a partial program
#: (:mod:`verimirage.smt.prune`); a family not listed is accounted for by itself only
FAMILY_COVERS: dict[str, tuple[str, ...]] = {
    "max": ("max", "exp", "relu", "clamp", "leaky_relu", "abs"),
    "exp": ("exp", "sigmoid", "tanh", "silu"),  # sigmoid-def writes sigmoid with an exp
    "sigmoid": ("sigmoid", "silu", "tanh", "gelu", "exp"),
    "tanh": ("tanh", "sigmoid", "silu", "gelu", "exp"),
    "silu": ("silu", "sigmoid", "exp"),  # silu-def writes silu with a sigmoid
    "softplus": ("softplus", "log", "exp"),
    "log": ("log", "softplus"),
}

# --------------------------------------------------------------------------- the registry's facts

_LAYOUT: dict[str, Any] = {"homog": _h_first, "egg_shape": "custom"}
_AXIS = {"axis": "axis"}
_REDUCTION: dict[str, Any] = {"index": index_reduce, "homog": _h_first, "egg_shape": "reduce", "attr_kinds": _AXIS}
_SHAPE = {"attr_kinds": {"shape": "ints", "src": "ints"}}

_TABLE: dict[str, dict[str, Any]] = {
    "exp": {"family": "exp"},
    "silu": {"family": "silu"},
    "gelu": {"family": "gelu"},
    "relu": {"family": "relu", "homog": _h_first},
    "sqrt": {"family": "sqrt", "homog": _h_times(Fraction(1, 2))},
    "rsqrt": {"family": "sqrt", "homog": _h_times(Fraction(-1, 2))},
    "square": {"homog": _h_times(Fraction(2))},
    "neg": {"homog": _h_first, "scales_with": (0,)},
    "scale": {"homog": _h_first, "scales_with": (0,)},
    "add": {"homog": _h_add},
    "sub": {"homog": _h_add},
    "mul": {"homog": _h_mul, "scales_with": (0, 1)},
    "div": {"homog": _h_div, "scales_with": (0,)},
    "maximum": {"homog": _h_add, "family": "max"},
    "minimum": {"homog": _h_add, "family": "max"},
    "sum": {**_REDUCTION, "reduce": Reduce("add", "loop_sum", 0.0), "scales_with": (0,)},
    "mean": {**_REDUCTION, "reduce": Reduce("add", "loop_sum", 0.0, mean=True), "accumulates": Accumulates(None)},
    "max": {**_REDUCTION, "reduce": Reduce("maximum", "loop_max", -math.inf), "family": "max"},
    "min": {**_REDUCTION, "reduce": Reduce("minimum", None, math.inf), "family": "max"},
    "matmul": {"index": _index_matmul, "scales_with": (0, 1), "homog": _h_mul, "egg_shape": "custom"},
    "rms_norm": {"index": _index_rms, "pad": 0.0, "homog": _h_rms, "family": "sqrt", "egg_shape": "same",
                 "accumulates": Accumulates("square"), "attr_kinds": _AXIS},
    "concat": {"index": _index_concat, "homog": _h_add, "egg_shape": "custom", "attr_kinds": _AXIS},
    "transpose": {"index": _index_transpose, "homog": _h_first, "egg_shape": "custom",
                  "attr_kinds": {"a": "axis", "b": "axis"}},
    "log": {"family": "log"},
    "tanh": {"family": "tanh"},
    "sigmoid": {"family": "sigmoid"},
    "erf": {"family": "erf"},
    "softplus": {"family": "softplus"},
    "sin": {"family": "sin"},
    "cos": {"family": "cos"},
    "abs": {"family": "abs", "homog": _h_first},
    "reciprocal": {"homog": _h_times(Fraction(-1))},
    "pow": {"homog": _h_pow},
    "clamp": {"family": "clamp"},
    "leaky_relu": {"family": "leaky_relu", "homog": _h_first},
    "step": {"family": "step"},
    "greater": {"family": "step"},
    "where": {"homog": _h_where},
    "cast": {"homog": _h_first, "attr_kinds": {"dtype": "dtype"}},
    "tril_mask": {"attr_kinds": {"shape": "ints", "offset": "int"}},
    "permute": {**_LAYOUT, "index": _index_permute, "attr_kinds": {"dims": "ints"}},
    "reshape": {**_LAYOUT, **_SHAPE, "index": _index_reshape},
    "broadcast_to": {**_LAYOUT, **_SHAPE, "index": _index_broadcast_to},
    "slice": {**_LAYOUT, "index": _index_slice, "attr_kinds": {"axis": "axis", "start": "int", "stop": "int"}},
    "loop_sum": {"index": index_broadcast},
    "loop_max": {"index": index_broadcast, "family": "max"},
    "running_max": {"index": index_broadcast, "family": "max"},
    "rescaled_sum": {"index": index_broadcast, "family": "exp"},
}
for _name, _facts in _TABLE.items():
    for _k, _v in _facts.items():
        OPS[_name].facts.setdefault(_k, _v)
#: the registry's hooks that only the search and the backend read (:attr:`~.ops.OpDef.hooks`): ``uses_exp`` (exact
#: through exp in the verifier's domains, 1 / (1 + exp(-x))), ``family_arg`` (the operand whose family the op's
#: result has: prune), ``triton_needs`` (the lowering's padded-shape attribute), ``reorders_dims`` (its result is
#: its operand's elements with the dims reordered: of a loaded tile, a strided load; the cost model's registers)
_HOOKS: dict[str, dict[str, Any]] = {
    **{n: {"uses_exp": True} for n in ("sigmoid", "tanh", "silu")}, "rms_norm": {"family_arg": 0},
    **{n: {"reorders_dims": True} for n in ("permute", "transpose")},
    "rescaled_sum": {"family_arg": 1}, **{n: {"triton_needs": ("_padded",)} for n in ("concat", "reshape",
                                                                                      "broadcast_to", "slice")}}
for _name, _h in _HOOKS.items():
    OPS[_name].hooks.update(_h)


def fact(op: OpDef, name: str) -> Any:
    """The fact ``name`` (one of :data:`~.ops.LAZY_FACTS`) of ``op``: stated, or the default (elementwise ops:
    the broadcasting index rule and e-graph shape)."""
    if name in op.facts:
        return op.facts[name]
    if op.has(Prop.ELEMENTWISE) and name == "index":
        return index_broadcast
    if op.has(Prop.ELEMENTWISE) and name == "egg_shape":
        return "same" if op.has(Prop.UNARY) else "broadcast"
    return LAZY_FACTS[name]


# --------------------------------------------------------------------------- methods (OpDef.<name>)


def index_map(op: OpDef, in_types: Sequence[TensorType], attrs: dict[str, Any], out: TensorType) -> IndexMap:
    """The op's :class:`IndexMap` on operands of ``in_types``; GraphError for ops without one."""
    if op.index is None:
        raise GraphError(f"{op.name}: has no index rule (structural op); expected a tensor op")
    return op.index(in_types, attrs, out)


def block_attrs(op: OpDef, attrs: dict[str, Any], full_in_types: Sequence[TensorType]) -> dict[str, Any]:
    """The attributes of ``op`` inside a block graph whose operands are tiles of ``full_in_types``."""
    out = dict(attrs)
    if "src" in op.hooks.get("block_only", ()):
        out["src"] = tuple(full_in_types[0].shape)
    return out


def attr_kind(op: OpDef, key: str) -> str:
    """The kind of attribute ``key``: ``"int"``, ``"float"``, ``"axis"``, ``"ints"``, ``"axes"`` or ``"dtype"`` (the
    op's fact ``attr_kinds``: how builders normalise it and how egglog holds it; not named there: a float)."""
    return op.attr_kinds.get(key, "float")


def install() -> None:
    """Put the facts (:data:`~.ops.LAZY_FACTS`, as properties) and the methods :func:`index_map`,
    :func:`block_attrs`, :func:`attr_kind` on :class:`~.ops.OpDef` (done when this module is imported)."""
    for name in LAZY_FACTS:
        setattr(OpDef, name, property(functools.partial(fact, name=name)))
    for fn in (index_map, block_attrs, attr_kind):
        setattr(OpDef, fn.__name__, fn)


install()


# --------------------------------------------------------------------------- every op has every domain

#: (op, domain) pairs that are reviewed exceptions to "every op has every domain", with reasons.
DOMAIN_EXCEPTIONS: dict[tuple[str, str], str] = {}

#: modules of this package holding a domain's meanings (loaded by :func:`missing_domains`)
DOMAIN_HOMES: dict[str, str] = {"ref": "verimirage.ir.reference"}


def exempt(domain: str, name: str, reason: str) -> None:
    """Record that op ``name`` has, on purpose, no meaning in ``domain``."""
    DOMAIN_EXCEPTIONS[(name, domain)] = reason


def missing_domains() -> list[tuple[str, str]]:
    """(op, domain) pairs with neither a meaning nor a reviewed exception."""
    for home in DOMAIN_HOMES.values():
        importlib.import_module(home)
    return [(op.name, d) for op in OPS.values() for d in DOMAINS
            if d not in op.domains and (op.name, d) not in DOMAIN_EXCEPTIONS]


for _name in ("loop_sum", "loop_max", "running_max", "rescaled_sum", "input", "arg", "custom", "fused"):
    for _d in ("ref", "ff", "abstract", "torch"):
        exempt(_d, _name, "structural/loop op: the graph evaluator gives its meaning for every domain")
    exempt("egglog", _name, "the e-graph holds kernel-level terms; block structure is made by the lowering")
# (pow keeps its own meaning for the exponents with no composition)
for _name in ("neg", "silu", "tanh", "rms_norm", "transpose", "minimum", "min"):
    exempt("abstract", _name, "a composite op: the abstract domain evaluates its composition (ir.interpret.COMPOSITES)")
