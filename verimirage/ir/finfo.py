"""Floating-point facts of the element types, for the rewrites (a clamp to the largest finite value) and the
float-safety check (inputs near it). Not on the certificate checker's path."""

from __future__ import annotations

from .dtypes import DType

#: the largest finite value of each dtype
DTYPE_MAX = {DType.float16: 65504.0, DType.bfloat16: 3.3895313892515355e38, DType.float32: 3.4028234663852886e38}

__all__ = ["DTYPE_MAX"]
