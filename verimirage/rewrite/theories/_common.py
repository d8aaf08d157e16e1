"""Shared pattern variables of the built-in theories."""

from __future__ import annotations

from ..rules import AVar, PVar

A, B, C, D = PVar("a"), PVar("b"), PVar("c"), PVar("d")
X, W, E, S, V, R = PVar("x"), PVar("w"), PVar("e"), PVar("s"), PVar("v"), PVar("r")
AX = AVar("ax")
K = AVar("k")
EPS = AVar("eps")
