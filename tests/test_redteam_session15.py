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
