"""Why the decode plan's designs were poor (H100, 2026-11-26 20:00: partitions of 4-48 ops served as 3-39 kernels,
up to 15x slower than Inductor's code for them), each cause a regression test: the e-graph's extracted terms lost
every cast (ill-typed), and an explicit ``broadcast_to`` kept the dims it broadcasts along whole in a tile."""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.ir.graph import Graph, node_list
from verimirage.ir.ops import get_op
from verimirage.pipeline import pricing
from verimirage.rewrite import partition as P
from verimirage.rewrite.lift import _py_attr

_ONE_HOT = """graph {
  %0 = input {name='x'} : f16[8,256]
  %1 = input {name='t'} : f32[8,1]
  %2 = input {name='iota'} : f32[1,256]
  %3 = broadcast_to %1 {shape=(8, 256)} : f32[8,256]
  %4 = broadcast_to %2 {shape=(8, 256)} : f32[8,256]
  %5 = sub %3, %4 : f32[8,256]
  %6 = abs %5 : f32[8,256]
  %7 = neg %6 : f32[8,256]
  %8 = step %7 {c=-0.5} : f32[8,256]
  %9 = cast %8 {dtype='f16'} : f16[8,256]
  %10 = mul %0, %9 : f16[8,256]
  %11 = sum %10 {axis=1} : f16[8,1]
  return %11
}"""


def test_extracted_cast_keeps_its_dtype_name() -> None:
    """A term read back from the e-graph names its cast's dtype as the lifted program does ("f16"): it was a DType
    object, printed "DType.float16", which the cast's type rule rejects, so every extracted term with a cast (the
    corpus's fp16 programs with fp32 norms, softmaxes and losses) was pruned as ill-typed and no rewrite reached
    them (softmax_head's logits softmax: 10 kernels, 67.5 us est.)."""
    assert _py_attr(get_op("cast"), "dtype", "f16") == "f16"
    g = Graph.parse(_ONE_HOT)
    r = vm.superoptimize(g, time_budget_s=5.0, top_k=1, cache=False)
    assert not [k for k in r.report.pruned if "ill-typed" in k], r.report.pruned
    assert r.best is not None and r.best.mugraph.num_kernels == 1, r.report


def test_broadcast_to_read_by_an_elementwise_op_does_not_keep_its_dims_whole() -> None:
    """``normalise`` drops a ``broadcast_to`` whose reader broadcasts anyway (the result keeps its shape), so the
    one-hot compare's rows and columns split: before, both dims were whole (the only fused lowering one block of
    the whole tile), and cross-entropy's target gather was searched as one kernel per op (11 kernels)."""
    g = Graph.parse(_ONE_HOT)
    assert P.analyse(g).data_parallel() == []
    n = P.normalise(g)
    assert "broadcast_to" not in [x.op for x in node_list(n)]
    an = P.analyse(n)
    assert an.data_parallel() and an.reduction_labels()
    rng = np.random.default_rng(0)
    xs = {"x": rng.standard_normal((8, 256)).astype(np.float16),
          "t": rng.integers(0, 256, (8, 1)).astype(np.float32), "iota": np.arange(256, dtype=np.float32)[None]}
    want, got = vm.evaluate(g, xs)[0], vm.evaluate(n, xs)[0]
    assert np.asarray(want).shape == (8, 1)
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=0, atol=0)


def test_broadcast_to_that_sets_the_shape_is_kept() -> None:
    """A ``broadcast_to`` whose removal would change its reader's shape (a unary op, or the only wide operand) stays."""
    g = Graph.parse("""graph {
  %0 = input {name='a'} : f32[8,1]
  %1 = input {name='b'} : f32[8,1]
  %2 = broadcast_to %0 {shape=(8, 64)} : f32[8,64]
  %3 = neg %2 : f32[8,64]
  %4 = add %2, %1 : f32[8,64]
  return %3, %4
}""")
    n = P.normalise(g)
    assert str(n) == str(g)


_QKV = """graph {
  %0 = input {name='x'} : f16[4,1,64]
  %1 = input {name='wq'} : f16[64,64]
  %2 = permute %1 {dims=(1, 0)} : f16[64,64]
  %3 = matmul %0, %2 : f16[4,1,64]
  %4 = reshape %3 {shape=(4, 1, 4, 16)} : f16[4,1,4,16]
  %5 = permute %4 {dims=(0, 2, 1, 3)} : f16[4,4,1,16]
  %6 = input {name='wk'} : f16[64,64]
  %7 = permute %6 {dims=(1, 0)} : f16[64,64]
  %8 = matmul %0, %7 : f16[4,1,64]
  %9 = reshape %8 {shape=(4, 1, 4, 16)} : f16[4,1,4,16]
  %10 = permute %9 {dims=(0, 2, 1, 3)} : f16[4,4,1,16]
  return %5, %10
}"""


