"""Red team of the masked tail tiles (74f80e3, docs/architecture.md "Masked tails"), session 17.

A block's tile along a dim is ``ceil(n / blocks)``: the blocks of two kernels over the same 197 rows no longer nest
as ``n / blocks`` says (2 blocks of 99 rows and 4 of 50: the second block of 50, rows 50..99, reads both blocks of
99). The launch forms that wait for *some* producer blocks (persistent tile waits, last-block combines) derived the
blocks a consumer reads from ``n // blocks`` (fixed in 326e2a1, found at the same time by its author); these tests
check every row a consumer block reads is written by a block it waits for, on pairs 326e2a1's own test leaves out (a
wait on a block that does not exist, a last-block combine of a proved program).
"""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import box_blocks, generate, last_block_plan, tile_box
from verimirage.ir import BlockBuilder
from verimirage.ir.graph import node_list

F16 = vm.float16


def _rows(n: int, gp: int, gc: int) -> vm.MuGraph:
    """exp over ``n`` rows in ``gp`` row blocks, then relu over them in ``gc`` row blocks (masked tails)."""
    mg = vm.MuGraph()
    x = mg.input("X", (n, 8), F16)
    b = BlockBuilder((gp,), 1)
    b.output(b.exp(b.input(0, x.type, (0,))), (0,))
    (y,) = mg.custom(b.build(), [x], [(n, 8)])
    c = BlockBuilder((gc,), 1)
    c.output(c.relu(c.input(0, y.type, (0,))), (0,))
    (o,) = mg.custom(c.build(), [y], [(n, 8)])
    mg.output(o)
    return mg


