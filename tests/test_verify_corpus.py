"""The mutation corpus (tests/cases/corpus.py): expert rewrites Proved, planted mistakes never Proved."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES


def test_corpus_size() -> None:
    assert len(CASES) >= 50
    assert len({c.name for c in CASES}) == len(CASES)
    assert sum(c.expect == "proved" for c in CASES) >= 20
    assert sum(c.expect != "proved" for c in CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case) -> None:
    v = vm.verify(case.a(), case.b())
    if case.expect == "proved":
        assert isinstance(v, vm.Proved), v.summary()
        ff = next(c for c in v.evidence if c.name == "finite-field")
        assert ff.param("false_accept_bound") <= 2.0**-60  # the per-node model's figure (trial count)
        # a stated probability is one; else the record says why none is stated
        assert v.false_accept_bound is None or v.false_accept_bound <= 2.0**-40
        assert v.false_accept_bound is not None or ff.param("bound_note").startswith("no probability stated")
        assert {c.name for c in v.evidence} == {"finite-field", "abstract-z3"}
    elif case.expect == "unknown":
        assert isinstance(v, vm.Unknown), v.summary()
    elif case.expect == "refuted":
        # a refutation carries float inputs that replay the difference (issue 26 item 4)
        assert isinstance(v, vm.Refuted), v.summary()
        a, b = case.a(), case.b()
        ins = v.counterexample["float_inputs"]
        assert any(not np.allclose(x, y, rtol=1e-6, atol=1e-9)
                   for x, y in zip(vm.evaluate(a, ins), vm.evaluate(b, ins), strict=True))
    else:
        assert not isinstance(v, vm.Proved), v.summary()
        assert v.caught_by(), v.summary()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_expressions_found_while_splitting_cases_are_the_ones_derive_makes(case) -> None:
    # abstract_check reuses what output_cases derived; it must be exactly what derive computes afresh
    from verimirage.smt import abstract as A
    from verimirage.smt.limits import deep_call

    def check() -> None:  # (in a deep-stack thread, as the verifier runs it: some cases are deep programs)
        a, b = case.a(), case.b()
        derived: A.Derived = {}
        cases = [A.output_cases([a, b], k, t.shape, derived) for k, t in enumerate(a.outputs)]
        fresh = (A.derive(a, cases), A.derive(b, cases))
        assert derived  # (every final case was derived on the way)
        assert (A.derive(a, cases, derived), A.derive(b, cases, derived)) == fresh

    deep_call(check)
