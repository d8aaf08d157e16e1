"""Partitioning: lowering kernel graphs into μGraphs (the multi-level part of the search).

The lowering is an enumerating, named procedure outside egglog (every result is
re-verified, so it need not be trusted):

1. :func:`analyse` gives every tensor dim an *index label* (union-find over
   dims that must be walked together: elementwise operands, a matmul's
   contraction dims, broadcast batch dims). A label reduced by some op (sum,
   max, matmul contraction) is a *reduction* label; a label that every output
   carries and nothing reduces is *data-parallel*.
2. A :class:`Config` chooses grid axes over data-parallel labels (``partition.grid``),
   an optional for-loop over a reduction label (``partition.loop``) with
   ``frange`` iterations, and optionally a split of that label across an extra
   grid axis plus a combine kernel (``partition.split_kv``, FlashDecoding); where
   the program then uses the complete statistic with the loop label's values again
   (``x - logsumexp(x)``, softmax), the combine kernel's grid walks the split too,
   each block writing its chunk (``partition.split_pass``: few, long rows).
3. :func:`build` emits the block graph(s): loop-body ops on tiles, ``loop_sum``
   for sums and contractions over the loop label, ``running_max`` +
   ``rescaled_sum`` when a max over the loop label is subtracted before ``exp``
   (``partition.online_softmax``, FlashAttention), post-loop epilogues fused
   into a thread graph (``fuse.epilogue``).
4. :func:`cut_lowerings` materialises a computed operand of a contraction (``partition.cut``): the
   program that computes it and the rest (reading it as an input) are lowered on their own and joined,
   so a chain ``up -> act -> down`` becomes two kernels with no recomputation where one kernel would
   recompute the up-projection in every block of the down-projection (or cannot fit at all).

Each applied step is named in the candidate's ``rules``.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.builders import BlockBuilder, Tensor, ThreadBuilder
from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph, node_list, output_refs
from ..ir.opfacts import IndexMap
from ..ir.ops import Prop, TensorType, broadcast_shapes, get_op, reshape_groups
from .lift import Term, graph_terms, term_to_graph

log = logging.getLogger(__name__)


#: the most KV splits a combine kernel reads as one tile (:attr:`Config.combine_whole`)
COMBINE_WHOLE_MAX = 64

#: Names of the lowering steps (recorded in candidates' ``rules`` and accepted by the certificate checker:
#: their output is always re-verified, and tests check every lowering against the float64 reference).
STEPS = (
    "partition.unfused", "partition.grid", "partition.loop", "partition.split_kv", "partition.online_softmax",
    "partition.split_recompute", "partition.combine_grid", "fuse.epilogue", "partition.cut",
    "partition.causal_skip", "partition.components", "partition.prologue_norm_scales", "partition.split_pass",
)


class Place(enum.StrEnum):
    """Where a value of the partitioned program lives relative to the kernel's for-loop."""

    BODY = "body"  # varies with the loop: computed in the loop body
    INV = "inv"  # loop-invariant
    RMAX = "rmax"  # a running max over the loop dim
    POST = "post"  # available after the loop (an accumulated result, or computed from those)
    SHIFT = "shift"  # a loop value minus its running max
    SCALED = "scaled"  # exp of a shifted value (or scaled with it): rescaled when the max grows
    #: a value of a second pass over the loop dim after its statistics are complete (``x - logsumexp(x)``, softmax's
    #: ``exp(x - m) / s``): only in a split (``partition.split_pass``), computed by the combine kernel, whose blocks
    #: also split the loop dim, each over its chunk of it
    PASS = "pass"


class AccKind(enum.StrEnum):
    """How an accumulator combines the loop iterations (and split-KV partials)."""

    SUM = "sum"
    RESCALED = "rescaled"  # online softmax: rescaled by exp(old max - new max)
    MAX = "max"


@dataclass(frozen=True)
class Acc:
    """One accumulator: its kind and, for a rescaled sum or a max, the running-max node it follows."""

    kind: AccKind
    rm: int | None = None


class Infeasible(Exception):
    """A partition choice that cannot be expressed (the message says why)."""


# --------------------------------------------------------------------------- label analysis


class _UF:
    def __init__(self) -> None:
        self.p: list[int] = []

    def new(self) -> int:
        self.p.append(len(self.p))
        return len(self.p) - 1

    def find(self, a: int) -> int:
        while self.p[a] != a:
            self.p[a] = self.p[self.p[a]]
            a = self.p[a]
        return a

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


