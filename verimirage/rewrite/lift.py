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

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from egglog import (
    EGraph,
    Expr,
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

from ..ir.errors import GraphError
from ..ir.graph import Graph, Tensor, node_list, output_refs
from ..ir.ops import TensorType, implements

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


# unary
@function
def t_exp(x: TT) -> TT: ...
@function
def t_silu(x: TT) -> TT: ...
@function
def t_gelu(x: TT) -> TT: ...
@function
def t_relu(x: TT) -> TT: ...
@function
def t_sqrt(x: TT) -> TT: ...
@function
def t_rsqrt(x: TT) -> TT: ...
@function
def t_square(x: TT) -> TT: ...
@function
def t_neg(x: TT) -> TT: ...
@function
def t_scale(x: TT, c: f64Like) -> TT: ...
@function
def t_shift(x: TT, c: f64Like) -> TT: ...


# binary (numpy broadcasting)
@function
def t_add(a: TT, b: TT) -> TT: ...
@function
def t_sub(a: TT, b: TT) -> TT: ...
@function
def t_mul(a: TT, b: TT) -> TT: ...
@function
def t_div(a: TT, b: TT) -> TT: ...
@function
def t_maximum(a: TT, b: TT) -> TT: ...


# reductions, matmul, structure
@function
def t_sum(x: TT, axis: i64Like) -> TT: ...
@function
def t_mean(x: TT, axis: i64Like) -> TT: ...
@function
def t_max(x: TT, axis: i64Like) -> TT: ...
@function
def t_matmul(a: TT, b: TT) -> TT: ...
@function
def t_rms_norm(x: TT, axis: i64Like, eps: f64Like) -> TT: ...
@function
def t_rms_norm_w(x: TT, w: TT, axis: i64Like, eps: f64Like) -> TT: ...
@function
def t_concat(xs: TL, axis: i64Like) -> TT: ...
@function
def t_transpose(x: TT, a: i64Like, b: i64Like) -> TT: ...


# the shape analysis (no merge: an unsound merge aborts)
@function
def rank(x: TT) -> i64: ...
@function
def dim(x: TT, i: i64Like) -> i64: ...


UNARY_CTORS = {
    "exp": t_exp, "silu": t_silu, "gelu": t_gelu, "relu": t_relu, "sqrt": t_sqrt, "rsqrt": t_rsqrt,
    "square": t_square, "neg": t_neg,
}
BINARY_CTORS = {"add": t_add, "sub": t_sub, "mul": t_mul, "div": t_div, "maximum": t_maximum}
CONST_CTORS = {"scale": t_scale, "shift": t_shift}
REDUCE_CTORS = {"sum": t_sum, "mean": t_mean, "max": t_max}

#: egglog function name -> registry op name (names as they appear in the serialised e-graph)
_FN_TO_OP: dict[str, str] = {f"t_{k}": k for k in (*UNARY_CTORS, *BINARY_CTORS, *CONST_CTORS, *REDUCE_CTORS)}
_FN_TO_OP.update(
    {"t_matmul": "matmul", "t_rms_norm": "rms_norm", "t_rms_norm_w": "rms_norm", "t_concat": "concat",
     "t_transpose": "transpose", "t_input": "input"}
)


# --------------------------------------------------------------------------- egglog domain meanings


def egg_list(xs: Sequence[TT]) -> TL:
    """An egglog cons list of ``xs``."""
    out = tl_nil()
    for x in reversed(list(xs)):
        out = tl_cons(x, out)
    return out


def _mk_unary(name: str) -> Any:
    def fn(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
        return UNARY_CTORS[name](args[0])

    return fn


def _mk_binary(name: str) -> Any:
    def fn(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
        return BINARY_CTORS[name](args[0], args[1])

    return fn


def _mk_const(name: str) -> Any:
    def fn(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
        return CONST_CTORS[name](args[0], f64(float(attrs["c"])))

    return fn


def _mk_reduce(name: str) -> Any:
    def fn(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
        return REDUCE_CTORS[name](args[0], i64(int(attrs["axis"])))

    return fn


for _n in UNARY_CTORS:
    implements("egglog", _n)(_mk_unary(_n))
for _n in BINARY_CTORS:
    implements("egglog", _n)(_mk_binary(_n))
for _n in CONST_CTORS:
    implements("egglog", _n)(_mk_const(_n))
for _n in REDUCE_CTORS:
    implements("egglog", _n)(_mk_reduce(_n))


@implements("egglog", "matmul")
def _egg_matmul(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
    return t_matmul(args[0], args[1])


@implements("egglog", "rms_norm")
def _egg_rms(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
    ax, eps = i64(int(attrs["axis"])), f64(float(attrs["eps"]))
    if len(args) == 2:
        return t_rms_norm_w(args[0], args[1], ax, eps)
    return t_rms_norm(args[0], ax, eps)


@implements("egglog", "concat")
def _egg_concat(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
    return t_concat(egg_list(args), i64(int(attrs["axis"])))


@implements("egglog", "transpose")
def _egg_transpose(args: list[TT], attrs: dict[str, Any], in_types: Any, out_types: Any) -> TT:
    return t_transpose(args[0], i64(int(attrs["a"])), i64(int(attrs["b"])))


# --------------------------------------------------------------------------- shape propagation rules

shapes = ruleset(name="shapes")


def _shape_rules() -> None:
    t, x, a, b, w = (var(n, TT) for n in ("t", "x", "a", "b", "w"))
    r, _r2, i, d1, d2, ax, ax2 = (var(n, i64) for n in ("r", "r2", "i", "d1", "d2", "ax", "ax2"))
    c = var("c", f64)
    unary_terms = [f(x) for f in UNARY_CTORS.values()] + [f(x, c) for f in CONST_CTORS.values()]
    unary_terms += [t_rms_norm(x, ax, c), t_rms_norm_w(x, w, ax, c)]
    rules = []
    for term in unary_terms:
        rules += [
            rule(eq(t).to(term), eq(r).to(rank(x))).then(set_(rank(t)).to(r)),
            rule(eq(t).to(term), eq(d1).to(dim(x, i))).then(set_(dim(t, i)).to(d1)),
        ]
    for f in BINARY_CTORS.values():
        rules += [
            rule(eq(t).to(f(a, b)), eq(r).to(rank(a)), eq(r).to(rank(b))).then(set_(rank(t)).to(r)),
            rule(eq(t).to(f(a, b)), eq(r).to(rank(a)), eq(r).to(rank(b)), eq(d1).to(dim(a, i)),
                 eq(d2).to(dim(b, i))).then(set_(dim(t, i)).to(d1.max(d2))),
        ]
    for fr in REDUCE_CTORS.values():
        rules += [
            rule(eq(t).to(fr(x, ax)), eq(r).to(rank(x))).then(set_(rank(t)).to(r), set_(dim(t, ax)).to(i64(1))),
            rule(eq(t).to(fr(x, ax)), eq(d1).to(dim(x, i)), ne(i).to(ax)).then(set_(dim(t, i)).to(d1)),
        ]
    mm = t_matmul(a, b)
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
    cat = t_concat(tl_cons(a, tl_cons(b, tl_nil())), ax)
    rules += [
        rule(eq(t).to(cat), eq(r).to(rank(a))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(cat), eq(d1).to(dim(a, ax)), eq(d2).to(dim(b, ax))).then(set_(dim(t, ax)).to(d1 + d2)),
        rule(eq(t).to(cat), eq(d1).to(dim(a, i)), ne(i).to(ax)).then(set_(dim(t, i)).to(d1)),
    ]
    tr = t_transpose(x, ax, ax2)
    rules += [
        rule(eq(t).to(tr), eq(r).to(rank(x))).then(set_(rank(t)).to(r)),
        rule(eq(t).to(tr), eq(d1).to(dim(x, ax)), eq(d2).to(dim(x, ax2))).then(
            set_(dim(t, ax2)).to(d1), set_(dim(t, ax)).to(d2)
        ),
        rule(eq(t).to(tr), eq(d1).to(dim(x, i)), ne(i).to(ax), ne(i).to(ax2)).then(set_(dim(t, i)).to(d1)),
    ]
    shapes.register(*rules)


_shape_rules()


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

    def __str__(self) -> str:
        if self.op == "input":
            return str(self.attr("name"))
        parts = [str(a) for a in self.args] + [f"{k}={v}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})"


#: ops whose two operands commute (terms differing only in their operand order are one program)
COMMUTATIVE = frozenset({"add", "mul", "maximum"})


def commutation_key(t: Term) -> Term:
    """``t`` with the operands of every commutative op in a canonical order (equal keys: the same program
    up to operand order, lowered to μGraphs of the same cost)."""
    args = tuple(commutation_key(a) for a in t.args)
    if t.op in COMMUTATIVE:
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
        e = get_op(t.op).domains["egglog"](args, dict(t.attrs), None, None)
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
        args = [build(a) for a in t.args]
        a = dict(t.attrs)
        if t.op == "rms_norm":
            out = g.rms_norm(args[0], args[1] if len(args) > 1 else None, axis=a["axis"], eps=a["eps"])
        elif t.op == "concat":
            out = g.concat(args, axis=a["axis"])
        elif t.op in ("scale", "shift"):
            out = getattr(g, t.op)(args[0], a["c"])
        else:
            out = getattr(g, t.op)(*args, **a)
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
    """Record ``rank``/``dim`` facts for every term in ``types``."""
    memo: dict[Term, TT] = {}
    acts = []
    for t, tt in types.items():
        e = term_to_egg(t, memo)
        acts.append(set_(rank(e)).to(i64(tt.rank)))
        for j, s in enumerate(tt.shape):
            acts.append(set_(dim(e, i64(j))).to(i64(s)))
    eg.register(*acts)


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
            if name in _FN_TO_OP or name in ("tl_nil", "tl_cons"):
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
        op = _FN_TO_OP[name]
        if op == "input":
            return Term("input", (("name", vs[0]),), ())
        if op in ("exp", "silu", "gelu", "relu", "sqrt", "rsqrt", "square", "neg", "matmul") or op in BINARY_CTORS:
            return Term(op, (), tuple(vs))
        if op in CONST_CTORS:
            return Term(op, (("c", float(vs[1])),), (vs[0],))
        if op in REDUCE_CTORS:
            return Term(op, (("axis", int(vs[1])),), (vs[0],))
        if op == "rms_norm":
            if name == "t_rms_norm":
                return Term(op, (("axis", int(vs[1])), ("eps", float(vs[2]))), (vs[0],))
            return Term(op, (("axis", int(vs[2])), ("eps", float(vs[3]))), (vs[0], vs[1]))
        if op == "concat":
            return Term(op, (("axis", int(vs[1])),), tuple(vs[0]))
        if op == "transpose":
            return Term(op, (("a", int(vs[1])), ("b", int(vs[2]))), (vs[0],))
        raise AssertionError(name)

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
        kids = [self._lookup(x) for x in t.args]
        if t.op == "input":
            return node("t_input", [prim("String", a["name"])])
        if t.op in CONST_CTORS:
            return node(f"t_{t.op}", [*kids, prim("f64", float(a["c"]))])
        if t.op in REDUCE_CTORS:
            return node(f"t_{t.op}", [*kids, prim("i64", int(a["axis"]))])
        if t.op == "rms_norm":
            extra = [prim("i64", int(a["axis"])), prim("f64", float(a["eps"]))]
            return node("t_rms_norm" if len(kids) == 1 else "t_rms_norm_w", [*kids, *extra])
        if t.op == "concat":
            return node("t_concat", [self._lookup(t.args), prim("i64", int(a["axis"]))])
        if t.op == "transpose":
            return node("t_transpose", [*kids, prim("i64", int(a["a"])), prim("i64", int(a["b"]))])
        return node(f"t_{t.op}", kids)

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
