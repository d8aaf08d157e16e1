"""A small self-contained SVG drawing of a μGraph (no graphviz needed).

Kernel-level nodes are laid out in layers by depth; each custom kernel is drawn
as a cluster (a framed box) holding its block graph, itself laid out in layers,
with fused thread graphs as nested frames. When the graphviz ``dot`` program is
installed, :func:`render_svg` uses it on :func:`verimirage.ir.dot.to_dot`
instead.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from html import escape
from typing import Any

from .graph import BlockGraph, Node, node_list, output_refs

_W, _H, _GX, _GY, _PAD = 170, 38, 20, 26, 14


@dataclass
class _Box:
    label: str
    sub: str = ""
    children: list[list[_Box]] = field(default_factory=list)  # layers of nested boxes
    title: str = ""
    w: float = _W
    h: float = _H
    x: float = 0.0
    y: float = 0.0
    ins: list[int] = field(default_factory=list)

    def measure(self) -> None:
        if not self.children:
            return
        for layer in self.children:
            for b in layer:
                b.measure()
        self.w = max(sum(b.w for b in layer) + _GX * (len(layer) - 1) for layer in self.children) + 2 * _PAD
        self.h = sum(max(b.h for b in layer) for layer in self.children) + _GY * (len(self.children) - 1)
        self.h += 2 * _PAD + 18

    def place(self, x: float, y: float) -> None:
        self.x, self.y = x, y
        if not self.children:
            return
        cy = y + _PAD + 18
        for layer in self.children:
            lw = sum(b.w for b in layer) + _GX * (len(layer) - 1)
            cx = x + (self.w - lw) / 2
            for b in layer:
                b.place(cx, cy)
                cx += b.w + _GX
            cy += max(b.h for b in layer) + _GY


def _label(n: Node) -> tuple[str, str]:
    t = ", ".join(str(o) for o in n.outs)
    if n.op == "input":
        if n.attr("name") is not None:
            return f"input {n.attr('name')}", t
        return f"in{n.attr('arg')} imap={n.attr('imap')} fmap={n.attr('fmap')}", t
    extra = " ".join(f"{k}={v}" for k, v in n.attrs if k not in ("block", "thread"))
    return f"{n.op} {extra}".strip(), t


def _layers(nodes: Any, make: Any) -> list[list[_Box]]:
    depth: list[int] = []
    for n in nodes:
        depth.append(1 + max((depth[a] for a, _ in n.args), default=-1))
    layers: list[list[_Box]] = [[] for _ in range(max(depth, default=-1) + 1)]
    boxes = []
    for i, n in enumerate(nodes):
        b = make(n)
        b.ins = [a for a, _ in n.args]
        layers[depth[i]].append(b)
        boxes.append(b)
    return layers


def _node_box(n: Node) -> _Box:
    lab, sub = _label(n)
    if n.op == "custom":
        bg: BlockGraph = n.attr("block")
        b = _Box(lab, sub, _layers(bg.nodes, _node_box), f"kernel grid={bg.grid} frange={bg.frange}")
        return b
    if n.op == "fused":
        return _Box(lab, sub, _layers(n.attr("thread").nodes, _node_box), "fused thread graph")
    return _Box(lab, sub)


def _emit(b: _Box, out: list[str], depth: int) -> None:
    if b.children:
        color = ["#3465a4", "#4e9a06", "#75507b"][depth % 3]
        out.append(
            f'<rect x="{b.x:.0f}" y="{b.y:.0f}" width="{b.w:.0f}" height="{b.h:.0f}" rx="8" fill="none" '
            f'stroke="{color}" stroke-width="1.5"/>'
        )
        out.append(f'<text x="{b.x + 8:.0f}" y="{b.y + 15:.0f}" fill="{color}">{escape(b.title)}</text>')
        flat = [c for layer in b.children for c in layer]
        for c in flat:
            _emit(c, out, depth + 1)
        for c in flat:
            for a in c.ins:
                _edge(flat[a], c, out)
        return
    out.append(f'<rect x="{b.x:.0f}" y="{b.y:.0f}" width="{b.w:.0f}" height="{b.h:.0f}" rx="4" fill="#f4f4f4" '
               'stroke="#555"/>')
    out.append(f'<text x="{b.x + 6:.0f}" y="{b.y + 15:.0f}">{escape(b.label[:30])}</text>')
    out.append(f'<text x="{b.x + 6:.0f}" y="{b.y + 30:.0f}" fill="#666">{escape(b.sub[:30])}</text>')


def _edge(a: _Box, b: _Box, out: list[str]) -> None:
    x1, y1, x2, y2 = a.x + a.w / 2, a.y + a.h, b.x + b.w / 2, b.y
    out.append(f'<line x1="{x1:.0f}" y1="{y1:.0f}" x2="{x2:.0f}" y2="{y2:.0f}" stroke="#888" '
               'marker-end="url(#arr)"/>')


def to_svg(g: Any) -> str:
    """SVG text drawing ``g`` (a Graph or MuGraph) with block graphs as nested clusters."""
    nodes = node_list(g)
    top = _Box("", "", _layers(nodes, _node_box), f"{type(g).__name__} outputs {list(output_refs(g))}")
    top.measure()
    top.place(10, 10)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{top.w + 20:.0f}" height="{top.h + 20:.0f}" '
        'font-family="monospace" font-size="11">',
        '<defs><marker id="arr" markerWidth="8" markerHeight="8" refX="8" refY="4" orient="auto">'
        '<path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>',
    ]
    _emit(top, out, 0)
    out.append("</svg>")
    return "\n".join(out)


def render_svg(g: Any) -> str:
    """SVG of ``g``: through graphviz ``dot`` if installed, else the built-in layout."""
    exe = shutil.which("dot")
    if exe:
        from .dot import to_dot

        r = subprocess.run([exe, "-Tsvg"], input=to_dot(g), capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return r.stdout
    return to_svg(g)
