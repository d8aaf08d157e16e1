"""Region splitting: a program of any length gets at least the fusions its parts get on their own.

One search lowers a whole kernel graph into a single fused kernel (or a kernel plus a combine kernel) or
leaves it unfused; a long program (a chain of layers, a decoder layer) has no single-kernel form, and its
search returns one kernel per op. Here the program is cut into *regions* small enough for one search:

1. **split** — the live ops in program order, cut before every matmul (the op a fusion is built around;
   the ops between two matmuls are its prologue/epilogue) and after :attr:`SearchOptions.region_ops` ops;
   every region is a contiguous run of a topological order, so the regions form a DAG;
2. **search** — each region as a kernel graph of its own (inputs: the program's inputs it reads and the
   values earlier regions produce, renamed canonically so identical regions are searched once; outputs:
   the values later regions or the program's outputs read), with the existing phases (rules, saturate,
   extract, lower, verify, attribute), its best verified candidate kept;
3. **reconsider the boundaries** — walking the regions in order, two neighbours are searched as one region
   (at most ``region_ops`` ops) and merged when that one search's best costs less than the two apart: an
   elementwise epilogue or a norm prologue lands in its neighbour's kernel this way, and so do whole
   layers when fusing them pays; then each region is searched with *all* the regions that read its values,
   wherever they lie in the order (a norm read by three projections fuses into their prologues only when
   all three take it), where that union is convex, kept when cheaper (:func:`_merge_with_readers`); then each
   region that reads two or more regions with all of them (:func:`_merge_with_producers`); with
   ``window_ops`` (:attr:`SearchOptions.window_ops`, off by default), runs of three consecutive regions too
   (:func:`_merge_windows`: an attention's two products and its softmax as one split-KV kernel pair). A union
   that falls into several connected parts is also searched as its parts, one region each
   (:func:`_searched_union`): a merge can so move ops between computations (the key's rotary from a region of
   rotaries to the key projection's);
4. **compose** — the regions' μGraphs spliced into one μGraph over the program's inputs (the glue: each
   region's inputs wired to the values they stand for; :mod:`verimirage.smt.glue`). Each region's μGraph is
   proved against its region on its own, and the composition is proved by congruence: the regions partition
   the program and the μGraph is exactly their splice, which the composed certificate's checker re-derives
   (:mod:`verimirage.smt.certificate`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..ir.graph import Graph, MuGraph, live_nodes, node_list, output_refs
from ..rewrite.partition import connected_parts
from ..smt.glue import Region, compose, region_of

log = logging.getLogger(__name__)

#: ops a region starts at (a fusion is built around them; what follows up to the next one is their epilogue)
ANCHORS = frozenset({"matmul"})


@dataclass
class RegionReport:
    """How one region of a split program was searched (``SearchReport.regions``)."""

    nodes: tuple[int, ...]  # the program's node indices it covers
    ops: list[str]
    kernels: int  # kernel launches of its chosen μGraph
    cost_us: float  # the cost model's estimate of its chosen μGraph
    how: str  # "searched" | "unfused (no verified candidate)" | ... and "merged" when boundaries moved
    rules: tuple[str, ...] = ()

    def __str__(self) -> str:
        span = f"%{self.nodes[0]}..%{self.nodes[-1]}" if len(self.nodes) > 1 else f"%{self.nodes[0]}"
        ops = ", ".join(self.ops) if len(self.ops) <= 12 else ", ".join(self.ops[:12]) + f", ... ({len(self.ops)})"
        return f"{span} [{ops}] -> {self.kernels} kernel(s), {self.cost_us:.1f} us est. ({self.how})"


@dataclass
class SplitOutcome:
    """The regions chosen, each with its μGraph, cost and how it was found; and search statistics."""

    regions: list[Region]
    mugraphs: list[MuGraph]
    reports: list[RegionReport]
    searches: int = 0  # region searches run (identical regions are searched once)
    reused: int = 0  # region searches answered from an identical region searched before
    merges_tried: int = 0
    merges_kept: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def initial_chunks(graph: Graph, region_ops: int) -> list[list[int]]:
    """The program's live non-input nodes in order, cut before every anchor op and after ``region_ops`` ops;
    then each layout op joins its reader's chunk (:func:`_layout_to_consumer`)."""
    nodes = node_list(graph)
    live = live_nodes(nodes, output_refs(graph))
    chunks: list[list[int]] = []
    cur: list[int] = []
    for i, n in enumerate(nodes):
        if n.op == "input" or i not in live:
            continue
        if cur and (n.op in ANCHORS or len(cur) >= region_ops):
            chunks.append(cur)
            cur = []
        cur.append(i)
    if cur:
        chunks.append(cur)
    return _norm_to_readers(graph, _layout_to_consumer(graph, chunks))


