"""What a certificate vouches for, for the module that runs: ``vm.compile`` records the digest and launch mode of the
module it writes and executes (``CompiledProgram.module_digest``, ``launch_mode``, ``tuned_tiles``), and
``vm.check_certificate(cert, compiled=program)`` / ``check-cert --mode`` regenerate that mode's module from the
certificate's μGraph and compare. A certificate's ``triton_source_sha256`` stays the default mode's module."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig
from verimirage.backend.tuning import launch_mode, mode_name, triton_digest, tuned_module
from verimirage.cli import main
from verimirage.pipeline.certificates import check_certificate
from verimirage.smt.certify import certify

PROOFS = Path(__file__).resolve().parent.parent / "proofs"
MODES = ("VERIMIRAGE_MERGE", "VERIMIRAGE_PDL", "VERIMIRAGE_LASTBLOCK", "VERIMIRAGE_PERSISTENT",
         "VERIMIRAGE_PERSISTENT_TILES")


@pytest.fixture(autouse=True)
def _default_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    for env in MODES:
        monkeypatch.delenv(env, raising=False)


def _projections() -> tuple[vm.MuGraph, vm.Certificate]:
    """Three independent products of one input and a sum of them, certified against itself as a μGraph of one kernel
    per op: merged launches put the three products in one launch (a module text unlike the default's)."""
    g = vm.Graph()
    x = g.input("X", (16, 32), vm.float16)
    p = [g.matmul(x, g.input(f"W{i}", (32, 16), vm.float16)) for i in range(3)]
    g.output(g.add(g.add(p[0], p[1]), g.exp(p[2])))
    mg = vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))
    return mg, certify(g, mg, triton_source_hash=triton_digest(mg))


def _module(v: vm.Verdict) -> dict:
    return dict(next(c for c in v.evidence if c.name == "triton-module").params)


def test_certificate_checked_against_a_merged_compile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mg, cert = _projections()
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    prog = vm.compile(mg, directory=tmp_path)
    assert prog.launch_mode == {"merge": True} and prog.tuned_tiles
    # (the certificate's own hash names the default module: it does not cover the merged one that runs)
    assert prog.module_digest != cert.triton_source_sha256
    assert hashlib.sha256(prog.path.read_text().encode()).hexdigest() == prog.module_digest
    v = check_certificate(cert, compiled=prog, isolate=False)
    assert v.proved, v.reason
    assert _module(v) == {"mode": "merge", "sha256": prog.module_digest}


def test_certificate_checked_against_a_last_block_compile(tmp_path: Path) -> None:
    path = PROOFS / "mha_bs1.json"
    mg = vm.MuGraph.parse(json.loads(path.read_text())["mugraph_text"])
    prog = vm.compile(mg, directory=tmp_path, last_block=True)
    assert prog.launch_mode == {"last_block": True}
    assert prog.module_digest != json.loads(path.read_text())["triton_source_sha256"]
    v = vm.check_certificate(path, compiled=prog)  # (in the checker process, as a user runs it)
    assert v.proved and _module(v) == {"mode": "last_block", "sha256": prog.module_digest}, v.reason


def test_tampered_module_for_a_mode_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mg, cert = _projections()
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    prog = vm.compile(mg, directory=tmp_path)
    prog.source = prog.source.replace("tl.exp(", "tl.exp2(", 1)  # a module that is not the generator's
    assert prog.source != tuned_module(mg, "merge").source
    v = check_certificate(cert, compiled=prog, isolate=False)
    assert not v.proved and "the module that runs" in v.reason and "launch mode merge" in v.reason
    # the default module presented as the merged one, and the merged one as the default
    for mode, other in (("merge", None), (None, "merge")):
        v = check_certificate(cert, mode=mode or "default", module_source=tuned_module(mg, other).source,
                              isolate=False)
        assert not v.proved and "the module that runs" in v.reason, mode
    # a module with a config's tiles: no certificate vouches for its text
    monkeypatch.delenv("VERIMIRAGE_MERGE")
    prog = vm.compile(mg, directory=tmp_path, config=LaunchConfig())
    assert not prog.tuned_tiles
    v = check_certificate(cert, compiled=prog, isolate=False)
    assert not v.proved and "launch config" in v.reason
    # a wrong program's certificate does not vouch for this one's module
    g2 = vm.Graph()
    x = g2.input("X", (16, 32), vm.float16)
    g2.output(g2.exp(x))
    mg2 = vm.MuGraph.parse(str(g2).replace("graph {", "mugraph {", 1))
    prog2 = vm.compile(mg2, directory=tmp_path)
    assert not check_certificate(cert, compiled=prog2, isolate=False).proved


def test_default_compile_is_the_certified_module(tmp_path: Path) -> None:
    # committed proofs: the default compile's module is the one the certificate records, checked as compiled
    path = PROOFS / "lora_bs1.json"
    d = json.loads(path.read_text())
    prog = vm.compile(vm.MuGraph.parse(d["mugraph_text"]), directory=tmp_path)
    assert prog.launch_mode == {} and prog.module_digest == d["triton_source_sha256"]
    v = check_certificate(path, compiled=prog, isolate=False)
    assert v.proved and _module(v)["mode"] == "default", v.reason


def test_compile_logs_a_module_no_certificate_records(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    mg, _ = _projections()
    caplog.set_level(logging.INFO, logger="verimirage.backend.runtime")

    def said() -> str:
        text = " ".join(r.getMessage() for r in caplog.records if "certificate" in r.getMessage())
        caplog.clear()
        return text

    vm.compile(mg, directory=tmp_path)
    assert said() == ""
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    vm.compile(mg, directory=tmp_path, last_block=True)
    assert "launch mode last_block,merge" in said()
    monkeypatch.delenv("VERIMIRAGE_MERGE")
    vm.compile(mg, directory=tmp_path, config=LaunchConfig())
    assert "no certificate vouches" in said()


def test_launch_mode_text() -> None:
    assert launch_mode("pdl=end, merge") == {"merge": True, "pdl": "end"} == launch_mode({"pdl": "end", "merge": True})
    assert mode_name({"pdl": "end", "merge": True, "last_block": False}) == "merge,pdl=end"
    assert launch_mode("default") == launch_mode(None) == launch_mode({"merge": False}) == {}
    for bad in ("merged", "pdl=sometimes", {"merge": 1}):
        with pytest.raises(ValueError, match="launch mode"):
            launch_mode(bad)
    with pytest.raises(ValueError, match="unknown option"):
        check_certificate(PROOFS / "lora_bs1.json", mode="fused")


def test_check_cert_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = PROOFS / "mha_bs1.json"
    mg = vm.MuGraph.parse(json.loads(path.read_text())["mugraph_text"])
    good, bad = tmp_path / "last_block.py", tmp_path / "default.py"
    good.write_text(tuned_module(mg, "last_block").source)
    bad.write_text(tuned_module(mg).source)
    assert main(["check-cert", str(path), "--mode", "last_block", "--module", str(good)]) == 0
    assert f"sha256 {triton_digest(mg, 'last_block')}" in capsys.readouterr().out
    assert main(["check-cert", str(path), "--mode", "last_block", "--module", str(bad)]) == 3
    assert "the module that runs" in capsys.readouterr().out
    assert main(["check-cert", str(path), "--module", str(good)]) == 2
