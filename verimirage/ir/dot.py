"""Graphviz rendering of programs: block graphs as nested clusters."""

from __future__ import annotations

from typing import Any

from .graph import BlockGraph, Graph, Node, node_list, output_refs


def _label(n: Node) -> str:
    t = ", ".join(str(o) for o in n.outs)
    if n.op == "input":
        name = n.attr("name")
        if name is not None:
            return f"{name}\\n{t}"
        imap, fmap = n.attr("imap"), n.attr("fmap")
        return f"in{n.attr('arg')} imap={imap} fmap={fmap}\\n{t}"
    extra = {k: v for k, v in n.attrs if k not in ("block", "thread")}
    attrs = " ".join(f"{k}={v}" for k, v in extra.items())
    return f"{n.op} {attrs}\\n{t}".replace('"', "'")


def _block(bg: BlockGraph, prefix: str, lines: list[str], title: str) -> None:
    lines.append(f'subgraph "cluster_{prefix}" {{')
    lines.append(f'label="{title} grid={bg.grid} frange={bg.frange}"; style=rounded; color=blue;')
    post = bg.post_loop()
    for i, n in enumerate(bg.nodes):
        nid = f"{prefix}_{i}"
        if n.op == "fused":
            lines.append(f'subgraph "cluster_{nid}" {{ label="fused (thread graph)"; color=darkgreen;')
            for j, m in enumerate(n.attr("thread").nodes):
                lines.append(f'"{nid}_{j}" [label="{_label(m)}", shape=box, style=dashed];')
            lines.append("}")
            lines.append(f'"{nid}" [label="fused\\n{n.outs[0]}", shape=box];')
        else:
            shape = "box" if not post[i] else "box3d"
            lines.append(f'"{nid}" [label="{_label(n)}", shape={shape}];')
        for a, _ in n.args:
            lines.append(f'"{prefix}_{a}" -> "{nid}";')
    for k, ((a, _), om) in enumerate(zip(bg.outputs, bg.omaps, strict=True)):
        lines.append(f'"{prefix}_out{k}" [label="out{k} omap={om.dims}", shape=ellipse];')
        lines.append(f'"{prefix}_{a}" -> "{prefix}_out{k}";')
    lines.append("}")


def to_dot(g: Graph | Any) -> str:
    """Graphviz ``dot`` source for a kernel graph or μGraph."""
    lines = ["digraph verimirage {", "rankdir=TB; node [fontname=monospace];"]
    nodes = node_list(g)
    for i, n in enumerate(nodes):
        if n.op == "custom":
            _block(n.attr("block"), f"k{i}", lines, f"kernel %{i}")
            for j, (a, _) in enumerate(n.args):
                lines.append(f'"k{a}" -> "k{i}_in{j}" [style=dotted];')
            bg = n.attr("block")
            for bi, bn in enumerate(bg.nodes):
                if bn.op == "input":
                    lines.append(f'"k{i}_in{bn.attr("arg")}" -> "k{i}_{bi}";')
                    lines.append(f'"k{i}_in{bn.attr("arg")}" [shape=point];')
            lines.append(f'"k{i}" [label="%{i} outputs", shape=diamond];')
            for k in range(len(bg.outputs)):
                lines.append(f'"k{i}_out{k}" -> "k{i}";')
        else:
            shape = "ellipse" if n.op == "input" else "box"
            lines.append(f'"k{i}" [label="{_label(n)}", shape={shape}];')
            for a, _ in n.args:
                lines.append(f'"k{a}" -> "k{i}";')
    for k, (a, _) in enumerate(output_refs(g)):
        lines.append(f'"out{k}" [label="output {k}", shape=doubleoctagon];')
        lines.append(f'"k{a}" -> "out{k}";')
    lines.append("}")
    return "\n".join(lines)
