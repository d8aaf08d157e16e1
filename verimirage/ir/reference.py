"""The float64 reference: the meaning (domain ``"ref"``) of the registry's ops and :func:`evaluate`
(``vm.evaluate``), the plain evaluator run on it.

It registers with :func:`~verimirage.ir.ops.implements` like every other domain. The certificate checker,
which compares programs in the finite field and through Z3, does not import it. Layout ops (data
movement) keep their one meaning for every array domain in :mod:`.ops`.

The float64 evaluator and the verifier hold every value of a program (and, for a block graph, every block's
tiles at once) in memory: :func:`check_evaluable` bounds each such array by :data:`MAX_EVAL_ELEMENTS` elements
before anything is allocated (``vm.evaluate``, ``vm.verify`` and ``vm.superoptimize`` call it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .errors import GraphError
from .graph import BlockGraph, Graph, ThreadGraph, node_list
from .interpret import run, whole_tiles
from .ops import OPS, TensorType, implements, neg_axis

_GELU_C = math.sqrt(2.0 / math.pi)

#: Largest number of elements of one array the float64 evaluator or the verifier holds: 2**30
#: (8 GiB as float64; the largest full-size suite tensor has 2**26).
MAX_EVAL_ELEMENTS = 2**30


def _arrays(program: Any) -> Iterator[tuple[int, str, int, TensorType, int]]:
    """``(elements, scope, node, type, blocks)`` of every array evaluating ``program`` holds: kernel-level values
    their own elements; a custom kernel's block-graph values every block's tile (the evaluator runs the blocks of a
    grid as one batch) and each block input's operand zero-padded to whole tiles (a masked tail's ``ceil(n / blocks)``
    tiles, over a for-loop's iterations too, may hold far more than the operand), thread-graph values likewise."""

    def walk(nodes: Any, blocks: int, prefix: str,
             bg: BlockGraph | None = None) -> Iterator[tuple[int, str, int, TensorType, int]]:
        for i, node in enumerate(nodes):
            for t in node.outs:
                yield blocks * math.prod(t.shape), prefix, i, t, blocks
            if bg is not None and node.op == "input":  # (its operand zero-padded to whole tiles: ``interpret.fit``)
                t = node.outs[0]
                whole = whole_tiles(t.shape, (*node.attr("imap"), node.attr("fmap")), (*bg.grid, bg.frange))
                if whole != tuple(node.attr("shape")):
                    yield math.prod(whole), prefix, i, TensorType(whole, t.dtype), 1
            for _, v in node.attrs:
                if isinstance(v, BlockGraph):
                    yield from walk(v.nodes, blocks * math.prod(v.grid), f"{prefix}%{i}/", v)
                elif isinstance(v, ThreadGraph):
                    yield from walk(v.nodes, blocks, f"{prefix}%{i}/")

    return walk(node_list(program), 1, "")


def check_evaluable(program: Any, what: str) -> None:
    """GraphError unless every array evaluating ``program`` needs has at most :data:`MAX_EVAL_ELEMENTS`
    (:func:`_arrays`)."""
    for n, prefix, i, t, blocks in _arrays(program):
        if n > MAX_EVAL_ELEMENTS:
            where = f"value {prefix}%{i} ({t} x {blocks} block(s))" if blocks > 1 else f"value {prefix}%{i} ({t})"
            raise GraphError(f"{what}: {where} needs {n} elements; the evaluator and the verifier hold at most "
                             f"{MAX_EVAL_ELEMENTS} (2**30) elements per array (verimirage.ir.reference)")


