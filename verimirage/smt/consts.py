"""How a program's float constants are read as exact rationals (shared by every check).

A constant ``c`` (``scale``/``shift`` constants, ``eps``) is read as the
simplest rational that rounds to the same float64 when its denominator is at
most 2**24 (so ``1.0 / 3`` means 1/3 and ``0.1`` means 1/10), else as the exact
binary fraction of the float. Both the finite-field check and the abstract
expressions use this one function, so they agree on every constant.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

MAX_DENOMINATOR = 1 << 24


@lru_cache(maxsize=4096)
def const_fraction(c: float) -> Fraction:
    """The exact rational a program constant ``c`` stands for (see the module docstring)."""
    exact = Fraction(float(c))
    simple = exact.limit_denominator(MAX_DENOMINATOR)
    if float(simple) == float(c):
        return simple
    return exact