#: ops a projection can take in its prologue (the rows' statistic recomputed per block, rewrite.stabilise's
#: :func:`~verimirage.rewrite.stabilise.norm_into_projections`)
PROLOGUE = frozenset({"rms_norm"})


def _norm_to_readers(graph: Graph, chunks: list[list[int]]) -> list[list[int]]:
    """``chunks`` with each norm (:data:`PROLOGUE`, not a program output) that ends a chunk of other ops and
    whose readers are all products, the next chunk's first, moved to the start of that chunk: at the end of
    the previous product's epilogue (a residual add, then the norm) its region must write the normalised rows
    for the next products, where with them their kernels can take it in the prologue (the neighbour pass
    then merges the readers' chunks when one search of them costs less: the norm of a gated FFN into both
    projections). A norm alone in its chunk (the layer's first, read by three projections) stays: whether its
    readers take it is the reader merge's call (:func:`_merge_with_readers`)."""
    nodes = node_list(graph)
    outs = {r[0] for r in output_refs(graph)}
    readers: dict[int, set[int]] = {}
    for j, n in enumerate(nodes):
        for a in n.args:
            readers.setdefault(a[0], set()).add(j)
    out = [list(ch) for ch in chunks]
    for k in range(len(out) - 1):
        ch, nxt = out[k], out[k + 1]
        i = ch[-1] if len(ch) > 1 else -1
        if i < 0 or nodes[i].op not in PROLOGUE or i in outs or not nxt:
            continue
        rd = readers.get(i, set())
        if rd and all(nodes[j].op == "matmul" for j in rd) and min(rd) == nxt[0]:
            out[k + 1] = [ch.pop(), *nxt]
    return out


#: ops that only re-index their operand: a region boundary right after one makes its kernel a copy of the whole
#: operand (a KV cache's transpose), where in its consumer's region the product reads the operand through it
LAYOUT = frozenset({"reshape", "transpose", "permute"})


def _layout_to_consumer(graph: Graph, chunks: list[list[int]]) -> list[list[int]]:
    """``chunks`` with each layout op (:data:`LAYOUT`, not a program output) whose readers are all in one later
    chunk moved into that chunk (last first, so a chain of them moves together); empty chunks dropped."""
    nodes = node_list(graph)
    where = {i: k for k, ch in enumerate(chunks) for i in ch}
    readers: dict[int, set[int]] = {}
    for j, n in enumerate(nodes):
        for a in n.args:
            readers.setdefault(a[0], set()).add(j)
    outs = {r[0] for r in output_refs(graph)}
    for i in sorted(where, reverse=True):
        ks = {where[j] for j in readers.get(i, ()) if j in where}
        if nodes[i].op in LAYOUT and i not in outs and len(ks) == 1 and min(ks) > where[i]:
            where[i] = min(ks)
    moved = [sorted(i for i in where if where[i] == k) for k in range(len(chunks))]
    return [part for ch in moved if ch for part in connected_parts(nodes, ch)]


