"""Causal attention whose masked elements weigh exactly 0 (issues 22 and 23): the form a kernel may skip masked
tiles of, its meaning against SDPA, its online-softmax lowering and what the verifier says of the other form."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks import get_model
from verimirage.benchmarks.models import MASKED, masked_attention

pytest.importorskip("egglog")  # the search (rewrite/) needs it; the GPU machine has none
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all


def _attention(h: int, n: int, d: int, *, zero_masked: bool, dt: vm.DType = vm.float32,
               cap: float | None = None) -> vm.Graph:
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, d), dt), g.input("K", (h, d, n), dt), g.input("V", (h, n, d), dt)
    m = g.input("M", (1, n, n), vm.bool)
    g.output(masked_attention(g, q, k, v, m, cap=cap, zero_masked=zero_masked))
    return g


def _ins(h: int, n: int, d: int, rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"Q": rng.uniform(-1, 1, (h, n, d)) * scale, "K": rng.uniform(-1, 1, (h, d, n)),
            "V": rng.uniform(-1, 1, (h, n, d)), "M": np.tril(np.ones((n, n), dtype=bool))[None]}


def test_zero_masked_attention_is_sdpa_where_the_masked_form_is_not() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    h, n, d = 2, 16, 8
    ins = _ins(h, n, d, rng)
    q, k, v = (torch.tensor(ins[x]) for x in "QKV")
    want = F.scaled_dot_product_attention(q, k.transpose(1, 2), v, is_causal=True, scale=1.0).numpy()
    new, old = _attention(h, n, d, zero_masked=True), _attention(h, n, d, zero_masked=False)
    np.testing.assert_allclose(vm.evaluate(new, ins)[0], want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vm.evaluate(old, ins)[0], want, rtol=1e-10, atol=1e-12)
    # every logit MASKED + 5: SDPA and the zero-masked form average the kept elements alone; the masked form gives
    # each masked element exp(-5) of a kept one's weight
    ins2 = dict(ins, Q=np.full((h, n, d), 1.0), K=np.full((h, d, n), (MASKED + 5.0) / d))
    q2, k2 = torch.tensor(ins2["Q"]), torch.tensor(ins2["K"])
    want2 = F.scaled_dot_product_attention(q2, k2.transpose(1, 2), v, is_causal=True, scale=1.0).numpy()
    np.testing.assert_allclose(vm.evaluate(new, ins2)[0], want2, rtol=1e-10, atol=1e-12)
    assert not np.allclose(vm.evaluate(old, ins2)[0], want2, atol=1e-3)


def test_a_fully_masked_row_is_nan_in_the_zero_masked_form() -> None:
    # 0 / 0: undefined over the reals, NaN in floats (the masked form averages V over the row instead)
    rng = np.random.default_rng(1)
    ins = _ins(1, 16, 8, rng)
    ins["M"] = ins["M"].copy()
    ins["M"][0, 3, :] = False
    out = vm.evaluate(_attention(1, 16, 8, zero_masked=True), ins)[0]
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out, 3, axis=1)).all()


def test_the_two_mask_forms_are_different_functions_to_the_verifier() -> None:
    # over the reals a masked element weighs exp(MASKED - m) > 0 in one form and 0 in the other: never Proved
    old, new = _attention(1, 16, 16, zero_masked=False), _attention(1, 16, 16, zero_masked=True)
    v = vm.verify(old, new)
    assert not isinstance(v, vm.Proved), v


def _divided_after(h: int, n: int, d: int, eps: float | None = None) -> vm.Graph:
    """``where(M, exp(c - max c), 0) V / sum(...)`` (the division after the matmul, as the search rewrites it);
    ``eps``: the masked branch ``eps`` instead of 0."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, d), vm.float32), g.input("K", (h, d, n), vm.float32), \
        g.input("V", (h, n, d), vm.float32)
    m = g.input("M", (1, n, n), vm.bool)
    s = g.matmul(q, k)
    c = g.where(m, s, g.shift(g.scale(s, 0.0), MASKED))
    z = g.scale(c, 0.0) if eps is None else g.shift(g.scale(c, 0.0), eps)
    e = g.where(m, g.exp(g.sub(c, g.max(c, axis=2))), z)
    g.output(g.div(g.matmul(e, v), g.sum(e, axis=2)))
    return g


