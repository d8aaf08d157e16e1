"""Issue 27 findings 3-7 and issue 26 item 4: what ``Proved``, ``Refuted`` and the bound claim.

Each test is named after the finding it guards (see the issue text for the attacks).
"""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline.admit import admit
from verimirage.rewrite.rules import AVar, Instance, PVar, Rule, RuleError, pat
from verimirage.smt import ff as FF

F32 = vm.float32


def g1(body, shapes=None, dtype=F32):  # type: ignore[no-untyped-def]
    """A kernel graph over inputs ``shapes`` (default X: 4x8) returning ``body(g, *inputs)``."""
    g = vm.Graph()
    ins = [g.input(n, s, dtype) for n, s in (shapes or {"X": (4, 8)}).items()]
    g.output(body(g, *ins))
    return g


def const(g, x, c):  # type: ignore[no-untyped-def]
    """A tensor of ``x``'s shape filled with ``c`` (``0 * x + c``)."""
    return g.shift(g.scale(x, 0.0), c)


def replay_differs(a: vm.Graph, b: vm.Graph, v: vm.Refuted) -> bool:
    ins = v.counterexample["float_inputs"]
    oa, ob = vm.evaluate(a, ins), vm.evaluate(b, ins)
    return any(not np.allclose(x, y, rtol=1e-6, atol=1e-9) for x, y in zip(oa, ob, strict=True))


# --------------------------------------------------------------------------- finding 4: false refutations

EQUAL_OVER_THE_REALS = {
    "relu-vs-maximum-x-0": (lambda g, x: g.relu(x), lambda g, x: g.maximum(x, g.sub(x, x))),
    "exp-max-vs-max-exp": (lambda g, x: g.exp(g.maximum(x, const(g, x, 0.0))),
                           lambda g, x: g.maximum(g.exp(x), const(g, x, 1.0))),
    "max-2x-vs-2max": (lambda g, x: g.maximum(g.scale(x, 2.0), const(g, x, 2.0)),
                       lambda g, x: g.scale(g.maximum(x, const(g, x, 1.0)), 2.0)),
    "sqrt-square-vs-abs": (lambda g, x: g.sqrt(g.mul(x, x)), lambda g, x: g.add(g.relu(x), g.relu(g.neg(x)))),
}


@pytest.mark.parametrize("name", sorted(EQUAL_OVER_THE_REALS))
def test_finding4_programs_equal_over_the_reals_are_not_refuted(name: str) -> None:
    fa, fb = EQUAL_OVER_THE_REALS[name]
    v = vm.verify(g1(fa), g1(fb))
    assert isinstance(v, vm.Unknown), v.summary()


#: the issue's literal pairs that do differ over the reals (exp(max(x, 1)) is >= e): refuted with a witness
DIFFERENT = {
    "exp-max1-vs-max-exp": (lambda g, x: g.exp(g.maximum(x, const(g, x, 1.0))),
                            lambda g, x: g.maximum(g.exp(x), const(g, x, 1.0))),
    "max-2x-1-vs-2max": (lambda g, x: g.maximum(g.scale(x, 2.0), const(g, x, 1.0)),
                         lambda g, x: g.scale(g.maximum(x, const(g, x, 1.0)), 2.0)),
    "exp-vs-square": (lambda g, x: g.exp(x), lambda g, x: g.square(x)),
}


@pytest.mark.parametrize("name", sorted(DIFFERENT))
def test_finding4_issue26_refuted_carries_replayable_float_inputs(name: str) -> None:
    fa, fb = DIFFERENT[name]
    a, b = g1(fa), g1(fb)
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted), v.summary()
    assert v.counterexample["float_differences"] and replay_differs(a, b, v)


# --------------------------------------------------------------------------- finding 5: the bound


def test_finding5_max_evidence_is_not_a_probability() -> None:
    shapes = {"X": (4, 8), "Y": (4, 8)}
    a = g1(lambda g, x, y: g.maximum(x, g.sub(y, y)), shapes)
    b = g1(lambda g, x, y: g.add(x, g.sub(y, y)), shapes)
    r = FF.ff_test(a, b)
    assert r.outcome == "proved"  # residues are >= 0: max(x, 0) = x in every field
    assert r.stated_bound is None and r.bound_note.startswith("no probability stated")
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted) and replay_differs(a, b, v)  # z3 says sat and a float witness exists
    assert v.false_accept_bound is None


