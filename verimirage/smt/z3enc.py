"""Z3 queries over canonical abstract expressions.

An equivalence query states that, for one output on one box of indices, the
two canonical expressions differ. Atoms (input elements, sums, exps, maxes,
sqrt, inv, uninterpreted functions) become real variables, numbered in
canonical order, so re-deriving the expressions reproduces the query text
exactly. A negative power of an atom uses an inverse variable with the named
fact ``inv:<n>`` (``x * x_inv = 1``); an exp or sqrt atom gets the named fact
``pos:<n>`` (``x > 0``). Powers are taken of the gcd of an atom's exponents and
never past :data:`verimirage.smt.limits.MAX_POWER` copies (see
:func:`_encode_atoms`), so a constant such as ``1/sqrt(96)`` in ``exp(c*m)``
costs one variable, not a power loop. The query is unsat exactly when the two expressions
are the same rational function of the atoms; its unsat core names the facts it
used. Every query is named, time-limited and dumpable as SMT-LIB2.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import z3

from . import expr as E
from . import limits

z3.set_param("memory_max_size", limits.Z3_MEMORY_MB)  # (Z3's memory cap, for the process)


@dataclass(frozen=True)
class Query:
    """A named Z3 query: its SMT-LIB2 text, expected and actual result, unsat core and time."""

    name: str
    smt2: str
    expected: str
    result: str
    core: tuple[str, ...]
    seconds: float


def _atoms(p: E.Poly, acc: dict[str, tuple[Any, set[Fraction]]]) -> None:
    for m, _ in p[1]:
        for a, e in m:
            k = E.key_of(a)
            if k not in acc:
                acc[k] = (a, set())
            acc[k][1].add(Fraction(e))


def _gcd(es: set[Fraction]) -> Fraction:
    """The largest rational ``g > 0`` of which every exponent in ``es`` is an integer multiple: the gcd of the
    numerators over the lcm ``L`` of the denominators (coprime, each exponent being in lowest terms: its
    denominator is ``L``)."""
    num, den = 0, 1
    for e in es:
        num = math.gcd(num, e.numerator)
        den = den * e.denominator // math.gcd(den, e.denominator)
    return Fraction(num, den)


def _encode_atoms(order: list[str], atoms: dict[str, tuple[Any, set[Fraction]]]) -> tuple[
        dict[str, Any], list[tuple[str, z3.BoolRef]]]:
    """Per atom key, a function from an exponent to its Z3 term; and the named facts.

    An atom whose exponents are the integer multiples ``k_i * g`` of ``g = 1/lcm(denominators)``, or
    else of their gcd ``g``, with every
    ``|k_i| <= MAX_POWER`` is one variable ``x = atom**g`` (and ``x_inv`` with the fact ``inv:<n>``,
    ``x * x_inv = 1``, if some ``k_i < 0``); ``atom**e`` is a product of ``|e/g|`` copies. Otherwise
    (``exp(c * m)`` next to ``exp(m)`` with ``c`` an exact binary fraction; ``x**(2**40)``) every
    exponent ``|e|`` is its own variable (and inverse): a polynomial identity in independent variables
    holds for every value they stand for, so this proves less but never more. ``exp`` and ``sqrt``
    atoms get ``pos:<n>`` facts (``x > 0``) on their variables.
    """
    enc: dict[str, Any] = {}
    facts: list[tuple[str, z3.BoolRef]] = []
    for n, k in enumerate(order):
        a, es = atoms[k]
        g = Fraction(1, _gcd(es).denominator)
        if max(abs(e / g) for e in es) > limits.MAX_POWER:
            g = _gcd(es)
        pos = a[0] in ("exp", "sqrt")
        if max(abs(e / g) for e in es) <= limits.MAX_POWER:
            x = z3.Real(f"x{n}")
            xi = None
            if any(e < 0 for e in es):
                xi = z3.Real(f"x{n}_inv")
                facts.append((f"inv:{n}", x * xi == 1))
            if pos:
                facts.append((f"pos:{n}", x > 0))

            def power(e: Fraction, x: Any = x, xi: Any = xi, g: Fraction = g) -> Any:
                k = int(e / g)
                base = x if k > 0 else xi
                t = base
                for _ in range(abs(k) - 1):
                    t = t * base
                return t

            enc[k] = power
            continue
        vs: dict[Fraction, tuple[Any, Any]] = {}
        for j, m in enumerate(sorted({abs(e) for e in es})):
            x = z3.Real(f"x{n}_p{j}")
            xi = None
            if -m in es:
                xi = z3.Real(f"x{n}_p{j}_inv")
                facts.append((f"inv:{n}:{j}", x * xi == 1))
            if pos:
                facts.append((f"pos:{n}:{j}", x > 0))
            vs[m] = (x, xi)
        enc[k] = lambda e, vs=vs: vs[abs(e)][0] if e > 0 else vs[abs(e)][1]
    return enc, facts


def equivalence_query(name: str, pa: E.Poly, pb: E.Poly, timeout_s: float = 10.0) -> Query:
    """Ask Z3 whether ``pa != pb`` is satisfiable (expected: unsat).

    :class:`verimirage.smt.expr.ResourceLimit` when the query would have more than
    :data:`verimirage.smt.limits.MAX_QUERY_TERMS` monomial factors.
    """
    t0 = time.perf_counter()
    size = sum(len(m) + 1 for m, _ in pa[1]) + sum(len(m) + 1 for m, _ in pb[1])
    if size > limits.MAX_QUERY_TERMS:
        raise E.ResourceLimit(f"query {name}: {size} monomial factors (cap {limits.MAX_QUERY_TERMS})")
    atoms: dict[str, tuple[Any, set[Fraction]]] = {}
    _atoms(pa, atoms)
    _atoms(pb, atoms)
    order = sorted(atoms)
    enc, facts = _encode_atoms(order, atoms)

    def term(p: E.Poly) -> z3.ArithRef:
        total: Any = z3.RealVal(0)
        for m, c in p[1]:
            t: Any = z3.RealVal(f"{c.numerator}/{c.denominator}")
            for a, e in m:
                t = t * enc[E.key_of(a)](Fraction(e))
            total = total + t
        return total

    goal = term(pa) != term(pb)
    plain = z3.Solver()
    for _, f in facts:
        plain.add(f)
    plain.add(goal)
    smt2 = canonical_smt2(plain.to_smt2())
    s = z3.Solver()
    s.set("timeout", int(timeout_s * 1000))
    for fname, f in facts:
        s.assert_and_track(f, fname)
    s.assert_and_track(goal, "goal")
    r = s.check()
    result = str(r)  # ("unsat", "sat" or "unknown")
    core = tuple(sorted(str(c) for c in s.unsat_core())) if r == z3.unsat else ()
    return Query(name, smt2, "unsat", result, core, time.perf_counter() - t0)


def canonical_smt2(text: str) -> str:
    """SMT-LIB2 text with z3's internal let-names (``?x123``) renumbered by first appearance."""
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"?t{len(names)}")

    return re.sub(r"\?x\d+", rename, text)
