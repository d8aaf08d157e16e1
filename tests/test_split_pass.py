"""Reductions over few, long rows: each row split over several blocks, a second pass in the combine (issue 22).

log_softmax over 16 x 32,000 (a decode step's vocabulary) was one kernel of 16 blocks, one a row: 116 of an H100's
132 SMs idle (4.1 us against a 0.7 us floor). logsumexp already had the reduction analogue of split-K (kernel 1:
a running max and rescaled sum per (row, column block); a combine kernel merges each row's partials), but any
program using the row statistic with the row's values again (``x - logsumexp(x)``, softmax's ``exp(x - m) / s``)
was refused for the split: "sub mixes a post-loop value with a loop-varying value". Now the combine kernel's grid
also walks the split dim (``partition.split_pass``): each of its blocks merges its row's partials and writes its
chunk of the row.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.models import log_softmax, logsumexp
from verimirage.pipeline import pricing
from verimirage.rewrite import partition as P


def _log_softmax(rows: int, cols: int) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (rows, cols), vm.float16)
    g.output(log_softmax(g, x, 1))
    return g


def _softmax(rows: int, cols: int) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (rows, cols), vm.float16)
    e = g.exp(g.sub(x, g.max(x, axis=1)))
    g.output(g.div(e, g.sum(e, axis=1)))
    return g


def _ranked(g: vm.Graph) -> tuple[list[P.Lowered], dict[str, int]]:
    lows, rejected = P.lower_all(g, rank=pricing.cost)
    feasible = [lo for lo in lows if not pricing.cost(lo.mugraph).infeasible]
    return sorted(feasible, key=lambda lo: pricing.cost(lo.mugraph).time_s), rejected


def _passes(lows: list[P.Lowered]) -> list[P.Lowered]:
    return [lo for lo in lows if "partition.split_pass" in lo.steps]


def test_log_softmax_over_few_long_rows_ranks_a_split_with_a_second_pass_first() -> None:
    ranked, _ = _ranked(_log_softmax(16, 32000))
    best = ranked[0]
    assert "partition.split_pass" in best.steps, [lo.steps for lo in ranked[:3]]
    assert best.mugraph.num_kernels == 2
    k1, k2 = [n for n in best.mugraph.nodes if n.op == "custom"]
    # both kernels fill the SMs the one-block-a-row design left idle; the second writes the whole output
    assert k1.attr("block").num_blocks >= 132 and k2.attr("block").num_blocks >= 132
    assert k2.outs[0].shape == (16, 32000)
    one = next(lo for lo in ranked if lo.mugraph.num_kernels == 1)
    assert pricing.cost(best.mugraph).time_s < pricing.cost(one.mugraph).time_s


def test_many_rows_keep_one_block_a_row() -> None:
    """At 2048 rows the grid over rows fills the GPU: re-reading every row in a second kernel costs its bytes."""
    ranked, _ = _ranked(_log_softmax(2048, 32000))
    assert "partition.split_pass" not in ranked[0].steps
    assert ranked[0].mugraph.num_kernels == 1
    assert _passes(ranked)  # (offered, priced below)


def test_second_pass_lowerings_equal_the_source_in_float64() -> None:
    rng = np.random.default_rng(0)
    for g in (_log_softmax(4, 256), _softmax(4, 256)):
        lows, rejected = P.lower_all(g, rank=pricing.cost)
        passes = _passes(lows)
        assert passes, rejected
        ins = {"X": rng.normal(0.0, 4.0, (4, 256))}
        ref = vm.evaluate(g, ins)[0]
        for lo in passes[:: max(1, len(passes) // 12)]:
            np.testing.assert_allclose(vm.evaluate(lo.mugraph, ins)[0], ref, rtol=1e-12, atol=1e-12)


def test_second_pass_kernels_match_float64_in_the_interpreter() -> None:
    """Also a row of -inf but one entry (a masked vocabulary) and a row whose first half is -inf: the partials of an
    all -inf chunk (its max floored, its sum 0) must not turn the row's result into NaN (red team 17's finding for
    the flash designs)."""
    import torch

    g = _log_softmax(4, 256)
    ranked, _ = _ranked(g)
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 4.0, (4, 256)).astype(np.float16)
    x[1] = -np.inf
    x[1, 200] = 2.0
    x[2, :128] = -np.inf
    ref = torch.log_softmax(torch.tensor(x, dtype=torch.float64), 1)
    fin = torch.isfinite(ref)
    for lo in _passes(ranked)[:3]:
        out = vm.compile(lo.mugraph)(X=torch.tensor(x))
        out = (out[0] if isinstance(out, tuple) else out).double()
        assert torch.equal(torch.isfinite(out), fin)
        np.testing.assert_allclose(out[fin].numpy(), ref[fin].numpy(), rtol=2e-3, atol=2e-2)


def test_a_second_pass_is_proved_and_a_wrong_one_is_not() -> None:
    g = _log_softmax(4, 256)
    lo = _passes(_ranked(g)[0])[0]
    assert isinstance(vm.verify(g, lo.mugraph), vm.Proved)
    # the second pass subtracting the row's max alone (the log of the merged sums dropped): not log_softmax
    text = str(lo.mugraph)
    lse = re.search(r"%(\d+) = fused %(\d+), %\d+ : f16\[\d+,1\] \{.*?return %\d+\n    \}", text, re.S)
    assert lse is not None, text
    wrong = text.replace(lse.group(0), f"%{lse.group(1)} = scale %{lse.group(2)} {{c=1.0}} : f16[1,1]")
    bad = vm.MuGraph.parse(wrong)
    assert not isinstance(vm.verify(g, bad), vm.Proved)


def test_a_second_pass_value_reduced_again_or_next_to_a_row_statistic_is_refused() -> None:
    # cross-entropy reduces x - logsumexp(x) over the row again: a third pass, not built
    g = vm.Graph()
    x = g.input("X", (16, 4096), vm.float16)
    t = g.input("T", (16, 4096), vm.float16)
    g.output(g.sum(g.mul(t, log_softmax(g, x, 1)), axis=1))
    lows, rejected = P.lower_all(g, rank=pricing.cost)
    assert not _passes(lows)
    assert any("over the loop dim of post-loop values" in r for r in rejected)
    # log_softmax and its logsumexp as outputs: the row statistic would be written by every block of its row
    g = vm.Graph()
    x = g.input("X", (16, 4096), vm.float16)
    g.output(log_softmax(g, x, 1), logsumexp(g, x, 1))
    lows, rejected = P.lower_all(g, rank=pricing.cost)
    assert not _passes(lows)
    assert any("split pass: an output without the split dim" in r for r in rejected)


def test_the_search_returns_the_split_log_softmax_first() -> None:
    g = _log_softmax(16, 32000)
    res = vm.superoptimize(g, cache=False, progress=False)
    first = res.candidates[0]
    assert isinstance(first.verdict, vm.Proved)
    assert "partition.split_pass" in first.rules and first.num_kernels == 2


@pytest.mark.gpu
def test_the_committed_split_log_softmax_candidates_match_float64_on_the_gpu() -> None:
    """Every committed log_softmax candidate (16 x 32,000) on the GPU against float64, two fresh input draws, one of
    them with a row of -inf but one entry (a masked vocabulary) and a row far above fp16's exp range."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks/candidates_models/log_softmax.json"
    doc = json.loads(path.read_text())
    for c in doc["candidates"]:
        fn = vm.compile(vm.MuGraph.parse(c["mugraph"]))
        for seed in (1, 2):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x = (4 * torch.randn(16, 32000, generator=g, device="cuda")).half()
            if seed == 2:
                x[3] = float("-inf")
                x[3, 17] = 1.0
                x[5] += 30000.0
            ref = torch.log_softmax(x.double(), dim=1)
            out = fn(X=x)
            out = (out[0] if isinstance(out, tuple) else out).double()
            fin = torch.isfinite(ref)
            assert torch.equal(torch.isfinite(out), fin)
            assert float((out[fin] - ref[fin]).norm() / ref[fin].norm()) < 2e-3
