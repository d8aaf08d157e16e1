"""Activations: sigmoid in terms of exp, reciprocal as division (issue 21).

The verifier gives sigmoid its exact meaning through exp (``1 / (1 + exp(-x))``; in the finite field's
p-part, its q-part a random function of the argument so that soft-capped logits may still feed an exp), and
tanh and silu theirs through sigmoid (``2 sigmoid(2x) - 1``, ``x sigmoid(x)``), so these laws are proved
by ``verify_rule`` like every other rule, and hold inside an exp too. They are off by default: the search
reaches for them when asked (``rulesets=["activations"]``).
"""

from __future__ import annotations

from ..rules import Instance, Rule, pat
from ._common import A, B

RULES = [
    # sigmoid(x) -> 1 / (1 + exp(-x))
    Rule("sigmoid-def", pat.sigmoid(A), pat.reciprocal(pat.shift(pat.exp(pat.neg(A)), c=1.0)),
         "sigmoid(x) = 1 / (1 + exp(-x))", "activations", (), (Instance.of({"a": (3, 4)}),), default=False),
    # tanh(x) -> 2 sigmoid(2x) - 1
    Rule("tanh-def", pat.tanh(A), pat.shift(pat.scale(pat.sigmoid(pat.scale(A, c=2.0)), c=2.0), c=-1.0),
         "tanh(x) = 2 sigmoid(2x) - 1", "activations", (), (Instance.of({"a": (3, 4)}),), default=False),
    # silu(x) -> x * sigmoid(x)
    Rule("silu-def", pat.silu(A), pat.mul(A, pat.sigmoid(A)), "silu(x) = x sigmoid(x)", "activations", (),
         (Instance.of({"a": (3, 4)}),), default=False),
    # a * (1 / b) -> a / b
    Rule("mul-reciprocal", pat.mul(A, pat.reciprocal(B)), pat.div(A, B), "a * (1 / b) = a / b", "activations",
         (), (Instance.of({"a": (3, 4), "b": (3, 1)}),), default=False),
]
