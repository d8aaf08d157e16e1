"""The cost model priced as the Triton backend launches programs: the estimates the search ranks by.

:mod:`verimirage.rewrite.cost` prices a μGraph from its block graphs; what only the code generator knows (which
elementwise kernels it emits flat, the block graph a kernel-level op runs as, the least shared memory a kernel
launches with, merged launches) it asks a ``LaunchModel``. The backend implements one
(:data:`verimirage.backend.launch_model.LAUNCHES`); neither package imports the other, and this module, above
both, joins them. The functions here are the cost model's with the backend's launch model given.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..backend.launch_model import LAUNCHES
from ..ir.graph import BlockGraph, Graph
from ..ir.ops import TensorType
from ..rewrite import cost as model
from ..rewrite.cost import H100, Calibration, Cost, Hardware, KernelCost

_UNIT = Calibration()  # (the model's own default: no fitted factors)


def cost(g: Graph, hw: Hardware = H100, cal: Calibration = _UNIT, merge: bool | None = None) -> Cost:
    """:func:`verimirage.rewrite.cost.cost` of ``g`` as the backend launches it (``merge`` default: as the runtime
    launches, ``VERIMIRAGE_MERGE``)."""
    return model.cost(g, hw, cal, merge, launch=LAUNCHES)


def block_cost(bg: BlockGraph, in_types: Sequence[TensorType], out_types: Sequence[TensorType],
               hw: Hardware = H100, cal: Calibration = _UNIT, hot: float = 0.0) -> KernelCost:
    """:func:`verimirage.rewrite.cost.block_cost` of one custom kernel as the backend launches it."""
    return model.block_cost(bg, in_types, out_types, hw, cal, hot, launch=LAUNCHES)


def merged_launches(g: Graph) -> int | None:
    """How many launches the runtime's merged mode (``VERIMIRAGE_MERGE``) makes of ``g``'s kernels: one per
    dependency level and warps count (``backend.tuning.recommend``'s), kernel-level ops wrapped as the backend wraps
    them; None for an op it cannot wrap."""
    return model.merged_launches(g, LAUNCHES)


def calibrate(samples: Sequence[tuple[Graph, float]], hw: Hardware = H100) -> Calibration:
    """:func:`verimirage.rewrite.cost.calibrate` over estimates as the backend launches."""
    return model.calibrate(samples, hw, launch=LAUNCHES)


__all__ = ["block_cost", "calibrate", "cost", "merged_launches"]
