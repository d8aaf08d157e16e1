"""Red team, twentieth session: findings (each test fails on the code before its fix).

Composition (``smt.glue.undefined_fed``, trusted): since 186bb75 a value crossing regions need only be defined where
the program is, the program's index-free definedness conditions taken as facts. The conditions of every case of an
output (the boxes of output indices ``derive_all`` splits on, a concatenation's pieces) were pooled as the facts of
that output, so a condition only the elements of one piece need justified a crossing value read by another piece:
``concat([x, sum(log y)])`` with the concat's region μGraph reading the sum in the first piece too
(``x + 0 * s``) checked Proved and was NaN on the first piece (where the program is ``x``) whenever a ``y`` was
negative. Now each output's each case gives its own facts.

Definedness (``smt.defined``, trusted): a claim proved "by signs" through the provenance of an expression (the op that
computed it and its sign rule) took a partial op's sign as holding everywhere, but it holds only where that op is
defined, and the normaliser cancels: ``1 / (1 / x)`` is the polynomial ``x``, whose provenance then said ``x != 0``.

* The candidate's own provenance proved its own conditions: ``x + y`` against ``1 / (1 / x) + (y x) / x`` was Proved
  by ``vm.verify`` (both halves), NaN at ``x = 0`` where the source is ``y``.
* A source's provenance inside a ``where`` branch (a condition there is no requirement of the program) did the same.
* A source's provenance over a bound index (a reduction's) proved a candidate's claim over another range of an index
  of the same name: ``sum(1 / (1 / x[0:2])) + sum(y)`` against ``sum((y x) / x) + sum(1 / (1 / x[0:2]))``.
* In the composition check, an output's provenance at the output's index proved a crossing value's claim at the
  value's own index: ``slice(1 / (1 / x), 0:2)`` split after the first reciprocal, the slice's μGraph reading
  ``r0[3]`` too, checked Proved and was NaN where ``x[3] = 0``.

Now a partial op's sign counts only from the source, outside ``where`` branches, of no bound index, and the
composition check takes no provenance at output indices.

Merged launches (``runtime.merged_config``, 26e3fbb): the regrouped-tile warp cap zipped the members' configurations
with their block graphs strictly, but ``tuning.merge_fits`` (and so the merged mode's codegen and the cost model's
``merged_launches``) calls it without block graphs: two kernels of 16 warps in one dependency level (two whole rows
of 32,768 reduced side by side) raised ValueError out of ``tuned_module(..., "merge")`` and ``vm.compile`` under
``VERIMIRAGE_MERGE=1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.smt.certificate import check_text
from verimirage.smt.certify import make_certificate, make_composed_certificate
from verimirage.smt.glue import live_ops, region_of, undefined_fed


def _concat_of_a_log_sum() -> tuple[vm.Graph, list, vm.Graph]:
    """``concat([x, sum(log y)], axis=0)`` in two regions (the log and its sum; the concat), and a μGraph of the
    concat's region that reads the sum in the first piece too (``x + 0 * s``): equal over the reals."""
    g = vm.Graph()
    x, y = g.input("x", (3,), vm.float32), g.input("y", (4,), vm.float32)
    g.output(g.concat([x, g.sum(g.log(y), axis=0)], axis=0))
    live = sorted(live_ops(g))
    cat = [i for i in live if g.nodes[i].op == "concat"]
    regs = [region_of(g, [i for i in live if i not in cat]), region_of(g, cat)]
    h = vm.Graph()
    r0, r1 = (h.input(t.name, t.shape, t.dtype) for t in regs[1].graph.inputs)
    h.output(h.concat([h.add(r0, h.scale(h.broadcast_to(r1, (3,)), 0.0)), r1], axis=0))
    return g, regs, h


def test_composition_took_one_concat_pieces_conditions_as_facts_of_another() -> None:
    g, regs, h = _concat_of_a_log_sum()
    mgs = [MuGraph.from_graph(regs[0].graph), MuGraph.from_graph(h)]
    certs = []
    for r, mg in zip(regs, mgs, strict=True):
        v = vm.verify(r.graph, mg)
        assert v.proved, v.reason  # (each region's proof is right: the attack is in the splice)
        certs.append(make_certificate(r.graph, mg, v))
    cc = make_composed_certificate(g, regs, certs, "red team 20")
    ins = {"x": np.array([1.0, 2.0, 3.0]), "y": np.array([1.0, -1.0, 2.0, 3.0])}
    with np.errstate(all="ignore"):
        ref, got = vm.evaluate(g, ins)[0], vm.evaluate(MuGraph.parse(cc.mugraph_text), ins)[0]
    assert np.array_equal(ref[:3], [1.0, 2.0, 3.0]) and np.isnan(got[:3]).all()  # (the splice is wrong there)
    assert not vm.verify(g, MuGraph.parse(cc.mugraph_text)).proved  # (whole-program verify refuses it)
    assert undefined_fed(g, regs) is not None
    v = check_text(cc.to_json())
    assert not v.proved and "may be undefined" in v.reason, v.reason



def _verdict_and_values(build: Any, ins: dict[str, np.ndarray]) -> tuple[vm.Verdict, np.ndarray, np.ndarray]:
    g, h = vm.Graph(), vm.Graph()
    build(g, False)
    build(h, True)
    with np.errstate(all="ignore"):
        ref, got = vm.evaluate(g, ins)[0], vm.evaluate(h, ins)[0]
    return vm.verify(g, MuGraph.from_graph(h)), ref, got


