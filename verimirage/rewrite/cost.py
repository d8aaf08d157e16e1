"""Cost model for μGraphs: device-memory bytes, launches, tensor-core flops, shared memory, parallelism.

The estimate is a roofline per kernel::

    time = launch + max(bytes / bandwidth, tc_flops / tc_peak + other_flops / simt_peak) / utilisation

where ``utilisation = blocks / (ceil(blocks / SMs) * SMs)`` (a grid that leaves
SMs idle, or a last partial wave, is charged for it), times the occupancy
``min(1, blocks in flight per SM / overlap_blocks)`` (blocks per SM are
limited by the grid and by shared memory; one block alone cannot overlap its
loads with another's arithmetic). Three refinements come
from H100/H200 measurements (benchmarks/perf/NOTES.md):

* a block streams from device memory at most ``block_bandwidth`` (more when a pipelined ``tl.dot`` loop
  keeps more bytes in flight: ``dot_latency_s``), so a memory-bound kernel needs enough blocks in flight
  (skinny matmuls want split-K; one block per SM does not reach the copy bandwidth), the blocks on one SM at
  most ``sm_bandwidth`` together, and a pipelined loop exposes ``pipeline_fill`` of a stage of every resident
  block per round (deeper K tiles cost more); a for-loop neither
  pipelined nor unrolled waits ``serial_iteration_s`` an iteration, and one that reduces tiles across the block
  in its body ``reduce_iteration_s`` an iteration (unrolled or not);
* tiles are padded to powers of two in the generated code: a kernel is
  charged for the padded size of its largest padded tile;
* tiles whose rows are narrower than a DRAM ``segment`` (128 bytes) are charged for the partly used
  transactions, ``(segment / run) ** segment_exponent`` (unless one wave of neighbouring blocks reads them
  together), results stored in rows narrower than an L2 ``sector`` ``(sector / run) ** sector_write_exponent``,
  and tiles of device-memory streams the for-loop walks along their contiguous dim in runs shorter than
  ``walk_run`` bytes a little;
* the for-loop is software-pipelined: a kernel whose per-iteration tiles do
  not fit ``stages - 1`` times in shared memory (as Triton buffers them) is
  infeasible (227 KB on an H100), and each loop iteration costs a little
  fixed time. So is a kernel the backend cannot launch within that limit under any configuration
  (:meth:`LaunchModel.min_smem`; the Triton backend's: one stage, 16-row ``tl.dot`` padding);
* a for-loop whose live tiles need more registers than ``loop_registers`` per thread spills, a kernel with
  ``tl.dot`` whose tiles, accumulators and mma.sync operands need more than ``register_budget`` words a thread
  (:func:`register_words`, checked against sm_90 compile reports) spills too, products of rank-3 tiles with several
  batch elements run ``batched_dot_slowdown`` slower (mma.sync and layout conversions instead of wgmma) and rank-2
  products of fewer than 64 rows at the backend's row padding ``mma_sync_slowdown`` slower;
* a program whose traffic fits in L2 finds part of it there when called again (``hot_l2``).

What only the code generator knows (which elementwise kernels it emits flat, the block graph a kernel-level op
runs as, the least shared memory a kernel launches with, merged launches) the model asks a :class:`LaunchModel`,
given as ``launch``: the backend implements it (:class:`verimirage.backend.launch_model.TritonLaunches`) and the
orchestrator passes it in (:mod:`verimirage.pipeline.pricing`, the estimate the search ranks by); this module
imports no backend. Without one the estimate is the model's own (see :class:`LaunchModel`).

``benchmarks/calibrate_cost.py`` reports the rank agreement of these estimates with every measured candidate of
the models set (``tests/test_cost_calibration.py`` holds it).

:func:`calibrate` fits the three coefficients to GPU timings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..ir.graph import BlockGraph, Graph, MuGraph, Node, node_list, output_refs
from ..ir.ops import LOOP_OPS, OPS, Prop, TensorType


@dataclass(frozen=True)
class Hardware:
    """Device parameters the model uses (defaults: an H100 SXM)."""

    name: str = "H100"
    sms: int = 132
    smem_per_block: int = 227 * 1024
    smem_per_sm: int = 228 * 1024
    #: most elements of one tile (a Triton tensor: dims padded to powers of two); Triton refuses larger blocks
    max_tile_elements: int = 1 << 20
    #: bytes/s a streaming kernel reaches (H100, models set: the 100-350 MB programs streamed at 2.5-2.9 TB/s,
    #: 85-97% of the 2.95 TB/s copy bandwidth; was 2.4e12 from the suite's smaller kernels)
    bandwidth: float = 2.8e12
    tc_flops: float = 6.9e14  # tensor-core flop/s (fp16/bf16, measured)
    simt_flops: float = 5.0e13  # other flop/s
    #: per kernel (CUDA-graph replay, H100: 1.2 us measured launch; a kernel's ramp and tail add the rest:
    #: layernorm_linear's ten small kernels cost about 1.7 us each; was 3.0e-6)
    launch_s: float = 2.0e-6
    l2_bytes: int = 50 * 1024 * 1024  # tensors re-read by many blocks are served from L2 when they fit
    l2_bandwidth: float = 1.0e13  # bytes/s for re-reads served by L2
    l2_speedup: float = 4.0  # a block streams L2 hits this much faster than device-memory bytes
    #: bytes/s one thread block streams (latency-bound; H100: rmsnorm_linear's 96-block kernel, 21 us)
    block_bandwidth: float = 2.5e10
    resident_blocks: int = 4  # blocks of a kernel in flight per SM, at most
    stages: int = 3  # software-pipeline depth the shared-memory check assumes
    iteration_s: float = 1.0e-8  # fixed cost of one for-loop iteration
    #: a for-loop without ``tl.dot`` and more than ``unroll_max`` iterations is neither software-pipelined nor
    #: unrolled by the backend: each iteration waits for its own loads, about this long (H100, models set:
    #: log_softmax and cross_entropy as reductions over 32 tiles of the vocabulary, 3-4 us a kernel more than
    #: their bytes; benchmarks/results/models.json)
    serial_iteration_s: float = 1.0e-7
    #: for-loops without ``tl.dot`` of at most this many iterations are unrolled (``TileOptions.unroll_max``)
    unroll_max: int = 16
    #: a block of a software-pipelined ``tl.dot`` loop keeps ``stages - 1`` iterations' tiles in flight and
    #: streams at least ``in_flight / dot_latency_s`` (Little's law), above ``block_bandwidth`` for deep stages
    #: (H100: qkv_bias's 72 blocks of 256 x 64 weight tiles at 4 stages, 462 KB each, 11.3 us, faster than its
    #: 144 blocks of 32 columns; benchmarks/results/models.json). Not for chained products (attention's loop
    #: waits on its softmax: the decode kernels' 64 blocks streamed at 30 GB/s each with 128 KB in flight)
    dot_latency_s: float = 1.5e-6
    #: the contiguous bytes a tile row has when the tile spans its tensor's whole last dim (never charged)
    min_run: int = 64
    #: DRAM segment a load should fill: rows of a tile narrower than this stream at ``(run / segment) **
    #: segment_exponent`` of the bandwidth (H100, models set: batchnorm_relu's 64-byte rows 41.5 us for
    #: 102.8 MB, 0.84 of the copy rate; qkv_bias's W in 32-byte rows 16.5 us against 11.3 us in 128-byte
    #: rows; benchmarks/results/models.json)
    segment: int = 128
    segment_exponent: float = 0.25
    #: a program whose device-memory traffic (inputs and outputs) is smaller than L2 finds part of it still in
    #: L2 when called again: ``1 - traffic / l2_bytes`` of its bytes are charged at ``l2_bandwidth`` (H100:
    #: 34 MB programs of the models set streamed at 3.1-3.9 TB/s under CUDA-graph replay, above the copy
    #: rate; 67 MB and larger at 2.8 TB/s)
    hot_l2: bool = True
    #: a tile of a tensor streamed from device memory that the for-loop walks along its contiguous last dim
    #: (attention's K stored d x kv) pays ``(walk_run / run) ** walk_exponent`` for runs of min_run up to this
    #: (H100, mha b8, 2 heads per block: KV tiles of 64 keys, 128-byte runs, 94.8 us; 128 keys 91.4 us;
    #: benchmarks/perf/NOTES.md session 3)
    walk_run: int = 256
    walk_exponent: float = 0.1
    #: blocks in flight per SM a compute-bound kernel needs to overlap one block's loads with another's
    #: arithmetic; a kernel with fewer (too few blocks for the SMs, or too much shared memory per block) runs
    #: its compute that much slower (H100, causal attention 16x1024x64: 128 blocks of 128 query rows, one per
    #: SM, 54.9 us; 256 blocks of 64 rows, two per SM, 25.6 us; benchmarks/results/models_run1.json)
    overlap_blocks: int = 2
    #: 32-bit registers per thread a for-loop's live tiles may take before they spill to local memory (255 is
    #: the hardware's most; addresses, masks and indices take the rest). The live set counted: the loop's
    #: accumulators plus twice its largest computed tile (a value and the one computed from it), spread over
    #: the block's threads (the backend's warps, :meth:`LaunchModel.loop_warps`); a kernel over budget runs
    #: ``(live / budget) ** 2`` slower
    #: (H100, causal attention 16x1024x64: 128x128 score tiles, about 320 registers, 82.4 us; 64x64 tiles,
    #: about 100, 23.8 us; benchmarks/results/models.json)
    loop_registers: int = 200
    #: a ``tl.dot`` of rank-3 tiles with several batch elements (two heads per block) lowers to mma.sync with
    #: layout conversions around it, not wgmma: its tensor-core work runs this much slower (H100, models set:
    #: attention with two heads per block 4.5-60x slower than one head, 2x with 32-row tiles; the decode
    #: kernels, memory-bound, unaffected; benchmarks/results/models.json)
    batched_dot_slowdown: float = 4.0
    #: a for-loop without ``tl.dot`` whose body reduces a tile across the block (``sum``/``max`` of a loaded
    #: tile: the online softmax's statistics) waits for each iteration's reductions (shared memory and a barrier,
    #: in order: the running max feeds the next rescale) even when unrolled: this long an iteration (H100, models
    #: set: logsumexp's 128 blocks, 4 iterations of 1,000 columns 4.8-4.9 us against one tile of 4,000 columns
    #: 3.4-3.6; cross_entropy's 16 blocks x 4 iterations of 16 x 500 tiles measured 36.6 us against 7.8 for 16
    #: whole rows, which this term ranks first, though it explains 1.2 us of the gap;
    #: benchmarks/results/models_run8_h100_1515.json)
    reduce_iteration_s: float = 3.0e-7
    #: a for-loop's kernel that computes a row statistic before its loop from rows it streams in chunks
    #: (``stabilise.prologue_norm_scales``, codegen's ``chunked_sums``) and scales each loaded operand tile by it
    #: takes about this long a chunk more than the same kernel unweighted, where one block has its SM to itself.
    #: H100 2026-11-27 10:13 UTC (benchmarks/results/layer17_h100_2026-11-27/call2_prologue_layer17_*.json), with the
    #: chunks added up elementwise and the row reduced once after their loop (codegen since the seventeenth session):
    #: rms_norm(x, w) @ W at 1 x 4096 x 4096, 32 chunks, 128 blocks 15.1 us against 9.6 unweighted (0.17 us a
    #: chunk); 256 blocks 26.9 against 22.1; 96 blocks of 2 / 16 rows at 8 warps (tuning's rule) 21.7 / 22.4 against
    #: 20.7. Before (one reduction across the block a chunk, its barrier holding the next chunk's load), 0.65 us a
    #: chunk: 23.3 at 128 blocks, 41.5 / 42.9 at 96 (07:20 UTC, results/weight_scale_ab_h100_2026-11-27b.json).
    #: Not charged where two blocks share an SM, though 256 blocks still paid 4.8 us (0.15 a chunk)
    prologue_chunk_s: float = 1.7e-7
    #: a tile stored in rows narrower than an L2 ``sector`` (32 bytes: a transposed store, each block writing a
    #: few elements of every row) costs ``(sector / run) ** sector_write_exponent`` times its bytes, however the
    #: grid walks it: each partial sector is a separate store transaction (H100, rotary_attention run 8: the
    #: kernel writing rotated K transposed, 2 MB in 16-, 8- and 4-byte runs, then the same attention kernel:
    #: 34.5, 36.7, 41.5 us with 16-key tiles, 34.8, 37.1, 41.8 with 32; +2.2 and +7.0 us over 16-byte runs;
    #: benchmarks/results/models_run8_h100_1515.json)
    sector: int = 32
    sector_write_exponent: float = 1.2
    #: 32-bit registers of one SM, in bytes. A kernel without ``tl.dot`` and without a for-loop holds its tiles in
    #: registers (as fp32: its largest input and output tiles, one of each of that size): blocks whose tiles take
    #: more than ``register_file / resident`` bytes cannot all be resident, and below ``stream_resident`` resident
    #: blocks a block's loads, reductions and stores run in turn, so the SM's share of the memory time is partly
    #: exposed: ``stream_exposure`` of it with one block resident, proportionally less with more (H100, run 10:
    #: logsumexp_prefill, 2048 x 32000, 2048 blocks of 2 x 16,000 or 4 x 8,000 columns (128 KB of fp32 a block) 57.8
    #: and 61.8 us against 47.2 for 8192 blocks of 1 x 8,000; run 16 (benchmarks/perf/results/
    #: run16_membound2_probe_h100.json): cross_entropy_prefill's two 1 x 16,000 tiles a block (128 KB, 2 resident)
    #: 119.1 us at best, 1 x 8,000 (64 KB, 4 resident) 96.7: ranked first by this term, fourth before it)
    register_file: int = 256 * 1024
    stream_resident: int = 3
    stream_exposure: float = 0.1
    #: a one-step kernel without ``tl.dot`` whose tiles read or write rows of a device-memory tensor shorter than
    #: a DRAM ``page`` (as 128-byte pieces of rows far apart: batchnorm_relu's 64-column tiles of 256 rows) streams
    #: ``(page / run) ** page_exponent`` slower than one that reads long contiguous runs: its blocks open a page for
    #: each piece (H100, run 16: batchnorm_relu's 32 x 8 x 64 tiles, 128-byte rows, 38.8-39.1 us whatever the
    #: launch order or warps; a flat kernel over the same bytes, 2-8 KB contiguous a block, 35.9-36.1, as
    #: Inductor's 36.3). Not for kernels with a K loop, whose blocks walk the rows in step (neighbours together read
    #: whole rows: qkv_bias's 128-byte weight rows at 98% of the copy rate)
    page: int = 512
    page_exponent: float = 0.06
    #: a kernel whose product consumes another product's result (attention's P @ V after Q @ K^T, the online
    #: softmax in between) runs its tensor-core work this much slower than a plain GEMM: the softmax's exp, max and
    #: rescale wait for the first product and the second waits for them, in every iteration (no ping-pong between
    #: warpgroups in the generated code); and such a block is not charged for a lone block per SM
    #: (``overlap_blocks``): its loop's software pipeline overlaps the next K / V tiles' loads with this
    #: iteration's arithmetic within the block. (H100, models set: rotary_attention's one-kernel design, 128
    #: blocks of 128 query rows, one per SM, 27.8 µs, against 33.0-37.6 for the two-kernel designs' 256 blocks of
    #: 64 rows; estimated 22.6 against 18.5-21.8 before, ranked 5th; the suite's mqa_bs1, 128 blocks of 64 rows,
    #: 8.6 µs, its fastest; the attention kernels' estimates were 0.4-0.6 of the measured times.
    #: benchmarks/calibrate_cost.py: models pooled Spearman 0.906 -> 0.912, within programs 0.677 -> 0.682, the
    #: first-ranked candidate over the best 1.039 -> 1.027 (rotary 1.28 -> 1.00); the suite's first choices
    #: 1.0745 -> 1.0727 the best (results/suite_h100_2026-11-26_s11), none slower by more than 0.4%)
    chained_dot_slowdown: float = 2.0
    #: bytes/s the blocks resident on one SM stream together, at most: a grid of few blocks cannot reach the copy
    #: rate however deep its pipelines (Little's law above stops at the SM's load path), and blocks sharing an SM
    #: share it (H100, the suite's gated_mlp_bs1: 32 blocks of 128 weight columns, 2 MB each, 30.8 us (65 GB/s a
    #: block) against 24.3 for 64 blocks; estimated the fastest of its twelve before (88 GB/s a block by
    #: ``dot_latency_s``); results/suite_h100_2026-11-26_s11)
    sm_bandwidth: float = 6.5e10
    #: a software-pipelined ``tl.dot`` loop (not a chained one) exposes about this many of its stages per round of
    #: resident blocks: each block waits for its first stage before its first product and computes its last
    #: after its last load, while all blocks of the round start together; charged as that many stages of every
    #: resident block at the device bandwidth. So, bytes and blocks equal, deeper K tiles (fewer, larger stages)
    #: cost more (H100, every skinny GEMM measured: gated_mlp_bs8 64 blocks with K tiles of 64 rows 25.1 us
    #: against 128 rows 27.8; geglu 172 blocks, 61.7 against 66.0; qkv_bias 72 blocks, 128 rows 10.6 against
    #: 256 rows 11.3; swiglu_ffn's up-projection 123.8 against 128.1; lora 4 iterations against 2 in every
    #: grid. Chosen on the models set's calibration data alone, leave-one-program-out: 0.75 for every held-out
    #: program but one; benchmarks/perf/NOTES.md, session 15)
    pipeline_fill: float = 0.75
    #: elementwise kernels whose tiles waste bandwidth run flat, as ``backend.tuning.recommend`` launches them
    #: (``TileOptions.flat``, see :func:`_flat_blocks`); False: as their block graphs tile them (what every run
    #: before codegen's flat form measured: ``benchmarks/calibrate_cost.py`` estimates its dataset so)
    flat_elementwise: bool = True
    #: a one-step kernel without ``tl.dot`` (not emitted flat) pays this for each block its busiest SM runs (each
    #: block's reductions and stores wait for all its loads). H100 2026-11-27 13:04 UTC, log_softmax 16 x 32,000 split
    #: over the row with a second pass (benchmarks/results/rowsplit_h100_2026-11-27): two kernels of 512 blocks of
    #: 1,000 columns 3.63 us, 256 of 2,000 3.00, 128 of 4,000 2.93 (the 512-block design ranked first before, at
    #: 3.63; now the 256-block one: the 128-block ones stay behind for their 16 KB a block at ``block_bandwidth``);
    #: logsumexp's and cross_entropy's splits likewise (16 x 16 blocks slower than 16 x 8: 3.59 / 3.44 us, 6.37 / 5.27,
    #: run 8). Calibration (benchmarks/calibrate_cost.py): the dataset (174 candidates) first/best 1.037 -> 1.027,
    #: within-program Spearman 0.771 -> 0.774, pooled 0.923; run 23 with this call's log_softmax rows (118, the newest
    #: methodology) first/best 1.022 -> 1.012, within 0.746 -> 0.757; the suite held out: first choices unchanged
    #: (1.047). A higher per-block rate for such kernels (45 GB/s: the one-block-a-row log_softmax streamed 128 KB a
    #: block in 4.1 us with its launch) ranked logsumexp's one-kernel design first, 1.21x its best in run 23: not taken
    stream_block_s: float = 5.0e-8
    #: per-thread 32-bit words (:func:`register_words`: a kernel's tiles, accumulators and non-wgmma product operands)
    #: beyond which a looped kernel with ``tl.dot`` of several rows spills to local memory and runs ``(words /
    #: register_budget) ** spill_exponent`` slower (``batched_spill_exponent`` with a product of 16-bit rank-3 tiles of
    #: several batch elements: mma.sync), on top of the loop law of ``loop_registers``. sm_90 allows 255 registers a
    #: thread; the budget sits above it because the estimate runs up to ~20% high near the limit. Against sm_90
    #: compile reports of 352 such kernels of committed designs (registers + stack bytes / 4, cuobjdump: Spearman
    #: 0.88; 27 of the 29 estimated over 300 words spill, none of the 240 using at most 200 registers is estimated over;
    #: benchmarks/results/models21_2026-11-27/regs_sm90.json, tests/test_cost_registers.py) and
    #: the H100 sweep of 2026-11-27 22:10 UTC (same folder): the attention designs with two heads a block (rank-3
    #: products, mma.sync, 1.1-7.5 KB of stack a thread) ran 7-115x their one-head designs (bias_attention's 2,219 us
    #: against 18.8), priced 2.4x before (54.6 against 22.8 us), 26x now (600 us; causal_attention's 120 and 102 us
    #: now 130 and 328, softcap's 132 now 334, all 31 before); 128 x 128 score tiles (0.3-0.7 KB of stack) ran 2-3x.
    #: Not predicted: which kernels ptxas compiles with whole tiles on the stack at 32 registers (bias_attention's
    #: 6.8 KB at 110x against causal's 1.1 KB at 7x, for the same estimate), nor one-step kernels (capture plan
    #: medium #31's fp32 product, 8 KB of stack, 4.2x its alternative)
    register_budget: float = 300.0
    spill_exponent: float = 3.0
    batched_spill_exponent: float = 6.0
    #: a chained kernel (see ``chained_dot_slowdown``) is not charged for a lone block per SM while its products
    #: have at most this many padded rows a warpgroup (four warps: one wgmma's 64); a block of more runs two row
    #: tiles in turn through each product and its softmax, which nothing on its SM overlaps: its compute is charged
    #: ``chained_wide_overlap`` blocks' overlap (H100 2026-11-27 22:10 UTC, benchmarks/results/models21_2026-11-27:
    #: rotary_attention's one-kernel design, 128 blocks of 128 query rows at 4 warps, 25.5 us against 19.3 for the
    #: two-kernel design's 256 blocks of 64 rows, ranked first before; the suite's mqa_bs1, 128 blocks of 64 rows,
    #: still its fastest and first). Against 1 (no charge): the models set's first/best 1.036 -> 1.022, the stored
    #: dataset's 1.045 -> 1.032; 2 (as other kernels) took their within-program Spearman 0.78 -> 0.75
    chained_rows: int = 64
    chained_wide_overlap: float = 1.4
    #: a rank-2 ``tl.dot`` of 16-bit operands with fewer than 64 rows once padded to the backend's row padding
    #: (:meth:`LaunchModel.dot_launch`: 16 for products of at most 32 rows in a K loop) runs on mma.sync, not wgmma:
    #: its tensor-core work this much slower. H100 2026-11-27 22:10 UTC (benchmarks/results/models21_2026-11-27): the
    #: suite's lora_bs8, 32-row tiles 5.3-5.7 us against 64-row 3.1-3.4; capture plan medium #56, a 512 x 1408 x 512
    #: product, 32 x 64 tiles 6.91 us against 64 x 32 5.44 (#58 and #99 likewise), estimated the other way round
    #: (#14 and #18, the same shapes, measured 4-5% the other way). Not for products of at most
    #: ``mma_sync_free_rows`` rows, for which mma.sync's 16-row tile is the fit (wgmma would compute 64). Over the
    #: sweep (against 1): the suite's first/best 1.061 -> 1.038 and within-program Spearman 0.724 -> 0.753, the
    #: plans' first/best 1.073 -> 1.065 and within-entry Spearman 0.427 -> 0.475; the models set unchanged
    mma_sync_slowdown: float = 3.0
    mma_sync_free_rows: int = 16


H100 = Hardware()


class LaunchModel(Protocol):
    """How the code generator launches what the model prices: the questions only the backend can answer
    (:class:`verimirage.backend.launch_model.TritonLaunches` answers them; :mod:`verimirage.pipeline.pricing`
    passes it to :func:`cost`). A method may raise for a kernel the backend cannot lower or an op it cannot wrap:
    the estimate then answers that question as without a launch model (the lowering reports the failure, not the
    cost model). Without a launch model (``launch=None``) each block graph is priced tiled as it stands, a
    kernel-level op outside a custom kernel by a flat roofline, one launch a kernel, shared-memory feasibility
    by this module's own estimate alone, no one-row product as a ``tl.dot``, :attr:`Hardware.stages` for every
    pipelined loop and 4 warps for every kernel."""

    @property
    def flat_block(self) -> int:
        """Elements a block of an elementwise kernel emitted flat takes."""
        ...

    def flat_pays(self, bg: BlockGraph, in_types: Sequence[TensorType]) -> bool:
        """Whether kernel ``bg`` is emitted flat: one index range over its outputs' elements, contiguous loads and
        stores, ``flat_block`` elements a block."""
        ...

    def min_smem(self, bg: BlockGraph, in_types: Sequence[TensorType], limit: int) -> int:
        """The least shared memory ``bg`` can be launched with under any configuration (or a cheap bound on it
        where that bound is within ``limit``)."""
        ...

    def default_block(self, node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
        """The block graph kernel-level ``node`` runs as outside a custom kernel."""
        ...

    def merged_launches(self, g: Graph) -> int:
        """How many launches the merged mode makes of ``g``'s kernels."""
        ...

    def merge_wanted(self) -> bool:
        """Whether programs run with merged launches when not told otherwise."""
        ...

    @property
    def row_dot_max_k(self) -> int:
        """The deepest one-row product (fp16/bf16, at least 16 deep and 16 wide) lowered to a ``tl.dot``; a deeper
        one, a column or an outer product is a broadcast multiply and a sum (:func:`_broadcast_spill`)."""
        ...

    @property
    def chunked_sum_k(self) -> int:
        """The depth of a chunk in which a for-loop's kernel streams the whole rows of a sum it computes before its
        loop (a norm's statistic: :func:`_prologue_sums`); 0 where the backend does not stream them."""
        ...

    def loop_stages(self, stage_bytes: int) -> int:
        """The software-pipeline stages of a ``tl.dot`` loop (no product consuming another's) whose one iteration
        loads ``stage_bytes`` of tiles (:func:`_in_flight`)."""
        ...

    def loop_warps(self, largest_tile: int, dots: bool) -> int:
        """The warps of a looped kernel whose largest tile has ``largest_tile`` elements (padded to powers of two),
        with ``tl.dot`` or not (the threads its live tiles spread over, :func:`_spill`)."""
        ...

    def dot_launch(self, bg: BlockGraph, in_types: Sequence[TensorType]) -> tuple[int, int]:
        """The rows kernel ``bg``'s ``tl.dot`` row operands are padded to (at least 16; 64 makes a product of fewer rows
        a wgmma one, :func:`_wgmma`) and the warps it is launched with."""
        ...


