"""The search's direct graph steps (rewrite/stabilise.py): the max-shifted softmax / logsumexp, and row
constants hoisted out of reductions (the loop-friendly cross-entropy)."""

from __future__ import annotations

import pytest

import verimirage as vm
from verimirage.benchmarks.models import get_model
from verimirage.benchmarks.models import logsumexp as lse
from verimirage.ir.graph import node_list
from verimirage.rewrite.stabilise import hoist_row_constants, logsumexp_sites, stabilise_softmax

F = vm.float32


def test_stabilised_logsumexp_adds_the_max_back() -> None:
    # regression (the step subtracted the row max inside exp and never added it back after the log: the
    # cross-entropy search lowered and verified such graphs, each Refuted with a float64 witness)
    g = vm.Graph()
    x, t = g.input("X", (4, 32), F), g.input("T", (4, 32), F)
    nll = g.sum(g.mul(t, g.sub(lse(g, x, 1, stable=False), x)), axis=1)
    g.output(g.mean(nll, axis=0))
    assert logsumexp_sites(g)
    gs = stabilise_softmax(g)
    assert gs is not None and any(n.op == "max" for n in node_list(gs))
    assert isinstance(vm.verify(g, gs), vm.Proved)


def test_stabilised_softmax_has_no_logsumexp_site() -> None:
    g = vm.Graph()
    x = g.input("X", (4, 32), F)
    e = g.exp(x)
    g.output(g.div(e, g.sum(e, axis=1)))
    assert not logsumexp_sites(g)
    gs = stabilise_softmax(g)
    assert gs is not None and isinstance(vm.verify(g, gs), vm.Proved)


def test_cross_entropy_hoisted_reads_the_logsumexp_only_after_the_row() -> None:
    g = get_model("cross_entropy", small=True)
    h = hoist_row_constants(g)
    assert h is not None
    assert isinstance(vm.verify(g, h), vm.Proved)
    # no elementwise op of the hoisted graph reads the logsumexp (the (4, 1) value after the log) together with
    # a full-width value: the row's reductions all come before it
    nodes = node_list(h)
    after_log = {i for i, n in enumerate(nodes) if n.op == "log"}
    for i, n in enumerate(nodes):
        if any(a in after_log for a, _ in n.args):
            after_log.add(i)
            assert n.outs[0].shape[1] == 1, n
    # the three sign forms all hoist, and each is the same function
    for body in (lambda g, t, x, c: g.mul(t, g.sub(c, x)), lambda g, t, x, c: g.mul(g.neg(g.sub(x, c)), t),
                 lambda g, t, x, c: g.mul(t, g.sub(x, c))):
        k = vm.Graph()
        x, t = k.input("X", (4, 32), F), k.input("T", (4, 32), F)
        k.output(k.sum(body(k, t, x, k.max(x, axis=1)), axis=1))
        hk = hoist_row_constants(k)
        assert hk is not None and isinstance(vm.verify(k, hk), vm.Proved)


def test_hoisting_leaves_centred_squares_and_plain_row_constants_alone() -> None:
    g = vm.Graph()
    x = g.input("X", (4, 32), F)
    d = g.sub(x, g.mean(x, axis=1))
    g.output(g.sum(g.mul(d, d), axis=1))  # a variance: t = d reads the mean
    assert hoist_row_constants(g) is None
    h = vm.Graph()
    x, t, c = h.input("X", (4, 32), F), h.input("T", (4, 32), F), h.input("C", (4, 1), F)
    h.output(h.sum(h.mul(t, h.sub(c, x)), axis=1))  # c an input: known before the row's pass
    assert hoist_row_constants(h) is None


@pytest.mark.slow
def test_cross_entropy_search_reaches_the_streaming_form() -> None:
    # full size (16 x 32000): the hoisted form's one-pass lowerings (online softmax over the vocabulary,
    # a loop per row) are among the verified candidates; the unhoisted form has none (the logsumexp is
    # read at every element)
    g = get_model("cross_entropy", small=False)
    res = vm.superoptimize(g, time_budget_s=300, top_k=4, cache=False)
    streaming = [c for c in res.candidates if "partition.online_softmax" in c.rules]
    assert streaming and all(c.verdict.proved and "sum-factor-out" in c.rules for c in streaming)
