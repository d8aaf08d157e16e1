"""Nothing read from disk is trusted (issue 24, findings 1 and 2, and the GPU-selection cache).

* a tampered search-cache entry (a wrong μGraph whose certificate and checksum were recomputed) is
  never served: the certificate re-check rejects it, the entry is removed and the search runs again;
* a planted ``__pycache__`` bytecode file or a modified ``kernels/vm_<digest>.py`` never runs: kernel
  modules execute the text that was just generated and hashed;
* a GPU-selection cache record is used only if each record names, by μGraph text hash, one of the
  candidates being selected among (the CPU-testable part: the selection logic given fake records).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import marshal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import runtime
from verimirage.backend.runtime import ensure_mode
from verimirage.pipeline import search_cache
from verimirage.smt.certificate import sha256

ensure_mode()  # CPU-only machine: TRITON_INTERPRET=1 before anything imports triton


def _entry_files(root: Path) -> list[Path]:
    return sorted((root / "search").glob("*.json"))


def _small_graph() -> vm.Graph:
    g = vm.Graph()
    x = g.input("x", (16, 32), vm.float16)
    w = g.input("w", (32, 16), vm.float16)
    b = g.input("b", (1, 16), vm.float16)
    g.output(g.add(g.matmul(x, w), b))
    return g


def test_tampered_search_cache_entry_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 1: add -> sub in a cached μGraph, certificate text/hash and checksum recomputed."""
    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = _small_graph()
    first = vm.superoptimize(g, top_k=1)
    good = str(first.best.mugraph)
    assert "add" in good
    (p,) = _entry_files(tmp_path)
    d = json.loads(p.read_text())
    c0 = d["value"]["candidates"][0]
    bad_mg = vm.MuGraph.parse(c0["mugraph"].replace("add ", "sub ", 1))
    bad = str(bad_mg)
    assert bad != good
    c0["mugraph"] = bad
    cert = json.loads(c0["certificate"])
    cert["mugraph_text"], cert["mugraph_sha256"] = bad, sha256(bad)
    c0["certificate"] = json.dumps(cert, indent=1, sort_keys=True)
    d["value"]["sha256"] = search_cache._checksum(d["value"]["candidates"])
    p.write_text(json.dumps(d))
    with caplog.at_level(logging.WARNING, logger="verimirage.pipeline.search_cache"):
        again = vm.superoptimize(g, top_k=1)  # default options
    assert again.report.stop_reason != "served from the search cache"
    assert str(again.best.mugraph) == good
    assert "rejected" in caplog.text and "does not re-check" in caplog.text
    # the bad entry was replaced by the fresh result, which is served (and re-checked) next time
    third = vm.superoptimize(g, top_k=1)
    assert third.report.stop_reason == "served from the search cache"
    assert str(third.best.mugraph) == good
    assert any(ch.name == "finite-field" for ch in third.best.verdict.evidence)


