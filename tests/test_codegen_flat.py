"""Flat elementwise kernels (issue 22, batchnorm_relu; ``TileOptions.flat``, ``codegen.flat_shape``): a loop-free kernel
of elementwise ops whose tiles line up with its output's is emitted over one flat index range of its output, each
operand read at the element's broadcast coordinates (Inductor's pointwise form), whatever the block graph's tiling.
The μGraph is unchanged; the flat kernel must compute what the tiled one computes (float64 and tiled references in the
interpreter, non-contiguous operands, several outputs, a merged launch), and kernels it does not compute alike are
refused (a loop, a reduction, a transposed operand, tiles that do not line up)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig, TileOptions, flat_shape, generate
from verimirage.backend.tuning import FLAT_BLOCK, candidate_configs, recommend, tuned_module
from verimirage.ir.graph import node_list

N, C, HW = 2, 16, 40


def _tup(xs: list) -> str:
    return f"({', '.join(map(str, xs))}{',' if len(xs) == 1 else ''})"


def _bn(nb: int, cb: int, wb: int, dt: str = "f32", two_outputs: bool = False) -> vm.MuGraph:
    """batchnorm + relu over (N, C, HW) in blocks of nb x cb x wb (params (C, 1)); optionally a second output
    (the affine part before the relu)."""
    grid, imap = [], []
    for dim, (size, per) in enumerate(((N, nb), (C, cb), (HW, wb))):
        if per < size:
            grid.append(size // per)
            imap.append(dim)
    grid, imap = grid or [1], imap or [0]
    pmap = _tup(["0" if d == 1 and g > 1 else "None" for d, g in zip(imap, grid, strict=True)])
    t, p = f"{dt}[{nb},{cb},{wb}]", f"{dt}[{cb},1]"
    params = "\n".join(f"    %{i} = input {{arg={i}, fmap=None, imap={pmap}, shape=({C}, 1)}} : {p}" for i in (1, 2, 3))
    second = f"    output %6 {{omap={_tup(imap)}}}\n" if two_outputs else ""
    res = f"{dt}[{N},{C},{HW}]"
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : {res}
  %1 = input {{name='MEAN'}} : {dt}[{C},1]
  %2 = input {{name='G'}} : {dt}[{C},1]
  %3 = input {{name='B'}} : {dt}[{C},1]
  %4 = custom %0, %1, %2, %3 {{frange=1, grid={_tup(grid)}}} : {res}{', ' + res if two_outputs else ''} {{
    %0 = input {{arg=0, fmap=None, imap={_tup(imap)}, shape=({N}, {C}, {HW})}} : {t}
{params}
    %4 = sub %0, %1 : {t}
    %5 = mul %4, %2 : {t}
    %6 = add %5, %3 : {t}
    %7 = relu %6 : {t}
    output %7 {{omap={_tup(imap)}}}
{second}  }}
  return {'%4.0, %4.1' if two_outputs else '%4'}
}}""")


def _inputs(dt: str = "f32", seed: int = 0) -> list:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    tdt = {"f32": torch.float32, "f16": torch.float16}[dt]
    xs = [rng.normal(0, 1, (N, C, HW)), rng.normal(0, 1, (C, 1)), rng.normal(1, 0.5, (C, 1)), rng.normal(0, 1, (C, 1))]
    return [torch.tensor(x, dtype=tdt) for x in xs]


def _reference(x, m, g, b) -> np.ndarray:  # type: ignore[no-untyped-def]
    x, m, g, b = (t.double().numpy() for t in (x, m, g, b))
    return np.maximum((x - m) * g + b, 0.0)


def _run(mg: vm.MuGraph, config: LaunchConfig, ins: list) -> list[np.ndarray]:
    got = vm.compile(mg, config=config)(*ins)
    got = got if isinstance(got, (tuple, list)) else (got,)
    return [t.double().numpy() for t in got]


@pytest.mark.parametrize("tiles", [(1, 1, HW), (2, 16, 8), (1, 8, 20), (2, 1, 40), (1, 4, 5), (2, 16, 40)])
def test_flat_kernel_matches_float64_and_the_tiled_kernel(tiles: tuple[int, int, int]) -> None:
    mg = _bn(*tiles)
    (bg,) = [n.attr("block") for n in node_list(mg) if n.op == "custom"]
    ins = _inputs()
    assert flat_shape(bg, [vm.TensorType(tuple(x.shape), vm.float32) for x in ins]) == (N, C, HW)
    src = generate(mg, TileOptions(flat=128)).source
    assert "Flat: the 1280 elements of (2, 16, 40), 128 a block" in src
    assert "c1 = (e // 40) % 16" in src and "a1_ptr + c1 * a1_s0" in src  # the channel, gathered per element
    ref = _reference(*ins)
    (flat,) = _run(mg, LaunchConfig(4, 1, TileOptions(flat=128)), ins)
    (tiled,) = _run(mg, LaunchConfig(4, 1, TileOptions()), ins)
    assert np.array_equal(flat, tiled)  # the same fp32 expressions per element
    assert np.abs(flat - ref).max() < 1e-5


