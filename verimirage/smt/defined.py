"""Definedness: the candidate must be defined wherever the source is (refinement, as Alive2 reads it).

The abstract-expression check proves "the same rational function of the atoms", which cancels ``t * t**-1``: ``Y + X/X``
and ``Y + 1`` normalise alike, though the first is undefined where ``X = 0``. Proved also needs that every partial op
the candidate applies is inside its domain wherever the source's are: the candidate may be *more* defined than the
source, never less. A program is read with partial ops outside their domain as undefined (like undefined behaviour),
whether or not a float evaluation would happen to absorb the resulting inf.

Registry
--------
Every op with an ``"abstract"`` meaning has a :class:`Rule` here (:func:`rule`): the conditions its elements need
(``div``: divisor ``!= 0``; ``sqrt``: argument ``>= 0``; ``rsqrt``, ``log``: argument ``> 0``; ``reciprocal``, ``pow``:
by exponent), and a sign rule (what the signs of the operands tell about the result's sign: ``exp`` is ``> 0``,
``square`` ``>= 0``, a sum of positives positive, ...). An op without a rule makes the abstract check ``Unknown`` (a new
op is never silently taken as total). A composite op (:data:`verimirage.ir.interpret.COMPOSITES`: ``rms_norm``,
``silu``, ...) has the rules of the ops of its composition.

While a program's expressions are derived (:mod:`verimirage.smt.abstract`), each element of an op with a rule records
its conditions and its provenance (the op and its operands' expressions) in the active derivation.

The check (:func:`refines`)
---------------------------
Each condition of the candidate is normalised into *claims* (``c * m * P != 0`` becomes ``a != 0`` for each atom ``a``
of ``m`` and ``P != 0``; a positive constant factor is dropped from ``> 0``, ``>= 0``; an exp factor from any claim) and
each claim must be

1. proved by signs: structurally (``exp(..) > 0``, even powers ``>= 0``, sums and maxes of positives, ``sqrt``, positive
   constants) or through the provenance of an expression (``mean(x**2) + eps`` with ``eps > 0`` is ``> 0`` even once
   ``x**2`` is expanded), with the source's own claims as facts; a partial op's sign holds only where it is defined
   (``1 / (1 / x)`` is ``x``, 0 at ``x = 0``): only the source's, outside ``where`` branches, of no bound index; or
2. a claim of the source (a condition of a source op the output reads, not one inside a ``where`` branch) on the same
   expression, at least as strong (``> 0`` gives ``>= 0`` and ``!= 0``), over a range of each bound index containing the
   candidate's (bound indices are matched up to renaming and a shift).

Otherwise the verdict is ``Unknown``, naming the op and its condition."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from . import expr as E

#: sign facts, as bits: ``>= 0`` and ``!= 0`` (both: ``> 0``)
NONNEG, NONZERO = 1, 2
POS = NONNEG | NONZERO

#: what a condition kind needs of its expression
NEED = {"gt0": POS, "ge0": NONNEG, "ne0": NONZERO}
_SHOW = {"gt0": "> 0", "ge0": ">= 0", "ne0": "!= 0"}

Conds = Callable[[Sequence[E.Poly], dict[str, Any]], list[tuple[str, E.Poly]]]
SignRule = Callable[[Sequence[int], dict[str, Any]], int]


@dataclass(frozen=True)
class Rule:
    """The definedness of one op: the conditions of its elements (None: total) and its sign rule."""

    conds: Conds | None = None
    sign: SignRule | None = None


RULES: dict[str, Rule] = {}


def rule(*ops: str, conds: Conds | None = None, sign: SignRule | None = None) -> None:
    """Register the definedness (conditions, sign rule) of ``ops``."""
    for op in ops:
        RULES[op] = Rule(conds, sign)


# --------------------------------------------------------------------------- recording (during derivation)


@dataclass(frozen=True)
class Cond:
    """A condition recorded while deriving: ``poly kind 0`` for every value of its free indices."""

    kind: str  # "gt0" | "ge0" | "ne0"
    poly: E.Poly
    op: str
    guarded: bool  # recorded inside a branch of a ``where`` (not a requirement of the whole program)


@dataclass
class Defs:
    """What one derivation recorded: conditions, provenance of expressions, index ranges."""

    conds: tuple[Cond, ...]
    prov: dict[E.Poly, list[tuple[SignRule, dict[str, Any], tuple[E.Poly, ...]]]]
    ranges: dict[str, tuple[int, int]]


def note(op: str, r: Rule, attrs: dict[str, Any], xs: Sequence[E.Poly], res: E.Poly) -> None:
    """Record the conditions and provenance of one element of ``op`` (operands ``xs``, result ``res``)."""
    d = E.der()
    if r.conds is not None:
        for kind, p in r.conds(xs, attrs):
            d.conds.append(Cond(kind, p, op, d.guard > 0))
    if r.sign is not None and (r.conds is None or not d.guard):  # (a partial op's sign holds where it is defined)
        provenance(res, r.sign, xs, attrs)


def provenance(res: E.Poly, sign: SignRule, xs: Sequence[E.Poly], attrs: dict[str, Any] | None = None) -> None:
    """Record that ``res`` was computed from ``xs`` by an op whose sign rule is ``sign``."""
    if len(lst := E.der().prov.setdefault(res, [])) < 4:
        lst.append((sign, attrs or {}, tuple(xs)))


def defs_of(d: E.Derivation) -> Defs:
    """The definedness record of a finished derivation."""
    return Defs(tuple(dict.fromkeys(d.conds)), d.prov, d.ranges)


# --------------------------------------------------------------------------- sign rules of the ops


def _all(ss: Sequence[int]) -> int:
    return functools.reduce(int.__and__, ss, POS)


def s_add(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """A sum: ``>= 0`` if every operand is; ``> 0`` if also one of them is."""
    if _all(ss) & NONNEG:
        return NONNEG | (NONZERO if any(s == POS for s in ss) else 0)
    return 0


def s_mul(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """A product (or a quotient, its divisor being non-zero): bitwise ``and`` of the operands' signs."""
    return _all(ss)


