"""The parser of program texts as people write them (``parse(print(g)) == g``): comments, blank lines and any spacing
allowed, every error a :class:`GraphError` naming the line. Not on the trusted path: the certificate checker reads a
program's canonical text with :func:`verimirage.ir.text.read_program`, whose every reading is printed back and
compared.
"""

from __future__ import annotations

import ast
import re
import warnings
from contextlib import suppress
from typing import Any

from .dtypes import DType
from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, OutputMap, Ref, ThreadGraph, make_attrs
from .ops import TensorType

_NODE_RE = re.compile(r"^%(\d+)\s*=\s*([A-Za-z_]\w*)(.*)$")
_TYPE_RE = re.compile(r"^(\w+)\[([\d,\s]*)\]$")
_REF_RE = re.compile(r"^%(\d+)(?:\.(\d+))?$")
_ATTRS = "<verimirage attributes>"  # (the file name ast.parse gives: its SyntaxWarnings, '1if', are SyntaxErrors)
warnings.filterwarnings("error", category=SyntaxWarning, module=re.escape(_ATTRS))


class _Lines:
    def __init__(self, text: str) -> None:
        self.lines = [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines())]
        self.lines = [(i, ln) for i, ln in self.lines if ln and not ln.startswith("#")]
        self.pos = 0

    def next(self) -> tuple[int, str]:
        if self.pos >= len(self.lines):
            raise GraphError("parse: unexpected end of text (a region is not closed with '}')")
        self.pos += 1
        return self.lines[self.pos - 1]


def _perr(lineno: int, line: str, msg: str) -> GraphError:
    return GraphError(f"parse: line {lineno}: {msg}\n  {line}")


def _parse_type(s: str, lineno: int, line: str) -> TensorType:
    m = _TYPE_RE.match(s.strip())
    if not m:
        raise _perr(lineno, line, f"bad type {s.strip()!r}; expected like f16[2,64]")
    dims = tuple(int(x) for x in m.group(2).replace(" ", "").split(",") if x)
    return TensorType(dims, DType.parse(m.group(1)))


def _parse_refs(s: str, lineno: int, line: str) -> tuple[Ref, ...]:
    s = s.strip()
    if not s:
        return ()
    out = []
    for part in s.split(","):
        m = _REF_RE.match(part.strip())
        if not m:
            raise _perr(lineno, line, f"bad operand {part.strip()!r}; expected %N or %N.K")
        out.append((int(m.group(1)), int(m.group(2) or 0)))
    return tuple(out)


def _parse_attrs(s: str, lineno: int, line: str) -> dict[str, Any]:
    with suppress(SyntaxError, ValueError, RecursionError, MemoryError):  # (deep nesting: the parser's stack)
        call = ast.parse(f"f({s})" if "\\" not in s else "", _ATTRS, mode="eval").body  # (no escapes: '\d' warns)
        if isinstance(call, ast.Call) and not call.args:  # (one call of keywords only: not 'f(a=1), g(2)')
            return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg is not None}
    raise _perr(lineno, line, f"bad attributes {{{s[:200]}}}; expected key=literal pairs")


def _split_head(rest: str) -> tuple[str, str]:
    """Split 'operands {attrs}' into its two parts."""
    rest = rest.strip()
    if "{" in rest:
        i = rest.index("{")
        if not rest.endswith("}"):
            raise GraphError(f"parse: unbalanced braces in {rest!r}")
        return rest[:i].strip(), rest[i + 1 : -1]
    return rest, ""