_ONE_PROJ = "\n".join(_QKV.split("\n")[:7]) + "\n  return %5\n}"


def _qkv_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.3).astype(np.float16).astype(np.float64)
            for n, s in (("x", (4, 1, 64)), ("wq", (64, 64)), ("wk", (64, 64)))}


def _run_f16(mg: vm.MuGraph, ins: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch

    outs = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()})
    return [o.double().numpy() for o in (outs if isinstance(outs, (tuple, list)) else [outs])]


def test_a_projection_split_into_heads_is_tiled_by_head() -> None:
    """A projection whose output a reshape splits into heads (``(B, 1, H*D) -> (B, 1, H, D)``, then the head
    permute) may be tiled along its columns one head (or several) a block: the label of the columns walks the
    heads, and its size is the 4 parts it may be split into, while its tile along the product is 64 / parts
    columns. The matmul minimum tile was checked against the parts (4 < 16), so no grid ever split the columns:
    the decode plan's QKV projections were split-K designs, 23 us est. for Inductor's 11-13.5 (H100, 20:00)."""
    g = P.normalise(Graph.parse(_ONE_PROJ))
    an = P.analyse(g)
    (cols,) = [lab for lab in an.data_parallel() if lab in an.mm_extent]
    assert an.size[cols] == 4 and an.tile_of(cols, 4) == 16
    lows, _ = P.lower_all(g, cuts=False, rank=pricing.cost)
    by_head = [lo for lo in lows if lo.config is not None and any(lab == cols and p == 4 for lab, p in lo.config.grid)
               and lo.mugraph.num_kernels == 1]
    assert by_head, "no one-kernel lowering tiles the columns by head"
    ins = _qkv_inputs(1)
    (ref,) = vm.evaluate(Graph.parse(_ONE_PROJ), {k: ins[k] for k in ("x", "wq")})
    for lo in by_head[:2]:
        (got,) = _run_f16(lo.mugraph, {k: ins[k] for k in ("x", "wq")})
        ref64 = np.asarray(ref, np.float64)
        assert np.linalg.norm(got - ref64) / np.linalg.norm(ref64) < 2e-3


def test_independent_projections_of_one_input_share_one_kernel() -> None:
    """Projections of one input into independent outputs (Q and K of attention) have no block axis every output
    carries, so each was a kernel of its own (3 for QKV, 12.4 us est. at decode). ``analyse(zip_parts=True)``
    walks each part's head dim with the first part's, and ``lower_all`` offers one kernel whose block computes
    head h of every part: proved equal, and equal to the float64 reference in the interpreter."""
    g = Graph.parse(_QKV)
    lows, _ = P.lower_all(g, cuts=False, rank=pricing.cost)
    one = [lo for lo in lows if lo.mugraph.num_kernels == 1 and lo.config is not None]
    assert one, "no one-kernel lowering of the two projections"
    from verimirage.pipeline.pricing import cost

    best = min(one, key=lambda lo: cost(lo.mugraph).time_s)
    assert len(next(n for n in node_list(best.mugraph) if n.op == "custom").outs) == 2
    assert isinstance(vm.verify(g, best.mugraph), vm.Proved)
    ins = _qkv_inputs(2)
    refs = vm.evaluate(g, ins)
    for got, ref in zip(_run_f16(best.mugraph, ins), refs, strict=True):
        ref64 = np.asarray(ref, np.float64)
        assert np.linalg.norm(got - ref64) / np.linalg.norm(ref64) < 2e-3
    # parts whose dims differ in size are not zipped
    assert P.analyse(g, zip_parts=True).data_parallel() != P.analyse(g).data_parallel()
    lone = Graph.parse(_QKV.replace("(4, 1, 4, 16)} : f16[4,1,4,16]\n  %10", "(4, 1, 2, 32)} : f16[4,1,2,32]\n  %10")
                       .replace("%9 {dims=(0, 2, 1, 3)} : f16[4,4,1,16]", "%9 {dims=(0, 2, 1, 3)} : f16[4,2,1,32]"))
    zipped = P.analyse(lone, zip_parts=True)
    assert len(zipped.data_parallel()) == len(P.analyse(lone).data_parallel())
