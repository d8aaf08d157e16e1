"""Merged launches (issue 23, opt-in ``VERIMIRAGE_MERGE``): the kernels of one dependency level, none reading what
another writes, run as one launch (codegen ``generate(merge=True)``): the same kernels on the same blocks in a
topological order of the μGraph. Measured on an H100 (benchmarks/perf/NOTES.md session 14): the layer's bs8 q, k and
v projections as one launch, 19 -> 13 launches, 249.0 -> 242.1 us."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import runtime
from verimirage.backend.codegen import LaunchConfig, _launch_units, generate
from verimirage.ir.graph import node_list

ROOT = Path(__file__).resolve().parent.parent


def _three_projections() -> vm.Graph:
    # three products of one input (independent) and a sum of them: one kernel per op, unfused
    g = vm.Graph()
    x = g.input("X", (16, 32), vm.float16)
    ws = [g.input(f"W{i}", (32, 16), vm.float16) for i in range(3)]
    p = [g.matmul(x, w) for w in ws]
    g.output(g.add(g.add(p[0], p[1]), g.exp(p[2])))
    return g


def _reads(nodes: list, i: int, views: set[int]) -> set[int]:
    """The kernel nodes node ``i`` reads, through views."""
    out: set[int] = set()
    for a, _ in nodes[i].args:
        if nodes[a].op != "custom":
            continue
        out |= _reads(nodes, a, views) if a in views else {a}
    return out


def _check_units(ms: vm.MuGraph, units: list[list[int]], views: set[int]) -> None:
    nodes = node_list(ms)
    seen: list[int] = [i for u in units for i in u]
    customs = [i for i, n in enumerate(nodes) if n.op == "custom"]
    assert sorted(seen) == customs  # every kernel (and view) once
    done: set[int] = set()
    for u in units:
        members = set(u)
        for i in u:
            r = _reads(nodes, i, views) if i not in views else {nodes[i].args[0][0]}
            assert not (r & members) or i in views, f"kernel {i} reads a kernel of its own launch"
            assert r <= done, f"kernel {i} runs before a kernel it reads"
        done |= members


def test_independent_kernels_are_one_launch_and_compute_the_same() -> None:
    g = _three_projections()
    mg = vm.MuGraph.from_graph(g)
    plain, merged = generate(mg), generate(mg, merge=True)
    assert len(plain.steps) == 6
    assert [k.name for k in merged.kernels] == ["k4_5_6", "k7_8", "k9"]  # the products, then add and exp, then add
    assert merged.kernels[0].members == (4, 5, 6) and plain.kernels[0].members == ()
    assert merged.kernels[0].grid == (sum(plain.kernels[j].grid[0] for j in range(3)),)
    # the members are device functions of the block index; the merged kernel alone asks for the program id
    text = merged.source
    assert text.count("tl.program_id") == len(merged.kernels) - 1 + sum(
        1 for k in merged.kernels if not k.members and any(d > 1 for d in k.grid))
    assert "def k4(p0, p1, p2," in text
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    xs = {"X": rng.standard_normal((16, 32)) * 0.3, **{f"W{i}": rng.standard_normal((32, 16)) * 0.3 for i in range(3)}}
    xs = {k: v.astype(np.float16).astype(np.float64) for k, v in xs.items()}
    (ref,) = vm.evaluate(g, xs)
    fn = vm.compile(mg)  # (no merge in the environment)
    ins = {k: torch.tensor(v, dtype=torch.float16) for k, v in xs.items()}
    got_plain = fn(**ins).double().numpy()
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("VERIMIRAGE_MERGE", "1")
        mfn = vm.compile(mg)
    finally:
        mp.undo()
    assert [k.name for k in mfn.kernels] == ["k4_5_6", "k7_8", "k9"]
    got = mfn(**ins).double().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
    assert np.array_equal(got, got_plain)  # the same kernels: the same bits


def test_merge_key_keeps_kernels_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    from verimirage.backend import codegen
    from verimirage.backend.wrap import to_kernels

    # (the three kernels have few blocks: MERGE_SMALL_MAX_BLOCKS would put them in one launch whatever their keys)
    monkeypatch.setattr(codegen, "MERGE_SMALL_MAX_BLOCKS", 0)
    nodes = node_list(to_kernels(vm.MuGraph.from_graph(_three_projections())))
    units = _launch_units(nodes, set(), True, lambda bg, at: bg is nodes[6].attr("block"))
    assert [4, 5] in units and [6] in units


def test_merge_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERIMIRAGE_MERGE", raising=False)
    assert runtime._merge_wanted() is False
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    assert runtime._merge_wanted() is True
    monkeypatch.setenv("VERIMIRAGE_MERGE", "bogus")
    assert runtime._merge_wanted() is False


@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8"])
def test_layer_launches_merge_only_independent_kernels_in_a_topological_order(case: str) -> None:
    # the full-size layer's committed candidate (codegen only: no kernel runs): every kernel once, no launch holds a
    # kernel and one it reads, every kernel after the ones it reads (views included)
    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}.json").read_text())
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    ms = generate(mg, merge=True)
    from verimirage.backend.wrap import to_kernels

    km = to_kernels(mg)
    nodes = node_list(km)
    plain = generate(mg)
    views = {i for i, n in enumerate(nodes) if n.op == "custom"} - {k.node for k in plain.kernels}
    units = _launch_units(nodes, views, True)
    _check_units(km, units, views)
    assert len(ms.steps) < len(plain.steps)
    assert sum(len(k.members) or 1 for k in ms.kernels) == len(plain.kernels)


@pytest.mark.slow
def test_scaled_down_layer_per_op_merged_matches_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    # the scaled-down decode layer, one kernel per op (many independent kernels: 24 launches for 55 kernels),
    # merged, in the interpreter against float64
    torch = pytest.importorskip("torch")
    from verimirage.benchmarks import get_layer
    from verimirage.benchmarks.layer_module import make_case

    g = get_layer("decode_bs8", small=True)
    c = make_case("decode_bs8", small=True, dtype=torch.float16, seed=1)
    ins = c["graph_inputs"]
    ref = vm.evaluate(g, {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in ins.items()})
    mg = vm.MuGraph.from_graph(g)
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    fn = vm.compile(mg)
    assert len(fn.steps) < len(generate(mg).steps)
    outs = fn(*[ins[t.name] for t in g.inputs])
    for o, r in zip(outs if isinstance(outs, tuple) else (outs,), ref, strict=True):
        assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) < 2e-3


def test_merged_config_takes_the_stages_of_the_kernel_with_the_most_blocks() -> None:
    from verimirage.backend.codegen import LaunchConfig

    # the layer's bs1 q projection (128 blocks, 4 stages) beside k and v as 32-block loops (8 stages by the rules:
    # 8 stages in a 192-block launch would leave one block an SM)
    c = runtime.merged_config([LaunchConfig(4, 4), LaunchConfig(4, 8), LaunchConfig(8, 8)], [128, 32, 32])
    assert (c.num_warps, c.num_stages) == (8, 4)


def test_a_merged_launch_takes_stages_under_which_every_member_fits() -> None:
    """A member the rules gave fewer stages for its shared memory must not get the stages of the member with the
    most blocks when those exceed the limit for it: ``merged_config`` given the members' kernels lowers the stages
    until every member fits (``resources.fit`` with each member's own tiles)."""
    from verimirage.backend.codegen import LaunchConfig, TileOptions
    from verimirage.backend.resources import SM90, smem_estimate
    from verimirage.benchmarks.designs import expert

    # full size, large k tiles (256 deep: three wgmma-read 64 x 256 / 256 x 64 fp16 tiles, 98,304 bytes a buffer,
    # two buffers at 2 stages: sm_90 gives a wgmma-read tile num_stages buffers)
    m = expert("gated_mlp", vm.benchmarks.get("gated_mlp"), cols=64, k_tile=256)
    from verimirage.backend import tuning

    small_mg = tuning.tuned_module(_three_projections()).mugraph  # one kernel per op: 16 x 32 products

    def kernels(mg: vm.MuGraph) -> list[tuple[object, list[vm.TensorType]]]:
        nodes = node_list(mg)
        return sorted(((n.attr("block"), [nodes[a].outs[j] for a, j in n.args]) for n in nodes if n.op == "custom"),
                      key=lambda k: smem_estimate(k[0], k[1], LaunchConfig(4, 4)))  # type: ignore[arg-type]

    (small, small_at), (big, big_at) = kernels(small_mg)[-1], kernels(m)[-1]
    tiles = TileOptions(dot_min_m=64)
    c_small, c_big = LaunchConfig(4, 4, tiles), LaunchConfig(8, 2, tiles)
    assert smem_estimate(small, small_at, c_small) <= SM90.smem_per_block  # the rules' own configurations fit
    four = replace(c_big, num_stages=4)
    assert smem_estimate(big, big_at, c_big) <= SM90.smem_per_block < smem_estimate(big, big_at, four)
    # the small member has the most blocks: its 4 stages, which the big member does not fit under
    assert runtime.merged_config([c_small, c_big], [128, 32]).num_stages == 4  # (no kernels given: not checked)
    c = runtime.merged_config([c_small, c_big], [128, 32], [(small, small_at, None), (big, big_at, None)])
    assert c.num_warps == 8 and c.num_stages == 2
    for bg, at, own in ((small, small_at, c_small), (big, big_at, c_big)):
        assert smem_estimate(bg, at, replace(own, num_stages=c.num_stages)) <= SM90.smem_per_block


@pytest.mark.parametrize(("rank", "cert", "launches"), [(4, "qkv_rot", 11), (5, "qkv_merge", 12)])
def test_layer_bs1_qkv_candidates_are_certified_and_merge_the_projections(rank: int, cert: str, launches: int) -> None:
    # candidates 4 and 5 of the bs1 file: k and v lowered as the q projection's design so that the three run as one
    # launch (candidate 4 also has the two rotary kernels as one)
    from verimirage.backend import tuning
    from verimirage.smt.certify import read_certificate

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / "decode_bs1.json").read_text())
    c = read_certificate((ROOT / "benchmarks" / "candidates" / "layer" / "proofs" /
                          f"layer_decode_bs1_{cert}.json").read_text())
    assert c.graph_text == doc["graph"] and c.mugraph_text == doc["candidates"][rank]["mugraph"]
    mg = vm.MuGraph.parse(doc["candidates"][rank]["mugraph"])
    ms = generate(mg, tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, merge=True,
                  merge_key=lambda bg, at: tuning.recommend(bg, at).num_warps)
    qkv = [k for k in ms.kernels if len(k.members) == 3]
    assert len(qkv) == 1 and qkv[0].grid == (192,)
    assert len(ms.steps) == launches


