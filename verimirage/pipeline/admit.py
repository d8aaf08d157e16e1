"""Admitting rules into a search: a rule is used only if ``verify_rule`` proves it sound, or it is trusted.

This is orchestration (it calls the verifier), so it lives above :mod:`verimirage.rewrite`, which stays
free of :mod:`verimirage.smt`.
"""

from __future__ import annotations

from typing import Any

from ..rewrite.rules import Rule, RuleError

_ADMITTED: dict[Rule, Any] = {}


def admit(rule: Rule, *, timeout_s: float = 10.0) -> Any:
    """The soundness verdict of ``rule`` (via ``verify_rule``); RuleError if not proved and not trusted."""
    if rule in _ADMITTED:
        v = _ADMITTED[rule]
    else:
        from ..smt.verdict import Unknown
        from ..smt.verify import verify_rule

        try:
            v = verify_rule(rule.name, rule.instance_graphs())
        except RuleError as e:
            v = Unknown(str(e))
        _ADMITTED[rule] = v
    if not getattr(v, "proved", False) and not rule.trusted:
        raise RuleError(
            f"rule {rule.name!r} was refused: verify_rule could not prove it sound ({type(v).__name__}: "
            f"{getattr(v, 'reason', '')}); fix it, or pass it with trusted=True to use it anyway"
        )
    return v
