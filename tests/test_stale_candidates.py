"""Committed candidates against the current search's forms (CPU, a few seconds).

The stored μGraphs (``benchmarks/candidates*/``, their certificates in ``proofs/`` and
``benchmarks/candidates/*/proofs/``, the capture plans ``benchmarks/results/capture/plan_*.json`` and the
certificates of ``tests/cases/``) are what the timing harnesses and the certificate checks read; a pass that
changes the form it emits (``rewrite.stabilise.scale_weight_tiles``: the fourteenth session's per-iteration scale)
leaves them carrying the old form until they are regenerated. Here every stored μGraph with a scaled weight tile (the
thirteenth and fourteenth sessions' forms; since the sixteenth, ``stabilise.prologue_norm_scales`` scales no
weight tile) is re-derived by the current pass from its unscaled core (``stabilise.rederive_weight_scales``) and
must be unchanged; and the floating-point check rejects the old forms on its own (``pipeline.fpsafe``: the outlier
sets, a vector's outlier paired with another input's, and the gross-error criterion).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.pipeline import pricing
from verimirage.rewrite.stabilise import rederive_weight_scales, unscale_weight_tiles

ROOT = Path(__file__).resolve().parent.parent

#: where stored μGraphs are committed (globs from the repository root)
STORED = ("benchmarks/candidates*/**/*.json", "proofs/*.json", "benchmarks/results/capture/plan_*.json",
          "tests/cases/**/*.json")

#: the thirteenth session's form of ``rms_norm(X, G) @ W`` (fp16, one block, a 2-iteration loop): one scale
#: ``s = max(1, max |G|)`` per block from a second load of ``G`` (kernel operand 3), the loop sum times ``s``
OLD_FORM = """mugraph {
  %0 = input {name='X'} : f16[4,64]
  %1 = input {name='G'} : f16[64]
  %2 = input {name='W'} : f16[64,32]
  %3 = custom %0, %1, %2, %1 {frange=2, grid=(1,)} : f16[4,32] {
    %0 = input {arg=3, fmap=None, imap=(None,), shape=(64,)} : f16[64]
    %1 = abs %0 : f16[64]
    %2 = max %1 {axis=0} : f16[1]
    %3 = clamp %2 {hi=65504.0, lo=1.0} : f16[1]
    %4 = input {arg=0, fmap=1, imap=(0,), shape=(4, 64)} : f16[4,32]
    %5 = input {arg=1, fmap=0, imap=(None,), shape=(64,)} : f16[32]
    %6 = input {arg=2, fmap=0, imap=(None,), shape=(64, 32)} : f16[32,32]
    %7 = square %4 : f16[4,32]
    %8 = sum %7 {axis=1} : f16[4,1]
    %9 = loop_sum %8 : f16[4,1]
    %10 = reshape %5 {shape=(64, 1), src=(64,)} : f16[32,1]
    %11 = div %10, %3 : f16[32,1]
    %12 = mul %11, %6 : f16[32,32]
    %13 = matmul %4, %12 : f16[4,32]
    %14 = loop_sum %13 : f16[4,32]
    %15 = mul %14, %3 : f16[4,32]
    %16 = fused %15, %9 : f16[4,32] {
      %0 = arg {index=0} : f16[4,32]
      %1 = arg {index=1} : f16[4,1]
      %2 = scale %1 {c=0.015625} : f16[4,1]
      %3 = shift %2 {c=1e-05} : f16[4,1]
      %4 = rsqrt %3 : f16[4,1]
      %5 = mul %0, %4 : f16[4,32]
      return %5
    }
    output %16 {omap=(0,)}
  }
  return %3
}"""


#: the fourteenth session's form (be5393c to d9baf9a, ``scale_weight_tiles``) of the same lowering: each loop
#: iteration's weight tile rows times ``G / s``, ``s = max(1, max |G_i W_ij| / 2**15)`` over the tile, the product
#: times ``s`` before its loop sum
OLD_ITERATION_FORM = """mugraph {
  %0 = input {name='X'} : f16[4,64]
  %1 = input {name='G'} : f16[64]
  %2 = input {name='W'} : f16[64,32]
  %3 = custom %0, %1, %2 {frange=2, grid=(1,)} : f16[4,32] {
    %0 = input {arg=0, fmap=1, imap=(0,), shape=(4, 64)} : f16[4,32]
    %1 = input {arg=1, fmap=0, imap=(None,), shape=(64,)} : f16[32]
    %2 = input {arg=2, fmap=0, imap=(None,), shape=(64, 32)} : f16[32,32]
    %3 = square %0 : f16[4,32]
    %4 = sum %3 {axis=1} : f16[4,1]
    %5 = loop_sum %4 : f16[4,1]
    %6 = reshape %1 {shape=(64, 1), src=(64,)} : f16[32,1]
    %7 = abs %2 : f16[32,32]
    %8 = max %7 {axis=1} : f16[32,1]
    %9 = abs %6 : f16[32,1]
    %10 = mul %8, %9 : f16[32,1]
    %11 = max %10 {axis=0} : f16[1,1]
    %12 = scale %11 {c=3.0517578125e-05} : f16[1,1]
    %13 = clamp %12 {hi=65504.0, lo=1.0} : f16[1,1]
    %14 = div %6, %13 : f16[32,1]
    %15 = mul %14, %2 : f16[32,32]
    %16 = matmul %0, %15 : f16[4,32]
    %17 = mul %16, %13 : f16[4,32]
    %18 = loop_sum %17 : f16[4,32]
    %19 = fused %18, %5 : f16[4,32] {
      %0 = arg {index=0} : f16[4,32]
      %1 = arg {index=1} : f16[4,1]
      %2 = scale %1 {c=0.015625} : f16[4,1]
      %3 = shift %2 {c=1e-05} : f16[4,1]
      %4 = rsqrt %3 : f16[4,1]
      %5 = mul %0, %4 : f16[4,32]
      return %5
    }
    output %19 {omap=(0,)}
  }
  return %3
}"""

def _norm_proj(h: vm.DType = vm.float16) -> vm.Graph:
    g = vm.Graph()
    g.output(g.matmul(g.rms_norm(g.input("X", (4, 64), h), g.input("G", (64,), h), eps=1e-5),
                      g.input("W", (64, 32), h)))
    return g


def _current_form(g: vm.Graph) -> MuGraph:
    """The current lowering of ``g``'s norm in the prologue with the same loop as :data:`OLD_FORM`."""
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import norm_into_projections

    gn = norm_into_projections(g)
    assert gn is not None
    return next(low.mugraph for low in lower_all(gn, rank=pricing.cost)[0]
                if "partition.prologue_norm_scales" in low.steps and low.mugraph.num_kernels == 1
                and "frange=2," in str(low.mugraph))


