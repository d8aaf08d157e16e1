"""A second, independent meaning of kernel graphs, written with torch ops.

``vm.evaluate`` reads the op registry's numpy meanings. :func:`torch_evaluate`
walks the same nodes but computes each op with torch's own implementation
(``torch.matmul``, ``torch.nn.functional.gelu(approximate="tanh")``,
``torch.amax``, ...), in float64 or any torch dtype. Comparing the two on
random graphs checks the registry's reference semantics; with a low-precision
``compute_dtype`` it is also a plain, correct "kernel" for any graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs
from ..ir.ops import get_op, implements


def _t() -> Any:
    import torch

    return torch


def _torch_unary(f: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def fn(a: list[Any], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Any:
        return f(_t(), a[0])

    return fn


def _torch_binary(name: str) -> Callable[..., Any]:
    def fn(a: list[Any], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Any:
        return getattr(_t(), name)(a[0], a[1])

    return fn


for _name, _f in [
    ("exp", lambda t, x: t.exp(x)),
    ("silu", lambda t, x: t.nn.functional.silu(x)),
    ("gelu", lambda t, x: t.nn.functional.gelu(x, approximate="tanh")),
    ("relu", lambda t, x: t.relu(x)),
    ("sqrt", lambda t, x: t.sqrt(x)),
    ("rsqrt", lambda t, x: t.rsqrt(x)),
    ("square", lambda t, x: t.square(x)),
    ("neg", lambda t, x: t.neg(x)),
]:
    implements("torch", _name)(_torch_unary(_f))
for _name, _f in [
    ("log", lambda t, x: t.log(x)),
    ("tanh", lambda t, x: t.tanh(x)),
    ("sigmoid", lambda t, x: t.sigmoid(x)),
    ("erf", lambda t, x: t.erf(x)),
    ("softplus", lambda t, x: t.nn.functional.softplus(x)),
    ("abs", lambda t, x: t.abs(x)),
    ("sin", lambda t, x: t.sin(x)),
    ("cos", lambda t, x: t.cos(x)),
    ("reciprocal", lambda t, x: t.reciprocal(x)),
]:
    implements("torch", _name)(_torch_unary(_f))
implements("torch", "pow")(lambda a, attrs, it, ot: _t().pow(a[0], attrs["c"]))
implements("torch", "clamp")(lambda a, attrs, it, ot: _t().clamp(a[0], attrs["lo"], attrs["hi"]))
implements("torch", "step")(lambda a, attrs, it, ot: (a[0] > attrs["c"]).to(a[0].dtype))
implements("torch", "greater")(lambda a, attrs, it, ot: (a[0] > attrs["c"]).to(a[0].dtype))
implements("torch", "leaky_relu")(lambda a, attrs, it, ot: _t().nn.functional.leaky_relu(a[0], attrs["slope"]))
implements("torch", "where")(lambda a, attrs, it, ot: _t().where(a[0] != 0, a[1], a[2]))
implements("torch", "tril_mask")(lambda a, attrs, it, ot: _t().ones(  # (on the inputs' device: torch_evaluate)
    attrs["shape"][-2:], dtype=_t().float64, device=attrs.get("device")).tril(attrs["offset"]).expand(attrs["shape"]))


@implements("torch", "cast")
def _cast(a: list[Any], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Any:
    from ..ir.dtypes import DType

    return a[0].to(getattr(_t(), DType.parse(str(attrs["dtype"])).torch_name)).to(a[0].dtype)


implements("torch", "permute")(lambda a, attrs, it, ot: a[0].permute(*attrs["dims"]))
implements("torch", "reshape")(lambda a, attrs, it, ot: a[0].reshape(attrs["shape"]))
implements("torch", "broadcast_to")(lambda a, attrs, it, ot: a[0].broadcast_to(attrs["shape"]))
implements("torch", "slice")(lambda a, attrs, it, ot: a[0].narrow(attrs["axis"], attrs["start"],
                                                                    attrs["stop"] - attrs["start"]))
implements("torch", "min")(lambda a, attrs, it, ot: _t().amin(a[0], dim=attrs["axis"], keepdim=True))
for _name in ("add", "sub", "mul", "div", "maximum", "minimum"):
    implements("torch", _name)(_torch_binary(_name))
implements("torch", "scale")(lambda a, attrs, it, ot: a[0] * attrs["c"])
implements("torch", "shift")(lambda a, attrs, it, ot: a[0] + attrs["c"])
implements("torch", "sum")(lambda a, attrs, it, ot: _t().sum(a[0], dim=attrs["axis"], keepdim=True))
implements("torch", "mean")(lambda a, attrs, it, ot: _t().mean(a[0], dim=attrs["axis"], keepdim=True))
implements("torch", "max")(lambda a, attrs, it, ot: _t().amax(a[0], dim=attrs["axis"], keepdim=True))
implements("torch", "matmul")(lambda a, attrs, it, ot: _t().matmul(a[0], a[1]))
implements("torch", "concat")(lambda a, attrs, it, ot: _t().cat(a, dim=attrs["axis"]))
implements("torch", "transpose")(lambda a, attrs, it, ot: _t().transpose(a[0], attrs["a"], attrs["b"]))


@implements("torch", "rms_norm")
def _rms_norm(a: list[Any], attrs: dict[str, Any], in_types: Any, out_types: Any) -> Any:
    torch = _t()
    x = a[0]
    ax = attrs["axis"]
    y = x * torch.rsqrt(torch.mean(x * x, dim=ax, keepdim=True) + attrs["eps"])
    if len(a) == 2:
        shape = [1] * x.dim()
        shape[ax] = x.shape[ax]
        y = y * a[1].reshape(shape)
    return y


def _op(op: str, a: list[Any], attrs: dict[str, Any], in_types: list[Any], out_type: Any) -> Any:
    fn = get_op(op).domains.get("torch")
    if fn is None:
        raise GraphError(f"torch_evaluate: op {op!r} is not a kernel-graph op (custom kernels are not supported)")
    return fn(a, attrs, in_types, [out_type])


def torch_evaluate(g: Graph, inputs: Mapping[str, Any], *, compute_dtype: Any = None) -> list[Any]:
    """``g`` computed op by op with torch, in ``compute_dtype`` (default ``torch.float64``).

    Returns one torch tensor per output, in ``compute_dtype``.
    """
    import torch

    cd = torch.float64 if compute_dtype is None else compute_dtype
    nodes = node_list(g)
    env: dict[int, Any] = {}
    dev = next((v.device for v in inputs.values() if isinstance(v, torch.Tensor)), None)
    for i, n in enumerate(nodes):
        if n.op == "input":
            name = n.attr("name")
            if name not in inputs:
                raise GraphError(f"torch_evaluate: missing input {name!r}")
            env[i] = torch.as_tensor(inputs[name]).to(cd)
        else:
            in_types = [nodes[a].outs[k] for a, k in n.args]
            attrs = n.attr_dict if n.args else {**n.attr_dict, "device": dev}  # (a constant: made on that device)
            env[i] = _op(n.op, [env[a] for a, _ in n.args], attrs, in_types, n.outs[0])
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
