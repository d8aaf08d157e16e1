"""Norms: rms_norm in terms of its parts; row scaling commutes with matmul (the RMSNorm + Linear design)."""

from __future__ import annotations

from ..rules import AVar, DimIsOne, Instance, PVar, RankMinus, Rule, SameRank, pat
from ._common import AX, EPS, R, W, X

M = PVar("m")

EPS_I = 1e-6

RULES = [
    # rms_norm(x) -> x * rsqrt(mean(x^2) + eps)
    Rule("rms-norm-expand", pat.rms_norm(X, axis=AX, eps=EPS),
         pat.mul(X, pat.rsqrt(pat.shift(pat.mean(pat.square(X), axis=AX), c=EPS))),
         "rms_norm(x) = x * rsqrt(mean_k(x^2) + eps)", "norm", (),
         (Instance.of({"x": (3, 4)}, ax=1, eps=EPS_I), Instance.of({"x": (2, 3, 4)}, ax=1, eps=EPS_I))),
    # rms_norm(x, w) -> rms_norm(x) * w   (last axis)
    Rule("rms-norm-weight", pat.rms_norm(X, W, axis=RankMinus(X, 1), eps=EPS),
         pat.mul(pat.rms_norm(X, axis=RankMinus(X, 1), eps=EPS), W),
         "rms_norm(x, w) = rms_norm(x) * w along the last axis", "norm", (),
         (Instance.of({"x": (3, 4), "w": (4,)}, eps=EPS_I),)),
    # rms_norm(x, w) @ m -> ((x * w) @ m) * rsqrt(mean(x^2) + eps)   (last axis): a weighted norm in the next
    # projection's prologue (each block scales its x tile by w; the row statistic is a loop sum, applied after
    # the loop). One rule, not rms-norm-weight then matmul-rowscale: the e-graph's shape facts give a
    # broadcast of x by the rank-1 w no rank, so matmul-rowscale's guards never hold on (x * w) * r.
    # (An identity over the reals: in fp16 the operand x * w is inf once |x w| > 65504 where the source's x r w is
    # finite, so wherever this form is lowered the operand becomes the source's own x r w, the row statistic
    # computed before the loop: rewrite.stabilise's prologue_norm_scales; the search's direct rewrite,
    # norm_into_projections, builds the weight-side form that pass starts from.)
    Rule("rms-norm-matmul", pat.matmul(pat.rms_norm(X, W, axis=RankMinus(X, 1), eps=EPS), M),
         pat.mul(pat.matmul(pat.mul(X, W), M),
                 pat.rsqrt(pat.shift(pat.mean(pat.square(X), axis=RankMinus(X, 1)), c=EPS))),
         "rms_norm(x, w) @ m = ((x * w) @ m) * rsqrt(mean_k(x^2) + eps) along the last axis", "norm", (),
         (Instance.of({"x": (3, 4), "w": (4,), "m": (4, 5)}, eps=EPS_I),
          Instance.of({"x": (2, 3, 4), "w": (4,), "m": (2, 4, 5)}, eps=EPS_I))),
    # (x * r) @ w -> (x @ w) * r   if r is constant along the contracted dim
    Rule("matmul-rowscale", pat.matmul(pat.mul(X, R), W), pat.mul(pat.matmul(X, W), R),
         "(x r) W = (x W) r for row scalings r", "norm", (SameRank((X, R, W)), DimIsOne(R, RankMinus(X, 1))),
         (Instance.of({"x": (3, 4), "r": (3, 1), "w": (4, 5)}),)),
]
_ = AVar