def _stored_texts(v: Any, where: str) -> Iterator[tuple[str, str]]:
    """(where, text) of every μGraph text in a JSON value, certificates stored as JSON strings included."""
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _stored_texts(x, f"{where}.{k}")
    elif isinstance(v, list):
        for k, x in enumerate(v):
            yield from _stored_texts(x, f"{where}[{k}]")
    elif isinstance(v, str):
        if v.startswith("mugraph {"):
            yield where, v
        elif v.startswith("{") and "mugraph" in v:
            try:
                inner = json.loads(v)
            except ValueError:
                return
            yield from _stored_texts(inner, f"{where}<json>")


def test_committed_candidates_carry_the_weight_tile_scales_the_current_pass_derives() -> None:
    """No committed μGraph carries a scaled weight tile the current pass would not derive from its unscaled core
    (since the sixteenth session none at all: ``prologue_norm_scales`` scales no weight tile): the layer_np
    candidates and their certificates carried the one ``s = max |w|`` per block until the fifteenth session (stale
    after be5393c), then the per-iteration ``s`` until the sixteenth. Regenerate a stale one through its search
    (``benchmarks/layer.py prepare``, ``benchmarks/prepare_candidates.py``) and re-record its certificate, never by
    editing the text."""
    seen: set[str] = set()
    stale, current = [], 0
    for pattern in STORED:
        for path in sorted(ROOT.glob(pattern)):
            for where, text in _stored_texts(json.loads(path.read_text()), str(path.relative_to(ROOT))):
                if text in seen:
                    continue
                seen.add(text)
                if " div " not in text:  # (a scaled weight column is a div; so is the current form's operand)
                    continue
                mg = MuGraph.parse(text)
                current += " sqrt " in text and "fmap=None" in text  # (the norm's statistic before the loop)
                if str(rederive_weight_scales(mg)) != text:
                    stale.append(where)
    assert len(seen) > 500  # (the sets were read: ~2,500 distinct μGraphs)
    assert current >= 2  # (the layer_np candidates: the FFN's norm in its gate/up kernel's prologue)
    assert not stale, f"stale μGraph forms (re-search these): {stale}"


