"""Programs of independent parts (issue 23): each part lowered on its own, not one kernel of one block."""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.pipeline.pricing import cost
from verimirage.rewrite import partition as P


def _two_parts(rows: int = 8) -> vm.Graph:
    """The decoder layer at batch ``rows`` (8 KV and 32 query heads of 128): the key projection's reshape to heads
    beside the query's rotary (two unrelated computations a cut left on one side)."""
    g = vm.Graph()
    k = g.input("K", (rows, 1024), vm.float16)
    q = g.input("Q", (rows, 4096), vm.float16)
    c = g.input("C", (rows, 1, 128), vm.float16)
    qh = g.reshape(q, (rows, 32, 128))
    rot = g.concat([g.neg(g.slice(qh, 2, 64, 128)), g.slice(qh, 2, 0, 64)], 2)
    g.output(g.reshape(k, (rows, 8, 128)))
    g.output(g.add(g.mul(qh, c), g.mul(rot, c)))
    return g


def _grids(mg: vm.MuGraph) -> list[int]:
    return [int(np.prod(n.attr("block").grid)) for n in mg.nodes if n.op == "custom"]


def test_independent_parts_are_lowered_apart_with_their_own_grids() -> None:
    g = P.normalise(_two_parts())
    assert len(P._output_components(g)) == 2
    lows, _ = P.lower_all(g, components=True, rank=cost)
    # (a cut's sides only)
    assert not any(lo.steps[0] == "partition.components" for lo in P.lower_all(g, rank=cost)[0])
    fused = [lo for lo in lows if lo.steps[0] == "partition.grid" or lo.steps[0] == "partition.loop"]
    apart = [lo for lo in lows if lo.steps[0] == "partition.components"]
    assert apart
    # one kernel over both parts of the program as it is has no block axis both outputs share: one block (on an
    # H100 at batch 8: 8.5 us); the parts' rows walked together (analyse's zip_parts) give it a grid of 8 blocks
    one_block = [lo for lo in fused if _grids(lo.mugraph) == [1]]
    zipped = [lo for lo in fused if _grids(lo.mugraph) != [1]]
    assert one_block and zipped and all(len(_grids(lo.mugraph)) == 1 for lo in zipped)
    best_apart = min(apart, key=lambda lo: cost(lo.mugraph).time_s)
    assert cost(best_apart.mugraph).time_s < min(cost(lo.mugraph).time_s for lo in one_block)
    assert min(_grids(best_apart.mugraph)) > 1
    best = min(lows, key=lambda lo: cost(lo.mugraph).time_s)
    assert best in zipped and _grids(best.mugraph) == [8]
    rng = np.random.default_rng(0)
    ins = {t.name: rng.uniform(-1.0, 1.0, t.shape) for t in g.inputs}
    for lo in [*apart[:3], best]:
        for a, b in zip(vm.evaluate(lo.mugraph, ins), vm.evaluate(g, ins), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert isinstance(vm.verify(g, best.mugraph), vm.Proved)


def test_a_cut_side_of_two_parts_is_lowered_apart() -> None:
    # the decoder layer's key projection feeding its reshape, beside the query's rotary: cut at the projection,
    # the rest is two parts
    g = vm.Graph()
    x = g.input("X", (8, 512), vm.float16)
    w = g.input("W", (512, 1024), vm.float16)
    q = g.input("Q", (8, 4096), vm.float16)
    c = g.input("C", (8, 1, 128), vm.float16)
    qh = g.reshape(q, (8, 32, 128))
    rot = g.concat([g.neg(g.slice(qh, 2, 64, 128)), g.slice(qh, 2, 0, 64)], 2)
    g.output(g.reshape(g.matmul(x, w), (8, 8, 128)))
    g.output(g.add(g.mul(qh, c), g.mul(rot, c)))
    lows = P.cut_lowerings(P.normalise(g), rank=cost)
    assert any("partition.components" in lo.steps for lo in lows)


def test_a_connected_program_has_no_component_lowering() -> None:
    g = vm.Graph()
    x = g.input("X", (8, 64), vm.float16)
    e = g.exp(x)
    g.output(e)
    g.output(g.neg(e))  # shares exp(x)
    assert P.component_lowerings(P.normalise(g), rank=cost) == []
    h = vm.Graph()
    y = h.input("Y", (8, 64), vm.float16)
    h.output(y)  # an output that is an input: nothing to lower apart
    h.output(h.exp(y))
    assert P.component_lowerings(h, rank=cost) == []
