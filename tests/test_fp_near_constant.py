"""The floating-point check's near-constant sets (``fpsafe.NEAR_CONSTANT_SET``; eighteenth session).

``vm.verify`` proves equality over the reals, where ``mean(x^2) - mean(x)^2`` is the variance. In a dtype it is not:
on rows of a large offset and a small spread it subtracts two nearly equal large values and loses the variance, where
the source's centred ``mean((x - mean(x))^2)`` is accurate. The check drew no such rows (every set spread each row
over its whole scale), so it accepted the one-pass form. Now it draws them, each input alone and all together, with
every row's mean exactly the offset, and applies its one rule there (gross error where the source is accurate).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.dtypes import DType
from verimirage.ir.reference import evaluate
from verimirage.pipeline import fpsafe
from verimirage.pipeline.fpsafe import NEAR_CONSTANT_SET, SafetyChecker, evaluate_in_dtype, round_to

R, H, N = 8, 64, 32


def _head(dt: str, R: int = R, H: int = H) -> str:
    return (f"  %0 = input {{name='X'}} : {dt}[{R},{H}]\n  %1 = input {{name='G'}} : {dt}[{H}]\n"
            f"  %2 = input {{name='B'}} : {dt}[{H}]\n  %3 = input {{name='W'}} : {dt}[{H},{N}]\n")


def _layernorm_linear(dt: str, R: int = R, H: int = H) -> vm.Graph:
    """``LayerNorm(X; G, B) @ W`` written as the models set writes it: the two-pass (centred) variance."""
    return vm.Graph.parse(f"""graph {{
{_head(dt, R, H)}  %4 = mean %0 {{axis=1}} : {dt}[{R},1]
  %5 = sub %0, %4 : {dt}[{R},{H}]
  %6 = square %5 : {dt}[{R},{H}]
  %7 = mean %6 {{axis=1}} : {dt}[{R},1]
  %8 = shift %7 {{c=1e-05}} : {dt}[{R},1]
  %9 = rsqrt %8 : {dt}[{R},1]
  %10 = mul %5, %9 : {dt}[{R},{H}]
  %11 = mul %10, %1 : {dt}[{R},{H}]
  %12 = add %11, %2 : {dt}[{R},{H}]
  %13 = matmul %12, %3 : {dt}[{R},{N}]
  return %13
}}""")


def _one_pass_source(dt: str) -> vm.Graph:
    """The same program written with the one-pass variance ``mean(x^2) - mean(x)^2``."""
    return vm.Graph.parse(f"""graph {{
{_head(dt)}  %4 = mean %0 {{axis=1}} : {dt}[{R},1]
  %5 = square %0 : {dt}[{R},{H}]
  %6 = mean %5 {{axis=1}} : {dt}[{R},1]
  %7 = square %4 : {dt}[{R},1]
  %8 = sub %6, %7 : {dt}[{R},1]
  %9 = shift %8 {{c=1e-05}} : {dt}[{R},1]
  %10 = rsqrt %9 : {dt}[{R},1]
  %11 = sub %0, %4 : {dt}[{R},{H}]
  %12 = mul %11, %10 : {dt}[{R},{H}]
  %13 = mul %12, %1 : {dt}[{R},{H}]
  %14 = add %13, %2 : {dt}[{R},{H}]
  %15 = matmul %14, %3 : {dt}[{R},{N}]
  return %15
}}""")


def _fused(dt: str, one_pass: bool, R: int = R, H: int = H) -> vm.MuGraph:
    """A row-per-block LayerNorm kernel (its statistics in fp32, as the generated code keeps them), then the
    product: the variance two-pass (``sum((x - mu)^2) / H``, the committed candidates' form) or one-pass
    (``sum(x^2) / H - mu^2``)."""
    row, one = f"{dt}[1,{H}]", f"{dt}[1,1]"
    body = (f"""    %5 = square %0 : {row}
    %6 = sum %5 {{axis=1}} : {one}
    %7 = scale %6 {{c={1 / H}}} : {one}
    %8 = square %4 : {one}
    %9 = sub %7, %8 : {one}
    %10 = shift %9 {{c=1e-05}} : {one}
    %11 = rsqrt %10 : {one}
    %12 = sub %0, %4 : {row}
    %13 = mul %12, %11 : {row}
""" if one_pass else f"""    %5 = sub %0, %4 : {row}
    %6 = square %5 : {row}
    %7 = sum %6 {{axis=1}} : {one}
    %8 = scale %7 {{c={1 / H}}} : {one}
    %9 = shift %8 {{c=1e-05}} : {one}
    %10 = rsqrt %9 : {one}
    %11 = mul %5, %10 : {row}
    %12 = mul %11, %1 : {row}
    %13 = add %12, %2 : {row}
""")
    if one_pass:
        body += f"    %14 = mul %13, %1 : {row}\n    %15 = add %14, %2 : {row}\n"
    return vm.MuGraph.parse(f"""mugraph {{
{_head(dt, R, H)}  %4 = custom %0, %1, %2 {{frange=1, grid=({R},)}} : {dt}[{R},{H}] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=({R}, {H})}} : {row}
    %1 = input {{arg=1, fmap=None, imap=(None,), shape=({H},)}} : {dt}[{H}]
    %2 = input {{arg=2, fmap=None, imap=(None,), shape=({H},)}} : {dt}[{H}]
    %3 = sum %0 {{axis=1}} : {one}
    %4 = scale %3 {{c={1 / H}}} : {one}
{body}    output %{15 if one_pass else 13} {{omap=(0,)}}
  }}
  %5 = matmul %4, %3 : {dt}[{R},{N}]
  return %5
}}""")


def _near_set(checker: SafetyChecker, name: str) -> int:
    return next(i for i, (what, _) in enumerate(checker.sets)
                if what.startswith(f"{name} alone ") and NEAR_CONSTANT_SET in what)


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_one_pass_variance_cancelled_on_near_constant_rows_and_was_accepted(dt: str) -> None:
    """The one-pass variance of a LayerNorm followed by a projection is proved equal to the program (over the reals)
    and passed the fp check, though on rows of a large offset and a small spread (X near 8192 in fp32, near 64 in
    fp16, one element in 16 off by a few ulps) it loses the variance: its output is off by more than the output's
    largest value where the source's op-by-op evaluation in its dtype is within 1e-3 of float64 (the source centres
    the rows first). Now the check rejects it on the near-constant set of X and keeps the two-pass kernel."""
    src = _layernorm_linear(dt)
    one, two = _fused(dt, one_pass=True), _fused(dt, one_pass=False)
    assert isinstance(vm.verify(src, one), vm.Proved)
    assert isinstance(vm.verify(src, two), vm.Proved)
    checker = SafetyChecker(src, numeric=True)
    why = checker.check(one)
    assert why is not None and NEAR_CONSTANT_SET in why and "X alone" in why, why
    assert checker.check(two) is None
    # what the check saw, evaluated here from the float64 reference
    i = _near_set(checker, "X")
    ins = checker.sets[i][1]
    ref = np.asarray(evaluate(src, {str(t.name): round_to(ins[str(t.name)], t.dtype) for t in src.inputs})[0],
                     dtype=np.float64)
    scale = float(np.abs(ref).max())
    src_out = evaluate_in_dtype(src, ins)[0][0]
    one_out = evaluate_in_dtype(one, ins, generated=True)[0][0]
    two_out = evaluate_in_dtype(two, ins, generated=True)[0][0]
    assert np.abs(src_out - ref).max() < 1e-3 * scale
    assert np.abs(two_out - ref).max() < 1e-3 * scale
    assert np.abs(one_out - ref).max() > 1.0 * scale
    # and no other set saw it: every set before the near-constant ones passes the one-pass kernel
    first = min(j for j, (what, _) in enumerate(checker.sets) if NEAR_CONSTANT_SET in what)
    assert all(checker._compare(one, j) is None for j in range(first)
               if j not in checker.special and not checker.source_outputs(j)[1])


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_near_constant_rows_keep_the_faithful_candidates_of_a_source_written_as_a_one_pass_variance(dt: str) -> None:
    """Where the source itself cancels (a program written with the one-pass variance), the near-constant sets
    constrain nothing: its own one-pass kernel and the more accurate two-pass one both pass. And in bf16, whose rows
    cannot be near-constant enough for fp32 sums to lose the variance, the two-pass program keeps both."""
    src = _one_pass_source(dt)
    for cand in (_fused(dt, one_pass=True), _fused(dt, one_pass=False)):
        assert isinstance(vm.verify(src, cand), vm.Proved)
        assert SafetyChecker(src, numeric=True).check(cand) is None
    if dt == "bf16":
        assert SafetyChecker(_layernorm_linear(dt), numeric=True).check(_fused(dt, one_pass=True)) is None


@pytest.mark.parametrize("rows", [1, 4])
def test_bf16_one_pass_variance_passed_on_rows_whose_variance_fp32_held_exactly_or_the_epsilon_hid(rows: int) -> None:
    """A bf16 element off the offset is off by 2^-8 to 2^-7 of it, so rows of one element in 16 off have a variance of
    2^-18 of the offset squared, of which fp32's rounding of ``sum(x^2)`` loses 1.6%; and with the deviations in pairs
    ``sum(x^2)`` is exact in fp32 for rows of up to 1,024. The one-pass variance of a LayerNorm of rows of 2,048 passed
    every set (within bf16's floor; with one deviation pair a row at offset 8 the variance, 2e-6, was below the
    epsilon). The bf16 near-constant sets now have an offset of 64 and a second set of one deviation pair a row: the
    variance 2 ulp^2 / n is lost to fp32's rounding of ``sum(x^2)`` from n = 2,048. On shorter rows the one-pass form
    is exact (and kept)."""
    src, one, two = (_layernorm_linear("bf16", rows, 2048), _fused("bf16", True, rows, 2048),
                     _fused("bf16", False, rows, 2048))
    assert fpsafe.numeric_check_affordable(src)
    checker = SafetyChecker(src)
    why = checker.check(one)
    assert why is not None and "one deviation pair a row" in why and "X alone" in why, why
    assert checker.check(two) is None
    i = next(j for j, (w, _) in enumerate(checker.sets) if w.startswith("X alone") and "one deviation pair" in w)
    ins = checker.sets[i][1]
    assert all(int((row != fpsafe.NEAR_CONSTANT[DType.bfloat16][0]).sum()) == 2 for row in ins["X"])
    ref = np.asarray(evaluate(src, {str(t.name): round_to(ins[str(t.name)], t.dtype) for t in src.inputs})[0])
    scale = float(np.abs(ref).max())
    assert np.abs(evaluate_in_dtype(src, ins)[0][0] - ref).max() < 1e-2 * scale
    assert np.abs(evaluate_in_dtype(one, ins, generated=True)[0][0] - ref).max() > 0.2 * scale
    # the same form, proved equal (at a size vm.verify takes quickly), is exact on rows of 64: kept
    assert isinstance(vm.verify(_layernorm_linear("bf16"), _fused("bf16", True)), vm.Proved)
    assert SafetyChecker(_layernorm_linear("bf16")).check(_fused("bf16", True)) is None


@pytest.mark.parametrize("dtype", [DType.float16, DType.bfloat16, DType.float32])
@pytest.mark.parametrize("shape", [(7,), (6, 64), (5, 3, 16), (2, 1, 9)])
def test_near_constant_rows_have_the_offset_as_their_exact_mean_along_every_axis(dtype: DType,
                                                                                  shape: tuple[int, ...]) -> None:
    """Each value is representable in its dtype and positive; every row along every axis, and every run of even length
    starting at an even index (a row that a reshape splits), sums to exactly its length times the offset; the
    deviations are whole ulps of the offset, at most ``NEAR_CONSTANT``'s, on about one element in
    ``NEAR_CONSTANT_DENSITY``."""
    offset, q = fpsafe.NEAR_CONSTANT[dtype]
    v = fpsafe.near_constant(shape, dtype, np.random.default_rng(3))
    assert v.shape == shape and (v > 0).all()
    assert np.array_equal(round_to(v, dtype), v)
    ulp = offset * 2.0 ** -{DType.float16: 10, DType.bfloat16: 7, DType.float32: 23}[dtype]
    steps = (v - offset) / ulp
    assert np.array_equal(steps, np.round(steps)) and np.abs(steps).max() <= q
    for ax, n in enumerate(shape):
        assert np.array_equal(v.sum(axis=ax), np.full(shape[:ax] + shape[ax + 1:], n * offset))
        pairs = np.take(v, range(2 * (n // 2)), axis=ax).reshape((*shape[:ax], n // 2, 2, *shape[ax + 1:]))
        assert np.array_equal(pairs.sum(axis=ax + 1), np.full(pairs.shape[:ax + 1] + shape[ax + 1:], 2 * offset))
    big = fpsafe.near_constant((64, 256), dtype, np.random.default_rng(0))
    assert 0.5 / fpsafe.NEAR_CONSTANT_DENSITY < float((big != offset).mean()) < 2.0 / fpsafe.NEAR_CONSTANT_DENSITY


def test_near_constant_sets_come_after_the_others_one_per_input_and_one_for_all() -> None:
    """One set per floating-point input of more than one element (a mask and a one-element input get none), then one
    with every such input near-constant, appended after the earlier sets (whose values are unchanged)."""
    g = vm.Graph.parse("""graph {
  %0 = input {name='X'} : f32[4,8]
  %1 = input {name='M'} : bool[4,8]
  %2 = input {name='S'} : f32[1]
  %3 = input {name='Y'} : f32[4,8]
  %4 = where %1, %0, %3 : f32[4,8]
  %5 = mul %4, %2 : f32[4,8]
  return %5
}""")
    sets = fpsafe.adversarial_inputs(g)
    near = [(i, what) for i, (what, _) in enumerate(sets) if NEAR_CONSTANT_SET in what]
    assert [w.split(" ")[0] for _, w in near] == ["X", "Y", "every"]
    assert [i for i, _ in near] == list(range(len(sets) - 3, len(sets)))
    last = sets[-1][1]
    offset = fpsafe.NEAR_CONSTANT[DType.float32][0]
    assert math.isclose(last["X"].mean(), offset) and math.isclose(last["Y"].mean(), offset)
    assert set(np.unique(last["M"])) <= {0.0, 1.0} and abs(last["S"][0]) <= 3.0
    old_count = len(sets) - 3
    fpsafe_near = dict(fpsafe.NEAR_CONSTANT)
    try:
        fpsafe.NEAR_CONSTANT.clear()
        before = fpsafe.adversarial_inputs(g)
    finally:
        fpsafe.NEAR_CONSTANT.update(fpsafe_near)
    assert len(before) == old_count
    assert all(a[0] == b[0] and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])
               for a, b in zip(before, sets, strict=False))
