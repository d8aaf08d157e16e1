"""The structural check's max shift (``fpsafe.exp_shifts``) and a floored max (red team 19b, nineteenth session).

A running max is floored at fp32's lowest finite value (``partition.RUNNING_MAX_FLOOR``) so that a row of -inf scores
does not make ``-inf - (-inf)``; the check took ``clamp(max x, lo, hi)`` for any ``lo`` as a max of ``x``. A floor above
a row's scores makes every exp of the row 0 and its softmax 0 / 0: ``exp(x - clamp(max x, 1e4))`` over the row sum is
proved equal to the softmax (any per-row shift cancels over the reals), is NaN on every row of +-3, and at a size the
numeric check does not evaluate (structural only) it passed.
"""

from __future__ import annotations

import numpy as np

import verimirage as vm
from verimirage.ir.dtypes import DType
from verimirage.ir.finfo import DTYPE_MAX
from verimirage.pipeline.fpsafe import SafetyChecker, evaluate_in_dtype, max_shifted

TOP = DTYPE_MAX[DType.float32]


def _softmax(r: int, n: int) -> vm.Graph:
    return vm.Graph.parse(f"""graph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = max %0 {{axis=1}} : f32[{r},1]
  %2 = sub %0, %1 : f32[{r},{n}]
  %3 = exp %2 : f32[{r},{n}]
  %4 = sum %3 {{axis=1}} : f32[{r},1]
  %5 = div %3, %4 : f32[{r},{n}]
  return %5
}}""")


