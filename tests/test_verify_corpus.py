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
    # derive_all keeps what it derived while splitting cases; it must be exactly what a fresh derivation on each
    # final case computes
    from verimirage.smt import abstract as A
    from verimirage.smt.deep import deep_call

    def check() -> None:  # (in a deep-stack thread, as the verifier runs it: some cases are deep programs)
        a, b = case.a(), case.b()
        cases, got = A.derive_all([a, b])
        fresh = [[[A.derive_on(g, c, k) for c in cs] for k, cs in enumerate(cases)] for g in (a, b)]
        assert [(e, ls, ds) for e, ls, ds in got] == [([[x[0] for x in cs] for cs in f], set().union(
            *(x[1] for cs in f for x in cs)), [[x[2] for x in cs] for cs in f]) for f in fresh]

    deep_call(check)
