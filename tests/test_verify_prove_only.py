"""A search's verifications stop early once no Proved is possible (``Verifier.check(prove_only=True)``), and a
cancelled finite-field test never proves."""

from __future__ import annotations

import threading

import verimirage as vm
from verimirage.smt.ff import FFReference
from verimirage.smt.verdict import Outcome
from verimirage.smt.verify import Verifier

F = vm.float16


def _pair(wrong: bool) -> tuple[vm.Graph, vm.Graph]:
    g = vm.Graph()
    x, w = g.input("X", (8, 16), F), g.input("W", (16, 8), F)
    g.output(g.matmul(g.exp(x), w))
    h = vm.Graph()
    x2, w2 = h.input("X", (8, 16), F), h.input("W", (16, 8), F)
    e = h.exp(x2)
    h.output(h.matmul(h.scale(e, 2.0) if wrong else e, w2))
    return g, h


def test_cancelled_ff_test_is_unknown_never_proved() -> None:
    g, h = _pair(wrong=False)
    ref = FFReference(g)
    stop = threading.Event()
    stop.set()
    r = ref.compare(h, cancel=stop)
    assert r.outcome == Outcome.UNKNOWN and "cancelled" in r.reason
    assert ref.compare(h).outcome == Outcome.PROVED  # the same pair, not cancelled


def test_prove_only_keeps_proved_and_never_proves_a_wrong_candidate() -> None:
    g, good = _pair(wrong=False)
    _, bad = _pair(wrong=True)
    v = Verifier(g)
    full, fast = v.check(good), v.check(good, prove_only=True)
    assert isinstance(full, vm.Proved) and isinstance(fast, vm.Proved)
    assert [(c.name, c.outcome) for c in full.evidence] == [(c.name, c.outcome) for c in fast.evidence]
    assert fast.evidence[0].param("trials") == full.evidence[0].param("trials")  # every trial ran
    assert not isinstance(v.check(bad, prove_only=True), vm.Proved)
    assert isinstance(v.check(bad), vm.Refuted)  # (the full check still finds the refutation)


def test_slow_derivation_leaves_the_queries_their_time_limit(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a derivation slower than the queries' limit (a loaded machine) used to leave them no time: "time limit
    # reached" for a pair Z3 proves at once (decode_gqa's split-KV candidates at load ~12)
    import time as _time

    from verimirage.smt import abstract as A
    from verimirage.smt import verify as V

    g, good = _pair(wrong=False)
    slow_derive = A.derive_all

    def derive_all(*args, **kw):  # type: ignore[no-untyped-def]
        _time.sleep(0.6)
        return slow_derive(*args, **kw)

    monkeypatch.setattr(A, "derive_all", derive_all)
    r = V.abstract_check(g, good, timeout_s=0.2)
    assert r.outcome == Outcome.PROVED, r.reason
    assert r.seconds > 0.6  # (the derivation took longer than the queries' limit)
