"""The text form of programs: the printer, which defines it, and the reader of its canonical form
(``read_program(print(g)) == g``; hand-written text, with comments, blank lines and any spacing, and errors
naming the line: :func:`verimirage.ir.parse.parse_program`).

Example::

    mugraph {
      %0 = input {name='Q'} : f16[2,256,64]
      ...
      %3 = custom %0, %1, %2 {frange=4, grid=(2, 4)} : f16[2,256,64] {
        %0 = input {arg=0, fmap=None, imap=(0, 1), shape=(2, 256, 64)} : f16[1,64,64]
        ...
        output %9 {omap=(0, 1)}
      }
      return %3
    }

Node lines are ``%i = op operands {attrs} : result types``; operands are
``%i`` (result 0) or ``%i.k``; attribute values are Python literals. Custom
kernels and fused thread graphs open a nested region. The printer shows every
field of a program the reader makes (a node's op, operands, attributes and result
types; a block graph's grid, loop, causal limit, nodes, outputs and their maps; a
custom or fused node holds only its block or thread graph), so the program the
reader makes of a text is the one program with that text that it can make.
"""

from __future__ import annotations

import ast
from typing import Any

from .dtypes import DType
from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, OutputMap, Ref, ThreadGraph, make_attrs, node_list, output_refs
from .ops import TensorType


def _ref(r: Ref, nodes: Any) -> str:
    a, k = r
    if k == 0 and (not nodes or a >= len(nodes) or len(nodes[a].outs) == 1):
        return f"%{a}"
    return f"%{a}.{k}"


def _attrs(d: dict[str, Any]) -> str:
    if not d:
        return ""
    return " {" + ", ".join(f"{k}={v!r}" for k, v in sorted(d.items())) + "}"


def block_head(bg: BlockGraph) -> str:
    """A block graph's attributes as text (`` {frange=..., grid=...}``)."""
    return _attrs({"grid": bg.grid, "frange": bg.frange, **({"flimit": bg.flimit} if bg.flimit else {})})


def print_node(n: Node, i: int, nodes: Any = None, indent: str = "") -> str:
    """One node as text (nested regions included)."""
    args = ", ".join(_ref(r, nodes) for r in n.args)
    head = f"{indent}%{i} = {n.op}" + (f" {args}" if args else "")
    types = ", ".join(str(t) for t in n.outs)
    if n.op == "custom":
        bg: BlockGraph = n.attr("block")
        return f"{head}{block_head(bg)} : {types} {{\n" + block_body(bg, indent + "  ") + f"\n{indent}}}"
    if n.op == "fused":
        tg: ThreadGraph = n.attr("thread")
        return f"{head} : {types} {{\n" + thread_body(tg, indent + "  ") + f"\n{indent}}}"
    return f"{head}{_attrs(n.attr_dict)} : {types}"


def _nodes_text(nodes: Any, indent: str) -> list[str]:
    return [print_node(n, i, nodes, indent) for i, n in enumerate(nodes)]


def block_body(bg: BlockGraph, indent: str) -> str:
    """A block graph's nodes and outputs as text, one per line (indented by ``indent``)."""
    lines = _nodes_text(bg.nodes, indent)
    for r, om in zip(bg.outputs, bg.omaps, strict=True):
        lines.append(f"{indent}output {_ref(r, bg.nodes)}{_attrs({'omap': om.dims})}")
    return "\n".join(lines)


def thread_body(tg: Any, indent: str) -> str:
    """A thread graph's (or a program's) nodes and ``return`` line as text (indented by ``indent``)."""
    nodes = node_list(tg)
    return "\n".join([*_nodes_text(nodes, indent), f"{indent}return " + ", ".join(_ref(r, nodes) for r in
                                                                               output_refs(tg))])


def print_program(p: Any) -> str:
    """Text of a kernel graph or μGraph (``str`` of a block or thread graph: :mod:`.builders`)."""
    return f"{'mugraph' if isinstance(p, MuGraph) else 'graph'} {{\n{thread_body(p, '  ')}\n}}"


# --------------------------------------------------------------------------- the canonical form's reader


def read_program(text: str, mu: bool) -> Any:
    """The program (a μGraph if ``mu``) whose canonical text is ``text``, checked, as the certificate checker reads
    it; an error for any other text. Terse on purpose: the program read is printed back and must give ``text`` letter
    for letter, so what this reads is the program the text shows (the printer shows every field of the programs read
    here: the module docstring) or it is rejected."""
    lines, pos = text.split("\n"), 1

    def body() -> tuple[list[Node], list[Ref], list[OutputMap]]:
        nonlocal pos
        nodes, outs, omaps = list[Node](), list[Ref](), list[OutputMap]()
        while (ln := lines[pos].strip()) != "}":
            pos += 1
            if ln.startswith("return "):
                outs = [_read_ref(r) for r in ln[7:].split(", ")]
            elif ln.startswith("output "):
                r, _, om = ln[7:].partition(" {omap=")
                outs.append(_read_ref(r))
                omaps.append(OutputMap(tuple(ast.literal_eval(om[:-1]))))
            else:  # %i = op operands {attrs} : types, a region opening at " {"
                head, _, types = ln.removesuffix(" {").rpartition(" : ")
                op_args, _, attrs_s = head.partition(" = ")[2].partition(" {")
                op, _, args_s = op_args.partition(" ")
                call: Any = ast.parse(f"f({attrs_s[:-1]})", mode="eval").body
                attrs = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
                if op in ("custom", "fused"):
                    ns, rs, ms = body()
                    attrs = {"block": BlockGraph(attrs["grid"], attrs["frange"], tuple(ns), tuple(rs), tuple(ms),
                                                 attrs.get("flimit"))} if op == "custom" else {
                        "thread": ThreadGraph(tuple(ns), tuple(rs))}
                nodes.append(Node(op, tuple(_read_ref(a) for a in args_s.split(", ") if a), make_attrs(attrs),
                                  tuple(_read_type(t) for t in types.split(", "))))
        pos += 1
        return nodes, outs, omaps

    g = (MuGraph if mu else Graph)._from_parts(*body()[:2])
    g.check()
    if print_program(g) != text:
        raise GraphError("program text is not canonical (print(parse(text)) != text)")
    return g


def _read_ref(s: str) -> Ref:
    a, _, k = s.removeprefix("%").partition(".")
    return int(a), int(k or 0)


def _read_type(s: str) -> TensorType:
    dt, _, dims = s.removesuffix("]").partition("[")
    return TensorType(tuple(int(d) for d in dims.split(",")), DType.parse(dt))