def test_flat_kernel_masks_a_partial_last_block_and_reads_non_contiguous_operands() -> None:
    torch = pytest.importorskip("torch")
    mg = _bn(1, 8, 20, two_outputs=True)
    ins = _inputs(seed=1)
    # X as a transposed view of a (HW, C, N) tensor, MEAN as every other row of a (2C, 1) tensor
    x = ins[0].permute(2, 1, 0).contiguous().permute(2, 1, 0)
    m = torch.cat([ins[1], ins[1] * 0 + 99.0], 1).reshape(2 * C, 1)[::2]
    assert not x.is_contiguous() and not m.is_contiguous()
    src = generate(mg, TileOptions(flat=512)).source
    assert "inside = e < 1280" in src and src.count("mask=inside") == 6  # four loads, two stores
    relu, affine = _run(mg, LaunchConfig(4, 1, TileOptions(flat=512)), [x, m, ins[2], ins[3]])
    assert np.abs(relu - _reference(*ins)).max() < 1e-5
    xs = [t.double().numpy() for t in ins]
    assert np.abs(affine - ((xs[0] - xs[1]) * xs[2] + xs[3])).max() < 1e-5


def test_flat_kernel_in_fp16_stores_what_the_tiled_kernel_stores() -> None:
    mg = _bn(2, 4, 40, dt="f16")
    ins = _inputs("f16", seed=2)
    (flat,) = _run(mg, LaunchConfig(tuned=True), ins)
    (tiled,) = _run(mg, LaunchConfig(4, 1, TileOptions()), ins)
    assert np.array_equal(flat, tiled)
    assert np.abs(flat - _reference(*ins)).max() < 4e-3


def test_the_tuning_rules_choose_the_flat_form_for_elementwise_kernels_only() -> None:
    mg = _bn(1, 8, 20)
    (bg,) = [n.attr("block") for n in node_list(mg) if n.op == "custom"]
    types = [n.outs[0] for n in node_list(mg) if n.op == "input"]
    c = recommend(bg, types)
    assert c.tiles.flat == FLAT_BLOCK and c.num_warps == 4 and c.num_stages == 1
    assert "f1024" in c.key()
    # the block graph's own tiles stay among the profiler's configurations
    assert any(x.tiles.flat == 0 for x in candidate_configs(bg, types))
    src = tuned_module(mg).source
    assert re.search(r"k4\[\(2,\)\]", src)  # 1280 elements, 1024 a block


def _parse(body: str, ins: str, out: str, grid: str, frange: int = 1) -> tuple[vm.MuGraph, list]:
    k = ins.count("input")
    mg = vm.MuGraph.parse(f"""mugraph {{
{ins}
  %{k} = custom {', '.join(f'%{i}' for i in range(k))} {{frange={frange}, grid={grid}}} : {out} {{
{body}
  }}
  return %{k}
}}""")
    (bg,) = [n.attr("block") for n in node_list(mg) if n.op == "custom"]
    return mg, bg


def test_kernels_the_flat_form_would_change_are_refused() -> None:
    types = [vm.TensorType((8, 16), vm.float32), vm.TensorType((16, 8), vm.float32)]
    two = "  %0 = input {name='X'} : f32[8,16]\n  %1 = input {name='Y'} : f32[16,8]"
    # Y transposed in the block: its tile (8, 16) is read at (j, i), not at the element's coordinates
    _, bg = _parse("""    %0 = input {arg=0, fmap=None, imap=(0,), shape=(8, 16)} : f32[4,16]
    %1 = input {arg=1, fmap=None, imap=(1,), shape=(16, 8)} : f32[16,4]
    %2 = transpose %1 {a=0, b=1} : f32[4,16]
    %3 = add %0, %2 : f32[4,16]
    output %3 {omap=(0,)}""", two, "f32[8,16]", "(2,)")
    assert flat_shape(bg, types) is None
    # a reduction
    one = "  %0 = input {name='X'} : f32[8,16]"
    _, bg = _parse("""    %0 = input {arg=0, fmap=None, imap=(0,), shape=(8, 16)} : f32[4,16]
    %1 = sum %0 {axis=1} : f32[4,1]
    %2 = sub %0, %1 : f32[4,16]
    output %2 {omap=(0,)}""", one, "f32[8,16]", "(2,)")
    assert flat_shape(bg, types[:1]) is None
    # a loop over the columns
    _, bg = _parse("""    %0 = input {arg=0, fmap=1, imap=(0,), shape=(8, 16)} : f32[4,8]
    %1 = exp %0 : f32[4,8]
    %2 = loop_sum %1 : f32[4,8]
    output %2 {omap=(0,)}""", one, "f32[8,8]", "(2,)", frange=2)
    assert flat_shape(bg, types[:1]) is None
    # the same elementwise kernel, its tiles lined up: accepted
    _, bg = _parse("""    %0 = input {arg=0, fmap=None, imap=(0,), shape=(8, 16)} : f32[4,16]
    %1 = exp %0 : f32[4,16]
    output %1 {omap=(0,)}""", one, "f32[8,16]", "(2,)")
    assert flat_shape(bg, types[:1]) == (8, 16)


