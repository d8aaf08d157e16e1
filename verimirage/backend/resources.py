"""Hardware limits of the target GPU and the shared memory a generated kernel asks for.

Triton refuses to launch a kernel whose shared memory exceeds the device's opt-in limit per block
(``OutOfResources: shared memory, Required: 270336, Hardware limit: 232448`` on an H100). The tile sizes
of a kernel are fixed by its block graph; what the backend chooses is the launch configuration: pipeline
stages (Triton keeps ``num_stages - 1`` copies of every tile a pipelined loop loads) and the row padding
of ``tl.dot`` operands (``TileOptions.dot_min_m``: 64 for wgmma, 16 for mma.sync). :func:`smem_estimate`
is an upper bound of what Triton 3.6 allocates (checked against ``triton.compile(...).metadata.shared``
for sm_90 in ``tests/test_resources.py``) and :func:`fit` shrinks a configuration until the estimate is
within :attr:`Target.smem_per_block`: stages first, then the row padding.

Pure Python: no GPU, no torch, no triton needed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..ir.dtypes import DType
from ..ir.graph import BlockGraph, live_nodes
from ..ir.ops import LOOP_OPS, OPS, Prop, TensorType
from .codegen import LaunchConfig, TileOptions, _KernelGen

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """Per-block resource limits of one GPU architecture."""

    name: str
    arch: int  # compute capability as an int (90 = sm_90)
    #: shared memory one block may opt in to (bytes): what Triton checks at launch
    smem_per_block: int
    smem_per_sm: int
    regs_per_sm: int  # 32-bit registers per SM
    regs_per_thread: int  # the most one thread may use
    sms: int


#: NVIDIA H100 / H200 (sm_90): 227 KB of shared memory per block (232,448 bytes), 64 K registers per SM.
SM90 = Target("H100/H200 (sm_90)", 90, 232448, 233472, 65536, 255, 132)


class ResourceError(ValueError):
    """A kernel does not fit the target's shared memory under any configuration the backend can choose."""


def _dot_nodes(bg: BlockGraph, live: set[int]) -> list[int]:
    out = []
    for i, n in enumerate(bg.nodes):
        if i not in live or not OPS[n.op].has(Prop.CONTRACTION):
            continue
        a = bg.nodes[n.args[0][0]].outs[n.args[0][1]]
        b = bg.nodes[n.args[1][0]].outs[n.args[1][1]]
        if a.shape[-2] > 1 and a.shape[-1] > 1 and b.shape[-1] > 1:  # codegen emits tl.dot (else a broadcast sum)
            out.append(i)
    return out


def _wgmma(bg: BlockGraph, kg: _KernelGen, i: int, config: LaunchConfig) -> bool:
    """Whether Triton 3.6 lowers ``tl.dot`` node ``i`` to wgmma on sm_90 (asynchronous, operands read from shared
    memory): a rank-2 product (batched dots use mma.sync) of at least 64 padded rows on a multiple of 4 warps, of
    16-bit operands or fp32 ones at tf32 (fp32 at "ieee" precision is computed without tensor cores: a 64-row fp32
    product compiled to neither wgmma nor mma.sync on sm_90)."""
    n = bg.nodes[i]
    out = kg.padded((i, 0), n.outs[0])
    if math.prod(out[:-2]) > 1 or out[-2] < 64 or config.num_warps % 4:
        return False
    dt = bg.nodes[n.args[0][0]].outs[n.args[0][1]].dtype
    return not (dt.itemsize == 4 and config.tiles.fp32_precision == "ieee")


