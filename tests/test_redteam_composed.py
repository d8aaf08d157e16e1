"""Red-team findings and attacks that held on composed certificates (programs searched by regions) and on
malformed certificate files.

Finding (composition and definedness): each region's μGraph was proved against its region graph with the region's
inputs as free reals, so a region μGraph could read an element of its input that its graph does not read
(``r0[0] + 0 * r0[1]`` for ``r0[0]``), or read outside a ``where`` branch a value its graph reads only inside
it. Spliced after a region that leaves that element undefined (``log(x)[1]`` for ``x[1] < 0``), the composed
μGraph was NaN where the program is defined, yet the checker and the search's composed verdict said Proved
(whole-program ``vm.verify`` says Unknown). Now every value one region makes and another reads must be defined
for all of the program's inputs (:func:`verimirage.smt.glue.undefined_fed`).

Finding (malformed file): a certificate file nested too deeply, or holding an integer too long for Python's
int parser, raised RecursionError / ValueError out of ``check_certificate`` (a traceback from ``verimirage
check-cert``) instead of the documented :class:`CertificateError`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.pipeline.certificates import check_certificate
from verimirage.smt.certificate import SCHEMA, CertificateError, check_text
from verimirage.smt.certify import make_certificate, make_composed_certificate
from verimirage.smt.glue import live_ops, region_of, undefined_fed


def _composed_of(g: vm.Graph, mugraph_of: dict[int, vm.Graph]) -> Any:
    """A composed certificate of ``g`` by one region per live op, region k's μGraph ``mugraph_of[k]`` (else its
    own graph); every sub-certificate proved."""
    regs = [region_of(g, [i]) for i in sorted(live_ops(g))]
    certs = []
    for k, r in enumerate(regs):
        mg = MuGraph.from_graph(mugraph_of.get(k, r.graph))
        v = vm.verify(r.graph, mg)
        assert v.proved, v.reason  # (each region's proof is right: the attack is in the splice)
        certs.append(make_certificate(r.graph, mg, v))
    return regs, make_composed_certificate(g, regs, certs, "red team")


def _log_then_slice() -> tuple[vm.Graph, vm.Graph]:
    g = vm.Graph()
    g.output(g.slice(g.log(g.input("x", (2,), vm.float32)), 0, 0, 1))
    h = vm.Graph()  # the slice's region, reading r0[1] too: r0[0:1] + 0 * r0[1:2]
    r0 = h.input("r0", (2,), vm.float32)
    h.output(h.add(h.slice(r0, 0, 0, 1), h.scale(h.slice(r0, 0, 1, 2), 0.0)))
    return g, h


def _log_in_where() -> tuple[vm.Graph, vm.Graph]:
    g = vm.Graph()
    m, x, z = g.input("m", (2,), vm.bool), g.input("x", (2,), vm.float32), g.input("z", (2,), vm.float32)
    g.output(g.where(m, g.log(x), z))
    h = vm.Graph()  # the where's region, reading the log's value outside the branch too: where(...) + 0 * r1
    r0, r1, r2 = h.input("r0", (2,), vm.bool), h.input("r1", (2,), vm.float32), h.input("r2", (2,), vm.float32)
    h.output(h.add(h.where(r0, r1, r2), h.scale(r1, 0.0)))
    return g, h


ATTACKS = {"unread-element": (_log_then_slice, {"x": np.array([1.0, -1.0])}),
           "where-branch": (_log_in_where, {"m": np.array([True, False]), "x": np.array([1.0, -1.0]),
                                            "z": np.array([3.0, 4.0])})}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_composed_splice_read_a_value_the_program_leaves_undefined(name: str) -> None:
    build, ins = ATTACKS[name]
    g, h = build()
    regs, cc = _composed_of(g, {1: h})
    spliced = MuGraph.parse(cc.mugraph_text)
    ref, got = vm.evaluate(g, ins)[0], vm.evaluate(spliced, ins)[0]
    assert np.isfinite(ref).all() and np.isnan(got).any()  # (the attack: NaN where the program is defined)
    assert not vm.verify(g, spliced).proved  # whole-program verify refuses it
    v = check_text(cc.to_json())
    assert not v.proved and "may be undefined" in v.reason, v.reason
    assert undefined_fed(g, regs) is not None


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_search_composed_verdict_read_a_value_the_program_leaves_undefined(name: str) -> None:
    from verimirage.pipeline.options import SearchOptions
    from verimirage.pipeline.superopt import _composed_verdict
    from verimirage.smt.glue import compose

    build, _ = ATTACKS[name]
    g, h = build()
    regs = [region_of(g, [i]) for i in sorted(live_ops(g))]
    mgs = [MuGraph.from_graph(regs[0].graph), MuGraph.from_graph(h)]
    proofs = [vm.verify(r.graph, mg) for r, mg in zip(regs, mgs, strict=True)]
    assert all(p.proved for p in proofs)
    v = _composed_verdict(g, compose(g, regs, mgs), proofs, SearchOptions(), regs)
    assert not v.proved and "may be undefined" in v.reason, v.reason


def test_composed_values_defined_by_signs_still_compose() -> None:
    # log of a sum of exps and a division by one, crossing region boundaries: defined for all inputs
    g = vm.Graph()
    x = g.input("x", (2, 4), vm.float32)
    e = g.exp(x)
    s = g.sum(e, axis=1)
    g.output(g.div(e, s), g.log(s))
    regs, cc = _composed_of(g, {})
    assert undefined_fed(g, regs) is None
    v = check_text(cc.to_json())
    assert v.proved, v.reason


# --------------------------------------------------------------------------- attacks that held (composed)


def _doc() -> dict[str, Any]:
    g = vm.Graph()
    x = g.input("x", (2, 4), vm.float32)
    g.output(g.mul(g.exp(x), x))
    _, cc = _composed_of(g, {})
    d = json.loads(cc.to_json())
    assert check_text(json.dumps(d)).proved
    return d


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return _doc()


def _tamper(doc: dict[str, Any], edit: Any) -> vm.Verdict:
    d = copy.deepcopy(doc)
    edit(d)
    return check_text(json.dumps(d))


def _set(path: list[Any], value: Any) -> Any:
    def edit(d: dict[str, Any]) -> None:
        t = d
        for p in path[:-1]:
            t = t[p]
        t[path[-1]] = value

    return edit


HELD = {
    "nodes-as-floats": _set(["regions", 0, "nodes"], [1.0]),
    "nodes-as-bools": _set(["regions", 0, "nodes"], [True]),
    "node-repeated": lambda d: d["regions"][1]["nodes"].append(d["regions"][0]["nodes"][0]),
    "input-node-in-a-region": lambda d: d["regions"][0]["nodes"].append(0),
    "node-out-of-range": lambda d: d["regions"][0]["nodes"].append(99),
    "empty-regions": _set(["regions"], []),
    "region-without-nodes": lambda d: d["regions"].append({**d["regions"][0], "nodes": []}),
    "certificate-index-bool": _set(["regions", 0, "certificate"], False),
    "certificate-index-out-of-range": _set(["regions", 0, "certificate"], 5),
    "unused-sub-certificate": lambda d: d["certificates"].append(d["certificates"][0]),
    "sub-certificates-swapped": lambda d: d["certificates"].reverse(),
    "regions-reversed": lambda d: d["regions"].reverse(),
    "nested-composed-sub-certificate": lambda d: d["certificates"].__setitem__(0, copy.deepcopy(d)),
    "sub-certificate-not-an-object": _set(["certificates", 0], "x"),
    "sub-certificate-schema-missing": lambda d: d["certificates"][0].pop("schema"),
    "sub-certificate-with-a-triton-hash": _set(["certificates", 0, "triton_source_sha256"], "0" * 64),
    "extra-region-field": lambda d: d["regions"][0].__setitem__("graph", "x"),
    "wiring-inputs-renamed": _set(["regions", 1, "inputs"], [[0, 0]]),
    "outputs-empty": _set(["regions", 1, "outputs"], []),
    "regions-not-a-list": _set(["regions"], {"0": 1}),
}


@pytest.mark.parametrize("name", sorted(HELD))
def test_tampered_composed_certificate_is_rejected(doc: dict[str, Any], name: str) -> None:
    v = _tamper(doc, HELD[name])
    assert not v.proved and v.reason.startswith("certificate rejected"), (name, v.reason)


def test_sub_certificate_of_a_wrong_region_mugraph_is_rejected(doc: dict[str, Any]) -> None:
    # region 0 (exp) given a sub-certificate proving its graph equal to a different (correct) μGraph of another
    # function: the splice is then not the recorded μGraph
    g = vm.Graph()
    r0 = g.input("r0", (2, 4), vm.float32)
    g.output(g.exp(r0))
    h = vm.Graph()
    h.output(h.exp(h.scale(h.input("r0", (2, 4), vm.float32), 1.0)))
    mg = MuGraph.from_graph(h)
    sub = json.loads(make_certificate(g, mg, vm.verify(g, mg)).to_json())

    def edit(d: dict[str, Any]) -> None:
        d["certificates"][d["regions"][0]["certificate"]] = sub

    v = _tamper(doc, edit)
    assert not v.proved, v.reason


# --------------------------------------------------------------------------- malformed files


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"schema": "' + SCHEMA + '", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                  '{"schema": "' + SCHEMA + '", "x": ' + "9" * 5000 + "}"],
                         ids=["nested-array", "nested-in-object", "long-int"])
def test_malformed_certificate_file_raised_past_the_contract(tmp_path: Path, text: str) -> None:
    p = tmp_path / "c.json"
    p.write_text(text)
    with pytest.raises(CertificateError, match="not JSON"):
        check_certificate(p, isolate=False)
    assert not check_text(text).proved


def test_check_cert_cli_on_a_deeply_nested_file_is_a_clean_error(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from verimirage.cli import main

    p = tmp_path / "c.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["check-cert", str(p)]) != 0
    assert "not JSON" in capsys.readouterr().err


def test_search_cache_entry_with_the_undefined_splice_is_not_served(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache entry (checksum right) serving the splice of the finding with its composed certificate: the
    # re-check refuses it, the entry is removed
    from verimirage.pipeline import search_cache
    from verimirage.pipeline.pricing import cost
    from verimirage.pipeline.superopt import Candidate, SearchReport, SearchResult

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g, h = _log_then_slice()
    _, cc = _composed_of(g, {1: h})
    mg = MuGraph.parse(cc.mugraph_text)
    cand = Candidate(mg, cost(mg), vm.verify(g, g), cc, ("partition.unfused",), g)
    key = search_cache.cache_key(g, {"red": "team"})
    search_cache.save(key, SearchResult([cand], SearchReport()))
    assert search_cache.entry_path(key).is_file()
    assert search_cache.load(key, g, recheck="all") is None
    assert not search_cache.entry_path(key).is_file()


def _plain_doc() -> dict[str, Any]:
    g = vm.Graph()
    g.output(g.exp(g.input("x", (2, 4), vm.float32)))
    mg = MuGraph.from_graph(g)
    d = json.loads(make_certificate(g, mg, vm.verify(g, mg)).to_json())
    assert check_text(json.dumps(d)).proved
    return d


@pytest.mark.parametrize("where", ["ff-p", "ff-g", "ff-trials", "cases", "ff-p-bool"])
def test_checker_took_floats_or_bools_for_ints_in_the_ff_record_and_cases(where: str) -> None:
    # the record and the cases were compared with == (1.0 and true stood for 1): a certificate is one text
    d = _plain_doc()
    if where == "ff-p":
        d["ff"]["p"][0] = float(d["ff"]["p"][0])
    elif where == "ff-g":
        d["ff"]["g"][-1] = float(d["ff"]["g"][-1])
    elif where == "ff-trials":
        d["ff"]["trials"] = float(d["ff"]["trials"])
    elif where == "cases":
        d["cases"][0][0][0][1] = float(d["cases"][0][0][0][1])
    else:
        d["cases"][0][0][1][0] = False  # (0)
    v = check_text(json.dumps(d))
    assert not v.proved, v.reason


@pytest.mark.parametrize("field", ["rules", "trusted_rules"])
def test_checker_took_a_dict_for_a_rule_list(field: str) -> None:
    d = _plain_doc()
    d[field] = {}
    v = check_text(json.dumps(d))
    assert not v.proved and f"field {field!r}: got {{}}; expected list[str]" in v.reason, v.reason


def _softmax(g: vm.Graph, x: Any) -> Any:
    e = g.exp(g.sub(x, g.max(x, axis=1)))
    return g.div(e, g.sum(e, axis=1))


def _model_programs() -> dict[str, vm.Graph]:
    out = {}
    g = vm.Graph()
    g.output(_softmax(g, g.input("x", (4, 8), vm.float32)))
    out["softmax"] = g
    g = vm.Graph()
    x, w = g.input("x", (4, 8), vm.float32), g.input("w", (8,), vm.float32)
    c = g.sub(x, g.mean(x, axis=1))
    g.output(g.mul(g.mul(c, g.rsqrt(g.shift(g.mean(g.square(c), axis=1), 1e-5))), w))
    out["layernorm"] = g
    g = vm.Graph()
    x, w = g.input("x", (4, 8), vm.float32), g.input("w", (8, 8), vm.float32)
    h = g.mul(x, g.rsqrt(g.shift(g.mean(g.square(x), axis=1), 1e-6)))
    g.output(g.matmul(g.add(h, x), w))
    out["rmsnorm-residual-matmul"] = g
    g = vm.Graph()
    x = g.input("x", (4, 8), vm.float32)
    m = g.max(x, axis=1)
    g.output(g.sub(x, g.add(g.log(g.sum(g.exp(g.sub(x, m)), axis=1)), m)))
    out["log-softmax"] = g
    g = vm.Graph()
    q, k, v = g.input("q", (4, 8), vm.float32), g.input("k", (8, 4), vm.float32), g.input("v", (4, 8), vm.float32)
    g.output(g.matmul(_softmax(g, g.scale(g.matmul(q, k), 0.35)), v))
    out["attention"] = g
    g = vm.Graph()
    x, w, u = (g.input(n, s, vm.float32) for n, s in (("x", (4, 8)), ("w", (8, 8)), ("u", (8, 8))))
    g.output(g.mul(g.silu(g.matmul(x, w)), g.matmul(x, u)))
    out["swiglu"] = g
    return out


@pytest.mark.parametrize("name", sorted(_model_programs()))
def test_model_programs_cut_at_every_op_still_compose(name: str) -> None:
    # the fix must not refuse what real compositions need: softmax's, norms' and log-sum-exp's partial ops are
    # in their domains for all inputs by signs, wherever the program is cut
    g = _model_programs()[name]
    assert undefined_fed(g, [region_of(g, [i]) for i in sorted(live_ops(g))]) is None


def test_a_division_by_an_input_cut_from_its_reader_does_not_compose() -> None:
    g = vm.Graph()
    x, y = g.input("x", (4, 8), vm.float32), g.input("y", (4, 8), vm.float32)
    g.output(g.exp(g.div(x, y)))
    why = undefined_fed(g, [region_of(g, [i]) for i in sorted(live_ops(g))])
    assert why is not None and "div" in why
