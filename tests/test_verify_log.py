"""log in the verifier (issue 21): the max-shifted logsumexp, log-softmax and cross-entropy are proved equal
to the plain forms (the field's q-part holds log as exp's exact inverse; the abstract check's law log-exp),
and what is false over the reals, or less defined than the target, is never Proved."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.models import cross_entropy, log_softmax, logsumexp
from verimirage.smt import ffref
from verimirage.smt.ff import Field, ff_test, ff_test_q
from verimirage.smt.ff.field import _log_table
from verimirage.smt.verdict import Outcome


def _pair(fn: Callable[..., vm.Tensor], *, targets: bool = False, shape: tuple[int, int] = (4, 16)
          ) -> tuple[vm.Graph, vm.Graph]:
    gs = []
    for stable in (True, False):
        g = vm.Graph()
        x = g.input("X", shape, vm.float32)
        if targets:
            g.output(fn(g, x, g.input("T", shape, vm.float32), stable=stable))
        else:
            g.output(fn(g, x, 1, stable=stable))
        gs.append(g)
    return gs[0], gs[1]


PAIRS = {"logsumexp": lambda: _pair(logsumexp), "log_softmax": lambda: _pair(log_softmax),
         "cross_entropy": lambda: _pair(cross_entropy, targets=True)}


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_max_shifted_form_is_proved_equal_to_the_plain_one(name: str, tmp_path: Path) -> None:
    stable, plain = PAIRS[name]()
    v = vm.verify(stable, plain)
    assert isinstance(v, vm.Proved), v.reason
    assert "q-world" in dict(v.evidence[0].params)["bound_note"] or "no probability" in v.reason
    # the independent checker re-checks it (its reference evaluator compares q-parts too)
    from verimirage.ir.graph import MuGraph
    from verimirage.smt.certify import make_certificate

    mg = MuGraph.from_graph(stable)  # the stable form as the (unfused) candidate of the plain program
    v = vm.verify(plain, mg)
    assert isinstance(v, vm.Proved), v.reason
    cert = make_certificate(plain, mg, v)
    assert "log-exp" in cert.laws
    cert.save(tmp_path / "c.json")
    assert isinstance(vm.check_certificate(tmp_path / "c.json"), vm.Proved)


def _g(f: Callable[..., vm.Tensor], names: tuple[str, ...] = ("X",)) -> vm.Graph:
    g = vm.Graph()
    g.output(f(g, *[g.input(n, (3, 5), vm.float32) for n in names]))
    return g


AB = ("A", "B")
#: (target, candidate, inputs, what the verifier must answer): false pairs Refuted, pairs true only where
#: the candidate takes log of what the target does not (less defined) or that the field cannot model Unknown
CASES: dict[str, tuple[Callable[..., vm.Tensor], Callable[..., vm.Tensor], tuple[str, ...], type]] = {
    "log_sum_is_not_sum_of_logs": (lambda g, a, b: g.log(g.add(a, b)), lambda g, a, b: g.add(g.log(a), g.log(b)),
                                   AB, vm.Refuted),
    "log_of_sum_exp_is_not_the_max": (lambda g, x: g.log(g.sum(g.exp(x), axis=1)), lambda g, x: g.max(x, axis=1),
                                      ("X",), vm.Refuted),
    "lse_shifted_by_half_the_max": (
        lambda g, x: g.log(g.sum(g.exp(x), axis=1)),
        lambda g, x: g.add(g.max(x, axis=1), g.log(g.sum(g.exp(g.sub(x, g.scale(g.max(x, axis=1), 0.5))), axis=1))),
        ("X",), vm.Refuted),
    "log_product_needs_positive_factors": (lambda g, a, b: g.log(g.mul(a, b)),
                                           lambda g, a, b: g.add(g.log(a), g.log(b)), AB, vm.Unknown),
    "log_of_negation_is_not_log": (lambda g, x: g.log(g.neg(x)), lambda g, x: g.log(x), ("X",), vm.Unknown),
    "log_square_is_twice_log_only_for_positives": (lambda g, x: g.log(g.square(x)),
                                                   lambda g, x: g.scale(g.log(x), 2.0), ("X",), vm.Unknown),
    "exp_of_log_is_not_tested_in_the_field": (lambda g, x: g.exp(g.log(x)), lambda g, x: x, ("X",), vm.Unknown),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_false_or_less_defined_log_identities_are_never_proved(name: str) -> None:
    fa, fb, names, want = CASES[name]
    v = vm.verify(_g(fa, names), _g(fb, names))
    assert not isinstance(v, vm.Proved), name
    assert isinstance(v, want), (name, v.reason)


def test_exp_of_log_against_its_negation_is_not_proved() -> None:
    """In the field's model the discrete log forgets the sign (exp(log y) is y or -y): such programs are not
    tested there (else exp(log x) = -x would pass about half the trials of a scalar)."""
    a, b = _g(lambda g, x: g.exp(g.log(x))), _g(lambda g, x: g.neg(x))
    assert not isinstance(vm.verify(a, b), vm.Proved)
    assert ff_test_q(a, b).outcome == Outcome.UNKNOWN
    assert ff_test(a, b).outcome == Outcome.UNKNOWN
    assert ffref.ref_test(a, b, [1, 2], part="q").outcome == Outcome.UNKNOWN
    assert ffref.exp_after_log(a) and not ffref.exp_after_log(b)


def test_log_exp_identities_are_proved() -> None:
    for fa, fb, names in [
        (lambda g, x: g.log(g.exp(x)), lambda g, x: x, ("X",)),
        (lambda g, a, b: g.log(g.mul(g.exp(a), g.exp(b))), lambda g, a, b: g.add(a, b), AB),
        (lambda g, a, b: g.log(g.mul(g.exp(a), g.sum(g.exp(b), axis=1))),
         lambda g, a, b: g.add(a, g.log(g.sum(g.exp(b), axis=1))), AB),
    ]:
        v = vm.verify(_g(fa, names), _g(fb, names))
        assert isinstance(v, vm.Proved), v.reason


@pytest.mark.parametrize("seed", [0, 7, 123])
def test_the_discrete_log_is_a_homomorphism_inverse_to_exp(seed: int) -> None:
    f = Field.from_seed(seed)
    t, e = _log_table(f.p, f.q, f.g), f.exp_table()
    rng = np.random.default_rng(seed)
    k = rng.integers(0, f.q, 1000)
    assert np.array_equal(t[e[k]], k)  # log(exp k) = k
    a, b = rng.integers(1, f.p, 1000), rng.integers(1, f.p, 1000)
    assert np.array_equal(t[a * b % f.p], (t[a] + t[b]) % f.q)  # log(ab) = log a + log b
    assert t[f.p - 1] == 0 and t[0] == -1  # the sign is forgotten; log 0 has no meaning
    ref = ffref.field_of(seed)
    assert (ref.p, ref.q, ref.g) == (f.p, f.q, f.g)
    assert np.array_equal(ffref._log_table(ref), t)  # the reference evaluator's table is the same


@pytest.mark.slow
def test_search_finds_the_max_shifted_logsumexp_of_the_plain_one() -> None:
    pytest.importorskip("egglog")
    g = vm.Graph()
    g.output(logsumexp(g, g.input("X", (4, 64), vm.float32), 1, stable=False))
    res = vm.superoptimize(g, time_budget_s=60, max_verify=3, cache=False)
    shifted = [c for c in res.candidates if "logsumexp-stabilise" in c.rules]
    assert shifted and all(isinstance(c.verdict, vm.Proved) for c in shifted)
    assert any(n.op == "max" for c in shifted for n in c.graph.nodes)


def test_exp_after_log_follows_values_through_kernels() -> None:
    """A one-kernel log(sum(exp(x))) is tested (its exp reads no log); a kernel computing exp(log(x)) is not."""
    from verimirage.rewrite.partition import analyse, build, configs

    def kernels(f: Callable[..., vm.Tensor]) -> list[vm.MuGraph]:
        g = _g(f)
        an = analyse(g)
        return [build(an, c).mugraph for c in configs(an)[:3]]

    lse = kernels(lambda g, x: g.log(g.sum(g.exp(x), axis=1)))
    assert lse and all(m.num_kernels == 1 and not ffref.exp_after_log(m) for m in lse)
    bad = kernels(lambda g, x: g.exp(g.log(x)))
    assert bad and all(ffref.exp_after_log(m) for m in bad)
    assert "log" in ffref.ops_in(lse[0]) and "log" not in ffref.ops_in(_g(lambda g, x: g.exp(x)))