def _shifted(r: int, n: int, shift: str, shape: str = "") -> vm.MuGraph:
    """The softmax of X's rows shifted by ``%2 = shift`` (an op of ``%1 = max X`` with its attributes) of type
    ``f32[shape]`` (default ``r, 1``), one op a kernel."""
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = max %0 {{axis=1}} : f32[{r},1]
  %2 = {shift} : f32[{shape or f"{r},1"}]
  %3 = sub %0, %2 : f32[{r},{n}]
  %4 = exp %3 : f32[{r},{n}]
  %5 = sum %4 {{axis=1}} : f32[{r},1]
  %6 = div %4, %5 : f32[{r},{n}]
  return %6
}}""")


def _floored(r: int, n: int, lo: float) -> vm.MuGraph:
    """The softmax with its max floored at ``lo`` (``clamp(max x, lo, fp32 max)``), one op a kernel."""
    return _shifted(r, n, f"clamp %1 {{hi={TOP!r}, lo={lo!r}}}")


def test_fp_check_took_a_max_floored_above_the_scores_as_a_max_shift() -> None:
    small = _floored(8, 64, 1e4)
    assert isinstance(vm.verify(_softmax(8, 64), small), vm.Proved)
    x = np.random.default_rng(0).uniform(-3.0, 3.0, (8, 64))
    assert np.isnan(evaluate_in_dtype(small, {"X": x}, generated=True)[0][0]).all()
    checker = SafetyChecker(_softmax(4096, 1024))  # (4M input elements: the structural check only)
    assert not checker.numeric
    why = checker.check(_floored(4096, 1024, 1e4))
    assert why is not None and "subtracts the max before every exp" in why, why
    assert not max_shifted(_floored(8, 64, 0.0))
    # the search's floor (fp32's lowest finite value) is a max shift: every row with a finite score keeps its max
    assert max_shifted(_floored(8, 64, -TOP)) and checker.check(_floored(4096, 1024, -TOP)) is None


def _global(r: int, n: int) -> vm.MuGraph:
    """The softmax shifted by the max of the row maxes (a scalar, the whole tensor's max), one op a kernel."""
    return _shifted(r, n, "max %1 {axis=0}", "1,1")


def test_fp_check_took_a_max_of_the_row_maxes_as_a_max_shift() -> None:
    """``exp(x - max(max(x, 1), 0))`` over the row sum is proved equal to the softmax; a row 200 below another is
    0 / 0 = NaN (fp32's exp underflows below -104), where the source is finite; at a size the numeric check does not
    evaluate it passed the structural check."""
    small = _global(8, 64)
    assert isinstance(vm.verify(_softmax(8, 64), small), vm.Proved)
    x = np.random.default_rng(1).uniform(-3.0, 3.0, (8, 64))
    x[0] += 200.0
    out = evaluate_in_dtype(small, {"X": x}, generated=True)[0][0]
    assert np.isnan(out[1:]).all() and np.isfinite(evaluate_in_dtype(_softmax(8, 64), {"X": x})[0][0]).all()
    assert not max_shifted(small)
    why = SafetyChecker(_softmax(4096, 1024)).check(_global(4096, 1024))
    assert why is not None and "subtracts the max before every exp" in why, why


def _distances(n: int, d: int, kind: str = "graph") -> str:
    """Pairwise squared distances ``sum((x[:, None] - c[None]) ** 2, -1)`` of ``n`` points of ``d`` dims each."""
    return f"""{kind} {{
  %0 = input {{name='X'}} : f32[{n},1,{d}]
  %1 = input {{name='C'}} : f32[1,{n},{d}]
  %2 = sub %0, %1 : f32[{n},{n},{d}]
  %3 = square %2 : f32[{n},{n},{d}]
  %4 = sum %3 {{axis=2}} : f32[{n},{n},1]
  return %4
}}"""


def test_fp_check_evaluated_a_broadcast_of_gibibytes_from_small_inputs() -> None:
    """The size gates counted input elements and matmul flops only: 4096 x 64 points each (524k input elements, no
    product) took the whole numeric check, whose every set holds the 2^30-element difference in float64 (8 GiB a
    value; 256 points: 0.2 GiB and 5 s, growing as n^2). A value above ``LARGE_VALUE_ELEMENTS`` (the near-constant
    sets: above their input bound) leaves the structural check only."""
    from verimirage.pipeline import fpsafe

    src = vm.Graph.parse(_distances(4096, 64))
    assert sum(int(np.prod(t.shape)) for t in src.inputs) <= fpsafe.LARGE_INPUT_ELEMENTS
    assert fpsafe.largest_value(src) == 4096 * 4096 * 64
    checker = SafetyChecker(src)
    assert not checker.numeric and not checker.near_at_size and not checker.sets
    assert checker.check(vm.MuGraph.parse(_distances(4096, 64, "mugraph"))) is None and not checker.sets
    assert SafetyChecker(vm.Graph.parse(_distances(64, 64))).numeric  # (256 Ki elements a value: evaluated)


def _joined(r: int, n: int, other: str, score: str | None = None) -> vm.MuGraph:
    """The softmax of X's rows shifted by ``maximum(max X, other)``: ``other`` names a (r, 1) value ``%3`` computed
    from ``%0`` (X), ``%1`` (T, a (r, 1) input: the decode's new score beside the cache's scores) and ``%2`` (max X)
    in lines numbered from ``%3`` (``{k}``: the node number ``3 + k``); the softmax follows. ``score``: the value
    (``other`` where "other") whose exp, shifted by the same maximum, the row's sum adds (the decode's new score's
    term, a softmax over the row and the new score)."""
    lines = other.format(**{f"k{k}": 3 + k for k in range(64)}).splitlines()
    m = 3 + len(lines) - 1  # (other's value)
    if score is None:  # (the row's sum alone)
        tail, out = "", m + 4
    else:  # (the row's sum plus the score's exp, shifted by the same maximum)
        y = m if score == "other" else score
        tail = (f"  %{m + 5} = sub %{y}, %{m + 1} : f32[{r},1]\n  %{m + 6} = exp %{m + 5} : f32[{r},1]\n"
                f"  %{m + 7} = add %{m + 4}, %{m + 6} : f32[{r},1]\n")
        out = m + 7
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = input {{name='T'}} : f32[{r},1]
  %2 = max %0 {{axis=1}} : f32[{r},1]
{chr(10).join(lines)}
  %{m + 1} = maximum %2, %{m} : f32[{r},1]
  %{m + 2} = sub %0, %{m + 1} : f32[{r},{n}]
  %{m + 3} = exp %{m + 2} : f32[{r},{n}]
  %{m + 4} = sum %{m + 3} {{axis=1}} : f32[{r},1]
{tail}  %{out + 1} = div %{m + 3}, %{out} : f32[{r},{n}]
  return %{out + 1}
}}""")


def test_fp_check_took_a_maximum_with_a_value_computed_from_the_row_as_a_max_shift() -> None:
    """``maximum(max x, max x + 1000)`` (or the row's sum of |x|) is above every score of the row: each exp 0 and the
    softmax 0 / 0, proved equal to the softmax (a per-row shift) and taken as a max shift. An operand beside the max
    must be a max of x too or a value not computed from x (the decode's new score ``T``)."""
    from verimirage.pipeline.fpsafe import exp_shifts

    plus = "  %{k0} = shift %2 {{c=1000.0}} : f32[R,1]\n  %{k1} = maximum %{k0}, %1 : f32[R,1]"
    abs_sum = ("  %{k0} = abs %0 : f32[R,64]\n  %{k1} = sum %{k0} {{axis=1}} : f32[R,1]\n"
               "  %{k2} = maximum %{k1}, %1 : f32[R,1]")
    plus, abs_sum = plus.replace("R", "8"), abs_sum.replace("R", "8")
    for other in (plus, abs_sum):
        assert exp_shifts(_joined(8, 64, other)) == ["sum"], other
    x = np.random.default_rng(2).uniform(-3.0, 3.0, (8, 64))
    out = evaluate_in_dtype(_joined(8, 64, plus), {"X": x, "T": np.zeros((8, 1))}, generated=True)[0][0]
    new_score = "  %{k0} = scale %1 {{c=1.0}} : f32[8,1]"
    assert isinstance(vm.verify(_joined(8, 64, new_score), _joined(8, 64, plus)), vm.Proved)
    assert np.isnan(out).all()
    # (the new score T: not computed from X, and its exp, shifted by the same maximum, in the row's sum)
    assert exp_shifts(_joined(8, 64, new_score, "other")) == ["max", "max"]  # (its own exp: by a maximum of itself)
    big = _joined(4096, 1024, plus.replace("[8,1]", "[4096,1]"))
    why = SafetyChecker(_softmax(4096, 1024)).structural(big)
    assert why is not None and "subtracts the max before every exp" in why, why


def test_fp_check_lost_a_maximums_dependence_on_the_row_past_16_ops() -> None:
    """``reads`` (93a835d) stopped 16 operations up from the maximum's operand: ``max x + 1000`` scaled by 1.0 twenty
    times was taken as a value not computed from x, a max shift again. It now walks every operand (each value
    once: a chain of 30 diamonds ``v * v + v`` is 2^30 paths)."""
    from verimirage.pipeline.fpsafe import exp_shifts

    deep = "  %{k0} = shift %2 {{c=1000.0}} : f32[8,1]\n" + "".join(
        f"  %{{k{i + 1}}} = scale %{{k{i}}} {{{{c=1.0}}}} : f32[8,1]\n" for i in range(20)) + \
        "  %{k21} = maximum %{k20}, %1 : f32[8,1]"
    assert exp_shifts(_joined(8, 64, deep)) == ["sum"]
    diamonds = "  %{k0} = scale %1 {{c=1.0}} : f32[8,1]\n" + "".join(
        f"  %{{k{2 * i + 1}}} = mul %{{k{2 * i}}}, %{{k{2 * i}}} : f32[8,1]\n"
        f"  %{{k{2 * i + 2}}} = add %{{k{2 * i + 1}}}, %{{k{2 * i}}} : f32[8,1]\n" for i in range(30))
    diamonds = diamonds.rstrip("\n")
    assert exp_shifts(_joined(8, 64, diamonds, "other")) == ["max", "max"]  # (computed from T alone: a new score)


def _twice(r: int, n: int, c: float) -> vm.MuGraph:
    """One kernel taking x twice (two operands, one kernel-level value, one map): the softmax of the first read's
    rows shifted by ``maximum(max x1, max x2 + c)``."""
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = custom %0, %0 {{frange=1, grid=({r},)}} : f32[{r},{n}] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=({r}, {n})}} : f32[1,{n}]
    %1 = input {{arg=1, fmap=None, imap=(0,), shape=({r}, {n})}} : f32[1,{n}]
    %2 = max %0 {{axis=1}} : f32[1,1]
    %3 = max %1 {{axis=1}} : f32[1,1]
    %4 = shift %3 {{c={c!r}}} : f32[1,1]
    %5 = maximum %2, %4 : f32[1,1]
    %6 = sub %0, %5 : f32[1,{n}]
    %7 = exp %6 : f32[1,{n}]
    %8 = sum %7 {{axis=1}} : f32[1,1]
    %9 = div %7, %8 : f32[1,{n}]
    output %9 {{omap=(0,)}}
  }}
  return %1
}}""")


def test_fp_check_took_a_second_read_of_x_as_a_value_not_computed_from_x() -> None:
    """Block inputs were one value only as one node: a kernel taking x twice, shifted by ``maximum(max x1, max x2 +
    1000)``, passed the maximum rule (``max x2 + 1000`` "not computed from x1"): Proved, NaN on every row, and the
    full-size structural check passed it. Two operands of a kernel that are one kernel-level value read through the
    same maps are now one value: ``maximum(max x1, max x2)`` is the row's max."""
    from verimirage.pipeline.fpsafe import exp_shifts

    small = _twice(8, 64, 1000.0)
    assert isinstance(vm.verify(_softmax(8, 64), small), vm.Proved)
    x = np.random.default_rng(3).uniform(-3.0, 3.0, (8, 64))
    assert np.isnan(evaluate_in_dtype(small, {"X": x}, generated=True)[0][0]).all()
    assert exp_shifts(small) == ["sum"]
    why = SafetyChecker(_softmax(4096, 1024)).check(_twice(4096, 1024, 1000.0))
    assert why is not None and "subtracts the max before every exp" in why, why
    joined = vm.MuGraph.parse(str(_twice(8, 64, 0.0)).replace("maximum %2, %4", "maximum %2, %3"))
    assert exp_shifts(joined) == ["max"]  # (maximum(max x1, max x2) is the row's max: x2 is x1)


