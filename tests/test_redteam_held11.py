"""Red team (eleventh session): attacks on what the tenth session landed that held, kept as tests so they keep
holding. Kernels run in Triton's interpreter against float64 (``vm.evaluate``).

* The served plan's re-check (``corpus_capture.recheck``): a certificate edited to name a wrong μGraph (its hash
  recomputed) and another pair's certificate relabelled with this partition's graph were both rejected by the
  checker (the re-derived queries differ); input names swapped on a non-commutative partition were refuted.
* Batched row dots (several KV heads a block) with query-head groups ``G`` of 1-8, non-power-of-two heads a block
  and key tiles, fp16 and bf16, online and plain softmax: 96 kernels, all within fp16/bf16 rounding of float64.
* The split causal loop (codegen 9) and rank-2 one-head kernels (codegen 10): attention with fewer queries than
  keys (offsets ``S - L`` and others, below, on and past the diagonal, fully masked rows), padded key tiles
  (20 of 32), with and without the causal skip, rank 2 and 3, unrolled or not: 128 kernels, none off.
* Boundary identities of ``step`` (``step(x) = 1 - step(-x)``, false at 0 only; ``step(x, 0)`` vs
  ``step(x, 1e-30)``; ``step(x**3, 8)`` vs ``step(x, 2.0001)``) are never Proved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig, TileOptions, generate
from verimirage.benchmarks.designs import _inputs, _one_kernel
from verimirage.ir.builders import BlockBuilder
from verimirage.ir.graph import Graph, MuGraph
from verimirage.pipeline import pricing

torch = pytest.importorskip("torch")

_G = """graph {
  %0 = input {name='in0'} : f32[4,8]
  %1 = input {name='in1'} : f32[4,8]
  %2 = add %0, %1 : f32[4,8]
  %3 = exp %2 : f32[4,8]
  %4 = sum %3 {axis=1} : f32[4,1]
  return %4
}"""


def _cc() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture

    return corpus_capture


@pytest.mark.slow
def test_plan_certificates_relabelled_or_edited_held() -> None:
    """A plan item whose certificate names this partition and the item's μGraph by text (and sha256) but proves
    another pair is rejected by the checker: the queries it re-derives from the two programs differ."""
    import hashlib

    from verimirage.smt.certify import certify

    cc = _cc()
    g, wrong_g = Graph.parse(_G), Graph.parse(_G.replace("add %0", "sub %0"))
    mg, wrong = MuGraph.from_graph(g), MuGraph.from_graph(wrong_g)

    def sha(t: str) -> str:
        return hashlib.sha256(t.encode()).hexdigest()

    edited = json.loads(certify(g, mg).to_json())
    edited.update(mugraph_text=str(wrong), mugraph_sha256=sha(str(wrong)))
    foreign = json.loads(certify(wrong_g, wrong).to_json())
    foreign.update(graph_text=str(g), graph_sha256=sha(str(g)))
    for c in (edited, foreign):
        served, why = cc.recheck(g, [{"mugraph": str(wrong), "certificate": json.dumps(c)}], 1, {})
        assert not served and "does not re-check" in why[0], why
    g2 = Graph.parse(_G.replace("add %0", "sub %0"))  # names swapped on a non-commutative op: another function
    swapped = str(MuGraph.from_graph(g2)).replace("'in0'", "'inX'").replace("'in1'", "'in0'").replace("'inX'",
                                                                                                        "'in1'")
    served, why = cc.recheck(g2, [swapped], 1, {})
    assert not served and "not proved" in why[0], why


def _gqa_decode(hk: int, grp: int, hb: int, d: int, kv: int, kvt: int, dt: vm.DType) -> tuple[vm.Graph, Any]:
    """Q (hk, grp, 1, d), K (hk, 1, d, kv), V (hk, 1, kv, d): ``hb`` KV heads a block, an online softmax over key
    tiles of ``kvt`` (both products batched row dots)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (hk, grp, 1, d), dt), g.input("K", (hk, 1, d, kv), dt), g.input("V", (hk, 1, kv, d), dt)
    s = g.matmul(q, k)
    p = g.exp(g.sub(s, g.max(s, 3)))
    g.output(g.div(g.matmul(p, v), g.sum(p, 3)))
    t = _inputs(g)
    b = BlockBuilder((hk // hb,), kv // kvt)
    qi, ki, vi = b.input(0, t["Q"], (0,), None), b.input(1, t["K"], (0,), 3), b.input(2, t["V"], (0,), 2)
    si = b.matmul(qi, ki)
    m = b.running_max(b.max(si, axis=3))
    pi = b.exp(b.sub(si, m))
    b.output(b.div(b.rescaled_sum(b.matmul(pi, vi), m), b.rescaled_sum(b.sum(pi, axis=3), m)), (0,))
    return g, _one_kernel(t, b)


@pytest.mark.parametrize("cfg", [(6, 3, 3, 24, 60, 20), (3, 5, 3, 32, 40, 20)])
def test_batched_row_dots_with_query_groups_held(cfg: tuple[int, int, int, int, int, int]) -> None:
    g, mg = _gqa_decode(*cfg, vm.float16)
    assert isinstance(vm.verify(g, mg), vm.Proved)
    tiles = TileOptions(dot_min_m=16)
    assert generate(mg, tiles=tiles).source.count("tl.dot(") == 2
    rng = np.random.default_rng(cfg[0])
    ins = {t.name: torch.tensor(rng.standard_normal(t.shape) * 0.5, dtype=torch.float16) for t in g.inputs}
    (ref,) = vm.evaluate(g, {k: x.double().numpy() for k, x in ins.items()})
    got = vm.compile(mg, config=LaunchConfig(tiles=tiles))(**ins).double().numpy()
    assert np.abs(got - ref).max() <= 4e-3 * np.abs(ref).max()


def _causal(h: int, n_q: int, n_k: int, d: int, off: int) -> vm.Graph:
    from verimirage.benchmarks.models import MASKED

    g = vm.Graph()
    q, k, v = g.input("Q", (h, n_q, d), vm.float32), g.input("K", (h, d, n_k), vm.float32), g.input(
        "V", (h, n_k, d), vm.float32)
    m = g.tril_mask((1, n_q, n_k), off)
    s = g.matmul(q, k)
    c = g.where(m, s, g.shift(g.scale(s, 0.0), MASKED))
    e = g.where(m, g.exp(g.sub(c, g.max(c, axis=2))), g.scale(c, 0.0))
    g.output(g.div(g.matmul(e, v), g.sum(e, axis=2)))
    return g


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [(2, 32, 64, 32, 16, 4), (2, 32, 40, 8, 16, 2), (2, 48, 48, -3, 16, 3)])
def test_split_causal_loop_with_fewer_queries_than_keys_held(cfg: tuple[int, int, int, int, int, int]) -> None:
    """``cfg``: heads, queries, keys, offset, query rows a block, loop iterations (key tiles of keys / iterations,
    20 padded to 32 in the second). Fully masked rows (offset -3) are NaN in both."""
    pytest.importorskip("egglog")
    from verimirage.rewrite.causal import mask_inputs, restore_masks, with_skips
    from verimirage.rewrite.partition import lower_all

    h, n_q, n_k, off, rows, fr = cfg
    g = _causal(h, n_q, n_k, 16, off)
    g2, masks = mask_inputs(g)
    lows, _ = lower_all(g2, grids=(h, n_q // rows), franges=(fr,), rank=pricing.cost)
    mg = next(restore_masks(low.mugraph, masks) for low in lows
              if any(n.op == "rescaled_sum" for k in low.mugraph.nodes if k.op == "custom"
                     for n in k.attr("block").nodes)
              and [k.attr("block").grid for k in low.mugraph.nodes if k.op == "custom"] == [(h, n_q // rows)])
    rng = np.random.default_rng(0)
    ins = {"Q": rng.uniform(-1, 1, (h, n_q, 16)), "K": rng.uniform(-1, 1, (h, 16, n_k)),
           "V": rng.uniform(-1, 1, (h, n_k, 16))}
    (ref,) = vm.evaluate(g, ins)
    for m in (mg, with_skips(mg)):
        assert m is not None and isinstance(vm.verify(g, m), vm.Proved)
        for rank2 in (True, False):
            tiles = TileOptions(rank2=rank2, unroll_max=0)
            assert "it_full" in generate(m, tiles=tiles).source
            got = vm.compile(m, config=LaunchConfig(tiles=tiles))(
                **{k: torch.tensor(x, dtype=torch.float32) for k, x in ins.items()}).double().numpy()
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
            fin = ~np.isnan(ref)
            np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-5)


def _step(g: vm.Graph, x: Any, c: float) -> Any:
    return g.apply("step", [x], {"c": c})


@pytest.mark.parametrize("pair", ["one_minus_step_of_neg", "threshold_moved_by_1e-30", "cube_vs_moved_root"])
def test_step_identities_false_at_one_point_are_never_proved(pair: str) -> None:
    lhs, rhs = {
        "one_minus_step_of_neg": (lambda g, x: _step(g, x, 0.0),
                                  lambda g, x: g.shift(g.neg(_step(g, g.neg(x), 0.0)), 1.0)),
        "threshold_moved_by_1e-30": (lambda g, x: _step(g, x, 0.0), lambda g, x: _step(g, x, 1e-30)),
        "cube_vs_moved_root": (lambda g, x: _step(g, g.pow(x, 3.0), 8.0), lambda g, x: _step(g, x, 2.0001)),
    }[pair]

    def prog(f: Any) -> vm.Graph:
        g = vm.Graph()
        x = g.input("x", (2, 3), vm.float32)
        g.output(f(g, x))
        return g

    assert not vm.verify(prog(lhs), prog(rhs), timeout_s=10).proved