def evaluation_elements(program: Any) -> int:
    """The elements of all the arrays evaluating ``program`` holds (:func:`_arrays`): a bound on what its evaluation
    keeps in memory at once (a finite-field trial: 16 bytes an element)."""
    return sum(a[0] for a in _arrays(program))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's ``approximate="tanh"``) as ``x sigmoid(2 z)``: ``1 + tanh z`` cancels."""
    return x * sigmoid(2.0 * _GELU_C * (x + 0.044715 * x**3))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e**-x), without overflow (e**-|x| <= 1) or cancellation (``1 + tanh(x / 2)`` at x < -10)."""
    return np.where(np.asarray(x) >= 0, 1.0, np.exp(-np.abs(x))) / (1.0 + np.exp(-np.abs(x)))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x), without overflow warnings."""
    return x * sigmoid(x)


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, elementwise (float64)."""
    return np.asarray(_ERF(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + e**x), stable for large |x| (torch's threshold of 20 changes it by < 1e-8)."""
    return np.logaddexp(0.0, x)


def batched_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` with broadcast batch dims; stacks of small products avoid BLAS.

    numpy's stacked ``matmul`` makes one BLAS call per matrix, and a threaded
    OpenBLAS on a small machine spends ~30 ms per call waking its threads
    (measured: 128 products of 64x64 by 64x128 in 3.4 s, vs 0.04 s here).
    """
    if a.ndim <= 2 and b.ndim <= 2:
        return np.matmul(a, b)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    nb = math.prod(batch)
    if nb == 1:
        return np.matmul(a, b)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if m * k * n < 1 << 21:
        return np.einsum("...ij,...jk->...ik", a, b, optimize=True)
    # large products: one BLAS call each
    aa = np.broadcast_to(a, (*batch, m, k)).reshape(nb, m, k)
    bb = np.broadcast_to(b, (*batch, k, n)).reshape(nb, k, n)
    out = np.empty((nb, m, n), dtype=np.result_type(a, b))
    for i in range(nb):
        np.matmul(aa[i], bb[i], out=out[i])
    return out.reshape((*batch, m, n))


#: elementwise ops: the numpy function of the operands and the attributes
_ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "exp": lambda x, at: np.exp(x),
    "silu": lambda x, at: silu(x),
    "gelu": lambda x, at: gelu_tanh(x),
    "relu": lambda x, at: np.maximum(x, 0.0),
    "sqrt": lambda x, at: np.sqrt(x),
    "rsqrt": lambda x, at: 1.0 / np.sqrt(x),
    "square": lambda x, at: np.square(x),
    "neg": lambda x, at: np.negative(x),
    "log": lambda x, at: np.log(x),
    "tanh": lambda x, at: np.tanh(x),
    "sigmoid": lambda x, at: sigmoid(x),
    "erf": lambda x, at: erf(x),
    "softplus": lambda x, at: softplus(x),
    "abs": lambda x, at: np.abs(x),
    "sin": lambda x, at: np.sin(x),
    "cos": lambda x, at: np.cos(x),
    "reciprocal": lambda x, at: 1.0 / x,
    "cast": lambda x, at: x,  # the real-valued meaning of a rounding
    "scale": lambda x, at: x * float(at["c"]),
    "shift": lambda x, at: x + float(at["c"]),
    "pow": lambda x, at: 1.0 / np.sqrt(x) if float(at["c"]) == -0.5 else np.power(x, float(at["c"])),  # (as rsqrt)
    "clamp": lambda x, at: np.clip(x, float(at["lo"]), float(at["hi"])),
    "leaky_relu": lambda x, at: np.where(x >= 0, x, x * float(at["slope"])),
    "step": lambda x, at: (x > float(at["c"])).astype(x.dtype),
    "greater": lambda x, at: (x > float(at["c"])).astype(x.dtype),  # (read as a mask: nonzero is true)
    "add": lambda a, b, at: np.add(a, b),
    "sub": lambda a, b, at: np.subtract(a, b),
    "mul": lambda a, b, at: np.multiply(a, b),
    "div": lambda a, b, at: np.divide(a, b),
    "maximum": lambda a, b, at: np.maximum(a, b),
    "minimum": lambda a, b, at: np.minimum(a, b),
    "where": lambda m, a, b, at: np.where(m != 0, a, b),
}


def _elementwise(f: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def fn(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            return f(*args, attrs)

    return fn


for _name, _f in _ELEMENTWISE.items():
    implements("ref", _name)(_elementwise(_f))


def _reduction(f: Callable[..., Any]) -> Callable[..., np.ndarray]:
    def fn(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
        return f(args[0], axis=neg_axis(attrs["axis"], in_types[0].rank), keepdims=True)

    return fn


_REDUCTIONS: dict[str, Callable[..., Any]] = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}
for _name, _red in _REDUCTIONS.items():
    implements("ref", _name)(_reduction(_red))


@implements("ref", "matmul")
def _matmul(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    return batched_matmul(args[0], args[1])


@implements("ref", "rms_norm")
def _rms(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    x = args[0]
    ax = neg_axis(attrs["axis"], in_types[0].rank)
    y = x / np.sqrt(np.mean(x * x, axis=ax, keepdims=True) + attrs["eps"])
    if len(args) == 2:
        w = args[1]
        # weight (..., n) -> (..., n, 1, ..., 1) so it lines up with the normalised axis
        y = y * w.reshape(w.shape + (1,) * (-ax - 1))
    return y


@implements("ref", "concat")
def _concat(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    r = in_types[0].rank
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - r] for a in args))
    return np.concatenate([np.broadcast_to(a, batch + a.shape[a.ndim - r :]) for a in args],
                          axis=neg_axis(attrs["axis"], r))


@implements("ref", "transpose")
def _transpose(args: list[np.ndarray], attrs: dict[str, Any], in_types: Any, out_types: Any) -> np.ndarray:
    r = in_types[0].rank
    return np.swapaxes(args[0], neg_axis(attrs["a"], r), neg_axis(attrs["b"], r))


class RegistryDomain:
    """A domain whose op meanings are the registry's entries for ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def apply(
        self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType], out_type: TensorType
    ) -> Any:
        fn = OPS[op].domains.get(self.name)
        if fn is None:
            raise GraphError(f"op {op!r} has no meaning in the {self.name!r} domain")
        return fn(args, attrs, in_types, [out_type])


REF = RegistryDomain("ref")


def as_float64(x: Any, what: str) -> np.ndarray:
    """A numpy float64 copy of a numpy array or torch tensor."""
    complex_msg = f"input {what}: complex values; expected real numbers (nothing is dropped silently)"
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor, without importing torch
        if x.is_complex():
            raise GraphError(complex_msg)
        x = x.detach().cpu().double().numpy()
    try:
        if np.iscomplexobj(x):
            raise GraphError(complex_msg)
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError, AttributeError) as e:
        if isinstance(e, GraphError):
            raise
        raise GraphError(f"input {what}: cannot read {type(x).__name__} as a float64 array") from None


def check_inputs(g: Graph, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Inputs as float64 arrays keyed by name; GraphError for missing, extra or misshapen ones."""
    if not isinstance(inputs, Mapping):
        raise GraphError(f"inputs: expected a dict of name -> array, got {type(inputs).__name__}")
    names = {str(t.name): t for t in g.inputs}
    extra = sorted(set(inputs) - set(names))
    if extra:
        raise GraphError(f"inputs: unknown input(s) {extra}; the graph's inputs are {list(names)}")
    out = {}
    for name, t in names.items():
        if name not in inputs:
            raise GraphError(f"inputs: missing input {name!r} (expected shape {t.shape})")
        a = as_float64(inputs[name], repr(name))
        if a.shape != t.shape:
            raise GraphError(f"inputs: {name!r} has shape {a.shape}; expected {t.shape}")
        out[name] = a
    return out


def evaluate(g: Graph, inputs: Mapping[str, Any]) -> list[np.ndarray]:
    """The float64 reference result of ``g`` (a Graph or MuGraph): one array per output."""
    if not isinstance(g, Graph):
        raise GraphError(f"evaluate: expected a vm.Graph or vm.MuGraph, got {type(g).__name__}")
    g.check()
    check_evaluable(g, "evaluate")  # before anything is allocated
    vals = check_inputs(g, inputs)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        outs = run(g, vals, REF)
    return [np.ascontiguousarray(np.asarray(o, dtype=np.float64)) for o in outs]