def split_search(graph: Graph, region_ops: int, search: Callable[[Graph], tuple[MuGraph, float, str,
                                                                                tuple[str, ...]]],
                 *, deadline: float | None = None, window_ops: int = 0) -> SplitOutcome:
    """Split ``graph`` into regions, search each (``search(region_graph)`` -> (μGraph, estimated seconds,
    how, rules)), merge neighbours whose joint search costs less, and return the regions with their μGraphs.

    Identical regions (the same program text under canonical input names) are searched once. ``deadline``
    (``time.perf_counter()`` value): past it, no more merges are tried. ``window_ops`` (0: off): then runs of three
    consecutive regions of at most that many ops are searched as one too (:func:`_merge_windows`)."""
    t0 = time.perf_counter()
    memo: dict[str, tuple[MuGraph, float, str, tuple[str, ...]]] = {}
    out = SplitOutcome([], [], [])

    def searched(reg: Region) -> tuple[MuGraph, float, str, tuple[str, ...]]:
        key = str(reg.graph)
        if key in memo:
            out.reused += 1
            return memo[key]
        out.searches += 1
        memo[key] = search(reg.graph)
        return memo[key]

    chunks = initial_chunks(graph, region_ops)
    if not chunks:
        return out
    first = region_of(graph, chunks[0])
    cur: list[_Searched] = [(first, searched(first))]  # (the parts of a kept merge: one region each)
    cur_merged = False
    done: list[tuple[Region, tuple[MuGraph, float, str, tuple[str, ...]], bool]] = []
    for ch in chunks[1:]:
        nxt = region_of(graph, ch)
        nxt_res = searched(nxt)
        cur_nodes = [i for reg, _ in cur for i in reg.nodes]
        if len(cur_nodes) + len(nxt.nodes) <= region_ops and (deadline is None or time.perf_counter() < deadline):
            out.merges_tried += 1
            both = _searched_union(graph, [*cur_nodes, *nxt.nodes], searched, region_ops)
            if both is not None and _total(both) < _total(cur) + nxt_res[1] - 1e-12:
                out.merges_kept += 1
                cur, cur_merged = both, True
                continue
        done += [(reg, res, cur_merged) for reg, res in cur]
        cur, cur_merged = [(nxt, nxt_res)], False
    done += [(reg, res, cur_merged) for reg, res in cur]
    tagged = [(reg, res, "merged across a boundary" if merged else "") for reg, res, merged in done]
    tagged = _merge_with_readers(graph, tagged, region_ops, searched, out, deadline)
    tagged = _merge_with_producers(graph, tagged, region_ops, searched, out, deadline)
    if window_ops:
        tagged = _merge_windows(graph, tagged, window_ops, searched, out, deadline)
    for reg, (mg, est, how, rules), note in tagged:
        out.regions.append(reg)
        out.mugraphs.append(mg)
        ops = [n.op for n in node_list(reg.graph) if n.op != "input"]
        out.reports.append(RegionReport(reg.nodes, ops, mg.num_kernels, est * 1e6,
                                        f"{how}, {note}" if note else how, rules))
    out.seconds = time.perf_counter() - t0
    return out


_Tagged = tuple[Region, tuple[MuGraph, float, str, tuple[str, ...]], str]
_Searched = tuple[Region, tuple[MuGraph, float, str, tuple[str, ...]]]


def _total(parts: list[_Searched]) -> float:
    """The estimated seconds of searched regions together."""
    return sum(res[1] for _, res in parts)


def _searched_union(graph: Graph, nodes: list[int],
                    searched: Callable[[Region], tuple[MuGraph, float, str, tuple[str, ...]]],
                    region_ops: int | None = None) -> list[_Searched] | None:
    """A union of regions (``nodes``) searched as one region (where it has at most ``region_ops`` ops; None: any
    size) and, where it falls into several connected parts of at most ``region_ops`` ops each, each part as a
    region of its own; the cheaper of the two (the parts on a tie), None where neither applies. One kernel over
    unrelated parts has no grid axis they share (it is found only where the parts' tiles zip,
    :func:`~verimirage.rewrite.partition.analyse`); a part may be none of the regions merged: the key projection
    with its rotary, where the regions were the projection and the rotary with the value's reshapes (decode at
    batch 1: the projection's split-K combine then carries the rotary, as ``benchmarks/layer.py regroup`` found it).
    Each part of a convex union is convex: a path leaving a part and coming back would leave the union (no op of
    another part reads it)."""
    fits = (lambda ns: True) if region_ops is None else (lambda ns: len(ns) <= region_ops)
    options: list[list[_Searched]] = []
    parts = connected_parts(node_list(graph), sorted(nodes))
    if len(parts) > 1 and all(fits(p) for p in parts):
        options.append([(reg, searched(reg)) for reg in (region_of(graph, p) for p in parts)])
    if fits(nodes):
        whole = region_of(graph, nodes)
        options.append([(whole, searched(whole))])
    return min(options, key=_total) if options else None  # (the first on a tie: the parts)


