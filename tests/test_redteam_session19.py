"""Red team (nineteenth session): findings, each a test named after what went wrong (what held:
``tests/test_redteam_held19.py``)."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline import fpsafe

#: a float32 softmax of 4 rows of 255 in three kernels: kernel 1 writes each block's max over 128 columns of a row
#: (255 = 2 x 128 - 1: the second block's tile reads one column of zero padding), kernel 2 exps each block's tile
#: shifted by the max of its row's partial maxima (the result cropped to 255), kernel 3 divides by the row's sum
_TAILED_SPLIT = """mugraph {
  %0 = input {name='x'} : f32[4,255]
  %1 = custom %0 {frange=1, grid=(4, 2)} : f32[4,2] {
    %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(4, 255)} : f32[1,128]
    %1 = max %0 {axis=1} : f32[1,1]
    output %1 {omap=(0, 1)}
  }
  %2 = custom %1, %0 {frange=1, grid=(4, 2)} : f32[4,255] {
    %0 = input {arg=0, fmap=None, imap=(0, None), shape=(4, 2)} : f32[1,2]
    %1 = max %0 {axis=1} : f32[1,1]
    %2 = input {arg=1, fmap=None, imap=(0, 1), shape=(4, 255)} : f32[1,128]
    %3 = sub %2, %1 : f32[1,128]
    %4 = exp %3 : f32[1,128]
    output %4 {omap=(0, 1)}
  }
  %3 = custom %2 {frange=1, grid=(4,)} : f32[4,255] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(4, 255)} : f32[1,255]
    %1 = sum %0 {axis=1} : f32[1,1]
    %2 = div %0, %1 : f32[1,255]
    output %2 {omap=(0,)}
  }
  return %3
}"""


def test_cross_kernel_max_shift_took_a_max_over_zero_padding_as_the_rows_own_max() -> None:
    """ef75aa3 follows a max of partial maxima into the kernel that wrote them and counts the exp it shifts as shifted
    by the row's own max. It checked that the partials tile their own output exactly, not that the first kernel's
    tiles tile the reduced dim: with a masked tail there the zero padding enters every partial, so the shift is
    ``max(row max, 0)``, an over-shift; on a row far below zero every exp underflows and the row is 0 / 0, where the
    softmax is finite. The structural check (the only one at sizes above the numeric limit) accepted it. Not reachable
    by the search today (its reduction splits divide, and ``vm.verify`` cannot prove a max over zero padding: Unknown
    here), but the check must not lean on either."""
    g = vm.Graph()
    x = g.input("x", (4, 255), vm.float32)
    e = g.exp(g.sub(x, g.max(x, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    mg = vm.MuGraph.parse(_TAILED_SPLIT)
    assert fpsafe.exp_shifts(mg) != ["max"]
    assert "max" in (fpsafe.SafetyChecker(g, numeric=False).check(mg) or "")
    # what the kernels compute: a row 200 below zero is NaN (exp(-200) is 0 in fp32), the softmax is finite there
    torch = pytest.importorskip("torch")
    xs = np.random.default_rng(0).normal(0.0, 1.0, (4, 255)).astype(np.float32)
    xs[1] -= 200.0
    out = vm.compile(mg)(x=torch.tensor(xs))
    out = (out[0] if isinstance(out, tuple) else out).double().numpy()
    assert np.isfinite(vm.evaluate(g, {"x": xs.astype(np.float64)})[0]).all()
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2, 3]]).all()


def test_cross_kernel_max_shift_of_whole_tiles_is_still_taken() -> None:
    """The same three kernels over 256 columns (two whole tiles of 128): the shift is the row's own max."""
    g = vm.Graph()
    x = g.input("x", (4, 256), vm.float32)
    e = g.exp(g.sub(x, g.max(x, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    mg = vm.MuGraph.parse(_TAILED_SPLIT.replace("255", "256"))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    assert fpsafe.exp_shifts(mg) == ["max"]
    assert fpsafe.SafetyChecker(g, numeric=False).check(mg) is None
