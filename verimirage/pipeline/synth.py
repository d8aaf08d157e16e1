"""Rule synthesis (Ruler-style): enumerate tensor terms, fingerprint them in the finite field, propose the
equalities, prove each with ``verify_rule``, keep a small set that derives the rest.

:func:`synthesize` works per *shape environment* (a shape for every tensor variable, all of one rank):

1. **enumerate** the well-typed terms over the chosen ops up to ``depth`` (children are class
   representatives only, as in Ruler: a term equal to a smaller one is not grown further);
2. **fingerprint** each term by evaluating it in the verifier's finite-field domain
   (:mod:`verimirage.smt.ff`) on several random fields and inputs: exact arithmetic, so equal
   programs always have equal fingerprints, and unequal polynomials collide with probability about
   ``degree / q`` per field;
3. **propose** ``t -> r`` for every term ``t`` of a class with ``r`` the class's cheapest member over a
   subset of ``t``'s variables (oriented toward the cheaper side); axes are written relative to the
   rank (``rank(a) - k``), so a rule found on matrices also fires on batched tensors, and every size-1
   dim of the environment becomes a :class:`~verimirage.rewrite.rules.DimIsOne` guard;
4. **filter** proposals the rules admitted so far already derive (egglog, a few rounds), smallest first,
   in batches;
5. **prove** each remaining proposal with :func:`verimirage.smt.verify.verify_rule` on the environment
   and on a batched copy of it (plus the generic instances :meth:`Rule.instance_graphs` adds): only
   ``Proved`` rules are admitted; ``Refuted``/``Unknown`` ones are reported, never admitted;
6. **minimize**: a rule that the other admitted rules derive (egglog within ``minimize_steps`` rounds,
   on each of its instances) is dropped.

Deterministic for a given ``seed`` (fields, inputs, orders); the proof jobs of a batch may run on Ray
(``ray=True``) or in a pool of worker processes (``processes=``), with the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir.dtypes import float32
from ..ir.errors import GraphError
from ..ir.ops import Prop, TensorType, get_op
from ..rewrite.lift import Term, term_to_graph
from ..rewrite.rules import (
    AVar,
    DimIsOne,
    Instance,
    Pat,
    PVar,
    RankMinus,
    Rule,
    RuleError,
    Ruleset,
    SameDim,
    SameRank,
)
from .progress import Progress

log = logging.getLogger(__name__)

#: the default ops of :func:`synthesize` (the issue's set)
DEFAULT_OPS = ("add", "mul", "sub", "neg", "scale", "exp", "sum", "matmul")

#: default shape environments: elementwise (equal shapes), broadcast (a row and a column vector),
#: matmul with a shared right operand shape, and a matmul chain
DEFAULT_SHAPES: tuple[dict[str, tuple[int, ...]], ...] = (
    {"a": (3, 4), "b": (3, 4), "c": (3, 4)},
    {"a": (3, 4), "b": (3, 1), "c": (1, 4)},
    {"a": (3, 4), "b": (4, 5), "c": (4, 5)},
    {"a": (3, 4), "b": (4, 5), "c": (5, 2)},
)

#: cost weights of the orientation (a rule rewrites toward the cheaper side)
_WEIGHT = {"matmul": 4, "exp": 3, "sum": 2}


# --------------------------------------------------------------------------- report


@dataclass
class SynthesisReport:
    """What a synthesis did: counts per stage, the rules refused (with reasons), the rules minimized away."""

    terms: int = 0
    classes: int = 0
    proposed: int = 0
    derivable: int = 0  # proposals the rules admitted before them already derived (not proved separately)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    refuted: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[tuple[str, str]] = field(default_factory=list)
    proved: list[str] = field(default_factory=list)
    minimized_away: list[str] = field(default_factory=list)
    untried: int = 0  # proposals left when max_proofs or the time budget stopped the proofs
    seconds: dict[str, float] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"synthesis: {self.terms} terms, {self.classes} classes with 2+ terms, {self.proposed} proposals, "
                 f"{self.derivable} already derivable, {len(self.proved)} proved, {len(self.refuted)} refuted, "
                 f"{len(self.unknown)} unknown (not admitted), {len(self.skipped)} skipped "
                 "(shape-unsafe or inexpressible), "
                 f"{len(self.minimized_away)} dropped by minimization, {self.untried} not tried",
                 "  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items())]
        lines += [f"  refuted: {r}: {why}" for r, why in self.refuted[:10]]
        lines += [f"  unknown: {r}: {why}" for r, why in self.unknown[:10]]
        return "\n".join(lines)


@dataclass(frozen=True)
class SynthesizedRuleset(Ruleset):
    """A :class:`Ruleset` made by :func:`synthesize`, with its :class:`SynthesisReport`."""

    report: SynthesisReport = field(default_factory=SynthesisReport, compare=False, hash=False)


# --------------------------------------------------------------------------- fingerprints


@dataclass(frozen=True)
class FieldSpec:
    """A field of the fingerprints: safe prime ``p = 2q + 1``, generator ``g`` of order ``q``, oracle key.
    (Tests force a tiny one to provoke collisions.)"""

    p: int
    q: int
    g: int
    key: int = 1


def _fields(seed: int, n: int) -> list[FieldSpec]:
    from ..smt.ff import Field

    out = []
    for k in range(n):
        f = Field.from_seed(int(np.random.default_rng([seed, 0xF1E1D, k]).integers(1 << 30)))
        out.append(FieldSpec(f.p, f.q, f.g, f.key))
    return out


class _Evaluator:
    """Finite-field values of terms over one shape environment, in several fields (memoised per term)."""

    def __init__(self, env: dict[str, tuple[int, ...]], fields: Sequence[FieldSpec], seed: int) -> None:
        from ..smt import ff

        self.ff = ff
        self.types = {v: TensorType(tuple(s), float32) for v, s in env.items()}
        self.fields = [ff.Field(f.p, f.q, f.g, f.key) for f in fields]
        self.inputs: list[dict[str, Any]] = []
        for k, fld in enumerate(self.fields):
            vals = {}
            for i, (name, tt) in enumerate(sorted(self.types.items())):
                rng = np.random.default_rng([seed, 0x1A7, k, i])
                arr = np.stack([rng.integers(0, fld.p, tt.shape), rng.integers(0, fld.q, tt.shape)])
                vals[name] = ff.fv_of(arr)
            self.inputs.append(vals)
        self.memo: dict[Term, list[Any]] = {}
        self.tmemo: dict[Term, TensorType] = {}

    def type_of(self, t: Term) -> TensorType:
        """The type of a well-typed term (GraphError otherwise)."""
        if t in self.tmemo:
            return self.tmemo[t]
        if t.op == "input":
            tt = self.types[str(t.attr("name"))]
        else:
            tt = get_op(t.op).infer([self.type_of(a) for a in t.args], dict(t.attrs))
        self.tmemo[t] = tt
        return tt

    def values(self, t: Term) -> list[Any]:
        """The term's value in each field."""
        if t in self.memo:
            return self.memo[t]
        if t.op == "input":
            out = [inp[str(t.attr("name"))] for inp in self.inputs]
        else:
            kids = [self.values(a) for a in t.args]
            in_types = [self.type_of(a) for a in t.args]
            out_t = self.type_of(t)
            out = [self.ff.FFDomain(fld).apply(t.op, [k[i] for k in kids], dict(t.attrs), in_types, out_t)
                   for i, fld in enumerate(self.fields)]
        self.memo[t] = out
        return out

    def is_zero(self, t: Term) -> bool:
        """Whether the term is zero everywhere in every field (its p-residues)."""
        return all(not self.ff.ints(v.p).any() for v in self.values(t))

    def fingerprint(self, t: Term) -> bytes:
        """A digest of the term's shape and values in every field."""
        h = hashlib.blake2b(digest_size=16)
        h.update(repr(self.type_of(t).shape).encode())
        for v in self.values(t):
            h.update(np.ascontiguousarray(self.ff.stacked(v)).tobytes())
        return h.digest()


