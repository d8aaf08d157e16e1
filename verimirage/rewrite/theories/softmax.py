"""exp / softmax / log: exp of sums and differences, deferred normalisation, shift invariance with max, log as
exp's inverse and the max-shifted logsumexp.

The log rules are proved by ``verify_rule`` through the abstract check's ``log-exp`` and ``log-mul`` laws and
the finite field's discrete log (log's q-part; see :mod:`verimirage.smt.ff`). Laws of log that need a side
condition on values (``log(a * b) = log a + log b`` for positive a, b; ``exp(log x) = x`` for x > 0) carry the
value guard :class:`~verimirage.rewrite.rules.Positive`: they fire only where the e-graph's sign facts show the
operands positive, and are proved with ``exp`` of a fresh input in their place (every positive value); without
the guard the two sides differ in definedness and the verifier answers Unknown, never Proved. They are off by
default (``rulesets=["softmax"]`` selects them): a value-guarded rule makes the search derive sign facts, which
costs every search ~0.2 s of saturation; and the finite field tests ``exp(log y)`` only where ``y`` is an exp's
value (its discrete log forgets the sign elsewhere), so ``exp-log``'s candidates prove only there."""

from __future__ import annotations

from ..rules import DimIsOne, Instance, Positive, RankMinus, Rule, SameRank, pat
from ._common import AX, A, B, E, S, V

_E = pat.exp(A)
_M = pat.max(A, axis=AX)
_ES = pat.exp(pat.sub(A, _M))

_LSE = pat.log(pat.sum(_E, axis=AX))
_LSE_SHIFTED = pat.add(_M, pat.log(pat.sum(_ES, axis=AX)))

RULES = [
    # exp(a + b) -> exp(a) * exp(b)
    Rule("exp-add", pat.exp(pat.add(A, B)), pat.mul(pat.exp(A), pat.exp(B)), "exp(a + b) = exp(a) exp(b)",
         "softmax", (SameRank((A, B)),), (Instance.of({"a": (3, 4), "b": (3, 1)}),)),
    # exp(a - b) -> exp(a) / exp(b)
    Rule("exp-sub", pat.exp(pat.sub(A, B)), pat.div(pat.exp(A), pat.exp(B)), "exp(a - b) = exp(a) / exp(b)",
         "softmax", (SameRank((A, B)),), (Instance.of({"a": (3, 4), "b": (3, 1)}),)),
    # (e / s) @ v -> (e @ v) / s   if s is constant along the contracted dim
    Rule("defer-normalisation", pat.matmul(pat.div(E, S), V), pat.div(pat.matmul(E, V), S),
         "(E / S) V = (E V) / S for row scalings S", "softmax",
         (SameRank((E, S, V)), DimIsOne(S, RankMinus(E, 1))),
         (Instance.of({"e": (3, 4), "s": (3, 1), "v": (4, 2)}), Instance.of({"e": (2, 3, 4), "s": (2, 3, 1),
                                                                              "v": (2, 4, 2)}))),
    # exp(a) / sum_k exp(a) -> exp(a - max_k a) / sum_k exp(a - max_k a)
    Rule("softmax-stabilise", pat.div(_E, pat.sum(_E, axis=AX)), pat.div(_ES, pat.sum(_ES, axis=AX)),
         "softmax is invariant under shifting by the row max (numerically safe form)", "softmax", (),
         (Instance.of({"a": (3, 4)}, ax=1),)),
    # exp(a - max_k a) / sum_k exp(a - max_k a) -> exp(a) / sum_k exp(a)
    Rule("softmax-shift-invariance", pat.div(_ES, pat.sum(_ES, axis=AX)), pat.div(_E, pat.sum(_E, axis=AX)),
         "softmax(a - max a) = softmax(a) (drops the max: not numerically safe in fp16)", "softmax", (),
         (Instance.of({"a": (3, 4)}, ax=1),), default=False),
    # log(exp(a)) -> a
    Rule("log-exp", pat.log(_E), A, "log(exp(a)) = a", "softmax", (), (Instance.of({"a": (3, 4)}),)),
    # log(exp(a) * b) -> a + log(b)   (both sides defined exactly where b > 0)
    Rule("log-exp-mul", pat.log(pat.mul(_E, B)), pat.add(A, pat.log(B)), "log(exp(a) b) = a + log(b)", "softmax",
         (SameRank((A, B)),), (Instance.of({"a": (3, 4), "b": (3, 4)}), Instance.of({"a": (3, 1), "b": (3, 4)}))),
    # log(a * b) -> log(a) + log(b)   if a > 0 and b > 0
    Rule("log-mul", pat.log(pat.mul(A, B)), pat.add(pat.log(A), pat.log(B)), "log(a b) = log a + log b (a, b > 0)",
         "softmax", (SameRank((A, B)), Positive(A), Positive(B)),
         (Instance.of({"a": (3, 4), "b": (3, 4)}), Instance.of({"a": (3, 1), "b": (3, 4)})), default=False),
    # log(a / b) -> log(a) - log(b)   if a > 0 and b > 0 (log-softmax from a softmax)
    Rule("log-div", pat.log(pat.div(A, B)), pat.sub(pat.log(A), pat.log(B)), "log(a / b) = log a - log b (a, b > 0)",
         "softmax", (SameRank((A, B)), Positive(A), Positive(B)),
         (Instance.of({"a": (3, 4), "b": (3, 1)}),), default=False),
    # exp(log(a)) -> a   if a > 0
    Rule("exp-log", pat.exp(pat.log(A)), A, "exp(log a) = a (a > 0)", "softmax", (Positive(A),),
         (Instance.of({"a": (3, 4)}),), default=False),
    # log(sum_k exp(a)) -> max_k a + log(sum_k exp(a - max_k a))
    Rule("logsumexp-stabilise", _LSE, _LSE_SHIFTED,
         "logsumexp is max + logsumexp of the max-shifted values (numerically safe form)", "softmax", (),
         (Instance.of({"a": (3, 4)}, ax=1), Instance.of({"a": (2, 3, 4)}, ax=2))),
    # max_k a + log(sum_k exp(a - max_k a)) -> log(sum_k exp(a))
    Rule("logsumexp-unshift", _LSE_SHIFTED, _LSE,
         "the max-shifted logsumexp is the plain one (drops the max: overflows in fp16)", "softmax", (),
         (Instance.of({"a": (3, 4)}, ax=1),), default=False),
]
