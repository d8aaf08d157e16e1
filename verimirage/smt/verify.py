"""``vm.verify``: are two programs the same function? Both checks must prove it.

1. the finite-field test (:mod:`verimirage.smt.ff`): fresh random fields and
   inputs per trial, stated false-accept bound; a mismatch is a refutation;
2. the abstract-expression check (:mod:`verimirage.smt.abstract` +
   :mod:`verimirage.smt.z3enc`): both programs' outputs normalised by laws that
   are each tested, the remaining equality decided by Z3 per output and index box.

``Proved`` needs both, the same input and output dtypes (a cast is an explicit
op), and a finite-field bound no larger than
:data:`~verimirage.smt.ff.MAX_ACCEPTABLE_BOUND`. A finite-field mismatch is
``Refuted`` only with float inputs on which the programs differ in float64
(:func:`float_witness`; replayable with ``vm.evaluate``), else ``Unknown``;
anything else is ``Unknown`` with the reason. The finite-field record states a
probability only where it is one (``stated_bound``; see
:func:`verimirage.smt.ff.stated_bound`).
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
import z3

from ..ir.errors import GraphError
from ..ir.graph import Graph
from ..ir.reference import check_evaluable, evaluate
from . import abstract as A
from . import budget as B
from . import deep
from . import defined as D
from . import expr as E
from .ff import (
    MAX_ACCEPTABLE_BOUND,
    FFReference,
    FFResult,
    applies_log,
    collect_here,
    ff_test,
    ff_test_p_or_q,
    refutation_inputs,
)
from .verdict import Check, Outcome, Proved, Refuted, Unknown, Verdict
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
        check_evaluable(x, "verify")  # sizes bounded before anything is allocated
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

    outcome: Outcome  # PROVED or UNKNOWN (the abstraction never refutes)
    reason: str
    queries: tuple[Query, ...]
    laws: tuple[str, ...]
    cases: tuple[tuple[tuple[tuple[int, int], ...], ...], ...]
    seconds: float


def abstract_check(a: Graph, b: Graph, *, timeout_s: float = 10.0,
                   cancel: threading.Event | None = None) -> AbstractResult:
    """Derive both programs' abstract expressions and ask Z3 whether each output pair can differ.

    ``cancel``: when set (checked between queries), stop and return ``unknown`` ("cancelled").
    ``timeout_s`` limits the Z3 queries, counted from the end of the derivation (which has its own budget,
    :func:`verimirage.smt.budget.derive_budget_s`): on a loaded machine a derivation of a few CPU seconds
    took longer than the queries' limit and left them no time at all ("time limit reached").

    When an output's normal forms differ, it is asked once more with nested sums over independent
    ranges in their canonical order (:func:`verimirage.smt.expr.canon_sums`: Fubini and factors moved
    into the innermost sum, laws ``sum-interchange`` and ``sum-factor-out``); that query, named
    ``...:fubini``, is recorded instead when it proves the output (so proofs that never needed it
    keep their queries).

    Before any query, the candidate ``b`` must be defined wherever the source ``a`` is (every partial op
    of ``b`` inside its domain where ``a``'s are: :func:`verimirage.smt.defined.refines_outputs`); if not,
    ``unknown`` naming the op and its condition.

    It runs in a thread with a deep stack (:func:`verimirage.smt.deep.deep_call`), so programs of a
    few thousand nodes derive; a term, constant or query past a cap of :mod:`verimirage.smt.limits`
    (or Z3 out of memory) is ``unknown`` with the reason.
    """
    return deep.deep_call(_abstract_check, a, b, timeout_s=timeout_s, cancel=cancel)


def _abstract_check(a: Graph, b: Graph, *, timeout_s: float, cancel: threading.Event | None) -> AbstractResult:
    """:func:`_abstract_check_within` under a derivation budget (:func:`verimirage.smt.budget.derive_budget_s`):
    the derivation is pure Python and only its checkpoints can stop it, so without one a program whose terms
    blow up slowly (a full-size decoder layer) held the caller for many minutes. Past the budget, or once
    ``cancel`` is set, the check is ``unknown`` with the reason."""
    t0 = time.perf_counter()
    budget = B.derive_budget_s(timeout_s)
    token = B.set_budget(budget, cancel)
    try:
        return _abstract_check_within(a, b, timeout_s=timeout_s, cancel=cancel)
    except B.DerivationStopped as e:
        why = "cancelled" if str(e) == "cancelled" else f"{e} ({budget:.0f} s for a query limit of {timeout_s:g} s)"
        return AbstractResult(Outcome.UNKNOWN, f"abstraction: {why}", (), (), (), time.perf_counter() - t0)
    finally:
        B.reset_budget(token)


def _abstract_check_within(a: Graph, b: Graph, *, timeout_s: float,
                           cancel: threading.Event | None) -> AbstractResult:
    t0 = time.perf_counter()
    try:
        cases, ((ea, la, da), (eb, lb, db)) = A.derive_all([a, b])
        undefined = D.refines_outputs(da, db)
    except (E.AbstractionError, E.NeedSplit, RecursionError, MemoryError) as e:
        return AbstractResult(Outcome.UNKNOWN, f"abstraction: {e}", (), (), (), time.perf_counter() - t0)
    if undefined is not None:
        return AbstractResult(Outcome.UNKNOWN, undefined, (), tuple(sorted(la | lb)),
                              tuple(tuple(cs) for cs in cases), time.perf_counter() - t0)
    tq = time.perf_counter()  # the queries' time limit starts now
    queries: list[Query] = []
    outcome, reason = Outcome.PROVED, "every output equal"
    for k, (xs, ys) in enumerate(zip(ea, eb, strict=True)):
        for ci, (x, y) in enumerate(zip(xs, ys, strict=True)):
            left = timeout_s - (time.perf_counter() - tq)
            stopped = cancel is not None and cancel.is_set()
            if left <= 0 or stopped:
                why = "cancelled" if stopped else "time limit reached"
                return AbstractResult(Outcome.UNKNOWN, why, tuple(queries), tuple(sorted(la | lb)),
                                      tuple(tuple(cs) for cs in cases), time.perf_counter() - t0)
            try:
                q = equivalence_query(f"eq:out{k}:case{ci}", x, y, timeout_s=max(0.1, left))
            except (E.AbstractionError, z3.Z3Exception, MemoryError) as e:
                return AbstractResult(Outcome.UNKNOWN, f"output {k} case {ci}: {type(e).__name__}: {e}", tuple(queries),
                                      tuple(sorted(la | lb)), tuple(tuple(cs) for cs in cases),
                                      time.perf_counter() - t0)
            if q.result != "unsat":
                # the construction normal forms differ: try again with nested sums in their canonical
                # (Fubini) form; this query replaces the first only when it proves the pair
                try:
                    (xc, lx), (yc, ly) = E.canon_sums(x), E.canon_sums(y)
                except (E.AbstractionError, RecursionError):
                    xc, yc, lx, ly = x, y, set(), set()
                left = timeout_s - (time.perf_counter() - tq)
                if (xc, yc) != (x, y) and left > 0:
                    try:
                        q2 = equivalence_query(f"eq:out{k}:case{ci}:fubini", xc, yc, timeout_s=max(0.1, left))
                    except (E.AbstractionError, z3.Z3Exception, MemoryError):
                        q2 = q
                    if q2.result == "unsat":
                        q = q2
                        la |= lx | ly
            queries.append(q)
            if q.result != "unsat" and outcome == Outcome.PROVED:
                outcome = Outcome.UNKNOWN
                reason = (f"output {k} case {ci}: z3 says {q.result} (the normal forms differ: "
                          f"{E.pretty(x)[:200]} vs {E.pretty(y)[:200]})")
    return AbstractResult(outcome, reason, tuple(queries), tuple(sorted(la | lb)),
                          tuple(tuple(cs) for cs in cases), time.perf_counter() - t0)


#: float64 outputs differ beyond this (relative to the output's magnitude) for a float witness
WITNESS_RTOL = 1e-6


def _float_inputs(a: Graph, seed: int) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Candidate float inputs for a witness: random normal, positive, wide and integer-valued sets."""
    rng = np.random.default_rng([seed, 0xF10A7])
    shapes = [(str(t.name), tuple(t.shape)) for t in a.inputs]
    sets: list[tuple[str, dict[str, np.ndarray]]] = []
    for kind in ("normal", "normal", "positive", "wide", "small-int", "normal-x10"):
        ins = {}
        for n, s in shapes:
            if kind == "normal":
                ins[n] = rng.standard_normal(s)
            elif kind == "positive":
                ins[n] = rng.uniform(0.25, 4.0, s)
            elif kind == "wide":
                ins[n] = rng.uniform(-3.0, 3.0, s)
            elif kind == "small-int":
                ins[n] = rng.integers(-3, 4, s).astype(np.float64)
            else:
                ins[n] = 10.0 * rng.standard_normal(s)
        sets.append((kind, ins))
    return sets


def _differences(oa: Sequence[np.ndarray], ob: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """Per differing output, the element where float64 outputs ``oa`` and ``ob`` differ most beyond
    :data:`WITNESS_RTOL` (relative to the larger finite magnitude). Only elements finite in both count: NaN or
    an infinity on either side (e.g. log of a negative input) is undefinedness, not a difference."""
    diffs = []
    for k, (x, y) in enumerate(zip(oa, ob, strict=True)):
        both = np.isfinite(x) & np.isfinite(y)
        xs, ys = np.where(both, x, 0.0), np.where(both, y, 0.0)
        scale = max(float(np.max(np.abs(xs), initial=0.0)), float(np.max(np.abs(ys), initial=0.0)), 1e-300)
        gap = np.abs(xs - ys)
        bad = both & (gap > WITNESS_RTOL * scale + 1e-12)
        if bad.any():
            idx = tuple(int(v) for v in np.unravel_index(int(np.argmax(np.where(bad, gap, -1.0))), x.shape))
            diffs.append({"output": k, "index": idx, "a": float(x[idx]), "b": float(y[idx])})
    return diffs


def float_witness(a: Graph, b: Graph, seed: int = 0, *, budget_s: float = 5.0) -> dict[str, Any] | None:
    """Float inputs on which ``a`` and ``b`` differ in float64 beyond tolerance, both finite, found by a small
    search (random normal, positive, wide, integer-valued and scaled sets; a set where they differ only by NaN or
    an infinity is passed over); None if none is found. The result
    (``float_inputs``, ``float_differences``, ``float_kind``) is replayable: ``vm.evaluate`` both
    programs on ``float_inputs`` and compare."""
    t0 = time.perf_counter()
    for kind, ins in _float_inputs(a, seed):
        if time.perf_counter() - t0 > budget_s:
            break
        diffs = _differences(evaluate(a, ins), evaluate(b, ins))
        if diffs:
            return {"float_inputs": ins, "float_differences": diffs, "float_kind": kind}
    return None


#: how the finite-field test compares outputs when it projects them (:func:`verimirage.smt.ff.observe`)
PROJECTION = "sum(O*U*r) mod p, U over O.shape[:-1], r over the last axis"


def _ff_check(r: FFResult) -> Check:
    equal = r.outcome == Outcome.PROVED
    # ``false_accept_bound`` is the per-node model's figure (what the trial count and the certificate record
    # use); ``stated_bound`` is the probability the test states (None: none, ``bound_note`` says why)
    params = (("p", r.p), ("q", r.q), ("g", r.g), ("seeds", r.seeds), ("trials", r.trials),
              ("per_trial_bound", r.per_trial_bound), ("false_accept_bound", r.bound if equal else 1.0),
              ("stated_bound", r.stated_bound if equal else None), ("bound_note", r.bound_note),
              ("projection", PROJECTION if r.projected else "none"), ("products_on", r.device))
    return Check("finite-field", r.outcome, params, r.seconds, r.reason)


def _dtype_mismatch(a: Graph, b: Graph) -> str | None:
    """Why the two programs' input or output dtypes differ (None: they match)."""
    da = {str(t.name): t.dtype for t in a.inputs}
    for t in b.inputs:
        if da.get(str(t.name)) != t.dtype:
            return (f"input {t.name!r} is {da.get(str(t.name))!r} in the first program and {t.dtype!r} in the "
                    "second; the programs must take the same dtypes (a cast is an explicit op)")
    for k, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True)):
        if x.dtype != y.dtype:
            return (f"output {k} is {x.dtype!r} in the first program and {y.dtype!r} in the second; the programs "
                    "must return the same dtypes (a cast is an explicit op)")
    return None


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
        check_evaluable(target, "verify")
        self.target = target
        self.seed = seed
        self.trials = trials
        self.timeout_s = timeout_s
        self.reference = FFReference(target, seed=seed)

    def check(self, candidate: Graph, *, timeout_s: float | None = None, prove_only: bool = False) -> Verdict:
        """Is ``candidate`` the same function as the target? (See :func:`verify`.)

        ``prove_only`` (a search, which keeps only what is proved): once the abstract check ends without
        proving the pair, the finite-field test starts no further trial, and the verdict is ``Unknown`` where
        :func:`verify` might have found it ``Refuted``; ``Proved`` means exactly what it means there (both
        checks ran to the end and proved it)."""
        return _verify(self.target, candidate, self.reference, trials=self.trials, seed=self.seed,
                       timeout_s=self.timeout_s if timeout_s is None else timeout_s, prove_only=prove_only)


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


