"""``torch.compile(model, backend="verimirage")``.

The backend receives an FX graph from TorchDynamo, finds the maximal
subgraphs made of ops the registry knows (matmul, elementwise ops, keepdim
reductions, rms_norm, concat, transpose, scaling by constants), turns each
into a ``vm.Graph``, superoptimizes it and replaces it with the compiled,
verified kernels. Everything else stays with PyTorch: an unsupported op is a
graph break, never an error. Registered under the entry point group
``torch_dynamo_backends`` (name ``verimirage``) and also on import of this
module.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.shape_prop import ShapeProp

from ..ir.dtypes import DType
from ..ir.errors import GraphError
from ..ir.graph import Graph, Tensor

log = logging.getLogger(__name__)

F = torch.nn.functional

_DTYPES = {torch.float16: DType.float16, torch.bfloat16: DType.bfloat16, torch.float32: DType.float32}

_UNARY: dict[Any, str] = {
    torch.exp: "exp",
    F.silu: "silu",
    torch.relu: "relu",
    F.relu: "relu",
    torch.sqrt: "sqrt",
    torch.rsqrt: "rsqrt",
    torch.square: "square",
    torch.neg: "neg",
    operator.neg: "neg",
}
_BINARY: dict[Any, str] = {
    torch.matmul: "matmul",
    operator.matmul: "matmul",
    torch.add: "add",
    operator.add: "add",
    torch.sub: "sub",
    operator.sub: "sub",
    torch.mul: "mul",
    operator.mul: "mul",
    torch.div: "div",
    operator.truediv: "div",
}
_METHODS_UNARY = {"exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt", "relu": "relu", "neg": "neg", "square": "square"}
_METHODS_BINARY = {"matmul": "matmul", "add": "add", "sub": "sub", "mul": "mul", "div": "div"}
_REDUCE_FN = {torch.sum: "sum", torch.mean: "mean", torch.amax: "max"}
_REDUCE_METHOD = {"sum": "sum", "mean": "mean", "amax": "max"}


def _meta(n: Any) -> Any:
    return n.meta.get("tensor_meta") if isinstance(n, fx.Node) else None


def _is_tensor(n: Any) -> bool:
    m = _meta(n)
    return m is not None and getattr(m, "dtype", None) in _DTYPES


def _is_number(x: Any) -> TypeGuard[int | float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _reduce_args(n: fx.Node) -> tuple[Any, int] | None:
    """(input, axis) of a keepdim reduction over one axis, else None."""
    args, kw = list(n.args), dict(n.kwargs)
    x = args[0] if args else kw.get("input")
    dim = args[1] if len(args) > 1 else kw.get("dim")
    keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
    if isinstance(dim, (list, tuple)) and len(dim) == 1:
        dim = dim[0]
    if not isinstance(dim, int) or keep is not True or kw.get("dtype") is not None:
        return None
    return x, dim


def _classify(n: fx.Node) -> tuple[str, list[Any], dict[str, Any]] | None:
    """The registry op an FX node computes, with its operands and attributes; None if unsupported."""
    if n.op not in ("call_function", "call_method") or not _is_tensor(n):
        return None
    t, args, kw = n.target, list(n.args), dict(n.kwargs)
    if n.op == "call_method":
        if t in _METHODS_UNARY and len(args) == 1 and not kw:
            return _METHODS_UNARY[t], args, {}
        if t in _METHODS_BINARY and len(args) == 2 and not kw:
            return _binary(_METHODS_BINARY[t], args)
        if t in _REDUCE_METHOD:
            r = _reduce_args(n)
            return (_REDUCE_METHOD[t], [r[0]], {"axis": r[1]}) if r else None
        if t == "transpose" and len(args) == 3 and not kw:
            return "transpose", [args[0]], {"a": args[1], "b": args[2]}
        return None
    if t in _UNARY and len(args) == 1 and not kw:
        return _UNARY[t], args, {}
    if t is F.gelu and len(args) == 1 and kw == {"approximate": "tanh"}:
        return "gelu", args, {}
    if t in _BINARY and len(args) == 2 and not kw:
        return _binary(_BINARY[t], args)
    if t in _REDUCE_FN:
        r = _reduce_args(n)
        return (_REDUCE_FN[t], [r[0]], {"axis": r[1]}) if r else None
    if t is torch.transpose and len(args) == 3 and not kw:
        return "transpose", [args[0]], {"a": args[1], "b": args[2]}
    if t is torch.cat:
        xs = args[0] if args else kw.get("tensors")
        dim = args[1] if len(args) > 1 else kw.get("dim", 0)
        if isinstance(xs, (list, tuple)) and all(_is_tensor(x) for x in xs) and isinstance(dim, int):
            return "concat", list(xs), {"axis": dim}
    if t is F.rms_norm:
        x, shape = args[0], args[1] if len(args) > 1 else kw.get("normalized_shape")
        w = args[2] if len(args) > 2 else kw.get("weight")
        eps = args[3] if len(args) > 3 else kw.get("eps")
        if isinstance(shape, (list, tuple)) and len(shape) == 1 and _is_number(eps):
            return "rms_norm", [x] if w is None else [x, w], {"axis": -1, "eps": float(eps)}
    return None


def _binary(op: str, args: list[Any]) -> tuple[str, list[Any], dict[str, Any]] | None:
    a, b = args
    if _is_tensor(a) and _is_tensor(b):
        return op, [a, b], {}
    # tensor (op) Python number -> scale / shift
    if op in ("mul", "div", "add", "sub") and _is_tensor(a) and _is_number(b) and (op != "div" or b != 0):
        c = float(b)
        # x / c becomes x * fl(1/c): equal in real arithmetic, within an ulp in floating point
        kind, const = {"mul": ("scale", c), "div": ("scale", 1.0 / c), "add": ("shift", c), "sub": ("shift", -c)}[op]
        return kind, [a], {"c": const}
    if op in ("mul", "add") and _is_number(a) and _is_tensor(b):
        return ("scale" if op == "mul" else "shift"), [b], {"c": float(a)}
    return None


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return _classify(node) is not None


def fx_to_graph(gm: fx.GraphModule) -> tuple[Graph, list[str]]:
    """A ``vm.Graph`` computing ``gm`` (a partition made of supported ops), and its input names in order."""
    g = Graph()
    env: dict[fx.Node, Tensor] = {}
    names: list[str] = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            m = _meta(n)
            if m is None or m.dtype not in _DTYPES:
                raise GraphError(f"input {n.name}: dtype {getattr(m, 'dtype', None)} is not supported")
            name = f"in{len(names)}"
            env[n] = g.input(name, tuple(int(s) for s in m.shape), _DTYPES[m.dtype])
            names.append(name)
        elif n.op in ("call_function", "call_method"):
            c = _classify(n)
            if c is None:
                raise GraphError(f"unsupported FX node {n.format_node()}")
            op, operands, attrs = c
            xs = [env[x] for x in operands]
            if op == "concat":
                env[n] = g.concat(xs, **attrs)
            elif op == "rms_norm":
                env[n] = g.rms_norm(xs[0], xs[1] if len(xs) > 1 else None, **attrs)
            else:
                env[n] = getattr(g, op)(*xs, **attrs)
        elif n.op == "output":
            outs = n.args[0]
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            g.output(*[env[o] for o in outs])
    return g, names


def _compile_partition(sub: fx.GraphModule, cuda_graph: bool = False) -> Callable[..., Any]:
    import verimirage as vm

    g, _ = fx_to_graph(sub)
    res = vm.superoptimize(g)
    if not res.candidates:
        log.warning("verimirage: no verified candidate for a partition; it stays with PyTorch")
        return sub
    fn = vm.compile(res.best, cuda_graph=cuda_graph)
    single = len(g.outputs) == 1
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    as_tuple = isinstance(out_node.args[0], (list, tuple))

    def run(*args: Any) -> Any:
        out = fn(*args)
        if cuda_graph:  # the graph's static outputs are overwritten by the next replay: hand out copies
            out = tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()
        if single and as_tuple:
            return (out,)
        return out

    return run


#: torch.compile modes this backend accepts; those with CUDA graphs replay each partition as one graph
_MODES = {None: False, "default": False, "reduce-overhead": True, "max-autotune": True,
          "max-autotune-no-cudagraphs": False}


def verimirage_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                       options: Any = None) -> Callable[..., Any]:
    """TorchDynamo backend: superoptimize the supported subgraphs of ``gm``; the rest runs in PyTorch.

    ``torch.compile(..., backend="verimirage", mode="reduce-overhead")`` (or ``"max-autotune"``) compiles
    each partition with ``vm.compile(..., cuda_graph=True)``: its kernels are replayed as one CUDA graph
    (inputs copied into the graph's static buffers), and its outputs are copied out of the graph's buffers
    so that nothing the model returns is overwritten by a later call. Without a GPU (Triton's interpreter)
    the partitions run without graphs.
    """
    if mode not in _MODES:
        raise ValueError(f"verimirage backend: mode={mode!r}; expected one of {sorted(m for m in _MODES if m)}")
    if options:
        raise ValueError(f"verimirage backend: takes no options; got {options!r}")
    from ..backend.runtime import ensure_mode

    graphs = _MODES[mode] and not ensure_mode()
    fake = any(type(x).__name__ == "FakeTensor" for x in example_inputs)
    if not fake:
        ShapeProp(gm).propagate(*example_inputs)
    else:  # pragma: no cover - dynamo normally hands real example inputs to backends
        for n in gm.graph.nodes:
            ev = n.meta.get("example_value")
            if isinstance(ev, torch.Tensor):
                from torch.fx.passes.shape_prop import _extract_tensor_metadata

                n.meta["tensor_meta"] = _extract_tensor_metadata(ev)
    parts = CapabilityBasedPartitioner(gm, _Support(), allows_single_node_partition=True).propose_partitions()
    if not parts:
        return gm.forward
    fused = CapabilityBasedPartitioner(gm, _Support()).fuse_partitions(parts)
    for n in list(fused.graph.nodes):
        if n.op == "call_module" and n.target.startswith("fused_"):
            sub = getattr(fused, n.target)
            try:
                setattr(fused, n.target, _Wrapped(_compile_partition(sub, cuda_graph=graphs)))
            except GraphError as e:
                log.warning("verimirage: partition %s stays with PyTorch: %s", n.target, e)
    fused.recompile()
    return fused.forward


class _Wrapped(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def register() -> None:
    """Make ``backend="verimirage"`` available to torch.compile (the entry point does this too)."""
    from torch._dynamo import list_backends, register_backend

    if "verimirage" not in list_backends(exclude_tags=()):
        register_backend(name="verimirage")(verimirage_backend)


register()
