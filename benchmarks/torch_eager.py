"""A kernel graph as PyTorch eager code: the eager and torch.compile baselines of the harness.

``torch_fn(g)`` returns a function of the graph's inputs (positional, in input
order) that runs the program op by op with PyTorch — exactly the program the
user wrote, so it is the natural eager baseline, and ``torch.compile`` of it is
the Inductor baseline. It also gives a float64 reference on the GPU when
called on float64 tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verimirage.ir.graph import Graph, node_list, output_refs

F = torch.nn.functional


def _rms(x: torch.Tensor, w: torch.Tensor | None, axis: int, eps: float) -> torch.Tensor:
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x  # accumulate halves in fp32
    y = x * torch.rsqrt(xf.square().mean(axis, keepdim=True).to(x.dtype) + eps)
    if w is not None:
        y = y * w.reshape(w.shape + (1,) * (x.dim() - 1 - axis))
    return y


def _apply(op: str, a: list[torch.Tensor], at: dict[str, Any]) -> torch.Tensor:
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
        return a[0] * at["c"]
    if op == "shift":
        return a[0] + at["c"]
    if op == "sum":
        return a[0].sum(at["axis"], keepdim=True)
    if op == "mean":
        return a[0].mean(at["axis"], keepdim=True)
    if op == "max":
        return a[0].amax(at["axis"], keepdim=True)
    if op == "rms_norm":
        return _rms(a[0], a[1] if len(a) > 1 else None, at["axis"], at["eps"])
    if op == "concat":
        return torch.cat(a, at["axis"])
    if op == "transpose":
        return a[0].transpose(at["a"], at["b"])
    raise ValueError(f"torch_eager: op {op!r} is not a kernel-graph op")


def torch_fn(g: Graph) -> Callable[..., Any]:
    """PyTorch eager implementation of kernel graph ``g`` (inputs positional, in order)."""
    nodes = list(node_list(g))
    outs = list(output_refs(g))

    def fn(*inputs: torch.Tensor) -> Any:
        env: dict[int, torch.Tensor] = {}
        it = iter(inputs)
        for i, n in enumerate(nodes):
            if n.op == "input":
                env[i] = next(it)
            else:
                env[i] = _apply(n.op, [env[a] for a, _ in n.args], n.attr_dict)
        res = tuple(env[a] for a, _ in outs)
        return res[0] if len(res) == 1 else res

    return fn


def flops(g: Graph) -> float:
    """Floating-point operations of the matmuls of ``g`` (2 per multiply-add)."""
    total = 0.0
    for n in node_list(g):
        if n.op == "matmul":
            k = g.type_of(n.args[0]).shape[-1]
            total += 2.0 * n.outs[0].numel * k
    return total


def min_bytes(g: Graph) -> float:
    """Fewest bytes a kernel must move: every input read once, every output written once."""
    ins = sum(t.type.numel * t.dtype.itemsize for t in g.inputs)
    outs = sum(t.type.numel * t.dtype.itemsize for t in g.outputs)
    return float(ins + outs)
