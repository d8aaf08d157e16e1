"""Equivalence certificates: emit, save, load, and re-check independently.

A certificate (schema :data:`SCHEMA`) is versioned JSON holding the canonical text (and sha256) of the
input graph and of the μGraph, the rewrite rules the search applied, trusted (unproved) user rules by
name, the Z3 queries as SMT-LIB2 with expected result and unsat core, the laws the normaliser used,
the finite-field record (:func:`ff_record`: trial count, seeds derived from the certificate's content,
the fields they give, the per-trial and false-accept bounds), optionally the sha256 of the Triton module
that ``vm.compile`` runs by default for the μGraph, and tool versions.

:func:`check_text` is the independent second opinion (``vm.check_certificate``). It runs in a child process
(:func:`verimirage.checkcall.check_certificate` starts it) under a memory
and a time cap (any blow-up is a rejection, never a crash), in which the verifier's modules (the fast
finite-field engine, ``verify``, the search, the backend) cannot be imported: it uses only the IR, the
abstract-expression derivation with its Z3 encoding, and the reference finite-field evaluator
(:mod:`verimirage.smt.ffref`). It re-parses both programs, checks the hashes, re-derives the abstract
expressions and the Z3 queries (their text must equal the stored text) and has Z3 prove each, recomputes
the finite-field record from the two programs (the seeds are a hash of the content, so they cannot be
chosen, repeated or reused) and runs those trials, comparing every output element. Then the calling side
(:mod:`verimirage.checkcall`, which cannot make a Proved: :func:`verdict_of`, :func:`confirmed`) regenerates the
Triton module from the μGraph and compares its hash. It rejects unknown schema versions, unknown rule names and
any mismatch, and fails closed: anything it cannot confirm is ``Unknown("certificate rejected: ...")``. A missing
file: FileNotFoundError; not a JSON object: :class:`CertificateError`. By regions: :class:`ComposedCertificate`.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, input_types, output_types
from ..ir.text import read_program
from . import abstract as A
from . import defined as D
from . import expr as E
from . import ffref, glue, limits
from .verdict import Check, Outcome, Proved, Unknown, Verdict

if TYPE_CHECKING:
    from .reading import DocMethods
else:  # (writing, loading a file: :mod:`.reading` puts them on _Doc; the checker's process reads text, never a file)
    DocMethods = object

log = logging.getLogger(__name__)

SCHEMA = "verimirage-certificate/2"
#: the schema of a certificate by regions (:class:`ComposedCertificate`)
COMPOSED_SCHEMA = "verimirage-composed-certificate/1"

#: how the checker runs the finite-field trials (part of what the seeds are derived from)
FF_METHOD = "verimirage.smt.ffref: every output element compared; seeds from sha256 of the content"
#: the most finite-field trials a certificate may ask for
MAX_TRIALS = 64


class CertificateError(GraphError):
    """A certificate that cannot be read at all: an unreadable file, text that is not a JSON object."""


def sha256(text: str) -> str:
    """Hex sha256 of UTF-8 ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


class _Doc(DocMethods):
    """The two kinds of certificate's base (a dataclass with a ``schema`` field). Reading with each field's type checked
    and named, writing, files: :mod:`.reading` puts them on it; the checker reads with :func:`_read`."""


def _read(text: str) -> Certificate | ComposedCertificate:
    """The certificate, of the kind its schema names, in JSON ``text`` as the checker reads it: an error for a missing,
    unknown or extra field, or one of another kind than its annotation's. Elements are not checked here: each field is
    compared with what the checker re-derives, and any error is a rejection (:meth:`_Doc.from_json` names it)."""
    d = json.loads(text)
    kind = {SCHEMA: Certificate, COMPOSED_SCHEMA: ComposedCertificate}.get(d.get("schema"))
    if kind is None:
        raise ValueError(f"certificate: unknown schema {d.get('schema')!r}; expected {SCHEMA!r} or {COMPOSED_SCHEMA!r}")
    for f in fields(kind):  # (a field of another kind than its annotation's is a rejection: fail closed)
        t = type(d.get(f.name)).__name__.replace("NoneType", "None")
        if f.name in d and t not in f.type.split("[")[0].split(" | "):
            raise ValueError(f"certificate: field {f.name!r} is a {t}; expected {f.type}")
    return kind(**d)  # type: ignore[return-value]


@dataclass
class Certificate(_Doc):
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



