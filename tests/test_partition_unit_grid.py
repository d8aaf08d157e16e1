"""Programs whose outputs have no data-parallel dim (a mean loss): one block, or the blocks of a split
reduction and a combine kernel, instead of every op its own kernel (issue 21: cross-entropy was 12)."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks import get_model
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import analyse, configs, lower_all, normalise


def _inputs(g: vm.Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {t.name: rng.uniform(-1.5, 1.5, t.shape) for t in g.inputs}


@pytest.mark.parametrize("which", ["cross_entropy", "mean_of_means"])
def test_a_program_without_data_parallel_dims_gets_fused_lowerings(which: str) -> None:
    if which == "cross_entropy":
        g = get_model("cross_entropy", small=True, dtype=vm.float32)
    else:
        g = vm.Graph()
        x, y = g.input("X", (8, 32), vm.float32), g.input("Y", (8, 32), vm.float32)
        g.output(g.mean(g.mean(g.mul(x, y), axis=1), axis=0))
    an = analyse(normalise(g))
    assert an.data_parallel() == []
    assert any(not c.grid for c in configs(an))
    lows, _ = lower_all(g, rank=pricing.cost)
    fused = [lw for lw in lows if lw.config is not None and "partition.cut" not in lw.steps]
    assert {lw.mugraph.num_kernels for lw in fused} == {1, 2}  # one block; a split reduction + combine
    assert any(lw.config is not None and lw.config.splits > 1 for lw in fused)
    # and cut at the per-row values (partition._reduced_reductions): the rows get a grid of their own
    cut = [lw for lw in lows if "partition.cut" in lw.steps]
    assert cut
    ins = _inputs(g)
    want = vm.evaluate(g, ins)
    for lw in fused + cut:
        lw.mugraph.check()
        for got, w in zip(vm.evaluate(lw.mugraph, ins), want, strict=True):
            np.testing.assert_allclose(got, w, rtol=1e-9, atol=1e-12, err_msg=" ".join(lw.steps))


def test_cross_entropy_search_finds_one_kernel() -> None:
    pytest.importorskip("egglog")
    g = get_model("cross_entropy", small=True, dtype=vm.float32)
    res = vm.superoptimize(g, time_budget_s=60, max_verify=2, cache=False)
    assert res.best.num_kernels == 1 and isinstance(res.best.verdict, vm.Proved)