def _merge_with_readers(graph: Graph, regs: list[_Tagged], region_ops: int,
                        searched: Callable[[Region], tuple[MuGraph, float, str, tuple[str, ...]]], out: SplitOutcome,
                        deadline: float | None) -> list[_Tagged]:
    """The boundaries reconsidered past neighbours: each region searched as one with *every* region that reads
    its values (a norm whose output three projections read goes into their prologues only when all three take
    it: with one, its output is still written for the others), wherever they lie in the order, when the union
    has at most ``region_ops`` ops and is convex (no path leaves it and comes back); kept when that one search's
    best costs less than the parts'. Repeated until nothing changes; returns the regions in a topological order."""
    # (one reader right after it is tried too: the neighbour pass searched that pair only if the two were neighbours
    # in the program's order, and a region placed between them there -- the value projection's reshape between the
    # key's slices and its rotary at batch 8 -- moves away when the regions are put back in a topological order; a
    # pair it did search is answered from the memo)
    return _merge_related(graph, regs, region_ops, searched, out, deadline, readers=True)


def _merge_with_producers(graph: Graph, regs: list[_Tagged], region_ops: int,
                          searched: Callable[[Region], tuple[MuGraph, float, str, tuple[str, ...]]],
                          out: SplitOutcome, deadline: float | None) -> list[_Tagged]:
    """The reader pass's dual: each region that reads the values of two or more regions searched with all of them,
    as the connected parts of their union (each part at most ``region_ops`` ops; the union whole too where it fits),
    when the union is convex and falls into two or more parts (a connected one is a plain fusion, the neighbour and
    reader passes' to weigh; skipping it keeps this pass to a few searches); kept when cheaper than the regions
    apart. Where a region holds pieces of several
    computations (decode at batch 1: the q, k and v rotaries with the value's reshapes, after the rotary regions
    merged), each piece goes back to the computation it continues: the union of the projections and that region
    falls into one part a projection (q with its rotary, k with its rotary: the split-K combine carries it, v with
    its reshapes), which no merge of one region with its readers forms (the key projection's one reader is the whole
    rotary region). Repeated until nothing changes; returns the regions in a topological order."""
    return _merge_related(graph, regs, region_ops, searched, out, deadline, readers=False)


def _merge_related(graph: Graph, regs: list[_Tagged], region_ops: int,
                   searched: Callable[[Region], tuple[MuGraph, float, str, tuple[str, ...]]], out: SplitOutcome,
                   deadline: float | None, *, readers: bool) -> list[_Tagged]:
    """The reader pass (``readers``: a region with every region reading its values, the union at most
    ``region_ops`` ops) or the producer pass (a region with the two or more regions whose values it reads, where that
    union falls into two or more connected parts of at most ``region_ops`` ops each): each convex union searched
    (:func:`_searched_union`), kept when cheaper than its regions apart; repeated until nothing changes."""
    what = "reader(s)" if readers else "producer(s)"
    changed = True
    while changed and (deadline is None or time.perf_counter() < deadline):
        changed = False
        for k, (reg, _res, _) in enumerate(regs):
            mine = set(reg.outputs if readers else reg.inputs)
            related = [m for m, (r, _, _) in enumerate(regs)
                       if m != k and mine & set(r.inputs if readers else r.outputs)]
            members = [k, *related]
            nodes = sorted(i for m in members for i in regs[m][0].nodes)
            if (len(related) < (1 if readers else 2) or (readers and len(nodes) > region_ops)
                    or not _convex(graph, set(nodes))):
                continue
            if not readers and len(connected_parts(node_list(graph), nodes)) < 2:
                continue  # (a connected union is a fusion the neighbour and reader passes weigh; this pass re-parts)
            both = _searched_union(graph, nodes, searched, region_ops)
            if both is None:
                continue
            out.merges_tried += 1
            parts = sum(regs[m][1][1] for m in members)
            log.info("regions: %s with its %d %s: %d kernel(s) in %d region(s), %.1f us est. (apart: %d, %.1f us)",
                     [node_list(graph)[i].op for i in reg.nodes], len(related), what,
                     sum(res[0].num_kernels for _, res in both), len(both), _total(both) * 1e6,
                     sum(regs[m][1][0].num_kernels for m in members), parts * 1e6)
            if _total(both) < parts - 1e-12:
                out.merges_kept += 1
                note = (f"merged with the {len(related)} region(s) reading it" if readers
                        else f"merged with the {len(related)} region(s) it reads")
                regs = _merged(regs, members, [(r, res, note) for r, res in both])
                changed = True
                break
    return regs


