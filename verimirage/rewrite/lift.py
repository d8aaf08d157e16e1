# mypy: disable-error-code="empty-body"
"""Lifting kernel graphs into egglog, and reading terms back out.

Every kernel-level registry op has an egglog constructor (its ``"egglog"``
domain meaning, registered here with :func:`implements`). A kernel graph is
*lifted* by walking it and applying those constructors; shapes are an e-graph
analysis held in two egglog functions, ``rank(t)`` and ``dim(t, i)``, set for
every lifted term and propagated to terms that rules create by the
``shapes`` ruleset. The functions have no merge rule, so a rule that merges two
differently shaped terms makes egglog fail loudly (a free soundness check).

Terms come back out through :class:`Term`, a small immutable tree mirroring the
registry ops (``Term("matmul", (), (a, b))``), which :func:`term_to_graph`
turns into a kernel :class:`~verimirage.ir.graph.Graph` again.

Works with egglog 13.2 (Python 3.11) and 14: only ``Expr`` classes,
``function``, ``rule``/``rewrite``, ``ruleset``, ``set_``/``eq`` and the
serialised e-graph are used.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egglog import (
    EGraph,
    Expr,
    String,
    StringLike,
    eq,
    f64,
    f64Like,
    function,
    i64,
    i64Like,
    ne,
    rule,
    ruleset,
    set_,
    var,
)

from ..ir.builders import Tensor
from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs
from ..ir.ops import OPS, OpDef, Prop, TensorType, get_op, implements

log = logging.getLogger(__name__)


class TT(Expr):
    """An egglog tensor term (kernel level)."""


class TL(Expr):
    """A cons list of tensor terms (operands of variadic ops such as concat)."""


@function
def tl_nil() -> TL: ...
@function
def tl_cons(x: TT, rest: TL) -> TL: ...


@function
def t_input(name: StringLike) -> TT: ...


# the shape analysis (no merge: an unsound merge aborts)
@function
def rank(x: TT) -> i64: ...
@function
def dim(x: TT, i: i64Like) -> i64: ...


# the tuple-of-ints attributes of layout ops (permute's dims, reshape's shape, ...) are egglog strings
# ("2,3,4"); their length and entries are facts set for every such string a lifted term carries
# (:func:`set_shapes`), which the layout ops' shape rules read
@function
def ints_len(s: StringLike) -> i64: ...
@function
def ints_at(s: StringLike, i: i64Like) -> i64: ...


# --------------------------------------------------------------------------- constructors (from the registry)

#: egglog type of each attribute kind (:attr:`verimirage.ir.ops.OpDef.attr_kinds`)
_EGG_KIND = {"axis": "i64Like", "int": "i64Like", "float": "f64Like", "ints": "StringLike", "axes": "StringLike",
             "dtype": "StringLike"}


@dataclass(frozen=True)
class Ctor:
    """One egglog constructor of a registry op: its function, the op, and how many tensor operands it takes
    (None: one cons list of operands, for variadic ops)."""

    fn: Any
    op: str
    nargs: int | None
    name: str


_CTORS: dict[tuple[str, int | None], Ctor] = {}
#: egglog function name -> constructor (names as they appear in the serialised e-graph)
_BY_NAME: dict[str, Ctor] = {"t_input": Ctor(t_input, "input", 0, "t_input")}


def _egg_names(d: OpDef) -> dict[int | None, str]:
    names = d.hooks.get("egg_names")
    if names is not None:
        return dict(names)
    return {d.arity: f"t_{d.name}"}


def ctor(op: str, nargs: int | None = None) -> Ctor:
    """The egglog constructor of ``op`` on ``nargs`` tensor operands, declared on first use from the
    registry entry (operand count, attributes and their kinds); its shape rules are added to
    :data:`shapes` at the same time."""
    d = get_op(op)
    names = _egg_names(d)
    key = nargs if nargs in names else (None if None in names else d.arity)
    if (op, key) in _CTORS:
        return _CTORS[(op, key)]
    if key not in names:
        raise GraphError(f"lift: op {op!r} has no egglog constructor on {nargs} operand(s)")
    fname = names[key]
    params = [f"x{i}: TT" for i in range(key)] if key is not None else ["xs: TL"]
    params += [f"{a}: {_EGG_KIND[d.attr_kind(a)]}" for a in d.egg_attrs()]
    ns: dict[str, Any] = {"TT": TT, "TL": TL, "i64Like": i64Like, "f64Like": f64Like, "StringLike": StringLike}
    if not fname.isidentifier():
        raise GraphError(f"lift: op name {op!r} is not an identifier; expected one for its egglog constructor")
    exec(f"def {fname}({', '.join(params)}) -> TT: ...", ns)  # a declaration from registry data
    c = Ctor(function(ns[fname]), op, key, fname)
    _CTORS[(op, key)] = c
    _BY_NAME[fname] = c
    _generic_shape_rules(d, c)
    return c


def egg_attr(d: OpDef, key: str, v: Any) -> Any:
    """Attribute value ``v`` of op ``d`` as an egglog value (egglog expressions pass through)."""
    if isinstance(v, Expr):
        return v
    kind = d.attr_kind(key)
    if kind in ("axis", "int"):
        return i64(int(v))
    if kind == "float":
        return f64(float(v))
    if kind in ("ints", "axes"):
        return ints_string(v)
    return String(str(v))


def _py_attr(d: OpDef, key: str, v: Any) -> Any:
    kind = d.attr_kind(key)
    if kind in ("axis", "int"):
        return int(v)
    if kind == "float":
        return float(v)
    if kind in ("ints", "axes"):
        return tuple(int(x) for x in str(v).split(",") if x != "")
    if kind == "dtype":
        from ..ir.dtypes import DType

        # the name a graph's attribute holds ("f16"), as in the lifted terms: a DType object prints as
        # "DType.float16", which the cast rule does not parse (every extracted term with a cast was pruned as
        # ill-typed: the search lowered only the lifted program's own terms of any graph with a cast)
        return DType.parse(str(v)).value
    return v


def egg_apply(op: str, args: Sequence[Any], attrs: dict[str, Any]) -> TT:
    """``op`` applied to egglog operands ``args`` with attributes ``attrs`` (Python or egglog values)."""
    d = get_op(op)
    c = ctor(op, len(args))
    operands = [egg_list(args)] if c.nargs is None else list(args)
    return c.fn(*operands, *[egg_attr(d, k, attrs[k]) for k in d.egg_attrs()])


def egg_meaning(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any, *, op: str) -> TT:
    """The generic ``"egglog"`` domain meaning (register with ``functools.partial(egg_meaning, op=name)``)."""
    return egg_apply(op, args, attrs)


def register_egglog(*names: str) -> None:
    """Give ops ``names`` the generic egglog meaning (constructors declared from their registry entries)."""
    for n in names:
        implements("egglog", n)(functools.partial(egg_meaning, op=n))


# --------------------------------------------------------------------------- egglog domain meanings


def egg_list(xs: Sequence[TT]) -> TL:
    """An egglog cons list of ``xs``."""
    out = tl_nil()
    for x in reversed(list(xs)):
        out = tl_cons(x, out)
    return out


# --------------------------------------------------------------------------- shape propagation rules

shapes = ruleset(name="shapes")


def _generic_shape_rules(d: OpDef, c: Ctor) -> None:
    """Shape rules of ``c`` from the registry's ``egg_shape`` kind (custom kinds are written below)."""
    kind = d.egg_shape
    if kind not in ("same", "broadcast", "reduce"):
        return
    t, x, a, b = (var(n, TT) for n in ("t", "x", "a", "b"))
    r, i, d1, d2 = (var(n, i64) for n in ("r", "i", "d1", "d2"))
    avars = [var(f"at_{k}", _attr_type(d, k)) for k in d.egg_attrs()]
    rules = []
    if kind == "same":
        ops = [x] + ([var("w", TT)] if c.nargs == 2 else []) if c.nargs is not None else None
        if ops is None:
            return
        term = c.fn(*ops, *avars)
        rules += [
            rule(eq(t).to(term), eq(r).to(rank(x))).then(set_(rank(t)).to(r)),
            rule(eq(t).to(term), eq(d1).to(dim(x, i))).then(set_(dim(t, i)).to(d1)),
        ]
    elif kind == "broadcast":
        if c.nargs is None or c.nargs < 2:
            return
        xs = [a, b] + [var(f"o{k}", TT) for k in range(2, c.nargs)]
        ds = [d1, d2] + [var(f"e{k}", i64) for k in range(2, c.nargs)]
        term = c.fn(*xs, *avars)
        same_rank = [eq(r).to(rank(v)) for v in xs]
        top = ds[0]
        for e in ds[1:]:
            top = top.max(e)
        rules += [
            rule(eq(t).to(term), *same_rank).then(set_(rank(t)).to(r)),
            rule(eq(t).to(term), *same_rank, *[eq(e).to(dim(v, i)) for e, v in zip(ds, xs, strict=True)]).then(
                set_(dim(t, i)).to(top)),
        ]
    else:  # reduce: the axis attribute keeps size 1
        ax = avars[list(d.egg_attrs()).index("axis")]
        term = c.fn(x, *avars)
        rules += [
            rule(eq(t).to(term), eq(r).to(rank(x))).then(set_(rank(t)).to(r), set_(dim(t, ax)).to(i64(1))),
            rule(eq(t).to(term), eq(d1).to(dim(x, i)), ne(i).to(ax)).then(set_(dim(t, i)).to(d1)),
        ]
    shapes.register(*rules)


