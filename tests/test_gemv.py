"""One-row products (decode-time GEMVs, issue 23): lowered to a pipelined 16-row ``tl.dot`` of the broadcast row.

The code generator emits ``(1, K) @ (K, N)`` (K, N >= 16, one batch element) as ``tl.dot`` of the row broadcast to
``TileOptions.row_dot`` rows, the accumulator kept inside ``tl.dot`` over the K loop and row 0 read after it; the
tuning rules give such kernels the skinny-matmul configuration (4 warps, 16-row padding, >= 3 stages). Measured on
an H100 (benchmarks/perf/NOTES.md session 7): the layer's gate/up shape at one row ran 80.5-84.5 µs as a 16-row dot
against 120-125 µs as the broadcast multiply and sum.
"""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import tuning
from verimirage.backend.codegen import LaunchConfig, TileOptions, generate
from verimirage.backend.wrap import to_kernels
from verimirage.benchmarks import designs
from verimirage.ir.graph import node_list


def _gated(rows: int = 1, k: int = 64, n: int = 64) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (rows, k), vm.float16)
    w1 = g.input("W1", (k, n), vm.float16)
    w2 = g.input("W2", (k, n), vm.float16)
    g.output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _recs(mg: vm.MuGraph) -> list[LaunchConfig]:
    nodes = node_list(to_kernels(mg))
    return [tuning.recommend(n.attr("block"), [nodes[a].outs[k] for a, k in n.args])
            for n in nodes if n.op == "custom"]


def _run(mg: vm.MuGraph, g: vm.Graph, ins: dict[str, np.ndarray], config: LaunchConfig | None = None) -> np.ndarray:
    import torch

    fn = vm.compile(mg, config=config)
    out = fn(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()})
    return out.double().numpy()


def test_one_row_product_is_a_pipelined_16_row_dot() -> None:
    g = _gated()
    mg = designs.gated_mlp(g, cols=16, k_tile=32)  # grid 4, K loop of 2
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    # the row loaded straight as the dot's (16, K) operand, rows 1..15 masked to zero (no broadcast in the loop)
    assert "mask=(tl.arange(0, 16)[:, None] < 1), other=0.0)" in src and "tl.broadcast_to(" not in src
    assert src.count("tl.dot(") == 2
    assert "tl.static_range" not in src  # a loop feeding tl.dot is left to Triton's pipeliner
    assert "tl.zeros((16, 16), tl.float32)" in src  # the accumulator stays inside tl.dot
    off = generate(mg, tiles=TileOptions(dot_min_m=16, row_dot=0)).source
    assert "tl.dot(" not in off and "tl.sum(" in off
    (c,) = _recs(mg)
    assert (c.num_warps, c.tiles.dot_min_m, c.tiles.row_dot) == (4, 16, 16) and c.num_stages >= 3
    assert LaunchConfig(tiles=TileOptions(row_dot=0)).key().endswith("r0")


def test_a_product_of_several_rows_or_a_short_row_keeps_its_lowering() -> None:
    # 8 rows: the ordinary tl.dot; K = 8 (below tl.dot's 16): the broadcast multiply and sum
    src8 = generate(designs.gated_mlp(_gated(rows=8), cols=16, k_tile=32), tiles=TileOptions(dot_min_m=16)).source
    assert "tl.broadcast_to(v0, (16" not in src8 and "tl.dot(" in src8
    g = vm.Graph()
    x = g.input("X", (1, 8), vm.float16)
    w = g.input("W", (8, 32), vm.float16)
    g.output(g.matmul(x, w))
    assert "tl.dot(" not in generate(vm.MuGraph.from_graph(g)).source


