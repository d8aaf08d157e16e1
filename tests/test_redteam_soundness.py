"""Red-team attacks on this session's verifier paths that held (kept as tests so that they keep holding): the
sum-fold law of the abstract check (runs of terms equal but for one constant index) on pairs that are not equal,
and composed certificates given a sub-certificate of a region that differs only in shape, dtype or input names."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.builders import Tensor
from verimirage.ir.graph import MuGraph
from verimirage.smt.certificate import check_text
from verimirage.smt.certify import make_certificate, make_composed_certificate
from verimirage.smt.glue import live_ops, region_of
from verimirage.smt.verify import abstract_check

N = 4
Build = Callable[[vm.Graph, Tensor, Tensor], Tensor]


def _rows(g: vm.Graph, x: Tensor, axis: int = 0) -> list[Tensor]:
    return [g.slice(x, axis, r, r + 1) for r in range(N)]


def _chain(g: vm.Graph, ts: list[Tensor]) -> Tensor:
    acc = ts[0]
    for t in ts[1:]:
        acc = g.add(acc, t)
    return acc


#: (source, candidate): not equal, though the candidate is a run of per-row terms the fold could take for a sum
FOLD_ATTACKS: dict[str, tuple[Build, Build]] = {
    # the row's index also in the other operand, two rows of it swapped
    "rows-of-y-swapped": (lambda g, x, y: g.sum(g.mul(x, y), axis=0),
                          lambda g, x, y: _chain(g, [g.mul(a, _rows(g, y)[[0, 1, 3, 2][r]])
                                                     for r, a in enumerate(_rows(g, x))])),
    # the constant in the column index: the fold gives a sum along the other axis
    "columns-for-rows": (lambda g, x, y: g.sum(g.add(x, y), axis=0),
                         lambda g, x, y: g.reshape(_chain(g, [g.add(a, b) for a, b in
                                                              zip(_rows(g, x, 1), _rows(g, y, 1), strict=True)]),
                                                   (1, N))),
    # row r of x against column r of y: equal to sum(x * y^T); rows of y instead are not
    "row-against-row-not-column": (lambda g, x, y: g.sum(g.mul(x, g.transpose(y, 0, 1)), axis=0),
                                   lambda g, x, y: _chain(g, [g.mul(a, b) for a, b in
                                                              zip(_rows(g, x), _rows(g, y), strict=True)])),
    # a run with a gap filled by another input's row
    "gap-filled-from-another-input": (lambda g, x, y: g.sum(g.exp(g.add(x, y)), axis=0),
                                      lambda g, x, y: _chain(g, [g.exp(g.add(a, b)) for a, b in
                                                                 zip(_rows(g, x), [*_rows(g, y)[:2], _rows(g, x)[2],
                                                                                   _rows(g, y)[3]], strict=True)])),
    # a run inside a function: one row's argument from another row
    "sigmoid-argument-from-another-row": (lambda g, x, y: g.sum(g.mul(g.sigmoid(x), y), axis=0),
                                          lambda g, x, y: _chain(g, [g.mul(g.sigmoid(_rows(g, x)[r if r != 2 else 1]),
                                                                           _rows(g, y)[r]) for r in range(N)])),
}


@pytest.mark.parametrize("name", sorted(FOLD_ATTACKS))
def test_sum_fold_attack_is_not_proved(name: str) -> None:
    progs = []
    for build in FOLD_ATTACKS[name]:
        g = vm.Graph()
        x, y = g.input("x", (N, N), vm.float32), g.input("y", (N, N), vm.float32)
        g.output(build(g, x, y))
        progs.append(g)
    a, b = progs
    rng = np.random.default_rng(0)
    ins = {"x": rng.standard_normal((N, N)), "y": rng.standard_normal((N, N))}
    assert not np.allclose(vm.evaluate(a, ins)[0], vm.evaluate(b, ins)[0])  # (the attack is a wrong pair)
    assert abstract_check(a, b).outcome != "proved"


def _composed(shapes: list[tuple[tuple[int, ...], vm.DType]]) -> dict:
    g = vm.Graph()
    g.output(*(g.exp(g.input(f"x{k}", s, t)) for k, (s, t) in enumerate(shapes)))
    regions = [region_of(g, [i]) for i in sorted(live_ops(g))]
    certs = [make_certificate(r.graph, MuGraph.from_graph(r.graph),
                              vm.verify(r.graph, MuGraph.from_graph(r.graph))) for r in regions]
    return json.loads(make_composed_certificate(g, regions, certs).to_json())


@pytest.mark.parametrize("other", [((4, 4), vm.float32), ((4, 8), vm.float16)], ids=["shape", "dtype"])
def test_one_sub_certificate_for_regions_differing_in_shape_or_dtype_is_rejected(other) -> None:
    d = _composed([((4, 8), vm.float32), other])
    assert check_text(json.dumps(d)).proved and len(d["certificates"]) == 2
    d["regions"][1]["certificate"] = 0
    d["certificates"] = d["certificates"][:1]
    v = check_text(json.dumps(d))
    assert not v.proved and "sub-certificate 0 is about another program" in v.reason, v.reason


def test_sub_certificate_with_the_input_renamed_is_rejected() -> None:
    d = _composed([((4, 8), vm.float32)])
    g = vm.Graph()
    g.output(g.exp(g.input("x0", (4, 8), vm.float32)))  # the program itself: input x0, not the region's r0
    mg = MuGraph.from_graph(g)
    d["certificates"][0] = json.loads(make_certificate(g, mg, vm.verify(g, mg)).to_json())
    v = check_text(json.dumps(d))
    assert not v.proved and "about another program" in v.reason, v.reason