def _attr_type(d: OpDef, key: str) -> Any:
    kind = d.attr_kind(key)
    return i64 if kind in ("axis", "int") else f64 if kind == "float" else String


def _custom_shape_rules() -> None:
    t, x, a, b = (var(n, TT) for n in ("t", "x", "a", "b"))
    r, i, d1, d2, ax, ax2 = (var(n, i64) for n in ("r", "i", "d1", "d2", "ax", "ax2"))
    rules = []
    mm = egg_apply("matmul", [a, b], {})
    rules += [
        rule(eq(t).to(mm), eq(r).to(rank(a)), eq(r).to(rank(b))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(mm), eq(r).to(rank(a)), eq(r).to(rank(b)), eq(d1).to(dim(a, r - 2))).then(
            set_(dim(t, r - 2)).to(d1)
        ),
        rule(eq(t).to(mm), eq(r).to(rank(a)), eq(r).to(rank(b)), eq(d1).to(dim(b, r - 1))).then(
            set_(dim(t, r - 1)).to(d1)
        ),
        rule(eq(t).to(mm), eq(r).to(rank(a)), eq(r).to(rank(b)), eq(d1).to(dim(a, i)), eq(d2).to(dim(b, i)),
             i < r - 2).then(set_(dim(t, i)).to(d1.max(d2))),
    ]
    cat = egg_apply("concat", [a, b], {"axis": ax})
    rules += [
        rule(eq(t).to(cat), eq(r).to(rank(a))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(cat), eq(d1).to(dim(a, ax)), eq(d2).to(dim(b, ax))).then(set_(dim(t, ax)).to(d1 + d2)),
        rule(eq(t).to(cat), eq(d1).to(dim(a, i)), ne(i).to(ax)).then(set_(dim(t, i)).to(d1)),
    ]
    tr = egg_apply("transpose", [x], {"a": ax, "b": ax2})
    rules += [
        rule(eq(t).to(tr), eq(r).to(rank(x))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(tr), eq(d1).to(dim(x, ax)), eq(d2).to(dim(x, ax2))).then(
            set_(dim(t, ax2)).to(d1), set_(dim(t, ax)).to(d2)
        ),
        rule(eq(t).to(tr), eq(d1).to(dim(x, i)), ne(i).to(ax), ne(i).to(ax2)).then(set_(dim(t, i)).to(d1)),
    ]
    rules += _layout_shape_rules()
    shapes.register(*rules)