def _merged(regs: list[_Tagged], members: list[int], union: list[_Tagged]) -> list[_Tagged]:
    """``regs`` with the regions at ``members`` replaced by ``union`` (their union's region, or its connected parts'
    regions), in a topological order."""
    return _in_order([*(r for m, r in enumerate(regs) if m not in members), *union])


#: regions a window of :func:`_merge_windows` spans
WINDOW = 3


def _merge_windows(graph: Graph, regs: list[_Tagged], window_ops: int,
                   searched: Callable[[Region], tuple[MuGraph, float, str, tuple[str, ...]]], out: SplitOutcome,
                   deadline: float | None) -> list[_Tagged]:
    """The boundaries reconsidered across :data:`WINDOW` consecutive regions (in a topological order): searched as
    one region when the union has at most ``window_ops`` ops and is convex, kept when that search's best costs
    less than the parts'. A fusion that pays only across two boundaries at once -- an attention's two products and
    the softmax between them as one split-KV kernel and its combine, where Q K^T with the softmax, or the softmax
    with P @ V, gains nothing -- is missed by the pairwise passes. Repeated until nothing changes."""
    changed = True
    while changed and (deadline is None or time.perf_counter() < deadline):
        changed = False
        for k in range(len(regs) - WINDOW + 1):
            members = list(range(k, k + WINDOW))
            nodes = sorted(i for m in members for i in regs[m][0].nodes)
            if len(nodes) > window_ops or not _convex(graph, set(nodes)):
                continue
            out.merges_tried += 1
            both = _searched_union(graph, nodes, searched, window_ops)
            if both is not None and _total(both) < sum(regs[m][1][1] for m in members) - 1e-12:
                out.merges_kept += 1
                note = f"merged with the next {WINDOW - 1} region(s)"
                regs = _merged(regs, members, [(r, res, note) for r, res in both])
                changed = True
                break
    return regs


def _convex(graph: Graph, nodes: set[int]) -> bool:
    """Whether no node outside ``nodes`` lies on a path between two of them (their region can be one kernel
    graph: what it reads is made before it, what it makes is read after)."""
    src = node_list(graph)
    below: set[int] = set()  # nodes outside that read (transitively) a member
    for i, n in enumerate(src):
        if i not in nodes and any(a[0] in nodes or a[0] in below for a in n.args):
            below.add(i)
    return not any(a[0] in below for i in nodes for a in src[i].args)


def _in_order(regs: list[_Tagged]) -> list[_Tagged]:
    """``regs`` in a topological order (each after the regions whose values it reads), by first node on ties."""
    left = sorted(regs, key=lambda r: r[0].nodes[0])
    made: set[tuple[int, int]] = set()
    order: list[_Tagged] = []
    while left:
        pending = {x for r in left for x in r[0].outputs} - made  # (values a region still to be placed makes)
        k = next(k for k, r in enumerate(left) if not pending.intersection(r[0].inputs))
        order.append(left.pop(k))
        made.update(order[-1][0].outputs)
    return order


__all__ = ["ANCHORS", "Region", "RegionReport", "SplitOutcome", "compose", "initial_chunks", "region_of",
           "split_search"]
