"""Element types of tensors."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .builders import DTypeMethods
else:  # (the backend's conveniences and ``vm.float16`` as repr: :mod:`.builders` puts them on DType)
    DTypeMethods = type("DTypeMethods", (), {})


class DType(DTypeMethods, enum.Enum):
    """A tensor element type. The float64 reference ignores it; codegen honours it."""

    float16 = "f16"
    bfloat16 = "bf16"
    float32 = "f32"
    bool = "b8"  # masks (``where``); the reference reads them as 0.0 / 1.0

    @property
    def short(self) -> str:
        """The short name used in the text form (``f16``)."""
        return self.value

    @classmethod
    def parse(cls, text: str) -> DType:
        """The dtype named ``text`` (``f16``, ``float16``, ...)."""
        for d in cls:
            if text in (d.value, d.name):
                return d
        from .errors import GraphError

        raise GraphError(f"unknown dtype {text!r}; expected one of {[d.value for d in cls]}")


float16 = DType.float16
bfloat16 = DType.bfloat16
float32 = DType.float32
bool_ = DType.bool
