"""Red team, session 14 (redteam2): attacks on this session's launch paths and plan lookup that held, kept as
compact tests that would fail if they stopped holding (the findings are in tests/test_redteam_session14_launch.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_last_block import SPLIT_K, _inputs, _run
from test_last_block import block_order as block_order  # (the fixture)

import verimirage as vm
from verimirage.backend import codegen
from verimirage.backend.codegen import generate, last_block_plan
from verimirage.backend.runtime import interpreting
from verimirage.backend.wrap import to_kernels
from verimirage.ir.graph import Graph, MuGraph, node_list

interp = pytest.mark.skipif(not interpreting(), reason="Triton's interpreter (block order, CPU tensors)")

#: split-K over three K splits (an odd group: 3 blocks a group), the combine's tiles twice the split's columns
SPLIT_K3 = (SPLIT_K.replace("f16[8,256]", "f16[8,192]").replace("f16[256,128]", "f16[192,128]")
            .replace("grid=(2, 4)} : f16[32,128]", "grid=(2, 3)} : f16[24,128]")
            .replace("shape=(8, 256)", "shape=(8, 192)").replace("shape=(256, 128)", "shape=(192, 128)")
            .replace("{frange=4, grid=(4,)}", "{frange=3, grid=(4,)}").replace("shape=(32, 128)", "shape=(24, 128)"))

_HEAD, _COMBINE = SPLIT_K3.split("  %3 = custom")
#: the same split, combined by one block over all 128 columns (coarser than the split's two column blocks)
COARSE = _HEAD + "  %3 = custom" + _COMBINE.replace("grid=(4,)", "grid=(1,)").replace("f16[8,32]", "f16[8,128]")


@pytest.fixture
def many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups may run up to 16 combine blocks (the default is 1), as test_last_block's tests allow."""
    monkeypatch.setattr(codegen, "LASTBLOCK_MAX_TILES", 16)


@pytest.mark.usefixtures("many_tiles")
def test_last_block_plan_of_an_odd_group_and_a_coarser_combine() -> None:
    """Three K splits: groups of 3 (any count, not a power of two); a combine whose grid partitions the split's
    column dim more coarsely than the split (2 split column blocks, 1 combine block) is not matched to it: both split
    column blocks are gathered into one group, which runs the one combine block."""
    nodes = node_list(to_kernels(MuGraph.parse(SPLIT_K3)))
    plan = last_block_plan(nodes, 2, 3)
    assert plan is not None and (plan.matched, plan.count, plan.groups, plan.tiles) == (((0, 0, 2),), 3, 2, 2)
    nodes = node_list(to_kernels(MuGraph.parse(COARSE)))
    plan = last_block_plan(nodes, 2, 3)
    assert plan is not None and (plan.matched, plan.count, plan.groups, plan.tiles) == ((), 6, 1, 1)


@interp
@pytest.mark.usefixtures("many_tiles")
@pytest.mark.parametrize("which", ["odd", "coarse"])
def test_last_block_odd_group_and_coarse_combine_equal_two_launches(which: str, block_order: Any) -> None:
    """Blocks in reverse order (the last to arrive is each group's first program id): the one launch computes
    the two launches' result bit for bit, and the counters end at zero."""
    import torch

    mg = MuGraph.parse(SPLIT_K3 if which == "odd" else COARSE)
    xs = _inputs(mg, 4)
    want = _run(vm.compile(mg, last_block=False), mg, xs)
    f1 = vm.compile(mg, last_block=True)
    assert len(f1.kernels) == 1
    block_order(lambda n: list(range(n))[::-1])
    assert np.array_equal(_run(f1, mg, xs), want)
    assert int(f1.counters(torch.device("cpu")).abs().sum()) == 0