def _verify(a: Graph, b: Graph, ref: FFReference, *, trials: int | None, seed: int, timeout_s: float,
            prove_only: bool = False) -> Verdict:
    check_compatible(a, b)
    why = _dtype_mismatch(a, b)
    if why is not None:
        return Unknown(f"dtypes differ: {why}", (Check("dtypes", Outcome.UNKNOWN, (), 0.0, why),))
    # the abstract check (Python and Z3, one thread) runs beside the finite-field trials (numpy, which
    # releases the GIL); it is always joined before returning, so Z3 is never used by two checks at once
    with collect_here(), concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vm-z3") as pool:
        cancel = threading.Event()
        abs_future = pool.submit(contextvars.copy_context().run, abstract_check, a, b, timeout_s=timeout_s,
                                 cancel=cancel)
        ff_cancel: threading.Event | None = None
        if prove_only:
            ff_cancel = threading.Event()

            def abstract_done(f: concurrent.futures.Future[AbstractResult]) -> None:
                if f.cancelled() or f.exception() is not None or f.result().outcome != Outcome.PROVED:
                    ff_cancel.set()  # (no Proved is possible: the trials left cannot change that)

            abs_future.add_done_callback(abstract_done)
        ffr: FFResult | None = None
        try:
            # (with log, a p-part refutation is located only if the q-world test does not replace it)
            ffr = ff_test(a, b, seed=seed, trials=trials, reference=ref, cancel=ff_cancel,
                          locate=not applies_log(a, b))
            ffr = ff_test_p_or_q(a, b, ffr, seed=seed)  # programs with log: their q-parts, where log is exact
        finally:
            if ffr is None or ffr.outcome == Outcome.REFUTED:
                cancel.set()  # an error or a refutation does not need the abstract check
        absr = abs_future.result()
    ffc = _ff_check(ffr)
    if ffr.outcome == Outcome.REFUTED:
        return _refuted_or_unknown(a, b, ffr, ffc, seed)
    abc = _abs_check(absr)
    ev = (ffc, abc)
    if ffr.outcome == Outcome.PROVED and absr.outcome == Outcome.PROVED:
        if ffr.bound > MAX_ACCEPTABLE_BOUND:
            return Unknown(f"finite-field: {ffr.trials} trial(s) give bound {ffr.bound:.3g}, above the acceptable "
                           f"{MAX_ACCEPTABLE_BOUND:.3g}: run more trials (trials=None chooses enough)", ev)
        _remember_proved(a, b, absr)
        stated = (f"false-accept bound {ffr.stated_bound:.2g}" if ffr.stated_bound is not None
                  else f"per-node model bound {ffr.bound:.2g}, no probability stated")
        return Proved(f"finite-field ({ffr.trials} trials, {stated}) and abstract-z3 "
                      f"({len(absr.queries)} queries) both prove equivalence", ev)
    reasons = [f"{c.name}: {c.detail}" for c in ev if c.outcome != Outcome.PROVED]
    if any(q.result == "sat" for q in absr.queries):
        # z3 found the normal forms different (the field test may be blind to it, e.g. ``max(x, 1)`` is
        # ``x`` on residues): a float witness makes it a refutation
        try:
            w = float_witness(a, b, seed)
        except Exception:  # (an evaluation error leaves it Unknown)
            w = None
        if w is not None:
            d = w["float_differences"][0]
            return Refuted(f"{'; '.join(reasons)}; float64 witness ({w['float_kind']} inputs): output {d['output']} "
                           f"at {d['index']} is {d['a']:.6g} vs {d['b']:.6g}", ev, dict(w))
    return Unknown("; ".join(reasons), ev)


