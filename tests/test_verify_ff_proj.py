"""The finite-field test's projected comparison (verimirage/smt/ff/proj.py).

* On every corpus program, the pushed projection equals ``sum(O * U * r) mod p`` of the fully computed
  outputs (the rules are identities, whatever they push through);
* each view's inverse is checked on random arrays (the tile assembly is made of these views);
* projected and element-wise tests agree on every corpus pair: same outcome, and for a refuted pair the
  same output and index (the index is found by computing the outputs once the projections differ);
* certificates record the projection and re-check either way.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.smt import ff as FF
from verimirage.smt.ff import proj as FP
from verimirage.smt.ff import trials as FFtrials

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES


def _contracted(x: np.ndarray, fs: list[np.ndarray], m: int) -> int:
    t = x.astype(object)
    for f in fs:
        t = t * f.astype(object)
    return int(np.sum(t) % m) if t.size else 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_projection_equals_the_contracted_outputs(case) -> None:
    for prog in (case.a(), case.b()):
        _check_program(prog, case.name)


def _check_program(prog: vm.Graph, what: str) -> None:
    fld = FF.Field.from_seed(99)
    full = [FF.ints(o.p) for o in FFtrials._run_lazy(prog, FF.input_values(prog, fld, 5), FF.Field.from_seed(99))]
    outs = FFtrials._run_lazy(prog, FF.input_values(prog, fld, 5), FF.Field.from_seed(99))
    for k, (o, x) in enumerate(zip(outs, full, strict=True)):
        if o.shape:
            fs = FF.projection_factors(o.shape, 7, k, fld.p)
            assert FP.project(o.p, o.shape, fs, fld.p) == _contracted(x, fs, fld.p), (what, k)


def test_projection_on_every_rewrite_rule_instance() -> None:
    # the rules' instances are many small programs over every op (a matmul summed along its last axis, of
    # width 1, transposed operands, ...); the first version failed on one of them (sum-matmul-last)
    from verimirage.rewrite.rules import all_builtin_rules

    n = 0
    for rule in all_builtin_rules():
        for lhs, rhs in rule.instance_graphs():
            _check_program(lhs, rule.name)
            _check_program(rhs, rule.name)
            n += 2
    assert n >= 50


M = 1_000_003


def _rand(shape, rng, compress=()):
    s = [1 if d in compress else n for d, n in enumerate(shape)]
    return rng.integers(0, M, s, dtype=np.int64)


@pytest.mark.parametrize("src,view,spec", [
    ((4, 6, 8), lambda a: a.reshape(4, 48), ("reshape",)),
    ((4, 6, 8), lambda a: a.reshape(24, 2, 4), ("reshape",)),
    ((2, 1, 3, 16), lambda a: a.reshape(2, 3, 4, 4), ("reshape",)),
    ((4, 6, 8), lambda a: a.transpose(1, 0, 2), ("transpose", (1, 0, 2))),
    ((4, 6, 8), lambda a: a.transpose(2, 0, 1), ("transpose", (2, 0, 1))),
    ((4, 8), lambda a: np.expand_dims(a, 1), ("expand_dims", 1)),
    ((4, 8), lambda a: np.expand_dims(a, (0, 2)), ("expand_dims", (0, 2))),
    ((4, 1, 8), lambda a: np.broadcast_to(a, (3, 4, 5, 8)), ("broadcast_to",)),
    ((5, 6, 8), lambda a: a[:, 2], ("getitem", (slice(None), 2))),
    ((5, 6, 8), lambda a: a[-1], ("getitem", -1)),
    ((5, 6, 8), lambda a: a[1:4, ::2], ("getitem", (slice(1, 4), slice(None, None, 2)))),
    ((5, 6, 8), lambda a: a[..., 3:7], ("getitem", (Ellipsis, slice(3, 7)))),
])
@pytest.mark.parametrize("compressed", [(), (0,), "all-but-last"])
def test_view_inverses_are_identities(src, view, spec, compressed) -> None:
    rng = np.random.default_rng(len(src) + len(spec))
    x = rng.integers(0, M, src, dtype=np.int64)
    v = view(x)
    shape = v.shape
    comp = tuple(range(len(shape) - 1)) if compressed == "all-but-last" else compressed
    term = [_rand(shape, rng, comp), _rand(shape, rng, (len(shape) - 1,))]
    back = FP._unview(term, shape, src, spec, M)
    assert back is not None
    assert all(f.ndim == len(src) and all(a in (1, n) for a, n in zip(f.shape, src, strict=True)) for f in back)
    assert _contracted(np.ascontiguousarray(v), term, M) == _contracted(x, back, M)


def test_merged_terms_are_compressed() -> None:
    rng = np.random.default_rng(1)
    u = rng.integers(0, M, (3, 1, 1), dtype=np.int64)
    parts = [np.zeros((1, 4, 5), dtype=np.int64) for _ in range(4)]
    r = rng.integers(0, M, (1, 1, 5), dtype=np.int64)
    for i, p in enumerate(parts):
        p[0, i] = r[0, 0]
    merged = FP._merge([[u.copy(), p] for p in parts], M)
    assert len(merged) == 1
    assert [f.shape for f in merged[0]] == [(3, 1, 1), (1, 1, 5)]  # the one-hot rows summed back to r


def _pairs():
    for c in CASES:
        yield pytest.param(c, id=c.name)


@pytest.mark.parametrize("case", list(_pairs()))
def test_projected_and_elementwise_tests_agree(case) -> None:
    a, b = case.a(), case.b()
    r1 = FF.ff_test(a, b, project=True)
    r0 = FF.ff_test(a, b, project=False)
    assert r1.outcome == r0.outcome, (case.name, r1.reason, r0.reason)
    assert r1.projected and not r0.projected
    if r1.outcome == "refuted":
        assert (r1.output, r1.index, r1.field_trial) == (r0.output, r0.index, r0.field_trial)
    if r1.outcome == "proved":
        assert r1.per_trial_bound == pytest.approx(r0.per_trial_bound + FF.projection_bound())


def test_suite_attention_pair_projects_the_last_product() -> None:
    g = vm.benchmarks.get("gqa", batch=1, small=True)
    m = vm.benchmarks.expert("gqa", g)
    r = FF.ff_test(g, m)
    assert r.outcome == "proved" and r.projected
    assert r.bound <= 2.0**-60


def test_certificates_record_the_reference_method(tmp_path) -> None:
    # a certificate's trials are the reference evaluator's, every element compared (no projection): the checker
    # recomputes the record and rejects any other method or a projection claim
    from verimirage.checkcall import check_certificate
    from verimirage.smt.certificate import FF_METHOD, Certificate
    from verimirage.smt.certify import make_certificate

    g = vm.benchmarks.get("lora", batch=1, small=True)
    m = vm.benchmarks.expert("lora", g)
    v = vm.verify(g, m)
    assert isinstance(v, vm.Proved)
    cert = make_certificate(g, m, v)
    assert cert.ff["method"] == FF_METHOD and "projection" not in cert.ff
    path = tmp_path / "c.json"
    cert.save(path)
    assert check_certificate(path, isolate=False).proved
    d = Certificate.load(path)
    d.ff["method"] = "something else"
    d.save(path)
    assert "finite-field record" in check_certificate(path, isolate=False).reason
    d.ff["method"] = FF_METHOD
    d.ff["projection"] = "sum(O*U*r) mod p"
    d.save(path)
    assert "finite-field record" in check_certificate(path, isolate=False).reason


@pytest.mark.parametrize("name", ["gqa", "gqa_stable", "mha_stable", "lora", "rmsnorm_linear", "gated_mlp"])
def test_suite_pairs_never_form_their_last_product(name, monkeypatch) -> None:
    # every matmul a projection reaches is pushed through or contracted as U . (a @ (b @ V)); a product
    # computed in full would show as a contracted part built by a matmul. The online-softmax combine's 16
    # rescaled steps must merge into one term (they once reached kernel 1 as 16 separate, full-size terms).
    formed: list[tuple[int, ...]] = []
    orig = FP._contract

    def contract(part, shape, term, m):
        if part._lin is not None and part._lin[0] == "matmul":
            formed.append(shape)
        return orig(part, shape, term, m)

    monkeypatch.setattr(FP, "_contract", contract)
    g = vm.benchmarks.get(name, batch=1, small=True)
    m = vm.benchmarks.expert(name, g)
    r = FF.ff_test(g, m, trials=1)
    assert r.outcome == "proved"
    if name == "gated_mlp":  # silu(X W1) = X W1 sigmoid(X W1) multiplies its argument's p-part elementwise: that
        # product is formed (as when silu was an oracle reading it), once per program; the last product never
        assert len(formed) == 2, formed  # (one X W1 in each program)
        return
    assert formed == []


@pytest.mark.parametrize("name", ["lora_bs1", "gqa_bs1"])
def test_certificates_of_schema_1_are_rejected(name) -> None:
    # proofs/ as committed before projections (schema 1: fixed public seeds): an unknown version now
    from verimirage.checkcall import check_certificate
    from verimirage.smt.certificate import Certificate

    src = Path(__file__).parent / "cases" / "certificates" / f"{name}_elementwise.json"
    assert json.loads(src.read_text())["schema"] == "verimirage-certificate/1"
    with pytest.raises(ValueError, match="unknown schema"):
        Certificate.load(src)
    v = check_certificate(src, isolate=False)
    assert not v.proved and "unknown schema" in v.reason