def test_finding5_degree_of_a_sum_of_quotients_clears_denominators() -> None:
    shapes = {"X": (1, 4096), "Y": (1, 4096)}
    g = g1(lambda g, x, y: g.sum(g.div(y, x), axis=1), shapes)
    # N / D with deg N, deg D <= 4096: the identity test's polynomial N_a D_b - N_b D_a has degree <= 8192
    assert FF.degree_info(g).degree == 4096 and FF.degree_bound(g)[0] == 4096  # (was 2)
    r = FF.ff_test(g, g)
    assert r.per_trial_bound >= (2 * 4096 + 1) / (int(FF.safe_primes()[0] - 1) // 2)
    # a common denominator (the softmax normaliser, constant along the summed axis) does not multiply
    s = g1(lambda g, x, s: g.sum(g.div(x, s), axis=1), {"X": (4, 16), "S": (4, 1)})
    assert FF.degree_info(s).degree == 1


def test_finding5_elementwise_applications_are_counted() -> None:
    g = g1(lambda g, x: g.exp(x), {"X": (16, 32)})
    assert FF.degree_info(g).applications == 16 * 32
    info = FF.degree_info(vm.benchmarks.get("gqa", small=True))
    assert info.opaque == 1 and info.applications >= 2 * 32 * 128
    stated, note = FF.stated_bound([info], 4, True)
    assert stated is None and "element-wise" in note  # too many applications for a 21-bit field
    assert FF.stated_bound([FF.degree_info(g1(lambda g, x: g.mul(x, x)))], 4, True)[0] is not None


def test_finding5_one_trial_is_not_proved() -> None:
    a = g1(lambda g, x: g.mul(x, x))
    b = g1(lambda g, x: g.square(x))
    v = vm.verify(a, b, trials=1)
    assert isinstance(v, vm.Unknown) and "above the acceptable" in v.reason
    assert isinstance(vm.verify(a, b), vm.Proved)


# --------------------------------------------------------------------------- finding 7: dtypes, custom verifiers


def test_finding7_dtypes_are_part_of_equivalence() -> None:
    a = g1(lambda g, x: g.exp(x))
    b = g1(lambda g, x: g.exp(x), dtype=vm.bfloat16)
    v = vm.verify(a, b)
    assert isinstance(v, vm.Unknown) and "dtypes differ" in v.reason and v.caught_by() == ("dtypes",)
    assert isinstance(vm.verify(a, g1(lambda g, x: g.exp(x))), vm.Proved)


def test_finding7_custom_verifier_candidates_are_labelled_not_proved() -> None:
    g = vm.benchmarks.get("lora", small=True)
    res = vm.superoptimize(g, verifier=lambda a, b: vm.Proved("trust me"), top_k=1, progress=False, cache=False)
    assert res.best is not None
    assert res.best.verified_by == "custom verifier" and res.best.certificate is None
    assert not isinstance(res.best.verdict, vm.Proved) and "custom verifier" in res.best.verdict.reason
    assert any("custom verifier" in n for n in res.report.notes)


# --------------------------------------------------------------------------- finding 6: rules on degenerate instances

X, Y = PVar("x"), PVar("y")
AX, K = AVar("ax"), AVar("k")

DEGENERATE_RULES = [
    Rule("transpose-id-1x1", pat.transpose(X, a=0, b=1), pat.neg(pat.neg(X)), "bad",
         instances=(Instance.of({"x": (1, 1)}),)),
    Rule("matmul-commutes-1x1", pat.matmul(X, Y), pat.matmul(Y, X), "bad",
         instances=(Instance.of({"x": (1, 1), "y": (1, 1)}),)),
    Rule("sum-drop-size1", pat.sum(X, axis=AX), pat.neg(pat.neg(X)), "bad",
         instances=(Instance.of({"x": (3, 1)}, ax=1),)),
    Rule("max-is-sum-size1", pat.max(X, axis=AX), pat.sum(X, axis=AX), "bad",
         instances=(Instance.of({"x": (3, 1)}, ax=1),)),
    Rule("scale-k-is-identity-k1", pat.scale(X, c=K), pat.neg(pat.neg(X)), "bad",
         instances=(Instance.of({"x": (3, 4)}, k=1.0),)),
]


@pytest.mark.parametrize("rule", DEGENERATE_RULES, ids=lambda r: r.name)
def test_finding6_rules_proved_on_degenerate_instances_only_are_refused(rule: Rule) -> None:
    with pytest.raises(RuleError, match="refused"):
        admit(rule)


def test_finding6_all_ones_instances_are_unknown_in_verify_rule() -> None:
    from verimirage.smt.verify import verify_rule

    a = g1(lambda g, x: g.transpose(x, 0, 1), {"X": (1, 1)})
    b = g1(lambda g, x: g.neg(g.neg(x)), {"X": (1, 1)})
    assert isinstance(vm.verify(a, b), vm.Proved)  # true on 1x1 ...
    assert isinstance(verify_rule("t", [(a, b)]), vm.Unknown)  # ... but not a proof of the rule


def test_finding6_egglog_panic_skips_the_rule_and_the_search_goes_on() -> None:
    pytest.importorskip("egglog")
    bad = Rule("sum-drop", pat.sum(X, axis=AX), pat.neg(pat.neg(X)), "bad",
               instances=(Instance.of({"x": (3, 1)}, ax=1),), trusted=True)
    g = g1(lambda g, x: g.exp(g.sum(x, axis=1)), dtype=vm.float16)
    res = vm.superoptimize(g, extra_rules=[bad], time_budget_s=20, top_k=1, progress=False, cache=False)
    assert res.best is not None
    assert any(what == "rule sum-drop" and "panicked" in why for what, why in res.report.rejected)


# --------------------------------------------------------------------------- finding 3: floating-point safety


def _softmax_numerator(dtype: vm.DType = F32):  # type: ignore[no-untyped-def]
    return g1(lambda g, a: g.exp(g.sub(a, g.max(a, axis=1))), {"A": (8, 64)}, dtype)


def _unshifted(dtype: vm.DType = F32):  # type: ignore[no-untyped-def]
    return g1(lambda g, a: g.div(g.exp(a), g.exp(g.max(a, axis=1))), {"A": (8, 64)}, dtype)


@pytest.mark.parametrize("dtype", [vm.float32, vm.float16, vm.bfloat16], ids=lambda d: d.short)
def test_finding3_fp_safety_rejects_the_unshifted_form(dtype: vm.DType) -> None:
    from verimirage.pipeline.fpsafe import SafetyChecker, fp_safety

    src, bad = _softmax_numerator(dtype), _unshifted(dtype)
    assert isinstance(vm.verify(src, bad), vm.Proved)  # equal over the reals
    why = fp_safety(src, bad)
    assert why is not None and "max" in why  # the structural check
    why = SafetyChecker(src).numeric_check(bad)  # and the evaluation in the dtype, on its own
    assert why is not None and "non-finite" in why and dtype.short in why
    assert fp_safety(src, src) is None


def test_finding3_bf16_rounding_is_round_to_nearest_even() -> None:
    from verimirage.pipeline.fpsafe import round_to

    x = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.5e38, -2.0, np.nan])
    r = round_to(x, vm.bfloat16)
    assert r[0] == 1.0 and r[1] == 1.0 and r[2] == 1.0 + 2.0**-6 and np.isinf(r[3]) and r[4] == -2.0
    assert np.isnan(r[5])


