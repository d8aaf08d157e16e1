"""On-disk cache of search results, so a second ``superoptimize`` of the same graph is served at once.

Entries live under ``$VERIMIRAGE_CACHE_DIR/search`` (default
``~/.cache/verimirage/search``), one JSON file per key, written atomically
(:mod:`verimirage.backend.cache`, which imports neither torch nor triton).
The key covers the graph's canonical text (so shapes and dtypes), every
search option that changes the result, the versions of verimirage, z3,
egglog and triton, and a digest of verimirage's own code that decides a
search result (:func:`code_digest`: the ``.py`` files of ``ir``, ``rewrite``,
``smt`` and ``pipeline``, and the backend's launch model), so a change to the cost model, the partitioner or a rule is a
miss even when the version number stays the same. An entry holds, per candidate, the μGraph text, cost,
rules and certificate, plus a SHA-256 of all of it.

Nothing read from an entry is trusted. On read, before anything is served:
the checksum; that each μGraph parses, passes the IR checks and is in
canonical text form; that each certificate's programs are exactly the
requesting graph and that μGraph (by text, not by a stored hash); that each
served candidate's cost is what the search's cost model gives; and the
independent certificate checker (:func:`verimirage.pipeline.certificates.check_certificate`,
re-deriving everything from the two programs) re-checks the certificate of
every candidate that is served (in this process where both programs' evaluations
are small, :data:`IN_PROCESS_ELEMENTS`; else in its capped checker process), and the search's floating-point check
(:mod:`verimirage.pipeline.fpsafe`: a certificate is about the reals) runs on
it again. The checksum is unkeyed, so it only catches accidents; the re-check
is what stops a tampered entry. A corrupt, truncated, mismatching or tampered
entry is reported (a warning naming the entry and why), removed, and the search
runs again; it is never served and never an exception to the caller.

Which candidates are re-checked and served (:func:`load`'s ``recheck``):
``"all"`` re-checks and serves every cached candidate; ``"best"`` (the default
of ``vm.superoptimize``) re-checks the best one only and serves it alone, since
a certificate re-check of a full-size candidate costs about as much as the
verification part of a search (measured in ``benchmarks/results/search_cache_recheck.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..ir.graph import Graph, MuGraph

log = logging.getLogger(__name__)

FORMAT = "verimirage.search-cache/1"


def _store() -> Any:
    from ..backend.cache import DiskCache

    return DiskCache("search")


#: Subpackages (and modules) of verimirage whose code decides what a search returns (lifting, rules, saturation,
#: extraction, cost model and the launch model it asks, partitioner, verifier, certificates, the search driver and
#: its floating-point check, and the IR they all share).
CODE_PACKAGES = ("ir", "rewrite", "smt", "pipeline", "backend/launch_model.py")


def code_files() -> list[tuple[str, Path]]:
    """The files :func:`code_digest` hashes: (path relative to the package, path), sorted."""
    root = Path(__file__).resolve().parent.parent
    return sorted((p.relative_to(root).as_posix(), p) for pkg in CODE_PACKAGES
                  for p in ([root / pkg] if pkg.endswith(".py") else (root / pkg).rglob("*.py")))


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    h = hashlib.sha256()
    for rel, p in code_files():
        data = p.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def code_digest() -> str:
    """SHA-256 of the ``.py`` sources of :data:`CODE_PACKAGES` (relative path and bytes, sorted by path).

    Computed once per process; part of every :func:`cache_key`.
    """
    return _code_digest()


def entry_path(key: str) -> Path:
    """The file that holds (or would hold) the entry of ``key``."""
    return Path(_store().path(key))


def cache_key(graph: Graph, options: dict[str, Any]) -> str:
    """The cache key of a search of ``graph`` with ``options`` (JSON-able values)."""
    from ..backend.cache import key_of
    from ..smt.certify import tool_versions

    return key_of({"format": FORMAT, "graph": str(graph), "options": options, "versions": tool_versions(),
                   "code": code_digest()})


def _checksum(cands: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(cands, sort_keys=True).encode()).hexdigest()


def save(key: str, result: Any) -> None:
    """Store a SearchResult's candidates under ``key`` (only candidates with certificates are kept)."""
    cands = []
    for c in result.candidates:
        if c.certificate is None:
            return  # nothing is cached that could not be re-checked
        cands.append(
            {
                "mugraph": str(c.mugraph),
                "cost": dataclasses.asdict(c.cost),
                "rules": list(c.rules),
                "graph": None if c.graph is None else str(c.graph),
                "certificate": c.certificate.to_json(),
                "verdict_reason": c.verdict.reason,
            }
        )
    _store().put(key, {"format": FORMAT, "candidates": cands, "sha256": _checksum(cands),
                       "report": str(result.report)})