# --------------------------------------------------------------------------- enumeration


def _variants(op: str, rank: int, constants: Sequence[float]) -> list[dict[str, Any]]:
    """Attribute choices of ``op`` on operands of ``rank``."""
    d = get_op(op)
    out: list[dict[str, Any]] = [{}]
    for key in d.attrs:
        kind = d.attr_kind(key)
        nxt: list[dict[str, Any]] = []
        for a in out:
            if kind == "axis":
                nxt += [{**a, key: ax} for ax in range(rank)]
            elif kind == "float":
                nxt += [{**a, key: float(c)} for c in constants]
            elif kind == "int" and op == "transpose" and rank >= 2:
                nxt.append({**a, key: rank - 2 if key == "a" else rank - 1})
            else:
                raise RuleError(f"synthesize: op {op!r} attribute {key!r} ({kind}) is not supported; "
                                "expected ops with axis or float attributes, or transpose")
        out = nxt
    return out


def _arity(op: str) -> int:
    from ..smt import ff as _ff  # noqa: F401  (registers the finite-field meanings)

    d = get_op(op)
    if d.has(Prop.STRUCTURAL) or "egglog" not in d.domains or "ff" not in d.domains:
        raise RuleError(f"synthesize: op {op!r} has no finite-field or egglog meaning; expected a tensor op")
    if d.has(Prop.CONCAT) or d.arity is None:
        return 2
    return int(d.arity)


def cost_key(t: Term) -> tuple[int, int, str]:
    """Orientation order: weighted size, then size, then text (smaller is cheaper)."""
    w = sum(_WEIGHT.get(s.op, 1) for s in t.subterms() if s.op != "input")
    return (w, t.size(), str(t))


def _vars(t: Term) -> frozenset[str]:
    return frozenset(str(s.attr("name")) for s in t.subterms() if s.op == "input")


def _height(t: Term) -> int:
    return 0 if not t.args else 1 + max(_height(a) for a in t.args)


