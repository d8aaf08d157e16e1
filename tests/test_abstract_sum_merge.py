"""Finding (issue 22, layernorm_linear): the LayerNorm-then-GEMM cut was rejected with "z3 says sat" while the
finite-field trials agreed. The abstract normaliser merged adjacent ranges of a sum only in monomials holding
exactly one sum: the mean times a K-tiled column sum, ``sum_k(X) * sum_[0,t)(G W) + sum_[t,2t)(G W) *
sum_k(X)``, stayed two terms. Now every sum factor of a monomial is tried (the merge is sound whatever the
other factors are); wrong programs of the same shape are still not proved.
"""

from __future__ import annotations

from fractions import Fraction

import verimirage as vm
from verimirage.ir.builders import BlockBuilder
from verimirage.ir.graph import MuGraph
from verimirage.ir.ops import TensorType
from verimirage.smt import expr as E
from verimirage.smt.verify import abstract_check

F16 = vm.float16


def _reference() -> vm.Graph:
    g = vm.Graph()
    x, gg, w = g.input("X", (2, 8), F16), g.input("G", (8,), F16), g.input("W", (8, 4), F16)
    g.output(g.matmul(g.mul(g.sub(x, g.mean(x, axis=1)), gg), w))
    return g


def _cut(*, frange: int = 2, mean_scale: float = 1 / 8) -> MuGraph:
    """Kernel 1: the centred, scaled rows; kernel 2: the GEMM with K walked in ``frange`` tiles."""
    mg = MuGraph()
    x, gg, w = mg.input("X", (2, 8), F16), mg.input("G", (8,), F16), mg.input("W", (8, 4), F16)
    b = BlockBuilder((2,), 1)
    xi = b.input(0, TensorType((2, 8), F16), (0,))
    gi = b.input(1, TensorType((8,), F16), (None,))
    b.output(b.mul(b.sub(xi, b.scale(b.sum(xi, axis=1), mean_scale)), gi), (0,))
    (c1,) = mg.custom(b.build(), [x, gg])
    b2 = BlockBuilder((1,), frange)
    wi = b2.input(0, TensorType((8, 4), F16), (1,), 0)
    ci = b2.input(1, TensorType((2, 8), F16), (None,), 1)
    b2.output(b2.loop_sum(b2.matmul(ci, wi)), (1,))
    (o,) = mg.custom(b2.build(), [w, c1])
    mg.output(o)
    return mg


def test_layernorm_cut_z3_sat_while_field_agrees_now_proved() -> None:
    for fr in (2, 4):
        assert abstract_check(_reference(), _cut(frange=fr)).outcome == "proved"
    assert isinstance(vm.verify(_reference(), _cut()), vm.Proved)


def test_wrong_mean_in_a_tiled_cut_is_not_proved() -> None:
    assert abstract_check(_reference(), _cut(mean_scale=1 / 7)).outcome != "proved"
    assert not isinstance(vm.verify(_reference(), _cut(mean_scale=1 / 7)), vm.Proved)


def _sum(lo: int, hi: int, name: str) -> E.Poly:
    v = E.der().fresh(lo, hi)
    return E.p_sum(v, E.p_atom(("in", name, (E.a_var(v),))))


def test_merge_needs_adjacent_ranges_and_equal_coefficients() -> None:
    tok = E.activate(E.Derivation())
    try:
        full = _sum(0, 8, "X")
        a, b = _sum(0, 4, "G"), _sum(4, 8, "G")
        merged = E.p_add(E.p_mul(a, full), E.p_mul(full, b))
        assert merged == E.p_mul(_sum(0, 8, "G"), full)
        gap = E.p_add(E.p_mul(a, full), E.p_mul(full, _sum(5, 8, "G")))
        assert gap != E.p_mul(_sum(0, 8, "G"), full) and len(gap[1]) == 2
        uneven = E.p_add(E.p_mul(a, full), E.p_scale(E.p_mul(full, b), Fraction(2)))
        assert len(uneven[1]) == 2
    finally:
        E.deactivate(tok)
