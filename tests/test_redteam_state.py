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


def test_launch_config_key_left_out_rank2() -> None:
    """Finding (tenth session, low: a cache key, no value changes): LaunchConfig.key() (the selection cache's key and
    records) named every tile option but TileOptions.rank2 (codegen 10), so two configurations generating different
    kernels had one key: a selection over both kept one of them and its records read as duplicates. Every tile
    option that changes the source must change the key; the defaults' keys are unchanged."""
    import dataclasses

    from verimirage.backend.codegen import LaunchConfig, TileOptions

    other = {"dot_min_m": 32, "dot_min_nk": 32, "fp32_precision": "tf32", "unroll_max": 4, "evict_once": True,
             "dot_batch1": True, "row_dot": 32, "rank2": False,
             "stream_order": False, "flat": 1024}
    fields = {f.name for f in dataclasses.fields(TileOptions)}
    assert fields == set(other), f"a new tile option: add it to LaunchConfig.key() and here ({fields - set(other)})"
    base = LaunchConfig()
    assert base.key() == "w4s2m64n16ieee"
    keys = {LaunchConfig(tiles=TileOptions(**{k: v})).key() for k, v in other.items()}
    assert len(keys) == len(other) and base.key() not in keys


def test_search_cache_key_names_every_search_option_held() -> None:
    """Held: every SearchOptions field is in the search cache's key (cache_fields) or cannot reach a cached search
    (a custom verifier or user rules make it uncacheable; progress / cache / recheck_cache change no result). Fails
    when a new option is added without a decision."""
    import dataclasses

    from verimirage.pipeline.options import SearchOptions

    fields = {f.name for f in dataclasses.fields(SearchOptions)}
    exempt = {"progress", "cache", "recheck_cache", "verifier", "extra_rules"}
    # (window_ops is in the key when on, tails when off: at their defaults a key is the one before the option existed)
    assert fields - exempt == set(SearchOptions(window_ops=24, tails=False).cache_fields(None)) - {"device"}
    assert fields - exempt - {"window_ops", "tails"} == set(SearchOptions().cache_fields(None)) - {"device"}
    assert not SearchOptions(verifier=lambda a, b: None).cacheable
