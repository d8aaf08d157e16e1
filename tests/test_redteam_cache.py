"""Red-team findings on the search cache: its re-check of a slow-to-derive entry was unbounded (low: denial of
service, nothing wrong accepted), and it served a candidate that overflows where the program does not (medium, see
the test).

The re-check runs the certificate checker in the searching process, without the checker process's time cap. A
tampered entry whose μGraph is a long loop of one-element tiles (``sum`` of ``K`` values as ``K`` loop steps)
makes the abstract derivation take time quadratic in ``K`` (1,024 steps: ~9 s, 2,048: ~30 s at load 9; 65,536
steps: hours) before the entry is rejected, so ``superoptimize`` hung on it. The re-check's derivations now run
under the checker's time cap (``$VERIMIRAGE_CHECK_SECONDS``) as a budget: past it the entry is rejected like any
other bad entry.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.pipeline import search_cache
from verimirage.smt.certificate import Certificate, ff_record, sha256
from verimirage.smt.verdict import Proved

K = 2048


def _programs() -> tuple[vm.Graph, vm.MuGraph]:
    g = vm.Graph.parse(f"""graph {{
  %0 = input {{name='x'}} : f32[1,{K}]
  %1 = sum %0 {{axis=1}} : f32[1,1]
  return %1
}}""")
    mg = vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='x'}} : f32[1,{K}]
  %1 = custom %0 {{frange={K}, grid=(1,)}} : f32[1,1] {{
    %0 = input {{arg=0, fmap=1, imap=(None,), shape=(1, {K})}} : f32[1,1]
    %1 = sum %0 {{axis=1}} : f32[1,1]
    %2 = loop_sum %1 : f32[1,1]
    output %2 {{omap=(0,)}}
  }}
  return %1
}}""")
    return g, mg


@pytest.mark.slow  # (~5 s: the rejected entry's finite-field trials still run)
def test_search_cache_recheck_of_a_slow_to_derive_entry_was_unbounded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from verimirage.pipeline.pricing import cost
    from verimirage.pipeline.superopt import Candidate, SearchReport, SearchResult

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("VERIMIRAGE_CHECK_SECONDS", "1")
    g, mg = _programs()
    gt, mt = str(g), str(mg)
    cert = Certificate(gt, sha256(gt), mt, sha256(mt), [], [], [], [], [], ff_record(g, mg))  # (no queries: a forgery)
    key = search_cache.cache_key(g, {"red": "team"})
    cand = Candidate(mg, cost(mg), Proved("(a forgery)"), cert, (), None)
    search_cache.save(key, SearchResult([cand], SearchReport()))
    t0 = time.perf_counter()
    assert search_cache.load(key, g, recheck="all") is None
    assert time.perf_counter() - t0 < 6.0  # (uncapped: the derivation alone took ~30 s at load 9)
    assert not search_cache.entry_path(key).is_file()


def _softmax(stable: bool) -> vm.Graph:
    g = vm.Graph()
    x = g.input("x", (4, 16), vm.float32)
    e = g.exp(g.sub(x, g.max(x, 1)) if stable else x)
    g.output(g.div(e, g.sum(e, 1)))
    return g


def test_search_cache_served_a_candidate_that_overflows_where_the_source_does_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium: NaN where the program gives numbers, from a tampered or stale entry): the search rejects a
    candidate that is Proved but not finite where the source is (``pipeline.fpsafe``: the unstabilised softmax of a
    max-shifted one); the search cache re-checked only the certificate, which is about the reals, so an entry
    holding ``exp(x) / sum(exp(x))`` for the stable softmax was served (``vm.superoptimize`` returned it, and it
    gave NaN on logits near 100). The code digest of the key does not cover ``pipeline/``, so a fix to the
    floating-point check did not invalidate entries made before it either. The floating-point check now runs on
    every served candidate."""
    from verimirage.pipeline.fpsafe import SafetyChecker
    from verimirage.pipeline.pricing import cost
    from verimirage.pipeline.superopt import Candidate, SearchReport, SearchResult
    from verimirage.smt.certify import make_certificate

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = _softmax(True)
    for stable in (False, True):  # (the unsafe candidate is rejected; the safe one, its control, is served)
        mg = vm.MuGraph.from_graph(_softmax(stable))
        v = vm.verify(g, mg)
        assert isinstance(v, Proved)
        assert (SafetyChecker(g).check(mg) is None) == stable
        key = search_cache.cache_key(g, {"red": "team", "stable": stable})
        search_cache.save(key, SearchResult([Candidate(mg, cost(mg), v, make_certificate(g, mg, v), ())],
                                            SearchReport()))
        hit = search_cache.load(key, g, recheck="all")
        assert (hit is not None) == stable
        assert search_cache.entry_path(key).is_file() == stable
