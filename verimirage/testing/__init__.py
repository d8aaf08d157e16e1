"""Property-based testing of kernels (API.md "Property-based tests").

* :func:`inputs` — a hypothesis strategy of input dicts for a graph (value
  regimes, non-contiguous layouts);
* :func:`graphs` — a strategy of random well-formed kernel graphs, to fuzz
  verimirage itself;
* :func:`write_tests` — a standalone pytest + hypothesis module checking a
  kernel against the float64 reference and the metamorphic properties the
  graph implies;
* :func:`torch_evaluate` / :func:`torch_kernel` — an independent torch
  meaning of kernel graphs (and a plain correct kernel for any graph);
* :func:`analyze`, :func:`tolerances`, :mod:`.checks` — the pieces the
  generated modules use.

Importing this package imports hypothesis and numpy, not torch (torch loads
when tensors are drawn).
"""

from __future__ import annotations

from .analysis import BatchDim, GraphFacts, ScalingProperty, ShiftPlan, SoftmaxSite, analyze
from .checks import Tolerance, assert_close, error_ratio, tolerances
from .kernels import kernel_ref, load_kernel
from .runner import run_pytest
from .strategies import (
    GRAPH_OPS,
    LAYOUTS,
    REGIMES,
    Inputs,
    applicable_regimes,
    decode_inputs,
    encode_inputs,
    graphs,
    inputs,
    make_inputs,
)
from .torch_ref import torch_evaluate, torch_kernel
from .writer import WrittenTests, write_tests

__all__ = [
    "GRAPH_OPS",
    "LAYOUTS",
    "REGIMES",
    "BatchDim",
    "GraphFacts",
    "Inputs",
    "ScalingProperty",
    "ShiftPlan",
    "SoftmaxSite",
    "Tolerance",
    "WrittenTests",
    "analyze",
    "applicable_regimes",
    "assert_close",
    "decode_inputs",
    "encode_inputs",
    "error_ratio",
    "graphs",
    "inputs",
    "kernel_ref",
    "load_kernel",
    "make_inputs",
    "run_pytest",
    "tolerances",
    "torch_evaluate",
    "torch_kernel",
    "write_tests",
]