def load(key: str, graph: Graph, *, recheck: str = "all", cost_of: Callable[[MuGraph], Any] | None = None,
         fp_check: Callable[[MuGraph], str | None] | None = None) -> Any | None:
    """The cached SearchResult for ``key``, or None (a miss, or a bad entry reported, removed and ignored).

    ``recheck``: ``"all"`` (re-check every candidate's certificate and serve them all) or ``"best"``
    (re-check and serve the best candidate only). Every served candidate's certificate has just re-checked
    against ``graph`` and names exactly the served μGraph. ``cost_of`` (the search's cost model): each served
    candidate's stored cost must be what it gives (a cost edited to reorder candidates is a bad entry).
    ``fp_check`` (default: :class:`verimirage.pipeline.fpsafe.SafetyChecker` of ``graph``, seed 0): each served
    candidate must be finite wherever ``graph`` is, as the search requires of what it returns (a certificate
    proves equality over the reals only: an unstabilised softmax re-checks, then overflows).
    """
    if recheck not in ("all", "best"):
        raise ValueError(f"search cache: recheck={recheck!r}; expected 'all' or 'best'")
    store = _store()
    entry = store.get(key)
    if entry is None:
        return None
    try:
        return _rebuild(entry, graph, recheck, cost_of, fp_check)
    except Exception as e:  # anything wrong with an entry is a miss, never the caller's exception
        log.warning("search cache entry %s rejected and removed (%s: %s); searching again", key[:16],
                    type(e).__name__, (str(e).splitlines() or [""])[0][:300])
        try:
            store.path(key).unlink(missing_ok=True)
        except OSError as e2:  # pragma: no cover - a read-only cache directory
            log.warning("search cache entry %s could not be removed (%s)", key[:16], e2)
        return None


#: the most elements (all arrays of both programs' evaluations together, :func:`~verimirage.ir.reference.
#: evaluation_elements`) a cached certificate may need for its re-check to run in this process, without the checker
#: process's memory cap: 2**24 (256 MiB of finite-field values per trial)
IN_PROCESS_ELEMENTS = 1 << 24


def _recheck(cert: Any, programs: tuple[Graph, MuGraph]) -> Any:
    """The independent checker's verdict on ``cert`` (written to a private temporary file first), about
    ``programs`` (the requested graph and the cached μGraph, which its texts name)."""
    import tempfile

    from ..checkcall import DEFAULT_SECONDS, SECONDS_ENV, limit
    from ..ir.reference import evaluation_elements
    from ..smt import budget as B
    from .certificates import check_certificate

    # in this process (a child process's start-up would cost more than a small search) only where the evaluations
    # are small: the checker reads no verifier state, but here it has no memory cap, and a tampered entry's μGraph
    # (one array of 2**30 elements: 16 GiB a trial) took the caller's memory instead of being rejected
    small = sum(evaluation_elements(p) for p in programs) <= IN_PROCESS_ELEMENTS
    with tempfile.TemporaryDirectory(prefix="vm-recheck-") as tmp:
        p = Path(tmp) / "certificate.json"
        cert.save(p)
        if not small:  # (the checker process: capped in memory and time)
            return check_certificate(p)
        # its derivations get the checker process's time cap ($VERIMIRAGE_CHECK_SECONDS) as a budget (a tampered
        # entry's μGraph with a long loop of one-element tiles derives in time quadratic in the loop: 65,536 steps
        # were hours, uncapped)
        token = B.set_budget(limit(None, SECONDS_ENV, DEFAULT_SECONDS))
        try:
            return check_certificate(p, isolate=False)
        finally:
            B.reset_budget(token)


