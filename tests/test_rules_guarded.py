"""Rules with value side conditions (issue 21 item 3): the ``Positive`` guard, the e-graph's sign facts, and
the verifier's definedness check on what guarded rules produce."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import verimirage as vm
from verimirage.rewrite.rules import Positive, all_builtin_rules
from verimirage.smt.verdict import Outcome
from verimirage.smt.verify import abstract_check, verify_rule

pytest.importorskip("egglog")

GUARDED = ("log-mul", "log-div", "exp-log")


def _rule(name: str) -> Any:
    return next(r for r in all_builtin_rules() if r.name == name)


@pytest.mark.parametrize("name", GUARDED)
def test_guarded_rule_is_proved_under_its_condition_only(name: str) -> None:
    r = _rule(name)
    assert r.value_guarded
    v = verify_rule(r.name, r.instance_graphs())
    assert isinstance(v, vm.Proved), v.reason
    # the same rule without its value guard: the operands are any reals there, and it is not proved
    bare = dataclasses.replace(r, guards=tuple(g for g in r.guards if not isinstance(g, Positive)))
    v = verify_rule(bare.name, bare.instance_graphs())
    assert not isinstance(v, vm.Proved)


def test_positive_variables_are_exp_of_a_fresh_input_in_the_instances() -> None:
    # every positive real is exp of a real: the instance is the rule for every positive value
    lhs, rhs = _rule("log-mul").instance_graphs(generic=False)[0]
    for g in (lhs, rhs):
        text = str(g)
        assert text.count("exp") == 2 and "input {name='a'}" in text and "input {name='b'}" in text


def test_log_of_a_non_positive_operand_is_not_split() -> None:
    # log(x * y) for inputs x, y: the verifier refuses the split form (definedness), and the search's guard
    # does not fire (no sign fact for an input)
    g = vm.Graph()
    x, y = g.input("x", (3, 4), vm.float32), g.input("y", (3, 4), vm.float32)
    g.output(g.log(g.mul(x, y)))
    h = vm.Graph()
    x2, y2 = h.input("x", (3, 4), vm.float32), h.input("y", (3, 4), vm.float32)
    h.output(h.add(h.log(x2), h.log(y2)))
    r = abstract_check(g, h)
    assert r.outcome == Outcome.UNKNOWN and "definedness" in r.reason
    res = vm.superoptimize(g, rulesets=["softmax"], time_budget_s=30, top_k=2, cache=False)
    assert "log-mul" not in res.report.rules_fired


Build = Callable[[vm.Graph, Callable[[str], Any]], Any]

#: terms the e-graph's sign rules find positive (one per rule kind of verimirage.rewrite.signs)
POSITIVE: dict[str, Build] = {
    "exp": lambda g, i: g.exp(i("x")),
    "sigmoid": lambda g, i: g.sigmoid(i("x")),
    "softplus": lambda g, i: g.softplus(i("x")),
    "rsqrt-of-square-plus-c": lambda g, i: g.rsqrt(g.shift(g.square(i("x")), 1.0)),
    "square-plus-c": lambda g, i: g.shift(g.square(i("x")), 0.5),
    "sum-of-exps": lambda g, i: g.sum(g.exp(i("x")), axis=1),
    "mean-of-exps": lambda g, i: g.mean(g.exp(i("x")), axis=1),
    "max-of-exps": lambda g, i: g.max(g.exp(i("x")), axis=1),
    "mul": lambda g, i: g.mul(g.exp(i("x")), g.sigmoid(i("y"))),
    "div": lambda g, i: g.div(g.exp(i("x")), g.sum(g.exp(i("y")), axis=1)),
    "add-pos-nonneg": lambda g, i: g.add(g.exp(i("x")), g.relu(i("y"))),
    "reciprocal": lambda g, i: g.reciprocal(g.exp(i("x"))),
    "scale": lambda g, i: g.scale(g.exp(i("x")), 2.5),
    "maximum": lambda g, i: g.maximum(g.exp(i("x")), i("y")),
    "transpose": lambda g, i: g.transpose(g.exp(i("x")), 0, 1),
    "matmul": lambda g, i: g.matmul(g.exp(i("x")), g.transpose(g.exp(i("y")), 0, 1)),
    "pow": lambda g, i: g.pow(g.exp(i("x")), 3.0),
}


@pytest.mark.parametrize("case", sorted(POSITIVE))
def test_sign_facts_of_the_egraph_are_definedness_facts_of_the_verifier(case: str) -> None:
    from egglog import EGraph

    from verimirage.rewrite.lift import lift, term_to_egg
    from verimirage.rewrite.signs import sign_rules, t_pos

    def prog(with_log: bool) -> vm.Graph:
        g = vm.Graph()
        ins: dict[str, Any] = {}

        def inp(name: str) -> Any:
            if name not in ins:
                ins[name] = g.input(name, (3, 4), vm.float32)
            return ins[name]

        t = POSITIVE[case](g, inp)
        # t + log(t) - log(t) is t wherever log(t) is defined: the definedness check must know t > 0
        g.output(g.sub(g.add(t, g.log(t)), g.log(t)) if with_log else t)
        return g

    src, cand = prog(False), prog(True)
    # the e-graph's sign rules derive t_pos for the term
    lf = lift(src)
    eg: EGraph = lf.egraph
    from egglog import ruleset

    rs = ruleset(name=f"signs_test_{case.replace('-', '_')}")
    rs.register(*sign_rules())
    eg.run(rs.saturate())
    eg.check(t_pos(term_to_egg(lf.terms[0], {})))
    # and the verifier's definedness check knows the term positive too
    r = abstract_check(src, cand)
    assert r.outcome == Outcome.PROVED, r.reason


def test_sign_rules_find_no_sign_for_an_input_or_a_difference() -> None:
    from egglog import ruleset

    from verimirage.rewrite.lift import lift, term_to_egg
    from verimirage.rewrite.signs import sign_rules, t_pos

    g = vm.Graph()
    x, y = g.input("x", (3, 4), vm.float32), g.input("y", (3, 4), vm.float32)
    g.output(g.sub(g.exp(x), g.exp(y)))
    lf = lift(g)
    rs = ruleset(name="signs_test_negative")
    rs.register(*sign_rules())
    lf.egraph.run(rs.saturate())
    for t in (lf.terms[0], lf.terms[0].args[0].args[0]):  # exp(x) - exp(y), and the input x
        with pytest.raises(Exception):  # noqa: B017 (egglog raises its own check error)
            lf.egraph.check(t_pos(term_to_egg(t, {})))


def test_search_takes_log_of_a_softmax_apart_and_proves_the_candidates() -> None:
    # log(exp(x) / sum(exp(x))): log-div fires (both operands positive by the sign facts), then log-exp;
    # every candidate the search returns is Proved (the definedness check accepts the split logs)
    g = vm.Graph()
    x = g.input("x", (4, 16), vm.float32)
    e = g.exp(x)
    g.output(g.log(g.div(e, g.sum(e, axis=1))))
    res = vm.superoptimize(g, rulesets=["softmax", "algebra"], time_budget_s=60, top_k=3, cache=False)
    assert res.report.rules_fired.get("log-div", 0) > 0 and res.report.rules_fired.get("log-exp", 0) > 0
    assert res.candidates and all(c.verdict.proved for c in res.candidates)
