"""Launch order of looped kernels with products (issue 22, seventeenth session): the grid axes along which the blocks
read the same streamed tiles (attention's query tiles of one head, which share its K and V tiles) launch first
(``codegen.SHARER_ORDER``, :func:`~verimirage.backend.codegen._sharer_order`); a GEMM's or a GEMV's order stays.
Measured on an H100 (benchmarks/perf/NOTES.md session 17m): bias_attention's 64 x 64 design 20.0-20.5 -> 19.7-19.9 us
launched directly, in three calls."""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import codegen
from verimirage.backend.codegen import LaunchConfig, TileOptions, _sharer_order, generate
from verimirage.ir.graph import node_list

H, N, D = 2, 256, 64  # 2 heads x 4 query tiles of 64 rows, 4 key tiles of 64


def _attention() -> vm.MuGraph:
    """bias_attention's 64 x 64 design (the models set's pick) at 2 heads x 256 tokens."""
    t = "f16[1,64,64]"
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='Q'}} : f16[{H},{N},{D}]
  %1 = input {{name='K'}} : f16[{H},{D},{N}]
  %2 = input {{name='V'}} : f16[{H},{N},{D}]
  %3 = input {{name='BIAS'}} : f16[{H},{N},{N}]
  %4 = custom %0, %1, %2, %3 {{frange={N // 64}, grid=({H}, {N // 64})}} : f16[{H},{N},{D}] {{
    %0 = input {{arg=0, fmap=None, imap=(0, 1), shape=({H}, {N}, {D})}} : {t}
    %1 = input {{arg=1, fmap=2, imap=(0, None), shape=({H}, {D}, {N})}} : {t}
    %2 = input {{arg=2, fmap=1, imap=(0, None), shape=({H}, {N}, {D})}} : {t}
    %3 = input {{arg=3, fmap=2, imap=(0, 1), shape=({H}, {N}, {N})}} : {t}
    %4 = matmul %0, %1 : {t}
    %5 = add %3, %4 : {t}
    %6 = max %5 {{axis=2}} : f16[1,64,1]
    %7 = running_max %6 : f16[1,64,1]
    %8 = sub %5, %7 : {t}
    %9 = exp %8 : {t}
    %10 = matmul %9, %2 : {t}
    %11 = rescaled_sum %10, %7 : {t}
    %12 = sum %9 {{axis=2}} : f16[1,64,1]
    %13 = rescaled_sum %12, %7 : f16[1,64,1]
    %14 = div %11, %13 : {t}
    output %14 {{omap=(0, 1)}}
  }}
  return %4
}}""")


def _gemm() -> vm.MuGraph:
    """A (128, 256) @ (256, 128) product in 64 x 64 output tiles over a K loop of 2: each operand is shared along the
    other's grid axis."""
    return vm.MuGraph.parse("""mugraph {
  %0 = input {name='A'} : f16[128,256]
  %1 = input {name='B'} : f16[256,128]
  %2 = custom %0, %1 {frange=2, grid=(2, 2)} : f16[128,128] {
    %0 = input {arg=0, fmap=1, imap=(0, None), shape=(128, 256)} : f16[64,128]
    %1 = input {arg=1, fmap=0, imap=(None, 1), shape=(256, 128)} : f16[128,64]
    %2 = matmul %0, %1 : f16[64,64]
    %3 = loop_sum %2 : f16[64,64]
    output %3 {omap=(0, 1)}
  }
  return %2
}""")


def _pids(src: str) -> dict[int, int]:
    return {int(a): int(b) for a, b in re.findall(r"pid(\d+) = tl\.program_id\((\d+)\)", src)}


def test_attention_launches_a_heads_query_tiles_consecutively() -> None:
    mg = _attention()
    ms = generate(mg)
    assert _pids(ms.source) == {0: 1, 1: 0}
    assert ms.kernels[0].grid == (N // 64, H)  # query tiles on CUDA's fastest axis
    assert f"k4[({N // 64}, {H})]" in ms.source
    # off by the tile option or the module switch: the block graph's order
    assert _pids(generate(mg, TileOptions(stream_order=False)).source) == {0: 0, 1: 1}


def test_the_switch_restores_the_block_graphs_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codegen, "SHARER_ORDER", False)
    ms = generate(_attention())
    assert _pids(ms.source) == {0: 0, 1: 1}
    assert ms.kernels[0].grid == (H, N // 64)


def test_a_gemm_keeps_its_order() -> None:
    mg = _gemm()
    n = next(n for n in node_list(mg) if n.op == "custom")
    assert _sharer_order(n.attr("block")) is None
    assert _pids(generate(mg).source) == {0: 0, 1: 1}


@pytest.mark.parametrize("order", [True, False])
def test_reordered_attention_matches_float64(order: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(codegen, "SHARER_ORDER", order)
    fn = vm.compile(_attention(), config=LaunchConfig(4, 2))
    rng = np.random.default_rng(5)
    q, k, v = (0.3 * rng.standard_normal(s) for s in ((H, N, D), (H, D, N), (H, N, D)))
    b = rng.standard_normal((H, N, N))
    q, k, v, b = (a.astype(np.float16).astype(np.float64) for a in (q, k, v, b))
    out = fn(*(torch.tensor(a, dtype=torch.float16) for a in (q, k, v, b)))
    out = out[0] if isinstance(out, tuple) else out
    s = q @ k + b
    e = np.exp(s - s.max(axis=2, keepdims=True))
    ref = (e / e.sum(axis=2, keepdims=True)) @ v
    assert np.linalg.norm(out.numpy().astype(np.float64) - ref) <= 2e-3 * np.linalg.norm(ref)
