"""Re-derive a stored μGraph's online softmax in the current lowering's form: every block ``max`` a running max
reads (directly or through ``maximum``) floored by ``partition.RUNNING_MAX_FLOOR``'s clamp.

Candidates searched before the seventeenth session read the tile's max into the running max as it is: -inf on a
row's masked first tiles, and NaN from then on (red team session 17). The search makes the floored form itself; this
re-derives it for stored candidates (``benchmarks/prepare_candidates.py --floor``), each then verified again."""

from __future__ import annotations

from ..ir.graph import BlockGraph, Graph, Node, make_attrs
from .causal import map_blocks


def _floored_block(bg: BlockGraph) -> BlockGraph | None:
    from .partition import RUNNING_MAX_FLOOR

    nodes = bg.nodes
    feeds: set[int] = set()  # the max nodes a running max reads, directly or through maximum
    for n in nodes:
        if n.op != "running_max":
            continue
        todo = [n.args[0][0]]
        while todo:
            j = todo.pop()
            if nodes[j].op == "max":
                feeds.add(j)
            elif nodes[j].op == "maximum":
                todo += [a for a, _ in nodes[j].args]
    if not feeds:
        return None
    new: list[Node] = []
    remap: dict[int, int] = {}
    lo, hi = RUNNING_MAX_FLOOR
    for j, n in enumerate(nodes):
        new.append(Node(n.op, tuple((remap[a], k) for a, k in n.args), n.attrs, n.outs))
        if j in feeds:
            new.append(Node("clamp", ((len(new) - 1, 0),), make_attrs({"hi": hi, "lo": lo}), n.outs))
        remap[j] = len(new) - 1
    return BlockGraph(bg.grid, bg.frange, tuple(new), tuple((remap[a], k) for a, k in bg.outputs), bg.omaps,
                      bg.flimit)


def floor_running_maxes(mg: Graph) -> Graph:
    """``mg`` with every running max's tile max floored (see the module docstring); ``mg`` itself where none is
    unfloored (a fixed point on the current lowering's form: a clamp already there is a node the max feeds, so the
    max does not feed the running max directly)."""
    out = map_blocks(mg, lambda bg, nodes, args: _floored_block(bg))
    return mg if out is None else out