def enumerate_classes(
    env: dict[str, tuple[int, ...]], ops: Sequence[str], depth: int, ev: _Evaluator, constants: Sequence[float],
    max_terms: int,
) -> tuple[dict[bytes, list[Term]], int]:
    """Terms up to ``depth`` grouped by fingerprint (children are class representatives); and the count."""
    classes: dict[bytes, list[Term]] = {}
    reps: dict[bytes, Term] = {}
    count = 0

    def add(t: Term) -> None:
        nonlocal count
        try:
            ev.type_of(t)
        except (GraphError, ValueError, IndexError):
            return
        count += 1
        fp = ev.fingerprint(t)
        if ev.is_zero(t):  # identically zero (no zero constant in the grammar): neither grown nor proposed
            return
        classes.setdefault(fp, []).append(t)
        if fp not in reps or cost_key(t) < cost_key(reps[fp]):
            reps[fp] = t

    for v in sorted(env):
        add(Term("input", (("name", v),), ()))
    rank = len(next(iter(env.values())))
    arities = {op: _arity(op) for op in ops}
    for level in range(1, depth + 1):
        keyed = sorted((cost_key(t), _height(t), t) for t in reps.values())
        keys = [k for k, _, _ in keyed]
        heights = [h for _, h, _ in keyed]
        kids = [t for _, _, t in keyed]
        size = _level_size(ops, arities, heights, keys, level, rank, constants)
        if count + size > max_terms:  # counted before any term is built (a level can hold millions)
            log.warning("synthesize: depth %d would enumerate %d more terms (max_terms=%d): stopping at depth %d",
                        level, size, max_terms, level - 1)
            break
        for op in ops:
            vs = [tuple(sorted(a.items())) for a in _variants(op, rank, constants)]
            top = [i for i, h in enumerate(heights) if h == level - 1]
            if arities[op] == 1:
                for i in top:
                    for a in vs:
                        add(Term(op, a, (kids[i],)))
                continue
            comm = get_op(op).has(Prop.COMMUTATIVE) and level > 1  # (level 1 shows commutativity)
            for i, x in enumerate(kids):
                for j, y in enumerate(kids):
                    if max(heights[i], heights[j]) == level - 1 and not (comm and keys[j] < keys[i]):
                        for a in vs:
                            add(Term(op, a, (x, y)))
    return classes, count


def _level_size(ops: Sequence[str], arities: dict[str, int], heights: list[int], keys: list[Any], level: int,
                rank: int, constants: Sequence[float]) -> int:
    """How many terms level ``level`` of :func:`enumerate_classes` builds, counted without building them
    (``keys`` sorted; a commutative op pairs ``x`` only with ``y`` whose key is not below ``x``'s)."""
    import bisect

    n = len(keys)
    top = [i for i, h in enumerate(heights) if h == level - 1]
    low = n - len(top)  # (heights never exceed level - 1)
    total = 0
    for op in ops:
        nv = len(_variants(op, rank, constants))
        if arities[op] == 1:
            total += nv * len(top)
        elif not (get_op(op).has(Prop.COMMUTATIVE) and level > 1):
            total += nv * (n * n - low * low)  # pairs with at least one child of height level - 1
        else:
            # pairs (i, j) with key j >= key i and at least one of the two at height level - 1
            top_keys = sorted(keys[i] for i in top)
            for i in range(n):
                if heights[i] == level - 1:
                    total += nv * (n - bisect.bisect_left(keys, keys[i]))
                else:
                    total += nv * (len(top_keys) - bisect.bisect_left(top_keys, keys[i]))
    return total


# --------------------------------------------------------------------------- proposals -> rules


def _rename(t: Term, names: dict[str, str]) -> Term:
    if t.op == "input":
        return Term("input", (("name", names[str(t.attr("name"))]),), ())
    return Term(t.op, t.attrs, tuple(_rename(a, names) for a in t.args))


def _first_vars(t: Term, out: list[str]) -> list[str]:
    if t.op == "input":
        n = str(t.attr("name"))
        if n not in out:
            out.append(n)
    for a in t.args:
        _first_vars(a, out)
    return out


@dataclass(frozen=True)
class Proposal:
    """A proposed rule ``lhs -> rhs`` (terms over canonical variable names) with its environment."""

    lhs: Term
    rhs: Term
    env: tuple[tuple[str, tuple[int, ...]], ...]

    def key(self) -> tuple[Any, ...]:
        """Order of processing: fewer size-1 dims (guards), then smaller."""
        ones = sum(1 for _, s in self.env for d in s if d == 1)
        return (ones, cost_key(self.lhs)[0] + cost_key(self.rhs)[0], self.lhs.size(), str(self.lhs), str(self.rhs),
                self.env)


def _ac_key(t: Term) -> Term:
    """``t`` modulo associativity and commutativity of the commutative-associative ops (flattened, sorted)."""
    if t.op == "input":
        return t
    d = get_op(t.op)
    args = [_ac_key(a) for a in t.args]
    if d.has(Prop.COMMUTATIVE) and d.has(Prop.ASSOCIATIVE):
        flat: list[Term] = []
        for a in args:
            flat += list(a.args) if a.op == t.op and a.attrs == t.attrs else [a]
        args = sorted(flat, key=str)
    elif d.has(Prop.COMMUTATIVE):
        args = sorted(args, key=str)
    return Term(t.op, t.attrs, tuple(args))


def _dedup(proposals: Iterable[Proposal]) -> list[Proposal]:
    """Proposals in processing order, without repeats: the same rule found in several environments (same
    sides, size-1 dims at the same places) is kept once; a proposal equal to an earlier one modulo
    associativity-commutativity, or whose sides are equal modulo AC, is left out (the AC rules, which come
    first, derive it; the minimization and :func:`rediscovered` check derivations with egglog)."""
    seen: set[Any] = set()
    out = []
    for pr in sorted(set(proposals), key=Proposal.key):
        ones = tuple((v, tuple(i for i, d in enumerate(s) if d == 1)) for v, s in pr.env)
        lk, rk = _ac_key(pr.lhs), _ac_key(pr.rhs)
        k = (str(lk), str(rk), ones)
        if k in seen or (lk == rk and max(pr.lhs.size(), pr.rhs.size()) > 5):
            continue
        seen.add(k)
        out.append(pr)
    return out


