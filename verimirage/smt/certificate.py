"""Equivalence certificates: emit, save, load, and re-check independently.

A certificate is versioned JSON holding the canonical text (and sha256) of the
input graph and of the μGraph, the rewrite rules the search applied, trusted
(unproved) user rules by name, the Z3 queries as SMT-LIB2 with expected result
and unsat core, the laws the normaliser used, the finite-field record (p, q, g,
seeds, trials, bound), optionally the sha256 of the generated Triton source it
vouches for, and tool versions.

:func:`check_certificate` uses only ``verimirage.ir`` and ``verimirage.smt``:
it re-parses both programs, checks the hashes, re-derives the abstract
expressions and the Z3 queries (their text must equal the stored text), re-runs
Z3 on the stored text *and* on its own derivation, re-runs the finite-field
trials from the stored seeds, and rejects unknown schema versions, unknown rule
names and any mismatch. It fails closed: anything it cannot confirm is
``Unknown("certificate rejected: ...")``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph
from .ff import ff_test
from .verdict import Check, Proved, Unknown, Verdict
from .verify import abstract_check, check_compatible, verify
from .z3enc import check_smt2

log = logging.getLogger(__name__)

SCHEMA = "verimirage-certificate/1"

#: Names of rewrite rules the checker accepts (each proved sound in the test suite). The rewrite
#: package's rule names are added here when they land; a name not here (and not listed as trusted)
#: makes a certificate invalid.
KNOWN_RULES: set[str] = set()


def register_rules(names: Iterable[str]) -> None:
    """Declare rewrite-rule names as known (proved sound in the tests) to the certificate checker."""
    for n in names:
        if not isinstance(n, str) or not re.match(r"^[A-Za-z0-9_.:\-]+$", n):
            raise ValueError(f"rule name {n!r}: expected letters, digits and _ . : -")
        KNOWN_RULES.add(n)


def sha256(text: str) -> str:
    """Hex sha256 of UTF-8 ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def tool_versions() -> dict[str, str]:
    """Versions of verimirage, z3, egglog and triton (from package metadata, without importing them)."""
    from .. import __version__

    return {"verimirage": __version__, "z3": _version("z3-solver"), "egglog": _version("egglog"),
            "triton": _version("triton")}


@dataclass
class Certificate:
    """A saved equivalence proof of ``graph`` ≡ ``mugraph`` (see the module docstring)."""

    graph_text: str
    graph_sha256: str
    mugraph_text: str
    mugraph_sha256: str
    rules: list[str]
    trusted_rules: list[str]
    queries: list[dict[str, Any]]
    laws: list[str]
    cases: list[Any]
    ff: dict[str, Any]
    triton_source_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    schema: str = SCHEMA

    def to_json(self) -> str:
        """The JSON text."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def save(self, path: str | Path) -> None:
        """Write the certificate to ``path`` (JSON)."""
        Path(path).write_text(self.to_json())

    @classmethod
    def from_json(cls, text: str) -> Certificate:
        """Read a certificate from JSON text; ValueError naming what is wrong."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"certificate: not JSON ({e})") from None
        if not isinstance(d, dict):
            raise ValueError("certificate: expected a JSON object")
        if d.get("schema") != SCHEMA:
            raise ValueError(f"certificate: unknown schema {d.get('schema')!r}; expected {SCHEMA!r}")
        names = set(cls.__dataclass_fields__)
        extra = sorted(set(d) - names)
        missing = sorted(n for n in names if n not in d and cls.__dataclass_fields__[n].default is not None
                         and n not in ("triton_source_sha256", "versions", "reason", "schema"))
        if extra or missing:
            raise ValueError(f"certificate: unknown fields {extra}, missing fields {missing}")
        return cls(**d)

    @classmethod
    def load(cls, path: str | Path) -> Certificate:
        """Read a certificate file."""
        return cls.from_json(Path(path).read_text())


