"""Measured tuning rules for Hopper GPUs (H100 / H200): launch configs per kernel, design parameters per shape.

Two entry points, both pure functions of shapes (no GPU, no torch, no triton needed):

* :func:`recommend` — given one block graph and its operand types, the :class:`LaunchConfig`
  (warps, pipeline stages, ``tl.dot`` row padding, loop unrolling) to launch it with. The runtime uses it
  for every kernel when ``compile`` gets no config; :func:`candidate_configs` lists a few neighbours
  for the GPU profiler to sweep.
* :func:`design_params` / :func:`skinny_matmul_plan` — for the search: which μGraph shapes are fast
  (grid size, column tile, split-K, K tile, attention rows / splits / combine rows), best first.

Where the numbers come from: ``benchmarks/perf/NOTES.md`` (sweeps with ``benchmarks/perf/sweep.py``,
CUDA-graph medians, float64-checked). The rules, in short:

1. Memory-bound skinny matmuls (rows M <= 16, K*N large): the weights must stream at full bandwidth,
   which needs (a) enough blocks on every SM — a grid of ``0.9..1.0 x`` the SM count, or split-K until
   the grid has ``>= 2.5 x`` the SM count; (b) ``tl.dot`` rows padded to 16 only (``mma.sync``),
   not 64 (``wgmma``): padding wastes shared memory that deeper pipelines need; (c) K tiles of
   128-256 and 3-4 pipeline stages (cp.async), under ~200 KB of shared memory.
2. Attention (split-KV FlashDecoding): 4 warps, 3 stages, 64-row Q tiles, KV tiles of 128, 16 splits;
   8 warps was 1.2-2x slower. The combine kernel needs many blocks (16-row tiles) and an unrolled
   loop over the splits (Triton does not pipeline loops without ``tl.dot``).
3. Kernels without a matmul (norms, combines): 4-8 warps, one stage, loops of <= 16 unrolled; elementwise kernels
   tiled like their output (:func:`~verimirage.backend.codegen.flat_shape`) as one flat index range.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..ir.dtypes import DType
from ..ir.graph import BlockGraph, Graph, MuGraph, live_nodes
from ..ir.ops import OPS, Prop, TensorType
from .codegen import LaunchConfig, ModuleSource, TileOptions, _KernelGen, flat_shape, generate

log = logging.getLogger(__name__)

#: Streaming multiprocessors of an H100 SXM / H200 (132 each).
NUM_SMS = 132
#: Shared memory a pipelined kernel may use (bytes): the 227 KB limit less headroom.
SMEM_BUDGET = 200 * 1024
#: Elements a block and warps of a flat elementwise kernel (:attr:`TileOptions.flat`: Inductor's pointwise form, 8
#: fp16 elements a thread, one 16-byte access each). Measured on an H100 (benchmarks/perf/NOTES.md session 13c):
#: batchnorm_relu's flat kernel at 1,024 elements and 4 warps, 2,048 / 8 and 4,096 / 8 all 35.9-36.1 us
FLAT_BLOCK = 1024
FLAT_WARPS = 4
#: A tiled elementwise kernel the flat form replaces: one whose output tiles read contiguous runs shorter than this
#: (bytes; ``rewrite.cost.Hardware.page``: batchnorm_relu's 64-column tiles, 128-byte runs, streamed at 89% of the
#: copy rate) or whose padded tiles leave more than this fraction of their lanes idle (its whole-row tiles: 3,136
#: of 4,096 lanes, 0.95x of Inductor on the H200). Other tilings are as fast as the flat form and keep their tiles
FLAT_SHORT_RUN = 512
FLAT_IDLE_LANES = 0.125
#: Most rows of a K-looped product that streams its weights with 16-row-granular mma.sync (see ``_measured``).
SKINNY_ROWS = 32


@dataclass(frozen=True)
class KernelShape:
    """What the tuning rules look at in one block graph."""

    blocks: int  # grid size (product)
    frange: int  # for-loop iterations
    matmuls: int  # tl.dot products (all dims > 1)
    dot_rows: int  # largest logical row count of a tl.dot result (0 without matmuls)
    chained: bool  # a matmul of the loop body consumes another's result (attention: P @ V after Q @ K)
    stage_bytes: int  # bytes of loop-varying input tiles per iteration, padded (rows to 16 for dots)
    max_tile: int  # largest padded value in the kernel (elements)
    dot_cols: int = 0  # smallest logical column count of a tl.dot result
    side_use: bool = False  # a loop-varying matmul operand also feeds a non-matmul op (rmsnorm_linear's X)
    chunks: int = 0  # K chunks of a one-step product emitted as a loop (codegen's chunked_dots); 0 without
    #: a loop-varying input tile that no product reads (not a bool mask) combined with a product's result: an
    #: elementwise stream beside the products, such as an additive bias on attention's scores
    side_stream: bool = False
    #: a product of the loop body whose operand the loop computes (elementwise) from a loaded tile, not the tile
    #: itself: a weighted norm in the prologue (``stabilise.prologue_norm_scales``: ``(x / s) * w`` each iteration)
    operand_chain: bool = False


def kernel_shape(bg: BlockGraph, arg_types: Sequence[TensorType]) -> KernelShape:
    """Measure ``bg`` (applied to operands of ``arg_types``) for the rules of :func:`recommend`."""
    outs = bg.result_types(arg_types)
    kg = _KernelGen(bg, arg_types, outs, "k", TileOptions(dot_min_m=16))
    for i in range(len(bg.nodes)):
        kg._unify_node(lambda a, k: (a, k), bg.nodes, i)
    kg._finish_classes()
    # products lowered to tl.dot: every dim > 1, or one row broadcast to 16 (TileOptions.row_dot)
    chunked: dict[int, int] = {}
    if bg.frange == 1:  # one-step products emitted as a loop of K chunks (codegen's chunked_dots)
        live = live_nodes(bg.nodes, bg.outputs)
        uses_: dict[int, list[int]] = {}
        for i, n in enumerate(bg.nodes):
            if i in live:
                for a, _ in n.args:
                    uses_.setdefault(a, []).append(i)
        chunked = kg.chunked_dots(live, uses_, kg.dot_operand_inputs(live, uses_))
    # products lowered to tl.dot: every dim > 1, or one row broadcast to 16 (TileOptions.row_dot, chunked or not)
    mm = [i for i, n in enumerate(bg.nodes) if OPS[n.op].has(Prop.CONTRACTION) and (min(
        bg.nodes[n.args[0][0]].outs[n.args[0][1]].shape[-2:] + bg.nodes[n.args[1][0]].outs[n.args[1][1]].shape[-1:]
    ) > 1 or kg.row_dot_node(bg.nodes, i) or i in chunked)]
    rows = max((bg.nodes[i].outs[0].shape[-2] for i in mm), default=0)
    mmset = set(mm)

    def reaches_matmul(i: int, seen: set[int]) -> bool:
        for a, _ in bg.nodes[i].args:
            if a in seen:
                continue
            seen.add(a)
            if a in mmset or reaches_matmul(a, seen):
                return True
        return False

    # a product in the loop body that consumes another of the same iteration (attention's P @ V after Q K^T): not
    # one after the loop that reads the loop's accumulators (LoRA's (X A) B, one-kernel design: the loop is a plain
    # K loop of two independent products, which the skinny-GEMM rules pipeline)
    post = bg.post_loop() if bg.frange > 1 else [False] * len(bg.nodes)
    chained = any(not post[i] and reaches_matmul(i, set()) for i in mm)
    stage = 0
    biggest = 0
    for i, n in enumerate(bg.nodes):
        p = kg.padded((i, 0), n.outs[0]) if n.outs else ()
        biggest = max(biggest, math.prod(p) if p else 0)
        if n.op == "input" and n.attr("fmap") is not None and bg.frange > 1:
            stage += math.prod(p) * n.outs[0].dtype.itemsize
    users: dict[int, set[str]] = {}
    for n in bg.nodes:
        for a, _ in n.args:
            users.setdefault(a, set()).add("mm" if OPS[n.op].has(Prop.CONTRACTION) else "other")
    side = any(
        n.op == "input" and n.attr("fmap") is not None and users.get(i, set()) == {"mm", "other"}
        for i, n in enumerate(bg.nodes)
    )
    readers: dict[int, list[int]] = {}
    for j, n in enumerate(bg.nodes):
        for a, _ in n.args:
            readers.setdefault(a, []).append(j)
    stream = bg.frange > 1 and any(  # (combined with a product's result, as a bias with the scores)
        n.op == "input" and n.attr("fmap") is not None and n.outs[0].dtype is not DType.bool
        and "mm" not in users.get(i, ()) and any(a in mmset for j in readers.get(i, ()) for a, _ in bg.nodes[j].args)
        for i, n in enumerate(bg.nodes)
    )
    cols = min((bg.nodes[i].outs[0].shape[-1] for i in mm), default=0)
    chunks = max((kg.padded(bg.nodes[i].args[0], bg.nodes[bg.nodes[i].args[0][0]].outs[0])[-1] // c
                  for i, c in chunked.items()), default=0)
    # (an operand the loop body computes: neither loaded as it is nor a loop-invariant value)
    invariant: list[bool] = []
    for n in bg.nodes:
        invariant.append(n.attr("fmap") is None if n.op == "input" else not OPS[n.op].has(Prop.LOOP)
                         and all(invariant[a] for a, _ in n.args))
    operand_chain = bg.frange > 1 and any(
        not post[i] and any(bg.nodes[a].op != "input" and not invariant[a] and not OPS[bg.nodes[a].op].has(
            Prop.CONTRACTION) for a, _ in bg.nodes[i].args) for i in mm)
    return KernelShape(math.prod(bg.grid), bg.frange, len(mm), rows, chained, stage, biggest, cols, side, chunks,
                       stream, operand_chain)


def flat_pays(bg: BlockGraph, arg_types: Sequence[TensorType]) -> bool:
    """Whether kernel ``bg`` may be emitted flat (:func:`~verimirage.backend.codegen.flat_shape`) and its own tiles
    waste bandwidth that the flat form does not: its output tiles' contiguous runs are shorter than
    :data:`FLAT_SHORT_RUN` bytes, or their padding leaves more than :data:`FLAT_IDLE_LANES` of the lanes idle."""
    shape = flat_shape(bg, arg_types)
    if shape is None:
        return False
    a, k = bg.outputs[0]
    tt = bg.nodes[a].outs[k]
    run = 1
    for t, full in zip(reversed(tt.shape), reversed(shape), strict=True):
        run *= t
        if t != full:
            break
    padded = math.prod(1 << max(0, (n - 1).bit_length()) for n in tt.shape)
    return run * tt.dtype.itemsize < FLAT_SHORT_RUN or tt.numel < (1 - FLAT_IDLE_LANES) * padded


def recommend(bg: BlockGraph, arg_types: Sequence[TensorType]) -> LaunchConfig:
    """The launch configuration the measurements favour for one kernel (see the module docstring).

    Never above the target's shared memory (:func:`verimirage.backend.resources.fit`: fewer stages, then
    16-row dot padding). A kernel whose tiles cannot fit under any configuration gets the smallest one
    (one stage, 16-row padding); the cost model ranks such candidates infeasible.
    """
    from .resources import ResourceError, fit

    c = _measured(bg, arg_types)
    try:
        return fit(bg, arg_types, c)
    except ResourceError as e:
        log.warning("tuning.recommend: %s", e)
        return LaunchConfig(c.num_warps, 1, replace(c.tiles, dot_min_m=16))


def regroups(bg: BlockGraph) -> bool:
    """Whether ``bg`` regroups a tile (an op with ``Prop.REGROUPS``: a reshape); such a kernel runs at most 8 warps
    (:func:`_measured`), in a launch of its own or one it shares (``runtime.merged_config``)."""
    return any(OPS[n.op].has(Prop.REGROUPS) for n in bg.nodes)


def _measured(bg: BlockGraph, arg_types: Sequence[TensorType]) -> LaunchConfig:
    """The measured rules of :func:`recommend`, before the shared-memory fit."""
    s = kernel_shape(bg, arg_types)
    if s.matmuls == 0 and flat_pays(bg, arg_types):
        return LaunchConfig(FLAT_WARPS, 1, TileOptions(flat=FLAT_BLOCK))
    if s.matmuls == 0:
        # a tile of 32,768 elements or more (a whole 32k-vocabulary row in registers: cross_entropy's X and T) over
        # 8 warps is 128+ fp32 values a thread per tensor, which spills: 16 warps
        warps = 16 if s.max_tile >= 32768 else 8 if s.max_tile >= 4096 else 4
        if warps == 16 and regroups(bg):
            # a WRONG result on Triton 3.6 / sm_90: a [2, 16, 1024] tile regrouped to [2, 1, 16384] (or [2, 16384]),
            # reduced and regrouped back (a group norm, two batch rows a block) raced at 16 warps: every run wrong
            # and different, on an H100 (2026-11-27 12:57 UTC, benchmarks/results/regroup16_h100_2026-11-27/); the
            # same kernel at 1, 4 and 8 warps, and without the regrouping at 16, matched float64. So 8 warps here
            warps = 8
        return LaunchConfig(warps, 1 if s.frange == 1 else 2, TileOptions(unroll_max=16))
    # rows <= 16: pad dots to 16 (mma.sync), except when the streamed operand also feeds other ops in the
    # loop (measured: rmsnorm_linear's X squared beside X @ W ran 31 us with 16, 22 us with 64-row wgmma)
    # (with column tiles under 64 that 64-row config computed a WRONG result on Triton 3.6 — rel. error 1e-2,
    # benchmarks/perf/NOTES.md — so there we keep 16 rows: slower, correct)
    min_m = 16 if s.dot_rows <= 16 and not (s.side_use and s.dot_cols >= 64) else 64
    if s.dot_rows <= SKINNY_ROWS and (s.frange > 1 or s.chunks >= 3) and not s.chained and not s.side_use:
        # a weight-streaming product of 17-32 rows in a K loop: mma.sync at its own rows (padded to 32), not 64-row
        # wgmma tiles, whose doubled row operand cut the pipeline to 2-3 stages (the layer at batch 32 on an H100:
        # gate/up 83.9 us, down 61.2, q 21.1, o 26.5 at 64 rows; the same kernels at batch 8 with 16-row
        # mma.sync and 4-8 stages: 80.6, 48.3, 14.0, 15.6; benchmarks/perf/NOTES.md session 8)
        min_m = 16
    if s.frange == 1:
        # a one-step product deeper than 256 is a loop of 256-deep chunks: pipeline it as a K loop (the layer's k and
        # v projections at bs8, 128 blocks of (8, 1024) @ (1024, 32): 7.9 us at 2 stages, 5.7-6.0 at 3-4 on an H100,
        # benchmarks/results/layer_h100_1520/sweep)
        return LaunchConfig(4, min(4, s.chunks) if s.chunks >= 3 else 2, TileOptions(dot_min_m=min_m))
    if s.chained:  # attention-like: two dependent products per iteration; 3 stages, 4 warps measured best
        # with an elementwise stream beside them (an additive bias: a tile from DRAM every iteration), 4 stages where
        # they fit: H100, inputs rotated (L2-cold), bias_attention's designs 20.6 -> 19.6 us (64 x 64 tiles) and
        # 21.9 -> 21.4 (128 x 64); warm, where the bias stays in L2, 3 and 4 timed alike (benchmarks/perf/NOTES.md
        # session 15m)
        return LaunchConfig(4, 4 if s.side_stream else 3, TileOptions(dot_min_m=min_m))
    per_stage = s.stage_bytes if min_m == 16 else s.stage_bytes * max(1, 64 // max(16, s.dot_rows))
    if s.side_use:
        # measured on an H100 (run5 sweep): one-kernel rmsnorm_linear, 64 columns, k_tile 128: 4 stages
        # 21.0 us, 3 stages 24.5; k_tile 256: 21.5 vs 21.9. Four stages whenever three of them fit.
        # (64-row padding grows only the row operand: at most twice the 16-row stage bytes here)
        fits4 = s.stage_bytes * (2 if min_m == 64 else 1) * 3 <= SMEM_BUDGET
        return LaunchConfig(4, 4 if fits4 else 3, TileOptions(dot_min_m=min_m))
    stages = 4 if per_stage * 4 <= SMEM_BUDGET * 4 // 5 else 3 if per_stage * 3 <= SMEM_BUDGET else 2
    from .resources import smem_estimate

    if stages == 2 and smem_estimate(bg, arg_types, LaunchConfig(4, 3, TileOptions(dot_min_m=min_m))) <= SMEM_BUDGET:
        # the per-stage rule above counts every stage's buffer; three stages hold two (resources.smem_estimate).
        # Where three fit, two starve the stream (an H100, 2026-11-26: gated_mlp_bs1's first candidate, 32 blocks
        # of two 128-column products, 56.7 us at 2 stages, 30.8 at 3; benchmarks/results/suite_h100_2026-11-26_s11)
        stages = 3
    if s.operand_chain and s.dot_rows > 1 and min_m == 16 and s.blocks <= NUM_SMS:
        # one block an SM whose loop computes a product's operand (the weighted norm's x r w, padded to 16 rows) and
        # stores it for mma.sync every iteration: at 4 warps (one a scheduler) that chain's latency is exposed. H100,
        # 2026-11-27 10:13 UTC (benchmarks/results/layer17_h100_2026-11-27/call2_prologue_layer17_*.json): rms_norm(x,
        # w) @ W, 96 blocks of 64 columns, 2 / 16 rows: 40.5 / 42.0 us at 4 warps, 21.7 / 22.4 at 8 (unweighted
        # 20.7); a one-row product (a 16-row row dot) ran slower at 8 (q shape 15.1 -> 21.2), so not those
        return LaunchConfig(8, stages, TileOptions(dot_min_m=min_m))
    if s.blocks <= NUM_SMS // 2 and s.frange >= 8:
        # few blocks (half the SMs or fewer, one block each): every block's stream is latency-bound, so keep
        # more tiles in flight per block (the layer's 64-block o projection at 4 stages: 26.8 us for 33.6 MB on
        # an H100, 1.25 TB/s; benchmarks/perf/NOTES.md session 7); at most 8 stages, the loop's length
        stages = max(stages, min(8, s.frange, (SMEM_BUDGET * 4 // 5) // max(per_stage, 1)))
    return LaunchConfig(4, stages, TileOptions(dot_min_m=min_m))


#: :func:`~verimirage.backend.codegen.generate`'s launch options that change the generated module's text, with
#: their defaults (the *default mode*); a launch mode is a mapping of some of them (:func:`launch_mode`). Warps and
#: pipeline stages are not among them: they are launch parameters (the module's ``LAUNCH`` table, which the runtime
#: overrides), not the module's text.
MODE_OPTIONS: dict[str, Any] = {"pdl": "", "merge": False, "last_block": False, "persistent": False,
                                "tile_waits": False}


def launch_mode(mode: Mapping[str, Any] | str | None = None) -> dict[str, Any]:
    """A launch mode in its normal form: the options of :data:`MODE_OPTIONS` that differ from their defaults, sorted
    (``{}``: the default module). ``mode``: a mapping, None, or text as :func:`mode_name` writes it
    (``"default"``, ``"merge,last_block"``, ``"pdl=end,merge"``). Raises ValueError for an unknown option or value."""
    if isinstance(mode, str):
        items: dict[str, Any] = {}
        for part in (p.strip() for p in mode.split(",")):
            if part and part != "default":
                key, eq, val = part.partition("=")
                items[key.strip()] = val.strip() if eq else True
        mode = items
    out: dict[str, Any] = {}
    for key, val in sorted((mode or {}).items()):
        if key not in MODE_OPTIONS:
            raise ValueError(f"launch mode: unknown option {key!r}; expected some of {', '.join(MODE_OPTIONS)}")
        ok = val in ("", "start", "end", "auto") if key == "pdl" else isinstance(val, bool)
        if not ok:
            raise ValueError(f"launch mode: {key}={val!r}; expected "
                             + ("'start', 'end' or 'auto'" if key == "pdl" else "True or False"))
        if val != MODE_OPTIONS[key]:
            out[key] = val
    return out


def mode_name(mode: Mapping[str, Any] | str | None = None) -> str:
    """A launch mode as text: ``"default"``, or its options joined by commas (``"merge,pdl=end"``)."""
    m = launch_mode(mode)
    return ",".join(k if v is True else f"{k}={v}" for k, v in m.items()) or "default"


def tuned_module(program: Any, mode: Mapping[str, Any] | str | None = None) -> ModuleSource:
    """The module ``vm.compile(program)`` generates by default (no profiled selection in the process, no config):
    each kernel with :func:`recommend`'s tile options, under the launch mode ``mode`` (:func:`launch_mode`; None: the
    default mode, whose module's ``digest`` a certificate records). Merged launches keep kernels that
    :func:`recommend` gives different warps apart. The runtime's tuned path generates its module with this function,
    so regenerating it from a μGraph and a mode gives the text ``vm.compile`` wrote and ran."""
    return generate(program, tiles_for=lambda bg, at: recommend(bg, at).tiles,
                    merge_key=lambda bg, at: recommend(bg, at).num_warps, merge_fits=merge_fits, **launch_mode(mode))


def merge_fits(kernels: Sequence[tuple[BlockGraph, Sequence[TensorType], Sequence[Any] | None]]) -> bool:
    """Whether one merged launch may hold ``kernels`` (each its block graph, operand types and operands' element types
    in memory): their shared memory together fits at the pipeline stages the launch takes
    (:func:`verimirage.backend.runtime.merged_config`: those of the looped kernel with the most blocks), so merging them
    lowers no kernel's pipelining. Measured on an H100 (BENCHMARKS.md "A decoder layer", 2026-11-27 04:49): the layer's
    bs8 q, k and v projections (4 stages each, recommend's) merged ran at 2 stages, the layer 252.1 us against 242.8
    with every kernel apart."""
    from .runtime import merged_config

    cs = [recommend(bg, at) for bg, at, _ in kernels]
    blocks = [bg.num_blocks for bg, _, _ in kernels]
    return merged_config(cs, blocks, list(kernels)).num_stages >= merged_config(cs, blocks, list(kernels),
                                                                                 fit_smem=False).num_stages


def triton_digest(mugraph: Graph | str, mode: Mapping[str, Any] | str | None = None) -> str:
    """The sha256 of the Triton module ``vm.compile`` generates for ``mugraph`` (a μGraph or its text) under the
    launch mode ``mode`` (None: the default, the digest a certificate records and ``vm.check_certificate``
    regenerates): :func:`tuned_module`'s digest. Imports the code generator, not torch or triton."""
    return tuned_module(MuGraph.parse(mugraph) if isinstance(mugraph, str) else mugraph, mode).digest


def candidate_configs(bg: BlockGraph, arg_types: Sequence[TensorType]) -> list[LaunchConfig]:
    """:func:`recommend` first, then a few neighbours worth timing (for the profiler)."""
    best = recommend(bg, arg_types)
    out = [best]
    if best.tiles.flat:  # the block graph's own tiles, for comparison
        out.append(LaunchConfig(4, 1, replace(best.tiles, flat=0)))
    for w, st in ((best.num_warps, best.num_stages + 1), (8, best.num_stages), (best.num_warps, 2)):
        c = LaunchConfig(w, max(1, st), best.tiles)
        if c not in out:
            out.append(c)
    return out


def wave_efficiency(blocks: int, per_sm: int = 1, sms: int = NUM_SMS) -> float:
    """Fraction of SM slots busy over the run when ``blocks`` equal blocks run ``per_sm`` at a time per SM."""
    slots = sms * per_sm
    return blocks / (math.ceil(blocks / slots) * slots)


def skinny_matmul_plan(m: int, k: int, n: int, *, weights: int = 1, sms: int = NUM_SMS) -> dict[str, Any]:
    """Design parameters for ``X (m, k) @ W (k, n)`` (``weights`` such matrices sharing X), M small.

    Returns ``{"split_k": S, "cols": C, "k_tile": T, "blocks": B}``: a single kernel (S = 1) when
    ``n / C`` fills the SMs in one wave at >= 90% for C in (32, 64); otherwise split-K with C = 64 and the
    smallest S (a power of two) giving >= 2.5 x the SM count blocks, plus a combine kernel (C columns,
    for-loop over the S partials).
    """
    for cols in (32, 64):
        if n % cols == 0 and 0.9 * sms <= n // cols <= sms:
            kt = 256 if weights == 1 and m <= 16 else 128
            while k % kt:
                kt //= 2
            return {"split_k": 1, "cols": cols, "k_tile": kt, "blocks": n // cols}
    cols = 64 if n % 64 == 0 else 32 if n % 32 == 0 else 16
    s = 1
    while (n // cols) * s < 2.5 * sms and k % (2 * s) == 0 and k // (2 * s) >= 256:
        s *= 2
    kt = 128
    while (k // s) % kt:
        kt //= 2
    return {"split_k": s, "cols": cols, "k_tile": kt, "blocks": (n // cols) * s}


def _attn_plan(h: int, n: int, kv: int) -> dict[str, Any]:
    rows = 64 if n >= 64 else max(16, 1 << (n - 1).bit_length())
    splits = 16
    while splits > 1 and kv // splits < 128:
        splits //= 2
    return {"rows": rows, "splits": splits, "kv_tile": 128, "combine_rows": 16}


def design_params(name: str, g: Graph) -> list[tuple[str, dict[str, Any]]]:
    """Good design parameters for suite program ``name`` on graph ``g``, best first.

    Each entry is ``(builder, kwargs)`` with ``builder`` a function name in
    :mod:`verimirage.benchmarks.designs`. Measured on an H200 (H100-class SM count and shared memory);
    the ranking is what the search should prefer for suite-like shapes.
    """
    t = {x.name: x.type for x in g.inputs if x.name is not None}
    if name in ("gqa", "mha", "qknorm_gqa", "gqa_stable", "mha_stable", "mqa"):
        q, k = t["Q"], t["K"]
        p = _attn_plan(q.shape[0], q.shape[1], k.shape[2])
        extra = {"qknorm": True} if name == "qknorm_gqa" else {}
        if name.endswith("_stable"):
            extra = {"stable": True}
        return [("split_kv_attention", p | extra), ("split_kv_attention", p | {"splits": p["splits"] * 2} | extra)]
    if name in ("gated_mlp", "rmsnorm_linear", "lora"):
        x = t["X"]
        w = t["W1"] if name == "gated_mlp" else t["W"]
        m, kk = x.shape
        nn = w.shape[1]
        if name == "lora":
            return [("lora", {"cols": 32, "k_tile": 256 if m <= 16 else 64}), ("lora", {"cols": 64, "k_tile": 256})]
        plan = skinny_matmul_plan(m, kk, nn, weights=2 if name == "gated_mlp" else 1)
        single = name  # the one-kernel builder has the program's name
        if plan["split_k"] == 1:
            out = [(single, {"cols": plan["cols"], "k_tile": plan["k_tile"]})]
            out.append((f"{name}_splitk", {"cols": 64, "splits": 2, "k_tile": 128}))
        else:
            out = [(f"{name}_splitk", {"cols": plan["cols"], "splits": plan["split_k"], "k_tile": plan["k_tile"]})]
            out.append((single, {"cols": 64, "k_tile": 128}))
        return out
    if name == "ntrans":
        return [("ntrans", {"rows": 1})]
    return []
