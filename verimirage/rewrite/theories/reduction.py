"""Reductions: sum splitting/merging, index-independent factors, mean = sum * 1/n, sum through matmul."""

from __future__ import annotations

from ..rules import DimIsOne, Instance, RankMinus, RecipDim, Rule, SameDim, SameRank, pat
from ._common import AX, A, B, X

_I = (Instance.of({"a": (3, 4), "b": (3, 4)}, ax=1), Instance.of({"a": (2, 3, 4), "b": (2, 3, 4)}, ax=0))

RULES = [
    # sum_k(a + b) -> sum_k a + sum_k b   if neither broadcasts along k (else n*a on one side, a on the other)
    Rule("sum-add-split", pat.sum(pat.add(A, B), axis=AX), pat.add(pat.sum(A, axis=AX), pat.sum(B, axis=AX)),
         "sum_k(a + b) = sum_k a + sum_k b", "reduction", (SameRank((A, B)), SameDim((A, B), AX)), _I),
    # sum_k a + sum_k b -> sum_k(a + b)   if neither broadcasts along k
    Rule("sum-add-merge", pat.add(pat.sum(A, axis=AX), pat.sum(B, axis=AX)), pat.sum(pat.add(A, B), axis=AX),
         "sum_k a + sum_k b = sum_k(a + b)", "reduction", (SameRank((A, B)), SameDim((A, B), AX)), _I),
    # sum_k(a - b) -> sum_k a - sum_k b   if neither broadcasts along k (off by default: see neg-sub)
    Rule("sum-sub-split", pat.sum(pat.sub(A, B), axis=AX), pat.sub(pat.sum(A, axis=AX), pat.sum(B, axis=AX)),
         "sum_k(a - b) = sum_k a - sum_k b", "reduction", (SameRank((A, B)), SameDim((A, B), AX)), _I,
         default=False),
    # sum_k(a * b) -> (sum_k a) * b   if b does not depend on k
    Rule("sum-factor-out", pat.sum(pat.mul(A, B), axis=AX), pat.mul(pat.sum(A, axis=AX), B),
         "sum_k(a * b) = (sum_k a) * b when b is independent of k", "reduction",
         (SameRank((A, B)), DimIsOne(B, AX)), (Instance.of({"a": (3, 4), "b": (3, 1)}, ax=1),)),
    # mean_k x -> sum_k x * (1/n)
    Rule("mean-as-sum", pat.mean(X, axis=AX), pat.scale(pat.sum(X, axis=AX), c=RecipDim(X, AX)),
         "mean_k x = (sum_k x) / n", "reduction", (), (Instance.of({"x": (3, 4)}, ax=1),)),
    # sum_last(a @ b) -> a @ sum_last(b)
    # Off by default (proved by verify_rule since the nested-sum normal form; not for soundness): it never
    # fires on the suite (every graph at batch 1, small and full size), so it would only add matching time.
    Rule("sum-matmul-last", pat.sum(pat.matmul(A, B), axis=RankMinus(A, 1)),
         pat.matmul(A, pat.sum(B, axis=RankMinus(A, 1))), "sum_j (a @ b)[i, j] = a @ (sum_j b[:, j])",
         "reduction", (SameRank((A, B)),), (Instance.of({"a": (3, 4), "b": (4, 5)}),), default=False),
]
