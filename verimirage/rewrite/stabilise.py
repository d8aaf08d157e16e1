"""A direct graph rewrite: the numerically safe softmax.

``exp(a) / sum_k exp(a)``  ->  ``exp(a - max_k a) / sum_k exp(a - max_k a)``

The e-graph holds both forms in one e-class (rule ``softmax-stabilise``), and
extraction by cost always prefers the plain one, which overflows fp16 (and
fp16 tensor-core operands) for logits beyond ~11. The search therefore also
lowers the stabilised form of every extracted graph, so the safe design is
among the candidates (and the GPU profiler, which checks every candidate
against the float64 reference, picks a correct one). Like every search
step, its output is re-verified.
"""

from __future__ import annotations

from typing import Any

from ..ir.graph import Graph, Tensor, node_list, output_refs


def _softmax_sites(g: Graph) -> dict[int, int]:
    """exp node -> axis, for every ``exp(a)`` (``a`` not already max-shifted) that is summed along an axis.

    Replacing such an ``exp(a)`` by ``exp(a - max(a))`` scales it by a per-row constant; the program is
    unchanged when that constant cancels (softmax, deferred or not). Whether it does is the verifier's
    call: the candidates built from this graph are verified like every other.
    """
    nodes = node_list(g)
    sites: dict[int, int] = {}
    for n in nodes:
        if n.op != "sum":
            continue
        e = n.args[0][0]
        if nodes[e].op != "exp" or nodes[e].outs[0].shape[n.attr("axis")] == 1:
            continue
        a = nodes[e].args[0][0]
        if nodes[a].op == "sub" and nodes[nodes[a].args[1][0]].op == "max":
            continue  # already stable
        sites.setdefault(e, n.attr("axis"))
    return sites


def stabilise_softmax(g: Graph) -> Graph | None:
    """``g`` with every plain softmax in the max-subtracted form, or None if it has none."""
    sites = _softmax_sites(g)
    if not sites:
        return None
    nodes = node_list(g)
    exps = sites
    out = Graph()
    val: dict[int, Tensor] = {}
    for i, n in enumerate(nodes):
        args = [val[a] for a, _ in n.args]
        if n.op == "input":
            val[i] = out.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        elif i in exps:
            a = args[0]
            val[i] = out.exp(out.sub(a, out.max(a, axis=exps[i])))
        else:
            attrs: dict[str, Any] = n.attr_dict
            val[i] = out._emit(n.op, args, attrs)
    out.output(*[val[a] for a, _ in output_refs(g)])
    out.check()
    return out