def propose(classes: dict[bytes, list[Term]], env: dict[str, tuple[int, ...]]) -> list[Proposal]:
    """For each term of a class, a rewrite to the cheapest member over a subset of its variables."""
    out: set[Proposal] = set()
    for members in classes.values():
        if len(members) < 2:
            continue
        ms = sorted(members, key=cost_key)
        for t in ms:
            vt = _vars(t)
            r = next((m for m in ms if _vars(m) <= vt), None)
            if r is None or r == t:
                continue
            names = {n: "abcdefgh"[i] for i, n in enumerate(_first_vars(t, []))}
            shapes = tuple(sorted((names[n], tuple(env[n])) for n in vt))
            out.add(Proposal(_rename(t, names), _rename(r, names), shapes))
    return sorted(out, key=Proposal.key)


def _pat(t: Term, rank: int, anchor: PVar, axis_var: AVar | None = None) -> Pat | PVar:
    if t.op == "input":
        return PVar(str(t.attr("name")))
    d = get_op(t.op)
    attrs: list[tuple[str, Any]] = []
    for k, v in t.attrs:
        if d.attr_kind(k) == "axis" and axis_var is not None:
            attrs.append((k, axis_var))
        elif d.attr_kind(k) == "axis" or (t.op == "transpose" and k in ("a", "b")):
            attrs.append((k, RankMinus(anchor, rank - int(v))))
        else:
            attrs.append((k, v))
    return Pat(t.op, tuple(_pat(a, rank, anchor, axis_var) for a in t.args), tuple(sorted(attrs)))


def _attrs_of_kind(t: Term, kind: str) -> set[Any]:
    """The values of every ``kind`` attribute (the registry's attribute kinds: "axis", "float") in ``t``."""
    out: set[Any] = set()
    for s in t.subterms():
        if s.op != "input":
            d = get_op(s.op)
            out |= {v for k, v in s.attrs if d.attr_kind(k) == kind}
    return out


def _axis_attrs(t: Term) -> set[int]:
    return {int(v) for v in _attrs_of_kind(t, "axis")}


def _subst_axis(t: Term, new: int) -> Term:
    if t.op == "input":
        return t
    d = get_op(t.op)
    attrs = tuple((k, new if d.attr_kind(k) == "axis" else v) for k, v in t.attrs)
    return Term(t.op, attrs, tuple(_subst_axis(a, new) for a in t.args))


_AX = AVar("ax")


def _const_attrs(t: Term) -> set[float]:
    return {float(v) for v in _attrs_of_kind(t, "float")}


def _replace_const(p: Pat | PVar, c: float, new: Any) -> Pat | PVar:
    if isinstance(p, PVar):
        return p
    d = get_op(p.op)
    attrs = tuple((k, new if d.attr_kind(k) == "float" and v == c else v) for k, v in p.attrs)
    return Pat(p.op, tuple(_replace_const(a, c, new) for a in p.args), attrs)


def _subst_const(t: Term, c: float, new: float) -> Term:
    if t.op == "input":
        return t
    d = get_op(t.op)
    attrs = tuple((k, new if d.attr_kind(k) == "float" and v == c else v) for k, v in t.attrs)
    return Term(t.op, attrs, tuple(_subst_const(a, c, new) for a in t.args))


_K = AVar("k")
_ALT_CONST = 1.625


