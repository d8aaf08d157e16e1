"""The IR: op registry, kernel/block/thread graphs, checks, text/JSON, the evaluator.

Imports neither torch nor triton.
"""

from .dtypes import DType, bfloat16, bool_, float16, float32
from .errors import GraphError
from .graph import (
    BlockBuilder,
    BlockGraph,
    Graph,
    MuGraph,
    Node,
    OutputMap,
    Ref,
    Tensor,
    ThreadBuilder,
    ThreadGraph,
    node_list,
    output_refs,
)
from .interpret import Domain, evaluate, run
from .ops import OPS, OpDef, Prop, TensorType, implements

__all__ = [
    "OPS",
    "BlockBuilder",
    "BlockGraph",
    "DType",
    "Domain",
    "Graph",
    "GraphError",
    "MuGraph",
    "Node",
    "OpDef",
    "OutputMap",
    "Prop",
    "Ref",
    "Tensor",
    "TensorType",
    "ThreadBuilder",
    "ThreadGraph",
    "bfloat16",
    "bool_",
    "evaluate",
    "float16",
    "float32",
    "implements",
    "node_list",
    "output_refs",
    "run",
]
