"""Certificates: expert designs certify and re-check; tampered copies are rejected (fail closed)."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.backend.tuning import triton_digest
from verimirage.benchmarks.designs import expert, small_design_kw
from verimirage.pipeline.certificates import check_certificate  # (the checker with the backend's Triton digest)
from verimirage.smt.certificate import SCHEMA, Certificate, CertificateError, derive_seeds, ff_record, sha256
from verimirage.smt.certify import certify, register_rules

NAMES = ["gqa", "gqa_stable", "rmsnorm_linear", "lora", "gated_mlp", "ntrans", "qknorm_gqa", "mqa"]


def _cert(name: str, rules: tuple[str, ...] = ()) -> Certificate:
    g = vm.benchmarks.get(name, small=True)
    return certify(g, expert(name, g, **small_design_kw(name)), rules)


@pytest.mark.parametrize("name", NAMES)
def test_expert_certificates_check(name: str, tmp_path: Path) -> None:
    c = _cert(name)
    p = tmp_path / "c.json"
    c.save(p)
    v = vm.check_certificate(p, isolate=False)
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
    return check_certificate(p, isolate=False)


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
    "repeated-seeds": lambda d: d["ff"].update(seeds=[d["ff"]["seeds"][0]] * d["ff"]["trials"]),
    "fewer-trials": lambda d: d["ff"].update(trials=1, seeds=d["ff"]["seeds"][:1]),
    "ff-method": lambda d: d["ff"].update(method="projected"),
    "per-trial-bound": lambda d: d["ff"].update(per_trial_bound=d["ff"]["per_trial_bound"] / 2),
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


def test_z3_and_trials_run_at_once_and_either_rejects(tmp_path: Path) -> None:
    # the checker runs the Z3 part and the finite-field trials at once (issue 26: check-cert start-up); a rejection
    # from either rejects, and with both wrong the Z3 part's reason is the one reported (as when it ran first)
    both = lambda d: (TAMPERS["smt2"](d), TAMPERS["seed"](d))  # noqa: E731
    for edit, why in ((TAMPERS["seed"], "finite-field record"), (TAMPERS["smt2"], "differs from the re-derived query"),
                      (both, "differs from the re-derived query")):
        v = _tamper(tmp_path, edit)
        assert isinstance(v, vm.Unknown) and why in v.reason, v.summary()
    v = _tamper(tmp_path, lambda d: None)
    assert v.proved and [c.name for c in v.evidence][:3] == ["hashes-and-rules", "abstract-z3", "finite-field"]


def test_rules_known_or_trusted(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    _cert("lora", ("test-rule-known",)).save(p)
    assert not check_certificate(p).proved
    register_rules(["test-rule-known"])
    assert check_certificate(p).proved  # (the rules registered here are passed to the checker process)
    g = vm.benchmarks.get("lora", small=True)
    mg = expert("lora", g, **small_design_kw("lora"))
    c = vm.verify(g, mg)
    from verimirage.smt.certify import make_certificate

    t = make_certificate(g, mg, c, rules=["user-rule"], trusted_rules=["user-rule"],
                         triton_source_hash=triton_digest(mg))
    t.save(p)
    v = check_certificate(p, isolate=False)
    assert v.proved and "user-rule" in v.reason and "triton-hash" in [e.name for e in v.evidence]
    assert not check_certificate(p, triton_source="other source", isolate=False).proved


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
#: proofs re-checked only in the heavy tier (``bash scripts/test.sh --heavy``): the prefill and batch-32 layers'
#: re-checks took 185 s and 66 s of CI's 19.5 minutes of tests (2026-11-27); the decode layers at batch 1 and 8, the
#: cases issue 23 times, stay in CI
HEAVY_PROOFS = {"layer_prefill_512", "layer_decode_bs32"}


def _proof_param(p: Path) -> object:
    if p.stem in FAST_PROOFS:
        return p
    return pytest.param(p, marks=pytest.mark.heavy if p.stem in HEAVY_PROOFS else pytest.mark.slow)


def test_committed_proofs_are_all_there() -> None:
    # the per-file checks below are collected from the directory: an empty or missing proofs/ must fail here
    want = {f"{n}_bs{b}" for n in vm.benchmarks.names() for b in (1, 8)}
    want |= {f"layer_{c}" for c in vm.benchmarks.layer_cases()}  # the full-size decoder layer (issue 23), prefill too
    have = {p.stem for p in PROOF_FILES}
    assert want <= have, f"proofs/ lacks {sorted(want - have)} (regenerate with scripts/regen_proofs.py)"
    assert have >= FAST_PROOFS


@pytest.mark.parametrize(
    "path", [_proof_param(p) for p in PROOF_FILES],
    ids=lambda p: p.stem)
def test_committed_proof_checks(path: Path) -> None:
    v = check_certificate(path)
    assert v.proved, (path.name, v.summary())


def test_known_rules_file_is_current() -> None:
    rules = pytest.importorskip("verimirage.rewrite.rules")
    partition = pytest.importorskip("verimirage.rewrite.partition")
    from verimirage.smt.certify import persisted_rules

    want = {*partition.STEPS, *(r.name for r in rules.all_builtin_rules() if r.name not in rules.UNPROVED_BUILTINS)}
    assert persisted_rules() == want, (
        "verimirage/smt/known_rules.txt is stale; regenerate it with "
        "verimirage.smt.certify.write_known_rules(names)")


def test_write_and_read_known_rules(tmp_path: Path) -> None:
    from verimirage.smt.certify import persisted_rules, write_known_rules

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

    from verimirage.smt.certify import persisted_rules

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
    from verimirage.smt import certify as C
    from verimirage.smt import verify as V

    g = vm.benchmarks.get("gqa_stable", small=True)
    m = expert("gqa_stable", g, **small_design_kw("gqa_stable"))
    fresh = C.make_certificate(g, m, vm.verify(g, m))
    calls: list[int] = []
    real = V.abstract_check
    monkeypatch.setattr(V, "abstract_check", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    v = vm.verify(g, m)
    assert isinstance(v, vm.Proved)
    calls.clear()  # (the verification itself ran one)
    cert = C.make_certificate(g, m, v)
    assert calls == []
    assert cert.queries == fresh.queries and cert.laws == fresh.laws
    cert.save(tmp_path / "c.json")
    assert isinstance(vm.check_certificate(tmp_path / "c.json", isolate=False), vm.Proved)
    V._PROVED_ABSTRACT.clear()  # forgotten (or never verified here): the check runs again
    assert C.make_certificate(g, m, v).queries == fresh.queries and calls == [1]


# --------------------------------------------------------------------------- the checker is a second opinion (issue 24)


def test_missing_or_corrupt_certificate_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nothing\.json"):
        check_certificate(tmp_path / "nothing.json")
    for text in ("{not json", "[1, 2]", ""):
        p = tmp_path / "bad.json"
        p.write_text(text)
        with pytest.raises(CertificateError, match=r"bad\.json"):
            check_certificate(p)
    with pytest.raises(CertificateError, match="expected a Certificate or a path"):
        check_certificate(42)  # type: ignore[arg-type]


def test_check_accepts_a_certificate_object_and_a_str_path(tmp_path: Path) -> None:
    c = _cert("lora")
    assert check_certificate(c, isolate=False).proved
    c.save(tmp_path / "c.json")
    assert check_certificate(str(tmp_path / "c.json")).proved  # (in the capped checker process)


def test_seeds_are_derived_from_the_content_and_distinct() -> None:
    c = _cert("lora")
    n = c.ff["trials"]
    assert c.ff["seeds"] == list(derive_seeds(c.graph_text, c.mugraph_text, n))
    assert len(set(c.ff["seeds"])) == n
    assert c.ff == ff_record(vm.Graph.parse(c.graph_text), vm.MuGraph.parse(c.mugraph_text))
    assert c.ff["false_accept_bound"] == c.ff["per_trial_bound"] ** n <= 2.0**-60
    assert not set(_cert("gqa").ff["seeds"]) & set(c.ff["seeds"])
    assert derive_seeds("a", "b", 3) != derive_seeds("a", "c", 3) and len(set(derive_seeds("a", "b", 40))) == 40


def test_repeated_seeds_rejected(tmp_path: Path) -> None:
    # one seed repeated claimed the bound of n trials with the evidence of one
    v = _tamper(tmp_path, TAMPERS["repeated-seeds"])
    assert isinstance(v, vm.Unknown) and "seeds" in v.reason, v.summary()


def test_non_derived_seeds_rejected(tmp_path: Path) -> None:
    # the verifier's fixed public seeds, their fields recorded consistently: not derived from the content
    from verimirage.smt import ffref
    from verimirage.smt.ff import default_seeds

    def edit(d: dict) -> None:
        seeds = list(default_seeds(0, d["ff"]["trials"]))
        fields = [ffref.field_of(s) for s in seeds]
        d["ff"].update(seeds=seeds, p=[f.p for f in fields], q=[f.q for f in fields], g=[f.g for f in fields])

    v = _tamper(tmp_path, edit)
    assert isinstance(v, vm.Unknown) and "seeds" in v.reason, v.summary()


def test_wrong_triton_hash_rejected(tmp_path: Path) -> None:
    from verimirage.smt.certify import make_certificate

    g = vm.benchmarks.get("lora", small=True)
    mg = expert("lora", g, **small_design_kw("lora"))
    v = vm.verify(g, mg)
    right = triton_digest(mg)
    for h in (right, "0" * 64, sha256("some other module")):
        c = make_certificate(g, mg, v, triton_source_hash=h)
        r = check_certificate(c, isolate=False)
        assert r.proved == (h == right), r.summary()
        if h != right:
            assert "Triton" in r.reason
    # without regenerating, the hash is not confirmed but the equivalence still is
    assert check_certificate(make_certificate(g, mg, v, triton_source_hash="0" * 64), isolate=False,
                             triton=False).proved


def test_triton_digest_is_the_module_compile_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from verimirage.backend import runtime

    class Made(Exception):
        pass

    def capture(ms, directory=None):
        raise Made(ms.digest)

    monkeypatch.setattr(runtime, "write_module", capture)
    for name in ("lora", "rmsnorm_linear", "gqa"):
        g = vm.benchmarks.get(name, small=True)
        mg = expert(name, g, **small_design_kw(name))
        with pytest.raises(Made) as e:
            vm.compile(mg)
        assert str(e.value) == triton_digest(mg), name


#: every committed certificate: proofs/, the test fixtures (tests/cases/certificates), benchmarks/candidates/*/proofs
ROOT = PROOFS.parent
COMMITTED_CERTIFICATES = sorted([*PROOF_FILES, *(ROOT / "tests" / "cases" / "certificates").glob("*.json"),
                                 *(ROOT / "benchmarks" / "candidates").glob("*/proofs/*.json")])


def test_committed_certificates_record_the_module_that_runs() -> None:
    """Every committed certificate records the Triton hash of the module ``vm.compile`` runs for its μGraph today
    (the two test fixtures recorded codegen 13's and nothing checked them: a certificate's hash is checked only where
    it is re-checked with the backend's generator; re-stamp with ``scripts/regen_proofs.py --restamp``).
    lora_bs1 and rmsnorm_linear_bs8 once recorded the default-tile module, which vm.compile does not run."""
    from verimirage.backend.codegen import generate

    differs = []
    assert len(COMMITTED_CERTIFICATES) > len(PROOF_FILES) >= 20
    stale = []
    for p in COMMITTED_CERTIFICATES:
        # (the fields every schema has: composed certificates (the layer's) and the fixtures' schema 1 too)
        d = json.loads(p.read_text())
        mg = vm.MuGraph.parse(d["mugraph_text"])
        if d.get("triton_source_sha256") != triton_digest(mg):
            stale.append(p.relative_to(ROOT).as_posix())
        if p.parent == PROOFS:
            differs += [p.stem] if generate(mg).digest != d["triton_source_sha256"] else []
    assert not stale, f"stale Triton hash(es), re-stamp with scripts/regen_proofs.py --restamp: {stale}"
    assert {"lora_bs1", "rmsnorm_linear_bs8"} <= set(differs)


def test_checker_ignores_verifier_cache() -> None:
    # the process that verified a pair: a (simulated) verifier bug caches the right pair's abstract check for a
    # wrong μGraph; the certificate made from it must be rejected, as the checker derives everything itself
    from verimirage.smt import verify as V
    from verimirage.smt.certify import make_certificate

    g = vm.benchmarks.get("gqa", small=True)
    m = expert("gqa", g, **small_design_kw("gqa"))
    v = vm.verify(g, m)
    r = V.proved_abstract(g, m)
    assert isinstance(v, vm.Proved) and r is not None
    wrong = vm.MuGraph.parse(str(_wrong(g)).replace("graph {", "mugraph {", 1))
    V._PROVED_ABSTRACT[(str(g), str(wrong))] = r
    try:
        cert = make_certificate(g, wrong, v)
        assert cert.queries == [{"name": q.name, "smt2": q.smt2, "expected": q.expected, "core": list(q.core)}
                                for q in r.queries]
        out = check_certificate(cert, isolate=False)
        assert isinstance(out, vm.Unknown) and "quer" in out.reason, out.summary()
    finally:
        V._PROVED_ABSTRACT.pop((str(g), str(wrong)), None)


def _softmax_scaled(mu: bool) -> vm.Graph:
    g = vm.MuGraph() if mu else vm.Graph()
    s = g.input("S", (4, 96), vm.float32)
    x = g.scale(s, 1 / math.sqrt(96))
    e = g.exp(g.sub(x, g.max(x, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    return g


@pytest.mark.slow
def test_crafted_certificate_does_not_crash_checker(tmp_path: Path) -> None:
    # 1 KB: a scaled softmax (constant 1/sqrt(96)) against a copy, with a made-up query; re-deriving its
    # query once made check-cert run 21 s and die with Z3Exception: out of memory
    gt, mt = str(_softmax_scaled(False)), str(_softmax_scaled(True))
    q = [{"name": "eq:out0:case0", "smt2": "(check-sat)", "expected": "unsat", "core": ["goal"]}]
    c = Certificate(gt, sha256(gt), mt, sha256(mt), [], [], q, [], [[[[0, 4], [0, 1]]]], {})
    p = tmp_path / "crafted.json"
    c.save(p)
    assert len(p.read_bytes()) < 2000
    t0 = time.perf_counter()
    v = check_certificate(p, memory_mb=1536, wall_s=40)
    assert isinstance(v, vm.Unknown) and "rejected" in v.reason, v.summary()
    assert time.perf_counter() - t0 < 90


def test_memory_blowup_is_a_rejection(tmp_path: Path) -> None:
    # a legal certificate whose finite-field trial needs ~4 GiB: under a 1.5 GiB cap, a rejection, not a crash
    from verimirage.smt.certify import make_certificate

    def prog(mu: bool) -> vm.Graph:
        g = vm.MuGraph() if mu else vm.Graph()
        x = g.input("X", (16384, 16384), vm.float32)
        g.output(g.neg(x))
        return g

    c = make_certificate(prog(False), prog(True), vm.Proved("(for the test)"))
    v = check_certificate(c, memory_mb=1536, wall_s=120, triton=False)
    assert isinstance(v, vm.Unknown) and "MemoryError" in v.reason, v.summary()


def test_time_limit_is_a_rejection() -> None:
    v = check_certificate(_cert("lora"), wall_s=0.02)  # the child cannot even start (lora checks in < 0.5 s idle)
    assert isinstance(v, vm.Unknown) and "time limit" in v.reason


def test_checker_process_cannot_import_the_verifier() -> None:
    import subprocess
    import sys

    from verimirage import checkproc as C

    root = Path(__file__).resolve().parent.parent
    for mod in ("verimirage.smt.ff", "verimirage.smt.verify", "verimirage.smt.ff.share", "verimirage.pipeline.superopt",
                "torch", "verimirage.ir.builders", "verimirage.ir.reference", "verimirage.ir.opfacts",
                "verimirage.ir.serial", "verimirage.smt.certify", "verimirage.smt.reading", "verimirage.checkcall",
                "verimirage.smt.deep", "verimirage.ir.parse"):
        code = C._CHILD.format(refused=C.REFUSED).replace(
            "from verimirage.smt.certificate import _child_main\n_child_main()", f"import {mod}")
        r = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, cwd=root,
                           timeout=120)
        assert r.returncode != 0 and "does not use" in r.stderr, (mod, r.stderr[-300:])


_BLOCKED_RUN = """
import json, os, sys, types
for pkg in ("verimirage", "verimirage.ir", "verimirage.smt"):  # (bare packages, as in the checker process)
    sys.modules[pkg] = types.ModuleType(pkg)
    sys.modules[pkg].__path__ = [os.path.join(os.getcwd(), *pkg.split("."))]
BLOCK = ("verimirage.smt.ff", "verimirage.smt.ff.share", "verimirage.smt.ff.proj", "verimirage.smt.ff.gpu",
         "verimirage.smt.verify", "verimirage.smt.prune", "verimirage.rewrite", "verimirage.backend", "torch",
         "verimirage.ir.builders", "verimirage.ir.reference", "verimirage.ir.opfacts", "verimirage.ir.serial",
         "verimirage.ir.dot", "verimirage.ir.svg", "verimirage.smt.certify", "verimirage.smt.axioms",
         "verimirage.smt.budget", "verimirage.smt.reading", "verimirage.integrations", "verimirage.benchmarks",
         "verimirage.checkcall", "verimirage.ir.parse", "verimirage.smt.deep")

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCK):
            raise ImportError("blocked for the test: " + name)
        return None

