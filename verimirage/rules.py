"""Rule research: ``vm.rules.synthesize`` (Ruler-style rule synthesis), ``vm.rules.sweep`` (ablations and
sweeps, on Ray when asked), ``vm.rules.ablate`` (each rule's contribution to one search), and the rule language
(``Rule``, ``pat``, ``ruleset``, guards) re-exported.

See docs/api.md (`vm.rules`) and docs/cli/sweep.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .pipeline.sweep import SweepRow, SweepTable, leave_one_theory_out, sweep
from .pipeline.synth import (
    DEFAULT_OPS,
    DEFAULT_SHAPES,
    FieldSpec,
    SynthesisReport,
    SynthesizedRuleset,
    derives,
    in_scope,
    minimize,
    rediscovered,
    synthesize,
)
from .rewrite.rules import (
    AVar,
    DimIsOne,
    Instance,
    Positive,
    PVar,
    RankIs,
    RankMinus,
    RecipDim,
    Rule,
    RuleError,
    Ruleset,
    SameDim,
    SameRank,
    all_builtin_rules,
    builtin_rulesets,
    pat,
    ruleset,
)

if TYPE_CHECKING:  # (at run time loaded on first use: see __getattr__)
    from .pipeline.superopt import ablate as ablate

__all__ = [
    "AVar", "DEFAULT_OPS", "DEFAULT_SHAPES", "DimIsOne", "FieldSpec", "Instance", "PVar", "Positive", "RankIs",
    "RankMinus", "RecipDim", "Rule", "RuleError", "Ruleset", "SameDim", "SameRank", "SweepRow", "SweepTable",
    "SynthesisReport", "SynthesizedRuleset", "ablate", "all_builtin_rules", "builtin_rulesets", "derives", "in_scope",
    "leave_one_theory_out", "minimize", "pat", "rediscovered", "ruleset", "sweep", "synthesize",
]


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    # (``ablate`` runs the search: loaded on first use, as the search's modules are)
    if name == "ablate":
        from .pipeline.superopt import ablate

        return ablate
    raise AttributeError(f"module 'verimirage.rules' has no attribute {name!r}")