def smem_estimate(bg: BlockGraph, arg_types: Sequence[TensorType], config: LaunchConfig,
                  arg_store: Sequence[DType] | None = None) -> int:
    """Bytes of shared memory the kernel of ``bg`` (on operands ``arg_types``) needs under ``config``.

    For the K loops of 64 x 4096 x 4096 products (fp16 / bf16, 8 / 16 / 64 / 128 rows, 64 / 128 columns, 64 / 128
    deep, wgmma and mma.sync, a row operand read from an fp32 buffer) at 2 to 4 stages this is Triton's allocation
    exactly (sm_90 compiles, 2026-11-27, ``tests/test_resources.py``, the data in
    ``benchmarks/results/smem_sm90_2026-11-27.json``); at one stage an fp32 buffer's operand is counted in fp32, at
    most twice Triton's. Over the 254 distinct pipelined products of the committed candidates at
    ``tuning.recommend``'s configurations it is never below Triton's allocation (87 equal). Not exact: a row
    operand the loop also sums takes ``num_stages - 1`` buffers under wgmma (one fewer than estimated); decode_gqa's
    split kernel (rank-3 tiles reshaped for the dot, its row operand summed) took 65,536 + 131,072 bytes a stage past
    the first: 196,608 at 2 stages as estimated, 327,680 / 458,752 at 3 / 4 against 294,912 / 393,216 (over the
    limit either way for that kernel; smaller tiles of that form may be estimated below Triton's: the runtime's
    retry after OutOfResources then takes a stage off).

    ``arg_store``: the element types the operands have in device memory where they differ from the IR's
    (:func:`arg_storage`: a kernel's result that another kernel reads is kept in fp32, unless it reads it only as a
    ``tl.dot`` operand); None: the IR's.

    An upper bound of Triton 3.6's allocation on sm_90, summed from:

    * tiles a for-loop with a ``tl.dot`` loads each iteration (the pipeliner buffers every load of such a
      loop, in its element type in memory): padded tile bytes x ``max(1, num_stages - 1)``, and ``num_stages``
      buffers of a tile a wgmma reads straight from the pipeline (:func:`_wgmma`; the asynchronous wgmma still
      reads one buffer while the next load fills another). Where the element type in memory is not the ``tl.dot``
      operand's (an fp32 buffer read as fp16), the converted column operand is stored again for the dot (the
      H200's training run of 2026-11-26: a 64 x 64 x 8-stage product of two fp32 buffers, 237,568 bytes: seven
      stages of fp32 buffers and the fp16 column tile); a converted row operand goes to the dot from registers;
    * ``tl.dot`` operands otherwise (loop-invariant loads, computed values): their padded bytes once, in the
      operand dtype, in fp32 where an fp32 buffer is read unpipelined (wgmma reads operands from shared memory;
      mma.sync converts layouts through it), all counted as live at once (Triton reuses the memory of dead
      operands, so this is often far above).

    Layout-conversion and reduction scratch is not counted: Triton places it in memory the operands or
    pipeline buffers free (measured on the suite's kernels, see the test).

    ``config.tuned`` is not resolved here: pass the concrete configuration (``tuning.recommend``'s).
    """
    kg = _KernelGen(bg, arg_types, bg.result_types(arg_types), "k", config.tiles)
    for i in range(len(bg.nodes)):
        kg._unify_node(lambda a, k: (a, k), bg.nodes, i)
    kg._finish_classes()
    live = live_nodes(bg.nodes, bg.outputs)
    dots = _dot_nodes(bg, live)
    looped = bg.frange > 1
    varying: list[bool] = []
    for n in bg.nodes:
        if n.op == "input":
            varying.append(looped and n.attr("fmap") is not None)
        else:
            varying.append(n.op in LOOP_OPS or any(varying[a] for a, _ in n.args))
    pipelined = looped and bool(dots) and config.num_stages > 1
    buffers = max(1, config.num_stages - 1)

    def nbytes(i: int, k: int = 0, itemsize: int | None = None) -> int:
        t = bg.nodes[i].outs[k]
        return math.prod(kg.padded((i, k), t)) * (itemsize or t.dtype.itemsize)

    def stored(i: int) -> int:  # the element size an input node's tile has in device memory
        n = bg.nodes[i]
        if arg_store is None or n.op != "input":
            return n.outs[0].dtype.itemsize
        return arg_store[int(n.attr("arg"))].itemsize

    wgmma = {i for i in dots if _wgmma(bg, kg, i, config)}
    # a pipelined tile a wgmma reads straight from the pipeline's buffer (its element type in memory is the operand's)
    # takes one buffer more: the asynchronous wgmma still reads a stage while the next load fills another (a 64 x
    # 4096 x 4096 fp16 product of 64 x 64 tiles on sm_90: 32,768 / 49,152 / 65,536 bytes at 2 / 3 / 4 stages, where
    # mma.sync at 16 rows keeps num_stages - 1)
    direct = {a for i in wgmma for a, _ in bg.nodes[i].args[:2] if bg.nodes[a].op == "input"
              and stored(a) == bg.nodes[a].outs[0].dtype.itemsize}
    total = 0
    counted: set[int] = set()
    if pipelined:
        for i, n in enumerate(bg.nodes):
            if i in live and n.op == "input" and varying[i]:
                total += nbytes(i, itemsize=stored(i)) * (config.num_stages if i in direct else buffers)
                counted.add(i)
    converted = {a for a in range(len(bg.nodes)) if bg.nodes[a].op == "input"
                 and stored(a) != bg.nodes[a].outs[0].dtype.itemsize}
    for i in dots:
        n = bg.nodes[i]
        itemsize = bg.nodes[n.args[0][0]].outs[n.args[0][1]].dtype.itemsize
        batch = math.prod(kg.padded((i, 0), n.outs[0])[:-2])
        for side, (a, k) in enumerate(n.args[:2]):
            if a in counted and not (side == 1 and a in converted):
                # a pipelined operand: read from its buffers (or, the row operand converted from an fp32 buffer,
                # from registers: a 64 x 64 fp32 row tile beside 64 x 64 fp16 weights took 32,768 / 57,344 /
                # 81,920 bytes at 2 / 3 / 4 stages on sm_90, the buffers and the weights' wgmma buffer alone)
                continue
            # the column operand converted from a pipelined fp32 buffer is stored again in the operand type for the
            # dot (a 128 x 256 fp16 tile beside a 256 x 32 fp32 buffer took 278,528 bytes at 3 stages: the buffers'
            # 196,608, the fp16 tile's wgmma buffer 65,536 and the converted 256 x 32 fp16 copy 16,384); an operand
            # converted from fp32 outside a pipeline passes through shared memory in fp32 (a 128 x 64 fp32 row tile
            # beside 64 x 64 fp16 weights took 32,768 bytes at one stage)
            size = stored(a) if a in converted and a not in counted else itemsize
            counted.add(a)
            shape = kg.padded((a, k), bg.nodes[a].outs[k])
            total += batch // max(1, math.prod(shape[:-2])) * math.prod(shape) * size
    return total