def _layout_shape_rules() -> list[Any]:
    """Shape rules of the layout ops, so that terms a rule builds through a layout op get shapes too.

    ``permute(x, dims)``: the rank of ``x``, dim ``j`` is ``dim(x, dims[j])``; ``reshape(x, shape)`` and
    ``broadcast_to(x, shape)``: the rank and dims of ``shape``; ``slice(x, axis, start, stop)``: ``x``'s
    shape with ``stop - start`` along ``axis``. Tuple attributes are read through :func:`ints_len` and
    :func:`ints_at`."""
    t, x = var("t", TT), var("x", TT)
    r, j, k, d1, ax, lo, hi = (var(n, i64) for n in ("r", "j", "k", "d1", "ax", "lo", "hi"))
    s = var("s", String)
    pm = egg_apply("permute", [x], {"dims": s})
    rules = [
        rule(eq(t).to(pm), eq(r).to(rank(x))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(pm), eq(k).to(ints_at(s, j)), eq(d1).to(dim(x, k))).then(set_(dim(t, j)).to(d1)),
    ]
    for op in ("reshape", "broadcast_to"):
        term = egg_apply(op, [x], {"shape": s})
        rules += [
            rule(eq(t).to(term), eq(r).to(ints_len(s))).then(set_(rank(t)).to(r)),
            rule(eq(t).to(term), eq(d1).to(ints_at(s, j))).then(set_(dim(t, j)).to(d1)),
        ]
    sl = egg_apply("slice", [x], {"axis": ax, "start": lo, "stop": hi})
    rules += [
        rule(eq(t).to(sl), eq(r).to(rank(x))).then(set_(rank(t)).to(r), set_(dim(t, ax)).to(hi - lo)),
        rule(eq(t).to(sl), eq(d1).to(dim(x, j)), ne(j).to(ax)).then(set_(dim(t, j)).to(d1)),
    ]
    return rules


