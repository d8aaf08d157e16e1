"""``vm.verify``: are two programs the same function? Both checks must prove it.

1. the finite-field test (:mod:`verimirage.smt.ff`): fresh random fields and
   inputs per trial, stated false-accept bound; a mismatch is a refutation;
2. the abstract-expression check (:mod:`verimirage.smt.abstract` +
   :mod:`verimirage.smt.z3enc`): both programs' outputs normalised by laws that
   are each tested, the remaining equality decided by Z3 per output and index box.

``Proved`` needs both; a finite-field mismatch is ``Refuted`` (with the
counterexample inputs and, when they differ, float64 outputs); anything else
is ``Unknown`` with the reason.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.errors import GraphError
from ..ir.graph import Graph
from ..ir.interpret import evaluate
from . import abstract as A
from . import expr as E
from .ff import FFReference, FFResult, collect_here, ff_test
from .verdict import Check, Proved, Refuted, Unknown, Verdict
from .z3enc import Query, equivalence_query

log = logging.getLogger(__name__)


def _sig(g: Graph) -> list[tuple[str, tuple[int, ...]]]:
    return [(str(t.name), t.shape) for t in g.inputs]


def check_compatible(a: Any, b: Any) -> None:
    """GraphError unless ``a`` and ``b`` are programs with the same inputs (names, shapes) and output shapes."""
    for x, w in ((a, "first"), (b, "second")):
        if not isinstance(x, Graph):
            raise GraphError(f"verify: the {w} program is a {type(x).__name__}; expected a vm.Graph or vm.MuGraph")
        x.check(unused_inputs=True)  # an input a program ignores is fine: it is constant in that input
    sa, sb = _sig(a), _sig(b)
    if sorted(sa) != sorted(sb):
        raise GraphError(f"verify: the programs' inputs differ: {sa} vs {sb}; expected the same names and shapes")
    oa = [t.shape for t in a.outputs]
    ob = [t.shape for t in b.outputs]
    if oa != ob:
        raise GraphError(f"verify: the programs' output shapes differ: {oa} vs {ob}; expected equal lists")


@dataclass(frozen=True)
class AbstractResult:
    """Outcome of the abstract-expression check."""

    outcome: str  # "proved" | "unknown"
    reason: str
    queries: tuple[Query, ...]
    laws: tuple[str, ...]
    cases: tuple[tuple[tuple[tuple[int, int], ...], ...], ...]
    seconds: float


def abstract_check(a: Graph, b: Graph, *, timeout_s: float = 10.0,
                   cancel: threading.Event | None = None) -> AbstractResult:
    """Derive both programs' abstract expressions and ask Z3 whether each output pair can differ.

    ``cancel``: when set (checked between queries), stop and return ``unknown`` ("cancelled").

    When an output's normal forms differ, it is asked once more with nested sums over independent
    ranges in their canonical order (:func:`verimirage.smt.expr.canon_sums`: Fubini and factors moved
    into the innermost sum, laws ``sum-interchange`` and ``sum-factor-out``); that query, named
    ``...:fubini``, is recorded instead when it proves the output (so proofs that never needed it
    keep their queries).
    """
    t0 = time.perf_counter()
    try:
        derived: A.Derived = {}
        cases = [A.output_cases([a, b], k, t.shape, derived) for k, t in enumerate(a.outputs)]
        ea, la = A.derive(a, cases, derived)
        eb, lb = A.derive(b, cases, derived)
    except (E.AbstractionError, E.NeedSplit, RecursionError) as e:
        return AbstractResult("unknown", f"abstraction: {e}", (), (), (), time.perf_counter() - t0)
    queries: list[Query] = []
    outcome, reason = "proved", "every output equal"
    for k, (xs, ys) in enumerate(zip(ea, eb, strict=True)):
        for ci, (x, y) in enumerate(zip(xs, ys, strict=True)):
            left = timeout_s - (time.perf_counter() - t0)
            stopped = cancel is not None and cancel.is_set()
            if left <= 0 or stopped:
                why = "cancelled" if stopped else "time limit reached"
                return AbstractResult("unknown", why, tuple(queries), tuple(sorted(la | lb)),
                                      tuple(tuple(c.ranges for c in cs) for cs in cases), time.perf_counter() - t0)
            q = equivalence_query(f"eq:out{k}:case{ci}", x, y, timeout_s=max(0.1, left))
            if q.result != "unsat":
                # the construction normal forms differ: try again with nested sums in their canonical
                # (Fubini) form; this query replaces the first only when it proves the pair
                try:
                    (xc, lx), (yc, ly) = E.canon_sums(x), E.canon_sums(y)
                except (E.AbstractionError, RecursionError):
                    xc, yc, lx, ly = x, y, set(), set()
                left = timeout_s - (time.perf_counter() - t0)
                if (xc, yc) != (x, y) and left > 0:
                    q2 = equivalence_query(f"eq:out{k}:case{ci}:fubini", xc, yc, timeout_s=max(0.1, left))
                    if q2.result == "unsat":
                        q = q2
                        la |= lx | ly
            queries.append(q)
            if q.result != "unsat" and outcome == "proved":
                outcome = "unknown"
                reason = (f"output {k} case {ci}: z3 says {q.result} (the normal forms differ: "
                          f"{E.pretty(x)[:200]} vs {E.pretty(y)[:200]})")
    return AbstractResult(outcome, reason, tuple(queries), tuple(sorted(la | lb)),
                          tuple(tuple(c.ranges for c in cs) for cs in cases), time.perf_counter() - t0)


def _float_counterexample(a: Graph, b: Graph, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    ins = {str(t.name): rng.standard_normal(t.shape) for t in a.inputs}
    oa, ob = evaluate(a, ins), evaluate(b, ins)
    diffs = []
    for k, (x, y) in enumerate(zip(oa, ob, strict=True)):
        if not np.allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True):
            i = int(np.argmax(np.abs(np.nan_to_num(x - y))))
            idx = tuple(int(v) for v in np.unravel_index(i, x.shape))
            diffs.append({"output": k, "index": idx, "a": float(x[idx]), "b": float(y[idx])})
    return {"float_inputs": ins, "float_differences": diffs}


#: how the finite-field test compares outputs when it projects them (:func:`verimirage.smt.ff.observe`)
PROJECTION = "sum(O*U*r) mod p, U over O.shape[:-1], r over the last axis"


def _ff_check(r: FFResult) -> Check:
    outcome = {"equal": "proved", "differ": "refuted"}.get(r.outcome, "unknown")
    params = (("p", r.p), ("q", r.q), ("g", r.g), ("seeds", r.seeds), ("trials", r.trials),
              ("per_trial_bound", r.per_trial_bound), ("false_accept_bound", r.bound if outcome == "proved" else 1.0),
              ("projection", PROJECTION if r.projected else "none"), ("products_on", r.device))
    return Check("finite-field", outcome, params, r.seconds, r.reason)


def _abs_check(r: AbstractResult) -> Check:
    params = (("queries", tuple(q.name for q in r.queries)), ("laws", r.laws),
              ("cores", tuple((q.name, q.core) for q in r.queries)), ("cases", r.cases))
    return Check("abstract-z3", r.outcome, params, r.seconds, r.reason)


class Verifier:
    """Verify many candidates against one target program, reusing the target's work.

    The finite-field trials are a fixed stream from ``seed``; the target's per-trial outputs are
    computed once (:class:`verimirage.smt.ff.FFReference`) and every :meth:`check` evaluates only the
    candidate. Verdicts are the same as ``verify(target, candidate, seed=seed, ...)``.

    Example (a search)::

        v = Verifier(graph)
        for mg in candidates:
            verdict = v.check(mg)
    """

    def __init__(self, target: Graph, *, seed: int = 0, trials: int | None = None, timeout_s: float = 10.0) -> None:
        if not isinstance(target, Graph):
            raise GraphError(f"Verifier: the target is a {type(target).__name__}; expected a vm.Graph or vm.MuGraph")
        target.check(unused_inputs=True)
        self.target = target
        self.seed = seed
        self.trials = trials
        self.timeout_s = timeout_s
        self.reference = FFReference(target, seed=seed)

    def check(self, candidate: Graph, *, timeout_s: float | None = None) -> Verdict:
        """Is ``candidate`` the same function as the target? (See :func:`verify`.)"""
        return _verify(self.target, candidate, self.reference, trials=self.trials, seed=self.seed,
                       timeout_s=self.timeout_s if timeout_s is None else timeout_s)


#: recent targets of :func:`verify` (canonical text, seed) -> Verifier, so a search that calls
#: ``verify(graph, candidate)`` repeatedly evaluates ``graph`` once per trial
_RECENT: OrderedDict[tuple[str, int, int | None], Verifier] = OrderedDict()
_RECENT_MAX = 4


def verifier_for(target: Graph, *, seed: int = 0, trials: int | None = None) -> Verifier:
    """A (cached) :class:`Verifier` for ``target``: the same one for the same program text and seed."""
    key = (str(target), seed, trials)
    v = _RECENT.get(key)
    if v is not None and str(v.target) != key[0]:  # the cached graph object was changed since
        v = None
    if v is None:
        v = Verifier(target, seed=seed, trials=trials)
        _RECENT[key] = v
        while len(_RECENT) > _RECENT_MAX:
            _RECENT.popitem(last=False)
    else:
        _RECENT.move_to_end(key)
    return v


def verify(a: Graph, b: Graph, *, trials: int | None = None, seed: int = 0, timeout_s: float = 10.0) -> Verdict:
    """Are ``a`` and ``b`` (Graph or MuGraph, same inputs) the same function? See the module docstring.

    ``a`` is treated as the target: its finite-field trial outputs are cached (for the last few
    targets), so verifying many candidates against one graph costs one evaluation per candidate and
    trial. For explicit control use :class:`Verifier`.
    """
    check_compatible(a, b)
    return _verify(a, b, verifier_for(a, seed=seed, trials=trials).reference, trials=trials, seed=seed,
                   timeout_s=timeout_s)


def _verify(a: Graph, b: Graph, ref: FFReference, *, trials: int | None, seed: int, timeout_s: float) -> Verdict:
    check_compatible(a, b)
    # the abstract check (Python and Z3, one thread) runs beside the finite-field trials (numpy, which
    # releases the GIL); it is always joined before returning, so Z3 is never used by two checks at once
    with collect_here(), concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vm-z3") as pool:
        cancel = threading.Event()
        abs_future = pool.submit(contextvars.copy_context().run, abstract_check, a, b, timeout_s=timeout_s,
                                 cancel=cancel)
        ffr: FFResult | None = None
        try:
            ffr = ff_test(a, b, seed=seed, trials=trials, reference=ref)
        finally:
            if ffr is None or ffr.outcome == "differ":
                cancel.set()  # an error or a refutation does not need the abstract check
        absr = abs_future.result()
    ffc = _ff_check(ffr)
    if ffr.outcome == "differ":
        cex: dict[str, Any] = {"ff_inputs": ffr.inputs, "ff_field": {"p": ffr.p[-1], "q": ffr.q[-1], "g": ffr.g[-1],
                               "seed": ffr.seeds[-1]}, "output": ffr.output, "index": ffr.index}
        try:
            cex.update(_float_counterexample(a, b, seed))
        except Exception as e:  # the float evaluation is informative only
            cex["float_error"] = str(e)
        return Refuted(f"finite-field test: {ffr.reason}", (ffc,), cex)
    abc = _abs_check(absr)
    ev = (ffc, abc)
    if ffr.outcome == "equal" and absr.outcome == "proved":
        _remember_proved(a, b, absr)
        return Proved(f"finite-field ({ffr.trials} trials, bound {ffr.bound:.2g}) and abstract-z3 "
                      f"({len(absr.queries)} queries) both prove equivalence", ev)
    reasons = [f"{c.name}: {c.detail}" for c in ev if c.outcome != "proved"]
    return Unknown("; ".join(reasons), ev)


#: abstract checks of recently Proved pairs, by program texts (a certificate records their queries)
_PROVED_ABSTRACT: OrderedDict[tuple[str, str], AbstractResult] = OrderedDict()
_PROVED_ABSTRACT_MAX = 16


def _remember_proved(a: Graph, b: Graph, r: AbstractResult) -> None:
    key = (str(a), str(b))
    _PROVED_ABSTRACT[key] = r
    _PROVED_ABSTRACT.move_to_end(key)
    while len(_PROVED_ABSTRACT) > _PROVED_ABSTRACT_MAX:
        _PROVED_ABSTRACT.popitem(last=False)


def proved_abstract(a: Graph, b: Graph) -> AbstractResult | None:
    """The abstract check of a pair that :func:`verify` (or a :class:`Verifier`) proved recently in this
    process, if it is still remembered: the certificate of the pair records its queries without asking
    Z3 again. (The certificate checker re-runs every recorded query itself.)"""
    return _PROVED_ABSTRACT.get((str(a), str(b)))


def verify_rule(name: str, instances: Sequence[tuple[Graph, Graph]], *, timeout_s: float = 10.0) -> Verdict:
    """A rewrite rule is sound if every instance pair (lhs, rhs as small concrete graphs) is Proved."""
    if not instances:
        return Unknown(f"rule {name!r}: no instances given", ())
    checks: list[Check] = []
    for i, (lhs, rhs) in enumerate(instances):
        v = verify(lhs, rhs, timeout_s=timeout_s)
        checks.extend(Check(f"{name}[{i}]:{c.name}", c.outcome, c.params, c.seconds, c.detail) for c in v.evidence)
        if not isinstance(v, Proved):
            cls = Refuted if isinstance(v, Refuted) else Unknown
            extra = {"counterexample": v.counterexample} if isinstance(v, Refuted) else {}
            return cls(f"rule {name!r} instance {i}: {v.reason}", tuple(checks), **extra)  # type: ignore[arg-type]
    return Proved(f"rule {name!r}: all {len(instances)} instance(s) proved", tuple(checks))
