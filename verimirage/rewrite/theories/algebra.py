"""Algebra: commutativity, associativity, distributivity of add/mul; matmul laws; scale, neg, division."""

from __future__ import annotations

from ..rules import Instance, RankMinus, Rule, SameDim, SameRank, pat
from ._common import A, B, C, K

_I2 = Instance.of({"a": (3, 4), "b": (3, 4), "c": (3, 4)})
_BC = Instance.of({"a": (3, 4), "b": (3, 1), "c": (1, 4)})
_MM = Instance.of({"a": (3, 4), "b": (4, 5), "c": (5, 2)})
_MM2 = Instance.of({"a": (3, 4), "b": (4, 5), "c": (4, 5)})
_MMB = Instance.of({"a": (2, 3, 4), "b": (2, 4, 5), "c": (2, 5, 2)})
_SR3 = SameRank((A, B, C))
_SR2 = SameRank((A, B))

RULES = [
    # a + b -> b + a
    Rule("add-comm", pat.add(A, B), pat.add(B, A), "a + b = b + a", "algebra", (_SR2,), (_I2, _BC)),
    # a * b -> b * a
    Rule("mul-comm", pat.mul(A, B), pat.mul(B, A), "a * b = b * a", "algebra", (_SR2,), (_I2, _BC)),
    # (a + b) + c -> a + (b + c)
    Rule("add-assoc", pat.add(pat.add(A, B), C), pat.add(A, pat.add(B, C)), "(a + b) + c = a + (b + c)",
         "algebra", (_SR3,), (_I2, _BC)),
    # (a * b) * c -> a * (b * c)
    Rule("mul-assoc", pat.mul(pat.mul(A, B), C), pat.mul(A, pat.mul(B, C)), "(a * b) * c = a * (b * c)",
         "algebra", (_SR3,), (_I2, _BC)),
    # a * (b + c) -> a * b + a * c
    Rule("mul-add-distrib", pat.mul(A, pat.add(B, C)), pat.add(pat.mul(A, B), pat.mul(A, C)),
         "a * (b + c) = a*b + a*c", "algebra", (_SR3,), (_I2, _BC)),
    # a * b + a * c -> a * (b + c)
    Rule("mul-add-factor", pat.add(pat.mul(A, B), pat.mul(A, C)), pat.mul(A, pat.add(B, C)),
         "a*b + a*c = a * (b + c)", "algebra", (_SR3,), (_I2, _BC)),
    # (a @ b) @ c -> a @ (b @ c)
    # Off by default (proved by verify_rule since the nested-sum normal form; not for soundness): measured on
    # the suite at batch 1 (every graph small, all ten full size; default options, no cache), it fires only on
    # lora, where it grows the e-graph from 60 to 89 e-nodes and the search from 0.14-0.20 s to 0.24-0.34 s
    # (full size) and finds no better best candidate (4.21 us est., 1 kernel either way; at small size only
    # the 3rd/4th candidates get cheaper). A chain of n matmuls would also get every bracketing.
    Rule("matmul-assoc", pat.matmul(pat.matmul(A, B), C), pat.matmul(A, pat.matmul(B, C)),
         "(a @ b) @ c = a @ (b @ c)", "algebra", (_SR3,), (_MM, _MMB), default=False),
    # a @ (b + c) -> a @ b + a @ c   if neither b nor c broadcasts along the contracted dim
    Rule("matmul-add-distrib", pat.matmul(A, pat.add(B, C)), pat.add(pat.matmul(A, B), pat.matmul(A, C)),
         "a @ (b + c) = a@b + a@c", "algebra", (_SR3, SameDim((B, C), RankMinus(A, 2))), (_MM2,)),
    # a @ b + a @ c -> a @ (b + c)
    Rule("matmul-add-factor", pat.add(pat.matmul(A, B), pat.matmul(A, C)), pat.matmul(A, pat.add(B, C)),
         "a@b + a@c = a @ (b + c)", "algebra", (_SR3,), (_MM2,)),
    # (a * k) @ b -> (a @ b) * k
    Rule("matmul-scale-pull", pat.matmul(pat.scale(A, c=K), B), pat.scale(pat.matmul(A, B), c=K),
         "(k a) @ b = k (a @ b)", "algebra", (_SR2,), (Instance.of({"a": (3, 4), "b": (4, 5)}, k=0.5),)),
    # (-a) @ b -> -(a @ b)
    Rule("matmul-neg-pull", pat.matmul(pat.neg(A), B), pat.neg(pat.matmul(A, B)), "(-a) @ b = -(a @ b)",
         "algebra", (_SR2,), (Instance.of({"a": (3, 4), "b": (4, 5)}),)),
    # -(a - b) -> b - a
    # Off by default, like mul-sub-distrib: with it and sum-sub-split the e-graph holds cross-entropy's
    # loop-friendly form sum(t x) - lse sum(t), which tree-size extraction does not reach yet (issue 21)
    Rule("neg-sub", pat.neg(pat.sub(A, B)), pat.sub(B, A), "-(a - b) = b - a", "algebra", (_SR2,), (_I2, _BC),
         default=False),
    # a * (b - c) -> a * b - a * c
    Rule("mul-sub-distrib", pat.mul(A, pat.sub(B, C)), pat.sub(pat.mul(A, B), pat.mul(A, C)),
         "a * (b - c) = a*b - a*c", "algebra", (_SR3,), (_I2, _BC), default=False),
    # (a / b) * c -> (a * c) / b
    Rule("div-mul-swap", pat.mul(pat.div(A, B), C), pat.div(pat.mul(A, C), B), "(a / b) * c = (a * c) / b",
         "algebra", (_SR3,), (_I2, _BC)),
    # (a / b) / c -> a / (b * c)
    Rule("div-div", pat.div(pat.div(A, B), C), pat.div(A, pat.mul(B, C)), "(a / b) / c = a / (b * c)",
         "algebra", (_SR3,), (_I2, _BC)),
]