def test_fp_check_took_the_max_of_a_whole_second_read_of_x_as_another_score() -> None:
    """A kernel taking x twice, the second read whole (every row), shifted its row by ``maximum(max x1, max of all
    of x2)``, the whole tensor's max: ``x2`` is no read of ``x1``'s tile, so the maximum rule took it as another score
    of the row. Proved, 0 / 0 on every row far below another, passed the full-size structural check. An operand beside
    the max must now also read a value ``x`` does not (the decode's new key beside the cache)."""
    from verimirage.pipeline.fpsafe import exp_shifts

    def whole(r: int, n: int) -> vm.MuGraph:
        text = str(_twice(r, n, 0.0)).replace(
            f"%1 = input {{arg=1, fmap=None, imap=(0,), shape=({r}, {n})}} : f32[1,{n}]",
            f"%1 = input {{arg=1, fmap=None, imap=(None,), shape=({r}, {n})}} : f32[{r},{n}]").replace(
            "%3 = max %1 {axis=1} : f32[1,1]", f"%3 = max %1 {{axis=1}} : f32[{r},1]").replace(
            "%4 = shift %3 {c=0.0} : f32[1,1]", "%4 = max %3 {axis=0} : f32[1,1]")
        return vm.MuGraph.parse(text)

    small = whole(8, 64)
    assert isinstance(vm.verify(_softmax(8, 64), small), vm.Proved)
    x = np.random.default_rng(4).uniform(-3.0, 3.0, (8, 64))
    x[0] += 200.0
    assert np.isnan(evaluate_in_dtype(small, {"X": x}, generated=True)[0][0][1:]).all()
    assert exp_shifts(small) == ["sum"]
    why = SafetyChecker(_softmax(2048, 1024)).check(whole(2048, 1024))
    assert why is not None and "subtracts the max before every exp" in why, why


