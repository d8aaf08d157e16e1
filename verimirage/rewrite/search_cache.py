"""On-disk cache of search results, so a second ``superoptimize`` of the same graph is served at once.

Entries live under ``$VERIMIRAGE_CACHE_DIR/search`` (default
``~/.cache/verimirage/search``), one JSON file per key, written atomically
(:mod:`verimirage.backend.cache`, which imports neither torch nor triton).
The key covers the graph's canonical text (so shapes and dtypes), every
search option that changes the result, the versions of verimirage, z3,
egglog and triton, and a digest of verimirage's own code that decides a
search result (:func:`code_digest`: the ``.py`` files of ``ir``, ``rewrite``
and ``smt``), so a change to the cost model, the partitioner or a rule is a
miss even when the version number stays the same. An entry holds, per candidate, the μGraph text, cost,
rules and certificate, plus a SHA-256 of all of it.

On read an entry is checked before anything is served: the checksum, that
each μGraph parses and passes the IR checks, and that each certificate names
this very graph and μGraph (by their SHA-256). ``recheck=True`` also re-runs
the independent certificate checker on every candidate. A corrupt,
truncated or mismatching entry is discarded with a warning and the search
runs again.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph

log = logging.getLogger(__name__)

FORMAT = "verimirage.search-cache/1"


def _store() -> Any:
    from ..backend.cache import DiskCache

    return DiskCache("search")


#: Subpackages of verimirage whose code decides what a search returns (lifting, rules, saturation,
#: extraction, cost model, partitioner, verifier, certificates, and the IR they all share).
CODE_PACKAGES = ("ir", "rewrite", "smt")


@functools.lru_cache(maxsize=1)
def _code_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    files = sorted(
        (p.relative_to(root).as_posix(), p) for pkg in CODE_PACKAGES for p in (root / pkg).rglob("*.py")
    )
    for rel, p in files:
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
    from ..smt.certificate import tool_versions

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


def load(key: str, graph: Graph, *, recheck: bool = False) -> Any | None:
    """The cached SearchResult for ``key``, or None (miss, or a bad entry discarded with a warning)."""
    store = _store()
    entry = store.get(key)
    if entry is None:
        return None
    try:
        return _rebuild(entry, graph, recheck)
    except (GraphError, ValueError, KeyError, TypeError) as e:
        log.warning("search cache entry %s rejected (%s); searching again", key[:12], str(e).splitlines()[0])
        store.path(key).unlink(missing_ok=True)
        return None


def _rebuild(entry: Any, graph: Graph, recheck: bool) -> Any:
    from ..smt.certificate import Certificate, check_certificate, sha256
    from ..smt.verdict import Check, Proved
    from .cost import Cost, KernelCost
    from .superopt import Candidate, SearchReport, SearchResult

    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise ValueError("not a search-cache entry of this format")
    cands_d = entry["candidates"]
    if _checksum(cands_d) != entry["sha256"]:
        raise ValueError("checksum mismatch")
    gsha = sha256(str(graph))
    out = []
    for d in cands_d:
        mg = MuGraph.parse(d["mugraph"])
        cert = Certificate.from_json(d["certificate"])
        if cert.graph_sha256 != gsha or cert.mugraph_sha256 != sha256(str(mg)):
            raise ValueError("a certificate does not name this graph and μGraph")
        checks: tuple[Check, ...] = (Check("search-cache", "proved", (("checksum", entry["sha256"]),)),)
        if recheck:
            import tempfile
            from pathlib import Path

            with tempfile.TemporaryDirectory() as tmp:
                p = Path(tmp) / "c.json"
                cert.save(p)
                v = check_certificate(p)
            if not v.proved:
                raise ValueError(f"certificate re-check: {v.reason}")
            checks = checks + tuple(v.evidence)
        cd = dict(d["cost"])
        cd["kernels"] = tuple(KernelCost(**k) for k in cd.get("kernels", ()))
        cost = Cost(**cd)
        verdict = Proved(f"served from the search cache (certified: {d['verdict_reason']})", checks)
        g2 = Graph.parse(d["graph"]) if d.get("graph") else None
        out.append(Candidate(mg, cost, verdict, cert, tuple(d["rules"]), g2))
    rep = SearchReport(stop_reason="served from the search cache")
    rep.verified = len(out)
    rep.notes.append("cache hit; the original search said:\n" + str(entry.get("report", "")))
    return SearchResult(out, rep)
