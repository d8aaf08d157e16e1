"""A second, independent meaning of kernel graphs, written with torch ops.

``vm.evaluate`` reads the op registry's numpy meanings. :func:`torch_evaluate`
walks the same nodes but computes each op with torch's own implementation
(``torch.matmul``, ``torch.nn.functional.gelu(approximate="tanh")``,
``torch.amax``, ...), in float64 or any torch dtype. Comparing the two on
random graphs checks the registry's reference semantics; with a low-precision
``compute_dtype`` it is also a plain, correct "kernel" for any graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs


def _op(torch: Any, op: str, a: list[Any], attrs: dict[str, Any]) -> Any:
    F = torch.nn.functional
    if op == "matmul":
        return torch.matmul(a[0], a[1])
    if op in ("add", "sub", "mul", "div", "maximum"):
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "maximum": torch.maximum}[op](
            a[0], a[1]
        )
    if op == "exp":
        return torch.exp(a[0])
    if op == "silu":
        return F.silu(a[0])
    if op == "gelu":
        return F.gelu(a[0], approximate="tanh")
    if op == "relu":
        return torch.relu(a[0])
    if op == "sqrt":
        return torch.sqrt(a[0])
    if op == "rsqrt":
        return torch.rsqrt(a[0])
    if op == "square":
        return torch.square(a[0])
    if op == "neg":
        return torch.neg(a[0])
    if op == "scale":
        return a[0] * attrs["c"]
    if op == "shift":
        return a[0] + attrs["c"]
    if op == "sum":
        return torch.sum(a[0], dim=attrs["axis"], keepdim=True)
    if op == "mean":
        return torch.mean(a[0], dim=attrs["axis"], keepdim=True)
    if op == "max":
        return torch.amax(a[0], dim=attrs["axis"], keepdim=True)
    if op == "rms_norm":
        x = a[0]
        ax = attrs["axis"]
        y = x * torch.rsqrt(torch.mean(x * x, dim=ax, keepdim=True) + attrs["eps"])
        if len(a) == 2:
            shape = [1] * x.dim()
            shape[ax] = x.shape[ax]
            y = y * a[1].reshape(shape)
        return y
    if op == "concat":
        return torch.cat(a, dim=attrs["axis"])
    if op == "transpose":
        return torch.transpose(a[0], attrs["a"], attrs["b"])
    raise GraphError(f"torch_evaluate: op {op!r} is not a kernel-graph op (custom kernels are not supported)")


def torch_evaluate(g: Graph, inputs: Mapping[str, Any], *, compute_dtype: Any = None) -> list[Any]:
    """``g`` computed op by op with torch, in ``compute_dtype`` (default ``torch.float64``).

    Returns one torch tensor per output, in ``compute_dtype``.
    """
    import torch

    cd = torch.float64 if compute_dtype is None else compute_dtype
    nodes = node_list(g)
    env: dict[int, Any] = {}
    for i, n in enumerate(nodes):
        if n.op == "input":
            name = n.attr("name")
            if name not in inputs:
                raise GraphError(f"torch_evaluate: missing input {name!r}")
            env[i] = torch.as_tensor(inputs[name]).to(cd)
        else:
            env[i] = _op(torch, n.op, [env[a] for a, _ in n.args], n.attr_dict)
    return [env[a] for a, _ in output_refs(g)]


def torch_kernel(g: Graph, *, compute_dtype: Any = None) -> Any:
    """A callable on torch tensors (in the graph's input order) computing ``g`` with torch ops.

    It computes in ``compute_dtype`` (default float32) and returns tensors of
    the graph's output dtypes: a correct, unfused kernel for any graph.
    """
    import torch

    cd = torch.float32 if compute_dtype is None else compute_dtype
    names = g.input_names()
    out_dtypes = [getattr(torch, t.dtype.torch_name) for t in g.outputs]

    def run(*args: Any) -> Any:
        outs = torch_evaluate(g, dict(zip(names, args, strict=True)), compute_dtype=cd)
        res = tuple(o.to(dt) for o, dt in zip(outs, out_dtypes, strict=True))
        return res[0] if len(res) == 1 else res

    return run