def _two_kernels(r: int, n: int) -> vm.MuGraph:
    """Kernel 1 writes each row's ``max x + 1000``; kernel 2 shifts the row by ``maximum(max x, that)``."""
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = custom %0 {{frange=1, grid=({r},)}} : f32[{r},1] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=({r}, {n})}} : f32[1,{n}]
    %1 = max %0 {{axis=1}} : f32[1,1]
    %2 = shift %1 {{c=1000.0}} : f32[1,1]
    output %2 {{omap=(0,)}}
  }}
  %2 = custom %0, %1 {{frange=1, grid=({r},)}} : f32[{r},{n}] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=({r}, {n})}} : f32[1,{n}]
    %1 = input {{arg=1, fmap=None, imap=(0,), shape=({r}, 1)}} : f32[1,1]
    %2 = max %0 {{axis=1}} : f32[1,1]
    %3 = maximum %2, %1 : f32[1,1]
    %4 = sub %0, %3 : f32[1,{n}]
    %5 = exp %4 : f32[1,{n}]
    %6 = sum %5 {{axis=1}} : f32[1,1]
    %7 = div %5, %6 : f32[1,{n}]
    output %7 {{omap=(0,)}}
  }}
  return %2
}}""")


def test_fp_check_took_another_kernels_max_plus_1000_as_another_score() -> None:
    """The maximum rule's "reads a value x does not" stopped at a kernel's operands: ``max x + 1000`` written by a
    first kernel was another kernel-level value than x, so ``maximum(max x, it)`` passed as the decode's new score:
    Proved, NaN on every row, and the full-size structural check passed it. Sources are now followed through kernels
    to the program's inputs (the decode's new key reads its own weight, which the cache's scores do not)."""
    from verimirage.pipeline.fpsafe import exp_shifts

    small = _two_kernels(8, 64)
    assert isinstance(vm.verify(_softmax(8, 64), small), vm.Proved)
    x = np.random.default_rng(5).uniform(-3.0, 3.0, (8, 64))
    assert np.isnan(evaluate_in_dtype(small, {"X": x}, generated=True)[0][0]).all()
    assert exp_shifts(small) == ["sum"]
    why = SafetyChecker(_softmax(4096, 1024)).check(_two_kernels(4096, 1024))
    assert why is not None and "subtracts the max before every exp" in why, why


