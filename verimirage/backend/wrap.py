"""Wrap kernel-level ops into ``custom`` kernels with a default block graph.

After :func:`to_kernels` every non-input node of a μGraph is a ``custom``
kernel, so codegen only ever lowers block graphs. The default block graphs are
plain, literal tilings (they evaluate equal to the op; the tests check it with
``vm.evaluate``):

* elementwise ops and ``transpose``/``concat``: the grid walks the output's dims
  (the last one in tiles of at most :data:`MAX_TILE` elements);
* reductions: the grid walks the kept dims, the for-loop walks the reduced one
  (``loop_sum``/``loop_max`` of per-tile partials; ``mean`` scales the sum);
* ``matmul``: grid (one batch dim, row tiles, column tiles), for-loop over K
  tiles accumulating with ``loop_sum`` (a product of at most :data:`GEMV_MAX_ROWS` rows: narrower, deeper tiles,
  :data:`GEMV_TILE_N`);
* ``rms_norm``: the grid walks the other dims, the normalised dim stays whole;
* ``reshape``: the grid walks the kept dims and splits each merged or split group of dims along its
  leading dim (a leading split of a row-major group is the same contiguous chunk on both sides), so no
  block copies a whole group (GroupNorm's ``(16, 512, 1024) -> (16, 32, 16384)`` in 512 blocks, not 16).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..ir.builders import BlockBuilder, Tensor
from ..ir.errors import GraphError
from ..ir.graph import BlockGraph, Graph, MuGraph, Node, node_list, output_refs
from ..ir.ops import OPS, Prop, TensorType

#: Largest tile extent the default block graphs put on the grid-split last dim.
MAX_TILE = 1024
#: Matmul tile sizes of the default block graphs (largest divisors not above these).
MM_TILE_M = 64
MM_TILE_N = 64
MM_TILE_K = 64
#: Tile sizes of a one-row product's default block graph (``(1, K) @ (K, N)``, no batch: a decode-time GEMV, whose
#: block streams a ``(K, N / GEMV_TILE_N)`` weight slab against one row), as the search's own GEMV designs: 32 columns,
#: 256-deep K steps. Measured on an H100 (benchmarks/results/pdl_prefetch_h100_2026-11-27_0438): the decoder layer's
#: o projection (1, 4096) @ (4096, 4096), a bare matmul in its μGraph, in 64 x 64 tiles of 64-deep steps (64 blocks,
#: 64 steps of 8 KB) against 32-column 256-deep ones: the layer at bs1 195.1 against 197.5 us (64 columns 195.3), with
#: the PDL prefetches 192.1 against 194.4. Again on 2026-11-27 16:18 UTC (benchmarks/results/layer19_h100_2026-11-27/
#: call3_*.json, one process, interleaved), the layer at the code generator's defaults: 64 x 128 tiles 191.2 against
#: 190.8 us at bs1 and 240.2 against 238.6 at bs8, so 32 x 256 stays; 64 x 128 won (-4.8 us at bs1, call2_bs1.json)
#: only with ``codegen.PDL_EARLY_OWN_MAX_BLOCKS`` 64, which is off by default (the models set, run 20)
GEMV_TILE_N = 32
GEMV_TILE_K = 256
#: The most rows a bare product (no batch) may have to take the GEMV tiles above: rows that one 16-row mma.sync tile
#: holds (``tuning.recommend`` pads such products to 16 rows), so its block still streams a ``(K, N / GEMV_TILE_N)``
#: weight slab. The decoder layer's o projection at batch 8, ``(8, 4096) @ (4096, 4096)``, in 64 x 64 tiles of 64-deep
#: steps is 64 blocks (half the H100's SMs) of 64 steps: 15.5 us for 33.6 MB on an H100 (2.2 TB/s,
#: benchmarks/results/layer_h100_2026-11-27_0608, kernel k29), the form the one-row case ran before its GEMV tiles
GEMV_MAX_ROWS = 16


def _blocks_of(n: int, cap: int) -> int:
    """Blocks splitting a dim of ``n`` into tiles of at most ``cap``: whole tiles of a divisor when one is at least a
    quarter of ``cap``, else tiles of ``cap`` with a masked tail (a prime ``n`` took 1-wide tiles: ``n`` blocks, or
    ``n`` one-deep steps of a contraction; the semantics reads the tail zero-padded and crops the result)."""
    t = _divisor_at_most(n, cap)
    return n // t if 4 * t >= min(n, cap) else -(-n // cap)


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is at most ``cap``, preferring powers of two."""
    p = 1
    while p * 2 <= cap and n % (p * 2) == 0:
        p *= 2
    best = max((c for c in range(1, min(n, cap) + 1) if n % c == 0), default=1)
    # a power-of-two tile avoids masks; take it unless it is much smaller than the best divisor
    return p if p * 2 > best else best