@pytest.mark.parametrize("design,kw", [
    ("gated_mlp", {"cols": 16, "k_tile": 32}),
    ("gated_mlp", {"cols": 32, "k_tile": 64}),  # one iteration: straight-line row dot
    ("gated_mlp_splitk", {"cols": 16, "k_tile": 16, "splits": 2}),
])
def test_one_row_products_match_float64_in_the_interpreter(design: str, kw: dict) -> None:
    g = _gated()
    mg = getattr(designs, design)(g, **kw)
    rng = np.random.default_rng(3)
    ins = {t.name: rng.standard_normal(t.shape) * 0.3 for t in g.inputs}
    ins = {k: v.astype(np.float16).astype(np.float64) for k, v in ins.items()}
    (ref,) = vm.evaluate(g, ins)
    for cfg in (None, LaunchConfig(4, 3, TileOptions(dot_min_m=16, row_dot=0))):
        got = _run(mg, g, ins, cfg)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_row_dot_reads_row_0_exactly_infinities_and_nan() -> None:
    # rows 1..15 of the broadcast are dropped by a select, not by adding products of zeros: an infinite weight
    # times a nonzero row element stays infinite (0 * inf in a zeroed row would make it NaN), NaN stays NaN
    g = vm.Graph()
    x = g.input("X", (1, 32), vm.float16)
    w = g.input("W", (32, 32), vm.float16)
    g.output(g.matmul(x, w))
    mg = vm.MuGraph.from_graph(g)
    assert "tl.dot(" in generate(mg, tiles=TileOptions(dot_min_m=16)).source
    xs = np.zeros((1, 32))
    xs[0, 0] = 1.0
    ws = np.ones((32, 32))
    ws[0, 3] = np.inf
    ws[5, 7] = np.nan
    got = _run(mg, g, {"X": xs, "W": ws})
    assert got[0, 3] == np.inf and np.isnan(got[0, 7]) and got[0, 0] == 1.0


@pytest.mark.slow
def test_row_dot_kernels_compile_for_sm90_with_mma_and_async_copies(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from verimirage.backend.gpucompile import compile_modules

    mods = {"gemv": designs.gated_mlp(_gated(k=1024, n=256), cols=64, k_tile=128),  # one-row dots in a K loop
            "grouped": _grouped(2)[1],  # GQA's 4 query rows over one KV head, K tiles of 16
            "chunked8": _one_step(rows=8, k=1024)[1], "chunked32": _one_step(rows=32, k=1024)[1],
            "pv": _pv(kv=2048, frange=16)[1],  # P (1, 128) @ V (128, 32) per step, V squeezed beside a reshaped P
            "pv_batched": _pv_batched(kv=2048, frange=16)[1]}  # 2 KV heads a block: a batched (2, 16, 128) dot
    paths = {}
    for name, mg in mods.items():
        paths[name] = tmp_path / f"{name}_mod.py"
        paths[name].write_text(tuning.tuned_module(mg).source)
    report = compile_modules(list(paths.values()))
    for name, p in paths.items():
        (k,) = report[str(p)].values()
        assert k["ok"] and (k["mma"] or k["wgmma"]), (name, k)
        if name != "grouped":  # the weights stream as asynchronous copies (grouped: its Q rows go through reshapes)
            assert k["cp_async"] > 0, (name, k)


def _grouped(frange: int = 2) -> tuple[vm.Graph, vm.MuGraph]:
    """Grouped-query scores: 4 query heads over each of 2 KV heads, ``(2, 4, 1, 32) @ (2, 1, 32, 64)``, one block
    per KV head (its 4 query rows a batch dim the keys do not have), the K loop split ``frange`` ways."""
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    g = vm.Graph()
    q = g.input("Q", (2, 4, 1, 32), vm.float16)
    k = g.input("K", (2, 1, 32, 64), vm.float16)
    g.output(g.matmul(q, k))
    t = _inputs(g)
    b = BlockBuilder((2,), frange)
    qi = b.input(0, t["Q"], (0,), 3)
    ki = b.input(1, t["K"], (0,), 2)
    prod = b.matmul(qi, ki)
    b.output(b.loop_sum(prod) if frange > 1 else prod, (0,))
    return g, _one_kernel(t, b)


@pytest.mark.parametrize("frange", [1, 2])
def test_grouped_rows_over_a_batch_dim_the_weights_lack_are_one_dot(frange: int) -> None:
    g, mg = _grouped(frange)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    # the 4 query rows loaded as the dot's 16 rows, rows 4..15 masked to zero; the keys loaded as its (K, N) operand
    assert "mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)" in src and "tl.broadcast_to(" not in src
    assert "tl.reshape(v1, " not in src
    assert src.count("tl.dot(") == 1
    rng = np.random.default_rng(5)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.5).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_long_row_without_a_loop_keeps_the_broadcast_multiply() -> None:
    # (1, 1024) @ (1024, 32) in one step: 55.0 us as a 16-row dot, 5.3 us as the broadcast multiply (H100)
    from verimirage.backend.codegen import ROW_DOT_MAX_K

    mg = designs.gated_mlp(_gated(k=2 * ROW_DOT_MAX_K, n=32), cols=32, k_tile=2 * ROW_DOT_MAX_K)
    assert "tl.dot(" not in generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "tl.dot(" in generate(designs.gated_mlp(_gated(k=2 * ROW_DOT_MAX_K, n=32), cols=32, k_tile=128),
                                 tiles=TileOptions(dot_min_m=16)).source