@dataclass
class ComposedCertificate(_Doc):
    """``graph`` ≡ ``mugraph`` by regions (:mod:`.glue`): ``certificates`` (:class:`Certificate` dicts) of region
    graph ≡ region μGraph; ``regions``, in splice order, each region's ``nodes``, the ``inputs``/``outputs`` it
    reads/makes (refs) and its ``certificate``'s index. The μGraph is the regions' μGraphs spliced."""

    graph_text: str
    graph_sha256: str
    mugraph_text: str
    mugraph_sha256: str
    regions: list[dict[str, Any]]
    certificates: list[dict[str, Any]]
    triton_source_sha256: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    schema: str = COMPOSED_SCHEMA


# --------------------------------------------------------------------------- the finite-field record


def derive_seeds(graph_text: str, mugraph_text: str, trials: int) -> tuple[int, ...]:
    """A certificate's finite-field trial seeds: ``trials`` distinct ints in ``[0, 2**62)`` from the sha256 of
    the schema, the trial method, both programs' canonical text and the trial count."""
    base = sha256(json.dumps([SCHEMA, FF_METHOD, graph_text, mugraph_text, trials]))
    seeds: list[int] = []
    i = 0
    while len(seeds) < trials:
        s = int(sha256(f"{base}:{i}"), 16) >> 194  # the top 62 bits
        i += 1
        if s not in seeds:
            seeds.append(s)
    return tuple(seeds)


def ff_record(graph: Graph, mugraph: Graph) -> dict[str, Any]:
    """The finite-field record of the pair's certificate (a function of the two programs only): enough
    trials of the reference evaluator for a false-accept bound of at most ``2**-60``, their seeds
    (:func:`derive_seeds`) and fields, and the bounds. GraphError when no bound is meaningful."""
    per = ffref.per_trial_bound(graph, mugraph)
    n = ffref.trials_needed(per)
    if not 1 <= n <= MAX_TRIALS:
        raise GraphError(f"certificate: the per-trial bound {per:.3g} needs {n} trials; expected 1..{MAX_TRIALS}")
    seeds = derive_seeds(str(graph), str(mugraph), n)
    fields = [ffref.field_of(s) for s in seeds]
    return {"method": FF_METHOD, "trials": n, "seeds": list(seeds), "p": [f.p for f in fields],
            "q": [f.q for f in fields], "g": [f.g for f in fields], "per_trial_bound": per,
            "false_accept_bound": per**n}


# --------------------------------------------------------------------------- checking


class _Reject(Exception):
    """A mismatch: the certificate is rejected with this reason."""


def _programs(cert: Certificate | ComposedCertificate) -> tuple[Graph, Graph]:
    """Both programs, parsed from canonical text matching its hash, with the same inputs and outputs."""
    if sha256(cert.graph_text) != cert.graph_sha256:
        raise _Reject("graph text does not match its sha256")
    if sha256(cert.mugraph_text) != cert.mugraph_sha256:
        raise _Reject("mugraph text does not match its sha256")
    try:  # (each program read, checked, and printed back to its text)
        g, mg = read_program(cert.graph_text, False), read_program(cert.mugraph_text, True)
    except Exception as e:  # (a text read otherwise than as canonical text of a well-formed program)
        raise _Reject(f"programs: {e if isinstance(e, GraphError) else type(e).__name__}") from None
    ins = [[(k, str(t)) for k, t in input_types(x).items()] for x in (g, mg)]  # (in order: called positionally)
    outs = [[str(t) for t in output_types(x)] for x in (g, mg)]
    if ins[0] != ins[1] or outs[0] != outs[1]:
        raise _Reject(f"the programs' inputs {ins} or outputs {outs} differ (names, order, shapes, dtypes)")
    return g, mg