def _looped(mg: vm.Graph) -> bool:
    return any(n.op == "rescaled_sum" for k in mg.nodes if k.op == "custom" for n in k.attr("block").nodes)


def test_zero_masked_attention_lowers_to_an_online_softmax_that_is_proved_and_fp_safe() -> None:
    from verimirage.pipeline.fpsafe import SafetyChecker

    g = _attention(2, 32, 16, zero_masked=True)
    lows, _ = lower_all(_divided_after(2, 32, 16), franges=(2,), rank=pricing.cost)
    mg = next(low.mugraph for low in lows if _looped(low.mugraph))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    assert SafetyChecker(g, 0).check(mg) is None
    ins = _ins(2, 32, 16, np.random.default_rng(2))
    np.testing.assert_allclose(vm.evaluate(mg, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-10, atol=1e-12)


def test_the_online_softmax_needs_an_exact_zero_in_the_masked_branch() -> None:
    # where(M, exp(c - m), eps) does not rescale with exp(c - m): no rescaled accumulator may be built for it
    lows, _ = lower_all(_divided_after(1, 32, 16, eps=1e-3), franges=(2,), rank=pricing.cost)
    assert lows and not any(_looped(low.mugraph) for low in lows)
    lows, _ = lower_all(_divided_after(1, 32, 16), franges=(2,), rank=pricing.cost)
    assert any(_looped(low.mugraph) for low in lows)


def test_the_models_causal_programs_weigh_masked_elements_zero() -> None:
    for name in ("causal_attention", "softcap_attention"):
        g = get_model(name, small=True)
        assert any(n.op == "where" and g.nodes[n.args[2][0]].op == "scale" for n in g.nodes), name


# --------------------------------------------------------------------------- the constant mask and the skip


def _causal_src(h: int, n: int, d: int, *, offset: int = 0, zero_masked: bool = True, mask: str = "tril",
                dt: vm.DType = vm.float32) -> vm.Graph:
    """Attention over a causal mask, the division after the matmul (as the search writes it): ``mask`` "tril" (the
    constant) or "input" (a vm.bool input ``M``)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, d), dt), g.input("K", (h, d, n), dt), g.input("V", (h, n, d), dt)
    m = g.tril_mask((1, n, n), offset) if mask == "tril" else g.input("M", (1, n, n), vm.bool)
    s = g.matmul(q, k)
    c = g.where(m, s, g.shift(g.scale(s, 0.0), MASKED))
    e = g.exp(g.sub(c, g.max(c, axis=2)))
    if zero_masked:
        e = g.where(m, e, g.scale(c, 0.0))
    g.output(g.div(g.matmul(e, v), g.sum(e, axis=2)))
    return g


def _flash(g: vm.Graph, rows: int, frange: int) -> vm.MuGraph:
    """The online-softmax kernel of ``g`` with a grid of (heads, row blocks) and a loop of ``frange`` (the causal
    mask searched as an input and given back, :mod:`verimirage.rewrite.causal`)."""
    from verimirage.rewrite.causal import mask_inputs, restore_masks

    h, n = g.inputs[0].shape[0], g.inputs[0].shape[1]
    g2, masks = mask_inputs(g)
    lows, _ = lower_all(g2, grids=(h, n // rows), franges=(frange,), rank=pricing.cost)
    mg = next(low.mugraph for low in lows if _looped(low.mugraph)
              and next(k for k in low.mugraph.nodes if k.op == "custom").attr("block").grid == (h, n // rows))
    return restore_masks(mg, masks)


def _with_limit(mg: vm.MuGraph, flimit: tuple[int, int, int, int]) -> vm.MuGraph:
    import dataclasses

    from verimirage.ir.graph import Node, make_attrs

    nodes = list(mg.nodes)
    i = next(j for j, k in enumerate(nodes) if k.op == "custom")
    at = dict(nodes[i].attrs)
    at["block"] = dataclasses.replace(at["block"], flimit=flimit)
    nodes[i] = Node("custom", nodes[i].args, make_attrs(at), nodes[i].outs)
    out = vm.MuGraph._from_parts(nodes, mg.outputs_refs)
    out.check()
    return out


def _qkv(h: int, n: int, d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"Q": rng.uniform(-1, 1, (h, n, d)), "K": rng.uniform(-1, 1, (h, d, n)), "V": rng.uniform(-1, 1, (h, n, d))}


@pytest.mark.parametrize("offset", [0, 3, -2])
def test_tril_mask_is_torch_tril_and_reads_back(offset: int) -> None:
    torch = pytest.importorskip("torch")
    g = vm.Graph()
    x = g.input("X", (2, 5, 7), vm.float32)
    g.output(g.where(g.tril_mask((1, 5, 7), offset), x, g.scale(x, 0.0)))
    a = np.random.default_rng(0).standard_normal((2, 5, 7))
    np.testing.assert_array_equal(vm.evaluate(g, {"X": a})[0], torch.tensor(a).tril(offset).numpy())
    assert vm.Graph.parse(str(g)) == g and vm.Graph.from_json(g.to_json()) == g
    with pytest.raises(vm.GraphError, match="tril_mask"):
        g.apply("tril_mask", [], {"shape": (4,), "offset": 0})
    with pytest.raises(vm.GraphError, match="tril_mask"):
        g.apply("tril_mask", [x], {"shape": (4, 4), "offset": 0})


def test_masks_of_different_offsets_are_different_functions_to_the_verifier() -> None:
    def prog(offset: int, twice: bool = False) -> vm.Graph:
        g = vm.Graph()
        x = g.input("X", (1, 16, 16), vm.float32)
        y = g.scale(g.scale(x, 2.0), 0.5) if twice else x
        g.output(g.sum(g.where(g.tril_mask((1, 16, 16), offset), y, g.scale(y, 0.0)), axis=2))
        return g

    assert isinstance(vm.verify(prog(0), prog(0, twice=True)), vm.Proved)
    assert not isinstance(vm.verify(prog(0), prog(1)), vm.Proved)
    assert not isinstance(vm.verify(prog(0), prog(-1)), vm.Proved)


def test_the_skipping_kernel_is_proved_certified_and_matches_float64(tmp_path: object) -> None:
    from verimirage.rewrite.causal import with_skips
    from verimirage.smt.certify import make_certificate

    g = _causal_src(2, 64, 16)
    sk = with_skips(_flash(g, 16, 4))
    assert sk is not None
    bg = next(k for k in sk.nodes if k.op == "custom").attr("block")
    assert bg.flimit == (1, 16, 15, 16)
    assert vm.MuGraph.parse(str(sk)) == sk and vm.MuGraph.from_json(sk.to_json()) == sk
    ins = _qkv(2, 64, 16)
    np.testing.assert_allclose(vm.evaluate(sk, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-10, atol=1e-12)
    v = vm.verify(g, sk)
    assert isinstance(v, vm.Proved), v
    cert = make_certificate(g, sk, v, rules=["partition.loop", "partition.causal_skip"])
    path = tmp_path / "c.json"  # type: ignore[operator]
    cert.save(path)
    assert isinstance(vm.check_certificate(path), vm.Proved)


def test_the_skipping_kernel_runs_in_the_interpreter_and_matches_float64() -> None:
    torch = pytest.importorskip("torch")
    from verimirage.backend.codegen import generate
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16)
    sk = with_skips(_flash(g, 16, 4))
    src = generate(sk).source
    assert "it_stop = tl.minimum((pid1 * 16 + 15) // 16 + 1, 4)" in src and "a3_ptr" not in src  # mask not loaded
    ins = _qkv(2, 64, 16, seed=3)
    out = vm.compile(sk)(*[torch.tensor(ins[x], dtype=torch.float32) for x in "QKV"])
    out = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_allclose(out.double().numpy(), vm.evaluate(g, ins)[0], rtol=1e-4, atol=1e-5)


def test_a_skip_of_a_tile_that_keeps_elements_is_not_proved() -> None:
    # iteration it of row block b runs only for 32 it <= 16 b: the diagonal tiles of odd blocks are skipped
    g = _causal_src(2, 64, 16)
    bad = _with_limit(_flash(g, 16, 4), (1, 16, 0, 32))
    ins = _qkv(2, 64, 16)
    assert not np.allclose(vm.evaluate(bad, ins)[0], vm.evaluate(g, ins)[0])
    assert not isinstance(vm.verify(g, bad), vm.Proved)


def test_a_skip_over_a_mask_that_is_an_input_is_not_proved() -> None:
    # any mask may be passed: a tile above the diagonal may keep elements
    g = _causal_src(2, 64, 16, mask="input")
    bad = _with_limit(_flash(g, 16, 4), (1, 16, 15, 16))
    assert not isinstance(vm.verify(g, bad), vm.Proved)


def test_a_skip_where_masked_elements_weigh_exp_of_minus_30000_is_not_proved() -> None:
    # where(M, s, -30000) alone: a masked element weighs exp(-30000 - m) > 0 over the reals, so skipping its tile
    # changes the function (in floats it is 0: the verifier is right to refuse it all the same)
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16, zero_masked=False)
    sk = with_skips(_flash(g, 16, 4))
    assert sk is not None
    assert isinstance(vm.verify(g, _flash(g, 16, 4)), vm.Proved)
    assert not isinstance(vm.verify(g, sk), vm.Proved)


def test_a_skip_with_a_mask_of_another_offset_is_not_proved() -> None:
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16, offset=0)
    other = with_skips(_flash(_causal_src(2, 64, 16, offset=-8), 16, 4))
    assert other is not None
    assert not isinstance(vm.verify(g, other), vm.Proved)


@pytest.mark.parametrize("offset", [-1, 20])
def test_skips_of_shifted_masks_are_proved(offset: int) -> None:
    # offset -1: the first row keeps nothing (0 / 0, undefined in both programs alike); 20: a tile past the
    # diagonal block is kept too
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16, offset=offset)
    sk = with_skips(_flash(g, 16, 4))
    assert sk is not None and next(k for k in sk.nodes if k.op == "custom").attr("block").flimit == (
        1, 16, 15 + offset, 16)
    assert isinstance(vm.verify(g, sk), vm.Proved)


def test_loop_iterations_count_the_skipped_tiles() -> None:
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.causal import with_skips
    from verimirage.rewrite.cost import loop_iterations

    g = _causal_src(2, 64, 16)
    full = _flash(g, 16, 4)
    sk = with_skips(full)
    assert sk is not None
    assert loop_iterations(next(k for k in sk.nodes if k.op == "custom").attr("block")) == 2.5  # (1 + 2 + 3 + 4) / 4
    assert cost(sk).tc_flops < cost(full).tc_flops and sk.num_kernels == 1


@pytest.mark.slow  # an sm_90 compile in a subprocess: minutes on a loaded 2-core machine
def test_the_skipping_kernel_compiles_for_sm90(tmp_path: object) -> None:
    from verimirage.backend.codegen import generate
    from verimirage.backend.gpucompile import compile_modules
    from verimirage.backend.runtime import write_module
    from verimirage.rewrite.causal import mask_inputs, restore_masks, with_skips

    g, masks = mask_inputs(_causal_src(2, 128, 64, dt=vm.float16))
    lows, _ = lower_all(g, grids=(2,), franges=(2,), rank=pricing.cost)
    sk = next(s for low in lows if "partition.split_kv" not in low.steps
              and (s := with_skips(restore_masks(low.mugraph, masks))) is not None)
    assert "it_stop" in generate(sk).source
    rep = compile_modules([write_module(generate(sk), tmp_path)])
    assert all(r["ok"] for kernels in rep.values() for r in kernels.values()), rep


def test_sdpa_is_causal_lifts_to_the_constant_mask_with_zero_masked_weights() -> None:
    """ATen's causal attention (the fused CPU op) lifts with a ``tril_mask`` (no constant mask input) and the masked
    weights exactly 0, equal to ATen in float64 (output and log-sum-exp); the search then skips its masked tiles."""
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    from verimirage.integrations import capture

    aten = torch.ops.aten
    B, H, L, D = 1, 2, 64, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    fwd = make_fx(lambda q, k, v: aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2])(
        *(x.float() for x in (q, k, v)))  # (traced in float32; evaluated in float64 below)
    lifted = capture.lift([n for n in fwd.graph.nodes if n.op == "call_function"])
    assert all(c.dtype != torch.bool for _, c in lifted.consts)  # (the mask is no constant input)
    gr = lifted.graph
    masks = [n for n in gr.nodes if n.op == "tril_mask"]
    assert masks and all(n.attr("offset") == 0 and n.attr("shape") == (L, L) for n in masks)
    assert any(n.op == "where" and gr.nodes[n.args[2][0]].op == "scale" for n in gr.nodes)  # exact zeros
    ph = [n.name for n in fwd.graph.nodes if n.op == "placeholder"]
    vals = dict(zip(ph, [q, k, v], strict=True))
    feed = {f"in{i}": vals[p.name].numpy() for i, p in enumerate(lifted.inputs)}
    feed.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(gr, feed)
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)[:2]
    outs = [np.asarray(got[i]).reshape(shape) for _, i, shape, _b in lifted.out_map]
    np.testing.assert_allclose(outs[0], o.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(outs[1], lse.numpy(), rtol=1e-9, atol=1e-10)


def test_a_loop_bound_on_the_heads_axis_is_not_proved() -> None:
    # a per-block bound read on the wrong grid axis (heads): head 0 would run only its first tile
    g = _causal_src(2, 64, 16)
    bad = _with_limit(_flash(g, 16, 4), (0, 1, 0, 2))
    assert not isinstance(vm.verify(g, bad), vm.Proved)


def test_a_skip_that_changes_a_row_max_is_not_proved() -> None:
    # the row max of where(M, s, -30000) is an output: a skipped tile's -30000 is part of it over the reals
    from verimirage.rewrite.causal import mask_inputs, restore_masks, with_skips

    g = vm.Graph()
    q, k = g.input("Q", (2, 64, 16), vm.float32), g.input("K", (2, 16, 64), vm.float32)
    s = g.matmul(q, k)
    g.output(g.max(g.where(g.tril_mask((1, 64, 64)), s, g.shift(g.scale(s, 0.0), MASKED)), axis=2))
    g2, masks = mask_inputs(g)
    lows, _ = lower_all(g2, grids=(2, 4), franges=(4,), rank=pricing.cost)
    sk = next(x for low in lows if (x := with_skips(restore_masks(low.mugraph, masks))) is not None)
    assert not isinstance(vm.verify(g, sk), vm.Proved)


# --------------------------------------------------------------------------- the tiles below the diagonal (codegen)


def _full_bound(src: str) -> str:
    import re

    m = re.search(r"it_full = (.*)\n", src)
    assert m is not None, src
    return m.group(1)


@pytest.mark.parametrize(("rows", "frange", "offset"), [(16, 4, 0), (16, 2, 0), (32, 4, 0), (32, 4, 5), (16, 4, 20),
                                                       (16, 4, -1), (32, 4, -20)])
def test_the_constant_mask_loop_runs_only_tiles_that_are_all_true(rows: int, frange: int, offset: int) -> None:
    # codegen splits the loop of a kernel reading a causal mask: first the iterations whose mask tile is true
    # everywhere (the mask the constant 1.0, so where() folds away), then the others with the mask computed.
    # Checked for every block: each iteration of the first loop reads an all-true tile of tril(offset), and the
    # first loop takes every leading all-true tile (its count: the number before the first tile with a False)
    from verimirage.backend.codegen import generate
    from verimirage.rewrite.causal import with_skips

    n = 64
    g = _causal_src(2, n, 16, offset=offset)
    full = _flash(g, rows, frange)
    for mg in (full, with_skips(full)):
        if mg is None:
            continue  # (an offset of -20 for 32 rows: no skip, the first row block keeps nothing in some rows)
        src = generate(mg).source
        assert src.count("for it in range(") == 2 and "for it in range(it_full, " in src, src
        bound = _full_bound(src)
        mask = np.tril(np.ones((n, n), dtype=bool), offset)
        cols = n // frange
        for b in range(n // rows):
            got = eval(bound.replace("tl.minimum", "min").replace("tl.maximum", "max"),
                       {"pid1": b, "it_stop": frange, "min": min, "max": max})
            tiles = [mask[b * rows:(b + 1) * rows, it * cols:(it + 1) * cols].all() for it in range(frange)]
            lead = next((it for it, t in enumerate(tiles) if not t), frange)
            assert got == lead, (b, got, tiles)


@pytest.mark.parametrize(("rows", "frange", "offset"), [(16, 4, 0), (16, 2, 0), (32, 4, 20), (16, 4, -1)])
def test_the_split_loop_kernel_matches_float64_in_the_interpreter(rows: int, frange: int, offset: int) -> None:
    torch = pytest.importorskip("torch")
    from verimirage.backend.codegen import LaunchConfig, TileOptions, generate
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16, offset=offset)
    ins = _qkv(2, 64, 16, seed=5)
    want = vm.evaluate(g, ins)[0]
    full = _flash(g, rows, frange)
    for mg in (full, with_skips(full)):
        assert mg is not None
        src = generate(mg).source
        # (rank 2: the one-head-per-block kernel's values without their leading size-1 dim, TileOptions.rank2)
        assert "it_full" in src and "tl.reshape" not in src and "tl.zeros((64, 16), tl.float32)" in src, src
        assert "tl.reshape" in generate(mg, TileOptions(rank2=False)).source
        for tiles in (TileOptions(), TileOptions(rank2=False), TileOptions(dot_min_m=16)):
            out = vm.compile(mg, config=LaunchConfig(tiles=tiles))(*[torch.tensor(ins[x], dtype=torch.float32)
                                                                      for x in "QKV"])
            out = out[0] if isinstance(out, (tuple, list)) else out
            np.testing.assert_allclose(out.double().numpy(), want, rtol=1e-4, atol=1e-5, equal_nan=True)


def test_causal_row_blocks_launch_the_longer_half_first_as_a_permutation() -> None:
    """The causal kernel's row blocks launch in a balanced order (``codegen._KernelGen.causal_row_axis``): the
    longer half first, then the rest from the shortest, so that the second wave's short blocks land beside the
    first wave's long ones. It must be a permutation of the row blocks (every block computed once; the kernels
    match float64 in ``test_the_split_loop_kernel_matches_float64_in_the_interpreter``, which runs this order)."""
    from verimirage.backend.codegen import generate

    g = _causal_src(2, 64, 16, offset=0)
    src = generate(_flash(g, 16, 4)).source
    line = "pid1 = tl.where(tl.program_id(1) < 2, 3 - tl.program_id(1), tl.program_id(1) - 2)"
    assert line in src, src
    for r in range(3, 34):
        order = [(r - 1 - p) if p < r // 2 else p - r // 2 for p in range(r)]
        assert sorted(order) == list(range(r)) and order[: r // 2] == list(range(r - 1, r - 1 - r // 2, -1))