@pytest.mark.parametrize(("n", "gp", "gc"), [(197, 2, 4), (5, 3, 2), (37, 2, 37), (197, 4, 2), (12, 2, 4)])
def test_tile_waits_under_a_masked_tail_missed_a_producer_block(n: int, gp: int, gc: int) -> None:
    """197 rows in 2 producer blocks (99 rows each) and 4 consumer blocks (50 each): ``tile_box`` took the slabs as
    ``197 // 2 = 98`` and ``197 // 4 = 49`` rows, so consumer block 1 (rows 50..99) waited for producer block 0
    only and read row 99 before block 1 wrote it (5 rows in 3 and 2 blocks: consumer block 1 waited for producer
    blocks 2 and 3, of which 3 does not exist: its flag is never set). Now a tailed slab is waited for whole."""
    mg = _rows(n, gp, gc)
    nodes = node_list(mg)
    (inp,) = [k for k in nodes[2].attr("block").nodes if k.op == "input"]
    box = tile_box(nodes[1].attr("block"), 0, nodes[2].attr("block"), inp, (n, 8))
    tp, tc = -(-n // gp), -(-n // gc)
    src = generate(mg, persistent=True, tile_waits=True).source
    if box is None:
        assert "fb = ctr_ptr" not in src and 'sem="acquire"' in src
        return
    assert n % gp == 0 and n % gc == 0  # (only exact slabs get a box)
    for c in range(gc):
        need = {r // tp for r in range(c * tc, min(n, c * tc + tc))}
        got = {blk[0] for blk in box_blocks(box, (c,))}
        assert need <= got and max(got) < gp, (c, box)


def test_last_block_combine_read_rows_of_another_group_under_a_masked_tail() -> None:
    """A split kernel over 200 rows in 4 blocks (50 each) whose partials are cropped to 150 rows, combined in 4
    blocks of ``ceil(150 / 4) = 38`` rows: ``last_block_plan`` matched combine block ``j`` with split group ``j``
    (4 % 4 == 0), so combine block 1 (rows 38..75) ran in the last block of group 1 and read rows 38..49 that group
    0 writes, with no wait for it (VERIMIRAGE_LASTBLOCK=1). The pair is proved; the plan must not pair slabs that
    do not nest."""
    n0, m, k, s, g = 200, 150, 16, 2, 4
    src = vm.Graph()
    x0 = src.input("X", (n0, k), vm.float32)
    src.output(src.sum(src.slice(x0, 0, 0, m), 1))
    mg = vm.MuGraph()
    x = mg.input("X", (n0, k), vm.float32)
    b = BlockBuilder((g, s), 1)
    b.output(b.sum(b.input(0, x.type, (0, 1)), 1), (0, 1))
    (p,) = mg.custom(b.build(), [x], [(m, s)])
    c = BlockBuilder((g,), s)
    c.output(c.loop_sum(c.input(0, p.type, (0,), 1)), (0,))
    (o,) = mg.custom(c.build(), [p], [(m, 1)])
    mg.output(o)
    assert isinstance(vm.verify(src, mg), vm.Proved)
    plan = last_block_plan(node_list(mg), 1, 2)
    ts, tc = -(-n0 // g), -(-m // g)
    for a, bb, r in plan.matched if plan is not None else ():
        assert a == 0 and bb == 0
        for j in range(g):  # combine block j runs in split group j // r: its rows must all be that group's
            assert {row // ts for row in range(j * tc, min(m, j * tc + tc))} == {j // r}, (j, plan)


def test_evaluation_bound_left_out_a_masked_tails_zero_padding() -> None:
    """A block input of one row of 8 looped over 2**28 iterations is a masked tail: the tile is one row and the
    evaluator pads the operand to 2**28 rows (2**31 elements, 16 GiB in float64) before it loops. ``check_evaluable``
    and ``evaluation_elements`` counted the tiles only (8 elements a block), so ``vm.evaluate`` allocated it, and the
    search cache re-checked such a tampered entry in the caller's process, uncapped (913503e's bound): an
    out-of-memory kill instead of a GraphError. The padded operand is now counted."""
    from verimirage.ir.reference import MAX_EVAL_ELEMENTS, check_evaluable, evaluation_elements

    mg = vm.MuGraph()
    x = mg.input("X", (1, 8), vm.float32)
    b = BlockBuilder((1,), 2**28)
    b.output(b.loop_sum(b.input(0, x.type, (None,), 0)), (0,))
    (o,) = mg.custom(b.build(), [x])
    mg.output(o)
    assert evaluation_elements(mg) > MAX_EVAL_ELEMENTS
    with pytest.raises(vm.GraphError, match="2\\*\\*30"):
        check_evaluable(mg, "evaluate")
    with pytest.raises(vm.GraphError, match="2\\*\\*30"):
        vm.evaluate(mg, {"X": np.ones((1, 8))})


@pytest.mark.parametrize("shapes", [[(197, 16), (3, 3)], [("a", 16)], "ab", [197, 16], [(-1, 16)]])
def test_custom_shapes_of_the_wrong_form_raised_an_unclear_error(shapes: object) -> None:
    """``MuGraph.custom``'s new ``shapes`` (a masked tail's cropped results): one shape too many or a string was
    zip's ValueError, a shape of strings a TypeError from the crop comparison, a flat list a TypeError ('int' is not
    iterable); a GraphError naming ``custom`` and what is expected now."""
    mg = vm.MuGraph()
    x, w = mg.input("X", (197, 32), vm.float32), mg.input("W", (32, 16), vm.float32)
    b = BlockBuilder((4,), 1)
    b.output(b.matmul(b.input(0, x.type, (0,)), b.input(1, w.type, (None,))), (0,))
    with pytest.raises(vm.GraphError, match="custom: shapes"):
        mg.custom(b.build(), [x, w], shapes)  # type: ignore[arg-type]


def test_float64_padding_is_nan_where_the_first_slab_is_infinite() -> None:
    """A split-K over 13 = 2 x 7 (the second part's 14th column padding) of a row whose first element is inf: the
    kernel computes inf (its padding is 0, 0 * w = 0) and so does the source; ``vm.evaluate`` of the μGraph padded
    with ``0 * inf = NaN`` and gave NaN. Fixed (tail17): ``fit`` pads with a constant 0 (a causal mask true nowhere,
    cast), not ``0 * slab``."""
    import torch

    from verimirage.backend.runtime import compile as vcompile

    f32 = vm.float32
    mg = vm.MuGraph()
    x, w = mg.input("X", (2, 13), f32), mg.input("W", (13, 3), f32)
    b = BlockBuilder((2,), 1)
    b.output(b.matmul(b.input(0, x.type, (1,)), b.input(1, w.type, (0,))), (0,))
    (part,) = mg.custom(b.build(), [x, w])
    c = BlockBuilder((1,), 2)
    c.output(c.loop_sum(c.input(0, part.type, (None,), 0)), (0,))
    (o,) = mg.custom(c.build(), [part])
    mg.output(o)
    xs, ws = np.ones((2, 13)), np.ones((13, 3))
    xs[0, 0] = np.inf
    (got,) = vm.evaluate(mg, {"X": xs, "W": ws})
    kern = vcompile(mg)(torch.tensor(xs, dtype=torch.float32), torch.tensor(ws, dtype=torch.float32))
    kern = (kern[0] if isinstance(kern, (tuple, list)) else kern).double().numpy()
    assert np.isinf(kern[0]).all() and np.array_equal(got, kern)


def _tailed_block(kind: str) -> vm.MuGraph:
    """One kernel whose tiles are masked tails, the padding feeding what it computes (so the kernel must read it as
    the IR's zeros, not skip it): ``kind`` names the shape of the tail."""
    f32 = vm.float32
    mg = vm.MuGraph()
    if kind == "rank3_lead":  # 3 heads in 4 blocks of one (the rank-2 view's leading dim), the last block padding
        x = mg.input("X", (3, 16, 16), f32)
        b = BlockBuilder((4,), 1)
        b.output(b.exp(b.input(0, x.type, (0,))), (0,))
        mg.output(*mg.custom(b.build(), [x], [(3, 16, 16)]))
        return mg
    x = mg.input("X", (197, 8), f32)
    if kind == "grid_and_loop_same_dim":  # 197 rows: 4 blocks x 3 iterations of 17 (blocks of 51)
        b = BlockBuilder((4,), 3)
        b.output(b.loop_max(b.max(b.input(0, x.type, (0,), 0), 0)), (0,))
        mg.output(*mg.custom(b.build(), [x]))
        return mg
    y = mg.input("Y", (197, 8), f32)
    b = BlockBuilder((4,), 1)  # 197 rows in 4 blocks of 50
    xt, yt = b.input(0, x.type, (0,)), b.input(1, y.type, (0,))
    if kind == "max_over_padding":
        b.output(b.max(b.add(xt, yt), 0), (0,))
        mg.output(*mg.custom(b.build(), [x, y]))
    elif kind == "concat_along_tail":
        b.output(b.concat([b.exp(xt), yt], 0), (0,))
        mg.output(*mg.custom(b.build(), [x, y], [(397, 8)]))
    else:  # slice of a tailed tile
        b.output(b.slice(b.exp(xt), 0, 40, 50), (0,))
        mg.output(*mg.custom(b.build(), [x, y], [(38, 8)]))
    return mg


@pytest.mark.parametrize("kind", ["max_over_padding", "concat_along_tail", "slice_of_a_tail", "grid_and_loop_same_dim",
                                  "rank3_lead"])
def test_tailed_kernels_read_the_padding_as_the_interpreter_does(kind: str) -> None:
    """Codegen against ``vm.evaluate`` of the μGraph itself (not a source: a max over the padding is not proved,
    yet the kernel must compute what the IR says), fp32, negative data so that a padding 0 shows."""
    import torch

    from verimirage.backend.runtime import compile as vcompile

    mg = _tailed_block(kind)
    rng = np.random.default_rng(11)
    ins = {str(t.name): rng.standard_normal(t.shape) - 3.0 for t in mg.inputs}
    want = vm.evaluate(mg, ins)
    got = vcompile(mg)(*[torch.tensor(ins[str(t.name)], dtype=torch.float32) for t in mg.inputs])
    got = [o.double().numpy() for o in (got if isinstance(got, (tuple, list)) else [got])]
    for a, w in zip(got, want, strict=True):
        assert a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(w).max()))
