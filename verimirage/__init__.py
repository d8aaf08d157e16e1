"""verimirage: a verified superoptimizer for tensor programs.

The public names are those of API.md. Importing this package is cheap: it
imports the IR (numpy only); verification (z3), search (egglog) and the
backend (torch, triton) load on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import Any

from .ir import BlockBuilder, BlockGraph, Graph, GraphError, MuGraph, TensorType, ThreadBuilder, ThreadGraph
from .ir.dtypes import DType, bfloat16, float16, float32
from .ir.dtypes import bool_ as bool
from .ir.interpret import evaluate

__version__ = "0.1.0"

# name -> (module, attribute); loaded on first access
_LAZY: dict[str, tuple[str, str]] = {
    "Verdict": ("verimirage.smt.verdict", "Verdict"),
    "Proved": ("verimirage.smt.verdict", "Proved"),
    "Refuted": ("verimirage.smt.verdict", "Refuted"),
    "Unknown": ("verimirage.smt.verdict", "Unknown"),
    "verify": ("verimirage.smt.verify", "verify"),
    "Certificate": ("verimirage.smt.certificate", "Certificate"),
    "check_certificate": ("verimirage.smt.certificate", "check_certificate"),
    "superoptimize": ("verimirage.pipeline.superopt", "superoptimize"),
    "Candidate": ("verimirage.pipeline.superopt", "Candidate"),
    "SearchResult": ("verimirage.pipeline.superopt", "SearchResult"),
    "compile": ("verimirage.backend.runtime", "compile"),
    "explain": ("verimirage.integrations.dynamo", "explain"),
    "benchmarks": ("verimirage.benchmarks", ""),
    "testing": ("verimirage.testing", ""),
    "rules": ("verimirage.rules", ""),
}

__all__ = [
    "BlockBuilder",
    "BlockGraph",
    "DType",
    "Graph",
    "GraphError",
    "MuGraph",
    "TensorType",
    "ThreadBuilder",
    "ThreadGraph",
    "bfloat16",
    "bool",
    "evaluate",
    "float16",
    "float32",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'verimirage' has no attribute {name!r}") from None
    m = importlib.import_module(mod)
    value = getattr(m, attr) if attr else m
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
