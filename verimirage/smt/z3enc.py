"""Z3 queries over canonical abstract expressions.

An equivalence query states that, for one output on one box of indices, the
two canonical expressions differ. Atoms (input elements, sums, exps, maxes,
sqrt, inv, uninterpreted functions) become real variables, numbered in
canonical order, so re-deriving the expressions reproduces the query text
exactly. A negative power of an atom uses an inverse variable with the named
fact ``inv:<n>`` (``x * x_inv = 1``); an exp or sqrt atom gets the named fact
``pos:<n>`` (``x > 0``). The query is unsat exactly when the two expressions
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


def _lcm_den(es: set[Fraction]) -> int:
    out = 1
    for e in es:
        out = out * e.denominator // math.gcd(out, e.denominator)
    return out


def equivalence_query(name: str, pa: E.Poly, pb: E.Poly, timeout_s: float = 10.0) -> Query:
    """Ask Z3 whether ``pa != pb`` is satisfiable (expected: unsat)."""
    t0 = time.perf_counter()
    atoms: dict[str, tuple[Any, set[Fraction]]] = {}
    _atoms(pa, atoms)
    _atoms(pb, atoms)
    order = sorted(atoms)
    xs: dict[str, z3.ArithRef] = {}
    xis: dict[str, z3.ArithRef] = {}
    scale: dict[str, int] = {}
    facts: list[tuple[str, z3.BoolRef]] = []
    for n, k in enumerate(order):
        a, es = atoms[k]
        scale[k] = _lcm_den(es)
        xs[k] = z3.Real(f"x{n}")
        if any(e < 0 for e in es):
            xis[k] = z3.Real(f"x{n}_inv")
            facts.append((f"inv:{n}", xs[k] * xis[k] == 1))
        if a[0] in ("exp", "sqrt"):
            facts.append((f"pos:{n}", xs[k] > 0))

    def term(p: E.Poly) -> z3.ArithRef:
        total: Any = z3.RealVal(0)
        for m, c in p[1]:
            t: Any = z3.RealVal(f"{c.numerator}/{c.denominator}")
            for a, e in m:
                k = E.key_of(a)
                power = int(e * scale[k])
                base = xs[k] if power > 0 else xis[k]
                for _ in range(abs(power)):
                    t = t * base
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
    result = _res(r)
    core = tuple(sorted(str(c) for c in s.unsat_core())) if r == z3.unsat else ()
    return Query(name, smt2, "unsat", result, core, time.perf_counter() - t0)


def canonical_smt2(text: str) -> str:
    """SMT-LIB2 text with z3's internal let-names (``?x123``) renumbered by first appearance."""
    names: dict[str, str] = {}

    def rename(m: re.Match) -> str:
        return names.setdefault(m.group(0), f"?t{len(names)}")

    return re.sub(r"\?x\d+", rename, text)


def _res(r: Any) -> str:
    if r == z3.unsat:
        return "unsat"
    if r == z3.sat:
        return "sat"
    return "unknown"


def check_smt2(text: str, timeout_s: float = 10.0) -> str:
    """Re-check an SMT-LIB2 query text in a fresh solver: ``"unsat"``, ``"sat"`` or ``"unknown"``."""
    s = z3.Solver()
    s.set("timeout", int(timeout_s * 1000))
    s.from_string(text)
    r = s.check()
    return _res(r)