@pytest.mark.usefixtures("many_tiles")
def test_last_block_refuses_a_combine_reading_the_split_through_a_view() -> None:
    """A combine that reads the split's partials through a view (a reshape: not launched, its memory the split's
    buffer) keeps its two launches: the plan is made only from what the combine reads of the split itself."""
    assert [k.members for k in generate(MuGraph.parse(SPLIT_K), last_block=True).kernels] == [(2, 3)]
    text = SPLIT_K.replace("  %3 = custom %2 {frange=4", "  %3 = reshape %2 {shape=(32, 128)} : f16[32,128]\n"
                           "  %4 = custom %3 {frange=4").replace("return %3", "return %4")
    ms = generate(MuGraph.parse(text), last_block=True)
    assert len(ms.views) == 1 and [k.members for k in ms.kernels] == [(), ()] and ms.counters == 0


_T3 = """graph {
  %0 = input {name='in0'} : f32[2,2,2]
  %1 = transpose %0 {a=0, b=2} : f32[2,2,2]
  %2 = exp %1 : f32[2,2,2]
  %3 = sum %2 {axis=2} : f32[2,2,1]
  return %3
}"""


def test_plan_key_takes_no_transpose_for_another_permute() -> None:
    """``capture.plan_key`` writes transpose(a, b) as the permute swapping a and b (3-D, the axes either way round) and
    nothing else: another permutation of the same shape (a rotation) keeps another key; and a plan entry for that
    other program, filed under the transpose's key (a tampered or stale plan), is refused by the re-check with its
    certificate (not about this partition) and without it (not proved)."""
    from verimirage.integrations.capture import plan_key
    from verimirage.smt.certify import certify

    tr = Graph.parse(_T3)
    same = Graph.parse(_T3.replace("transpose %0 {a=0, b=2}", "permute %0 {dims=(2, 1, 0)}"))
    swapped = Graph.parse(_T3.replace("{a=0, b=2}", "{a=2, b=0}"))
    rot = Graph.parse(_T3.replace("transpose %0 {a=0, b=2}", "permute %0 {dims=(1, 2, 0)}"))
    assert plan_key(tr) == plan_key(same) == plan_key(swapped) != plan_key(rot)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture as cc

    mg = MuGraph.from_graph(rot)
    item = {"mugraph": str(mg), "certificate": certify(rot, mg).to_json()}
    served, why = cc.recheck(tr, [item, str(mg)], 2, {})
    assert not served and "not about this partition" in why[0] and "not proved" in why[1], why
    ok = MuGraph.from_graph(same)  # the right program in the other spelling, with its certificate: proved here
    served, why = cc.recheck(tr, [{"mugraph": str(ok), "certificate": certify(same, ok).to_json()}], 2, {})
    assert [str(s) for s in served] == [str(ok)], why
    json.dumps(item)  # (the entry is what make_plan writes: JSON)


