"""A kernel graph as PyTorch eager code: the eager and torch.compile baselines of the harness.

``torch_fn(g)`` returns a function of the graph's inputs (positional, in input
order) that runs the program op by op with PyTorch — exactly the program the
user wrote, so it is the natural eager baseline, and ``torch.compile`` of it is
the Inductor baseline. It also gives a float64 reference on the GPU when
called on float64 tensors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from verimirage.ir.graph import Graph, node_list
from verimirage.testing.torch_ref import torch_evaluate


def torch_fn(g: Graph) -> Callable[..., Any]:
    """PyTorch eager implementation of kernel graph ``g`` (inputs positional, in order), in the inputs' dtype."""
    names = g.input_names()

    def fn(*inputs: torch.Tensor) -> Any:
        res = torch_evaluate(g, dict(zip(names, inputs, strict=True)), compute_dtype=inputs[0].dtype)
        return res[0] if len(res) == 1 else tuple(res)

    return fn


def rel_err(out: Any, ref: Any) -> float:
    """Worst ||out - ref|| / ||ref|| over the outputs (tensor or tuple); inf if anything is not finite."""
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        o64 = o.double()
        if not torch.isfinite(o64).all():
            return math.inf
        worst = max(worst, float(torch.linalg.norm(o64 - r) / torch.linalg.norm(r)))
    return worst


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
