"""The IR: op registry, kernel/block/thread graphs, checks, text/JSON, the evaluator.

Imports neither torch nor triton. Importing this package imports the op facts (:mod:`.opfacts`, which it puts on
:class:`OpDef`) and the builders (:mod:`.builders`: ``Tensor``, the block and thread builders, and the methods that
build graphs, which it puts on the graph classes); the float64 reference (:mod:`.reference`, with ``evaluate``)
loads on first use of its name. The certificate checker's process never runs this file (its packages are bare
modules, :mod:`verimirage.checkproc`): it imports the IR modules it reads programs with, not the builders.
"""

from typing import Any

from . import opfacts  # noqa: F401  (puts the op facts on OpDef)
from .builders import BlockBuilder, Tensor, ThreadBuilder
from .dtypes import DType, bfloat16, bool_, float16, float32
from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, OutputMap, Ref, ThreadGraph, node_list, output_refs
from .interpret import Domain, run
from .ops import OPS, OpDef, Prop, TensorType, implements

__all__ = ["OPS", "BlockBuilder", "BlockGraph", "DType", "Domain", "Graph", "GraphError", "MuGraph", "Node", "OpDef",
           "OutputMap", "Prop", "Ref", "Tensor", "TensorType", "ThreadBuilder", "ThreadGraph", "bfloat16", "bool_",
           "evaluate", "float16", "float32", "implements", "node_list", "output_refs", "run"]


def __getattr__(name: str) -> Any:
    if name == "evaluate":
        from .reference import evaluate

        return evaluate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