def test_an_operand_split_by_another_axis_than_its_output_dim_is_refused() -> None:
    """A (1, 16) row operand whose tile is the block's column slice: accepted; tiles placed differently in an operand
    than in the output: refused."""
    types = [vm.TensorType((8, 16), vm.float32), vm.TensorType((1, 16), vm.float32)]
    ins = "  %0 = input {name='X'} : f32[8,16]\n  %1 = input {name='R'} : f32[1,16]"
    mg, bg = _parse("""    %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(8, 16)} : f32[4,8]
    %1 = input {arg=1, fmap=None, imap=(None, 1), shape=(1, 16)} : f32[1,8]
    %2 = mul %0, %1 : f32[4,8]
    output %2 {omap=(0, 1)}""", ins, "f32[8,16]", "(2, 2)")
    assert flat_shape(bg, types) == (8, 16)
    torch = pytest.importorskip("torch")
    x, r = torch.randn(8, 16), torch.randn(1, 16)
    (got,) = _run(mg, LaunchConfig(4, 1, TileOptions(flat=128)), [x, r])
    assert np.abs(got - (x * r).double().numpy()).max() < 1e-6
    # X's rows split by the grid's second axis and its columns by the first, the output's the other way round: block
    # (i, j) reads X's tile (j, i) and writes the output's (i, j), a permutation of tiles the flat form cannot express
    mg2, bg2 = _parse("""    %0 = input {arg=0, fmap=None, imap=(1, 0), shape=(8, 16)} : f32[4,8]
    %1 = input {arg=1, fmap=None, imap=(1, None), shape=(1, 16)} : f32[1,8]
    %2 = mul %0, %1 : f32[4,8]
    output %2 {omap=(0, 1)}""", ins, "f32[8,16]", "(2, 2)")
    assert flat_shape(bg2, types) is None
    # asked for the flat form, the kernel keeps its tiles and computes the μGraph's function
    assert "Flat:" not in generate(mg2, TileOptions(flat=128)).source
    from verimirage.ir.reference import evaluate

    (want,) = evaluate(mg2, {"X": x.double().numpy(), "R": r.double().numpy()})
    (got2,) = _run(mg2, LaunchConfig(4, 1, TileOptions(flat=128)), [x, r])
    assert np.abs(got2 - want).max() < 1e-6 and np.abs(want - (x * r).double().numpy()).max() > 0.1



def test_flat_kernels_merge_into_one_launch() -> None:
    """Two independent flat kernels in one merged launch (``generate(merge=True)``): each a device function of the
    launch's block index."""
    torch = pytest.importorskip("torch")
    mg = vm.MuGraph.parse("""mugraph {
  %0 = input {name='X'} : f32[8,16]
  %1 = input {name='Y'} : f32[4,32]
  %2 = custom %0 {frange=1, grid=(2,)} : f32[8,16] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(8, 16)} : f32[4,16]
    %1 = exp %0 : f32[4,16]
    output %1 {omap=(0,)}
  }
  %3 = custom %1 {frange=1, grid=(1,)} : f32[4,32] {
    %0 = input {arg=0, fmap=None, imap=(None,), shape=(4, 32)} : f32[4,32]
    %1 = relu %0 : f32[4,32]
    output %1 {omap=(0,)}
  }
  return %2, %3
}""")
    ms = generate(mg, TileOptions(flat=128), merge=True)
    assert len(ms.kernels) == 1 and ms.kernels[0].grid == (2,)
    assert ms.source.count("Flat:") == 2 and "e = p0 * 128" in ms.source
    x, y = torch.randn(8, 16), torch.randn(4, 32)
    got = vm.compile(mg, config=LaunchConfig(4, 1, TileOptions(flat=128)))(x, y)
    assert np.abs(got[0].double().numpy() - np.exp(x.double().numpy())).max() < 1e-5
    assert np.array_equal(got[1].numpy(), torch.relu(y).numpy())