@interp
def test_select_checks_only_the_first_input_set_and_says_so(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``profile.select(input_sets=)``: the output check runs on ``inputs`` (the proof covers every input; the check
    is the backstop against the code generator); the other sets are timed. A candidate that fails on a timing set
    fails that timing (an exception is the candidate's error), so no candidate is ranked on a set it crashed on."""
    from test_select_rotate import _graph, _inputs, _setup

    torch, profile, _ = _setup(monkeypatch)
    g = _graph()
    xs = _inputs(torch, g, 0)
    bad = {"x": xs["x"], "b": xs["b"].to(torch.float16)}

    def boom(fn: Any, rep: int = 0, return_mode: str = "") -> float:
        raise RuntimeError("a timing set crashed the candidate")

    import triton.testing

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", boom)
    monkeypatch.setattr(triton.testing, "do_bench", boom)
    out = profile.select(g, [g], configs=profile.DEFAULT_CONFIGS[:1], inputs=xs, input_sets=[bad], cache=False)
    assert out[0].ms is None and "crashed" in (out[0].error or "")


#: split-K whose column tiles are not powers of two (48 split columns, 24 combine columns: padded to 64 and 32 in
#: registers, the stores masked)
SPLIT_K_PADDED = (SPLIT_K.replace("f16[256,128]", "f16[256,96]").replace("shape=(256, 128)", "shape=(256, 96)")
                  .replace("f16[32,64]", "f16[32,48]").replace("f16[8,64]", "f16[8,48]")
                  .replace(": f16[32,128] {", ": f16[32,96] {").replace("shape=(32, 128)", "shape=(32, 96)")
                  .replace(": f16[8,128] {", ": f16[8,96] {").replace("(32, 96)} : f16[8,32]", "(32, 96)} : f16[8,24]")
                  .replace("%1 = loop_sum %0 : f16[8,32]", "%1 = loop_sum %0 : f16[8,24]")
                  .replace("%2 = relu %1 : f16[8,32]", "%2 = relu %1 : f16[8,24]"))


@interp
@pytest.mark.usefixtures("many_tiles")
def test_last_block_with_padded_tiles_in_a_shuffled_block_order(block_order: Any) -> None:
    """Tiles padded in registers (masked stores at the tails of the partials' columns), the interpreter's blocks in a
    random order: the one launch equals the two launches bit for bit and float64 within fp16 accuracy."""
    mg = MuGraph.parse(SPLIT_K_PADDED)
    xs = _inputs(mg, 2)
    want = _run(vm.compile(mg, last_block=False), mg, xs)
    f1 = vm.compile(mg, last_block=True)
    assert len(f1.kernels) == 1
    rng = np.random.default_rng(3)
    cache: dict[int, list[int]] = {}
    block_order(lambda n: cache.setdefault(n, [int(v) for v in rng.permutation(n)]))
    got = _run(f1, mg, xs)
    ref = vm.evaluate(mg, {k: v.astype(np.float64) for k, v in xs.items()})[0]
    assert np.array_equal(got, want) and np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max()


def _rows(gp: int, gc: int) -> MuGraph:
    """exp over 12 rows in ``gp`` row blocks, then relu over them in ``gc`` row blocks."""
    return MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f16[12,8]
  %1 = custom %0 {{frange=1, grid=({gp},)}} : f16[12,8] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=(12, 8)}} : f16[{12 // gp},8]
    %1 = exp %0 : f16[{12 // gp},8]
    output %1 {{omap=(0,)}}
  }}
  %2 = custom %1 {{frange=1, grid=({gc},)}} : f16[12,8] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=(12, 8)}} : f16[{12 // gc},8]
    %1 = relu %0 : f16[{12 // gc},8]
    output %1 {{omap=(0,)}}
  }}
  return %2
}}""")


@pytest.mark.parametrize(("gp", "gc"), [(2, 3), (2, 4), (4, 2), (3, 6), (6, 4)])
def test_persistent_tile_waits_cover_every_row_a_consumer_block_reads(gp: int, gc: int) -> None:
    """Tile waits (VERIMIRAGE_PERSISTENT_TILES): each consumer block waits for exactly the producer blocks whose
    rows it reads, where the row blocks nest (finer, coarser); where they do not (12 rows in 2 and 3 blocks, in 6 and
    4), the consumer waits for the whole producer (its completion counter), never for a box that misses a row."""
    from verimirage.backend.codegen import box_blocks, tile_box

    mg = _rows(gp, gc)
    nodes = node_list(mg)
    (inp,) = [n for n in nodes[2].attr("block").nodes if n.op == "input"]
    box = tile_box(nodes[1].attr("block"), 0, nodes[2].attr("block"), inp, (12, 8))
    src = generate(mg, persistent=True, tile_waits=True).source
    if (12 // gc) % (12 // gp) and (12 // gp) % (12 // gc):
        assert box is None and "fb = ctr_ptr" not in src and 'sem="acquire"' in src
        return
    assert box is not None and "fb = ctr_ptr" in src
    for c in range(gc):
        need = {r // (12 // gp) for r in range(c * (12 // gc), (c + 1) * (12 // gc))}
        assert {b[0] for b in box_blocks(box, (c,))} == need, (c, box)