def _refuted_or_unknown(a: Graph, b: Graph, ffr: FFResult, ffc: Check, seed: int) -> Verdict:
    """A finite-field mismatch: ``Refuted`` with replayable float inputs on which the programs differ in
    float64 (:func:`float_witness`), else ``Unknown`` (the field's model of max / relu / sqrt can tell
    apart programs equal over the reals)."""
    cex: dict[str, Any] = {"ff_inputs": refutation_inputs(a, ffr),
                           "ff_field": {"p": ffr.p[-1], "q": ffr.q[-1], "g": ffr.g[-1], "seed": ffr.seeds[-1]},
                           "output": ffr.output, "index": ffr.index}
    try:
        w = float_witness(a, b, seed)
    except Exception as e:  # (an evaluation error leaves the mismatch unconfirmed)
        w, cex["float_error"] = None, str(e)
    if w is not None:
        cex.update(w)
        d = w["float_differences"][0]
        return Refuted(f"finite-field test: {ffr.reason}; float64 witness ({w['float_kind']} inputs): output "
                       f"{d['output']} at {d['index']} is {d['a']:.6g} vs {d['b']:.6g}", (ffc,), cex)
    unk = Check(ffc.name, Outcome.UNKNOWN, ffc.params, ffc.seconds, ffc.detail)
    return Unknown(f"finite-field test: {ffr.reason}, but no float inputs were found on which the programs "
                   "differ in float64, both finite (the field's order / oracle model may separate programs equal "
                   "over the reals; NaN or an infinity on either side is undefinedness, not a difference)", (unk,))


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
    """A rewrite rule is sound if every instance pair (lhs, rhs as small concrete graphs) is Proved.

    Pass :meth:`verimirage.rewrite.rules.Rule.instance_graphs`, which adds generic instances to the author's
    (a rule is not proved on size-1 dims, coincident dims or identity constants only); a list of instances
    that are all degenerate (every input dim 1) is Unknown here, and a pair of programs that cannot be
    compared (output shapes differ) is Unknown with the reason."""
    if not instances:
        return Unknown(f"rule {name!r}: no instances given", ())
    checks: list[Check] = []
    if all(all(d <= 1 for t in lhs.inputs for d in t.shape) for lhs, _ in instances):
        return Unknown(f"rule {name!r}: every instance is degenerate (every input dim is 1); give instances "
                       "with dims > 1 (Rule.instance_graphs adds generic ones)", ())
    for i, (lhs, rhs) in enumerate(instances):
        try:
            v = verify(lhs, rhs, timeout_s=timeout_s)
        except GraphError as e:
            return Unknown(f"rule {name!r} instance {i}: {str(e).splitlines()[0]}", tuple(checks))
        checks.extend(Check(f"{name}[{i}]:{c.name}", c.outcome, c.params, c.seconds, c.detail) for c in v.evidence)
        if not isinstance(v, Proved):
            cls = Refuted if isinstance(v, Refuted) else Unknown
            extra = {"counterexample": v.counterexample} if isinstance(v, Refuted) else {}
            return cls(f"rule {name!r} instance {i}: {v.reason}", tuple(checks), **extra)  # type: ignore[arg-type]
    return Proved(f"rule {name!r}: all {len(instances)} instance(s) proved", tuple(checks))
