"""Red-team findings on the causal skip (``tril_mask``, ``BlockGraph.flimit``): the generated kernels computed the
mask and the per-block loop bound in int32, where the verified meaning (``ir.interpret``, every domain, the
certificate checker) computes them exactly.

* A ``tril_mask`` offset near ``2**31`` (``g.tril_mask(shape, 2**31 - 3)``: every element kept) wrapped in
  ``row + offset``: the kernel masked every element of the rows ``>= 3`` (silently wrong values from ``vm.compile``
  of a plain graph); offsets past int32 failed in Triton. The kernel now reads the offset clamped to
  ``[-rows, cols]`` (the same mask).
* A loop bound ``flimit = (axis, a, c, d)`` with ``a (blocks - 1) + c`` past int32 is Proved (its meaning is exact:
  ``(1, 2**30, 0, 1)`` runs every iteration but in block 0), its certificate re-checks, and the kernel's
  ``(pid a + c) // d + 1`` wrapped negative: no iteration ran and the attention rows came out NaN (a tampered search
  cache entry or a hostile μGraph: the re-check and the float64 safety check both pass). The kernel now reads ``a``
  and ``c`` clamped to ``d (frange - 1)`` (the same bound) and refuses, with a GraphError, a bound still past int32.
  The search's skip (``rewrite.causal``) clamps ``c`` the same way, so a huge offset keeps a skip it can compile.

Severity: medium (wrong values, silently, from a verified program; the offsets and bounds are far from the search's
and the models' own).
"""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("offset", [2**31 - 3, 2**31 + 5, 10**12, -(2**31) + 2, -(10**12)])
def test_tril_mask_offset_near_int32_masked_every_row(offset: int) -> None:
    g = vm.Graph()
    x = g.input("X", (1, 8, 8), vm.float32)
    g.output(g.where(g.tril_mask((1, 8, 8), offset), x, g.scale(x, 0.0)))
    xs = np.random.default_rng(0).standard_normal((1, 8, 8))
    want = vm.evaluate(g, {"X": xs})[0]
    np.testing.assert_array_equal(want, xs if offset > 0 else np.zeros_like(xs))
    got = vm.compile(g)(X=torch.tensor(xs, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("flimit", [(1, 2**30, 0, 1), (1, 16, 2**31 - 1, 16), (1, 2**29, 2**30, 1)])
def test_loop_bound_past_int32_ran_no_iteration(flimit: tuple[int, int, int, int]) -> None:
    from test_causal_skip import _causal_src, _flash, _qkv, _with_limit

    g = _causal_src(2, 64, 16)
    mg = _with_limit(_flash(g, 16, 4), flimit)
    assert isinstance(vm.verify(g, mg), vm.Proved)  # (the bound's meaning: every tile the program needs runs)
    ins = _qkv(2, 64, 16, 1)
    want = vm.evaluate(g, ins)[0]
    got = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float32) for k, v in ins.items()}).double().numpy()
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_loop_bound_that_int32_cannot_hold_is_refused() -> None:
    from verimirage.backend.codegen import _loop_header
    from verimirage.ir.graph import BlockGraph

    bg = BlockGraph(nodes=(), outputs=(), grid=(1, 4), frange=4, omaps=(), flimit=(1, 0, 0, 2**31))
    with pytest.raises(vm.GraphError, match="past int32"):
        _loop_header(bg, "range")
    bg = BlockGraph(nodes=(), outputs=(), grid=(1, 4), frange=4, omaps=(), flimit=(1, 2**30, 2**40, 16))
    assert _loop_header(bg, "range")[0] == "    it_stop = tl.minimum((pid1 * 48 + 48) // 16 + 1, 4)"