def _scaled_softmax(r: int, n: int, shift: str | None = None) -> vm.Graph | vm.MuGraph:
    """``softmax(X) * T`` (T a (r, 1) input: a row weight, any input beside the scores); ``shift``: the candidate
    shifting X's rows by ``maximum(max X, shift)`` (``shift``: an op of T, ``%1``) instead of ``max X``."""
    kind, m = ("graph", "%2") if shift is None else ("mugraph", "%4")
    extra = "" if shift is None else f"  %3 = {shift} : f32[{r},1]\n  %4 = maximum %2, %3 : f32[{r},1]\n"
    k = 2 if shift is None else 4
    text = f"""{kind} {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = input {{name='T'}} : f32[{r},1]
  %2 = max %0 {{axis=1}} : f32[{r},1]
{extra}  %{k + 1} = sub %0, {m} : f32[{r},{n}]
  %{k + 2} = exp %{k + 1} : f32[{r},{n}]
  %{k + 3} = sum %{k + 2} {{axis=1}} : f32[{r},1]
  %{k + 4} = div %{k + 2}, %{k + 3} : f32[{r},{n}]
  %{k + 5} = mul %{k + 4}, %1 : f32[{r},{n}]
  return %{k + 5}
}}"""
    return vm.Graph.parse(text) if shift is None else vm.MuGraph.parse(text)


