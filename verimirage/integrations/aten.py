"""Lifting core ATen ops into ``vm.Graph`` ops (the capture's op table).

Each ATen op (by its overload packet name, e.g. ``"addmm"``) has a handler
that emits the registry ops computing it. Registry ops that may not exist yet
(``tanh``, ``sigmoid``, ``erf``, ``log``, ``reshape``, ``where``, ``cast``,
...) are looked up by name in :data:`verimirage.ir.ops.OPS` when a handler
runs, so ops added to the registry are picked up without changes here. A
handler that cannot express a node raises :class:`Unsupported` with a
:class:`Reason`; the capture then leaves that node to the fallback.

Views and layout
----------------
The IR has no views. A lifted value is an :class:`LV`: a graph tensor plus the
ATen shape it stands for. A reshape-like op (``view``, ``_unsafe_view``,
``unsqueeze``, a reduction without ``keepdim``...) changes only the ATen shape
(the data is the same row-major sequence); ``expand`` marks the value as
broadcasting to its ATen shape. Consumers that can read the value as it is
(elementwise ops whose broadcasting lines up, matmuls whose batch dims were
flattened, reductions over the trailing dims) use it directly; others need the
registry's ``reshape`` / ``broadcast_to`` ops, and without them the node is a
partition boundary (reason ``layout``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..ir.builders import Tensor
from ..ir.dtypes import DType
from ..ir.errors import GraphError
from ..ir.graph import Graph
from ..ir.ops import OPS


class Reason(enum.Enum):
    """Why an ATen op or a partition is left to the fallback."""

    NOT_IN_REGISTRY = "op not in the registry"
    LAYOUT = "layout"
    DYNAMIC_SHAPE = "dynamic shape"
    DTYPE = "dtype"
    NO_CANDIDATE = "no verified candidate"
    SEARCH_FAILED = "search failed"
    COMPILE_FAILED = "compile or launch failed"
    NUMERIC = "numeric check failed"
    SLOWER = "slower than the fallback"
    NO_COMPUTE = "no compute (views only)"
    RANDOM = "random op"
    #: reads or writes at indices that are data (embedding lookups, top-k, scatter): no registry op can state them,
    #: so they run in the fallback, outside the verified kernels, which read their results as inputs
    INDEXED = "data-dependent indexing"
    NOT_TENSOR = "not a tensor op"
    #: a constant the model makes in its forward (a mask, a position sequence) that only ops left to ATen read: ATen
    #: makes it (one the kernels read is computed while lifting and enters them as a constant input)
    CONSTANT = "a constant only ATen ops read"
    CAPTURE_FAILED = "the capture failed"
    UNPARTITIONED = "left out of every partition"


class Unsupported(GraphError):
    """A node the capture cannot lift, with the :class:`Reason`.

    ``blame``: the fx node that made the value unusable (a view the IR cannot express), if not the
    node being lifted; the capture then leaves that node, not the consumer, to the fallback.
    """

    def __init__(self, reason: Reason, message: str, blame: Any = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.blame = blame


@dataclass(frozen=True)
class LV:
    """A lifted value: graph tensor ``t`` standing for an ATen tensor of ``shape``.

    ``t.shape == shape``, or the same elements in row-major order under another
    shape (a pending reshape), or (``bcast``) ``t`` broadcasts to ``shape``.
    """

    t: Tensor
    shape: tuple[int, ...]
    bcast: bool = False
    src: Any = None  # the fx node that made it differ from ``t`` (a view), for blame
    #: an ATen boolean (a comparison with a constant) held as 0/1 floats (``step``): read by ``where`` as
    #: arithmetic, and by any other op as the numbers 0 and 1 (what ATen promotes a boolean to); never a result
    #: of a partition (its ATen dtype is bool)
    mask: bool = False
    #: ``(m, keep)``: the boolean mask ``m`` (a graph tensor broadcasting to ``t``) true where ``aten.masked_fill``
    #: wrote -inf (``keep``: true where it did not), which ``t`` holds as the dtype's lowest finite value: read
    #: only by the softmax the fill feeds (its only users), which makes those entries exactly 0
    #: (:func:`_masked_fill`); never a result of a partition
    fill: tuple[Tensor, bool] | None = None
    #: an ATen boolean held as its negation (``~keep`` of a boolean ``keep``: ``t`` is ``keep``): read only by
    #: ``where`` and ``masked_fill`` as their mask, which swap their branches (:func:`_not`); never a result of a
    #: partition
    negated: bool = False
    #: a complex64 value held as its real view (``torch.view_as_real``: float32, a trailing dim of 2 for the real and
    #: imaginary parts; ``shape`` is that view's): read only by :data:`COMPLEX_OPS`; never a result of a partition
    cplx: bool = False
    #: for a comparison with a constant (:attr:`mask`): ``(x, op, c)``, the compared tensor (in ``t``'s shape), the
    #: ATen comparison and the constant, from which ``where`` makes its boolean mask (``greater``)
    cmp: tuple[Tensor, str, float] | None = None
    #: a boolean ``m1 & m2`` (``and``) or ``m1 | m2`` of two booleans (comparisons made here or boolean tensors), as
    #: ``(m1, m2, and)``: with :attr:`mask`, ``t`` holds it as 0/1 floats; ``where`` reads it as nested selects
    both: tuple[Any, Any, bool] | None = None
    #: a constant computed while lifting (:func:`constant_value`): its torch value, for ops that read it at lift time
    #: (constant indices)
    value: Any = None
    #: a constant that is 0 wherever it is finite (with :attr:`fill`: a 0 / -inf mask, which a sum need not add)
    zero: bool = False
    #: integer-valued float32s standing for an ATen integer tensor (class labels compared with a constant, a count
    #: of true booleans): exact below 2**24; read by equality tests and arithmetic, never a result of a partition
    integral: bool = False
    #: with :attr:`fill` made from a constant (a mask computed while lifting): the torch booleans of its "kept"
    #: entries (``fill[0]``'s values), from which a softmax knows a column every row keeps (:func:`_softmax`)
    kept: Any = None

    @property
    def exact(self) -> bool:
        """Whether the graph tensor has exactly the ATen shape."""
        return tuple(self.t.shape) == self.shape and not self.bcast


def strip1(s: Sequence[int]) -> tuple[int, ...]:
    """``s`` without its leading size-1 dims."""
    s = tuple(s)
    i = 0
    while i < len(s) and s[i] == 1:
        i += 1
    return s[i:]


def common_tail(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common suffix of two shapes."""
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def broadcasts_to(s: Sequence[int], target: Sequence[int]) -> bool:
    """Whether shape ``s`` broadcasts to ``target`` (numpy rules, right-aligned)."""
    s, target = strip1(s), tuple(target)
    if len(s) > len(target):
        return False
    return all(d in (1, target[len(target) - len(s) + i]) for i, d in enumerate(s))


def has_op(name: str) -> bool:
    """Whether the registry has op ``name`` (and the graph builder can emit it)."""
    return name in OPS


def emit(g: Graph, name: str, *args: Any, **attrs: Any) -> Tensor:
    """Emit registry op ``name``: the builder method when there is one, else the generic path."""
    if name not in OPS:
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"the registry has no op {name!r}")
    m = getattr(g, name, None)
    if m is not None and callable(m):
        return m(*args, **attrs)
    apply = getattr(g, "apply", None)
    if apply is not None:
        return apply(name, list(args), attrs)
    return g._emit(name, list(args), attrs)


_DTYPES: dict[str, DType] = {"float16": DType.float16, "bfloat16": DType.bfloat16, "float32": DType.float32}


def vm_dtype(torch_dtype: Any) -> DType:
    """The registry dtype of a torch dtype, or Unsupported."""
    name = str(torch_dtype).replace("torch.", "")
    if name == "bool" and hasattr(DType, "bool"):
        return DType["bool"]
    if name not in _DTYPES:
        raise Unsupported(Reason.DTYPE, f"dtype {name} is not in the registry (float16, bfloat16, float32)")
    return _DTYPES[name]


class Ctx:
    """State of one lifting: the graph being built and helpers the handlers share."""

    def __init__(self, g: Graph) -> None:
        self.g = g
        self.consts: list[tuple[str, Any]] = []  # (input name, torch tensor) made while lifting (e.g. masks)
        self.node: Any = None  # the fx node being lifted
        self.strict = False  # no registry layout ops (reshape, broadcast_to, permute, slice): views are boundaries
        self.out_dtype: DType | None = None  # the dtype of the node's (first) result, when it is a float
        self.env: dict[Any, Any] = {}  # fx node -> its lifted value (the lifting's, for handlers that look back)
        self.folded: dict[Any, Any] = {}  # fx node -> its torch value, computed while lifting (capture.foldable)

    def layout(self, name: str) -> bool:
        """Whether registry layout op ``name`` may be emitted."""
        return has_op(name) and not self.strict

    # -- shapes
    def exact(self, v: LV) -> Tensor:
        """A tensor of exactly the ATen shape (a reshape / broadcast_to op if needed)."""
        if v.exact:
            return v.t
        t = v.t
        if v.bcast:
            if self.layout("broadcast_to") and (len(t.shape) == len(v.shape) or self.layout("reshape")):
                if len(t.shape) < len(v.shape):
                    t = emit(self.g, "reshape", t, (1,) * (len(v.shape) - len(t.shape)) + tuple(t.shape))
                elif len(t.shape) > len(v.shape) and all(d == 1 for d in t.shape[:len(t.shape) - len(v.shape)]):
                    # an expand viewed without its leading size-1 dims ((1, 1, 8, 4) expanded to (1, 3, 8, 4), then
                    # viewed as (3, 8, 4)): the same elements, fewer leading dims
                    t = emit(self.g, "reshape", t, tuple(t.shape[len(t.shape) - len(v.shape):]))
                return emit(self.g, "broadcast_to", t, v.shape)
            raise Unsupported(Reason.LAYOUT, f"an expanded value {tuple(t.shape)} -> {v.shape} needs broadcast_to",
                              v.src)
        if self.layout("reshape"):
            return emit(self.g, "reshape", t, v.shape)
        raise Unsupported(Reason.LAYOUT, f"a reshape {tuple(t.shape)} -> {v.shape} needs the registry's reshape op",
                          v.src)

    def axes(self, v: LV, dims: Sequence[int]) -> tuple[Tensor, list[int]]:
        """The graph tensor and graph axes for ATen ``dims`` of ``v`` (no data movement when possible)."""
        r = len(v.shape)
        dims = [d % r if r else 0 for d in dims]
        if not v.bcast and not v.exact:
            n = common_tail(v.shape, v.t.shape)
            if all(d >= r - n for d in dims):
                off = len(v.t.shape) - r
                return v.t, [d + off for d in dims]
        return self.exact(v), dims

    def ew(self, out_shape: Sequence[int], vals: Sequence[LV], build: Callable[[list[Tensor]], Tensor]) -> LV:
        """An elementwise op over ``vals`` (ATen result shape ``out_shape``), reading pending reshapes as they are."""
        R = tuple(out_shape)
        full = [v for v in vals if v.shape == R and not v.bcast]
        W = R
        for v in full:
            if not v.exact:
                W = tuple(v.t.shape)
                break
        def as_is() -> list[Tensor]:  # every operand in the ATen shape (pending reshapes made real)
            return [v.t if v.exact or (not v.bcast and strip1(v.t.shape) == strip1(v.shape)) or (
                v.bcast and broadcasts_to(v.t.shape, v.shape)) else self.exact(v) for v in vals]

        def viewed() -> list[Tensor]:  # in the viewed operands' shape ``W`` (no data movement)
            ts: list[Tensor] = []
            L = common_tail(R, W)
            for v in vals:
                if v.shape == R and not v.bcast:
                    if tuple(v.t.shape) != W:
                        blame = next((u.src for u in full if not u.exact and u.src is not None), None)
                        raise Unsupported(Reason.LAYOUT, f"operands viewed as {R} from different shapes", blame)
                    ts.append(v.t)
                elif (not v.bcast and strip1(v.t.shape) == strip1(v.shape) and len(strip1(v.shape)) <= L) or (
                    v.bcast and len(strip1(v.t.shape)) <= L and broadcasts_to(v.t.shape, R)
                ):
                    ts.append(v.t)
                else:
                    raise Unsupported(Reason.LAYOUT, f"an operand of shape {v.shape} does not line up with {R}", v.src)
            return ts

        if W == R:
            ts = as_is()
        else:
            try:
                ts = viewed()
            except Unsupported:
                # an operand broadcasts over dims the view merged (an attention mask (B, 1, 1, S) added to
                # scores viewed as (B, H, L, S) from a (B*H, L, S) batched matmul): the viewed operands are
                # reshaped to the ATen shape instead, where the registry has reshape
                if not self.layout("reshape"):
                    raise
                ts, W = as_is(), R
        if len({t.dtype for t in ts}) > 1 and self.out_dtype in {t.dtype for t in ts}:
            # ATen's type promotion (an fp16 weight times an fp32 activation is fp32): the narrower operands
            # are cast to the result's dtype first, exactly as ATen computes it
            ts = [t if t.dtype == self.out_dtype else emit(self.g, "cast", t, self.out_dtype) for t in ts]
        out = build(ts)
        src = next((v.src for v in vals if not v.exact), None)
        return LV(out, R, bcast=math.prod(out.shape) != math.prod(R), src=src)


# --------------------------------------------------------------------------- handlers
#
# A handler is ``fn(ctx, args, kwargs, out) -> LV | tuple[LV, ...]``: ``args`` are the node's
# arguments with tensors replaced by LVs, ``out`` the ATen result's (shape, dtype) (a list for
# multi-output ops).

Handler = Callable[..., Any]
HANDLERS: dict[str, Handler] = {}