@pytest.mark.slow
def test_causal_skip_of_a_huge_offset_stays_in_int32() -> None:
    from test_causal_skip import _causal_src, _flash, _qkv

    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16, offset=2**31 - 100)
    sk = with_skips(_flash(g, 16, 4))
    assert sk is not None
    _, _, c, d = next(k for k in sk.nodes if k.op == "custom").attr("block").flimit
    assert c <= d * 3
    assert isinstance(vm.verify(g, sk), vm.Proved)
    ins = _qkv(2, 64, 16, 2)
    got = vm.compile(sk)(**{k: torch.tensor(v, dtype=torch.float32) for k, v in ins.items()}).double().numpy()
    np.testing.assert_allclose(got, vm.evaluate(g, ins)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offset", [10**30, -(10**30), 2**63, 2**62])
def test_tril_mask_offset_past_int64_raised_overflow_error(offset: int) -> None:
    """Finding (low, a user error without its GraphError): a ``tril_mask`` offset past int64 built, then
    ``vm.evaluate`` / ``vm.verify`` raised numpy's OverflowError. Offsets are bounded where the op is checked."""
    g = vm.Graph()
    x = g.input("X", (1, 4, 4), vm.float32)
    with pytest.raises(vm.GraphError, match="tril_mask"):
        g.tril_mask((1, 4, 4), offset)
    g.output(g.where(g.tril_mask((1, 4, 4), 2**62 - 1), x, g.scale(x, 0.0)))  # (the largest: every element kept)
    np.testing.assert_array_equal(vm.evaluate(g, {"X": np.ones((1, 4, 4))})[0], np.ones((1, 4, 4)))


def test_a_concat_of_causal_masks_read_an_unpassed_pointer() -> None:
    """Finding (tenth session, low: a crash, not a value): a concat of block inputs is loaded directly, and a causal
    mask operand (computed in the kernel, never passed) was loaded too: NameError 'a0_ptr' from Triton at the first
    call of vm.compile(where(concat([tril_mask, tril_mask]), x, 0)). Such a concat is now computed from the masks."""
    g = vm.Graph()
    x = g.input("X", (1, 16, 8), vm.float32)
    m = g.concat([g.tril_mask((1, 8, 8), 0), g.tril_mask((1, 8, 8), -2)], axis=1)
    g.output(g.where(m, x, g.scale(x, 0.0)))
    xs = np.random.default_rng(0).standard_normal((1, 16, 8))
    got = vm.compile(g)(torch.tensor(xs, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(got, vm.evaluate(g, {"X": xs})[0], rtol=1e-6, atol=1e-7)


def test_causal_skip_of_a_split_kv_kernel_read_the_wrong_tile_width() -> None:
    """Finding (tenth session, low: wasted verification, never a wrong Proved): with_skips bounded the loop of a
    split-KV kernel (a grid axis splitting the mask's columns too) with columns starting at 0 and tiles of
    cols / frange (32, not 16 here), so its skip dropped needed tiles; the verifier refuted it (float64 witness) each
    time. Such a kernel now gets no skip; a kernel whose grid splits only the rows still does."""
    pytest.importorskip("egglog")
    from tests.test_causal_skip import _causal_src, _flash
    from verimirage.rewrite.causal import with_skips

    g = _causal_src(2, 64, 16)
    split = _flash(g, 32, 2)  # grid (row blocks, KV splits), a loop of 2 tiles of 16 columns
    bg = next(k for k in split.nodes if k.op == "custom").attr("block")
    mask = next(n for n in bg.nodes if n.op == "input" and n.attr("shape") == (1, 64, 64))
    assert [bg.grid[a] for a, d in enumerate(mask.attr("imap")) if d == 2] == [2]  # the columns split
    assert with_skips(split) is None
    assert with_skips(_flash(g, 16, 4)) is not None


def _masked_row_sums(n: int, m: int, grid: int, fr: int, off: int) -> tuple[vm.Graph, vm.MuGraph]:
    """``sum(where(tril_mask(offset), x, 0), axis=2)`` and its one kernel: rows split over ``grid`` blocks, the
    columns walked by a loop of ``fr`` tiles (the mask an inline constant)."""
    from verimirage.ir.builders import BlockBuilder
    from verimirage.ir.graph import node_list
    from verimirage.rewrite.causal import restore_masks

    g = vm.Graph()
    x = g.input("X", (2, n, m), vm.float32)
    g.output(g.sum(g.where(g.tril_mask((1, n, m), off), x, g.scale(x, 0.0)), axis=2))
    mg = vm.MuGraph()
    xi, mi = mg.input("X", (2, n, m), vm.float32), mg.input("M", (1, n, m), vm.bool)
    b = BlockBuilder((2, grid), fr)
    bx, bm = b.input(0, xi.type, (0, 1), 2), b.input(1, mi.type, (None, 1), 2)
    b.output(b.loop_sum(b.sum(b.where(bm, bx, b.scale(bx, 0.0)), axis=2)), (0, 1))
    (o,) = mg.custom(b.build(), [xi, mi])
    mg.output(o)
    return g, restore_masks(mg, {"M": next(k for k in node_list(g) if k.op == "tril_mask")})


@pytest.mark.parametrize("cfg", [(48, 32, 2, 2, -5), (15, 48, 3, 3, 0), (24, 80, 3, 5, 80)])
def test_full_mask_tiles_first_held(cfg: tuple[int, int, int, int, int]) -> None:
    """Held (codegen 9's full_tiles: the iterations whose mask tile is all true first, the mask a constant): odd row
    tiles (5, 24 of 32), column tiles of 12 and 16, offsets below, on and past the diagonal and past int32 (the
    session's run: 32 such kernels), with +inf at every masked position: Proved, and equal to float64 (no inf leaks)."""
    from verimirage.backend.codegen import LaunchConfig, TileOptions, generate

    g, mg = _masked_row_sums(*cfg)
    assert isinstance(vm.verify(g, mg), vm.Proved)
    tiles = TileOptions(unroll_max=0)  # (a for-loop: static_range loops are not split)
    assert "it_full" in generate(mg, tiles=tiles).source
    n, m, off = cfg[0], cfg[1], cfg[4]
    xs = np.random.default_rng(0).standard_normal((2, n, m))
    xs[0][~np.tril(np.ones((n, m), bool), off)] = np.inf
    got = vm.compile(mg, config=LaunchConfig(tiles=tiles))(torch.tensor(xs, dtype=torch.float32)).double().numpy()
    np.testing.assert_allclose(got, vm.evaluate(g, {"X": xs})[0], rtol=1e-5, atol=1e-5)
