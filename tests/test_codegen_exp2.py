"""A softmax's ``exp(x - max x)`` is emitted as ``tl.exp2`` with log2(e) folded into one FMA (codegen 11, issue 22):
which exps qualify, and that the kernels still match float64 in the interpreter, large logits and NaN included."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import _LOG2E, generate

pytest.importorskip("egglog")  # the search (rewrite/) needs it; the GPU machine has none
from verimirage.rewrite.partition import lower_all

H, N, D = 2, 32, 16


def _attention(shift: str) -> vm.Graph:
    """softmax(Q K) V with the logits shifted by their own row max (``own``), by the max of another input's rows
    (``other``) or not at all (``none``)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (H, N, D), vm.float32), g.input("K", (H, D, N), vm.float32), \
        g.input("V", (H, N, D), vm.float32)
    s = g.matmul(q, k)
    if shift == "own":
        s = g.sub(s, g.max(s, axis=2))
    elif shift == "other":
        y = g.input("Y", (H, N, N), vm.float32)
        s = g.sub(s, g.max(y, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def _fused(g: vm.Graph, frange: int) -> vm.Graph:
    lows, _ = lower_all(g, grids=(H,), franges=(frange,))
    return next(low.mugraph for low in lows if low.mugraph.num_kernels == 1)


def _ins(rng: np.random.Generator, scale: float, other: bool = False) -> dict[str, np.ndarray]:
    ins = {"Q": rng.uniform(-1, 1, (H, N, D)) * scale, "K": rng.uniform(-1, 1, (H, D, N)),
           "V": rng.uniform(-1, 1, (H, N, D))}
    if other:
        ins["Y"] = rng.uniform(-1, 1, (H, N, N))
    return ins


def _run(mg: vm.Graph, ins: dict[str, np.ndarray]) -> np.ndarray:
    torch = pytest.importorskip("torch")
    names = [t.name for t in mg.inputs]
    out = vm.compile(mg)(*[torch.tensor(ins[x], dtype=torch.float32) for x in names])
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.double().numpy()


@pytest.mark.parametrize("frange", [1, 2])  # one tile (max) and the online softmax (running_max)
def test_a_max_shifted_exp_is_exp2_and_matches_float64(frange: int) -> None:
    g = _attention("own")
    mg = _fused(g, frange)
    src = generate(mg).source
    assert f") * {_LOG2E})" in src and "tl.exp(" not in src, src
    rng = np.random.default_rng(3)
    # scale 60: logits up to ~1000 apart in a row, so most terms underflow (flushed to 0 by exp2's ftz)
    for scale in (1.0, 60.0):
        ins = _ins(rng, scale)
        np.testing.assert_allclose(_run(mg, ins), vm.evaluate(g, ins)[0], rtol=1e-4, atol=1e-5)


def test_a_nan_logit_makes_its_row_nan_as_in_the_graph() -> None:
    g = _attention("own")
    mg = _fused(g, 2)
    ins = _ins(np.random.default_rng(4), 1.0)
    ins["Q"][1, 5, 3] = np.nan
    ins["K"][0, 2, 7] = np.inf  # every row of head 0 meets an infinite logit (sign by Q's element)
    want = vm.evaluate(g, ins)[0]
    got = _run(mg, ins)
    assert np.isnan(want[1, 5]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shift", ["other", "none"])
def test_an_exp_not_shifted_by_its_own_max_keeps_tl_exp(shift: str) -> None:
    # exp(x - max y) or exp(x) need not hold a 1 in each row: a flushed term could be the whole row
    g = _attention(shift)
    mg = _fused(g, 1)
    src = generate(mg).source
    assert "tl.exp(" in src and "tl.exp2(" not in src, src
    ins = _ins(np.random.default_rng(5), 1.0, other=shift == "other")
    np.testing.assert_allclose(_run(mg, ins), vm.evaluate(g, ins)[0], rtol=1e-4, atol=1e-5)