get_op("rms_norm").hooks["egg_names"] = {1: "t_rms_norm", 2: "t_rms_norm_w"}
register_egglog(*(n for n, o in OPS.items() if not o.has(Prop.STRUCTURAL) and not o.has(Prop.LOOP)))
for _n, _o in list(OPS.items()):
    if not _o.has(Prop.STRUCTURAL) and not _o.has(Prop.LOOP):
        for _k in _egg_names(_o):
            ctor(_n, _k)
_custom_shape_rules()


# --------------------------------------------------------------------------- terms (Python side)


@dataclass(frozen=True)
class Term:
    """An immutable kernel-level term: a registry op, its sorted attributes and operand terms."""

    op: str
    attrs: tuple[tuple[str, Any], ...]
    args: tuple[Term, ...]

    def attr(self, key: str, default: Any = None) -> Any:
        """Attribute ``key`` (or ``default``)."""
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    def size(self) -> int:
        """Number of nodes of the tree."""
        return 1 + sum(a.size() for a in self.args)

    def subterms(self) -> list[Term]:
        """Every subterm (pre-order, with repeats)."""
        out = [self]
        for a in self.args:
            out += a.subterms()
        return out

    # A term is a DAG (extraction shares subterms), so the dataclass's recursive hash and a recursive ``str``
    # (the sort key of commutative operands) visited each shared subterm once per path to it: 22 and 19 of
    # rotary_attention's 40 CPU-s of search. Both are cached on the (immutable) term; the caches are not pickled
    # (a string hash differs between processes).

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.attrs, self.args))
            object.__setattr__(self, "_hash", h)
        return h  # type: ignore[no-any-return]

    def __str__(self) -> str:
        s = self.__dict__.get("_str")
        if s is None:
            if self.op == "input":
                s = str(self.attr("name"))
            else:
                parts = [str(a) for a in self.args] + [f"{k}={v}" for k, v in self.attrs]
                s = f"{self.op}({', '.join(parts)})"
            object.__setattr__(self, "_str", s)
        return s  # type: ignore[no-any-return]

    def __getstate__(self) -> dict[str, Any]:
        return {"op": self.op, "attrs": self.attrs, "args": self.args}


