"""The search: egglog lifting, rulesets by theory, partitioning into μGraphs, cost model, superoptimize.

Importing this package registers the ``"egglog"`` meaning of every kernel-level op. Public names for
research use: :class:`Rule`, :func:`ruleset`, ``pat``, :class:`PVar`, :class:`AVar`, :class:`Instance`,
guards (:class:`SameRank`, :class:`RankIs`, :class:`DimIsOne`, :class:`SameDim`; the value guard
:class:`Positive`). (``ablate``, which runs the search, is the orchestrator's: ``vm.rules.ablate``.)
"""

from ..logs import quiet_egglog

quiet_egglog()  # egglog logs every command at INFO: quiet unless the user asked (VERIMIRAGE_LOG)

from . import lift as lift  # noqa: E402  (registers the egglog domain)
from .rules import (  # noqa: E402
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
    builtin_rulesets,
    pat,
    ruleset,
)

__all__ = [
    "AVar", "DimIsOne", "Instance", "PVar", "Positive", "RankIs", "RankMinus", "RecipDim", "Rule", "RuleError",
    "Ruleset", "SameDim", "SameRank", "builtin_rulesets", "lift", "pat", "ruleset",
]