@dataclass(frozen=True)
class Calibration:
    """Multipliers fitted to GPU timings: ``time = a*mem + b*compute + c*launches``."""

    mem: float = 1.0
    compute: float = 1.0
    launch: float = 1.0


@dataclass(frozen=True)
class KernelCost:
    """One kernel's estimate."""

    bytes: int
    tc_flops: int
    other_flops: int
    blocks: int
    smem: int
    mem_s: float
    compute_s: float
    time_s: float


@dataclass(frozen=True, order=True)
class Cost:
    """A μGraph's estimate. Ordered by ``time_s`` (feasible first)."""

    infeasible: bool
    time_s: float
    bytes: int = field(compare=False)
    launches: int = field(compare=False)
    tc_flops: int = field(compare=False)
    other_flops: int = field(compare=False)
    smem_max: int = field(compare=False)
    min_blocks: int = field(compare=False)
    reason: str = field(default="", compare=False)
    kernels: tuple[KernelCost, ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        s = (
            f"{self.time_s * 1e6:.1f} us est. ({self.launches} launch(es), {self.bytes / 1e6:.2f} MB, "
            f"{self.tc_flops / 1e9:.2f} GFLOP tc, smem {self.smem_max / 1024:.0f} KB, >= {self.min_blocks} blocks)"
        )
        return s + (f" INFEASIBLE: {self.reason}" if self.infeasible else "")


def _bytes(t: TensorType) -> int:
    return t.numel * t.dtype.itemsize


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _roofline(nbytes: int, tc: int, other: int, blocks: int, smem: int, hw: Hardware, cal: Calibration,
              l2_bytes: int = 0, pad: float = 1.0, iterations: int = 0, hot: float = 0.0,
              serial: int = 0, in_flight: float = 0.0, reduce_its: int = 0, mem_pad: float | None = None,
              reg_bytes: int = 0, chained: bool = False, stage: float = 0.0, prologue: int = 0, alone_ok: bool = False,
              stream: bool = False) -> KernelCost:
    # (``stage``: the bytes one iteration of a software-pipelined tl.dot loop loads, see Hardware.pipeline_fill)
    # compute: SMs left idle by the grid (or by a partial last wave) are lost, and so is the overlap of
    # loads and arithmetic when shared memory (or, for tiles held in registers, the register file: ``reg_bytes``
    # a block, see Hardware.register_file) leaves room for fewer than ``overlap_blocks`` blocks per SM
    resident = max(1, min(hw.resident_blocks, hw.smem_per_sm // max(smem, 1)))
    if reg_bytes:
        resident = max(1, min(resident, hw.register_file // reg_bytes))
    waves = max(1, math.ceil(blocks / hw.sms))
    util = blocks / (waves * hw.sms)
    overlap = 1.0 if alone_ok else hw.chained_wide_overlap if chained else hw.overlap_blocks
    occupancy = min(1.0, min(resident, math.ceil(blocks / hw.sms)) / max(1.0, overlap))
    comp = pad * (tc / hw.tc_flops + other / hw.simt_flops) * cal.compute / max(util * occupancy, 1e-9)
    # memory: the blocks resident at once (shared memory limits them) stream in rounds; a round takes
    # the longer of one block's latency-bound stream and the round's bytes at the device bandwidth
    per_round = min(blocks, hw.sms * resident)
    rounds = max(1, math.ceil(blocks / per_round))
    # (``mem_pad``: the padding's charge on the bytes; masked lanes of a tile loaded into registers move none)
    mpad = pad if mem_pad is None else mem_pad
    per_block = mpad * nbytes / max(blocks, 1)
    # a block streams its L2 hits too, faster than device memory (x4 fits gated_mlp's re-read X, H100)
    streamed = per_block + mpad * l2_bytes / max(blocks, 1) / hw.l2_speedup
    # (``hot``: the fraction of device-memory bytes still in L2 from the previous call, see Hardware.hot_l2)
    rate = (1 - hot) / hw.bandwidth + hot / hw.l2_bandwidth
    block_bw = max(hw.block_bandwidth, in_flight / hw.dot_latency_s)
    if hw.sm_bandwidth:  # (the blocks of a round sharing the busiest SM share its load path)
        block_bw = min(block_bw, hw.sm_bandwidth / math.ceil(per_round / hw.sms))
    mem = (rounds * max(streamed / block_bw, per_block * per_round * rate)
           + l2_bytes / hw.l2_bandwidth) * cal.mem
    if stage and not chained:  # (the pipeline's fill and drain, see Hardware.pipeline_fill)
        mem += hw.pipeline_fill * rounds * stage * per_round / hw.bandwidth * cal.mem
    exposed = 0.0
    if reg_bytes and resident < hw.stream_resident:
        exposed = hw.stream_exposure * mem * (hw.stream_resident - resident) / (hw.stream_resident - 1)
    # (``prologue``: the chunks of a row statistic streamed before the loop, see Hardware.prologue_chunk_s)
    alone = min(resident, math.ceil(blocks / hw.sms)) <= 1
    t = (hw.launch_s * cal.launch + max(mem, comp) + iterations * rounds * hw.iteration_s
         + serial * rounds * hw.serial_iteration_s + reduce_its * rounds * hw.reduce_iteration_s + exposed
         + (prologue * rounds * hw.prologue_chunk_s if alone else 0.0)
         + (hw.stream_block_s * math.ceil(blocks / hw.sms) if stream else 0.0))  # (see Hardware.stream_block_s)
    return KernelCost(nbytes, tc, other, blocks, smem, mem, comp, t)


def loop_iterations(bg: BlockGraph) -> float:
    """The for-loop's iterations a block runs, on average over the blocks (fewer than ``frange`` where a per-block
    bound, ``BlockGraph.flimit``, skips some: a causal mask's tiles above the diagonal)."""
    if bg.flimit is None:
        return float(bg.frange)
    axis, a, c, d = bg.flimit
    n = bg.grid[axis]
    return sum(min(bg.frange, (a * b + c) // d + 1) for b in range(n)) / n


def block_cost(bg: BlockGraph, in_types: Sequence[TensorType], out_types: Sequence[TensorType],
               hw: Hardware = H100, cal: Calibration = Calibration(), hot: float = 0.0,
               launch: LaunchModel | None = None) -> KernelCost:
    """Estimate of one custom kernel (``hot``: the fraction of its device-memory bytes found in L2, see
    :attr:`Hardware.hot_l2`; ``launch``: the backend's answers, see :class:`LaunchModel`)."""
    blocks = bg.num_blocks
    post = bg.post_loop()
    dram_in = 0
    l2_in = 0
    smem_in = 0
    smem_walk = 0
    smem_acc = 0
    smem_tmp = 0
    tc: float = 0
    other: float = 0
    pad = 1.0
    its = loop_iterations(bg)
    # a one-step kernel without tl.dot: masked loads straight into registers (see the end of this function)
    stream = bg.frange == 1 and not any(OPS[n.op].has(Prop.CONTRACTION) for n in bg.nodes)
    # an elementwise kernel the backend emits over one flat index range (see _flat_blocks): whole runs, no padding
    flat, flat_block = _flat_blocks(bg, in_types, launch) if stream and hw.flat_elementwise else (0, 0)
    dots = False
    reducing = False
    chunk = launch.chunked_sum_k if launch is not None else 0
    streamed_rows, pre = _prologue_sums(bg)
    if not chunk:  # (rows loaded whole: their tiles count as any other)
        streamed_rows = set()
    tl_dots = set(_tl_dots(bg, launch))
    min_m = _dot_launch(bg, in_types, launch)[0] if tl_dots else 64
    for i, n in enumerate(bg.nodes):
        t = n.outs[0]
        reps = 1 if post[i] or pre[i] else its
        if n.op == "input":
            tb = _bytes(t)
            reads = int(tb * (its if n.attr("fmap") is not None else 1) * blocks)
            full = in_types[n.attr("arg")]
            run = _bytes(full) if flat else _run(t, full, hw, stream)
            reads = int(reads * _segment_charge(bg, n.attr("imap"), full.rank, run, hw))
            # a tensor small enough to stay in L2 costs one trip through device memory however often it is read
            if _bytes(full) <= hw.l2_bytes // 4:
                dram_in += min(reads, _bytes(full))
                l2_in += max(0, reads - _bytes(full))
            else:
                reads = int(reads * _page_charge(stream, run, hw))
                if n.attr("fmap") == t.rank - 1 and hw.min_run <= run < hw.walk_run:
                    # streamed from device memory, the loop walking along contiguous memory a short run per
                    # iteration: each DRAM page is opened once per iteration instead of once (not charged for
                    # L2-resident tensors: the small attention cases' split-KV designs ran as fast as before)
                    reads = int(reads * (hw.walk_run / run) ** hw.walk_exponent)
                dram_in += reads
            if n.attr("fmap") is not None and bg.frange > 1:
                smem_walk += tb
            elif i not in streamed_rows:
                smem_in += tb
            pad = max(pad, math.prod(_pow2(d) for d in t.shape) / max(1, t.numel))
            continue
        if n.op in LOOP_OPS:
            smem_acc += t.numel * 4
            other += t.numel * reps
            continue
        if OPS[n.op].has(Prop.CONTRACTION):
            a = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
            batched = math.prod(t.shape[:-2]) > 1 and min(t.shape[-2], t.shape[-1], a.shape[-1]) > 1
            # (a rank-2 tl.dot of 16-bit operands that the backend's row padding leaves under wgmma's 64 rows:
            # mma.sync, see Hardware.mma_sync_slowdown)
            narrow = (not batched and hw.mma_sync_slowdown != 1.0 and a.dtype.itemsize == 2 and i in tl_dots
                      and _pow2(t.shape[-2]) > hw.mma_sync_free_rows and not _wgmma(bg, i, min_m))
            tc += 2 * t.numel * a.shape[-1] * reps * (hw.batched_dot_slowdown if batched else
                                                      hw.mma_sync_slowdown if narrow else 1.0)
            smem_tmp = max(smem_tmp, t.numel * 4)
            dots = True
        else:
            other += t.numel * reps
            smem_tmp = max(smem_tmp, _bytes(t))
            # (a reduction in the loop body of a tile larger than its result: see Hardware.reduce_iteration_s)
            a0 = bg.nodes[n.args[0][0]].outs[n.args[0][1]] if n.args else t
            reducing = reducing or (not post[i] and not pre[i] and OPS[n.op].has(Prop.REDUCTION)
                                    and a0.numel > t.numel)
    spill = _spill(bg, [p or q for p, q in zip(post, pre, strict=True)], dots, hw, launch)
    # (a looped kernel with tl.dot of several rows: its registers, see register_words; one-row products, padded to 16
    # rows, and one-step kernels (a whole row of 1,408 columns held as fp16 where the estimate counts fp32) are left
    # to the loop law: their estimates ran 2-4x the compiled kernels' registers)
    if hw.spill_exponent and bg.frange > 1 and tl_dots and all(bg.nodes[j].outs[0].shape[-2] > 1 for j in tl_dots):
        batched16 = any(math.prod(bg.nodes[j].outs[0].shape[:-2]) > 1
                        and bg.nodes[bg.nodes[j].args[0][0]].outs[bg.nodes[j].args[0][1]].dtype.itemsize == 2
                        for j in tl_dots)
        spill *= max(1.0, register_words(bg, in_types, launch) / hw.register_budget) ** (
            hw.batched_spill_exponent if batched16 else hw.spill_exponent)
    spill *= _broadcast_spill(bg, hw, launch)
    chained = dots and _chained(bg)  # see Hardware.chained_dot_slowdown
    alone_ok = False
    if chained:
        tc *= hw.chained_dot_slowdown
        groups = max(1, _dot_launch(bg, in_types, launch)[1] // 4)
        rows = max((_pow2(bg.nodes[j].outs[0].shape[-2]) for j in tl_dots), default=0)
        alone_ok = rows <= hw.chained_rows * groups
    written = 0.0
    for r, om, full in zip(bg.outputs, bg.omaps, out_types, strict=True):
        t = bg.type_of(r)
        run = _bytes(full) if flat else _run(t, full, hw, stream)
        written += _bytes(full) * _segment_charge(bg, om.dims, full.rank, run, hw) * (
            max(1.0, hw.sector / run) ** hw.sector_write_exponent) * _page_charge(stream, run, hw)
    nbytes = dram_in + written
    # loop-walked tiles are multi-buffered by the software pipeline: Triton 3.6 keeps stages - 1 copies in
    # shared memory (H100: 2 heads x KV tiles of 256 keys at 3 stages asked for 266,240 B = 2 x 128 KB of K and
    # V tiles + the Q tile); loop-invariant tiles are loaded once
    smem = smem_in + smem_walk * max(1, hw.stages - 1) + smem_acc + smem_tmp
    # a one-step kernel without tl.dot: its tiles are masked loads into registers (the padding costs lanes, not
    # bytes: batchnorm_relu's whole 3136-column rows padded to 4096 ran 38.5 us, its 64-wide tiles 39.1, H100,
    # benchmarks/perf/results/run15_membound_probe_h100.json), and its largest tiles (fp32, one per input of that
    # size) bound the blocks resident per SM
    regs = 0
    mem_pad = None
    if stream:
        mem_pad = 1.0
        sizes = [math.prod(_pow2(d) for d in n.outs[0].shape) for n in bg.nodes if n.op == "input"]
        big = max(sizes, default=0)
        outs = [math.prod(_pow2(d) for d in bg.type_of(r).shape) for r in bg.outputs]
        regs = 4 * big * max(1, sum(1 for x in [*sizes, *outs] if x == big))
    tc_all, other_all = int(tc * blocks), int(other * blocks)
    if flat:  # its blocks of flat_block elements each (no padding), one per input and output in registers
        blocks, regs, pad = flat, 4 * flat_block * (len(in_types) + len(out_types)), 1.0
    kc = _roofline(int(nbytes), tc_all, other_all, blocks, 0 if flat else smem, hw, cal, l2_in, pad * spill,
                   math.ceil(its), hot, 0 if dots or bg.frange <= hw.unroll_max else math.ceil(its),
                   _in_flight(bg, smem_walk, hw, launch) if dots else 0.0,
                   math.ceil(its) if reducing and not dots and bg.frange > 1 else 0, mem_pad, regs, chained,
                   float(smem_walk) if dots and bg.frange > 1 else 0.0,
                   sum(math.ceil(bg.nodes[j].outs[0].shape[-1] / chunk) for j in streamed_rows),
                   stream=stream and not flat, alone_ok=alone_ok)
    # (the block graph's own tiles still say whether the kernel fits at all: the tiled form is the fallback)
    return dataclasses.replace(kc, smem=smem) if flat else kc


def _prologue_sums(bg: BlockGraph) -> tuple[set[int], list[bool]]:
    """The block inputs a for-loop's kernel reads without the loop's map only through a chain of one-operand
    elementwise ops into a sum along the last dim (a norm's statistic of whole rows computed before the loop,
    ``stabilise.prologue_norm_scales``), and per node whether it is such an input, chain or sum: their arithmetic
    runs once, not every iteration, and a backend that streams those rows in chunks through registers
    (:attr:`LaunchModel.chunked_sum_k`) gives them no shared memory."""
    pre = [False] * len(bg.nodes)
    if bg.frange <= 1:
        return set(), pre
    readers: dict[int, list[int]] = {}
    for j, n in enumerate(bg.nodes):
        for a, _ in n.args:
            readers.setdefault(a, []).append(j)
    out: set[int] = set()
    for j, n in enumerate(bg.nodes):
        if n.op != "input" or n.attr("fmap") is not None:
            continue
        k, chain = j, [j]
        while len(readers.get(k, [])) == 1:
            k = readers[k][0]
            u = bg.nodes[k]
            chain.append(k)
            if u.op == "sum" and u.attr("axis") % u.outs[0].rank == u.outs[0].rank - 1:
                out.add(j)
                for c in chain:
                    pre[c] = True
                break
            if len(u.args) != 1 or not OPS[u.op].has(Prop.ELEMENTWISE):
                break
    return out, pre


def _flat_blocks(bg: BlockGraph, in_types: Sequence[TensorType], launch: LaunchModel | None) -> tuple[int, int]:
    """The blocks of kernel ``bg`` and the elements of each when the backend emits it flat (one index range over its
    outputs' elements, ``launch.flat_block`` a block, contiguous loads and stores), which the Triton backend does
    where its own tiles would waste bandwidth (``LaunchModel.flat_pays``; Triton's ``tuning.flat_pays``: rows
    shorter than 512 bytes, or padding idling more than 1/8 of the lanes); (0, 0) otherwise, or without a launch
    model. (H100, run 16: batchnorm_relu's flat kernel 35.9-36.1 us for 102.8 MB, its 64-column tiles 38.8-39.1:
    ``Hardware.page``.)"""
    if launch is None:  # the block graph's own tiles
        return 0, 0
    try:
        if not launch.flat_pays(bg, in_types):
            return 0, 0
    except Exception:  # a kernel codegen cannot lower: the lowering reports that, not the cost model
        return 0, 0
    a, k = bg.outputs[0]
    numel = bg.nodes[a].outs[k].numel * bg.num_blocks
    return max(1, math.ceil(numel / launch.flat_block)), launch.flat_block


def _run(t: TensorType, full: TensorType, hw: Hardware, whole: bool = False) -> int:
    """Contiguous bytes of one row of tile ``t`` of tensor ``full``: its last dim's; when it spans the whole last dim,
    ``min_run``, or with ``whole`` (a one-step kernel without tl.dot, see :func:`block_cost`) that dim's bytes
    (batchnorm_relu's whole 3136-column rows are 6,272-byte runs, measured faster than its 128-byte ones,
    benchmarks/perf/results/run15_membound_probe_h100.json). (Every kernel's whole-dim rows are not given their
    bytes: that reorders the suite's and the attention programs' profiled sets, unmeasured.)"""
    if t.shape and t.shape[-1] < full.shape[-1]:
        return t.shape[-1] * t.dtype.itemsize
    return max(hw.min_run, full.shape[-1] * full.dtype.itemsize if whole and full.shape else 0)


def _page_charge(stream: bool, run: int, hw: Hardware) -> float:
    """Factor on the bytes of a one-step kernel without ``tl.dot`` (``stream``) whose tile rows are ``run``
    contiguous bytes (see :attr:`Hardware.page`); 1 for other kernels and runs of a page or more."""
    if not stream or run >= hw.page:
        return 1.0
    return float((hw.page / max(run, 1)) ** hw.page_exponent)


def _in_flight(bg: BlockGraph, stage: int, hw: Hardware, launch: LaunchModel | None) -> float:
    """Bytes a block of a software-pipelined ``tl.dot`` loop keeps in flight: ``stages - 1`` iterations' tiles, with
    the stages the backend gives a loop of ``stage`` bytes an iteration (:meth:`LaunchModel.loop_stages`; without
    one :attr:`Hardware.stages`); none where a product consumes another's result (attention's P @ V)."""
    if bg.frange <= 1 or stage <= 0 or _chained(bg):
        return 0.0
    stages = launch.loop_stages(stage) if launch is not None else hw.stages
    return float(min(bg.frange, stages - 1) * stage)


def _chained(bg: BlockGraph) -> bool:
    """Whether a product of ``bg`` consumes another product's result (attention's P @ V after Q @ K^T)."""
    after_dot: list[bool] = []
    for n in bg.nodes:
        dep = any(after_dot[a] for a, _ in n.args)
        dot = OPS[n.op].has(Prop.CONTRACTION)
        if dot and dep:
            return True
        after_dot.append(dep or dot)
    return False


def _segment_charge(bg: BlockGraph, imap: Sequence[int | None], rank: int, run: int, hw: Hardware) -> float:
    """Factor on the device-memory bytes of a tile whose rows are ``run`` contiguous bytes (see
    :attr:`Hardware.segment`). Not charged when the grid is one wave (at most one block per SM) and its axis 0,
    the one consecutive blocks walk in launch order, splits the tensor's contiguous dim: all blocks stream
    together, neighbours reading neighbouring runs, which fill the segments between them (H100: gated_mlp's
    128 blocks of 32 weight columns, 64-byte rows, streamed 64 MB at 2.9 TB/s, benchmarks/results/latest.json;
    qkv_bias's 144 blocks of 32 columns, two waves' worth, 12.6 us against 11.3 for 72 blocks of 64,
    benchmarks/results/models.json)."""
    if run >= hw.segment:
        return 1.0
    if bg.grid[0] > 1 and bg.num_blocks <= hw.sms and imap and imap[0] == rank - 1:
        return 1.0
    return float((hw.segment / run) ** hw.segment_exponent)


def _spill(bg: BlockGraph, post: Sequence[bool], dots: bool, hw: Hardware, launch: LaunchModel | None = None
           ) -> float:
    """How much slower a kernel runs for the registers its for-loop's live tiles need (see
    :attr:`Hardware.loop_registers`), over the threads of the warps the backend gives it
    (:meth:`LaunchModel.loop_warps`; without one 4); 1 without a loop or within the budget."""
    if bg.frange <= 1:
        return 1.0
    padded = [math.prod(_pow2(d) for d in n.outs[0].shape) if n.outs else 0 for n in bg.nodes]
    acc = sum(p for n, p in zip(bg.nodes, padded, strict=True) if n.op in LOOP_OPS)
    body = max((p for n, p, q in zip(bg.nodes, padded, post, strict=True)
                if not q and n.op != "input" and n.op not in LOOP_OPS), default=0)
    threads = 32 * (launch.loop_warps(max(padded, default=0), dots) if launch is not None else 4)
    live = (acc + 2 * body) / threads
    return max(1.0, live / hw.loop_registers) ** 2


def register_words(bg: BlockGraph, in_types: Sequence[TensorType], launch: LaunchModel | None = None
                   ) -> float:
    """32-bit words a thread of kernel ``bg`` needs for its tiles at the peak of its loop body (or of its one step),
    over the threads of the warps the backend launches it with (:meth:`LaunchModel.dot_launch`; 4 without one): its
    loop accumulators; the values computed before the loop that the loop reads (fp32; a computed wgmma row operand as
    16-bit); the two largest tiles its body computes (a value and the one computed from it, fp32; a block input loaded
    in the body counts as one unless it only feeds products); and the operands of the products: wgmma (:func:`_wgmma`)
    reads loaded operands from shared memory and holds a computed row operand (attention's P) in registers, mma.sync
    (a batch of several elements, fewer than 64 rows at the backend's row padding) holds both, the row operand
    repeated over the warps along the columns and the column operand over the warps along the rows, and an fp32
    product (no tensor cores) half of each. Products' outputs and accumulators count at their padded rows. Checked
    against sm_90 compile reports (registers + stack bytes / 4): :attr:`Hardware.register_budget`."""
    post = bg.post_loop()
    _, pre = _prologue_sums(bg)
    looped = bg.frange > 1
    padded = [math.prod(_pow2(d) for d in n.outs[0].shape) if n.outs else 0 for n in bg.nodes]
    min_m, warps = _dot_launch(bg, in_types, launch)
    threads = 32 * warps
    readers: dict[int, list[int]] = {}
    for j, n in enumerate(bg.nodes):
        for a, _ in n.args:
            readers.setdefault(a, []).append(j)
    wg = {j: _wgmma(bg, j, min_m) for j in _tl_dots(bg, launch)}
    # loop-varying values (an input the loop walks, an accumulator, or computed from one); the others are computed
    # once before the loop, and those a varying value reads are held across it
    varying: list[bool] = []
    for n in bg.nodes:
        varying.append((n.attr("fmap") is not None) if n.op == "input" else
                       n.op in LOOP_OPS or any(varying[a] for a, _ in n.args))
    # a block input a product reads (itself or through permutes: strided loads) feeds it from memory: no fp32 tile
    views: set[int] = set()
    for j, n in enumerate(bg.nodes):
        if OPS[n.op].hooks.get("reorders_dims") and (bg.nodes[n.args[0][0]].op == "input" or n.args[0][0] in views):
            views.add(j)

    def to_dots(j: int) -> bool:
        used = readers.get(j, [])
        return bool(used) and all(u in wg or (u in views and to_dots(u)) for u in used)

    acc = 0.0
    held = 0.0
    body: list[float] = []
    operands = 0.0
    for j, n in enumerate(bg.nodes):
        words = float(padded[j])  # (fp32 in registers)
        if j in wg and n.outs[0].rank >= 2:  # (a product's rows padded to the backend's row padding)
            words *= max(1, min_m // _pow2(n.outs[0].shape[-2]))
        if n.op in LOOP_OPS:
            a = n.args[0][0] if n.args else j
            acc += words * (max(1, min_m // _pow2(n.outs[0].shape[-2])) if a in wg and n.outs[0].rank >= 2 else 1)
            continue
        if post[j] or pre[j]:
            continue
        used = readers.get(j, [])
        if looped and not varying[j]:
            if any(varying[u] and not wg.get(u) for u in used):
                held += words  # (read in the loop, not as a wgmma operand only)
            elif any(varying[u] for u in used) and n.op != "input":
                held += words / 2  # (a computed wgmma row operand, held as 16-bit)
            continue
        if n.op == "input" or j in views:
            if to_dots(j):
                continue  # (a product's operand only: shared memory for wgmma, counted below for mma.sync)
            if n.op == "input":
                body.append(words)
            continue
        if not (j in wg and used and all(OPS[bg.nodes[u].op].has(Prop.LOOP) and not OPS[bg.nodes[u].op].has(
                Prop.BROADCAST) and len(bg.nodes[u].args) == 1 for u in used)):
            body.append(words)  # (a product summed by the loop, a K loop's, computes into its accumulator's registers)
        if j in wg:
            ta, tb = (bg.nodes[x].outs[k] for x, k in n.args[:2])
            pa = float(math.prod(_pow2(d) for d in ta.shape))
            pb = float(math.prod(_pow2(d) for d in tb.shape))
            depth = _pow2(ta.shape[-1])
            half = min(1.0, ta.dtype.itemsize / 4)
            if wg[j]:
                if bg.nodes[n.args[0][0]].op != "input":
                    operands += half * pa / threads
                continue
            if ta.dtype.itemsize > 2:  # (fp32: no tensor cores, a blocked layout: half of each operand at once)
                operands += (pa + pb) / threads / 2
                continue
            # (mma.sync's operands are read from shared memory a K slice at a time: at most MMA_K_SLICE of them live)
            slice_ = min(1.0, MMA_K_SLICE / depth)
            pa, pb = pa * slice_, pb * slice_
            batch = math.prod(_pow2(d) for d in n.outs[0].shape[:-2])
            wb = min(warps, batch)
            wm = min(warps // wb, max(1, _pow2(n.outs[0].shape[-2]) // 16))
            wn = max(1, min(warps // (wb * wm), _pow2(n.outs[0].shape[-1]) // 8))
            # (the row operand split over the warps along the batch and the rows, the column operand over those along
            # the batch and the columns; warps left over hold copies)
            operands += half * pa / (32 * wb * wm) + half * pb / (32 * wb * wn)
    body.sort(reverse=True)
    return (acc + held + sum(body[:2])) / threads + operands


#: the contraction depth of an mma.sync product's operand tiles that :func:`register_words` counts as held at once
#: (Triton reads them from shared memory in slices along K): sm_90 compile reports, one-step products of 8-16 rows
#: 1,024-1,408 deep at 168-204 registers a thread without stack (benchmarks/results/models21_2026-11-27/regs_sm90.json)
MMA_K_SLICE = 64


def _tl_dots(bg: BlockGraph, launch: LaunchModel | None) -> list[int]:
    """The products of ``bg`` the backend lowers to ``tl.dot`` (the others, a broadcast multiply and a sum: see
    :func:`_broadcast_spill`)."""
    row_dot = launch.row_dot_max_k if launch is not None else 0
    out = []
    for j, n in enumerate(bg.nodes):
        if not OPS[n.op].has(Prop.CONTRACTION):
            continue
        a = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
        t = n.outs[0]
        if a.rank < 2 or t.rank < 2:
            continue
        m, k, nn = a.shape[-2], a.shape[-1], t.shape[-1]
        if (m > 1 and k > 1 and nn > 1) or (m == 1 and k > 1 and nn > 1 and 16 <= _pow2(k) <= row_dot
                                             and _pow2(nn) >= 16):
            out.append(j)
    return out


def _dot_launch(bg: BlockGraph, in_types: Sequence[TensorType], launch: LaunchModel | None) -> tuple[int, int]:
    """The rows the backend pads ``bg``'s products' row operands to and its warps (:meth:`LaunchModel.dot_launch`;
    64 and 4 without one, the code generator's defaults)."""
    if launch is None:
        return 64, 4
    try:
        return launch.dot_launch(bg, in_types)
    except Exception:  # a kernel codegen cannot lower: the lowering reports that, not the cost model
        return 64, 4


def _wgmma(bg: BlockGraph, j: int, min_m: int) -> bool:
    """Whether product ``j`` of ``bg`` runs on wgmma (sm_90's asynchronous tensor-core product, operands in shared
    memory): no batch of several elements, at least 64 rows once padded to ``min_m``, 16-bit operands (fp32 ones are
    computed without tensor cores at the code generator's "ieee" precision)."""
    n = bg.nodes[j]
    a = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
    t = n.outs[0]
    if math.prod(t.shape[:-2]) > 1 or a.dtype.itemsize > 2:
        return False
    return max(_pow2(t.shape[-2]), min_m) >= 64 if t.rank >= 2 else False


def _broadcast_spill(bg: BlockGraph, hw: Hardware, launch: LaunchModel | None = None) -> float:
    """How much slower a kernel runs for a product that codegen lowers without ``tl.dot`` (a dim of 1: one row
    deeper than a row dot takes, :meth:`LaunchModel.row_dot_max_k`, or any one row without a launch model; a
    column, an outer product), as a broadcast multiply and ``tl.sum`` whose ``batch x M x K x N`` temporary lives in
    registers: the loop-spill law of :func:`_spill` on that temporary, over the warps the backend gives a kernel
    without ``tl.dot`` (:meth:`LaunchModel.loop_warps`; without one 4) (1 within the budget). H100, the capture's
    decode MLPs (benchmarks/results/capture, session 10): one ``(8, 1, 1024) @ (1024, 16)`` step per block ran
    11.8 us (Inductor 5.2), SwiGLU's two of them 199 us (8.9), both estimated ~5 us without this term."""
    worst = 0
    row_dot = launch.row_dot_max_k if launch is not None else 0
    for n in bg.nodes:
        if not OPS[n.op].has(Prop.CONTRACTION):
            continue
        a = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
        t = n.outs[0]
        if a.rank < 2 or t.rank < 2:
            continue
        m, k, nn = a.shape[-2], a.shape[-1], t.shape[-1]
        if m > 1 and k > 1 and nn > 1:
            continue  # a tl.dot
        if m == 1 and k > 1 and nn > 1 and 16 <= _pow2(k) <= row_dot and _pow2(nn) >= 16:
            continue  # a row dot (fp16/bf16; an fp32 one is charged like the broadcast, conservatively not)
        worst = max(worst, math.prod(_pow2(d) for d in t.shape[:-2]) * _pow2(m) * _pow2(k) * _pow2(nn))
    if not worst:
        return 1.0
    threads = 32 * (launch.loop_warps(worst, False) if launch is not None else 4)
    return max(1.0, worst / threads / hw.loop_registers) ** 2


def _backend_min_smem(bg: BlockGraph, in_types: Sequence[TensorType], limit: int, launch: LaunchModel | None) -> int:
    """The least shared memory the backend can launch ``bg`` with (:meth:`LaunchModel.min_smem`); 0 when there is
    no launch model or it cannot say (then only this module's own estimate decides feasibility)."""
    if launch is None:
        return 0
    try:
        return launch.min_smem(bg, in_types, limit)
    except Exception:  # codegen cannot lower it: the lowering reports that, not the cost model
        return 0


def _largest_tile(bg: BlockGraph) -> int:
    """Elements of the block graph's largest value with each dim padded to a power of two (as codegen pads
    it; tl.dot's minimum operand sizes aside)."""
    return max((math.prod(_pow2(d) for d in t.shape) for n in bg.nodes for t in n.outs), default=0)


def merged_launches(g: Graph, launch: LaunchModel | None) -> int | None:
    """How many launches the merged mode makes of ``g``'s kernels (:meth:`LaunchModel.merged_launches`); None where
    there is no launch model or it cannot say (an op it cannot wrap: the estimate keeps a launch per kernel)."""
    if launch is None:
        return None
    try:
        return launch.merged_launches(g)
    except Exception:  # (an op the backend cannot wrap)
        return None


def cost(g: Graph, hw: Hardware = H100, cal: Calibration = Calibration(), merge: bool | None = None,
         launch: LaunchModel | None = None) -> Cost:
    """Estimate for a kernel graph or μGraph, with ``launch`` the backend's answers (:class:`LaunchModel`; the
    estimate the search ranks by is :func:`verimirage.pipeline.pricing.cost`, this one with the Triton backend's).

    ``merge`` (default: as the runtime launches, :meth:`LaunchModel.merge_wanted`; off without a launch model): the
    kernels of one dependency level that the tuning rules give the same warps are one launch
    (:func:`merged_launches`), each launch after the first of such a group no longer paying ``hw.launch_s``
    (measured on an H100, the decoder layer at bs1: 16 -> 14 launches, 197.1 -> 194.3 µs; another candidate
    13 -> 11, 208.3 -> 195.5; BENCHMARKS.md "A decoder layer").

    Kernel-level ops outside custom kernels are costed as the backend will run them: each wrapped in
    its default block graph (:meth:`LaunchModel.default_block`; without a launch model, or for an op the backend
    cannot wrap, a flat roofline of its bytes and flops). Only custom
    kernels (the search's block graphs) can be infeasible for shared memory: a wrapped kernel-level op is
    how the backend runs that op whatever the size (its tiles live in registers; e.g. qknorm_gqa's
    ``rms_norm`` of K over axis 1, a 64 x 1024 tile modelled at 256 KB, compiles for sm_90 with 8 KB of
    shared memory), so the unfused baseline is always a candidate.
    """
    nodes = node_list(g)

    def arg_types(n: Any) -> list[TensorType]:
        return [nodes[a].outs[k] for a, k in n.args]

    wrapped: dict[int, BlockGraph] = {}
    def inline(op: str) -> bool:  # (a constant such as a causal mask is computed inside the kernels that read it)
        return op in ("input", "custom") or OPS[op].has(Prop.CONSTANT)

    if launch is not None and any(not inline(n.op) for n in nodes):
        try:
            wrapped = {i: launch.default_block(n, arg_types(n)) for i, n in enumerate(nodes) if not inline(n.op)}
        except Exception:  # an op the backend cannot wrap: fall back to the flat estimate below
            wrapped = {}
    ks: list[KernelCost] = []
    reason = ""
    traffic = sum(_bytes(n.outs[0]) for n in nodes if n.op == "input") + sum(
        _bytes(nodes[a].outs[k]) for a, k in output_refs(g))
    hot = max(0.0, 1.0 - traffic / hw.l2_bytes) if hw.hot_l2 else 0.0
    for i, n in enumerate(nodes):
        if n.op == "input" or OPS[n.op].has(Prop.CONSTANT):
            continue
        in_types = arg_types(n)
        if n.op == "custom":
            kc = block_cost(n.attr("block"), in_types, n.outs, hw, cal, hot, launch)
            big = _largest_tile(n.attr("block"))
            if big > hw.max_tile_elements and not reason:
                reason = (f"a block value is a tile of {big} elements (padded; > {hw.max_tile_elements} per "
                          "Triton tensor)")
            if kc.smem > hw.smem_per_block and not reason:
                reason = f"a block needs {kc.smem / 1024:.0f} KB of shared memory (> {hw.smem_per_block // 1024} KB)"
            if not reason:
                least = _backend_min_smem(n.attr("block"), in_types, hw.smem_per_block, launch)
                if least > hw.smem_per_block:
                    reason = (f"a kernel's tiles need {least} B of shared memory under every launch configuration "
                              f"(> {hw.smem_per_block} B per block)")
        elif i in wrapped:
            kc = block_cost(wrapped[i], in_types, n.outs, hw, cal, hot, launch)
        else:
            out = n.outs[0]
            nbytes = sum(_bytes(t) for t in in_types) + _bytes(out)
            mm = OPS[n.op].has(Prop.CONTRACTION)
            tc = 2 * out.numel * in_types[0].shape[-1] if mm else 0
            other = 0 if mm else sum(t.numel for t in in_types)
            kc = _roofline(nbytes, tc, other, max(hw.sms, out.numel // 4096), 0, hw, cal, hot=hot)
        ks.append(kc)
    launches = len(ks)
    saved = 0.0
    if merge is None:
        merge = launch is not None and launch.merge_wanted()
    if merge and launches > 1:
        merged = merged_launches(g, launch)
        if merged is not None and merged < launches:
            saved, launches = (launches - merged) * hw.launch_s * cal.launch, merged
    # A program input returned as an output is returned as a copy (backend.runtime clones it: a copy kernel, one more
    # launch). Uncounted, a captured graph's design returning its input ranked level with one kernel writing both
    # outputs and, after Hardware.stream_block_s, above it (H100 2026-11-27 16:16 UTC, plan_decode_fp16 entry 85: a
    # negation of 8 values and a constant passed through, 1.09 us as one kernel, 2.15 with the copy).
    for a, k in output_refs(g):
        if nodes[a].op == "input":
            t = nodes[a].outs[k]
            ks.append(_roofline(2 * _bytes(t), 0, 0, max(1, min(hw.sms, t.numel // 4096)), 0, hw, cal, hot=hot))
            launches += 1
    return Cost(
        infeasible=bool(reason),
        time_s=sum(k.time_s for k in ks) - saved,
        bytes=sum(k.bytes for k in ks),
        launches=launches,
        tc_flops=sum(k.tc_flops for k in ks),
        other_flops=sum(k.other_flops for k in ks),
        smem_max=max((k.smem for k in ks), default=0),
        min_blocks=min((k.blocks for k in ks), default=0),
        reason=reason,
        kernels=tuple(ks),
    )


def calibrate(samples: Sequence[tuple[Graph, float]], hw: Hardware = H100,
              launch: LaunchModel | None = None) -> Calibration:
    """Fit :class:`Calibration` to measured ``(mugraph, seconds)`` pairs (least squares, non-negative), each
    estimated with ``launch`` (see :func:`cost`).

    The hook the GPU profiler feeds: ``cost(g, cal=calibrate(timings))`` then ranks by calibrated time.
    """
    import numpy as np

    if not samples:
        return Calibration()
    rows, ys = [], []
    for g, secs in samples:
        c = cost(g, hw, launch=launch)
        mem = sum(k.mem_s for k in c.kernels)
        comp = sum(k.compute_s for k in c.kernels)
        rows.append([mem, comp, c.launches * hw.launch_s])
        ys.append(secs)
    a = np.asarray(rows)
    y = np.asarray(ys)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    coef = np.clip(coef, 1e-3, None)
    return Calibration(float(coef[0]), float(coef[1]), float(coef[2]))


__all__ = ["H100", "Calibration", "Cost", "Hardware", "KernelCost", "LaunchModel", "block_cost", "calibrate", "cost",
           "merged_launches", "MuGraph"]