def _plan(shape: tuple[int, ...], whole: set[int], max_axes: int = 3, tails: bool = False) -> list[tuple[int, int]]:
    """Grid axes as (dim, blocks): last dim in tiles <= MAX_TILE (``tails``: with a masked tail where no divisor
    makes a tile of a quarter of that, as :func:`_blocks_of`), other dims one block per index."""
    r = len(shape)
    axes: list[tuple[int, int]] = []
    for d in reversed(range(r)):
        if d in whole or shape[d] == 1 or len(axes) == max_axes:
            continue
        if d == r - 1:
            blocks = _blocks_of(shape[d], MAX_TILE) if tails else shape[d] // _divisor_at_most(shape[d], MAX_TILE)
            if blocks > 1:
                axes.append((d, blocks))
        else:
            axes.append((d, shape[d]))
    axes.sort(key=lambda a: -a[1])
    if not axes:
        axes = [(next((d for d in range(r) if d not in whole), 0), 1)]
    return axes


def _operand_imap(t: TensorType, out_rank: int, axes: Sequence[tuple[int, int]], dim_of=None) -> tuple[int | None, ...]:
    """imap of an operand (right-aligned to the output like numpy broadcasting)."""
    lead = out_rank - t.rank
    imap: list[int | None] = []
    for d, blocks in axes:
        od = dim_of(d) if dim_of else d - lead
        if od is None or od < 0 or od >= t.rank or (t.shape[od] == 1 and blocks > 1):
            imap.append(None)
        else:
            imap.append(od)
    return tuple(imap)


def default_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    """The default block graph computing kernel-level ``node`` on operands of ``in_types``."""
    op = node.op
    attrs = node.attr_dict
    out = node.outs[0]
    d = OPS[op]
    r = out.rank
    if d.has(Prop.ELEMENTWISE):
        ew_axes = _plan(out.shape, set(), tails=True)
        b = BlockBuilder([n for _, n in ew_axes], 1)
        xs = [b.input(i, t, _operand_imap(t, r, ew_axes)) for i, t in enumerate(in_types)]
        y = b.apply(op, xs, attrs)
        b.output(y, [dd for dd, _ in ew_axes])
        return b.build()
    if d.reduce is not None:
        return _reduction_block(node, in_types)
    block = d.hooks.get("block")
    if block is None:
        raise GraphError(f"backend: no default block graph for kernel-level op {op!r}")
    return block(node, in_types)  # type: ignore[no-any-return]


def _reduction_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    """A reduction: tiles along the axis combined by the op's loop op (one tile if it has none)."""
    d = OPS[node.op]
    rd = d.reduce
    assert rd is not None
    attrs = node.attr_dict
    out = node.outs[0]
    r = out.rank
    (t,) = in_types
    ax = attrs["axis"]
    axes = _plan(out.shape, {ax})
    n = t.shape[ax]
    # (a masked tail only where zero padding is the combine's identity: a sum's and a mean's partial sums)
    whole = n // _divisor_at_most(n, MAX_TILE)
    frange = 1 if rd.loop is None else _blocks_of(n, MAX_TILE) if rd.identity == 0 else whole
    b = BlockBuilder([k for _, k in axes], frange)
    x = b.input(0, t, _operand_imap(t, r, axes), ax if frange > 1 else None)
    if frange == 1:
        y = b.apply(node.op, [x], {"axis": ax})
    else:
        # partial results of the plain reduction (a mean's division comes after the loop)
        y = b.apply(rd.loop, [b.apply(_plain(node.op), [x], {"axis": ax})])  # type: ignore[arg-type]
        if rd.mean:
            y = b.scale(y, 1.0 / n)
    b.output(y, [dd for dd, _ in axes])
    return b.build()


