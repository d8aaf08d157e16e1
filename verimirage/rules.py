"""Rule research: ``vm.rules.synthesize`` (Ruler-style rule synthesis), ``vm.rules.sweep`` (ablations and
sweeps, on Ray when asked), and the rule language (``Rule``, ``pat``, ``ruleset``, guards) re-exported.

See docs/api.md (`vm.rules`) and docs/cli/sweep.md.
"""

from __future__ import annotations

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

__all__ = [
    "AVar", "DEFAULT_OPS", "DEFAULT_SHAPES", "DimIsOne", "FieldSpec", "Instance", "PVar", "Positive", "RankIs",
    "RankMinus", "RecipDim", "Rule", "RuleError", "Ruleset", "SameDim", "SameRank", "SweepRow", "SweepTable",
    "SynthesisReport", "SynthesizedRuleset", "all_builtin_rules", "builtin_rulesets", "derives", "in_scope",
    "leave_one_theory_out", "minimize", "pat", "rediscovered", "ruleset", "sweep", "synthesize",
]
