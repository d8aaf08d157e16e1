"""Triton code generation: one ``@triton.jit`` kernel per block graph, plus a launcher.

:func:`generate` lowers a μGraph to the source text of a Python module: every
kernel-level op is first wrapped into a ``custom`` kernel (:mod:`.wrap`), then
each block graph becomes a kernel and ``forward(*inputs)`` launches them in
order. The source is written to a file and imported by the runtime (Triton's
compiler needs the kernels' source on disk).

How a block graph becomes a kernel
----------------------------------
* **Tiles in registers.** Every block-level value is an fp32 register tensor
  whose shape is the value's tile shape with each dim *padded* to a power of
  two (Triton's ranges must be powers of two); dims of ``tl.dot`` operands are
  padded to at least ``dot_min_m`` rows and ``dot_min_nk`` columns/contraction
  (the GPU compiler needs >= 16, and wgmma needs 64 rows per warp group).
  Dims that must line up (operands of elementwise ops, matmul contraction
  dims, loop accumulators, ...) are unified so they get one padded size.
* **Padding contract.** Padded positions may hold anything. Loads mask them
  (``other=0``), stores mask them, and every op that mixes elements along a
  padded axis (sum/mean/max, rms_norm, the contraction of a matmul, concat)
  first replaces them with its identity (``tl.where``). Masks are emitted only
  where a dim is actually padded.
* **Grid and tiles.** ``tl.program_id`` per grid axis; an input's tile offset on
  a dim is ``pid * (dim / grid)`` for the grid axis of its imap plus
  ``it * tile`` for the for-loop's fmap; strides are kernel arguments taken
  from the tensors, so non-contiguous inputs work.
* **For-loop.** Loop-invariant values are hoisted before the loop;
  ``loop_sum``/``loop_max`` are fp32 accumulators; ``running_max`` keeps its
  previous value so ``rescaled_sum`` can multiply by ``exp(m_prev - m)`` (online
  softmax); ``loop_sum(matmul)`` accumulates inside ``tl.dot``. Values after the
  loop (epilogues) run once. With a one-iteration loop everything is
  straight-line code.
* **Thread graphs** are inlined as elementwise expressions.
* **Numerics.** Loads are upcast to fp32; ``tl.dot`` operands are cast to the
  matmul's dtype (fp16/bf16 use the tensor cores with fp32 accumulation; fp32
  uses ``fp32_precision``); stores cast to the output's dtype.

The op-by-op expressions come from the registry's ``"triton"`` domain
(:mod:`.lowering`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.dtypes import DType
from ..ir.errors import GraphError
from ..ir.graph import BlockGraph, Graph, MuGraph, Node, ThreadGraph, live_nodes, make_attrs, node_list, output_refs
from ..ir.limits import FLOAT32_MAX
from ..ir.ops import OPS, Prop, TensorType, neg_axis
from . import lowering as _lowering  # noqa: F401  (registers the triton domain)
from .lowering import HELPERS, TRITON_MAX_NUMEL
from .wrap import to_kernels

#: Largest (padded) contraction tile a one-row product is lowered to a 16-row ``tl.dot`` with (TileOptions.row_dot);
#: longer rows keep the broadcast multiply and sum. Measured on an H100 (benchmarks/perf/NOTES.md session 7): the
#: layer's v projection, 128 blocks each one (1, 1024) @ (1024, 32) product with no loop, ran 55.0 us as a 16-row
#: dot and 5.3 us as the broadcast multiply; the pipelined GEMVs that streamed at the copy rate had K tiles <= 256.
ROW_DOT_MAX_K = 256
#: Whether a one-step one-row product ``(1, K) @ (K, N)`` deeper than :data:`ROW_DOT_MAX_K` is emitted as
#: :meth:`_KernelGen.chunked_dots`' loop of ``ROW_DOT_MAX_K``-deep 16-row dots (the row broadcast to 16 rows, row 0
#: of the result kept), pipelined as a K loop, rather than one broadcast multiply and ``tl.sum`` over the whole
#: ``(K, N)`` tile at 16 warps (the layer's k and v projections at batch 1: 256 blocks of (1, 1024) @ (1024, 32))
CHUNK_ROW_DOTS = True
#: Depth of a chunk of :meth:`_KernelGen.chunked_sums`' loop (a row statistic computed before a for-loop, its rows
#: padded as the ``tl.dot`` operand they scale: 64 x 128 fp32 values, 64 registers a thread at 4 warps). H100,
#: 2026-11-27 07:20 UTC (benchmarks/results/weight_scale_ab_h100_2026-11-27b.json): 128 deep with the dot's 64
#: padded rows ran rmsnorm(x, w) @ W (16 x 4096 x 6144) in 42.9 us; the rows' own padding (16) with 512-deep chunks
#: in 50.2 us, and 2 rows with one 4096-deep chunk (or 8 rows, 1024 deep) in 14 ms (07:23 UTC, same file).
CHUNKED_SUM_K = 128
#: Most batch elements of a batched row product's ``tl.dot`` (:meth:`_KernelGen.row_groups`): a block of several KV
#: heads' P @ V, each head its own (rows, K) @ (K, N).
ROW_DOT_MAX_BATCH = 8
#: Elements a tensor the kernels read or write must stay below: their offsets (``pid * tile * stride``) are int32
#: (:mod:`.runtime` copies an input view whose elements span more to a contiguous tensor)
INT32_INDEX = 2**31

#: Version of the generator: part of every cache key (bump when generated code changes).
CODEGEN_VERSION = "18"


@dataclass(frozen=True)
class TileOptions:
    """Choices the IR leaves free that change the generated source (GPU autotuner parameters)."""

    dot_min_m: int = 64  # rows of tl.dot operands padded to at least this (wgmma: 64 per warp group)
    dot_min_nk: int = 16  # columns / contraction of tl.dot padded to at least this (GPU minimum 16)
    fp32_precision: str = "ieee"  # tl.dot input_precision for fp32 operands: "ieee" or "tf32"
    #: for-loops without tl.dot of at most this many iterations are unrolled (tl.static_range), so all
    #: their loads are in flight at once (Triton pipelines only loops that feed tl.dot); 0 disables
    unroll_max: int = 16
    #: loads of inputs no other block re-reads (every grid axis with several blocks indexes them) carry
    #: ``eviction_policy="evict_first"``: streamed once, they need not displace re-read tiles in L2
    evict_once: bool = False
    #: products of rank-3 tiles with one batch element are emitted as batch-1 ``tl.dot`` on the rank-3
    #: values (no ``tl.reshape`` around the dot, so Triton's pipeliner turns both operands' loads into
    #: asynchronous copies; batched dots use mma.sync, never wgmma). Off: such products are rank-2 dots,
    #: block inputs feeding only them are loaded squeezed to rank 2 where that keeps the dot reshape-free
    dot_batch1: bool = False
    #: a product of one row (``(1, K) @ (K, N)``, K and N >= 16, no batch: decode-time GEMVs) is a ``tl.dot`` of
    #: the row broadcast to this many rows (row 0 of the result kept), so the K loop is software-pipelined and
    #: the weights stream as asynchronous copies; 0: a broadcast multiply and ``tl.sum`` (no tensor cores, no
    #: pipelining). Measured on an H100 (benchmarks/perf/NOTES.md, session 7): 4096 x 14336 x 2 gate/up at
    #: one row, 80.5 us as a 16-row dot against 120-125 us as a broadcast multiply and sum
    row_dot: int = 16
    #: a looped kernel that reads a causal mask, whose values all have leading dims of size 1 and whose looped
    #: inputs all feed ``tl.dot`` is emitted at rank 2 (those dims dropped: no ``tl.reshape`` around the dots, V
    #: loaded as the P @ V operand instead of shared -> registers -> shared every iteration; see
    #: :func:`_rank2_lead`). Measured (benchmarks/perf/NOTES.md session 10, H200): causal attention 64 x 64 with
    #: the diagonal split, 17.1 -> 14.6 us at rank 2
    rank2: bool = True
    #: a kernel without ``tl.dot`` whose grid splits the contiguous (last) dim of its largest tensor launches that
    #: grid axis as CUDA's fastest-varying block index (see :func:`_stream_order`), so consecutive blocks read and
    #: write neighbouring runs of the same rows, as a flat elementwise kernel does
    stream_order: bool = True
    #: a loop-free kernel of elementwise ops whose tiles all line up with its output's (:func:`flat_shape`) is emitted
    #: over one flat index range of its output, this many elements a block, each operand read at the element's
    #: broadcast coordinates (:func:`_flat_kernel`: Inductor's pointwise form); 0: the block graph's tiles. The μGraph
    #: is the same either way. Measured (benchmarks/perf/NOTES.md session 13c, H100): batchnorm_relu's (32, 256, 3136)
    #: as 128-byte row pieces 38.3-39.1 us, as a flat kernel of 1,024-4,096 elements a block 35.9-36.1
    flat: int = 0

    def __post_init__(self) -> None:
        if self.row_dot not in (0, 16, 32, 64):
            raise ValueError(f"TileOptions.row_dot={self.row_dot!r}; expected 0 (off), 16, 32 or 64")
        for k in ("dot_min_m", "dot_min_nk"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"TileOptions.{k}={v!r}; expected a power of two >= 16")
        if not isinstance(self.unroll_max, int) or self.unroll_max < 0:
            raise ValueError(f"TileOptions.unroll_max={self.unroll_max!r}; expected an int >= 0")
        if not isinstance(self.flat, int) or self.flat < 0 or (self.flat and (self.flat < 128 or self.flat & (
                self.flat - 1) or self.flat > TRITON_MAX_NUMEL)):
            raise ValueError(f"TileOptions.flat={self.flat!r}; expected 0 (off) or a power of two from 128 to "
                             f"{TRITON_MAX_NUMEL}")
        if self.fp32_precision not in ("ieee", "tf32", "tf32x3"):
            raise ValueError(f"TileOptions.fp32_precision={self.fp32_precision!r}; expected 'ieee', 'tf32' or 'tf32x3'")


@dataclass(frozen=True)
class LaunchConfig:
    """One tile configuration: source-level tile options plus launch parameters."""

    num_warps: int = 4
    num_stages: int = 2
    tiles: TileOptions = field(default_factory=TileOptions)
    #: ignore the fields above: every kernel gets :func:`verimirage.backend.tuning.recommend`'s config
    tuned: bool = False

    def __post_init__(self) -> None:
        if self.num_warps not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"LaunchConfig.num_warps={self.num_warps!r}; expected 1, 2, 4, 8, 16 or 32")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"LaunchConfig.num_stages={self.num_stages!r}; expected an int >= 1")

    def key(self) -> str:
        """A short stable text for cache keys and reports."""
        if self.tuned:
            return "tuned"
        t = self.tiles
        u = "" if t.unroll_max == 16 else f"u{t.unroll_max}"
        e = "e1" if t.evict_once else ""
        b = "b1" if t.dot_batch1 else ""
        r = "" if t.row_dot == 16 else f"r{t.row_dot}"
        q = "" if t.rank2 else "q0"
        o = "" if t.stream_order else "o0"
        f = f"f{t.flat}" if t.flat else ""
        head = f"w{self.num_warps}s{self.num_stages}m{t.dot_min_m}n{t.dot_min_nk}{t.fp32_precision}"
        return f"{head}{u}{e}{b}{r}{q}{o}{f}"


#: Most combine blocks the last-arriving block of a group runs, one after another, in a last-block-combines launch
#: (:func:`last_block_plan`); a pair whose combine has more blocks per group keeps its two launches. Measured on an
#: H100 (benchmarks/results/last_block_h100_2026-11-27_0203): one combine block per group (decode_gqa, 8 groups of
#: 16 splits) 33.95 -> 32.71 us; four per group, run one after another by the group's last block (the suite's
#: split-KV attention, whose combine is 4x finer than its split), 0.74-0.96x of the two launches
LASTBLOCK_MAX_TILES = 1


@dataclass(frozen=True)
class LastBlock:
    """How a split kernel's blocks group for a last-block-combines launch (:func:`last_block_plan`).

    ``matched`` lists ``(a, b, r)``: split-kernel grid axis ``a`` and combine-kernel grid axis ``b`` partition the
    same dim of the partial results, the combine's ``r`` times finer (combine block ``c`` on ``b`` reads only what
    split block ``c // r`` on ``a`` wrote). The split kernel's other axes are *gathered*: a group is the split
    blocks that agree on every matched axis (``groups`` of them, each of ``count`` blocks), and the combine blocks
    of a group (``tiles``: the ``r`` finer ones on each matched axis, every block on the combine's other axes) read
    only what that group wrote."""

    matched: tuple[tuple[int, int, int], ...]
    count: int
    groups: int
    tiles: int


@dataclass(frozen=True)
class KernelInfo:
    """One generated kernel: its name, launch grid, argument signature and whether it uses tl.dot."""

    name: str
    node: int
    grid: tuple[int, ...]
    signature: dict[str, str]
    uses_dot: bool
    #: every tl.dot of the kernel is a one-row product's 16-row dot (TileOptions.row_dot: mma.sync, never wgmma)
    row_dots_only: bool = False
    #: a merged launch (:func:`generate`'s ``merge``): the μGraph nodes of the kernels it runs, in block order
    #: (``node`` is the first); () for a kernel of its own. A last-block-combines launch (:func:`generate`'s
    #: ``last_block``): its split kernel's node, then its combine kernel's
    members: tuple[int, ...] = ()
    #: which launch-grid axis each block-grid axis of the kernel uses (:func:`_launch_axes`)
    launch_axes: tuple[int, ...] = ()
    #: a last-block-combines launch: its :class:`LastBlock` plan and the offset of its counters in the program's
    #: counter buffer; None otherwise
    last_block: tuple[LastBlock, int] | None = None
    #: a persistent kernel (:func:`generate`'s ``persistent``): its blocks loop over the tasks of every kernel of the
    #: program (``grid`` is the number of tasks; the runtime launches at most as many blocks as can be co-resident)
    persistent: bool = False
    #: a device function with L2 prefetches of its own (``<name>_pf``, :meth:`_KernelGen.prefetch_lines`), which the
    #: merged launch calls before its ``gdc_wait``
    prefetch: bool = False
    #: with programmatic dependent launch: the kernel's for-loop runs before its wait (it reads only operands no kernel
    #: that may still run writes: :func:`kernel_source`'s ``early_args``)
    early_loop: bool = False
    #: with programmatic dependent launch: a kernel without a for-loop loads its tiles of the operands no kernel that
    #: may still run writes before its wait (:data:`PDL_EARLY_LOADS_MIN_BYTES` a block or more)
    early_loads: bool = False


#: A value a kernel reads or writes: ``("in", i)`` the program's i-th input, ``("buf", j)`` the j-th
#: buffer the launcher allocates (see :class:`LaunchStep`), ``("view", j)`` the j-th view
#: (:attr:`ModuleSource.views`: another value's memory under a new contiguous shape, no launch), ``("ctr", n)``
#: the program's ``n`` int32 completion counters (:attr:`ModuleSource.counters`: last-block-combines launches).
ValueRef = tuple[str, int]


@dataclass(frozen=True)
class LaunchStep:
    """One kernel launch of ``forward``, as data: what the runtime's lean launcher replays.

    ``args`` are the operands in the kernel's argument order (each followed by its strides, as in the
    generated call), ``outs`` the buffers it writes: ``(buffer index, shape, dtype)`` with ``dtype`` a torch
    dtype name (``"float16"``); buffers are contiguous and numbered in allocation order over the program.
    """

    kernel: str
    grid: tuple[int, ...]
    args: tuple[tuple[ValueRef, int], ...]  # (value, rank)
    outs: tuple[tuple[int, tuple[int, ...], str], ...]


@dataclass(frozen=True)
class ModuleSource:
    """The generated module: source text, kernel descriptions, the μGraph it came from."""

    source: str
    kernels: tuple[KernelInfo, ...]
    mugraph: MuGraph
    input_names: tuple[str, ...]
    output_types: tuple[TensorType, ...]
    #: ``forward``'s launches in order and the values it returns (the runtime's lean launch path)
    steps: tuple[LaunchStep, ...] = ()
    returns: tuple[ValueRef, ...] = ()
    #: ``("view", j)`` is ``views[j] = (source, shape)``: the source's memory (a contiguous buffer or an earlier
    #: view) read as ``shape`` -- a kernel that only reshapes, row-major, is not launched (:func:`_view_kernel`)
    views: tuple[tuple[ValueRef, tuple[int, ...]], ...] = ()
    #: kernels for programmatic dependent launch (:func:`generate`'s ``pdl``: "", "start" or "end")
    pdl: str = ""
    #: int32 completion counters the last-block-combines launches and a persistent kernel use (:func:`generate`'s
    #: ``last_block``, ``persistent``): one
    #: zero-filled buffer per device and CUDA stream the generated module keeps (``_vm_counters``); every launch
    #: leaves its counters at zero again, so one buffer serves every call on its stream (a CUDA graph's capture
    #: gets its own, zeroed in the graph)
    counters: int = 0

    @property
    def digest(self) -> str:
        """SHA-256 of the source (names the file and keys the caches)."""
        return hashlib.sha256(self.source.encode()).hexdigest()


_TL_DTYPE = {DType.float16: "tl.float16", DType.bfloat16: "tl.bfloat16", DType.float32: "tl.float32",
             DType.bool: "tl.int1"}
_PTR_SIG = {DType.float16: "*fp16", DType.bfloat16: "*bf16", DType.float32: "*fp32", DType.bool: "*i1"}
_TORCH_DTYPE = {DType.float16: "torch.float16", DType.bfloat16: "torch.bfloat16", DType.float32: "torch.float32",
                DType.bool: "torch.bool"}
_NEG_INF = 'float("-inf")'
#: log2(e): a softmax's ``exp(x - m)`` is emitted as ``tl.exp2((x - m) * LOG2E)`` (:func:`_max_shift`)
_LOG2E = "1.4426950408889634"


def _fill_text(v: float) -> str:
    """Source text of a padding value (``0.0``, ``float("-inf")``, ...)."""
    if math.isinf(v):
        return _NEG_INF if v < 0 else 'float("inf")'
    return repr(float(v))


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _lift(rank: int, axis: int) -> str:
    """Indexing that puts a 1-d range on ``axis`` of a rank-``rank`` tensor."""
    if rank == 1:
        return ""
    return "[" + ", ".join(":" if i == axis else "None" for i in range(rank)) + "]"


def _shape_text(s: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, s)) + ("," if len(s) == 1 else "") + ")"


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, k: Any) -> Any:
        self.parent.setdefault(k, k)
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: Any, b: Any) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


class _KernelGen:
    """Lowers one block graph to the text of one ``@triton.jit`` function."""

    def __init__(self, bg: BlockGraph, arg_types: Sequence[TensorType], out_types: Sequence[TensorType], name: str,
                 opts: TileOptions, arg_store: Sequence[DType] | None = None,
                 out_store: Sequence[DType] | None = None, inline: dict[int, int] | None = None) -> None:
        #: operands that are causal masks (``tril_mask``, by operand: its offset): computed from the tile's
        #: indices, never passed or loaded
        self.inline = dict(inline or {})
        #: leading dims (all of size 1) every value of the kernel is emitted without (:func:`_rank2_lead`); the
        #: block graph's values are then viewed without them (input and output maps still name tensor dims)
        self.lead = _rank2_lead(bg, self.inline) if opts.rank2 else 0
        self.bg = _drop_lead(bg, self.lead) if self.lead else bg
        self.arg_types = list(arg_types)
        self.out_types = list(out_types)
        # element types in device memory (fp32 for partial results passed between kernels)
        self.arg_store = list(arg_store) if arg_store is not None else [t.dtype for t in arg_types]
        self.out_store = list(out_store) if out_store is not None else [t.dtype for t in out_types]
        self.name = name
        self.opts = opts
        #: programmatic dependent launch (kernel_source's ``pdl``: "", "start", "end", or "pre": launch_dependents
        #: before the wait)
        self.pdl = ""
        #: operands (by index) that are the program's inputs, whose tiles the kernel prefetches into L2 before its
        #: ``gdc_wait`` (kernel_source's ``prefetch``; :meth:`prefetch_lines`)
        self.prefetch: frozenset[int] = frozenset()
        #: a device function's prefetches as a function of their own (``<name>_pf``), which the merged launch calls
        #: before its ``gdc_wait``; "" when it has none
        self.prefetch_fn = ""
        #: operands (argument indices) the kernel may read before the PDL wait: no kernel still running can write them
        self.early_args: frozenset[int] = frozenset()
        #: set by generate(): the PDL wait follows the for-loop (the loop reads only ``early_args``)
        self.early_loop = False
        #: set by generate(): a kernel without a for-loop loads its tiles of ``early_args`` before the PDL wait
        #: (at least :data:`PDL_EARLY_LOADS_MIN_BYTES` a block)
        self.early_loads = False
        self.n_early_loads = 0  # (the loads :meth:`_loads_first` moved to the front)
        #: emitted as a device function of a merged launch (:func:`generate`'s ``merge``): the block's index along
        #: launch axis ``j`` is the parameter ``p<j>`` (the merged kernel's caller computes it), not ``tl.program_id``
        self.device_fn = False
        self.uf = _UnionFind()
        self.size: dict[Any, int] = {}
        self.dot_m: set[Any] = set()
        self.dot_nk: set[Any] = set()
        self.uses_dot = False
        self.row_dots = 0  # one-row products lowered to 16-row dots (see row_groups)
        self.full_dots = 0  # other tl.dot products
        self.tmp = 0
        #: names of block inputs loaded without their size-1 dims -> the rank-2 shape they have
        self.squeezed: dict[str, tuple[int, ...]] = {}
        #: the shape of the last accumulator emit_matmul(carry=True) returned (tl.dot's own; see emit_matmul)
        self.carried: tuple[int, ...] = ()
        self.alias_reshape: dict[int, int] = {}  # reshape node -> the block input it only re-dims (row dots)
        #: names of block inputs loaded straight as a row product's ``(rows, K)`` ``tl.dot`` operand, its rows after
        #: the product's own zero (see row_loaded_inputs), and the products that read such an operand
        self.row_loaded: dict[str, int] = {}
        self.zero_row_dots: set[int] = set()
        #: matmuls of concats computed piecewise (see split_concat_matmuls), set by generate()
        self.split_mm: dict[int, list[tuple[Any, Any]]] = {}

    # ------------------------------------------------------------------ dim classes and padding
    def _keys(self, vid: Any, t: TensorType) -> list[Any]:
        keys = []
        for ax, n in enumerate(t.shape):
            k = (vid, ax)
            if n > 1:
                self.size[k] = n
                self.uf.find(k)
            keys.append(k)
        return keys

    def _unify_bcast(self, outs: list[Any], out_t: TensorType, ins: list[tuple[list[Any], TensorType]]) -> None:
        r = out_t.rank
        for keys, t in ins:
            lead = r - t.rank
            for ax, n in enumerate(t.shape):
                if n > 1:
                    self.uf.union(keys[ax], outs[ax + lead])

    def _unify_node(self, vid_of: Any, nodes: Sequence[Node], i: int) -> None:
        n = nodes[i]
        outs = [self._keys(vid_of(i, k), t) for k, t in enumerate(n.outs)]
        ins = [(self._keys(vid_of(a, k), nodes[a].outs[k]), nodes[a].outs[k]) for a, k in n.args]
        op = n.op
        if op in ("input", "arg"):
            return
        if op == "fused":
            tg: ThreadGraph = n.attr("thread")
            tvid = lambda j, k, i=i: ("t", vid_of(i, 0), j, k)  # noqa: E731
            for j, tn in enumerate(tg.nodes):
                if tn.op == "arg":
                    keys, t = ins[tn.attr("index")]
                    tk = self._keys(tvid(j, 0), tn.outs[0])
                    self._unify_bcast(tk, tn.outs[0], [(keys, t)])
                else:
                    self._unify_node(tvid, tg.nodes, j)
            for k, (a, kk) in enumerate(tg.outputs):
                tk = self._keys(tvid(a, kk), tg.nodes[a].outs[kk])
                self._unify_bcast(outs[k], n.outs[k], [(tk, tg.nodes[a].outs[kk])])
            return
        self._unify_with(OPS[op], ins, n.attr_dict, outs[0], n.outs[0])

    def _unify_with(self, d: Any, ins: list[tuple[list[Any], TensorType]], attrs: dict[str, Any], out: list[Any],
                    ot: TensorType) -> None:
        """Union the dim keys the op's index rule lines up (one rule, shared with the partitioner)."""
        im = d.index_map([t for _, t in ins], attrs, ot)
        for a, j, o in im.links:
            if ins[a][1].shape[j] > 1:
                self.uf.union(ins[a][0][j], out[o])
        for grp in im.reduced:
            ks = [ins[a][0][j] for a, j in grp if ins[a][1].shape[j] > 1]
            for k in ks[1:]:
                self.uf.union(ks[0], k)
        if im.matrix is not None:
            self._dot_facts(ins, im, out, ot)

    def _dot_facts(self, ins: list[tuple[list[Any], TensorType]], im: Any, out: list[Any], ot: TensorType) -> None:
        """Record the tl.dot dims of a matrix product (rows, and columns + contraction: padded to >= 16)."""
        m_ax, n_ax = im.matrix
        (a0, j0) = im.reduced[0][0]
        kk = ins[a0][1].shape[j0]
        if ot.shape[m_ax] > 1 and kk > 1 and ot.shape[n_ax] > 1:
            self.dot_m.add(out[m_ax])
            self.dot_nk.update((out[n_ax], ins[a0][0][j0]))

    def _unify_matmul(self, op: str, a: tuple[list[Any], TensorType], b: tuple[list[Any], TensorType],
                      out: list[Any], ot: TensorType) -> None:
        """Line up the dims of a product ``op(a, b)`` (keys and types of the operands) with its result ``out``."""
        self._unify_with(OPS[op], [a, b], {}, out, ot)

    def _finish_classes(self) -> None:
        cls: dict[Any, int] = {}
        for k, n in self.size.items():
            root = self.uf.find(k)
            if cls.setdefault(root, n) != n:  # pragma: no cover - shape rules make this impossible
                raise GraphError(f"codegen: inconsistent tile sizes {cls[root]} and {n} on one dim class")
        pad = {root: _pow2(n) for root, n in cls.items()}
        for k in self.dot_m:
            r = self.uf.find(k)
            pad[r] = max(pad[r], self.opts.dot_min_m)
        for k in self.dot_nk:
            r = self.uf.find(k)
            pad[r] = max(pad[r], self.opts.dot_min_nk)
        self.pad = pad

    def padded(self, vid: Any, t: TensorType) -> tuple[int, ...]:
        """Padded shape of value ``vid`` of logical type ``t``."""
        return tuple(1 if n == 1 else self.pad[self.uf.find((vid, ax))] for ax, n in enumerate(t.shape))

    # ------------------------------------------------------------------ emission helpers
    def fresh(self, base: str = "t") -> str:
        self.tmp += 1
        return f"{base}{self.tmp}"

    def _mask(self, rank: int, axis: int, n: int, p: int, lo: int = 0) -> str:
        r = f"tl.arange(0, {p}){_lift(rank, axis)}"
        return f"({r} < {n})" if lo == 0 else f"(({r} >= {lo}) & ({r} < {lo + n}))"

    def sanitize(self, lines: list[str], x: str, t: TensorType, p: tuple[int, ...], axis: int, fill: str) -> str:
        """``x`` with padded positions along ``axis`` replaced by ``fill`` (a new name) if that axis is padded."""
        if p[axis] == t.shape[axis]:
            return x
        y = self.fresh("m")
        lines.append(f"{y} = tl.where({self._mask(t.rank, axis, t.shape[axis], p[axis])}, {x}, {fill})")
        return y

    def load(self, i: int, p: tuple[int, ...], axis: int | None = None, start: int = 0,
             squeeze: bool = False, sub: tuple[int, str] | None = None, roll: int = 0,
             it: str = "it", line: int = 0) -> tuple[str, str | None]:
        """Pointer and mask text of the tile of block input ``i`` (shifted by ``start`` along ``axis``; ``roll``:
        rotated along ``axis``, position ``j`` reading ``(j + roll) % size``, for a tile holding its whole dim).

        With ``squeeze`` the tile's size-1 dims are dropped (their offsets become scalar terms): the
        pointer tensor has only the dims of size > 1. ``sub = (dim, offset)``: a chunk of ``p[dim]`` elements of
        the tile along ``dim`` (unpadded there), starting ``offset`` (an expression) into it. ``it``: the loop's
        iteration (an expression). ``line`` (elements): along the tile's last dim only every ``line``-th element
        (one pointer a cache line where that dim is contiguous; :meth:`prefetch_lines`)."""
        n = self.bg.nodes[i]
        k = n.attr("arg")
        shape = n.attr("shape")
        imap = n.attr("imap")
        fmap = n.attr("fmap")
        t = n.outs[0].shape
        L = self.lead  # (a rank-2 view: the tile's dims are the tensor's last ones; the leading ones have size 1)
        if L:
            t, p = (1,) * L + tuple(t), (1,) * L + tuple(p)
            axis = None if axis is None else axis + L
            sub = None if sub is None else (sub[0] + L, sub[1])
        r = len(t)
        kept = [d for d in range(r) if d >= L and not (squeeze and p[d] == 1)]
        rr = len(kept)
        terms, masks = [], []
        for d in range(r):
            off = []
            chunk = t[d] * (self.bg.frange if fmap == d else 1)  # (a block's elements of dim d: shape / grid if exact)
            whole = chunk * math.prod(self.bg.grid[a] for a, dd in enumerate(imap) if dd == d)
            for a, dd in enumerate(imap):
                if dd == d and self.bg.grid[a] > 1:
                    off.append(f"pid{a} * {chunk}")
            if fmap == d and self.bg.frange > 1:
                off.append(f"{it} * {t[d]}")
            if d == axis and start:
                off.append(f"{-start}")
            if sub is not None and d == sub[0]:
                off.append(sub[1])
            if p[d] == 1 and not off:
                continue
            if d not in kept:  # a size-1 dim of a squeezed tile: a scalar offset
                terms.append(f"({' + '.join(off)}) * a{k}_s{d}")
                masks += [f"(({' + '.join(off)}) < {shape[d]})"] * (whole > shape[d])  # (a masked tail: zeros)
                continue
            j = kept.index(d)
            ar = f"tl.arange(0, {p[d]})"
            if line and d == r - 1:
                ar = f"(tl.arange(0, {max(1, p[d] // line)}) * {line})"
            idx = " + ".join([*off, f"{ar}{_lift(rr, j)}"])
            if whole > shape[d]:  # a masked tail: the operand's elements past its end read as 0 (the IR's padding)
                if roll and d == axis:
                    raise GraphError("codegen: a rotated load along a dim read with a masked tail")
                masks.append(f"(({idx}) < {shape[d]})")
            if roll and d == axis:
                idx = f"({roll} + {idx}) % {t[d]}"
            terms.append(f"({idx}) * a{k}_s{d}")
            if sub is not None and d == sub[0]:
                pass  # a chunk of an unpadded dim: every position is inside the tile
            elif d == axis and (start or p[d] != t[d]):
                masks.append(self._mask(rr, j, t[d], p[d], start))
            elif p[d] != t[d]:
                masks.append(self._mask(rr, j, t[d], p[d]))
        if not terms:
            terms.append(f"tl.zeros({_shape_text([p[d] for d in kept])}, tl.int32)")
        ptr = f"a{k}_ptr + " + " + ".join(terms)
        return ptr, (" & ".join(masks) if masks else None)

    def prefetch_lines(self) -> list[str]:
        """``_vm_prefetch`` calls (L2 prefetches, one a 128-byte line along each tile row) of the tiles this block
        reads of the operands in :attr:`prefetch` (the program's inputs, which no kernel of the program writes): a
        looped operand's first iterations, as many as :data:`PDL_PREFETCH_BYTES` covers over all of them (at least
        one), an operand read once whole if it is within that. Only tiles whose every dim is a power of two (their
        pointers are the tile's own, unmasked: inside the tensor). A prefetch changes no value: what the kernel
        computes is what it computes without it."""
        nodes = self.bg.nodes
        live = live_nodes(nodes, self.bg.outputs)
        looped = self.bg.frange > 1
        picked: list[tuple[int, int, bool]] = []  # (node, bytes, looped)
        for i, n in enumerate(nodes):
            if n.op != "input" or i not in live:
                continue
            k = n.attr("arg")
            t = tuple(n.outs[0].shape)
            if k not in self.prefetch or k in self.inline or any(x & (x - 1) for x in t):
                continue
            picked.append((i, math.prod(t) * self.arg_store[k].itemsize, looped and n.attr("fmap") is not None))
        per_iter = sum(b for _, b, lp in picked if lp)
        iters = max(1, min(self.bg.frange, PDL_PREFETCH_BYTES // per_iter)) if per_iter else 0
        out: list[str] = []
        for i, b, lp in picked:
            if not lp and b > PDL_PREFETCH_BYTES:
                continue
            t = tuple(nodes[i].outs[0].shape)
            line = 128 // self.arg_store[nodes[i].attr("arg")].itemsize
            for j in range(iters if lp else 1):
                ptr, mask = self.load(i, t, it=str(j), line=line)
                if mask is None:  # (never masked at the tile's own shape; kept as a guard)
                    out.append(f"_vm_prefetch({ptr})")
        return out

    def load_expr(self, i: int, p: tuple[int, ...], axis: int | None = None, start: int = 0,
                  squeeze: bool = False) -> str:
        ptr, mask = self.load(i, p, axis, start, squeeze)
        m = f", mask={mask}, other=0.0" if mask else ""
        if self.opts.evict_once and self.read_once(i):
            m += ', eviction_policy="evict_first"'
        return f"tl.load({ptr}{m}).to(tl.float32)"

    def tril_expr(self, i: int, p: tuple[int, ...], all_true: bool = False) -> str:
        """The tile of block input ``i`` of a causal mask operand (:attr:`inline`): 1.0 where its column index is
        at most its row index plus the offset (and inside the tile), else 0.0, from the block's and the loop's
        offsets as :meth:`load` computes them. ``all_true``: the same tile where that comparison holds for every
        element inside the tile (:meth:`full_tiles`): 1.0 inside the tile, 0.0 in its padding."""
        n = self.bg.nodes[i]
        shape, imap, fmap, t = n.attr("shape"), n.attr("imap"), n.attr("fmap"), n.outs[0].shape
        r, rt = len(t), len(shape)  # (tile and tensor ranks: they differ in a rank-2 view, see _rank2_lead)
        idx, inside = [], []
        for d in (r - 2, r - 1):
            dt = d + rt - r  # the tensor's dim
            chunk = t[d] * (self.bg.frange if fmap == dt else 1)
            off = [f"pid{a} * {chunk}" for a, dd in enumerate(imap) if dd == dt and self.bg.grid[a] > 1]
            if fmap == dt and self.bg.frange > 1:
                off.append(f"it * {t[d]}")
            idx.append("(" + " + ".join([*off, f"tl.arange(0, {p[d]}){_lift(r, d)}"]) + ")")
            if p[d] != t[d]:
                inside.append(self._mask(r, d, t[d], p[d]))
            if chunk * math.prod(self.bg.grid[a] for a, dd in enumerate(imap) if dd == dt) > shape[dt]:
                inside.append(f"({idx[-1]} < {shape[dt]})")  # (a masked tail: the mask operand's padding is 0)
        # the offset within [-rows, cols]: the same mask (all false below, all true above), and row + offset stays
        # in int32 (an offset of 2**31 - 3 wrapped: the kernel masked every element of rows >= 3)
        within = min(max(self.inline[n.attr("arg")], -shape[rt - 2]), shape[rt - 1])
        cond = " & ".join(inside if all_true else [f"({idx[1]} <= {idx[0]} + {within})", *inside])
        shape_p = _shape_text(p)
        if not cond:
            return f"tl.full({shape_p}, 1.0, tl.float32)"
        return f"tl.broadcast_to(({cond}).to(tl.float32), {shape_p})"

    def full_tiles(self, i: int, p: tuple[int, ...]) -> str | None:
        """How many first loop iterations read a tile of causal mask input ``i`` (:attr:`inline`, read in the
        loop) that is true everywhere inside the tile, as an expression of the block's index; None when the tile is
        not one of rows fixed by the block and columns walked by the loop.

        The tile of iteration ``it`` covers columns ``[it C, it C + C)`` and rows ``[b R, b R + R)``; it is all
        true when its last column is at most its first row plus the offset, ``it C + C - 1 <= b R + offset``, i.e.
        for ``it < (b R + offset + 1) // C``. Those iterations may read the tile ``tril_expr(all_true=True)``
        instead (1.0 inside the tile, 0.0 in its padding: a constant): the same values, so the kernel computes
        exactly what it computed before, in the same order (the μGraph, and so
        what was verified, is unchanged). Measured (benchmarks/perf/NOTES.md session 10): the mask's ``where``
        on every tile cost causal attention a third of its time."""
        n = self.bg.nodes[i]
        shape, imap, fmap, t = n.attr("shape"), n.attr("imap"), n.attr("fmap"), n.outs[0].shape
        r = len(shape)  # (the tensor's dims; the tile's columns are its last dim)
        if r < 2 or len(t) < 2 or fmap != r - 1 or self.bg.frange < 2:
            return None
        rows = [a for a, dd in enumerate(imap) if dd == r - 2 and self.bg.grid[a] > 1]
        if len(rows) > 1 or any(dd == r - 1 and self.bg.grid[a] > 1 for a, dd in enumerate(imap)):
            return None
        within = min(max(self.inline[n.attr("arg")], -shape[r - 2]), shape[r - 1])  # (as tril_expr)
        first = f"pid{rows[0]} * {t[-2]} + " if rows else ""
        return f"tl.maximum({first}{within + 1}, 0) // {t[-1]}"

    def causal_row_axis(self) -> int | None:
        """The grid axis whose blocks are a causal mask's row blocks (their loops the longer the larger the block
        index: :meth:`full_tiles`), when it is the slowest launch axis of at least 3 blocks; else None.

        Its blocks are launched in a balanced order: the longer half first (rows ``R-1 .. R/2``), then the rest from
        the shortest (``0 ..``). Dispatched breadth-first, the first wave's blocks each take an SM and the second's
        land beside them, so a long row block shares its SM with a short one (16 x 16 blocks of 64 rows on 132 SMs:
        17-18 iterations an SM instead of up to 24, row ``r`` beside ``r + 8``). A permutation of the blocks: every
        block computes what it computed before."""
        grid = self.bg.grid
        if self.bg.frange < 2:
            return None
        for n in self.bg.nodes:
            if n.op != "input" or n.attr("arg") not in self.inline:
                continue
            shape, imap, fmap = n.attr("shape"), n.attr("imap"), n.attr("fmap")
            r = len(shape)
            if r < 2 or fmap != r - 1:
                continue
            rows = [a for a, dd in enumerate(imap) if dd == r - 2 and grid[a] > 1]
            if len(rows) != 1 or grid[rows[0]] < 3:
                continue
            a = rows[0]
            if all(self.launch_axes[b] < self.launch_axes[a] for b, g in enumerate(grid) if g > 1 and b != a):
                return a
        return None

    def read_once(self, i: int) -> bool:
        """Whether no two blocks read the same elements of block input ``i``."""
        imap = self.bg.nodes[i].attr("imap")
        return all(g == 1 or imap[a] is not None for a, g in enumerate(self.bg.grid))

    # ------------------------------------------------------------------ ops
    def row_groups(self, ta: TensorType, tb: TensorType, pa: tuple[int, ...], pb: tuple[int, ...],
                   po: tuple[int, ...]) -> int:
        """How many one-row products ``ta @ tb`` (padded ``pa``, ``pb``; result padded ``po``) is, when it is lowered
        to one ``tl.dot`` of its rows (``TileOptions.row_dot``); 0 when it is not.

        One row ``(1, K) @ (K, N)``: the row broadcast to ``row_dot`` rows. ``G`` rows over batch dims that the
        right operand does not have (``(..., G.., 1, K) @ (K, N)``: grouped-query attention's query heads over
        one KV head): those batch dims are the dot's rows (each repeated ``row_dot / G`` times when ``G`` is
        smaller) -- the same products, each row's sum over K. K and N >= 16 (tl.dot's minimum), K at most
        ``ROW_DOT_MAX_K``, fp16/bf16 operands.

        Batched (:meth:`row_batch` ``B`` > 1): the right operand has batch dims ``(B.., 1..)`` and the left
        ``(B.., G..)``, the same leading dims (a block of several KV heads, each with its group of query heads):
        one batched ``tl.dot`` ``(B, rows, K) @ (B, K, N)``, each batch element's rows as above. Without this such a
        product was a broadcast multiply and ``tl.sum``, which Triton does not software-pipeline (the layer's P @ V
        at batch 32, two KV heads a block: 234.5 us for 268 MB on an H100, 2.6x the copy rate's time)."""
        if not (self.opts.row_dot > 0 and ta.rank >= 2 and tb.rank >= 2 and ta.shape[-2] == 1
                and ta.shape[-1] > 1 and tb.shape[-1] > 1 and 16 <= pa[-1] <= ROW_DOT_MAX_K and pb[-1] >= 16
                and ta.dtype in (DType.float16, DType.bfloat16) and tb.dtype == ta.dtype):
            return 0
        nb = math.prod(pb[:-2])
        if nb == 1:
            g = math.prod(pa[:-2])
            return g if g == math.prod(po[:-2]) and g <= 64 else 0
        # the right operand's batch dims: a prefix (j dims, equal in both operands and the result), then ones
        bb = pb[:-2]
        if not (len(pa) == len(pb) == len(po) and nb <= ROW_DOT_MAX_BATCH):
            return 0
        j = max(d for d, x in enumerate(bb) if x != 1) + 1
        if not (tuple(pa[:j]) == tuple(bb[:j]) == tuple(po[:j]) and all(x == 1 for x in bb[j:])):
            return 0
        g = math.prod(pa[j:-2])
        return g if g == math.prod(po[j:-2]) and g <= 64 else 0

    @staticmethod
    def row_batch(pb: tuple[int, ...]) -> int:
        """Batch elements ``B`` of a row product (:meth:`row_groups` > 0) whose right operand is padded ``pb``."""
        return math.prod(pb[:-2])

    def row_dot_node(self, nodes: Sequence[Node], i: int) -> int:
        """:meth:`row_groups` of block node ``i`` (0 for a product split over concat pieces, or no product)."""
        n = nodes[i]
        if not OPS[n.op].has(Prop.CONTRACTION) or i in self.split_mm:
            return 0
        (ra, rb) = n.args
        ta, tb = nodes[ra[0]].outs[ra[1]], nodes[rb[0]].outs[rb[1]]
        if ta.rank < 2 or tb.rank < 2:
            return 0
        return self.row_groups(ta, tb, self.padded(ra, ta), self.padded(rb, tb), self.padded((i, 0), n.outs[0]))

    def dot_rows(self, groups: int) -> int:
        """Rows of the ``tl.dot`` of ``groups`` one-row products (:meth:`row_groups`)."""
        return max(self.opts.row_dot, groups)

    def row_of(self, x: str, po: tuple[int, ...], groups: int, batch: int = 1, zero_rows: bool = False) -> str:
        """The ``groups`` rows (of each of ``batch`` elements) of a row-product ``tl.dot`` result ``x`` (see
        :meth:`row_groups`), shaped ``po``. Exact: the repeated rows are replaced by 0 before the sum that drops
        them. ``zero_rows``: ``x`` holds the ``groups`` rows first, then rows of zero operands
        (:meth:`row_loaded_inputs`); they are replaced by 0 the same way (a product of a zero row with an
        infinite weight is NaN, which must not reach the sum)."""
        rows = self.dot_rows(groups)
        rep = rows // groups
        if rep == 1:
            return f"tl.reshape({x}, {_shape_text(po)})"
        if zero_rows and groups > 1:
            return (f"tl.reshape(tl.sum(tl.where(tl.arange(0, {rep})[:, None, None] == 0, "
                    f"tl.reshape({x}, ({rep}, {groups}, {po[-1]})), 0.0), axis=0), {_shape_text(po)})")
        if batch > 1:
            return (f"tl.reshape(tl.sum(tl.where(tl.arange(0, {rep})[None, :, None] == 0, "
                    f"tl.reshape({x}, ({batch * groups}, {rep}, {po[-1]})), 0.0), axis=1), {_shape_text(po)})")
        if groups == 1:
            return (f"tl.reshape(tl.sum(tl.where(tl.arange(0, {rows})[:, None] == 0, {x}, 0.0), axis=0), "
                    f"{_shape_text(po)})")
        return (f"tl.reshape(tl.sum(tl.where(tl.arange(0, {rep})[None, :, None] == 0, "
                f"tl.reshape({x}, ({groups}, {rep}, {po[-1]})), 0.0), axis=1), {_shape_text(po)})")

    def emit_matmul(self, lines: list[str], n: Node, a: str, b: str, ta: TensorType, tb: TensorType,
                    pa: tuple[int, ...], pb: tuple[int, ...], po: tuple[int, ...], acc: str | None,
                    wide: bool = False, carry: bool = False) -> str:
        """Lines computing ``a @ b`` (plus ``acc`` if given); returns the result's name.

        ``wide`` (a one-row product, :meth:`row_groups`): ``acc`` and the result are the ``(row_dot, N)`` tiles of
        the broadcast row's ``tl.dot`` (a loop accumulator kept inside ``tl.dot``; :meth:`row_of` reads it).
        ``carry`` (a loop accumulator): ``acc`` and the result have the shape ``tl.dot`` itself takes, recorded in
        :attr:`carried` (no ``tl.reshape`` of the loop-carried value around the dot: Triton 3.6's sm_90 pipeliner
        fails on one, "operand #0 does not dominate this use")."""
        self.carried = po
        r = len(po)
        groups = self.row_groups(ta, tb, pa, pb, po)
        if groups:
            return self._emit_row_dot(lines, n, a, b, ta, tb, pa, pb, po, acc, wide, groups)
        if wide:  # pragma: no cover - generate asks for wide results of row products only
            raise GraphError("codegen: internal error (a wide accumulator for a product that is not one row)")
        # operands loaded squeezed (see dot_operand_inputs) already have the rank-2 shape tl.dot takes
        a_sq, b_sq = a in self.squeezed, b in self.squeezed
        if len(pa) < r and not a_sq:
            pa = (1,) * (r - len(pa)) + pa
            a2 = self.fresh("a")
            lines.append(f"{a2} = tl.reshape({a}, {_shape_text(pa)})")
            a = a2
            ta = TensorType((1,) * (r - ta.rank) + ta.shape, ta.dtype)
        if len(pb) < r and not b_sq:
            pb = (1,) * (r - len(pb)) + pb
            b2 = self.fresh("b")
            lines.append(f"{b2} = tl.reshape({b}, {_shape_text(pb)})")
            b = b2
            tb = TensorType((1,) * (r - tb.rank) + tb.shape, tb.dtype)
        m, k, nn = ta.shape[-2], ta.shape[-1], tb.shape[-1]
        out = self.fresh("d")
        if k > 1:  # (a squeezed operand is a fresh load: its padding is already 0)
            a = a if a_sq else self.sanitize(lines, a, ta, pa, r - 1, "0.0")
            b = b if b_sq else self.sanitize(lines, b, tb, pb, r - 2, "0.0")
        if not (m > 1 and k > 1 and nn > 1):
            if a_sq or b_sq:  # pragma: no cover - dot_operand_inputs only squeezes operands of tl.dot
                raise GraphError("codegen: internal error (squeezed operand of a degenerate product)")
            # a degenerate product (a row, a column or an outer product): broadcast multiply and sum
            numel = math.prod(max(x, y) for x, y in zip(pa[:-2], pb[:-2], strict=True)) * pa[-2] * pa[-1] * pb[-1]
            if numel > TRITON_MAX_NUMEL:
                raise GraphError(f"codegen: the degenerate product {ta.shape} @ {tb.shape} (no tl.dot: a dim is 1) "
                                 f"needs a broadcast temporary of {numel} elements, above Triton's limit of "
                                 f"{TRITON_MAX_NUMEL} per tensor")
            lhs = f"{a}[{', '.join([':'] * r + ['None'])}]"
            rhs = f"{b}[{', '.join([':'] * (r - 2) + ['None', ':', ':'])}]"
            expr = f"tl.sum({lhs} * {rhs}, axis={r - 1})"
            lines.append(f"{out} = {expr}" + (f" + {acc}" if acc else ""))
            return out
        self.uses_dot = True
        self.full_dots += 1
        dt = _TL_DTYPE[ta.dtype]
        batch = po[:-2]
        nb = math.prod(batch)
        pm, pk, pn = pa[-2], pa[-1], pb[-1]
        s_a: tuple[int, ...]
        s_b: tuple[int, ...]
        s_o: tuple[int, ...]
        if nb == 1 and not (self.opts.dot_batch1 and r == 3):
            s_a, s_b, s_o = (pm, pk), (pk, pn), (pm, pn)
        else:
            s_a, s_b, s_o = (nb, pm, pk), (nb, pk, pn), (nb, pm, pn)

        def shaped(x: str, have: tuple[int, ...], full: tuple[int, ...], want: tuple[int, ...],
                   cast: str = "") -> str:
            """``x`` converted by ``cast`` (``.to(...)``, see :meth:`early_casts`), broadcast to ``full`` and
            reshaped to ``want``."""
            if x in self.squeezed:
                if self.squeezed[x] != want:  # pragma: no cover - guarded by dot_operand_inputs
                    raise GraphError(f"codegen: internal error (squeezed {x} is {self.squeezed[x]}, not {want})")
                return x + cast
            x += cast
            if have != full:
                x = f"tl.broadcast_to({x}, {_shape_text(full)})"
            if full != want:
                x = f"tl.reshape({x}, {_shape_text(want)})"
            return x

        a_op = self.fresh("x")
        b_op = self.fresh("y")
        fa, fb = (*batch, pm, pk), (*batch, pk, pn)
        early_a, early_b = self.early_casts(a, b, (pa, fa, s_a), (pb, fb, s_b), acc is not None and carry)
        cast = f".to({dt})"
        lines.append(f"{a_op} = {shaped(a, pa, fa, s_a, cast) if early_a else shaped(a, pa, fa, s_a) + cast}")
        lines.append(f"{b_op} = {shaped(b, pb, fb, s_b, cast) if early_b else shaped(b, pb, fb, s_b) + cast}")
        args = [a_op, b_op]
        if acc is not None:
            args.append(acc if carry else shaped(acc, po, po, s_o))
        attrs = {"_precision": self.opts.fp32_precision}
        expr = OPS["matmul"].domains["triton"](args, attrs, [ta, tb], [n.outs[0]])
        if carry:
            self.carried = s_o
        elif s_o != po:
            expr = f"tl.reshape({expr}, {_shape_text(po)})"
        lines.append(f"{out} = {expr}")
        return out

    def early_casts(self, a: str, b: str, sa: tuple[tuple[int, ...], ...], sb: tuple[tuple[int, ...], ...],
                    carried: bool = False) -> tuple[bool, bool]:
        """Whether each operand of a ``tl.dot`` is converted to the dot's dtype *before* its broadcast and reshape
        (``sa``, ``sb``: the operand's padded tile, its broadcast shape and the shape the dot takes;
        ``carried``: the dot adds a loop accumulator carried in its own shape, not one reshaped to it and back as the
        online softmax's rescaled running sum is).

        The conversion commutes with both, and before them the compiler folds a loaded tile's ``.to(tl.float32)``
        into it (after a reshape it did not: V went fp16 -> fp32 -> fp16 through shared memory each iteration;
        rotary attention's candidate 0 29.2 -> 26.2 µs on the H100, BENCHMARKS.md, attn18). So an operand that is a
        block input's loaded tile and is broadcast or reshaped is converted first, except beside the other operand
        computed and reshaped (``P @ V`` with P reshaped from rank 3) unless the two tiles' shapes are in
        :data:`SQUEEZE_BESIDE_RESHAPE` or the dot's loop accumulator is carried in its shape
        (:data:`EARLY_CAST_BESIDE_CARRIED`: a split's plain ``exp`` partial sums, the non-stable decode attention):
        with the accumulator reshaped around the dot too (the online softmax) Triton 3.6's
        TritonGPURemoveLayoutConversions fails on V converted and reshaped beside P as it does on V loaded squeezed
        beside P (:meth:`dot_operand_inputs`; the suite's gqa_stable_bs1, mha_stable_bs1 and mha_stable_bs8
        candidate 0, ``(64, 128) @ (128, 64)``)."""
        nodes = self.bg.nodes

        def loaded(x: str) -> bool:
            m = re.fullmatch(r"v(\d+)", x)
            return m is not None and int(m.group(1)) < len(nodes) and nodes[int(m.group(1))].op == "input"

        def shaped(x: str, s: tuple[tuple[int, ...], ...]) -> bool:
            return x not in self.squeezed and (s[0] != s[1] or s[1] != s[2])

        fits = (tuple(sa[0][-2:]), tuple(sb[0][-2:])) in SQUEEZE_BESIDE_RESHAPE

        beside = fits or (EARLY_CAST_BESIDE_CARRIED and carried)

        def early(x: str, s: tuple[tuple[int, ...], ...], y: str, t: tuple[tuple[int, ...], ...]) -> bool:
            return loaded(x) and shaped(x, s) and (loaded(y) or not shaped(y, t) or beside)

        return early(a, sa, b, sb), early(b, sb, a, sa)

    def _emit_row_dot(self, lines: list[str], n: Node, a: str, b: str, ta: TensorType, tb: TensorType,
                      pa: tuple[int, ...], pb: tuple[int, ...], po: tuple[int, ...], acc: str | None,
                      wide: bool, groups: int) -> str:
        """``groups`` one-row products (:meth:`row_groups`) as a ``tl.dot`` of the rows broadcast to ``row_dot``
        (batched: ``(B, rows, K) @ (B, K, N)``, :meth:`row_batch`)."""
        rows = self.dot_rows(groups)
        rep = rows // groups
        pk, pn = pa[-1], pb[-1]
        zero_rows = a in self.row_loaded
        if not zero_rows:
            a = self.sanitize(lines, a, ta, pa, len(pa) - 1, "0.0")
        if b not in self.squeezed:
            b = self.sanitize(lines, b, tb, pb, len(pb) - 2, "0.0")
        dt = _TL_DTYPE[ta.dtype]
        a_op, b_op = self.fresh("x"), self.fresh("y")
        nb = self.row_batch(pb)
        if nb > 1:
            return self._emit_batched_row_dot(lines, n, a, b, ta, tb, pa, pb, po, acc, wide, groups, a_op, b_op, nb)
        a2 = a if pa == (groups, pk) else f"tl.reshape({a}, ({groups}, {pk}))"
        if zero_rows:  # loaded as the (rows, K) operand, the rows after the groups' zero
            if self.row_loaded[a] != rows:  # pragma: no cover - guarded by row_loaded_inputs
                raise GraphError(f"codegen: internal error (row operand {a} has {self.row_loaded[a]} rows, not {rows})")
            lines.append(f"{a_op} = {a}.to({dt})")
        elif rep == 1:
            lines.append(f"{a_op} = {a2}.to({dt})")
        elif groups == 1:
            lines.append(f"{a_op} = tl.broadcast_to({a2}, ({rows}, {pk})).to({dt})")
        else:  # each of the groups' rows repeated rep times: rows g * rep .. g * rep + rep - 1
            lines.append(f"{a_op} = tl.reshape(tl.broadcast_to(tl.reshape({a2}, ({groups}, 1, {pk})), "
                         f"({groups}, {rep}, {pk})), ({rows}, {pk})).to({dt})")
        if b in self.squeezed:
            if self.squeezed[b] != (pk, pn):  # pragma: no cover - guarded by dot_operand_inputs
                raise GraphError(f"codegen: internal error (squeezed {b} is {self.squeezed[b]}, not {(pk, pn)})")
            b2 = b
        else:  # (its batch dims are all 1: the product has one batch element)
            b2 = b if len(pb) == 2 else f"tl.reshape({b}, ({pk}, {pn}))"
        lines.append(f"{b_op} = {b2}.to({dt})")
        return self._row_dot_result(lines, n, ta, tb, po, acc, wide, groups, a_op, b_op, 1, zero_rows)

    def _row_dot_result(self, lines: list[str], n: Node, ta: TensorType, tb: TensorType, po: tuple[int, ...],
                        acc: str | None, wide: bool, groups: int, a_op: str, b_op: str, nb: int,
                        zero_rows: bool = False) -> str:
        """The ``tl.dot`` of a row product's prepared operands ``a_op`` @ ``b_op`` (plus ``acc``): the whole result
        when ``wide``, else its ``groups`` rows of each of ``nb`` batch elements (:meth:`row_of`)."""
        self.uses_dot = True
        self.row_dots += 1
        attrs = {"_precision": self.opts.fp32_precision}
        out = self.fresh("d")
        if wide:
            args = [a_op, b_op] + ([acc] if acc is not None else [])
            lines.append(f"{out} = {OPS['matmul'].domains['triton'](args, attrs, [ta, tb], [n.outs[0]])}")
            return out
        dot = OPS["matmul"].domains["triton"]([a_op, b_op], attrs, [ta, tb], [n.outs[0]])
        lines.append(f"{out} = {self.row_of(dot, po, groups, nb, zero_rows)}" + (f" + {acc}" if acc else ""))
        return out

    def _emit_batched_row_dot(self, lines: list[str], n: Node, a: str, b: str, ta: TensorType, tb: TensorType,
                              pa: tuple[int, ...], pb: tuple[int, ...], po: tuple[int, ...], acc: str | None,
                              wide: bool, groups: int, a_op: str, b_op: str, nb: int) -> str:
        """:meth:`_emit_row_dot` of a batched row product (``nb`` = :meth:`row_batch` > 1 batch elements): the
        left operand as ``(B, rows, K)`` (each element's ``groups`` rows repeated to ``rows``), the right as
        ``(B, K, N)``."""
        rows = self.dot_rows(groups)
        rep = rows // groups
        pk, pn = pa[-1], pb[-1]
        dt = _TL_DTYPE[ta.dtype]
        a2 = f"tl.reshape({a}, ({nb}, {groups}, 1, {pk}))"
        if rep == 1:
            lines.append(f"{a_op} = tl.reshape({a}, ({nb}, {rows}, {pk})).to({dt})")
        else:
            lines.append(f"{a_op} = tl.reshape(tl.broadcast_to({a2}, ({nb}, {groups}, {rep}, {pk})), "
                         f"({nb}, {rows}, {pk})).to({dt})")
        if b in self.squeezed:
            if self.squeezed[b] != (nb, pk, pn):  # pragma: no cover - guarded by dot_operand_inputs
                raise GraphError(f"codegen: internal error (squeezed {b} is {self.squeezed[b]}, not {(nb, pk, pn)})")
            lines.append(f"{b_op} = {b}.to({dt})")
        else:
            lines.append(f"{b_op} = tl.reshape({b}, ({nb}, {pk}, {pn})).to({dt})")
        return self._row_dot_result(lines, n, ta, tb, po, acc, wide, groups, a_op, b_op, nb)

    def emit_matmul_node(self, lines: list[str], nodes: Sequence[Node], i: int, vid_of: Any, name: dict[Any, str],
                         acc: str | None, wide: bool = False, carry: bool = False) -> str:
        """Lines computing matmul node ``i`` (plus ``acc``); a split matmul of concats (see
        :meth:`split_concat_matmuls`) is the sum of its pieces' products, chained through the accumulator.
        ``carry``: see :meth:`emit_matmul` (a product of one piece only)."""
        n = nodes[i]
        po = self.padded(vid_of(i, 0), n.outs[0])
        pairs = self.split_mm.get(i) if vid_of(i, 0) == (i, 0) else None
        carry = carry and pairs is None
        for ra, rb in pairs if pairs is not None else [tuple(n.args)]:
            ta, tb = nodes[ra[0]].outs[ra[1]], nodes[rb[0]].outs[rb[1]]
            acc = self.emit_matmul(lines, n, name[vid_of(*ra)], name[vid_of(*rb)], ta, tb,
                                   self.padded(vid_of(*ra), ta), self.padded(vid_of(*rb), tb), po, acc, wide, carry)
        assert acc is not None
        return acc

    def emit_op(self, lines: list[str], nodes: Sequence[Node], i: int, vid_of: Any, name: dict[Any, str]) -> None:
        """Lines computing plain (non-loop, non-input) node ``i``; records its name(s)."""
        n = nodes[i]
        op = n.op
        if OPS[op].has(Prop.CONTRACTION):
            name[vid_of(i, 0)] = self.emit_matmul_node(lines, nodes, i, vid_of, name, None)
            return
        args = [name[vid_of(a, k)] for a, k in n.args]
        in_types = [nodes[a].outs[k] for a, k in n.args]
        pin = [self.padded(vid_of(a, k), nodes[a].outs[k]) for a, k in n.args]
        ot = n.outs[0]
        po = self.padded(vid_of(i, 0), ot)
        v = f"v{i}" if not isinstance(vid_of(i, 0), tuple) or vid_of(i, 0)[0] != "t" else self.fresh("u")
        attrs = n.attr_dict
        if op == "fused":
            tg: ThreadGraph = n.attr("thread")
            vi = vid_of(i, 0)
            tvid = lambda j, k, vi=vi: ("t", vi, j, k)  # noqa: E731
            for j, tn in enumerate(tg.nodes):
                if tn.op == "arg":
                    name[tvid(j, 0)] = args[tn.attr("index")]
                else:
                    self.emit_op(lines, tg.nodes, j, tvid, name)
            for k, (a, kk) in enumerate(tg.outputs):
                name[vid_of(i, k)] = name[tvid(a, kk)]
            return
        d = OPS[op]
        fill = d.reduce.identity if d.reduce is not None else d.pad
        if fill is not None:  # the op mixes elements along its axis: padded positions hold its identity
            args[0] = self.sanitize(lines, args[0], in_types[0], pin[0], attrs["axis"], _fill_text(fill))
        if "_padded" in d.hooks.get("triton_needs", ()):
            attrs["_padded"] = (*pin, po)
        if op == "exp" and (shift := _max_shift(nodes, i)) is not None:
            # a softmax's exp(x - max): exp2 of the difference times log2(e) (the difference first: x * log2(e)
            # overflows). tl.exp2 flushes results below 2**-126 to 0: where that can show (_flush_harmless),
            # tl.exp (a non-ftz ex2 with ptxas's subnormal fix-up: three more instructions an element)
            x, m = (name[vid_of(a, k)] for a, k in shift)
            if _flush_harmless(self.bg, i):
                lines.append(f"{v} = tl.exp2(({x} - {m}) * {_LOG2E})")
            else:
                lines.append(f"{v} = tl.exp({x} - {m})")
            name[vid_of(i, 0)] = v
            return
        if op == "tanh" and nodes is self.bg.nodes and _logit_tanh(nodes, i):
            # a soft cap's tanh read only as a softmax's logits: absolute accuracy suffices (_logit_tanh)
            lines.append(f"{v} = _vm_tanh_logit({args[0]})")
            name[vid_of(i, 0)] = v
            return
        fn = OPS[op].domains.get("triton")
        if fn is None:  # pragma: no cover
            raise GraphError(f"codegen: op {op!r} has no triton lowering")
        lines.append(f"{v} = {fn(args, attrs, in_types, [ot])}")
        name[vid_of(i, 0)] = v

    def sliced_concats(self, live: set[int]) -> dict[int, list[tuple[int, int, bool]]]:
        """Concats whose pieces are each a slice of one block input along the concat dim, or its negation (rotary
        embedding's ``rotate_half``: ``concat(-x[..., h:], x[..., :h])``), where the input's tile holds its whole
        tensor along that dim and has the concat's shape: ``{concat: [(input, slice start, negated)]}``.

        Each is emitted as one masked load per piece, the input read shifted along the dim (:meth:`load_sliced`),
        instead of loading the input and slicing / concatenating the tile (``tl.split`` / ``tl.join`` /
        ``tl.permute``: layout conversions through shared memory). Exact: a slice, a negation and a concat move and
        negate values without rounding. sm_90 SASS (benchmarks/perf/NOTES.md session 12): rotary's one-kernel
        design, whose loop rotates each K tile, had 12 barriers and 65 shared-memory loads an iteration."""
        nodes = self.bg.nodes
        found: dict[int, list[tuple[int, int, bool]]] = {}
        for i, n in enumerate(nodes):
            if i not in live or n.op != "concat" or not n.outs:
                continue
            t = n.outs[0]
            ax = n.attr("axis") % t.rank
            pieces: list[tuple[int, int, bool]] = []
            for a, k in n.args:
                neg = nodes[a].op == "neg" and k == 0
                sref = nodes[a].args[0] if neg else (a, k)
                sl = nodes[sref[0]]
                if sl.op != "slice" or sref[1] != 0 or sl.attr("axis") % t.rank != ax:
                    break
                x = sl.args[0][0]
                xn = nodes[x]
                if xn.op != "input" or xn.attr("arg") in self.inline or xn.outs[0].shape != t.shape:
                    break
                shape = xn.attr("shape")
                if shape[ax + len(shape) - t.rank] != t.shape[ax]:  # (the tile holds the whole dim: no offsets)
                    break
                pieces.append((x, sl.attr("start"), neg))
            else:
                if self.padded((i, 0), t)[ax] == t.shape[ax]:
                    found[i] = pieces
        return found

    def load_sliced(self, i: int, p: tuple[int, ...], pieces: list[tuple[int, int, bool]]) -> str:
        """The tile of :meth:`sliced_concats`' concat ``i``: a sum of masked loads, piece ``k`` reading its input
        at ``start_k + j - offset_k`` for the concat's positions ``offset_k <= j < offset_k + width_k``."""
        nodes = self.bg.nodes
        n = nodes[i]
        t = n.outs[0]
        ax = n.attr("axis") % t.rank
        widths = [nodes[a].outs[k].shape[ax] for a, k in n.args]
        offs = [sum(widths[:q]) for q in range(len(widths))]
        shifts = {(start - o) % t.shape[ax] for (_, start, _), o in zip(pieces, offs, strict=True)}
        if len({x for x, _, _ in pieces}) == 1 and len(shifts) == 1:
            # one input rotated along the dim (rotate_half: shift size / 2): one load, the index taken modulo the
            # size (runs stay contiguous: 16-byte copies), the negated pieces' sign a constant tile
            ptr, mask = self.load(pieces[0][0], p, ax, roll=shifts.pop())
            m = f", mask={mask}, other=0.0" if mask else ""
            val = f"tl.load({ptr}{m}).to(tl.float32)"
            if not any(neg for _, _, neg in pieces):
                return val
            j = f"tl.arange(0, {p[ax]}){_lift(t.rank, ax)}"
            sign = "-1.0" if pieces[-1][2] else "1.0"
            for (_, _, neg), o in reversed(list(zip(pieces[:-1], offs[1:], strict=True))):
                sign = f"tl.where({j} < {o}, {'-1.0' if neg else '1.0'}, {sign})"
            return f"{val} * {sign}"
        terms, off = [], 0
        for (x, start, neg), (a, k) in zip(pieces, n.args, strict=True):
            w = nodes[a].outs[k].shape[ax]
            ptr, mask = self.load(x, p, ax, off - start)
            inside = self._mask(t.rank, ax, w, p[ax], off)
            m = inside if mask is None else f"{mask} & {inside}"
            # (a negated piece times -1: Triton's unary minus is 0 - x, +0 at +0)
            terms.append(f"tl.load({ptr}, mask={m}, other=0.0).to(tl.float32){' * -1.0' if neg else ''}")
            off += w
        return " + ".join(terms)

    def split_concat_matmuls(self, live: set[int], uses: dict[int, list[int]]) -> dict[int, list[tuple[Any, Any]]]:
        """Matmuls of two concats split at the same points, lowered as a sum of products of the pieces.

        ``concat(a1, .., an, axis=-1) @ concat(b1, .., bn, axis=-2)`` is ``a1 @ b1 + .. + an @ bn`` (block
        matrix product; each piece's product accumulates in fp32 inside ``tl.dot``), so neither concat is
        materialised. Both concats must be used only by that matmul and not be block outputs. (LoRA's
        concat fusion, ``[X | X A] @ [W ; B]``, is the case the search produces; a concat of computed tiles
        otherwise needs the one-hot lowering, quadratic in the tile.) Returns ``{matmul: [(ref_a, ref_b),
        ..]}``."""
        nodes = self.bg.nodes
        outs = {a for a, _ in self.bg.outputs}
        found: dict[int, list[tuple[Any, Any]]] = {}
        for i, n in enumerate(nodes):
            if not OPS[n.op].has(Prop.CONTRACTION) or i not in live:
                continue
            (xa, _), (xb, _) = n.args
            ca, cb = nodes[xa], nodes[xb]
            cats = OPS[ca.op].has(Prop.CONCAT) and OPS[cb.op].has(Prop.CONCAT)
            if not cats or xa == xb or xa in outs or xb in outs:
                continue
            if uses.get(xa) != [i] or uses.get(xb) != [i]:
                continue
            ra, rb = ca.outs[0].rank, cb.outs[0].rank
            if neg_axis(ca.attr("axis"), ra) != -1 or neg_axis(cb.attr("axis"), rb) != -2:
                continue
            sa = [nodes[a].outs[k].shape[-1] for a, k in ca.args]
            sb = [nodes[b].outs[k].shape[-2] for b, k in cb.args]
            if sa != sb:
                continue
            found[i] = list(zip(ca.args, cb.args, strict=True))
        return found

    def dot_operand_inputs(self, live: set[int], uses: dict[int, list[int]],
                           rank2: set[int] | None = None) -> set[int]:
        """Block inputs loaded straight into their rank-2 ``tl.dot`` shape (``rank2``: inputs loaded as a rank-2
        operand otherwise, :meth:`row_loaded_inputs`).

        An input whose every use is as an operand of a matmul lowered to one unbatched ``tl.dot``
        (every batch dim of the product is 1) is loaded without its size-1 dims. Loading it with them
        and reshaping before the dot gives the same values, but Triton's software pipeliner does not
        follow a load through ``tl.reshape``: the load is then not turned into an asynchronous copy into
        shared memory, and the loop streams with plain loads (measured: no ``cp.async`` in the PTX)."""
        nodes = self.bg.nodes
        outs = {a for a, _ in self.bg.outputs}
        found = set()
        self.alias_reshape = {}
        for i, n in enumerate(nodes):
            if n.op != "input" or i not in live or i in outs or not uses.get(i):
                continue
            pi = self.padded((i, 0), n.outs[0])
            batched = any(x != 1 for x in pi[:-2])
            if batched and len([x for x in pi[:-2] if x != 1]) > 1:
                continue  # a batched tl.dot takes rank-3 operands
            ok = True
            aliases = []
            for u in uses[i]:
                m = nodes[u]
                if self.row_weight_reshape(i, u, uses, outs):
                    aliases.append(u)  # a reshape adding or dropping size-1 dims: the row dot reads the load
                    continue
                if not OPS[m.op].has(Prop.CONTRACTION):
                    ok = False
                    break
                ta, tb = (nodes[a].outs[k] for a, k in m.args)
                if self.row_dot_node(nodes, u) and m.args[1][0] == i and m.args[0][0] != i:
                    continue  # the weights of a one-row product: loaded as its tl.dot's (K, N) operand
                if batched:  # (of a batched tl.dot: only as a batched row product's weights, (B, K, N))
                    ok = False
                    break
                degenerate = not (ta.shape[-2] > 1 and ta.shape[-1] > 1 and tb.shape[-1] > 1)  # broadcast multiply
                if degenerate or math.prod(self.padded((u, 0), m.outs[0])[:-2]) != 1:
                    ok = False
                    break
            if ok:
                found.add(i)
                self.alias_reshape.update({u: i for u in aliases})
        # Both operands of each such tl.dot must be rank-2 without a reshape: a squeezed load beside an
        # operand reshaped from a rank-3 value breaks Triton 3.6's layout pass (TritonGPURemoveLayoutConversions
        # fails on e.g. the online-softmax P @ V with P reshaped and V squeezed), so such an input keeps its rank.
        # Except where a looped kernel also streams a tile that no product reads and that is combined with a
        # product's result (an additive bias on the scores: such a kernel stays at rank 3, see _rank2_lead) and the
        # product's shapes are in SQUEEZE_BESIDE_RESHAPE ((128, 64) @ (64, 64), (64, 64) @ (64, 64)): there V
        # squeezed beside the reshaped P compiles for sm_90 and skips V's shared -> registers -> shared round trip
        # each iteration (H100: bias_attention's 128 x 64 design 23.4 -> 20.4 us, benchmarks/perf/NOTES.md session
        # 13b). Other shapes of the same kernels fail in Triton 3.6's layout pass (32- and 128-key tiles, 32 rows),
        # so they keep it.
        def product(a: int) -> bool:
            return OPS[nodes[a].op].has(Prop.CONTRACTION)

        side = self.bg.frange > 1 and any(
            n.op == "input" and i in live and n.attr("fmap") is not None and uses.get(i)
            and not any(product(u) for u in uses[i])
            and any(any(product(a) for a, _ in nodes[u].args) for u in uses[i])
            for i, n in enumerate(nodes))

        def squeezable_beside_reshape(u: int) -> bool:
            if not side or not product(u) or len(nodes[u].args) != 2:
                return False
            (a, ka), (b, kb) = nodes[u].args
            pa, pb = self.padded((a, ka), nodes[a].outs[ka]), self.padded((b, kb), nodes[b].outs[kb])
            return b in found and a not in found and (tuple(pa[-2:]), tuple(pb[-2:])) in SQUEEZE_BESIDE_RESHAPE

        changed = True
        while changed:
            changed = False
            for i in sorted(found):
                for u in uses[i]:
                    m = nodes[u]
                    others = [a for a, _ in m.args if a != i]
                    if any(a not in found and a not in (rank2 or ()) and nodes[a].outs[0].rank > 2 for a in others) \
                            and not squeezable_beside_reshape(u):
                        found.discard(i)
                        changed = True
                        break
        return found

    def row_loaded_inputs(self, live: set[int], uses: dict[int, list[int]],
                          taken: set[int]) -> dict[int, tuple[int, ...]]:
        """Block inputs loaded straight as the ``(rows, K)`` left operand of the one-row products that read them
        (:meth:`row_groups`, unbatched): block input -> the padded tile to load with ``squeeze`` (its ``G`` rows'
        dim, or for one row its row dim, widened to ``rows``; the load's mask zeroes the rows after them).

        Such an input's every use is as the left operand of a one-row product, its tile ``(.., G, .., 1, K)`` with
        at most one leading dim above 1. Built from the loaded tile instead (each row repeated to ``rows`` by a
        broadcast and a reshape in the loop body), the operand is no load that Triton's pipeliner turns into an
        asynchronous copy, and the layout change runs every iteration: the capture's decode MLPs' ``(8, 1, 1024)
        @ (1024, N)`` products ran 7.6 us on an H100 where the same product on ``(8, 1024)``, a masked 64-row load
        and a plain ``tl.dot``, ran 4.4 (benchmarks/results/capture, 2026-11-26 20:00)."""
        nodes = self.bg.nodes
        outs = {a for a, _ in self.bg.outputs}
        found: dict[int, tuple[int, ...]] = {}
        for i, n in enumerate(nodes):
            if (n.op != "input" or i not in live or i in outs or i in taken or not uses.get(i)
                    or n.attr("arg") in self.inline):
                continue
            t = n.outs[0]
            if t.rank < 2 or t.shape[-2] != 1:
                continue
            pa = self.padded((i, 0), t)
            big = [d for d in range(t.rank - 2) if pa[d] != 1]
            groups = set()
            for u in uses[i]:
                m = nodes[u]
                if not (OPS[m.op].has(Prop.CONTRACTION) and m.args[0] == (i, 0) and m.args[1][0] != i):
                    break
                g = self.row_dot_node(nodes, u)
                rb = m.args[1]
                if not g or self.row_batch(self.padded(rb, nodes[rb[0]].outs[rb[1]])) != 1:
                    break
                groups.add(g)
            else:
                if len(groups) != 1 or len(big) > 1:
                    continue
                rows = self.dot_rows(groups.pop())
                p = list(pa)
                p[big[0] if big else t.rank - 2] = rows
                found[i] = tuple(p)
                self.zero_row_dots.update(uses[i])
        return found

    def row_weight_reshape(self, i: int, u: int, uses: dict[int, list[int]], outs: set[int]) -> bool:
        """Whether node ``u`` reshapes block input ``i`` only by adding or dropping size-1 dims and feeds only
        one-row products as their right operand (attention's P @ V reads V through such a reshape): ``i`` is then
        loaded as that product's rank-2 ``tl.dot`` operand and the reshape is the load itself, so the loop's V
        tiles are pipelined (the layer's P @ V at bs1: 8.4 MB in 17.9 us on an H100, not pipelined)."""
        nodes = self.bg.nodes
        m = nodes[u]
        if not OPS[m.op].has(Prop.REGROUPS) or u in outs or not uses.get(u):
            return False
        ti, tu = nodes[i].outs[0], m.outs[0]
        pi, pu = self.padded((i, 0), ti), self.padded((u, 0), tu)
        # the true shapes too: (10, 24) -> (12, 20) regroups the elements though both pad to (16, 32)
        if ([x for x in ti.shape if x != 1] != [x for x in tu.shape if x != 1] or ti.shape[-2:] != tu.shape[-2:]
                or [x for x in pi if x != 1] != [x for x in pu if x != 1] or pi[-2:] != pu[-2:]):
            return False
        return all(self.row_dot_node(nodes, w) and nodes[w].args[1] == (u, 0) and nodes[w].args[0][0] != u
                   for w in uses[u])

    def chunked_dots(self, live: set[int], uses: dict[int, list[int]], squeeze: set[int]) -> dict[int, int]:
        """One-step products (no for-loop) of two block inputs with a contraction tile deeper than
        ``ROW_DOT_MAX_K``: matmul node -> chunk. Such a product is emitted as a loop over K chunks, each loading
        its operands' chunk and accumulating in ``tl.dot`` (the same products, summed in fp32 in chunk order),
        so the loads are pipelined and no 64 KB+ operand tile is held: the layer's v projection at batch 8 (one
        ``(8, 1024) @ (1024, 32)`` step per block) ran 10.9 or 95.6 us on an H100 depending on the process, and at
        batch 32 asked for 256 KB of shared memory (benchmarks/perf/NOTES.md, session 7)."""
        nodes = self.bg.nodes
        if self.bg.frange != 1:
            return {}
        outs = {a for a, _ in self.bg.outputs}
        found: dict[int, int] = {}
        for i, n in enumerate(nodes):
            if i not in live or not OPS[n.op].has(Prop.CONTRACTION) or i in self.split_mm:
                continue
            (ra, ka), (rb, kb) = n.args
            if ra == rb or ka or kb or ra in outs or rb in outs:
                continue
            if uses.get(ra) != [i] or uses.get(rb) != [i] or nodes[ra].op != "input" or nodes[rb].op != "input":
                continue
            ta, tb = nodes[ra].outs[0], nodes[rb].outs[0]
            pa, pb = self.padded((ra, 0), ta), self.padded((rb, 0), tb)
            # (K unpadded, whole chunks of ROW_DOT_MAX_K, more than one)
            deep = pa[-1] > ROW_DOT_MAX_K and pa[-1] == ta.shape[-1] and pa[-1] % ROW_DOT_MAX_K == 0
            if ra not in squeeze or rb not in squeeze:  # (a one-row product is no squeezed operand's: rank 2 as it is)
                if deep and self.chunk_row(ta, tb) and len(pa) == len(pb) == 2 \
                        and self.padded((i, 0), nodes[i].outs[0]) == (1, pb[1]):
                    found[i] = ROW_DOT_MAX_K
            # (a row, a column or an outer product is not a tl.dot, unless a one-row product chunk_row takes)
            elif deep and (self.chunk_row(ta, tb) or (ta.shape[-2] > 1 and ta.shape[-1] > 1 and tb.shape[-1] > 1)):
                found[i] = ROW_DOT_MAX_K
        return found

    def chunk_row(self, ta: TensorType, tb: TensorType) -> bool:
        """Whether a one-step product ``ta @ tb`` is a rank-2 one-row product that :meth:`chunked_dots` takes as a
        loop of 16-row dots (:data:`CHUNK_ROW_DOTS`; fp16/bf16 operands, at least 16 columns)."""
        return (CHUNK_ROW_DOTS and self.opts.row_dot > 0 and ta.rank == 2 and tb.rank == 2 and ta.shape[0] == 1
                and ta.shape[1] > 1 and tb.shape[1] >= 16 and ta.dtype in (DType.float16, DType.bfloat16)
                and tb.dtype == ta.dtype)

    def emit_chunked_dot(self, lines: list[str], i: int, chunk: int) -> str:
        """Lines of :meth:`chunked_dots`'s loop for matmul node ``i``; returns the result's name. A one-row
        product (:meth:`chunk_row`) broadcasts each chunk of its row to the dot's 16 rows and keeps row 0."""
        nodes = self.bg.nodes
        n = nodes[i]
        (ra, _), (rb, _) = n.args
        ta, tb = nodes[ra].outs[0], nodes[rb].outs[0]
        pa, pb = self.padded((ra, 0), ta), self.padded((rb, 0), tb)
        po = self.padded((i, 0), n.outs[0])
        pm, pk, pn = pa[-2], pa[-1], pb[-1]
        row = self.chunk_row(ta, tb)
        if row:
            pm = self.dot_rows(1)
        dt = _TL_DTYPE[ta.dtype]
        acc, kc = self.fresh("d"), self.fresh("kc")
        qa = tuple(x if d != ta.rank - 1 else chunk for d, x in enumerate(pa))
        qb = tuple(x if d != tb.rank - 2 else chunk for d, x in enumerate(pb))
        pta, ma = self.load(ra, qa, squeeze=not row, sub=(ta.rank - 1, f"{kc} * {chunk}"))
        ptb, mb = self.load(rb, qb, squeeze=True, sub=(tb.rank - 2, f"{kc} * {chunk}"))
        fa = f", mask={ma}, other=0.0" if ma else ""
        fb = f", mask={mb}, other=0.0" if mb else ""
        xa, xb = self.fresh("x"), self.fresh("y")
        attrs = {"_precision": self.opts.fp32_precision}
        self.uses_dot = True
        if row:
            self.row_dots += 1
        else:
            self.full_dots += 1
        lines.append(f"{acc} = tl.zeros(({pm}, {pn}), tl.float32)")
        lines.append(f"for {kc} in range(0, {pk // chunk}):")
        if row:  # (the row's chunk, the same in each of the dot's rows)
            lines.append(f"    {xa} = tl.broadcast_to(tl.load({pta}{fa}).to({dt}), ({pm}, {chunk}))")
        else:
            lines.append(f"    {xa} = tl.load({pta}{fa}).to({dt})")
        lines.append(f"    {xb} = tl.load({ptb}{fb}).to({dt})")
        dot = OPS["matmul"].domains["triton"]([xa, xb, acc], attrs, [ta, tb], [n.outs[0]])
        lines.append(f"    {acc} = {dot}")
        if row:
            out = self.fresh("d")
            lines.append(f"{out} = {self.row_of(acc, po, 1)}")
            return out
        if po != (pm, pn):
            out = self.fresh("d")
            lines.append(f"{out} = tl.reshape({acc}, {_shape_text(po)})")
            return out
        return acc

    def chunked_sums(self, live: set[int], uses: dict[int, list[int]], invariant: Sequence[bool]) -> dict[int, int]:
        """Sums along the last dim of elementwise chains of one block input that a for-loop's kernel computes before
        its loop, over a whole row deeper than ``ROW_DOT_MAX_K`` (a norm's statistic of the rows it normalises in
        the loop: ``stabilise.prologue_norm_scales``): sum node -> chunk. Such a sum is emitted as a loop over
        chunks of the row, each loaded and reduced into an fp32 accumulator, so that no ``(rows, K)`` tile (64
        padded rows beside a ``tl.dot``) is held in registers."""
        nodes = self.bg.nodes
        if self.bg.frange == 1:
            return {}
        outs = {a for a, _ in self.bg.outputs}
        found: dict[int, int] = {}
        for i, n in enumerate(nodes):
            if i not in live or n.op != "sum" or not invariant[i] or i in outs:
                continue
            t = nodes[n.args[0][0]].outs[0]
            if n.attr("axis") % t.rank != t.rank - 1:
                continue
            prev, j = i, n.args[0][0]
            while (nodes[j].op != "input" and OPS[nodes[j].op].has(Prop.ELEMENTWISE) and len(nodes[j].args) == 1
                   and uses.get(j) == [prev] and j not in outs):
                prev, j = j, nodes[j].args[0][0]
            if nodes[j].op != "input" or uses.get(j) != [prev] or nodes[j].attr("arg") in self.inline or j in outs:
                continue
            p = self.padded((j, 0), nodes[j].outs[0])
            if p[-1] > ROW_DOT_MAX_K and p[-1] == t.shape[-1] and p[-1] % CHUNKED_SUM_K == 0:
                found[i] = CHUNKED_SUM_K
        return found

    def deferred_reductions(self, live: set[int], uses: dict[int, list[int]],
                            invariant: Sequence[bool]) -> dict[int, int]:
        """Loop accumulations of a reduction inside a for-loop that also computes a product (``loop_sum(sum(x))``,
        ``loop_sum(mean(x))``, ``loop_max(max(x))``, the reduction used nowhere else): loop node -> reduction node.
        Such a loop accumulates the tile ``x`` elementwise and reduces it once after the loop, which is the same sum
        (or max) in another order. The reason is Triton 3.6's software pipelining: on an H100, a kernel reducing a
        tile in a loop beside a pipelined ``tl.dot`` (``rms_norm(x) @ W`` at 8 x 4096 x 14336: 64 padded rows, 4
        warps, 3 or 4 stages) gave wrong rows in 13 of 40 runs, the same kernel with the sum after the loop none
        in 60, and it ran as fast (BENCHMARKS.md, "A wrong result under pipelining"; triton-lang/triton#6691 is an
        open report of the same class)."""
        nodes = self.bg.nodes
        if not any(i in live and not invariant[i] and OPS[n.op].has(Prop.CONTRACTION) for i, n in enumerate(nodes)):
            return {}
        outs = {a for a, _ in self.bg.outputs}
        found: dict[int, int] = {}
        for i, n in enumerate(nodes):
            if i not in live or n.op not in ("loop_sum", "loop_max"):
                continue
            r = n.args[0][0]
            red = OPS[nodes[r].op].reduce if nodes[r].op in OPS else None
            if (red is None or red.loop != n.op or invariant[r] or uses.get(r) != [i] or r in outs
                    or len(nodes[r].args) != 1):
                continue
            found[i] = r
        return found

    def emit_chunked_sum(self, lines: list[str], i: int, chunk: int) -> tuple[str, list[int]]:
        """Lines of :meth:`chunked_sums`' loop for sum node ``i``; returns the result's name and the chain's nodes
        (not emitted otherwise)."""
        nodes = self.bg.nodes
        chain = []
        j = nodes[i].args[0][0]
        while nodes[j].op != "input":
            chain.append(j)
            j = nodes[j].args[0][0]
        t = nodes[j].outs[0]
        p = self.padded((j, 0), t)
        q = (*p[:-1], chunk)
        acc, kc = self.fresh("r"), self.fresh("kc")
        ptr, mask = self.load(j, q, sub=(t.rank - 1, f"{kc} * {chunk}"))
        m = f", mask={mask}, other=0.0" if mask else ""
        x = self.fresh("x")
        po = self.padded((i, 0), nodes[i].outs[0])
        # (the chunks add up elementwise and the row is reduced once after the loop: a reduction across the block in
        # every iteration waits at a barrier, which keeps the next chunk's load from being issued before it, so
        # the loop ran one memory round trip a chunk; H100, benchmarks/perf/NOTES.md session 17)
        part = self.fresh("r")
        lines.append(f"{part} = tl.zeros({_shape_text(q)}, tl.float32)")
        lines.append(f"for {kc} in range(0, {p[-1] // chunk}):")
        lines.append(f"    {x} = tl.load({ptr}{m}).to(tl.float32)")
        ct = TensorType((*t.shape[:-1], chunk), t.dtype)
        for c in reversed(chain):
            cn = nodes[c]
            fn = OPS[cn.op].domains["triton"]
            y = self.fresh("x")
            lines.append(f"    {y} = {fn([x], cn.attr_dict, [ct], [ct])}")
            x = y
        lines.append(f"    {part} = {part} + {x}")
        red = f"tl.sum({part}, axis={t.rank - 1}, keep_dims=True)"
        lines.append(f"{acc} = {red}" if tuple(po) == (*p[:-1], 1) else f"{acc} = tl.reshape({red}, {_shape_text(po)})")
        return acc, chain

    # ------------------------------------------------------------------ the kernel
    def generate(self) -> str:
        bg = self.bg
        nodes = bg.nodes
        vid_of = lambda i, k: (i, k)  # noqa: E731
        for i in range(len(nodes)):
            self._unify_node(vid_of, nodes, i)
        live = live_nodes(nodes, bg.outputs)
        uses = _uses(nodes, live)
        split_mm = self.split_concat_matmuls(live, uses)
        for i, pairs in split_mm.items():  # each piece product is a tl.dot of its own: line up its dims
            ot = nodes[i].outs[0]
            out = self._keys(vid_of(i, 0), ot)
            for ra, rb in pairs:
                ta, tb = nodes[ra[0]].outs[ra[1]], nodes[rb[0]].outs[rb[1]]
                self._unify_matmul(nodes[i].op, (self._keys(vid_of(*ra), ta), ta), (self._keys(vid_of(*rb), tb), tb),
                                   out, ot)
        split_cat = {x for i in split_mm for x, _ in nodes[i].args}
        self.split_mm = split_mm
        self._finish_classes()

        post = bg.post_loop()
        looped = bg.frange > 1
        invariant: list[bool] = []
        for n in nodes:
            if n.op == "input":
                invariant.append(n.attr("fmap") is None or not looped)
            else:
                invariant.append(n.op not in OPS or not OPS[n.op].has(Prop.LOOP))
                invariant[-1] = invariant[-1] and all(invariant[a] for a, _ in n.args)

        # concats of block inputs are loaded directly; inputs used only by them are not loaded
        direct_concat = {
            i for i, n in enumerate(nodes)
            if i in live and i not in split_cat and OPS[n.op].has(Prop.CONCAT)
            and all(nodes[a].op == "input" for a, _ in n.args)
            and not any(nodes[a].attr("arg") in self.inline for a, _ in n.args)  # (a causal mask is never loaded)
        }
        skip = {
            i for i, n in enumerate(nodes)
            if n.op == "input" and uses.get(i) and all(u in direct_concat for u in uses[i])
            and (i, 0) not in set(bg.outputs)
        }
        # loop_sum / rescaled_sum of a matmul used nowhere else accumulate inside tl.dot
        dot_acc: dict[int, int] = {}
        if looped:
            for i, n in enumerate(nodes):
                if i in live and n.op in ("loop_sum", "rescaled_sum"):
                    a = n.args[0][0]
                    if OPS[nodes[a].op].has(Prop.CONTRACTION) and uses.get(a) == [i] and (a, 0) not in set(bg.outputs):
                        dot_acc[a] = i

        deferred = self.deferred_reductions(live, uses, invariant) if looped else {}
        sliced = {i: ps for i, ps in self.sliced_concats(live).items() if i not in split_cat and i not in direct_concat}
        # the slices (and their negations) only those concats read are not emitted
        outs_set = {a for a, _ in bg.outputs}
        unread: set[int] = set()
        for i in reversed(range(len(nodes))):
            if nodes[i].op in ("slice", "neg") and i not in outs_set and uses.get(i) and all(
                    u in sliced or u in unread for u in uses[i]):
                unread.add(i)
        rowload = self.row_loaded_inputs(live, uses, skip | direct_concat | set(sliced))
        squeeze = set() if self.opts.dot_batch1 else self.dot_operand_inputs(live, uses, set(rowload)) - set(rowload)
        chunked = self.chunked_dots(live, uses, squeeze)
        chunk_inputs = {a for i in chunked for a, _ in nodes[i].args}
        csums = self.chunked_sums(live, uses, invariant) if looped else {}
        csum_parts: set[int] = set()
        for i in csums:
            j = nodes[i].args[0][0]
            while True:
                csum_parts.add(j)
                if nodes[j].op == "input":
                    break
                j = nodes[j].args[0][0]
        name: dict[Any, str] = {}
        pre: list[str] = []
        body: list[str] = []
        postl: list[str] = []
        alpha_needed = {n.args[1][0] for n in nodes if n.op == "rescaled_sum"}
        #: causal masks read in the loop whose first iterations' tiles are all true: line -> (constant, bound)
        full_masks: dict[str, tuple[str, str]] = {}

        for i, n in enumerate(nodes):
            if i not in live or i in skip or i in split_cat or i in unread:  # (split concats: their matmul reads
                continue  # the pieces)
            ot = n.outs[0]
            po = self.padded((i, 0), ot)
            if math.prod(po) > TRITON_MAX_NUMEL:
                raise GraphError(f"codegen: block value %{i} ({n.op}) is a tile of padded shape {po}: "
                                 f"{math.prod(po)} elements, above Triton's limit of {TRITON_MAX_NUMEL} per tensor "
                                 "(a smaller tile or a loop over the axis is needed)")
            sect = pre if (invariant[i] or not looped) else postl if post[i] else body
            if i in chunk_inputs or i in csum_parts:
                continue  # loaded chunk by chunk in its product's (or its sum's) loop
            if i in csums:
                name[(i, 0)], _ = self.emit_chunked_sum(sect, i, csums[i])
                continue
            if i in self.alias_reshape:  # (see row_weight_reshape)
                name[(i, 0)] = name[(self.alias_reshape[i], 0)]
                continue
            if i in chunked:
                name[(i, 0)] = self.emit_chunked_dot(sect, i, chunked[i])
                continue
            if n.op == "input" and n.attr("arg") in self.inline:
                sect.append(f"v{i} = {self.tril_expr(i, po)}")
                name[(i, 0)] = f"v{i}"
                if sect is body and (bound := self.full_tiles(i, po)) is not None:
                    full_masks[sect[-1]] = (f"v{i} = {self.tril_expr(i, po, all_true=True)}", bound)
            elif i in rowload:
                sect.append(f"v{i} = {self.load_expr(i, rowload[i], squeeze=True)}")
                name[(i, 0)] = f"v{i}"
                self.row_loaded[f"v{i}"] = max(x for x in rowload[i][:-1])
            elif n.op == "input":
                sq = i in squeeze
                sect.append(f"v{i} = {self.load_expr(i, po, squeeze=sq)}")
                name[(i, 0)] = f"v{i}"
                if sq:  # (a batched row product's weights: (B, K, N))
                    self.squeezed[f"v{i}"] = tuple(po[-2:]) if math.prod(po[:-2]) == 1 else tuple(
                        x for x in po if x != 1)
            elif i in sliced:
                sect.append(f"v{i} = {self.load_sliced(i, po, sliced[i])}")
                name[(i, 0)] = f"v{i}"
            elif i in direct_concat:
                ax = n.attr("axis")
                terms, start = [], 0
                for a, _ in n.args:
                    terms.append(self.load_expr(a, po, ax, start))
                    start += nodes[a].outs[0].shape[ax]
                sect.append(f"v{i} = " + " + ".join(terms))
                name[(i, 0)] = f"v{i}"
            elif n.op in OPS and OPS[n.op].has(Prop.LOOP):
                x = name.get(n.args[0])
                if not looped:
                    if n.args[0][0] in dot_acc:  # pragma: no cover - dot_acc only when looped
                        raise GraphError("codegen: internal error (dot accumulation without a loop)")
                    name[(i, 0)] = x  # type: ignore[assignment]  # one iteration: every loop op is the identity
                    continue
                v = f"v{i}"
                name[(i, 0)] = v
                zero = f"tl.zeros({_shape_text(po)}, tl.float32)"
                ninf = f"tl.full({_shape_text(po)}, {_NEG_INF}, tl.float32)"
                fn = OPS[n.op].domains["triton"]
                if n.op == "running_max":
                    pre.append(f"{v} = {ninf}")
                    body.append(f"{v}_prev = {v}")
                    body.append(f"{v} = {fn([v, x], {}, [ot, ot], [ot])}")
                    if i in alpha_needed:  # (flushed below 2**-126 only where that cannot show: _fp16_only)
                        e = f"tl.exp2(({v}_prev - {v}) * {_LOG2E})" if _fp16_only(bg) else f"tl.exp({v}_prev - {v})"
                        body.append(f"{v}_alpha = tl.where({v}_prev == {_NEG_INF}, 0.0, {e})")
                elif i in deferred:
                    # the tile accumulated elementwise in the loop, reduced once after it (deferred_reductions)
                    r = deferred[i]
                    (xa, xk), = nodes[r].args[:1]
                    xt = nodes[xa].outs[xk]
                    pin = self.padded(vid_of(xa, xk), xt)
                    e = f"{v}_e"
                    pre.append(f"{e} = " + (f"tl.zeros({_shape_text(pin)}, tl.float32)" if n.op == "loop_sum"
                                            else f"tl.full({_shape_text(pin)}, {_NEG_INF}, tl.float32)"))
                    xe = name[vid_of(xa, xk)]
                    body.append(f"{e} = {fn([e, xe], {}, [xt, xt], [xt])}")
                    name[vid_of(xa, xk)] = e
                    self.emit_op(postl, nodes, r, vid_of, name)
                    name[vid_of(xa, xk)] = xe
                    name[(i, 0)] = name[vid_of(r, 0)]
                elif n.op == "loop_max":
                    pre.append(f"{v} = {ninf}")
                    body.append(f"{v} = {fn([v, x], {}, [ot, ot], [ot])}")
                else:
                    pre.append(f"{v} = {zero}")
                    acc_in = v if n.op == "loop_sum" else f"{v} * v{n.args[1][0]}_alpha"
                    a = n.args[0][0]
                    if a in dot_acc and n.op == "loop_sum" and (groups := self.row_dot_node(nodes, a)):
                        # one-row products: the (rows, N) accumulator stays inside tl.dot; the rows read after it
                        pn = self.padded(n.args[0], nodes[a].outs[0])[-1]
                        rb = nodes[a].args[1]
                        nb = self.row_batch(self.padded(rb, nodes[rb[0]].outs[rb[1]]))
                        wrows = self.dot_rows(groups)
                        wshape = f"({wrows}, {pn})" if nb == 1 else f"({nb}, {wrows}, {pn})"
                        pre[-1] = f"{v}_w = tl.zeros({wshape}, tl.float32)"
                        res = self.emit_matmul_node(body, nodes, a, vid_of, name, f"{v}_w", wide=True)
                        body.append(f"{v}_w = {res}")
                        postl.append(f"{v} = {self.row_of(f'{v}_w', po, groups, nb, a in self.zero_row_dots)}")
                    elif a in dot_acc:
                        carry = n.op == "loop_sum"
                        res = self.emit_matmul_node(body, nodes, a, vid_of, name, acc_in, carry=carry)
                        body.append(f"{v} = {res}")
                        if carry and self.carried != po:
                            # the loop carries tl.dot's own shape (a batch of one dropped); reshaped after the loop
                            pre[-1] = f"{v} = tl.zeros({_shape_text(self.carried)}, tl.float32)"
                            postl.append(f"{v}_r = tl.reshape({v}, {_shape_text(po)})")
                            name[(i, 0)] = f"{v}_r"
                    elif n.op == "loop_sum":
                        body.append(f"{v} = {fn([v, x], {}, [ot, ot], [ot])}")
                    else:
                        body.append(f"{v} = {fn([v, x, f'v{n.args[1][0]}_alpha'], {}, [ot, ot], [ot])}")
            elif i in dot_acc or i in deferred.values():
                continue  # computed inside its accumulator's update (a deferred reduction: after the loop)
            else:
                self.emit_op(sect, nodes, i, vid_of, name)

        stores: list[str] = []
        for oi, ((a, k), om) in enumerate(zip(bg.outputs, bg.omaps, strict=True)):
            t = nodes[a].outs[k]
            p = self.padded((a, k), t)
            L = self.lead  # (a rank-2 view: the output tensor's leading dims are size-1 tiles, scalar offsets)
            if L:
                t, p = TensorType((1,) * L + t.shape, t.dtype), (1,) * L + tuple(p)
            r = t.rank
            terms, masks = [], []
            real = (1,) * (r - self.out_types[oi].rank) + self.out_types[oi].shape  # (its recorded, cropped shape)
            for d in range(r):
                off = [f"pid{ax} * {t.shape[d]}" for ax, dd in enumerate(om.dims) if dd == d and bg.grid[ax] > 1]
                tail = t.shape[d] * math.prod(bg.grid[ax] for ax, dd in enumerate(om.dims) if dd == d) > real[d]
                if p[d] == 1 and not off:
                    continue
                if d < L:
                    terms.append(f"({' + '.join(off)}) * o{oi}_s{d}")
                    masks += [f"(({' + '.join(off)}) < {real[d]})"] * tail  # (a masked tail: cropped)
                    continue
                idx = " + ".join([*off, f"tl.arange(0, {p[d]}){_lift(r - L, d - L)}"])
                terms.append(f"({idx}) * o{oi}_s{d}")
                if p[d] != t.shape[d]:
                    masks.append(self._mask(r - L, d - L, t.shape[d], p[d]))
                if tail:
                    masks.append(f"(({idx}) < {real[d]})")
            if not terms:
                terms.append(f"tl.zeros({_shape_text(p[self.lead:])}, tl.int32)")
            ptr = f"o{oi}_ptr + " + " + ".join(terms)
            m = f", mask={' & '.join(masks)}" if masks else ""
            stores.append(f"tl.store({ptr}, {name[(a, k)]}.to(o{oi}_ptr.dtype.element_ty){m})")

        params = []
        self.signature: dict[str, str] = {}
        for k, t in enumerate(self.arg_types):
            if k in self.inline:
                continue
            params.append(f"a{k}_ptr")
            self.signature[f"a{k}_ptr"] = _PTR_SIG[self.arg_store[k]]
            for d in range(t.rank):
                params.append(f"a{k}_s{d}")
                self.signature[f"a{k}_s{d}"] = "i32"
        for k, t in enumerate(self.out_types):
            params.append(f"o{k}_ptr")
            self.signature[f"o{k}_ptr"] = _PTR_SIG[self.out_store[k]]
            for d in range(t.rank):
                params.append(f"o{k}_s{d}")
                self.signature[f"o{k}_s{d}"] = "i32"
        self.launch_axes = _launch_axes(bg.grid, _stream_order(bg, self.arg_types, self.out_types)
                                        if self.opts.stream_order else None)
        lead = ["p0", "p1", "p2"] if self.device_fn else []
        out = ["@triton.jit", f"def {self.name}(" + ", ".join([*lead, *params]) + "):"]
        summary = f"grid {bg.grid}, for-loop of {bg.frange}"
        out.append(f'    """Block graph: {summary}."""')
        pids = []
        zig = None if self.device_fn else self.causal_row_axis()
        for a, g in enumerate(bg.grid):
            if g > 1:
                pid = f"p{self.launch_axes[a]}" if self.device_fn else f"tl.program_id({self.launch_axes[a]})"
                if a == zig:  # the longest half of the row blocks first, then the rest from the shortest
                    pid = f"tl.where({pid} < {g // 2}, {g - 1} - {pid}, {pid} - {g // 2})"
                pids.append(f"    pid{a} = {pid}")
        out += pids
        pf = ["    " + x for x in self.prefetch_lines()] if self.prefetch else []
        if pf and self.device_fn:
            doc = f'    """L2 prefetches of the input tiles of {self.name} (before the wait)."""'
            self.prefetch_fn = "\n".join(["@triton.jit", f"def {self.name}_pf(" + ", ".join([*lead, *params]) + "):",
                                          doc, *pids, *pf]) + "\n"
        elif pf:  # (loads of what no kernel writes: they need not wait for the previous kernel)
            out += pf
        # programmatic dependent launch: the wait goes before the first statement that stores or reads an operand an
        # unfinished kernel may still write (all but ``early_args``): the previous kernel has then completed and its
        # writes are visible. Where that is after the for-loop, the loop streams its operands while the kernels
        # before it finish (:attr:`early_loop`). The statements: pre's, the loop (one), postl's, the stores.
        late: list[str] = []
        if self.pdl and self.early_args and looped:
            pre, late = self._after_loop(pre, body)
        elif self.pdl and self.early_args and self._early_load_bytes() >= PDL_EARLY_LOADS_MIN_BYTES:
            pre = self._loads_first(pre)
        segs: list[list[str]] = [["    " + s] for s in pre]
        loop_seg = len(segs)
        if looped:
            unroll = bg.frange <= self.opts.unroll_max and not any("tl.dot(" in b for b in body)
            rng = "tl.static_range" if unroll else "range"
            head = _loop_header(bg, rng)
            lp: list[str] = []
            if full_masks and (bg.flimit is not None or not unroll):
                # the iterations whose mask tiles are all true first, the mask a constant (where() folds away)
                stop = "it_stop" if bg.flimit is not None else str(bg.frange)
                bound = stop
                for _, b in full_masks.values():
                    bound = f"tl.minimum({b}, {bound})"
                lp += [*head[:-1], f"    it_full = {bound}", "    for it in range(0, it_full):"]
                lp += ["        " + full_masks.get(s, (s, ""))[0] for s in body]
                head = [f"    for it in range(it_full, {stop}):"]
            lp += head
            lp += ["        " + s for s in body] or ["        pass"]
            segs.append(lp)
        segs += [["    " + s] for s in [*late, *postl, *stores]]
        first = next((j for j, sg in enumerate(segs) if any(self._waits_for(ln) for ln in sg)), len(segs))
        if any(ln.rstrip().endswith(":") or "\n" in ln for sg in segs[:first] for ln in sg
               if not (looped and sg is segs[loop_seg])):
            first = 0  # (never inside a block of statements)
        self.early_loop = bool(self.pdl) and looped and first > loop_seg
        self.early_loads = bool(self.pdl) and not looped and first >= self.n_early_loads > 0
        if not (self.early_loop or self.early_loads):
            first = 0  # (a kernel without a loop and with a few loads of inputs waits first: they gain little)
        elif pf and not self.device_fn:  # (its loop loads those tiles before the wait itself)
            del out[-len(pf):]
        gdc = _gdc_head(self.pdl)
        for j, sg in enumerate(segs):
            if j == first:
                out += gdc
            out += sg
        if first >= len(segs):
            out += gdc
        if self.pdl == "end":
            out.append("    gdc_launch_dependents()")
        return "\n".join(out) + "\n"

    def _after_loop(self, pre: list[str], body: list[str]) -> tuple[list[str], list[str]]:
        """``pre`` split into the statements to run before the for-loop and those that can run after it: the ones that
        must follow the PDL wait (:meth:`_waits_for`) and those computed from them, when the loop reads none of
        their names and they read none the loop assigns (a loop-invariant epilogue term such as LoRA's
        ``(X A) B``, hoisted before the loop, moves after it so that the loop can run before the wait); else
        ``(pre, [])``."""
        ident = re.compile(r"[A-Za-z_]\w*")
        if any(self._waits_for(b) for b in body):
            return pre, []
        late: list[str] = []
        names: set[str] = set()
        for st in pre:
            m = re.match(r"(\w+) = ", st)
            if m is None or "\n" in st:
                if self._waits_for(st) or names & set(ident.findall(st)):
                    return pre, []
                continue
            if self._waits_for(st) or names & set(ident.findall(st[m.end():])):
                late.append(st)
                names.add(m.group(1))
        # (names the loop assigns, or that pre assigns twice, could hold another value where a late reader moves)
        lhs = [m.group(1) for st in pre if (m := re.match(r"(\w+) = ", st))]
        assigned = {m.group(1) for b in body if (m := re.match(r"(\w+) = ", b))} | {x for x in lhs if lhs.count(x) > 1}
        used = {w for b in body for w in ident.findall(b)}
        if not late or names & used or any(assigned & set(ident.findall(st)) for st in late):
            return pre, []
        return [st for st in pre if st not in late], late

    def _early_load_bytes(self) -> int:
        """Bytes a block loads of the operands in ``early_args`` (padded tiles; 0 with a for-loop): what a kernel
        without a loop can load before its PDL wait."""
        if self.bg.frange > 1:
            return 0
        live = live_nodes(self.bg.nodes, self.bg.outputs)
        return sum(math.prod(self.padded((i, 0), n.outs[0])) * self.arg_store[n.attr("arg")].itemsize
                   for i, n in enumerate(self.bg.nodes)
                   if i in live and n.op == "input" and n.attr("arg") in self.early_args
                   and n.attr("arg") not in self.inline)

    def _loads_first(self, pre: list[str]) -> list[str]:
        """``pre`` (a kernel without a for-loop) with its loads of ``early_args`` moved to the front, in their order:
        single-line assignments ``v = tl.load(...)`` that need not follow the PDL wait (:meth:`_waits_for`) and read
        no name another statement of ``pre`` assigns (only the block's indices and the kernel's parameters). The
        other statements keep their order; a moved load reads nothing they write, so every value is the same."""
        ident = re.compile(r"[A-Za-z_]\w*")
        assigned = {m.group(1) for st in pre if (m := re.match(r"(\w+) = ", st))}
        lhs = [m.group(1) for st in pre if (m := re.match(r"(\w+) = ", st))]
        early: list[str] = []
        for st in pre:
            m = re.match(r"(\w+) = tl\.load\(", st)
            if (m is None or "\n" in st or self._waits_for(st) or lhs.count(m.group(1)) > 1
                    or (assigned - {m.group(1)}) & set(ident.findall(st[m.end():]))):
                continue
            early.append(st)
        self.n_early_loads = len(early)
        return early + [st for st in pre if st not in early] if early else pre

    def _waits_for(self, stmt: str) -> bool:
        """Whether ``stmt`` must follow the PDL wait: it stores, or it reads an operand not in ``early_args``."""
        if re.search(r"\bo\d+_ptr\b|tl\.atomic_", stmt):
            return True
        return any(int(k) not in self.early_args for k in re.findall(r"\ba(\d+)_ptr\b", stmt))


def _max_shift(nodes: Sequence[Node], i: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """``(x, m)`` when node ``i`` is ``exp(x - m)`` with ``m`` the max of ``x`` along an axis (``max(x)``, or a
    for-loop's ``running_max(max(x))``): a softmax's numerator. Else None.

    Such an exp is emitted as ``tl.exp2((x - m) * LOG2E)``: Triton lowers ``tl.exp`` to a multiply by log2(e)
    and ``ex2.approx.f32``, which ptxas expands with a denormal rescale (two multiplies and a compare an element,
    sm_90 SASS); ``tl.exp2`` is ``ex2.approx.ftz.f32`` (causal attention's loop: 427 -> 296 instructions an
    iteration with the multiply and subtract fused, benchmarks/perf/NOTES.md session 12). The flush to zero only
    turns results below 2**-126 into 0: every row of ``exp(x - m)`` holds exp(0) = 1 at its max, so a flushed term
    is below 2**-126 of its row's largest (and of the row sum a softmax divides by); but a later factor can scale
    it up (times a bf16 / fp32 value near 3e38 it is an output's size), so the exp2 form is emitted only where
    :func:`_flush_harmless` says the flush cannot show, else ``tl.exp``. NaN and infinities propagate as before.
    The difference is taken first: the fused form ``x * LOG2E - m * LOG2E`` overflowed to inf - inf = NaN at
    finite logits above 2.3e38 where eager's softmax is finite (found by
    ``tests/test_redteam_capture.py::test_held_special_values[softmax]``), and its rounding of ``m * LOG2E`` is an
    exponent error of 2**-24 |m| that the online softmax does not cancel (benchmarks/perf/NOTES.md session 13b)."""
    n = nodes[i]
    if n.op != "exp" or len(n.args) != 1:
        return None
    s = nodes[n.args[0][0]]
    if s.op != "sub" or n.args[0][1] != 0 or len(s.args) != 2:
        return None
    x, (mi, mk) = s.args
    m = nodes[mi]
    if m.op == "running_max" and mk == 0:
        mi, mk = m.args[0]
        m = nodes[mi]
    if mk == 0 and _finite_identity_clamp(m):
        mi, mk = m.args[0]
        m = nodes[mi]
    if m.op != "max" or mk != 0 or len(m.args) != 1 or m.args[0] != x:
        return None
    return x, s.args[1]


def _finite_identity_clamp(n: Node) -> bool:
    """Whether ``n`` is a clamp that leaves every finite value (of any dtype a kernel computes in: fp32 at most)
    as it is: ``partition.RUNNING_MAX_FLOOR``'s floor of a tile's max (an infinite max becomes fp32's largest
    finite value of its sign; NaN stays NaN).

    :func:`_max_shift` looks through it: ``exp(x - m)`` with ``m`` the floored (running) max still holds exp(0) = 1
    in every row where a term can flush. A term ``exp(x - m)`` is in exp2's flush range only for finite ``x`` and
    ``m`` at most ~87 apart; a finite ``x`` makes its tile's max finite (so unchanged by the floor), and where the
    floor did change a max (``m = +-3.4e38`` from an infinite one) every finite ``x - m`` is 0 or at least
    2**104 in size (fp32's spacing there), never in the flush range. A clamp with other bounds (``lo = 0``) can
    put ``m`` above every element of a row, whose terms could then all flush: not looked through."""
    if n.op != "clamp" or len(n.args) != 1:
        return False
    lo, hi = n.attr("lo"), n.attr("hi")
    return lo is not None and hi is not None and lo <= -FLOAT32_MAX and hi >= FLOAT32_MAX


#: The largest factor by which a tanh's value may be scaled into a softmax's logits and still be emitted as
#: ``_vm_tanh_logit`` (:func:`_logit_tanh`): its absolute error, at most 2**-21, then moves a logit by at most
#: 2**-13, i.e. each ``exp(x - m)`` term by under 2**-13 relative, below fp16's half-ulp (2**-12).
LOGIT_TANH_MAX_SCALE = 256.0


def _logit_tanh(nodes: Sequence[Node], i: int) -> bool:
    """Whether tanh node ``i`` is read only as (part of) a softmax's logits: through scales by at most
    :data:`LOGIT_TANH_MAX_SCALE` in all, shifts and selects' value operands, into the ``x`` of a softmax's
    ``exp(x - m)`` (:func:`_max_shift`) and into the max ``m`` of that ``x`` (through the online softmax's floor and
    running max; ``m`` read only by those exps' shifts and the rescaled sums). A soft cap ``c tanh(s / c)``
    (soft-capped attention logits) is such a tanh.

    It is then emitted as ``_vm_tanh_logit`` (``lowering.HELPERS``): ``sign(x) (1 - e) / (1 + e)`` everywhere, without
    the helper's odd polynomial below |x| = 0.3125, which keeps tanh's *relative* accuracy near 0 (the polynomial,
    evaluated in every lane, was 11% of softcap attention's time on the H100: 21.9 -> 19.3 µs, BENCHMARKS.md,
    attn18). Its *absolute* error is below 2**-21 everywhere (about 6 * 2**-24 with ``ex2.approx`` and
    ``div.full``'s errors; 1.9 * 2**-24 rounded exactly), which is what a logit needs: an error ``d`` in ``x``
    changes ``exp(x - m)`` by a factor ``e**d``, and one in ``m`` changes every term and rescale of its row by the
    same factor, which the softmax's division cancels. The two forms agree on +-inf (+-1) and NaN; at -0 the
    short form gives +0 (a logit's sign of zero does not show). A value scaled by 0 is exactly +-0 (or NaN, for
    both forms alike) and is not followed further."""
    uses = _uses(nodes)
    xs: dict[int, int] = {}  # a softmax's x - m (sub node) -> its x's node
    maxes: dict[int, set[int]] = {}  # a softmax's x (node) -> the max nodes its m is taken of
    for k in range(len(nodes)):
        sh = _max_shift(nodes, k)
        if sh is None or sh[0][1] != 0:
            continue
        xs[nodes[k].args[0][0]] = sh[0][0]
        m = nodes[sh[1][0]]
        mi = sh[1][0]
        if m.op == "running_max":
            mi = m.args[0][0]
        if _finite_identity_clamp(nodes[mi]):
            mi = nodes[mi].args[0][0]
        maxes.setdefault(sh[0][0], set()).add(mi)

    def shift_only(mi: int) -> bool:  # the max (floored, running) is read only as softmax shifts and rescales
        for u in uses.get(mi, []):
            n = nodes[u]
            if n.args[0][0] == mi and (n.op == "running_max" or _finite_identity_clamp(n)):
                if not shift_only(u):
                    return False
            elif not ((u in xs and n.args[1][0] == mi and n.args[0][0] != mi)
                      or (n.op == "rescaled_sum" and n.args[1][0] == mi and n.args[0][0] != mi)):
                return False
        return True

    todo, seen = [(i, 1.0)], set()
    while todo:
        j, f = todo.pop()
        if f == 0.0 or (j, f) in seen:
            continue
        seen.add((j, f))
        if f > LOGIT_TANH_MAX_SCALE or not uses.get(j):  # (no reader here: an output)
            return False
        for u in uses[j]:
            n = nodes[u]
            if n.op == "scale":
                todo.append((u, f * abs(float(n.attr("c")))))
            elif n.op == "shift" or (n.op == "where" and n.args[0][0] != j):
                todo.append((u, f))
            elif u in xs and xs[u] == j and n.args[1][0] != j:
                continue  # the logits of exp(x - m)
            elif u in maxes.get(j, ()) and n.args[0] == (j, 0):
                if not shift_only(u):
                    return False
            else:
                return False
    return True


def _fp16_only(bg: BlockGraph) -> bool:
    """Every block input of ``bg`` is fp16 (or a 0/1 mask) and every output fp16: then a softmax term flushed
    below 2**-126 (``tl.exp2``'s ``ex2.approx.ftz``) times any input value (at most 65504) stays below fp16's
    resolution; with bf16 or fp32 factors up to 3e38 it need not (red team, twelfth session:
    ``exp(x - max x) * y``)."""
    ins = [n.outs[0].dtype for n in bg.nodes if n.op == "input"]
    outs = [bg.nodes[a].outs[k].dtype for a, k in output_refs(bg)]
    return all(d in (DType.float16, DType.bool) for d in ins) and all(d == DType.float16 for d in outs)


def _flush_harmless(bg: BlockGraph, i: int) -> bool:
    """Whether exp node ``i`` (a softmax's ``exp(x - max x)``, :func:`_max_shift`) may flush its results below
    2**-126 to 0. Yes when the kernel is fp16 only (:func:`_fp16_only`) and the exp is read (through selects)
    only by sums along the max's axis, whose rows hold exp(0) = 1, so a flushed term changes them by < 2**-126
    relative; by divisions by such a sum (read in turn like the exp); and by products contracting that axis with
    an fp16 block input, whose results (off by < 2**-126 * 65504 * K) are read only by rescaled sums, divisions
    of them by such a sum (>= 1) and the kernel's fp16 outputs: an error below 2**-90 where fp16 resolves
    2**-24. Otherwise (a bf16 / fp32 factor, a product by another value) a flushed term can be an output's
    size."""
    nodes = bg.nodes
    if not _fp16_only(bg):
        return False
    shift = _max_shift(nodes, i)
    assert shift is not None
    rank = nodes[i].outs[0].rank
    m = nodes[shift[1][0]]
    if m.op == "running_max":
        m = nodes[m.args[0][0]]
    if _finite_identity_clamp(m):
        m = nodes[m.args[0][0]]
    axis = neg_axis(m.attr("axis"), rank)
    uses = _uses(nodes)

    def row_sum(j: int) -> bool:  # a sum along the max's axis of the exp (or a rescaled sum of one)
        n = nodes[j]
        if n.op == "rescaled_sum":
            return row_sum(n.args[0][0])
        return n.op == "sum" and n.args[0][0] in exp_like and neg_axis(n.attr("axis"), rank) == axis

    def scaled_down(j: int) -> bool:  # readers of a product of the exp keep its error's size
        for u in uses.get(j, []):
            n = nodes[u]
            keeps = (n.op == "rescaled_sum" and n.args[0][0] == j) or (
                n.op == "div" and n.args[0][0] == j and n.args[1][0] != j and row_sum(n.args[1][0]))
            if not keeps or not scaled_down(u):
                return False
        return True

    exp_like = {i}
    todo = [i]
    products = []
    while todo:
        j = todo.pop()
        for u in uses.get(j, []):
            n = nodes[u]
            if n.op == "where" and n.args[0][0] != j:
                exp_like.add(u)
                todo.append(u)
            elif n.op == "sum" and neg_axis(n.attr("axis"), rank) == axis:
                continue
            elif n.op == "div" and n.args[0][0] == j and n.args[1][0] != j and row_sum(n.args[1][0]):
                exp_like.add(u)  # e / its row sum (>= 1): the softmax itself
                todo.append(u)
            elif OPS[n.op].has(Prop.CONTRACTION) and n.args[0][0] == j and n.args[1][0] != j \
                    and axis == -1 and nodes[n.args[1][0]].op == "input":
                products.append(u)
            else:
                return False
    return all(scaled_down(u) for u in products)


def _uses(nodes: Sequence[Node], live: set[int] | None = None) -> dict[int, list[int]]:
    """Node index -> the (``live``) nodes reading one of its values, in order."""
    uses: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        if live is None or i in live:
            for a, _ in n.args:
                uses.setdefault(a, []).append(i)
    return uses


def _rank2_lead(bg: BlockGraph, inline: dict[int, int]) -> int:
    """How many leading dims the kernel of ``bg`` is emitted without (0: none; see ``TileOptions.rank2``).

    Every value of the block has the same rank ``R >= 3`` and size 1 in its first ``R - 2`` dims (one head per
    block), the block loops and reads a causal mask (``inline``), every op is a product, a loop op, an
    elementwise op (attributes at most a constant) or a reduction over one of the last two dims, and every block
    input the loop walks (other than the mask) is an operand of products only: at rank 2 a looped tile that feeds
    elementwise code lost its asynchronous copy and gained a layout conversion in the loop (bias attention's
    128 x 64 bias tile: 21.3 -> 28.1 us, NOTES session 10). Dropping size-1 dims changes no value: every index
    into them is 0."""
    if bg.frange < 2 or not any(n.op == "input" and n.attr("arg") in inline for n in bg.nodes):
        return 0
    ranks = {t.rank for n in bg.nodes for t in n.outs}
    if len(ranks) != 1 or (rank := ranks.pop()) < 3:
        return 0
    lead = rank - 2
    uses = _uses(bg.nodes)
    for i, n in enumerate(bg.nodes):
        if any(x != 1 for t in n.outs for x in t.shape[:lead]):
            return 0
        d = OPS.get(n.op)
        if n.op == "input":
            if len(n.attr("shape")) != rank:
                return 0
            looped = n.attr("fmap") is not None and n.attr("arg") not in inline
            if looped and not all(OPS[bg.nodes[u].op].has(Prop.CONTRACTION) for u in uses.get(i, [])):
                return 0
        elif d is None:
            return 0
        elif d.has(Prop.CONTRACTION) or d.has(Prop.LOOP):
            if n.attrs:
                return 0
        elif d.has(Prop.REDUCTION):
            if set(n.attr_dict) != {"axis"} or not lead <= n.attr("axis") < rank:
                return 0
        elif not d.has(Prop.ELEMENTWISE) or d.has(Prop.CONCAT | Prop.REGROUPS | Prop.CONSTANT) \
                or not set(n.attr_dict) <= {"c", "lo", "hi"}:  # (constants: a scale, a clamp's bounds)
            return 0
    return lead


def _drop_lead(bg: BlockGraph, lead: int) -> BlockGraph:
    """``bg`` with its values viewed without their first ``lead`` dims (all of size 1; see :func:`_rank2_lead`):
    reductions' axes shifted; input nodes keep their ``shape``/``imap``/``fmap`` (tensor dims), as outputs keep
    their maps (codegen's loads, masks and stores add the dropped dims back as scalar offsets)."""
    nodes = []
    for n in bg.nodes:
        attrs = dict(n.attr_dict)
        if "axis" in attrs and n.op != "input":
            attrs["axis"] = attrs["axis"] - lead
        outs = tuple(TensorType(t.shape[lead:], t.dtype) for t in n.outs)
        nodes.append(Node(n.op, n.args, make_attrs(attrs), outs))
    return dataclasses.replace(bg, nodes=tuple(nodes))


def _inline_masks(nodes: Sequence[Node], n: Node) -> dict[int, int]:
    """The operands of kernel ``n`` that are causal masks (``tril_mask`` nodes), by position: their offsets."""
    return {j: int(nodes[a].attr("offset")) for j, (a, _) in enumerate(n.args) if nodes[a].op == "tril_mask"}


def _check_inline_mask(mg: Graph, i: int) -> None:
    """A causal mask is computed inside the kernels that read it: GraphError if the program returns it."""
    if any(a == i for a, _ in output_refs(mg)):
        raise GraphError(f"codegen: %{i} (tril_mask) is a program output; a causal mask is computed inside the "
                         "kernels that read it, expected it read by kernels only")


def _loop_header(bg: BlockGraph, rng: str) -> list[str]:
    """The for-loop's first line: over ``bg.frange`` iterations, or, with ``bg.flimit = (axis, a, c, d)``, over
    those with ``d * it <= a * b + c`` for the block's index ``b`` on that axis (a bound that varies by block)."""
    if bg.flimit is None:
        return [f"    for it in {rng}(0, {bg.frange}):"]
    axis, a, c, d = bg.flimit
    a, c = min(a, d * (bg.frange - 1)), min(c, d * (bg.frange - 1))  # (the same bound: past it every iteration runs)
    if a * (bg.grid[axis] - 1) + c >= 2**31 - 1 or d >= 2**31:  # (in int32 a wrapped bound ran no iteration)
        raise GraphError(f"codegen: loop bound {bg.flimit} past int32 (a (blocks - 1) + c = "
                         f"{a * (bg.grid[axis] - 1) + c}); expected a bound the kernel computes exactly")
    b = f"pid{axis}" if bg.grid[axis] > 1 else "0"
    return [f"    it_stop = tl.minimum(({b} * {a} + {c}) // {d} + 1, {bg.frange})",
            "    for it in range(0, it_stop):"]


def _stream_order(bg: BlockGraph, arg_types: Sequence[TensorType], out_types: Sequence[TensorType]) -> list[int] | None:
    """The order a kernel without a product should launch its grid axes in (fastest first), when its grid splits
    the last (contiguous) dim of its largest input or output: the axes by the dim of that tensor they split,
    innermost first (the others after them, in order), so blocks start in the tensor's row-major order; None
    when that is the grid's own order or the last dim is not split.

    CUDA starts blocks in order of their linear index, axis 0 fastest. batchnorm_relu's grid (32 channel groups,
    49 column tiles) launched channel groups fastest, so the blocks in flight read 128-byte runs 6 KB apart in every
    row at once; launched column tiles fastest, consecutive blocks read consecutive runs of the same rows (a flat
    elementwise kernel's order). Kernels with ``tl.dot`` take :func:`_sharer_order` instead."""
    if any(OPS[n.op].has(Prop.CONTRACTION) for n in bg.nodes):
        return _sharer_order(bg) if SHARER_ORDER else None
    cands: list[tuple[int, tuple[int | None, ...], TensorType]] = []
    for n in bg.nodes:
        if n.op == "input":
            t = arg_types[n.attr("arg")]
            cands.append((t.numel * t.dtype.itemsize, tuple(n.attr("imap")), t))
    for om, t in zip(bg.omaps, out_types, strict=True):
        cands.append((t.numel * t.dtype.itemsize, tuple(om.dims), t))
    if not cands:
        return None
    _, imap, t = max(cands, key=lambda c: c[0])
    split = [a for a in range(len(bg.grid)) if bg.grid[a] > 1 and imap[a] is not None]
    if not any(imap[a] == t.rank - 1 for a in split):
        return None
    order = sorted(split, key=lambda a: -(imap[a] or 0)) + [a for a in range(len(bg.grid)) if a not in split]
    return None if order == list(range(len(bg.grid))) else order


#: a looped kernel with ``tl.dot`` launches first the grid axes along which its blocks read the same streamed tiles
#: (:func:`_sharer_order`). Measured on an H100, 2026-11-27 (benchmarks/perf/NOTES.md session 17m): bias_attention's
#: 64 x 64 design (16 heads x 16 query tiles), heads fastest against a head's query tiles consecutive, launched
#: directly 20.04 / 19.74, 20.24 / 19.91 and 20.53 / 19.79 us in three calls (10:05, 10:13, 10:17 UTC), through
#: vm.compile with PDL 20.02-20.31 / 19.93 (10:08); the suite's split-KV gqa / mqa / qknorm kernels and
#: rotary_attention -0.3 to +0.05 us (benchmarks/results/pdl_models_ab_h100_2026-11-27_1008.json)
SHARER_ORDER = True


def _sharer_order(bg: BlockGraph) -> list[int] | None:
    """The launch order (fastest first) of a kernel with a for-loop whose streamed inputs several blocks read: the
    grid axes that index none of those shared streamed inputs first (the blocks that differ only along them read the
    same tiles in the same iteration, so they start together on neighbouring SMs and the tiles come from DRAM once,
    from L2 to the others: attention's query tiles of one head, which share its K and V tiles), the others after
    them in the grid's order; None when that is the grid's own order, the loop is absent or no streamed input is
    shared. A GEMM's two operands are each shared along the other's axis, so no axis shares both: its order stays
    (the grid's own), as does a GEMV's (one axis, already first)."""
    if bg.frange <= 1:
        return None
    shared = [n.attr("imap") for n in bg.nodes if n.op == "input" and n.attr("fmap") is not None
              and any(g > 1 and n.attr("imap")[a] is None for a, g in enumerate(bg.grid))]
    if not shared:
        return None
    split = [a for a, g in enumerate(bg.grid) if g > 1]
    first = [a for a in split if all(imap[a] is None for imap in shared)]
    order = first + [a for a in range(len(bg.grid)) if a not in first]
    return None if not first or order == list(range(len(bg.grid))) else order


def _launch_axes(grid: tuple[int, ...], order: Sequence[int] | None = None) -> list[int]:
    """Which launch-grid axis each block-grid axis uses: the grid axes in ``order`` (if given; fastest first); else
    the grid's own order; the largest on axis 0 when another would exceed 65535 blocks (axes 1, 2 allow no
    more)."""
    if order is not None and all(grid[a] <= 65535 for a in order[1:]):
        axes = [0] * len(grid)
        for pos, a in enumerate(order):
            axes[a] = pos
        return axes
    if all(g <= 65535 for g in grid[1:]):
        return list(range(len(grid)))
    order = sorted(range(len(grid)), key=lambda a: -grid[a])
    if any(grid[a] > 65535 for a in order[1:]):
        raise GraphError(f"codegen: grid {grid} has more than one axis above 65535 blocks; Triton cannot launch it")
    axes = [0] * len(grid)
    for pos, a in enumerate(order):
        axes[a] = pos
    return axes


def _as_mugraph(g: Any) -> MuGraph:
    if hasattr(g, "mugraph") and not isinstance(g, Graph):
        g = g.mugraph
    if not isinstance(g, Graph):
        raise GraphError(f"backend: expected a vm.Graph, vm.MuGraph or Candidate, got {type(g).__name__}")
    g.check()
    return g if isinstance(g, MuGraph) else MuGraph.from_graph(g)


#: A kernel's result that other kernels read only as an operand of ``tl.dot`` (:func:`_dot_operand_only`) is stored in
#: its IR dtype, not fp32: each reader casts it to that dtype for the dot anyway (:meth:`_KernelGen.emit_matmul`), so
#: rounding it once at the store gives the same operand bits (fp32 -> dtype, round to nearest even, either way) and
#: halves the bytes every reader loads (layernorm_linear: each of the projection's 128 blocks reads the whole
#: 16 x 4096 normalised activation; in fp32 that is as many bytes per loop iteration as its weight tile).
DOT_OPERAND_STORAGE = True


def _dot_operand_only(nodes: Sequence[Node], ref: tuple[int, int]) -> bool:
    """Whether every kernel reading value ``ref`` uses it only as an operand of block products that code generation
    lowers to ``tl.dot`` with operands cast to ``ref``'s IR dtype: every block input node loading it is read only by
    ``matmul`` nodes whose tiles have more than one row, contracted element and column (no degenerate product, which
    is summed in fp32, and no one-row product) and whose left operand has that dtype (``tl.dot``'s operand dtype).
    Not a kernel that only reshapes another kernel's result (:func:`_view_kernel`): in that result's fp32 it is a view
    of its buffer (:func:`_view_nodes`), in another dtype a copy launch (the decoder layer's candidates: 1-2 launches
    more)."""
    dt = nodes[ref[0]].outs[ref[1]].dtype
    n0 = nodes[ref[0]]
    if (len(n0.args) == 1 and len(n0.outs) == 1 and nodes[n0.args[0][0]].op == "custom"
            and _view_kernel(n0.attr("block"), nodes[n0.args[0][0]].outs[n0.args[0][1]], n0.outs[0])):
        return False  # (a reshape of another kernel's fp32 result: stored in fp32 it stays a view, no launch)
    readers = 0
    for n in nodes:
        pos = [p for p, a in enumerate(n.args) if tuple(a) == tuple(ref)]
        if not pos:
            continue
        if n.op != "custom":
            return False
        bg = n.attr("block")
        loads = {j for j, b in enumerate(bg.nodes) if b.op == "input" and b.attr("arg") in pos}
        if not loads or any(r in loads for r, _ in bg.outputs):
            return False
        for b in bg.nodes:
            read = [a for a, _ in b.args if a in loads]
            if not read:
                continue
            if b.op not in OPS or not OPS[b.op].has(Prop.CONTRACTION):
                return False
            ta, tb = (bg.nodes[a].outs[k] for a, k in b.args)
            if ta.dtype != dt or min(ta.shape[-2], ta.shape[-1], tb.shape[-1]) < 2:
                return False
        readers += 1
    return readers > 0


def storage_dtype(nodes: Sequence[Node], final: set[tuple[int, int]], ref: tuple[int, int]) -> DType:
    """The element type value ``ref`` of a μGraph (``nodes``, its outputs ``final``) has in device memory: fp32 for
    a kernel's result that another kernel reads (partial sums...), except one read only as a ``tl.dot`` operand
    (:data:`DOT_OPERAND_STORAGE`); else its IR dtype."""
    n0 = nodes[ref[0]]
    if n0.op == "custom" and ref not in final and not (DOT_OPERAND_STORAGE and _dot_operand_only(nodes, ref)):
        return DType.float32
    return n0.outs[ref[1]].dtype


def arg_storage(mg: MuGraph) -> dict[int, list[DType]]:
    """Per kernel node of ``mg`` (by index), the element types its operands have in device memory
    (:func:`storage_dtype`; what the shared-memory estimate of a pipelined load counts)."""
    nodes = node_list(mg)
    final = set(output_refs(mg))
    return {i: [storage_dtype(nodes, final, r) for r in n.args] for i, n in enumerate(nodes) if n.op == "custom"}


def _elementwise_only(nodes: Sequence[Node], live: set[int] | None = None) -> bool:
    """Whether every (live) node but the inputs is an elementwise op (a fused thread graph of them included)."""
    for i, n in enumerate(nodes):
        if (live is not None and i not in live) or n.op in ("input", "arg"):
            continue
        if n.op == "fused":
            tg: ThreadGraph = n.attr("thread")
            if not _elementwise_only(tg.nodes, live_nodes(tg.nodes, tg.outputs)):
                return False
        elif n.op not in OPS or not OPS[n.op].has(Prop.ELEMENTWISE):
            return False
    return True


def _grid_split(bg: BlockGraph, dims: Sequence[int | None], d: int) -> frozenset[int]:
    """The grid axes of more than one block that split dim ``d`` of a tensor placed by ``dims`` (an imap or omap)."""
    return frozenset(a for a, dd in enumerate(dims) if dd == d and bg.grid[a] > 1)


def flat_shape(bg: BlockGraph, arg_types: Sequence[TensorType], inline: dict[int, int] | None = None,
               out_types: Sequence[TensorType] | None = None) -> tuple[int, ...] | None:
    """The shape ``S`` of the outputs of kernel ``bg`` (on operands of ``arg_types``) when the kernel may be emitted
    over one flat index range of ``S`` (:attr:`TileOptions.flat`, :func:`_flat_kernel`); None when it may not.

    The flat kernel computes, for every coordinate ``c`` of ``S``, the block graph's ops on its operands' elements at
    ``c`` (right-aligned, an operand's size-1 dims read at index 0: numpy broadcasting). That is what the block graph
    computes, whatever its tiling, when (each checked here):

    * it has no for-loop (``frange`` 1, no loop bound) and no causal-mask operand computed in the kernel;
    * every live node but the inputs is elementwise (its result at a tile position depends on its operands at that
      position, broadcast): a tile's element at block-local coordinate ``l`` is then the ops applied to the input
      tiles' elements at ``l``;
    * all outputs have the shape ``S``, one tile shape and the same grid axes splitting each dim, so block ``b``
      writes the element ``c = off(b) + l`` of every output, ``off(b)_d`` the sum over the axes splitting dim ``d``;
    * every input of rank ``r_i <= rank S`` has, on each dim ``j`` (aligned with dim ``d = j + rank S - r_i``), either
      size 1 (read at 0 in both forms), or the size ``S_d``, the tile size of the output's dim ``d`` and the same grid
      axes splitting it: its tile's element at ``l`` is then the input's element at ``off(b)_d + l_d = c_d``.

    The tiles in registers are then a partition of the same elementwise function of ``c``; the flat kernel evaluates
    it per element, with the same fp32 expressions (the registry's triton lowering), loads and stores.
    """
    if bg.frange != 1 or bg.flimit is not None or inline:
        return None
    nodes = bg.nodes
    live = live_nodes(nodes, bg.outputs)
    if not _elementwise_only(nodes, live):
        return None
    outs = bg.result_types(arg_types)
    if out_types is not None and tuple(out_types) != outs:
        return None  # (results cropped: a masked tail, stored by the tiled kernel's masks)
    shape = outs[0].shape
    r = len(shape)
    tile: tuple[int, ...] | None = None
    split: list[frozenset[int]] = []
    for (a, k), om in zip(bg.outputs, bg.omaps, strict=True):
        t = nodes[a].outs[k].shape
        sp = [_grid_split(bg, om.dims, d) for d in range(r)]
        if len(t) != r or len(om.dims) != len(bg.grid) or (tile is not None and (t != tile or sp != split)):
            return None
        tile, split = t, sp
    if tile is None or any(o.shape != shape for o in outs):
        return None
    for i in live:
        n = nodes[i]
        if n.op != "input":
            continue
        full, t, imap = arg_types[n.attr("arg")].shape, n.outs[0].shape, n.attr("imap")
        ri = len(full)
        if ri > r or len(t) != ri or len(imap) != len(bg.grid):
            return None
        for j in range(ri):
            d = j + r - ri
            sj = _grid_split(bg, imap, j)
            if full[j] == 1 and not sj:
                continue
            if full[j] != shape[d] or sj != split[d] or t[j] != tile[d]:
                return None
    if math.prod(shape) + TRITON_MAX_NUMEL >= INT32_INDEX:  # (the flat offsets are int32)
        return None
    return shape


def _flat_kernel(bg: BlockGraph, arg_types: Sequence[TensorType], out_types: Sequence[TensorType],
                 shape: tuple[int, ...], name: str, block: int, arg_store: Sequence[DType],
                 out_store: Sequence[DType], pdl: str, device_fn: bool) -> tuple[str, KernelInfo]:
    """The ``@triton.jit`` source of kernel ``bg`` over one flat index range of its output shape ``shape``
    (:func:`flat_shape` said it may be), ``block`` elements a block, and its :class:`KernelInfo` (grid: the blocks).

    The element ``e`` of a block has the row-major coordinates ``c_d = (e // prod(shape[d+1:])) % shape[d]``; an
    operand or output is addressed at ``sum_j c_(j + r - r_i) * stride_j`` over its dims of size > 1 (strides are
    arguments, as in the tiled kernels); every load and store is masked past the last element. The ops are the
    registry's triton lowerings on fp32 values, as in the tiled form."""
    r = len(shape)
    total = math.prod(shape)
    nblocks = -(-total // block)
    masked = total % block != 0
    nodes = bg.nodes
    live = live_nodes(nodes, bg.outputs)
    first = next((d for d in range(r) if shape[d] > 1), r)
    body = [f"e = {'p0' if device_fn else 'tl.program_id(0)'} * {block} + tl.arange(0, {block})"]
    if masked:
        body.append(f"inside = e < {total}")
    for d in range(r):
        if shape[d] == 1:
            continue
        inner = math.prod(shape[d + 1:])
        c = "e" if inner == 1 else f"(e // {inner})"
        body.append(f"c{d} = {c} % {shape[d]}" if d > first else f"c{d} = {c}")

    def address(ptr: str, stride: str, dims: Sequence[int]) -> str:
        terms = [f"c{j + r - len(dims)} * {stride}{j}" for j, n in enumerate(dims) if n > 1]
        return f"{ptr} + " + (" + ".join(terms) if terms else f"tl.zeros(({block},), tl.int32)")

    mask = ", mask=inside" if masked else ""
    name_of: dict[Any, str] = {}

    def emit(ns: Sequence[Node], vid: Callable[[int, int], Any], keep: set[int]) -> None:
        for i, n in enumerate(ns):
            if i not in keep or n.op == "arg":
                continue
            v = f"v{len(name_of)}"
            if n.op == "input":
                k = n.attr("arg")
                other = ", other=0.0" if masked else ""
                body.append(f"{v} = tl.load({address(f'a{k}_ptr', f'a{k}_s', arg_types[k].shape)}{mask}{other})"
                            ".to(tl.float32)")
            elif n.op == "fused":
                tg: ThreadGraph = n.attr("thread")
                tv = lambda j, kk, i=i: ("t", vid(i, 0), j, kk)  # noqa: E731
                for j, tn in enumerate(tg.nodes):
                    if tn.op == "arg":
                        name_of[tv(j, 0)] = name_of[vid(*n.args[tn.attr("index")])]
                emit(tg.nodes, tv, live_nodes(tg.nodes, tg.outputs))
                for kk, ref in enumerate(tg.outputs):
                    name_of[vid(i, kk)] = name_of[tv(*ref)]
                continue
            else:
                fn = OPS[n.op].domains["triton"]
                args = [name_of[vid(a, k)] for a, k in n.args]
                body.append(f"{v} = {fn(args, n.attr_dict, [ns[a].outs[k] for a, k in n.args], list(n.outs))}")
            name_of[vid(i, 0)] = v

    emit(nodes, lambda i, k: (i, k), live)
    for oi, ref in enumerate(bg.outputs):
        body.append(f"tl.store({address(f'o{oi}_ptr', f'o{oi}_s', shape)}, "
                    f"{name_of[ref]}.to(o{oi}_ptr.dtype.element_ty){mask})")
    params: list[str] = []
    signature: dict[str, str] = {}
    for pre, types, store in (("a", arg_types, arg_store), ("o", out_types, out_store)):
        for k, t in enumerate(types):
            params.append(f"{pre}{k}_ptr")
            signature[f"{pre}{k}_ptr"] = _PTR_SIG[store[k]]
            for d in range(t.rank):
                params.append(f"{pre}{k}_s{d}")
                signature[f"{pre}{k}_s{d}"] = "i32"
    lead = ["p0", "p1", "p2"] if device_fn else []
    doc = f"Flat: the {total} elements of {_shape_text(shape)}, {block} a block (block graph: grid {bg.grid})."
    out = ["@triton.jit", f"def {name}(" + ", ".join([*lead, *params]) + "):", f'    """{doc}"""']
    if pdl and not device_fn:
        out += _gdc_head(pdl)
    out += ["    " + s for s in body]
    if pdl == "end" and not device_fn:
        out.append("    gdc_launch_dependents()")
    return "\n".join(out) + "\n", KernelInfo(name, -1, (nblocks,), signature, False)


def kernel_source(bg: BlockGraph, arg_types: Sequence[TensorType], name: str = "kernel",
                  tiles: TileOptions | None = None, arg_store: Sequence[DType] | None = None,
                  out_store: Sequence[DType] | None = None,
                  inline: dict[int, int] | None = None, pdl: str = "",
                  device_fn: bool = False, prefetch: frozenset[int] = frozenset(),
                  early_args: frozenset[int] = frozenset(),
                  out_types: Sequence[TensorType] | None = None) -> tuple[str, KernelInfo]:
    """The ``@triton.jit`` source of one block graph applied to operands of ``arg_types``.

    ``out_types``: the kernel node's recorded results where they crop the block graph's whole tiles (a masked tail:
    stores masked past their end); left out, whole tiles.

    ``arg_store`` / ``out_store`` give the element types the operands and results have in device
    memory when they differ from the IR's (fp32 storage of intermediate results). ``pdl`` (see :func:`generate`):
    the kernel starts with ``gdc_wait()`` and calls ``gdc_launch_dependents()`` first ("start") or last ("end").
    ``early_args`` (with ``pdl``): the operands no kernel that may still run can write; the wait goes before the
    first statement that stores or reads another (:attr:`KernelInfo.early_loop`: after the for-loop; without a
    for-loop, :attr:`KernelInfo.early_loads`: the loads of those operands first, where they are at least
    :data:`PDL_EARLY_LOADS_MIN_BYTES` a block). "pre": the
    kernel calls ``gdc_launch_dependents()`` before its wait.
    ``device_fn``: a ``@triton.jit`` function a merged kernel calls (:func:`generate`'s ``merge``), its block's
    index along launch axis ``j`` the parameter ``p<j>``; the returned grid is the one it would be launched with.
    ``prefetch``: operands (by index) that are the program's inputs, which no kernel of the program writes: their
    tiles are prefetched into L2 before ``gdc_wait`` (:meth:`_KernelGen.prefetch_lines`; a device function's in a
    function ``<name>_pf`` of its own, appended to the source, for the merged launch to call before its wait). Not
    for a flat kernel.
    """
    outs = tuple(out_types) if out_types is not None else bg.result_types(arg_types)
    opts = tiles or TileOptions()
    if opts.flat and (shape := flat_shape(bg, arg_types, inline, outs)) is not None:
        return _flat_kernel(bg, arg_types, outs, shape, name, opts.flat,
                            list(arg_store) if arg_store is not None else [t.dtype for t in arg_types],
                            list(out_store) if out_store is not None else [t.dtype for t in outs], pdl, device_fn)
    kg = _KernelGen(bg, arg_types, outs, name, opts, arg_store, out_store, inline)
    kg.pdl = "" if device_fn else pdl
    kg.early_args = early_args if kg.pdl else frozenset()
    kg.device_fn = device_fn
    kg.prefetch = frozenset(prefetch)
    src = kg.generate()
    if kg.prefetch_fn:
        src += "\n\n" + kg.prefetch_fn
    launch_grid = [1] * len(bg.grid)
    for a, g in enumerate(bg.grid):
        launch_grid[kg.launch_axes[a]] = g
    return src, KernelInfo(name, -1, tuple(launch_grid), kg.signature, kg.uses_dot,
                           kg.uses_dot and kg.full_dots == 0, launch_axes=tuple(kg.launch_axes),
                           prefetch=bool(kg.prefetch_fn), early_loop=kg.early_loop, early_loads=kg.early_loads)


def _gdc_head(pdl: str) -> list[str]:
    """A PDL kernel's wait (``griddepcontrol.wait``) with, in mode "start", ``launch_dependents`` after it, in mode
    "pre" before it (the next kernel may launch before this one's own wait); none without ``pdl``."""
    if not pdl:
        return []
    if pdl == "pre":
        return ["    gdc_launch_dependents()", "    gdc_wait()"]
    return ["    gdc_wait()", *(["    gdc_launch_dependents()"] if pdl == "start" else [])]


#: The (P, V) tile shapes of a product whose right operand a looped kernel with a side stream loads squeezed beside
#: the left one reshaped from rank 3 (:meth:`_KernelGen.dot_operand_inputs`): those Triton 3.6 compiles for sm_90,
#: checked for every stored bias_attention design (P of 32-128 rows by 32-128 keys) at 4 warps with 3 and 4 stages
#: and at 8 warps with 3: (128, 64) @ (64, 64) at both warps, (64, 64) @ (64, 64) at 4 only (at 8 the runtime
#: compiles it again at 4: ``runtime._layout_pass_failed``); every other shape fails in the layout pass.
SQUEEZE_BESIDE_RESHAPE: frozenset[tuple[tuple[int, ...], tuple[int, ...]]] = frozenset(
    {((128, 64), (64, 64)), ((64, 64), (64, 64))})
#: :meth:`_KernelGen.early_casts`: a loaded dot operand is converted before its reshape beside the other operand
#: computed and reshaped also where the dot's loop accumulator is carried in the dot's shape (not reshaped around it).
#: Compiled for sm_90 (benchmarks/compile_check.py over every committed attention candidate, twentieth session): of
#: the kernels where the rule differs from the shape list alone, those with a carried accumulator (83) or none (30)
#: all compile at 4 and 8 warps, those whose accumulator is reshaped (the online softmax's rescaled sum) fail the
#: layout pass in 105 of 172, whatever the P and V shapes. H100, one process, PDL off (benchmarks/results/
#: models20_2026-11-27/ab): the suite's decode candidate 0s gqa_bs1 8.01 -> 7.77 us, mqa_bs1 8.51 -> 7.74 (the 8-byte
#: spill gone), qknorm_gqa_bs1 10.28 -> 9.82, mha unchanged; one-step kernels without an accumulator were mixed
#: (capture plan_large #4 188.1 -> 183.6, plan_medium #28 3.79 -> 3.91: there the conversion is done once, not per
#: iteration), so they keep the shape list. False: the shape list alone (codegen 16-17).
EARLY_CAST_BESIDE_CARRIED = True

#: ``pdl="auto"``: a kernel lets the next one launch at its start when that one has at most this many blocks.
PDL_EARLY_MAX_BLOCKS = 64
#: ``pdl="auto"``: ... or when the kernel itself has at most this many blocks (all of them on the SMs at once, beside
#: room for the next one's: the next kernel's blocks then wait for it where they will run, having prefetched their
#: input tiles, :data:`PDL_PREFETCH_BYTES`); 0: only the next kernel's blocks decide. Alone it changed little (H100,
#: the layer merged: bs1 196.0 -> 196.4 us, bs8 255.1 -> 254.5); with the prefetches see there. Off (0) by default:
#: with it (and the prefetches everywhere) the models set's layernorm_linear ran 22.3 us against 16.1 (H100, run 20,
#: 2026-11-27 05:44 UTC, against run 19 at 02:27; its LayerNorm kernel of 16 blocks then starts the 128-block
#: projection at its start), for the layer's bs1 192.1 against 193.1 with it off (benchmarks/results/pdl_prefetch_*)
PDL_EARLY_OWN_MAX_BLOCKS = 0
#: With ``pdl``, each kernel prefetches into L2, before its ``gdc_wait``, the tiles it will read of the program's
#: inputs (weights, caches: no kernel of the program writes them), up to this many bytes a block (a looped input's
#: first iterations, at least one; :meth:`_KernelGen.prefetch_lines`); 0: none. A kernel launched early thereby
#: streams its first weight tiles while the kernel before it finishes. Measured on an H100 (benchmarks/results/
#: pdl_prefetch_h100_2026-11-27_0432, _0438; the layer merged, PDL auto, with PDL_EARLY_OWN_MAX_BLOCKS 64): bs1
#: 197.5 -> 194.4 us at 16 KB (8 KB 194.5, 32 KB 194.6, one iteration 194.1; 64 KB 197.2 and 256 KB 215.1 against
#: 196.0 in the other call: a block's whole slab in prefetches costs more than it hides), bs8 255.3 -> 252.5
PDL_PREFETCH_BYTES = 16384
#: ... only in a kernel the launch before it lets launch at its start (pdl "start"), whose blocks may then run their
#: prefetches while that launch still runs; elsewhere they would only come before its own loads. Off: measured
#: level with prefetching everywhere (bs1 194.1 against 194.4 us at 16 KB, 193.1 against 192.1 with the o projection
#: in 256-deep K tiles; bs8 251.9 against 252.5). On by default: prefetching everywhere made kernels that are the
#: program's first (whose wait is for work outside the program) slower in the models set (H100, run 20 against run 19,
#: CUDA-graph medians, every candidate: residual_rmsnorm's one-kernel designs 23.7 -> 27.2-31.5 us, softcap_attention
#: 25.0 -> 27.9, activations 14.1 -> 14.9, causal_attention 15.1 -> 15.7): a block's prefetches of the rows it loads
#: at once cost more than they hide where nothing before it runs long enough to hide them
PDL_PREFETCH_EARLY_ONLY = True
#: ... and in the program's first launch where its grid is at most this many blocks (one wave: every block is placed
#: while the previous call's last kernel still runs its tail, so its prefetches overlap that); 0: never. H100 run 20
#: (prefetches in every kernel): lora_scaled, whose first kernel has 16 blocks, 16.44 us against 16.8 in run 21
#: without; residual_rmsnorm's first (and only) kernel of thousands of blocks 23.7 -> 27.2-31.6
PDL_PREFETCH_FIRST_MAX_BLOCKS = 0
#: ... and in the program's first launch where it has no for-loop and lets the next launch at its start (pdl
#: "start"): a few loads whose launch is off the program's path, the next launch starting at once. H100, 2026-11-27
#: 07:17 UTC (benchmarks/results/pdl_models_ab_h100_2026-11-27_0717.json, CUDA-graph medians over rotated inputs, the
#: same module timed twice within 0.02 us): prefetches in every first launch of one wave (the constant above at 132)
#: made lora_scaled 16.88 -> 16.42 us (its first kernel: X A's 16 one-step split blocks, "start") and every other
#: program it changed slower: those whose first launch starts the next only at its end (layernorm_linear's one-step
#: LayerNorm 16.32 -> 16.52, activations 14.12 -> 14.87, qkv_bias 13.75 -> 14.16, gelu_mlp 95.04 -> 95.99,
#: rotary_attention 28.94 -> 30.01) and decode_gqa's "start" launch that streams the cache in a loop (31.10 -> 31.71)
PDL_PREFETCH_FIRST_START = True

#: ``pdl="auto"``: a launch whose next launch runs its for-loop over the program's inputs before its wait
#: (:attr:`KernelInfo.early_loop`) lets that one launch at its start ("start": once it has waited itself) where the
#: block-count rules above would have it wait for the end: the next launch's stream then overlaps this one.
PDL_START_BEFORE_EARLY_LOOP = True
#: With ``pdl`` (not the program's first launch): a kernel without a for-loop whose block loads at least this many
#: bytes of the program's inputs (a split-KV attention kernel's K and V tiles) issues those loads before its
#: ``gdc_wait`` (:attr:`KernelInfo.early_loads`), and in "auto" the launch before it lets it launch at its start
#: (as for an early loop: :data:`PDL_START_BEFORE_EARLY_LOOP`), so that its stream overlaps that launch. Below it the
#: kernel waits first: a few loads gain little (what they wait for after the wait is a round trip to memory anyway),
#: and tiles up to :data:`PDL_PREFETCH_BYTES` are prefetched into L2 instead. H100, 2026-11-27 10:09 UTC (benchmarks/
#: results/layer17_h100_2026-11-27/, A B A B in one call): the decode layer at bs1, merged, PDL auto, 190.43 / 190.32 us
#: -> 189.09 / 188.99 (its split-KV attention's 64 KB of K and V a block stream while the rotary before it runs)
PDL_EARLY_LOADS_MIN_BYTES = 32768
#: ``pdl="auto"`` (without ``last_block``): a split kernel and its combine kernel run as one last-block launch
#: (:func:`_last_block_units`) where the launch after the combine runs its for-loop before its wait, which then
#: starts one launch hop sooner (LoRA's ``X A`` split over K, its sum, then the weight stream with ``(X A) B`` after
#: the loop: two hops before the stream, one with this). H100, 2026-11-27 (benchmarks/results/
#: pdl_models_ab_h100_2026-11-27_0717.json, _0733.json; CUDA-graph medians over rotated inputs): lora_scaled's three
#: launches 16.82-16.88 us, its two (this and the rule above) 17.47 while a captured graph zeroed the last-block
#: counters with a fill kernel each call, **15.44** without that fill (counters zeroed outside the capture, a
#: measurement). The runtime gives a capture such counters (``runtime._capture_counters``: one zeroed buffer per
#: capture, stream and program, the capture's id from the driver). On (with the rule above) since that path ran on the
#: device (H100, 08:16-08:27 UTC: ``tests/test_capture_counters.py`` passed, two graphs replayed at once on two
#: streams; ``pdl_models_ab.py --cases lora_scaled``: main 16.85, this commit's previous defaults 16.49, these rules
#: through the runtime's counters 15.48, the fill-free measurement 15.47; bench.py models at 08:26: lora_scaled
#: 15.5 us, 74% of its floor). Of the committed models and layer candidates only lora_scaled's module changes.
PDL_LASTBLOCK_BEFORE_EARLY_LOOP = True

#: Largest tensor (elements) :func:`_view_kernel` checks by evaluating the kernel.
VIEW_CHECK_MAX = 1 << 22


def _view_kernel(bg: BlockGraph, in_type: TensorType, out_type: TensorType) -> bool:
    """Whether the kernel ``bg`` of one operand of ``in_type`` computes ``reshape(x, out_type.shape)`` (row-major):
    its output's memory is then its operand's, and the kernel need not run (:attr:`ModuleSource.views`).

    Its block nodes must all be ``input`` or ``reshape`` (pure data movement: ``out[j] = x[pi(j)]`` with ``pi``
    independent of the data); the kernel is then evaluated in float64 on ``x = arange`` (distinct, exact values),
    which identifies ``pi``: it must be the identity on the flat order. The layer's flatten of the attention output
    before the o projection was such a kernel (a copy of 32 KB: 1.5 us and a launch on an H100)."""
    from ..ir.reference import evaluate

    if len(bg.outputs) != 1 or any(n.op not in ("input", "reshape") for n in bg.nodes):
        return False
    if bg.flimit is not None or in_type.dtype != out_type.dtype or math.prod(in_type.shape) != math.prod(
            out_type.shape) or math.prod(in_type.shape) > VIEW_CHECK_MAX:
        return False
    import numpy as np

    mg = MuGraph()
    x = mg.input("x", in_type.shape, in_type.dtype)
    (y,) = mg.custom(bg, [x])
    mg.output(y)
    flat = np.arange(math.prod(in_type.shape), dtype=np.float64)
    try:
        (got,) = evaluate(mg, {"x": flat.reshape(in_type.shape)})
    except GraphError:
        return False
    return got.shape == tuple(out_type.shape) and bool(np.array_equal(got.reshape(-1), flat))


#: With ``merge_key`` (the runtime's merged launches: a key for each kernel's warps), the launches of one level whose
#: kernels all have at most this many blocks are one launch whatever their keys (it takes their most warps:
#: ``runtime.merged_config``); 0: off. H100 2026-11-27 19:21 UTC (benchmarks/results/layer20_h100_2026-11-27/call3):
#: the decoder layer's bs1 q-projection combine with its rotary (8 blocks, 4 warps) and the k and v combines (8 blocks
#: each, 8 warps) as one launch, 9 launches: 187.4 us against 188.3 (three rounds each, interleaved)
MERGE_SMALL_MAX_BLOCKS = 32


def _launch_units(nodes: Sequence[Node], view_nodes: set[int], merge: bool,
                  merge_key: Callable[[BlockGraph, Sequence[TensorType]], Any] | None = None,
                  merge_fits: Callable[[Sequence[int]], bool] | None = None) -> list[list[int]]:
    """The order ``forward`` takes the μGraph's kernel nodes in, as launches: lists of node indices (a view, which
    is not launched, a list of one). Without ``merge``, one launch per kernel in the μGraph's order. With it, the
    kernels by *level* (1 + the highest level of the kernels whose results they read, through views; 0 for the
    program's inputs), each level's kernels one launch, in node order (:func:`_merged_kernel`), and each view right
    after its level's launch; with ``merge_key`` (of a kernel's block graph and operand types), one launch per
    level and key (kernels that want different launch parameters apart; the keys' launches of few-block kernels
    together, :data:`MERGE_SMALL_MAX_BLOCKS`), split where ``merge_fits`` (of the kernels'
    nodes) says a launch may not hold them all: each kernel joins the launch before it in node order if the launch
    may hold it too, else starts one. Kernels of one level read nothing
    another of them writes (a reader is at least one level above what it reads), and every kernel still runs after
    every kernel it reads: the order is a topological order of the μGraph, which computes the same values as its
    own order (every value has a buffer of its own, written once)."""
    customs = [i for i, n in enumerate(nodes) if n.op == "custom"]
    if not merge:
        return [[i] for i in customs]
    level: dict[int, int] = {}
    for i in customs:
        below = max((level.get(a, 0) for a, _ in nodes[i].args), default=0)
        level[i] = below if i in view_nodes else below + 1
    order = sorted(customs, key=lambda i: (level[i], i in view_nodes, i))
    units: list[list[int]] = []
    for (_, is_view), grp in itertools.groupby(order, key=lambda i: (level[i], i in view_nodes)):
        members = list(grp)
        if is_view or merge_key is None:
            units += [[i] for i in members] if is_view else [members]
            continue
        by_key: dict[Any, list[int]] = {}
        for i in members:
            n = nodes[i]
            by_key.setdefault(merge_key(n.attr("block"), [nodes[a].outs[k] for a, k in n.args]), []).append(i)
        groups = sorted(by_key.values())
        small = [g for g in groups if all(nodes[i].attr("block").num_blocks <= MERGE_SMALL_MAX_BLOCKS for i in g)]
        if len(small) > 1:  # (few-block kernels of other keys share one launch: see MERGE_SMALL_MAX_BLOCKS)
            groups = sorted([*(g for g in groups if g not in small), sorted(i for g in small for i in g)])
        for grp_ in groups:
            cur: list[int] = []
            for i in grp_:
                if cur and merge_fits is not None and not merge_fits([*cur, i]):
                    units.append(cur)
                    cur = []
                cur.append(i)
            units.append(cur)
    return units


def last_block_pairs(program: Any, tiles: TileOptions | None = None,
                     tiles_for: Callable[[BlockGraph, Sequence[TensorType]], TileOptions] | None = None
                     ) -> list[tuple[int, int, LastBlock]]:
    """The split/combine pairs :func:`generate` runs as one launch with ``last_block=True`` and the same ``tiles`` /
    ``tiles_for`` (under the current :data:`LASTBLOCK_MAX_TILES`): ``(split node, combine node, plan)``, nodes of the
    kernel-level μGraph (:func:`verimirage.backend.wrap.to_kernels`), in launch order. ``vm.compile``'s default
    launches take ``tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles`` (:func:`tuning.tuned_module`), whose
    rules emit some elementwise kernels flat: such a split keeps its own launch and is not listed. For a cost model:
    such a launch saves one launch gap (about 1.2 us inside a CUDA graph on an H100) and puts ``plan.tiles`` combine
    blocks, one after another, behind the last split block of each of ``plan.groups`` groups (BENCHMARKS.md
    "Last-block combines")."""
    mg = to_kernels(_as_mugraph(program))
    nodes = node_list(mg)
    views = _view_nodes(nodes, set(output_refs(mg)))
    units, plans = _last_block_units(nodes, _launch_units(nodes, views, False), views,
                                     _emitted_flat(nodes, tiles, tiles_for))
    return [(u[0], u[1], plans[u[0]]) for u in units if u[0] in plans]


def _view_nodes(nodes: Sequence[Node], final: set[tuple[int, int]]) -> set[int]:
    """The kernels :func:`generate` emits as views of their operand's buffer (no launch): one operand, a kernel's
    result (a buffer or a view of one) in the same element type in memory, contiguous; not a program output (in
    ``final``), no inlined masks, a block graph that only reshapes (:func:`_view_kernel`)."""
    def is_view(i: int, n: Node) -> bool:
        return (n.op == "custom" and len(n.args) == 1 and len(n.outs) == 1 and (i, 0) not in final
                and nodes[n.args[0][0]].op == "custom"
                and storage_dtype(nodes, final, n.args[0]) == storage_dtype(nodes, final, (i, 0))
                and not _inline_masks(nodes, n)
                and _view_kernel(n.attr("block"), nodes[n.args[0][0]].outs[n.args[0][1]], n.outs[0]))

    return {i for i, n in enumerate(nodes) if is_view(i, n)}


def _emitted_flat(nodes: Sequence[Node], tiles: TileOptions | None,
                  tiles_for: Callable[[BlockGraph, Sequence[TensorType]], TileOptions] | None) -> Callable[[int], bool]:
    """Whether :func:`generate` with ``tiles`` / ``tiles_for`` emits kernel node ``j`` flat (one flat index range,
    :attr:`TileOptions.flat`; kernel_source's own test)."""
    def flat(j: int) -> bool:
        bg: BlockGraph = nodes[j].attr("block")
        at = [nodes[a].outs[k] for a, k in nodes[j].args]
        opts = (tiles_for(bg, at) if tiles_for else tiles) or TileOptions()
        return bool(opts.flat) and flat_shape(bg, at, _inline_masks(nodes, nodes[j]), nodes[j].outs) is not None

    return flat


def _last_block_units(nodes: Sequence[Node], units: list[list[int]], view_nodes: set[int],
                      flat: Callable[[int], bool] | None = None, keep: Callable[[int, int], bool] | None = None
                      ) -> tuple[list[list[int]], dict[int, LastBlock]]:
    """``units`` (:func:`_launch_units`) with each split kernel that has a combine kernel (:func:`last_block_plan`)
    launched with it: the unit ``[s]`` becomes ``[s, c]`` and ``[c]`` goes. Only where both are launches of their
    own (not views, not merged with others) and everything else the combine reads is written by launches before
    the split kernel's (the combine then runs earlier than in ``units``, with all its operands ready; what reads
    its results still comes after it), and not where the split kernel is emitted flat (``flat(node)``: one flat
    index range, :attr:`TileOptions.flat`; its blocks are not the block graph's grid the plan groups), and only the
    pairs ``(split, combine)`` that ``keep`` accepts (None: every pair). Returns the units and the plans by split
    node."""
    where = {u[0]: k for k, u in enumerate(units) if len(u) == 1}
    plans: dict[int, LastBlock] = {}
    partner: dict[int, int] = {}  # split node -> its combine node
    paired: set[int] = set()
    for c in sorted(where):
        if c in view_nodes or nodes[c].op != "custom" or c in paired:
            continue
        for s in dict.fromkeys(a for a, _ in nodes[c].args):
            if s not in where or s in view_nodes or s in paired or nodes[s].op != "custom" or (flat and flat(s)):
                continue
            plan = last_block_plan(nodes, s, c)
            if plan is None or any(a != s and nodes[a].op == "custom" and where.get(a, len(units)) >= where[s]
                                   for a, _ in nodes[c].args) or (keep is not None and not keep(s, c)):
                continue
            plans[s], partner[s] = plan, c
            paired |= {s, c}
            break
    combines = set(partner.values())
    out = [[u[0], partner[u[0]]] if len(u) == 1 and u[0] in partner else u for u in units
           if not (len(u) == 1 and u[0] in combines)]
    return out, plans


def _loops_early_after(nodes: Sequence[Node], units: list[list[int]], view_nodes: set[int], c: int,
                       tiles: TileOptions | None,
                       tiles_for: Callable[[BlockGraph, Sequence[TensorType]], TileOptions] | None,
                       store_dtype: Callable[[tuple[int, int]], DType]) -> bool:
    """Whether the launch after kernel ``c``'s (the next unit of ``units`` that is not a view) is a kernel of its own
    that, generated for PDL with the program's inputs as its ``early_args``, runs its for-loop before its wait
    (:attr:`KernelInfo.early_loop`)."""
    at = next((k for k, u in enumerate(units) if c in u), None)
    nxt = next((u for u in units[at + 1:] if u[0] not in view_nodes), None) if at is not None else None
    if nxt is None or len(nxt) != 1:
        return False
    n = nodes[nxt[0]]
    bg: BlockGraph = n.attr("block")
    arg_types = [nodes[a].outs[k] for a, k in n.args]
    early = frozenset(q for q, (a, _) in enumerate(n.args) if nodes[a].op == "input")
    _, info = kernel_source(bg, arg_types, f"k{nxt[0]}", tiles_for(bg, arg_types) if tiles_for else tiles,
                            [store_dtype(r) for r in n.args], [store_dtype((nxt[0], k)) for k in range(len(n.outs))],
                            _inline_masks(nodes, n), "end", early_args=early, out_types=n.outs)
    return info.early_loop


def _member_params(made: Sequence[tuple[str, KernelInfo]], first: dict[str, str] | None = None
                   ) -> tuple[list[str], dict[str, str], list[list[str]]]:
    """The parameters of one launch that runs the device functions ``made``: ``first`` (names and types), then every
    member's operands in order, then every member's outputs, member ``m``'s parameter ``p`` named ``m<m>_p``. Returns
    them, their signature and each member's own parameters in its order (what its call passes)."""
    params = list(first or {})
    sig = dict(first or {})
    outs: list[str] = []
    mine_of: list[list[str]] = []
    for m, (_src, info) in enumerate(made):
        mine = []
        for p, t in info.signature.items():
            q = f"m{m}_{p}"
            mine.append(q)
            (outs if p.startswith("o") else params).append(q)
            sig[q] = t
        mine_of.append(mine)
    params += outs
    return params, {p: sig[p] for p in params}, mine_of


def _block_ids(info: KernelInfo, local: str) -> list[str]:
    """The block index along each launch axis of kernel ``info`` for its block number ``local`` (x fastest, as CUDA
    numbers a grid's blocks)."""
    g = (*info.grid, 1, 1)[:3]
    return [f"({local}) % {g[0]}" if g[0] > 1 else "0",
            f"(({local}) // {g[0]}) % {g[1]}" if g[1] > 1 else "0",
            f"({local}) // {g[0] * g[1]}" if g[2] > 1 else "0"]


def _dispatch(made: Sequence[tuple[str, KernelInfo]], calls: Sequence[tuple[str, list[str]]],
              suffix: str = "") -> list[str]:
    """A merged launch's block ``pid`` calling its member's device function (``<name><suffix>``: ``"_pf"``, the
    member's prefetches, where it has them; the others ``pass``) with the member's own block index."""
    out: list[str] = []
    start = 0
    for m, (_src, info) in enumerate(made):
        nb = math.prod(info.grid)
        pids = _block_ids(info, f"pid - {start}" if start else "pid")
        test = "if" if m == 0 else ("else" if m == len(made) - 1 else "elif")
        out.append(f"    {test} pid < {start + nb}:" if test != "else" else "    else:")
        fn, mine = calls[m]
        out.append(f"        {fn}{suffix}({', '.join(pids)}, {', '.join(mine)})" if not suffix or info.prefetch
                   else "        pass")
        start += nb
    return out


def _merged_kernel(name: str, unit: Sequence[int], made: Sequence[tuple[str, KernelInfo]],
                   pdl: str) -> tuple[str, KernelInfo]:
    """One ``@triton.jit`` kernel that runs the kernels ``made`` (device functions, :func:`kernel_source`'s
    ``device_fn``, of the μGraph nodes ``unit``) as one launch: its grid is one axis of their blocks together, the
    first kernel's blocks first; block ``b`` of the launch is block ``b - start`` of its kernel, decomposed into
    that kernel's launch axes (x fastest, as CUDA numbers a grid's blocks). Its parameters: every member's operands
    in order, then every member's outputs (:func:`generate`'s call). ``pdl`` as :func:`kernel_source`'s."""
    params, signature, mine_of = _member_params(made)
    calls = [(info.name, mine) for (_src, info), mine in zip(made, mine_of, strict=True)]
    out = ["@triton.jit", f"def {name}(" + ", ".join(params) + "):",
           f'    """Kernels {", ".join(i.name for _, i in made)} as one launch (independent: none reads what another '
           'writes)."""', "    pid = tl.program_id(0)"]
    if pdl and any(info.prefetch for _, info in made):  # (the members' L2 prefetches: before the wait)
        out += _dispatch(made, calls, "_pf")
    if pdl:
        out += _gdc_head(pdl)
    out += _dispatch(made, calls)
    if pdl == "end":
        out.append("    gdc_launch_dependents()")
    infos = [i for _, i in made]
    start = sum(math.prod(i.grid) for i in infos)
    return "\n".join(out) + "\n", KernelInfo(name, unit[0], (start,), signature, any(i.uses_dot for i in infos),
                                             all(i.row_dots_only for i in infos), tuple(unit), (0,))


def persistent_tasks(unit: Sequence[int], blocks: Sequence[int],
                     deps: Mapping[int, Sequence[int]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """The task table of a persistent kernel over the kernel nodes ``unit`` (in a topological order) with ``blocks``
    blocks each and ``deps[j]`` the kernels of ``unit`` whose results kernel ``j`` reads: per kernel, in order,
    ``(first task, tasks, indices in unit of the kernels it waits for)``. Kernel ``m``'s blocks are the global tasks
    ``first .. first + tasks - 1``; every kernel it waits for comes earlier in ``unit``, so each of its tasks has a
    larger global index than every task it waits for. Raises GraphError where ``unit`` is not topological."""
    pos = {j: m for m, j in enumerate(unit)}
    table: list[tuple[int, int, tuple[int, ...]]] = []
    start = 0
    for m, (j, nb) in enumerate(zip(unit, blocks, strict=True)):
        waits = tuple(sorted({pos[d] for d in deps.get(j, ())}))
        if any(w >= m for w in waits):
            raise GraphError(f"codegen: persistent kernel: kernel {j} waits for a kernel not scheduled before it")
        table.append((start, nb, waits))
        start += nb
    return table


#: One grid axis of a producer kernel in a consumer block's wait (:func:`tile_box`): ``(b, mult, div, n)``: the
#: consumer block with coordinate ``c`` on its grid axis ``b`` needs the producer blocks ``c * mult // div`` to
#: ``c * mult // div + n - 1`` on this axis (``b`` = -1: all ``n`` of them, from 0).
BoxAxis = tuple[int, int, int, int]


def tile_box(producer: BlockGraph, out: int, consumer: BlockGraph, inp: Node,
             shape: Sequence[int]) -> tuple[BoxAxis, ...] | None:
    """The producer blocks one block of ``consumer`` reads through its input node ``inp`` (a tile of ``producer``'s
    output ``out``, of ``shape``, read directly: no view between), per producer grid axis (:data:`BoxAxis`), or None
    where the partitions do not nest (a consumer tile neither a multiple nor a divisor of the producer's).

    From the maps alone: producer block ``i`` on its axis ``a`` writes slab ``i`` (size ``shape[d] / grid[a]``) of
    dim ``d = omaps[out].dims[a]`` (:class:`~verimirage.ir.graph.OutputMap`: every block its own region); a
    consumer block reads, along ``d``, the slab its grid axis ``b`` selects where ``imap[b] == d`` (every for-loop
    iteration stays inside it), else the whole dim. Every element the block's tile holds is inside the box (a causal
    ``flimit`` only skips iterations: the box is then a superset)."""
    imap = tuple(inp.attr("imap"))
    box: list[BoxAxis] = []
    for a, d in enumerate(producer.omaps[out].dims):
        tp = shape[d] // producer.grid[a]
        if d not in imap:
            box.append((-1, 0, 1, producer.grid[a]))
            continue
        b = imap.index(d)
        tc = shape[d] // consumer.grid[b]
        ct = inp.outs[0].shape[d] * (consumer.frange if inp.attr("fmap") == d else 1)
        if producer.type_of(producer.outputs[out]).shape[d] != tp or ct != tc or tc * consumer.grid[b] != shape[d]:
            return None  # (a masked tail on either side: the slabs are rounded-up tiles; waited for whole)
        if tc % tp == 0:
            box.append((b, tc // tp, 1, tc // tp))
        elif tp % tc == 0:
            box.append((b, 1, tp // tc, 1))
        else:
            return None
    return tuple(box)


def box_blocks(box: Sequence[BoxAxis], coords: Sequence[int]) -> list[tuple[int, ...]]:
    """The producer blocks (their grid coordinates) a consumer block at ``coords`` (its grid coordinates) waits for
    under ``box`` (:func:`tile_box`): what the generated wait computes, for checks."""
    ranges = [range(n) if b < 0 else range(coords[b] * mult // div, coords[b] * mult // div + n)
              for b, mult, div, n in box]
    return list(itertools.product(*ranges))


def _noinline(src: str) -> str:
    """Device function ``src`` (:func:`kernel_source`'s ``device_fn``) as ``@triton.jit(noinline=True)``: a call
    of its own in the PTX, not inlined into its caller. A persistent kernel's members so keep their registers to
    themselves: inlined, the compiler hoisted every member's loop-invariant values (pointers, offset vectors) out of
    the task loop and kept them all live across it (sm_90, the layer's decode_bs1 at 16 warps: 128 registers and
    392 bytes spilled; at 4 warps 255 and 1,376), where called, the kernel takes the most any member takes (62 and
    168 registers, no spill) and the parameters a member needs are passed at its call."""
    head = "@triton.jit\n"
    if not src.startswith(head):
        raise GraphError("codegen: a device function's source does not start with @triton.jit")
    return "@triton.jit(noinline=True)\n" + src[len(head):]


def _tile_wait(box: Sequence[BoxAxis], coords: Sequence[str], producer: KernelInfo, flags: int) -> list[str]:
    """The lines (at the task branch's indent) that wait for the producer blocks ``box`` names (:func:`tile_box`) for
    the consumer block whose grid coordinates are the expressions ``coords``: one acquire load a block at once (a
    vector of the producer blocks' flags ``ctr_ptr[flags + local block]``, each 1 once that block's stores are
    released), until all are set."""
    size = math.prod(n for *_, n in box)
    width = max(2, 1 << (size - 1).bit_length())
    stride = [math.prod(producer.grid[:la]) for la in producer.launch_axes]
    terms, inner = [], 1
    for a, (b, mult, div, n) in enumerate(box):
        off = "fl" if inner == 1 else f"(fl // {inner})"
        off = "" if n == 1 else (f"{off} % {n}" if inner * n < size else off)
        lo = "" if b < 0 else f"({coords[b]})" + (f" * {mult}" if mult > 1 else "") + (f" // {div}" if div > 1 else "")
        here = " + ".join(t for t in (lo, off) if t) or "0"
        terms.append(f"({here}) * {stride[a]}" if stride[a] > 1 else f"({here})")
        inner *= n
    if size == 1:  # (one block: the pointer still a vector, as the mask is)
        terms.append("fl * 0")
    return [f"fl = tl.arange(0, {width})",
            f"fb = ctr_ptr + {flags} + " + " + ".join(terms),
            f'while tl.sum(tl.where(fl < {size}, tl.atomic_add(fb, 0, mask=fl < {size}, sem="acquire", '
            f'scope="gpu"), 0), 0) < {size}:',
            "    pass"]


def _tile_deps(nodes: Sequence[Node], unit: Sequence[int], made: Sequence[tuple[str, KernelInfo]],
               view_nodes: set[int]) -> dict[int, list[tuple[int, tuple[BoxAxis, ...]]]]:
    """Per kernel node of ``unit`` (a persistent kernel's members, ``made`` their device functions), the kernels it
    reads whose blocks it can wait for tile by tile: ``(producer node, box)`` for each distinct :func:`tile_box` of
    its input nodes reading that producer's outputs, where every such box is smaller than the producer's whole grid.
    A producer that any operand reads through a view (a reshape: no box), a flat kernel on either side, a box that
    does not nest or covers the whole grid: that producer is waited for whole (left out here)."""
    info = {j: made[m][1] for m, j in enumerate(unit)}
    out: dict[int, list[tuple[int, tuple[BoxAxis, ...]]]] = {}
    for j in unit:
        bg: BlockGraph = nodes[j].attr("block")
        inline = _inline_masks(nodes, nodes[j])
        boxes: dict[int, list[tuple[BoxAxis, ...] | None]] = {}
        for q, (p, k) in enumerate(nodes[j].args):
            if q in inline:
                continue
            base = p
            while base in view_nodes:
                base = nodes[base].args[0][0]
            if base not in info:  # (an input or a constant)
                continue
            if base != p or not info[j].launch_axes or not info[p].launch_axes:
                boxes.setdefault(base, []).append(None)
                continue
            pb: BlockGraph = nodes[p].attr("block")
            for n in bg.nodes:
                if n.op == "input" and n.attr("arg") == q:
                    box = tile_box(pb, k, bg, n, nodes[p].outs[k].shape)
                    whole = box is None or math.prod(b[3] for b in box) == pb.num_blocks
                    boxes.setdefault(p, []).append(None if whole else box)
        pairs = [(p, box) for p, bs in boxes.items() if None not in bs for box in dict.fromkeys(bs)
                 if box is not None]
        if pairs:
            out[j] = pairs
    return out


def _persistent_kernel(name: str, unit: Sequence[int], made: Sequence[tuple[str, KernelInfo]],
                       deps: Mapping[int, Sequence[int]], offset: int,
                       tiles: Mapping[int, Sequence[tuple[int, tuple[BoxAxis, ...]]]] | None = None
                       ) -> tuple[str, KernelInfo]:
    """One ``@triton.jit`` kernel that runs the kernels ``made`` (device functions of the μGraph nodes ``unit``, in a
    topological order) as *tasks* on a persistent grid (the MPK design): task ``t`` is block ``t - first`` of its
    kernel (:func:`persistent_tasks`); block ``b`` of a launch of ``G`` blocks runs tasks ``b, b + G, b + 2G, ...``
    in increasing order. Each kernel ``m`` that another reads has a completion counter ``ctr_ptr[offset + m]`` in
    the program's counter buffer: a task that finished its stores passes a block barrier (every thread's stores are
    done) and adds one to it with release semantics at GPU scope; a task whose kernel reads kernel ``m``'s results
    first spins until the counter equals ``m``'s block count, reading it with acquire semantics at GPU scope, then
    passes a block barrier before any load. The last block to finish (counter ``offset + len(unit)``,
    acquire-release) sets every counter back to zero, so the next launch in stream order (or CUDA-graph replay)
    starts from zero, as the last-block-combines launches leave theirs.

    No deadlock when the ``G`` blocks are co-resident: every task waits only for tasks of smaller global index, and
    each block takes its tasks in increasing order; the smallest unfinished task's waits are all satisfied and its
    block has finished every earlier task of its own, so it runs. With ``G = 1`` (Triton's interpreter, which runs
    blocks one after another) every wait is already satisfied when reached. Parameters: the counter buffer, then as
    :func:`_merged_kernel`'s (``len(unit) + 1`` counters from ``offset``).

    ``tiles[j]``: ``(producer node, box)`` pairs where kernel ``j``'s blocks wait only for the producer blocks they
    read (:func:`tile_box`; ``deps[j]`` then leaves that producer out): each such producer's blocks set a flag of
    their own (``ctr_ptr[offset + len(unit) + 1 + ...]``, one a block, in the unit's order) with a release after
    their stores, and the consumer block waits for the flags of its box (:func:`_tile_wait`): it starts while
    other blocks of its producer still run. Still only waits for tasks of smaller index (no deadlock)."""
    params, signature, mine_of = _member_params(made, {"ctr_ptr": "*i32", "ctr_s0": "i32"})
    infos = [i for _, i in made]
    blocks = [math.prod(i.grid) for i in infos]
    table = persistent_tasks(unit, blocks, deps)
    read = {w for _, _, waits in table for w in waits}  # the kernels another waits for: those count completions
    total = sum(blocks)
    pos = {j: m for m, j in enumerate(unit)}
    tiles = tiles or {}
    flagged = sorted({pos[p] for j in unit for p, _ in tiles.get(j, ())})
    flag_at: dict[int, int] = {}
    nxt = offset + len(unit) + 1
    for m in flagged:
        flag_at[m] = nxt
        nxt += blocks[m]
    if any(w >= pos[j] for j in unit for w in (pos[p] for p, _ in tiles.get(j, ()))):
        raise GraphError("codegen: persistent kernel: a kernel waits for tiles of a kernel not scheduled before it")
    out = ["@triton.jit", f"def {name}(" + ", ".join(params) + "):",
           f'    """Kernels {", ".join(i.name for i in infos)} as tasks of one persistent launch (counters '
           f'ctr_ptr[{offset}:{nxt}])."""', "    nprog = tl.num_programs(0)",
           f"    for task in range(tl.program_id(0), {total}, nprog):"]
    for m, ((start, nb, waits), info) in enumerate(zip(table, infos, strict=True)):
        test = "if" if m == 0 else ("else" if m == len(made) - 1 else "elif")
        out.append(f"        {test} task < {start + nb}:" if test != "else" else "        else:")
        for w in waits:
            out += [f'            while tl.atomic_add(ctr_ptr + {offset + w}, 0, sem="acquire", scope="gpu") < '
                    f"{blocks[w]}:", "                pass"]
        pids = _block_ids(info, f"task - {start}" if start else "task")
        coords = [pids[la] for la in info.launch_axes]
        for p, box in tiles.get(unit[m], ()):
            out += ["            " + line for line in _tile_wait(box, coords, infos[pos[p]], flag_at[pos[p]])]
        if waits or tiles.get(unit[m]):
            out.append("            tl.debug_barrier()  # (no load of this task before the acquire)")
        out.append(f"            {info.name}({', '.join(pids)}, {', '.join(mine_of[m])})")
        if m in read or m in flag_at:
            out.append("            tl.debug_barrier()  # (every thread's stores before the release)")
        if m in read:
            out.append(f'            tl.atomic_add(ctr_ptr + {offset + m}, 1, sem="release", scope="gpu")')
        if m in flag_at:
            local = f"task - {start}" if start else "task"
            out.append(f'            tl.atomic_add(ctr_ptr + {flag_at[m]} + {local}, 1, sem="release", scope="gpu")')
    n = offset + len(made)
    out += ["    tl.debug_barrier()",
            f'    done = tl.atomic_add(ctr_ptr + {n}, 1, sem="acq_rel", scope="gpu")',
            "    if done == nprog - 1:  # the last block: every wait is over; zero the counters for the next launch",
            *(f'        tl.atomic_xchg(ctr_ptr + {c}, 0, sem="relaxed", scope="gpu")'
              for c in [*(offset + m for m in sorted(read)), n])]
    for m in flagged:  # (every task is over: the flags zeroed with plain stores, seen by the next launch)
        out += [f"        for z in range(0, {blocks[m]}, 1024):",
                "            zo = z + tl.arange(0, 1024)",
                f"            tl.store(ctr_ptr + {flag_at[m]} + zo, 0, mask=zo < {blocks[m]})"]
    return "\n".join(out) + "\n", KernelInfo(name, unit[0], (total,), signature, any(i.uses_dot for i in infos),
                                             all(i.row_dots_only for i in infos), tuple(unit), (0,), persistent=True)


def last_block_plan(nodes: Sequence[Node], s: int, c: int) -> LastBlock | None:
    """How kernel ``c`` (a custom node of ``nodes``) can run inside kernel ``s``'s launch as a last-block combine, or
    None: ``c`` reads partial results ``s`` writes side by side along split-kernel grid axes, looping over them.

    Found from the grids and maps alone (any split reduction: sums, maxima, the online softmax's rescaled sums):
    for every block input of ``c`` that reads an output of ``s``, each grid axis ``a`` of ``s`` (over one block)
    writes that output's dim ``d = omap[a]``; it is *matched* to ``c``'s grid axis ``b`` when every such input
    partitions ``d`` by ``b`` (``imap[b] == d``) into a multiple ``r`` of ``s``'s blocks on ``a``, with the same
    ``(b, r)`` for all of them (then combine block ``j`` on ``b`` reads a part of what split block ``j // r`` wrote);
    every other axis is gathered (its blocks are counted). None unless some axis is gathered, every such input
    loops (an ``fmap``: the combine's walk over the partials), and a group has at most :data:`LASTBLOCK_MAX_TILES`
    combine blocks (read at each call). Which blocks finish last is not known: the plan is correct for any order (see
    :func:`_last_block_kernel`)."""
    ns, nc = nodes[s], nodes[c]
    if ns.op != "custom" or nc.op != "custom" or s == c:
        return None
    bs: BlockGraph = ns.attr("block")
    bc: BlockGraph = nc.attr("block")
    reads = [n for n in bc.nodes if n.op == "input" and nc.args[n.attr("arg")][0] == s]
    if not reads or any(n.attr("fmap") is None for n in reads):
        return None
    matched: dict[int, tuple[int, int]] = {}
    for a, ga in enumerate(bs.grid):
        if ga == 1:
            continue
        pairs: set[tuple[int, int]] = set()
        for n in reads:
            d = bs.omaps[nc.args[n.attr("arg")][1]].dims[a]
            imap = tuple(n.attr("imap"))
            b = imap.index(d) if d in imap else None
            ts = bs.type_of(bs.outputs[nc.args[n.attr("arg")][1]]).shape[d]  # (the slab split block j // r wrote)
            if b is None or bc.grid[b] % ga or n.outs[0].shape[d] * (bc.frange if n.attr("fmap") == d else 1) * (
                    bc.grid[b] // ga) != ts:  # (and with a masked tail the rounded-up tiles must still nest)
                pairs.add((-1, 0))
            else:
                pairs.add((b, bc.grid[b] // ga))
        if len(pairs) == 1 and next(iter(pairs))[0] >= 0:
            matched[a] = next(iter(pairs))
    on_b = [b for b, _ in matched.values()]
    matched = {a: br for a, br in matched.items() if on_b.count(br[0]) == 1}  # (an axis of c matched once)
    count = math.prod(g for a, g in enumerate(bs.grid) if a not in matched)
    if count < 2:
        return None
    per = {b: r for b, r in matched.values()}
    tiles = math.prod(per.get(b, g) for b, g in enumerate(bc.grid))
    if tiles > LASTBLOCK_MAX_TILES:
        return None
    return LastBlock(tuple((a, b, r) for a, (b, r) in sorted(matched.items())), count,
                     math.prod(bs.grid[a] for a in matched), tiles)


#: The generated module's counter buffers (one per device and stream) for its last-block and persistent launches.
_COUNTERS_HELPER = '''_VM_COUNTERS = {}


def _vm_counters(device, n, stream=None, reset=False):
    """The int32 counters of this module's last-block and persistent launches on ``device`` for the calls on one
    CUDA stream (``stream``: its raw handle; None: the device's current stream): zeroed once, then left at zero by
    every launch (``reset``: ``forward``'s call; in Triton's interpreter, on the CPU, zeroed then, since a launch
    interrupted mid-grid leaves its counts behind). Each stream has its own (launches on two streams at once would
    count each other's blocks), and a launch being captured into a CUDA graph gets fresh zeroed ones (the graph's
    memory, zeroed in the graph)."""
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(n, device=device, dtype=torch.int32)
        if stream is None:
            stream = torch.cuda.current_stream(device).cuda_stream
    c = _VM_COUNTERS.get((device, stream))
    if c is None:
        c = _VM_COUNTERS[(device, stream)] = torch.zeros(n, device=device, dtype=torch.int32)
    elif reset and device.type != "cuda":
        c.zero_()
    return c'''


def _last_block_kernel(name: str, unit: Sequence[int], made: Sequence[tuple[str, KernelInfo]], plan: LastBlock,
                       offset: int, grids: Sequence[tuple[int, ...]], pdl: str) -> tuple[str, KernelInfo]:
    """One ``@triton.jit`` kernel that runs split kernel ``made[0]`` and, in the last of each group's blocks to
    finish it, combine kernel ``made[1]`` (both device functions, :func:`kernel_source`'s ``device_fn``; ``grids``
    their block grids): a *last-block-combines* launch of the μGraph nodes ``unit``.

    Every block runs its split block (its partial results stored), waits for all its threads' stores
    (``tl.debug_barrier``: a CTA barrier), then adds one to its group's counter (``ctr_ptr[offset + group]``) with
    ``tl.atomic_add(..., sem="acq_rel", scope="gpu")``: the release makes the block's stores visible to whichever block
    reads the counter after it, the acquire makes the others' stores visible to this one. The block that reads
    ``count - 1`` arrived last: every partial of its group is written and visible, and it runs the group's combine
    blocks (the combine kernel's own code, block by block: the same operations in the same order as the two-launch
    version; on an H100 its sum combines gave the two launches' results bit for bit, while the online softmax's
    rescaling combine differed in a few elements by one fp16 unit, as many every call, consistent with ptxas
    contracting ``mul.f32`` and ``add.f32`` (no rounding mode) into ``fma`` differently in another kernel),
    then sets the counter back to zero for the next launch (every block of the group has counted by then). Its
    parameters: the counter buffer, then every member's operands in order, then every member's outputs (as
    :func:`_merged_kernel`'s). ``pdl`` as :func:`kernel_source`'s."""
    (_, si), (_, ci) = made
    gs, gc = grids
    params, signature, calls = _member_params(made, {"ctr_ptr": "*i32", "ctr_s0": "i32"})
    out = ["@triton.jit", f"def {name}(" + ", ".join(params) + "):",
           f'    """Kernel {si.name}, then kernel {ci.name} in the last block of each group to finish: '
           f'{plan.groups} group(s) of {plan.count} blocks, {plan.tiles} combine block(s) each."""']
    if pdl:
        out += _gdc_head(pdl)
    lead = [f"tl.program_id({j})" if j < len(si.grid) and si.grid[j] > 1 else "0" for j in range(3)]
    out.append(f"    {si.name}({', '.join(lead)}, {', '.join(calls[0])})")
    pid = {a: lead[si.launch_axes[a]] for a in range(len(gs))}
    group, stride = [], 1
    for a, _b, _r in reversed(plan.matched):
        group.append(f"{pid[a]} * {stride}" if stride > 1 else pid[a])
        stride *= gs[a]
    cnt = f"ctr_ptr + {offset}" + "".join(f" + {t}" for t in reversed(group))
    out += ["    tl.debug_barrier()  # (every thread's stores before the release)",
            f"    arrived = tl.atomic_add({cnt}, 1, sem=\"acq_rel\", scope=\"gpu\")",
            f"    if arrived == {plan.count - 1}:  # the last of its group: every partial is written and visible"]
    per = {b: (a, r) for a, b, r in plan.matched}
    ext = [per[b][1] if b in per else g for b, g in enumerate(gc)]
    ind = "        "
    if plan.tiles > 1:
        out.append(f"        for j in range(0, {plan.tiles}):")
        ind += "    "
    cpid = ["0", "0", "0"]
    step = 1
    for b in reversed(range(len(gc))):  # (the last axis fastest, as the interpreter and CUDA walk a grid)
        if gc[b] == 1:
            continue
        j = "0" if plan.tiles == 1 else (f"(j // {step}) % {ext[b]}" if step > 1 else f"j % {ext[b]}")
        step *= ext[b]
        if b in per:
            a, r = per[b]
            j = f"{pid[a]} * {r} + {j}" if r > 1 else pid[a]
        cpid[ci.launch_axes[b]] = j
    out.append(f"{ind}{ci.name}({', '.join(cpid)}, {', '.join(calls[1])})")
    out.append(f"        tl.atomic_xchg({cnt}, 0, sem=\"relaxed\", scope=\"gpu\")  # (for the next launch)")
    if pdl == "end":
        out.append("    gdc_launch_dependents()")
    dots = [i.row_dots_only for i in (si, ci) if i.uses_dot]
    return "\n".join(out) + "\n", KernelInfo(name, unit[0], si.grid, signature, bool(dots), bool(dots) and all(dots),
                                              tuple(unit), si.launch_axes, (plan, offset))


def generate(program: Any, tiles: TileOptions | None = None,
             tiles_for: Callable[[BlockGraph, Sequence[TensorType]], TileOptions] | None = None,
             pdl: str = "", merge: bool = False,
             merge_key: Callable[[BlockGraph, Sequence[TensorType]], Any] | None = None,
             last_block: bool = False, persistent: bool = False, tile_waits: bool = False,
             merge_fits: Callable[[Sequence[tuple[BlockGraph, Sequence[TensorType], Sequence[DType]]]], bool]
             | None = None) -> ModuleSource:
    """The generated module for a Graph, MuGraph or Candidate (kernel-level ops wrapped first).

    ``tiles_for(block_graph, arg_types)``, if given, chooses each kernel's tile options (else ``tiles``).
    ``pdl`` ("start", "end" or "auto"; "" off): kernels for programmatic dependent launch (Hopper and later; not in
    Triton's interpreter): each kernel first waits for the kernel before it in the stream to complete
    (``griddepcontrol.wait``, before any memory access: the same ordering as a plain launch) and lets the next one
    launch (``launch_dependents``) at its start or after its stores, so in a CUDA graph a kernel's blocks are placed
    while its predecessor still runs; launched with ``launch_pdl=True`` (:attr:`ModuleSource.pdl`). Measured on an H100
    (benchmarks/perf/NOTES.md session 13): "start" made the layer's bs8 9.8 us faster and its bs1 26.5 us slower.
    "auto": "start" where the next kernel has at most ``PDL_EARLY_MAX_BLOCKS`` blocks or this one at most
    ``PDL_EARLY_OWN_MAX_BLOCKS``, else "end"; and "pre" (``launch_dependents`` before the kernel's own wait) where
    the next kernel, which must then read nothing but the program's inputs and this kernel's results, runs its
    for-loop before its wait. In every mode a launch after the program's first waits only before the first statement
    that stores or reads a tensor other than the program's inputs, where that is after its for-loop
    (:attr:`KernelInfo.early_loop`; a loop-invariant term the loop does not read moves after the loop for it): the
    first launch waits before it lets the next launch, so when a later one starts, every kernel before the program
    has completed and only the program's own kernels, which write only their own buffers, may still run. H100,
    inputs rotated: lora_scaled's three-kernel design 17.7 -> 17.0 us (benchmarks/perf/NOTES.md session 15m).
    With ``pdl``, each kernel (not a flat one, not a last-block launch) first prefetches into L2 its first tiles of
    the program's inputs (:data:`PDL_PREFETCH_BYTES`), which need not wait: no kernel writes them.
    ``merge``: the kernels that read nothing another writes run as one launch (:func:`_launch_units`,
    :func:`_merged_kernel`): the same kernels on the same blocks, in a topological order of the μGraph; a merged
    launch's :class:`KernelInfo` names its kernels' nodes (``members``); ``merge_key`` keeps kernels of different
    keys apart (the runtime's: the warps :func:`verimirage.backend.tuning.recommend` gives them); ``merge_fits`` (of
    the kernels' block graphs, operand types and operands' element types in memory) whether one launch may hold
    them (the runtime's: :func:`verimirage.backend.tuning.merge_fits`, their shared memory together at the launch's
    stages).
    ``last_block``: each split kernel whose combine kernel reads only its partials and what earlier launches wrote
    runs with it as one launch, the combine in the last block of each group to finish (:func:`last_block_plan`,
    :func:`_last_block_kernel`): the same kernels' code, the combine's blocks run by the split kernel's last blocks;
    its :class:`KernelInfo` names both nodes (``members``) and its plan (``last_block``). Such launches take the
    program's counter buffer (``("ctr", n)``, :attr:`ModuleSource.counters`) first.
    ``persistent``: every kernel of the program (views aside) runs as tasks of *one* persistent launch
    (:func:`_persistent_kernel`): the kernels in the merged launches' topological order, dependencies tracked by
    completion counters in the program's counter buffer (taken first, as a last-block launch takes it); ``pdl``,
    ``merge``, ``merge_key`` and ``last_block`` do not apply. ``forward`` launches it on ``GRID[name]`` blocks (one
    unless the runtime sets more: never more than can be co-resident,
    :func:`verimirage.backend.runtime.persistent_grid`).
    ``tile_waits`` (with ``persistent``): a kernel waits only for the blocks of a kernel it reads whose results its
    block reads (:func:`_tile_deps`, from the block graphs' maps), not for the whole kernel.
    """
    mg0 = _as_mugraph(program)
    mg = to_kernels(mg0)
    nodes = node_list(mg)
    for n in nodes:  # (the kernels index in int32: pid * tile * stride wrapped past 2**31, reading other memory)
        if any(math.prod(t.shape) >= INT32_INDEX for t in n.outs) and not OPS[n.op].has(Prop.CONSTANT):
            raise GraphError(f"codegen: a tensor of {max(math.prod(t.shape) for t in n.outs)} elements "
                             f"({n.op}); the kernels index in int32, expected fewer than 2**31 elements")
    names = mg.input_names()
    var: dict[tuple[int, int], str] = {}
    ref_of: dict[tuple[int, int], ValueRef] = {}
    steps: list[LaunchStep] = []
    views: list[tuple[ValueRef, tuple[int, ...]]] = []
    kernels: list[KernelInfo] = []
    ksrc: list[str] = []
    body: list[str] = []
    dev = names[0]
    # Values passed from one kernel to another (partial sums, running maxima, ...) are kept in fp32
    # in device memory, whatever the IR's dtype: the float64 semantics are the same, and fp16 partials
    # lose precision (or overflow) between a split reduction and its combine kernel. (Except a value every
    # reader only casts to its dtype for tl.dot: stored in that dtype, the same operand bits; DOT_OPERAND_STORAGE.)
    final = set(output_refs(mg))

    def store_dtype(ref: tuple[int, int]) -> DType:
        return storage_dtype(nodes, final, ref)

    view_nodes = _view_nodes(nodes, final)
    if persistent:
        pdl, merge_key, last_block = "", None, False
    def fits(ids: Sequence[int]) -> bool:
        assert merge_fits is not None
        return merge_fits([(nodes[j].attr("block"), [nodes[a].outs[k] for a, k in nodes[j].args],
                            [store_dtype(r) for r in nodes[j].args]) for j in ids])

    units = _launch_units(nodes, view_nodes, merge or persistent, merge_key,
                          fits if merge_fits is not None and not persistent else None)
    pending_views: list[list[int]] = []
    if persistent and any(u[0] not in view_nodes for u in units):
        # one unit of every kernel, in level order; the views after its buffers are allocated
        pending_views = [u for u in units if u[0] in view_nodes]
        units = [[i for u in units if u[0] not in view_nodes for i in u]]

    def base_kernel(r: tuple[int, int]) -> int | None:
        # the kernel whose buffer value ``r`` lives in (through views); None for an input or constant
        while r[0] in view_nodes:
            r = nodes[r[0]].args[0]
        return r[0] if nodes[r[0]].op == "custom" else None

    def emit_view(i: int, n: Node) -> None:
        shape = tuple(n.outs[0].shape)
        ref_of[(i, 0)] = ("view", len(views))
        views.append((ref_of[n.args[0]], shape))
        var[(i, 0)] = f"t{i}_0"
        body.append(f"t{i}_0 = {var[n.args[0]]}.view({_shape_text(shape)})")

    plans: dict[int, LastBlock] = {}
    if last_block:
        units, plans = _last_block_units(nodes, units, view_nodes, _emitted_flat(nodes, tiles, tiles_for))
    elif pdl == "auto" and PDL_LASTBLOCK_BEFORE_EARLY_LOOP:
        # a split kernel and its combine as one launch where the launch after the combine streams its for-loop
        # over the program's inputs before its wait: that stream then starts one launch hop sooner
        units, plans = _last_block_units(nodes, units, view_nodes, _emitted_flat(nodes, tiles, tiles_for),
                                         keep=lambda s, c: _loops_early_after(nodes, units, view_nodes, c,
                                                                              tiles, tiles_for, store_dtype))
    offsets: dict[int, int] = {}  # (each last-block launch's counters: a range of the program's counter buffer)
    n_ctr = 0
    for s_node in sorted(plans):
        offsets[s_node] = n_ctr
        n_ctr += plans[s_node].groups
    if persistent and units and units[0][0] not in view_nodes:  # (its counters: one a kernel, one for the blocks)
        offsets[units[0][0]] = n_ctr
        n_ctr += len(units[0]) + 1
    launched = [u for u in units if u[0] not in view_nodes]
    next_blocks = {a[0]: sum(nodes[j].attr("block").num_blocks for j in (b[:1] if b[0] in plans else b))
                   for a, b in itertools.pairwise(launched)}
    next_unit = {a[0]: b for a, b in itertools.pairwise(launched)}

    def plain(u: list[int]) -> bool:  # a kernel launched on its own (not merged, last-block or persistent)
        return len(u) == 1 and u[0] not in plans and not persistent

    def early_args(j: int) -> frozenset[int]:
        # PDL: the operands kernel j may read before its wait. Every launch but the program's first waits before it
        # lets the next one launch ("pre" is never the first's), so when a later launch starts, every kernel before
        # the program has completed and only the program's own kernels, which write only their own buffers, may
        # still run: the program's inputs are final.
        if not pdl or not launched or j == launched[0][0]:
            return frozenset()
        return frozenset(q for q, (a, _) in enumerate(nodes[j].args) if nodes[a].op == "input")

    def member(unit: list[int], j: int, mode: str, early: bool) -> tuple[str, KernelInfo]:
        # kernel j of launch ``unit`` in PDL ``mode`` (``early``: the launch before lets it launch at its start)
        nj = nodes[j]
        bg: BlockGraph = nj.attr("block")
        arg_types = [nodes[a].outs[k] for a, k in nj.args]
        i = unit[0]
        first_wave = bool(launched) and i == launched[0][0] and (bg.num_blocks <= PDL_PREFETCH_FIRST_MAX_BLOCKS or (
            PDL_PREFETCH_FIRST_START and mode == "start" and bg.frange == 1))
        pf = frozenset(q for q, (a, _) in enumerate(nj.args) if nodes[a].op == "input") \
            if pdl and PDL_PREFETCH_BYTES and i not in plans and (early or not PDL_PREFETCH_EARLY_ONLY or first_wave) \
            else frozenset()
        return kernel_source(bg, arg_types, f"k{j}", tiles_for(bg, arg_types) if tiles_for else tiles,
                             [store_dtype(r) for r in nj.args], [store_dtype((j, k)) for k in range(len(nj.outs))],
                             _inline_masks(nodes, nj), mode, device_fn=len(unit) > 1 or persistent, prefetch=pf,
                             early_args=early_args(j) if plain(unit) else frozenset(), out_types=nj.outs)

    def next_loops_early(i: int) -> bool:
        # "auto": whether the launch after launch ``i`` is a kernel of its own that streams its for-loop (over the
        # program's inputs) before its wait
        nxt = next_unit.get(i)
        if nxt is None or not plain(nxt):
            return False
        info = member(nxt, nxt[0], "end", True)[1]
        return info.early_loop or info.early_loads

    def pre_pays(unit: list[int]) -> bool:
        # "auto": a launch (a kernel of its own or a last-block launch, not the program's first) lets the next one
        # launch before its own wait where that one streams its for-loop before its wait and reads nothing but the
        # program's inputs and this launch's results (never what a launch before this one wrote, which may still
        # run then)
        i = unit[0]
        if not (plain(unit) or i in plans) or i == launched[0][0] or not next_loops_early(i):
            return False
        return all(base_kernel(r) in (None, *unit) for r in nodes[next_unit[i][0]].args)

    for i, n in enumerate(nodes):
        if n.op == "input":
            var[(i, 0)] = n.attr("name")
            ref_of[(i, 0)] = ("in", names.index(n.attr("name")))
        elif OPS[n.op].has(Prop.CONSTANT):
            _check_inline_mask(mg, i)
    early = False  # (whether the launch before this one lets it launch at its start: pdl "start")
    for unit in units:
        i = unit[0]
        n = nodes[i]
        if i in view_nodes:  # a row-major reshape of a buffer this program wrote (contiguous): its memory, reshaped
            emit_view(i, n)
            continue
        mode = pdl
        if pdl == "auto":  # early only where the next kernel's blocks are few (where they land matters little), or
            nb = next_blocks.get(i)  # where this one's are (None: the last launch, which has no next kernel)
            own = sum(nodes[j].attr("block").num_blocks for j in (unit[:1] if i in plans else unit))
            mode = "start" if nb is not None and (nb <= PDL_EARLY_MAX_BLOCKS or own <= PDL_EARLY_OWN_MAX_BLOCKS) \
                else "end"
            if pre_pays(unit):  # or "pre", where the next kernel's loop can start at once
                mode = "pre"
            elif mode == "end" and PDL_START_BEFORE_EARLY_LOOP and next_loops_early(i):
                mode = "start"  # (or once this launch has waited: the program's first, or one whose next reads more)
        made = [member(unit, j, mode, early) for j in unit]
        early = mode in ("start", "pre")
        if persistent:
            kname = "kp"
            deps = {j: [k for k in (base_kernel(r) for r in nodes[j].args) if k is not None] for j in unit}
            tile_deps: dict[int, list[tuple[int, tuple[BoxAxis, ...]]]] = {}
            if tile_waits:
                tile_deps = _tile_deps(nodes, unit, made, view_nodes)
                deps = {j: [k for k in ks if k not in {p for p, _ in tile_deps.get(j, ())}] for j, ks in deps.items()}
                n_ctr += sum(math.prod(made[unit.index(p)][1].grid) for p in {p for v in tile_deps.values()
                                                                             for p, _ in v})
            src, info = _persistent_kernel(kname, unit, made, deps, offsets[i], tile_deps)
            ksrc.extend(_noinline(s_) for s_, _ in made)
        elif i in plans:
            kname = f"k{i}_{unit[1]}"
            src, info = _last_block_kernel(kname, unit, made, plans[i], offsets[i],
                                           [nodes[j].attr("block").grid for j in unit], mode)
            ksrc.extend(s_ for s_, _ in made)
        elif len(unit) == 1:
            src, info = made[0]
            kname = f"k{i}"
            info = KernelInfo(kname, i, info.grid, info.signature, info.uses_dot, info.row_dots_only)
        else:
            kname = "k" + "_".join(str(j) for j in unit)
            src, info = _merged_kernel(kname, unit, made, mode)
            ksrc.extend(s for s, _ in made)
        kernels.append(info)
        ksrc.append(src)
        bufs: list[tuple[int, tuple[int, ...], str]] = []
        call: list[str] = []
        passed_refs: list[tuple[ValueRef, int]] = []
        base = sum(len(st.outs) for st in steps)
        for j in unit:  # every member's outputs, allocated
            nj = nodes[j]
            for k, t in enumerate(nj.outs):
                v = f"t{j}_{k}"
                var[(j, k)] = v
                tdt = _TORCH_DTYPE[store_dtype((j, k))]
                body.append(f"{v} = torch.empty({_shape_text(t.shape)}, device={dev}.device, dtype={tdt})")
                ref_of[(j, k)] = ("buf", base + len(bufs))
                bufs.append((ref_of[(j, k)][1], tuple(t.shape), tdt.removeprefix("torch.")))
        for pv in pending_views:  # (persistent: every buffer allocated, the views of them)
            emit_view(pv[0], nodes[pv[0]])
        out_call: list[str] = []
        if i in plans or persistent:  # (a last-block-combines launch or a persistent kernel: the counters first)
            call += ["ctr", "ctr.stride(0)"]
            passed_refs.append((("ctr", n_ctr), 1))
        for j in unit:  # the launch's arguments: every member's operands, then every member's outputs
            nj = nodes[j]
            inline = _inline_masks(nodes, nj)
            passed = [r for q, r in enumerate(nj.args) if q not in inline]
            passed_refs += [(ref_of[r], nodes[r[0]].outs[r[1]].rank) for r in passed]
            for a, k in passed:
                x = var[(a, k)]
                call.append(x)
                call += [f"{x}.stride({d})" for d in range(nodes[a].outs[k].rank)]
            for k, t in enumerate(nj.outs):
                out_call.append(var[(j, k)])
                out_call += [f"{var[(j, k)]}.stride({d})" for d in range(t.rank)]
        call += out_call
        steps.append(LaunchStep(kname, info.grid, tuple(passed_refs), tuple(bufs)))
        grid = f"GRID[{kname!r}]" if persistent else _shape_text(info.grid)
        body.append(f"{kname}[{grid}]({', '.join(call)}, **LAUNCH[{kname!r}])")
    rets = [var[r] for r in output_refs(mg)]
    header = [
        f'"""Generated by verimirage (codegen {CODEGEN_VERSION}); do not edit.',
        "",
        "The μGraph it implements:",
        "",
        *("    " + line for line in str(mg0).splitlines()),
        '"""',
        "",
        "import torch",
        "import triton",
        "import triton.language as tl",
        *(["from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"] if pdl else []),
        "",
        "",
    ]
    for h in ("max", "min"):  # the max/min reductions' combines: NaN propagates, as in ATen (tl.max/tl.min drop it)
        if any(f"_{h}_nan" in k for k in ksrc):
            header += ["@triton.jit", f"def _{h}_nan(a, b):",
                       f"    return tl.{h}imum(a, b, propagate_nan=tl.PropagateNan.ALL)", "", ""]
    if any("_vm_prefetch(" in k for k in ksrc):  # (one L2 prefetch an element: no value, no fault, no wait)
        header += ["@triton.jit", "def _vm_prefetch(p):",
                   '    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [p], dtype=tl.int32, '
                   "is_pure=False, pack=1)", "", ""]
    for h, text in HELPERS.items():  # the lowerings' helpers (tanh, softplus) where a kernel calls them
        if any(f"{h}(" in k for k in ksrc):
            header += [*text.rstrip("\n").splitlines(), "", ""]
    if n_ctr:  # the last-block and persistent launches' counters: one zeroed buffer per device and stream, kept
        header += [*_COUNTERS_HELPER.splitlines(), "", ""]
    launch = ["# launch parameters per kernel (the runtime may override them)", "LAUNCH = {"]
    launch += [f"    {k.name!r}: {{'num_warps': 4, 'num_stages': 2}}," for k in kernels]
    launch.append("}")
    if persistent and kernels:
        launch += ["", "# persistent kernels' grids: one block unless the runtime sets as many as can be co-resident",
                   "GRID = {" + ", ".join(f"{k.name!r}: (1,)" for k in kernels if k.persistent) + "}"]
    launch += ["", "# argument types per kernel (ahead-of-time compilation, e.g. the sm_90 check)", "SIGNATURES = {"]
    launch += [f"    {k.name!r}: {k.signature!r}," for k in kernels]
    launch.append("}")
    fwd = [f"def forward({', '.join(names)}):", '    """Run the kernels in order; returns the outputs."""']
    if n_ctr:
        fwd.append(f"    ctr = _vm_counters({dev}.device, {n_ctr}, reset=True)")
    fwd += ["    " + line for line in body]
    fwd.append(f"    return ({', '.join(rets)},)")
    source = "\n".join(header) + "\n\n".join(ksrc) + "\n\n" + "\n".join(launch) + "\n\n\n" + "\n".join(fwd) + "\n"
    out_types = tuple(mg.type_of(r) for r in output_refs(mg))
    return ModuleSource(source, tuple(kernels), mg, tuple(names), out_types, tuple(steps),
                        tuple(ref_of[r] for r in output_refs(mg)), tuple(views), pdl, n_ctr)
