"""Rewrite rules: a small pattern language compiled to egglog, and the public API for user rules.

A :class:`Rule` is written once, as a left and a right :class:`Pat` over
tensor variables (:class:`PVar`) and attribute variables (:class:`AVar`), with
shape guards (:class:`SameRank`, :class:`DimIsOne`, :class:`SameDim`, :class:`RankIs`) and value guards
(:class:`Positive`: a variable's value is > 0 by the e-graph's sign facts). From that
one definition come

* the egglog ``rewrite(...).to(..., guards)`` used by the search
  (:meth:`Rule.egglog`), and
* concrete instances — lhs and rhs as small kernel graphs over the shapes of
  :class:`Instance` — for the soundness check
  :func:`verimirage.smt.verify.verify_rule` (:meth:`Rule.instance_graphs`).

Build patterns with the ``pat`` helper: ``pat.matmul(pat.div(E, S), V)``;
attribute keywords as in the Graph API (``pat.sum(X, axis=AX)``).

User rules are added through :func:`ruleset` / ``superoptimize(extra_rules=...)``;
:func:`verimirage.pipeline.admit.admit` refuses a rule the verifier cannot prove unless it is marked
``trusted=True`` (and trusted rules are then named in every candidate and
certificate that used them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.dtypes import float32
from ..ir.errors import GraphError
from ..ir.graph import Graph
from ..ir.ops import TensorType
from .lift import Term, term_to_graph

log = logging.getLogger(__name__)

_INT_ATTRS = ("axis", "a", "b")


class RuleError(ValueError):
    """A rule is malformed, or was refused because it could not be proved sound."""


# --------------------------------------------------------------------------- the pattern language


@dataclass(frozen=True)
class PVar:
    """A tensor variable of a pattern."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class AVar:
    """An attribute variable (an axis, or a constant) of a pattern."""

    name: str


@dataclass(frozen=True)
class RankMinus:
    """Attribute value ``rank(var) - k`` (e.g. the last axis of ``var``: ``RankMinus(X, 1)``)."""

    var: PVar
    k: int


@dataclass(frozen=True)
class RecipDim:
    """Attribute value ``1 / dim(var, axis)`` (the factor turning a sum into a mean)."""

    var: PVar
    axis: AVar


AttrVal = int | float | AVar | RankMinus | RecipDim


@dataclass(frozen=True)
class Pat:
    """A pattern node: a registry op, its operands (patterns or variables), its attributes."""

    op: str
    args: tuple[Pat | PVar, ...]
    attrs: tuple[tuple[str, AttrVal], ...] = ()

    def __str__(self) -> str:
        parts = [str(a) if isinstance(a, Pat) else a.name for a in self.args]
        parts += [f"{k}={_attr_str(v)}" for k, v in self.attrs]
        return f"{self.op}({', '.join(parts)})"


def _attr_str(v: AttrVal) -> str:
    if isinstance(v, AVar):
        return v.name
    if isinstance(v, RankMinus):
        return f"rank({v.var.name})-{v.k}"
    if isinstance(v, RecipDim):
        return f"1/dim({v.var.name},{v.axis.name})"
    return repr(v)


class _PatBuilder:
    """``pat.<op>(*operands, **attrs)`` builds a :class:`Pat` (``pat.concat([a, b], axis=...)`` too)."""

    def __getattr__(self, op: str) -> Any:
        if op.startswith("_"):
            raise AttributeError(op)
        from ..ir.ops import Prop, get_op

        get_op(op)  # GraphError for unknown ops

        def build(*args: Any, **attrs: AttrVal) -> Pat:
            if get_op(op).has(Prop.CONCAT):  # pat.concat([a, b], axis=...) takes a list, like the Graph API
                (xs,) = args
                args = tuple(xs)
            for a in args:
                if not isinstance(a, (Pat, PVar)):
                    raise RuleError(f"pat.{op}: operand {a!r}; expected a Pat or a PVar")
            return Pat(op, tuple(args), tuple(sorted(attrs.items())))

        return build


pat = _PatBuilder()


@dataclass(frozen=True)
class SameRank:
    """Guard: the variables have equal rank."""

    vars: tuple[PVar, ...]


@dataclass(frozen=True)
class RankIs:
    """Guard: ``rank(var) == n``."""

    var: PVar
    n: int


@dataclass(frozen=True)
class DimIsOne:
    """Guard: ``dim(var, axis) == 1`` (``axis`` an int, an AVar, or ``RankMinus``)."""

    var: PVar
    axis: int | AVar | RankMinus