def test_finding3_max_shifted_checks_the_subtraction() -> None:
    from verimirage.pipeline.fpsafe import max_shifted as _max_shifted

    assert _max_shifted(_softmax_numerator())
    assert not _max_shifted(_unshifted())  # a max somewhere is not a shift
    other = g1(lambda g, a, b: g.exp(g.sub(a, g.max(b, axis=1))), {"A": (8, 64), "B": (8, 64)})
    assert not _max_shifted(other)  # shifted by another tensor's max
    stable = vm.benchmarks.get("gqa_stable", small=True)
    assert _max_shifted(stable) and _max_shifted(vm.benchmarks.expert("gqa_stable", stable))


def test_finding3_search_never_returns_the_unshifted_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("egglog")
    from verimirage.pipeline import superopt

    g = _softmax_numerator()
    res = vm.superoptimize(g, cache=False, progress=False)
    assert res.candidates and all(superopt._max_shifted(c.mugraph) for c in res.candidates)
    assert all("exp-sub" not in c.rules for c in res.candidates)
    # without the extraction filter the floating-point check itself rejects it
    monkeypatch.setattr(superopt, "_removes_max_shift", lambda originals, terms: False)
    res = vm.superoptimize(g, cache=False, progress=False)
    assert all("exp-sub" not in c.rules for c in res.candidates)
    assert any("floating point" in why for _, why in res.report.rejected), str(res.report)


