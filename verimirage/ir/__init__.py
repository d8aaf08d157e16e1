"""The IR: op registry, kernel/block/thread graphs, checks, text/JSON, the evaluator.

Imports neither torch nor triton. The builders (:mod:`.builders`: ``Tensor``, the block and thread
builders) and the float64 reference (:mod:`.reference`, with ``evaluate``) load on first use of their
names, so the certificate checker, which imports this package, does not load them.
"""

from typing import Any

from .dtypes import DType, bfloat16, bool_, float16, float32
from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, OutputMap, Ref, ThreadGraph, node_list, output_refs
from .interpret import Domain, run
from .ops import OPS, OpDef, Prop, TensorType, implements

__all__ = ["OPS", "BlockBuilder", "BlockGraph", "DType", "Domain", "Graph", "GraphError", "MuGraph", "Node", "OpDef",
           "OutputMap", "Prop", "Ref", "Tensor", "TensorType", "ThreadBuilder", "ThreadGraph", "bfloat16", "bool_",
           "evaluate", "float16", "float32", "implements", "node_list", "output_refs", "run"]


def __getattr__(name: str) -> Any:
    if name in ("BlockBuilder", "Tensor", "ThreadBuilder"):
        from . import builders

        return getattr(builders, name)
    if name == "evaluate":
        from .reference import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
