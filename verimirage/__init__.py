"""verimirage: a verified superoptimizer for tensor programs.

The public names are those of API.md. Importing this package is cheap (no numpy): every name loads
on first use, the IR (numpy) with ``vm.Graph`` and the like, verification (z3), search (egglog) and the
backend (torch, triton) with theirs. So ``verimirage check-cert`` starts its checker process before the
heavy imports.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (the names below, for type checkers; at run time they load on first use)
    from .ir import BlockGraph as BlockGraph
    from .ir import Graph as Graph
    from .ir import GraphError as GraphError
    from .ir import MuGraph as MuGraph
    from .ir import TensorType as TensorType
    from .ir import ThreadGraph as ThreadGraph
    from .ir.builders import BlockBuilder as BlockBuilder
    from .ir.builders import ThreadBuilder as ThreadBuilder
    from .ir.dtypes import DType as DType
    from .ir.dtypes import bfloat16 as bfloat16
    from .ir.dtypes import bool_ as bool  # noqa: F401
    from .ir.dtypes import float16 as float16
    from .ir.dtypes import float32 as float32
    from .ir.reference import evaluate as evaluate

__version__ = "0.1.0"

# name -> (module, attribute); loaded on first access
_LAZY: dict[str, tuple[str, str]] = {
    **{n: ("verimirage.ir", n) for n in ("BlockBuilder", "BlockGraph", "Graph", "GraphError", "MuGraph", "TensorType",
                                         "ThreadBuilder", "ThreadGraph")},
    **{n: ("verimirage.ir.dtypes", n) for n in ("DType", "bfloat16", "float16", "float32")},
    "bool": ("verimirage.ir.dtypes", "bool_"),
    "evaluate": ("verimirage.ir.reference", "evaluate"),
    **{n: ("verimirage.smt.verdict", n) for n in ("Verdict", "Proved", "Refuted", "Unknown")},
    "verify": ("verimirage.smt.verify", "verify"),
    "Certificate": ("verimirage.smt.certificate", "Certificate"),
    "check_certificate": ("verimirage.pipeline.certificates", "check_certificate"),
    **{n: ("verimirage.pipeline.superopt", n) for n in ("superoptimize", "Candidate", "SearchResult")},
    "compile": ("verimirage.backend.runtime", "compile"),
    "explain": ("verimirage.integrations.dynamo", "explain"),
    "benchmarks": ("verimirage.benchmarks", ""),
    "testing": ("verimirage.testing", ""),
    "rules": ("verimirage.rules", ""),
}

__all__ = [*_LAZY]


def __getattr__(name: str) -> Any:
    try:
        mod, attr = _LAZY[name]
    except KeyError:
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'verimirage' has no attribute {name!r}") from None
        mod, attr = f"{__name__}.{name}", ""  # a subpackage (vm.ir, vm.smt, ...), as after `import verimirage.ir`
    m = importlib.import_module(mod)
    value = getattr(m, attr) if attr else m
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
