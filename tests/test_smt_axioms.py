"""Every law the normaliser may use is listed, and holds on concrete random values."""

from __future__ import annotations

import pytest

import verimirage as vm
from verimirage.benchmarks.designs import expert, small_design_kw
from verimirage.smt.axioms import AXIOMS, check_law
from verimirage.smt.verify import abstract_check


@pytest.mark.parametrize("name", sorted(AXIOMS))
def test_law_holds_on_random_values(name: str) -> None:
    assert check_law(name)


@pytest.mark.parametrize("name", vm.benchmarks.names())
def test_laws_used_are_listed(name: str) -> None:
    g = vm.benchmarks.get(name, small=True)
    r = abstract_check(g, expert(name, g, **small_design_kw(name)))
    assert r.outcome == "proved", r.reason
    assert set(r.laws) <= set(AXIOMS), set(r.laws) - set(AXIOMS)
    assert all(q.result == "unsat" and "goal" in q.core for q in r.queries)