def fit(bg: BlockGraph, arg_types: Sequence[TensorType], config: LaunchConfig,
        target: Target = SM90, arg_store: Sequence[DType] | None = None, keep_tiles: bool = False) -> LaunchConfig:
    """``config``, or the nearest configuration whose :func:`smem_estimate` is within ``target``'s limit
    (``arg_store``: the operands' element types in device memory, see :func:`smem_estimate`).

    Shrinks the pipeline stages first (down to 1: no software pipelining), then pads ``tl.dot`` rows to 16
    instead of 64 (mma.sync instead of wgmma). Raises :class:`ResourceError` when even that does not fit:
    the block graph's tiles themselves are too large (the cost model ranks such candidates infeasible).

    ``keep_tiles``: ``config``'s tile options are fixed (the generated code a certificate's digest vouches for):
    only the stages shrink, and where no number of them fits the estimate, one stage is returned (the least
    these tiles can take; the estimate is an upper bound, Triton has the last word) instead of an error.
    """
    if config.tuned:
        raise ValueError("resources.fit: resolve a tuned configuration first (tuning.recommend)")
    limit = target.smem_per_block
    c = config
    need = smem_estimate(bg, arg_types, c, arg_store)
    if need <= limit:
        return c
    tries: list[LaunchConfig] = [replace(c, num_stages=s) for s in range(c.num_stages - 1, 0, -1)]
    if keep_tiles:
        t = next((t for t in tries if smem_estimate(bg, arg_types, t, arg_store) <= limit), replace(c, num_stages=1))
        log.info("resources: kernel needs %d B of shared memory under %s (limit %d on %s); its tiles kept, %d "
                 "pipeline stage(s)", need, c.key(), limit, target.name, t.num_stages)
        return t
    if c.tiles.dot_min_m > 16:
        small = replace(c.tiles, dot_min_m=16)
        tries += [replace(c, num_stages=s, tiles=small) for s in range(c.num_stages, 0, -1)]
    for t in tries:
        n = smem_estimate(bg, arg_types, t, arg_store)
        if n <= limit:
            log.info("resources: kernel needs %d B of shared memory under %s (limit %d on %s); using %s (%d B)",
                     need, c.key(), limit, target.name, t.key(), n)
            return t
    least = min_smem(bg, arg_types)
    raise ResourceError(f"a kernel of grid {bg.grid} needs at least {least} bytes of shared memory (one stage, "
                        f"16-row dot padding); {target.name} allows {limit} per block: its tiles are too large")


def _quick_bound(bg: BlockGraph) -> int:
    """A cheap upper bound of :func:`min_smem` (no dim unification): every input and ``tl.dot`` operand once,
    each dim padded to a power of two (at least 16 for the last two), operands broadcast to the dot's batch."""
    def padded(t: TensorType) -> int:
        r = t.rank
        return math.prod(1 if n == 1 else max(16 if ax >= r - 2 else 1, 1 << (n - 1).bit_length())
                         for ax, n in enumerate(t.shape))

    total = sum(padded(n.outs[0]) * n.outs[0].dtype.itemsize for n in bg.nodes if n.op == "input")
    for n in bg.nodes:
        if OPS[n.op].has(Prop.CONTRACTION):
            out = n.outs[0]
            batch = math.prod(1 << (d - 1).bit_length() for d in out.shape[:-2])
            for a, k in n.args[:2]:
                t = bg.nodes[a].outs[k]
                total += batch * padded(TensorType(t.shape[-2:], t.dtype)) * t.dtype.itemsize
    return total


def min_smem(bg: BlockGraph, arg_types: Sequence[TensorType], limit: int | None = None) -> int:
    """The least :func:`smem_estimate` over the configurations :func:`fit` may choose. With ``limit``, a
    cheap bound is returned instead when that bound is within ``limit`` (the cost model's question)."""
    if limit is not None:
        quick = _quick_bound(bg)
        if quick <= limit:
            return quick
    return smem_estimate(bg, arg_types, LaunchConfig(4, 1, TileOptions(dot_min_m=16)))


__all__ = ["SM90", "ResourceError", "Target", "fit", "min_smem", "smem_estimate"]