def commutation_key(t: Term) -> Term:
    """``t`` with the operands of every commutative op in a canonical order (equal keys: the same program
    up to operand order, lowered to μGraphs of the same cost)."""
    args = tuple(commutation_key(a) for a in t.args)
    if t.op != "input" and get_op(t.op).has(Prop.COMMUTATIVE):
        args = tuple(sorted(args, key=str))
    return Term(t.op, t.attrs, args)


def graph_terms(g: Graph) -> list[Term]:
    """The terms of ``g``'s outputs (shared subgraphs become shared subterms)."""
    nodes = node_list(g)
    memo: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        if n.op == "custom":
            raise GraphError("lift: a μGraph with custom kernels cannot be lifted; expected a kernel graph")
        args = tuple(memo[a] for a, _ in n.args)
        attrs = n.attrs
        memo[i] = Term(n.op, attrs, args)
    return [memo[a] for a, _ in output_refs(g)]


def term_to_egg(t: Term, memo: dict[Term, TT] | None = None) -> TT:
    """The egglog expression of a term (through the registry's ``egglog`` meanings)."""
    from ..ir.ops import get_op

    memo = {} if memo is None else memo
    if t in memo:
        return memo[t]
    if t.op == "input":
        e = t_input(str(t.attr("name")))
    else:
        args = [term_to_egg(a, memo) for a in t.args]
        fn = get_op(t.op).domains.get("egglog")
        if fn is None:
            raise GraphError(f"lift: op {t.op!r} has no egglog meaning")
        e = fn(args, dict(t.attrs), None, None)
    memo[t] = e
    return e


def term_to_graph(terms: Sequence[Term], inputs: Sequence[tuple[str, TensorType]]) -> Graph:
    """A kernel graph computing ``terms`` over named inputs (common subterms computed once).

    Raises GraphError if a term is ill-typed (a rule produced a shape-incorrect term).
    """
    g = Graph()
    env: dict[Term, Tensor] = {}
    ins = {name: g.input(name, tt.shape, tt.dtype) for name, tt in inputs}

    def build(t: Term) -> Tensor:
        if t in env:
            return env[t]
        if t.op == "input":
            name = t.attr("name")
            if name not in ins:
                raise GraphError(f"term_to_graph: unknown input {name!r}")
            env[t] = ins[name]
            return env[t]
        out = g.apply(t.op, [build(a) for a in t.args], dict(t.attrs))
        env[t] = out
        return out

    g.output(*[build(t) for t in terms])
    return g


# --------------------------------------------------------------------------- lifting


@dataclass
class Lifted:
    """An e-graph holding a kernel graph's outputs, with shapes set for every lifted subterm."""

    egraph: EGraph
    roots: list[TT]
    terms: list[Term]
    inputs: list[tuple[str, TensorType]]


def set_shapes(eg: EGraph, terms: Sequence[Term], types: dict[Term, TensorType]) -> None:
    """Record ``rank``/``dim`` facts for every term in ``types``, and the length and entries of every
    tuple-of-ints attribute the terms carry (:func:`ints_len`, :func:`ints_at`)."""
    memo: dict[Term, TT] = {}
    acts = []
    tuples: set[tuple[int, ...]] = set()
    for t, tt in types.items():
        e = term_to_egg(t, memo)
        acts.append(set_(rank(e)).to(i64(tt.rank)))
        for j, s in enumerate(tt.shape):
            acts.append(set_(dim(e, i64(j))).to(i64(s)))
        if t.op != "input":
            d = get_op(t.op)
            tuples |= {tuple(v) for k, v in t.attrs if k in d.egg_attrs() and d.attr_kind(k) in ("ints", "axes")}
    for tup in sorted(tuples):
        acts.append(set_(ints_len(ints_string(tup))).to(i64(len(tup))))
        acts += [set_(ints_at(ints_string(tup), i64(j))).to(i64(v)) for j, v in enumerate(tup)]
    eg.register(*acts)