def _plain(op: str) -> str:
    """The reduction computing a mean's partial sums (a reduction with the same combine, no division)."""
    rd = OPS[op].reduce
    assert rd is not None
    if not rd.mean:
        return op
    for name, o in OPS.items():
        if o.reduce is not None and o.reduce.combine == rd.combine and o.reduce.loop == rd.loop and not o.reduce.mean:
            return name
    raise GraphError(f"backend: no plain reduction for {op!r}")


def _matmul_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    out = node.outs[0]
    r = out.rank
    ta, tb = in_types
    m, n = out.shape[-2], out.shape[-1]
    k = ta.shape[-1]
    axes = []
    batch = [(dd, out.shape[dd]) for dd in range(r - 2) if out.shape[dd] > 1]
    if batch:
        axes.append(max(batch, key=lambda a: a[1]))
    gemv = m <= GEMV_MAX_ROWS and not batch
    bm, bn = _blocks_of(m, MM_TILE_M), _blocks_of(n, GEMV_TILE_N if gemv else MM_TILE_N)
    if bm > 1:
        axes.append((r - 2, bm))
    if bn > 1:
        axes.append((r - 1, bn))
    if not axes:
        axes = [(r - 1, 1)]
    frange = _blocks_of(k, GEMV_TILE_K if gemv else MM_TILE_K)

    def a_dim(od: int) -> int | None:
        return None if od == r - 1 else od - (r - ta.rank)

    def b_dim(od: int) -> int | None:
        return None if od == r - 2 else od - (r - tb.rank)

    bld = BlockBuilder([k_ for _, k_ in axes], frange)
    fa = ta.rank - 1 if frange > 1 else None
    fb = tb.rank - 2 if frange > 1 else None
    xa = bld.input(0, ta, _operand_imap(ta, r, axes, a_dim), fa)
    xb = bld.input(1, tb, _operand_imap(tb, r, axes, b_dim), fb)
    y = bld.apply(node.op, [xa, xb])
    y = bld.loop_sum(y) if frange > 1 else y
    bld.output(y, [dd for dd, _ in axes])
    return bld.build()


def _axis_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    """Ops that keep some dims whole in a tile (rms_norm and concat's axis, a reshape's merged dims, a
    slice's axis): the grid walks the result dims the operands' dims line up with."""
    attrs = node.attr_dict
    out = node.outs[0]
    r = out.rank
    im0 = OPS[node.op].index_map(in_types, attrs, out)
    axes = _plan(out.shape, set(im0.whole_out) | (set(range(r)) - im0.linked()))
    b = BlockBuilder([k for _, k in axes], 1)
    im = OPS[node.op].index_map(in_types, attrs, out)
    xs = []
    for i, t in enumerate(in_types):
        dims = {o: j for a, j, o in im.links if a == i}
        xs.append(b.input(i, t, _operand_imap(t, r, axes, lambda od, dims=dims: dims.get(od))))
    b.output(b.apply(node.op, xs, OPS[node.op].block_attrs(attrs, in_types)), [dd for dd, _ in axes])
    return b.build()