def test_finding4_no_float_witness_where_only_the_source_is_undefined() -> None:
    # sqrt(x)^2 is x wherever it is defined; the second program is more defined (a refinement), not different
    a = g1(lambda g, x: g.mul(g.sqrt(x), g.sqrt(x)))
    b = g1(lambda g, x: g.neg(g.neg(x)))
    assert not isinstance(vm.verify(a, b), vm.Refuted)
    # the other way round the candidate is NaN where the source is defined: less defined (not Proved), but NaN is
    # no float64 difference, so not Refuted either (test_nan_float_witness_counted_as_refuted)
    v = vm.verify(b, a)
    assert not isinstance(v, vm.Proved)
    if isinstance(v, vm.Refuted):
        assert replay_differs(b, a, v) and all(np.isfinite([d["a"], d["b"]]).all()
                                               for d in v.counterexample["float_differences"])


def test_nan_float_witness_counted_as_refuted() -> None:
    # verifier finding: float inputs on which one program is NaN (sqrt or log of a negative input) counted as a
    # Refuted's witness; NaN or an infinity on either side is undefinedness, not a float64 difference
    from verimirage.smt.verify import float_witness

    x_ = g1(lambda g, x: g.neg(g.neg(x)))
    sq = g1(lambda g, x: g.mul(g.sqrt(x), g.sqrt(x)))  # x wherever sqrt is defined, NaN for x < 0
    lg = g1(lambda g, x: g.add(x, g.sub(g.log(x), g.log(x))))  # x wherever log is defined, NaN for x <= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        for a, b in ((x_, sq), (sq, x_), (x_, lg), (lg, x_), (sq, lg)):
            assert float_witness(a, b) is None
        v = vm.verify(x_, sq)  # the field tells them apart (sqrt is an oracle there); float64 does not
        assert isinstance(v, vm.Unknown) and "both finite" in v.reason, v.reason
        # a real difference beside NaN elements is still found, finite on both sides, and replays
        off = g1(lambda g, x: g.add(g.shift(x, 1.0), g.sub(g.log(x), g.log(x))))  # x + 1 where x > 0, else NaN
        w = float_witness(x_, off)
        assert w is not None
        d = w["float_differences"][0]
        assert np.isfinite([d["a"], d["b"]]).all() and abs(d["a"] - d["b"]) > 0.5
        oa, ob = vm.evaluate(x_, w["float_inputs"]), vm.evaluate(off, w["float_inputs"])
        assert oa[0][d["index"]] == d["a"] and ob[0][d["index"]] == d["b"]


def test_finding3_large_programs_get_the_structural_check() -> None:
    from verimirage.pipeline.fpsafe import SafetyChecker

    src = vm.benchmarks.get("gqa_stable")  # full size: too large to evaluate on every input set here
    sc = SafetyChecker(src)
    assert not sc.numeric
    assert sc.check(vm.benchmarks.expert("gqa_stable", src)) is None
    plain = vm.benchmarks.get("gqa")  # the same program without the max shift
    why = sc.check(plain)
    assert why is not None and "max" in why
