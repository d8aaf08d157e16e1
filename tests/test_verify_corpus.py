"""The mutation corpus (tests/cases/corpus.py): expert rewrites Proved, planted mistakes never Proved."""

from __future__ import annotations

import sys
from pathlib import Path

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
        assert v.false_accept_bound is not None and v.false_accept_bound <= 2.0**-60
        assert {c.name for c in v.evidence} == {"finite-field", "abstract-z3"}
    elif case.expect == "unknown":
        assert isinstance(v, vm.Unknown), v.summary()
    else:
        assert not isinstance(v, vm.Proved), v.summary()
        assert v.caught_by(), v.summary()
