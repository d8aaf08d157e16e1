"""Red team (nineteenth session): attacks that held, kept as tests so they keep holding. No finding this session;
the probes and their logs are in ``benchmarks/results/redteam19_2026-11-27/``.

* ``partition.split_pass`` and ``Config.combine_whole`` (the combine kernel's second pass over the row; the partials
  read as one tile along a size-1 dim), in Triton's interpreter against float64: log_softmax, softmax, softmax with a
  bias, ``x - mean(x)``, rms scaling; 2-d and 3-d shapes with size-1 dims, reductions along the first, middle and last
  axis, 40 rows in tailed blocks; rows of -inf, a -inf half, all but one -inf, +30000 offsets, NaN, +inf: no kernel
  finite where float64 is not, or the reverse, or off.
* A split whose tiles do not divide the reduction (a lowering of 96 columns re-typed to 90: zero padding enters the
  max and the sums): never Proved (48 mutants: Refuted, Unknown or refused by the IR checks).
* The running max joined with a loop-invariant input by ``maximum`` (``partition._joins_running_max``): online,
  split and split-pass lowerings of ``logsumexp`` over ``max(max(x), b)`` with b = -inf, +inf, NaN, 60000: no
  mismatch (70 interpreter runs).
* Mutation campaigns (maps, ranges, grids, constants, ops, operand order, kernel result types, block input shapes):
  17,580 + 5,444 mutants of 12 small programs' lowerings (1,863 + 551 Proved, none differing from the program in
  float64; the 22 Proved ones non-finite in float64, a running max clamped to a constant or a softmax shifted by a
  sum, all refused by the fp check) and 2,128 random programs of ``vm.testing.strategies.graphs`` (odd and size-1
  dims, fp16/fp32; 9,118 mutants, 1,733 Proved, none differing), 1,516 Proved ones run in the interpreter: no
  mismatch.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.models import log_softmax
from verimirage.pipeline import pricing
from verimirage.pipeline.fpsafe import SafetyChecker
from verimirage.rewrite import partition as P


def _log_softmax(shape: tuple[int, ...], axis: int) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", shape, vm.float16)
    g.output(log_softmax(g, x, axis))
    return g


def _split_passes(g: vm.Graph, whole: bool) -> list[P.Lowered]:
    lows, _ = P.lower_all(g, rank=pricing.cost)
    return [lo for lo in lows if "partition.split_pass" in lo.steps and lo.config is not None
            and lo.config.combine_whole == whole]


def test_split_pass_combined_in_one_tile_along_a_size_one_dim_matches_float64_on_minus_inf_rows() -> None:
    """The partials hold their splits along the data-parallel size-1 dim (not the reduced one); a Proved such
    lowering's kernels in the interpreter: the same special values as float64 and within fp16 rounding elsewhere."""
    torch = pytest.importorskip("torch")
    g = _log_softmax((2, 1, 128), 2)
    lo = next(lo for lo in _split_passes(g, True) if isinstance(vm.verify(g, lo.mugraph), vm.Proved))
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 4.0, (2, 1, 128))
    x[0, 0] = -np.inf
    x[0, 0, 100] = 1.0  # one finite entry: every other chunk all -inf (its max floored, its sum 0)
    x[1, 0, :64] = -np.inf  # the first split all -inf
    x = x.astype(np.float16).astype(np.float64)
    ref = vm.evaluate(g, {"X": x})[0]
    out = vm.compile(lo.mugraph)(X=torch.tensor(x).half())
    out = (out[0] if isinstance(out, tuple) else out).double().numpy()
    fin = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), fin) and np.array_equal(out[~fin], ref[~fin])
    np.testing.assert_allclose(out[fin], ref[fin], rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("whole", [False, True], ids=["loop-combine", "one-tile-combine"])
def test_split_pass_whose_tiles_overrun_the_reduction_is_not_proved(whole: bool) -> None:
    """A lowering of 96 columns re-typed to 90: its tiles cover 96, so zero padding enters the row's max and sums."""
    g96, g90 = _log_softmax((2, 96), 1), _log_softmax((2, 90), 1)
    verified = 0
    for lo in _split_passes(g96, whole):
        text = str(lo.mugraph).replace("[2,96]", "[2,90]").replace("shape=(2, 96)", "shape=(2, 90)")
        try:
            mg = vm.MuGraph.parse(text)
        except vm.GraphError:
            continue  # (refused by the IR checks: as good)
        assert not isinstance(vm.verify(g90, mg), vm.Proved), lo.config
        verified += 1
        if verified == 2:
            break
    assert verified


def test_running_max_clamped_to_a_constant_is_proved_over_the_reals_and_refused_by_the_fp_check() -> None:
    """A mutant whose floor clamp pins the running max to +FLT_MAX: equal to log_softmax over the reals (a per-row
    shift cancels), so ``vm.verify`` proves it; ``exp(x - 3.4e38)`` underflows every term, and the search's fp check
    must refuse it (the layering a Proved relies on): its shift is no max of the exp's operand."""
    g = _log_softmax((2, 64), 1)
    lows, _ = P.lower_all(g, rank=pricing.cost)
    lo = next(lo for lo in lows if "partition.online_softmax" in lo.steps)
    text = str(lo.mugraph)
    checker = SafetyChecker(g, 0)
    assert checker.check(lo.mugraph) is None
    pinned = re.sub(r"lo=-3\.4028234663852886e\+38", "lo=3.4028234663852886e+38", text, count=1)
    assert pinned != text
    mg = vm.MuGraph.parse(pinned)
    assert isinstance(vm.verify(g, mg), vm.Proved)
    why = checker.check(mg)  # (by the structural rule since 91127ad, by the numeric sets before: either refuses)
    assert why is not None and ("non-finite" in why or "max" in why), why