def _check_abstract(g: Graph, mg: Graph, cert: Certificate, timeout_s: float) -> tuple[str, ...]:
    """Re-derive both programs' abstract expressions per output and case (the μGraph must refine the graph:
    defined wherever it is), build each stored query from them (``...:fubini``: from their nested sums in
    canonical order) and have Z3 prove it; the names of the queries."""
    from . import z3enc  # (z3 is imported by the checking process only)

    cases, ((ea, la, da), (eb, lb, db)) = A.derive_all([g, mg])
    undefined = D.refines_outputs(da, db)  # the μGraph must be defined wherever the graph is
    if undefined is not None:
        raise _Reject(f"definedness: {undefined}")
    laws = set(la | lb)
    want = [(k, ci) for k, xs in enumerate(ea) for ci in range(len(xs))]
    stored = cert.queries
    if len(stored) != len(want):
        raise _Reject(f"{len(stored)} stored queries; the re-derivation has {len(want)} outputs and cases")
    names = []
    for (k, ci), st in zip(want, stored, strict=True):
        if sorted(st) != ["core", "expected", "name", "smt2"]:
            raise _Reject(f"query {st!r:.80}: expected the fields core, expected, name, smt2")
        name = f"eq:out{k}:case{ci}"
        x, y = ea[k][ci], eb[k][ci]
        if st["name"] == name + ":fubini":
            (x, lx), (y, ly) = E.canon_sums(x), E.canon_sums(y)
            laws |= lx | ly
            name = st["name"]
        elif st["name"] != name:
            raise _Reject(f"query {st['name']!r}: expected {name!r} (or {name + ':fubini'!r})")
        q = z3enc.equivalence_query(name, x, y, timeout_s=timeout_s)
        if st["expected"] != "unsat" or st["smt2"] != q.smt2:
            raise _Reject(f"query {name!r} differs from the re-derived query")
        if q.result != "unsat":
            raise _Reject(f"query {name!r}: z3 says {q.result}, not unsat")
        if not isinstance(st["core"], list) or sorted(map(str, st["core"])) != sorted(q.core):
            raise _Reject(f"query {name!r}: unsat core differs")
        names.append(name)
    if sorted(cert.laws) != sorted(laws):
        raise _Reject("laws differ from the re-derivation")
    if json.dumps(cert.cases) != json.dumps(cases):  # (as JSON text: 1.0 is not 1)
        raise _Reject("cases differ from the re-derivation")
    return tuple(names)


def _check_ff(g: Graph, mg: Graph, cert: Certificate) -> ffref.RefResult:
    """Recompute the finite-field record from the programs (it must equal the stored one) and run its trials."""
    want = ff_record(g, mg)
    if json.dumps(cert.ff, sort_keys=True) != json.dumps(want, sort_keys=True):  # (as JSON text: 1.0 is not 1)
        bad = sorted(k for k in set(want) | set(cert.ff) if cert.ff.get(k) != want.get(k))
        raise _Reject(f"finite-field record: {bad} differ from the checker's (seeds and bound come from the "
                      f"content; the bound needs {want['trials']} trials of method {FF_METHOD!r})")
    r = ffref.ref_test(g, mg, want["seeds"])
    if r.outcome == Outcome.REFUTED and "log" in ffref.ops_in(g) | ffref.ops_in(mg):
        # log's p-part is a random function, its q-part exp's inverse: compare in the q-world (as vm.verify)
        rq = ffref.ref_test(g, mg, want["seeds"], part="q")
        r = rq if rq.outcome == Outcome.PROVED else r
    if r.outcome != Outcome.PROVED:
        raise _Reject(f"finite-field re-run: {r.reason}")
    return r