def test_rederived_weight_scales_replace_the_old_whole_weight_scale_and_keep_the_current_one() -> None:
    """The re-derivation is a fixed point on the current pass's own form and turns the thirteenth and fourteenth
    sessions' forms into it (the thirteenth's second load of ``G`` and its kernel operand dropped, X loaded once
    more for the row statistic); the core (no scale) is returned as is."""
    g = _norm_proj()
    new = _current_form(g)
    assert str(rederive_weight_scales(new)) == str(new)
    for text in (OLD_FORM, OLD_ITERATION_FORM):
        old = MuGraph.parse(text)
        assert str(rederive_weight_scales(old)) == str(new)
        core = unscale_weight_tiles(old)
        assert core is not None and " div " not in str(core) and isinstance(vm.verify(g, core), vm.Proved)
        assert unscale_weight_tiles(core) is None and rederive_weight_scales(core) is core


def test_fp_check_passed_a_weight_scale_that_flushed_small_weights_to_zero() -> None:
    """Finding (medium): the floating-point check compared finiteness only, and its input sets scaled whole
    inputs, so the thirteenth session's form (:data:`OLD_FORM`: fp16 weight tile ``(w_i / max |w|) m_ij``, 0 for
    small weights beside a large one) passed it, on the red team's input (``w = [6e4, 1e-3, ...]``, ``x`` 0 on the
    outlier's column: every output 0 where the source is within 4e-4 of float64) and on every other. Now each
    input also gets one outlier among tiny values with the others idle at index 0 (``fpsafe.OUTLIER_SET``), and a
    candidate's error above a quarter of an output's largest value where the source's is below 2e-2 of it is
    rejected (``fpsafe.GROSS_ERROR``): the old form is rejected, the current one passes, on the check's sets and
    on the red team's input."""
    from verimirage.pipeline.fpsafe import SafetyChecker, evaluate_in_dtype

    g = _norm_proj()
    sc = SafetyChecker(g)
    old, new = MuGraph.parse(OLD_FORM), _current_form(g)
    assert isinstance(vm.verify(g, old), vm.Proved)
    why = sc.check(old)
    assert why is not None and "one element near" in why and "error" in why, why
    assert sc.check(new) is None
    # the red team's input, through the same criterion
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (4, 64)) * (np.arange(64) > 0)  # (the outlier's column idle)
    raw = {"X": x, "G": np.r_[60000.0, np.full(63, 1e-3)], "W": rng.uniform(-1, 1, (64, 32))}
    ins = {k: np.float16(v).astype(np.float64) for k, v in raw.items()}
    sc.sets = [("the red team's", ins)]
    sc._src.clear()
    sc._ref.clear()
    assert sc.check(old) is not None and sc.check(new) is None
    (got,), _ = evaluate_in_dtype(old, ins, generated=True)
    assert np.abs(got).max() == 0.0  # (every output flushed)


