"""Programs at the three levels of the IR.

* :class:`Graph` — a kernel graph: a DAG of tensor ops over device memory.
* :class:`MuGraph` — a kernel graph whose nodes may be ``custom`` kernels, each
  holding a :class:`BlockGraph`.
* :class:`BlockGraph` — what one thread block computes: a grid, a for-loop,
  per-input tiling maps, ops on tiles, loop accumulators, per-output maps.
* :class:`ThreadGraph` — a fused chain of elementwise ops, held by a ``fused``
  node of a block graph.

All are lists of immutable :class:`Node` values in SSA form: a node's operands
are :data:`Ref` pairs ``(node index, result index)`` pointing at earlier
nodes, so a program is acyclic by construction and compares structurally.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import GraphError
from .ops import Level, TensorType

Ref = tuple[int, int]  # (node index, result index)


if TYPE_CHECKING:
    from .builders import GraphMethods, MuGraphMethods, NodeMethods, OpMethods
    from .builders import Tensor as Tensor
else:  # (bases :mod:`.builders` fills in with the building, JSON and dot methods and conveniences: importing
    # verimirage.ir imports it; the certificate checker's process never does, it reads programs, never builds them)
    OpMethods = NodeMethods = object

    class GraphMethods:
        pass

    class MuGraphMethods:
        pass


@dataclass(frozen=True)
class Node(NodeMethods):
    """One operation: op name, operand refs, attributes (sorted pairs), result types."""

    op: str
    args: tuple[Ref, ...]
    attrs: tuple[tuple[str, Any], ...]
    outs: tuple[TensorType, ...]

    def attr(self, key: str, default: Any = None) -> Any:
        """The attribute ``key`` (or ``default``)."""
        for k, v in self.attrs:
            if k == key:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        """Attributes as a dict."""
        return dict(self.attrs)


def make_attrs(d: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Canonical (sorted) attribute tuple."""
    return tuple(sorted(d.items()))


@dataclass(frozen=True)
class OutputMap:
    """How a block graph's output tiles are placed in the kernel's output tensor.

    ``dims[a]`` is the output dim that grid axis ``a`` walks: block ``i`` on that
    axis writes the ``i``-th tile-sized slab of that dim. Every grid axis maps to
    a distinct dim, so every block writes its own region (partial results of a
    split reduction are placed side by side and combined by a later kernel).
    """

    dims: tuple[int, ...]


def live_nodes(nodes: Sequence[Node], outputs: Iterable[Ref]) -> set[int]:
    """Indices of ``nodes`` that some output depends on."""
    seen: set[int] = set()
    stack = [r[0] for r in outputs]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(a for a, _ in nodes[i].args)
    return seen


# --------------------------------------------------------------------------- builders


class _Builder(OpMethods):
    """The builders' common base (each level allows a subset of the ops); its methods are
    :class:`verimirage.ir.builders.OpMethods`'."""

    _level: Level
    _nodes: list[Node]


class Graph(GraphMethods, _Builder):
    """A kernel-level tensor program (see API.md). Build it with its methods."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._outputs: list[Ref] = []
        self._level = Level.KERNEL

    def check(self, *, unused_inputs: bool = False) -> None:
        """Well-formedness check (raises GraphError showing the offending node).

        An input that no output uses is an error unless ``unused_inputs=True``.
        """
        from .check import check_program

        check_program(self, unused_inputs=unused_inputs)

    @classmethod
    def _from_parts(cls, nodes: Iterable[Node], outputs: Iterable[Ref]) -> Any:
        g = cls()
        g._nodes = list(nodes)
        g._outputs = list(outputs)
        return g

    def __str__(self) -> str:
        from .text import print_program

        return print_program(self)


def output_refs(p: Graph | BlockGraph | ThreadGraph) -> tuple[Ref, ...]:
    """Output refs of a program at any level."""
    if isinstance(p, Graph):
        return tuple(p._outputs)
    return tuple(p.outputs)


def node_list(p: Graph | BlockGraph | ThreadGraph) -> Sequence[Node]:
    """Nodes of a program at any level."""
    if isinstance(p, Graph):
        return p._nodes
    return p.nodes


def input_types(g: Graph) -> dict[str, TensorType]:
    """A kernel graph's inputs by name, in order (``g.inputs`` are the builders' handles)."""
    return {n.attr("name"): n.outs[0] for n in g._nodes if n.op == "input"}


def output_types(p: Graph | BlockGraph | ThreadGraph) -> list[TensorType]:
    """The types of a program's outputs, in order."""
    return [node_list(p)[a].outs[k] for a, k in output_refs(p)]