def _check_composed(cc: ComposedCertificate, known: frozenset[str], timeout_s: float, checks: list[Check]) -> Verdict:
    """A certificate by regions: the regions partition the program's live ops, each region's recorded wiring
    is the one re-derived from the program, each sub-certificate checks and is about its region's graph, and
    the μGraph is the regions' μGraphs spliced in order (so it is the program's function, by congruence)."""
    t0 = time.perf_counter()
    g, _ = _programs(cc)
    regs, subs = cc.regions, cc.certificates
    if not (regs and all(sorted(r) == ["certificate", "inputs", "nodes", "outputs"] for r in regs)):
        raise _Reject("regions: expected a non-empty list of {nodes, inputs, outputs, certificate}")
    flat = [i for r in regs for i in (r["nodes"] if isinstance(r["nodes"], list) and r["nodes"] else [None])]
    if not all(type(i) is int for i in flat) or len(flat) != len(set(flat)) or set(flat) != glue.live_ops(g):
        raise _Reject("the regions' nodes do not partition the program's live ops")
    cis = [r["certificate"] for r in regs]
    if not all(type(c) is int for c in cis) or set(cis) != set(range(len(subs))):
        raise _Reject(f"each of the {len(subs)} sub-certificates must be some region's (indices 0..{len(subs) - 1})")
    done: dict[int, tuple[Certificate, Verdict]] = {}
    regions, mugraphs = [], []
    for k, r in enumerate(regs):
        reg, ci = glue.region_of(g, r["nodes"]), r["certificate"]
        if json.dumps([r["inputs"], r["outputs"]]) != json.dumps([reg.inputs, reg.outputs]):  # (1.0, true: not 1)
            raise _Reject(f"region {k}: its wiring (inputs, outputs) is not the one its nodes have in the program")
        if ci not in done:
            if subs[ci].get("schema") != SCHEMA:
                raise _Reject(f"sub-certificate {ci}: expected a {SCHEMA!r} certificate")
            t1, sub_checks = time.perf_counter(), []  # type: ignore[var-annotated]
            try:
                v = _check(json.dumps(subs[ci]), known, timeout_s, sub_checks)
            except _Reject as e:
                raise _Reject(f"sub-certificate {ci}: {e}") from None
            done[ci] = (_read(json.dumps(subs[ci])), v)  # type: ignore[assignment]
            checks.append(Check(f"sub-certificate {ci}", Outcome.PROVED, (("reason", v.reason),),
                                time.perf_counter() - t1))
        sub = done[ci][0]
        if sub.graph_text != str(reg.graph):
            raise _Reject(f"region {k}: sub-certificate {ci} is about another program than the region's graph")
        if sub.triton_source_sha256 is not None:
            raise _Reject(f"sub-certificate {ci}: records a Triton hash (a region's module is not what runs)")
        regions.append(reg)
        mugraphs.append(read_program(sub.mugraph_text, True))  # (checked by _check: canonical)
    why = glue.undefined_fed(g, regions)
    if why is not None:
        raise _Reject(f"a value one region makes and another reads may be undefined ({why}): the splice may read "
                      "values the program leaves undefined")
    try:
        composed = str(glue.compose(g, regions, mugraphs))
    except (KeyError, GraphError) as e:
        raise _Reject(f"the regions' μGraphs cannot be spliced in this order ({type(e).__name__}: {e})") from None
    if composed != cc.mugraph_text:
        raise _Reject("the μGraph is not the regions' μGraphs spliced by the glue")
    trusted = sorted({t for c, _ in done.values() for t in c.trusted_rules})
    checks.append(Check("glue", Outcome.PROVED, (("regions", len(regs)), ("live_ops", len(flat))),
                        time.perf_counter() - t0))
    return Proved(f"composed certificate checked: {len(regs)} regions partition the {len(flat)} live ops, their "
                  f"wiring re-derived, the μGraph is their splice; {len(subs)} sub-certificates checked (union "
                  f"per-node model bound {sum(c.ff['false_accept_bound'] for c, _ in done.values()):.2g})"
                  + (f"; trusts unproved rules {trusted}" if trusted else ""), tuple(checks))


def _check(text: str, known: frozenset[str], timeout_s: float, checks: list[Check]) -> Verdict:
    t0 = time.perf_counter()
    try:
        cert = _read(text)
    except (ValueError, TypeError, AttributeError) as e:
        raise _Reject(str(e)) from None
    if isinstance(cert, ComposedCertificate):
        return _check_composed(cert, known, timeout_s, checks)
    g, mg = _programs(cert)
    unknown = sorted(set(cert.rules) - known - set(cert.trusted_rules))
    if unknown:
        raise _Reject(f"unknown rules {unknown} (neither known nor declared trusted)")
    checks.append(Check("hashes-and-rules", Outcome.PROVED, (("rules", tuple(cert.rules)),
                                                       ("trusted_rules", tuple(cert.trusted_rules))),
                        time.perf_counter() - t0))
    def timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        t = time.perf_counter()
        return fn(*args), time.perf_counter() - t

    # both parts run at once (the trials' numpy and Z3 release the GIL); each must pass, the Z3 part's
    # rejection is reported first, and the `with` waits for the trials whatever happens
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="vm-check-ff") as pool:
        ff = pool.submit(timed, _check_ff, g, mg, cert)
        names, t_abs = timed(_check_abstract, g, mg, cert, timeout_s)
        r, t_ff = ff.result()
    checks.append(Check("abstract-z3", Outcome.PROVED, (("queries", names), ("laws", tuple(cert.laws))), t_abs))
    checks.append(Check("finite-field", Outcome.PROVED, (("seeds", r.seeds), ("trials", len(r.seeds)),
                                                   ("per_trial_bound", r.per_trial_bound),
                                                   ("false_accept_bound", r.bound), ("method", FF_METHOD),
                                                   ("stated_bound", r.bound if ffref.states_probability(g)
                                                    and ffref.states_probability(mg) else None)), t_ff))
    trusted = f"; trusts unproved rules {cert.trusted_rules}" if cert.trusted_rules else ""
    return Proved(f"certificate checked: hashes, {len(names)} z3 queries, {len(r.seeds)} finite-field trials "
                  f"(reference evaluator, per-node model bound {r.bound:.2g}){trusted}", tuple(checks))