def s_div(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``a / b`` (``b != 0``): ``!= 0`` if ``a`` is; ``>= 0`` if both are."""
    return (ss[0] & NONZERO) | (ss[0] & ss[1] & NONNEG)


def s_max(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """A max: ``> 0`` if an operand is; ``>= 0`` if an operand is."""
    if any(s == POS for s in ss):
        return POS
    return NONNEG if any(s & NONNEG for s in ss) else 0


def s_min(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """A min (or a sum or max over a non-empty range of its one operand, a body): ``> 0`` if every operand is;
    ``>= 0`` if every operand is."""
    a = _all(ss)
    return a if a & NONNEG else 0


def s_same(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """The operand's sign (tanh, erf, silu, gelu: same sign as the argument)."""
    return ss[0]


def s_square(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``x**2 >= 0``, ``> 0`` if ``x != 0``."""
    return NONNEG | (ss[0] & NONZERO)


def s_sqrt(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``sqrt(x) >= 0``, ``> 0`` if ``x > 0``."""
    return NONNEG | (NONZERO if ss[0] == POS else 0)


def s_scale(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``c * x``."""
    c = float(attrs["c"])
    return ss[0] if c > 0 else (ss[0] & NONZERO if c < 0 else NONNEG)


def s_shift(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``x + c``."""
    c = float(attrs["c"])
    if c > 0:
        return POS if ss[0] & NONNEG else 0
    return ss[0] if c == 0 else 0


def s_recip(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``1 / x`` (``x != 0``)."""
    return NONZERO | (ss[0] & NONNEG)


def s_where(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``where(m, a, b)`` is ``a`` or ``b``."""
    return ss[1] & ss[2]


def s_clamp(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``min(max(x, lo), hi)``: at least ``lo``."""
    lo = float(attrs["lo"])
    return POS if lo > 0 else (NONNEG if lo == 0 else 0)


def s_pow(ss: Sequence[int], attrs: dict[str, Any]) -> int:
    """``x ** c`` (an exponent with no composition: an integer above POW_EXACT_MAX or a fraction but +-0.5)."""
    c = float(attrs["c"])
    if c.is_integer():
        if int(c) % 2 == 0:
            return NONNEG | (ss[0] & NONZERO) if c > 0 else POS
        return ss[0] if c > 0 else NONZERO | (ss[0] & NONNEG)
    return POS if c < 0 else NONNEG | (NONZERO if ss[0] == POS else 0)


def c_pow(xs: Sequence[E.Poly], attrs: dict[str, Any]) -> list[tuple[str, E.Poly]]:
    """``x ** c``: ``x != 0`` for negative integer ``c``; ``x >= 0`` (``> 0`` if ``c < 0``) for fractional ``c``."""
    c = float(attrs["c"])
    if c.is_integer():
        return [("ne0", xs[0])] if c < 0 else []
    return [("gt0" if c < 0 else "ge0", xs[0])]


rule("add", sign=s_add)
rule("sub")
rule("mul", sign=s_mul)
rule("div", conds=lambda xs, at: [("ne0", xs[1])], sign=s_div)
rule("maximum", sign=s_max)
rule("minimum", sign=s_min)
rule("exp", "sigmoid", "softplus", sign=lambda ss, at: POS)
rule("relu", "step", "greater", sign=lambda ss, at: NONNEG)
rule("abs", sign=s_square)
rule("tanh", "erf", "silu", "gelu", sign=s_same)  # (tanh, silu: composite, this sign fact beside their composition's)
rule("leaky_relu", "cast", "sin", "cos")
rule("square", sign=s_square)
rule("sqrt", conds=lambda xs, at: [("ge0", xs[0])], sign=s_sqrt)
rule("rsqrt", conds=lambda xs, at: [("gt0", xs[0])], sign=lambda ss, at: POS)
rule("log", conds=lambda xs, at: [("gt0", xs[0])])
rule("reciprocal", conds=lambda xs, at: [("ne0", xs[0])], sign=s_recip)
rule("pow", conds=c_pow, sign=s_pow)
rule("scale", sign=s_scale)
rule("shift", sign=s_shift)
rule("clamp", sign=s_clamp)
rule("where", sign=s_where)
# not elementwise: total; the reductions and matmul record their results' provenance themselves
rule("sum", "mean", "max", "min", "matmul", "concat", "permute", "reshape", "broadcast_to", "slice", "tril_mask")


# --------------------------------------------------------------------------- signs of expressions


class Signs:
    """Signs of expressions from their structure, their recorded provenance and known facts."""

    def __init__(self, provs: Iterable[dict[E.Poly, list[tuple[SignRule, dict[str, Any], tuple[E.Poly, ...]]]]],
                 facts: dict[E.Poly, int]) -> None:
        self.provs = list(provs)
        self.facts = facts
        self.memo: dict[E.Poly, int] = {}

    def of(self, p: E.Poly) -> int:
        """Sign bits that hold for ``p`` wherever it is defined."""
        s = self.memo.get(p)
        if s is not None:
            return s
        self.memo[p] = 0  # (a cycle through provenance gives nothing)
        s = self.facts.get(p, 0) | self._structural(p)
        if s != POS:
            for prov in self.provs:
                for sign, attrs, xs in prov.get(p, ()):
                    s |= sign([self.of(x) for x in xs], attrs)
        self.memo[p] = s
        return s

    def _structural(self, p: E.Poly) -> int:
        terms = p[1]
        if not terms:
            return NONNEG
        if len(terms) == 1:
            m, c = terms[0]
            if len(m) == 1 and m[0][1] == 1 and c == 1:
                return self._atom(m[0][0])
            return self._term(m, c)
        ss = [self._term(m, c) for m, c in terms]
        return s_add(ss, {})

    def _term(self, m: E.Mono, c: Fraction) -> int:
        if c == 0:
            return NONNEG
        s = self.mono(m)
        return s if c > 0 else s & NONZERO

    def mono(self, m: E.Mono) -> int:
        """Sign bits of a product of atom powers."""
        out = POS
        for a, e in m:
            sa = self.of(E.p_atom(a))
            e = Fraction(e)
            if e.denominator == 1 and e.numerator % 2 == 0:
                f = NONNEG | (sa & NONZERO) if e > 0 else POS
            elif e < 0:
                f = NONZERO | (sa & NONNEG)
            else:
                f = sa
            out &= f
        return out

    def _atom(self, a: E.Atom) -> int:
        tag = a[0]
        if tag == "exp":
            return POS
        if tag == "sum":
            b = self.mono(a[4])
            nonempty = E.a_is_const(a[2]) and E.a_is_const(a[3]) and a[2][1] < a[3][1]
            if b == POS and nonempty:
                return POS
            return NONNEG if b & NONNEG else 0
        if tag == "max":
            return s_max([self.of(it[1] if it[0] == "pt" else it[4]) for it in a[1]], {})
        if tag in ("sqrt", "inv", "fn"):  # an op's atom (a fn's name: the op's, attributes included): its sign rule
            r = RULES.get({"inv": "reciprocal", "fn": str(a[1])}.get(tag, tag))
            return r.sign([self.of(a[-1])], {}) if r is not None and r.sign is not None else 0
        if tag == "cat":
            return _all([self.of(q) for _, _, q in a[2]]) if a[2] else 0
        return 0


# --------------------------------------------------------------------------- claims and their matching


def _claims(kind: str, p: E.Poly) -> list[tuple[str, E.Poly]] | None:
    """``p kind 0`` as simpler claims (None: false, e.g. ``0 != 0``; [] : true). An exp factor common to every
    term is dropped first (``exp(u) * y kind 0`` iff ``y kind 0``: exp is positive)."""
    if p[1]:
        _, m0, _ = E._content(p)
        ex = tuple((a, e) for a, e in m0 if a[0] == "exp")
        if ex:
            p = E.p_mul(p, E.p_mono(E.mono_pow(ex, Fraction(-1))))
    c0 = E.p_is_const(p)
    if c0 is not None:
        ok = {"gt0": c0 > 0, "ge0": c0 >= 0, "ne0": c0 != 0}[kind]
        return [] if ok else None
    if kind == "ne0":
        _, m, rest = E._content(p)
        out = [("ne0", E.p_atom(a)) for a, e in m if e > 0]
        if E.p_is_const(rest) is None:
            out.append(("ne0", rest))
        return out
    lead = abs(p[1][0][1])
    return [(kind, p if lead == 1 else E.p_scale(p, 1 / lead))]


def _is_out(v: str) -> bool:
    return v.startswith("_o")


def _canon(p: E.Poly, ranges: dict[str, tuple[int, int]]) -> list[tuple[str, tuple[tuple[int, int], ...]]] | None:
    """Canonical forms of ``p`` with its bound (non-output) indices renamed and shifted: (text, ranges)."""
    bound = sorted(v for v in E.free_vars(p) if not _is_out(v))
    if not bound:
        return [(E.key_of(p), ())]
    if len(bound) > 3 or any(v not in ranges for v in bound):
        return None
    shifted = p
    rs: dict[str, tuple[int, int]] = {}
    for v in bound:
        offs: set = set()
        bad: list = []
        E._offsets(shifted, v, offs, bad)
        lo, hi = ranges[v]
        if not bad and offs:
            off = sorted(offs, key=E.key_of)[0]
            if E.a_is_const(off):
                shifted = E.subst(shifted, v, E.a_add(E.a_var(v), off, -1))
                lo, hi = lo + off[1], hi + off[1]
        rs[v] = (lo, hi)
    out = []
    for perm in itertools.permutations(bound):
        q = shifted
        for j, v in enumerate(perm):
            q = E.subst(q, v, E.a_var(f"_b{j}"))
        out.append((E.key_of(q), tuple(rs[v] for v in perm)))
    return sorted(out)


_STRONGER = {"gt0": ("gt0",), "ge0": ("gt0", "ge0"), "ne0": ("gt0", "ne0")}


def refines(src: Sequence[Defs], cand: Sequence[Defs]) -> str | None:
    """None when every condition of the candidate derivations ``cand`` is implied (see the module
    docstring) by the source derivations ``src`` of the same output and case; else the reason."""
    tok = E.activate(E.Derivation())  # (normalising claims may merge sums, which logs a law)
    try:
        return _refines(src, cand)
    finally:
        E.deactivate(tok)


def _refines(src: Sequence[Defs], cand: Sequence[Defs]) -> str | None:
    facts: dict[E.Poly, int] = {}
    known: dict[tuple[str, str], list[tuple[tuple[int, int], ...]]] = {}
    for d in src:
        for c in d.conds:
            if c.guarded:
                continue
            for kind, q in _claims(c.kind, c.poly) or ():
                if not any(not _is_out(v) for v in E.free_vars(q)):
                    facts[q] = facts.get(q, 0) | NEED[kind]
                for key, rs in _canon(q, d.ranges) or ():
                    known.setdefault((kind, key), []).append(rs)
    # sqrt(p) != 0 (> 0) says p != 0 (> 0) too: a source dividing by sqrt(x) establishes x > 0 with x >= 0
    for q, s in list(facts.items()):
        if len(q[1]) == 1 and q[1][0][1] == 1 and len(q[1][0][0]) == 1 and q[1][0][0][0][1] == 1:
            a = q[1][0][0][0][0]
            if a[0] == "sqrt" and s & NONZERO:
                facts[a[1]] = facts.get(a[1], 0) | NONZERO
    part = {r.sign for r in RULES.values() if r.conds is not None}  # (partial ops' signs: the source's, as its facts)
    signs = Signs([{p: [t for t in ts if t[0] not in part or (i < len(src) and all(map(_is_out, E.free_vars(p))))]
                    for p, ts in d.prov.items()} for i, d in enumerate([*src, *cand])], facts)
    for d in cand:
        for c in d.conds:
            if signs.of(c.poly) & NEED[c.kind] == NEED[c.kind]:  # (the provenance of the poly before _claims scales it)
                continue
            claims = _claims(c.kind, c.poly)
            if claims is None:
                return f"definedness: the candidate's {c.op} needs {E.pretty(c.poly)[:200]} {_SHOW[c.kind]}: never"
            for kind, q in claims:
                if signs.of(q) & NEED[kind] == NEED[kind]:
                    continue
                if _matched(kind, q, d.ranges, known):
                    continue
                return (f"definedness: the candidate's {c.op} needs {E.pretty(q)[:200]} {_SHOW[kind]}, which the "
                        f"source does not establish (the candidate may be less defined than the source)")
    return None


def _matched(kind: str, q: E.Poly, ranges: dict[str, tuple[int, int]],
             known: dict[tuple[str, str], list[tuple[tuple[int, int], ...]]]) -> bool:
    forms = _canon(q, ranges)
    if forms is None:
        return False
    for key, rs in forms:
        for k2 in _STRONGER[kind]:
            for srs in known.get((k2, key), ()):
                if all(slo <= lo and hi <= shi for (lo, hi), (slo, shi) in zip(rs, srs, strict=True)):
                    return True
    return False


def refines_outputs(src: Sequence[Sequence[Defs]], cand: Sequence[Sequence[Defs]]) -> str | None:
    """:func:`refines` for every output and case (``src[k][ci]``, ``cand[k][ci]``): None, or the first reason."""
    for k, (xs, ys) in enumerate(zip(src, cand, strict=True)):
        for ci, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if (why := refines([x], [y])) is not None:
                return f"output {k} case {ci}: {why}"
    return None