def _group_blocks(a: int, b: int, rest: int) -> int:
    """Blocks splitting a reshape group whose leading dims are ``a`` (operand) and ``b`` (result) and whose
    other dims hold ``rest`` elements: the fewest (a divisor of both leading dims) giving tiles of at most
    :data:`MAX_TILE` x 16 elements, powers of two when both leading dims are."""
    g = math.gcd(a, b)
    pow2 = a & (a - 1) == 0 and b & (b - 1) == 0
    divs = [d for d in range(1, g + 1) if g % d == 0 and (not pow2 or d & (d - 1) == 0)]
    return next((d for d in divs if a * rest // d <= MAX_TILE * 16), divs[-1])


def _reshape_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    """A reshape: kept dims walked as by :func:`_axis_block`; each merged or split group of dims is split
    along its leading operand and result dims into the same number of blocks (each block reshapes one
    contiguous chunk of the group), instead of one block copying whole groups."""
    from ..ir.ops import reshape_groups

    (t,) = in_types
    out = node.outs[0]
    src, new = t.shape, out.shape
    groups = reshape_groups(src, new)
    if all(len(og) == 1 and len(ng) == 1 for og, ng in groups):
        return _axis_block(node, in_types)
    src2, new2 = list(src), list(new)
    cand: list[tuple[int, int, int, bool]] = []  # (result dim, blocks, operand dim, splits a group)
    # a kept last dim stays in every block's tile (up to MAX_TILE of it): a group's chunk is that many times larger
    last = next((ng[0] for og, ng in groups if len(og) == 1 and ng == [len(new) - 1]), None)
    extra = _divisor_at_most(new[last], MAX_TILE) if last is not None else 1
    for og, ng in groups:
        if len(og) == 1 and len(ng) == 1:
            o, i = ng[0], og[0]
            if o == len(new) - 1:
                tile = _divisor_at_most(new[o], MAX_TILE)
                if tile < new[o]:
                    cand.append((o, new[o] // tile, i, False))
            else:
                cand.append((o, new[o], i, False))
            continue
        rest = math.prod(src[d] for d in og[1:]) * extra
        k = _group_blocks(src[og[0]], new[ng[0]], rest)
        if k > 1:
            cand.append((ng[0], k, og[0], True))
    cand.sort(key=lambda c: -c[1])
    axes = cand[:3]
    if not any(grp for *_, grp in axes):
        return _axis_block(node, in_types)
    # the block-level reshape's "full" shapes with each split group's leading dims divided by its blocks:
    # the tile rule then gives the chunk's shapes (kept dims take the operand tile's size)
    for o, k, i, grp in axes:
        if grp:
            src2[i], new2[o] = src[i] // k, new[o] // k
    b = BlockBuilder([k for _, k, _, _ in axes], 1)
    x = b.input(0, t, [i for _, _, i, _ in axes])
    b.output(b.apply("reshape", [x], {"shape": tuple(new2), "src": tuple(src2)}), [o for o, _, _, _ in axes])
    return b.build()


def _transpose_block(node: Node, in_types: Sequence[TensorType]) -> BlockGraph:
    attrs = node.attr_dict
    out = node.outs[0]
    r = out.rank
    a, bb = attrs["a"], attrs["b"]
    axes = _plan(out.shape, set())
    perm = {a: bb, bb: a}
    b = BlockBuilder([k for _, k in axes], 1)
    x = b.input(0, in_types[0], _operand_imap(in_types[0], r, axes, lambda od: perm.get(od, od)))
    b.output(b.apply(node.op, [x], attrs), [dd for dd, _ in axes])
    return b.build()


OPS["matmul"].hooks["block"] = _matmul_block
OPS["rms_norm"].hooks["block"] = _axis_block
OPS["concat"].hooks["block"] = _axis_block
OPS["transpose"].hooks["block"] = _transpose_block
for _name in ("permute", "broadcast_to", "slice"):
    OPS[_name].hooks["block"] = _axis_block
OPS["reshape"].hooks["block"] = _reshape_block


def to_kernels(g: Graph) -> MuGraph:
    """The μGraph equal to ``g`` in which every non-input node is a ``custom`` kernel."""
    nodes = node_list(g)
    mg = MuGraph()
    vals: dict[int, tuple[Tensor, ...]] = {}
    for i, n in enumerate(nodes):
        if n.op == "input":
            t = n.outs[0]
            vals[i] = (mg.input(n.attr("name"), t.shape, t.dtype),)
            continue
        args = [vals[a][k] for a, k in n.args]
        if OPS[n.op].has(Prop.CONSTANT):  # (computed inside the kernels that read it: verimirage.backend.codegen)
            vals[i] = (mg.apply(n.op, [], n.attr_dict),)
        elif n.op == "custom":
            vals[i] = mg.custom(n.attr("block"), args, [t.shape for t in n.outs])  # (as recorded: maybe cropped)
        else:
            bg = default_block(n, [a.type for a in args])
            vals[i] = mg.custom(bg, args, [t.shape for t in n.outs])  # (a masked tail crops the whole tiles)
            if vals[i][0].type != n.outs[0]:  # pragma: no cover - a bug in default_block
                raise GraphError(f"backend: default block graph of {n.op} gives {vals[i][0].type}; want {n.outs[0]}")
    mg.output(*[vals[a][k] for a, k in output_refs(g)])
    return mg
