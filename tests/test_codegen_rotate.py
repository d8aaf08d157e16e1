"""Concats of slices of one block input (rotary embedding's rotate_half) loaded directly, without slicing and
joining the loaded tile (codegen 12, issue 22): which concats qualify, and that the kernels match float64."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import generate

pytest.importorskip("egglog")  # the search (rewrite/) needs it; the GPU machine has none
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all


def _graph(kind: str) -> vm.Graph:
    """``concat(pieces of X) * C + X`` with the pieces: rotary's rotate_half (``rot``), the halves in place, one
    negated (``signs``), or a piece repeated (``repeat``: not a permutation of the dim)."""
    g = vm.Graph()
    x, c = g.input("X", (8, 16), vm.float32), g.input("C", (8, 16), vm.float32)
    lo, hi = g.slice(x, 1, 0, 8), g.slice(x, 1, 8, 16)
    pieces = {"rot": [g.neg(hi), lo], "signs": [lo, g.neg(hi)], "repeat": [g.neg(lo), lo]}[kind]
    g.output(g.add(g.mul(g.concat(pieces, 1), c), x))
    return g


def _one_kernel(g: vm.Graph) -> vm.Graph:
    lows, _ = lower_all(g, grids=(2,), franges=(1,), rank=pricing.cost)
    return next(low.mugraph for low in lows if low.mugraph.num_kernels == 1)


def _run(mg: vm.Graph, ins: dict[str, np.ndarray]) -> np.ndarray:
    torch = pytest.importorskip("torch")
    out = vm.compile(mg)(*[torch.tensor(ins[t.name], dtype=torch.float32) for t in mg.inputs])
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.double().numpy()


@pytest.mark.parametrize("kind", ["rot", "signs", "repeat"])
def test_a_concat_of_slices_of_an_input_is_loaded_directly_and_matches_float64(kind: str) -> None:
    g = _graph(kind)
    mg = _one_kernel(g)
    src = generate(mg).source
    assert "tl.join" not in src and "tl.split" not in src, src
    # a rotation of the dim (rot): one load with the index modulo 16; otherwise a masked load per piece
    assert ("% 16) * a" in src) == (kind == "rot"), src
    rng = np.random.default_rng(7)
    ins = {"X": rng.uniform(-1, 1, (8, 16)), "C": rng.uniform(-1, 1, (8, 16))}
    np.testing.assert_allclose(_run(mg, ins), vm.evaluate(g, ins)[0], rtol=1e-6, atol=1e-6)


def test_the_rotary_model_kernels_match_float64() -> None:
    from verimirage.benchmarks import get_model

    g = get_model("rotary_attention", small=True, dtype=vm.float32)
    lows, _ = lower_all(g, rank=pricing.cost)
    mgs = [low.mugraph for low in lows if low.mugraph.num_kernels <= 2][:3]
    assert mgs
    rng = np.random.default_rng(8)
    ins = {t.name: rng.uniform(-1, 1, t.shape) for t in g.inputs}
    want = vm.evaluate(g, ins)[0]
    srcs = [generate(mg).source for mg in mgs]
    assert any("% 16) * a" in s for s in srcs) and not any("tl.join" in s for s in srcs)
    for mg in mgs:
        np.testing.assert_allclose(_run(mg, ins), want, rtol=1e-4, atol=1e-5)