@pytest.mark.slow
def test_layer_bs1_qkv_rot_new_regions_run_in_the_interpreter() -> None:
    # the region μGraphs candidate 2 has and candidate 1 (layer_decode_bs1_attn4) has not (the v projection's
    # loop; the k projection's loop with the one rotary kernel), in Triton's interpreter against their regions in
    # float64
    torch = pytest.importorskip("torch")
    from verimirage.smt.certify import read_certificate

    base = read_certificate((ROOT / "benchmarks" / "candidates" / "layer" / "proofs" /
                             "layer_decode_bs1_attn4.json").read_text())
    new = read_certificate((ROOT / "benchmarks" / "candidates" / "layer" / "proofs" /
                            "layer_decode_bs1_qkv_rot.json").read_text())
    old = {json.dumps(s, sort_keys=True) for s in base.certificates}
    fresh = [s for s in new.certificates if json.dumps(s, sort_keys=True) not in old]
    assert len(fresh) == 2
    rng = np.random.default_rng(0)
    for s in fresh:
        g, mg = vm.Graph.parse(s["graph_text"]), vm.MuGraph.parse(s["mugraph_text"])
        xs = {t.name: (rng.standard_normal(t.type.shape) * (0.02 if len(t.type.shape) == 2 and t.type.shape[0] == 4096
                                                             else 0.5)).astype(np.float16).astype(np.float64)
              for t in g.inputs}
        ref = vm.evaluate(g, xs)
        outs = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in xs.items()})
        for o, r in zip(outs if isinstance(outs, tuple) else (outs,), ref, strict=True):
            assert np.linalg.norm(o.double().numpy() - r) / max(np.linalg.norm(r), 1e-30) < 2e-3