@dataclass(frozen=True)
class SameDim:
    """Guard: the variables have the same size along ``axis`` (an int, an AVar, or ``RankMinus``), e.g. the
    reduced dim of two summands (``sum_k a + sum_k b`` is ``sum_k (a + b)`` only if neither broadcasts
    along ``k``)."""

    vars: tuple[PVar, ...]
    axis: int | AVar | RankMinus


@dataclass(frozen=True)
class Positive:
    """Value guard: every element of ``var`` is > 0, by the e-graph's sign facts
    (:mod:`verimirage.rewrite.signs`: exp, a sum of exps, a square plus a positive constant, ...), which are
    the verifier's definedness facts (:mod:`verimirage.smt.defined`), so a candidate the rule makes is defined
    where the source is.

    The soundness instances put ``exp(v)`` (``v`` a fresh input of the variable's shape) in the variable's
    place: every positive real is ``exp`` of a real, so proving the rule there proves it for every positive
    value, and for no other (``log(a * b) = log a + log b`` is not proved without the guard)."""

    var: PVar


Guard = SameRank | RankIs | DimIsOne | SameDim | Positive


@dataclass(frozen=True)
class Instance:
    """Concrete shapes (per tensor variable) and attribute values for a soundness instance."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    attrs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(shapes: dict[str, tuple[int, ...]], **attrs: Any) -> Instance:
        """Instance from a dict of shapes and attribute keywords."""
        return Instance(tuple(sorted(shapes.items())), tuple(sorted(attrs.items())))


@dataclass(frozen=True)
class Rule:
    """A named, guarded rewrite ``lhs -> rhs`` with a one-line law and soundness instances."""

    name: str
    lhs: Pat
    rhs: Pat | PVar  # a variable: the lhs simplifies to one of its operands (``log(exp(a)) -> a``)
    law: str
    theory: str = "user"
    guards: tuple[Guard, ...] = ()
    instances: tuple[Instance, ...] = ()
    trusted: bool = False
    default: bool = True  # part of the default schedule

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.lhs, Pat) or not isinstance(self.rhs, (Pat, PVar)):
            raise RuleError(f"rule {self.name!r}: expected a name, an lhs pattern (pat.<op>(...)) and an rhs "
                            "pattern or variable")
        lv = _pvars(self.lhs)
        missing = _pvars(self.rhs) - lv
        if missing:
            raise RuleError(f"rule {self.name!r}: rhs uses variables {sorted(v.name for v in missing)} not in lhs")
        if not self.instances:
            raise RuleError(f"rule {self.name!r}: give at least one Instance (shapes) for its soundness check")

    # -- egglog
    def egglog(self) -> Any:
        """The egglog rewrite of this rule (with its guards as conditions)."""
        from egglog import String, eq, f64, i64, rewrite, var

        from ..ir.ops import get_op
        from . import lift as L

        tv: dict[str, Any] = {}
        av: dict[str, Any] = {}
        facts: list[Any] = []
        ranks: dict[str, Any] = {}

        def tvar(v: PVar) -> Any:
            if v.name not in tv:
                tv[v.name] = var(v.name, L.TT)
            return tv[v.name]

        def rank_of(v: PVar) -> Any:
            if v.name not in ranks:
                ranks[v.name] = var(f"rank_{v.name}", i64)
                facts.append(eq(ranks[v.name]).to(L.rank(tvar(v))))
            return ranks[v.name]

        def attr(key: str, val: AttrVal, op: str | None = None) -> Any:
            kind = get_op(op).attr_kind(key) if op is not None else ("axis" if key in _INT_ATTRS else "float")
            is_int = kind in ("axis", "int")
            if isinstance(val, AVar):
                if val.name not in av:  # typed by the attribute's kind (a tuple of ints is an egglog String)
                    av[val.name] = var(val.name, i64 if is_int else f64 if kind == "float" else String)
                return av[val.name]
            if isinstance(val, RankMinus):
                return rank_of(val.var) - val.k
            if isinstance(val, RecipDim):
                n = var(f"dim_{val.var.name}_{val.axis.name}", i64)
                facts.append(eq(n).to(L.dim(tvar(val.var), attr("axis", val.axis))))
                return f64(1.0) / f64.from_i64(n)
            return i64(int(val)) if is_int else f64(float(val))

        def build(p: Pat | PVar) -> Any:
            if isinstance(p, PVar):
                return tvar(p)
            a = {k: attr(k, v, p.op) for k, v in p.attrs}
            args = [build(x) for x in p.args]
            try:
                return L.egg_apply(p.op, args, a)
            except (GraphError, KeyError) as e:
                raise RuleError(f"rule {self.name!r}: op {p.op!r} has no egglog constructor ({e})") from None

        lhs = build(self.lhs)
        for g in self.guards:
            if isinstance(g, SameRank):
                r0 = rank_of(g.vars[0])
                for v in g.vars[1:]:
                    facts.append(eq(L.rank(tvar(v))).to(r0))
            elif isinstance(g, RankIs):
                facts.append(eq(L.rank(tvar(g.var))).to(i64(g.n)))
            elif isinstance(g, DimIsOne):
                facts.append(eq(L.dim(tvar(g.var), attr("axis", g.axis))).to(i64(1)))
            elif isinstance(g, SameDim):
                d0 = L.dim(tvar(g.vars[0]), attr("axis", g.axis))
                for v in g.vars[1:]:
                    facts.append(eq(L.dim(tvar(v), attr("axis", g.axis))).to(d0))
            elif isinstance(g, Positive):
                from .signs import t_pos

                facts.append(t_pos(tvar(g.var)))
        rhs = build(self.rhs)
        return rewrite(lhs).to(rhs, *facts)

    # -- concrete instances
    def instance_terms(self, inst: Instance) -> tuple[Term, Term, list[tuple[str, TensorType]]]:
        """lhs and rhs as terms over inputs named after the variables, with the inputs' types."""
        shapes = dict(inst.shapes)
        avals = dict(inst.attrs)
        for v in _pvars(self.lhs):
            if v.name not in shapes:
                raise RuleError(f"rule {self.name!r}: instance gives no shape for variable {v.name!r}")

        def attr(val: AttrVal) -> Any:
            if isinstance(val, AVar):
                if val.name not in avals:
                    raise RuleError(f"rule {self.name!r}: instance gives no value for attribute {val.name!r}")
                return avals[val.name]
            if isinstance(val, RankMinus):
                return len(shapes[val.var.name]) - val.k
            if isinstance(val, RecipDim):
                return 1.0 / shapes[val.var.name][attr(val.axis)]
            return val

        positive = {g.var.name for g in self.guards if isinstance(g, Positive)}

        def term(p: Pat | PVar) -> Term:
            if isinstance(p, PVar):
                leaf = Term("input", (("name", p.name),), ())
                return Term("exp", (), (leaf,)) if p.name in positive else leaf  # every positive value
            attrs = tuple(sorted((k, attr(v)) for k, v in p.attrs))
            return Term(p.op, attrs, tuple(term(a) for a in p.args))

        for g in self.guards:
            ok = True
            if isinstance(g, SameRank):
                ok = len({len(shapes[v.name]) for v in g.vars}) == 1
            elif isinstance(g, RankIs):
                ok = len(shapes[g.var.name]) == g.n
            elif isinstance(g, DimIsOne):
                ok = shapes[g.var.name][attr(g.axis)] == 1
            elif isinstance(g, SameDim):
                ok = len({shapes[v.name][attr(g.axis)] for v in g.vars}) == 1
            elif isinstance(g, Positive) and g.var not in _pvars(self.lhs):
                raise RuleError(f"rule {self.name!r}: guard {g} names a variable the lhs does not have")
            if not ok:
                raise RuleError(f"rule {self.name!r}: instance {inst} violates guard {g}")
        names = sorted(v.name for v in _pvars(self.lhs))
        inputs = [(n, TensorType(tuple(shapes[n]), float32)) for n in names]
        return term(self.lhs), term(self.rhs), inputs

    def instance_graphs(self, *, generic: bool = True) -> list[tuple[Graph, Graph]]:
        """(lhs, rhs) kernel graphs for every instance (the input of ``verify_rule``).

        ``generic`` (the default): also every instance of :meth:`generic_instances`, so that a rule is
        never proved on a degenerate instance only (a size-1 dim, two dims equal by coincidence, an
        identity constant, a dim that could broadcast). RuleError if on a generic instance, where the lhs
        matches, the rhs is ill-typed or well-typed with another shape: the e-graph would hold an ill-typed
        term whose propagated shape need not be the lhs's (egglog panics with "Illegal merge" when the two
        differ), or merge values of different shapes. A guard (:class:`SameDim`, :class:`DimIsOne`, ...)
        keeps the rule off those shapes.
        """
        out = []
        for inst in self.instances:
            lt, rt, inputs = self.instance_terms(inst)
            try:
                out.append((term_to_graph([lt], inputs), term_to_graph([rt], inputs)))
            except GraphError as e:
                raise RuleError(f"rule {self.name!r}: instance {inst} is ill-typed: {e}") from None
        if generic:
            for inst, why in self.generic_instances():
                lt, rt, inputs = self.instance_terms(inst)
                lg = term_to_graph([lt], inputs)
                try:
                    rg = term_to_graph([rt], inputs)
                except GraphError as e:
                    raise RuleError(f"rule {self.name!r}: on {inst} ({why}) the lhs matches and the rhs is "
                                    f"ill-typed ({str(e).splitlines()[0]}); add a guard (SameDim, DimIsOne, "
                                    "...) that keeps the rule off those shapes") from None
                if [t.shape for t in lg.outputs] != [t.shape for t in rg.outputs]:
                    raise RuleError(f"rule {self.name!r}: on {inst} ({why}) the lhs has shape {lg.outputs[0].shape} "
                                    f"and the rhs {rg.outputs[0].shape}; the rule is unsound for those shapes")
                out.append((lg, rg))
        return out

    def generic_instances(self) -> list[tuple[Instance, str]]:
        """Instances beside the author's on which the rule fires too, each with what it generalises.

        For every author instance: each dim that is 1 or equal to another dim is changed, one at a time, to
        a fresh size; each dim above 1 to 1 (an operand that broadcasts there); each float attribute that
        is 0, 1 or -1 to a generic constant. A change is kept when the lhs stays well-typed and the guards
        still hold (the e-graph would apply the rule there), so a dim forced by typing or by a guard (a
        contracted dim, ``DimIsOne``, ``SameDim``) stays as it is.
        """
        out: list[tuple[Instance, str]] = []
        seen = set(self.instances)
        float_avars = _float_avars(self.lhs) | _float_avars(self.rhs)
        for inst in self.instances:
            shapes = dict(inst.shapes)
            attrs = dict(inst.attrs)
            dims = [d for s in shapes.values() for d in s]
            fresh = max([*dims, 1]) + 2
            while fresh in dims:
                fresh += 1
            variants: list[tuple[Instance, str]] = []
            for name, shape in sorted(shapes.items()):
                for ax, d in enumerate(shape):
                    if d != 1:  # an operand that broadcasts along this dim
                        new = dict(shapes)
                        new[name] = tuple(1 if i == ax else x for i, x in enumerate(shape))
                        variants.append((Instance(tuple(sorted(new.items())), inst.attrs),
                                         f"dim {ax} of {name!r} is {d}, could be 1"))
                    if d != 1 and dims.count(d) < 2:
                        continue
                    new = dict(shapes)
                    new[name] = tuple(fresh if i == ax else x for i, x in enumerate(shape))
                    what = f"dim {ax} of {name!r} {'is 1' if d == 1 else f'equals another dim ({d})'}"
                    variants.append((Instance(tuple(sorted(new.items())), inst.attrs), what))
            for key, val in sorted(attrs.items()):
                if key in float_avars and isinstance(val, (int, float)) and val in (0, 1, -1):
                    new_attrs = dict(attrs)
                    new_attrs[key] = 1.375 if val != -1 else -1.375
                    variants.append((Instance(inst.shapes, tuple(sorted(new_attrs.items()))), f"{key}={val}"))
            for v, what in variants:
                if v in seen:
                    continue
                try:
                    lt, _, inputs = self.instance_terms(v)  # (RuleError: a guard fails there)
                    term_to_graph([lt], inputs)
                except (RuleError, GraphError, KeyError, IndexError):
                    continue
                seen.add(v)
                out.append((v, what))
        return out

    @property
    def value_guarded(self) -> bool:
        """Whether a guard of the rule is about values (:class:`Positive`): the search then derives sign facts."""
        return any(isinstance(g, Positive) for g in self.guards)

    def __str__(self) -> str:
        guards = f" if {', '.join(map(str, self.guards))}" if self.guards else ""
        return f"{self.name}: {self.lhs} -> {self.rhs}{guards}"


