"""Split-KV with a loop-invariant epilogue term (issue 23): the decode layer's P @ V plus the new token's term.

The layer's attention over the cache reads the exp-weights the previous region computed, so its P @ V is a sum over
the cached keys plus the new token's term ``e * v_new`` (loop-invariant), divided by the weights' sum. Its split
over the keys was refused ("the combine step needs a loop-invariant value"), so 128 blocks could come only from
grid axes: 4 query heads x 4 tiles of 32 columns per KV head (the bs1 kernel read V in 64-byte runs, each tile 4
times: 10.9 us for 8.4 MB on an H100). The combine kernel now computes such terms from the inputs.
"""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.benchmarks.layer import get_layer
from verimirage.pipeline import pricing
from verimirage.rewrite import partition as P
from verimirage.smt.glue import region_of

PV = [43, 44, 53, 54, 55, 56, 57, 58]  # reshape V, P @ V, the new token's term, the sums, the division


def test_the_decode_layers_p_v_splits_over_the_keys_with_its_new_token_term() -> None:
    g = get_layer("decode_bs1", small=True)
    reg = region_of(g, PV).graph
    assert any(n.op == "div" for n in reg.nodes) and any(n.op == "matmul" for n in reg.nodes)
    lows, rejected = P.lower_all(reg, rank=pricing.cost)
    split = [lo for lo in lows if "partition.split_kv" in lo.steps and "partition.split_recompute" in lo.steps]
    assert split, rejected
    assert not any("loop-invariant value" in r for r in rejected)
    rng = np.random.default_rng(0)
    ins = {t.name: rng.uniform(0.1, 1.0, t.shape) for t in reg.inputs}
    for lo in split[:4]:
        for a, b in zip(vm.evaluate(lo.mugraph, ins), vm.evaluate(reg, ins), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    assert isinstance(vm.verify(reg, split[0].mugraph), vm.Proved)


def test_the_split_p_v_kernels_match_float64_in_the_interpreter() -> None:
    import torch

    g = get_layer("decode_bs1", small=True)
    reg = region_of(g, PV).graph
    lows, _ = P.lower_all(reg, rank=pricing.cost)
    lo = next(lo for lo in lows if "partition.split_kv" in lo.steps and "partition.split_recompute" in lo.steps)
    rng = np.random.default_rng(1)
    ins = {t.name: rng.uniform(0.1, 1.0, t.shape).astype(np.float16).astype(np.float64) for t in reg.inputs}
    ref = vm.evaluate(reg, ins)
    fn = vm.compile(lo.mugraph)
    outs = fn(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()})
    outs = outs if isinstance(outs, tuple) else (outs,)
    for o, r in zip(outs, ref, strict=True):
        assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) < 2e-3