def ints_string(v: Sequence[int]) -> String:
    """A tuple-of-ints attribute as the egglog string terms carry (``(2, 3) -> "2,3"``)."""
    return String(",".join(str(int(x)) for x in v))


def lift(g: Graph) -> Lifted:
    """Lift kernel graph ``g`` into a fresh e-graph; returns the e-graph and its output roots."""
    g.check()
    nodes = node_list(g)
    terms = graph_terms(g)
    types: dict[Term, TensorType] = {}
    memo: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        memo[i] = Term(n.op, n.attrs, tuple(memo[a] for a, _ in n.args))
        types[memo[i]] = n.outs[0]
    eg = EGraph()
    emap: dict[Term, TT] = {}
    roots = []
    for k, t in enumerate(terms):
        roots.append(eg.let(f"root{k}", term_to_egg(t, emap)))
    set_shapes(eg, terms, types)
    inputs = [(t.name, t.type) for t in g.inputs if t.name is not None]
    return Lifted(eg, roots, terms, inputs)


# --------------------------------------------------------------------------- reading the e-graph


def serialized(eg: EGraph) -> dict[str, Any]:
    """The e-graph as egglog's JSON serialisation (nodes with op, children, eclass)."""
    ser = getattr(eg, "_serialize", None)
    if ser is not None:
        s = ser(split_primitive_outputs=False)
    else:  # pragma: no cover - fallback for egglog versions without the helper
        s = eg._egraph.serialize([])
    return json.loads(s.to_json())


_PRIM_TYPE = {"axis": "i64", "int": "i64", "float": "f64", "ints": "String", "axes": "String", "dtype": "String"}


def _prim_value(d: OpDef, key: str, v: Any) -> Any:
    kind = d.attr_kind(key)
    if kind in ("axis", "int"):
        return int(v)
    if kind == "float":
        return float(v)
    if kind in ("ints", "axes"):
        return ",".join(str(int(x)) for x in v)
    return str(v)


def _fn_name(op: str) -> str:
    return op.split(".")[-1]


def _prim(op: str) -> Any:
    if op.startswith('"'):
        return json.loads(op)
    try:
        return int(op)
    except ValueError:
        return float(op)


