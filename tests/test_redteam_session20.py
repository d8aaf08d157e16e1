"""Red team, twentieth session: findings (each test fails on the code before its fix).

Composition (``smt.glue.undefined_fed``, trusted): since 186bb75 a value crossing regions need only be defined where
the program is, the program's index-free definedness conditions taken as facts. The conditions of every case of an
output (the boxes of output indices ``derive_all`` splits on, a concatenation's pieces) were pooled as the facts of
that output, so a condition only the elements of one piece need justified a crossing value read by another piece:
``concat([x, sum(log y)])`` with the concat's region μGraph reading the sum in the first piece too
(``x + 0 * s``) checked Proved and was NaN on the first piece (where the program is ``x``) whenever a ``y`` was
negative. Now each output's each case gives its own facts.
"""

from __future__ import annotations

import numpy as np

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