def to_rule(pr: Proposal, name: str, ev_for: Callable[[dict[str, tuple[int, ...]]], _Evaluator]) -> Rule | str:
    """The guarded rule of a proposal, or why it is shape-unsafe.

    Axes become ``rank(a) - k``; size-1 dims become ``DimIsOne`` guards; a float constant (one value in
    the rule) becomes an attribute variable when the two sides stay equal with another constant. The
    instances: the environment and a batched copy (a leading dim of 2), where the lhs is well-typed.
    A rule whose sides have different shapes on an instance where the lhs is well-typed is refused.
    """
    env = dict(pr.env)
    rank = len(next(iter(env.values())))
    vs = sorted(env)
    anchor = PVar(vs[0])
    lhs, rhs = _pat(pr.lhs, rank, anchor), _pat(pr.rhs, rank, anchor)
    assert isinstance(lhs, Pat)
    if not isinstance(rhs, Pat):  # a rule to a bare variable: rhs as the pattern of an identity is not
        return "rhs is a bare variable (the pattern language needs an op on each side)"
    guards: list[Any] = [SameRank(tuple(PVar(v) for v in vs))] if len(vs) > 1 else []
    for v in vs:
        for ax, dd in enumerate(env[v]):
            if dd == 1:
                guards.append(DimIsOne(PVar(v), RankMinus(anchor, rank - ax)))
    consts = _const_attrs(pr.lhs) | _const_attrs(pr.rhs)
    attrs: dict[str, Any] = {}
    if len(consts) == 1:
        (c,) = consts
        ev = ev_for(env)
        alt_l, alt_r = _subst_const(pr.lhs, c, _ALT_CONST), _subst_const(pr.rhs, c, _ALT_CONST)
        if ev.fingerprint(alt_l) == ev.fingerprint(alt_r):
            lhs_p, rhs_p = _replace_const(lhs, c, _K), _replace_const(rhs, c, _K)
            assert isinstance(lhs_p, Pat) and isinstance(rhs_p, Pat)
            lhs, rhs = lhs_p, rhs_p
            attrs = {"k": c}
    batched = {v: (2, *s) for v, s in env.items()}
    instances = [Instance.of(env, **attrs), Instance.of(batched, **attrs)]
    # one reduction axis, no size-1 dims, and the sides stay equal on every other axis: any axis (``ax``)
    axes = _axis_attrs(pr.lhs) | _axis_attrs(pr.rhs)
    if len(axes) == 1 and all(d != 1 for sh in env.values() for d in sh):
        ev = ev_for(env)
        try:
            general = all(ev.fingerprint(_subst_axis(pr.lhs, o)) == ev.fingerprint(_subst_axis(pr.rhs, o))
                          for o in range(rank))
        except (GraphError, ValueError, IndexError):
            general = False
        if general:
            lp, rp = _pat(pr.lhs, rank, anchor, _AX), _pat(pr.rhs, rank, anchor, _AX)
            assert isinstance(lp, Pat) and isinstance(rp, Pat)
            if "k" in attrs:
                lp, rp = _replace_const(lp, next(iter(consts)), _K), _replace_const(rp, next(iter(consts)), _K)
            assert isinstance(lp, Pat) and isinstance(rp, Pat)
            lhs, rhs = lp, rp
            instances = [Instance.of(env, ax=a, **attrs) for a in range(rank)]
            instances += [Instance.of(batched, ax=a, **attrs) for a in range(rank + 1)]
    try:
        rule = Rule(name, lhs, rhs, f"{pr.lhs} = {pr.rhs}", "synthesized", tuple(guards), tuple(instances))
        rule = _same_dim_guards(rule, anchor)
    except RuleError as e:
        return str(e)
    # shape safety beyond the instances: every combination of variable dims set to 1 (broadcasting); where
    # the lhs is well-typed, a well-typed rhs must have its shape (else the e-graph would merge the two)
    slots = [(v, ax) for v in vs for ax in range(rank) if env[v][ax] != 1]
    for mask in range(1, 1 << min(len(slots), 10)):
        shp = {v: list(s) for v, s in env.items()}
        for k, (v, ax) in enumerate(slots[:10]):
            if mask >> k & 1:
                shp[v][ax] = 1
        inst = Instance.of({v: tuple(s) for v, s in shp.items()}, **dict(instances[0].attrs))
        try:
            lt, rt, inputs = rule.instance_terms(inst)
            lg = term_to_graph([lt], inputs)
        except (RuleError, GraphError):
            continue
        try:
            rg = term_to_graph([rt], inputs)
        except GraphError:
            continue
        if lg.outputs[0].shape != rg.outputs[0].shape:
            return f"sides differ in shape on {dict(inst.shapes)}"
    return rule


def _same_dim_guards(rule: Rule, anchor: PVar) -> Rule:
    """``rule`` with :class:`SameDim` guards where its rhs needs them.

    A proposal is found on one environment, where dims of different variables may be equal; the rule then
    also fires where they differ (its generic instances), and there the rhs can be ill-typed, e.g.
    ``sum(a, ax) + sum(b, ax) -> sum(a + b, ax)`` when ``a`` and ``b`` differ along ``ax``. For each generic
    instance with an ill-typed rhs that changed a dim equal to another variable's dim on the same axis, the
    variables sharing it get a ``SameDim`` guard on that axis (counted from the end, as the rule's axes are);
    any other failure is left to the prover, which refuses the rule with the reason.
    """
    for _ in range(8):
        bad = None
        for inst, _why in rule.generic_instances():
            _, rt, inputs = rule.instance_terms(inst)
            try:
                term_to_graph([rt], inputs)
            except GraphError:
                bad = inst
                break
        if bad is None:
            return rule
        shapes = dict(bad.shapes)
        base = next((dict(i.shapes) for i in rule.instances if i.attrs == bad.attrs and _one_dim_apart(i, shapes)),
                    None)
        if base is None:
            return rule
        (v, ax), = [(v, ax) for v, sh in base.items() for ax, d in enumerate(sh) if shapes[v][ax] != d]
        d = base[v][ax]
        group = tuple(PVar(w) for w in sorted(base) if base[w][ax] == d)
        if d == 1 or shapes[v][ax] == 1 or len(group) < 2:
            return rule  # (a broadcasting operand, or a dim equal to another axis's: no SameDim says it)
        # the reduced axis of an axis attribute (``sum(a, ax) + sum(b, ax)``): the guard names the attribute, so
        # it holds at every rank; another axis counts from the end, as the rule's axes do
        avars = {a.name for a in _axis_avars(rule.lhs)}
        named = [k for k, val in bad.attrs if k in avars and val == ax]
        guard = SameDim(group, AVar(named[0]) if named else RankMinus(anchor, len(base[v]) - ax))
        if guard in rule.guards:
            return rule
        rule = dataclasses.replace(rule, guards=(*rule.guards, guard))
    return rule


def _axis_avars(p: Pat | PVar) -> set[AVar]:
    """The attribute variables of a pattern."""
    if isinstance(p, PVar):
        return set()
    out = {v for _, v in p.attrs if isinstance(v, AVar)}
    for a in p.args:
        out |= _axis_avars(a)
    return out