class EClassTerms:
    """k-best term extraction from a serialised e-graph, by tree size, distinct terms per e-class."""

    def __init__(self, data: dict[str, Any], k: int) -> None:
        self.k = k
        nodes = data["nodes"]
        self.class_type = {c: d.get("type", "") for c, d in data.get("class_data", {}).items()}
        self.prim: dict[str, Any] = {}
        self.enodes: dict[str, list[tuple[str, list[str]]]] = {}
        self.node_class = {nid: n["eclass"] for nid, n in nodes.items()}
        self.let_class: dict[str, str] = {}
        for c, d in data.get("class_data", {}).items():
            if "let" in d:
                self.let_class[d["let"].lstrip("$")] = c
        for nid, n in nodes.items():
            op, ch = n["op"], n["children"]
            if "primitive-" in nid:
                self.prim[n["eclass"]] = _prim(op)
                continue
            name = _fn_name(op)
            if name in _BY_NAME or name in ("tl_nil", "tl_cons"):
                self.enodes.setdefault(n["eclass"], []).append((name, [self.node_class[c] for c in ch]))
        self.num_enodes = sum(len(v) for v in self.enodes.values())
        self.best: dict[str, list[tuple[int, Any]]] = {}
        self._solve()

    def _combine(self, name: str, kids: list[str]) -> list[tuple[int, Any]]:
        choices: list[list[tuple[int, Any]]] = []
        for c in kids:
            if c in self.prim:
                choices.append([(0, self.prim[c])])
            elif c in self.best:
                choices.append(self.best[c])
            else:
                return []
        combos: list[tuple[int, list[Any]]] = [(0, [])]
        for ch in choices:
            combos = sorted(((s + cs, [*vs, v]) for s, vs in combos for cs, v in ch), key=lambda p: p[0])[: self.k]
        out = []
        for s, vs in combos:
            t = self._mk(name, vs)
            if t is not None:
                out.append((s + 1, t))
        return out

    @staticmethod
    def _mk(name: str, vs: list[Any]) -> Any:
        if name == "tl_nil":
            return ()
        if name == "tl_cons":
            return (vs[0], *vs[1])
        c = _BY_NAME[name]
        if c.op == "input":
            return Term("input", (("name", vs[0]),), ())
        d = get_op(c.op)
        k = 1 if c.nargs is None else c.nargs
        operands = tuple(vs[0]) if c.nargs is None else tuple(vs[:k])
        attrs = tuple(sorted((a, _py_attr(d, a, v)) for a, v in zip(d.egg_attrs(), vs[k:], strict=True)))
        return Term(c.op, attrs, operands)

    def _solve(self) -> None:
        for _ in range(50):
            changed = False
            for c, ens in self.enodes.items():
                pool: dict[Any, int] = {}
                for cost, t in self.best.get(c, []):
                    pool[t] = cost
                for name, kids in ens:
                    for cost, t in self._combine(name, kids):
                        if t not in pool or cost < pool[t]:
                            pool[t] = cost
                new = sorted(((cost, t) for t, cost in pool.items()), key=lambda p: (p[0], str(p[1])))[: self.k]
                if new != self.best.get(c):
                    self.best[c] = new
                    changed = True
            if not changed:
                break

    def find_class(self, t: Term) -> str | None:
        """The e-class holding term ``t`` (looked up structurally), or None."""
        if not hasattr(self, "_index"):
            self._index: dict[tuple[str, tuple[str, ...]], str] = {}
            for c, ens in self.enodes.items():
                for name, kids in ens:
                    self._index[(name, tuple(kids))] = c
            self._prim_class = {(self.class_type.get(c, ""), repr(v)): c for c, v in self.prim.items()}
        return self._lookup(t)

    def _lookup(self, t: Term | tuple[Term, ...]) -> str | None:
        def prim(ty: str, v: Any) -> str | None:
            return self._prim_class.get((ty, repr(v)))

        def node(name: str, kids: list[str | None]) -> str | None:
            if any(k is None for k in kids):
                return None
            return self._index.get((name, tuple(kids)))  # type: ignore[arg-type]

        if isinstance(t, tuple):
            c = node("tl_nil", [])
            for x in reversed(t):
                c = node("tl_cons", [self._lookup(x), c])
            return c
        a = dict(t.attrs)
        if t.op == "input":
            return node("t_input", [prim("String", a["name"])])
        d = get_op(t.op)
        cons = ctor(t.op, len(t.args))
        kids = [self._lookup(t.args)] if cons.nargs is None else [self._lookup(x) for x in t.args]
        extra = [prim(_PRIM_TYPE[d.attr_kind(k)], _prim_value(d, k, a[k])) for k in d.egg_attrs()]
        return node(cons.name, [*kids, *extra])

    def class_of(self, t: Term) -> str | None:
        """:meth:`find_class`, memoised per term."""
        if not hasattr(self, "_class_memo"):
            self._class_memo: dict[Term, str | None] = {}
        if t not in self._class_memo:
            self._class_memo[t] = self.find_class(t)
        return self._class_memo[t]

    def consistent(self, terms: Sequence[Term]) -> bool:
        """Whether ``terms`` compute every e-class one way: two different subterms in one e-class are the
        same value computed twice by different means (shared work lost), never needed by a cheapest program."""
        rep: dict[str, Term] = {}
        for t in terms:
            for s in t.subterms():
                if s.op == "input":
                    continue
                c = self.class_of(s)
                if c is not None and rep.setdefault(c, s) != s:
                    return False
        return True

    def terms_of(self, t: Term) -> list[Term]:
        """The k cheapest distinct terms equal (in the e-graph) to ``t``."""
        c = self.find_class(t)
        if c is None:
            return [t]
        return [x for _, x in self.best.get(c, [])] or [t]
