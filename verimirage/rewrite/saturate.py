"""Equality saturation: run the selected rules (with shape propagation) under limits; and which rules a
rewritten term was derived with (:func:`attribute`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from egglog import EGraph, eq, ruleset

from ..clock import cpu_seconds
from ..ir.graph import Graph
from .lift import Lifted, Term, lift, serialized, shapes, term_to_egg
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


def _num_nodes(eg: EGraph) -> int:
    """Rows of every egglog function (term constructors and the shape analysis), as the node limit counts."""
    return sum(n for _, n in eg.all_function_sizes())


#: rule -> (its egglog rewrite, the names egglog's run report may give it); compiling and printing a
#: rewrite costs milliseconds, and a search (and each attribution replay) needs every rule
_COMPILED: dict[Rule, tuple[Any, tuple[str, ...]]] = {}


def _compiled(r: Rule) -> tuple[Any, tuple[str, ...]]:
    if r not in _COMPILED:
        rw = r.egglog()
        decl = getattr(rw, "decl", None)
        _COMPILED[r] = (rw, (str(rw), *((str(decl),) if decl is not None else ())))
    return _COMPILED[r]


def _main_ruleset(rules: Sequence[Rule], tag: str) -> tuple[Any, dict[str, str]]:
    main = ruleset(name=tag)
    by_key: dict[str, str] = {}
    for r in rules:
        rw, keys = _compiled(r)
        main.register(rw)
        for k in keys:
            by_key[k] = r.name
    if any(r.value_guarded for r in rules):  # the sign facts the value guards read
        from .signs import sign_rules

        main.register(*sign_rules())
    return main, by_key


class SaturationPanic(RuntimeError):
    """egglog panicked while running the rules (e.g. ``Illegal merge``: a rule merged values of different
    shapes); the e-graph is not usable. :func:`verimirage.pipeline.superopt.superoptimize` catches it and runs
    again without the user rules (then without any), reporting why."""


def _run(eg: EGraph, what: Any) -> Any:
    try:
        return eg.run(what)
    except Exception as e:  # egglog reports a panic as EggSmolError ("Panic: Illegal merge ...")
        if type(e).__name__ == "EggSmolError" or "panic" in str(e).lower():
            raise SaturationPanic(str(e).splitlines()[0][:300]) from None
        raise


def saturate(
    lifted: Lifted, rules: list[Rule], *, iter_limit: int, node_limit: int, time_budget_s: float
) -> tuple[SaturationStats, dict[str, Any]]:
    """Run ``rules`` on ``lifted`` until saturation or a limit; returns stats and the serialised e-graph.
    :class:`SaturationPanic` if egglog panics."""
    t0, wall0 = cpu_seconds(), time.perf_counter()  # (the budget is CPU seconds: load-independent)
    eg = lifted.egraph
    stats = SaturationStats()
    main, by_key = _main_ruleset(rules, f"search_{id(lifted)}")
    _run(eg, shapes.saturate())
    for it in range(iter_limit):
        if cpu_seconds() - t0 > time_budget_s:
            stats.stop_reason = "time budget"
            break
        rep = _run(eg, main)
        _run(eg, shapes.saturate())
        stats.iterations = it + 1
        for key, n in getattr(rep, "num_matches_per_rule", {}).items():
            name = by_key.get(str(key), str(key))
            if name not in by_key.values() and ("t_pos" in name or "t_nonneg" in name):
                continue  # a sign rule (an analysis, not a rewrite)
            if n:
                stats.fired[name] = stats.fired.get(name, 0) + int(n)
        n_nodes = _num_nodes(eg)
        stats.enodes = n_nodes
        if not getattr(rep, "updated", True):
            stats.stop_reason = "saturated"
            break
        if n_nodes > node_limit:
            stats.stop_reason = f"node limit ({n_nodes} > {node_limit})"
            break
    else:
        stats.stop_reason = f"iteration limit ({iter_limit})"
    data = serialized(eg)
    stats.enodes = sum(1 for k in data["nodes"] if "primitive" not in k)
    stats.eclasses = len(data.get("class_data", {}))
    stats.seconds = time.perf_counter() - wall0
    log.info("e-graph: %d iterations, %s, %d e-nodes", stats.iterations, stats.stop_reason, stats.enodes)
    return stats, data


# --------------------------------------------------------------------------- rule attribution


@dataclass(frozen=True)
class Attribution:
    """The rules a rewritten term was derived with. ``exact``: ``rules`` is the rule set of a derivation
    from the input term to it (each rule on it, none missing); otherwise (the derivation could not be
    reproduced within the limits) every rule that fired, conservatively."""

    rules: tuple[str, ...]
    exact: bool


class _Reach:
    """Which targets lie in the input's e-classes when only some rules run (memoised per rule subset).

    The e-graph of ``graph`` (lifted once; each run works on a pushed copy) is saturated with the subset
    for at most ``iterations`` rounds (and ``node_limit`` nodes), stopping once every target is reached.
    A target is a tuple of terms, one per output; it is reached when each term is in the e-class of its
    output (``check``: nothing is added).
    """

    def __init__(self, graph: Graph, rules: Sequence[Rule], targets: Sequence[Sequence[Term]], iterations: int,
                 node_limit: int) -> None:
        self.graph = graph
        self.by_name = {r.name: r for r in rules}
        self.targets = [tuple(t) for t in targets]
        self.iterations = iterations
        self.node_limit = node_limit
        self.memo: dict[frozenset[str], frozenset[int]] = {}
        self.first: dict[int, int] = {}  # target -> the round it was first reached in (by the first run)
        self.runs = 0
        self.lifted: Lifted | None = None
        self.facts: list[list[Any]] = []

    def __call__(self, subset: frozenset[str]) -> frozenset[int]:
        if subset not in self.memo:
            self.memo[subset] = self._run(subset)
        return self.memo[subset]

    def _run(self, subset: frozenset[str]) -> frozenset[int]:
        self.runs += 1
        if self.lifted is None:  # one e-graph of the input, shapes set; each run works in a pushed copy
            self.lifted = lift(self.graph)
            self.lifted.egraph.run(shapes.saturate())
            memo: dict[Term, Any] = {}
            self.facts = [[eq(term_to_egg(t, memo)).to(root) for t, root in zip(tgt, self.lifted.roots, strict=True)]
                          for tgt in self.targets]
        eg, facts = self.lifted.egraph, self.facts
        reached: set[int] = set()

        def check(rnd: int) -> None:
            for k, fs in enumerate(facts):
                if k not in reached and all(eg.check_bool(f) for f in fs):
                    reached.add(k)
                    self.first.setdefault(k, rnd)

        eg.push()
        try:
            check(0)
            rules = [r for n, r in self.by_name.items() if n in subset]
            if rules:
                main, _ = _main_ruleset(rules, f"attr_{id(self)}_{self.runs}")
                for rnd in range(1, self.iterations + 1):
                    if len(reached) == len(facts):
                        break
                    try:
                        rep = _run(eg, main)
                        _run(eg, shapes.saturate())
                    except SaturationPanic as e:
                        log.warning("rule attribution: egglog panicked replaying %s: %s", sorted(subset), e)
                        break
                    check(rnd)
                    if not getattr(rep, "updated", True) or _num_nodes(eg) > self.node_limit:
                        break
        finally:
            eg.pop()
        return frozenset(reached)


def attribute(
    graph: Graph, rules: Sequence[Rule], fired: Mapping[str, int], targets: Sequence[Sequence[Term]],
    *, iterations: int, node_limit: int,
) -> list[Attribution]:
    """The rules on a derivation from ``graph``'s output terms to each target (a tuple of terms, one per
    output), by replaying the saturation with rule subsets.

    Only rules that fired can lie on a derivation. A rule is *necessary* for a target when the target is
    not reached without it; when the necessary rules alone reach the target, they are exactly the rules
    of every shortest-in-rules derivation. Otherwise (alternative derivations) rules are dropped one at
    a time, in rule order, while the target stays reachable: what is left is the rule set of one
    derivation, each rule on it needed. A target the full set does not reach again (limits) gets every
    fired rule (``exact=False``).
    """
    from .lift import graph_terms

    originals = tuple(graph_terms(graph))
    cand = [r.name for r in rules if fired.get(r.name)]
    order = {n: i for i, n in enumerate(r.name for r in rules)}
    out: list[Attribution | None] = [Attribution((), True) if tuple(t) == originals else None for t in targets]
    todo = [k for k, a in enumerate(out) if a is None]
    if not todo:
        return [a for a in out if a is not None]
    reach = _Reach(graph, rules, [targets[k] for k in todo], iterations, node_limit)
    full = frozenset(cand)
    ok = reach(full)
    # fewer rules never reach a term sooner (each round's e-graph is a part of the full run's): replays stop
    # one round after the round the full set reached every target in
    if ok:
        reach.iterations = min(reach.iterations, 1 + max(reach.first[i] for i in ok))
    necessary: dict[int, set[str]] = {i: set() for i in range(len(todo))}
    for r in cand:
        without = reach(full - {r})
        for i in ok - without:
            necessary[i].add(r)
    for i, k in enumerate(todo):
        if i not in ok:
            out[k] = Attribution(tuple(cand), False)
            continue
        subset = frozenset(necessary[i])
        if i not in reach(subset):
            kept = set(full)
            for r in cand:
                if r not in necessary[i] and i in reach(frozenset(kept - {r})):
                    kept.discard(r)
            subset = frozenset(kept)
        out[k] = Attribution(tuple(sorted(subset, key=order.__getitem__)), True)
    log.info("rule attribution: %d target(s), %d saturation replay(s)", len(todo), reach.runs)
    return [a for a in out if a is not None]
