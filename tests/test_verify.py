"""vm.verify, the finite-field domain and the abstract check."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.designs import expert
from verimirage.ir.opfacts import missing_domains
from verimirage.ir.ops import OPS, Prop
from verimirage.smt import ff as FF
from verimirage.smt.ff import products as FFprod
from verimirage.smt.verify import abstract_check, verify_rule

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES


def _pair(shapes: dict, f, g):
    out = []
    for body in (f, g):
        h = vm.Graph()
        ins = [h.input(n, s, vm.float16) for n, s in shapes.items()]
        r = body(h, *ins)
        h.output(*(r if isinstance(r, tuple) else (r,)))
        out.append(h)
    return out


def test_every_op_has_ff_and_abstract() -> None:
    gaps = [(o, d) for o, d in missing_domains() if d in ("ff", "abstract")]
    assert gaps == []
    from verimirage.ir.interpret import COMPOSITES  # (their abstract meaning: their composition's)

    for n, o in OPS.items():
        if not o.has(Prop.STRUCTURAL) and not o.has(Prop.LOOP):
            assert "ff" in o.domains and ("abstract" in o.domains or n in COMPOSITES), n


def test_verify_rejects_mismatched_inputs() -> None:
    a, _ = _pair({"X": (4, 4)}, lambda g, x: g.exp(x), lambda g, x: x)
    b, _ = _pair({"Y": (4, 4)}, lambda g, x: g.exp(x), lambda g, x: x)
    with pytest.raises(vm.GraphError, match="inputs differ"):
        vm.verify(a, b)
    c, _ = _pair({"X": (4, 8)}, lambda g, x: g.exp(x), lambda g, x: x)
    with pytest.raises(vm.GraphError, match="inputs differ"):
        vm.verify(a, c)
    d, _ = _pair({"X": (4, 4)}, lambda g, x: g.sum(x, 0), lambda g, x: x)
    with pytest.raises(vm.GraphError, match="output shapes"):
        vm.verify(a, d)
    with pytest.raises(vm.GraphError, match=r"expected a vm\.Graph"):
        vm.verify(a, "not a graph")  # type: ignore[arg-type]


def test_refuted_carries_counterexample() -> None:
    a, b = _pair({"X": (4, 8), "W": (8, 4)}, lambda g, x, w: g.matmul(x, w),
                 lambda g, x, w: g.scale(g.matmul(x, w), 1.001))
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted) and not v.proved
    cex = v.counterexample
    assert set(cex["ff_inputs"]) == {"X", "W"} and cex["ff_inputs"]["X"].shape == (2, 4, 8)
    assert cex["float_differences"] and cex["float_differences"][0]["output"] == 0
    d = cex["float_differences"][0]
    assert d["a"] != d["b"]


def test_several_outputs_and_verdict_is_frozen() -> None:
    a, b = _pair({"A": (4, 4), "B": (4, 4)}, lambda g, x, y: (g.add(x, y), g.sub(x, y)),
                 lambda g, x, y: (g.add(y, x), g.add(x, g.neg(y))))
    v = vm.verify(a, b)
    assert isinstance(v, vm.Proved)
    with pytest.raises(AttributeError):
        v.reason = "x"  # type: ignore[misc]
    a2, b2 = _pair({"A": (4, 4), "B": (4, 4)}, lambda g, x, y: (g.add(x, y), g.sub(x, y)),
                   lambda g, x, y: (g.add(y, x), g.sub(y, x)))
    r = vm.verify(a2, b2)
    assert isinstance(r, vm.Refuted) and r.counterexample["output"] == 1


def test_verify_rule_hook() -> None:
    good = [_pair({"A": (4, 4), "B": (4, 4), "C": (4, 4)}, lambda g, a, b, c: g.mul(g.add(a, b), c),
                  lambda g, a, b, c: g.add(g.mul(a, c), g.mul(b, c)))]
    assert isinstance(verify_rule("distribute", good), vm.Proved)
    bad = [_pair({"A": (4, 4), "B": (4, 4)}, lambda g, a, b: g.div(a, b), lambda g, a, b: g.div(b, a))]
    v = verify_rule("div-comm", bad)
    assert isinstance(v, vm.Refuted) and "div-comm" in v.reason
    assert isinstance(verify_rule("empty", []), vm.Unknown)


@pytest.mark.parametrize("name", vm.benchmarks.names())
@pytest.mark.parametrize("batch", [1, 8])
def test_full_size_designs_prove_abstractly(name: str, batch: int) -> None:
    g = vm.benchmarks.get(name, batch=batch)
    r = abstract_check(g, expert(name, g))
    assert r.outcome == "proved", r.reason
    assert r.seconds < 10


def test_full_size_ff_lora() -> None:
    g = vm.benchmarks.get("lora", batch=1)
    r = FF.ff_test(g, expert("lora", g))
    assert r.outcome == "proved" and r.bound <= 2.0**-60


@pytest.mark.parametrize("case", [c for c in CASES if c.expect != "proved"], ids=lambda c: c.name)
def test_abstract_check_alone_never_proves_wrong_pairs(case) -> None:
    if case.expect == "unknown":
        return
    assert abstract_check(case.a(), case.b()).outcome != "proved"


# --------------------------------------------------------------------------- the finite-field domain


def _field() -> FF.Field:
    return FF.Field.from_seed(12345)


def test_field_parameters() -> None:
    f = _field()
    assert (f.p - 1) % f.q == 0 and pow(f.g, f.q, f.p) == 1 and f.g != 1
    t = f.exp_table()
    assert t[0] == 1 and t[1] == f.g and t[5] == pow(f.g, 5, f.p)


def _run1(shapes: dict, body, vals: dict, f: FF.Field) -> list[np.ndarray]:
    h = vm.Graph()
    ins = [h.input(n, s, vm.float16) for n, s in shapes.items()]
    r = body(h, *ins)
    h.output(*(r if isinstance(r, tuple) else (r,)))
    return FF.run_ff(h, vals, f)


def test_ff_exp_homomorphism_and_q_violation() -> None:
    f = _field()
    rng = np.random.default_rng(0)
    a = np.stack([rng.integers(0, f.p, (3, 3)), rng.integers(0, f.q, (3, 3))])
    b = np.stack([rng.integers(0, f.p, (3, 3)), rng.integers(0, f.q, (3, 3))])
    sh = {"A": (3, 3), "B": (3, 3)}
    (x,) = _run1(sh, lambda g, a, b: g.exp(g.add(a, b)), {"A": a, "B": b}, f)
    (y,) = _run1(sh, lambda g, a, b: g.mul(g.exp(a), g.exp(b)), {"A": a, "B": b}, f)
    assert np.array_equal(x[0], y[0]) and (x[1] == -1).all()
    assert f.q_violations == 0
    _run1(sh, lambda g, a, b: g.exp(g.exp(a)), {"A": a, "B": b}, f)
    assert f.q_violations > 0


def test_ff_max_total_order_and_division_by_zero() -> None:
    f = _field()
    rng = np.random.default_rng(1)
    x = np.stack([rng.integers(0, 50, (4, 16)), rng.integers(0, f.q, (4, 16))])  # many p-ties
    sh = {"X": (4, 16)}
    (flat,) = _run1(sh, lambda g, x: g.max(x, 1), {"X": x}, f)
    (m1,) = _run1({"X": (4, 16)}, lambda g, x: g.max(g.transpose(x, 0, 1), 0), {"X": x}, f)
    assert np.array_equal(flat.reshape(2, 4), m1.reshape(2, 4))
    z = np.zeros((2, 4, 16), dtype=np.int64)
    (d,) = _run1({"X": (4, 16), "Y": (4, 16)}, lambda g, x, y: g.div(x, y), {"X": x, "Y": z}, f)
    assert (d[0] == 0).all()  # documented: the inverse of 0 is 0


def test_ff_matmul_exact() -> None:
    f = _field()
    rng = np.random.default_rng(2)
    k = 9000  # more than one chunk
    a = rng.integers(0, f.p, (2, k))
    b = rng.integers(0, f.p, (k, 2))
    got = FFprod._modmatmul(a, b, f.p)
    want = [[sum(int(a[i, t]) * int(b[t, j]) for t in range(k)) % f.p for j in range(2)] for i in range(2)]
    assert got.tolist() == want


def test_ff_rsqrt_is_inverse_sqrt_and_constants_exact() -> None:
    f = _field()
    rng = np.random.default_rng(3)
    x = np.stack([rng.integers(1, f.p, (4, 4)), rng.integers(1, f.q, (4, 4))])
    (r,) = _run1({"X": (4, 4)}, lambda g, x: g.mul(g.rsqrt(x), g.sqrt(x)), {"X": x}, f)
    assert (r[0] == 1).all()
    (m,) = _run1({"X": (4, 3)}, lambda g, x: g.mean(x, 1), {"X": x[:, :, :3]}, f)
    (s,) = _run1({"X": (4, 3)}, lambda g, x: g.scale(g.sum(x, 1), 1.0 / 3), {"X": x[:, :, :3]}, f)
    assert np.array_equal(m, s)


# --------------------------------------------------------------------------- speed-ups keep the verdicts


def test_verifier_reuses_the_target_and_agrees_with_verify() -> None:
    from verimirage.smt.verify import Verifier

    names = {"lora-concat-fusion", "softmax-shift-invariance", "split-k-wrong-accumulator", "second-output-wrong"}
    pairs = [c for c in CASES if c.name in names]
    assert len(pairs) == 4
    for c in pairs:
        a, b = c.a(), c.b()
        v = Verifier(a)
        first = v.check(b)
        cached = dict(v.reference._outs)
        assert len(cached) >= 1
        again = v.check(b)
        # the target was not evaluated again for the trials it already ran (a trial that was running
        # beside a refuting one in another thread may or may not have been started the first time)
        assert all(v.reference._outs[s] is r for s, r in cached.items())
        assert type(first) is type(again) is type(vm.verify(a, b))
        assert type(v.check(a)) is vm.Proved


def test_verify_cache_follows_graph_changes() -> None:
    a, b = _pair({"X": (4, 4)}, lambda g, x: g.scale(x, 2.0), lambda g, x: g.add(x, x))
    assert isinstance(vm.verify(a, b), vm.Proved)
    c, d = _pair({"X": (4, 4)}, lambda g, x: g.scale(x, 3.0), lambda g, x: g.add(x, x))
    assert isinstance(vm.verify(c, d), vm.Refuted)
    assert isinstance(vm.verify(a, b), vm.Proved)


def test_p_only_mode_without_exp_and_full_form_with_exp() -> None:
    g = vm.benchmarks.get("rmsnorm_linear", batch=1, small=True)
    r = FF.ff_test(g, expert("rmsnorm_linear", g))
    assert r.outcome == "proved" and "p-only" in r.reason
    # silu is x sigmoid(x) through exp: the gated MLP needs q-parts
    m = vm.benchmarks.get("gated_mlp", batch=1, small=True)
    r = FF.ff_test(m, expert("gated_mlp", m, cols=32, k_tile=16))
    assert r.outcome == "proved" and "p-only" not in r.reason and FF.uses_exp(m)
    h = vm.benchmarks.get("gqa", batch=1, small=True)
    r2 = FF.ff_test(h, expert("gqa", h, rows=16, kv_tile=32, splits=2))
    assert r2.outcome == "proved" and "p-only" not in r2.reason
    assert not FF.uses_exp(g) and FF.uses_exp(h)


def test_p_parts_do_not_depend_on_the_mode() -> None:
    g = vm.benchmarks.get("lora", batch=1, small=True)
    f = _field()
    full = FF.trial_inputs(g, f, 7)
    ponly = FF.trial_inputs(g, f, 7, q_part=False)
    for k in full:
        assert full[k].shape[0] == 2 and ponly[k].shape[0] == 1
        assert np.array_equal(full[k][0], ponly[k][0])
        assert (full[k][1] < f.q).all() and (full[k][0] < f.p).all() and (full[k] >= 0).all()


def test_mixed_q_forms_in_concat_and_maximum() -> None:
    f = _field()
    rng = np.random.default_rng(4)
    a = np.stack([rng.integers(0, f.p, (3, 4)), rng.integers(0, f.q, (3, 4))])
    b = np.stack([rng.integers(0, f.p, (3, 4)), rng.integers(0, f.q, (3, 4))])
    sh = {"A": (3, 4), "B": (3, 4)}
    (c,) = _run1(sh, lambda g, x, y: g.concat([g.exp(x), y], 1), {"A": a, "B": b}, f)
    assert c.shape == (2, 3, 8)
    assert (c[1][:, :4] == -1).all() and np.array_equal(c[1][:, 4:], b[1])
    assert np.array_equal(c[0][:, :4], f.exp_table()[a[1]])
    (m,) = _run1(sh, lambda g, x, y: g.maximum(g.exp(x), y), {"A": a, "B": b}, f)
    e = f.exp_table()[a[1]]
    take_e = e > b[0]  # ties go to the value with a meaningful q-part
    assert np.array_equal(m[0], np.where(take_e, e, b[0]))
    assert np.array_equal(m[1], np.where(take_e, -1, b[1]))
    # matmul with some meaningless q rows: those rows' q-parts are meaningless, the others exact
    a2 = a.copy()
    a2[1, 0, 1] = -1
    (mm,) = _run1({"A": (3, 4), "B": (4, 3)}, lambda g, x, y: g.matmul(x, y), {"A": a2, "B": b.reshape(2, 4, 3)}, f)
    assert (mm[1, 0] == -1).all()
    want = (a2[1, 1:].astype(object) @ b.reshape(2, 4, 3)[1].astype(object)) % f.q
    assert mm[1, 1:].tolist() == want.tolist()


@pytest.mark.parametrize("name", ["gqa", "mqa", "qknorm_gqa", "gqa_stable", "rmsnorm_linear", "gated_mlp", "ntrans"])
def test_full_size_ff_batch1(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1)
    r = FF.ff_test(g, expert(name, g))
    assert r.outcome == "proved" and r.bound <= 2.0**-60, r.reason


# --------------------------------------------------------------------------- nested sums (Fubini)

_ABCD = {"A": (3, 4), "B": (4, 5), "C": (5, 2), "D": (2, 3)}


@pytest.mark.parametrize("assoc", [
    lambda g, a, b, c, d: g.matmul(a, g.matmul(b, g.matmul(c, d))),
    lambda g, a, b, c, d: g.matmul(g.matmul(a, b), g.matmul(c, d)),
    lambda g, a, b, c, d: g.matmul(g.matmul(a, g.matmul(b, c)), d),
    lambda g, a, b, c, d: g.matmul(a, g.matmul(g.matmul(b, c), d)),
])
def test_matmul_chains_prove_in_any_association(assoc) -> None:
    left, other = _pair(_ABCD, lambda g, a, b, c, d: g.matmul(g.matmul(g.matmul(a, b), c), d), assoc)
    r = abstract_check(left, other)
    assert r.outcome == "proved", r.reason
    assert {"sum-interchange", "sum-factor-out"} <= set(r.laws)
    assert any(q.name.endswith(":fubini") for q in r.queries)
    assert isinstance(vm.verify(left, other), vm.Proved)


def test_sum_of_products_interchanged_and_factors_pushed_in() -> None:
    # sum_j (A @ B)[i, j] * w[j]  vs  sum_k A[i, k] * (B @ w)[k]
    sh = {"A": (3, 4), "B": (4, 5), "W": (5, 1)}
    a, b = _pair(sh, lambda g, x, y, w: g.matmul(g.matmul(x, y), w), lambda g, x, y, w: g.matmul(x, g.matmul(y, w)))
    assert abstract_check(a, b).outcome == "proved"
    c, d = _pair({"A": (3, 4), "B": (4, 5)}, lambda g, x, y: g.sum(g.matmul(x, y), 1),
                 lambda g, x, y: g.matmul(x, g.sum(y, 1)))
    assert abstract_check(c, d).outcome == "proved"


def test_fubini_never_equates_different_sums() -> None:
    # A B C vs A B^T-ish mistakes: the interchange must not make them equal
    sh = {"A": (4, 4), "B": (4, 4), "C": (4, 4)}
    wrong = [
        lambda g, a, b, c: g.matmul(a, g.matmul(c, b)),
        lambda g, a, b, c: g.matmul(g.matmul(a, g.transpose(b, 0, 1)), c),
        lambda g, a, b, c: g.matmul(g.matmul(b, a), c),
        lambda g, a, b, c: g.mul(g.matmul(a, b), g.matmul(b, c)),
        lambda g, a, b, c: g.matmul(g.matmul(a, b), g.transpose(c, 0, 1)),
    ]
    for w in wrong:
        x, y = _pair(sh, lambda g, a, b, c: g.matmul(g.matmul(a, b), c), w)
        assert abstract_check(x, y).outcome != "proved"
        assert isinstance(vm.verify(x, y), vm.Refuted)
    # sums whose ranges differ are not swapped into equality either
    s1, s2 = _pair({"X": (4, 6)}, lambda g, x: g.sum(g.sum(x, 0), 1), lambda g, x: g.scale(g.sum(g.sum(x, 1), 0), 2.0))
    assert abstract_check(s1, s2).outcome != "proved"


def test_canon_sums_is_stable_and_capture_free() -> None:
    from verimirage.smt import expr as E

    # sibling sums inside an exp inside a sum: flattening them raises their levels; the outer binder must
    # be renamed above them (no capture)
    sh = {"X": (3, 4), "Y": (4, 5)}
    a, b = _pair(sh, lambda g, x, y: g.sum(g.exp(g.matmul(g.matmul(x, y), g.transpose(y, 0, 1))), 1),
                 lambda g, x, y: g.sum(g.exp(g.matmul(x, g.matmul(y, g.transpose(y, 0, 1)))), 1))
    r = abstract_check(a, b)
    assert r.outcome == "proved", r.reason
    from verimirage.smt import abstract as A

    _, ((ea, _, _),) = A.derive_all([a])
    once, _ = E.canon_sums(ea[0][0])
    twice, _ = E.canon_sums(once)
    assert once == twice


def test_one_outcome_vocabulary_across_the_verifier() -> None:
    from verimirage.smt import ffref as R
    from verimirage.smt.verdict import Check, Outcome

    g = vm.benchmarks.get("lora", batch=1, small=True)
    v = vm.verify(g, g)
    assert v.outcome is Outcome.PROVED and all(isinstance(c.outcome, Outcome) for c in v.evidence)
    assert FF.ff_test(g, g, trials=2).outcome is Outcome.PROVED
    assert R.ref_test(g, g, (1, 2)).outcome is Outcome.PROVED
    assert vm.Unknown("x").outcome is Outcome.UNKNOWN and vm.Refuted("x").outcome is Outcome.REFUTED
    assert Check("c", "proved").outcome is Outcome.PROVED and Outcome.PROVED == "proved"
    with pytest.raises(ValueError):
        Check("c", "equal")  # the fast engine's old word is not an outcome
