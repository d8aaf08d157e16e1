"""Masked tail tiles: a grid (or for-loop) that covers a dim with ``ceil(n / tile)`` blocks, the last one partly
past the end (docs/architecture.md "Masked tails").

The μGraph's meaning: the operand is read zero-padded to whole tiles and each result cropped to its recorded shape
(``ir.interpret.fit``). Soundness: the padding is one value, 0, in every domain, so whatever it feeds is in the
semantics -- a reduction over a padded dim that 0 is not neutral for (max over negatives, mean's count, softmax
denominators) gives another function than the source's and must never be proved (the attacks below); a sum or a
contraction over it is exact. The generated kernels mask loads (``other=0``) and stores past the end.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import verimirage as vm
from verimirage.backend.codegen import generate
from verimirage.backend.runtime import compile as vcompile
from verimirage.ir import BlockBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import odd_shapes  # (the sweep's program families)

F32 = vm.float32
#: per dtype: the largest difference from the float64 reference allowed (values of order 1)
_TOL = {"float32": 2e-5, "float16": 2e-2}


def _matmul(n: int, k: int, m: int, dt: Any = F32) -> vm.Graph:
    g = vm.Graph()
    g.output(g.matmul(g.input("X", (n, k), dt), g.input("W", (k, m), dt)))
    return g


def _rows_tailed(n: int, k: int, m: int, blocks: int, dt: Any = F32) -> vm.MuGraph:
    """``X @ W`` with the rows in ``blocks`` blocks of ``ceil(n / blocks)`` (the last one masked)."""
    mg = vm.MuGraph()
    x, w = mg.input("X", (n, k), dt), mg.input("W", (k, m), dt)
    b = BlockBuilder((blocks,), 1)
    b.output(b.matmul(b.input(0, x.type, (0,)), b.input(1, w.type, (None,))), (0,))
    (o,) = mg.custom(b.build(), [x, w], [(n, m)])
    mg.output(o)
    return mg


def _split_k_tailed(n: int, k: int, m: int, parts: int, dt: Any = F32) -> vm.MuGraph:
    """``X @ W`` as ``parts`` partial products over K in tiles of ``ceil(k / parts)`` (zeros past K), then summed."""
    mg = vm.MuGraph()
    x, w = mg.input("X", (n, k), dt), mg.input("W", (k, m), dt)
    b = BlockBuilder((parts,), 1)
    b.output(b.matmul(b.input(0, x.type, (1,)), b.input(1, w.type, (0,))), (0,))
    (part,) = mg.custom(b.build(), [x, w])
    c = BlockBuilder((1,), parts)
    c.output(c.loop_sum(c.input(0, part.type, (None,), 0)), (0,))
    (o,) = mg.custom(c.build(), [part])
    mg.output(o)
    return mg


def _inputs(g: vm.Graph, seed: int = 0, scale: float = 1.0, shift: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) * scale + shift for t in g.inputs}


def _proved(v: vm.Verdict) -> bool:
    return isinstance(v, vm.Proved)


# --------------------------------------------------------------------------- semantics


@pytest.mark.parametrize(("n", "blocks"), [(197, 4), (197, 7), (197, 13), (5, 4), (1000, 16), (50, 3)])
def test_a_grid_with_a_masked_tail_is_the_source_and_is_proved(n: int, blocks: int) -> None:
    """Rows of a product in blocks that do not divide them (5 rows in 4 blocks: the last block all padding)."""
    g, mg = _matmul(n, 32, 16), _rows_tailed(n, 32, 16, blocks)
    assert vm.MuGraph.parse(str(mg)) == mg  # (the cropped result is recorded in the text form)
    ins = _inputs(g)
    np.testing.assert_allclose(vm.evaluate(mg, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-12, atol=1e-12)
    assert _proved(vm.verify(g, mg))


@pytest.mark.parametrize(("k", "parts"), [(197, 4), (1023, 8), (13, 2)])
def test_a_contraction_over_a_masked_tail_is_exact_its_zeros_are_neutral(k: int, parts: int) -> None:
    g, mg = _matmul(8, k, 16), _split_k_tailed(8, k, 16, parts)
    ins = _inputs(g, 1)
    np.testing.assert_allclose(vm.evaluate(mg, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-12, atol=1e-10)
    assert _proved(vm.verify(g, mg))


def test_every_domain_pads_with_its_exact_zero_and_crops() -> None:
    """The finite-field reference (the certificate checker's) and the abstract domain evaluate the tailed program
    as the float64 one does: a certificate of it checks in the isolated checker process."""
    from verimirage.smt.certify import certify

    g, mg = _matmul(37, 16, 8), _rows_tailed(37, 16, 8, 3)
    cert = certify(g, mg)
    assert isinstance(vm.check_certificate(cert), vm.Proved)


# --------------------------------------------------------------------------- attacks: padding leaking into a reduction


def _reduce_tailed(kind: str, n: int, k: int, parts: int) -> tuple[vm.Graph, vm.MuGraph]:
    """The source ``kind`` of each row of ``X (n, k)`` and a two-kernel μGraph that reduces ``parts`` column tiles
    of ``ceil(k / parts)`` (the last one padded with zeros), then the partials."""
    g = vm.Graph()
    x = g.input("X", (n, k), F32)
    if kind == "max":
        g.output(g.max(x, 1))
    elif kind == "mean":
        g.output(g.mean(x, 1))
    elif kind == "sumexp":
        g.output(g.sum(g.exp(x), 1))
    else:  # min
        g.output(g.min(x, 1))
    mg = vm.MuGraph()
    xm = mg.input("X", (n, k), F32)
    b = BlockBuilder((parts,), 1)
    xt = b.input(0, xm.type, (1,))
    part = {"max": b.max, "mean": b.mean, "min": b.min}.get(kind, lambda v, a: b.sum(b.exp(v), a))(xt, 1)
    b.output(part, (1,))
    (p,) = mg.custom(b.build(), [xm])
    c = BlockBuilder((1,), 1)
    pt = c.input(0, p.type, (None,))
    c.output({"max": c.max, "mean": c.mean, "min": c.min}.get(kind, c.sum)(pt, 1), (0,))
    (o,) = mg.custom(c.build(), [p])
    mg.output(o)
    return g, mg


@pytest.mark.parametrize("kind", ["max", "min", "mean", "sumexp"])
def test_a_reduction_that_zero_padding_is_not_neutral_for_is_never_proved(kind: str) -> None:
    """Attack: reduce over a dim tiled with a masked tail as if the padding were not there. ``max`` (a row of
    negatives: the padding's 0 wins), ``min`` (positives), ``mean`` (divides by the padded count), a sum of
    ``exp`` (``exp(0) = 1`` per padded element). Each differs from the source in float64, and none is Proved.
    (The finite-field test alone passes the max: max is modelled by an order on residues, in which 0 is least;
    the abstract check refuses it.)"""
    g, mg = _reduce_tailed(kind, 4, 197, 4)
    shift = {"max": -5.0, "min": 5.0}.get(kind, 0.0)
    ins = _inputs(g, 2, shift=shift)
    assert np.abs(vm.evaluate(mg, ins)[0] - vm.evaluate(g, ins)[0]).max() > 1e-3
    assert not _proved(vm.verify(g, mg))


def test_an_online_softmax_over_a_masked_last_iteration_is_refuted() -> None:
    """Attack: softmax over 197 keys in a for-loop of 4 tiles of 50 (the last iteration 3 keys of padding): the
    padded scores (0) enter the running max and the denominator (``exp(0 - m)``)."""
    n, k, it = 8, 197, 4
    g = vm.Graph()
    x = g.input("X", (n, k), F32)
    e = g.exp(g.sub(x, g.max(x, 1)))
    g.output(g.div(e, g.sum(e, 1)))
    mg = vm.MuGraph()
    xm = mg.input("X", (n, k), F32)
    b = BlockBuilder((1,), it)
    xt = b.input(0, xm.type, (None,), 1)
    m = b.running_max(b.max(xt, 1))
    b.output(b.rescaled_sum(b.sum(b.exp(b.sub(xt, m)), 1), m), (0,))
    b.output(b.loop_max(b.max(xt, 1)), (0,))
    s, mx = mg.custom(b.build(), [xm])
    c = BlockBuilder((1,), 1)
    xc, sc, mc = c.input(0, xm.type, (None,)), c.input(1, s.type, (None,)), c.input(2, mx.type, (None,))
    c.output(c.div(c.exp(c.sub(xc, mc)), sc), (0,))
    (o,) = mg.custom(c.build(), [xm, s, mx])
    mg.output(o)
    ins = _inputs(g, 3, scale=3.0)
    assert np.abs(vm.evaluate(mg, ins)[0] - vm.evaluate(g, ins)[0]).max() > 1e-4
    assert isinstance(vm.verify(g, mg), vm.Refuted)


def test_a_crop_that_keeps_padding_in_the_result_is_refuted() -> None:
    """Attack: a rows-tailed product recorded with one padded row too many (199 of 200), read by a sum over rows;
    the extra row is the product of zeros (0: neutral for the sum), so the recorded shape is checked against the
    source's instead -- the programs' output shapes differ and the pair is refused outright."""
    g = _matmul(197, 8, 4)
    mg = vm.MuGraph()
    x, w = mg.input("X", (197, 8), F32), mg.input("W", (8, 4), F32)
    b = BlockBuilder((4,), 1)
    b.output(b.matmul(b.input(0, x.type, (0,)), b.input(1, w.type, (None,))), (0,))
    (o,) = mg.custom(b.build(), [x, w], [(199, 4)])
    mg.output(o)
    with pytest.raises(vm.GraphError):
        vm.verify(g, mg)


# --------------------------------------------------------------------------- search and the generated kernels


def _best(g: vm.Graph, **kw: Any) -> Any:
    return vm.superoptimize(g, cache=False, **kw).best


def _run(mg: vm.MuGraph, g: vm.Graph, ins: dict[str, np.ndarray], dt: str) -> list[np.ndarray]:
    tdt = getattr(torch, dt)
    out = vcompile(mg)(*[torch.tensor(ins[t.name], dtype=tdt) for t in g.inputs])
    return [o.double().numpy() for o in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize(("n", "blocks"), [(197, 4), (197, 13), (5, 4)])
def test_tailed_kernels_mask_loads_and_stores_and_match_float64(n: int, blocks: int, dt: str) -> None:
    g, mg = _matmul(n, 32, 16, getattr(vm, dt)), _rows_tailed(n, 32, 16, blocks, getattr(vm, dt))
    src = str(generate(mg))
    assert f"< {n})" in src  # (the tail's mask)
    ins = _inputs(g, 5)
    (got,) = _run(mg, g, ins, dt)
    (want,) = vm.evaluate(g, ins)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=_TOL[dt], atol=_TOL[dt] * np.abs(want).max())


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_a_split_k_over_a_masked_tail_runs_and_matches_float64(dt: str) -> None:
    g, mg = _matmul(16, 197, 32, getattr(vm, dt)), _split_k_tailed(16, 197, 32, 4, getattr(vm, dt))
    ins = _inputs(g, 6)
    (got,) = _run(mg, g, ins, dt)
    (want,) = vm.evaluate(g, ins)
    np.testing.assert_allclose(got, want, rtol=_TOL[dt], atol=_TOL[dt] * np.abs(want).max())


def _causal(h: int, n: int, hd: int, dt: Any) -> vm.Graph:
    from verimirage.benchmarks import models as M

    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, hd), dt), g.input("K", (h, hd, n), dt), g.input("V", (h, n, hd), dt)
    g.output(M.masked_attention(g, q, k, v, g.tril_mask((1, n, n)), zero_masked=True))
    return g


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_vit_197_token_causal_attention_is_one_tailed_kernel_that_matches_float64(dt: str) -> None:
    """The finding (held-out sweep, session 16): ViT-B/16's 197 tokens (a prime) had 12 kernels against one at 256
    (only 1 or 197 row blocks divide 197). With masked tails the rows go in blocks of ``ceil(197 / G)``; the
    causal mask's tile is 0 past the end as the IR's padding is (``tril_expr``)."""
    g = _causal(2, 197, 32, getattr(vm, dt))
    best = _best(g)
    assert best.mugraph.num_kernels == 1 and _proved(best.verdict)
    bg = next(n.attr("block") for n in best.mugraph.nodes if n.op == "custom")
    assert any(n.op == "input" and n.outs[0].shape[1] * bg.grid[1] > 197 for n in bg.nodes), bg  # (tailed)
    ins = _inputs(g, 7)
    (got,) = _run(best.mugraph, g, ins, dt)
    (want,) = vm.evaluate(g, ins)
    np.testing.assert_allclose(got, want, rtol=0, atol=_TOL[dt])


def test_the_tails_option_off_keeps_dividing_grids() -> None:
    g = _causal(2, 197, 32, vm.float16)
    best = _best(g, tails=False)
    for n in best.mugraph.nodes:
        if n.op == "custom":
            bg = n.attr("block")
            assert all(k.outs[0].shape[d] * bg.grid[a] == k.attr("shape")[d] for k in bg.nodes if k.op == "input"
                       for a, d in enumerate(k.attr("imap")) if d is not None)


@pytest.mark.slow  # an sm_90 compile in a subprocess: minutes on a loaded 2-core machine
def test_tailed_kernels_compile_for_sm90(tmp_path: Any) -> None:
    from verimirage.backend.gpucompile import compile_modules
    from verimirage.backend.runtime import write_module

    mods = [generate(_rows_tailed(197, 64, 64, 4, vm.float16)), generate(_split_k_tailed(16, 197, 64, 4, vm.float16)),
            generate(_best(_causal(2, 197, 64, vm.float16)).mugraph)]
    rep = compile_modules([write_module(ms, tmp_path / str(i)) for i, ms in enumerate(mods)])
    assert all(r["ok"] for kernels in rep.values() for r in kernels.values()), rep


@pytest.mark.parametrize(("n", "tailed"), [(200, False), (197, True)])
def test_a_persistent_kernels_tile_waits_wait_whole_for_a_masked_tail(n: int, tailed: bool) -> None:
    """``tile_box`` (persistent kernels' per-tile waits, opt-in) computed a producer's slab as ``shape / grid``:
    with a masked tail (197 rows in 4 blocks of 50) that is 49, the wrong producer blocks. A tailed pair now waits
    for the whole producer (None); the dividing twin keeps its one-block box."""
    from verimirage.backend.codegen import tile_box

    mg = vm.MuGraph()
    x = mg.input("X", (n, 16), F32)
    b = BlockBuilder((4,), 1)
    b.output(b.exp(b.input(0, x.type, (0,))), (0,))
    (y,) = mg.custom(b.build(), [x], [(n, 16)])
    c = BlockBuilder((4,), 1)
    inp = c.input(0, y.type, (0,))
    c.output(c.exp(inp), (0,))
    cons = c.build()
    box = tile_box(b.build(), 0, cons, inp.node, (n, 16))
    assert (box is None) == tailed, box


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize(("build", "dims"), [("logit_softcap", (8, 64, 1155)), ("logit_softcap", (4, 64, 2374)),
                                             ("rmsnorm_linear", (16, 128, 344)), ("rmsnorm_linear", (77, 64, 48))])
def test_the_searchs_tailed_candidates_run_and_match_float64(build: str, dims: tuple[int, ...], dt: str) -> None:
    """The odd-shape sweep's rows that masked tails improved (an LM head over 1155 and 2374 = 2 x 1187 columns,
    a projection to 344 = 8 x 43 columns, 77 token rows): the best candidate has a tailed kernel, runs, matches."""
    g = getattr(odd_shapes, build)(*dims, getattr(vm, dt))
    best = _best(g)
    assert _proved(best.verdict)
    tailed = [n for n in best.mugraph.nodes if n.op == "custom" and any(
        k.op == "input" and any(d is not None and k.outs[0].shape[d] * gr != k.attr("shape")[d]
                                for d, gr in zip(k.attr("imap"), n.attr("block").grid, strict=True))
        for k in n.attr("block").nodes)]
    assert tailed, best.mugraph
    if dt == "float16":  # (its certificate, the Triton module's hash included, re-checked by the isolated checker)
        assert best.certificate.triton_source_sha256
        assert isinstance(vm.check_certificate(best.certificate), vm.Proved)
    ins = _inputs(g, 8, scale=0.5)
    (got,) = _run(best.mugraph, g, ins, dt)
    (want,) = vm.evaluate(g, ins)
    np.testing.assert_allclose(got, want, rtol=_TOL[dt], atol=_TOL[dt] * max(1.0, np.abs(want).max()))


def test_a_tail_refused_on_a_reshaped_group_leaves_the_structures_other_counts_in_the_search() -> None:
    """Finding (this session's sweep): a tailed block count refused on a reshaped group (40 heads of a flat (16, 640)
    projection in 3 blocks) was recorded as its grid *structure*'s infeasibility, so lower_all pruned every other
    count of that structure too: 45 lowerings against 81 without tails, and a worse best (2.03 against 2.02 us est.).
    The refusal names the count ("divide"), as a non-dividing count's did before masked tails."""
    from verimirage.pipeline import pricing
    from verimirage.rewrite.partition import lower_all

    g = vm.Graph()
    x, w = g.input("x", (16, 640), vm.float16), g.input("w", (16,), vm.float16)
    g.output(g.reshape(g.rms_norm(g.reshape(x, (16, 40, 16)), w), (16, 640)))
    on, _ = lower_all(g, rank=pricing.cost, tail=True)
    off, _ = lower_all(g, rank=pricing.cost, tail=False)
    assert len(on) >= len(off)


def test_padding_kept_in_an_intermediate_and_summed_by_the_next_kernel_is_refused_and_run_as_the_ir_says() -> None:
    """Attack: kernel 1 computes ``exp(X)`` over 197 rows in 4 blocks of 50 but records 199 rows (two rows of the
    padding's ``exp(0) = 1`` kept); kernel 2 sums the rows. The IR's meaning counts them (the sum is 2 too large):
    refuted, and the generated kernels compute that same meaning (the crop is the recorded shape, not the source's)."""
    g = vm.Graph()
    x = g.input("X", (197, 8), F32)
    g.output(g.sum(g.exp(x), 0))
    mg = vm.MuGraph()
    xm = mg.input("X", (197, 8), F32)
    b = BlockBuilder((4,), 1)
    b.output(b.exp(b.input(0, xm.type, (0,))), (0,))
    (e,) = mg.custom(b.build(), [xm], [(199, 8)])
    c = BlockBuilder((1,), 1)
    c.output(c.sum(c.input(0, e.type, (None, )), 0), (1,))
    (o,) = mg.custom(c.build(), [e])
    mg.output(o)
    ins = _inputs(g, 9)
    (want,), (ir,) = vm.evaluate(g, ins), vm.evaluate(mg, ins)
    np.testing.assert_allclose(ir - want, 2.0, rtol=0, atol=1e-9)
    assert isinstance(vm.verify(g, mg), vm.Refuted)
    (got,) = _run(mg, g, ins, "float32")
    np.testing.assert_allclose(got, ir, rtol=1e-5, atol=1e-4)