class MuGraph(MuGraphMethods, Graph):
    """A μGraph: a kernel graph whose nodes may be ``custom`` kernels holding block graphs."""



# --------------------------------------------------------------------------- block and thread graphs


def tile_shape(what: str, shape: tuple[int, ...], grid: tuple[int, ...], imap: tuple[int | None, ...],
               fmap: int | None, frange: int) -> tuple[int, ...]:
    """Shape of one block's per-iteration tile of a tensor of ``shape``; GraphError if the maps don't fit. A dim
    that does not divide gets the ceiling: the operand is read zero-padded to ``grid * frange * tile`` there (a
    *masked tail*: :func:`verimirage.ir.interpret.fit`)."""
    if len(imap) != len(grid):
        raise GraphError(f"{what}: imap {imap} has {len(imap)} entries; expected one per grid axis {grid}")
    t = list(shape)
    used: set[int] = set()
    for a, d in enumerate(imap):
        if d is None:
            continue
        if not isinstance(d, int) or not 0 <= d < len(shape):
            raise GraphError(f"{what}: imap {imap} names dim {d!r} of a rank-{len(shape)} tensor {shape}")
        if d in used:
            raise GraphError(f"{what}: imap {imap} partitions dim {d} twice; expected distinct dims")
        used.add(d)
        t[d] = -(-t[d] // grid[a])
    if fmap is not None:
        if not isinstance(fmap, int) or not 0 <= fmap < len(shape):
            raise GraphError(f"{what}: fmap {fmap!r} is not a dim of a rank-{len(shape)} tensor {shape}")
        t[fmap] = -(-t[fmap] // frange)
    return tuple(t)


@dataclass(frozen=True)
class BlockGraph:
    """What one thread block computes, for every block of ``grid``.

    Its ``input`` nodes carry ``arg`` (which operand of the custom kernel),
    ``shape`` (that operand's full shape), ``imap`` (per grid axis: the dim it
    partitions, or None for replicated) and ``fmap`` (the dim the for-loop walks,
    or None: the same tile every iteration). Nodes that depend on a loop
    accumulator (``loop_sum``, ``loop_max``, ``rescaled_sum``) run once after the
    loop; the others run every iteration. ``omaps[i]`` places output ``i``.

    ``flimit = (axis, a, c, d)`` bounds the loop per block: iteration ``it`` runs in the blocks whose index ``b`` on
    grid axis ``axis`` has ``d it <= a b + c``; in the others every accumulator keeps its value (a causal skip).
    """

    grid: tuple[int, ...]
    frange: int
    nodes: tuple[Node, ...]
    outputs: tuple[Ref, ...]
    omaps: tuple[OutputMap, ...]
    flimit: tuple[int, int, int, int] | None = None

    def type_of(self, ref: Ref) -> TensorType:
        """Type of the value ``ref``."""
        return self.nodes[ref[0]].outs[ref[1]]

    @property
    def num_blocks(self) -> int:
        """Number of thread blocks."""
        return math.prod(self.grid)

    def post_loop(self) -> list[bool]:
        """Per node: whether it runs after the for-loop (depends on an accumulator)."""
        post: list[bool] = []
        for n in self.nodes:
            post.append(n.op in ("loop_sum", "loop_max", "rescaled_sum") or any(post[a] for a, _ in n.args))
        return post

    def result_types(self, in_types: Sequence[TensorType]) -> tuple[TensorType, ...]:
        """Types of the kernel's outputs given its operands' types; GraphError on mismatch."""
        from .check import check_block
        from .interpret import whole_tiles

        check_block(self, in_types)
        return tuple(TensorType(whole_tiles(self.type_of(o).shape, m.dims, self.grid), self.type_of(o).dtype)
                     for o, m in zip(self.outputs, self.omaps, strict=True))


@dataclass(frozen=True)
class ThreadGraph:
    """A fused chain of elementwise ops; ``arg`` nodes (attr ``index``) are its operands."""

    nodes: tuple[Node, ...]
    outputs: tuple[Ref, ...]

    def type_of(self, ref: Ref) -> TensorType:
        """Type of the value ``ref``."""
        return self.nodes[ref[0]].outs[ref[1]]
