"""A split kernel's combine runs the post-loop ops on its block's tiles: a reshape whose merged or split group of dims
the combine's grid walks (a k projection's columns as heads, a head a block) must take its block's chunk of the group
(partition._reshape_tile), as the split kernel's own reshapes do. Found by the decoder layer's search of its q/k/v and
rotary regions as one (layer20, 2026-11-27): the combine of the k projection's split-K partials, then its reshape to
heads and the rotary, was built with the program's reshape attributes, whose block-level tile rule took all 8 heads
(a (1, 8, 128) tile of a (1, 128) operand); the IR check passed it and the verifier's interpreter then raised
ValueError (cannot reshape 1024 elements into (8, 1, 8, 128)), which ended the whole search."""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.ir.graph import node_list
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all


def _rotary_heads(k: int = 64, heads: int = 4, d: int = 16) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (1, k), vm.float32)
    w = g.input("W", (k, heads * d), vm.float32)
    cos = g.input("COS", (1, 1, d), vm.float32)
    h = g.reshape(g.matmul(x, w), (1, heads, d))
    half = d // 2
    rot = g.concat([g.neg(g.slice(h, 2, half, d)), g.slice(h, 2, 0, half)], axis=2)
    g.output(g.add(g.mul(h, cos), rot))
    return g


def test_a_split_combine_took_every_head_in_its_reshape_tile() -> None:
    g = _rotary_heads()
    lowered, _ = lower_all(g, cuts=False, rank=pricing.cost)
    split = [lo for lo in lowered if "partition.split_kv" in lo.steps
             and any(n.op == "custom" and n.attr("block").grid[0] > 1 for n in node_list(lo.mugraph)[-2:])]
    assert split, "expected a split-K lowering whose combine kernel walks the heads"
    rng = np.random.default_rng(3)
    ins = {"X": rng.standard_normal((1, 64)), "W": rng.standard_normal((64, 64)),
           "COS": rng.standard_normal((1, 1, 16))}
    ref = vm.evaluate(g, ins)[0]
    for lo in split:
        lo.mugraph.check()
        for n in node_list(lo.mugraph):  # every block reshape keeps its operand tile's elements
            if n.op != "custom":
                continue
            bg = n.attr("block")
            for b in bg.nodes:
                if b.op == "reshape":
                    a, j = b.args[0]
                    assert b.outs[0].numel == bg.nodes[a].outs[j].numel, (str(lo.mugraph), b)
        np.testing.assert_allclose(vm.evaluate(lo.mugraph, ins)[0], ref, rtol=1e-9, atol=1e-9)


#: a block reshape given the program's attributes in a kernel that walks the heads: its tile rule made a (1, 4, 16)
#: tile of a (1, 16) operand tile
_BAD_RESHAPE_TILE = """mugraph {
  %0 = input {name='X'} : f32[1,64]
  %1 = input {name='W'} : f32[64,64]
  %2 = custom %0, %1 {frange=1, grid=(4,)} : f32[1,4,16] {
    %0 = input {arg=0, fmap=None, imap=(None,), shape=(1, 64)} : f32[1,64]
    %1 = input {arg=1, fmap=None, imap=(1,), shape=(64, 64)} : f32[64,16]
    %2 = matmul %0, %1 : f32[1,16]
    %3 = reshape %2 {shape=(1, 4, 16), src=(1, 64)} : f32[1,4,16]
    output %3 {omap=(1,)}
  }
  return %2
}"""


def test_ir_check_accepted_a_block_reshape_tile_of_more_elements_than_its_operand() -> None:
    # layer20's note: the IR check passed the bad combine above (its result read as a cropped masked tail) and the
    # interpreters then raised ValueError, which ends a search; the reshape's tile rule now refuses it
    import pytest

    with pytest.raises(vm.GraphError, match="operand tile's 16 elements"):
        vm.MuGraph.parse(_BAD_RESHAPE_TILE).check()
