"""Launch order of matmul-free kernels (codegen 13, issue 22): a kernel whose grid splits the contiguous last dim of its
largest tensor launches that axis fastest (``TileOptions.stream_order``), so consecutive blocks read neighbouring runs
of the same rows; kernels with ``tl.dot`` keep the block graph's order. Measured on an H100 (benchmarks/perf/NOTES.md,
session 13): batchnorm_relu 39.1 -> 38.3-38.8 us, logsumexp_prefill's 2048 x 4 design 48.7 -> 46.6."""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig, TileOptions, _launch_axes, _stream_order, generate
from verimirage.ir.graph import node_list

N, C, HW = 2, 16, 64


def _bn(nb: int, cb: int, wb: int) -> vm.MuGraph:
    """batchnorm + relu over (N, C, HW) in blocks of nb x cb x wb (a hand-written lowering, as the partitioner
    writes them: the grid axes in the order of the dims they split)."""
    grid, imap = [], []
    for dim, (size, per) in enumerate(((N, nb), (C, cb), (HW, wb))):
        if per < size:
            grid.append(size // per)
            imap.append(dim)

    def tup(xs: list) -> str:
        return f"({', '.join(map(str, xs))}{',' if len(xs) == 1 else ''})"

    pmap = tup(["0" if d == 1 else "None" for d in imap])
    t, p = f"f32[{nb},{cb},{wb}]", f"f32[{cb},1]"
    params = "\n".join(f"    %{i} = input {{arg={i}, fmap=None, imap={pmap}, shape=({C}, 1)}} : {p}" for i in (1, 2))
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f32[{N},{C},{HW}]
  %1 = input {{name='MEAN'}} : f32[{C},1]
  %2 = input {{name='G'}} : f32[{C},1]
  %3 = custom %0, %1, %2 {{frange=1, grid={tup(grid)}}} : f32[{N},{C},{HW}] {{
    %0 = input {{arg=0, fmap=None, imap={tup(imap)}, shape=({N}, {C}, {HW})}} : {t}
{params}
    %3 = sub %0, %1 : {t}
    %4 = mul %3, %2 : {t}
    %5 = relu %4 : {t}
    output %5 {{omap={tup(imap)}}}
  }}
  return %3
}}""")


def _pids(src: str) -> dict[int, int]:
    return {int(a): int(b) for a, b in re.findall(r"pid(\d+) = tl\.program_id\((\d+)\)", src)}


def test_the_axis_splitting_the_contiguous_dim_launches_first() -> None:
    mg = _bn(2, 8, 16)  # grid (2 channel groups, 4 column tiles)
    src = generate(mg).source
    assert _pids(src) == {0: 1, 1: 0}
    assert "k3[(4, 2)]" in src
    old = generate(mg, TileOptions(stream_order=False)).source
    assert _pids(old) == {0: 0, 1: 1}
    assert "k3[(2, 4)]" in old
    # three axes: columns, then channels, then images (the tensor's row-major order)
    src3 = generate(_bn(1, 8, 16)).source
    assert _pids(src3) == {0: 2, 1: 1, 2: 0}
    assert "k3[(4, 2, 2)]" in src3
    # already in order (the columns are not split): unchanged
    src_rows = generate(_bn(1, 8, HW)).source
    assert _pids(src_rows) == {0: 0, 1: 1}


def test_kernels_with_products_keep_their_order() -> None:
    mg = vm.MuGraph.parse("""mugraph {
  %0 = input {name='X'} : f16[16,64]
  %1 = input {name='W'} : f16[64,64]
  %2 = custom %0, %1 {frange=1, grid=(2, 2)} : f16[16,64] {
    %0 = input {arg=0, fmap=None, imap=(0, None), shape=(16, 64)} : f16[8,64]
    %1 = input {arg=1, fmap=None, imap=(None, 1), shape=(64, 64)} : f16[64,32]
    %2 = matmul %0, %1 : f16[8,32]
    output %2 {omap=(0, 1)}
  }
  return %2
}""")
    n = next(n for n in node_list(mg) if n.op == "custom")
    bg = n.attr("block")
    assert _stream_order(bg, [node_list(mg)[0].outs[0], node_list(mg)[1].outs[0]], n.outs) is None
    assert _pids(generate(mg).source) == {0: 0, 1: 1}


def test_launch_axes_respect_the_65535_limit() -> None:
    assert _launch_axes((4, 70000), [1, 0]) == [1, 0]
    # the first axis may be large; a later one may not: fall back to the largest first
    assert _launch_axes((70000, 4), [1, 0]) == [0, 1]


@pytest.mark.parametrize("order", [True, False])
@pytest.mark.parametrize("tiles", [(2, 8, 16), (1, 8, 16), (1, 4, 32)])
def test_reordered_kernels_match_float64(order: bool, tiles: tuple[int, int, int]) -> None:
    torch = pytest.importorskip("torch")
    mg = _bn(*tiles)
    fn = vm.compile(mg, config=LaunchConfig(4, 1, TileOptions(stream_order=order)))
    rng = np.random.default_rng(3)
    x, mean, gam = (rng.standard_normal(s) for s in ((N, C, HW), (C, 1), (C, 1)))
    out = fn(*(torch.tensor(a, dtype=torch.float32) for a in (x, mean, gam)))
    out = out[0] if isinstance(out, tuple) else out
    ref = np.maximum((x - mean) * gam, 0.0)
    assert np.linalg.norm(out.numpy().astype(np.float64) - ref) <= 1e-6 * np.linalg.norm(ref)
