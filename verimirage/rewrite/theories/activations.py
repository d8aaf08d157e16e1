"""Activations: sigmoid in terms of exp, reciprocal as division (issue 21).

The verifier gives sigmoid its exact meaning through exp (``1 / (1 + exp(-x))``), so these laws are proved
by ``verify_rule`` like every other rule. (tanh is a random function in the finite field: an exact tanh
would have no q-part, and soft-capped logits feed an exp; so ``tanh = 2 sigmoid(2x) - 1`` is not here.)
They are off by default: the search reaches for them when asked (``rulesets=["activations"]``).
"""

from __future__ import annotations

from ..rules import Instance, Rule, pat
from ._common import A, B

RULES = [
    # sigmoid(x) -> 1 / (1 + exp(-x))
    Rule("sigmoid-def", pat.sigmoid(A), pat.reciprocal(pat.shift(pat.exp(pat.neg(A)), c=1.0)),
         "sigmoid(x) = 1 / (1 + exp(-x))", "activations", (), (Instance.of({"a": (3, 4)}),), default=False),
    # a * (1 / b) -> a / b
    Rule("mul-reciprocal", pat.mul(A, pat.reciprocal(B)), pat.div(A, B), "a * (1 / b) = a / b", "activations",
         (), (Instance.of({"a": (3, 4), "b": (3, 1)}),), default=False),
]