@dataclass
class Analysis:
    """Index labels of a kernel graph's values and what each node does to them."""

    graph: Graph
    labels: dict[int, tuple[int | None, ...]]
    size: dict[int, int]
    reduces: dict[int, int]  # node -> label it reduces (sum/max over it, matmul contraction)
    whole: set[int]  # labels that must stay whole in a tile (rms_norm axis, concat axis)
    mm_labels: set[int]  # labels that are matmul m/n/k dims (tiles of >= 16 or the full size)
    #: inputs of ``graph`` that read another input's tensor (name -> that input's name): one kernel
    #: operand used in two roles (see :func:`split_input_uses`), loaded once per role
    alias: dict[str, str] = field(default_factory=dict)
    #: the smallest matmul m/n/k dim each label of ``mm_labels`` walks (its elements): a label a reshape also
    #: walks (a projection split into heads) has ``size`` = the parts it may be split into (16 heads), while
    #: its tile along the product is this over the parts (1024 / 16 = 64 columns a head)
    mm_extent: dict[int, int] = field(default_factory=dict)

    def tile_of(self, lab: int, parts: int) -> int:
        """The matmul tile a label split into ``parts`` gives (``size / parts`` rounded up for a label no reshape
        shrinks: the last block's tile masked where it does not divide)."""
        return -(-self.mm_extent.get(lab, self.size[lab]) // parts)

    def data_parallel(self) -> list[int]:
        """Labels every output carries, that nothing reduces, that may be split (first-seen order)."""
        nodes = node_list(self.graph)
        outs = [set(self.labels[a]) for a, _ in output_refs(self.graph)]
        reduced = set(self.reduces.values())
        order: list[int] = []
        for a, _ in output_refs(self.graph):
            for lab in self.labels[a]:
                if lab is not None and lab not in order:
                    order.append(lab)
        del nodes
        return [
            lab for lab in order
            if all(lab in o for o in outs) and lab not in reduced and lab not in self.whole and self.size[lab] > 1
        ]

    def reduction_labels(self) -> list[int]:
        """Labels some sum/max/matmul reduces and that may be walked by a loop."""
        out: list[int] = []
        for lab in self.reduces.values():
            if lab not in out and lab not in self.whole and self.size[lab] > 1:
                out.append(lab)
        return out


def _reshape_leads(src: tuple[int, ...], new: tuple[int, ...], in_labels: Sequence[int | None],
                   shrink: list[tuple[int, int]]) -> IndexMap:
    """A reshape's index map for partitioning: kept dims walk together; a merged or split group of dims walks
    its leading operand and result dims together (a block takes the same contiguous chunk of the group on both
    sides: GroupNorm's ``(N, C, L) -> (N, G, C/G * L)`` walks the channels with the groups, C/G channels a
    block), its other dims stay whole. A lead label is split into at most gcd(leading sizes) parts
    (``shrink``); :func:`build` divides the block-level reshape's leading sizes by the parts."""
    links, whole_in, whole_out = [], [], []
    for og, ng in reshape_groups(src, new):
        if len(og) == 1 and len(ng) == 1:
            links.append((0, og[0], ng[0]))
            continue
        gcd = math.gcd(src[og[0]], new[ng[0]])
        if gcd > 1 and in_labels[og[0]] is not None:
            links.append((0, og[0], ng[0]))
            shrink.append((in_labels[og[0]], gcd))  # type: ignore[arg-type]
            whole_in += [(0, d) for d in og[1:]]
            whole_out += ng[1:]
        else:
            whole_in += [(0, d) for d in og]
            whole_out += ng
    return IndexMap(links=tuple(links), whole_in=tuple(whole_in), whole_out=tuple(whole_out))


def analyse(g: Graph, *, zip_parts: bool = False) -> Analysis:
    """Index labels for every value of kernel graph ``g``.

    ``zip_parts``: where ``g``'s outputs fall into independent parts (:func:`_output_components`: a fused QKV
    projection's three products of one input), the data-parallel dims of each part's first output are walked
    together with the same dims of the first part's first output (same position, same size, reduced and kept
    whole in neither), so one grid walks every part: one kernel whose block computes a tile of each part (the
    head ``h`` of Q, K and V) where apart the parts are a kernel each (or one block, with no shared axis)."""
    uf = _UF()
    raw: dict[int, list[int | None]] = {}
    size: dict[int, int] = {}
    reduces: dict[int, int] = {}
    whole: list[int] = []
    mm: list[int] = []
    mm_dims: list[tuple[int, int]] = []  # (label, the matmul dim's size)
    shrink: list[tuple[int, int]] = []  # (label, g): the label also walks a dim of g blocks' worth (a reshape)
    nodes = node_list(g)

    def fresh(n: int) -> int | None:
        if n == 1:
            return None
        lab = uf.new()
        size[lab] = n
        return lab

    def unify(a: int | None, b: int | None) -> int | None:
        if a is None:
            return b
        if b is None:
            return a
        return uf.union(a, b)

    for i, n in enumerate(nodes):
        outt = n.outs[0]
        args = [raw[a] for a, _ in n.args]
        if n.op == "input":
            raw[i] = [fresh(s) for s in outt.shape]
            continue
        d = get_op(n.op)
        if d.index is None or d.has(Prop.LOOP):
            raise GraphError(f"partition: cannot lower op {n.op!r}; expected a kernel-level tensor op")
        im = d.index_map([nodes[a].outs[k] for a, k in n.args], n.attr_dict, outt)
        if d.has(Prop.REGROUPS):
            im = _reshape_leads(nodes[n.args[0][0]].outs[n.args[0][1]].shape, outt.shape, args[0], shrink)
        res: list[int | None] = [None] * outt.rank
        for a, j, o in im.links:
            res[o] = unify(res[o], args[a][j])
        for grp in im.reduced:
            lab: int | None = None
            for a, j in grp:
                lab = unify(lab, args[a][j])
            if lab is not None:
                reduces[i] = lab
                if im.matrix is not None:
                    mm.append(lab)
                    a0, j0 = grp[0]
                    mm_dims.append((lab, nodes[n.args[a0][0]].outs[n.args[a0][1]].shape[j0]))
        for a, j in im.whole_in:
            if args[a][j] is not None:
                whole.append(args[a][j])  # type: ignore[arg-type]
        linked = im.linked()
        for o in range(outt.rank):
            if o not in linked:
                res[o] = fresh(outt.shape[o])
        for o in im.whole_out:
            if res[o] is not None:
                whole.append(res[o])  # type: ignore[arg-type]
        if im.matrix is not None:
            mm += [res[o] for o in im.matrix if res[o] is not None]  # type: ignore[misc]
            mm_dims += [(res[o], outt.shape[o]) for o in im.matrix if res[o] is not None]  # type: ignore[misc]
        raw[i] = res

    if zip_parts:
        _zip_parts(g, nodes, raw, size, reduces, whole, shrink, uf)

    def f(x: int | None) -> int | None:
        return None if x is None else uf.find(x)

    labels = {i: tuple(f(x) for x in v) for i, v in raw.items()}
    sizes = {uf.find(k): v for k, v in size.items()}
    for lab, gcd in shrink:
        r = uf.find(lab)
        sizes[r] = math.gcd(sizes[r], gcd)
    extent: dict[int, int] = {}
    for lab, ext in mm_dims:
        r = uf.find(lab)
        extent[r] = min(extent.get(r, ext), ext)
    return Analysis(
        g,
        labels,
        sizes,
        {i: uf.find(v) for i, v in reduces.items()},
        {uf.find(x) for x in whole},
        {uf.find(x) for x in mm},
        mm_extent={r: ext for r, ext in extent.items() if ext != sizes.get(r)},
    )


def _zip_parts(g: Graph, nodes: Sequence[Any], raw: dict[int, list[int | None]], size: dict[int, int],
               reduces: dict[int, int], whole: list[int], shrink: list[tuple[int, int]], uf: _UF) -> None:
    """Union the data-parallel labels of independent output parts (see :func:`analyse`'s ``zip_parts``)."""
    comps = _output_components(g)
    if len(comps) < 2:
        return
    outs = output_refs(g)

    def blocked() -> set[int]:
        return {uf.find(x) for x in [*reduces.values(), *whole]}

    def parts_of(lab: int) -> int:
        r = uf.find(lab)
        return math.gcd(size[lab], *[gcd for x, gcd in shrink if uf.find(x) == r])

    first = raw[outs[comps[0][0]][0]]
    for comp in comps[1:]:
        other = raw[outs[comp[0]][0]]
        if len(other) != len(first):
            continue
        for a, b in zip(first, other, strict=True):
            if a is None or b is None or uf.find(a) == uf.find(b) or size[a] != size[b]:
                continue
            if {uf.find(a), uf.find(b)} & blocked() or parts_of(a) != parts_of(b):
                continue
            uf.union(a, b)


def _conflated(an: Analysis) -> bool:
    """Whether some label a contraction reduces is also kept by an output: two roles of one index merged
    (by an input used in two roles, e.g. rotary's cos table applied to the query rows and to the key rows).
    A sum or max reduced and broadcast back (softmax, a norm) is no conflict: only contractions count."""
    nodes = node_list(an.graph)
    kept = {lab for a, _ in output_refs(an.graph) for lab in an.labels[a] if lab is not None}
    return any(lab in kept for i, lab in an.reduces.items() if get_op(nodes[i].op).has(Prop.CONTRACTION))


def split_input_uses(g: Graph) -> Analysis:
    """The analysis of ``g``; where two roles of an index are merged through a shared input
    (:func:`_conflated`), that of ``g`` with each distinct role of such an input read through an alias
    input of its own (``Analysis.alias``; the uses whose labels agree share one).

    Rotary attention applies the cos/sin tables (N, D) to Q's rows and to K's rows: one label for both
    made the key dim (reduced by softmax @ V) the query dim too, and every fused lowering was wrong (the
    verifier rejected them all on their output shapes)."""
    an = analyse(g)
    if not _conflated(an):
        return an
    nodes = node_list(g)
    outs = output_refs(g)
    uses: dict[int, list[tuple[int, int]]] = {}
    for i, n in enumerate(nodes):
        for p, (a, _) in enumerate(n.args):
            if nodes[a].op == "input":
                uses.setdefault(a, []).append((i, p))
    shared = {a for a, us in uses.items() if len(us) > 1}
    if not shared:
        return an
    taken = {str(t.name) for t in g.inputs}

    def fresh_name(base: str) -> str:
        k = 1
        while f"{base}__use{k}" in taken:
            k += 1
        taken.add(f"{base}__use{k}")
        return f"{base}__use{k}"

    def rebuild(name_of: dict[tuple[int, int], str]) -> tuple[Graph, dict[str, str]]:
        g2 = Graph()
        env: dict[str, Tensor] = {}
        alias: dict[str, str] = {}
        for n in nodes:
            if n.op == "input":
                env[n.attr("name")] = g2.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        for (i, p), nm in name_of.items():
            a = nodes[i].args[p][0]
            orig = nodes[a].attr("name")
            if nm != orig and nm not in env:
                env[nm] = g2.input(nm, nodes[a].outs[0].shape, nodes[a].outs[0].dtype)
                alias[nm] = orig
        val: dict[int, Tensor] = {}
        for i, n in enumerate(nodes):
            if n.op == "input":
                val[i] = env[n.attr("name")]
                continue
            args = [env[name_of[(i, p)]] if (i, p) in name_of else val[a] for p, (a, _) in enumerate(n.args)]
            val[i] = g2.apply(n.op, args, dict(n.attrs))
        g2.output(*[val[a] for a, _ in outs])
        return g2, alias

    every = {(i, p): (fresh_name(nodes[a].attr("name")) if k else nodes[a].attr("name"))
             for a in shared for k, (i, p) in enumerate(uses[a])}
    g_all, _ = rebuild(every)
    if _conflated(analyse(g_all)):
        return an  # not (only) through shared inputs
    # merge the uses back greedily: a use joins the first group of its input it does not conflate with
    name_of = dict(every)
    for a in shared:
        groups: list[str] = []
        for i, p in uses[a]:
            for nm in groups:
                trial = {**name_of, (i, p): nm}
                if not _conflated(analyse(rebuild(trial)[0])):
                    name_of = trial
                    break
            else:
                groups.append(name_of[(i, p)])
    g2, alias = rebuild(name_of)
    if not alias:
        return an
    an2 = analyse(g2)
    an2.alias = alias
    log.debug("partition: inputs read in two roles, loaded once per role: %s", alias)
    return an2


# --------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    """A partition choice: grid axes ``(label, parts)``, loop label and range, KV splits."""

    grid: tuple[tuple[int, int], ...]
    loop: int | None = None
    frange: int = 1
    splits: int = 1
    combine_refine: int = 1  # the combine kernel splits its widest grid axis this many times finer
    #: the combine kernel reads every split's partials as one tile (a size-1 dim of each partial holds the splits)
    #: and reduces them along it, where a loop over the splits waits on each iteration's few loads in turn
    combine_whole: bool = False

    def describe(self) -> str:
        """Human-readable summary."""
        g = ", ".join(f"L{lab}/{p}" for lab, p in self.grid)
        s = f"grid[{g}]"
        if self.loop is not None:
            s += f" loop L{self.loop} x{self.frange}"
        if self.splits > 1:
            s += f" split x{self.splits}"
        if self.combine_refine > 1:
            s += f" combine finer x{self.combine_refine}"
        if self.combine_whole:
            s += " combine in one tile"
        return s


@dataclass
class Lowered:
    """A μGraph built from a kernel graph by a named sequence of lowering steps."""

    mugraph: MuGraph
    steps: list[str] = field(default_factory=list)
    config: Config | None = None


def _broadcasts_to(op: str, ts: Sequence[TensorType], shape: tuple[int, ...]) -> bool:
    """Whether operands of types ``ts`` of the element-wise ``op`` broadcast (numpy rules) to ``shape``."""
    try:
        return broadcast_shapes(op, ts) == tuple(shape)
    except GraphError:
        return False


def normalise(g: Graph) -> Graph:
    """``g`` with every ``mean`` written as ``scale(sum, 1/n)`` (so loops only accumulate sums), and every
    ``broadcast_to`` read by an element-wise op that broadcasts its operands anyway replaced by its operand where
    the op's result keeps its shape.

    An explicit ``broadcast_to`` keeps the dims it broadcasts along whole in a tile (its index rule), while the
    same broadcast done by the element-wise op splits freely: cross-entropy's one-hot target compare
    ``sub(broadcast_to(t, (8, V)), broadcast_to(iota, (8, V)))`` (ATen's ``expand``s) kept both dims whole, so the
    only fused lowering was one block of the whole (8, 8192) tile and its search returned one kernel per op
    (11 kernels, 30 us est.). The result is the same program (the lowering is verified against ``g``)."""
    nodes = node_list(g)

    def is_mean(n: Any) -> bool:
        rd = get_op(n.op).reduce
        return rd is not None and rd.mean

    def implicit(n: Any) -> bool:  # an element-wise op broadcasting its operands (the default index rule)
        return get_op(n.op).has(Prop.ELEMENTWISE) and len(n.args) > 1 and "index" not in get_op(n.op).facts

    elide = any(implicit(n) and any(nodes[a].op == "broadcast_to" for a, _ in n.args) for n in nodes)
    if not elide and not any(is_mean(n) for n in nodes):
        return g
    memo: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        args = tuple(memo[a] for a, _ in n.args)
        if is_mean(n):
            ax = n.attr("axis")
            cnt = nodes[n.args[0][0]].outs[n.args[0][1]].shape[ax]
            memo[i] = Term("scale", (("c", 1.0 / cnt),), (Term("sum", (("axis", ax),), args),))
            continue
        if implicit(n):
            types = [nodes[a].outs[k] for a, k in n.args]
            new = list(args)
            for j, (a, _) in enumerate(n.args):
                src = nodes[a]
                if src.op != "broadcast_to":
                    continue
                inner = nodes[src.args[0][0]].outs[src.args[0][1]]
                trial = [*types[:j], inner, *types[j + 1:]]
                if src.outs[0].dtype == inner.dtype and _broadcasts_to(n.op, trial, n.outs[0].shape):
                    types, new[j] = trial, memo[src.args[0][0]]
            args = tuple(new)
        memo[i] = Term(n.op, n.attrs, args)
    inputs = [(t.name, t.type) for t in g.inputs if t.name is not None]
    return term_to_graph([memo[a] for a, _ in output_refs(g)], inputs)


def _pow2_divisors(n: int, lo: int = 1, hi: int | None = None) -> list[int]:
    out = []
    p = 1
    while p <= n:
        if n % p == 0 and p >= lo and (hi is None or p <= hi):
            out.append(p)
        p *= 2
    return out


def _grid_divisors(n: int) -> list[int]:
    """Block counts for an axis of size ``n``: powers of two, and counts giving power-of-two tiles.

    The second kind matters for sizes like 6144 = 3 x 2^11: 96 blocks of 64 columns need no padding,
    where every power-of-two count leaves a padded tile (48, 96 or 192 columns).
    """
    out = set(_pow2_divisors(n)) | {n // t for t in _pow2_divisors(n)}
    if not any(p > 1 and n // p >= ODD_TILE_MIN and _pow2_ceil(n // p) <= ODD_TILE_PAD * (n // p) for p in out):
        # no tiling of those pads little (1,155 = 3 x 5 x 7 x 11 columns: one tile of 1,155 padded to 2,048, or
        # tiles of 1): every divisor (55 blocks of 21 columns)
        out |= _divisors(n)
    return sorted(out)


#: an axis none of whose power-of-two-derived block counts gives a tile of at least ``ODD_TILE_MIN`` elements padded
#: by at most ``ODD_TILE_PAD`` (Triton's power-of-two tiles) has every divisor as a block count
#: (:func:`_grid_divisors`); a multiple of 16 always has such a tiling (tiles of 16), so its block counts stay
ODD_TILE_MIN = 16
ODD_TILE_PAD = 1.25


#: the power-of-two tiles a data-parallel label with a masked tail is offered in (:func:`_tail_counts`)
TAIL_TILES = (16, 32, 64, 128, 256)


def _tail_counts(n: int) -> list[int]:
    """Block counts ``ceil(n / T)`` for the tiles ``T`` of :data:`TAIL_TILES`, for a size ``n`` that no tile of 16
    divides (a prime such as ViT's 197 tokens, GPT-2's vocabulary 50257 = 29 x 1733, a sequence of 1000): each block
    a tile of ``ceil(n / blocks)`` elements, the operands read zero-padded past ``n`` and the results cropped (the
    IR's masked tail, :func:`verimirage.ir.graph.tile_shape`). Only for data-parallel labels, which nothing reduces:
    the padding reaches only the cropped elements (and the verifier checks it does)."""
    if n % ODD_TILE_MIN == 0:
        return []
    return sorted({-(-n // t) for t in TAIL_TILES if -(-n // t) > 1 and n % -(-n // t)})


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _divisors(n: int) -> set[int]:
    """Every divisor of ``n``."""
    out = set()
    d = 1
    while d * d <= n:
        if n % d == 0:
            out |= {d, n // d}
        d += 1
    return out


#: bytes of a DRAM segment: a tile whose rows (its contiguous dim) are narrower fills only part of each
#: transaction (the cost model charges it: ``Hardware.segment``)
SEGMENT_BYTES = 128


def _contiguous_labels(an: Analysis) -> dict[int, int]:
    """Labels of the contiguous (last) dim of a graph input or output, with the largest element size there."""
    nodes = node_list(an.graph)
    out: dict[int, int] = {}
    refs = [i for i, n in enumerate(nodes) if n.op == "input"] + [a for a, _ in output_refs(an.graph)]
    for i in refs:
        labs = an.labels.get(i, ())
        if labs and labs[-1] is not None:
            out[labs[-1]] = max(out.get(labs[-1], 0), nodes[i].outs[0].dtype.itemsize)
    return out


def configs(
    an: Analysis,
    *,
    grids: Sequence[int] | None = None,
    franges: Sequence[int] | None = None,
    max_splits: int = 32,
    min_tile: int = 16,
    max_blocks: int = 1 << 14,
    min_blocks: int = 16,
    max_loop_tile: int = 256,
    tail: bool = True,
) -> list[Config]:
    """Every partition choice within limits (deterministic order). ``tail``: a data-parallel label with no tile of
    16 that divides it is also split into blocks of power-of-two tiles, the last one masked (:func:`_tail_counts`)."""
    dp = an.data_parallel()
    wide = _contiguous_labels(an)
    per_label: list[list[int]] = []
    for lab in dp:
        n = an.size[lab]
        tails = _tail_counts(n) if tail else []
        opts = [p for p in sorted({*_grid_divisors(n), *tails})
                if p == 1 or lab not in an.mm_labels or an.tile_of(lab, p) >= min_tile]
        if grids is not None:
            opts = [p for p in opts if p == 1 or p in grids]
        keep = sorted({*opts[-6:], *(p for p in opts if p in tails)})
        if lab in wide and lab not in an.mm_labels:
            # the finest tiles of a contiguous dim can have rows narrower than a DRAM segment: also offer the two
            # finest block counts whose tiles are at least a segment wide (batchnorm_relu's 3136 columns were
            # offered in tiles of 32 fp16 at most, 64-byte rows; 49 blocks of 64 give 128-byte rows)
            seg = [p for p in opts if (n // p) * wide[lab] >= SEGMENT_BYTES]
            keep = sorted(set(keep) | set(seg[-2:]))
        per_label.append(keep)
        if 1 not in per_label[-1]:
            per_label[-1].insert(0, 1)
    grid_choices: list[tuple[tuple[int, int], ...]] = []
    for parts in itertools.product(*per_label) if dp else [()]:
        chosen = tuple((lab, p) for lab, p in zip(dp, parts, strict=True) if p > 1)
        if len(chosen) > 3:
            continue
        if not chosen and dp:
            chosen = ((dp[0], 1),)
        # no data-parallel label (every output dim is reduced, e.g. a mean loss): one block, or the blocks
        # of a split reduction with its combine kernel
        grid_choices.append(chosen)
    fr_allowed = list(franges) if franges is not None else [1, 2, 4, 8, 16, 32, 64, 128, 256]
    fr_max = max(fr_allowed)
    out: list[Config] = []
    most = max((math.prod(p for _, p in gc) for gc in grid_choices), default=1)
    for gc in grid_choices:
        blocks = math.prod(p for _, p in gc)
        if blocks > max_blocks:
            continue
        # too few blocks to fill the device (a larger grid exists); 1 block kept as a baseline. A
        # split reduction multiplies the blocks, so a coarse grid stays in play with splits
        # (FlashDecoding's 64-row tiles x 16 KV splits: benchmarks/perf/NOTES.md)
        few = blocks < min(min_blocks, most) and blocks > 1
        if not few:
            out.append(Config(gc))
        for lab in an.reduction_labels():
            n = an.size[lab]
            for splits in [1, *[s for s in _pow2_divisors(n, 2, max_splits)]]:
                if splits > 1 and (len(gc) >= 3 or blocks * splits > max_blocks):
                    continue
                if (splits == 1 and few) or (splits > 1 and blocks * splits < min(min_blocks, most)):
                    continue
                per = n // splits
                # powers of two, and (for sizes like 3584 = 7 x 2^9) ranges giving power-of-two tiles: a
                # 224-wide tile is padded to 256 in the generated code (qkv_bias, H100: 13.5 us)
                for f in [d for d in _grid_divisors(per) if d >= 2]:
                    if f not in fr_allowed and (franges is not None or f > fr_max or f & (f - 1) == 0):
                        continue
                    if lab in an.mm_labels and not min_tile <= per // f <= max_loop_tile:
                        continue
                    out.append(Config(gc, lab, f, splits))
                    if splits > 1 and splits <= COMBINE_WHOLE_MAX:
                        out.append(Config(gc, lab, f, splits, combine_whole=True))
                    # a combine kernel with as few blocks as kernel 1 has row blocks starves the GPU:
                    # offer one with a finer grid (measured: 16-row combine tiles, benchmarks/perf)
                    if splits > 1 and gc and _refinable(an, gc, 4, min_tile):
                        out.append(Config(gc, lab, f, splits, 4))
                if splits > 1 and 1 in fr_allowed and (lab not in an.mm_labels or per >= min_tile):
                    out.append(Config(gc, lab, 1, splits))
                    if splits <= COMBINE_WHOLE_MAX:
                        out.append(Config(gc, lab, 1, splits, combine_whole=True))
    return out


def _widest(an: Analysis, grid: tuple[tuple[int, int], ...]) -> int:
    """Index in ``grid`` of the axis with the largest tile."""
    return max(range(len(grid)), key=lambda k: (an.size[grid[k][0]] // grid[k][1], -k))


def _refinable(an: Analysis, grid: tuple[tuple[int, int], ...], r: int, min_tile: int) -> bool:
    lab, p = grid[_widest(an, grid)]
    n = an.size[lab]
    return n % (p * r) == 0 and n // (p * r) >= min_tile


# --------------------------------------------------------------------------- building block graphs


#: ``(lo, hi)`` of the clamp of a tile's max before it enters a running max (``partition.online_softmax``): fp32's
#: finite range, so that only an infinite max changes. A row whose first tiles are all -inf (an additive mask's: left
#: padding, a sliding window, a -inf bias) had the running max -inf there, and ``exp(x - m)``, ``exp(m_prev - m)`` were
#: ``exp(-inf + inf) = NaN`` from then on: every flash and split-KV design gave NaN on every such row where the source
#: (and ATen's attention) is finite (red team session 17). Floored, ``exp(-inf - m) = 0`` and the row's sums stay 0
#: until a finite score comes; equal over the reals (any per-row shift cancels, as the running max's does).
RUNNING_MAX_FLOOR = (-3.4028234663852886e38, 3.4028234663852886e38)


def _joins_running_max(nodes: Sequence[Any], n: Any, ks: Sequence[Place]) -> bool:
    """Whether ``n`` joins one running max (a max over the loop dim) with loop-invariant values by that max's own
    combine (``maximum``), keeping its shape: the joined value is again a running max."""
    rm = [a for (a, _), k in zip(n.args, ks, strict=True) if k == Place.RMAX]
    if len(rm) != 1 or len(ks) < 2 or any(k not in (Place.RMAX, Place.INV) for k in ks):
        return False
    red = get_op(nodes[rm[0]].op).reduce
    return red is not None and n.op == red.combine and n.outs[0].shape == nodes[rm[0]].outs[0].shape


def _zero_masked(nodes: Sequence[Any], n: Any, ks: Sequence[Place]) -> bool:
    """Whether ``n`` is ``where(mask, e, z)`` with ``e`` rescaled (exp of a max-shifted value), the mask not
    rescaled and ``z`` exactly zero (``scale(x, 0)`` of a loop or invariant value): the masked attention whose
    masked elements contribute exactly 0, so that rescaling ``e`` rescales the selection."""
    if n.op != "where" or len(ks) != 3 or ks[1] != Place.SCALED or ks[0] not in (Place.BODY, Place.INV) \
            or ks[2] not in (Place.BODY, Place.INV):
        return False
    z = nodes[n.args[2][0]]
    return z.op == "scale" and float(z.attr("c")) == 0.0


def _apply(b: Any, op: str, attrs: dict[str, Any], args: list[Tensor],
           full: Sequence[TensorType] | None = None) -> Tensor:
    """``op`` on tiles ``args``; ``full``: the kernel operands' types (block-level attributes need them)."""
    return b.apply(op, args, get_op(op).block_attrs(attrs, full) if full is not None else attrs)


class _Epilogue:
    """Post-loop elementwise ops, collected lazily and emitted as one fused thread graph."""

    def __init__(self, b: BlockBuilder) -> None:
        self.b = b
        self.fused = 0

    def materialise(self, v: Any) -> Tensor:
        if isinstance(v, Tensor):
            return v
        leaves: list[Tensor] = []
        ops = 0

        def walk(x: Any) -> None:
            nonlocal ops
            if isinstance(x, Tensor):
                if all(x is not y for y in leaves):
                    leaves.append(x)
                return
            ops += 1
            for a in x[2]:
                walk(a)

        walk(v)
        if ops == 1:
            op, attrs, args = v
            return _apply(self.b, op, attrs, [self.materialise(a) for a in args])
        tb = ThreadBuilder()
        targs = [tb.arg(t.type) for t in leaves]

        def emit(x: Any) -> Tensor:
            if isinstance(x, Tensor):
                return targs[next(k for k, y in enumerate(leaves) if y is x)]
            op, attrs, args = x
            return _apply(tb, op, attrs, [emit(a) for a in args])

        tb.output(emit(v))
        self.fused += 1
        return self.b.fused(tb.build(), leaves)


#: the label of the one size-1 grid axis of a config without grid axes (a kernel whose outputs have no
#: data-parallel dim, such as a mean loss: one block, or the blocks of a split reduction); no value has it
UNIT = -1


def _imap(labels: tuple[int | None, ...], axes: Sequence[int]) -> tuple[int | None, ...]:
    return tuple(next((d for d, x in enumerate(labels) if x == lab), None) for lab in axes)


def _reshape_tile(an: Analysis, axes: Sequence[int], sizes: Sequence[int], loop: int | None, n: Any,
                  full: list[TensorType]) -> tuple[dict[str, Any], list[TensorType]]:
    """The attributes and operand type a reshape node is applied with in a block: each merged or split group
    whose leading dims a grid axis walks (:func:`_reshape_leads`) has those leading sizes divided by the axis's
    parts, so the block-level tile rule gives the chunk's shape."""
    src, new = full[0].shape, n.outs[0].shape
    labs = an.labels[n.args[0][0]]
    src2, new2 = list(src), list(new)
    for og, ng in reshape_groups(src, new):
        if len(og) == 1 and len(ng) == 1:
            continue
        lab = labs[og[0]]
        if lab is not None and lab == loop:
            raise Infeasible("a for-loop over a reshaped group of dims")
        if lab is not None and lab in axes:
            p = sizes[list(axes).index(lab)]
            if src2[og[0]] % p:
                # ("divide" in the reason: this count's, not the structure's, lower_all keeps trying other counts)
                raise Infeasible("a masked tail: a block count that does not divide a reshaped group of dims")
            src2[og[0]] //= p
            new2[ng[0]] //= p
    return {**n.attr_dict, "shape": tuple(new2)}, [TensorType(tuple(src2), full[0].dtype)]


def build(an: Analysis, cfg: Config, *, fuse_epilogue: bool = True) -> Lowered:
    """The μGraph of ``cfg`` (one kernel, or split-KV + combine); raises Infeasible."""
    g = an.graph
    nodes = node_list(g)
    L = cfg.loop
    split = cfg.splits > 1
    axes = [lab for lab, _ in cfg.grid] or [UNIT]
    sizes = [p for _, p in cfg.grid] or [1]
    if split:
        assert L is not None
        axes_k1 = [*axes, L]
        sizes_k1 = [*sizes, cfg.splits]
    else:
        axes_k1, sizes_k1 = axes, sizes
    try:
        b = BlockBuilder(tuple(sizes_k1), cfg.frange)
    except GraphError as e:
        raise Infeasible(str(e)) from None
    mg = MuGraph()
    by_name: dict[str, Tensor] = {}
    ins = []
    for t in g.inputs:  # an alias input (after every input it reads) is that input's tensor again
        nm = an.alias.get(str(t.name), str(t.name))
        if nm not in by_name:
            by_name[nm] = mg.input(nm, t.shape, t.dtype)
        ins.append(by_name[nm])
    in_idx = [i for i, n in enumerate(nodes) if n.op == "input"]
    val: dict[int, Any] = {}
    kind: dict[int, Place] = {}
    rm_of: dict[int, int] = {}  # shifted/scaled/rescaled node -> its running-max node
    acc: dict[int, Acc] = {}  # accumulator node -> how it accumulates (and its running max)
    postmax: dict[int, Any] = {}
    tile_max: dict[int, Tensor] = {}  # running-max node -> the per-iteration max it runs over
    steps: set[str] = set()
    epi = _Epilogue(b)

    def has_L(i: int) -> bool:
        return L is not None and L in an.labels[i]

    try:
        for k, i in enumerate(in_idx):
            n = nodes[i]
            fmap = an.labels[i].index(L) if has_L(i) else None
            val[i] = b.input(k, n.outs[0], _imap(an.labels[i], axes_k1), fmap)
            kind[i] = Place.BODY if has_L(i) else Place.INV
    except GraphError as e:
        raise Infeasible(str(e)) from None

    def post_of_max(j: int) -> Any:
        if j not in postmax:
            postmax[j] = b.loop_max(val[j])
            acc[j] = Acc(AccKind.MAX, j)
        return postmax[j]

    def mat(v: Any) -> Tensor:
        return epi.materialise(v)

    def full_in(n: Any) -> list[TensorType]:
        return [nodes[a].outs[k] for a, k in n.args]

    try:
        for i, n in enumerate(nodes):
            if n.op == "input":
                continue
            attrs = n.attr_dict
            fin = full_in(n)
            if get_op(n.op).has(Prop.REGROUPS):
                attrs, fin = _reshape_tile(an, axes_k1, sizes_k1, L, n, fin)
            arefs = [a for a, _ in n.args]
            ks = [kind[a] for a in arefs]
            red = an.reduces.get(i)
            if red is not None and red in axes:
                raise Infeasible(f"{n.op} reduces a grid-partitioned dim")
            d = get_op(n.op)
            if L is not None and red == L:
                if d.reduce is not None and d.reduce.loop == "loop_max":
                    if ks != [Place.BODY]:
                        raise Infeasible("max over the loop dim of a non-loop value")
                    # (floored at fp32's lowest finite value: a tile of -inf scores, a mask's, has the max -inf,
                    # and x - m, m_prev - m would be -inf + inf = NaN for every later tile of the row: see
                    # RUNNING_MAX_FLOOR)
                    tile_max[i] = b.clamp(b.max(mat(val[arefs[0]]), axis=attrs["axis"]), *RUNNING_MAX_FLOOR)
                    val[i] = b.running_max(tile_max[i])
                    kind[i] = Place.RMAX
                    continue
                if not (d.has(Prop.CONTRACTION) or (d.reduce is not None and d.reduce.loop == "loop_sum"
                                                     and not d.reduce.mean)):
                    raise Infeasible(f"{n.op} over the loop dim cannot be accumulated")
                if any(k not in (Place.BODY, Place.SCALED, Place.INV) for k in ks) or ks.count(Place.SCALED) > 1:
                    raise Infeasible(f"{n.op} over the loop dim of post-loop values")
                part = _apply(b, n.op, attrs, [mat(val[a]) for a in arefs], fin)
                if Place.SCALED in ks:
                    rm = rm_of[arefs[ks.index(Place.SCALED)]]
                    val[i] = b.rescaled_sum(part, val[rm])
                    acc[i] = Acc(AccKind.RESCALED, rm)
                    rm_of[i] = rm
                    steps.add("partition.online_softmax")
                else:
                    val[i] = b.loop_sum(part)
                    acc[i] = Acc(AccKind.SUM)
                kind[i] = Place.POST
                continue
            if Place.RMAX in ks:
                if _joins_running_max(nodes, n, ks):
                    # max(running max, c) with c loop-invariant (a softmax over the cached keys and the new
                    # token's): the running max of max(tile max, c), the same value at every iteration, so
                    # values shifted by it rescale as by any running max (exp(m_prev - m))
                    joined = [tile_max[a] if kind[a] == Place.RMAX else mat(val[a]) for a in arefs]
                    tile_max[i] = _apply(b, n.op, attrs, joined, fin)
                    val[i] = b.running_max(tile_max[i])
                    kind[i] = Place.RMAX
                    steps.add("partition.online_softmax")
                    continue
                if d.has(Prop.DIFFERENCE) and ks == [Place.BODY, Place.RMAX]:
                    val[i] = b.sub(mat(val[arefs[0]]), val[arefs[1]])
                    kind[i] = Place.SHIFT
                    rm_of[i] = arefs[1]
                    continue
                ks = [Place.POST if k == Place.RMAX else k for k in ks]
                args = [post_of_max(a) if kind[a] == Place.RMAX else val[a] for a in arefs]
            else:
                args = [val[a] for a in arefs]
            if split and (Place.PASS in ks or (Place.POST in ks and any(
                    k in (Place.BODY, Place.SHIFT, Place.SCALED) for k in ks))):
                # a loop value combined with a complete statistic (x - logsumexp(x)): a second pass over the
                # loop dim, which the combine kernel makes, each of its blocks over one split's chunk
                kind[i] = Place.PASS
                val[i] = None
                continue
            if Place.SHIFT in ks:
                if not d.has(Prop.EXPONENTIAL):
                    raise Infeasible(f"{n.op} of a max-shifted loop value (only exp is rescalable)")
                val[i] = _apply(b, n.op, attrs, [mat(args[0])], fin)
                kind[i] = Place.SCALED
                rm_of[i] = rm_of[arefs[0]]
                continue
            if Place.SCALED in ks and _zero_masked(nodes, n, ks):
                # where(mask, e, 0) with e rescaled: rescaling e rescales the selection (0 * f = 0)
                val[i] = _apply(b, n.op, attrs, [mat(a) for a in args], fin)
                kind[i] = Place.SCALED
                rm_of[i] = rm_of[arefs[1]]
                continue
            if Place.SCALED in ks:
                si = ks.index(Place.SCALED)
                others = [k for j, k in enumerate(ks) if j != si]
                ok = all(k in (Place.BODY, Place.INV) for k in others) and si in d.scales_with and (
                    d.reduce is None or red != L)
                if not ok:
                    raise Infeasible(f"{n.op} of a rescaled loop value")
                val[i] = _apply(b, n.op, attrs, [mat(a) for a in args], fin)
                kind[i] = Place.SCALED
                rm_of[i] = rm_of[arefs[si]]
                continue
            if Place.POST in ks:
                if any(k in (Place.BODY, Place.SHIFT, Place.SCALED) for k in ks):
                    raise Infeasible(f"{n.op} mixes a post-loop value with a loop-varying value")
                kind[i] = Place.POST
                if split:
                    val[i] = None  # emitted in the combine kernel
                    continue
                if fuse_epilogue and get_op(n.op).has(Prop.ELEMENTWISE):
                    val[i] = (n.op, attrs, args)
                else:
                    val[i] = _apply(b, n.op, attrs, [mat(a) for a in args], fin)
                continue
            kind[i] = Place.BODY if Place.BODY in ks else Place.INV
            val[i] = _apply(b, n.op, attrs, [mat(a) for a in args], fin)
    except GraphError as e:
        raise Infeasible(str(e)) from None

    outs = [a for a, _ in output_refs(g)]
    for o in outs:
        if kind[o] == Place.RMAX:
            post_of_max(o)
            kind[o] = Place.POST
        if kind[o] not in (Place.POST, Place.INV, Place.PASS) or (
                kind[o] == Place.INV and L is not None and cfg.frange > 1 and split):
            raise Infeasible(f"output %{o} is a loop-varying value, not an accumulated result")
    if L is not None:
        steps.add("partition.loop")
    steps.add("partition.grid")

    def omap_for(i: int, ax: Sequence[int]) -> tuple[int, ...]:
        m = _imap(an.labels[i], ax)
        if UNIT in ax:  # the size-1 axis walks the first dim no other axis walks (its tile is the whole dim)
            r = len(an.labels[i])  # (a split places its partials along the last free dim: leave it)
            free = [d for d in range(r) if d not in m and not (split and r > 1 and d == r - 1)]
            if not free:
                raise Infeasible(f"value %{i} has no dim for the size-1 grid axis")
            m = tuple(free[0] if lab == UNIT else d for lab, d in zip(ax, m, strict=True))
        if any(d is None for d in m):
            raise Infeasible(f"value %{i} lacks a grid-partitioned dim; blocks would write the same tile")
        return m  # type: ignore[return-value]

    try:
        if not split:
            for o in outs:
                rd = get_op(nodes[o].op).reduce if nodes[o].op != "input" else None
                t = postmax[o] if o in postmax and kind[o] == Place.POST and rd is not None and rd.loop == "loop_max" \
                    else val[o]
                b.output(mat(t), omap_for(o, axes))
            res = mg.custom(b.build(check=False), ins,  # (custom checks the block against the operands)
                            [nodes[o].outs[0].shape for o in outs])  # (a masked tail's whole tiles cropped)
            mg.output(*[res[k] for k in range(len(outs))])
            if epi.fused:
                steps.add("fuse.epilogue")
            return Lowered(mg, sorted(steps), cfg)
        return _build_split(an, cfg, b, mg, ins, val, kind, acc, postmax, outs, omap_for, fuse_epilogue, steps)
    except GraphError as e:
        raise Infeasible(str(e)) from None


def _build_split(an: Analysis, cfg: Config, b: BlockBuilder, mg: MuGraph, ins: list[Tensor], val: dict[int, Any],
                 kind: dict[int, Place], acc: dict[int, Acc], postmax: dict[int, Any],
                 outs: list[int], omap_for: Any, fuse_epilogue: bool, steps: set[str]) -> Lowered:
    """Kernel 1 writes the accumulators per KV split side by side; a combine kernel merges them."""
    g = an.graph
    nodes = node_list(g)
    axes = [lab for lab, _ in cfg.grid] or [UNIT]
    L = cfg.loop
    assert L is not None
    # the accumulators the rest of the program needs
    needed: list[int] = []
    invariant: list[int] = []  # loop-invariant operands of the post-loop ops: the combine kernel computes them
    for i, n in enumerate(nodes):
        if kind.get(i) == Place.POST and i not in acc:
            for a, _ in n.args:
                if kind[a] == Place.INV:
                    if a not in invariant:
                        invariant.append(a)
                    continue
                if a in acc and a not in needed:
                    needed.append(a)
                if kind[a] == Place.RMAX and a not in needed:
                    post_of = postmax.get(a)
                    if post_of is None:
                        raise Infeasible("split-KV: max used without accumulation")
                    needed.append(a)
    # a second pass (Place.PASS): the statistics its values read, through the loop values it recomputes
    second = [o for o in outs if kind[o] == Place.PASS]
    if second:
        if len(second) < len(outs):
            raise Infeasible("split pass: an output without the split dim next to one with it")
        if cfg.combine_refine > 1:
            raise Infeasible("split pass: the combine kernel's grid walks the split dim, not a finer grid")
        seen: set[int] = set()
        todo = [i for i, k in kind.items() if k == Place.PASS]
        while todo:
            for a, _ in nodes[todo.pop()].args:
                if a in seen:
                    continue
                seen.add(a)
                if kind[a] == Place.RMAX:  # (the row's max over every split: a partial of its own)
                    if a not in postmax:
                        postmax[a] = b.loop_max(val[a])
                        acc[a] = Acc(AccKind.MAX, a)
                    if a not in needed:
                        needed.append(a)
                elif kind[a] == Place.POST:
                    if a in acc and a not in needed:
                        needed.append(a)
                elif kind[a] != Place.INV:
                    todo.append(a)
    for o in outs:
        if (o in acc or kind[o] == Place.RMAX) and o not in needed:
            needed.append(o)
        if kind[o] == Place.INV:
            raise Infeasible("split-KV: an output does not depend on the split dim")
    # a plain sum that does not depend on the grid-partitioned dims (e.g. the sum of squares of X in
    # rmsnorm_linear, identical in every column block) cannot be placed as a per-block partial: the
    # combine kernel recomputes it from the inputs, walking the same dim over the splits
    recompute = [i for i in needed if acc[i].kind is AccKind.SUM and any(
        d is None for lab, d in zip(axes, _imap(an.labels[i], axes), strict=True) if lab != UNIT)]
    needed = [i for i in needed if i not in recompute]
    if recompute and second:
        raise Infeasible("split pass: a sum recomputed over the split dim in the combine kernel")
    rms = sorted({r for i in needed if acc[i].kind is AccKind.RESCALED and (r := acc[i].rm) is not None})
    part_nodes: list[tuple[str, int]] = [("acc", i) for i in needed] + [("max", r) for r in rms if r not in needed]
    placements: list[int] = []
    for what, i in part_nodes:
        labs = an.labels[i]
        used = {d for d in _imap(labs, axes) if d is not None}
        free = [d for d in range(len(labs)) if d not in used]
        if not free:
            raise Infeasible("split-KV: a partial result has no free dim to place the splits along")
        pl = max(free)
        if cfg.combine_whole:  # the splits along a size-1 dim: one tile of every split, reduced along that dim
            ones = [d for d in free if nodes[i].outs[0].shape[d] == 1]
            if not ones:
                raise Infeasible("split-KV: a partial result has no size-1 dim to hold the splits in one tile")
            pl = ones[0]
        placements.append(pl)
        base = omap_for(i, axes)
        if what == "max" or acc[i].kind is AccKind.MAX:
            if i not in postmax:
                postmax[i] = b.loop_max(val[i])
            t = postmax[i]
        else:
            t = val[i]
        b.output(t, (*base, pl))
    if cfg.combine_whole and len(set(placements)) > 1:
        raise Infeasible("split-KV: the partials hold their splits along different dims")
    parts = mg.custom(b.build(check=False), ins)
    # combine kernel
    cgrid = [p for _, p in cfg.grid] or [1]
    if cfg.combine_refine > 1:
        cgrid[_widest(an, cfg.grid)] *= cfg.combine_refine
        steps.add("partition.combine_grid")
    # a second pass: one more grid axis over the split dim, each block its split's chunk of it (every block of a
    # row reads all the row's partials)
    caxes = [*axes, L] if second else axes
    if second:
        cgrid.append(cfg.splits)
    whole = cfg.combine_whole
    c = BlockBuilder(tuple(cgrid), 1 if whole else cfg.splits)
    cin: dict[tuple[str, int], Tensor] = {}
    for k, ((what, i), pl) in enumerate(zip(part_nodes, placements, strict=True)):
        cin[(what, i)] = c.input(k, parts[k].type, _imap(an.labels[i], caxes), None if whole else pl)
    cval: dict[int, Any] = {}
    crm: dict[int, Tensor] = {}

    def max_part(r: int) -> Tensor:
        return cin[("acc", r)] if ("acc", r) in cin else cin[("max", r)]

    extra_args: list[Tensor] = []
    in_idx = [j for j, n in enumerate(nodes) if n.op == "input"]
    rval: dict[int, Tensor] = {}

    def on_tiles(n: Any, args: list[Tensor]) -> Tensor:
        """Node ``n`` applied in the combine kernel to its block's tiles ``args``: a reshape whose merged or split
        group of dims a grid axis walks (a k projection's 1024 columns as 8 heads, a head a block) on its block's
        chunk of the group, as in the split kernel (:func:`_reshape_tile`; with the program's attributes its
        block-level tile rule took that group whole, a tile of more elements than its operand's)."""
        attrs, fin = n.attr_dict, [nodes[a].outs[k] for a, k in n.args]
        if get_op(n.op).has(Prop.REGROUPS):
            attrs, fin = _reshape_tile(an, caxes, cgrid, None if second else L, n, fin)
        return _apply(c, n.op, attrs, args, fin)

    def replay(j: int) -> Tensor:
        """Node ``j`` computed in the combine kernel from the inputs: walking the split dim with its loop (a
        recomputed sum), or, in a second pass, its block's chunk of it, where a running max is the row's whole max
        and a loop value shifted by it (or exp of that) is recomputed with it."""
        if j in rval:
            return rval[j]
        n = nodes[j]
        place = kind.get(j)
        if n.op == "input":
            labs = an.labels[j]
            fmap = labs.index(L) if L in labs and not second else None
            rval[j] = c.input(len(part_nodes) + len(extra_args), n.outs[0], _imap(labs, caxes), fmap)
            extra_args.append(ins[in_idx.index(j)])
        elif second and j in cval:  # (a statistic, or the row's max for a running max)
            rval[j] = epi.materialise(cval[j])
        elif place in (Place.BODY, Place.INV) or (second and place in (Place.SHIFT, Place.SCALED)):
            rval[j] = on_tiles(n, [replay(a) for a, _ in n.args])
        else:
            raise Infeasible("split: a recomputed sum depends on a rescaled or post-loop value")
        return rval[j]

    epi = _Epilogue(c)

    if recompute:
        for i in recompute:
            n = nodes[i]
            cval[i] = c.loop_sum(on_tiles(n, [replay(a) for a, _ in n.args]))
        steps.add("partition.split_recompute")
    for a in invariant:  # (the attention's new-token term e * v_new, after the split sums over the cached keys)
        cval[a] = replay(a)
    if invariant:
        steps.add("partition.split_recompute")

    for what, i in part_nodes:
        if what != "acc":
            continue
        kd = acc[i].kind
        p = cin[("acc", i)]
        if whole:  # (every placement the same dim: checked above)
            ax = placements[0]
            if kd is AccKind.SUM:
                cval[i] = c.sum(p, axis=ax)
                continue
            r = i if kd is AccKind.MAX else acc[i].rm
            assert r is not None
            if r not in crm:  # the max over the splits (a running max's, once for all its rescaled sums)
                crm[r] = c.max(max_part(r), axis=ax)
            cval[i] = crm[r] if kd is AccKind.MAX else c.sum(c.mul(p, c.exp(c.sub(max_part(r), crm[r]))), axis=ax)
            continue
        if kd is AccKind.SUM:
            cval[i] = c.loop_sum(p)
        elif kd is AccKind.MAX:
            cval[i] = c.loop_max(p)
        else:
            r = acc[i].rm
            assert r is not None
            if r not in crm:
                crm[r] = c.running_max(max_part(r))
            w = c.exp(c.sub(max_part(r), crm[r]))
            cval[i] = c.rescaled_sum(c.mul(p, w), crm[r])
    for i, n in enumerate(nodes):
        if kind.get(i) == Place.PASS:  # (on its chunk of the loop dim: not fused with the row's statistics)
            cval[i] = on_tiles(n, [replay(a) for a, _ in n.args])
            continue
        if kind.get(i) != Place.POST or i in acc or i in cval:
            continue
        args = [cval[a] for a, _ in n.args]
        if fuse_epilogue and get_op(n.op).has(Prop.ELEMENTWISE):
            cval[i] = (n.op, n.attr_dict, args)
        else:
            cval[i] = on_tiles(n, [epi.materialise(a) for a in args])
    for o in outs:
        c.output(epi.materialise(cval[o]), omap_for(o, caxes))
    res = mg.custom(c.build(check=False), [*parts, *extra_args], [nodes[o].outs[0].shape for o in outs])
    mg.output(*[res[k] for k in range(len(outs))])
    steps.add("partition.split_kv")
    if second:
        steps.add("partition.split_pass")
    if epi.fused:
        steps.add("fuse.epilogue")
    return Lowered(mg, sorted(steps), cfg)


def unfused(g: Graph) -> Lowered:
    """Every kernel op its own kernel (the baseline)."""
    return Lowered(MuGraph.from_graph(g), ["partition.unfused"], None)


#: how :func:`lower_all` ranks the lowerings of a cut's sides and of a program's parts to keep the cheapest: a
#: μGraph -> sortable key. The search passes the cost model as the backend launches (``verimirage.pipeline.pricing.
#: cost``); this package has no default (the cost model alone, without the backend's launch model, keeps other
#: sides of some cuts)
Rank = Callable[[MuGraph], Any]

#: lowerings of each side of a cut that are joined (the cheapest by the cost model), and cuts tried per program
CUT_KEEP = 3
CUT_MAX = 4
#: cuts nested in a side of a cut (2: a side may be cut once more). 1 by default: at 2 the decoder layer's output
#: projection reads its blocked flatten (a reshape kernel) in a K loop, and that candidate is not proved yet (the
#: loop's per-iteration sums of r0[(256*it + r)//512, ...] are simplified apart per iteration and do not fold back;
#: the region's verified re-search then spent minutes on its siblings)
CUT_DEPTH = 1


def _term_inputs(t: Term, acc: dict[str, None]) -> None:
    if t.op == "input":
        acc[t.attr("name")] = None
    for a in t.args:
        _term_inputs(a, acc)


def cut_points(g: Graph) -> list[int]:
    """Nodes of ``g`` worth materialising: computed (not input) operands of a contraction, smaller than the
    largest input (an attention matrix, larger than Q, K and V, is never worth a round trip through device
    memory) or as large and computed without a contraction, that are not themselves a program output; at most
    :data:`CUT_MAX`, the producers nearest the outputs first."""
    nodes = node_list(g)
    outs = {a for a, _ in output_refs(g)}
    budget = max((t.type.numel for t in g.inputs), default=0)
    # values computed through a contraction (an attention matrix, Q K^T) as large as the largest input are
    # no cut points; a map of the inputs as large as them is (rotary's rotated K: written once, instead of
    # rotated again by every block of queries)
    contracted: list[bool] = []
    for n in nodes:
        contracted.append(get_op(n.op).has(Prop.CONTRACTION) or any(contracted[a] for a, _ in n.args))
    pts: list[int] = []
    for n in nodes:
        if not get_op(n.op).has(Prop.CONTRACTION):
            continue
        for pos, (a, k) in enumerate(n.args):
            src = nodes[a]
            size = src.outs[k].numel
            if (src.op == "input" or a in outs or a in pts or size > budget or (size == budget and contracted[a])
                    or _scaled_along_contraction(nodes, src, pos)):
                continue
            pts.append(a)
    pts += [i for i in _gridless_products(g) if i not in outs and i not in pts and nodes[i].outs[0].numel <= budget]
    pts += [i for i in _reduced_reductions(g) if i not in outs and i not in pts]
    return sorted(pts, reverse=True)[:CUT_MAX]


def _scaled_along_contraction(nodes: Sequence[Any], src: Any, pos: int) -> bool:
    """Whether ``src``, operand ``pos`` of a product, is a full-size value times a vector along the contracted dim
    (``x * w`` on the left, ``reshape(w, (k, 1)) * m`` on the right: a norm's weight applied before or after its
    projection). Materialised, it is stored and then rounded to its dtype for ``tl.dot``: ``|x w|`` or ``|w m|``
    above 65504 is inf in fp16 where the source's operand (``x r w``, normalised) is finite, which only the
    numeric floating-point check sees and programs above its size limit do not get (red team, session 14);
    lowered in one kernel, the weight goes back to the activation side, normalised (:func:`_norm_operands`)."""
    op = get_op(src.op)
    if op.has(Prop.CONTRACTION) or tuple(op.scales_with) != (0, 1):  # (an elementwise product: scales with both)
        return False
    t = src.outs[0]
    dim = t.rank - 1 if pos == 0 else t.rank - 2
    if t.rank < 2 or t.shape[dim] < 2:
        return False
    # one row (every other dim 1): the value is a vector too, so a weight is told from an activation by what it
    # reads: a norm's weight reads no input the other factor reads (a gated MLP's silu(x Wg) * (x Wu) at one token,
    # both of x, is no norm weight)
    row = all(n == 1 for j, n in enumerate(t.shape) if j != dim)
    for i, (a, k) in enumerate(src.args):
        s = (1,) * (t.rank - nodes[a].outs[k].rank) + tuple(nodes[a].outs[k].shape)
        others = set().union(*(_reads(nodes, b) for j, (b, _) in enumerate(src.args) if j != i)) if row else set()
        if all(n == 1 for j, n in enumerate(s) if j != dim) and s[dim] == t.shape[dim] and \
                not (_reads(nodes, a) & others):
            return True
    return False


def _reads(nodes: Sequence[Any], i: int) -> set[int]:
    """The input nodes node ``i`` reads, directly or through other nodes."""
    seen, todo, out = set(), [i], set()
    while todo:
        j = todo.pop()
        if j in seen:
            continue
        seen.add(j)
        if nodes[j].op == "input":
            out.add(j)
        todo += [a for a, _ in nodes[j].args]
    return out


def _materialises_scaled_operand(g: Graph) -> bool:
    """Whether some product of ``g`` reads a computed operand scaled along its contracted dim
    (:func:`_scaled_along_contraction`), which ``g``'s unfused lowering would store and round to its dtype."""
    nodes = node_list(g)
    return any(_scaled_along_contraction(nodes, nodes[a], pos) for n in nodes if get_op(n.op).has(Prop.CONTRACTION)
               for pos, (a, _) in enumerate(n.args))


def _reduced_reductions(g: Graph) -> list[int]:
    """Computed operands of a reduction that are themselves results of a reduction, at most 1/16 of the largest
    input (a mean loss over per-row losses: cross-entropy's per-token NLL, one value a row). The one-kernel
    lowerings of such a program have no data-parallel dim (its output is a scalar), so its rows are split only as
    the outer reduction's KV splits, at most ``max_splits`` of them: at 2048 tokens, 64 rows of 32,000 a block.
    Materialised, the per-row values get the row grid (and vocabulary splits) they get on their own, and the
    outer reduction is a small kernel of its own."""
    nodes = node_list(g)
    budget = max((t.type.numel for t in g.inputs), default=0)
    # row statistics: reduction results, and maps of row statistics (with any inputs) no larger than them
    # (cross-entropy's m + log(sum e) - sum(t x)); not the maps of a full-size value by a statistic (an attention's
    # exp(s - max s) is as large as s: materialising it would be the round trip the fused kernels avoid)
    stat: list[bool] = []
    out: list[int] = []
    for n in nodes:
        red = get_op(n.op).has(Prop.REDUCTION)
        computed = [(a, k) for a, k in n.args if nodes[a].op != "input" and not get_op(nodes[a].op).has(Prop.CONSTANT)]
        stat.append(bool(n.outs) and (red or (bool(computed) and all(stat[a] for a, _ in computed) and all(
            n.outs[0].numel <= nodes[a].outs[k].numel for a, k in computed))))
        if not red or not n.args:
            continue
        a, k = n.args[0]
        if nodes[a].op != "input" and stat[a] and nodes[a].outs[k].numel * 16 <= budget and a not in out:
            out.append(a)
    return out


def _gridless_products(g: Graph) -> list[int]:
    """Contractions whose result's dims the program cannot split over blocks (each is reduced or kept whole
    later: an RMSNorm of a projection's output over its columns, so every one-kernel lowering is one block
    streaming the whole weight). Materialised, the product gets the grids it gets on its own and the rest
    reads it (``partition.cut``: the decoder layer's output projection, residual and RMSNorm)."""
    try:
        an = analyse(g)
    except GraphError:
        return []
    dp = set(an.data_parallel())
    nodes = node_list(g)
    out = []
    for i, n in enumerate(nodes):
        labs = [lab for lab in an.labels.get(i, ()) if lab is not None and an.size[lab] > 1]
        if not get_op(n.op).has(Prop.CONTRACTION) or not labs:
            continue
        if not dp.intersection(labs):
            out.append(i)
            continue
        # its larger operand (the weights) indexed by no splittable label: every block streams all of it (the
        # decoder layer's output projection + RMSNorm at batch 8: a grid over the 8 rows only, each block the
        # whole 33.6 MB weight; cut, the product gets its column grid and the norm one kernel with the residual)
        big = max(n.args, key=lambda r: nodes[r[0]].outs[r[1]].numel)
        blabs = [lab for lab in an.labels.get(big[0], ()) if lab is not None and an.size[lab] > 1]
        if blabs and not dp.intersection(blabs) and nodes[big[0]].outs[big[1]].numel > 4 * n.outs[0].numel:
            out.append(i)
    return out


def _split_at(g: Graph, v: int, name: str) -> tuple[Graph, Graph] | None:
    """(the program computing node ``v``; ``g`` reading ``v`` as input ``name``), inputs in ``g``'s order."""
    nodes = node_list(g)
    memo: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        memo[i] = Term(n.op, n.attrs, tuple(memo[a] for a, _ in n.args))
    cut_t = memo[v]
    hole = Term("input", (("name", name),), ())
    rest: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        rest[i] = hole if i == v else Term(n.op, n.attrs, tuple(rest[a] for a, _ in n.args))
    types = {t.name: t.type for t in g.inputs if t.name is not None}
    types[name] = nodes[v].outs[0]
    outs = [rest[a] for a, _ in output_refs(g)]
    used1: dict[str, None] = {}
    _term_inputs(cut_t, used1)
    used2: dict[str, None] = {}
    for t in outs:
        _term_inputs(t, used2)
    if name not in used2:
        return None
    order = [*[t.name for t in g.inputs if t.name is not None], name]
    try:
        g1 = term_to_graph([cut_t], [(n, types[n]) for n in order if n in used1])
        g2 = term_to_graph(outs, [(n, types[n]) for n in order if n in used2])
    except GraphError:
        return None
    return g1, g2


def _splice(nodes: list[Any], env: dict[str, tuple[int, int]], mg: MuGraph) -> dict[tuple[int, int], tuple[int, int]]:
    """Append ``mg``'s nodes to ``nodes``, its inputs read from ``env`` (input name -> value); the map from
    ``mg``'s values to the appended ones."""
    from ..ir.graph import Node

    remap: dict[tuple[int, int], tuple[int, int]] = {}
    for i, n in enumerate(node_list(mg)):
        if n.op == "input":
            remap[(i, 0)] = env[n.attr("name")]
            continue
        nodes.append(Node(n.op, tuple(remap[a] for a in n.args), n.attrs, n.outs))
        for k in range(len(n.outs)):
            remap[(i, k)] = (len(nodes) - 1, k)
    return remap


def join(g: Graph, parts: Sequence[tuple[MuGraph, str | None]]) -> MuGraph:
    """One μGraph running ``parts`` in order: each part's inputs are ``g``'s inputs or earlier parts'
    results (a part given with a name is read under that name by the later parts: its single output);
    the last part's outputs are the result."""
    from ..ir.graph import Node

    nodes: list[Node] = []
    env: dict[str, tuple[int, int]] = {}
    for t in g.inputs:
        n = t.node
        nodes.append(n)
        env[str(t.name)] = (len(nodes) - 1, 0)
    last: list[tuple[int, int]] = []
    for mg, name in parts:
        remap = _splice(nodes, env, mg)
        last = [remap[r] for r in output_refs(mg)]
        if name is not None:
            env[name] = last[0]
    return MuGraph._from_parts(nodes, last)


def cut_lowerings(g: Graph, *, rank: Rank, grids: Sequence[int] | None = None,
                  franges: Sequence[int] | None = None, max_splits: int = 32, keep: int = CUT_KEEP,
                  depth: int = CUT_DEPTH, tail: bool = True) -> list[Lowered]:
    """Lowerings of ``g`` with one contraction operand materialised (``partition.cut``): for each of
    :func:`cut_points`, the ``keep`` cheapest lowerings (by ``rank``, see :data:`Rank`) of the part computing it
    joined with the ``keep`` cheapest of the rest. Each side is lowered with cuts of its own up to ``depth`` - 1
    levels deeper (a projection cut from its norm epilogue may itself read a flattened operand that only a cut lets
    it tile); a pair of two unfused sides (the unfused baseline again) is skipped."""
    out: list[Lowered] = []
    taken = {t.name for t in g.inputs}
    for v in cut_points(g):
        name = f"cut_{v}"
        while name in taken:  # (a program input named cut_8 made the cut of node 8 read that input: no lowering)
            name += "_"
        split = _split_at(g, v, name)
        if split is None:
            continue
        sides = []
        for part in split:
            lows, _ = lower_all(part, grids=grids, franges=franges, max_splits=max_splits, cuts=depth > 1,
                                rank=rank, cut_depth=depth - 1, components=True, tail=tail)
            scored = sorted(((rank(lo.mugraph), i) for i, lo in enumerate(lows)), key=lambda p: p[0])
            sides.append([lows[i] for _, i in scored[:keep]])
        for a, b in itertools.product(*sides):
            if a.steps == ["partition.unfused"] and b.steps == ["partition.unfused"]:
                continue
            mg = join(g, [(a.mugraph, name), (b.mugraph, None)])
            steps = ["partition.cut", *dict.fromkeys([*a.steps, *b.steps])]
            out.append(Lowered(mg, steps, b.config or a.config))
    return out


def connected_parts(nodes: Sequence[Any], chunk: Sequence[int]) -> list[list[int]]:
    """``chunk`` (node indices of ``nodes``) split into its connected parts: ops linked by reading one another's
    values (a value from outside ``chunk`` links nothing), in order of their first op."""
    part = {i: i for i in chunk}

    def root(i: int) -> int:
        while part[i] != i:
            part[i] = part[part[i]]
            i = part[i]
        return i

    for i in chunk:
        for a, _ in nodes[i].args:
            if a in part:
                part[root(a)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in chunk:
        groups.setdefault(root(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _output_components(g: Graph) -> list[list[int]]:
    """``g``'s outputs (positions) grouped by the computations they share (:func:`connected_parts` of its ops;
    the program's inputs link nothing): one group for a connected program; [] when an output is an input or a
    constant alone (nothing to lower apart)."""
    nodes = node_list(g)
    outs = output_refs(g)
    if any(nodes[a].op == "input" or not nodes[a].args for a, _ in outs):
        return []
    part_of = {i: k for k, ids in enumerate(connected_parts(nodes, [i for i, n in enumerate(nodes)
                                                                       if n.op != "input"])) for i in ids}
    groups: dict[int, list[int]] = {}
    for k, (a, _) in enumerate(outs):
        groups.setdefault(part_of[a], []).append(k)
    return list(groups.values())


def _join_parallel(g: Graph, parts: Sequence[tuple[MuGraph, Sequence[int]]]) -> MuGraph:
    """One μGraph running independent ``parts`` (each reading only ``g``'s inputs) one after another; part ``p``'s
    outputs are ``g``'s outputs at positions ``p[1]``."""
    from ..ir.graph import Node

    nodes: list[Node] = []
    env: dict[str, tuple[int, int]] = {}
    for t in g.inputs:
        nodes.append(t.node)
        env[str(t.name)] = (len(nodes) - 1, 0)
    result: dict[int, tuple[int, int]] = {}
    for mg, positions in parts:
        remap = _splice(nodes, env, mg)
        for pos, r in zip(positions, output_refs(mg), strict=True):
            result[pos] = remap[r]
    return MuGraph._from_parts(nodes, [result[k] for k in range(len(result))])


def component_lowerings(g: Graph, *, rank: Rank, grids: Sequence[int] | None = None,
                        franges: Sequence[int] | None = None, max_splits: int = 32, keep: int = CUT_KEEP,
                        cut_depth: int = CUT_DEPTH, tail: bool = True) -> list[Lowered]:
    """Lowerings of a program of independent parts (outputs computed from the inputs by disjoint ops): each part
    lowered on its own (its ``keep`` cheapest by ``rank``), then run one after another (``partition.components``).
    One kernel over unrelated parts has no block axis that every output shares, so its only grid is one block
    (the decoder layer at batch 8: the key's reshape to heads and the query's rotary in one 8.5 us block on an
    H100; a cut's side is such a program when the cut value fed two computations). [] for a connected program."""
    comps = _output_components(g)
    if len(comps) < 2:
        return []
    nodes = node_list(g)
    memo: dict[int, Term] = {}
    for i, n in enumerate(nodes):
        memo[i] = Term(n.op, n.attrs, tuple(memo[a] for a, _ in n.args))
    outs = output_refs(g)
    types = input_types(g)
    sides: list[list[tuple[Lowered, Sequence[int]]]] = []
    for positions in comps:
        terms = [memo[outs[k][0]] for k in positions]
        if any(outs[k][1] for k in positions):
            return []  # (a multi-output node: kept whole)
        used: dict[str, None] = {}
        for t in terms:
            _term_inputs(t, used)
        try:
            sub = term_to_graph(terms, [(n, t) for n, t in types if n in used])
        except GraphError:
            return []
        lows, _ = lower_all(sub, grids=grids, franges=franges, max_splits=max_splits, cuts=cut_depth > 0,
                            rank=rank, cut_depth=cut_depth, tail=tail)
        scored = sorted(((rank(lo.mugraph), i) for i, lo in enumerate(lows)), key=lambda p: p[0])
        sides.append([(lows[i], positions) for _, i in scored[:keep]])
    out = []
    for combo in itertools.product(*sides):
        if all(lo.steps == ["partition.unfused"] for lo, _ in combo):
            continue
        mg = _join_parallel(g, [(lo.mugraph, pos) for lo, pos in combo])
        steps = ["partition.components", *dict.fromkeys(s for lo, _ in combo for s in lo.steps)]
        out.append(Lowered(mg, steps, next((lo.config for lo, _ in combo if lo.config is not None), None)))
    return out


def lower_all(
    g: Graph,
    *,
    rank: Rank,
    grids: Sequence[int] | None = None,
    franges: Sequence[int] | None = None,
    max_splits: int = 32,
    cuts: bool = True,
    cut_depth: int = CUT_DEPTH,
    components: bool = False,
    tail: bool = True,
) -> tuple[list[Lowered], dict[str, int]]:
    """Every feasible lowering of ``g`` (plus the unfused baseline, and with ``cuts`` those of
    :func:`cut_lowerings` up to ``cut_depth`` cuts deep, ranked by ``rank``; with ``components`` those of
    :func:`component_lowerings`); and rejection counts by reason. (A cut's sides are lowered with
    ``components``; a region's program is split into its connected parts before its search, by
    :mod:`verimirage.pipeline.regions`, so a merge of regions is searched whole.)"""
    g = normalise(g)
    an = split_input_uses(g)
    # (no unfused baseline that would store a product's operand scaled along its contracted dim: see
    # _scaled_along_contraction; the program's other forms keep theirs)
    out = [] if _materialises_scaled_operand(g) else [unfused(g)]
    rejected: dict[str, int] = {}
    bad_struct: dict[tuple[Any, ...], str] = {}
    analyses = [an]
    if not an.alias and len(_output_components(g)) > 1:
        zipped = analyse(g, zip_parts=True)
        if zipped.data_parallel() != an.data_parallel():
            analyses.append(zipped)  # one kernel over the parts (each block a tile of every part)
    for k, a_n in enumerate(analyses):
        for cfg in configs(a_n, grids=grids, franges=franges, max_splits=max_splits, tail=tail):
            # (a structure infeasible for a whole-tile combine says nothing of the loop combine: each has its key)
            skey = (k, tuple(lab for lab, _ in cfg.grid), cfg.loop, cfg.splits > 1, cfg.combine_whole,
                    cfg.combine_refine > 1)
            if skey in bad_struct:
                rejected[bad_struct[skey]] = rejected.get(bad_struct[skey], 0) + 1
                continue
            try:
                out.append(build(a_n, cfg))
            except Infeasible as e:
                reason = str(e).split("\n")[0]
                if "divide" not in reason and "imap" not in reason:
                    bad_struct[skey] = reason
                rejected[reason] = rejected.get(reason, 0) + 1
    if cuts:
        out += cut_lowerings(g, grids=grids, franges=franges, max_splits=max_splits, rank=rank, depth=cut_depth,
                             tail=tail)
    if components:
        out += component_lowerings(g, grids=grids, franges=franges, max_splits=max_splits, rank=rank,
                                   cut_depth=cut_depth if cuts else 0, tail=tail)
    return [low2 for low in out if (low2 := _norm_operands(low)) is not None], rejected


def _norm_operands(low: Lowered) -> Lowered | None:
    """``low`` with its norm-weighted weight tiles' products reading the source's normalised operand instead
    (:func:`~verimirage.rewrite.stabilise.prologue_norm_scales`: a norm in its projection's prologue, finite and
    as accurate wherever the source is); None (dropped) where such a product has no norm statistic to bound it."""
    from .stabilise import prologue_norm_scales

    try:
        mg = prologue_norm_scales(low.mugraph)
    except ValueError:
        return None
    if mg is None:
        return low
    return dataclasses.replace(low, mugraph=mg, steps=[*low.steps, "partition.prologue_norm_scales"])


def input_types(g: Graph) -> list[tuple[str, TensorType]]:
    """(name, type) of ``g``'s inputs."""
    return [(t.name, t.type) for t in g.inputs if t.name is not None]


__all__ = [
    "Analysis", "Config", "Infeasible", "Lowered", "analyse", "build", "component_lowerings", "configs",
    "cut_lowerings", "cut_points",
    "graph_terms", "join", "lower_all", "normalise", "split_input_uses", "unfused",
]