def _rebuild(entry: Any, graph: Graph, recheck: str, cost_of: Callable[[MuGraph], Any] | None = None,
             fp_check: Callable[[MuGraph], str | None] | None = None) -> Any:
    from ..rewrite.cost import Cost, KernelCost
    from ..smt.certify import read_certificate
    from ..smt.verdict import Check, Outcome, Proved
    from .options import StopReason
    from .superopt import Candidate, SearchReport, SearchResult

    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise ValueError("not a search-cache entry of this format")
    cands_d = entry["candidates"]
    if not isinstance(cands_d, list) or not cands_d:
        raise ValueError("no candidates")
    if _checksum(cands_d) != entry["sha256"]:
        raise ValueError("checksum mismatch")
    gtext = str(graph)
    parsed = []
    for i, d in enumerate(cands_d):
        mg = MuGraph.parse(d["mugraph"])
        mtext = str(mg)
        if mtext != d["mugraph"]:
            raise ValueError(f"candidate {i}: the μGraph text is not canonical")
        cert = read_certificate(d["certificate"])  # (a search by regions: a composed certificate)
        if cert.graph_text != gtext:
            raise ValueError(f"candidate {i}: the certificate is not about the requested graph")
        if cert.mugraph_text != mtext:
            raise ValueError(f"candidate {i}: the certificate does not name the cached μGraph")
        rules = d["rules"]
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError(f"candidate {i}: rules must be a list of names")
        parsed.append((d, mg, cert))
    served = parsed if recheck == "all" else parsed[:1]
    out = []
    for i, (d, mg, cert) in enumerate(served):
        cd = dict(d["cost"])
        cd["kernels"] = tuple(KernelCost(**k) for k in cd.get("kernels", ()))
        cost = Cost(**cd)
        if cost_of is not None and dataclasses.asdict(cost_of(mg)) != dataclasses.asdict(cost):
            raise ValueError(f"candidate {i}: the stored cost is not the cost model's")
        v = _recheck(cert, (graph, mg))
        if not isinstance(v, Proved):
            raise ValueError(f"candidate {i}: the certificate does not re-check ({v.reason})")
        if fp_check is None:
            from .fpsafe import SafetyChecker

            fp_check = SafetyChecker(graph).check
        unsafe = fp_check(mg)  # (the certificate is about the reals: the search's floating-point check again)
        if unsafe is not None:
            raise ValueError(f"candidate {i}: re-checks, but {unsafe}")
        checks: tuple[Check, ...] = (Check("search-cache", Outcome.PROVED, (("entry_sha256", entry["sha256"]),)),
                                     *tuple(v.evidence))
        verdict = Proved(f"served from the search cache, certificate re-checked ({v.reason}); "
                         f"the search said: {d['verdict_reason']}", checks)
        g2 = Graph.parse(d["graph"]) if d.get("graph") else None
        out.append(Candidate(mg, cost, verdict, cert, tuple(d["rules"]), g2))
    rep = SearchReport()
    rep.stop(StopReason.CACHED)
    rep.verified = len(out)
    if len(out) < len(parsed):
        rep.notes.append(f"{len(parsed) - len(out)} more cached candidate(s) not served: only the best one was "
                         "re-checked (superoptimize(..., recheck_cache=True) re-checks and serves all)")
    rep.notes.append("cache hit, every served certificate re-checked; the original search said:\n"
                     + str(entry.get("report", "")))
    return SearchResult(out, rep)