def _pvars(p: Pat | PVar) -> set[PVar]:
    if isinstance(p, PVar):
        return {p}
    out: set[PVar] = set()
    for a in p.args:
        out |= _pvars(a)
    for _, v in p.attrs:
        if isinstance(v, (RankMinus, RecipDim)):
            out.add(v.var)
    return out


def _float_avars(p: Pat | PVar) -> set[str]:
    """Names of the attribute variables ``p`` uses as float constants (``c``, ``eps``)."""
    if isinstance(p, PVar):
        return set()
    from ..ir.ops import get_op

    d = get_op(p.op)
    out = {v.name for k, v in p.attrs if d.attr_kind(k) == "float" and isinstance(v, AVar)}
    for a in p.args:
        out |= _float_avars(a)
    return out


def match(p: Pat | PVar, t: Term, env: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Match pattern ``p`` against term ``t`` (attribute expressions match anything); env or None."""
    env = {} if env is None else env
    if isinstance(p, PVar):
        if p.name in env and env[p.name] != t:
            return None
        env[p.name] = t
        return env
    if p.op != t.op or len(p.args) != len(t.args):
        return None
    for k, v in p.attrs:
        tv = t.attr(k)
        if isinstance(v, AVar):
            if env.get("@" + v.name, tv) != tv:
                return None
            env["@" + v.name] = tv
        elif isinstance(v, (int, float)) and tv != v:
            return None
    for a, b in zip(p.args, t.args, strict=True):
        if match(a, b, env) is None:
            return None
    return env


def occurs(p: Pat, t: Term) -> bool:
    """Whether pattern ``p`` matches some subterm of ``t``."""
    return any(match(p, s) is not None for s in set(t.subterms()))


# --------------------------------------------------------------------------- rulesets


@dataclass(frozen=True)
class Ruleset:
    """A named group of rules (one theory, or a user's own)."""

    name: str
    rules: tuple[Rule, ...] = field(default=())

    def names(self) -> list[str]:
        """Names of its rules."""
        return [r.name for r in self.rules]


def ruleset(name: str, rules: Iterable[Rule]) -> Ruleset:
    """A user ruleset: pass it to ``superoptimize(rulesets=..., extra_rules=...)``."""
    rs = tuple(rules)
    for r in rs:
        if not isinstance(r, Rule):
            raise RuleError(f"ruleset {name!r}: {r!r} is not a Rule")
    return Ruleset(name, rs)


def builtin_rulesets() -> dict[str, Ruleset]:
    """The built-in theories: algebra, reduction, softmax, norm, concat, activations."""
    from .theories import activations, algebra, concat, norm, reduction, softmax

    return {
        "algebra": Ruleset("algebra", tuple(algebra.RULES)),
        "reduction": Ruleset("reduction", tuple(reduction.RULES)),
        "softmax": Ruleset("softmax", tuple(softmax.RULES)),
        "norm": Ruleset("norm", tuple(norm.RULES)),
        "concat": Ruleset("concat", tuple(concat.RULES)),
        "activations": Ruleset("activations", tuple(activations.RULES)),
    }


def all_builtin_rules() -> list[Rule]:
    """Every built-in rule, theory by theory."""
    return [r for rs in builtin_rulesets().values() for r in rs.rules]


#: Built-in rules that ``verify_rule`` cannot prove yet, with the reason (they must be off by default, are
#: left out of the certificate checker's known rules and are cited as trusted in certificates; reviewed in
#: tests/test_rules_soundness.py). None now: matmul-assoc and sum-matmul-last prove since the abstract check
#: interchanges nested sums (smt/expr.canon_sums).
UNPROVED_BUILTINS: dict[str, str] = {}

def select_rules(
    rulesets: Sequence[str | Ruleset] | None, disable: Sequence[str], extra: Sequence[Rule | Ruleset]
) -> list[Rule]:
    """Resolve ruleset names/objects, drop disabled rules, add extra rules (deduplicated by name)."""
    builtin = builtin_rulesets()
    chosen: list[Rule] = []
    if rulesets is None:
        chosen = [r for rs in builtin.values() for r in rs.rules if r.default]
    else:
        for rs in rulesets:
            if isinstance(rs, str):
                if rs not in builtin:
                    raise RuleError(f"unknown ruleset {rs!r}; built-in rulesets are {sorted(builtin)}")
                chosen += list(builtin[rs].rules)
            elif isinstance(rs, Ruleset):
                chosen += list(rs.rules)
            else:
                raise RuleError(f"rulesets: {rs!r}; expected a ruleset name or a Ruleset")
    for e in extra:
        if isinstance(e, Ruleset):
            chosen += list(e.rules)
        elif isinstance(e, Rule):
            chosen.append(e)
        else:
            raise RuleError(f"extra_rules: {e!r}; expected a Rule or a Ruleset")
    known = {r.name for r in chosen} | {r.name for r in all_builtin_rules()}
    for d in disable:
        if d not in known and d not in builtin:
            raise RuleError(f"disable_rules: no rule or ruleset named {d!r}")
    off = set(disable)
    for name, rs in builtin.items():
        if name in off:
            off |= set(rs.names())
    out: dict[str, Rule] = {}
    for r in chosen:
        if r.name not in off and r.name not in out:
            out[r.name] = r
    return list(out.values())
