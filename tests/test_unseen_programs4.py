"""Held-out programs, fourth set (benchmarks/unseen_graphs4.py): full-size ``vm.Graph`` programs of open LLMs, here
as their scaled-down twins (the same ops, dtypes and structure at small sizes).

Each twin is superoptimized (the search cache off; every candidate Proved) and its best candidate's kernels, run in
Triton's interpreter, compared with the float64 reference. The full-size searches and their times are the benchmark
script's (``benchmarks/results/unseen4/``), not CI's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_graphs4 as u4  # noqa: E402

import verimirage as vm  # noqa: E402
from verimirage.pipeline import fpsafe  # noqa: E402

#: relative tolerance of an output against float64 over max(1, its largest magnitude), per dtype: the narrowest
#: float dtype a program computes in (the router's float32 softmax reads half-precision logits)
TOL = {"float16": 2e-2, "float32": 1e-4}
#: twins whose search (regions) and interpreter run take longest: the slow tier
SLOW = {"gptj_parallel_decode_layer", "qk_layernorm_attention", "partial_rotary_attention", "mla_absorbed_decode"}
_TORCH = {vm.float16: torch.float16, vm.float32: torch.float32, vm.bool: torch.bool}


def _error(g: vm.Graph, cand: vm.MuGraph) -> list[float]:
    ins = u4.program_inputs(g)
    ref = vm.evaluate(g, ins)
    out = vm.compile(cand)(*[torch.from_numpy(np.asarray(ins[t.name])).to(_TORCH[t.dtype]) for t in g.inputs])
    outs = out if isinstance(out, (list, tuple)) else [out]
    return [float(np.abs(o.double().numpy() - r).max()) / max(1.0, float(np.abs(r).max()))
            for o, r in zip(outs, ref, strict=True)]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow if n in SLOW else ()) for n in u4.PROGRAMS])
def test_fourth_set_twin_is_proved_and_matches_float64(name: str) -> None:
    g = u4.build(name, small=True)
    res = vm.superoptimize(g, cache=False, progress=False, time_budget_s=30.0)
    assert res.candidates and all(isinstance(c.verdict, vm.Proved) for c in res.candidates), str(res.report)
    assert res.best is not None and res.best.mugraph.num_kernels < vm.MuGraph.from_graph(g).num_kernels
    tol = max(TOL.get(t.dtype.name, 0.0) for t in [*g.inputs, *g.outputs])
    for e in _error(g, res.best.mugraph):
        assert e < tol, f"{name}: error {e:.2e} against float64 (tolerance {tol})"


def test_fourth_set_full_sizes_build_and_are_priced() -> None:
    """Every full-size program builds and checks, and the one-kernel-per-op estimate the table divides by exists."""
    for name in u4.PROGRAMS:
        g = u4.build(name)
        assert u4.unfused_estimate_s(g) > 0
        assert [t.name for t in g.inputs] == [t.name for t in u4.build(name, small=True).inputs]


# --------------------------------------------------------------------------- the max-shift check's recomputation

#: a one-kernel ALiBi decode (4 heads, 64 keys) as the search lowers it at 1,024 keys: the scores a fused thread
#: graph (%8) whose max (%9) is taken; the exp's thread graph (%10) recomputes the same chain, then subtracts it
_ALIBI_FUSED = """mugraph {
  %0 = input {name='q'} : f16[4,1,16]
  %1 = input {name='k'} : f16[4,16,64]
  %2 = input {name='v'} : f16[4,64,16]
  %3 = input {name='slopes'} : f32[4,1,1]
  %4 = input {name='positions'} : f32[1,1,64]
  %5 = custom %0, %1, %2, %3, %4 {frange=2, grid=(4, 1)} : f16[4,1,16] {
    %0 = input {arg=0, fmap=2, imap=(0, None), shape=(4, 1, 16)} : f16[1,1,8]
    %1 = input {arg=1, fmap=1, imap=(0, None), shape=(4, 16, 64)} : f16[1,8,64]
    %2 = input {arg=2, fmap=None, imap=(0, 2), shape=(4, 64, 16)} : f16[1,64,16]
    %3 = input {arg=3, fmap=None, imap=(0, None), shape=(4, 1, 1)} : f32[1,1,1]
    %4 = input {arg=4, fmap=None, imap=(None, None), shape=(1, 1, 64)} : f32[1,1,64]
    %5 = matmul %0, %1 : f16[1,1,64]
    %6 = loop_sum %5 : f16[1,1,64]
    %7 = mul %3, %4 : f32[1,1,64]
    %8 = fused %6, %7 : f32[1,1,64] {
      %0 = arg {index=0} : f16[1,1,64]
      %1 = arg {index=1} : f32[1,1,64]
      %2 = cast %0 {dtype='f32'} : f32[1,1,64]
      %3 = scale %2 {c=0.25} : f32[1,1,64]
      %4 = add %3, %1 : f32[1,1,64]
      return %4
    }
    %9 = max %8 {axis=2} : f32[1,1,1]
    %10 = fused %6, %7, %9 : f32[1,1,64] {
      %0 = arg {index=0} : f16[1,1,64]
      %1 = arg {index=1} : f32[1,1,64]
      %2 = arg {index=2} : f32[1,1,1]
      %3 = cast %0 {dtype='f32'} : f32[1,1,64]
      %4 = scale %3 {c=SCALE} : f32[1,1,64]
      %5 = add %4, %1 : f32[1,1,64]
      %6 = sub %5, %2 : f32[1,1,64]
      %7 = exp %6 : f32[1,1,64]
      return %7
    }
    %11 = sum %10 {axis=2} : f32[1,1,1]
    %12 = fused %10, %11 : f16[1,1,64] {
      %0 = arg {index=0} : f32[1,1,64]
      %1 = arg {index=1} : f32[1,1,1]
      %2 = div %0, %1 : f32[1,1,64]
      %3 = cast %2 {dtype='f16'} : f16[1,1,64]
      return %3
    }
    %13 = matmul %12, %2 : f16[1,1,16]
    output %13 {omap=(0, 2)}
  }
  return %5
}"""


def test_fp_check_rejected_a_max_shift_whose_thread_graph_recomputes_the_maxed_value() -> None:
    """The floating-point check's structural part (the only part for programs too large to evaluate) asks every exp
    to be of ``x - max(x)``. It compared ``x`` by node identity, so a fused kernel whose exp's thread graph
    recomputes the chain a block value (the one the max reads) was computed by counted as unshifted: every fused
    candidate of the full-size ALiBi decode (float32 scores plus a bias) was rejected and the search returned
    12 kernels. The same op over the same values with the same attributes is the same value now; a chain that
    differs (another scale) is still not."""
    g = u4.build("alibi_decode", small=True)
    good = vm.MuGraph.parse(_ALIBI_FUSED.replace("SCALE", "0.25"))
    assert isinstance(vm.verify(g, good), vm.Proved)
    assert fpsafe.exp_shifts(good) == ["max"]
    assert fpsafe.SafetyChecker(g, numeric=False).check(good) is None
    assert fpsafe.fp_safety(g, good) is None  # (and numerically, at this size)
    other = vm.MuGraph.parse(_ALIBI_FUSED.replace("SCALE", "0.5"))  # the exp's chain is not the maxed one
    assert fpsafe.exp_shifts(other) == ["sum"]
    assert "max" in (fpsafe.SafetyChecker(g, numeric=False).check(other) or "")


#: a float32 softmax of 4 rows of 256 split over 2 blocks a row: kernel 1 writes each block's (rescaled sum, max) of
#: ``ASCALE * x``; kernel 2 reads all of a row's partials, takes their max M and sum, and recomputes ``0.5 x``'s
#: exp shifted by M (the two-pass form of a row too wide for one block)
_SPLIT_SOFTMAX = """mugraph {
  %0 = input {name='x'} : f32[4,256]
  %1 = custom %0 {frange=1, grid=(4, 2)} : f32[4,2], f32[4,2] {
    %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(4, 256)} : f32[1,128]
    %1 = scale %0 {c=ASCALE} : f32[1,128]
    %2 = max %1 {axis=1} : f32[1,1]
    %3 = clamp %2 {hi=3.4028234663852886e+38, lo=-3.4028234663852886e+38} : f32[1,1]
    %4 = running_max %3 : f32[1,1]
    %5 = sub %1, %4 : f32[1,128]
    %6 = exp %5 : f32[1,128]
    %7 = sum %6 {axis=1} : f32[1,1]
    %8 = rescaled_sum %7, %4 : f32[1,1]
    %9 = loop_max %4 : f32[1,1]
    output %8 {omap=(0, 1)}
    output %9 {omap=(0, 1)}
  }
  %2 = custom %1.0, %1.1, %0 {frange=1, grid=(4, 2)} : f32[4,256] {
    %0 = input {arg=0, fmap=None, imap=(0, None), shape=(4, 2)} : f32[1,2]
    %1 = input {arg=1, fmap=None, imap=(0, None), shape=(4, 2)} : f32[1,2]
    %2 = max %1 {axis=1} : f32[1,1]
    %3 = sub %1, %2 : f32[1,2]
    %4 = exp %3 : f32[1,2]
    %5 = mul %0, %4 : f32[1,2]
    %6 = sum %5 {axis=1} : f32[1,1]
    %7 = input {arg=2, fmap=None, imap=(0, 1), shape=(4, 256)} : f32[1,128]
    %8 = scale %7 {c=0.5} : f32[1,128]
    %9 = sub %8, %2 : f32[1,128]
    %10 = exp %9 : f32[1,128]
    %11 = div %10, %6 : f32[1,128]
    output %11 {omap=(0, 1)}
  }
  return %2
}"""


def test_fp_check_rejected_a_row_split_softmax_shifted_by_the_max_of_its_partial_maxima() -> None:
    """A softmax row too wide for one block is computed in two kernels: per-block (sum, max) partials, then each
    block recomputes its exps shifted by the max of the row's partial maxima. The structural check traced a max only
    within a kernel, so it called that exp unshifted and refused every such candidate of a program too large for the
    numeric check: Qwen2.5-7B's sampling softmax over 152,064 entries kept its 7 unfused kernels. A max of partials is
    now followed into the kernel that wrote them (same grid and loop, the partials read whole along the split axis
    and aligned on the others, each partial a max of the same chain over the same tiles); a second pass exp'ing
    another value than the first pass maxed is still refused."""
    g = vm.Graph()
    x = g.input("x", (4, 256), vm.float32)
    s = g.scale(x, 0.5)
    e = g.exp(g.sub(s, g.max(s, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    good = vm.MuGraph.parse(_SPLIT_SOFTMAX.replace("ASCALE", "0.5"))
    assert isinstance(vm.verify(g, good), vm.Proved)
    assert fpsafe.exp_shifts(good) == ["max"] * 4
    assert fpsafe.SafetyChecker(g, numeric=False).check(good) is None
    assert fpsafe.fp_safety(g, good) is None  # (and numerically, at this size)
    other = vm.MuGraph.parse(_SPLIT_SOFTMAX.replace("ASCALE", "0.25"))  # the partials are maxima of 0.25 x
    assert fpsafe.exp_shifts(other)[-1] == "sum"
    assert "max" in (fpsafe.SafetyChecker(g, numeric=False).check(other) or "")


#: a softmax of 2 x 4 rows of 64, one row a block: kernel 1 writes each row's (sum, max); kernel 2 shifts a row's exps
#: by the max of all 4 rows' maxima (its grid axis 1 walks rows, not the reduced axis) and divides by its own sum
#: rescaled to that max: equal over the reals, but a row far below another has every exp 0 and 0 / 0
_ROW_MIX = """mugraph {
  %0 = input {name='x'} : f32[2,4,64]
  %1 = custom %0 {frange=1, grid=(2, 4)} : f32[2,4,1], f32[2,4,1] {
    %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(2, 4, 64)} : f32[1,1,64]
    %1 = max %0 {axis=2} : f32[1,1,1]
    %2 = clamp %1 {hi=3.4028234663852886e+38, lo=-3.4028234663852886e+38} : f32[1,1,1]
    %3 = running_max %2 : f32[1,1,1]
    %4 = sub %0, %3 : f32[1,1,64]
    %5 = exp %4 : f32[1,1,64]
    %6 = sum %5 {axis=2} : f32[1,1,1]
    %7 = rescaled_sum %6, %3 : f32[1,1,1]
    %8 = loop_max %3 : f32[1,1,1]
    output %7 {omap=(0, 1)}
    output %8 {omap=(0, 1)}
  }
  %2 = custom %1.0, %1.1, %1.1, %0 {frange=1, grid=(2, 4)} : f32[2,4,64] {
    %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(2, 4, 1)} : f32[1,1,1]
    %1 = input {arg=1, fmap=None, imap=(0, 1), shape=(2, 4, 1)} : f32[1,1,1]
    %2 = input {arg=2, fmap=None, imap=(0, None), shape=(2, 4, 1)} : f32[1,4,1]
    %3 = max %2 {axis=1} : f32[1,1,1]
    %4 = sub %1, %3 : f32[1,1,1]
    %5 = exp %4 : f32[1,1,1]
    %6 = mul %0, %5 : f32[1,1,1]
    %7 = input {arg=3, fmap=None, imap=(0, 1), shape=(2, 4, 64)} : f32[1,1,64]
    %8 = sub %7, %3 : f32[1,1,64]
    %9 = exp %8 : f32[1,1,64]
    %10 = div %9, %6 : f32[1,1,64]
    output %10 {omap=(0, 1)}
  }
  return %2
}"""


def test_fp_check_takes_no_max_of_other_rows_partials_as_a_max_shift() -> None:
    """The follow-through into the partials' kernel must show the partials are of the exp's own row: here the
    whole-read grid axis walks the rows, so M is the max over 4 rows (the red team's over-shift, across kernels)."""
    g = vm.Graph()
    x = g.input("x", (2, 4, 64), vm.float32)
    e = g.exp(g.sub(x, g.max(x, 2)))
    g.output(g.div(e, g.sum(e, 2)))
    mix = vm.MuGraph.parse(_ROW_MIX)
    assert isinstance(vm.verify(g, mix), vm.Proved)
    assert fpsafe.exp_shifts(mix)[-1] == "sum"
    assert "max" in (fpsafe.SafetyChecker(g, numeric=False).check(mix) or "")
    assert "non-finite" in (fpsafe.SafetyChecker(g).numeric_check(mix) or "")  # (as the numeric check sees it)
