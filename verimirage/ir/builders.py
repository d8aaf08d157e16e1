"""Building programs: a graph's inputs and outputs, a μGraph's custom kernels, the builders' named op methods
(``g.add(a, b)``, ``g.exp(x)``, ``g.sum(x, axis)``, ...), JSON and dot, and the block and thread graph builders.

Each named method is a shorthand for ``apply(op, args, attrs)`` with the argument handling users expect
(constants as floats, ``keepdim``, ``-1`` in a reshape, negative permute dims). They live apart from the IR
core (:mod:`.graph`), which the certificate checker imports: the checker reads programs and never builds
them, so none of this is part of what a ``Proved`` depends on. The builders load this module on first use
so: importing :mod:`verimirage.ir` imports this module, which puts its methods on the IR's classes (:func:`install`):
besides building, the conveniences the checker never reads (``g.nodes``, ``g.type_of``, graph equality, a node's
``type``, the text of a block or thread graph on its own).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .dtypes import DType
from .errors import GraphError
from .graph import (
    BlockGraph,
    Graph,
    MuGraph,
    Node,
    OutputMap,
    Ref,
    ThreadGraph,
    _Builder,
    live_nodes,
    make_attrs,
    node_list,
    output_refs,
    tile_shape,
)
from .limits import check_constant, check_shape
from .ops import OPS, Level, Prop, TensorType, check_axis, get_op
from .text import block_body, block_head, print_node, thread_body

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_dtype(what: str, dtype: Any) -> DType:
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        return DType.parse(dtype)
    raise GraphError(f"{what}: dtype {dtype!r}; expected vm.float16, vm.bfloat16, vm.float32 or vm.bool")


class Tensor:
    """A value of a program under construction: returned by builder methods."""

    __slots__ = ("owner", "ref")

    def __init__(self, owner: _Builder, ref: Ref) -> None:
        self.owner = owner
        self.ref = ref

    @property
    def node(self) -> Node:
        """The node that produces this value."""
        return self.owner._nodes[self.ref[0]]

    @property
    def type(self) -> TensorType:
        """Shape and dtype."""
        return self.node.outs[self.ref[1]]

    @property
    def shape(self) -> tuple[int, ...]:
        """Static shape."""
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """Element type."""
        return self.type.dtype

    @property
    def name(self) -> str | None:
        """The input's name (kernel-level inputs), else None."""
        n = self.node
        return n.attr("name") if n.op == "input" else None

    def __repr__(self) -> str:
        n = self.node
        label = f"{n.op} {self.name}" if self.name else n.op
        return f"Tensor(%{self.ref[0]}{'' if self.ref[1] == 0 else '.' + str(self.ref[1])}: {self.type} = {label})"

    def __add__(self, o: Tensor) -> Tensor:
        return self.owner.add(self, o)

    def __sub__(self, o: Tensor) -> Tensor:
        return self.owner.sub(self, o)

    def __mul__(self, o: Tensor) -> Tensor:
        return self.owner.mul(self, o)

    def __truediv__(self, o: Tensor) -> Tensor:
        return self.owner.div(self, o)

    def __matmul__(self, o: Tensor) -> Tensor:
        return self.owner.matmul(self, o)

    def __neg__(self) -> Tensor:
        return self.owner.neg(self)


class NodeMethods:
    """A node's conveniences (installed on :class:`~.graph.Node`)."""

    outs: tuple[TensorType, ...]
    op: str

    @property
    def type(self) -> TensorType:
        """The single result type (GraphError for multi-result nodes)."""
        if len(self.outs) != 1:
            raise GraphError(f"{self.op} has {len(self.outs)} results; use outs[i]")
        return self.outs[0]


class BlockGraphMethods:
    """A block graph's text on its own (installed on :class:`~.graph.BlockGraph`)."""

    def __str__(self) -> str:
        bg = cast(BlockGraph, self)
        return f"block{block_head(bg)} {{\n{block_body(bg, '  ')}\n}}"


class ThreadGraphMethods:
    """A thread graph's text on its own (installed on :class:`~.graph.ThreadGraph`)."""

    def __str__(self) -> str:
        return f"thread {{\n{thread_body(cast(ThreadGraph, self), '  ')}\n}}"


