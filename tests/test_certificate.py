"""Certificates: expert designs certify and re-check; tampered copies are rejected (fail closed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.benchmarks.designs import expert, small_design_kw
from verimirage.smt.certificate import SCHEMA, Certificate, certify, check_certificate, register_rules, sha256

NAMES = ["gqa", "gqa_stable", "rmsnorm_linear", "lora", "gated_mlp", "ntrans", "qknorm_gqa", "mqa"]


def _cert(name: str, rules: tuple[str, ...] = ()) -> Certificate:
    g = vm.benchmarks.get(name, small=True)
    return certify(g, expert(name, g, **small_design_kw(name)), rules)


@pytest.mark.parametrize("name", NAMES)
def test_expert_certificates_check(name: str, tmp_path: Path) -> None:
    c = _cert(name)
    p = tmp_path / "c.json"
    c.save(p)
    v = vm.check_certificate(p)
    assert isinstance(v, vm.Proved), v.summary()
    c2 = Certificate.load(p)
    assert c2 == c and c2.schema == SCHEMA and c2.ff["false_accept_bound"] <= 2.0**-60
    assert all(q["expected"] == "unsat" and "check-sat" in q["smt2"] for q in c2.queries)


def _tamper(tmp_path: Path, edit) -> vm.Verdict:
    c = _cert("gqa_stable")
    d = json.loads(c.to_json())
    edit(d)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    return check_certificate(p)


def _rehash(d: dict) -> None:
    d["graph_sha256"] = sha256(d["graph_text"])
    d["mugraph_sha256"] = sha256(d["mugraph_text"])


def _shape(d: dict) -> None:
    d["graph_text"] = d["graph_text"].replace("f16[2,32,16]", "f16[2,32,32]", 1)
    _rehash(d)


def _mu_line(d: dict) -> None:
    lines = d["mugraph_text"].splitlines()
    i = next(k for k, s in enumerate(lines) if " = exp " in s)
    lines[i] = lines[i].replace(" = exp ", " = silu ")
    d["mugraph_text"] = "\n".join(lines) + ("\n" if d["mugraph_text"].endswith("\n") else "")
    _rehash(d)


TAMPERS = {
    "shape": _shape,
    "shape-unhashed": lambda d: d.update(graph_text=d["graph_text"].replace("f16[2,32,16]", "f16[2,32,32]", 1)),
    "mugraph-line": _mu_line,
    "rule": lambda d: d.update(rules=["no-such-rule"]),
    "seed": lambda d: d["ff"]["seeds"].__setitem__(0, d["ff"]["seeds"][0] + 1),
    "hash": lambda d: d.update(graph_sha256="0" * 64),
    "schema": lambda d: d.update(schema="verimirage-certificate/999"),
    "smt2": lambda d: d["queries"][0].update(
        smt2=d["queries"][0]["smt2"].replace("(check-sat)", "(assert false)\n(check-sat)")
    ),
    "core": lambda d: d["queries"][0].update(core=["goal", "pos:7"]),
    "bound": lambda d: d["ff"].update(false_accept_bound=1e-30),
    "triton-hash": lambda d: d.update(triton_source_sha256="xyz"),
    "extra-field": lambda d: d.update(note="hi"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERS))
def test_tampered_rejected(kind: str, tmp_path: Path) -> None:
    v = _tamper(tmp_path, TAMPERS[kind])
    assert isinstance(v, vm.Unknown) and "rejected" in v.reason, (kind, v.summary())


def test_rules_known_or_trusted(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    _cert("lora", ("test-rule-known",)).save(p)
    assert not check_certificate(p).proved
    register_rules(["test-rule-known"])
    assert check_certificate(p).proved
    g = vm.benchmarks.get("lora", small=True)
    mg = expert("lora", g, **small_design_kw("lora"))
    c = vm.verify(g, mg)
    from verimirage.smt.certificate import make_certificate

    t = make_certificate(g, mg, c, rules=["user-rule"], trusted_rules=["user-rule"], triton_source_hash="a" * 64)
    t.save(p)
    v = check_certificate(p)
    assert v.proved and "user-rule" in v.reason
    assert not check_certificate(p, triton_source="other source").proved


def test_only_proved_pairs_certify() -> None:
    g = vm.benchmarks.get("gqa", small=True)
    with pytest.raises(vm.GraphError):
        certify(g, _wrong(g))


def _wrong(g: vm.Graph) -> vm.Graph:
    h = vm.Graph()
    q, k, v = (h.input(t.name, t.shape, t.dtype) for t in g.inputs)
    h.output(h.matmul(h.exp(h.matmul(q, k)), v))
    return h


PROOFS = Path(__file__).resolve().parent.parent / "proofs"
PROOF_FILES = sorted(PROOFS.glob("*.json")) if PROOFS.is_dir() else []
#: proofs re-checked in the default (fast) test run; every other one runs in the slow tier (CI runs both)
FAST_PROOFS = {"gqa_bs1", "lora_bs1"}


def test_committed_proofs_are_all_there() -> None:
    # the per-file checks below are collected from the directory: an empty or missing proofs/ must fail here
    want = {f"{n}_bs{b}" for n in vm.benchmarks.names() for b in (1, 8)}
    have = {p.stem for p in PROOF_FILES}
    assert want <= have, f"proofs/ lacks {sorted(want - have)} (regenerate with scripts/regen_proofs.py)"
    assert have >= FAST_PROOFS


@pytest.mark.parametrize(
    "path", [p if p.stem in FAST_PROOFS else pytest.param(p, marks=pytest.mark.slow) for p in PROOF_FILES],
    ids=lambda p: p.stem)
def test_committed_proof_checks(path: Path) -> None:
    v = check_certificate(path)
    assert v.proved, (path.name, v.summary())


def test_known_rules_file_is_current() -> None:
    rules = pytest.importorskip("verimirage.rewrite.rules")
    partition = pytest.importorskip("verimirage.rewrite.partition")
    from verimirage.smt.certificate import persisted_rules

    want = {*partition.STEPS, *(r.name for r in rules.all_builtin_rules() if r.name not in rules.UNPROVED_BUILTINS)}
    assert persisted_rules() == want, (
        "verimirage/smt/known_rules.txt is stale; regenerate it with "
        "verimirage.smt.certificate.write_known_rules(names)")


def test_write_and_read_known_rules(tmp_path: Path) -> None:
    from verimirage.smt.certificate import persisted_rules, write_known_rules

    p = write_known_rules(["b-rule", "a.rule", "b-rule"], tmp_path / "k.txt")
    assert persisted_rules(p) == {"a.rule", "b-rule"}
    assert persisted_rules(tmp_path / "missing.txt") == frozenset()
    with pytest.raises(ValueError, match="rule name"):
        write_known_rules(["bad name"], tmp_path / "k2.txt")
    with pytest.raises(ValueError, match="rule name"):
        register_rules(["x y"])


def test_persisted_rules_accepted_in_a_fresh_process(tmp_path: Path) -> None:
    import subprocess
    import sys

    from verimirage.smt.certificate import persisted_rules

    name = sorted(persisted_rules())[0]
    p = tmp_path / "c.json"
    _cert("lora", (name,)).save(p)
    code = ("import sys, verimirage as vm; v = vm.check_certificate(sys.argv[1]); "
            "print(v.reason); sys.exit(0 if v.proved else 1)")
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, cwd=root,
                       env={**__import__("os").environ, "PYTHONPATH": str(root)}, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_certificate_reuses_the_verified_abstract_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a search verifies a pair, then certifies it: the certificate takes the queries of that verification
    # instead of asking Z3 again, and they are the queries a fresh check records
    from verimirage.smt import certificate as C
    from verimirage.smt import verify as V

    g = vm.benchmarks.get("gqa_stable", small=True)
    m = expert("gqa_stable", g, **small_design_kw("gqa_stable"))
    fresh = C.make_certificate(g, m, vm.verify(g, m))
    calls: list[int] = []
    real = V.abstract_check
    monkeypatch.setattr(C, "abstract_check", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    v = vm.verify(g, m)
    assert isinstance(v, vm.Proved)
    cert = C.make_certificate(g, m, v)
    assert calls == []
    assert cert.queries == fresh.queries and cert.laws == fresh.laws
    cert.save(tmp_path / "c.json")
    assert isinstance(vm.check_certificate(tmp_path / "c.json"), vm.Proved)
    V._PROVED_ABSTRACT.clear()  # forgotten (or never verified here): the check runs again
    assert C.make_certificate(g, m, v).queries == fresh.queries and calls == [1]
