"""Equality saturation: run the selected rules (with shape propagation) under limits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from egglog import ruleset

from .lift import Lifted, serialized, shapes
from .rules import Rule

log = logging.getLogger(__name__)


@dataclass
class SaturationStats:
    """What the e-graph run did: iterations, stop reason, e-graph size, matches per rule."""

    iterations: int = 0
    stop_reason: str = ""
    enodes: int = 0
    eclasses: int = 0
    seconds: float = 0.0
    fired: dict[str, int] = field(default_factory=dict)


def saturate(
    lifted: Lifted, rules: list[Rule], *, iter_limit: int, node_limit: int, time_budget_s: float
) -> tuple[SaturationStats, dict[str, Any]]:
    """Run ``rules`` on ``lifted`` until saturation or a limit; returns stats and the serialised e-graph."""
    t0 = time.perf_counter()
    eg = lifted.egraph
    stats = SaturationStats()
    main = ruleset(name=f"search_{id(lifted)}")
    by_key: dict[str, str] = {}
    for r in rules:
        rw = r.egglog()
        main.register(rw)
        by_key[str(rw)] = r.name
        decl = getattr(rw, "decl", None)
        if decl is not None:
            by_key[str(decl)] = r.name
    eg.run(shapes.saturate())
    data = serialized(eg)
    for it in range(iter_limit):
        if time.perf_counter() - t0 > time_budget_s:
            stats.stop_reason = "time budget"
            break
        rep = eg.run(main)
        eg.run(shapes.saturate())
        stats.iterations = it + 1
        for key, n in getattr(rep, "num_matches_per_rule", {}).items():
            name = by_key.get(str(key), str(key))
            if n:
                stats.fired[name] = stats.fired.get(name, 0) + int(n)
        data = serialized(eg)
        n_nodes = sum(1 for k in data["nodes"] if "primitive" not in k)
        stats.enodes = n_nodes
        if not getattr(rep, "updated", True):
            stats.stop_reason = "saturated"
            break
        if n_nodes > node_limit:
            stats.stop_reason = f"node limit ({n_nodes} > {node_limit})"
            break
    else:
        stats.stop_reason = f"iteration limit ({iter_limit})"
    stats.enodes = sum(1 for k in data["nodes"] if "primitive" not in k)
    stats.eclasses = len(data.get("class_data", {}))
    stats.seconds = time.perf_counter() - t0
    log.info("e-graph: %d iterations, %s, %d e-nodes", stats.iterations, stats.stop_reason, stats.enodes)
    return stats, data