def _queries_of(graph: Graph, mugraph: Graph, timeout_s: float) -> tuple[list[dict[str, Any]], list[str], list[Any]]:
    r = abstract_check(graph, mugraph, timeout_s=timeout_s)
    if r.outcome != "proved":
        raise GraphError(f"certificate: the abstract check does not prove the pair: {r.reason}")
    qs = [{"name": q.name, "smt2": q.smt2, "expected": q.expected, "core": list(q.core)} for q in r.queries]
    return qs, list(r.laws), json.loads(json.dumps(r.cases))


def make_certificate(
    graph: Graph, mugraph: Graph, verdict: Verdict, rules: Sequence[str] = (), trusted_rules: Sequence[str] = (),
    triton_source_hash: str | None = None, *, timeout_s: float = 10.0,
) -> Certificate:
    """The certificate of a Proved pair (GraphError for any other verdict)."""
    if not isinstance(verdict, Proved):
        raise GraphError(f"certificate: only a Proved pair gets a certificate; got {type(verdict).__name__}")
    ffc = next((c for c in verdict.evidence if c.name == "finite-field"), None)
    if ffc is None:
        raise GraphError("certificate: the verdict carries no finite-field record")
    if triton_source_hash is not None and not re.fullmatch(r"[0-9a-f]{64}", triton_source_hash):
        raise GraphError(f"certificate: triton_source_hash {triton_source_hash!r}; expected 64 hex digits (sha256)")
    gt, mt = str(graph), str(mugraph)
    queries, laws, cases = _queries_of(graph, mugraph, timeout_s)
    ff = {k: list(ffc.param(k)) if isinstance(ffc.param(k), tuple) else ffc.param(k)
          for k in ("p", "q", "g", "seeds", "trials", "per_trial_bound", "false_accept_bound")}
    return Certificate(gt, sha256(gt), mt, sha256(mt), list(rules), list(trusted_rules), queries, laws, cases, ff,
                       triton_source_hash, tool_versions(), verdict.reason)


def _reject(why: str, checks: list[Check]) -> Unknown:
    log.info("certificate rejected: %s", why)
    return Unknown(f"certificate rejected: {why}", tuple(checks))