def _parse_node_line(lines: _Lines, lineno: int, line: str, expect: int) -> Node:
    m = _NODE_RE.match(line)
    if not m:
        raise _perr(lineno, line, "expected '%N = op operands {attrs} : types'")
    idx, op, rest = int(m.group(1)), m.group(2), m.group(3)
    if idx != expect:
        raise _perr(lineno, line, f"node numbered %{idx}; expected %{expect} (nodes are numbered in order)")
    opens = rest.rstrip().endswith("{") and op in ("custom", "fused")
    if opens:
        rest = rest.rstrip()[:-1]
    head, sep, types_s = rest.rpartition(" : ")
    if not sep:
        raise _perr(lineno, line, "missing ' : ' and the result types")
    types = tuple(_parse_type(t, lineno, line) for t in re.split(r",(?![^\[]*\])", types_s) if t.strip())
    args_s, attrs_s = _split_head(head)
    args = _parse_refs(args_s, lineno, line)
    attrs = _parse_attrs(attrs_s, lineno, line) if attrs_s else {}
    if op == "custom":
        if not opens:
            raise _perr(lineno, line, "custom: expected a block region '{' at the end of the line")
        grid, frange, flimit = (attrs.pop(k, None) for k in ("grid", "frange", "flimit"))  # (checked with the program)
        if attrs:
            raise _perr(lineno, line, f"custom: unexpected attributes {sorted(attrs)}")
        nodes, outs, omaps = _parse_body(lines, block=True)  # (the block graph is checked with the program)
        return Node(op, args, (("block", BlockGraph(grid, frange, tuple(nodes), tuple(outs), tuple(omaps), flimit)),),
                    types)
    if op == "fused":
        if not opens:
            raise _perr(lineno, line, "fused: expected a thread region '{' at the end of the line")
        nodes, outs, _ = _parse_body(lines)
        return Node(op, args, (("thread", ThreadGraph(tuple(nodes), tuple(outs))),), types)  # (checked with its block)
    return Node(op, args, make_attrs(attrs), types)


def _parse_body(lines: _Lines, block: bool = False) -> tuple[list[Node], list[Ref], list[OutputMap]]:
    """The nodes, the output refs and (a block's) omaps of a body up to its closing ``}``: a program's or a thread
    graph's ends with ``return`` refs, a block graph's has ``output %N {omap=(...)}`` lines."""
    nodes: list[Node] = []
    outs: list[Ref] = []
    omaps: list[OutputMap] = []
    while True:
        lineno, line = lines.next()
        if line == "}":
            return nodes, outs, omaps
        if block and line.startswith("output "):
            refs_s, attrs_s = _split_head(line[len("output ") :])
            (r,) = _parse_refs(refs_s, lineno, line) or (None,)
            attrs = _parse_attrs(attrs_s, lineno, line)
            if r is None or set(attrs) != {"omap"} or not isinstance(attrs["omap"], tuple):
                raise _perr(lineno, line, "expected 'output %N {omap=(...)}'")
            outs.append(r)
            omaps.append(OutputMap(tuple(attrs["omap"])))
        elif not block and line.startswith("return"):
            outs = list(_parse_refs(line[len("return") :], lineno, line))
        else:
            nodes.append(_parse_node_line(lines, lineno, line, len(nodes)))


def parse_program(text: str) -> Graph:
    """Parse a ``graph { ... }`` or ``mugraph { ... }`` text; the result is checked.

    Any malformed text is a :class:`GraphError`: those raised on purpose name the line; anything else
    that goes wrong on malformed text (a wrong attribute type, say) is reported as a GraphError too.
    """
    if not isinstance(text, str):
        raise GraphError(f"parse: expected program text, got {type(text).__name__}")
    try:
        return _parse_program(text)
    except GraphError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError, RecursionError) as e:
        raise GraphError(f"parse: malformed program ({type(e).__name__}: {str(e)[:200]})") from None


def _parse_program(text: str) -> Graph:
    lines = _Lines(text)
    lineno, first = lines.next()
    kw = first.split()[0] if first.split() else ""
    if first not in ("graph {", "mugraph {"):
        raise _perr(lineno, first, "expected 'graph {' or 'mugraph {'")
    nodes, outs, _ = _parse_body(lines)
    if lines.pos != len(lines.lines):
        ln, extra = lines.lines[lines.pos]
        raise _perr(ln, extra, "text after the closing '}'")
    cls = MuGraph if kw == "mugraph" else Graph
    g = cls._from_parts(nodes, outs)
    g.check()
    return g
