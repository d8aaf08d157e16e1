"""Slow plan designs of the capture's decode partitions (issue 20): a product that codegen lowers as a broadcast
multiply and ``tl.sum`` with a temporary larger than the registers is charged its spill (``cost._broadcast_spill``),
and the device run serves a plan entry's items cheapest first by today's cost model (``corpus_capture.by_cost``)."""

from __future__ import annotations

import sys
from pathlib import Path

from verimirage.ir.graph import MuGraph, node_list
from verimirage.pipeline import pricing
from verimirage.rewrite import cost as C

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import corpus_capture as cc

_HEAD = """mugraph {
  %0 = input {name='in0'} : f16[8,1,1024]
  %1 = input {name='in1'} : f16[2816,1024]
  %2 = input {name='in2'} : f16[2816]
"""
#: mlp_relu_3d's up projection at decode, the plan's first (H100 session 10: 11.8 us; Inductor 5.2): one
#: (8, 1, 1024) @ (1024, 16) step per block, a broadcast multiply over a 131,072-element temporary
ONE_STEP = _HEAD + """  %3 = custom %0, %1, %2 {frange=1, grid=(176,)} : f16[8,1,2816] {
    %0 = input {arg=0, fmap=None, imap=(None,), shape=(8, 1, 1024)} : f16[8,1,1024]
    %1 = input {arg=1, fmap=None, imap=(0,), shape=(2816, 1024)} : f16[16,1024]
    %2 = input {arg=2, fmap=None, imap=(0,), shape=(2816,)} : f16[16]
    %3 = permute %1 {dims=(1, 0)} : f16[1024,16]
    %4 = matmul %0, %3 : f16[8,1,16]
    %5 = add %4, %2 : f16[8,1,16]
    %6 = relu %5 : f16[8,1,16]
    output %6 {omap=(2,)}
  }
  return %3
}"""
#: the same entry's K-looped design (256-deep steps: row dots), fourth in the plan and never timed
K_LOOP = _HEAD + """  %3 = custom %0, %1, %2 {frange=4, grid=(176,)} : f16[8,1,2816] {
    %0 = input {arg=0, fmap=2, imap=(None,), shape=(8, 1, 1024)} : f16[8,1,256]
    %1 = input {arg=1, fmap=1, imap=(0,), shape=(2816, 1024)} : f16[16,256]
    %2 = input {arg=2, fmap=None, imap=(0,), shape=(2816,)} : f16[16]
    %3 = permute %1 {dims=(1, 0)} : f16[256,16]
    %4 = matmul %0, %3 : f16[8,1,16]
    %5 = loop_sum %4 : f16[8,1,16]
    %6 = fused %5, %2 : f16[8,1,16] {
      %0 = arg {index=0} : f16[8,1,16]
      %1 = arg {index=1} : f16[16]
      %2 = add %0, %1 : f16[8,1,16]
      %3 = relu %2 : f16[8,1,16]
      return %3
    }
    output %6 {omap=(2,)}
  }
  return %3
}"""


def _block(text: str) -> object:
    return next(n.attr("block") for n in node_list(MuGraph.parse(text)) if n.op == "custom")


def test_a_deep_broadcast_product_is_charged_its_register_spill() -> None:
    from verimirage.backend.launch_model import LAUNCHES

    one, loop = MuGraph.parse(ONE_STEP), MuGraph.parse(K_LOOP)
    assert C._broadcast_spill(_block(ONE_STEP), C.H100, LAUNCHES) > 2.0
    # row dots (the backend's row_dot_max_k): tl.dot, no temporary; without a launch model no one-row tl.dot
    assert C._broadcast_spill(_block(K_LOOP), C.H100, LAUNCHES) == 1.0
    assert C._broadcast_spill(_block(K_LOOP), C.H100) >= 1.0
    # (was 4.0 vs 3.8 us: the one-step design ranked even)
    assert pricing.cost(one).time_s > 2.5 * pricing.cost(loop).time_s
    # a broadcast temporary within the registers is not charged: the layer's v projection, one (1, 1024) @
    # (1024, 32) step per block, ran 5.3 us so (55 us as a 16-row dot)
    small = ONE_STEP.replace("8,1,1024", "1,1,1024").replace("(8, 1, 1024)", "(1, 1, 1024)").replace(
        "f16[8,1,16]", "f16[1,1,16]").replace("f16[8,1,2816]", "f16[1,1,2816]")
    assert C._broadcast_spill(_block(small), C.H100, LAUNCHES) == 1.0


def test_plan_items_are_served_cheapest_first() -> None:
    assert cc.by_cost([ONE_STEP, "not a μGraph", K_LOOP]) == [K_LOOP, ONE_STEP, "not a μGraph"]
    assert cc.by_cost([{"mugraph": ONE_STEP, "certificate": "{}"}, K_LOOP])[0] == K_LOOP
