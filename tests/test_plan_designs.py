"""Why the decode plan's designs were poor (H100, 2026-11-26 20:00: partitions of 4-48 ops served as 3-39 kernels,
up to 15x slower than Inductor's code for them), each cause a regression test: the e-graph's extracted terms lost
every cast (ill-typed), and an explicit ``broadcast_to`` kept the dims it broadcasts along whole in a tile."""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.ir.graph import Graph, node_list
from verimirage.ir.ops import get_op
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
