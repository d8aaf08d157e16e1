"""Red team (tenth session): state that outlives one test or one call."""

from __future__ import annotations

import pytest

from verimirage.smt import budget


@pytest.mark.parametrize("phase", [0, 480])
def test_derivation_budget_test_failed_by_the_tick_phase_earlier_tests_left(phase: int,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (test only, not soundness): test_full_size_layer_derivation_hung_past_its_time_limit failed when run
    after test_certificate.py and test_verify.py in one process. Cause: checkpoint() reads the clock every 1024th
    call of the process (a module counter), and the test's zero-budget derivation makes only 544 calls, so whether
    one of them looked at the clock depended on the count earlier tests left (480 before the test: never). No cache
    was involved: every check re-derived its 544 terms. The test now sets the counter so its next call looks."""
    from tests.test_verify_limits import test_full_size_layer_derivation_hung_past_its_time_limit as t

    monkeypatch.setattr(budget, "_ticks", phase)
    t(monkeypatch)