def test_few_blocks_get_a_deeper_pipeline() -> None:
    # 64 blocks (half the SMs) streaming 64 K tiles each: 8 stages; 256 blocks: the usual 4
    few = designs.gated_mlp(_gated(k=4096, n=2048), cols=32, k_tile=64)
    many = designs.gated_mlp(_gated(k=4096, n=8192), cols=32, k_tile=64)
    (c_few,) = _recs(few)
    (c_many,) = _recs(many)
    assert c_few.num_stages == 8 and c_many.num_stages == 4


def _one_step(rows: int = 8, k: int = 512, n: int = 64, cols: int = 32) -> tuple[vm.Graph, vm.MuGraph]:
    """``X (rows, k) @ W (k, n)`` as one kernel of ``n / cols`` blocks, the whole K in one step (no for-loop)."""
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    g = vm.Graph()
    x = g.input("X", (rows, k), vm.float16)
    w = g.input("W", (k, n), vm.float16)
    g.output(g.matmul(x, w))
    t = _inputs(g)
    b = BlockBuilder((n // cols,), 1)
    b.output(b.matmul(b.input(0, t["X"], (None,), None), b.input(1, t["W"], (1,), None)), (1,))
    return g, _one_kernel(t, b)


@pytest.mark.parametrize("rows", [8, 32])
def test_a_deep_one_step_product_is_a_loop_of_256_deep_dots(rows: int) -> None:
    # (8, 1024) @ (1024, 32) in one step per block: 10.9 or 95.6 us on an H100 by process; at 32 rows Triton asked
    # for 256 KB of shared memory. Emitted as 4 chunks of 256 accumulated in tl.dot (loads pipelined)
    from verimirage.backend.codegen import ROW_DOT_MAX_K

    g, mg = _one_step(rows=rows, k=2 * ROW_DOT_MAX_K)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "for kc" in src and src.count("tl.dot(") == 1 and f"tl.arange(0, {ROW_DOT_MAX_K})" in src
    assert "tl.arange(0, 512)" not in src
    rng = np.random.default_rng(7)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.3).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    # at most 256 deep: one dot, no loop
    _, short = _one_step(rows=rows, k=ROW_DOT_MAX_K)
    assert "for kc" not in generate(short, tiles=TileOptions(dot_min_m=16)).source


def _pv(kv: int = 64, frange: int = 2) -> tuple[vm.Graph, vm.MuGraph]:
    """Attention's P @ V at one query row: P (2, 1, 1, kv) rows, V (2, kv, 32) read through a reshape to
    (2, 1, kv, 32); one block per head, the kv loop split ``frange`` ways."""
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    g = vm.Graph()
    p = g.input("P", (2, 1, 1, kv), vm.float16)
    v = g.input("V", (2, kv, 32), vm.float16)
    g.output(g.matmul(p, g.reshape(v, (2, 1, kv, 32))))
    t = _inputs(g)
    b = BlockBuilder((2,), frange)
    pi = b.input(0, t["P"], (0,), 3)
    vi = b.input(1, t["V"], (0,), 1)
    b.output(b.loop_sum(b.matmul(pi, b.reshape(vi, (1, 1, kv // frange, 32)))), (0,))
    return g, _one_kernel(t, b)


def test_weights_reshaped_by_size_1_dims_are_loaded_as_the_row_dot_operand() -> None:
    # V is loaded as the dot's rank-2 (K, N) operand (no tl.reshape between its load and tl.dot: Triton pipelines
    # it; the layer's P @ V at bs1 streamed 8.4 MB in 17.9 us on an H100 with the reshape)
    g, mg = _pv()
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    load_v = next(line for line in src.splitlines() if "a1_ptr +" in line)
    assert "tl.arange(0, 32)[:, None]" in load_v and "tl.reshape(v1" not in src  # rank-2 load, no reshape
    rng = np.random.default_rng(11)
    ins = {x.name: (rng.standard_normal(x.shape) * 0.3).astype(np.float16).astype(np.float64) for x in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _pv_batched(kv: int = 64, frange: int = 2, heads: int = 4, group: int = 4, per_block: int = 2
                ) -> tuple[vm.Graph, vm.MuGraph]:
    """Grouped-query P @ V with several KV heads a block: P (heads, group, 1, kv), V (heads, kv, 32) read through a
    reshape to (heads, 1, kv, 32); ``per_block`` KV heads a block (the layer's decode at batch 32), the kv loop split
    ``frange`` ways."""
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    g = vm.Graph()
    p = g.input("P", (heads, group, 1, kv), vm.float16)
    v = g.input("V", (heads, kv, 32), vm.float16)
    g.output(g.matmul(p, g.reshape(v, (heads, 1, kv, 32))))
    t = _inputs(g)
    b = BlockBuilder((heads // per_block,), frange)
    pi = b.input(0, t["P"], (0,), 3)
    vi = b.input(1, t["V"], (0,), 1)
    prod = b.matmul(pi, b.reshape(vi, (per_block, 1, kv // frange, 32)))
    b.output(b.loop_sum(prod) if frange > 1 else prod, (0,))
    return g, _one_kernel(t, b)


@pytest.mark.parametrize("frange,group", [(2, 4), (1, 4), (2, 1), (2, 16)])
def test_row_products_of_several_kv_heads_a_block_are_one_batched_dot(frange: int, group: int) -> None:
    # two KV heads a block, each with its query rows: one batched tl.dot (2, 16, K) @ (2, K, 32), V loaded as its
    # rank-3 operand (pipelined); was a broadcast multiply and tl.sum (the layer's P @ V at batch 32: 234.5 us for
    # 268 MB on an H100, 2.6x the copy rate's time)
    g, mg = _pv_batched(frange=frange, group=group)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    rows = max(16, group)
    assert src.count("tl.dot(") == 1 and f"({2}, {rows}, {64 // frange})" in src, src
    assert "tl.sum(v0[" not in src and "* v1[" not in src  # no broadcast multiply
    if frange > 1:
        load_v = next(line for line in src.splitlines() if "a1_ptr +" in line)
        assert "[:, None, None]" in load_v and "tl.reshape(v1" not in src  # rank-3 load, no reshape
        assert f"tl.zeros((2, {rows}, 32), tl.float32)" in src  # the accumulator stays inside tl.dot
    rng = np.random.default_rng(13)
    ins = {x.name: (rng.standard_normal(x.shape) * 0.3).astype(np.float16).astype(np.float64) for x in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    # each batch element's row 0 only: an infinite weight in head 1 stays out of head 0's results
    ins["V"][1, 0, 0] = np.inf
    got = _run(mg, g, ins)
    assert np.all(np.isfinite(got[0])) and not np.all(np.isfinite(got[1]))


def test_a_32_row_streaming_product_is_mma_sync_with_a_deep_pipeline() -> None:
    # 32 rows over a K loop (the layer's projections at batch 32): 32-row mma.sync, 4 stages; it had 64-row wgmma
    # padding and 2-3 stages (H100: gate/up 83.9 us, down 61.2, against 80.6 / 48.3 at batch 8 with 16-row dots)
    mg = designs.gated_mlp(_gated(rows=32, k=4096, n=14336), cols=64, k_tile=128)
    (c,) = _recs(mg)
    assert c.tiles.dot_min_m == 16 and c.num_stages == 4 and c.num_warps == 4
    (c64,) = _recs(designs.gated_mlp(_gated(rows=64, k=4096, n=14336), cols=64, k_tile=128))
    assert c64.tiles.dot_min_m == 64  # more rows: the wgmma rule as before


@pytest.mark.parametrize("rows", [8, 32])
def test_a_chunked_one_step_product_is_pipelined_like_a_k_loop(rows: int) -> None:
    # the layer's k / v projections at bs8 ((8, 1024) @ (1024, 32) per block, a loop of 4 chunks): 7.9 us at 2 stages,
    # 5.7-6.0 at 3-4 on an H100 (benchmarks/results/layer_h100_1520/sweep); 32 rows: 16-row-granular mma.sync
    _, mg = _one_step(rows=rows, k=1024)
    (c,) = _recs(mg)
    assert c.num_stages == 4 and c.tiles.dot_min_m == 16
    _, short = _one_step(rows=rows, k=256)  # one chunk: no loop
    (c1,) = _recs(short)
    assert c1.num_stages == 2


def test_rows_of_a_batch_the_weights_lack_load_as_the_dots_rows_exactly() -> None:
    # the capture's decode products (B, 1, K) @ (K, N): B rows loaded straight as the dot's first B rows (the rest
    # masked to zero), no repetition; the zero rows' products with an infinite weight (NaN) never reach the result
    g = vm.Graph()
    x = g.input("X", (4, 1, 32), vm.float16)
    w = g.input("W", (32, 32), vm.float16)
    g.output(g.matmul(x, w))
    from verimirage.benchmarks.designs import _inputs, _one_kernel
    from verimirage.ir.builders import BlockBuilder

    t = _inputs(g)
    b = BlockBuilder((2,), 2)  # 2 blocks of 16 columns, a K loop of 2: all 4 rows in every block
    b.output(b.loop_sum(b.matmul(b.input(0, t["X"], (None,), 2), b.input(1, t["W"], (1,), 0))), (2,))
    mg = _one_kernel(t, b)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "mask=(tl.arange(0, 16)[:, None] < 4), other=0.0)" in src and "tl.broadcast_to(" not in src
    rng = np.random.default_rng(7)
    xs = (rng.standard_normal((4, 1, 32)) * 0.5).astype(np.float16).astype(np.float64)
    ws = (rng.standard_normal((32, 32)) * 0.5).astype(np.float16).astype(np.float64)
    (ref,) = vm.evaluate(g, {"X": xs, "W": ws})
    got = _run(mg, g, {"X": xs, "W": ws})
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    xs[:, 0, :] = 0.0
    xs[:, 0, 0] = 1.0
    ws[0, 3] = np.inf
    ws[5, 7] = np.nan
    got = _run(mg, g, {"X": xs, "W": ws})
    assert (got[:, 0, 3] == np.inf).all() and np.isnan(got[:, 0, 7]).all()
    assert np.isfinite(np.delete(got[:, 0, :], [3, 7], axis=1)).all()


@pytest.mark.parametrize("shape", [(1, 1024, 512), (1, 4096, 4096), (8, 1024, 512), (8, 4096, 4096), (16, 256, 96),
                                   (1, 64, 48), (32, 1024, 512)])
def test_a_bare_one_row_product_is_wrapped_in_deep_narrow_tiles(shape: tuple[int, int, int]) -> None:
    # a kernel-level matmul of at most 16 rows (the decoder layer's o projection: a bare matmul in its μGraph, one row
    # at batch 1, eight at batch 8) is wrapped in 32-column, 256-deep tiles (wrap.GEMV_TILE_N / GEMV_TILE_K,
    # GEMV_MAX_ROWS; H100: the layer at bs1 197.5 -> 195.1 us; bs8 239.8 -> 238.6 with the 8-row o projection so
    # wrapped, benchmarks/results/layer19_h100_2026-11-27/call3_bs8.json); products of more rows keep the 64 x 64 x 64
    # tiles; the wrapped kernel computes the product (interpreter vs float64)
    from verimirage.backend import wrap

    m, k, n = shape
    g = vm.Graph()
    x = g.input("X", (m, k), vm.float16)
    w = g.input("W", (k, n), vm.float16)
    g.output(g.matmul(x, w))
    (node,) = [nd for nd in node_list(to_kernels(vm.MuGraph.from_graph(g))) if nd.op == "custom"]
    bg = node.attr("block")
    if m <= wrap.GEMV_MAX_ROWS:
        tn = wrap._divisor_at_most(n, wrap.GEMV_TILE_N)
        assert bg.grid == (n // tn,) and bg.frange == k // wrap._divisor_at_most(k, wrap.GEMV_TILE_K)
        assert (tn, bg.frange) == {1024: (32, 4), 4096: (32, 16), 64: (16, 1), 256: (32, 1)}[k]
    else:
        assert bg.grid == (n // 64,) and bg.frange == k // 64  # (32 rows: one 64-row tile)
    if k * n > 1 << 20:
        return  # (the interpreter run: the smaller shapes)
    rng = np.random.default_rng(5)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.3).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(vm.MuGraph.from_graph(g), g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("k", [512, 1024])
def test_a_deep_one_step_one_row_product_is_a_loop_of_256_deep_row_dots(k: int) -> None:
    # the decoder layer's k and v projections at batch 1: 128 blocks each of one (1, 1024) @ (1024, 32) step, split-K.
    # They were a broadcast multiply and tl.sum over the whole (1024, 32) tile at 16 warps (5.6 / 5.4 us on an H100);
    # as a loop of four 256-deep 16-row dots (codegen.CHUNK_ROW_DOTS) at 4 warps, 4 stages 5.25 / 5.15 us, and the q, k
    # and v projections share one launch (the same warps): the layer 194.7 -> 194.0 us (2026-11-27 15:58 UTC,
    # benchmarks/results/layer19_h100_2026-11-27/call1_bs1.json)
    from verimirage.backend import codegen

    g, mg = _one_step(rows=1, k=k)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "for kc" in src and src.count("tl.dot(") == 1 and "tl.broadcast_to(" in src
    assert f"tl.arange(0, {codegen.ROW_DOT_MAX_K})" in src and f"tl.arange(0, {k})" not in src
    (c,) = _recs(mg)
    assert (c.num_warps, c.tiles.dot_min_m) == (4, 16) and c.num_stages == min(4, k // codegen.ROW_DOT_MAX_K)
    rng = np.random.default_rng(11)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.3).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    # an infinite weight gives the infinity in its column (the broadcast rows are all the same row: no 0 * inf)
    ins["W"][3, 5] = np.inf
    (ref,) = vm.evaluate(g, ins)
    got = _run(mg, g, ins)
    assert np.isinf(got[0, 5]) and np.sign(got[0, 5]) == np.sign(ref[0, 5])
    assert np.allclose(np.delete(got, 5, axis=1), np.delete(ref, 5, axis=1), rtol=2e-2, atol=2e-2)
    # off: the broadcast multiply as before
    old = codegen.CHUNK_ROW_DOTS
    codegen.CHUNK_ROW_DOTS = False
    try:
        assert "tl.dot(" not in generate(mg, tiles=TileOptions(dot_min_m=16)).source
    finally:
        codegen.CHUNK_ROW_DOTS = old


@pytest.mark.parametrize("m,k,n", [(4, 257, 37), (1, 61, 37), (20, 257, 61), (2, 4099, 64)])
def test_a_prime_size_product_took_one_wide_tiles(m: int, k: int, n: int) -> None:
    # finding (red team 19b): the default block graph of a product (the fallback lowering, one kernel per op) took
    # the largest divisor of a dim as its tile, so a prime N gave 1-column tiles (N blocks) and a prime K one-deep
    # steps (K iterations; 50-60 s in the interpreter for (4, 257) @ (257, 37)); such a dim now takes whole tiles
    # with a masked tail, read zero-padded (exact for the contraction) and cropped
    import torch

    g = vm.Graph()
    a, b = g.input("A", (m, k), vm.float32), g.input("B", (k, n), vm.float32)
    g.output(g.matmul(a, b))
    mg = vm.MuGraph.from_graph(g)
    (node,) = [nd for nd in node_list(to_kernels(mg)) if nd.op == "custom"]
    bg = node.attr("block")
    assert bg.frange <= 17 and max(bg.grid) <= 4 and node.outs[0].shape == (m, n), (bg.grid, bg.frange)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    out = vm.compile(mg)(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    np.testing.assert_allclose(out.double().numpy(), x @ y, rtol=1e-4, atol=1e-4)
    assert isinstance(vm.verify(g, mg), vm.Proved)


def test_a_prime_width_elementwise_op_took_one_wide_tiles() -> None:
    # the same for an elementwise op's default block graph: a prime last dim of 4099 took 4099 one-element blocks
    import torch

    g = vm.Graph()
    a, b = g.input("A", (3, 4099), vm.float32), g.input("B", (1, 4099), vm.float32)
    g.output(g.mul(g.exp(a), b))
    mg = vm.MuGraph.from_graph(g)
    blocks = [nd.attr("block") for nd in node_list(to_kernels(mg)) if nd.op == "custom"]
    assert blocks and all(bg.num_blocks <= 3 * 5 for bg in blocks), [bg.grid for bg in blocks]
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((3, 4099)), rng.standard_normal((1, 4099))
    out = vm.compile(mg)(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32))
    np.testing.assert_allclose(out.double().numpy(), np.exp(x) * y, rtol=1e-5, atol=1e-6)
    assert isinstance(vm.verify(g, mg), vm.Proved)


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
def test_a_prime_length_reduction_took_one_element_steps(op: str) -> None:
    # and a sum or mean over a prime axis of 4099 took 4099 one-element loop steps; it now takes tiles of 1,024 with
    # a masked tail (zero padding is a sum's identity; a mean divides the partial sums by the true length), while
    # a max keeps whole tiles (zero padding would be another function over negative rows: not proved)
    import torch

    g = vm.Graph()
    a = g.input("A", (2, 4099), vm.float32)
    g.output(getattr(g, op)(a, axis=1))
    mg = vm.MuGraph.from_graph(g)
    (bg,) = [nd.attr("block") for nd in node_list(to_kernels(mg)) if nd.op == "custom"]
    assert (bg.frange == 5) if op != "max" else (4099 % bg.frange == 0), bg.frange  # (max: whole tiles only)
    if op == "max":
        return
    x = np.random.default_rng(3).standard_normal((2, 4099)) - 3.0
    out = vm.compile(mg)(torch.tensor(x, dtype=torch.float32))
    want = getattr(np, op)(x, axis=1, keepdims=True)
    np.testing.assert_allclose(out.double().numpy().reshape(want.shape), want, rtol=1e-5, atol=1e-4)
    assert isinstance(vm.verify(g, mg), vm.Proved)
