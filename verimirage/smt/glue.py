"""The glue of a program split into regions (trusted: the certificate checker re-derives it).

:func:`region_of` takes a set of a program's nodes out as a kernel graph: inputs ``r0, r1, ...`` for the values it
reads from outside (in order of first use), outputs its values read outside (in ref order). :func:`compose` splices
one μGraph per region into one over the program's inputs. Composing the regions' own graphs gives the program back
(each node the same op on the same values); so when the regions partition the live ops (:func:`live_ops`), each
region's μGraph is proved equal to (and defined wherever) its region's graph and every value crossing regions is
defined wherever the program is (:func:`undefined_fed`), their splice computes the program's function (congruence).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..ir.graph import Graph, MuGraph, Node, Ref, live_nodes, node_list, output_refs


@dataclass(frozen=True)
class Region:
    """A region: its nodes (indices into the program), its kernel graph, the program's values (refs) its
    inputs ``r0, r1, ...`` stand for and that its outputs are."""

    nodes: tuple[int, ...]
    graph: Graph
    inputs: tuple[Ref, ...]
    outputs: tuple[Ref, ...]


def live_ops(graph: Graph) -> set[int]:
    """The program's live non-input nodes (what its regions must partition)."""
    nodes = node_list(graph)
    return {i for i in live_nodes(nodes, output_refs(graph)) if nodes[i].op != "input"}


def region_of(graph: Graph, members: Sequence[int]) -> Region:
    """The region of ``graph`` made of the nodes ``members`` (non-input), as a kernel graph."""
    nodes = node_list(graph)
    mem, inside = sorted(members), set(members)
    used_outside: set[Ref] = {r for r in output_refs(graph) if r[0] in inside}
    used_outside.update(a for j, n in enumerate(nodes) if j not in inside for a in n.args if a[0] in inside)
    new_nodes, ins, where = list[Node](), list[Ref](), dict[Ref, Ref]()  # (where: program ref -> region ref)
    for i in mem:
        n = nodes[i]
        for a in n.args:
            if a[0] not in inside and a not in where:
                where[a] = (len(new_nodes), 0)
                new_nodes.append(Node("input", (), (("name", f"r{len(ins)}"),), (nodes[a[0]].outs[a[1]],)))
                ins.append(a)
        where.update({(i, k): (len(new_nodes), k) for k in range(len(n.outs))})
        new_nodes.append(Node(n.op, tuple(where[a] for a in n.args), n.attrs, n.outs))
    outs = tuple(sorted(used_outside))
    return Region(tuple(mem), Graph._from_parts(new_nodes, [where[r] for r in outs]), tuple(ins), outs)


def compose(graph: Graph, regions: Sequence[Region], mugraphs: Sequence[MuGraph]) -> MuGraph:
    """One μGraph for ``graph``: its inputs, then each region's μGraph, its inputs wired to the values they stand
    for (KeyError: a value no earlier region made); GraphError when it is not a well-formed μGraph."""
    src = node_list(graph)
    out_nodes: list[Node] = []
    value: dict[Ref, Ref] = {}  # program ref -> composed ref
    for i, n in enumerate(src):
        if n.op == "input":
            value[(i, 0)] = (len(out_nodes), 0)
            out_nodes.append(n)
    for reg, mg in zip(regions, mugraphs, strict=True):
        names = {f"r{k}": ref for k, ref in enumerate(reg.inputs)}
        wired: dict[int, Ref] = {}  # the region μGraph's input nodes -> the composed values they stand for
        placed: dict[int, int] = {}  # its other nodes -> their index in the composed μGraph

        def at(a: Ref, wired: dict[int, Ref] = wired, placed: dict[int, int] = placed) -> Ref:
            return wired[a[0]] if a[0] in wired else (placed[a[0]], a[1])

        for j, n in enumerate(node_list(mg)):
            if n.op == "input":
                wired[j] = value[names[n.attr("name")]]
            else:
                placed[j] = len(out_nodes)
                out_nodes.append(Node(n.op, tuple(at(a) for a in n.args), n.attrs, n.outs))
        for k, r in enumerate(output_refs(mg)):
            value[reg.outputs[k]] = at(r)
    composed = MuGraph._from_parts(out_nodes, [value[r] for r in output_refs(graph)])
    composed.check(unused_inputs=True)
    return composed


def undefined_fed(graph: Graph, regions: Sequence[Region]) -> str | None:
    """None when every value a region makes and another reads is defined (partial ops in their domains by signs,
    :mod:`.defined`) wherever any case of an output of ``graph`` is, its unguarded conditions free of output indices
    as facts (a case undefined wherever the value is, ``g / n`` at ``n = 0``, needs nothing of it); else why not.
    Congruence needs it: a region's μGraph may read input elements its graph does not (``r0[0] + 0 * r0[1]``) or a
    value its graph reads only in a ``where`` branch, which the program may leave undefined (``log(x)[1]``)."""
    from . import abstract as A
    from . import defined as D
    from . import expr as E

    read = {a for r in regions for a in r.inputs}
    refs = sorted({o for r in regions for o in r.outputs if o in read})
    nodes = node_list(graph)
    if not refs or all(n.op == "input" or (n.op in D.RULES and D.RULES[n.op].conds is None) for n in nodes):
        return None  # (no value crosses, or no op has a condition)

    def conds(outs: Sequence[Ref]) -> list[list[D.Defs]]:
        return A.derive_all([Graph._from_parts(list(nodes), list(outs))])[1][0][2]

    def free(p: E.Poly) -> bool:  # (of no output index: an output's index is not the crossing value's)
        return not any(map(D._is_out, E.free_vars(p)))

    def first(facts: list[list[D.Defs]]) -> str | None:
        return next((f"the value of node {refs[k][0]}: {w}" for k, ds in enumerate(defs) for d in ds for f in facts
                     if (w := D.refines(f, [d]))), None)

    bad = (E.AbstractionError, E.NeedSplit, RecursionError)
    try:
        defs = conds(refs)
    except bad as e:
        return f"abstraction: {e}"
    if (why := first([[]])) is None:
        return None
    try:  # (the program's own conditions, derived only when needed; else the value must be defined for all inputs)
        facts = [[D.Defs(tuple(c for c in d.conds if free(c.poly)), {p: t for p, t in d.prov.items() if free(p)},
                         d.ranges)] for ds in conds(output_refs(graph)) for d in ds]  # (per output and case)
    except bad:
        return why
    return first(facts)


__all__ = ["Region", "compose", "live_ops", "region_of", "undefined_fed"]
