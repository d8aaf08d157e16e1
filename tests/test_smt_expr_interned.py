"""The normaliser's speed-ups (smt/expr.py: interned rationals with cached hashes, keys built from cached parts,
identity memo tables) change no term: keys are exactly ``repr``, rationals behave as Fractions."""

from __future__ import annotations

import pickle
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import verimirage as vm
from verimirage.smt import abstract as A
from verimirage.smt import expr as E

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES


def _walk(t: Any, out: list[Any]) -> None:
    out.append(t)
    if isinstance(t, tuple):
        for x in t:
            _walk(x, out)


def _derived(g: vm.Graph) -> list[Any]:
    _, ((exprs, _, _),) = A.derive_all([g])
    return [e for es in exprs for e in es]


def test_q_is_a_fraction_in_value_hash_and_print() -> None:
    for v in (Fraction(0), Fraction(1), Fraction(-3, 7), Fraction(2**70, 3), 5, -1):
        q = E.as_q(v)
        f = Fraction(v)
        assert q == f and hash(q) == hash(f) and repr(q) == repr(f) and str(q) == str(f)
        assert E.as_q(f) is q  # interned: one object per value
        assert type(q * 2) is Fraction and q * 2 == f * 2 and 1 / q == 1 / f if f else True
        assert pickle.loads(pickle.dumps(q)) is q
    assert E.as_q(Fraction(1, 2)) != E.as_q(Fraction(1, 3))


def test_keys_are_repr_and_rationals_interned_on_derived_terms() -> None:
    seen = 0
    for case in CASES[:40]:
        for g in (case.a(), case.b()):
            try:
                exprs = _derived(g)
            except (E.AbstractionError, E.NeedSplit):
                continue
            for e in exprs:
                nodes: list[Any] = []
                _walk(e, nodes)
                for n in nodes:
                    if isinstance(n, tuple) and n:
                        assert E.key_of(n) == repr(n)
                        seen += 1
                    if isinstance(n, Fraction):
                        assert type(n) is E.Q
                assert pickle.loads(pickle.dumps(e)) == e
    assert seen > 1000


def test_derivation_is_deterministic_across_fresh_memo_tables() -> None:
    # the identity memos (keys, free variables, heights) only cache: clearing them changes no term
    g = vm.benchmarks.get("gqa", batch=1, small=True)
    mg = vm.benchmarks.expert("gqa", g)
    first = [repr(e) for e in _derived(mg)]
    for memo in (E._KEYS, E._FV, E._HEIGHT):  # (the normaliser's caches: keys, free variables, heights)
        memo.clear()
    E._reset_qs()  # (and its interned rationals)
    assert E.as_q(0) is E.ZERO and E.as_q(1) is E.ONE and E.as_q(-1) is E.MINUS_ONE
    assert [repr(e) for e in _derived(mg)] == first


def test_interned_rationals_restart_keeping_the_constants(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # past the cap the table restarts; zero must still be ZERO (and x - x is still the zero polynomial)
    monkeypatch.setattr(E, "_QS_MAX", 8)
    for k in range(2, 40):
        E.as_q(Fraction(1, k))
    assert E.as_q(0) is E.ZERO and E.as_q(1) is E.ONE
    x = E.p_atom(("in", "X", ()))
    assert E.p_add(x, x, -1) == E.poly({})  # x - x is the zero polynomial, no zero-coefficient term left
