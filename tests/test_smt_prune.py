"""The pruning query verimirage.smt.prune.may_be_subexpression: conservative, fast, cached."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.benchmarks.designs import DESIGNS, small_design_kw
from verimirage.ir.builders import Tensor
from verimirage.ir.graph import node_list
from verimirage.smt.prune import explain, may_be_subexpression, partial_atoms

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES

F = vm.float16


@pytest.mark.parametrize("name", sorted(DESIGNS))
@pytest.mark.parametrize("small", [True, False], ids=["small", "full"])
@pytest.mark.parametrize("batch", [1, 8])
def test_never_prunes_a_sub_result_of_an_expert_design(name: str, small: bool, batch: int) -> None:
    g = vm.benchmarks.get(name, batch=batch, small=small)
    m = vm.benchmarks.expert(name, g, **(small_design_kw(name) if small else {}))
    assert may_be_subexpression(m, g), explain(m, g)
    # every kernel-level value of the design (and its ancestors), and every block graph alone
    for i, n in enumerate(node_list(m)):
        for k in range(len(n.outs)):
            assert may_be_subexpression(Tensor(m, (i, k)), g)
        if n.op == "custom":
            assert may_be_subexpression(n.attr("block"), g)
    # the suite graph is a sub-result of itself
    assert may_be_subexpression(g, g)


def test_expert_rewrites_of_the_corpus_are_never_pruned() -> None:
    for c in CASES:
        if c.expect == "proved" and not c.cancels:
            a, b = c.a(), c.b()
            assert may_be_subexpression(b, a), (c.name, explain(b, a))
            assert may_be_subexpression(a, b), (c.name, explain(a, b))


def _graph(shapes: dict, body) -> vm.Graph:
    g = vm.Graph()
    ins = [g.input(n, s, F) for n, s in shapes.items()]
    r = body(g, *ins)
    g.output(*(r if isinstance(r, tuple) else (r,)))
    return g


MLP = {"X": (8, 16), "W1": (16, 16), "W2": (16, 16)}
ATT = {"Q": (2, 4, 8), "K": (2, 8, 16), "V": (2, 16, 8)}


def _mlp(g, x, w1, w2):
    return g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2))


def _att(g, q, k, v):
    e = g.exp(g.matmul(q, k))
    return g.matmul(g.div(e, g.sum(e, 2)), v)


def test_prunes_opaque_functions_on_the_wrong_inputs() -> None:
    mlp = _graph(MLP, _mlp)
    assert may_be_subexpression(_graph(MLP, lambda g, x, a, b: g.silu(g.matmul(x, a))), mlp)
    wrong = _graph(MLP, lambda g, x, a, b: g.silu(g.matmul(x, b)))  # silu of the other product
    assert not may_be_subexpression(wrong, mlp)
    assert explain(wrong, mlp) == [("silu", frozenset({"X", "W2"}))]
    # silu is x sigmoid(x) = x / (1 + exp(-x)) (rule silu-def): an exp of silu's argument's inputs is covered,
    # an exp of the other product is not
    assert may_be_subexpression(_graph(MLP, lambda g, x, a, b: g.exp(g.matmul(x, a))), mlp)
    assert not may_be_subexpression(_graph(MLP, lambda g, x, a, b: g.exp(g.matmul(x, b))), mlp)
    assert not may_be_subexpression(_graph(MLP, lambda g, x, a, b: g.gelu(g.matmul(x, a))), mlp)
    # ring operations are never pruned, whatever they combine
    assert may_be_subexpression(_graph(MLP, lambda g, x, a, b: g.matmul(x, g.add(a, b))), mlp)


def test_attention_softmax_forms() -> None:
    att = _graph(ATT, _att)
    # the stable form (a max subtracted before exp) is part of an equal program: the shift
    stable = _graph(ATT, lambda g, q, k, v: g.exp(g.sub(g.matmul(q, k), g.max(g.matmul(q, k), 2))))
    assert may_be_subexpression(stable, att)
    # exp of Q against V (wrong operand) cannot be
    qv = _graph(ATT, lambda g, q, k, v: g.exp(g.matmul(q, g.transpose(v, 1, 2))))
    assert not may_be_subexpression(qv, att)
    # a tensor query looks at that value's ancestors only
    h = vm.Graph()
    q, k, v = (h.input(n, s, F) for n, s in ATT.items())
    good = h.exp(h.matmul(q, k))
    bad = h.silu(v)
    h.output(good, bad)
    assert may_be_subexpression(good, att)
    assert not may_be_subexpression(bad, att)
    assert not may_be_subexpression(h, att)


def test_partial_atoms_see_inside_blocks_and_loops() -> None:
    g = vm.benchmarks.get("gqa_stable", batch=1, small=True)
    m = vm.benchmarks.expert("gqa_stable", g, **small_design_kw("gqa_stable"))
    fams = {f for f, _ in partial_atoms(m)}
    assert {"exp", "max"} <= fams
    r = vm.benchmarks.get("rmsnorm_linear", batch=1, small=True)
    assert partial_atoms(r) == frozenset({("sqrt", frozenset({"X"}))})


def test_bad_arguments() -> None:
    g = _graph(MLP, _mlp)
    with pytest.raises(vm.GraphError, match=r"expected a vm\.Graph"):
        may_be_subexpression(g, "target")  # type: ignore[arg-type]
    with pytest.raises(vm.GraphError, match=r"expected a vm\.Graph"):
        may_be_subexpression(3, g)