def _reject(why: str, checks: Sequence[Check] = ()) -> Unknown:
    log.info("certificate rejected: %s", why)
    return Unknown(f"certificate rejected: {why}", tuple(checks))


def check_text(text: str, known: Iterable[str] | None = None, timeout_s: float = 10.0) -> Verdict:
    """Check a certificate's JSON text in this process (what the checker process runs: :func:`_verdict`), on a thread
    with a deep stack (:func:`.deep.deep_call`); ``known``: the rule names accepted (the checker process is sent them;
    default, outside it: :func:`.certify.known_rules`). Fails closed: any error is a rejection."""
    from .deep import deep_call  # (the checker process makes its own deep-stack thread: :func:`_child_main`)

    if known is None:
        from .certify import known_rules  # (the rule names are provenance: the proof is re-derived without them)

        known = known_rules()
    try:
        _Doc.from_json(text)  # (each field's type, named (:mod:`.reading`); the check only compares them)
    except (ValueError, TypeError, RecursionError) as e:  # (JSON nested too deep: RecursionError)
        return _reject(str(e))
    return deep_call(_verdict, text, frozenset(known), timeout_s)


def _verdict(text: str, known: frozenset[str], timeout_s: float) -> Verdict:
    """The check of :func:`check_text` (on a thread with a deep stack), failing closed: any error is a rejection."""
    checks: list[Check] = []
    try:
        return _check(text, known, timeout_s, checks)
    except _Reject as e:
        return _reject(str(e), checks)
    except Exception as e:  # anything unforeseen (a blow-up, a bug) rejects; never a crash, never Proved
        return _reject(f"the check failed: {type(e).__name__}: {str(e)[:300]}", checks)


def _child_main() -> None:
    """The checker process: read the request from stdin, cap memory, check on one thread with a deep stack
    (:mod:`.limits`: the derivation recurses per op), write the verdict as JSON."""
    import resource
    import threading

    req = json.loads(sys.stdin.read())
    mb = int(req["memory_mb"])
    if mb > 0:
        resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
    got: list[Verdict] = []  # (empty if the thread dies: no verdict is written, the calling side rejects)
    sys.setrecursionlimit(limits.MAX_DEPTH)
    threading.stack_size(limits.STACK_BYTES)  # (for this one thread: the trials' threads get the default)
    t = threading.Thread(target=lambda: got.append(_verdict(req["certificate"], frozenset(req["known_rules"]),
                                                            float(req["timeout_s"]))))
    t.start()
    threading.stack_size(0)
    t.join()
    v = got[0]
    ev = [[c.name, c.outcome, [[k, list(x) if isinstance(x, tuple) else x] for k, x in c.params], c.seconds,
           c.detail] for c in v.evidence]
    sys.stdout.write("\n" + json.dumps({"proved": v.proved, "reason": v.reason, "evidence": ev,
                                        "sha256": sha256(req["certificate"])}) + "\n")


def verdict_of(stdout: str, text: str) -> Verdict | None:
    """The checker process's verdict (the last line of its ``stdout``) on the certificate ``text``; None when it wrote
    none. The process names the sha256 of the text it checked: an answer about any other text is a rejection (what it
    was sent, and how, is the calling side's, :mod:`verimirage.checkcall`, which cannot make a Proved)."""
    try:
        out = json.loads(stdout.rstrip().rsplit("\n", 1)[-1])
        ev = tuple(Check(n, o, tuple((k, tuple(x) if isinstance(x, list) else x) for k, x in ps), s, d)
                   for n, o, ps, s, d in out["evidence"])
        proved, reason, about = out["proved"] is True, str(out["reason"]), out.get("sha256")
    except (ValueError, IndexError, KeyError, TypeError):
        return None
    if about != sha256(text):
        return _reject("the checker process answered about another certificate text", ev)
    return (Proved if proved else Unknown)(reason, ev)


def confirmed(v: Verdict, how: str, check: Check) -> Verdict:
    """``v`` with one more confirmation of the calling side (a Triton module regenerated and matched, ``check``):
    Proved only where ``v`` is (the calling side narrows a verdict, it never makes one)."""
    return Proved(v.reason + how, (*v.evidence, check)) if v.proved else v