def test_fp_check_passed_the_per_iteration_weight_scale_that_flushed_products_beside_a_huge_one() -> None:
    """Finding (low; red team 15's strict xfail): the fourteenth session's form (:data:`OLD_ITERATION_FORM`) passed
    the floating-point check, whose outlier sets give one input an outlier and keep every other idle at index 0,
    so the weight row that meets ``G``'s outlier was 0 and ``s`` stayed 1. Its flush needs two outliers that meet
    in one product (``G_0`` and ``W_00``: ``s = G_0 W_00 / 2**15``, the products ``G_i W_ij`` of tiny entries below
    ``s * 2**-24``). Now a vector input's outlier is also paired with every other input's (``fpsafe``'s
    OUTLIER_PAIRS): the old form is rejected there (every output flushed), the current one passes every set."""
    from verimirage.pipeline.fpsafe import SafetyChecker

    g = _norm_proj()
    old, new = MuGraph.parse(OLD_ITERATION_FORM), _current_form(g)
    assert isinstance(vm.verify(g, old), vm.Proved)
    sc = SafetyChecker(g)
    why = sc.check(old)
    assert why is not None and "G and W one element near" in why, why
    assert sc.check(new) is None

def test_bf16_weight_tiles_flushed_small_weights_beside_a_weight_near_1e38() -> None:
    """Finding (low: needs a weight near bf16's largest value), found by the outlier sets: after be5393c a bf16
    weight tile kept one ``s = max(1, max |w|)`` per block, so beside ``w_0 = 1.6e38`` the other rows' ``(w_i / s)
    m_ij`` (1e-3 / 1.6e38) were below bf16's smallest subnormal and flushed to 0 in the ``tl.dot`` operand: every
    output 0 where the source is within 4e-3 of float64. Now every dtype's tile takes ``s = max(1, max |w_i m_ij| /
    2**e)`` per iteration (bf16 ``2**126``): the old form is rejected by the check, the current one passes it and
    its kernel (Triton's interpreter) is accurate on the check's own outlier input."""
    import torch

    from verimirage.pipeline.fpsafe import DTYPE_MAX, SafetyChecker

    g = _norm_proj(vm.bfloat16)
    old = MuGraph.parse(OLD_FORM.replace("f16", "bf16").replace("hi=65504.0", f"hi={DTYPE_MAX[vm.bfloat16]!r}"))
    new = _current_form(g)
    sc = SafetyChecker(g)
    assert isinstance(vm.verify(g, old), vm.Proved)
    why = sc.check(old)
    assert why is not None and "G one element near" in why, why
    assert sc.check(new) is None
    (_, ins), = [s for s in sc.sets if s[0].startswith("G one element near")]
    want = vm.evaluate(g, ins)[0]
    out = vm.compile(new)(*(torch.tensor(ins[k], dtype=torch.bfloat16) for k in ("X", "G", "W")))
    got = np.asarray(out.float().numpy(), dtype=np.float64)
    assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_fp_check_outlier_sets_keep_the_current_norm_prologue_designs(dt: str) -> None:
    """Every one-kernel lowering of the weighted norm before its projection that the search keeps passes the
    outlier sets in fp16 and bf16 (no correct design lost to the gross-error criterion)."""
    from verimirage.pipeline.fpsafe import SafetyChecker
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import norm_into_projections

    g = _norm_proj(getattr(vm, dt))
    gn = norm_into_projections(g)
    assert gn is not None
    sc = SafetyChecker(g)
    lows = [low.mugraph for low in lower_all(gn, rank=pricing.cost)[0] if low.mugraph.num_kernels == 1]
    assert lows
    bad = [(str(mg), why) for mg in lows[:6] if (why := sc.check(mg)) is not None]
    assert not bad, bad[0]