def _own_provenance(g: vm.Graph, cand: bool) -> None:
    x, y = g.input("x", (4,), vm.float32), g.input("y", (4,), vm.float32)
    g.output(g.add(g.reciprocal(g.reciprocal(x)), g.div(g.mul(y, x), x)) if cand else g.add(x, y))


def _provenance_in_a_branch(g: vm.Graph, cand: bool) -> None:
    x, y, z, m = (g.input("x", (4,), vm.float32), g.input("y", (4,), vm.float32), g.input("z", (4,), vm.float32),
                  g.input("m", (4,), vm.bool))
    w = g.where(m, g.reciprocal(g.reciprocal(x)), z)
    g.output(g.add(w, g.div(g.mul(y, x), x) if cand else y))


def _provenance_over_a_bound_index(g: vm.Graph, cand: bool) -> None:
    x, y = g.input("x", (4,), vm.float32), g.input("y", (4,), vm.float32)
    a = g.sum(g.reciprocal(g.reciprocal(g.slice(x, 0, 0, 2))), axis=0)
    b = g.sum(g.div(g.mul(y, x), x) if cand else y, axis=0)
    g.output(g.add(b, a) if cand else g.add(a, b))  # (each derivation's first reduction index is the same name)


PARTIAL_SIGNS = {
    "own": (_own_provenance, {"x": np.array([0.0, 1.0, 2.0, -3.0]), "y": np.array([5.0, 1.0, 1.0, 1.0])}),
    "branch": (_provenance_in_a_branch, {"x": np.array([0.0, 1.0, 2.0, -3.0]), "y": np.array([5.0, 1.0, 1.0, 1.0]),
                                         "z": np.ones(4), "m": np.array([False, True, True, True])}),
    "bound": (_provenance_over_a_bound_index, {"x": np.array([1.0, 2.0, 0.0, 3.0]), "y": np.array([5.0, 1, 1, 1])}),
}


@pytest.mark.parametrize("name", sorted(PARTIAL_SIGNS))
def test_definedness_took_a_partial_ops_sign_as_holding_where_the_op_is_undefined(name: str) -> None:
    build, ins = PARTIAL_SIGNS[name]
    v, ref, got = _verdict_and_values(build, ins)
    assert np.isfinite(ref).all() and np.isnan(got).any()  # (the candidate is NaN where the source is defined)
    assert not v.proved and "definedness" in v.reason, v.reason


def test_composition_took_an_outputs_provenance_at_its_index_as_a_crossing_values() -> None:
    g = vm.Graph()
    g.output(g.slice(g.reciprocal(g.reciprocal(g.input("x", (4,), vm.float32))), 0, 0, 2))
    live = sorted(live_ops(g))
    regs = [region_of(g, live[:1]), region_of(g, live[1:])]
    h = vm.Graph()  # the second region reading r0[3] too: slice(1 / r0, 0:2) + 0 * r0[3]
    r0 = h.input("r0", (4,), vm.float32)
    h.output(h.add(h.slice(h.reciprocal(r0), 0, 0, 2), h.scale(h.broadcast_to(h.slice(r0, 0, 3, 4), (2,)), 0.0)))
    certs = []
    for r, mg in zip(regs, [MuGraph.from_graph(regs[0].graph), MuGraph.from_graph(h)], strict=True):
        v = vm.verify(r.graph, mg)
        assert v.proved, v.reason
        certs.append(make_certificate(r.graph, mg, v))
    cc = make_composed_certificate(g, regs, certs, "red team 20")
    ins = {"x": np.array([1.0, 2.0, 3.0, 0.0])}
    with np.errstate(all="ignore"):
        ref, got = vm.evaluate(g, ins)[0], vm.evaluate(MuGraph.parse(cc.mugraph_text), ins)[0]
    assert np.array_equal(ref, [1.0, 2.0]) and np.isnan(got).all()
    assert undefined_fed(g, regs) is not None
    v = check_text(cc.to_json())
    assert not v.proved and "may be undefined" in v.reason, v.reason


_TWO_WIDE_ROWS = """mugraph {
  %0 = input {name='x'} : f32[2,32768]
  %1 = input {name='y'} : f32[2,32768]
  %2 = custom %0 {frange=1, grid=(1,)} : f32[2,1] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(2, 32768)} : f32[2,32768]
    %1 = sum %0 {axis=1} : f32[2,1]
    output %1 {omap=(0,)}
  }
  %3 = custom %1 {frange=1, grid=(1,)} : f32[2,1] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(2, 32768)} : f32[2,32768]
    %1 = max %0 {axis=1} : f32[2,1]
    output %1 {omap=(0,)}
  }
  return %2, %3
}"""


def test_merged_launch_of_two_16_warp_kernels_raised_out_of_the_warp_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from verimirage.backend import launch_model
    from verimirage.backend.tuning import recommend, tuned_module
    from verimirage.ir.graph import node_list

    mg = MuGraph.parse(_TWO_WIDE_ROWS)
    nodes = node_list(mg)
    assert [recommend(n.attr("block"), [nodes[a].outs[k] for a, k in n.args]).num_warps
            for n in nodes if n.op == "custom"] == [16, 16]  # (the condition: two 16-warp kernels, one level)
    assert len(tuned_module(mg, "merge").kernels) == 1
    assert launch_model.TritonLaunches().merged_launches(mg) == 1
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    x, y = torch.randn(2, 32768), torch.randn(2, 32768)
    s, m = vm.compile(mg)(x=x, y=y)
    assert torch.allclose(s[:, 0].double(), x.double().sum(1), atol=1e-3) and torch.equal(m[:, 0], y.amax(1))