def test_fp_check_took_a_maximum_with_1000_times_another_input_as_a_max_shift() -> None:
    """``maximum(max x, 1000 * t)``, ``t`` an input beside the scores (a row weight here; the decode's new score, the
    values of an attention), passed the maximum rule as "another score of the row" (not computed from x, reads an
    input x does not), a max shift: proved equal (a per-row shift), NaN on every row where ``1000 t`` is above the
    row, and passed the full-size structural check. Another score now counts only where the program exps it, shifted
    by the same maximum, into a normaliser with x's exps (the term exp(0) = 1 where it is the maximum)."""
    from verimirage.pipeline.fpsafe import exp_shifts

    over = "scale %1 {c=1000.0}"
    small = _scaled_softmax(8, 64, over)
    assert isinstance(vm.verify(_scaled_softmax(8, 64), small), vm.Proved)
    rng = np.random.default_rng(6)
    ins = {"X": rng.uniform(-3.0, 3.0, (8, 64)), "T": rng.uniform(0.5, 1.0, (8, 1))}
    assert np.isnan(evaluate_in_dtype(small, ins, generated=True)[0][0]).all()
    assert np.isfinite(evaluate_in_dtype(_scaled_softmax(8, 64), ins)[0][0]).all()
    assert exp_shifts(small) == ["sum"] and exp_shifts(_scaled_softmax(8, 64)) == ["max"]
    checker = SafetyChecker(_scaled_softmax(4096, 1024))
    assert not checker.numeric
    why = checker.check(_scaled_softmax(4096, 1024, over))
    assert why is not None and "subtracts the max before every exp" in why, why
    # the new score exp'd by the same maximum and summed into the row's normaliser is a score of the row: its max
    # shift; 1000 times it, where only the score itself is exp'd so, is not (the row's sum is 0 where 1000 t is above)
    assert exp_shifts(_joined(8, 64, "  %{k0} = scale %1 {{c=1.0}} : f32[8,1]", "other")) == ["max", "max"]
    assert exp_shifts(_joined(8, 64, "  %{k0} = scale %1 {{c=1000.0}} : f32[8,1]", "1")) == ["sum", "sum"]


def _decode_softmax(r: int, n: int, floor: bool) -> vm.Graph | vm.MuGraph:
    """The softmax over each row of X and its new score T (the decode's form: shifted by ``maximum(max X, T)``);
    ``floor``: the candidate shifting by ``relu`` of it (the maximum floored at zero), one op a kernel."""
    shift = f"  %4 = relu %3 : f16[{r},1]\n" if floor else f"  %4 = scale %3 {{c=1.0}} : f16[{r},1]\n"
    text = f"""{"mugraph" if floor else "graph"} {{
  %0 = input {{name='X'}} : f16[{r},{n}]
  %1 = input {{name='T'}} : f16[{r},1]
  %2 = max %0 {{axis=1}} : f16[{r},1]
  %3 = maximum %2, %1 : f16[{r},1]
{shift}  %5 = sub %0, %4 : f16[{r},{n}]
  %6 = exp %5 : f16[{r},{n}]
  %7 = sub %1, %4 : f16[{r},1]
  %8 = exp %7 : f16[{r},1]
  %9 = sum %6 {{axis=1}} : f16[{r},1]
  %10 = add %9, %8 : f16[{r},1]
  %11 = div %6, %10 : f16[{r},{n}]
  return %11
}}"""
    return vm.MuGraph.parse(text) if floor else vm.Graph.parse(text)


