"""Red team (sixteenth session): findings against the verifier, the certificate checker and what they trust, each
with the test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held16.py``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm

PROOFS = Path(__file__).resolve().parent.parent / "proofs"

def _exp_program(shape: tuple[int, int] = (16, 32)) -> tuple[vm.Graph, vm.MuGraph]:
    g = vm.Graph()
    x = g.input("X", shape, vm.float16)
    g.output(g.exp(g.add(x, x)))
    return g, vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))


def _hashed_certificate() -> Any:
    """A certificate of :func:`_exp_program` that records the Triton hash of the module ``vm.compile`` runs."""
    from verimirage.backend.tuning import tuned_module
    from verimirage.smt.certify import certify

    g, mg = _exp_program()
    return certify(g, mg, triton_source_hash=tuned_module(mg).digest)


def test_check_regenerated_the_triton_module_with_no_time_or_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium; a certificate you are handed holds the caller for as long as it likes): ``vm.check_certificate``
    (``check-cert``) regenerates the Triton module from the certificate's μGraph in the calling process, before the
    checker's verdict, with no bound: the checker process's time and memory caps do not cover it. A 0.75 MB μGraph
    of elementwise ops held ``check_certificate(cert, wall_s=2)`` 47-52 s (the code generator's time grows faster
    than the text; a 100 MB certificate: hours). Now a text over ``MAX_REGENERATE_CHARS`` is not regenerated (a
    rejection naming the limit), and the regeneration runs on a thread given until the check's wall-clock limit
    (``wall_s`` / ``$VERIMIRAGE_CHECK_SECONDS``): past it, a rejection naming the limit."""
    from verimirage.backend import tuning
    from verimirage.pipeline import certificates as P

    cert = _hashed_certificate()
    assert P.check_certificate(cert, isolate=False).proved  # (the certificate is right)
    release, calls = threading.Event(), []
    real = tuning.triton_digest

    def slow(mugraph: Any, mode: Any = None) -> str:  # (a code generator that takes its time)
        calls.append(mugraph)
        release.wait(45)
        return real(mugraph, mode)

    monkeypatch.setattr(tuning, "triton_digest", slow)
    try:
        t0 = time.monotonic()
        v = P.check_certificate(cert, isolate=False, wall_s=6)
        took = time.monotonic() - t0
    finally:
        release.set()
    assert not v.proved and "time limit" in v.reason, v.reason
    assert took < 25, took
    # a μGraph text over the bound is not handed to the code generator at all
    monkeypatch.setattr(P, "MAX_REGENERATE_CHARS", len(cert.mugraph_text) - 1)
    calls.clear()
    v = P.check_certificate(cert, isolate=False)
    assert not v.proved and "MAX_REGENERATE_CHARS" in v.reason and not calls, v.reason
    v = P.check_certificate(cert, isolate=False, mode="merge")  # (a launch mode's module likewise)
    assert not v.proved and "MAX_REGENERATE_CHARS" in v.reason and not calls, v.reason


@pytest.mark.parametrize(("field", "bad"), [("graph_text", None), ("mugraph_text", 7), ("queries", "q"),
                                            ("queries", 1.5), ("laws", {}), ("laws", [1]), ("cases", True),
                                            ("ff", []), ("reason", 3), ("versions", [1]), ("rules", [None])])
def test_wrong_typed_certificate_field_was_rejected_without_naming_it(field: str, bad: Any) -> None:
    """Finding (low; an unclear message, or none): a certificate field of the wrong JSON type was rejected through
    the checker's catch-all (``the check failed: AttributeError: 'NoneType' object has no attribute 'encode'`` for
    ``graph_text: null``, ``TypeError: object of type 'float' has no len()`` for ``queries: 1.5``), or as a
    mismatch (``laws: {}``: "laws differ from the re-derivation"; ``queries: "q"``: "1 stored queries"), and a
    wrong-typed ``reason`` or ``versions`` was accepted. The reader now checks every field against its declared
    type and names the field, what it got and what it expected."""
    from verimirage.smt.certificate import check_text

    d = json.loads(_hashed_certificate().to_json())
    d[field] = bad
    v = check_text(json.dumps(d))
    want = f"field {field!r}: got {json.dumps(bad)}; expected "
    assert not v.proved and want in v.reason and "the check failed" not in v.reason, v.reason
    if field in ("graph_text", "laws"):  # a sub-certificate of a certificate by regions is read the same way
        c = json.loads((PROOFS / "layer_decode_bs1_small.json").read_text())
        c["certificates"][0][field] = bad
        v = check_text(json.dumps(c))
        assert not v.proved and f"sub-certificate 0: certificate: {want}" in v.reason, v.reason
