"""Issue 27 item 1: refinement. Proved needs the candidate defined wherever the source is.

The corpus (tests/cases/corpus.py, ``definedness_*``) holds the end-to-end cases in both directions; these
tests cover the registry and the sign analysis.
"""

from __future__ import annotations

from fractions import Fraction

import verimirage as vm
from verimirage.ir.ops import OPS
from verimirage.smt import abstract  # noqa: F401  (registers the abstract meanings)
from verimirage.smt import defined as D
from verimirage.smt import expr as E

F = vm.float16


def test_every_op_with_an_abstract_meaning_has_a_definedness_rule() -> None:
    missing = [n for n, o in OPS.items() if "abstract" in o.domains and n not in D.RULES]
    assert missing == [], f"add a rule in verimirage/smt/defined.py for {missing}"


def _x(name: str = "X") -> E.Poly:
    return E.p_atom(("in", name, ()))


def _signs(facts: dict | None = None) -> D.Signs:
    return D.Signs([], facts or {})


def test_structural_signs() -> None:
    tok = E.activate(E.Derivation())
    try:
        x, y = _x(), _x("Y")
        s = _signs()
        assert s.of(E.p_exp(x)) == D.POS
        assert s.of(E.p_mul(x, x)) == D.NONNEG
        assert s.of(E.p_add(E.p_mul(x, x), E.p_const(Fraction(1, 10**6)))) == D.POS
        assert s.of(E.p_add(E.p_mul(x, x), E.p_mul(y, y))) == D.NONNEG
        assert s.of(x) == 0
        assert s.of(E.p_add(x, E.p_const(1))) == 0
        assert s.of(E.p_scale(E.p_exp(x), -1)) == D.NONZERO
        assert s.of(E.p_sqrt(x)) == D.NONNEG
        # a fact about the argument of sqrt
        assert _signs({x: D.POS}).of(E.p_sqrt(x)) == D.POS
        # (x + y)**2 expanded has a cross term: its sign comes from its provenance
        xy = E.p_add(x, y)
        sq = E.p_mul(xy, xy)
        assert _signs().of(sq) == 0
        assert D.Signs([{sq: [(D.s_square, {}, (xy,))]}], {}).of(sq) == D.NONNEG
    finally:
        E.deactivate(tok)


def test_an_op_without_a_rule_is_unknown(monkeypatch) -> None:
    monkeypatch.delitem(D.RULES, "exp")
    g = vm.Graph()
    g.output(g.exp(g.input("X", (4, 4), F)))
    v = vm.verify(g, g)
    assert isinstance(v, vm.Unknown)
    assert "definedness rule" in v.reason


def test_reason_names_the_op_and_the_condition() -> None:
    g, h = vm.Graph(), vm.Graph()
    x = g.input("X", (4, 4), F)
    g.output(g.add(x, g.sub(x, x)))
    x2 = h.input("X", (4, 4), F)
    h.output(h.mul(x2, h.mul(h.sqrt(x2), h.rsqrt(x2))))
    v = vm.verify(g, h)
    assert isinstance(v, vm.Unknown)
    assert "sqrt needs" in v.reason and ">= 0" in v.reason