def test_fp_check_drew_no_rows_far_below_zero_and_passed_a_shift_floored_at_zero() -> None:
    """The decode's softmax over a row and its new score, shifted by ``relu(maximum(max x, t))`` (floored at zero),
    is proved equal (a per-row shift) and NaN (0 / 0) on every row far below zero, where the source is finite. The
    structural check passes it (the source's new-score exp is no max shift, so nothing is demanded), and so did every
    input set: each spreads a row over both signs or keeps it positive, so the row's max is above zero. The sets now
    include every logit input far below zero (``BELOW_SETS``)."""
    from verimirage.pipeline import fpsafe

    src, cand = _decode_softmax(8, 64, False), _decode_softmax(8, 64, True)
    assert isinstance(vm.verify(src, cand), vm.Proved)
    checker = SafetyChecker(src)
    assert checker.structural(cand) is None
    why = checker.check(cand)
    assert why is not None and "far below zero" in why and "non-finite" in why, why
    first = min(i for i, (what, _) in enumerate(checker.sets) if "far below zero" in what)
    assert all(checker._compare(cand, i) is None for i in range(first)
               if i not in checker.special and not checker.source_outputs(i)[1])
    ins = checker.sets[first][1]
    assert (ins["X"] < -9990).all() and (ins["T"] < -9990).all()
    assert np.isfinite(checker.source_outputs(first)[0][0]).all()
    assert [w for w, _ in fpsafe.adversarial_inputs(src) if "far below zero" in w] == [
        f"T, X {what} (the others uniform +-3)" for what, _, _ in fpsafe.BELOW_SETS]


def test_fp_check_took_a_normaliser_nothing_reads_as_the_rows_sum() -> None:
    """The maximum rule (266e191) asked for a normaliser summing x's exp and the other score's, shifted by the same
    maximum: one that nothing reads passed it, while the output divided by x's sum alone, 0 / 0 where ``1000 t`` is
    the maximum. Only a normaliser an output is computed from counts now."""
    from verimirage.pipeline.fpsafe import exp_shifts

    def dead(r: int, n: int) -> vm.MuGraph:
        return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{r},{n}]
  %1 = input {{name='T'}} : f32[{r},1]
  %2 = max %0 {{axis=1}} : f32[{r},1]
  %3 = scale %1 {{c=1000.0}} : f32[{r},1]
  %4 = maximum %2, %3 : f32[{r},1]
  %5 = sub %0, %4 : f32[{r},{n}]
  %6 = exp %5 : f32[{r},{n}]
  %7 = sum %6 {{axis=1}} : f32[{r},1]
  %8 = sub %3, %4 : f32[{r},1]
  %9 = exp %8 : f32[{r},1]
  %10 = add %7, %9 : f32[{r},1]
  %11 = reciprocal %10 : f32[{r},1]
  %12 = div %6, %7 : f32[{r},{n}]
  %13 = mul %12, %1 : f32[{r},{n}]
  return %13
}}""")

    small = dead(8, 64)
    assert isinstance(vm.verify(_scaled_softmax(8, 64), small), vm.Proved)
    rng = np.random.default_rng(7)
    ins = {"X": rng.uniform(-3.0, 3.0, (8, 64)), "T": rng.uniform(0.5, 1.0, (8, 1))}
    assert np.isnan(evaluate_in_dtype(small, ins, generated=True)[0][0]).all()
    assert exp_shifts(small) == ["sum", "sum"]
    why = SafetyChecker(_scaled_softmax(4096, 1024)).check(dead(4096, 1024))
    assert why is not None and "subtracts the max before every exp" in why, why
    live = vm.MuGraph.parse(str(small).replace("%12 = div %6, %7", "%12 = div %6, %10"))
    assert exp_shifts(live)[0] == "max"  # (the same normaliser, read: the row's sum has the term exp(0))