class GraphMethods:
    """A kernel graph's building, JSON and dot methods, its node list and equality (installed on
    :class:`~.graph.Graph`)."""

    _nodes: list[Node]
    _outputs: list[Ref]

    @property
    def nodes(self) -> Sequence[Node]:
        """The nodes, in order (read-only view)."""
        return tuple(self._nodes)

    def type_of(self, ref: Ref) -> TensorType:
        """Type of the value ``ref``."""
        return self._nodes[ref[0]].outs[ref[1]]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph) or type(other) is not type(self):
            return NotImplemented
        return self._nodes == other._nodes and self._outputs == other._outputs

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(self._nodes), tuple(self._outputs)))

    def __repr__(self) -> str:
        return str(self)

    def input(self, name: str, shape: Sequence[int], dtype: DType) -> Tensor:
        """A named input of static ``shape`` and ``dtype``."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise GraphError(f"input: name {name!r}; expected an identifier")
        if any(n.op == "input" and n.attr("name") == name for n in self._nodes):
            raise GraphError(f"input: name {name!r} is already an input of this graph")
        shape = check_shape(f"input {name!r}", shape)
        dt = _check_dtype(f"input {name!r}", dtype)
        self._nodes.append(Node("input", (), (("name", name),), (TensorType(shape, dt),)))
        return Tensor(cast(_Builder, self), (len(self._nodes) - 1, 0))

    def output(self, *ts: Tensor) -> None:
        """Mark ``ts`` as outputs (in order); may be called more than once."""
        if not ts:
            raise GraphError("output: expected at least one Tensor")
        self._outputs.extend(cast(_Builder, self)._ref("output", t, i) for i, t in enumerate(ts))

    @property
    def inputs(self) -> list[Tensor]:
        """The inputs, in order of creation."""
        return [Tensor(cast(_Builder, self), (i, 0)) for i, n in enumerate(self._nodes) if n.op == "input"]

    @property
    def outputs(self) -> list[Tensor]:
        """The outputs, in order."""
        return [Tensor(cast(_Builder, self), r) for r in self._outputs]

    @property
    def outputs_refs(self) -> tuple[Ref, ...]:
        """The output refs, in order."""
        return tuple(self._outputs)

    def live(self) -> set[int]:
        """Indices of nodes that some output depends on."""
        return live_nodes(self._nodes, self._outputs)

    def input_names(self) -> list[str]:
        """Names of the inputs, in order."""
        return [n.attr("name") for n in self._nodes if n.op == "input"]

    @property
    def num_kernels(self) -> int:
        """Kernel launches an unfused execution makes: one per non-input node (a custom kernel is one; a causal
        mask, ``tril_mask``, is computed inside the kernels that read it)."""
        return sum(1 for n in self._nodes if n.op != "input" and not OPS[n.op].has(Prop.CONSTANT))

    def copy(self) -> Graph:
        """A new graph with the same nodes and outputs."""
        return cast(Graph, self)._from_parts(self._nodes, self._outputs)

    def to_json(self) -> str:
        """JSON text of the program."""
        from .serial import to_json

        return to_json(cast(Graph, self))

    @classmethod
    def parse(cls, text: str) -> Any:
        """Read a program from its text form (``parse(str(g)) == g``; as people write it too: :mod:`.parse`)."""
        from .parse import parse_program

        g = parse_program(text)
        if cls is MuGraph and not isinstance(g, MuGraph):
            return MuGraph._from_parts(g._nodes, g._outputs)
        if cls is Graph and isinstance(g, MuGraph):
            raise GraphError("Graph.parse: the text is a mugraph; use vm.MuGraph.parse")
        return g

    @classmethod
    def from_json(cls, s: str) -> Any:
        """Read a program from :meth:`to_json` text."""
        from .serial import from_json

        g = from_json(s)
        if cls is MuGraph and not isinstance(g, MuGraph):
            return MuGraph._from_parts(g._nodes, g._outputs)
        return g

    def to_dot(self) -> str:
        """Graphviz ``dot`` source (block graphs as nested clusters)."""
        from .dot import to_dot

        return to_dot(cast(Graph, self))


class MuGraphMethods:
    """A μGraph's custom kernels (installed on :class:`~.graph.MuGraph`)."""

    _nodes: list[Node]

    def custom(self, block: BlockGraph, args: Sequence[Tensor],
               shapes: Sequence[tuple[int, ...] | None] | None = None) -> tuple[Tensor, ...]:
        """A kernel computing ``block`` on ``args``; returns one Tensor per block output. ``shapes[r]``: output
        ``r``'s shape where it is smaller than its whole tiles (a masked tail: the last block's tile cropped along
        the dims the grid walks; None or left out: whole tiles)."""
        if not isinstance(block, BlockGraph):
            raise GraphError(f"custom: expected a BlockGraph, got {type(block).__name__}")
        me = cast(_Builder, self)
        refs = tuple(me._ref("custom", a, i) for i, a in enumerate(args))
        in_types = [self._nodes[r[0]].outs[r[1]] for r in refs]
        outs = block.result_types(in_types)
        if shapes is not None:
            from .check import check_crops

            if isinstance(shapes, (str, bytes)) or not isinstance(shapes, Sequence) or len(shapes) > len(outs):
                raise GraphError(f"custom: shapes={shapes!r}; expected a list of at most {len(outs)} shape(s) or None, "
                                 "one per block output")
            pad = [*shapes, *[None] * (len(outs) - len(shapes))]
            whole, outs = outs, tuple(t if s is None else TensorType(check_shape("custom: shapes", s), t.dtype)
                                      for t, s in zip(outs, pad, strict=True))
            check_crops(block, whole, outs)
        for t in outs:
            check_shape("custom: result", t.shape)
        self._nodes.append(Node("custom", refs, (("block", block),), outs))
        i = len(self._nodes) - 1
        return tuple(Tensor(me, (i, k)) for k in range(len(outs)))

    @classmethod
    def from_graph(cls, g: Graph) -> MuGraph:
        """The μGraph with the same nodes as ``g`` (every op its own kernel)."""
        return cast("type[MuGraph]", cls)._from_parts(node_list(g), output_refs(g))


