"""Concat: concat-matmul fusion (the LoRA design) and concat of partial results."""

from __future__ import annotations

from ..rules import Instance, RankIs, RankMinus, Rule, SameDim, SameRank, pat
from ._common import A, B, C, D

RULES = [
    # a @ b + c @ d -> concat([a, c], -1) @ concat([b, d], -2)   if the products have one shape (no broadcast)
    Rule("concat-matmul-fuse", pat.add(pat.matmul(A, B), pat.matmul(C, D)),
         pat.matmul(pat.concat([A, C], axis=RankMinus(A, 1)), pat.concat([B, D], axis=RankMinus(A, 2))),
         "a b + c d = [a c] [b; d]", "concat", (SameRank((A, B, C, D)), RankIs(A, 2), SameDim((A, C), RankMinus(A, 2)),
                                                SameDim((B, D), RankMinus(A, 1))),
         (Instance.of({"a": (3, 4), "b": (4, 5), "c": (3, 2), "d": (2, 5)}),)),
    # a @ concat([b, c], -1) -> concat([a @ b, a @ c], -1)
    Rule("matmul-concat-split", pat.matmul(A, pat.concat([B, C], axis=RankMinus(A, 1))),
         pat.concat([pat.matmul(A, B), pat.matmul(A, C)], axis=RankMinus(A, 1)),
         "a [b c] = [a b, a c] (column blocks computed separately)", "concat", (SameRank((A, B, C)),),
         (Instance.of({"a": (3, 4), "b": (4, 2), "c": (4, 5)}),)),
]
