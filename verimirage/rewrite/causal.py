"""Causal masks: searched as inputs, then kernels that skip the tiles a causal mask sets entirely false.

A program's ``tril_mask`` (the causal mask, a constant) is searched as an ordinary boolean input
(:func:`mask_inputs`): every rule and lowering that holds for any mask holds for it. The μGraphs found are given
the constant back (:func:`restore_masks`), and :func:`with_skips` bounds the for-loop of each kernel that walks
the mask's columns while its grid partitions the rows: iteration ``it`` of the block of rows ``[b R, b R + R)``
runs only when its columns ``[it C, it C + C)`` start at or before the block's last row plus the offset
(``BlockGraph.flimit = (axis, R, R - 1 + offset, C)``), so the tiles above the diagonal are never computed.

Nothing here is trusted: the skipping μGraph is verified against the program like any candidate. The skip is
an identity only where a skipped tile contributes exactly nothing over the reals: the masked elements weigh
``where(mask, exp(..), 0)`` (see :func:`verimirage.benchmarks.models.masked_attention`, ``zero_masked``), so
a program written with ``where(mask, s, -30000)`` alone keeps its unskipped kernels (the verifier refutes the
skip: ``exp(-30000 - m)`` is not 0 over the reals).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.graph import BlockGraph, Graph, MuGraph, Node, make_attrs, node_list, output_refs
from ..ir.ops import OPS, Prop

#: the prefix of the input names standing for causal masks during a search
MASK_PREFIX = "tril_mask_"


def mask_inputs(g: Graph) -> tuple[Graph, dict[str, Node]]:
    """``g`` with each constant (``Prop.CONSTANT``: a ``tril_mask``) node an input (named with
    :data:`MASK_PREFIX`, unused by ``g``), and the nodes by name; ``g`` itself (and no names) when it has none."""
    nodes = list(node_list(g))
    taken = {n.attr("name") for n in nodes if n.op == "input"}
    masks: dict[str, Node] = {}
    for i, n in enumerate(nodes):
        if OPS[n.op].has(Prop.CONSTANT):
            k = 0
            while f"{MASK_PREFIX}{k}" in taken:
                k += 1
            name = f"{MASK_PREFIX}{k}"
            taken.add(name)
            masks[name] = n
            nodes[i] = Node("input", (), make_attrs({"name": name}), n.outs)
    if not masks:
        return g, {}
    return type(g)._from_parts(nodes, output_refs(g)), masks


def restore_masks(mg: Graph, masks: dict[str, Node]) -> Any:
    """``mg`` with the inputs :func:`mask_inputs` made the ``tril_mask`` nodes they stand for again."""
    if not masks:
        return mg
    nodes = [masks[n.attr("name")] if n.op == "input" and n.attr("name") in masks else n for n in node_list(mg)]
    return type(mg)._from_parts(nodes, output_refs(mg))


def _skip_of(bg: BlockGraph, nodes: Any, args: Any) -> tuple[int, int, int, int] | None:
    """The loop bound of ``bg`` skipping the tiles above the diagonal of a causal mask it reads, or None."""
    if bg.frange < 2 or bg.flimit is not None:
        return None
    for n in bg.nodes:
        if n.op != "input":
            continue
        src = nodes[args[n.attr("arg")][0]]
        if src.op != "tril_mask":
            continue
        shape, imap, fmap = n.attr("shape"), n.attr("imap"), n.attr("fmap")
        r = len(shape)
        if fmap != r - 1 or (r - 2) not in imap:
            continue
        if any(dd == r - 1 and bg.grid[a] > 1 for a, dd in enumerate(imap)):
            continue  # the grid splits the columns too (split-KV): a block's loop starts past column 0
        axis = imap.index(r - 2)
        rows, cols = n.outs[0].shape[r - 2:]  # (the tiles: shape / grid and / frange, rounded up for a masked tail)
        c = rows - 1 + int(src.attr("offset"))
        if c < 0:
            continue
        c = min(c, cols * (bg.frange - 1))  # (every iteration runs from there on: a huge offset stays in int32)
        return (axis, rows, c, cols)
    return None


def map_blocks(mg: Graph, fn: Any) -> MuGraph | None:
    """``mg`` with each kernel's block graph replaced by ``fn(block, nodes, args)`` where that is not None (the
    μGraph's nodes and the kernel's operands, for a rewrite that reads what feeds the kernel); None when no kernel
    changed."""
    nodes = list(node_list(mg))
    changed = False
    for i, n in enumerate(nodes):
        if n.op != "custom" or (bg := fn(n.attr("block"), nodes, n.args)) is None:
            continue
        attrs = dict(n.attrs)
        attrs["block"] = bg
        nodes[i] = Node(n.op, n.args, make_attrs(attrs), n.outs)
        changed = True
    if not changed:
        return None
    out = MuGraph._from_parts(nodes, output_refs(mg))
    out.check(unused_inputs=True)
    return out


def with_skips(mg: Graph) -> MuGraph | None:
    """``mg`` with every kernel that walks a causal mask's columns by its loop and partitions its rows by its
    grid bounded to the tiles at or below the diagonal; None when no kernel is."""

    def skip(bg: BlockGraph, nodes: list[Any], args: Any) -> BlockGraph | None:
        fl = _skip_of(bg, nodes, args)
        return None if fl is None else dataclasses.replace(bg, flimit=fl)

    return map_blocks(mg, skip)
