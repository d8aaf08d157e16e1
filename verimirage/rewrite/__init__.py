"""The search: egglog lifting, rulesets by theory, partitioning into μGraphs, cost model, superoptimize.

Importing this package registers the ``"egglog"`` meaning of every kernel-level op.
"""

from . import lift as lift  # registers the egglog domain

__all__ = ["lift"]
