"""Sums over sub-ranges of a block, merged by the polynomial normaliser (twentieth session, heldout20).

A split-KV decode (Qwen2-7B's 8,192 keys as 32 blocks of 256, each block's loop in two steps of 128) sums
``sum_b (sum_[256 b, 256 b + 128) f + sum_[256 b + 128, 256 b + 256) f)``: the two step sums meet end to end in every
block, but their bounds are affine in ``b``, and law sum-split-merge merged constant bounds only, so the block's sum
never became one and the outer sum over the blocks never became ``sum_[0, 8192) f`` (sum-block-merge): the abstract
check said the normal forms differ and the candidates were Unknown (heldout19's qwen2_gqa_decode_group7 and
gptj_parallel_decode_layer). Now ranges with affine bounds merge where each has a constant length >= 0 and one's end
is the other's start (identically, so they lie end to end whatever ``b`` is). Both directions are tested: merged
exactly then, the value kept (evaluated numerically), and an off-by-one program is not proved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_redteam_normaliser import _ev_poly  # (the tests folder is on the path)

import verimirage as vm
from verimirage.smt import expr as E
from verimirage.smt.verify import abstract_check

S, N = 8, 3  # blocks of S elements, N blocks


@pytest.mark.parametrize("ranges", [
    [(0, 4), (4, 8)],  # two steps end to end: merged, then one sum over every block (block-merge)
    [(0, 3), (3, 5), (5, 8)],  # three steps
    [(4, 8), (0, 4)],  # out of order
    [(0, 3), (4, 8)],  # a gap: not merged
    [(0, 5), (4, 8)],  # overlapping: not merged
    [(3, 0), (0, 8)],  # a range of negative length ending where the next starts: not merged
    [(0, 4), (4, 8), (0, 8)],  # the whole block too: merged, then twice the sum
])
def test_block_sums_over_affine_ranges_merge_only_when_they_meet(ranges: list[tuple[int, int]]) -> None:
    d = E.Derivation(ranges={"o": (0, 2), "b": (0, N)})
    tok = E.activate(d)
    try:
        body = E.p_const(0)
        for lo, hi in ranges:
            # a step's sum over [S b + lo, S b + hi), as a loop over a block's sub-range reads it
            r = d.fresh(0, max(0, hi - lo))
            at = E.a_add(E.a_add(E.a_scale(E.a_var("b"), S), E.a_const(lo)), E.a_var(r))
            inner = E.p_mul(E.p_atom(("in", "x", (at,))), E.p_atom(("in", "y", (at, E.a_var("o")))))
            body = E.p_add(body, E.p_sum(r, inner))
        total = E.p_sum("b", body)
        merged = "sum-split-merge" in d.laws
    finally:
        E.deactivate(tok)
    meet = any(b == c and b >= a and dd >= c for (a, b), (c, dd) in itertools.permutations(ranges, 2))
    assert merged == meet, (ranges, E.pretty(total))
    if ranges[:2] in ([(0, 4), (4, 8)], [(4, 8), (0, 4)]):
        assert "sum-block-merge" in d.laws and len(total[1]) == 1  # one sum over [0, S N)
    rng = np.random.default_rng(1)
    xs = {"x": rng.standard_normal(S * N + S), "y": rng.standard_normal((S * N + S, 2))}
    for o in range(2):
        want = sum(float(xs["x"][r] * xs["y"][r, o]) for b in range(N) for lo, hi in ranges
                   for r in range(S * b + lo, S * b + hi))
        assert math.isclose(_ev_poly(total, {"o": o}, xs), want, rel_tol=1e-12, abs_tol=1e-12)


def _blocked(parts: list[tuple[int, int]]) -> Callable[[vm.Graph, Any], Any]:
    """``x`` (S N, 4) summed over its rows as N blocks of S, each block as the sum of its row ranges ``parts``."""
    def build(g: vm.Graph, x: Any) -> Any:
        blocks = g.reshape(x, (N, S, 4))
        acc = None
        for lo, hi in parts:
            s = g.sum(g.slice(blocks, 1, lo, hi), 1)
            acc = s if acc is None else g.add(acc, s)
        return g.reshape(g.sum(acc, 0), (1, 4))

    return build


@pytest.mark.parametrize("parts, equal", [
    ([(0, 4), (4, 8)], True),
    ([(0, 3), (3, 6), (6, 8)], True),
    ([(0, 4), (5, 8)], False),  # a row of each block skipped
    ([(0, 5), (4, 8)], False),  # a row of each block twice
])
def test_a_sum_over_blocks_of_end_to_end_steps_is_proved_and_an_off_by_one_is_not(
        parts: list[tuple[int, int]], equal: bool) -> None:
    progs = []
    for build in (lambda g, x: g.sum(x, 0), _blocked(parts)):
        g = vm.Graph()
        g.output(build(g, g.input("x", (S * N, 4), vm.float32)))
        progs.append(g)
    a, b = progs
    x = np.random.default_rng(0).standard_normal((S * N, 4))
    assert np.allclose(vm.evaluate(a, {"x": x})[0], vm.evaluate(b, {"x": x})[0]) == equal
    proved = abstract_check(a, b).outcome == "proved"
    assert proved == equal
