"""Red team (tenth session): cut lowerings (``partition.cut``, the gridless-product cut)."""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.benchmarks import get_model
from verimirage.pipeline import pricing
from verimirage.rewrite import partition as P


def test_an_input_named_like_a_cut_lost_every_cut_lowering() -> None:
    """Finding (low, completeness): the materialised value of cut point v was read under the name ``cut_v``; a
    program input of that name was taken for it (its type replaced), so the cut's sides did not build and the
    program got no cut lowering at all. The name is now fresh. Every lowering still computes the program."""
    ng = P.normalise(get_model("gelu_mlp", small=True, dtype=vm.float32))
    (v, *_) = P.cut_points(ng)
    old = str(ng.inputs[0].name)
    g = vm.Graph.parse(str(ng).replace(old, f"cut_{v}"))
    assert f"cut_{v}" in [t.name for t in g.inputs]
    lows = P.cut_lowerings(P.normalise(g), rank=pricing.cost)
    assert len(lows) == len(P.cut_lowerings(ng, rank=pricing.cost)) > 0
    rng = np.random.default_rng(0)
    ins = {str(t.name): rng.uniform(-1, 1, t.shape) for t in g.inputs}
    ref = vm.evaluate(g, ins)
    for lo in lows:
        for a, b in zip(vm.evaluate(lo.mugraph, ins), ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
