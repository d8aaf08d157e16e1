"""SearchOptions: one frozen, validated value for every option of ``superoptimize``; StopReason."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline import search_cache
from verimirage.pipeline.options import SearchOptions, StopReason
from verimirage.pipeline.superopt import superoptimize
from verimirage.smt.verdict import Proved, Refuted


def _graph() -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (4, 8), vm.float32)
    w = g.input("W", (8, 8), vm.float32)
    g.output(g.relu(g.matmul(x, w)))
    return g


def _checker(a: vm.Graph, b: vm.Graph):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    ins = {t.name: rng.uniform(-1, 1, t.shape) for t in a.inputs}
    same = all(np.allclose(p, q) for p, q in zip(vm.evaluate(a, ins), vm.evaluate(b, ins), strict=True))
    return Proved("float64 stand-in") if same else Refuted("differs")


def test_options_are_frozen_validated_and_normalised() -> None:
    o = SearchOptions(top_k=2, grids=[1, 2], disable_rules=["exp-sub"])
    assert o.grids == (1, 2) and o.disable_rules == ("exp-sub",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.top_k = 3  # type: ignore[misc]
    for bad in ({"top_k": 0}, {"variants": -1}, {"time_budget_s": 0}, {"grids": [0]}, {"grids": []},
                {"max_verify": 0}, {"node_limit": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SearchOptions(**bad)  # type: ignore[arg-type]
    for bad in ({"profile": 1}, {"rulesets": "default"}, {"disable_rules": "exp-sub"}, {"verifier": 3},
                {"hardware": "H100"}):
        with pytest.raises(TypeError, match=next(iter(bad))):
            SearchOptions(**bad)  # type: ignore[arg-type]
    assert str(SearchOptions()) == "defaults"
    assert "top_k=2" in str(o) and "grids=[1, 2]" in str(o) and "disable_rules=[exp-sub]" in str(o)
    assert o.attempts == 9 and o.verify_budget == 30.0


def test_keywords_and_options_value_are_the_same_search() -> None:
    g = _graph()
    kw = superoptimize(g, top_k=1, verifier=_checker, time_budget_s=20, cache=False, progress=False)
    ov = superoptimize(g, options=SearchOptions(top_k=1, verifier=_checker, time_budget_s=20, cache=False,
                                                progress=False))
    assert [str(c.mugraph) for c in kw.candidates] == [str(c.mugraph) for c in ov.candidates]
    assert kw.report.stopped in (StopReason.ENOUGH, StopReason.EXHAUSTED)
    assert kw.report.stop_reason == kw.report.stopped.value
    assert "options: " in str(kw.report) and "top_k=1" in str(kw.report)
    # keywords beside options override its fields
    mixed = SearchOptions.make(SearchOptions(top_k=3), {"top_k": 1})
    assert mixed.top_k == 1
    with pytest.raises(TypeError, match=r"unknown option.*topk"):
        superoptimize(g, topk=1)
    with pytest.raises(TypeError, match="expected a SearchOptions"):
        superoptimize(g, options={"top_k": 1})  # type: ignore[arg-type]


def test_search_cache_key_changes_with_every_result_option(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(search_cache, "code_digest", lambda: "fixed")
    g = _graph()
    base = SearchOptions()
    k0 = search_cache.cache_key(g, base.cache_fields(None))
    assert k0 == search_cache.cache_key(g, SearchOptions().cache_fields(None))
    changes = {"time_budget_s": 30.0, "node_limit": 100, "iter_limit": 2, "rulesets": ("core",),
               "disable_rules": ("exp-sub",), "grids": (2,), "franges": (4,), "max_splits": 4, "top_k": 2,
               "variants": 1, "terms_per_class": 2, "max_terms": 3, "max_verify": 2, "verify_budget_s": 5.0,
               "calibration": vm.rewrite.cost.Calibration(2.0), "profile": True, "seed": 1,
               "verify_timeout_s": 3.0, "hardware": dataclasses.replace(vm.rewrite.cost.H100, sms=100)}
    keys = {k0}
    for name, v in changes.items():
        k = search_cache.cache_key(g, dataclasses.replace(base, **{name: v}).cache_fields("GPU"))
        assert k not in keys, name
        keys.add(k)
    # options that do not change the result leave the key alone
    for name, v in {"progress": True, "cache": False, "recheck_cache": True}.items():
        assert search_cache.cache_key(g, dataclasses.replace(base, **{name: v}).cache_fields(None)) == k0
    # the GPU a profiled order belongs to is part of the key; without profiling it is not
    assert base.cache_fields("GPU") == base.cache_fields(None)
    p = dataclasses.replace(base, profile=True)
    assert search_cache.cache_key(g, p.cache_fields("A")) != search_cache.cache_key(g, p.cache_fields("B"))
    assert not dataclasses.replace(base, verifier=_checker).cacheable