def handles(*names: str) -> Callable[[Handler], Handler]:
    """Register a handler for the ATen ops ``names`` (overload packet names)."""

    def deco(fn: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _shape(out: Any) -> tuple[int, ...]:
    return tuple(out[0])


#: ATen op -> registry unary op (looked up when used).
UNARY: dict[str, str] = {
    "relu": "relu",
    "exp": "exp",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "neg": "neg",
    "silu": "silu",
    "sigmoid": "sigmoid",
    "tanh": "tanh",
    "log": "log",
    "erf": "erf",
    "abs": "abs",
    "reciprocal": "reciprocal",
    "softplus": "softplus",
    "square": "square",
    "sin": "sin",
    "cos": "cos",
}


def _unary(name: str) -> Handler:
    op = UNARY[name]

    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
        if name == "softplus" and (args[1:] not in ([], [1], [1, 20]) or kwargs):
            raise Unsupported(Reason.NOT_IN_REGISTRY, "softplus with beta/threshold other than 1/20")
        return ctx.ew(_shape(out), [args[0]], lambda ts: emit(ctx.g, op, ts[0]))

    return fn


for _n in UNARY:
    HANDLERS[_n] = _unary(_n)


@handles("gelu")
def _gelu(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    approx = kwargs.get("approximate", args[1] if len(args) > 1 else "none")
    g = ctx.g
    if approx == "tanh":
        return ctx.ew(_shape(out), [args[0]], lambda ts: emit(g, "gelu", ts[0]))

    def exact(ts: list[Tensor]) -> Tensor:  # 0.5 x (1 + erf(x / sqrt 2))
        x = ts[0]
        e = emit(g, "erf", emit(g, "scale", x, c=math.sqrt(0.5)))
        return emit(g, "mul", emit(g, "scale", x, c=0.5), emit(g, "shift", e, c=1.0))

    return ctx.ew(_shape(out), [args[0]], exact)


@handles("pow")
def _pow(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    x, c = args[0], args[1]
    if _num(x) and isinstance(c, LV) and float(x) > 0 and not c.mask and not c.cplx:
        # base ** t of a positive base (rotary's ``base ** (arange(0, d, 2) / d)``): exp(t ln base)
        k = math.log(float(x))
        return ctx.ew(_shape(out), [c], lambda ts: emit(ctx.g, "exp", emit(ctx.g, "scale", ts[0], c=k)))
    if not isinstance(x, LV) or not _num(c):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "pow with a tensor exponent of a tensor or of a base <= 0")
    g, c = ctx.g, float(c)
    table: dict[float, Callable[[Tensor], Tensor]] = {
        1.0: lambda t: t,
        2.0: lambda t: emit(g, "square", t),
        3.0: lambda t: emit(g, "mul", emit(g, "square", t), t),
        4.0: lambda t: emit(g, "square", emit(g, "square", t)),
        0.5: lambda t: emit(g, "sqrt", t),
        -0.5: lambda t: emit(g, "rsqrt", t),
        -1.0: lambda t: emit(g, "reciprocal", t),
        -2.0: lambda t: emit(g, "reciprocal", emit(g, "square", t)),
    }
    f = table.get(c)
    if f is None:
        return ctx.ew(_shape(out), [x], lambda ts: emit(g, "pow", ts[0], c=c))
    return ctx.ew(_shape(out), [x], lambda ts: f(ts[0]))


def _binary(op: str) -> Handler:
    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"{op} with rounding_mode")
        g = ctx.g
        filled = [v for v in (a, b) if isinstance(v, LV) and v.fill is not None]
        if filled:  # scores + a constant mask holding -inf, which a softmax reads (constant_value)
            if op != "add" or alpha != 1 or len(filled) > 1 or not all(isinstance(v, LV) for v in (a, b)):
                raise Unsupported(Reason.NOT_IN_REGISTRY, f"{op} of a value holding -inf")
            other = b if filled[0] is a else a
            if filled[0].zero and tuple(_shape(out)) == other.shape:  # a 0 / -inf mask: x + 0 is x (up to -0)
                r = other
            else:
                plain = [dataclasses.replace(v, fill=None) for v in (a, b)]
                r = ctx.ew(_shape(out), plain, lambda ts: emit(g, "add", ts[0], ts[1]))
            fill = filled[0].fill
            assert fill is not None
            return LV(_filled(ctx, fill, ctx.exact(r)), r.shape, fill=fill, kept=filled[0].kept)
        if op == "mul" and isinstance(a, LV) and a.cplx:
            return _cmul(ctx, a, b, out)
        if op == "mul" and isinstance(b, LV) and b.cplx:
            return _cmul(ctx, b, a, out)
        if op in ("add", "sub", "rsub") and alpha != 1:
            # alpha scales ``other`` in add/sub (a + alpha b) but ``self`` in rsub (b - alpha a)
            scaled = a if op == "rsub" else b
            if not (isinstance(scaled, LV) and _num(alpha)):
                raise Unsupported(Reason.NOT_IN_REGISTRY, f"{op} with alpha={alpha!r}")
            scaled = ctx.ew(scaled.shape, [scaled], lambda ts: emit(g, "scale", ts[0], c=float(alpha)))
            a, b = (scaled, b) if op == "rsub" else (a, scaled)
        if isinstance(a, LV) and isinstance(b, LV):
            return ctx.ew(_shape(out), [a, b], lambda ts: emit(g, op, ts[0], ts[1]))
        if isinstance(a, LV) and _num(b):
            c = float(b)
            if op == "add":
                return ctx.ew(_shape(out), [a], lambda ts: emit(g, "shift", ts[0], c=c))
            if op == "sub":
                return ctx.ew(_shape(out), [a], lambda ts: emit(g, "shift", ts[0], c=-c))
            if op == "mul":
                return ctx.ew(_shape(out), [a], lambda ts: emit(g, "scale", ts[0], c=c))
            if op == "div" and c != 0:
                # x / c becomes x * fl(1/c): equal in real arithmetic, within an ulp in floating point
                return ctx.ew(_shape(out), [a], lambda ts: emit(g, "scale", ts[0], c=1.0 / c))
            if op == "rsub":
                return ctx.ew(_shape(out), [a], lambda ts: emit(g, "shift", emit(g, "neg", ts[0]), c=c))
        if _num(a) and isinstance(b, LV) and op in ("add", "mul"):
            return _binary(op)(ctx, [b, a], {}, out)
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"{op} of {type(a).__name__} and {type(b).__name__}")

    return fn


for _n in ("add", "sub", "mul", "div", "rsub"):
    HANDLERS[_n] = _binary(_n)


def _named_binary(op: str) -> Handler:
    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
        a, b = args[0], args[1]
        if not (isinstance(a, LV) and isinstance(b, LV)):
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"{op} with a scalar operand")
        return ctx.ew(_shape(out), [a, b], lambda ts: emit(ctx.g, op, ts[0], ts[1]))

    return fn


HANDLERS["maximum"] = _named_binary("maximum")
HANDLERS["minimum"] = _named_binary("minimum")


@handles("leaky_relu")
def _leaky(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    slope = float(args[1]) if len(args) > 1 else float(kwargs.get("negative_slope", 0.01))
    g = ctx.g
    if has_op("leaky_relu"):
        return ctx.ew(_shape(out), [args[0]], lambda ts: emit(g, "leaky_relu", ts[0], slope))
    if not 0.0 <= slope <= 1.0:
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"leaky_relu with slope {slope} outside [0, 1]")
    # for 0 <= s <= 1: leaky_relu(x) = max(x, s x)
    return ctx.ew(_shape(out), [args[0]], lambda ts: emit(g, "maximum", ts[0], emit(g, "scale", ts[0], c=slope)))


@handles("clamp", "hardtanh")
def _clamp(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    lo = args[1] if len(args) > 1 else kwargs.get("min", kwargs.get("min_val"))
    hi = args[2] if len(args) > 2 else kwargs.get("max", kwargs.get("max_val"))
    if not (lo is None or _num(lo)) or not (hi is None or _num(hi)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "clamp with tensor bounds")
    if lo is None or hi is None:  # one bound (x.clamp(min=eps)): the registry's clamp takes both; max/min with it
        if lo is None and hi is None:
            return args[0]
        name, bound = ("maximum", lo) if lo is not None else ("minimum", hi)
        c = float(bound)  # type: ignore[arg-type]  # one of the two is a number (checked above)
        if not math.isfinite(c):
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"clamp with an infinite bound {c}")
        k = _constant(ctx, (), out[1], c)
        return ctx.ew(_shape(out), [args[0], k], lambda ts: emit(ctx.g, name, ts[0], ts[1]))
    return ctx.ew(
        _shape(out), [args[0]], lambda ts: emit(ctx.g, "clamp", ts[0], None if lo is None else float(lo),
                                                 None if hi is None else float(hi))
    )


