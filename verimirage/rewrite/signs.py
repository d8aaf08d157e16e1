"""Sign facts in the e-graph: which terms are positive (``> 0``) or non-negative (``>= 0``) wherever they
are defined, for the value guards of rewrite rules (:class:`verimirage.rewrite.rules.Positive`).

Two egglog relations, ``t_pos(t)`` and ``t_nonneg(t)``, derived by :func:`sign_rules` from the structure of
terms, the same facts the verifier's definedness check derives (:class:`verimirage.smt.defined.Signs`): so
a candidate that a guarded rule produces is defined wherever the source is (tests/test_rules_guarded.py
checks every sign rule here against the definedness check):

* ``exp``, ``sigmoid``, ``softplus``, ``rsqrt`` are positive; ``square``, ``relu``, ``abs``, ``sqrt``
  non-negative; a positive term is non-negative;
* ``a + b``: positive if both are non-negative and one is positive; ``a * b``, ``a / b``, ``a @ b``: positive
  if both are; ``1 / a``, ``a ** c``: positive if ``a`` is; ``c * a`` (``c > 0``) and ``a + c`` (``c > 0``,
  ``a >= 0``); ``maximum(a, b)`` if one is;
* a sum, mean or max along an axis of a positive term; layout ops (transpose, permute, reshape,
  broadcast_to, slice) and ``concat`` of positive terms; ``where(m, a, b)`` of positive ``a`` and ``b``.

The rules run with the rewrite rules (in the same ruleset) only when a selected rule has a value guard.
"""

from __future__ import annotations

from typing import Any

from egglog import String, eq, f64, i64, relation, rule, var

from .lift import TT, egg_apply

#: ``t_pos(t)``: every element of ``t`` is > 0 where it is defined
t_pos = relation("t_pos", TT)
#: ``t_nonneg(t)``: every element of ``t`` is >= 0 where it is defined
t_nonneg = relation("t_nonneg", TT)


def sign_rules() -> list[Any]:
    """The egglog rules deriving :data:`t_pos` and :data:`t_nonneg` (see the module docstring)."""
    t, a, b, m = (var(n, TT) for n in ("t", "a", "b", "m"))
    ax, ax2, lo, hi = (var(n, i64) for n in ("ax", "ax2", "lo", "hi"))
    c = var("c", f64)
    s = var("s", String)
    out: list[Any] = []

    # leaves: positive / non-negative by the op alone
    for op in ("exp", "sigmoid", "softplus", "rsqrt"):
        out.append(rule(_eq(t, egg_apply(op, [a], {}))).then(t_pos(t)))
    for op in ("square", "relu", "abs", "sqrt"):
        out.append(rule(_eq(t, egg_apply(op, [a], {}))).then(t_nonneg(t)))
    out.append(rule(t_pos(t)).then(t_nonneg(t)))
    # binary
    add = egg_apply("add", [a, b], {})
    out += [
        rule(_eq(t, add), t_pos(a), t_nonneg(b)).then(t_pos(t)),
        rule(_eq(t, add), t_nonneg(a), t_pos(b)).then(t_pos(t)),
        rule(_eq(t, add), t_nonneg(a), t_nonneg(b)).then(t_nonneg(t)),
    ]
    for op in ("mul", "div", "matmul"):
        term = egg_apply(op, [a, b], {})
        out.append(rule(_eq(t, term), t_pos(a), t_pos(b)).then(t_pos(t)))
    for op in ("mul", "matmul"):
        term = egg_apply(op, [a, b], {})
        out.append(rule(_eq(t, term), t_nonneg(a), t_nonneg(b)).then(t_nonneg(t)))
    mx = egg_apply("maximum", [a, b], {})
    out += [rule(_eq(t, mx), t_pos(a)).then(t_pos(t)), rule(_eq(t, mx), t_pos(b)).then(t_pos(t)),
            rule(_eq(t, mx), t_nonneg(a)).then(t_nonneg(t)), rule(_eq(t, mx), t_nonneg(b)).then(t_nonneg(t))]
    # unary with a constant
    out.append(rule(_eq(t, egg_apply("reciprocal", [a], {})), t_pos(a)).then(t_pos(t)))
    out.append(rule(_eq(t, egg_apply("pow", [a], {"c": c})), t_pos(a)).then(t_pos(t)))
    sc = egg_apply("scale", [a], {"c": c})
    out += [rule(_eq(t, sc), t_pos(a), c > f64(0.0)).then(t_pos(t)),
            rule(_eq(t, sc), t_nonneg(a), c >= f64(0.0)).then(t_nonneg(t))]
    out.append(rule(_eq(t, egg_apply("shift", [a], {"c": c})), t_nonneg(a), c > f64(0.0)).then(t_pos(t)))
    # reductions along an axis (non-empty) and layout ops keep the sign of every element
    for op in ("sum", "mean", "max"):
        term = egg_apply(op, [a], {"axis": ax})
        out += [rule(_eq(t, term), t_pos(a)).then(t_pos(t)), rule(_eq(t, term), t_nonneg(a)).then(t_nonneg(t))]
    layouts = [egg_apply("transpose", [a], {"a": ax, "b": ax2}), egg_apply("permute", [a], {"dims": s}),
               egg_apply("reshape", [a], {"shape": s}), egg_apply("broadcast_to", [a], {"shape": s}),
               egg_apply("slice", [a], {"axis": ax, "start": lo, "stop": hi})]
    for term in layouts:
        out += [rule(_eq(t, term), t_pos(a)).then(t_pos(t)), rule(_eq(t, term), t_nonneg(a)).then(t_nonneg(t))]
    cat = egg_apply("concat", [a, b], {"axis": ax})
    out.append(rule(_eq(t, cat), t_pos(a), t_pos(b)).then(t_pos(t)))
    wh = egg_apply("where", [m, a, b], {})
    out.append(rule(_eq(t, wh), t_pos(a), t_pos(b)).then(t_pos(t)))
    return out


def _eq(t: Any, term: Any) -> Any:
    return eq(t).to(term)
