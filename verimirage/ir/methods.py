"""The builders' named op methods (``g.add(a, b)``, ``g.exp(x)``, ``g.sum(x, axis)``, ...).

Each is a shorthand for ``apply(op, args, attrs)`` with the argument handling users expect (constants
as floats, ``keepdim``, ``-1`` in a reshape, negative permute dims). They live apart from the IR core
(:mod:`.graph`), which the certificate checker imports: the checker reads programs and never builds
them with these methods, so they are not part of what a ``Proved`` depends on. The builders load this
module on first use of a name they lack (see :class:`verimirage.ir.graph.LoadsMethods`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .errors import GraphError
from .graph import Tensor, _Builder, _check_dtype
from .limits import check_constant
from .ops import check_axis


class OpMethods:
    """The named op methods shared by every builder (each level allows a subset of the ops)."""

    _emit: Callable[..., Tensor]

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

def install() -> bool:
    """Put the methods on the builders' base class; False if they already are."""
    if "matmul" in vars(_Builder):
        return False
    for name, fn in vars(OpMethods).items():
        if callable(fn) and not name.startswith("__"):
            setattr(_Builder, name, fn)
    return True


__all__ = ["OpMethods", "install"]