@handles("clamp_min", "clamp_max")
def _clamp_one(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``clamp_min(x, c)`` / ``clamp_max(x, c)`` (``F.normalize``'s ``norm.clamp_min(eps)``): a one-sided clamp."""
    c = args[1] if len(args) > 1 else kwargs.get("min" if op_of(ctx) == "clamp_min" else "max")
    return _clamp(ctx, [args[0]], {"min" if op_of(ctx) == "clamp_min" else "max": c}, out)


@handles("linalg_vector_norm")
def _vector_norm(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``torch.linalg.vector_norm`` (``F.normalize``, ``x.norm(dim=...)``) of order 2 (``sqrt(sum(x**2))``), 1
    (``sum(|x|)``) or inf (``max(|x|)``) over ``dim``."""
    v = args[0]
    order = args[1] if len(args) > 1 else kwargs.get("ord", 2)
    dims = args[2] if len(args) > 2 else kwargs.get("dim")
    keep = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
    if (args[4] if len(args) > 4 else kwargs.get("dtype")) is not None:
        raise Unsupported(Reason.DTYPE, "linalg_vector_norm with a dtype")
    if not isinstance(v, LV) or v.mask or not _num(order) or float(order) not in (1.0, 2.0, math.inf):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"linalg_vector_norm of order {order!r} (orders 1, 2 and inf)")
    if len(v.shape) == 0:
        raise Unsupported(Reason.LAYOUT, "linalg_vector_norm of a scalar")
    ds, _ = _dims([v, dims, keep], {}, len(v.shape))
    t, gdims = ctx.axes(v, ds)
    g = ctx.g
    o = float(order)
    t = _reduced(g, "max" if o == math.inf else "sum", emit(g, "square", t) if o == 2.0 else emit(g, "abs", t), gdims)
    if o == 2.0:
        t = emit(g, "sqrt", t)
    return LV(t, _shape(out), src=ctx.node if tuple(t.shape) != _shape(out) else None)


# -- identity and layout


@handles("clone", "detach", "alias", "contiguous", "lift_fresh_copy")
def _ident(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    assert isinstance(v, LV)
    return v


@handles("_to_copy", "convert_element_type", "to")
def _to_copy(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    want = vm_dtype(out[1])
    if isinstance(v, LV) and v.mask and want != DType.bool:  # a comparison's booleans as numbers: its 0/1 floats
        v = dataclasses.replace(v, mask=False, cmp=None)
    if v.t.dtype == want:
        return v
    r = ctx.ew(_shape(out), [v], lambda ts: emit(ctx.g, "cast", ts[0], want))
    # a masked_fill(-inf) on its way to a softmax (the fill checked its readers: a widening cast, then softmax)
    return r if v.fill is None else dataclasses.replace(r, fill=v.fill, kept=v.kept)


@handles("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as", "_reshape_alias")
def _view(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    shape = _shape(out)
    if v.bcast:
        if strip1(shape) == strip1(v.shape):
            return LV(v.t, shape, bcast=True, src=v.src)
        return LV(ctx.exact(v), shape, src=ctx.node)
    return LV(v.t, shape, src=ctx.node if tuple(v.t.shape) != shape else None)


@handles("expand")
def _expand(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    shape = _shape(out)
    if shape == v.shape:
        return v
    if not v.bcast and strip1(v.t.shape) != strip1(v.shape):
        t = ctx.exact(v)
    else:
        t = v.t
    return LV(t, shape, bcast=True, src=ctx.node)


@handles("t")
def _t(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    if len(v.shape) < 2:
        return v
    return LV(emit(ctx.g, "transpose", ctx.exact(v), 0, 1), _shape(out))


@handles("transpose")
def _transpose(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v, a, b = args[0], int(args[1]), int(args[2])
    r = len(v.shape)
    if r == 0 or a % r == b % r:
        return v
    t, (ga, gb) = ctx.axes(v, [a, b])
    return LV(emit(ctx.g, "transpose", t, ga, gb), _shape(out))


@handles("permute")
def _permute(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v, dims = args[0], [int(d) % max(len(args[0].shape), 1) for d in args[1]]
    t = ctx.exact(v)
    if dims == sorted(dims):
        return v
    if ctx.layout("permute"):
        return LV(emit(ctx.g, "permute", t, tuple(dims)), _shape(out))
    # a permutation as a sequence of swaps
    cur = list(range(len(dims)))
    for i, d in enumerate(dims):
        j = cur.index(d)
        if j != i:
            t = emit(ctx.g, "transpose", t, i, j)
            cur[i], cur[j] = cur[j], cur[i]
    return LV(t, _shape(out))


@handles("cat", "concat")
def _cat(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    xs = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(xs, (list, tuple)) or not all(isinstance(x, LV) for x in xs):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "cat of non-tensors")
    r = len(xs[0].shape)
    return LV(emit(ctx.g, "concat", [ctx.exact(x) for x in xs], int(dim) % r), _shape(out))


@handles("stack")
def _stack(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``torch.stack(xs, dim)``: each operand with a size-1 dim inserted at ``dim``, concatenated along it (GPT-J's
    interleaved rotary stacks its two halves)."""
    xs = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    if not isinstance(xs, (list, tuple)) or not xs or not all(isinstance(x, LV) and not x.mask for x in xs):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "stack of non-tensors")
    r = len(xs[0].shape) + 1
    d = int(dim) % r
    parts = [ctx.exact(LV(ctx.exact(x), (*x.shape[:d], 1, *x.shape[d:]))) for x in xs]
    return LV(emit(ctx.g, "concat", parts, d), _shape(out))


@handles("slice")
def _slice(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    dim = int(args[1]) if len(args) > 1 else 0
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = int(args[4]) if len(args) > 4 else 1
    n = v.shape[dim]
    s = 0 if start is None else max(0, min(n, int(start) + n if int(start) < 0 else int(start)))
    e = n if end is None else max(0, min(n, int(end) + n if int(end) < 0 else int(end)))
    if s == 0 and e == n and step == 1:
        return v
    if not ctx.layout("slice"):
        raise Unsupported(Reason.LAYOUT, "a slice (the registry's slice op is not available here)")
    d = dim % len(v.shape)
    if step == 1:
        return LV(emit(ctx.g, "slice", ctx.exact(v), d, s, e), _shape(out))
    base, j, m = _strided(n, s, e, step)
    # elements s, s + k, ...: the rows of [base, base + k m) regrouped as (m, k), column j (GPT-J's x[..., ::2])
    shape = list(v.shape)
    t = emit(ctx.g, "slice", ctx.exact(v), d, base, base + step * m) if (base, step * m) != (0, n) else ctx.exact(v)
    t = emit(ctx.g, "reshape", t, (*shape[:d], m, step, *shape[d + 1:]))
    t = emit(ctx.g, "slice", t, d + 1, j, j + 1)
    return LV(emit(ctx.g, "reshape", t, _shape(out)), _shape(out))


@handles("select")
def _select(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``x.select(dim, i)`` (``x[:, i]``): the slice ``[i, i + 1)`` along ``dim``, viewed without that dim."""
    v, dim, index = args[0], int(args[1]), int(args[2])
    n = v.shape[dim]
    i = index + n if index < 0 else index
    if not 0 <= i < n:
        raise Unsupported(Reason.LAYOUT, f"select of index {index} from a dim of {n}")
    r = _slice(ctx, [v, dim, i, i + 1], {}, [(*v.shape[:dim % len(v.shape)], 1, *v.shape[dim % len(v.shape) + 1:])])
    return LV(r.t, _shape(out), bcast=r.bcast, src=ctx.node if tuple(r.t.shape) != _shape(out) else r.src)


@handles("unbind")
def _unbind(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, ...]:
    """``x.unbind(dim)`` (``q, k, v = qkv.unbind(0)``): one ``select`` per index."""
    v = args[0]
    dim = int(args[1]) if len(args) > 1 else int(kwargs.get("dim", 0))
    return tuple(_select(ctx, [v, dim, i], {}, o) for i, o in enumerate(out))


# -- complex numbers (LLaMA's ``view_as_complex(x) * freqs_cis`` rotary), held as real views (:attr:`LV.cplx`)

#: ATen ops that may read a complex value: these handlers, the view ops (their results get the trailing 2) and the
#: identities
COMPLEX_OPS = frozenset({"view_as_complex", "view_as_real", "mul", "_conj", "conj_physical", "_conj_physical",
                         "clone", "detach", "alias", "contiguous", "lift_fresh_copy"})
#: views of a complex value: the same view of its real view with the trailing 2 kept last
COMPLEX_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "flatten",
                           "unflatten", "view_as", "_reshape_alias"})


@handles("view_as_complex")
def _view_as_complex(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``view_as_complex(x)`` of float32 pairs ``(..., 2)``: the same tensor, read as complex numbers."""
    v = args[0]
    if not isinstance(v, LV) or v.cplx or v.mask or v.t.dtype != DType.float32 or v.shape[-1:] != (2,):
        raise Unsupported(Reason.DTYPE, "view_as_complex of anything but float32 pairs")
    return LV(ctx.exact(v), v.shape, cplx=True)


@handles("view_as_real")
def _view_as_real(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    if not (isinstance(v, LV) and v.cplx):
        raise Unsupported(Reason.DTYPE, "view_as_real of a tensor that is not complex")
    return dataclasses.replace(v, cplx=False)


def _parts(ctx: Ctx, v: LV) -> tuple[Tensor, Tensor]:
    """The real and imaginary parts of complex ``v``, each with a trailing dim of 1."""
    t = ctx.exact(v)
    ax = len(t.shape) - 1
    return emit(ctx.g, "slice", t, ax, 0, 1), emit(ctx.g, "slice", t, ax, 1, 2)


def _complex(ctx: Ctx, re: Tensor, im: Tensor, out: Any) -> LV:
    r = emit(ctx.g, "concat", [re, im], len(re.shape) - 1)
    return LV(r, (*_shape(out), 2), cplx=True)


def _cmul(ctx: Ctx, a: Any, b: Any, out: Any) -> LV:
    """``a * b`` with ``a`` complex: ``(ar br - ai bi, ar bi + ai br)`` for complex ``b``, each part times ``b`` for a
    real tensor or a number."""
    if not ctx.layout("slice"):
        raise Unsupported(Reason.LAYOUT, "complex arithmetic needs the registry's slice")
    g = ctx.g
    ar, ai = _parts(ctx, a)
    if isinstance(b, LV) and b.cplx:
        br, bi = _parts(ctx, b)
        re = emit(g, "sub", emit(g, "mul", ar, br), emit(g, "mul", ai, bi))
        return _complex(ctx, re, emit(g, "add", emit(g, "mul", ar, bi), emit(g, "mul", ai, br)), out)
    if _num(b):
        return _complex(ctx, emit(g, "scale", ar, c=float(b)), emit(g, "scale", ai, c=float(b)), out)
    if isinstance(b, LV) and not b.mask and b.t.dtype == DType.float32 and ctx.layout("reshape"):
        tb = emit(g, "reshape", ctx.exact(b), (*b.shape, 1))
        return _complex(ctx, emit(g, "mul", ar, tb), emit(g, "mul", ai, tb), out)
    raise Unsupported(Reason.DTYPE, "a complex product with anything but a complex or float32 tensor or a number")


@handles("_conj", "conj_physical", "_conj_physical")
def _conj(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v = args[0]
    if not (isinstance(v, LV) and v.cplx):
        raise Unsupported(Reason.DTYPE, "conj of a tensor that is not complex")
    re, im = _parts(ctx, v)
    return _complex(ctx, re, emit(ctx.g, "neg", im), out)


def _strided(n: int, s: int, e: int, k: int) -> tuple[int, int, int]:
    """For the strided slice ``[s:e:k]`` of a dim of ``n`` (``k > 1``): ``(base, j, m)`` with the ``m`` elements
    ``s + i k`` at column ``j`` of the rows of ``[base, base + k m)`` regrouped as ``(m, k)``; Unsupported when no
    such window fits in the dim."""
    m = max(0, -(-(e - s) // k))
    j = max(0, s + k * m - n)
    if k < 1 or m == 0 or j > min(s, k - 1):
        raise Unsupported(Reason.LAYOUT, f"a strided slice [{s}:{e}:{k}] of a dim of {n}")
    return s - j, j, m


@handles("split", "split_with_sizes")
def _split(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, ...]:
    v = args[0]
    dim = int(args[2]) if len(args) > 2 else int(kwargs.get("dim", 0))
    dim %= len(v.shape)
    res, start = [], 0
    for shape, _dt in out:
        stop = start + shape[dim]
        res.append(_slice(ctx, [v, dim, start, stop], {}, [shape]))
        start = stop
    return tuple(res)


# -- matmuls


def _mm(ctx: Ctx, a: LV, b: LV, out: Any) -> LV:
    tb = ctx.exact(b)
    if not a.bcast and not a.exact and len(a.shape) == 2 and a.t.shape[-1] == a.shape[-1]:
        ta = a.t  # a flattened batch: (..., k) read as (m, k)
    else:
        ta = ctx.exact(a)
    r = emit(ctx.g, "matmul", ta, tb)
    return LV(r, _shape(out), src=a.src if tuple(r.shape) != _shape(out) else None)


@handles("mm", "bmm", "matmul")
def _matmul(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    return _mm(ctx, args[0], args[1], out)


@handles("addmm", "baddbmm")
def _addmm(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    bias, a, b = args[0], args[1], args[2]
    beta = kwargs.get("beta", 1)
    alpha = kwargs.get("alpha", 1)
    g = ctx.g
    p = _mm(ctx, a, b, out)
    if alpha != 1:
        p = ctx.ew(p.shape, [p], lambda ts: emit(g, "scale", ts[0], c=float(alpha)))
    if beta == 0:
        return p
    if beta != 1:
        bias = ctx.ew(bias.shape, [bias], lambda ts: emit(g, "scale", ts[0], c=float(beta)))
    return ctx.ew(_shape(out), [p, bias], lambda ts: emit(g, "add", ts[0], ts[1]))


@handles("linear")
def _linear(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    g = ctx.g
    wt = emit(g, "transpose", ctx.exact(w), 0, 1)
    y = LV(emit(g, "matmul", ctx.exact(x), wt), _shape(out))
    if bias is None:
        return y
    return ctx.ew(_shape(out), [y, bias], lambda ts: emit(g, "add", ts[0], ts[1]))


# -- reductions


def _dims(args: list[Any], kwargs: dict[str, Any], rank: int) -> tuple[list[int], bool]:
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({int(d) % max(rank, 1) for d in dims}), bool(keep)


def _reduce(op: str) -> Handler:
    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
        v = args[0]
        if kwargs.get("dtype") is not None and vm_dtype(kwargs["dtype"]) != v.t.dtype:
            raise Unsupported(Reason.DTYPE, f"{op} with an accumulation dtype")
        if len(v.shape) == 0:
            return v
        dims, _keep = _dims(args, kwargs, len(v.shape))
        # a count of true booleans (ATen's int64 sum of a comparison): integer-valued float32s, exact below 2**24
        count = op == "sum" and isinstance(v, LV) and v.mask and not getattr(out[1], "is_floating_point", True)
        if count and math.prod(v.shape) >= 2**24:
            raise Unsupported(Reason.DTYPE, "a count of 2**24 booleans or more (exact in float32 below)")
        t, gdims = ctx.axes(v, dims)
        for d in gdims:
            t = emit(ctx.g, op, t, d)
        return LV(t, _shape(out), src=ctx.node if tuple(t.shape) != _shape(out) else None, integral=bool(count))

    return fn


HANDLERS["sum"] = _reduce("sum")
HANDLERS["mean"] = _reduce("mean")
HANDLERS["amax"] = _reduce("max")
HANDLERS["amin"] = _reduce("min")


# -- normalisation, softmax


def _softmax_t(g: Graph, t: Tensor, axis: int) -> Tensor:
    e = emit(g, "exp", emit(g, "sub", t, emit(g, "max", t, axis)))
    return emit(g, "div", e, emit(g, "sum", e, axis))


@handles("_softmax", "softmax")
def _softmax(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v, dim = args[0], int(args[1])
    if len(args) > 2 and args[2] is True:
        raise Unsupported(Reason.DTYPE, "softmax with half_to_float")
    t, (ax,) = ctx.axes(v, [dim])
    if v.fill is None:
        return LV(_softmax_t(ctx.g, t, ax), _shape(out))
    if t.ref != v.t.ref:
        raise Unsupported(Reason.LAYOUT, "softmax of a masked_fill(-inf) read in another shape")
    g = ctx.g
    s = emit(g, "sub", t, emit(g, "max", t, ax))
    # the filled entries are exactly 0, as ATen's exp(-inf) (a row filled throughout is 0 / 0, NaN, as in ATen)
    ex = emit(g, "exp", s)
    zero = emit(g, "scale", ex, c=0.0)  # (exp(s) is in [0, 1]: 0 times it is 0 even where s overflowed to -inf)
    fm, keep = v.fill
    e = emit(g, "where", fm, *((ex, zero) if keep else (zero, ex)))
    return LV(emit(g, "div", e, _kept_sum(ctx, v, ex, zero, e, ax)), _shape(out))


def _kept_sum(ctx: Ctx, v: LV, ex: Tensor, zero: Tensor, e: Tensor, ax: int) -> Tensor:
    """The denominator of a softmax over ``e = where(kept, ex, 0)`` (``ex = exp(s - max s)``, ``v`` the filled
    scores): ``sum(e)``, or, where ``v``'s fill is a constant (:attr:`LV.kept`) keeping some column ``j`` in every
    row (a causal mask keeps the first key), ``ex[.., j] + sum(where(kept and not column j, ex, 0))``: the same
    terms, and positive by the signs of its terms alone (an exp plus a sum of exps and zeros), so the division is
    defined for all inputs and the verifier composes the regions that read the softmax (a sum of selected exps may
    be 0 by signs: CLIP's layer with its -inf causal mask was left unproved). A row whose kept scores are all -inf
    is still 0 / 0, NaN, as ATen's."""
    import torch

    g, kept = ctx.g, v.kept
    if kept is None or v.fill is None or not v.fill[1] or ax != len(e.shape) - 1 or kept.dim() == 0 \
            or not ctx.layout("slice") \
            or int(kept.shape[-1]) != int(e.shape[-1]):
        return emit(g, "sum", e, ax)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # (the lifting runs under the tracer's fake mode; ``kept`` is a real tensor)
        every = kept.reshape(-1, kept.shape[-1]).all(0)
        if not bool(every.any()):
            return emit(g, "sum", e, ax)
        j = int(torch.nonzero(every)[0])
        rest = kept.clone()
        rest[..., j] = False
        fm = _const_input(ctx, rest).t
    others = emit(g, "sum", emit(g, "where", fm, ex, zero), ax)
    return emit(g, "add", emit(g, "slice", ex, ax, j, j + 1), others)


@handles("_log_softmax", "log_softmax")
def _log_softmax(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    v, dim = args[0], int(args[1])
    t, (ax,) = ctx.axes(v, [dim])
    g = ctx.g
    s = emit(g, "sub", t, emit(g, "max", t, ax))
    r = emit(g, "sub", s, emit(g, "log", emit(g, "sum", emit(g, "exp", s), ax)))
    return LV(r, _shape(out))


def _reduced(g: Graph, op: str, t: Tensor, axes: Sequence[int]) -> Tensor:
    """``t`` reduced by registry op ``op`` along each of ``axes`` (kept as size-1 dims)."""
    for d in axes:
        t = emit(g, op, t, d)
    return t


@handles("logsumexp")
def _logsumexp(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``log(sum(exp(x)))`` over ``dims``, computed as ATen does: ``m + log(sum(exp(x - m)))`` with ``m`` the max over
    those dims clamped to the finite range (the PaLM z-loss, log-partition terms; log-probabilities with log 0 = -inf:
    a row of -inf is -inf, a row holding +inf is inf, as in ATen)."""
    v = args[0]
    if not isinstance(v, LV) or v.mask:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "logsumexp of a mask")
    if len(v.shape) == 0:
        return v
    dims, _keep = _dims(args, kwargs, len(v.shape))
    t, gdims = ctx.axes(v, dims)
    g = ctx.g
    # ATen shifts by the max only where it is finite (a row whose max is +-inf gives +-inf, not inf - inf = NaN): the
    # max of x clamped to the dtype's finite range is the max itself where that is finite, and a finite c where it
    # is not (x - c is then -inf or +inf where x is, so the sum is 0 or inf and the result -inf or inf). (Clamping
    # x, not its max, keeps the shift a max, which the search's softmax forms read.)
    import torch

    big = float(torch.finfo(getattr(torch, t.dtype.torch_name)).max)
    m = _reduced(g, "max", emit(g, "clamp", t, -big, big), gdims)
    r = emit(g, "add", emit(g, "log", _reduced(g, "sum", emit(g, "exp", emit(g, "sub", t, m)), gdims)), m)
    return LV(r, _shape(out), src=ctx.node if tuple(r.shape) != _shape(out) else None)


@handles("_softmax_backward_data")
def _softmax_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    gr, y, dim = args[0], args[1], int(args[2])
    g = ctx.g
    tg, ty = ctx.exact(gr), ctx.exact(y)
    ax = dim % len(y.shape)
    # y * (g - sum(g * y))
    r = emit(g, "mul", ty, emit(g, "sub", tg, emit(g, "sum", emit(g, "mul", tg, ty), ax)))
    return LV(_as(g, r, vm_dtype(out[1])), _shape(out))


@handles("_log_softmax_backward_data")
def _log_softmax_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    gr, y, dim = args[0], args[1], int(args[2])
    g = ctx.g
    tg, ty = ctx.exact(gr), ctx.exact(y)
    ax = dim % len(y.shape)
    # g - exp(y) * sum(g)
    r = emit(g, "sub", tg, emit(g, "mul", emit(g, "exp", ty), emit(g, "sum", tg, ax)))
    return LV(_as(g, r, vm_dtype(out[1])), _shape(out))


@handles("native_layer_norm")
def _layer_norm(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, LV, LV]:
    x, shape, w, b, eps = args[0], args[1], args[2], args[3], args[4]
    if len(shape) != 1:
        raise Unsupported(Reason.LAYOUT, "layer norm over several dims")
    g = ctx.g
    t = ctx.exact(x)
    ax = len(x.shape) - 1
    mean = emit(g, "mean", t, ax)
    d = emit(g, "sub", t, mean)
    rstd = emit(g, "rsqrt", emit(g, "shift", emit(g, "mean", emit(g, "square", d), ax), c=float(eps)))
    y = emit(g, "mul", d, rstd)
    if isinstance(w, LV):
        y = emit(g, "mul", y, ctx.exact(w))
    if isinstance(b, LV):
        y = emit(g, "add", y, ctx.exact(b))
    return _norm_results(g, out, y, mean, rstd)


def _norm_results(g: Graph, out: Any, y: Tensor, mean: Tensor, rstd: Tensor) -> tuple[LV, LV, LV]:
    """A norm's ``(y, mean, rstd)`` in the dtypes and shapes ATen gives them (float32 internals cast back)."""
    a, b, c = (LV(_as(g, t, vm_dtype(o[1])), tuple(o[0])) for t, o in zip((y, mean, rstd), out, strict=True))
    return a, b, c


@handles("rms_norm", "_fused_rms_norm")
def _rms(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    x, shape = args[0], args[1]
    w = args[2] if len(args) > 2 else kwargs.get("weight")
    eps = args[3] if len(args) > 3 else kwargs.get("eps")
    if len(shape) != 1 or not isinstance(eps, (int, float)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "rms_norm over several dims or with the default eps")
    y = ctx.g.rms_norm(ctx.exact(x), ctx.exact(w) if isinstance(w, LV) else None, axis=-1, eps=float(eps))
    if isinstance(out, list) and len(out) > 1:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "rms_norm's saved statistics")
    return LV(y, _shape(out))


@handles("native_group_norm")
def _group_norm(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, LV, LV]:
    """``(y, mean, rstd)`` of GroupNorm over ``(N, C, *)``: the ``C // group * HxW`` values of each group normalised
    together (a layer norm of the ``(N, group, C // group * HxW)`` view), then the per-channel weight and bias."""
    x, w, b, n, c, hw, groups, eps = args[:8]
    if not isinstance(x, LV) or not all(_num(v) for v in (n, c, hw, groups, eps)) or int(groups) < 1 \
            or int(c) % int(groups) or not ctx.layout("reshape"):
        raise Unsupported(Reason.LAYOUT, "group norm of static sizes with the registry's reshape")
    g = ctx.g
    n, c, hw, k = int(n), int(c), int(hw), int(groups)
    t = emit(g, "reshape", ctx.exact(x), (n, k, c // k * hw))
    mean = emit(g, "mean", t, 2)
    d = emit(g, "sub", t, mean)
    rstd = emit(g, "rsqrt", emit(g, "shift", emit(g, "mean", emit(g, "square", d), 2), c=float(eps)))
    y = emit(g, "reshape", emit(g, "mul", d, rstd), (n, c, hw))
    for p, op in ((w, "mul"), (b, "add")):
        if isinstance(p, LV):
            y = emit(g, op, y, emit(g, "reshape", ctx.exact(p), (c, 1)))
    return _norm_results(g, out, y, mean, rstd)


@handles("constant_pad_nd")
def _pad(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``F.pad(x, pad, value=c)``: per dim (the last first), a negative pad crops (a slice), a positive one adds rows
    of the constant ``c`` (a concat; RWKV's token shift ``F.pad(x, (0, 0, 1, -1))``)."""
    v, pad = args[0], [int(p) for p in args[1]]
    value = args[2] if len(args) > 2 else kwargs.get("value", 0.0)
    if not isinstance(v, LV) or not _num(value) or not math.isfinite(float(value)) or len(pad) % 2 \
            or len(pad) // 2 > len(v.shape):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "constant_pad_nd with a non-finite value (the registry's constants "
                                                  "are finite)")
    g, t, r = ctx.g, ctx.exact(v), len(v.shape)
    for i in range(len(pad) // 2):
        d, lo, hi = r - 1 - i, pad[2 * i], pad[2 * i + 1]
        size = t.shape[d]
        s, e = max(0, -lo), size - max(0, -hi)
        if e <= s:
            raise Unsupported(Reason.LAYOUT, f"a pad {lo, hi} that crops away a dim of {size}")
        if (s, e) != (0, size):
            if not ctx.layout("slice"):
                raise Unsupported(Reason.LAYOUT, "a cropping pad needs the registry's slice")
            t = emit(g, "slice", t, d, s, e)
        parts = [t]
        for k, at in ((lo, 0), (hi, 1)):
            if k > 0:
                shape = list(t.shape)
                shape[d] = k
                parts.insert(at * len(parts), ctx.exact(_constant(ctx, shape, out[1], float(value))))
        if len(parts) > 1:
            t = emit(g, "concat", parts, d)
    return LV(t, _shape(out))


def _elu_args(args: list[Any]) -> tuple[float, float, float]:
    alpha, scale, in_scale = ([*args, 1.0, 1.0, 1.0])[:3]
    if not all(_num(a) for a in (alpha, scale, in_scale)) or float(in_scale) <= 0:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "elu with a non-positive input_scale")
    return float(alpha), float(scale), float(in_scale)


def _exp_neg_part(g: Graph, x: Tensor, k: float) -> Tensor:
    """``exp(min(k x, 0))`` as ``exp(-relu(-k x))``: ``exp(k x)`` where ``x <= 0`` and 1 elsewhere (finite
    everywhere, so a mask multiplying it never meets inf)."""
    return emit(g, "exp", emit(g, "neg", emit(g, "relu", emit(g, "scale", x, c=-k))))


@handles("elu")
def _elu(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1))`` as ``scale * (relu(x) + alpha *
    (exp(min(input_scale x, 0)) - 1))`` (linear attention's ``elu(x) + 1`` feature map)."""
    alpha, sc, k = _elu_args(list(args[1:]))
    g = ctx.g

    def f(ts: list[Tensor]) -> Tensor:
        neg = emit(g, "scale", emit(g, "shift", _exp_neg_part(g, ts[0], k), c=-1.0), c=alpha)
        return emit(g, "scale", emit(g, "add", emit(g, "relu", ts[0]), neg), c=sc)

    return ctx.ew(_shape(out), [args[0]], f)


@handles("elu_backward")
def _elu_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``grad * (scale if x > 0 else alpha * scale * input_scale * exp(input_scale * x))`` from the input ``x``
    (``is_result`` false), the ``x > 0`` test a ``step`` mask over finite factors."""
    gr, x = args[0], args[5] if len(args) > 5 else None
    alpha, sc, k = _elu_args(list(args[1:4]))
    if not (isinstance(gr, LV) and isinstance(x, LV)) or (len(args) > 4 and args[4]):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "elu_backward from the result (in-place elu)")
    g = ctx.g

    def f(ts: list[Tensor]) -> Tensor:
        pos = emit(g, "step", ts[1], c=0.0)
        negf = emit(g, "mul", emit(g, "scale", _exp_neg_part(g, ts[1], k), c=alpha * sc * k),
                    emit(g, "shift", emit(g, "scale", pos, c=-1.0), c=1.0))
        return emit(g, "mul", ts[0], emit(g, "add", emit(g, "scale", pos, c=sc), negf))

    return ctx.ew(_shape(out), [gr, x], f)


@handles("sigmoid_backward")
def _sigmoid_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    g = ctx.g  # grad * y * (1 - y)
    return ctx.ew(_shape(out), [args[0], args[1]], lambda ts: emit(
        g, "mul", ts[0], emit(g, "mul", ts[1], emit(g, "shift", emit(g, "neg", ts[1]), c=1.0))))


@handles("tanh_backward")
def _tanh_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    g = ctx.g  # grad * (1 - y^2)
    return ctx.ew(_shape(out), [args[0], args[1]], lambda ts: emit(
        g, "mul", ts[0], emit(g, "shift", emit(g, "neg", emit(g, "square", ts[1])), c=1.0)))


@handles("silu_backward")
def _silu_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    g = ctx.g  # grad * s * (1 + x (1 - s)), s = sigmoid(x)

    def f(ts: list[Tensor]) -> Tensor:
        gr, x = ts
        s = emit(g, "sigmoid", x)
        return emit(g, "mul", gr, emit(g, "mul", s, emit(g, "shift", emit(
            g, "mul", x, emit(g, "shift", emit(g, "neg", s), c=1.0)), c=1.0)))

    return ctx.ew(_shape(out), [args[0], args[1]], f)


_GELU_C = math.sqrt(2.0 / math.pi)


@handles("gelu_backward")
def _gelu_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    approx = kwargs.get("approximate", args[2] if len(args) > 2 else "none")
    g = ctx.g

    def tanh_f(ts: list[Tensor]) -> Tensor:
        gr, x = ts
        x2 = emit(g, "square", x)
        u = emit(g, "scale", emit(g, "mul", x, emit(g, "shift", emit(g, "scale", x2, c=0.044715), c=1.0)), c=_GELU_C)
        th = emit(g, "tanh", u)
        du = emit(g, "scale", emit(g, "shift", emit(g, "scale", x2, c=3 * 0.044715), c=1.0), c=_GELU_C)
        left = emit(g, "scale", emit(g, "shift", th, c=1.0), c=0.5)
        sech2 = emit(g, "shift", emit(g, "neg", emit(g, "square", th)), c=1.0)
        right = emit(g, "mul", emit(g, "scale", x, c=0.5), emit(g, "mul", sech2, du))
        return emit(g, "mul", gr, emit(g, "add", left, right))

    def erf_f(ts: list[Tensor]) -> Tensor:
        gr, x = ts
        cdf = emit(g, "scale", emit(g, "shift", emit(g, "erf", emit(g, "scale", x, c=math.sqrt(0.5))), c=1.0), c=0.5)
        pdf = emit(g, "scale", emit(g, "exp", emit(g, "scale", emit(g, "square", x), c=-0.5)),
                   c=1 / math.sqrt(2 * math.pi))
        return emit(g, "mul", gr, emit(g, "add", cdf, emit(g, "mul", x, pdf)))

    return ctx.ew(_shape(out), [args[0], args[1]], tanh_f if approx == "tanh" else erf_f)


@handles("where")
def _where(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``where(m, a, b)`` by the registry's ``where``, whose mask is a boolean input of the partition (ATen's
    comparison). A comparison lifted in the partition is a 0/1 float (``step``), and ``m * a + (1 - m) * b`` is
    NaN where the branch not taken is inf or NaN (``where(x > 0, sqrt(x), 0)``): such a comparison is left to
    ATen (blamed), so the ``where`` reads its booleans. A scalar branch is a (finite) constant."""
    m, a, b = args[0], args[1], args[2]
    if isinstance(m, LV) and m.negated:  # where(~keep, a, b) = where(keep, b, a)
        m, a, b = dataclasses.replace(m, negated=False), b, a
    if isinstance(m, LV) and m.both is not None:  # m1 & m2: where(m1, where(m2, a, b), b); m1 | m2: the dual
        m1, m2, conj = m.both
        inner = _where(ctx, [m2, a, b], {}, out)
        return _where(ctx, [m1, inner, b] if conj else [m1, a, _where(ctx, [m2, a, b], {}, out)], {}, out)
    if isinstance(m, LV) and m.mask:
        if m.cmp is None or not m.exact:
            node = ctx.node.args[0] if ctx.node is not None and ctx.node.args else None
            raise Unsupported(Reason.DTYPE, "where of a comparison made in the partition in another shape (held as "
                                            "0/1 floats, the branch not taken would leak inf/NaN): the comparison "
                                            "stays in ATen", node)
        # the registry's boolean comparison: x > c (gt, le and their negations) or -x > -c (lt, ge, ...), the
        # branches swapped where the comparison is false when that holds; at NaN, where both x > c and -x > -c are
        # false, ATen's le and ge are false and their negations true: a second where on ``notnan(x)`` there
        x, cmp, c = m.cmp
        if cmp in ("feq", "fne"):  # x == c: neither x > c nor -x > -c, and not NaN (x != c: the branches swapped)
            dt = vm_dtype(out[1])
            a_, b_ = ((_constant(ctx, (), out[1], float(v)) if _num(v) else v) for v in (a, b))
            ta, tb = (v.t if v.shape == () and tuple(v.t.shape) == (1,) else ctx.exact(v) for v in (a_, b_))
            ta, tb = (t if t.dtype == dt else emit(ctx.g, "cast", t, dt) for t in (ta, tb))
            t_, f_ = (ta, tb) if cmp == "feq" else (tb, ta)
            r = emit(ctx.g, "where", _notnan(ctx.g, x), t_, f_)
            r = emit(ctx.g, "where", emit(ctx.g, "greater", emit(ctx.g, "neg", x), c=-c), f_, r)
            return LV(emit(ctx.g, "where", emit(ctx.g, "greater", x, c=c), f_, r), _shape(out))
        pos, direct, nan = CMP_FORMS[cmp]
        bm = emit(ctx.g, "greater", x if pos else emit(ctx.g, "neg", x), c=c if pos else -c)
        if nan == direct:  # le, ge, ~le, ~ge: x > c false does not decide at NaN
            dt = vm_dtype(out[1])
            a_, b_ = ((_constant(ctx, (), out[1], float(v)) if _num(v) else v) for v in (a, b))
            ta, tb = (v.t if v.shape == () and tuple(v.t.shape) == (1,) else ctx.exact(v) for v in (a_, b_))
            ta, tb = (t if t.dtype == dt else emit(ctx.g, "cast", t, dt) for t in (ta, tb))
            t_, f_ = (ta, tb) if direct else (tb, ta)  # the branch where the comparison holds, where it does not
            rest = emit(ctx.g, "where", _notnan(ctx.g, x), f_, t_)
            return LV(emit(ctx.g, "where", bm, t_, rest), _shape(out))
        m = LV(bm, m.shape)
        if not direct:
            a, b = b, a
    if not isinstance(m, LV) or not all(isinstance(v, LV) or _num(v) for v in (a, b)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "where with a scalar mask or a non-numeric branch")
    if any(_num(v) and not math.isfinite(float(v)) for v in (a, b)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "where with an infinite constant branch (the registry's "
                                                  "constants are finite)")
    _, dt = out
    odt = vm_dtype(dt)
    a, b = (v if isinstance(v, LV) else _constant(ctx, (), dt, float(v)) for v in (a, b))
    ts = [ctx.exact(m)]
    for v in (a, b):
        t = v.t if v.shape == () and tuple(v.t.shape) == (1,) else ctx.exact(v)
        ts.append(t if t.dtype == odt else emit(ctx.g, "cast", t, odt))
    return LV(emit(ctx.g, "where", *ts), _shape(out))


@handles("masked_fill")
def _masked_fill(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``masked_fill(x, m, v)`` is ``where(m, v, x)``. A fill of -inf (attention's causal or sliding-window mask
    written ``scores.masked_fill(~keep, float("-inf"))``) is lifted only when a softmax along the last dim is its
    only reader: the filled entries are held as the dtype's lowest finite value (so no kept score is below them)
    and the softmax makes their exponentials exactly 0, what ATen's -inf gives (:attr:`LV.fill`)."""
    x, m, v = args[0], args[1], args[2]
    src = ctx.node.args[0] if ctx.node is not None and ctx.node.args else None
    sargs = getattr(src, "args", None)
    partial = op_of_node(src) if isinstance(sargs, tuple) else ""
    made_here = isinstance(x, LV) and ctx.g.nodes[x.t.ref[0]].op != "input"  # (not a partition input)
    if made_here and partial in _PARTIAL_OPS and (partial != "div" or not (sargs and len(sargs) > 1
                                                                          and _num(sargs[1]))):
        # masked_fill(x / n, n == 0, 0) (a norm's gradient): the kernels compute x / n everywhere, undefined where
        # the fill hides it, which the verifier cannot prove harmless: no candidate would verify the partition.
        # (Computing it as ``x / where(m, 1, n)`` verified F.normalize's gradient alone but left the composition of
        # nGPT's larger backward partitions unproved: 14-19 of 46 ops taken against 42-44.)
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"masked_fill of aten.{partial}'s result: the fill may hide where "
                                                  f"{partial} is undefined, which the kernels would compute")
    ab = _quotient(ctx, src)
    if ab is not None and isinstance(m, LV) and _num(v) and math.isfinite(float(v)):
        # masked_fill(a / b broadcast, m, v) = where(m, v, a) / where(m, 1, b) (exactly: v / 1 = v): the kernels
        # divide only where the fill does not hide it (label smoothing's mean over the kept tokens); where(m, v, a / b)
        # would leave the division undefined where the fill hides it, which no candidate could be proved to avoid
        import torch

        num, den = (_where(ctx, [m, c, t], {}, (tuple(torch.broadcast_shapes(m.shape, t.shape)), out[1]))
                    for c, t in ((v, ab[0]), (1.0, ab[1])))
        return ctx.ew(_shape(out), [num, den], lambda ts: emit(ctx.g, "div", ts[0], ts[1]))
    if not (_num(v) and math.isinf(float(v)) and float(v) < 0):
        return _where(ctx, [m, v, x], {}, out)
    import torch

    if ctx.node is None or not _softmax_reads_only(ctx.node, len(_shape(out))):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "masked_fill with -inf read by anything but a softmax along the "
                                                  "last dim (the registry's constants are finite)")
    if not isinstance(m, LV) or m.mask or not isinstance(x, LV):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "masked_fill(-inf) whose mask is not a boolean tensor")
    tdt = getattr(torch, x.t.dtype.torch_name)
    r = _where(ctx, [m, float(torch.finfo(tdt).min), x], {}, out)
    return dataclasses.replace(r, fill=(ctx.exact(dataclasses.replace(m, negated=False)), m.negated))


def _quotient(ctx: Ctx, n: Any) -> tuple[Any, Any] | None:
    """The lifted dividend and divisor of fx node ``n`` when it is ATen's true division of two lifted real tensors
    (not complex, not a negated mask or a -inf fill), read through broadcasts (``expand``: their operands broadcast
    alike), else None."""
    while op_of_node(n) == "expand" and n.args[0] in ctx.env:
        n = n.args[0]
    if op_of_node(n) != "div" or n.kwargs.get("rounding_mode") is not None or len(n.args) != 2:
        return None
    ab = [ctx.env.get(a) for a in n.args]
    ok = all(isinstance(a, LV) and not (a.cplx or a.negated or a.fill is not None) for a in ab)
    return (ab[0], ab[1]) if ok else None


@handles("bitwise_not", "logical_not")
def _not(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``~keep`` of a boolean ``keep`` (``scores.masked_fill(~causal, -inf)``), held as ``keep`` marked negated
    (:attr:`LV.negated`) when every reader is a ``where`` or ``masked_fill`` reading it as its mask."""
    import torch

    x, n = args[0], ctx.node
    if isinstance(x, LV) and x.both is not None:
        m1, m2, conj = x.both
        if m1.mask and m2.mask:  # De Morgan: ~(m1 & m2) = ~m1 | ~m2
            return _and_or_of(ctx, _not(ctx, [m1], {}, out), _not(ctx, [m2], {}, out), not conj, out)
        raise Unsupported(Reason.NOT_IN_REGISTRY, "bitwise_not of a conjunction of boolean tensors")
    if isinstance(x, LV) and x.mask:  # a comparison made here: 1 - m, and its boolean form's test reversed
        flip = {"gt": "ngt", "ngt": "gt", "le": "nle", "nle": "le", "lt": "nlt", "nlt": "lt", "ge": "nge", "nge": "ge",
                "feq": "fne", "fne": "feq"}
        r = ctx.ew(x.shape, [x], lambda ts: emit(ctx.g, "shift", emit(ctx.g, "scale", ts[0], c=-1.0), c=1.0))
        cmp = None if x.cmp is None else (x.cmp[0], flip[x.cmp[1]], x.cmp[2])
        return dataclasses.replace(r, mask=True, cmp=cmp if r.t.shape == x.t.shape else None)
    if not isinstance(x, LV) or x.t.dtype != vm_dtype(torch.bool) or n is None:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "bitwise_not of anything but a boolean tensor (the registry has "
                                                  "no boolean op)")
    # (its readers in the partition are where / masked_fill reading it as their mask, NEGATED_READERS; one outside
    # it gets its 0/1 floats, converted to booleans on exit: negated_floats)
    return dataclasses.replace(x, negated=not x.negated)


#: the ops that read a negated boolean (:attr:`LV.negated`) as such, as their mask: any other reader is refused
NEGATED_READERS = {"where": 0, "masked_fill": 1, "bitwise_not": 0, "logical_not": 0}


def reads_negated(name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether ATen op ``name`` reads its lifted operands ``args`` / ``kwargs`` so that a negated boolean among
    them is read only as its mask operand."""
    pos = NEGATED_READERS.get(name)
    return all(not (isinstance(a, LV) and a.negated) or i == pos for i, a in enumerate(args)) and not any(
        isinstance(a, LV) and a.negated for a in kwargs.values())


@handles("logical_and", "bitwise_and", "logical_or", "bitwise_or", "__and__", "__or__")
def _and_or(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``m1 & m2`` / ``m1 | m2`` of two booleans (clamp's gradient ``where(ge(x, lo) & le(x, hi), grad, 0)``): a
    ``where`` reads it as nested selects; any other reader as the 0/1 floats ``f1 f2`` / ``f1 + f2 - f1 f2``."""
    return _and_or_of(ctx, args[0], args[1], "and" in op_of(ctx), out)


def _and_or_of(ctx: Ctx, m1: Any, m2: Any, conj: bool, out: Any) -> LV:
    import torch

    if not all(isinstance(m, LV) and (m.mask or m.t.dtype == DType.bool) and not m.negated and m.shape == _shape(out)
               for m in (m1, m2)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "and / or of anything but two booleans of the result's shape")
    f1, f2 = (m if m.mask else _where(ctx, [m, 1.0, 0.0], {}, (_shape(out), torch.float32)) for m in (m1, m2))
    g = ctx.g

    def f(ts: list[Tensor]) -> Tensor:
        p = emit(g, "mul", ts[0], ts[1])
        return p if conj else emit(g, "sub", emit(g, "add", ts[0], ts[1]), p)

    r = ctx.ew(_shape(out), [dataclasses.replace(f1, mask=False), dataclasses.replace(f2, mask=False)], f)
    return dataclasses.replace(r, mask=True, both=(m1, m2, conj))


def negated_floats(ctx: Ctx, v: LV) -> LV:
    """A negated boolean (:attr:`LV.negated`) as the 0/1 floats of its value, a mask (:attr:`LV.mask`): what a
    partition hands out (the runner converts it to ATen's booleans on exit; ``~causal`` saved for the backward)."""
    import torch

    r = _where(ctx, [dataclasses.replace(v, negated=False), 0.0, 1.0], {}, (v.shape, torch.float32))
    return dataclasses.replace(r, mask=True)


#: ATen ops undefined somewhere over the reals (a tensor denominator, a logarithm, a root)
_PARTIAL_OPS = frozenset({"div", "reciprocal", "log", "sqrt", "rsqrt"})

#: casts a masked_fill(-inf) may pass through to its softmax (HF's ``softmax(s, dtype=torch.float32)``)
_FILL_CASTS = ("_to_copy", "convert_element_type")


def _softmax_reads_only(n: Any, rank: int) -> bool:
    """Whether every reader of fx node ``n`` is a softmax along the last dim, directly or through widening casts to
    float32 or float64 (which keep the lowest finite value of the narrower float finite and below every value of
    that float; a narrowing cast could make it -inf)."""
    import torch

    users = list(n.users)
    src = getattr(n.meta.get("val"), "dtype", None)
    for u in users:
        name = op_of_node(u)
        if not u.args or u.args[0] is not n:
            return False
        if name in _FILL_CASTS:
            dt = getattr(u.meta.get("val"), "dtype", None)
            if dt not in (torch.float32, torch.float64) or src is None or dt.itemsize < src.itemsize \
                    or not _softmax_reads_only(u, rank):
                return False
        elif name not in ("_softmax", "softmax") or len(u.args) < 2 or int(u.args[1]) % max(rank, 1) != rank - 1:
            return False
    return bool(users)


def op_of_node(n: Any) -> str:
    """The overload packet name of fx node ``n``'s target (e.g. ``"_softmax"`` for ``aten._softmax.default``)."""
    t = getattr(n, "target", None)
    packet = getattr(t, "_overloadpacket", None)
    return str(getattr(packet, "__name__", getattr(t, "__name__", t))).split(".")[0]


#: a comparison with a constant (:attr:`LV.cmp`) by name: (tested as x > c rather than -x > -c, true where that
#: test holds, its value at NaN). ``ngt`` is ``~(x > c)``, ``nle`` is ``~(x <= c)`` (true at NaN), ...
CMP_FORMS = {"gt": (True, True, False), "le": (True, False, False), "ngt": (True, False, True),
             "nle": (True, True, True), "lt": (False, True, False), "ge": (False, False, False),
             "nlt": (False, False, True), "nge": (False, True, True)}


def _notnan(g: Graph, x: Tensor) -> Tensor:
    """``x == x`` as a ``vm.bool``: ``clamp(x, -1, 1) > -2`` (the clamp keeps NaN and maps every other value,
    infinities too, into [-1, 1])."""
    return emit(g, "greater", emit(g, "clamp", x, -1.0, 1.0), c=-2.0)


def _in_dtype(c: float, dt: DType) -> float:
    """The constant ``c`` as ATen compares it with a tensor of ``dt``: rounded to ``dt`` (``x > 0.3`` of a half
    ``x`` compares with half(0.3) = 0.30005)."""
    import torch

    return float(torch.tensor(c, dtype=getattr(torch, dt.torch_name))) if dt != DType.bool else c


@handles("le", "lt", "ge", "gt")
def _compare(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """A comparison with a constant as a 0/1 mask (``step``: 1 where x > c): gt = step(x, c),
    le = notnan(x) - step(x, c), lt = step(-x, -c), ge = notnan(x) - step(-x, -c) (ATen's le and ge are false at
    NaN), the constant rounded to ``x``'s dtype as ATen does. Only ``where`` and arithmetic read it."""
    x, c = args[0], args[1]
    name = op_of(ctx)
    if not (isinstance(x, LV) and _num(c)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} of two tensors (the registry's step compares with "
                                                  "a constant)")
    cv = _in_dtype(float(c), x.t.dtype)
    if x.mask or not math.isfinite(cv):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} of a mask or with a constant {c} (not finite in "
                                                  f"{x.t.dtype})")
    g = ctx.g
    seen: list[Tensor] = []

    def f(ts: list[Tensor]) -> Tensor:
        seen.append(ts[0])
        s = emit(g, "step", ts[0], c=cv) if name in ("gt", "le") else emit(g, "step", emit(g, "neg", ts[0]), c=-cv)
        if name in ("gt", "lt"):
            return s
        ok = emit(g, "step", emit(g, "clamp", ts[0], -1.0, 1.0), c=-2.0)  # 1, 0 at NaN (as _notnan)
        return emit(g, "sub", ok, s)

    r = ctx.ew(_shape(out), [x], f)
    cmp = (seen[0], name, cv) if tuple(seen[0].shape) == tuple(r.t.shape) else None
    return dataclasses.replace(r, mask=True, cmp=cmp)


_SDPA = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "scaled_dot_product_attention",
)

#: SDPA ops: positions of (attn_mask, dropout_p, is_causal) and the scale keyword, by op name.
SDPA_ARGS: dict[str, tuple[int | None, int | None, int | None]] = {
    "_scaled_dot_product_flash_attention_for_cpu": (None, 3, 4),
    "_scaled_dot_product_flash_attention": (None, 3, 4),
    "_scaled_dot_product_efficient_attention": (3, 5, 6),
    "_scaled_dot_product_cudnn_attention": (3, 5, 6),
    "scaled_dot_product_attention": (3, 4, 5),
}


def _sdpa_scores(ctx: Ctx, q: LV, k: LV, mask: Any, causal: bool,
                 scale: Any) -> tuple[Tensor, float, Tensor | None]:
    """Attention's scores ``scale * Q K^T`` (+ the causal mask, + an additive float mask), the scale, and the causal
    mask (``tril_mask``, a constant; None when not causal)."""
    import torch

    if len(q.shape) < 2 or q.shape[-1] != k.shape[-1] or q.shape[:-2] != k.shape[:-2]:
        raise Unsupported(Reason.LAYOUT, "attention with broadcast heads")
    g = ctx.g
    tq, tk = ctx.exact(q), ctx.exact(k)
    s = emit(g, "matmul", tq, emit(g, "transpose", tk, len(k.shape) - 2, len(k.shape) - 1))
    c = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = emit(g, "scale", s, c=c)
    L, S = q.shape[-2], k.shape[-2]
    dt = q.t.dtype
    keep = None
    if causal:
        tdt = getattr(torch, dt.torch_name)
        big = torch.finfo(tdt).min  # finite: a fully masked tile of an online softmax stays NaN-free
        keep = emit(g, "tril_mask", shape=(L, S), offset=0)  # (ATen's is_causal: torch.ones(L, S).tril())
        # the masked scores *are* the lowest finite value (ATen: -inf), so no masked score outweighs a kept one;
        # adding it instead let a masked score above a kept one by more than |finfo.min| (fp16 scores 6e4 and
        # -1e4) win the row's softmax (the red team's test_causal_attention_attended_to_masked_positions)
        s = emit(g, "where", keep, s, _constant(ctx, (), tdt, big).t)
    if isinstance(mask, LV):
        if mask.t.dtype != dt:
            raise Unsupported(Reason.DTYPE, "attention with a boolean mask (needs where)")
        # a row the mask sets entirely to -inf (a padded query) is 0 in the fused op and its gradients: the callers
        # take the softmax and the statistics of masked scores in their safe forms (_safe_softmax_t, _row_lse)
        s = emit(g, "add", s, ctx.exact(dataclasses.replace(mask, fill=None)))
        if mask.fill is not None:  # a constant mask holding -inf (constant_value): those scores are the lowest
            # value and their weights exactly 0 (``keep``, read by the callers' softmax, as a causal mask's)
            if causal or not mask.fill[1]:
                raise Unsupported(Reason.NOT_IN_REGISTRY, "attention with a -inf mask and a causal flag")
            s, keep = _filled(ctx, mask.fill, s), mask.fill[0]
    return s, c, keep


def _gqa_heads(ctx: Ctx, q: LV, x: LV) -> tuple[LV, int]:
    """Key or value ``x`` with as many heads as ``q`` (dim -3), and how many query heads share each of its heads:
    attention ops read KV head ``h // rep`` for query head ``h`` when ``x`` has fewer heads (grouped-query
    attention, SDPA's ``enable_gqa`` or the CPU op's own broadcast); ``x`` itself (rep 1) otherwise."""
    if len(q.shape) < 3 or len(x.shape) != len(q.shape) or q.shape[-3] == x.shape[-3]:
        return x, 1
    h, kv = q.shape[-3], x.shape[-3]
    if q.shape[:-3] != x.shape[:-3] or h % kv:
        raise Unsupported(Reason.LAYOUT, f"attention with {h} query heads and {kv} key/value heads")
    if not (ctx.layout("reshape") and ctx.layout("broadcast_to")):
        raise Unsupported(Reason.LAYOUT, "grouped-query attention needs the registry's reshape and broadcast_to")
    rep, lead, tail = h // kv, x.shape[:-3], x.shape[-2:]
    t = emit(ctx.g, "reshape", ctx.exact(x), (*lead, kv, 1, *tail))
    t = emit(ctx.g, "broadcast_to", t, (*lead, kv, rep, *tail))
    shape = (*lead, h, *tail)
    return LV(emit(ctx.g, "reshape", t, shape), shape), rep


def _gqa_sum(ctx: Ctx, t: Tensor, rep: int) -> Tensor:
    """The gradient ``t`` of a key or value widened by :func:`_gqa_heads`: summed over each group of ``rep``
    query heads (dim -3)."""
    if rep == 1:
        return t
    s = tuple(t.shape)
    lead, h, tail = s[:-3], s[-3], s[-2:]
    r = emit(ctx.g, "reshape", t, (*lead, h // rep, rep, *tail))
    return emit(ctx.g, "reshape", emit(ctx.g, "sum", r, len(lead) + 1), (*lead, h // rep, *tail))


def _kept(g: Graph, keep: Tensor | None, e: Tensor, s: Tensor) -> Tensor:
    """``e`` (``exp`` of the shifted scores ``s``) where the causal mask ``keep`` keeps a score, exactly 0 elsewhere:
    what ATen's -inf gives in floats, and 0 over the reals too, so a kernel may skip the tiles the mask sets entirely
    false (:mod:`verimirage.rewrite.causal`); ``e`` itself without a mask."""
    return e if keep is None else emit(g, "where", keep, e, emit(g, "scale", s, c=0.0))


#: SDPA ops whose second result is the log-sum-exp of each row of scores, shaped like ``Q`` without its last dim
#: (natural log; what their backward reads)
SDPA_LSE = frozenset({"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"})


def _row_lse(ctx: Ctx, s: Tensor, axis: int, want: Any, *, safe: bool = False, keep: Tensor | None = None) -> Tensor:
    """``log(sum(exp(s)))`` along ``axis`` (kept as a size-1 dim), computed stably in ``want``'s dtype.

    ``safe`` (scores with a tensor mask): a row masked entirely to -inf gives 0, as ATen's fused op saves it,
    without a test for -inf: with the clamped max ``m`` and ``t = sum(exp(s - m))`` of :func:`_safe_parts`,
    ``step(t, 0.5) * m + log(max(t, 1))``; a row with a finite max has ``t >= 1`` (its term ``exp(0)``), so it
    is unchanged, and an all -inf row has ``t = 0``: ``0 * m + log(1) = 0``."""
    g = ctx.g
    if s.dtype != want:
        s = emit(g, "cast", s, want)
    if safe:
        m, _, t, d = _safe_parts(g, s, axis, keep)
        return emit(g, "add", emit(g, "mul", emit(g, "step", t, c=0.5), m), emit(g, "log", d))
    m = emit(g, "max", s, axis)
    e = _kept(g, keep, emit(g, "exp", emit(g, "sub", s, m)), s)
    return emit(g, "add", m, emit(g, "log", emit(g, "sum", e, axis)))


def _safe_parts(g: Graph, s: Tensor, axis: int, keep: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The safe softmax's pieces along ``axis``: the row max clamped to the dtype's finite range ``m``,
    ``e = exp(s - m)``, ``t = sum(e)`` and the denominator ``d = clamp(t, 1, max) + 0 * t`` (see
    :func:`_safe_softmax`): the ``0 * t`` term is 0 over the reals and for every finite ``t``, and NaN where a +inf
    score made ``t`` infinite, so such a row is NaN as in ATen (``exp(inf - inf)``) rather than +-inf (the clamp
    alone gave a finite denominator there)."""
    import torch

    fi = torch.finfo(getattr(torch, s.dtype.torch_name))
    m = emit(g, "clamp", emit(g, "max", s, axis), float(fi.min), float(fi.max))
    e = _kept(g, keep, emit(g, "exp", emit(g, "sub", s, m)), s)
    t = emit(g, "sum", e, axis)
    return m, e, t, emit(g, "add", emit(g, "clamp", t, 1.0, float(fi.max)), emit(g, "scale", t, c=0.0))


def _safe_softmax_t(g: Graph, s: Tensor, axis: int, keep: Tensor | None = None) -> Tensor:
    """Softmax that is 0 on a row of ``s`` that is -inf throughout (ATen's fused attention with a mask, and
    ``_safe_softmax``), equal to the softmax on every other row (``keep``: the entries a constant mask keeps, the
    others' weights exactly 0, a row kept nowhere 0)."""
    _, e, _, d = _safe_parts(g, s, axis, keep)
    return emit(g, "div", e, d)


def sdpa_handler(name: str) -> Handler:
    """Attention as matmul / softmax / matmul with its scale, mask and causal flag (and, for the ops that return
    it, the rows' log-sum-exp their backward reads)."""
    mpos, dpos, cpos = SDPA_ARGS[name]

    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
        q, k, v = args[0], args[1], args[2]

        def arg(pos: int | None, key: str, default: Any) -> Any:
            if key in kwargs:
                return kwargs[key]
            return args[pos] if pos is not None and pos < len(args) else default

        mask = arg(mpos, "attn_mask", None)
        if name == "_scaled_dot_product_flash_attention_for_cpu":
            mask = kwargs.get("attn_mask")
        p = arg(dpos, "dropout_p", 0.0)
        causal = bool(arg(cpos, "is_causal", False))
        if p:
            raise Unsupported(Reason.RANDOM, "attention with dropout")
        g = ctx.g
        k, _ = _gqa_heads(ctx, q, k)
        v, _ = _gqa_heads(ctx, q, v)
        s, _, keep = _sdpa_scores(ctx, q, k, mask, causal, kwargs.get("scale"))
        ax = len(q.shape) - 1
        safe = isinstance(mask, LV)  # a row masked entirely to -inf is 0 (ATen), not NaN
        keep = keep if not safe or mask.fill is not None else None
        if safe:
            p = _safe_softmax_t(g, s, ax, keep)
        else:  # (causal: the masked weights exactly 0)
            e = _kept(g, keep, emit(g, "exp", emit(g, "sub", s, emit(g, "max", s, ax))), s)
            p = emit(g, "div", e, emit(g, "sum", e, ax))
        o = emit(g, "matmul", p, ctx.exact(v))
        res = LV(o, tuple(out[0][0]))
        if not isinstance(out, list) or len(out) < 2:
            return res
        rest: list[Any] = [None] * (len(out) - 1)
        lse_meta = out[1]
        # (the memory-efficient CUDA op pads its statistics to a multiple of 32 rows, +inf beyond the queries: only
        # an unpadded one is lifted)
        # (cuDNN's statistics keep the reduced dim: shaped like Q with a last dim of 1)
        if name in SDPA_LSE and lse_meta is not None and tuple(lse_meta[0]) in (tuple(q.shape[:-1]),
                                                                                 (*q.shape[:-1], 1)):
            with contextlib.suppress(Unsupported):  # a dtype the registry lacks: the statistics stay unlifted
                rest[0] = LV(_row_lse(ctx, s, ax, vm_dtype(lse_meta[1]), safe=safe, keep=keep), tuple(lse_meta[0]))
        return (res, *rest)

    return fn


#: SDPA backward ops: positions of (grad_out, query, key, value, out, logsumexp, mask, dropout_p, is_causal,
#: grad_input_mask); the CPU op takes its mask as the keyword ``attn_mask``
SDPA_BW_ARGS: dict[str, tuple[int, int, int, int, int, int, int | None, int, int, int | None]] = {
    "_scaled_dot_product_flash_attention_for_cpu_backward": (0, 1, 2, 3, 4, 5, None, 6, 7, None),
    "_scaled_dot_product_flash_attention_backward": (0, 1, 2, 3, 4, 5, None, 10, 11, None),
    "_scaled_dot_product_efficient_attention_backward": (0, 1, 2, 3, 5, 6, 4, 9, 11, 10),
    "_scaled_dot_product_cudnn_attention_backward": (0, 1, 2, 3, 4, 5, 8, 13, 14, None),
}


#: ATen's fused attention ops, whose results at infinities and NaN are their kernels' own, not their definition's
#: (the CPU flash kernel gives 0 for a query row holding NaN or -inf, where the math path and the lifted softmax give
#: NaN; the CUDA kernels differ again): the compile-time check's special-value sets that feed one of them a
#: non-finite operand constrain nothing (``capture.undefined_at``)
SPECIAL_VALUES_OWN = frozenset({*_SDPA, *SDPA_BW_ARGS})


#: positions of arguments a handler never reads, by op name (not lifted as partition inputs): the CUDA attention
#: backwards' random-number state and nested-batch offsets (read only with a dropout, which is refused)
UNREAD_ARGS: dict[str, frozenset[int]] = {
    "_scaled_dot_product_flash_attention_backward": frozenset({6, 7, 12, 13}),
    "_scaled_dot_product_efficient_attention_backward": frozenset({7, 8}),
    "_scaled_dot_product_cudnn_attention_backward": frozenset({6, 7, 9, 10}),
    # (values not read: a copy's destination, the tensor an allocation or zeros_like takes its shape from, a pad's
    # input in its gradient)
    "copy": frozenset({0}),
    "embedding": frozenset({1}), "embedding_dense_backward": frozenset({1}),  # (constant indices: ctx.folded)
    **dict.fromkeys(("zeros_like", "empty_like", "new_empty", "new_empty_strided"), frozenset({0})),
    **{f"{m}_pad{k}d_backward": frozenset({1}) for m in ("reflection", "replication") for k in (1, 2, 3)},
}


def unread_args(name: str, args: Sequence[Any]) -> frozenset[int]:
    """The argument positions of ATen op ``name`` (called with ``args``) its handler does not read: those of
    :data:`UNREAD_ARGS`, ``nll_loss_backward``'s input (only its shape matters) and its total_weight unless the
    reduction is the mean, and ``convolution_backward``'s input or weight where no gradient reads it."""
    skip = UNREAD_ARGS.get(name, frozenset())
    if name == "nll_loss_backward":  # the input's values are not read (its shape is the result's)
        skip = skip | ({1} if (args[4] if len(args) > 4 else 1) == 1 else {1, 6})
    if name == "convolution_backward" and len(args) > 10 and isinstance(args[10], (list, tuple)):
        # the input is read only for the weight's gradient, the weight only for the input's (else their shapes)
        want = [bool(m) for m in args[10]]
        skip = skip | ({1} if not want[1] else set()) | ({2} if not want[0] else set())
    return skip


@handles(*SDPA_BW_ARGS)
def _sdpa_backward(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    """The gradients of attention from its saved output and rows' log-sum-exp ``lse``: with ``P = exp(S - lse)``
    (the softmax, recomputed), ``dV = P^T dO``, ``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ = c dS K``,
    ``dK = c dS^T Q`` (``c`` the scale; ``S`` the scaled, masked scores). The CPU op, and the CUDA flash and
    memory-efficient ops (whose statistics may be padded to more rows than queries: the first rows are read;
    the mask's gradient, when asked for, is not lifted)."""
    name = op_of(ctx)
    ido, iq, ik, iv, io, il, im, ip, ic, ig = SDPA_BW_ARGS[name]

    def arg(pos: int | None, default: Any = None) -> Any:
        return args[pos] if pos is not None and pos < len(args) else default

    do, q, k, v, o, lse = (arg(i) for i in (ido, iq, ik, iv, io, il))
    mask = kwargs.get("attn_mask") if im is None else arg(im)
    p, causal = arg(ip, 0.0), bool(kwargs.get("is_causal", arg(ic, False)))
    if p:
        raise Unsupported(Reason.RANDOM, "attention with dropout")
    want = arg(ig)
    grad_mask = want is not None and len(want) > 3 and bool(want[3])
    if grad_mask and not isinstance(mask, LV):
        raise Unsupported(Reason.NOT_TENSOR, "attention backward with the gradient of a mask it does not have")
    if not all(isinstance(x, LV) for x in (do, q, k, v, o, lse)):
        raise Unsupported(Reason.NOT_TENSOR, "attention backward with a constant operand")
    g = ctx.g
    k, rep = _gqa_heads(ctx, q, k)
    v, _ = _gqa_heads(ctx, q, v)
    s, c, _ = _sdpa_scores(ctx, q, k, mask, causal, kwargs.get("scale"))
    r = len(q.shape)
    dt = q.t.dtype
    L = q.shape[-2]
    if tuple(lse.shape) in (tuple(q.shape[:-1]), (*q.shape[:-1], 1)):
        tl = ctx.exact(lse)
    elif tuple(lse.shape[:-1]) == tuple(q.shape[:-2]) and lse.shape[-1] > L and ctx.layout("slice"):
        tl = emit(g, "slice", ctx.exact(lse), r - 2, 0, L)  # padded statistics: the queries' rows
    else:
        raise Unsupported(Reason.LAYOUT, f"attention backward with statistics of shape {lse.shape}")
    if not ctx.layout("reshape"):
        raise Unsupported(Reason.LAYOUT, "attention backward needs the registry's reshape (its statistics)")
    lt = emit(g, "reshape", tl, (*q.shape[:-1], 1))
    if lt.dtype != dt:
        lt = emit(g, "cast", lt, dt)
    if isinstance(mask, LV):
        # a row masked entirely to -inf has S = -inf throughout: P = exp(S - lse) must be 0 there, so the
        # statistics are kept finite (ATen saves 0 for such a row, the lifted forward too; a -inf would give NaN)
        import torch

        fi = torch.finfo(getattr(torch, dt.torch_name))
        lt = emit(g, "clamp", lt, float(fi.min), float(fi.max))
    pm = emit(g, "exp", emit(g, "sub", s, lt))
    tdo, tv, to = ctx.exact(do), ctx.exact(v), ctx.exact(o)
    dv = emit(g, "matmul", emit(g, "transpose", pm, r - 2, r - 1), tdo)
    dp = emit(g, "matmul", tdo, emit(g, "transpose", tv, r - 2, r - 1))
    dd = emit(g, "sum", emit(g, "mul", tdo, to), r - 1)
    ds = emit(g, "mul", pm, emit(g, "sub", dp, dd))
    dq = emit(g, "scale", emit(g, "matmul", ds, ctx.exact(k)), c=c)
    dk = emit(g, "scale", emit(g, "matmul", emit(g, "transpose", ds, r - 2, r - 1), ctx.exact(q)), c=c)
    dk, dv = _gqa_sum(ctx, dk, rep), _gqa_sum(ctx, dv, rep)
    res: tuple[Any, ...] = (LV(dq, tuple(out[0][0])), LV(dk, tuple(out[1][0])), LV(dv, tuple(out[2][0])))
    if grad_mask and len(out) > 3 and out[3] is not None:
        res = (*res, _reduce_to(ctx, ds, tuple(out[3][0])))  # the mask is added to S: its gradient is dS, reduced
    return (*res, *([None] * (len(out) - len(res)))) if isinstance(out, list) and len(out) > len(res) else res


def _reduce_to(ctx: Ctx, t: Tensor, shape: tuple[int, ...]) -> LV:
    """``t`` summed over the dims that broadcast ``shape`` to ``t``'s shape (the gradient of a broadcast operand)."""
    g = ctx.g
    full = tuple(t.shape)
    pad = (1,) * (len(full) - len(shape)) + tuple(shape)
    if len(pad) != len(full) or any(p not in (1, f) for p, f in zip(pad, full, strict=True)):
        raise Unsupported(Reason.LAYOUT, f"a gradient of shape {shape} for a value of shape {full}")
    for ax, (p, f) in enumerate(zip(pad, full, strict=True)):
        if p == 1 and f > 1:
            t = emit(g, "sum", t, ax)
    if tuple(t.shape) != tuple(shape):
        if not ctx.layout("reshape"):
            raise Unsupported(Reason.LAYOUT, "a reduced gradient needs the registry's reshape")
        t = emit(g, "reshape", t, tuple(shape))
    return LV(t, tuple(shape))


for _n in _SDPA:
    HANDLERS[_n] = sdpa_handler(_n)


#: ATen ops that only change how data is viewed (counted apart from compute ops in coverage).
VIEW_OPS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as",
        "_reshape_alias", "expand", "t", "transpose", "permute", "detach", "alias", "slice", "select",
        "split", "split_with_sizes", "unbind", "as_strided", "contiguous", "lift_fresh_copy", "getitem", "clone",
        "_to_copy_noop",
    }
)


@handles("var_mean", "var")
def _var_mean(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    v = args[0]
    dims, _keep = _dims(args, kwargs, len(v.shape))
    corr = kwargs.get("correction", 1)
    if kwargs.get("unbiased") is False:
        corr = 0
    t, gdims = ctx.axes(v, dims)
    g = ctx.g
    mean = t
    for d in gdims:
        mean = emit(g, "mean", mean, d)
    sq = emit(g, "square", emit(g, "sub", t, mean))
    for d in gdims:
        sq = emit(g, "mean", sq, d)
    n = math.prod(v.shape[d] for d in dims)
    if corr:
        if n - corr <= 0:
            raise Unsupported(Reason.NOT_IN_REGISTRY, "variance of fewer elements than the correction")
        sq = emit(g, "scale", sq, c=n / (n - float(corr)))
    if isinstance(out, list) and len(out) == 2:
        return LV(sq, tuple(out[0][0])), LV(mean, tuple(out[1][0]))
    return LV(sq, _shape(out))


# -- gradient masks, constants, max with indices (issue 20's op gaps)


@handles("threshold_backward")
def _threshold_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    gr, x, c = args[0], args[1], args[2]
    if not (isinstance(gr, LV) and isinstance(x, LV) and _num(c)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "threshold_backward with a tensor threshold")
    g = ctx.g  # grad where x > c else 0
    return ctx.ew(_shape(out), [gr, x], lambda ts: emit(g, "mul", ts[0], emit(g, "step", ts[1], c=float(c))))


@handles("leaky_relu_backward")
def _leaky_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    gr, x, slope = args[0], args[1], args[2]
    if not (isinstance(gr, LV) and isinstance(x, LV) and _num(slope)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "leaky_relu_backward with a tensor slope")
    s = float(slope)
    if args[3:4] == [True] and s < 0:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "leaky_relu_backward on the result with a negative slope")
    g = ctx.g  # grad * (1 where x > 0 else slope) = grad * (slope + (1 - slope) step(x))

    def f(ts: list[Tensor]) -> Tensor:
        return emit(g, "mul", ts[0], emit(g, "shift", emit(g, "scale", emit(g, "step", ts[1], c=0.0), c=1.0 - s),
                                          c=s))

    return ctx.ew(_shape(out), [gr, x], f)


def _constant(ctx: Ctx, shape: Sequence[int], torch_dtype: Any, value: float) -> LV:
    """A constant tensor (an input of the partition made here, like attention's causal mask)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    dt = vm_dtype(torch_dtype)
    if not math.isfinite(value):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"a constant {value} (not finite)")
    shape = tuple(int(s) for s in shape)
    with unset_fake_temporarily():
        c = torch.full(shape or (1,), float(value), dtype=torch_dtype)
    name = f"const{len(ctx.consts)}"
    ctx.consts.append((name, c))
    return LV(ctx.g.input(name, shape or (1,), dt), shape)


#: the ops that read a value holding -inf as the lowest finite value (:attr:`LV.fill`) and know it: any other
#: reader of such a value is left to ATen
FILL_READERS = frozenset({"_softmax", "softmax", "_to_copy", "convert_element_type", "add", *_SDPA, *SDPA_BW_ARGS})


def _const_input(ctx: Ctx, c: Any) -> LV:
    """A torch tensor ``c`` (float or bool) as a constant input of the partition (rank 0: a (1,) input)."""
    shape = tuple(int(s) for s in c.shape)
    name = f"const{len(ctx.consts)}"
    ctx.consts.append((name, c.reshape(shape or (1,))))
    return LV(ctx.g.input(name, shape or (1,), vm_dtype(c.dtype)), shape)


#: the ops that read a constant holding -inf (a mask made in the forward, ``torch.full((t, t), -inf).triu(1)``):
#: attention's mask, or a sum only a softmax along the last dim reads (:func:`constant_value`)
def _reads_fill(user: Any, c: Any) -> bool:
    name = op_of_node(user)
    if name in _SDPA or name in SDPA_BW_ARGS:
        return user.kwargs.get("attn_mask") is c or c in user.args[3:]
    return name == "add" and len(user.args) == 2 and user.args[0] is not user.args[1] \
        and _softmax_reads_only(user, user.meta["val"].dim())


def constant_value(ctx: Ctx, c: Any, node: Any, user: Any) -> LV:
    """The value ``c`` (a torch tensor) the capture computed while lifting fx ``node`` (every operand a constant: a
    mask or a rotary table made in the forward), as fx node ``user`` reads it: a float or boolean constant input;
    integers as exact float32s (below 2**24); a float holding -inf (a mask) as its finite part (0 there) with
    :attr:`LV.fill` its boolean "kept" mask, only for attention's mask or a sum a softmax reads (both make those
    entries' weights exactly 0, as ATen's -inf)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _constant_value(ctx, c, node, user)


def _constant_value(ctx: Ctx, c: Any, node: Any, user: Any) -> LV:
    import torch

    if c.dtype == torch.bool:
        return _const_input(ctx, c)
    if c.is_complex() or not (c.is_floating_point() or c.dtype in (torch.int64, torch.int32, torch.int16,
                                                                   torch.int8, torch.uint8)):
        raise Unsupported(Reason.DTYPE, f"a constant of dtype {c.dtype}")
    if not c.is_floating_point():
        if c.numel() and int(c.abs().max()) >= _EXACT_INT:
            raise Unsupported(Reason.DTYPE, "an integer constant beyond 2**24 (not exact in float32)")
        return dataclasses.replace(_const_input(ctx, c.to(torch.float32)), integral=True, value=c)
    vm_dtype(c.dtype)
    finite = torch.isfinite(c)
    if bool(finite.all()):
        return _const_input(ctx, c)
    keep = c != float("-inf")
    if bool((~finite & keep).any()):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "a constant holding NaN or +inf (the registry's constants are "
                                                  "finite)", node)
    if not _reads_fill(user, node):  # (ATen makes it, and the kernels read it as an input: blamed, not its reader)
        raise Unsupported(Reason.NOT_IN_REGISTRY, "a constant holding -inf read by anything but attention's mask or "
                                                  "a sum a softmax along the last dim reads (the registry's "
                                                  "constants are finite)", node)
    finite = torch.where(keep, c, torch.zeros((), dtype=c.dtype))
    r = _const_input(ctx, finite)
    return dataclasses.replace(r, fill=(_const_input(ctx, keep).t, True), zero=not bool(finite.any()), kept=keep)


def _lowest(ctx: Ctx, dt: DType) -> Tensor:
    import torch

    tdt = getattr(torch, dt.torch_name)
    return _constant(ctx, (), tdt, float(torch.finfo(tdt).min)).t


def _filled(ctx: Ctx, fill: tuple[Tensor, bool], t: Tensor) -> Tensor:
    """``t`` with the entries ``fill`` marks (:attr:`LV.fill`) set to the dtype's lowest finite value."""
    fm, keep = fill
    low = _lowest(ctx, t.dtype)
    return emit(ctx.g, "where", fm, *((t, low) if keep else (low, t)))


#: ops that make a constant tensor (their ``device`` keyword is where it lives, not a move)
CREATION_OPS = frozenset({"new_zeros", "new_ones", "new_full", "full", "zeros", "ones", "scalar_tensor", "arange"})


@handles(*(CREATION_OPS - {"arange"}))
def _full(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    name = op_of(ctx)
    value = {"new_zeros": 0.0, "zeros": 0.0, "new_ones": 1.0, "ones": 1.0}.get(name)
    if value is None:
        v = args[0] if name == "scalar_tensor" else args[2] if name == "new_full" else args[1]
        if not _num(v):
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"{name} with a fill value {v!r}")
        value = float(v)
    shape, dt = out
    return _constant(ctx, shape, dt, value)


@handles("arange")
def _arange(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``torch.arange(...)`` of a float dtype (a rotary embedding's frequency exponents): a constant input made by
    torch's own arange. An integer sequence (position ids) stays with ATen: the kernels read its conversion to a
    float, its comparisons with constants or its use as class indices."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    shape, dt = out
    if not dt.is_floating_point or not all(_num(a) for a in args):
        raise Unsupported(Reason.DTYPE, "an integer sequence (arange) is made by ATen: the kernels read only its "
                                        "conversion to a float, its comparisons or its use as class indices")
    vm_dtype(dt)
    with unset_fake_temporarily():
        c = torch.arange(*args, dtype=dt)
    if tuple(c.shape) != tuple(shape):
        raise Unsupported(Reason.LAYOUT, f"arange{tuple(args)}: {tuple(c.shape)} where ATen has {tuple(shape)}")
    name = f"const{len(ctx.consts)}"
    ctx.consts.append((name, c))
    return LV(ctx.g.input(name, tuple(shape), vm_dtype(dt)), tuple(shape))


def op_of(ctx: Ctx) -> str:
    """The overload packet name of the node being lifted."""
    return op_of_node(ctx.node)


@handles("slice_backward")
def _slice_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    gr, _sizes, dim, start, end, step = args[:6]
    shape, dt = out
    r = len(shape)
    dim = int(dim) % r
    n = shape[dim]
    s = max(0, min(n, int(start) + n if int(start) < 0 else int(start)))
    e = max(s, min(n, int(end) + n if int(end) < 0 else int(end)))
    if int(step) != 1:
        # the gradient at column j of (m, k) rows, zeros in the other columns: the window [s, e) of a unit slice
        k = int(step)
        base, j, m = _strided(n, s, e, k)
        g = ctx.g
        col = list(gr.shape)
        col.insert(dim + 1, 1)
        cols = [emit(g, "reshape", ctx.exact(gr), tuple(col))]
        zs = [(0, j), (j + 1, k)]
        for lo, hi in zs:
            if hi > lo:
                zc = list(col)
                zc[dim + 1] = hi - lo
                cols.insert(0 if lo == 0 else len(cols), ctx.exact(_constant(ctx, zc, dt, 0.0)))
        win = list(shape)
        win[dim] = k * m
        t = emit(g, "reshape", emit(g, "concat", cols, dim + 1), tuple(win))
        gr, s, e = LV(t, tuple(win)), base, base + k * m
    parts = []
    for lo, hi in ((0, s), (e, n)):
        if hi > lo:
            ps = list(shape)
            ps[dim] = hi - lo
            parts.append((lo, _constant(ctx, ps, dt, 0.0)))
    if e > s:
        parts.append((s, gr))
    parts.sort(key=lambda p: p[0])
    if len(parts) == 1:
        return parts[0][1]
    return LV(emit(ctx.g, "concat", [ctx.exact(p) for _, p in parts], dim), tuple(shape))


@handles("select_backward")
def _select_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """The gradient of ``x.select(dim, i)``: ``grad`` viewed with a size-1 dim at ``dim``, zeros around it (the
    gradient of the slice ``[i, i + 1)``)."""
    gr, sizes, dim, index = args[:4]
    shape = _shape(out)
    d = int(dim) % len(shape)
    i = int(index) + shape[d] if int(index) < 0 else int(index)
    if not isinstance(gr, LV):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "select_backward of a non-tensor")
    g1 = LV(ctx.exact(gr) if gr.bcast else gr.t, (*shape[:d], 1, *shape[d + 1:]), src=ctx.node)
    return _slice_bw(ctx, [g1, sizes, d, i, i + 1, 1], {}, out)


_max_red = _reduce("max")
_min_red = _reduce("min")


@handles("max", "min")
def _max(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
    name = op_of(ctx)
    if len(args) > 1 and isinstance(args[1], LV):  # max.other: elementwise
        return _named_binary("maximum" if name == "max" else "minimum")(ctx, args, kwargs, out)
    red = _max_red if name == "max" else _min_red
    if isinstance(out, list):
        # max.dim: (values, indices). The indices stay in ATen: an index is the *first* position of the maximum,
        # and the registry can mark every position equal to it (step masks) but not the first of several equal
        # ones, so a tied row (ReLU'd or quantised activations) would send its gradient to the wrong place
        if ctx.node is not None and len(ctx.node.users) and any(
                u.target is operator.getitem and u.args[1] == 1 and u.users for u in ctx.node.users):
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name}.dim whose indices are read: the index of the "
                              "first maximum among equal values has no registry op (a mask marks every tied one)")
        return red(ctx, args, kwargs, out[0]), None
    return red(ctx, args, kwargs, out)


def _not_expressible(reason: Reason, why: str) -> Handler:
    def fn(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> Any:
        raise Unsupported(reason, f"aten.{op_of(ctx)}: {why}")

    fn.refuses = True  # type: ignore[attr-defined]
    return fn


#: ATen ops whose integer operand (at this argument position) lifts as an input of integer-valued float32s: the
#: class indices, read only through an equality mask with the class numbers (:func:`_one_hot`); the partition's
#: runner casts the tensor to float32 on entry (exact below 2**24)
INDEX_OPERANDS = {"nll_loss_forward": 1, "nll_loss_backward": 2, "gather": 2}

def index_bounds(name: str, args: Sequence[Any]) -> tuple[int, int | None] | None:
    """``(classes, ignore)`` for the index operand of ATen op ``name`` (one of :data:`INDEX_OPERANDS`) called with
    ``args`` (fx nodes or values): a valid index is in ``[0, classes)`` or equals ``ignore`` (nll_loss's
    ignore_index; None for gather). ATen raises for any other index; the lifted one-hot mask matches no class there
    (a silent 0), so the partition's runner checks the indices against these bounds on entry. None when the
    operand's shape is not known (the handler then refused it anyway)."""

    def shape(a: Any) -> tuple[int, ...] | None:
        v = a.meta.get("val") if hasattr(a, "meta") else a
        return tuple(int(d) for d in v.shape) if hasattr(v, "shape") else None

    args = list(args)
    if name == "nll_loss_forward" and args:
        s, ignore = shape(args[0]), (args[4] if len(args) > 4 else -100)
    elif name == "nll_loss_backward" and len(args) > 1:
        s, ignore = shape(args[1]), (args[5] if len(args) > 5 else -100)
    elif name == "gather" and len(args) > 1:
        s, ignore = shape(args[0]), None
    else:
        return None
    if not s:
        return None
    return s[-1], None if ignore is None else int(ignore)


#: class counts up to this are exact in float32 (so are the indices and their differences)
_EXACT_INT = 2**24


def _one_hot(ctx: Ctx, index: LV, rows: int, classes: int, ignore: int | None = None, *,
             boolean: bool = False) -> Tensor:
    """``(rows, classes)`` float32: 1 where ``index[i] == c`` (and ``c != ignore``), else 0; ``index`` holds
    ``rows`` integer-valued float32s. Built as ``step(-|index[i] - c|, -0.5)`` against a constant row of the class
    numbers (the ignored class's number replaced by a half-integer, which no integer matches): integers closer
    than 1/2 are equal, and every value here is an integer below 2**24 (exact). An index outside
    ``[0, classes)`` matches no class (ATen raises for it; the kernels do not check). ``boolean``: the same mask as
    a ``vm.bool`` (``greater``), for a ``where`` that picks (a select: no ``inf * 0`` from the classes not picked)."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    g = ctx.g
    if classes > _EXACT_INT or rows * classes <= 0:
        raise Unsupported(Reason.DTYPE, f"{classes} classes: indices are exact in float32 up to 2**24 only")
    if not (ctx.layout("reshape") and ctx.layout("broadcast_to")):
        raise Unsupported(Reason.LAYOUT, "an index mask needs the registry's reshape and broadcast_to")
    t = emit(g, "reshape", ctx.exact(index) if index.shape else index.t, (rows, 1))
    with unset_fake_temporarily():
        iota = torch.arange(classes, dtype=torch.float32).reshape(1, classes)
        if ignore is not None and 0 <= ignore < classes:
            iota[0, ignore] = ignore + 0.5
    name = f"const{len(ctx.consts)}"
    ctx.consts.append((name, iota))
    c = ctx.g.input(name, (1, classes), vm_dtype(torch.float32))
    d = emit(g, "sub", emit(g, "broadcast_to", t, (rows, classes)), emit(g, "broadcast_to", c, (rows, classes)))
    return emit(g, "greater" if boolean else "step", emit(g, "neg", emit(g, "abs", d)), c=-0.5)


def _picked(ctx: Ctx, x: Tensor, index: LV, ignore: int | None = None) -> Tensor:
    """``(rows, 1)``: ``x[i, index[i]]`` (0 where the index is ``ignore``), as ``sum_c where(index[i] == c, x[i, c],
    0)``: the select passes the picked value as it is (a -inf log-probability gives an infinite loss, as ATen's)
    and reads nothing else (an inf or NaN of a class not picked changes nothing, as in ATen)."""
    import torch

    n, k = (int(s) for s in x.shape)
    zero = _constant(ctx, (), getattr(torch, x.dtype.torch_name), 0.0).t
    sel = emit(ctx.g, "where", _one_hot(ctx, index, n, k, ignore, boolean=True), x, zero)
    return emit(ctx.g, "sum", sel, 1)


def _as(g: Graph, t: Tensor, dt: Any) -> Tensor:
    return t if t.dtype == dt else emit(g, "cast", t, dt)


def _nll_args(ctx: Ctx, x: Any, weight: Any, reduction: Any) -> tuple[Tensor, int, int, int]:
    if not isinstance(x, LV) or len(x.shape) != 2:
        raise Unsupported(Reason.LAYOUT, "nll_loss of a (batch, classes) input only")
    if weight is not None:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "nll_loss with class weights")
    if reduction not in (0, 1, 2):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"nll_loss reduction {reduction!r}")
    return ctx.exact(x), x.shape[0], x.shape[1], int(reduction)


@handles("nll_loss_forward")
def _nll_loss_forward(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, LV]:
    """``(loss, total_weight)``: ``-x[i, t_i]`` per row (reduction none), summed (sum) or over the count of
    targets not ``ignore_index`` (mean); total_weight is that count (0 for none), as ATen gives them."""
    x, target, weight, reduction, ignore = (list(args) + [None] * 5)[:5]
    xt, n, k, red = _nll_args(ctx, x, weight, reduction)
    g = ctx.g
    ig = None if ignore is None else int(ignore)
    loss = emit(g, "neg", _picked(ctx, xt, target, ig))  # (n, 1): -x[i, t_i], 0 if ignored
    if red == 0:
        return LV(loss, (n,)), _constant(ctx, (), out[1][1], 0.0)
    count = _as(g, emit(g, "sum", emit(g, "sum", _one_hot(ctx, target, n, k, ig), 1), 0), xt.dtype)  # (1, 1)
    total = emit(g, "sum", loss, 0)
    if red == 1:
        total = emit(g, "div", total, count)
    return LV(total, ()), LV(count, ())


@handles("nll_loss_backward")
def _nll_loss_backward(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``grad_input[i, c] = -grad_output[i] [c == t_i]`` (reduction none; sum: ``grad_output`` a scalar; mean:
    divided by ``total_weight``), 0 on rows whose target is ``ignore_index``."""
    gr, _x, target, weight, reduction, ignore, total = (list(args) + [None] * 7)[:7]
    shape, dt = _shape(out), vm_dtype(out[1])
    if len(shape) != 2 or weight is not None or reduction not in (0, 1, 2):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "nll_loss_backward: a (batch, classes) input, no class weights, "
                                                  "reduction none, mean or sum only")
    n, k = shape
    red = int(reduction)
    if not isinstance(gr, LV) or (red == 1 and not isinstance(total, LV)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "nll_loss_backward without tensor gradients")
    g = ctx.g
    ig = None if ignore is None else int(ignore)
    oh = _as(g, _one_hot(ctx, target, n, k, ig), dt)
    go = emit(g, "reshape", ctx.exact(gr) if gr.shape else gr.t, (n, 1) if red == 0 else (1, 1))
    scale = emit(g, "broadcast_to", _as(g, go, dt), (n, k))
    if red == 1:
        # ATen writes only the rows whose target is not ignore_index: with every target ignored (total_weight 0)
        # the gradient is 0, not (g / 0) * 0 = NaN. So 1 is added to total_weight where no target counts (the
        # mask is then 0 throughout), and nothing where one does.
        none = emit(g, "step", emit(g, "neg", emit(g, "sum", emit(g, "sum", oh, 1), 0)), c=-0.5)  # (1, 1)
        tw = emit(g, "add", _as(g, emit(g, "reshape", total.t, (1, 1)), dt), none)
        scale = emit(g, "div", scale, emit(g, "broadcast_to", tw, (n, k)))
    # (ATen writes 0 off the targets whatever the upstream gradient; ``scale * oh`` is NaN there at an infinite
    # one. A select, ``where(t_i == c, -scale, 0)``, left the composed backward of cross entropy unproved.)
    return LV(emit(g, "neg", emit(g, "mul", scale, oh)), (n, k))


@handles("gather")
def _gather(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``gather(x, 1, index)`` with one index per row (``index`` of shape ``(n, 1)``): ``sum_c x[i, c] [c ==
    index[i]]`` (a gather the registry cannot index, read as a masked sum); other gathers stay in ATen."""
    x, dim, index = args[0], args[1], args[2]
    if kwargs.get("sparse_grad") or (len(args) > 3 and args[3]):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "gather with sparse_grad")
    if not (isinstance(x, LV) and isinstance(index, LV) and len(x.shape) == 2 and int(dim) % 2 == 1
            and index.shape == (x.shape[0], 1)):
        raise Unsupported(Reason.INDEXED, "gather of anything but one index per row along the last dim of a 2-d "
                                          "input: it runs in the fallback, outside the verified kernels")
    return LV(_picked(ctx, ctx.exact(x), index), (x.shape[0], 1))


def _runs(idx: Any, n: int) -> list[tuple[int, int]] | None:
    """Constant indices ``idx`` (a 1-d torch tensor) into a dim of size ``n`` as runs ``[s, e)`` of consecutive
    positions (negative indices from the end); None if one is out of range."""
    out: list[tuple[int, int]] = []
    for i in (int(v) for v in idx.tolist()):
        if not -n <= i < n:
            return None
        i %= n
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _take_constant(ctx: Ctx, x: Any, dim: int, idx: Any, out: Any) -> LV:
    """``x`` at constant positions ``idx`` along ``dim`` (Falcon's multi-query ``fused[..., [-2], :]``): slices of
    its runs of consecutive positions, concatenated; the indices are known when lifting, so nothing is read at data
    positions."""
    if not isinstance(x, LV) or idx is None or getattr(idx, "dim", lambda: 2)() != 1 or idx.is_floating_point():
        raise Unsupported(Reason.INDEXED, f"aten.{op_of(ctx)}: reads at indices that are data: it runs in the "
                                          "fallback, outside the verified kernels")
    d = dim % len(x.shape)
    runs = _runs(idx, x.shape[d])
    if not runs:
        raise Unsupported(Reason.INDEXED, f"aten.{op_of(ctx)} with an index out of range or none")
    dt = out[1]
    parts = []
    for s0, e0 in runs:
        shape = (*x.shape[:d], e0 - s0, *x.shape[d + 1:])
        parts.append(_slice(ctx, [x, d, s0, e0, 1], {}, (shape, dt)))
    return parts[0] if len(parts) == 1 else _cat(ctx, [parts, d], {}, out)


@handles("index")
def _index(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``x[..., idx, ...]`` with one constant 1-d index tensor (made in the forward or held by the graph):
    :func:`_take_constant`; data-dependent indices stay in ATen."""
    x, ix = args[0], args[1]
    given = [(i, v) for i, v in enumerate(ix or []) if v is not None]
    if len(given) != 1 or not isinstance(given[0][1], LV):
        raise Unsupported(Reason.INDEXED, "aten.index: reads or writes at indices that are data: it runs in the "
                                          "fallback, outside the verified kernels")
    return _take_constant(ctx, x, given[0][0], given[0][1].value, out)


@handles("index_select")
def _index_select(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``index_select(x, dim, idx)`` with constant ``idx``: :func:`_take_constant`."""
    idx = args[2]
    return _take_constant(ctx, args[0], int(args[1]), idx.value if isinstance(idx, LV) else None, out)


#: fx meta key of a node's constant tensor: a ``get_attr`` node's (a constant the traced graph holds: ``x[..., [-2]]``'s
#: index list), a backward placeholder's that its forward made and saved (``capture.hold_saved``)
HELD = "verimirage_constant"


#: the most runs of consecutive rows an embedding with constant indices is lifted as (one slice a run)
EMBED_RUNS_MAX = 256


def _embed_index(ctx: Ctx, w: Any, idx: Any, what: str) -> Any:
    """The index tensor of an embedding (an fx node: :data:`UNREAD_ARGS`) when it is computed while lifting (made
    in the forward: T5's relative position buckets) or held (:data:`HELD`: such buckets saved for the backward),
    flattened; Unsupported (data-dependent indexing) when not."""
    value = ctx.folded.get(idx, getattr(idx, "meta", {}).get(HELD))
    if not (isinstance(w, LV) and len(w.shape) == 2 and value is not None and not value.is_floating_point()):
        raise Unsupported(Reason.INDEXED, f"{what} at indices that are data: it runs in the fallback, outside the "
                                          "verified kernels")
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        flat = torch.tensor([int(v) for v in value.reshape(-1).tolist()], dtype=torch.int64)
    if len(_runs(flat, w.shape[0]) or ()) > EMBED_RUNS_MAX or int(flat.numel()) == 0:
        raise Unsupported(Reason.INDEXED, f"{what} of {int(flat.numel())} constant indices in more than "
                                          f"{EMBED_RUNS_MAX} runs")
    return flat


def _embedding(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``embedding(weight, idx)`` with indices known while lifting: the rows of their runs (:func:`_take_constant`),
    viewed as ATen's shape; with indices that are data it stays in ATen."""
    w = args[0]
    flat = _embed_index(ctx, w, args[1], "embedding")
    rows = _take_constant(ctx, w, 0, flat, ((int(flat.numel()), w.shape[1]), out[1]))
    return LV(emit(ctx.g, "reshape", ctx.exact(rows), _shape(out)), _shape(out))


def _embedding_backward(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``embedding_dense_backward(grad, idx, num_weights, padding_idx, scale_grad_by_freq)`` with constant indices:
    row ``v`` of the weight's gradient is the sum of the gradient's rows whose index is ``v`` (zeros for ``v`` no
    index names, and for ``padding_idx``)."""
    gr, idx, nw, pad, scale = (list(args) + [None] * 5)[:5]
    shape, dt = out
    if scale:
        raise Unsupported(Reason.INDEXED, "embedding_dense_backward scaled by the indices' frequencies")
    if not isinstance(gr, LV):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "embedding_dense_backward of a non-tensor")
    flat = _embed_index(ctx, LV(gr.t, tuple(shape)), idx, "embedding_dense_backward")
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    g, n, d = ctx.g, int(flat.numel()), shape[1]
    if int(nw) > EMBED_RUNS_MAX:
        raise Unsupported(Reason.INDEXED, f"embedding_dense_backward of {nw} rows")
    rows = emit(g, "reshape", ctx.exact(gr), (n, d))
    parts = []
    for v in range(int(nw)):
        at = [i for i in range(n) if int(flat[i]) == v and v != (pad if pad is not None else -1)]
        if not at:
            parts.append(ctx.exact(_constant(ctx, (1, d), dt, 0.0)))
            continue
        with unset_fake_temporarily():
            ats = torch.tensor(at, dtype=torch.int64)
        picked = _take_constant(ctx, LV(rows, (n, d)), 0, ats, ((len(at), d), dt))
        parts.append(emit(g, "sum", ctx.exact(picked), 0) if len(at) > 1 else ctx.exact(picked))
    return LV(parts[0] if len(parts) == 1 else emit(g, "concat", parts, 0), tuple(shape))


for _n in ("nll_loss", "nll_loss_nd", "scatter", "scatter_add", "scatter_reduce",
           "_unsafe_index", "index_put", "_unsafe_index_put", "index_add", "index_copy", "embedding",
           "embedding_dense_backward", "topk", "sort", "argsort", "nonzero", "masked_select", "masked_scatter",
           "take_along_dim", "_embedding_bag", "one_hot", "bincount", "searchsorted", "bucketize"):
    HANDLERS[_n] = _not_expressible(Reason.INDEXED, "reads or writes at indices that are data (a gather or "
                                    "scatter): it runs in the fallback, outside the verified kernels")
HANDLERS["embedding"], HANDLERS["embedding_dense_backward"] = _embedding, _embedding_backward
for _n in ("cumsum", "cumprod"):
    HANDLERS[_n] = _not_expressible(Reason.NOT_IN_REGISTRY, "a running sum or product along a dim: the registry has "
                                    "no scan, and a triangular matmul (0/1 weights) would read the later elements "
                                    "times 0, NaN where one is inf (ATen's scan is finite before it), at O(n^2)")
@handles("eq", "ne")
def _equal(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``x == c`` (``!=``) of integer-valued floats (:attr:`LV.integral`: labels, counts) and an integer constant,
    as the mask ``|x - c| < 1/2`` (``step(-|x - c|, -1/2)``; exact, every value an integer below 2**24); a ``where``
    reads it as the boolean ``greater(-|x - c|, -1/2)``. Floats (:func:`_float_equal`): neither above nor below."""
    x, c = args[0], args[1]
    name = op_of(ctx)
    if isinstance(x, LV) and not x.integral and not x.mask and not x.cplx and _num(c) and x.t.dtype != DType.bool:
        return _float_equal(ctx, x, float(c), name, out)
    if not (isinstance(x, LV) and x.integral and _num(c) and float(c).is_integer() and abs(float(c)) < 2**24):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} of anything but integers and an integer constant "
                                                  "(an equality of floats has no registry op)")
    g = ctx.g
    seen: list[Tensor] = []

    def f(ts: list[Tensor]) -> Tensor:
        d = emit(g, "neg", emit(g, "abs", emit(g, "shift", ts[0], c=-float(c))))
        seen.append(d)
        s = emit(g, "step", d, c=-0.5)
        return s if name == "eq" else emit(g, "shift", emit(g, "scale", s, c=-1.0), c=1.0)

    r = ctx.ew(_shape(out), [x], f)
    cmp = (seen[0], "gt" if name == "eq" else "ngt", -0.5) if tuple(seen[0].shape) == tuple(r.t.shape) else None
    return dataclasses.replace(r, mask=True, cmp=cmp)


def _float_equal(ctx: Ctx, x: LV, c: float, name: str, out: Any) -> LV:
    """``x == c`` (``!=``) of floats with a constant (``F.normalize``'s gradient ``masked_fill(x / n, n == 0, 0)``):
    neither ``x > c`` nor ``-x > -c`` and not NaN, as the mask ``notnan(x) - step(x, c) - step(-x, -c)`` (1 - that
    for ``!=``, true at NaN as in ATen), ``c`` rounded to ``x``'s dtype as ATen compares; a ``where`` reads it as
    booleans (``feq`` / ``fne``)."""
    g = ctx.g
    cv = _in_dtype(c, x.t.dtype)
    if not math.isfinite(cv):
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} with a constant {c} (not finite in {x.t.dtype})")
    seen: list[Tensor] = []

    def f(ts: list[Tensor]) -> Tensor:
        seen.append(ts[0])
        ok = emit(g, "step", emit(g, "clamp", ts[0], -1.0, 1.0), c=-2.0)
        both = emit(g, "add", emit(g, "step", ts[0], c=cv), emit(g, "step", emit(g, "neg", ts[0]), c=-cv))
        eq = emit(g, "sub", ok, both)
        return eq if name == "eq" else emit(g, "shift", emit(g, "scale", eq, c=-1.0), c=1.0)

    r = ctx.ew(_shape(out), [x], f)
    cmp = (seen[0], "feq" if name == "eq" else "fne", cv) if tuple(seen[0].shape) == tuple(r.t.shape) else None
    return dataclasses.replace(r, mask=True, cmp=cmp)


@handles("_safe_softmax")
def _safe_softmax(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """Softmax that gives 0 on rows masked entirely to -inf (SDPA's math path with a mask), without a test for
    -inf: the row max is clamped to the dtype's finite range (a row of -inf then gives ``exp(-inf) = 0``
    everywhere; any row with a finite max is unchanged, since that max is in range) and the denominator to at
    least 1 (a row with a finite max has a term ``exp(0) = 1``, so only the all -inf rows change: 0 / 1 = 0)."""
    v, dim = args[0], int(args[1])
    dt = args[2] if len(args) > 2 else kwargs.get("dtype")
    if dt is not None and vm_dtype(dt) != v.t.dtype:
        raise Unsupported(Reason.DTYPE, "_safe_softmax with a dtype conversion")
    t, (ax,) = ctx.axes(v, [dim])
    return LV(_safe_softmax_t(ctx.g, t, ax), _shape(out))


HANDLERS["argmax"] = HANDLERS["argmin"] = _not_expressible(Reason.INDEXED, "an index result (argmax): it runs in "
                                                            "the fallback, outside the verified kernels")
for _n in ("native_dropout", "bernoulli", "rand", "randn", "rand_like", "randn_like", "randint", "randint_like",
           "randperm", "multinomial", "normal", "uniform", "exponential"):
    HANDLERS[_n] = _not_expressible(Reason.RANDOM, "draws random numbers: it runs in the fallback (ATen's generator), "
                                    "the kernels read what it drew")


@handles("native_dropout_backward")
def _dropout_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``grad * mask * scale`` with dropout's boolean ``mask`` (drawn by ATen in the forward): ``grad`` times
    ``where(mask, scale, 0)``, as ATen (an inf gradient where the mask is false gives NaN there too)."""
    gr, m, scale = args[0], args[1], args[2]
    if not (isinstance(gr, LV) and isinstance(m, LV) and _num(scale)) or m.mask or m.negated:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "native_dropout_backward of a mask that is not a boolean tensor")
    w = _where(ctx, [m, float(scale), 0.0], {}, out)
    return ctx.ew(_shape(out), [gr, w], lambda ts: emit(ctx.g, "mul", ts[0], ts[1]))


from . import conv as _conv  # noqa: E402,F401  (registers the convolution handlers: it reads this module's helpers)
from . import pad as _pad_modes  # noqa: E402,F401  (registers the padding modes and slice_scatter, copy, allocations)
