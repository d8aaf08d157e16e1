"""Red team (fifteenth session): findings against the verifier, the certificate checker and what they trust, each
with the test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held15.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm


def _exp_program(shape: tuple[int, int]) -> tuple[vm.Graph, vm.MuGraph]:
    g = vm.Graph()
    x = g.input("X", shape, vm.float16)
    g.output(g.exp(g.add(x, x)))
    return g, vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))


def test_mode_check_read_the_certificate_file_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding (low-medium; a wrong "matched" under a concurrent writer): ``vm.check_certificate(path, mode=M,
    module_source=S)`` (``check-cert --mode M --module S``) checked the file in the checker process, then, for a
    certificate with no Triton hash (or ``triton=False``), read the file *again* for the μGraph whose mode-M module it
    regenerated and compared with ``S``. A file replaced between the two reads (here: right after the check) had
    ``S``, the module of a μGraph no certificate proved, reported "Proved ... regenerated and matched". Now the
    file is read once: the μGraph whose module is compared is the one the checker checked."""
    from verimirage.backend.tuning import tuned_module
    from verimirage.pipeline import certificates as P
    from verimirage.smt import certificate as C
    from verimirage.smt.certify import certify

    g, mg = _exp_program((16, 32))
    cert = certify(g, mg)  # (no Triton hash: the checker confirms no module of its own)
    assert cert.triton_source_sha256 is None
    other = vm.Graph()  # an unproved μGraph of another program, whose merged module is the one that runs
    x = other.input("X", (16, 32), vm.float16)
    other.output(other.sqrt(x))
    bad_mg = vm.MuGraph.parse(str(other).replace("graph {", "mugraph {", 1))
    path = tmp_path / "cert.json"
    path.write_text(cert.to_json())
    swapped = json.loads(cert.to_json())
    swapped["mugraph_text"] = str(bad_mg)  # (no check would pass this file; nothing checks it)
    real = C.check_certificate

    def check_then_swap(*a: Any, **k: Any) -> vm.Verdict:
        v = real(*a, **k)
        path.write_text(json.dumps(swapped))  # (a writer replacing the file once the checker has read it)
        return v

    monkeypatch.setattr(C, "check_certificate", check_then_swap)
    module = tuned_module(bad_mg, "merge").source
    v = P.check_certificate(path, mode="merge", module_source=module, isolate=False)
    assert not v.proved and "the module that runs" in v.reason, v.reason
    # the module of the μGraph that was checked still matches, read from the file once
    path.write_text(cert.to_json())
    v = P.check_certificate(path, mode="merge", module_source=tuned_module(mg, "merge").source, isolate=False)
    assert v.proved, v.reason


def test_search_cache_rechecked_a_tampered_huge_mugraph_in_process_without_a_memory_cap(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Finding (medium; a tampered cache entry could take the caller's memory instead of being a miss): the search
    cache re-checks a served candidate's certificate in the caller's process (``isolate=False``: no checker-process
    start-up), i.e. without the checker process's memory cap, whatever the μGraph it names. A tampered entry's
    μGraph of the requested ``exp(X)`` (X 4 x 4) with an intermediate of 2**30 elements (a broadcast to 2**26
    copies, exp, max back: 16 GiB per finite-field trial) was evaluated there: on a machine with the memory, an
    out-of-memory kill of the caller, not a rejected entry. Now the re-check runs in this process only where both
    programs' evaluations hold at most ``IN_PROCESS_ELEMENTS`` elements, else in the capped checker process."""
    from verimirage.pipeline import certificates as P
    from verimirage.pipeline import search_cache as S
    from verimirage.smt.certificate import Certificate, sha256

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = vm.Graph()
    g.output(g.exp(g.input("X", (4, 4), vm.float32)))
    big = vm.Graph()
    x = big.input("X", (4, 4), vm.float32)
    big.output(big.reshape(big.max(big.exp(big.broadcast_to(x, (2**26, 4, 4))), 0), (4, 4)))
    mg = vm.MuGraph.from_graph(big)
    gt, mt = str(g), str(mg)
    cert = Certificate(gt, sha256(gt), mt, sha256(mt), [], [], [], [], [], {})
    seen: list[dict[str, Any]] = []
    key = "ab" * 32

    def record(path: Any, **kw: Any) -> vm.Verdict:  # (no check runs here: where it would run is the point)
        seen.append(kw)
        return vm.Unknown("not checked in this test")

    monkeypatch.setattr(P, "check_certificate", record)
    import dataclasses

    from verimirage.rewrite.cost import cost

    cand = {"mugraph": mt, "cost": dataclasses.asdict(cost(vm.MuGraph.from_graph(g))), "rules": [], "graph": None,
            "certificate": cert.to_json(), "verdict_reason": ""}
    S._store().put(key, {"format": S.FORMAT, "candidates": [cand], "sha256": S._checksum([cand]), "report": ""})
    assert S.load(key, g, fp_check=lambda m: None) is None  # (rejected: the recorded check is no Proved)
    assert len(seen) == 1 and seen[0].get("isolate", True) is True, seen
    # a small μGraph (the plain one) is still re-checked in this process
    mt = str(vm.MuGraph.from_graph(g))
    cand = {**cand, "mugraph": mt, "certificate": Certificate(gt, sha256(gt), mt, sha256(mt), [], [], [], [], [],
                                                                {}).to_json()}
    S._store().put(key, {"format": S.FORMAT, "candidates": [cand], "sha256": S._checksum([cand]), "report": ""})
    assert S.load(key, g, fp_check=lambda m: None) is None
    assert len(seen) == 2 and seen[1].get("isolate") is False, seen
