"""Within-program ranking of skinny GEMMs (issue 22, the cost model's calibration): a software-pipelined ``tl.dot``
loop exposes part of a stage per round of blocks (``Hardware.pipeline_fill``: bytes and blocks equal, shorter K
tiles are faster, as every skinny GEMM of the models set and the suite measured on an H100), and the blocks on one SM
stream at most ``Hardware.sm_bandwidth`` together (a grid of 32 blocks cannot reach the copy rate however deep its
pipelines)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import verimirage as vm
from verimirage.pipeline.pricing import cost
from verimirage.rewrite.cost import H100

ROOT = Path(__file__).resolve().parent.parent


def _gemm(cols: int, frange: int, m: int = 16, k: int = 4096, n: int = 8192) -> vm.MuGraph:
    """X (m, k) @ W (k, n) fp16 in one kernel: a block per ``cols`` columns of W, a K loop of ``frange`` steps."""
    kt = k // frange
    return vm.MuGraph.parse(f"""mugraph {{
  %0 = input {{name='X'}} : f16[{m},{k}]
  %1 = input {{name='W'}} : f16[{k},{n}]
  %2 = custom %0, %1 {{frange={frange}, grid=({n // cols},)}} : f16[{m},{n}] {{
    %0 = input {{arg=0, fmap=1, imap=(None,), shape=({m}, {k})}} : f16[{m},{kt}]
    %1 = input {{arg=1, fmap=0, imap=(1,), shape=({k}, {n})}} : f16[{kt},{cols}]
    %2 = matmul %0, %1 : f16[{m},{cols}]
    %3 = loop_sum %2 : f16[{m},{cols}]
    output %3 {{omap=(1,)}}
  }}
  return %2
}}""")


def test_shorter_k_tiles_expose_less_of_the_pipeline() -> None:
    # 128 blocks of 64 columns streaming a 64 MB weight: K tiles of 64, 128 and 256 rows move the same bytes with
    # the same blocks; the shorter tiles rank first (measured so on the H100: gated_mlp_bs8 25.1 vs 27.8 us, geglu
    # 61.7 vs 66.0, qkv_bias 10.6 vs 11.3)
    designs = [_gemm(64, f) for f in (64, 32, 16)]  # K tiles 64, 128, 256
    est = [cost(g).time_s for g in designs]
    assert est == sorted(est) and est[0] < est[2]
    assert len({cost(g).bytes for g in designs}) == 1
    # the fill is what orders them: without it the deeper tiles (more bytes in flight) were the cheaper
    off = dataclasses.replace(H100, pipeline_fill=0.0)
    est_off = [cost(g, off).time_s for g in designs]
    assert est_off == sorted(est_off, reverse=True) and est_off[0] > est_off[2]
    # the charge is one part of a stage of every resident block at the device bandwidth, per round of blocks
    k0, k0_off = cost(designs[2]).kernels[0], cost(designs[2], off).kernels[0]
    stage = 256 * 64 * 2 + 16 * 256 * 2
    assert abs((k0.mem_s - k0_off.mem_s) - H100.pipeline_fill * 128 * stage / H100.bandwidth) < 1e-12


def test_chained_products_pay_no_pipeline_fill() -> None:
    # attention's loop (P @ V after Q @ K^T) is not charged the fill: its stages wait on the softmax anyway, and
    # the charge mis-ranked the suite's split-KV decode designs (mha_stable_bs1 first/best 1.08 -> 1.45 with it)
    cands = json.loads((ROOT / "benchmarks" / "candidates_models" / "causal_attention.json").read_text())
    from verimirage.ir.graph import node_list
    from verimirage.rewrite.cost import _chained

    mg = vm.MuGraph.parse(cands["candidates"][0]["mugraph"])
    blocks = [n.attr("block") for n in node_list(mg) if n.op == "custom"]
    assert blocks and all(bg.frange > 1 and _chained(bg) for bg in blocks)
    off = dataclasses.replace(H100, pipeline_fill=0.0)
    assert cost(mg).time_s == cost(mg, off).time_s


def test_few_blocks_share_an_sms_load_path() -> None:
    # the suite's gated_mlp_bs1 (H100, results/suite_h100_2026-11-26_s11): 32 blocks of 128 columns (2 MB of weights
    # each) 30.8 us, 64 blocks of 64 columns 24.3; by Little's law alone (dot_latency_s) the 32 blocks' deep
    # pipelines streamed 88 GB/s each and the design was estimated the fastest of the file
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import calibrate_cost

    entries = [e for e in calibrate_cost.heldout_sets()["suite"] if e["case"] == "gated_mlp_bs1"]
    uncapped = dataclasses.replace(H100, sm_bandwidth=0.0)
    one_kernel: dict[int, list[tuple[float, float, vm.MuGraph]]] = {}
    for e in entries:
        mg = vm.MuGraph.parse(e["mugraph"])
        if mg.num_kernels == 1:
            one_kernel.setdefault(cost(mg).kernels[0].blocks, []).append((cost(mg, uncapped).time_s,
                                                                           e["measured_us"], mg))
    _, few_us, few = min(one_kernel[32], key=lambda x: x[0])  # the 32-block design the uncapped model liked best
    many_us, many = min((m, g) for _, m, g in one_kernel[64])
    assert few_us > 1.2 * many_us
    assert cost(few).time_s > cost(many).time_s
    assert cost(few, uncapped).time_s < cost(many, uncapped).time_s
    first = min(entries, key=lambda e: cost(vm.MuGraph.parse(e["mugraph"])).time_s)
    assert first["measured_us"] == min(e["measured_us"] for e in entries)


def test_elementwise_kernels_the_backend_launches_flat_are_priced_flat() -> None:
    # run 16 (H100): batchnorm_relu as a flat kernel (Inductor's form, now codegen's TileOptions.flat, which
    # backend.tuning.recommend picks where the tiles read runs under 512 bytes or idle more than 1/8 of their lanes)
    # 35.9-36.1 us, its 64-column tiles 38.8-39.1, whole 3,136-column rows (padded to 4,096) 38.5: every tiling of
    # it is the same flat kernel now, estimated alike and below the tiled estimates
    from verimirage.backend.tuning import flat_pays
    from verimirage.ir.graph import node_list

    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    from bn_rows_ab import variant

    tiled = dataclasses.replace(H100, flat_elementwise=False)
    designs = [vm.MuGraph.parse(variant(*v)) for v in ((32, 8, 64), (16, 16, 64), (1, 8, 3136), (1, 2, 3136))]
    flat = [cost(g).time_s for g in designs]
    assert max(flat) < 1.001 * min(flat)
    assert all(f < cost(g, tiled).time_s for f, g in zip(flat, designs, strict=True))
    assert cost(designs[0], tiled).time_s > 1.1 * flat[0]  # the 128-byte runs' page and segment charges
    # a kernel whose tiles waste nothing (whole 8 KB rows, no padding) keeps its tiles, and its estimate
    x = vm.MuGraph.parse("""mugraph {
  %0 = input {name='X'} : f16[4096,4096]
  %1 = custom %0 {frange=1, grid=(512,)} : f16[4096,4096] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(4096, 4096)} : f16[8,4096]
    %1 = relu %0 : f16[8,4096]
    output %1 {omap=(0,)}
  }
  return %1
}""")
    (bg,) = [n.attr("block") for n in node_list(x) if n.op == "custom"]
    assert not flat_pays(bg, [vm.TensorType((4096, 4096), vm.float16)])
    assert cost(x).time_s == cost(x, tiled).time_s


def test_the_launch_model_answers_the_stage_warp_and_row_dot_rules_from_the_backend() -> None:
    # the three rules the cost model once copied from the backend (issue 22 item 3): the backend's launch model now
    # answers them; its stages for a weight-streaming loop of many blocks are recommend's own, its row-dot depth is
    # codegen's, and without a launch model the estimate assumes neither row dots nor the backend's stages
    from verimirage.backend import codegen, tuning
    from verimirage.backend.launch_model import LAUNCHES
    from verimirage.ir.graph import node_list
    from verimirage.rewrite import cost as model

    assert LAUNCHES.row_dot_max_k == codegen.ROW_DOT_MAX_K and LAUNCHES.chunked_sum_k == codegen.CHUNKED_SUM_K
    for cols, frange in ((32, 16), (64, 16), (128, 16), (256, 16)):  # 24 to 136 KB a stage, 256 or more blocks
        mg = _gemm(cols, frange, k=4096, n=65536)
        nodes = node_list(mg)
        n = next(x for x in nodes if x.op == "custom")
        bg, ats = n.attr("block"), [nodes[a].outs[k] for a, k in n.args]
        stage = sum(x.outs[0].numel * 2 for x in bg.nodes if x.op == "input" and x.attr("fmap") is not None)
        assert LAUNCHES.loop_stages(stage) == tuning.recommend(bg, ats).num_stages, (cols, frange)
        assert LAUNCHES.loop_warps(16 * cols, True) == tuning.recommend(bg, ats).num_warps
        assert model.block_cost(bg, ats, list(n.outs), launch=LAUNCHES) == cost(mg).kernels[0]
    assert [LAUNCHES.loop_warps(t, False) for t in (1024, 4096, 16384)] == [4, 8, 8]
