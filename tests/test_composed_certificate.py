"""Certificates by regions (issue 23): each region's μGraph proved against its region (a sub-certificate), the
composition by congruence; the checker re-checks every sub-certificate and re-derives the glue (the regions
partition the program's live ops, each region's wiring, the μGraph is the regions' μGraphs spliced), and
rejects anything else."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.dtypes import float16
from verimirage.ir.graph import MuGraph, Node, node_list
from verimirage.smt.certificate import COMPOSED_SCHEMA, ComposedCertificate, check_text, sha256
from verimirage.smt.certify import make_certificate, make_composed_certificate
from verimirage.smt.glue import compose, live_ops, region_of

PROOFS = Path(__file__).resolve().parent.parent / "proofs"


def two_layers() -> vm.Graph:
    """relu(relu(x @ w0) @ w1) * x + z: two regions of different shapes, the second reading the first's value
    and two program inputs of the same shape (x, z)."""
    g = vm.Graph()
    x, z = g.input("x", (16, 32), float16), g.input("z", (16, 32), float16)
    w0, w1 = g.input("w0", (32, 48), float16), g.input("w1", (48, 32), float16)
    h = g.relu(g.matmul(x, w0))
    g.output(g.add(g.mul(g.relu(g.matmul(h, w1)), x), z))
    return g


def _chunks(g: vm.Graph) -> list[list[int]]:
    ops = sorted(live_ops(g))
    cut = [i for i in ops if node_list(g)[i].op == "matmul"][1]
    return [[i for i in ops if i < cut], [i for i in ops if i >= cut]]


@pytest.fixture(scope="module")
def made() -> tuple[vm.Graph, ComposedCertificate]:
    g = two_layers()
    regions = [region_of(g, c) for c in _chunks(g)]
    certs = []
    for r in regions:
        mg = MuGraph.from_graph(r.graph)
        certs.append(make_certificate(r.graph, mg, vm.verify(r.graph, mg)))
    return g, make_composed_certificate(g, regions, certs, "test")


def _doc(made: tuple[vm.Graph, ComposedCertificate]) -> dict[str, Any]:
    return copy.deepcopy(json.loads(made[1].to_json()))


def _check(d: dict[str, Any]) -> vm.Verdict:
    return check_text(json.dumps(d))


def _rejected(d: dict[str, Any], why: str) -> None:
    v = _check(d)
    assert not v.proved and "certificate rejected" in v.reason and why in v.reason, v.reason


def test_composed_certificate_rechecks(made: tuple[vm.Graph, ComposedCertificate], tmp_path: Path) -> None:
    g, cert = made
    assert cert.schema == COMPOSED_SCHEMA and len(cert.regions) == 2 and len(cert.certificates) == 2
    p = tmp_path / "c.json"
    cert.save(p)
    v = vm.check_certificate(p)  # the isolated checker process
    assert v.proved, v.reason
    assert "2 regions partition the 6 live ops" in v.reason
    assert [c.name for c in v.evidence] == ["sub-certificate 0", "sub-certificate 1", "glue"]
    # what it certifies is the program's function (float64)
    rng = np.random.default_rng(0)
    ins = {str(t.name): rng.standard_normal(t.shape) for t in g.inputs}
    np.testing.assert_allclose(vm.evaluate(MuGraph.parse(cert.mugraph_text), ins)[0], vm.evaluate(g, ins)[0],
                               rtol=1e-12)
    assert ComposedCertificate.load(p) == cert


def test_composed_certificate_wrong_glue_wiring_is_rejected(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["regions"][1]["inputs"] = d["regions"][1]["inputs"][::-1]
    _rejected(d, "region 1: its wiring")
    d = _doc(made)
    d["regions"][0]["outputs"] = [[0, 0]]
    _rejected(d, "region 0: its wiring")


def test_composed_certificate_miswired_mugraph_is_rejected(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    # x and z swapped where the μGraph reads them (relu(..) * z + x): same shapes, each region still proved,
    # a different function; the μGraph is not the splice by the program's wiring
    g, cert = made
    mg = MuGraph.parse(cert.mugraph_text)
    nodes = list(node_list(mg))
    ix, iz = (next(i for i, n in enumerate(nodes) if n.op == "input" and n.attr("name") == s) for s in ("x", "z"))
    swap = {(ix, 0): (iz, 0), (iz, 0): (ix, 0)}
    nodes = [n if n.op == "input" else Node(n.op, tuple(swap.get(a, a) for a in n.args), n.attrs, n.outs)
             for n in nodes]
    bad = MuGraph._from_parts(nodes, list(mg.outputs_refs))
    rng = np.random.default_rng(1)
    ins = {str(t.name): rng.standard_normal(t.shape) for t in g.inputs}
    assert not np.allclose(vm.evaluate(bad, ins)[0], vm.evaluate(g, ins)[0])
    d = _doc(made)
    d["mugraph_text"] = str(bad)
    d["mugraph_sha256"] = sha256(str(bad))
    _rejected(d, "not the regions' μGraphs spliced")


def test_composed_certificate_regions_swapped_are_rejected(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["regions"] = d["regions"][::-1]  # the second region first: it reads a value no region made yet
    _rejected(d, "cannot be spliced in this order")
    d = _doc(made)
    d["regions"][0]["certificate"], d["regions"][1]["certificate"] = 1, 0  # each region given the other's proof
    _rejected(d, "region 0: sub-certificate 1 is about another program")


def test_composed_certificate_sub_certificate_of_another_program_is_rejected(
        made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["certificates"][1] = json.loads((PROOFS / "lora_bs1.json").read_text())  # valid, but not region 1's
    _rejected(d, "about another program")


def test_composed_certificate_partition_is_checked(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["regions"][1]["nodes"] = d["regions"][1]["nodes"][1:]  # a live op in no region
    _rejected(d, "do not partition")
    d = _doc(made)
    d["regions"][1]["nodes"] = [*d["regions"][1]["nodes"], d["regions"][0]["nodes"][0]]  # one op in two regions
    _rejected(d, "do not partition")
    d = _doc(made)
    d["regions"][0]["nodes"] = [True]
    _rejected(d, "do not partition")


def test_composed_certificate_sub_certificates_are_checked(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["certificates"][0]["ff"]["seeds"][0] += 1
    _rejected(d, "sub-certificate 0: finite-field record")
    d = _doc(made)
    d["certificates"][1]["triton_source_sha256"] = "0" * 64
    _rejected(d, "sub-certificate 1: records a Triton hash")
    d = _doc(made)
    d["certificates"][0] = _doc(made)  # a composed certificate inside
    _rejected(d, "sub-certificate 0: expected a 'verimirage-certificate/2' certificate")
    d = _doc(made)
    d["certificates"].append(d["certificates"][0])  # one no region uses
    _rejected(d, "each of the 3 sub-certificates must be some region's")
    d = _doc(made)
    d["regions"][0]["certificate"] = 2
    _rejected(d, "must be some region's")


def test_composed_certificate_fields_are_checked(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    d = _doc(made)
    d["graph_text"] = d["graph_text"].replace("16", "17", 1)
    _rejected(d, "graph text does not match its sha256")
    d = _doc(made)
    d["regions"][0]["extra"] = 1
    _rejected(d, "expected a non-empty list of {nodes, inputs, outputs, certificate}")
    d = _doc(made)
    d["regions"] = []
    _rejected(d, "non-empty")
    d = _doc(made)
    d["glue"] = {}
    _rejected(d, "unknown fields ['glue']")


def test_composition_of_unproved_regions_gets_no_certificate(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    g = two_layers()
    regions = [region_of(g, c) for c in _chunks(g)]
    certs = [ComposedCertificate.from_json(made[1].to_json()).certificates[k] for k in range(2)]
    from verimirage.smt.certificate import Certificate

    subs = [Certificate(**c) for c in certs][::-1]  # each region given the other's
    with pytest.raises(vm.GraphError, match="certificate 0 is not region 0's"):
        make_composed_certificate(g, regions, subs)
    assert str(compose(g, regions, [MuGraph.parse(c["mugraph_text"]) for c in certs])) == made[1].mugraph_text


def test_composed_malformed_triton_hash_was_accepted(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    # red-team finding: a plain certificate's triton_source_sha256 must be a sha256 hex digest; a composed one's
    # was not read by the checker at all (check_text, and check_certificate(triton=False), said Proved)
    for h in (5, "", "xyz", ["0" * 64], "0" * 63):
        d = _doc(made)
        d["triton_source_sha256"] = h
        _rejected(d, "triton_source_sha256 is not a sha256 hex digest" if isinstance(h, str)
                  else "field 'triton_source_sha256': got")


def test_composed_wiring_with_floats_or_bools_was_accepted(made: tuple[vm.Graph, ComposedCertificate]) -> None:
    # red-team finding: the recorded wiring was compared with ==, so [[2.0, 0]] or [[true, 0]] stood for [[2, 0]]
    # (harmless: the checker re-derives the wiring it uses; but the record must be the wiring, exactly)
    d = _doc(made)
    d["regions"][1]["inputs"] = [[float(a) for a in r] for r in d["regions"][1]["inputs"]]
    _rejected(d, "region 1: its wiring")
    d = _doc(made)
    d["regions"][0]["outputs"] = [[r[0], bool(r[1]) if r[1] in (0, 1) else r[1]] for r in d["regions"][0]["outputs"]]
    _rejected(d, "region 0: its wiring")