@pytest.mark.parametrize("damage", ["other-graph", "not-json", "bad-cost", "edited-cost"])
def test_corrupt_search_cache_entry_is_a_miss_not_an_exception(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = _small_graph()
    first = vm.superoptimize(g, top_k=1)
    (p,) = _entry_files(tmp_path)
    d = json.loads(p.read_text())
    c0 = d["value"]["candidates"][0]
    if damage == "other-graph":  # a genuine certificate of another graph, hashes consistent
        cert = json.loads(c0["certificate"])
        gt = cert["graph_text"].replace("f16[1,16]", "f16[16,16]", 1)
        cert["graph_text"], cert["graph_sha256"] = gt, sha256(gt)
        c0["certificate"] = json.dumps(cert)
    elif damage == "not-json":
        c0["certificate"] = "{"
    elif damage == "bad-cost":
        c0["cost"] = {"nonsense": 1}
    else:  # a cost edited (to reorder candidates) is not the cost model's
        c0["cost"]["bytes"] = 1
    d["value"]["sha256"] = search_cache._checksum(d["value"]["candidates"])
    p.write_text(json.dumps(d))
    with caplog.at_level(logging.WARNING, logger="verimirage.pipeline.search_cache"):
        again = vm.superoptimize(g, top_k=1)
    assert again.report.stop_reason != "served from the search cache"
    assert str(again.best.mugraph) == str(first.best.mugraph)
    assert "rejected" in caplog.text


# --------------------------------------------------------------------------- generated kernel modules

_EVIL = """
import torch
LAUNCH = {}
def forward(*xs):
    return (torch.full((16, 16), 42.0, dtype=torch.float16),)
"""


def _reference_check(fn: Any, g: vm.Graph) -> None:
    import torch

    gen = torch.Generator().manual_seed(0)
    xs = {t.name: (torch.randn(t.shape, generator=gen) * 0.5).to(torch.float16) for t in g.inputs}
    out = fn(**xs)
    (ref,) = vm.evaluate(g, {k: v.double().numpy() for k, v in xs.items()})
    err = float(np.abs(out.double().numpy() - ref).max())
    assert err < 2e-2, f"max error {err} against the float64 reference"


def test_planted_pyc_not_executed(tmp_path: Path) -> None:
    """Finding 2: a bytecode file with a header matching the .py, and a modified .py, never run."""
    g = _small_graph()
    mg = vm.MuGraph.from_graph(g)
    fn = vm.compile(mg, directory=tmp_path)
    _reference_check(fn, g)
    path = Path(fn.path)
    src = path.read_text()
    # a .pyc that importlib would accept for this .py (same mtime and size in its header), returning 42
    st = path.stat()
    code = compile(_EVIL, str(path), "exec")
    pyc = Path(importlib.util.cache_from_source(str(path)))
    pyc.parent.mkdir(parents=True, exist_ok=True)
    header = importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(
        4, "little") + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc.write_bytes(header + marshal.dumps(code))
    # the plant works against a plain import (so the test would catch a return to importing the file)
    spec = importlib.util.spec_from_file_location("vm_planted_probe", path)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    assert float(probe.forward()[0][0, 0]) == 42.0
    runtime._MODULES.clear()  # as in a fresh process
    _reference_check(vm.compile(mg, directory=tmp_path), g)
    assert path.read_text() == src
    # a modified .py (not the generated text): rewritten, and the generated text runs
    path.write_text(_EVIL)
    runtime._MODULES.clear()
    fn2 = vm.compile(mg, directory=tmp_path)
    _reference_check(fn2, g)
    assert path.read_text() == src


def test_modified_module_file_after_load_does_not_change_kernels(tmp_path: Path) -> None:
    """The file changing under a loaded module (Triton reads source through inspect) changes nothing."""
    g = _small_graph()
    mg = vm.MuGraph.from_graph(g)
    runtime._MODULES.clear()
    fn = vm.compile(mg, directory=tmp_path)
    Path(fn.path).write_text(_EVIL + "\n# padding\n")
    _reference_check(fn, g)


# --------------------------------------------------------------------------- GPU-selection cache


def _fake_candidates() -> list[vm.MuGraph]:
    g = _small_graph()
    a = vm.MuGraph.from_graph(g)
    h = vm.Graph()
    x = h.input("x", (16, 32), vm.float16)
    w = h.input("w", (32, 16), vm.float16)
    b = h.input("b", (1, 16), vm.float16)
    h.output(h.add(b, h.matmul(x, w)))
    return [a, vm.MuGraph.from_graph(h)]


def test_tampered_selection_cache_not_used() -> None:
    """Stored selection records name a candidate by index and μGraph hash; anything else is rejected.

    (A stored time or success that was never measured is not detectable from the record: on a GPU,
    ``select`` re-runs each candidate's chosen configuration against the float64 reference on a hit.)
    """
    from verimirage.backend.codegen import LaunchConfig
    from verimirage.backend.profile import DEFAULT_CONFIGS, cached_timings, timing_records

    cands = _fake_candidates()
    configs = DEFAULT_CONFIGS[:2]
    from verimirage.backend.profile import Timing

    timings = [Timing(1, cands[1], configs[0], 0.5), Timing(0, cands[0], configs[1], 0.7),
               Timing(1, cands[1], configs[1], 0.9), Timing(0, cands[0], configs[0], None, "ValueError: differs")]
    good = timing_records(timings)
    got = cached_timings(good, cands, configs)
    assert [(t.index, t.config, t.ms) for t in got] == [(t.index, t.config, t.ms) for t in timings]
    assert got[0].candidate is cands[1]

    def bad(mutate: Any) -> list[dict[str, Any]]:
        recs = json.loads(json.dumps(good))
        mutate(recs)
        return recs

    other = vm.Graph()
    x = other.input("x", (16, 32), vm.float16)
    other.output(other.neg(x))
    other_sha = sha256(str(vm.MuGraph.from_graph(other)))
    tampered = {
        "unverified kernel": bad(lambda r: r[0].update(mugraph_sha256=other_sha)),
        "index swapped": bad(lambda r: r[0].update(index=0)),
        "index out of range": bad(lambda r: r[0].update(index=7)),
        "unknown config": bad(lambda r: r[0].update(config=LaunchConfig(8, 2).key())),
        "negative time": bad(lambda r: r[0].update(ms=-1.0)),
        "nan time": bad(lambda r: r[0].update(ms=float("nan"))),
        "out of order": bad(lambda r: r[1].update(ms=0.1)),
        "failure turned success": bad(lambda r: r[3].update(error=None, ms=0.1)),
        "a pair left out": bad(lambda r: r.pop(2)),
        "time and failure": bad(lambda r: r[0].update(error="x")),
        "missing hash": bad(lambda r: r[0].pop("mugraph_sha256")),
        "not a list": {"index": 0},
        "duplicate": bad(lambda r: r.append(dict(r[0]))),
    }
    for why, recs in tampered.items():
        with pytest.raises(ValueError):
            cached_timings(recs, cands, configs)
            pytest.fail(f"tampered record accepted: {why}")


def test_tampered_selection_cache_rechecked_against_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The whole ``select`` hit path on the CPU (interpreted kernels, a fake GPU clock).

    A wrong candidate fails the reference check when measured; its record, edited into the fastest
    success (well-formed, so only the re-run can tell), is caught on the next hit: the entry is
    removed, the selection measured again, and the wrong candidate fails again.
    """
    import torch
    import triton.testing

    from verimirage.backend import profile
    from verimirage.backend.cache import DiskCache

    monkeypatch.setattr(profile, "device_info", lambda: {"name": "fake", "capability": [9, 0]})
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    clock = iter(range(1, 10**6))

    def bench(fn: Any, rep: int = 0, return_mode: str = "") -> float:
        fn()
        return float(next(clock))

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", bench)
    monkeypatch.setattr(triton.testing, "do_bench", bench)
    g = _small_graph()
    good = vm.MuGraph.from_graph(g)
    w = vm.Graph()
    x = w.input("x", (16, 32), vm.float16)
    wt = w.input("w", (32, 16), vm.float16)
    b = w.input("b", (1, 16), vm.float16)
    w.output(w.sub(w.matmul(x, wt), b))  # not the same function
    wrong = vm.MuGraph.from_graph(w)
    gen = torch.Generator().manual_seed(0)
    xs = {t.name: (torch.randn(t.shape, generator=gen) * 0.5).to(torch.float16) for t in g.inputs}
    configs = profile.DEFAULT_CONFIGS[:1]
    first = profile.select(g, [good, wrong], configs=configs, inputs=xs, cache_root=tmp_path)
    assert [t.ok for t in first] == [True, False] and first[0].candidate is good
    (p,) = (tmp_path / "select").glob("*.json")
    d = json.loads(p.read_text())
    recs = d["value"]
    assert all(r["mugraph_sha256"] for r in recs)
    recs[1].update(ms=0.001, error=None)
    d["value"] = [recs[1], recs[0]]  # the wrong kernel, "fastest"
    p.write_text(json.dumps(d))
    assert profile.cached_timings(DiskCache("select", tmp_path).get(p.stem), [good, wrong], configs)
    with caplog.at_level(logging.WARNING, logger="verimirage.backend.profile"):
        again = profile.select(g, [good, wrong], configs=configs, inputs=xs, cache_root=tmp_path)
    assert "rejected" in caplog.text and "float64 reference" in caplog.text
    assert [t.ok for t in again] == [True, False] and again[0].candidate is good
    # the re-measured entry is well-formed and served next time (after the same re-check)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verimirage.backend.profile"):
        third = profile.select(g, [good, wrong], configs=configs, inputs=xs, cache_root=tmp_path)
    assert "rejected" not in caplog.text
    assert [(t.index, t.ok) for t in third] == [(t.index, t.ok) for t in again]