class OpMethods:
    """The named op methods shared by every builder (each level allows a subset of the ops)."""

    _level: Level
    _nodes: list[Node]

    def _ref(self, op: str, x: Any, pos: int) -> Ref:
        if not isinstance(x, Tensor):
            raise GraphError(f"{op}: operand {pos} is {type(x).__name__} {x!r}; expected a Tensor of this graph")
        if x.owner is not self:
            raise GraphError(f"{op}: operand {pos} {x!r} belongs to another graph; expected a Tensor of this graph")
        return x.ref

    def _add_node(self, node: Node) -> Node:
        self._nodes.append(node)
        return node

    def _emit(self, op: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> Tensor:
        d = get_op(op)
        if not d.levels & self._level:
            raise GraphError(f"{op}: not allowed in a {str(self._level.name).lower()} graph")
        refs = tuple(self._ref(op, a, i) for i, a in enumerate(args))
        if attrs is not None and not isinstance(attrs, Mapping):
            raise GraphError(f"{op}: attributes {attrs!r}; expected a dict of name -> value")
        attrs = dict(attrs or {})
        unknown = sorted(set(attrs) - set(d.attrs))
        if unknown:
            raise GraphError(f"{op}: unknown attribute(s) {unknown}; expected {list(d.attrs)}")
        in_types = [self._nodes[r[0]].outs[r[1]] for r in refs]
        for key in list(attrs):
            kind = d.attr_kind(key)
            if kind == "axis" and in_types:
                attrs[key] = check_axis(op, in_types[0], attrs[key], "axis" if key == "axis" else f"axis {key}")
            elif kind == "float":  # finite and float32-representable (verimirage.ir.limits), as a float
                attrs[key] = check_constant(f"{op}: {key}", attrs[key])
            elif kind in ("ints", "axes") and isinstance(attrs[key], (list, tuple)):
                vals = attrs[key]
                if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                    raise GraphError(f"{op}: attribute {key}={vals!r}; expected a tuple of ints")
                if kind == "axes" and in_types:
                    vals = [check_axis(op, in_types[0], v) for v in vals]
                attrs[key] = tuple(int(v) for v in vals)
        try:
            out = d.infer(in_types, attrs)
        except KeyError as e:  # (a shape rule reading an attribute the call left out)
            raise GraphError(f"{op}: missing attribute {e.args[0]!r}; expected {list(d.attrs)}") from None
        check_shape(f"{op}: result", out.shape)
        self._add_node(Node(op, refs, make_attrs(attrs), (out,)))
        return Tensor(cast(_Builder, self), (len(self._nodes) - 1, 0))

    def apply(self, op: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> Tensor:
        """Apply registry op ``op`` to ``args`` with attributes ``attrs`` (every op, including ones
        declared outside this package; the named methods below are shorthands)."""
        return self._emit(op, args, attrs)


    def tril_mask(self, shape: Sequence[int], offset: int = 0) -> Tensor:
        """The causal mask (a constant ``vm.bool`` tensor): true where column ``j <= i + offset`` for row ``i`` of
        the last two dims, as ``torch.ones(n, m).tril(offset)``."""
        return self._emit("tril_mask", [], {"shape": tuple(shape) if isinstance(shape, (list, tuple)) else shape,
                                            "offset": offset})

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        """Batched matrix product ``a @ b``: (..., m, k) x (..., k, n); leading dims broadcast."""
        return self._emit("matmul", [a, b])

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """``a + b`` with numpy broadcasting."""
        return self._emit("add", [a, b])

    def sub(self, a: Tensor, b: Tensor) -> Tensor:
        """``a - b`` with numpy broadcasting."""
        return self._emit("sub", [a, b])

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        """``a * b`` with numpy broadcasting."""
        return self._emit("mul", [a, b])

    def div(self, a: Tensor, b: Tensor) -> Tensor:
        """``a / b`` with numpy broadcasting."""
        return self._emit("div", [a, b])

    def maximum(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise ``max(a, b)`` with numpy broadcasting."""
        return self._emit("maximum", [a, b])

    def exp(self, x: Tensor) -> Tensor:
        """``e**x``."""
        return self._emit("exp", [x])

    def silu(self, x: Tensor) -> Tensor:
        """``x * sigmoid(x)``."""
        return self._emit("silu", [x])

    def gelu(self, x: Tensor) -> Tensor:
        """GELU with the tanh approximation."""
        return self._emit("gelu", [x])

    def relu(self, x: Tensor) -> Tensor:
        """``max(x, 0)``."""
        return self._emit("relu", [x])

    def sqrt(self, x: Tensor) -> Tensor:
        """Square root."""
        return self._emit("sqrt", [x])

    def rsqrt(self, x: Tensor) -> Tensor:
        """``1 / sqrt(x)``."""
        return self._emit("rsqrt", [x])

    def square(self, x: Tensor) -> Tensor:
        """``x * x``."""
        return self._emit("square", [x])

    def neg(self, x: Tensor) -> Tensor:
        """``-x``."""
        return self._emit("neg", [x])

    def scale(self, x: Tensor, c: float) -> Tensor:
        """``x * c`` for a Python constant ``c``."""
        return self._emit("scale", [x], {"c": _const("scale", c)})

    def shift(self, x: Tensor, c: float) -> Tensor:
        """``x + c`` for a Python constant ``c``."""
        return self._emit("shift", [x], {"c": _const("shift", c)})

    def sum(self, x: Tensor, axis: int, keepdim: bool = True) -> Tensor:
        """Sum along ``axis``, keeping it with size 1 (``keepdim=False``: then reshaped without it)."""
        return self._drop(self._emit("sum", [x], {"axis": axis}), axis, keepdim)

    def mean(self, x: Tensor, axis: int, keepdim: bool = True) -> Tensor:
        """Mean along ``axis``, keeping it with size 1 (``keepdim=False``: then reshaped without it)."""
        return self._drop(self._emit("mean", [x], {"axis": axis}), axis, keepdim)

    def max(self, x: Tensor, axis: int, keepdim: bool = True) -> Tensor:
        """Max along ``axis``, keeping it with size 1 (``keepdim=False``: then reshaped without it)."""
        return self._drop(self._emit("max", [x], {"axis": axis}), axis, keepdim)

    def rms_norm(self, x: Tensor, weight: Tensor | None = None, axis: int = -1, eps: float = 1e-6) -> Tensor:
        """``x / sqrt(mean(x**2, axis) + eps)``, times ``weight`` (shape ``(x.shape[axis],)``) if given."""
        if isinstance(eps, int) and not isinstance(eps, bool):
            eps = check_constant("rms_norm: eps", eps, nonnegative=True)
        args = [x] if weight is None else [x, weight]
        return self._emit("rms_norm", args, {"axis": axis, "eps": eps})

    def concat(self, xs: Sequence[Tensor], axis: int) -> Tensor:
        """Concatenate ``xs`` along ``axis``."""
        if isinstance(xs, Tensor) or not isinstance(xs, Sequence) or not xs:
            raise GraphError(f"concat: expected a non-empty list of Tensors, got {xs!r}")
        return self._emit("concat", list(xs), {"axis": axis})

    def transpose(self, x: Tensor, a: int, b: int) -> Tensor:
        """Swap axes ``a`` and ``b``."""
        return self._emit("transpose", [x], {"a": a, "b": b})

    def minimum(self, a: Tensor, b: Tensor) -> Tensor:
        """Elementwise ``min(a, b)`` with numpy broadcasting."""
        return self._emit("minimum", [a, b])

    def log(self, x: Tensor) -> Tensor:
        """Natural logarithm (defined for ``x > 0``)."""
        return self._emit("log", [x])

    def tanh(self, x: Tensor) -> Tensor:
        """Hyperbolic tangent."""
        return self._emit("tanh", [x])

    def sigmoid(self, x: Tensor) -> Tensor:
        """``1 / (1 + e**-x)``."""
        return self._emit("sigmoid", [x])

    def erf(self, x: Tensor) -> Tensor:
        """The error function (exact GELU: ``0.5 * x * (1 + erf(x / sqrt(2)))``)."""
        return self._emit("erf", [x])

    def greater(self, x: Tensor, c: float) -> Tensor:
        """``x > c`` as a ``vm.bool`` mask (``where`` reads it; a comparison a model makes)."""
        return self._emit("greater", [x], {"c": c})

    def sin(self, x: Tensor) -> Tensor:
        """Sine (radians)."""
        return self._emit("sin", [x])

    def cos(self, x: Tensor) -> Tensor:
        """Cosine (radians)."""
        return self._emit("cos", [x])

    def softplus(self, x: Tensor) -> Tensor:
        """``log(1 + e**x)``."""
        return self._emit("softplus", [x])

    def abs(self, x: Tensor) -> Tensor:
        """``|x|``."""
        return self._emit("abs", [x])

    def reciprocal(self, x: Tensor) -> Tensor:
        """``1 / x``."""
        return self._emit("reciprocal", [x])

    def pow(self, x: Tensor, c: float) -> Tensor:
        """``x ** c`` for a Python constant ``c``."""
        return self._emit("pow", [x], {"c": c})

    def clamp(self, x: Tensor, lo: float, hi: float) -> Tensor:
        """``min(max(x, lo), hi)`` (hardtanh: ``clamp(x, -1, 1)``, relu6: ``clamp(x, 0, 6)``)."""
        return self._emit("clamp", [x], {"lo": lo, "hi": hi})

    def leaky_relu(self, x: Tensor, slope: float = 0.01) -> Tensor:
        """``x`` where ``x >= 0``, else ``slope * x``."""
        return self._emit("leaky_relu", [x], {"slope": slope})

    def where(self, mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
        """``a`` where ``mask`` (a vm.bool tensor) is true, else ``b``; the three broadcast like numpy."""
        return self._emit("where", [mask, a, b])

    def cast(self, x: Tensor, dtype: Any) -> Tensor:
        """``x`` rounded to ``dtype`` (vm.float16, vm.bfloat16 or vm.float32)."""
        dt = _check_dtype("cast", dtype)
        return self._emit("cast", [x], {"dtype": dt.short})

    def permute(self, x: Tensor, dims: Sequence[int]) -> Tensor:
        """Reorder dims: result dim ``j`` is operand dim ``dims[j]`` (negative dims count from the end)."""
        if isinstance(dims, (tuple, list)) and isinstance(x, Tensor):
            dims = [check_axis("permute", x.type, d, "dim") for d in dims]
        return self._emit("permute", [x], {"dims": dims})

    def reshape(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """Row-major reshape (a view); one dim may be ``-1`` (inferred)."""
        if isinstance(shape, (tuple, list)) and isinstance(x, Tensor) and list(shape).count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            shape = [x.type.numel // known if s == -1 and known > 0 else s for s in shape]
        return self._emit("reshape", [x], {"shape": shape})

    def broadcast_to(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        """``x`` broadcast to ``shape`` (numpy rules; torch's ``expand``)."""
        return self._emit("broadcast_to", [x], {"shape": shape})

    def slice(self, x: Tensor, axis: int, start: int, stop: int) -> Tensor:
        """Elements ``start .. stop-1`` along ``axis`` (torch's ``narrow``)."""
        return self._emit("slice", [x], {"axis": axis, "start": start, "stop": stop})

    def min(self, x: Tensor, axis: int, keepdim: bool = True) -> Tensor:
        """Min along ``axis``, keeping it with size 1 (``keepdim=False``: then reshaped without it)."""
        return self._drop(self._emit("min", [x], {"axis": axis}), axis, keepdim)

    def _drop(self, y: Tensor, axis: int, keepdim: bool) -> Tensor:
        """``y`` without its (size-1) dim ``axis`` unless ``keepdim``: a keepdim=False reduction is a
        reshape after the keepdim one."""
        if keepdim:
            return y
        shape = list(y.type.shape)
        del shape[check_axis("reduce", y.type, axis)]
        return self._emit("reshape", [y], {"shape": tuple(shape)})


def _const(op: str, c: Any) -> float:
    """A builder's constant: ints become floats; GraphError unless finite and float32-representable."""
    return check_constant(f"{op}: c", c)

class ThreadBuilder(_Builder):
    """Builds a :class:`ThreadGraph`: ``arg`` operands and elementwise ops."""

    def __init__(self) -> None:
        self._nodes: list[Node] = []
        self._outputs: list[Ref] = []
        self._level = Level.THREAD

    def arg(self, ttype: TensorType) -> Tensor:
        """The next operand, of type ``ttype``."""
        idx = sum(1 for n in self._nodes if n.op == "arg")
        self._add_node(Node("arg", (), (("index", idx),), (ttype,)))
        return Tensor(self, (len(self._nodes) - 1, 0))

    def _emit(self, op: str, args: Sequence[Any], attrs: dict[str, Any] | None = None) -> Tensor:
        if not get_op(op).has(Prop.ELEMENTWISE):
            raise GraphError(f"{op}: a thread graph holds elementwise ops only")
        return super()._emit(op, args, attrs)

    def output(self, *ts: Tensor) -> None:
        """Mark results."""
        self._outputs.extend(self._ref("output", t, i) for i, t in enumerate(ts))

    def build(self) -> ThreadGraph:
        """The finished, checked thread graph."""
        from .check import check_thread

        tg = ThreadGraph(tuple(self._nodes), tuple(self._outputs))
        check_thread(tg)
        return tg


class BlockBuilder(_Builder):
    """Builds a :class:`BlockGraph` for a ``grid`` and a for-loop of ``frange`` iterations."""

    def __init__(self, grid: Sequence[int], frange: int = 1) -> None:
        self.grid = tuple(grid)
        if not 1 <= len(self.grid) <= 3 or not all(isinstance(g, int) and g >= 1 for g in self.grid):
            raise GraphError(f"block graph: grid {grid!r}; expected 1 to 3 positive ints")
        if not isinstance(frange, int) or frange < 1:
            raise GraphError(f"block graph: frange {frange!r}; expected a positive int")
        self.frange = frange
        self._nodes: list[Node] = []
        self._outputs: list[Ref] = []
        self._omaps: list[OutputMap] = []
        self._level = Level.BLOCK

    def input(
        self, arg: int, ttype: TensorType, imap: Sequence[int | None], fmap: int | None = None
    ) -> Tensor:
        """Tile of custom-kernel operand ``arg`` (full type ``ttype``) as mapped by ``imap``/``fmap``."""
        if not isinstance(ttype, TensorType):
            raise GraphError(f"block input {arg}: type {ttype!r}; expected a TensorType")
        check_shape(f"block input {arg}", ttype.shape)
        imap_t = tuple(imap)
        tshape = tile_shape(f"block input {arg}", ttype.shape, self.grid, imap_t, fmap, self.frange)
        attrs = {"arg": arg, "shape": ttype.shape, "imap": imap_t, "fmap": fmap}
        self._add_node(Node("input", (), make_attrs(attrs), (TensorType(tshape, ttype.dtype),)))
        return Tensor(self, (len(self._nodes) - 1, 0))

    def loop_sum(self, x: Tensor) -> Tensor:
        """Sum of ``x`` over the for-loop's iterations (available after the loop)."""
        return self._emit("loop_sum", [x])

    def loop_max(self, x: Tensor) -> Tensor:
        """Max of ``x`` over the for-loop's iterations (available after the loop)."""
        return self._emit("loop_max", [x])

    def running_max(self, x: Tensor) -> Tensor:
        """In the loop body: max of ``x`` over this and all earlier iterations."""
        return self._emit("running_max", [x])

    def rescaled_sum(self, x: Tensor, m: Tensor) -> Tensor:
        """Online-softmax accumulator: ``acc = acc * exp(m_prev - m) + x``; ``m`` a running_max."""
        if isinstance(m, Tensor) and m.owner is self and m.node.op != "running_max":
            raise GraphError(f"rescaled_sum: the second operand must be a running_max, got {m.node.op}")
        return self._emit("rescaled_sum", [x, m])

    def fused(self, tg: ThreadGraph, args: Sequence[Tensor]) -> Tensor:
        """Apply thread graph ``tg`` (one result) to ``args``."""
        refs = tuple(self._ref("fused", a, i) for i, a in enumerate(args))
        from .check import thread_result_types

        outs = thread_result_types(tg, [self._nodes[r[0]].outs[r[1]] for r in refs])
        self._add_node(Node("fused", refs, (("thread", tg),), outs))
        return Tensor(self, (len(self._nodes) - 1, 0))

    def output(self, x: Tensor, omap: Sequence[int]) -> None:
        """Make ``x`` an output; ``omap[a]`` is the output dim that grid axis ``a`` walks."""
        self._outputs.append(self._ref("output", x, 0))
        self._omaps.append(OutputMap(tuple(omap)))

    def build(self, check: bool = True) -> BlockGraph:
        """The finished block graph, checked (``check=False``: by the caller, e.g. :meth:`MuGraph.custom`, which
        checks it against its operands' types: a superset of this check)."""
        from .check import check_block

        bg = BlockGraph(self.grid, self.frange, tuple(self._nodes), tuple(self._outputs), tuple(self._omaps))
        if check:
            check_block(bg, None)
        return bg


class DTypeMethods:
    """A dtype's size, torch name and repr (installed on :class:`.DType`)."""

    name: str
    value: str

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {"f32": 4, "b8": 1}.get(self.value, 2)

    @property
    def torch_name(self) -> str:
        """Name of the matching ``torch`` dtype attribute."""
        return self.name

    def __repr__(self) -> str:
        return f"vm.{self.name}"


class ErrorMethods:
    """A GraphError's text with the node it names and that node's operands (installed on :class:`.GraphError`)."""

    args: tuple[Any, ...]

    def __str__(self) -> str:
        if len(self.args) != 3:
            return str(self.args[0]) if self.args else ""
        msg, nodes, i = self.args
        lines = [msg, f"  at      {print_node(nodes[i], i)}"]
        for a, _ in nodes[i].args[:4]:
            if isinstance(a, int) and 0 <= a < len(nodes) and a != i:
                lines.append(f"  operand {print_node(nodes[a], a)}")
        return "\n".join(lines)


def install() -> None:
    """Put the methods on the builders' classes (done when this module is imported)."""
    for src, dst in ((OpMethods, _Builder), (GraphMethods, Graph), (MuGraphMethods, MuGraph), (NodeMethods, Node),
                     (BlockGraphMethods, BlockGraph), (ThreadGraphMethods, ThreadGraph),
                     (ErrorMethods, GraphError), (DTypeMethods, DType)):
        for name, fn in vars(src).items():
            if not name.startswith("__") or name in ("__eq__", "__hash__", "__repr__", "__str__"):
                setattr(dst, name, fn)


def installed() -> bool:
    """Whether :func:`install` ran."""
    return "apply" in vars(_Builder) and "custom" in vars(MuGraph)


install()


__all__ = ["BlockBuilder", "BlockGraphMethods", "DTypeMethods", "ErrorMethods", "GraphMethods", "MuGraphMethods",
           "NodeMethods", "OpMethods", "Tensor", "ThreadBuilder", "ThreadGraphMethods", "install", "installed"]