def check_certificate(path: str | Path, *, triton_source: str | None = None, timeout_s: float = 10.0) -> Verdict:
    """Independently re-check a saved certificate; Proved, or Unknown naming the first mismatch."""
    t0 = time.perf_counter()
    checks: list[Check] = []
    try:
        cert = Certificate.load(path)
    except (OSError, ValueError, TypeError) as e:
        return _reject(str(e), checks)
    # hashes and programs
    if sha256(cert.graph_text) != cert.graph_sha256:
        return _reject("graph text does not match its sha256", checks)
    if sha256(cert.mugraph_text) != cert.mugraph_sha256:
        return _reject("mugraph text does not match its sha256", checks)
    try:
        g = Graph.parse(cert.graph_text)
        mg = MuGraph.parse(cert.mugraph_text)
        check_compatible(g, mg)
    except GraphError as e:
        return _reject(f"programs: {e}", checks)
    if str(g) != cert.graph_text or str(mg) != cert.mugraph_text:
        return _reject("program text is not canonical (print(parse(text)) != text)", checks)
    # rules
    if not all(isinstance(r, str) for r in list(cert.rules) + list(cert.trusted_rules)):
        return _reject("rule names must be strings", checks)
    unknown = sorted(set(cert.rules) - KNOWN_RULES - set(cert.trusted_rules))
    if unknown:
        return _reject(f"unknown rules {unknown} (neither known nor declared trusted)", checks)
    if cert.triton_source_sha256 is not None:
        if not isinstance(cert.triton_source_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}",
                                                                              cert.triton_source_sha256):
            return _reject("triton_source_sha256 is not a sha256 hex digest", checks)
        if triton_source is not None and sha256(triton_source) != cert.triton_source_sha256:
            return _reject("the Triton source does not match the certificate's hash", checks)
    checks.append(Check("hashes-and-rules", "proved", (("rules", tuple(cert.rules)),
                                                       ("trusted_rules", tuple(cert.trusted_rules))),
                        time.perf_counter() - t0))
    # abstract expressions and z3, from our own derivation and from the stored text
    t1 = time.perf_counter()
    try:
        queries, laws, cases = _queries_of(g, mg, timeout_s)
    except GraphError as e:
        return _reject(str(e), checks)
    if len(queries) != len(cert.queries):
        return _reject(f"{len(cert.queries)} stored queries; the re-derivation gives {len(queries)}", checks)
    for mine, stored in zip(queries, cert.queries, strict=True):
        if not isinstance(stored, dict) or stored.get("expected") != "unsat":
            return _reject(f"query {stored!r:.80}: expected result must be 'unsat'", checks)
        if mine["name"] != stored.get("name") or mine["smt2"] != stored.get("smt2"):
            return _reject(f"query {stored.get('name')!r} differs from the re-derived query", checks)
        if check_smt2(str(stored["smt2"]), timeout_s) != "unsat":
            return _reject(f"query {stored['name']!r}: the stored SMT-LIB2 is not unsat", checks)
        if sorted(mine["core"]) != sorted(stored.get("core", [])):
            return _reject(f"query {stored['name']!r}: unsat core differs", checks)
    if sorted(laws) != sorted(cert.laws) or cases != cert.cases:
        return _reject("laws or cases differ from the re-derivation", checks)
    checks.append(Check("abstract-z3", "proved", (("queries", tuple(q["name"] for q in queries)),
                                                  ("laws", tuple(laws))), time.perf_counter() - t1))
    # finite field from the stored seeds
    t2 = time.perf_counter()
    ff = cert.ff
    try:
        seeds = [int(s) for s in ff["seeds"]]
        r = ff_test(g, mg, seeds=seeds)
    except (KeyError, TypeError, ValueError) as e:
        return _reject(f"finite-field record: {e}", checks)
    if r.outcome != "equal":
        return _reject(f"finite-field re-run: {r.reason}", checks)
    if [list(r.p), list(r.q), list(r.g), r.trials] != [ff.get("p"), ff.get("q"), ff.get("g"), ff.get("trials")]:
        return _reject("finite-field record (p, q, g, trials) does not match the stored seeds", checks)
    if not isinstance(ff.get("false_accept_bound"), float) or abs(r.bound - ff["false_accept_bound"]) > 1e-12 * max(
        r.bound, 1e-300
    ) or r.bound > 2.0**-60:
        return _reject(f"finite-field bound {ff.get('false_accept_bound')!r} does not match {r.bound!r}", checks)
    checks.append(Check("finite-field", "proved", (("seeds", tuple(seeds)), ("false_accept_bound", r.bound)),
                        time.perf_counter() - t2))
    trusted = f"; trusts unproved rules {cert.trusted_rules}" if cert.trusted_rules else ""
    return Proved(f"certificate checked: hashes, {len(queries)} z3 queries, {r.trials} finite-field trials{trusted}",
                  tuple(checks))


def certify(graph: Graph, mugraph: Graph, rules: Sequence[str] = (), trusted_rules: Sequence[str] = (),
            triton_source_hash: str | None = None) -> Certificate:
    """Verify the pair and return its certificate (GraphError if it is not Proved)."""
    v = verify(graph, mugraph)
    return make_certificate(graph, mugraph, v, rules, trusted_rules, triton_source_hash)


def regenerate_proofs(
    directory: str | Path, make_candidate: Callable[[str, int], tuple[Graph, Graph, Sequence[str]]],
    names: Sequence[str] | None = None, batches: Sequence[int] = (1, 8),
) -> list[Path]:
    """Write ``<name>_bs<batch>.json`` for every suite program: ``make_candidate(name, batch)`` returns
    ``(graph, mugraph, rules)`` (e.g. from ``vm.superoptimize(...).best``)."""
    from ..benchmarks import suite

    out = []
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name in names or suite.names():
        for b in batches:
            g, mg, rules = make_candidate(name, b)
            cert = certify(g, mg, rules)
            p = d / f"{name}_bs{b}.json"
            cert.save(p)
            out.append(p)
    return out
