"""The floating-point check's refusals that hold whatever a candidate's verdict are made before verifying it
(twenty-first session): at full size a candidate was verified first (~14 CPU-s for Qwen2's cross entropy at 512 x
151,936) and then refused by the structural check or for a difference with no twin of fewer rows."""

from __future__ import annotations

from typing import Any

import pytest

import verimirage as vm
from verimirage.pipeline import fpsafe


def _softmax_numerator() -> vm.Graph:
    g = vm.Graph()
    a = g.input("A", (8, 64), vm.float32)
    g.output(g.exp(g.sub(a, g.max(a, axis=1))))
    return g


def test_candidates_the_fp_check_refuses_whatever_their_verdict_were_verified_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the extraction filter the search lowers the unshifted ``exp(a) / exp(max a)``, which the structural
    check refuses; it used to be verified first (``Proved but floating point: ...``). Now it is refused unverified,
    and only the other candidates reach the verifier."""
    pytest.importorskip("egglog")
    from verimirage.pipeline import superopt
    from verimirage.smt import verify as V

    checked: list[str] = []
    check = V.Verifier.check

    def counting_check(self: Any, mg: Any, *a: Any, **k: Any) -> Any:
        checked.append(str(mg))
        return check(self, mg, *a, **k)

    monkeypatch.setattr(V.Verifier, "check", counting_check)
    monkeypatch.setattr(superopt, "_removes_max_shift", lambda originals, terms: False)
    g = _softmax_numerator()
    res = vm.superoptimize(g, cache=False, progress=False)
    fp = [why for _, why in res.report.rejected if "floating point" in why]
    assert fp and all(why.startswith("not verified: floating point") for why in fp), str(res.report)
    assert res.candidates and all(superopt._max_shifted(c.mugraph) for c in res.candidates)
    assert all(superopt._max_shifted(vm.MuGraph.parse(t)) for t in checked), "an fp-refused candidate was verified"
    assert len(checked) == len(res.candidates) + len(res.report.rejected) - len(fp)


def test_before_verification_refuses_what_check_refuses_and_nothing_it_accepts() -> None:
    """The early refusal is a part of :meth:`SafetyChecker.check`: the same reason where it refuses, None where
    ``check`` accepts; a refusal that needs an evaluation (numeric programs) is left to ``check``."""
    src = _softmax_numerator()
    g = vm.Graph()
    a = g.input("A", (8, 64), vm.float32)
    g.output(g.div(g.exp(a), g.exp(g.max(a, axis=1))))
    bad, good = vm.MuGraph.from_graph(g), vm.MuGraph.from_graph(src)
    sc = fpsafe.SafetyChecker(src)
    assert sc.before_verification(bad) == sc.check(bad) is not None
    assert sc.before_verification(good) is None and sc.check(good) is None


def _variance_pair(rows: int) -> tuple[vm.Graph, vm.Graph]:
    """A centred variance over rows of 96 and the one-pass form (a difference of two sums the source does not take)."""
    src, cand = vm.Graph(), vm.Graph()
    x, y = src.input("X", (rows, 96), vm.float16), cand.input("X", (rows, 96), vm.float16)
    src.output(src.mean(src.square(src.sub(x, src.mean(x, axis=1))), axis=1))
    cand.output(cand.sub(cand.mean(cand.square(y), axis=1), cand.square(cand.mean(y, axis=1))))
    return src, cand


def _structural_only(src: vm.Graph) -> fpsafe.SafetyChecker:
    """A checker of ``src`` as at a size past the near-constant limit."""
    sc = fpsafe.SafetyChecker(src, numeric=False)
    sc.near_at_size = False
    return sc


def test_before_verification_refuses_a_new_difference_without_a_row_twin() -> None:
    """Past the near-constant limit, a candidate taking a difference the source does not and with no twin of fewer
    rows (one row) is refused before verification with :meth:`check`'s reason; with a twin (64 rows) it is left to
    ``check``, whose twin must be proved first."""
    src, cand = _variance_pair(1)
    assert fpsafe.row_twin(src, cand) is None
    why = _structural_only(src).before_verification(cand)
    assert why is not None and "no twin of fewer rows" in why
    assert why == _structural_only(src).check(cand)
    src, cand = _variance_pair(64)
    assert fpsafe.row_twin(src, cand) is not None
    assert _structural_only(src).before_verification(cand) is None
