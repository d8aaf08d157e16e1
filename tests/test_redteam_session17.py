"""Red team, seventeenth session: regression tests, each named after what went wrong and failing on the code
before its fix (see /work/wt/report_redteam17.md for the ranking)."""

from __future__ import annotations

import pytest

import verimirage as vm


def _gated_norm_ffn(t: int, h: int, n: int) -> vm.Graph:
    g = vm.Graph()
    x, w = g.input("X", (t, h), vm.bfloat16), g.input("w", (h,), vm.bfloat16)
    wg, wu = g.input("Wg", (h, n), vm.bfloat16), g.input("Wu", (h, n), vm.bfloat16)
    a = g.rms_norm(x, w, axis=1, eps=1e-6)
    g.output(g.mul(g.sigmoid(g.matmul(a, wg)), g.matmul(a, wu)))
    return g


def test_bf16_gated_norm_prologue_multiplied_both_accumulators_by_the_rms_before_dividing_it_out() -> None:
    """Finding (low; extreme values): the sixteenth session's open bf16 prologue item, in its fused form. For
    ``sigmoid(rms_norm(X, w) @ Wg) * (rms_norm(X, w) @ Wu)`` in bf16 the ``prologue_norm_scales`` candidates fed
    ``acc_g * s`` and ``acc_u * s`` (``s`` the row's rms, computed before the loop) into the fused epilogue, which then
    multiplied each by ``rsqrt(mean(X^2) + eps)``: with ``X`` near 3e4 and the up projection near 1.5e37 (``w`` near
    1e30), ``acc_u * s`` is inf in fp32 where the source is finite. Now each is ``acc * (s * rsqrt(...))`` inside the
    thread graph (``s`` one more operand of it): finite, and still Proved."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    t, h, n = 64, 256, 64
    g = _gated_norm_ffn(t, h, n)
    rng = np.random.default_rng(0)
    inputs = {"X": rng.uniform(-3e4, 3e4, (t, h)), "w": rng.uniform(5e29, 1e30, (h,)),
              "Wg": rng.uniform(-3e4, 3e4, (h, n)), "Wu": rng.uniform(-3e4, 3e4, (h, n))}
    src, overflowed = evaluate_in_dtype(g, inputs)
    assert not overflowed and np.isfinite(src[0]).all()
    res = vm.superoptimize(g, cache=False, top_k=8, variants=1, time_budget_s=120)
    pro = [c for c in res.candidates if "partition.prologue_norm_scales" in c.rules]
    assert pro, "no prologue candidate was searched"
    for c in pro:
        out = evaluate_in_dtype(c.mugraph, inputs, generated=True)[0][0]
        assert np.isfinite(out).all(), c.rules
        assert np.abs(out - src[0]).max() <= 2e-2 * np.abs(src[0]).max()
        assert isinstance(vm.verify(g, c.mugraph), vm.Proved)



@pytest.mark.parametrize("shifted", [False, True])
def test_softmax_stabiliser_raised_key_error_on_a_sum_over_two_axes_of_an_exp(shifted: bool) -> None:
    """Finding (low-medium; a crash of the search): ``log(sum(sum(exp(x - c), 1), 0))`` with ``c`` an input (not a
    max), or a plain ``exp(x)``, made ``stabilise.stabilise_softmax`` raise ``KeyError`` (its table of maxes is keyed
    by sum nodes too, then read through the table of exps), and ``vm.superoptimize`` with it: a captured partition
    went to the fallback (redteam2, session 16). Now the second sum is copied as it is (the stabilised graph is then
    not equal to the source, and the verifier drops it), and the search returns the plain designs, Proved."""
    from verimirage.rewrite.stabilise import stabilise_softmax

    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float32)
    g.output(g.log(g.sum(g.sum(g.exp(g.sub(x, g.input("c", (8, 1), vm.float32)) if shifted else x), axis=1),
                         axis=0)))
    assert stabilise_softmax(g) is not None
    res = vm.superoptimize(g, cache=False, time_budget_s=60)
    assert res.candidates and all(isinstance(vm.verify(g, cand.mugraph), vm.Proved) for cand in res.candidates)
