"""The cost model's per-block term for one-step kernels (``Hardware.stream_block_s``) and the copy of a returned input.

H100, 2026-11-27 (BENCHMARKS.md, rowsplit and models19): log_softmax over 16 x 32,000 split over the row, 512 blocks
3.63 µs, 256 blocks 3.00, 128 blocks 2.93; the model ranked the 512-block design first. With 50 ns for each block the
busiest SM runs, the 256-block one is first. A program input returned as an output costs a copy kernel at run time
(``backend.runtime`` clones it); uncounted, a captured graph's design that returns its input ranked level with the one
kernel that writes both outputs, then above it once the per-block term charged that kernel (1.09 µs against 2.15)."""

from __future__ import annotations

import json
from pathlib import Path

import verimirage as vm
from verimirage.ir.graph import node_list
from verimirage.pipeline.pricing import cost
from verimirage.rewrite.cost import H100

CANDS = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates_models" / "log_softmax.json"


def _blocks(mg: vm.MuGraph) -> list[int]:
    return [n.attr("block").num_blocks for n in node_list(mg) if n.op == "custom"]


def test_the_512_block_split_ranked_above_the_faster_256_block_one() -> None:
    mgs = [vm.MuGraph.parse(c["mugraph"]) for c in json.loads(CANDS.read_text())["candidates"]]
    by_blocks = {tuple(_blocks(m)): m for m in mgs}
    fast, slow = by_blocks[(256, 256)], by_blocks[(512, 512)]  # 16 x 16 and 16 x 32 column blocks, both kernels
    assert cost(fast).time_s < cost(slow).time_s
    assert _blocks(mgs[0]) == [256, 256]  # the committed file's first (the default pick) is the 256-block design
    assert H100.stream_block_s > 0


def test_a_returned_input_was_costed_as_free_and_outranked_one_kernel() -> None:
    g = vm.Graph()
    x, c = g.input("in0", (8, 1), vm.float16), g.input("const0", (1,), vm.float16)
    g.output(g.neg(x), c)
    passthrough = vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))
    one = vm.MuGraph.parse("""mugraph {
  %0 = input {name='in0'} : f16[8,1]
  %1 = input {name='const0'} : f16[1]
  %2 = custom %0, %1 {frange=1, grid=(1,)} : f16[8,1], f16[1] {
    %0 = input {arg=0, fmap=None, imap=(None,), shape=(8, 1)} : f16[8,1]
    %1 = input {arg=1, fmap=None, imap=(None,), shape=(1,)} : f16[1]
    %2 = neg %0 : f16[8,1]
    output %2 {omap=(0,)}
    output %1 {omap=(0,)}
  }
  return %2.0, %2.1
}""")
    a, b = cost(one), cost(passthrough)
    assert b.launches == 2 and a.launches == 1
    assert a.time_s < b.time_s