def test_cost_counts_merged_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    # the runtime's merged mode runs the three products as one launch and the add and exp as one: 6 -> 3 launches,
    # three launch costs fewer; by default the estimate follows VERIMIRAGE_MERGE as the runtime does
    from verimirage.pipeline.pricing import cost, merged_launches
    from verimirage.rewrite.cost import H100

    mg = vm.MuGraph.from_graph(_three_projections())
    assert merged_launches(mg) == len(generate(mg, merge=True).steps) == 3
    plain, merged = cost(mg, merge=False), cost(mg, merge=True)
    assert (plain.launches, merged.launches) == (6, 3)
    assert merged.time_s == pytest.approx(plain.time_s - 3 * H100.launch_s)
    assert merged.bytes == plain.bytes
    monkeypatch.delenv("VERIMIRAGE_MERGE", raising=False)
    assert cost(mg).launches == 6
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    assert cost(mg).launches == 3


def _two_streamed_products() -> vm.MuGraph:
    """X (64 x 4096) @ W1 and X @ W2 (4096 x 4096 fp16), each its own kernel of 64 blocks looping over 128-deep K
    tiles: independent, so one merged launch. Each alone is estimated at 131,072 bytes at 4 stages (wgmma: four
    32,768-byte buffers), together 262,144: over the 232,448 an H100 block may have."""
    from verimirage.ir.builders import BlockBuilder

    mg = vm.MuGraph()
    xt, wt = vm.TensorType((64, 4096), vm.float16), vm.TensorType((4096, 4096), vm.float16)
    x = mg.input("X", xt.shape, xt.dtype)
    outs = []
    for w in (mg.input("W1", wt.shape, wt.dtype), mg.input("W2", wt.shape, wt.dtype)):
        b = BlockBuilder((4096 // 64,), 4096 // 128)
        b.output(b.loop_sum(b.matmul(b.input(0, xt, (None,), 1), b.input(1, wt, (1,), 0))), (1,))
        outs += mg.custom(b.build(), [x, w])
    mg.output(*outs)
    return mg


def test_a_given_config_fitted_the_members_of_a_merged_launch_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (the red team, 2026-11-27): ``vm.compile(config=...)`` fitted each member of a merged launch to the
    shared memory alone (``runtime._fit_kernels``), while Triton gives the one launch every member's buffers (two
    merged 64 x 4096 x 4096 products: 262,144 bytes at 8 stages, each alone 131,072; sm_90 compile 2026-11-27):
    4 stages were launched where only 3 fit. The members are now fitted together, as ``merged_config`` does."""
    from verimirage.backend.codegen import LaunchConfig, TileOptions
    from verimirage.backend.resources import SM90, smem_estimate

    mg = _two_streamed_products()
    config = LaunchConfig(4, 4, TileOptions(dot_min_m=64))
    ms = generate(mg, config.tiles, merge=True)
    (k,) = [k for k in ms.kernels if len(k.members) == 2]
    nodes = node_list(mg)
    kernels = [(nodes[i].attr("block"), [nodes[a].outs[j] for a, j in nodes[i].args]) for i in k.members]
    each = [smem_estimate(bg, at, config) for bg, at in kernels]  # type: ignore[arg-type]
    assert max(each) <= SM90.smem_per_block < sum(each)
    ((members, launch),) = runtime._fit_kernels(ms, config).values()
    assert launch.num_stages == 3 and [c.num_stages for _, _, c in members] == [3, 3]
    assert sum(smem_estimate(bg, at, launch) for bg, at in kernels) <= SM90.smem_per_block  # type: ignore[arg-type]
    monkeypatch.setenv("VERIMIRAGE_MERGE", "1")
    p = vm.compile(mg, config=config)
    assert p.launch[k.name]["num_stages"] == 3 and p.launch[k.name]["num_warps"] == 4
    monkeypatch.delenv("VERIMIRAGE_MERGE")
    q = vm.compile(mg, config=config)  # apart, each launch keeps the 4 stages that fit it
    assert [q.launch[n]["num_stages"] for n in q.launch] == [4, 4]


def _layer_launches(case: str) -> list[tuple[tuple[int, ...], LaunchConfig, LaunchConfig]]:
    """The merged launches of the layer ``case``'s committed candidate 0: (members, the launch's configuration from
    ``runtime.merged_config``, the same without the shared-memory fit)."""
    from verimirage.backend import tuning
    from verimirage.backend.codegen import arg_storage

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}.json").read_text())
    ms = tuning.tuned_module(vm.MuGraph.parse(doc["candidates"][0]["mugraph"]), {"merge": True})
    nodes, store = node_list(ms.mugraph), arg_storage(ms.mugraph)
    out = []
    for k in ms.kernels:
        members = k.members or (k.node,)
        ks = [(nodes[i].attr("block"), [nodes[a].outs[j] for a, j in nodes[i].args], store[i]) for i in members]
        cs = [tuning.recommend(bg, at) for bg, at, _ in ks]
        blocks = [bg.num_blocks for bg, _, _ in ks]
        out.append((tuple(members), runtime.merged_config(cs, blocks, ks),
                    runtime.merged_config(cs, blocks, ks, fit_smem=False)))
    return out


def test_merging_lowered_the_bs8_projections_pipeline() -> None:
    # H100 2026-11-27 04:49: the layer's bs8 q, k and v projections (recommend: 4 stages each) merged into one launch,
    # whose shared memory together fits only 2 stages, ran the layer at 252.1 us against 242.8 with every kernel apart.
    # A launch now takes a kernel only where their shared memory together fits the launch's stages
    # (tuning.merge_fits): the q projection apart, k and v one launch at 4 stages
    from verimirage.backend import tuning

    def launches(case: str) -> list[tuple[tuple[int, ...], int]]:
        rows = _layer_launches(case)
        assert all(c.num_stages >= free.num_stages for _, c, free in rows)  # (merge_fits: no launch lowered them)
        return [(m, c.num_stages) for m, c, _ in rows]

    bs8 = launches("decode_bs8")
    assert ((15,), 4) in bs8 and ((17, 20), 4) in bs8
    assert not [m for m, _ in bs8 if {15, 17} <= set(m) or {15, 20} <= set(m)]
    # bs1: the q projection's loop (split over K, the rotary in its combine) and the k and v projections' one-step
    # split kernels, one level and 4 warps each, fit one launch at the loop's 4 stages (merged_config: the stages of
    # the looped kernel with the most blocks)
    assert ((15, 17, 19), 4) in launches("decode_bs1")
    # without the rule (every kernel of one level and warps one launch) the three were one launch
    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / "decode_bs8.json").read_text())
    nodes = node_list(tuning.tuned_module(vm.MuGraph.parse(doc["candidates"][0]["mugraph"]), {"merge": True}).mugraph)
    assert [15, 17, 20] in _launch_units(nodes, set(), True, lambda bg, at: tuning.recommend(bg, at).num_warps)


_LOOP_BESIDE_ONE_STEP = """mugraph {
  %0 = input {name='X'} : f16[1,4096]
  %1 = input {name='WQ'} : f16[4096,4096]
  %2 = input {name='WK'} : f16[4096,1024]
  %3 = custom %0, %1 {frange=16, grid=(128,)} : f16[1,4096] {
    %0 = input {arg=0, fmap=1, imap=(None,), shape=(1, 4096)} : f16[1,256]
    %1 = input {arg=1, fmap=0, imap=(1,), shape=(4096, 4096)} : f16[256,32]
    %2 = matmul %0, %1 : f16[1,32]
    %3 = loop_sum %2 : f16[1,32]
    output %3 {omap=(1,)}
  }
  %4 = custom %0, %2 {frange=1, grid=(8, 32)} : f16[32,1024] {
    %0 = input {arg=0, fmap=1, imap=(None, 1), shape=(1, 4096)} : f16[1,128]
    %1 = input {arg=1, fmap=0, imap=(1, 0), shape=(4096, 1024)} : f16[128,128]
    %2 = matmul %0, %1 : f16[1,128]
    %3 = loop_sum %2 : f16[1,128]
    output %3 {omap=(1, 0)}
  }
  return %3, %4
}"""


def test_a_merged_launch_took_the_stages_of_a_kernel_without_a_loop() -> None:
    """The decoder layer's bs1 q projection (a 16-step loop, 128 blocks, 4 stages by the rules) merged with the k
    projection's one-step split kernel (256 blocks, 2 stages) ran at that kernel's 2 stages, which mean nothing to a
    kernel without a loop: the layer 199.5 us against 189.9 for a design one launch longer (H100 2026-11-27 19:06
    UTC). The launch now takes the stages of the looped kernel with the most blocks."""
    from verimirage.backend import tuning

    mg = vm.MuGraph.parse(_LOOP_BESIDE_ONE_STEP)
    nodes = node_list(mg)
    ks = [(n.attr("block"), [nodes[a].outs[j] for a, j in n.args], None) for n in nodes if n.op == "custom"]
    cs = [tuning.recommend(bg, at) for bg, at, _ in ks]
    blocks = [bg.num_blocks for bg, _, _ in ks]
    assert blocks == [128, 256] and cs[0].num_stages > cs[1].num_stages  # (the rules' own stages differ)
    assert [tuning.kernel_shape(bg, at).frange > 1 or tuning.kernel_shape(bg, at).chunks for bg, at, _ in ks] == [
        True, False]
    assert runtime.merged_config(cs, blocks, ks).num_stages == cs[0].num_stages
    assert tuning.merge_fits(ks)
    ms = tuning.tuned_module(mg, {"merge": True})
    assert [k.members for k in ms.kernels] == [(3, 4)]


def test_few_block_kernels_of_one_level_share_a_launch_whatever_their_warps(monkeypatch: pytest.MonkeyPatch) -> None:
    """codegen.MERGE_SMALL_MAX_BLOCKS: the bs1 layer's q-projection combine with its rotary (8 blocks, 4 warps by the
    rules) and the k and v combines (8 blocks each, 8 warps) are one launch at 8 warps (9 launches, H100 2026-11-27:
    187.4 us against 188.3 as two); a few-block kernel beside many-block kernels of its own warps stays in their
    launch (bs8's 8-block kernel 22 with 23 and 25)."""
    from verimirage.backend import codegen

    def units(case: str) -> list[tuple[tuple[int, ...], int]]:
        return [(m, c.num_warps) for m, c, _ in _layer_launches(case)]

    assert codegen.MERGE_SMALL_MAX_BLOCKS >= 8
    bs1 = units("decode_bs1")
    assert ((16, 18, 20), 8) in bs1 and len(bs1) == 9
    assert ((22, 23, 25), 4) in units("decode_bs8")
    monkeypatch.setattr(codegen, "MERGE_SMALL_MAX_BLOCKS", 0)
    assert ((16,), 4) in units("decode_bs1") and ((18, 20), 8) in units("decode_bs1")
