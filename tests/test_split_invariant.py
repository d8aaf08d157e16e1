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


# the whole attention over the cache: Q K^T, the max joined with the new token's score (maximum), the shifted exps,
# P @ V plus the new token's term, the sums, the division (regions 5-7 of the bs1 layer's split)
ATTN = list(range(39, 59))


def _flash_lowerings(reg: vm.Graph) -> tuple[list[P.Lowered], dict[str, int]]:
    lows, rejected = P.lower_all(reg, rank=pricing.cost)
    return [lo for lo in lows if {"partition.split_kv", "partition.online_softmax"} <= set(lo.steps)], rejected


def test_the_decode_attention_with_its_new_token_lowers_to_flash_decoding() -> None:
    """max(scores) joined with the new token's score by ``maximum`` was a post-loop value, so ``scores - m`` mixed a
    post-loop value with a loop-varying one and the attention had no one-pass form (4 kernels in the layer: Q K^T,
    the softmax, P @ V, a combine). The join is itself a running max (the running max of max(tile max, score)):
    one split-KV kernel reads K and V once, a combine kernel merges the splits and adds the new token."""
    g = get_layer("decode_bs1", small=True)
    reg = region_of(g, ATTN).graph
    assert sum(n.op == "maximum" for n in reg.nodes) == 1
    flash, rejected = _flash_lowerings(reg)
    assert flash, rejected
    best = min(flash, key=lambda lo: pricing.cost(lo.mugraph).time_s)
    assert best.mugraph.num_kernels == 2
    body = next(n for n in best.mugraph.nodes if n.op == "custom").attr("block")
    assert [n.op for n in body.nodes].count("running_max") >= 1
    rng = np.random.default_rng(2)
    ins = {t.name: rng.uniform(-2.0, 2.0, t.shape) for t in reg.inputs}
    for lo in flash[:4]:
        for a, b in zip(vm.evaluate(lo.mugraph, ins), vm.evaluate(reg, ins), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert isinstance(vm.verify(reg, best.mugraph), vm.Proved)


def test_flash_decoding_with_a_dominant_new_token_matches_float64_in_the_interpreter() -> None:
    """The new token's score far above the cached ones (its exp-weight ~1, the cache's ~0) and far below: the joined
    max must shift both sides, or exp overflows (fp16) or the division loses the cache."""
    g = get_layer("decode_bs1", small=True)
    reg = region_of(g, ATTN).graph
    lows, _ = P.lower_all(reg, rank=pricing.cost)
    # the cheapest split-KV form, splits with a 2-step loop each (their combine a loop over the splits, or one tile of
    # them all), and one kernel looping over all the keys (the running max rescales across iterations, then splits)
    picks = [min(_flash_lowerings(reg)[0], key=lambda lo: pricing.cost(lo.mugraph).time_s)]
    shapes = ((True, False), (True, True), (False, False))  # (split, combine in one tile)
    picks += [next(lo for lo in lows if "partition.online_softmax" in lo.steps and lo.config is not None
                   and lo.config.frange > 1 and (lo.config.splits > 1) == split
                   and lo.config.combine_whole == whole) for split, whole in shapes]
    for lo in picks:
        _run_against_float64(reg, lo)


def _run_against_float64(reg: vm.Graph, lo: P.Lowered) -> None:
    import torch

    fn = vm.compile(lo.mugraph)
    names = [t.name for t in reg.inputs]
    shapes = {t.name: t.shape for t in reg.inputs}
    for scale_new in (8.0, -8.0, 0.0):
        rng = np.random.default_rng(3)
        ins = {k: rng.uniform(-1.0, 1.0, shapes[k]) for k in names}
        if scale_new:
            for k in names:  # push the new token's score: scale every (H, 1, D) input (new key, new value)
                if len(shapes[k]) == 3 and shapes[k][1] == 1:
                    ins[k] = ins[k] * scale_new
        ins16 = {k: v.astype(np.float16).astype(np.float64) for k, v in ins.items()}
        ref = vm.evaluate(reg, ins16)
        outs = fn(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins16.items()})
        outs = outs if isinstance(outs, tuple) else (outs,)
        for o, r in zip(outs, ref, strict=True):
            assert np.isfinite(o.double().numpy()).all()
            assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) < 5e-3


def test_a_combine_in_one_tile_reduces_the_splits_without_a_loop() -> None:
    """The combine kernel's loop over 32 splits waited on each iteration's few loads in turn (6.9 us for the bs1
    layer's attention on an H100, 07:26 UTC 2026-11-27; its split kernel 6.4). Read as one tile, the splits along a
    size-1 dim of the partials, reduced by max and sums: 3.3 us (benchmarks/perf/attn_split_ab.py, 07:37)."""
    g = get_layer("decode_bs1", small=True)
    reg = region_of(g, ATTN).graph
    flash, _ = _flash_lowerings(reg)
    whole = [lo for lo in flash if lo.config is not None and lo.config.combine_whole]
    assert whole and all(lo.config is not None and not lo.config.combine_whole for lo in flash if lo not in whole)
    lo = min(whole, key=lambda lo: pricing.cost(lo.mugraph).time_s)
    combine = [n for n in lo.mugraph.nodes if n.op == "custom"][-1]
    block = combine.attr("block")
    assert block.frange == 1
    ops = [n.op for n in block.nodes]
    assert not {"loop_max", "running_max", "rescaled_sum", "loop_sum"} & set(ops) and "max" in ops
    assert isinstance(vm.verify(reg, lo.mugraph), vm.Proved)
