"""Limits every program must respect, checked before anything is allocated.

* Shapes: every tensor (and tile) has rank >= 1 and positive dims, and at most
  :data:`MAX_ELEMENTS` elements. Rank-0 (scalar) and zero-size tensors are
  rejected with a :class:`GraphError`: the pipeline (tiling, the finite-field
  check, the Triton lowering) is built and tested for neither; write a scalar
  as shape ``(1,)``.
* Constants (``scale``/``shift``'s ``c``, ``rms_norm``'s ``eps``, ...): Python
  numbers that are finite and representable as float32, the precision kernels
  compute in: ``c == 0`` or ``FLOAT32_TINY <= |c| <= FLOAT32_MAX``. A constant
  outside that range would be ``inf`` or ``0`` in a kernel while the float64
  reference and the verifier see its exact value.

Builders, :meth:`Graph.parse <verimirage.ir.graph.Graph.parse>` and
:meth:`Graph.from_json <verimirage.ir.graph.Graph.from_json>` enforce both. The
bound on evaluation (:func:`verimirage.ir.reference.check_evaluable`) is the
float64 evaluator's and the verifier's (the certificate checker runs under a
memory cap instead).
"""

from __future__ import annotations

import math
from typing import Any

from .errors import GraphError

#: Largest number of elements of one tensor or tile: 2**34 (16 Gi; 32 GiB in fp16).
MAX_ELEMENTS = 2**34
#: Largest finite float32.
FLOAT32_MAX = 3.4028234663852886e38
#: Smallest positive normal float32.
FLOAT32_TINY = 1.1754943508222875e-38


def check_shape(what: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple if it is a valid tensor shape; GraphError naming ``what`` otherwise."""
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape
    ):
        raise GraphError(f"{what}: shape {_short(shape)}; expected a tuple of positive ints")
    if not shape:
        raise GraphError(f"{what}: shape (); rank-0 tensors are not supported, expected rank >= 1 (use (1,))")
    n = math.prod(shape)
    if n > MAX_ELEMENTS:
        raise GraphError(f"{what}: shape {tuple(shape)} has {n} elements; expected at most {MAX_ELEMENTS} (2**34)")
    return tuple(shape)


def check_constant(what: str, c: Any, *, nonnegative: bool = False) -> float:
    """``c`` as a float if it is a finite constant representable as float32; GraphError otherwise."""
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        raise GraphError(f"{what}: the constant must be a Python int or float, got {_short(c)}")
    try:
        f = float(c)
    except OverflowError:
        f = math.inf
    if not math.isfinite(f) or abs(f) > FLOAT32_MAX:
        raise GraphError(f"{what}: the constant {_short(c)} is not a finite float32 number; expected "
                         f"|c| <= {FLOAT32_MAX:.7g}")
    if f != 0 and abs(f) < FLOAT32_TINY:
        raise GraphError(f"{what}: the constant {_short(c)} is below the float32 normal range; expected 0 or "
                         f"|c| >= {FLOAT32_TINY:.7g}")
    if nonnegative and f < 0:
        raise GraphError(f"{what}: the constant {_short(c)} is negative; expected >= 0")
    return f


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except ValueError:  # an int with more digits than repr allows
        r = f"<{type(v).__name__} too large to print>"
    return r if len(r) <= 60 else r[:40] + f"...({len(r)} characters)"