sys.meta_path.insert(0, Refuse())
from verimirage.smt.certificate import _verdict  # (what the checker process runs; check_text: in-process plumbing)
good, bad = (_verdict(open(f).read(), frozenset(json.loads(sys.argv[3])), 10.0) for f in sys.argv[1:3])
files = sorted(m.__file__ for n, m in sys.modules.items()
               if n.startswith("verimirage") and getattr(m, "__file__", None))
print(json.dumps({"good": good.proved, "why": good.reason, "bad": bad.proved, "bad_why": bad.reason,
                  "loaded": [n for n in sys.modules if any(n == b or n.startswith(b + ".") for b in BLOCK)],
                  "files": files}))
"""


def _blocked_check(tmp_path: Path, proof: str = "lora_bs1") -> dict:
    import subprocess
    import sys

    src = PROOFS / f"{proof}.json"
    d = json.loads(src.read_text())
    d["ff"]["seeds"][0] += 1
    bad = tmp_path / "tampered.json"
    bad.write_text(json.dumps(d))
    root = Path(__file__).resolve().parent.parent
    from verimirage.smt.certify import known_rules

    r = subprocess.run([sys.executable, "-c", _BLOCKED_RUN, str(src), str(bad), json.dumps(sorted(known_rules()))],
                       capture_output=True, text=True, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_checker_runs_with_the_fast_modules_unimportable(tmp_path: Path) -> None:
    out = _blocked_check(tmp_path)
    assert out["good"], out["why"]
    assert not out["bad"] and "rejected" in out["bad_why"]
    assert out["loaded"] == []


def test_checker_answer_about_another_text_is_not_taken() -> None:
    # the calling side (verimirage.checkcall: starting the process, sending the request) is not trusted: the checker
    # process names the sha256 of the text it checked, and its Proved about any other text is a rejection
    import subprocess
    import sys

    from verimirage.checkcall import isolated
    from verimirage.smt.certificate import verdict_of
    from verimirage.smt.certify import known_rules

    text, other = ((PROOFS / f"{n}.json").read_text() for n in ("lora_bs1", "gqa_bs1"))
    root = Path(__file__).resolve().parent.parent
    from verimirage import checkproc as K

    req = json.dumps({"certificate": text, "known_rules": sorted(known_rules()), "timeout_s": 60.0, "memory_mb": 0})
    path = [str(root), *(p for p in sys.path if Path(p).is_absolute() and p != str(root))]
    r = subprocess.run([sys.executable, "-I", "-S", "-c", K._CHILD.format(refused=K.REFUSED), *path], input=req,
                       capture_output=True, text=True, cwd=root, timeout=600)
    v = verdict_of(r.stdout, text)
    assert v is not None and v.proved, r.stderr[-500:]
    w = verdict_of(r.stdout, other)  # (the same answer, read as one about gqa_bs1's certificate)
    assert w is not None and not w.proved and "another certificate text" in w.reason
    assert verdict_of(r.stdout.replace('"proved": true', '"proved": 1'), text).proved is False  # (true only)
    assert verdict_of("no verdict", text) is None and verdict_of("[1, 2]", text) is None
    assert isolated(text, known_rules(), 60.0, 0, 600.0).proved


def test_checker_process_checks_a_deep_program(tmp_path: Path) -> None:
    # the checker process runs its whole check on one thread with a deep stack (twenty-first session: no longer
    # through smt.deep.deep_call, which it cannot import): a chain of 1,200 ops derives there and in this process
    g = vm.Graph()
    x = g.input("X", (4,), vm.float32)
    for i in range(600):
        x = g.shift(g.scale(x, 2.0), float(i % 3))
    g.output(x)
    mg = vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))
    path = tmp_path / "chain.json"
    path.write_text(certify(g, mg).to_json())
    from verimirage.smt.certificate import check_text

    assert check_certificate(path).proved and check_text(path.read_text()).proved


def test_calling_side_names_a_field_of_the_wrong_type(tmp_path: Path) -> None:
    # the checker process compares each field with its re-derivation and does not check the fields' types (twenty-first
    # session); every entry point reads the certificate with them checked first, so a rule list given as an object
    # (red team 20: no wrong pair accepted, a certificate is one text) is still a rejection naming the field
    d = json.loads((PROOFS / "lora_bs1.json").read_text())
    d["rules"] = {}
    path = tmp_path / "dict_rules.json"
    path.write_text(json.dumps(d))
    v = check_certificate(path)
    assert not v.proved and "field 'rules': got {}; expected list[str]" in v.reason, v.reason


def test_checker_process_accepted_a_field_of_the_wrong_kind() -> None:
    # trusted21 moved the typed reading to the calling side, and the process itself then checked a certificate whose
    # rule list was an object (``{}``) as Proved; the process fails closed on what it does not know, so a field of
    # another kind than its annotation's (list, dict, str) is its own rejection too, whoever calls it
    from verimirage.smt.certificate import _read, check_text

    good = (PROOFS / "lora_bs1.json").read_text()
    assert _read(good).rules == json.loads(good)["rules"]
    for name, bad in (("rules", {}), ("trusted_rules", "x"), ("ff", []), ("graph_text", 3), ("queries", None)):
        d = json.loads(good)
        d[name] = bad
        with pytest.raises(ValueError, match=f"field '{name}' is a"):
            _read(json.dumps(d))
    d = json.loads(good)
    d["rules"] = {}
    assert not check_text(json.dumps(d)).proved


def test_calling_side_makes_no_proved() -> None:
    # the calling side narrows the checker's verdict (certificate.confirmed keeps a verdict that is not Proved as
    # it is); it never builds a Proved itself, so it is not on the trusted path
    root = Path(__file__).resolve().parent.parent
    for f in ("verimirage/checkcall.py", "verimirage/pipeline/certificates.py", "verimirage/smt/deep.py"):
        src = (root / f).read_text()
        assert "Proved(" not in src and not re.search(r"import[^\n]*\bProved\b", src), f


#: the trusted path (the files of verimirage the checker process loads while it checks a certificate, and what it
#: runs first, verimirage/checkproc.py; the calling side, verimirage/checkcall.py, is not: it makes no Proved),
#: non-blank lines; the polynomial normaliser (smt/expr.py) is counted apart. README.md ("Trust") states these
#: figures. Measured over the union of what a plain certificate (lora_bs1) and a certificate by regions
#: (:data:`MEASURED_COMPOSED`) load.
TRUSTED_BUDGET, NORMALISER, CHECKPROC = 3465, "verimirage/smt/expr.py", "verimirage/checkproc.py"
MEASURED_COMPOSED = "layer_decode_bs1_small"


def _child_files(proof: str = "lora_bs1") -> list[str]:
    """The files of verimirage the checker process (:mod:`verimirage.checkproc`'s child, as started) has loaded once
    it has checked ``proof`` (Proved), relative to the repository root."""
    import subprocess
    import sys

    from verimirage import checkproc as C
    from verimirage.smt.certify import known_rules

    root = Path(__file__).resolve().parent.parent
    show = ("print(sorted(m.__file__ for n, m in sys.modules.items() if n.startswith('verimirage') and "
            "getattr(m, '__file__', None)))\n")
    code = C._CHILD.format(refused=C.REFUSED).replace("_child_main()\n", "_child_main()\n" + show, 1)
    req = json.dumps({"certificate": (PROOFS / f"{proof}.json").read_text(), "known_rules": sorted(known_rules()),
                      "timeout_s": 60.0, "memory_mb": 0})
    path = [str(root), *(p for p in sys.path if Path(p).is_absolute() and p != str(root))]
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, *path], input=req, capture_output=True, text=True,
                       cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    verdict, files = r.stdout.strip().splitlines()[-2:]
    assert json.loads(verdict)["proved"], verdict[:500]
    return [Path(f).resolve().relative_to(root).as_posix() for f in json.loads(files.replace("'", '"'))]


def test_checker_process_runs_no_package_init() -> None:
    # the packages' __init__ files (lazy loaders of the public names, re-exports) never run in the checker process
    files = _child_files()
    assert "verimirage/smt/certificate.py" in files and not [f for f in files if f.endswith("__init__.py")], files


def test_trusted_path_line_count() -> None:
    root = Path(__file__).resolve().parent.parent
    # (checkproc.py: what the checker process runs first)
    files = sorted({*_child_files(), *_child_files(MEASURED_COMPOSED), CHECKPROC})
    must = {NORMALISER, "verimirage/smt/ffref.py", "verimirage/smt/z3enc.py", "verimirage/smt/glue.py"}
    assert must <= set(files), sorted(must - set(files))
    count = {f: sum(1 for ln in (root / f).read_text().splitlines() if ln.strip()) for f in files}
    trusted = sum(n for f, n in count.items() if f != NORMALISER)
    detail = ", ".join(f"{f} {n}" for f, n in sorted(count.items()))
    assert trusted <= TRUSTED_BUDGET, f"the trusted path grew to {trusted} lines (budget {TRUSTED_BUDGET}): {detail}"
    readme = (root / "README.md").read_text()
    assert f"{TRUSTED_BUDGET:,} lines" in readme, "README.md must state the trusted path's line budget"


def test_check_cert_leaves_z3_and_the_checking_to_the_child() -> None:
    # start-up of `verimirage check-cert` (issue 26): the calling process spawns the capped checker and regenerates
    # the Triton hash meanwhile; it never loads z3, the fast finite-field engine or the verifier itself
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = ("import sys\nfrom verimirage.cli import main\n"
            f"assert main(['check-cert', {str(PROOFS / 'lora_bs1.json')!r}]) == 0\n"
            "print('LOADED', sorted(m for m in ('z3', 'verimirage.smt.z3enc', 'verimirage.smt.ff', "
            "'verimirage.smt.verify', 'torch') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "LOADED []" in r.stdout, r.stdout


def test_certificate_states_no_probability_where_verify_states_none() -> None:
    # finding (degrees session, 2026-11-26): check_certificate's verdict stated the per-node model figure as its
    # false-accept probability (gqa_stable_bs1: 1.1e-20) where vm.verify, for the same pair, states none (max is
    # an order on residues; element-wise exp applications are not counted by the per-node model)
    v = vm.check_certificate(str(PROOFS / "gqa_stable_bs1.json"))
    assert v.proved and v.false_accept_bound is None
    c = Certificate.load(PROOFS / "gqa_stable_bs1.json")
    assert vm.verify(vm.Graph.parse(c.graph_text), vm.MuGraph.parse(c.mugraph_text)).false_accept_bound is None
    w = vm.check_certificate(str(PROOFS / "lora_bs1.json"))  # products and sums only: the figure is a probability
    assert w.proved and w.false_accept_bound == Certificate.load(PROOFS / "lora_bs1.json").ff["false_accept_bound"]


def test_check_certificate_raised_oserror_on_json_text() -> None:
    # finding (trusted2, 2026-11-27): check_certificate(text) with a certificate's JSON text instead of its path
    # raised a raw OSError (File name too long) from Path.is_file; a str is a path: a clear FileNotFoundError
    text = (PROOFS / "lora_bs1.json").read_text()
    with pytest.raises(FileNotFoundError, match="no certificate file at"):
        vm.check_certificate(text)


def test_recertify_wrote_a_certificate_before_its_recheck(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # finding (session 19): scripts/regen_proofs.py saved a re-made certificate over the committed one and only then
    # re-checked it, so a rejected certificate replaced a good one on disk; it is now checked first and not written
    import importlib.util

    spec = importlib.util.spec_from_file_location("regen_proofs", ROOT / "scripts" / "regen_proofs.py")
    assert spec is not None and spec.loader is not None
    regen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regen)
    path = tmp_path / "lora_bs1.json"
    path.write_text((PROOFS / "lora_bs1.json").read_text())
    before = path.read_bytes()
    seen: list[object] = []
    monkeypatch.setattr(vm, "check_certificate", lambda c, **kw: seen.append(c) or vm.Unknown("rejected (simulated)"))
    assert regen.recertify([path], 60.0) == 1
    assert seen and not isinstance(seen[0], (str, Path)), "the checker must see the certificate before it is written"
    assert path.read_bytes() == before
