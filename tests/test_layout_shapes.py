"""E-graph shape rules of the layout ops (issue 21): a term a rule builds through permute / reshape /
broadcast_to / slice gets its rank and dims, so guarded rules apply through layouts."""

from __future__ import annotations

import pytest

pytest.importorskip("egglog")

from egglog import eq, i64
from egglog import ruleset as egg_ruleset

import verimirage as vm
from verimirage.rewrite import lift as L
from verimirage.rewrite.rules import AVar, Instance, PVar, Rule, pat
from verimirage.smt.verify import verify_rule

A = PVar("a")
S, AX, LO, HI = AVar("s"), AVar("ax"), AVar("lo"), AVar("hi")


def _pull(op: str, attrs: dict, inst: Instance) -> Rule:
    """``op(exp(a)) -> exp(op(a))``: the rhs holds a new layout term over ``a``."""
    lhs = pat.__getattr__(op)(pat.exp(A), **attrs)
    rhs = pat.exp(pat.__getattr__(op)(A, **attrs))
    return Rule(f"{op}-exp-pull", lhs, rhs, f"{op}(exp(a)) = exp({op}(a))", "user", (), (inst,))


CASES = [
    ("permute", {"dims": S}, Instance.of({"a": (3, 5, 2)}, s=(2, 0, 1)), {"dims": (2, 0, 1)}, (2, 3, 5)),
    ("reshape", {"shape": S}, Instance.of({"a": (3, 5, 2)}, s=(15, 2)), {"shape": (15, 2)}, (15, 2)),
    ("broadcast_to", {"shape": S}, Instance.of({"a": (3, 1, 2)}, s=(4, 3, 5, 2)), {"shape": (4, 3, 5, 2)},
     (4, 3, 5, 2)),
    ("slice", {"axis": AX, "start": LO, "stop": HI}, Instance.of({"a": (3, 5, 2)}, ax=1, lo=1, hi=4),
     {"axis": 1, "start": 1, "stop": 4}, (3, 3, 2)),
]


@pytest.mark.parametrize(("op", "pattrs", "inst", "attrs", "want"), CASES, ids=[c[0] for c in CASES])
def test_a_layout_term_a_rule_builds_gets_its_shape(op: str, pattrs: dict, inst: Instance, attrs: dict,
                                                    want: tuple[int, ...]) -> None:
    r = _pull(op, pattrs, inst)
    assert verify_rule(r.name, r.instance_graphs()).proved  # data movement commutes with exp
    shape = dict(inst.shapes)["a"]
    # lift op(exp(X)); the rule builds exp(op(X)), whose op(X) is a new term
    g2 = vm.Graph()
    g2.output(g2.apply(op, [g2.exp(g2.input("X", shape, vm.float32))], attrs))
    lf = L.lift(g2)
    eg = lf.egraph
    new = L.egg_apply(op, [L.t_input("X")], attrs)
    eg.run(egg_ruleset(r.egglog()))
    eg.run(L.shapes.saturate())
    assert eg.extract(L.rank(new)).value == len(want)
    assert [eg.extract(L.dim(new, i)).value for i in range(len(want))] == list(want)


def test_a_guarded_rule_applies_through_layout_terms_a_rule_built() -> None:
    """exp-add (guard: its operands have the same rank) fires on ``exp(permute(X) + permute(Y))`` where both
    permutes are new terms a rule built; without permute's shape rule the guard never holds there."""
    from verimirage.rewrite.theories.softmax import RULES

    b, d = PVar("b"), AVar("d")
    push = Rule("permute-add-push", pat.permute(pat.add(A, b), dims=d), pat.add(pat.permute(A, dims=d),
                                                                               pat.permute(b, dims=d)),
                "permute(a + b) = permute(a) + permute(b)", "user", (), (Instance.of({"a": (3, 4), "b": (3, 4)},
                                                                                     d=(1, 0)),))
    assert verify_rule(push.name, push.instance_graphs()).proved
    exp_add = next(x for x in RULES if x.name == "exp-add")
    g = vm.Graph()
    x, y = g.input("X", (3, 4), vm.float32), g.input("Y", (3, 4), vm.float32)
    g.output(g.exp(g.permute(g.add(x, y), (1, 0))))
    eg = L.lift(g).egraph
    rs = egg_ruleset(push.egglog(), exp_add.egglog())
    for _ in range(3):
        eg.run(rs)
        eg.run(L.shapes.saturate())
    px, py = (L.egg_apply("permute", [L.t_input(n)], {"dims": (1, 0)}) for n in "XY")
    root = L.egg_apply("exp", [L.egg_apply("permute", [L.egg_apply("add", [L.t_input("X"), L.t_input("Y")], {})],
                                           {"dims": (1, 0)})], {})
    eg.check(eq(L.rank(px)).to(i64(2)), eq(L.dim(px, 0)).to(i64(4)), eq(L.dim(px, 1)).to(i64(3)))
    eg.check(eq(root).to(L.egg_apply("mul", [L.egg_apply("exp", [px], {}), L.egg_apply("exp", [py], {})], {})))
