"""The search: lifting, extraction, partitioning, cost model, superoptimize, user rules, ablation."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.opfacts import missing_domains
from verimirage.pipeline import pricing
from verimirage.pipeline.superopt import ablate, superoptimize, verify_estimate_s
from verimirage.rewrite import cost as cost_mod
from verimirage.rewrite.lift import EClassTerms, Term, commutation_key, graph_terms, lift, term_to_graph
from verimirage.rewrite.partition import Config, Infeasible, analyse, build, lower_all
from verimirage.rewrite.rules import Instance, PVar, Rule, RuleError, occurs, pat, select_rules
from verimirage.rewrite.saturate import Attribution, attribute, saturate
from verimirage.smt.verdict import Proved, Refuted

NAMES = vm.benchmarks.names()
ATTENTION = {"gqa", "mha", "mqa", "qknorm_gqa", "gqa_stable", "mha_stable"}
HAVE_VERIFY = importlib.util.find_spec("verimirage.smt.verify") is not None


def _inputs(g: vm.Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.uniform(-1.0, 1.0, t.shape) for t in g.inputs}


def _same(a: vm.Graph, b: vm.Graph, seed: int = 0) -> bool:
    ins = _inputs(a, seed)
    return all(np.allclose(x, y, rtol=1e-9, atol=1e-9) for x, y in zip(vm.evaluate(a, ins), vm.evaluate(b, ins),
                                                                       strict=True))


def numeric_checker(a: vm.Graph, b: vm.Graph):  # type: ignore[no-untyped-def]
    """A float64 stand-in for vm.verify, to test the search machinery on its own."""
    return Proved("float64 stand-in") if _same(a, b) else Refuted("float64 outputs differ")


# --------------------------------------------------------------------------- lifting


def test_every_kernel_op_has_an_egglog_meaning() -> None:
    assert [m for m in missing_domains() if m[1] == "egglog"] == []


@pytest.mark.parametrize("name", NAMES)
def test_lift_and_back_is_the_same_function(name: str) -> None:
    g = vm.benchmarks.get(name, small=True)
    lifted = lift(g)
    assert lifted.terms == graph_terms(g)
    back = term_to_graph(lifted.terms, lifted.inputs)
    assert _same(g, back)


def test_shape_analysis_is_set_and_propagated() -> None:
    from egglog import i64

    from verimirage.rewrite.lift import dim, rank

    g = vm.benchmarks.get("gqa", small=True)
    lifted = lift(g)
    saturate(lifted, select_rules(["softmax"], [], []), iter_limit=3, node_limit=500, time_budget_s=10)
    eg, root = lifted.egraph, lifted.roots[0]
    assert eg.extract(rank(root)) == i64(3)
    assert eg.extract(dim(root, 2)) == i64(16)


def test_deferred_normalisation_reaches_the_egraph() -> None:
    g = vm.benchmarks.get("gqa", small=True)
    lifted = lift(g)
    stats, data = saturate(lifted, select_rules(None, [], []), iter_limit=6, node_limit=2000, time_budget_s=20)
    assert stats.fired.get("defer-normalisation", 0) >= 1
    terms = EClassTerms(data, 6).terms_of(lifted.terms[0])
    assert any(t.op == "div" and t.args[0].op == "matmul" for t in terms)


def test_rmsnorm_division_moves_after_the_matmul() -> None:
    g = vm.benchmarks.get("rmsnorm_linear", small=True)
    lifted = lift(g)
    _, data = saturate(lifted, select_rules(None, [], []), iter_limit=6, node_limit=2000, time_budget_s=20)
    terms = EClassTerms(data, 8).terms_of(lifted.terms[0])
    assert any(t.op == "mul" and "matmul" in (t.args[0].op, t.args[1].op) for t in terms)
    for t in terms:
        assert _same(g, term_to_graph([t], lifted.inputs))


# --------------------------------------------------------------------------- partitioning


@pytest.mark.parametrize("name", NAMES)
def test_every_lowering_evaluates_equal(name: str) -> None:
    g = vm.benchmarks.get(name, small=True)
    lifted = lift(g)
    _, data = saturate(lifted, select_rules(None, [], []), iter_limit=6, node_limit=2000, time_budget_s=20)
    ex = EClassTerms(data, 3)
    terms = [ex.terms_of(t)[:2] for t in lifted.terms]
    ins = _inputs(g)
    ref = vm.evaluate(g, ins)
    checked = 0
    for choice in zip(*terms, strict=False):
        g2 = term_to_graph(list(choice), lifted.inputs)
        lows, _ = lower_all(g2, franges=(1, 2, 4), rank=pricing.cost)
        for low in lows[::3]:  # a deterministic sample keeps the test fast
            low.mugraph.check()
            out = vm.evaluate(low.mugraph, ins)
            for x, y in zip(out, ref, strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9, err_msg=f"{low.steps} {low.config}")
            checked += 1
    assert checked >= 2


def test_online_softmax_and_split_kv_lowering_of_the_stable_attention() -> None:
    g = vm.benchmarks.get("gqa_stable", small=True)
    lifted = lift(g)
    _, data = saturate(lifted, select_rules(None, [], []), iter_limit=6, node_limit=2000, time_budget_s=20)
    terms = EClassTerms(data, 6).terms_of(lifted.terms[0])
    deferred = next(t for t in terms if t.op == "div" and t.args[0].op == "matmul")
    g2 = term_to_graph([deferred], lifted.inputs)
    an = analyse(g2)
    (kv,) = an.reduction_labels()[:1] or [None]
    kv = next(lab for lab in an.reduction_labels() if an.size[lab] == 128)
    heads, rows = an.data_parallel()[:2]
    one = build(an, Config(((heads, 2), (rows, 2)), kv, 4, 1))
    two = build(an, Config(((heads, 2), (rows, 2)), kv, 2, 2))
    assert one.mugraph.num_kernels == 1 and "partition.online_softmax" in one.steps
    assert two.mugraph.num_kernels == 2 and "partition.split_kv" in two.steps
    ops = {n.op for n in two.mugraph.nodes[3].attr("block").nodes}
    assert {"running_max", "rescaled_sum", "loop_max"} <= ops
    for low in (one, two):
        assert _same(g, low.mugraph)


def test_infeasible_partitions_say_why() -> None:
    g = vm.benchmarks.get("gqa", small=True)  # softmax normalised before the matmul: no loop over KV
    an = analyse(g)
    kv = next(lab for lab in an.reduction_labels() if an.size[lab] == 128)
    with pytest.raises(Infeasible, match="mixes a post-loop value"):
        build(an, Config(((an.data_parallel()[0], 2),), kv, 4, 1))


# --------------------------------------------------------------------------- cost model


def test_cost_model_prefers_fusion_and_rejects_oversized_tiles() -> None:
    g = vm.benchmarks.get("gqa", batch=1)
    expert = vm.benchmarks.expert("gqa", g)
    unfused = vm.MuGraph.from_graph(g)
    ce, cu = pricing.cost(expert), pricing.cost(unfused)
    assert ce.launches == 2 and cu.launches == 5
    assert ce.time_s < cu.time_s and ce.bytes < cu.bytes
    assert not ce.infeasible
    # one block holding all of K and V (no loop, no split): far beyond 227 KB
    an = analyse(vm.benchmarks.get("gqa", batch=1))
    big = build(an, Config(((an.data_parallel()[0], 2),)))
    cb = pricing.cost(big.mugraph)
    assert cb.infeasible and "shared memory" in cb.reason


def test_kernel_level_ops_are_never_infeasible_for_shared_memory() -> None:
    # issue 4: qknorm_gqa's unfused baseline was rejected: its rms_norm of K over axis 1, wrapped in the
    # default block graph (a 64 x 1024 tile, 256 KB in the model), is how the backend runs that op (8 KB of
    # shared memory on sm_90). Fused candidates keep the check and their costs.
    g = vm.benchmarks.get("qknorm_gqa", batch=1)
    cu = pricing.cost(vm.MuGraph.from_graph(g))
    assert not cu.infeasible and cu.launches == 7 and cu.smem_max > cost_mod.H100.smem_per_block
    from verimirage.backend.wrap import to_kernels

    cw = pricing.cost(to_kernels(vm.MuGraph.from_graph(g)))  # the same kernels as custom ones: checked
    assert cw.infeasible and cw.time_s == cu.time_s
    an = analyse(g)
    big = build(an, Config(((an.data_parallel()[0], 2),)))
    assert pricing.cost(big.mugraph).infeasible


@pytest.mark.skipif(not HAVE_VERIFY, reason="needs verimirage.smt.verify")
def test_qknorm_gqa_without_deferred_normalisation_gets_a_verified_candidate() -> None:
    g = vm.benchmarks.get("qknorm_gqa", batch=1)
    res = superoptimize(g, disable_rules=["defer-normalisation"], cache=False, progress=False)
    assert res.candidates, str(res.report)
    assert isinstance(res.best.verdict, Proved) and res.best.certificate is not None
    # without the rule the whole program fuses nothing (7 kernels, one per op); split into regions, the attention
    # core still fuses (its composition proved region by region), so the best is cheaper than one kernel per op
    unfused = pricing.cost(vm.MuGraph.from_graph(g))
    assert res.best.cost.time_s < unfused.time_s, (res.best, unfused)


def test_calibration_recovers_scale() -> None:
    gs = [vm.benchmarks.expert(n, vm.benchmarks.get(n)) for n in ("gqa", "rmsnorm_linear", "lora", "ntrans")]
    samples = [(g, 2.0 * pricing.cost(g).time_s) for g in gs]
    cal = pricing.calibrate(samples)
    for g, t in samples:
        assert pricing.cost(g, cal=cal).time_s == pytest.approx(t, rel=0.35)


# --------------------------------------------------------------------------- superoptimize (search machinery)


@pytest.mark.parametrize("name", NAMES)
def test_search_reaches_expert_kernel_counts(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=1, progress=False)
    best = res.best
    assert best is not None, str(res.report)
    # (rmsnorm_linear: split-K over 192 blocks plus a combine kernel ties the one 96-block kernel, estimated and
    # measured: H100 sweeps 21.3 vs 22.1 us and 21.6 vs 21.0 us, benchmarks/perf/results/run{3,5}_sweep.json)
    limit = 2 if name in ATTENTION or name == "rmsnorm_linear" else 1
    assert best.num_kernels <= limit, f"{name}: {best!r}\n{best.mugraph}"
    assert best.rules and any(r.startswith("partition.") for r in best.rules)


def numeric_checker_full(a: vm.Graph, b: vm.Graph):  # type: ignore[no-untyped-def]
    """Full-size graphs: structural sanity only (the small-size tests check values)."""
    b.check()
    return Proved("structural stand-in for full-size search tests")


@pytest.mark.parametrize("name", NAMES)
def test_small_search_candidates_are_equal_and_sorted(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1, small=True)
    res = superoptimize(g, verifier=numeric_checker, top_k=3, progress=False)
    assert res.candidates, str(res.report)
    costs = [c.cost.time_s for c in res.candidates]
    assert costs == sorted(costs)
    for c in res.candidates:
        # a custom verifier's acceptance is labelled, never a Proved (no certificate)
        assert c.verified_by == "custom verifier" and not isinstance(c.verdict, Proved) and c.certificate is None
        assert "custom verifier" in c.verdict.reason and "accepted by custom verifier" in repr(c)
        assert _same(g, c.mugraph, seed=7)
    r = res.report
    assert r.egraph_enodes > 0 and r.lowered >= len(res.candidates) and r.stop_reason
    assert {"saturate", "extract", "lower", "verify"} <= set(r.phase_seconds)
    assert set(r.phase_cpu_seconds) == set(r.phase_seconds) and all(v >= 0 for v in r.phase_cpu_seconds.values())
    assert "e-graph" in str(r)


def test_progress_display_runs() -> None:
    res = superoptimize(vm.benchmarks.get("ntrans", small=True), verifier=numeric_checker, progress=True)
    assert res.best is not None


def test_search_is_deterministic() -> None:
    g = vm.benchmarks.get("gqa_stable", small=True)
    a = superoptimize(g, verifier=numeric_checker, progress=False)
    b = superoptimize(g, verifier=numeric_checker, progress=False)
    assert [str(c.mugraph) for c in a.candidates] == [str(c.mugraph) for c in b.candidates]
    assert [c.rules for c in a.candidates] == [c.rules for c in b.candidates]


def test_wrong_candidates_are_rejected_with_a_reason() -> None:
    g = vm.benchmarks.get("lora", small=True)

    def refuse_fused(a, b):  # type: ignore[no-untyped-def]
        if any(n.op == "custom" for n in b.nodes):
            return Refuted("planted refusal")
        return Proved("ok")

    res = superoptimize(g, verifier=refuse_fused, top_k=1, progress=False)
    assert res.best is not None and res.best.rules == ("partition.unfused",)
    assert any("planted refusal" in why for _, why in res.report.rejected)


def test_options_are_honoured() -> None:
    g = vm.benchmarks.get("gqa", small=True)
    res = superoptimize(g, verifier=numeric_checker, disable_rules=["defer-normalisation"], progress=False)
    assert "defer-normalisation" not in res.report.rules_used
    assert all(c.num_kernels >= 1 for c in res.candidates)
    res2 = superoptimize(g, verifier=numeric_checker, franges=(1,), max_splits=1, progress=False)
    for c in res2.candidates:
        for n in c.mugraph.nodes:
            if n.op == "custom":
                assert n.attr("block").frange == 1
    with pytest.raises(RuleError):
        superoptimize(g, verifier=numeric_checker, disable_rules=["no-such-rule"], progress=False)
    with pytest.raises(vm.GraphError):
        superoptimize(vm.benchmarks.expert("gqa", vm.benchmarks.get("gqa")), progress=False)


# --------------------------------------------------------------------------- user rules, ablation


X, Y = PVar("x"), PVar("y")


def _bad_rule(trusted: bool) -> Rule:
    # exp(x) * exp(y) -> exp(x * y) is false
    return Rule("bad-exp-mul", pat.mul(pat.exp(X), pat.exp(Y)), pat.exp(pat.mul(X, Y)), "not a law", "user",
                instances=(Instance.of({"x": (2, 3), "y": (2, 3)}),), trusted=trusted)


def test_user_rule_validation() -> None:
    with pytest.raises(RuleError, match="not in lhs"):
        Rule("r", pat.exp(X), pat.mul(X, Y), "x", instances=(Instance.of({"x": (2,)}),))
    with pytest.raises(RuleError, match="Instance"):
        Rule("r", pat.exp(X), pat.exp(X), "x")
    r = _bad_rule(False)
    lhs, rhs = r.instance_graphs()[0]
    assert not _same(lhs, rhs)


@pytest.mark.skipif(not HAVE_VERIFY, reason="needs verimirage.smt.verify (verification workstream)")
def test_unprovable_user_rule_is_refused_unless_trusted() -> None:
    g = vm.Graph()
    x = g.input("x", (4, 16), vm.float32)
    y = g.input("y", (4, 16), vm.float32)
    g.output(g.mul(g.exp(x), g.exp(y)))
    with pytest.raises(RuleError, match="refused"):
        superoptimize(g, extra_rules=[_bad_rule(False)], verifier=numeric_checker, progress=False)
    res = superoptimize(g, extra_rules=[_bad_rule(True)], progress=False)
    assert "bad-exp-mul" in res.report.trusted_rules
    # the wrong rewrite never survives verification; candidates from rewritten terms name the trusted rule
    for c in res.candidates:
        assert _same(g, c.mugraph)
        if c.graph is not None and str(c.graph) != str(g):
            assert "bad-exp-mul" in c.rules
        if "bad-exp-mul" in c.rules and c.certificate is not None:
            assert "bad-exp-mul" in c.certificate.trusted_rules


def test_ablation_reports_what_a_rule_contributed() -> None:
    g = vm.benchmarks.get("gqa", batch=1)
    ab = ablate(g, rules=["defer-normalisation"], verifier=numeric_checker_full, top_k=1, progress=False)
    (row,) = ab.table()
    name, t_without, _k_without, t_with, _k_with = row
    assert name == "defer-normalisation"
    assert t_with < t_without
    assert "defer-normalisation" in str(ab)


# --------------------------------------------------------------------------- exact rule attribution


def _saturated(name: str):  # type: ignore[no-untyped-def]
    g = vm.benchmarks.get(name, batch=1)
    rules = select_rules(None, [], [])
    stats, _ = saturate(lift(g), rules, iter_limit=6, node_limit=4000, time_budget_s=30)
    return g, rules, stats


def _rule(rules, name):  # type: ignore[no-untyped-def]
    return next(r for r in rules if r.name == name)


def test_attribution_names_a_rule_whose_pattern_left_no_trace() -> None:
    # the e-graph stabilises softmax (softmax-stabilise), then defers the normalisation: the stabilised
    # softmax exp(a - max a) / sum exp(a - max a), the rule's right-hand side, no longer occurs in the term
    g, rules, stats = _saturated("gqa")
    (o,) = graph_terms(g)
    a = o.args[0].args[0].args[0]  # matmul(Q, K)
    es = Term("exp", (), (Term("sub", (), (a, Term("max", (("axis", 2),), (a,)))),))
    target = Term("div", (), (Term("matmul", (), (es, o.args[1])), Term("sum", (("axis", 2),), (es,))))
    (att,) = attribute(g, rules, stats.fired, [(target,)], iterations=stats.iterations, node_limit=4000)
    assert att.exact and att.rules == ("defer-normalisation", "softmax-stabilise")
    # the former heuristic (a rule's right-hand side shows in the term but not in the input) missed it
    assert not occurs(_rule(rules, "softmax-stabilise").rhs, target)


def test_attribution_does_not_name_a_rule_whose_pattern_merely_matches() -> None:
    # (x W) * rsqrt(mean(x^2) + eps): rms-norm-expand, then matmul-rowscale. Its mul matches mul-comm's
    # right-hand side and the input has no mul, so the former heuristic named mul-comm too
    g, rules, stats = _saturated("rmsnorm_linear")
    (o,) = graph_terms(g)
    x, w = o.args[0].args[0], o.args[1]
    inv = Term("rsqrt", (), (Term("shift", (("c", 1e-06),), (Term("mean", (("axis", 1),),
                                                                       (Term("square", (), (x,)),)),)),))
    target = Term("mul", (), (Term("matmul", (), (x, w)), inv))
    (att,) = attribute(g, rules, stats.fired, [(target,)], iterations=stats.iterations, node_limit=4000)
    assert att.exact and att.rules == ("rms-norm-expand", "matmul-rowscale")
    assert occurs(_rule(rules, "mul-comm").rhs, target)  # what made the heuristic name it
    # the input itself, and a term no rule reaches
    assert attribute(g, rules, stats.fired, [(o,)], iterations=6, node_limit=4000)[0] == Attribution((), True)
    bogus = Term("matmul", (), (Term("exp", (), (x,)), w))
    assert attribute(g, rules, stats.fired, [(bogus,)], iterations=6, node_limit=4000)[0].exact is False


@pytest.mark.parametrize("name", [pytest.param("gqa", marks=pytest.mark.slow), "rmsnorm_linear", "ntrans"])
def test_candidates_name_the_rules_of_a_derivation(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=4, progress=False, cache=False)
    assert res.candidates and "attribute" in res.report.phase_seconds
    rules = {r.name: r for r in select_rules(None, [], [])}
    for c in res.candidates:
        named = [rules[r] for r in c.rules if r in rules]
        terms = tuple(graph_terms(c.graph))
        # the named rules alone derive the candidate's term, and each of them is needed
        (att,) = attribute(g, named, {r.name: 1 for r in named}, [terms], iterations=6, node_limit=4000)
        assert att.exact and list(att.rules) == [r.name for r in named], (c.rules, att)
        for r in named:
            rest = [x for x in named if x is not r]
            (a2,) = attribute(g, rest, {x.name: 1 for x in rest}, [terms], iterations=6, node_limit=4000)
            assert not a2.exact, f"{r.name} is named but not needed"


def test_the_stabilised_deferred_candidate_names_softmax_stabilise() -> None:
    g = vm.benchmarks.get("gqa", batch=1)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=4, progress=False, cache=False)
    stable = [c for c in res.candidates if any(n.op == "max" for n in c.graph.nodes)]
    assert stable, str(res.report)
    for c in stable:
        assert "softmax-stabilise" in c.rules and "defer-normalisation" in c.rules, c.rules


@pytest.mark.parametrize("name", [pytest.param("gqa", marks=pytest.mark.slow), "rmsnorm_linear"])
def test_ablation_agrees_with_attribution(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1)
    ab = ablate(g, verifier=numeric_checker_full, top_k=1, progress=False, cache=False)
    rows = ab.contributions()
    assert {r for r, _, _ in rows} == set(ab.baseline.report.rules_fired)
    assert any(named for _, named, _ in rows)
    for rule, named, changed in rows:
        assert named == changed, f"{rule}: named by the best candidate {named}, ablation changes the best {changed}"
    assert "*" in str(ab)


# --------------------------------------------------------------------------- extraction filters, verifier use


def test_extraction_drops_commuted_and_inconsistent_terms() -> None:
    g = vm.benchmarks.get("qknorm_gqa", batch=1)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=2, progress=False, cache=False)
    pruned = res.report.pruned
    assert pruned.get("extracted term: one value computed two ways", 0) > 0
    g2 = vm.benchmarks.get("ntrans", batch=1)
    res2 = superoptimize(g2, verifier=numeric_checker_full, top_k=2, progress=False, cache=False)
    assert res2.report.pruned.get("extracted term: a commuted duplicate", 0) > 0
    for r in (res, res2):
        assert r.best is not None


def test_commutation_key() -> None:
    x, y = Term("input", (("name", "x"),), ()), Term("input", (("name", "y"),), ())
    assert commutation_key(Term("mul", (), (x, y))) == commutation_key(Term("mul", (), (y, x)))
    assert commutation_key(Term("sub", (), (x, y))) != commutation_key(Term("sub", (), (y, x)))


@pytest.mark.skipif(not HAVE_VERIFY, reason="needs verimirage.smt.verify (verification workstream)")
def test_one_verifier_serves_every_candidate(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from verimirage.smt import verify as V

    made: list[int] = []
    checked: list[int] = []
    init, check = V.Verifier.__init__, V.Verifier.check

    def counting_init(self, *a, **k):  # type: ignore[no-untyped-def]
        made.append(1)
        init(self, *a, **k)

    def counting_check(self, *a, **k):  # type: ignore[no-untyped-def]
        checked.append(1)
        return check(self, *a, **k)

    monkeypatch.setattr(V.Verifier, "__init__", counting_init)
    monkeypatch.setattr(V.Verifier, "check", counting_check)
    g = vm.Graph()  # shapes no other test uses, so no Verifier of it is cached yet
    x = g.input("x", (24, 48), vm.float32)
    w = g.input("w", (48, 40), vm.float32)
    g.output(g.matmul(g.rms_norm(x, axis=1), w))
    res = superoptimize(g, top_k=3, progress=False, cache=False)
    assert len(res.candidates) >= 2
    assert len(made) == 1 and len(checked) == len(res.candidates) + len(res.report.rejected)


def test_verification_budget_is_deterministic_and_honoured() -> None:
    g = vm.benchmarks.get("gqa", batch=1, small=True)
    full = superoptimize(g, verifier=numeric_checker, top_k=3, progress=False, cache=False)
    assert len(full.candidates) == 3
    cut = superoptimize(g, verifier=numeric_checker, top_k=3, verify_budget_s=0.0, progress=False, cache=False)
    assert len(cut.candidates) == 1 and "verification budget" in cut.report.stop_reason
    assert str(cut.best.mugraph) == str(full.best.mugraph)
    big, small = vm.benchmarks.get("mha", batch=8), vm.benchmarks.get("mha", batch=1)
    mb, ms = vm.benchmarks.expert("mha", big), vm.benchmarks.expert("mha", small)
    assert verify_estimate_s(big, mb) > 4 * verify_estimate_s(small, ms) > 0


def test_verification_estimate_ran_short_on_huge_reductions_and_the_search_overran_its_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # cross_entropy_prefill (2048 x 32000): verify_estimate_s put each candidate at a fraction of the ~30 s it took,
    # so the default search verified 4 candidates in 118 s against its 60 s budget (2-core CPU, 2026-11-27). Later
    # estimates are now scaled by measured / estimated seconds of the verifications so far
    import verimirage.pipeline.superopt as so
    from verimirage.clock import cpu_seconds

    monkeypatch.setattr(so, "verify_estimate_s", lambda graph, mugraph, c=None: 1e-4)

    starts: list[float] = []

    def slow_checker(a: vm.Graph, b: vm.Graph) -> Any:
        # 0.5 CPU-s a verification (the check's own time included): the budgets are CPU seconds (a sleep costs
        # none), so this holds whatever the machine's load (a flat 0.4 s wall sleep failed at load ~9)
        t = cpu_seconds()
        starts.append(t)
        v = numeric_checker(a, b)
        while cpu_seconds() - t < 0.5:
            pass
        return v

    g = vm.benchmarks.get("gqa", batch=1, small=True)
    res = superoptimize(g, verifier=slow_checker, top_k=4, verify_budget_s=0.9, progress=False, cache=False)
    # the second candidate's scaled estimate (the first's measured 0.5 s, up to ~0.9 s with the search's own time
    # around it under load) fits the 0.9 s after the first, a third does not (1.0 s or more); unscaled (1e-4 s
    # each) all four were verified
    assert len(res.candidates) == 2 and "verification budget" in res.report.stop_reason
    starts.clear()
    t0 = cpu_seconds()
    timed = superoptimize(g, verifier=slow_checker, top_k=4, time_budget_s=1.0, progress=False, cache=False)
    # no candidate after the first started once the 1 s budget was spent (the scaling itself: the first part)
    assert len(timed.candidates) >= 1 and all(s - t0 < 1.0 for s in starts[1:]), [s - t0 for s in starts]
    assert len(timed.candidates) == 4 or "time budget" in timed.report.stop_reason


def test_a_busy_machine_cut_the_search_short() -> None:
    # the time budget was wall-clock: on the 2-core box shared by 7-8 sessions the same program verified 1-3
    # candidates where an idle machine verified more (heldout20's niced run of the fifth set). A verification that
    # waits (here a sleep: wall time without CPU, as a process waiting for a core) no longer spends the budget
    import time as time_mod

    def waiting_checker(a: vm.Graph, b: vm.Graph) -> Any:
        time_mod.sleep(0.6)
        return numeric_checker(a, b)

    g = vm.benchmarks.get("gqa", batch=1, small=True)
    kw: dict[str, Any] = dict(top_k=4, time_budget_s=1.0, verify_budget_s=100.0, progress=False, cache=False)
    idle = superoptimize(g, verifier=numeric_checker, **kw)
    busy = superoptimize(g, verifier=waiting_checker, **kw)
    assert len(idle.candidates) == 4, str(idle.report)
    assert [str(c.mugraph) for c in busy.candidates] == [str(c.mugraph) for c in idle.candidates], str(busy.report)
    assert busy.report.phase_seconds["verify"] > 4 * 0.6 > busy.report.phase_cpu_seconds["verify"]


# --------------------------------------------------------------------------- with the real verifier


@pytest.mark.skipif(not HAVE_VERIFY, reason="needs verimirage.smt.verify (verification workstream)")
@pytest.mark.parametrize("name", NAMES)
def test_superoptimize_verified_small(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = vm.benchmarks.get(name, batch=1, small=True)
    res = vm.superoptimize(g, top_k=2, progress=False)
    assert res.best is not None, str(res.report)
    limit = 2 if name in ATTENTION else 1
    assert res.best.num_kernels <= limit, str(res.report)
    for k, c in enumerate(res.candidates):
        assert isinstance(c.verdict, vm.Proved)
        assert _same(g, c.mugraph, seed=3)
        assert c.certificate is not None, str(res.report)
        path = tmp_path / f"{name}_{k}.json"
        c.certificate.save(path)
        v = vm.check_certificate(path)
        assert isinstance(v, vm.Proved), v.summary()


# --------------------------------------------------------------------------- loop-range variants


def test_variants_add_verified_siblings_of_the_kept_structures() -> None:
    from verimirage.pipeline.superopt import _structure

    g = vm.benchmarks.get("rmsnorm_linear", batch=1)
    base = superoptimize(g, verifier=numeric_checker_full, top_k=2, progress=False, cache=False)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=2, variants=2, progress=False, cache=False)
    head = [str(c.mugraph) for c in res.candidates[:2]]
    assert head == [str(c.mugraph) for c in base.candidates]  # the distinct structures are unchanged
    extra = res.candidates[2:]
    assert extra, str(res.report)
    structs = [_structure(c.mugraph) for c in res.candidates[:2]]
    assert len(set(structs)) == 2
    seen = {str(c.mugraph) for c in res.candidates}
    assert len(seen) == len(res.candidates)  # no candidate twice
    for s in structs:
        assert sum(_structure(c.mugraph) == s for c in extra) <= 2
    for c in extra:
        assert _structure(c.mugraph) in structs
        assert _same(g, c.mugraph)
    # siblings of the best structure come first
    assert _structure(extra[0].mugraph) == structs[0]
    assert any("variants:" in n for n in res.report.notes)
    with pytest.raises(ValueError, match="variants"):
        superoptimize(g, variants=-1)


def test_a_sibling_offers_another_loop_range_the_pipeliner_can_fill() -> None:
    # lora_bs8 on the H100 (benchmarks/perf/results/run9_lora_probe.json): the one-shot 256-deep tile the model
    # ranks first ran 3.37 us, the same tile walked in 4 steps of 64 with 3 stages 3.12 us. The pool lists the
    # concat-fusion block graph (same loop range) first; the sibling slot must go to a loop of >= 4 steps.
    from verimirage.pipeline.superopt import _loop_ranges, _structure

    g = vm.benchmarks.get("lora", batch=8)
    res = superoptimize(g, verifier=numeric_checker_full, top_k=2, variants=1, progress=False, cache=False)
    head, extra = res.candidates[:2], res.candidates[2:]
    assert len(extra) == 2, str(res.report)
    for sib, kept in zip(extra, head, strict=True):
        assert _structure(sib.mugraph) == _structure(kept.mugraph)
        assert _loop_ranges(sib.mugraph) != _loop_ranges(kept.mugraph)
        assert all(r == 1 or r >= 4 for r in _loop_ranges(sib.mugraph)), _loop_ranges(sib.mugraph)
        assert _same(g, sib.mugraph)


def test_cost_model_shared_memory_and_contiguous_walks_match_the_h100() -> None:
    # mha b8 designs measured on the H100 (benchmarks/perf/NOTES.md, session 3): Triton keeps stages - 1 copies of
    # loop-walked tiles, so 2 heads x 128-key tiles fit (it ran: 91.4 us, the fastest) and 2 x 256 do not (the GPU
    # asked 266,240 B); K is stored (d, kv), so 64-key tiles walk it in 128-byte runs and ran slower (94.8 us)
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/perf/cands/mha_tiles_bs8.json").read_text())
    est = {(c["heads_per_block"], c["kv_tile"]): pricing.cost(vm.MuGraph.parse(c["mugraph"])) for c in doc["mha_bs8"]}
    assert not est[(2, 128)].infeasible and est[(2, 128)].smem_max < 200 * 1024
    assert est[(2, 256)].infeasible
    assert est[(2, 128)].time_s < est[(2, 64)].time_s
    assert est[(1, 128)].time_s < est[(1, 64)].time_s
    best = min((c for c in est.values() if not c.infeasible), key=lambda c: c.time_s)
    assert best.time_s == est[(2, 128)].time_s
    # the walk charge is for device-memory streams only: the measured batch-1 split-KV winners walk L2-resident
    # partial sums in 2-128-byte runs, and charging those pushed them out of the search's top 12 (14.4 -> 22.4 us)
    rows = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/latest.json").read_text())["rows"]
    no_walk = cost_mod.Hardware(walk_exponent=0.0)
    for r in rows:
        if r["case"] in ("qknorm_gqa_bs1", "gqa_stable_bs1"):
            w = vm.MuGraph.parse(r["verimirage_mugraph"])
            assert pricing.cost(w).time_s == pricing.cost(w, no_walk).time_s, r["case"]
    assert pricing.cost(vm.MuGraph.parse(doc["mha_bs8"][3]["mugraph"])).time_s > pricing.cost(
        vm.MuGraph.parse(doc["mha_bs8"][3]["mugraph"]), no_walk).time_s  # K (134 MB) is a device-memory stream