def _one_dim_apart(inst: Instance, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether ``shapes`` differ from ``inst``'s in exactly one dim (same variables, same ranks)."""
    mine = dict(inst.shapes)
    if set(mine) != set(shapes) or any(len(mine[v]) != len(shapes[v]) for v in mine):
        return False
    return sum(x != y for v in mine for x, y in zip(mine[v], shapes[v], strict=True)) == 1


def _prove(rule: Rule, timeout_s: float) -> tuple[str, str]:
    """(verdict class name, reason) of ``verify_rule`` on the rule's instances."""
    from ..smt.verify import verify_rule

    try:
        v = verify_rule(rule.name, rule.instance_graphs(), timeout_s=timeout_s)
    except (RuleError, GraphError) as e:
        return "Unknown", str(e).splitlines()[0]
    return type(v).__name__, str(getattr(v, "reason", ""))


# --------------------------------------------------------------------------- egglog derivability


def derives(rules: Sequence[Rule], pairs: Iterable[tuple[Term, Term, Sequence[tuple[str, TensorType]]]], *,
            steps: int = 4, node_limit: int = 20000) -> list[bool]:
    """Whether ``rules`` rewrite each ``lhs`` into ``rhs`` (same e-class) within ``steps`` rounds.

    Each pair is (lhs term, rhs term, typed inputs); pairs with the same inputs share one e-graph.
    """
    from egglog import eq

    from ..rewrite.lift import lift
    from ..rewrite.saturate import SaturationPanic, _main_ruleset, _num_nodes, _run, shapes

    pairs = list(pairs)
    out = [False] * len(pairs)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, (lt, rt, inputs) in enumerate(pairs):
        if lt == rt:
            out[i] = True
        else:
            groups.setdefault(tuple(inputs), []).append(i)
    if not rules:
        return out
    for inputs, idx in groups.items():
        terms: list[Term] = []
        for i in idx:
            terms += [pairs[i][0], pairs[i][1]]
        try:
            g = term_to_graph(terms, list(inputs))
        except GraphError:
            continue
        lf = lift(g)
        eg = lf.egraph
        facts = [eq(lf.roots[2 * k]).to(lf.roots[2 * k + 1]) for k in range(len(idx))]
        main, _ = _main_ruleset(list(rules), f"derive_{id(lf)}")
        try:
            _run(eg, shapes.saturate())
            for _ in range(steps):
                rep = _run(eg, main)
                _run(eg, shapes.saturate())
                if not getattr(rep, "updated", True) or _num_nodes(eg) > node_limit:
                    break
        except SaturationPanic as e:
            log.warning("synthesize: egglog panicked checking derivability: %s", e)
        for k, i in enumerate(idx):
            try:
                out[i] = bool(eg.check_bool(facts[k]))
            except Exception:  # a fact egglog cannot check counts as not derived
                out[i] = False
    return out


def rule_pairs(rule: Rule) -> list[tuple[Term, Term, list[tuple[str, TensorType]]]]:
    """(lhs, rhs, inputs) of each author instance of ``rule``."""
    out = []
    for inst in rule.instances:
        lt, rt, inputs = rule.instance_terms(inst)
        out.append((lt, rt, inputs))
    return out


def rule_derived(rules: Sequence[Rule], rule: Rule, *, steps: int = 4) -> bool:
    """Whether ``rules`` derive ``rule`` on every one of its author instances (or contain it)."""
    if any(r.lhs == rule.lhs and r.rhs == rule.rhs and r.guards == rule.guards for r in rules):
        return True
    return all(derives(rules, rule_pairs(rule), steps=steps))


# --------------------------------------------------------------------------- progress / parallel map


class Jobs:
    """Where independent jobs run: in this process (the default), in a pool of ``processes`` worker processes
    (the standard library's :class:`~concurrent.futures.ProcessPoolExecutor`, started with ``spawn``; for a
    many-core machine without Ray), or as Ray tasks (``ray=True``; ``address`` joins a cluster).

    A context manager: the pool starts on entry and stops on exit, so a run of many small batches (the
    synthesis's proofs) pays the workers' start-up once. ``processes=0`` means one per usable core. Results
    come back in the order of the jobs whichever way they ran; each worker runs the finite-field test on one
    thread unless ``$VERIMIRAGE_FF_THREADS`` says otherwise (the pool is the parallelism).
    """

    def __init__(self, *, ray: bool = False, address: str | None = None, processes: int | None = None) -> None:
        if processes is not None and processes < 0:
            raise RuleError(f"processes={processes}; expected None (this process), 0 (every core) or a count >= 1")
        if ray and processes not in (None, 1):
            raise RuleError("ray=True and processes= both given; choose one way to run the jobs")
        if address is not None and not ray:
            raise RuleError(f"address={address!r} without ray=True; the address is a Ray cluster's")
        self.ray, self.address = ray, address
        self.processes = _usable_cores() if processes == 0 else processes
        self._pool: Any = None

    @property
    def parallel(self) -> bool:
        """Whether jobs run outside this process."""
        return self.ray or (self.processes or 1) > 1

    def __enter__(self) -> Jobs:
        if not self.ray and (self.processes or 1) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(max_workers=self.processes, mp_context=ctx, initializer=_worker_init)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``[fn(*a) for a in args]``, run this object's way (``fn`` a module-level function when parallel)."""
        if self.ray:
            r = _ray(self.address)
            remote = r.remote(fn)
            return list(r.get([remote.remote(*a) for a in args]))
        if self._pool is not None:
            futures = [self._pool.submit(fn, *a) for a in args]
            return [f.result() for f in futures]
        if (self.processes or 1) > 1:  # used outside a with-block: a pool for this call only
            with self:
                return self.map(fn, args)
        return [fn(*a) for a in args]


def _usable_cores() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _worker_init() -> None:
    """Start-up of a pool worker: one finite-field thread (the pool is the parallelism)."""
    import os

    os.environ.setdefault("VERIMIRAGE_FF_THREADS", "1")


def pmap(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *, ray: bool = False,
         address: str | None = None, processes: int | None = None) -> list[Any]:
    """``[fn(*a) for a in args]``, serially, in ``processes`` worker processes, or as Ray tasks (results in the
    order of ``args``; see :class:`Jobs`)."""
    with Jobs(ray=ray, address=address, processes=processes) as jobs:
        return jobs.map(fn, args)


def _ray(address: str | None) -> Any:
    try:
        import ray as r
    except ImportError:
        raise RuleError("ray=True needs Ray: pip install 'verimirage[ray]'") from None
    if not r.is_initialized():
        kw: dict[str, Any] = {}
        if address is None:  # local workers import this copy of verimirage (not another installed one)
            import os
            from pathlib import Path

            root = str(Path(__file__).resolve().parents[2])
            kw["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}}
        r.init(address=address, logging_level=logging.WARNING, include_dashboard=False, **kw)
    return r


# --------------------------------------------------------------------------- synthesize


def synthesize(
    ops: Sequence[str] = DEFAULT_OPS,
    depth: int = 2,
    shapes: Sequence[dict[str, tuple[int, ...]]] | None = None,
    seed: int = 0,
    *,
    constants: Sequence[float] = (0.5,),
    num_fields: int = 3,
    fields: Sequence[FieldSpec] | None = None,
    max_terms: int = 20000,
    max_proofs: int | None = None,
    time_budget_s: float | None = None,
    batch: int = 16,
    filter_steps: int = 3,
    minimize_steps: int = 4,
    timeout_s: float = 10.0,
    name: str = "synthesized",
    progress: bool | None = None,
    ray: bool = False,
    address: str | None = None,
    processes: int | None = None,
) -> SynthesizedRuleset:
    """Synthesize a ruleset over ``ops`` (see the module docstring); every rule in it is Proved.

    ``shapes``: shape environments (dicts variable -> shape, all of one rank; default
    :data:`DEFAULT_SHAPES`); ``depth``: term height; ``constants``: values of float attributes (``scale``);
    ``num_fields`` random fields per fingerprint (or ``fields`` given explicitly: research and tests);
    ``max_terms`` per environment; ``max_proofs``: stop after this many proof attempts (``time_budget_s``:
    after this many seconds; the minimization still runs); proposals are
    proved in batches of ``batch`` (each batch's proofs are independent: Ray jobs with ``ray=True``,
    ``address`` to join a cluster, or jobs of a pool of ``processes`` worker processes, 0 for every core:
    see :class:`Jobs`; the result is the same); ``filter_steps`` / ``minimize_steps``: egglog rounds of the
    derivability checks; ``timeout_s`` per proof. The result's ``report`` lists every refused proposal.
    """
    t_all = time.perf_counter()
    ops = list(ops)
    if not ops:
        raise RuleError("synthesize: no ops given; expected e.g. ['add', 'mul']")
    for op in ops:
        _arity(op)
    envs = [dict(e) for e in (DEFAULT_SHAPES if shapes is None else shapes)]
    for e in envs:
        if not e or len({len(s) for s in e.values()}) != 1:
            raise RuleError(f"synthesize: shape environment {e}; expected variables of one rank")
    if depth < 1:
        raise RuleError(f"synthesize: depth={depth}; expected >= 1")
    fspecs = list(fields) if fields is not None else _fields(seed, num_fields)
    rep = SynthesisReport()
    evs: dict[tuple[Any, ...], _Evaluator] = {}
    runner = Jobs(ray=ray, address=address, processes=processes)

    def ev_for(env: dict[str, tuple[int, ...]]) -> _Evaluator:
        k = tuple(sorted(env.items()))
        if k not in evs:
            evs[k] = _Evaluator(env, fspecs, seed)
        return evs[k]

    with Progress(progress, "synthesize") as prog, runner:
        t0 = time.perf_counter()
        proposals: list[Proposal] = []
        for i, env in enumerate(envs):
            prog.update(f"enumerating environment {i + 1}/{len(envs)}")
            classes, n = enumerate_classes(env, ops, depth, ev_for(env), constants, max_terms)
            rep.terms += n
            rep.classes += sum(1 for m in classes.values() if len(m) > 1)
            proposals += propose(classes, env)
        proposals = _dedup(proposals)
        rep.proposed = len(proposals)
        rep.seconds["enumerate"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        admitted: list[Rule] = []
        made: set[tuple[Any, ...]] = set()
        todo = list(proposals)
        attempts = 0
        n_rule = 0
        while todo and (max_proofs is None or attempts < max_proofs):
            if time_budget_s is not None and time.perf_counter() - t_all > time_budget_s:
                rep.untried = len(todo)
                log.warning("synthesize: time budget (%.0f s) spent; %d proposals not tried", time_budget_s, len(todo))
                break
            # drop proposals the admitted rules derive
            # (a window of the next proposals: checking them all each round would cost more than proving)
            want = batch if max_proofs is None else min(batch, max_proofs - attempts)
            take: list[Proposal] = []
            while todo and len(take) < want:
                window, todo = todo[:3 * want], todo[3 * want:]
                if admitted:
                    pairs = [(pr.lhs, pr.rhs, [(v, TensorType(s, float32)) for v, s in pr.env]) for pr in window]
                    ok = derives(admitted, pairs, steps=filter_steps)
                    rep.derivable += sum(ok)
                    window = [pr for pr, d in zip(window, ok, strict=True) if not d]
                need = want - len(take)
                take += window[:need]
                todo = window[need:] + todo
            rules: list[Rule] = []
            for pr in take:
                r = to_rule(pr, f"syn-{n_rule}", ev_for)
                n_rule += 1
                if isinstance(r, str):
                    rep.skipped.append((f"{pr.lhs} -> {pr.rhs}", r))
                elif (r.lhs, r.rhs, r.guards) not in made:  # (proposals differing in one axis generalise alike)
                    made.add((r.lhs, r.rhs, r.guards))
                    rules.append(r)
            # the proofs of a batch are independent jobs
            verdicts = runner.map(_prove, [(r, timeout_s) for r in rules])
            attempts += len(take)
            for r, (kind, why) in zip(rules, verdicts, strict=True):
                if kind == "Proved":
                    admitted.append(r)
                    rep.proved.append(str(r))
                elif kind == "Refuted":
                    rep.refuted.append((str(r), why))
                else:
                    rep.unknown.append((str(r), why))
            prog.update(f"proved {len(admitted)} of {attempts} tried, {len(todo)} proposals left",
                        completed=len(proposals) - len(todo), total=len(proposals))
        rep.seconds["prove"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        prog.update(f"minimizing {len(admitted)} rules")
        kept = minimize(admitted, steps=minimize_steps)
        rep.minimized_away = [r.name for r in admitted if r not in kept]
        rep.seconds["minimize"] = time.perf_counter() - t0
    rep.seconds["total"] = time.perf_counter() - t_all
    log.info("%s", rep)
    return SynthesizedRuleset(name, tuple(kept), rep)


def minimize(rules: Sequence[Rule], *, steps: int = 4, chunk: int = 16) -> list[Rule]:
    """A subset of ``rules`` that derives every rule of ``rules`` (within ``steps`` egglog rounds each).

    A forward pass keeps a rule only if the rules kept before its chunk do not derive it (in the given order:
    smallest first); a backward pass then drops, ``chunk`` rules at a time (largest first), each rule that the
    kept rules outside its chunk derive. (Chunks share one e-graph per input signature: far fewer egglog
    runs than one per rule, at the price of a slightly larger set.)
    """
    kept: list[Rule] = []
    for k in range(0, len(rules), chunk):  # forward, a chunk at a time: dropped if the rules kept before derive it
        part = list(rules[k:k + chunk])
        if kept:
            part = [r for r, d in zip(rules[k:k + chunk], _derived_flags(kept, rules[k:k + chunk], steps), strict=True)
                    if not d]
        kept += part
    order = sorted(kept, key=lambda r: (-len(r.guards), -len(str(r.lhs)), r.name))
    for k in range(0, len(order), chunk):  # backward: a chunk the kept rules outside it derive is dropped
        part = order[k:k + chunk]
        rest = [o for o in kept if o not in part]
        if not rest:
            continue
        for r, d in zip(part, _derived_flags(rest, part, steps), strict=True):
            if d:
                kept.remove(r)
    return kept


def _derived_flags(rules: Sequence[Rule], targets: Sequence[Rule], steps: int) -> list[bool]:
    """For each target: whether ``rules`` derive it on every one of its author instances (one egglog run per
    input signature for all targets together)."""
    pairs: list[tuple[Term, Term, list[tuple[str, TensorType]]]] = []
    owner: list[int] = []
    for i, r in enumerate(targets):
        for p in rule_pairs(r):
            pairs.append(p)
            owner.append(i)
    flags = [True] * len(targets)
    for i, ok in zip(owner, derives(rules, pairs, steps=steps), strict=True):
        flags[i] = flags[i] and ok
    return flags


def in_scope(rule: Rule, ops: Iterable[str]) -> bool:
    """Whether every op of the rule's two sides is in ``ops``."""
    allowed = set(ops)

    def ops_of(p: Pat | PVar) -> set[str]:
        if isinstance(p, PVar):
            return set()
        out = {p.op}
        for a in p.args:
            out |= ops_of(a)
        return out

    return (ops_of(rule.lhs) | ops_of(rule.rhs)) <= allowed


def rediscovered(rs: Ruleset, targets: Sequence[Rule], *, steps: int = 4) -> dict[str, bool]:
    """For each target rule: whether ``rs`` contains or derives it (on each of its author instances)."""
    return {t.name: rule_derived(list(rs.rules), t, steps=steps) for t in targets}


__all__ = ["DEFAULT_OPS", "DEFAULT_SHAPES", "FieldSpec", "Jobs", "Proposal", "SynthesisReport", "SynthesizedRuleset",
           "derives", "in_scope", "minimize", "pmap", "rediscovered", "rule_derived", "synthesize"]
