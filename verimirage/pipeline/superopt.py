"""``superoptimize``: lift, saturate, extract, partition, cost, verify, certify.

Phases (each timed in the report):

1. *saturate* — lift the kernel graph into egglog and run the selected rules
   (built-in theories, user rules admitted by ``verify_rule``) under an
   iteration limit, a node limit and a share of the time budget;
2. *extract* — the k cheapest distinct terms of each output's e-class
   (always including the original), turned back into kernel graphs; terms
   that only commute operands of an earlier one, or compute one e-class two
   different ways, are dropped (same programs, or never cheaper);
3. *lower* — every feasible partition of each graph into μGraphs
   (:mod:`verimirage.rewrite.partition`), plus the unfused baseline;
4. *cost* — rank by the cost model, dropping kernels that do not fit shared
   memory (:mod:`verimirage.rewrite.cost` with the backend's launch model, :mod:`.pricing`);
5. *verify* — ``vm.verify`` each candidate against the input graph (one
   ``Verifier`` of the graph for all candidates), best first, until ``top_k``
   are Proved; anything else is rejected with its reason;
6. *attribute* — the rewrite rules each candidate was derived with: the rule
   set of an actual derivation from the input term to its extracted term,
   found by replaying the saturation with rule subsets
   (:func:`verimirage.rewrite.saturate.attribute`);
7. *certify* — a certificate per verified candidate; optionally *profile*
   on a GPU to reorder.

The result is deterministic for a given graph and options.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..clock import cpu_seconds
from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph, input_types, node_list
from ..ir.ops import Prop, get_op
from ..ir.reference import check_evaluable
from ..rewrite.causal import mask_inputs, restore_masks, with_skips
from ..rewrite.cost import Calibration, Cost
from ..rewrite.lift import EClassTerms, Term, commutation_key, lift, term_to_graph
from ..rewrite.partition import Lowered, lower_all
from ..rewrite.rules import Rule, RuleError, select_rules
from ..rewrite.saturate import SaturationPanic, attribute, saturate
from .admit import admit
from .fpsafe import max_shifted as _max_shifted
from .options import SearchOptions, StopReason
from .pricing import cost
from .progress import Progress

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """A verified μGraph with its cost, verdict, certificate and the rules that produced it."""

    mugraph: MuGraph
    cost: Cost
    verdict: Any
    certificate: Any
    rules: tuple[str, ...]
    graph: Graph | None = None  # the rewritten kernel graph it was lowered from
    timing_ms: float | None = None  # GPU median time of its best launch config (profile=True)
    #: who accepted it: ``"vm.verify"`` (the default verifier: ``verdict`` is its Proved, with a certificate),
    #: or ``"custom verifier"`` (``superoptimize(verifier=...)``: ``verdict`` is an Unknown that says so, never
    #: a Proved, and there is no certificate)
    verified_by: str = "vm.verify"

    @property
    def num_kernels(self) -> int:
        """Kernel launches of the μGraph."""
        return self.mugraph.num_kernels

    def __repr__(self) -> str:
        what = type(self.verdict).__name__ if self.verified_by == "vm.verify" else f"accepted by {self.verified_by}"
        return f"Candidate({self.num_kernels} kernel(s), {self.cost}, {what}, rules={list(self.rules)})"


@dataclass
class SearchReport:
    """Search statistics: time per phase, e-graph size, stop reason, rules fired, candidate counts."""

    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: process CPU seconds (every thread) of each phase: on a shared machine these compare, the wall seconds do not
    phase_cpu_seconds: dict[str, float] = field(default_factory=dict)
    egraph_iterations: int = 0
    egraph_enodes: int = 0
    egraph_eclasses: int = 0
    egraph_stop_reason: str = ""
    stop_reason: str = ""
    rules_used: list[str] = field(default_factory=list)
    rules_fired: dict[str, int] = field(default_factory=dict)
    trusted_rules: list[str] = field(default_factory=list)
    terms_extracted: int = 0
    lowered: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (candidate summary, reason)
    verified: int = 0
    notes: list[str] = field(default_factory=list)
    from_cache: str = ""  # the search-cache entry this result was served from ("" = a search ran)
    #: why verification stopped (``stop_reason`` is its text, with the detail)
    stopped: StopReason | None = None
    options: str = ""  # the search's options that differ from the defaults (``str(SearchOptions)``)
    #: how a split program was searched (:mod:`verimirage.pipeline.regions`), region by region, in order
    #: (empty: the program was searched whole)
    regions: list[Any] = field(default_factory=list)
    split: str = ""  # a one-line summary of the split ("" when the program was searched whole)

    def stop(self, why: StopReason, detail: str = "") -> None:
        """Record why the search stopped: ``stopped`` and its text ``stop_reason`` (``detail`` in parentheses)."""
        self.stopped = why
        self.stop_reason = f"{why.value} ({detail})" if detail else why.value

    @property
    def total_seconds(self) -> float:
        """Wall time of the whole search."""
        return sum(self.phase_seconds.values())

    def __str__(self) -> str:
        lines = []
        if self.from_cache:
            lines.append(f"from the search cache: {self.from_cache} (no search ran; superoptimize(..., cache=False) "
                         "or `verimirage cache clear` searches again)")
        lines.append(f"search: {self.total_seconds:.2f}s, stop: {self.stop_reason}")
        if self.options:
            lines.append(f"  options: {self.options}")
        if not self.from_cache:  # a served result ran no phases: its notes hold the original search's report
            lines.append("  phases: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.phase_seconds.items()))
            lines.append(f"  e-graph: {self.egraph_enodes} e-nodes, {self.egraph_eclasses} e-classes, "
                         f"{self.egraph_iterations} iterations ({self.egraph_stop_reason})")
            lines.append(f"  rules fired: {self.rules_fired}")
            if self.split:
                lines.append(f"  split: {self.split}")
                lines += [f"    region {k}: {r}" for k, r in enumerate(self.regions)]
                lines.append(f"  verified {self.verified} against the whole program, rejected {len(self.rejected)}")
            else:
                lines.append(f"  extracted {self.terms_extracted} term(s), lowered {self.lowered} μGraph(s), "
                             f"verified {self.verified}, rejected {len(self.rejected)}")
        else:
            lines.append(f"  served {self.verified} verified candidate(s)")
        for reason, n in sorted(self.pruned.items(), key=lambda p: -p[1])[:8]:
            lines.append(f"  pruned {n}: {reason}")
        for what, why in self.rejected[:8]:
            lines.append(f"  rejected {what}: {why}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class SearchResult:
    """The outcome: verified candidates best first, the best one, and the report."""

    candidates: list[Candidate]
    report: SearchReport

    @property
    def best(self) -> Candidate | None:
        """The best verified candidate (None if nothing was verified)."""
        return self.candidates[0] if self.candidates else None


def _default_verifier(graph: Graph, timeout_s: float, seed: int) -> Callable[[Graph, Graph], Any]:
    """``vm.verify(graph, candidate)`` through one :class:`~verimirage.smt.verify.Verifier` of ``graph`` (the
    cached one of ``verifier_for``), so the target's finite-field trials are evaluated once for all candidates
    (and across repeated searches of the same graph, e.g. an ablation)."""
    state: dict[str, Any] = {}

    def run(a: Graph, b: Graph) -> Any:
        if "v" not in state:
            from ..smt.verify import verifier_for

            state["v"] = verifier_for(graph, seed=seed)
        if a is not graph:
            raise ValueError("superoptimize: the default verifier checks candidates against the searched graph")
        if list(input_types(a)) != list(input_types(b)):  # (the compiled candidate is called as the graph is)
            return _unknown(f"the candidate declares its inputs {list(input_types(b))} in another order than the "
                            f"graph's {list(input_types(a))}: called positionally it computes another function")
        return state["v"].check(b, timeout_s=timeout_s, prove_only=True)  # (a search keeps only what is proved)

    return run


def _unknown(reason: str, evidence: Any = ()) -> Any:
    try:
        from ..smt.verdict import Unknown

        return Unknown(reason, tuple(evidence) if isinstance(evidence, (tuple, list)) else ())
    except ImportError:  # pragma: no cover
        return None


def superoptimize(graph: Graph, *, options: SearchOptions | None = None, **overrides: Any) -> SearchResult:
    """Search for verified μGraphs equivalent to kernel graph ``graph``; best (by cost) first.

    Options: ``time_budget_s`` for the whole search, in CPU seconds of the process (:mod:`verimirage.clock`: the
    same program gets the same search on a busy machine as on an idle one, only later); ``node_limit`` /
    ``iter_limit`` for the e-graph;
    ``rulesets`` (built-in theory names or :class:`Ruleset` objects; default: every default rule),
    ``disable_rules`` (rule or theory names), ``extra_rules`` (user rules, each admitted by
    ``verify_rule`` unless ``trusted=True``); ``grids`` (allowed per-axis block counts) and ``franges``
    (allowed for-loop ranges), ``max_splits`` (split-KV); ``top_k`` verified candidates to return, each
    a different kernel structure (the grids of its kernels); ``variants``: besides those, up to this many
    more verified candidates per returned structure that share its grids and differ in loop ranges or
    block graphs, next best by cost (for a GPU profiler to choose among: the cost model ranks such
    siblings least reliably); they follow the ``top_k`` in ``candidates``, best structure's first;
    ``terms_per_class`` / ``max_terms`` for extraction; ``max_verify`` candidates to try verifying;
    ``verify_budget_s``: estimated verification time (:func:`verify_estimate_s`, a deterministic model of
    ``vm.verify`` on a 2-core CPU) to spend on candidates after the first verified one (default
    ``0.5 * time_budget_s``): large graphs return fewer than ``top_k`` candidates rather than blow the time
    budget, and which ones does not depend on the machine's load;
    ``profile=True`` reorders by GPU timings (``verimirage.backend.profile.select``); ``progress``
    shows a rich display (None: when stderr is a terminal); ``seed`` is passed to the verifier's random
    trials; ``verifier`` replaces ``vm.verify`` (research use). ``cache``: serve a repeated search
    from the on-disk cache (:mod:`verimirage.pipeline.search_cache`; not used with a custom
    ``verifier`` or user rules). Nothing from the cache is trusted: on a hit the independent certificate
    checker re-checks the best candidate against ``graph`` and only it is served (a full-size re-check costs
    seconds per candidate); ``recheck_cache=True`` re-checks every cached candidate and serves them all. A
    candidate that does not re-check makes the entry a miss: it is reported, removed and searched again.

    A program too big for one search is searched by regions (:mod:`verimirage.pipeline.regions`): cut before
    every matmul and after ``region_ops`` ops, each region searched, neighbours merged where one search of
    both costs less (at most ``region_ops`` ops; with ``window_ops`` > 0 also runs of three regions of at most that
    many ops), the regions' μGraphs composed and the composition verified
    and certified against the whole program; the report lists the regions (``SearchReport.regions``,
    ``split``). ``split="auto"`` (default) searches a program with one matmul whole, one of more than
    ``whole_ops`` ops by regions, and one in between whole and, when that fused less than one kernel per
    region to start with, by regions too (the cheaper wins); ``"never"``/``"always"`` force one way. With
    regions, ``time_budget_s`` applies to each region's search (every boundary is reconsidered once, whatever
    the time: the regions do not depend on the machine's load). ``tails`` (default on): a dim that no tile of 16
    divides (197 tokens, a vocabulary of 50257) is also split into power-of-two tiles, the last block's tile masked
    (docs/architecture.md "Masked tails").

    The keywords are the fields of :class:`~verimirage.pipeline.options.SearchOptions` (validated once, a
    TypeError for an unknown one); ``options=SearchOptions(...)`` passes them as one value (keywords given
    beside it override its fields). The report prints the options that differ from the defaults.
    """
    opts = SearchOptions.make(options, overrides)
    if not isinstance(graph, Graph) or any(n.op == "custom" for n in node_list(graph)):
        raise GraphError("superoptimize: expected a kernel graph (vm.Graph) without custom kernels")
    graph.check()
    check_evaluable(graph, "superoptimize")  # the verifier evaluates it: sizes bounded before allocating
    key = None
    if opts.cacheable:
        from . import search_cache

        # a profiled ordering belongs to one GPU (and its software): key it by them
        key = search_cache.cache_key(graph, opts.cache_fields(_device_key() if opts.profile else None))
        hit = search_cache.load(key, graph, recheck="all" if opts.recheck_cache else "best",
                                cost_of=lambda mg: cost(mg, opts.hardware, opts.calibration or Calibration()),
                                fp_check=lambda mg: _fp_unsafe(graph, mg, opts))
        if hit is not None:
            hit.report.from_cache = str(search_cache.entry_path(key))
            hit.report.options = str(opts)
            log.info("superoptimize: served from the search cache (%d candidate(s))", len(hit.candidates))
            return hit
    result = _search_program(graph, opts)
    if key is not None and result.candidates:
        from . import search_cache

        search_cache.save(key, result)
    return result


@dataclass
class _Run:
    """The state one search passes from phase to phase (see :func:`_search`)."""

    graph: Graph
    opts: SearchOptions
    rep: SearchReport
    check: Callable[[Graph, Graph], Any]
    cal: Calibration
    #: :func:`cpu_seconds` at the start: the time budgets are CPU seconds (load-independent)
    t_start: float
    rules: list[Rule] = field(default_factory=list)
    builtin_names: set[str] = field(default_factory=set)
    lifted: Any = None
    stats: Any = None
    data: Any = None
    originals: tuple[Term, ...] = ()
    # graphs to lower: (graph, the extracted terms it was built from, graph-level steps applied to them)
    graphs: list[tuple[Graph, tuple[Term, ...], tuple[str, ...]]] = field(default_factory=list)
    # (rank key, lowering, cost, index of its graph in ``graphs``), best first
    pool: list[tuple[tuple[Any, ...], Lowered, Cost, int]] = field(default_factory=list)
    cands: list[Candidate] = field(default_factory=list)
    cand_source: list[int] = field(default_factory=list)  # per candidate, the index of its graph in ``graphs``
    certify: bool = True  # whether the certify phase runs
    # the graph the e-graph lifts: ``graph`` with each causal mask (tril_mask) an input, and those masks by name
    # (verimirage.rewrite.causal); the μGraphs found get the masks back before they are verified
    search_graph: Graph | None = None
    masks: dict[str, Any] = field(default_factory=dict)

    def prune(self, reason: str) -> None:
        """Count a candidate dropped for ``reason``."""
        self.rep.pruned[reason] = self.rep.pruned.get(reason, 0) + 1


def _search(graph: Graph, opts: SearchOptions, *, certify: bool = True) -> SearchResult:
    """The search itself (see :func:`superoptimize`): the phases of :data:`_PHASES` in order, each timed.
    ``certify=False`` skips the certificates (a region's search: its program's composition is certified)."""
    rep = SearchReport(options=str(opts))
    run = _Run(graph, opts, rep, opts.verifier or _default_verifier(graph, opts.verify_timeout_s, opts.seed),
               opts.calibration or Calibration(), cpu_seconds(), certify=certify)
    run.search_graph, run.masks = mask_inputs(graph)
    if opts.profile:
        from ..smt.ff import gpu as ffgpu

        ffgpu.start_cuda_in_background()  # (profiling needs CUDA; started now, verification can use the GPU)
    with Progress(opts.progress, "superoptimize", total=7) as prog:
        for name, phase, wanted in _PHASES:
            if not wanted(run):
                continue
            prog.phase(name)
            t0, c0 = time.perf_counter(), time.process_time()
            phase(run)
            rep.phase_seconds[name] = rep.phase_seconds.get(name, 0.0) + time.perf_counter() - t0
            rep.phase_cpu_seconds[name] = rep.phase_cpu_seconds.get(name, 0.0) + time.process_time() - c0
    log.info("%s", rep)
    return SearchResult(run.cands, rep)


def _num_ops(graph: Graph) -> int:
    return sum(1 for n in node_list(graph) if n.op != "input")


def _search_program(graph: Graph, opts: SearchOptions) -> SearchResult:
    """One search of the whole program, or a search by regions (:mod:`.regions`), as ``opts.split`` says.

    ``"auto"``: a program that starts as one region (at most one matmul and ``region_ops`` ops) is searched
    whole; one of more than ``whole_ops`` ops by regions only; in between, whole first, and by regions too
    when the whole search's best candidate has more kernels than the program has regions to start with (it
    fused less than its parts would on their own): then the candidates of both, cheapest first."""
    from .regions import initial_chunks

    n_chunks = len(initial_chunks(graph, opts.region_ops))
    if opts.split == "never" or (opts.split == "auto" and n_chunks < 2):
        return _search(graph, opts)
    if opts.split == "always" or _num_ops(graph) > opts.whole_ops:
        return _split_search(graph, opts)
    whole = _search(graph, opts)
    if whole.best is not None and whole.best.num_kernels <= n_chunks:
        return whole
    split = _split_search(graph, opts)
    rep = split.report
    rep.phase_seconds = {"whole": whole.report.total_seconds, **rep.phase_seconds}
    rep.phase_cpu_seconds = {"whole": sum(whole.report.phase_cpu_seconds.values()), **rep.phase_cpu_seconds}
    best = whole.best
    rep.notes.insert(0, "the whole program was searched first: "
                     + (f"its best has {best.num_kernels} kernel(s) ({best.cost.time_s * 1e6:.1f} us est.), more "
                        f"than its {n_chunks} region(s) to start with, so it was searched by regions too"
                        if best is not None else "nothing verified, so it was searched by regions too")
                     + f" (whole search: {whole.report.stop_reason})")
    cands = sorted([*split.candidates, *whole.candidates], key=lambda c: (c.cost.time_s, c.num_kernels))
    rep.verified = len(cands)
    rep.rejected = [*rep.rejected, *whole.report.rejected]
    return SearchResult(cands, rep)


#: the least time (s) the whole-program check of a split program may take for its Z3 queries: the abstract
#: expressions of a whole layer take tens of seconds to derive before any query runs
WHOLE_VERIFY_TIMEOUT_S = 300.0


class _Deferred:
    """A region search's stand-in verdict: the candidate is kept for the composition, whose check against the
    whole program decides (it is never a candidate's verdict: the region's μGraph is not returned alone)."""

    proved = True
    reason = "deferred to the check of the composition against the whole program"


def _split_search(graph: Graph, opts: SearchOptions) -> SearchResult:
    """Search ``graph`` by regions (:mod:`.regions`): split, search each region, merge neighbours where one
    search of both costs less, prove each region's μGraph against its region, and compose them; the
    composition is proved by congruence (:mod:`verimirage.smt.glue`), its certificate is the regions'
    certificates with the glue (:class:`verimirage.smt.certificate.ComposedCertificate`).

    The regions' candidates are chosen unverified (only what the code generator expresses), then the chosen
    one of each region is verified against the region (identical regions once); a region whose candidate
    does not verify is searched again with its candidates verified, and left unfused if none is. Where cheap
    (:data:`WHOLE_FF_MAX_MACS`), the finite-field test of the composition against the whole program runs
    too, as extra evidence (a difference there rejects the composition)."""
    from .regions import RegionReport, compose, split_search

    rep = SearchReport(options=str(opts))
    t_start = cpu_seconds()
    run = _Run(graph, opts, rep, opts.verifier or _default_verifier(graph, opts.verify_timeout_s, opts.seed),
               opts.calibration or Calibration(), t_start)
    cal = run.cal

    def timed(name: str, t0: tuple[float, float]) -> None:
        rep.phase_seconds[name] = rep.phase_seconds.get(name, 0.0) + time.perf_counter() - t0[0]
        rep.phase_cpu_seconds[name] = rep.phase_cpu_seconds.get(name, 0.0) + time.process_time() - t0[1]

    results: list[SearchResult] = []
    region_opts, search_region = _region_searcher(opts, cal, results)

    proofs: dict[tuple[str, str], Any] = {}  # (region text, μGraph text) -> verdict
    certs: dict[tuple[str, str], Any] = {}  # -> its certificate (made at once: the verifier's queries are cached)

    def proved(rg: Graph, mg: MuGraph, rules: tuple[str, ...]) -> Any:
        key = (str(rg), str(mg))
        if key not in proofs:
            proofs[key] = _check_split(rg, mg, opts, min_timeout_s=60.0)
            if getattr(proofs[key], "proved", False) and opts.verifier is None:
                certs[key] = _region_certificate(run, rg, mg, proofs[key], rules)
        return proofs[key]

    def prove_regions(out: Any) -> list[tuple[Any, tuple[str, ...]]]:
        """Each region's μGraph proved against its region (else searched again verified, else unfused): the
        verdicts and rules, in region order; GraphError when a region is not proved even unfused."""
        got = []
        for k, (reg, rr) in enumerate(zip(out.regions, out.reports, strict=True)):
            v, rules = proved(reg.graph, out.mugraphs[k], rr.rules), rr.rules
            if not getattr(v, "proved", False):
                rep.rejected.append((f"region {k}'s {out.mugraphs[k].num_kernels}-kernel μGraph",
                                     f"{type(v).__name__}: {getattr(v, 'reason', v)}"))
                res = _search(reg.graph, region_opts(True), certify=False)
                results.append(res)
                pick = [c for c in res.candidates if getattr(c.verdict, "proved", False)
                        and not _inexpressible(c.mugraph)]
                mg, rules, how = ((pick[0].mugraph, pick[0].rules, "searched again, candidates verified") if pick
                                  else (MuGraph.from_graph(reg.graph), ("partition.unfused",), "unfused"))
                v = proved(reg.graph, mg, rules)
                if not getattr(v, "proved", False):
                    raise GraphError(f"region {k} is not proved even {how}: {getattr(v, 'reason', v)}")
                out.mugraphs[k] = mg
                out.reports[k] = RegionReport(rr.nodes, rr.ops, mg.num_kernels, cost(mg, opts.hardware, cal).time_s
                                              * 1e6, f"{rr.how}; its candidate did not verify: {how}", rules)
            got.append((v, rules))
        return got

    def refit_unsafe(out: Any) -> bool:
        """After the floating-point check refused the composition (at a layer's size, e.g. one decode row, its
        check may be only structural, with no twin of fewer rows to evaluate): each region whose own μGraph the
        check refuses at the region's size is searched again verified (its candidates checked), else left
        unfused; True when any region changed."""
        changed = False
        for k, (reg, rr) in enumerate(zip(out.regions, out.reports, strict=True)):
            if (why := _fp_unsafe(reg.graph, out.mugraphs[k], opts)) is None:
                continue
            rep.rejected.append((f"region {k}'s {out.mugraphs[k].num_kernels}-kernel μGraph", f"Proved but {why}"))
            res = _search(reg.graph, region_opts(True), certify=False)
            results.append(res)
            pick = [c for c in res.candidates if getattr(c.verdict, "proved", False) and not _inexpressible(c.mugraph)
                    and _fp_unsafe(reg.graph, c.mugraph, opts) is None]
            mg, rules, how = ((pick[0].mugraph, pick[0].rules, "searched again, candidates checked") if pick
                              else (MuGraph.from_graph(reg.graph), ("partition.unfused",), "unfused"))
            out.mugraphs[k] = mg
            out.reports[k] = RegionReport(rr.nodes, rr.ops, mg.num_kernels, cost(mg, opts.hardware, cal).time_s
                                          * 1e6, f"{rr.how}; its candidate failed the floating-point check: {how}",
                                          rules)
            changed = True
        return changed

    def unfuse_one(out: Any) -> bool:
        """When every region's μGraph passes the floating-point check against its region but the composition does
        not (a difference is new only against the whole program: a LayerNorm folded into a later region's product),
        the first region (in program order) whose unfused form makes the composition pass is left unfused; True
        when one is."""
        for k, (reg, rr) in enumerate(zip(out.regions, out.reports, strict=True)):
            if rr.rules == ("partition.unfused",):
                continue
            trial = [*out.mugraphs[:k], MuGraph.from_graph(reg.graph), *out.mugraphs[k + 1:]]
            if _fp_unsafe(graph, compose(graph, out.regions, trial), opts) is None:
                out.mugraphs[k] = trial[k]
                out.reports[k] = RegionReport(rr.nodes, rr.ops, trial[k].num_kernels,
                                              cost(trial[k], opts.hardware, cal).time_s * 1e6,
                                              f"{rr.how}; unfused: with its candidate the composition failed the "
                                              "floating-point check", ("partition.unfused",))
                return True
        return False

    with Progress(opts.progress, "superoptimize", total=7) as prog:
        prog.phase("rules")
        t0 = (time.perf_counter(), time.process_time())
        _rules_phase(run)
        timed("rules", t0)

        prog.phase("regions")
        t0 = (time.perf_counter(), time.process_time())
        out = split_search(graph, opts.region_ops, search_region, window_ops=opts.window_ops)
        timed("regions", t0)
        prog.phase("verify")
        t0 = (time.perf_counter(), time.process_time())
        cands: list[Candidate] = []
        why_not = ""  # why no composed candidate: named in the stop reason (a region not proved is not the glue)
        try:
            for again in (False, False, True):
                verdicts = prove_regions(out)
                composed = compose(graph, out.regions, out.mugraphs)
                rules: list[str] = []
                for _, rr in verdicts:
                    rules += [x for x in rr if x not in rules]
                v = _composed_verdict(graph, composed, [vd for vd, _ in verdicts], opts, out.regions)
                unsafe = _fp_unsafe(graph, composed, opts) if getattr(v, "proved", False) else None
                if unsafe is None or again or not (refit_unsafe(out) or unfuse_one(out)):
                    break
                rep.rejected.append((f"{composed.num_kernels}-kernel composed μGraph", f"Proved but {unsafe}; "
                                     "regions searched again or left unfused"))
            if getattr(v, "proved", False):
                if unsafe is None:
                    cands = [Candidate(composed, cost(composed, opts.hardware, cal), v, None, tuple(rules), graph,
                                       verified_by="vm.verify" if opts.verifier is None else "custom verifier")]
                else:
                    why_not = f"the composition is Proved but {unsafe}"
                    rep.rejected.append((f"{composed.num_kernels}-kernel composed μGraph", f"Proved but {unsafe}"))
            else:
                why_not = f"the composition is {type(v).__name__}: {getattr(v, 'reason', v)}"
                rep.rejected.append((f"{composed.num_kernels}-kernel composed μGraph",
                                     f"{type(v).__name__}: {getattr(v, 'reason', v)}"))
        except GraphError as e:
            why_not = str(e).splitlines()[0]
            rep.rejected.append(("composed μGraph", why_not))
        timed("verify", t0)
        rep.regions = list(out.reports)
        rep.rules_fired = {}
        for res in results:
            for r, n in res.report.rules_fired.items():
                rep.rules_fired[r] = rep.rules_fired.get(r, 0) + n
        rep.egraph_enodes = max((r.report.egraph_enodes for r in results), default=0)
        rep.egraph_eclasses = max((r.report.egraph_eclasses for r in results), default=0)
        rep.egraph_iterations = max((r.report.egraph_iterations for r in results), default=0)
        rep.egraph_stop_reason = "per region (the largest region's e-graph)"
        rep.lowered = sum(r.report.lowered for r in results)
        rep.terms_extracted = sum(r.report.terms_extracted for r in results)
        kernels = sum(r.kernels for r in out.reports)
        rep.split = (f"{len(out.regions)} region(s), {kernels} kernel(s) in all; {out.searches} region search(es) "
                     f"({out.reused} answered by an identical region), {out.merges_kept} of {out.merges_tried} "
                     f"boundary merge(s) kept; at most {opts.region_ops} ops a region; each region's μGraph "
                     f"verified against its region ({len(proofs)} distinct check(s)), the composition by its glue")
        if opts.verifier is not None and cands:
            cands[0].verdict = _unknown("accepted by a custom verifier, not proved by vm.verify (no certificate): "
                                        f"{getattr(cands[0].verdict, 'reason', '')}")
        rep.verified = len(cands)
        rep.stop(StopReason.REGIONS, f"{len(out.regions)} region(s); "
                 + ("the composition proved region by region, its glue checked" if cands
                    else f"not composed: {why_not[:300]}"))
        run.cands = cands

        prog.phase("certify")
        t0 = (time.perf_counter(), time.process_time())
        if cands and opts.verifier is None:
            _certify_composed(run, out, certs)
        timed("certify", t0)
    log.info("%s", rep)
    return SearchResult(run.cands, rep)


def _region_searcher(opts: SearchOptions, cal: Calibration, results: list[SearchResult]) -> tuple[
        Callable[[bool], SearchOptions], Callable[[Graph], tuple[MuGraph, float, str, tuple[str, ...]]]]:
    """The options of a region's search (``verified``: its candidates verified, else only what the code
    generator expresses) and the region search :func:`.regions.split_search` calls (unverified; each
    search's result appended to ``results``)."""
    def region_opts(verified: bool) -> SearchOptions:
        def expressible(rg: Graph, mg: Graph) -> Any:
            why = _inexpressible(mg) if isinstance(mg, MuGraph) else ""
            return _unknown(f"the code generator cannot express it: {why}") if why else _Deferred()

        # deferred checks cost only the code generator: more attempts, so a region whose cheapest lowerings
        # codegen cannot express still gets a fused one
        return dataclasses.replace(opts, top_k=1 if not verified else 2, variants=0, progress=False,
                                   profile=False, cache=False, split="never",
                                   verifier=opts.verifier if verified else expressible,
                                   max_verify=opts.max_verify if verified else max(16, opts.attempts))

    def search_region(rg: Graph) -> tuple[MuGraph, float, str, tuple[str, ...]]:
        res = _search(rg, region_opts(False), certify=False)
        results.append(res)
        for k, c in enumerate(res.candidates):
            return c.mugraph, c.cost.time_s, "searched" if k == 0 else "searched (next best)", c.rules
        mg = MuGraph.from_graph(rg)
        return mg, cost(mg, opts.hardware, cal).time_s, "unfused (no candidate)", ("partition.unfused",)

    return region_opts, search_region


def plan_regions(graph: Graph, options: SearchOptions | None = None, **overrides: Any) -> Any:
    """The search side of a search by regions, unverified: the regions and their chosen μGraphs
    (:class:`.regions.SplitOutcome`), for proving them elsewhere (``benchmarks/layer.py prove`` on a machine
    without egglog); nothing it returns is verified."""
    from .regions import split_search

    opts = SearchOptions.make(options, overrides)
    _, search_region = _region_searcher(opts, opts.calibration or Calibration(), [])
    return split_search(graph, opts.region_ops, search_region, window_ops=opts.window_ops)


#: the whole-program finite-field test of a composition runs when the program's products have at most this
#: many multiply-adds (extra evidence beside the regions' proofs; a full-size layer's takes ~15 s, skipped)
WHOLE_FF_MAX_MACS = 1 << 26


def _check_split(graph: Graph, mg: MuGraph, opts: SearchOptions, *, min_timeout_s: float,
                 prove_only: bool = False) -> Any:
    """``vm.verify(graph, mg)`` for a region or a whole split program (a Z3 limit of at least ``min_timeout_s``:
    their queries are large), or the custom verifier's answer."""
    try:
        mg.check()
        if opts.verifier is not None:
            return opts.verifier(graph, mg)
        from ..smt.verify import Verifier

        # a verifier of its own, dropped after (each region is checked once: its finite-field trials' products and
        # inputs, ~2 GB for a full-size prefill FFN region, would otherwise stay cached for no later candidate)
        return Verifier(graph, seed=opts.seed).check(mg, timeout_s=max(opts.verify_timeout_s, min_timeout_s),
                                                     prove_only=prove_only)
    except ImportError as e:
        return _unknown(f"verifier not available: {e}")
    except GraphError as e:
        return _unknown(f"IR check failed: {str(e).splitlines()[0]}")


def _macs(graph: Graph) -> int:
    """Multiply-adds of the program's products (a proxy for the cost of evaluating it)."""
    total = 0
    for n in node_list(graph):
        if get_op(n.op).has(Prop.CONTRACTION):
            k = node_list(graph)[n.args[0][0]].outs[n.args[0][1]].shape[-1]
            total += math.prod(n.outs[0].shape) * k
    return total


def _composed_verdict(graph: Graph, composed: MuGraph, verdicts: Sequence[Any], opts: SearchOptions,
                      regions: Sequence[Any]) -> Any:
    """The composition's verdict: Proved from its regions' Proved verdicts (congruence: the μGraph is their
    splice by the program's own wiring) when every value one region makes and another reads is defined for all
    inputs (:func:`verimirage.smt.glue.undefined_fed`, as the certificate checker requires), with the whole-program
    finite-field test where cheap; Refuted-free: a difference there is an Unknown naming it (the regions'
    proofs and the whole-program test disagree)."""
    from ..smt import budget, deep, glue
    from ..smt.verdict import Check, Outcome, Proved

    evidence = [Check(f"region {k}", Outcome.PROVED, (("reason", getattr(v, "reason", "")),))
                for k, v in enumerate(verdicts)]
    # the derivation is pure Python, stopped only at its checkpoints: without a budget one (Whisper's encoder
    # forward) held torch.compile for over 25 minutes
    token = budget.set_budget(budget.derive_budget_s(opts.verify_timeout_s))
    try:
        why = deep.deep_call(glue.undefined_fed, graph, regions)
    except Exception as e:  # (fails closed: not shown defined is not composed; past the budget too)
        why = f"{type(e).__name__}: {e}"
    finally:
        budget.reset_budget(token)
    if why is not None:
        return _unknown(f"a value one region makes and another reads may be undefined ({why}): the composition "
                        "may read values the program leaves undefined", evidence)
    extra = ""
    if opts.verifier is None and _macs(graph) <= WHOLE_FF_MAX_MACS:
        from ..smt.verify import _ff_check, applies_log, ff_test, ff_test_p_or_q

        r = ff_test_p_or_q(graph, composed, ff_test(graph, composed, seed=opts.seed,
                                                    locate=not applies_log(graph, composed)), seed=opts.seed)
        if r.outcome != Outcome.PROVED:
            log.error("the composition of proved regions differs from the whole program: %s", r.reason)
            return _unknown(f"the regions are proved but the whole-program finite-field test says: {r.reason}",
                            [*evidence, _ff_check(r)])
        evidence.append(_ff_check(r))
        extra = f"; whole-program finite-field test ({r.trials} trials) agrees"
    return Proved(f"by regions: {len(verdicts)} region μGraph(s) each proved against its region, the "
                  f"composition by its glue (congruence){extra}", tuple(evidence))


def _fp_unsafe(graph: Graph, mg: MuGraph, opts: SearchOptions) -> Any:
    from .fpsafe import SafetyChecker

    return SafetyChecker(graph, opts.seed).check(mg)


def _region_certificate(run: _Run, rg: Graph, mg: MuGraph, verdict: Any, rules: tuple[str, ...]) -> Any:
    """The certificate of a region's proved μGraph (None, with a note, when none can be made)."""
    try:
        from ..smt.certify import make_certificate

        unproved_all = _register_known_rules(run)
        unproved = [r for r in rules if r in run.rep.trusted_rules or r in unproved_all]
        return make_certificate(rg, mg, verdict, rules=[r for r in rules if r not in unproved],
                                trusted_rules=unproved, timeout_s=max(run.opts.verify_timeout_s, 60.0))
    except (GraphError, ImportError) as e:
        run.rep.notes.append(f"a region: no certificate: {str(e).splitlines()[0]}")
        return None


def _certify_composed(run: _Run, out: Any, certs: dict[tuple[str, str], Any]) -> None:
    """The composed candidate's certificate: its regions' certificates (identical ones once) and the glue."""
    cand = run.cands[0]
    subs: list[Any] = [certs.get((str(reg.graph), str(mg))) for reg, mg in zip(out.regions, out.mugraphs, strict=True)]
    if any(c is None for c in subs):
        run.rep.notes.append("composed candidate: no certificate (a region has none)")
        return
    try:
        from ..smt.certify import make_composed_certificate

        cand.certificate = make_composed_certificate(run.graph, out.regions, subs, str(cand.verdict.reason),
                                                     _triton_source_hash(cand.mugraph))
    except GraphError as e:
        run.rep.notes.append(f"composed candidate: no certificate: {str(e).splitlines()[0]}")


def _inexpressible(mg: MuGraph) -> str:
    """Why the code generator cannot emit ``mg`` ("" when it can, or when the backend is not installed)."""
    try:
        from ..backend.tuning import tuned_module
    except ImportError:
        return ""
    try:
        tuned_module(mg)
    except Exception as e:  # codegen cannot express it: the region keeps another candidate
        return (str(e).splitlines() or [type(e).__name__])[0][:200]
    return ""


def _rules_phase(run: _Run) -> None:
    """Select the rules; admit user rules (``verify_rule``) and note the trusted ones."""
    opts, rep = run.opts, run.rep
    rules = select_rules(opts.rulesets, opts.disable_rules, opts.extra_rules)
    builtin_names = {r.name for r in _builtin()}
    for r in rules:
        if r.name not in builtin_names or r.trusted:
            admit(r)
            if r.trusted:
                rep.trusted_rules.append(r.name)
    rep.rules_used = [r.name for r in rules]

    run.rules, run.builtin_names = rules, builtin_names


def _saturate_phase(run: _Run) -> None:
    """Lift the graph and saturate its e-graph; an egglog panic saturates again with fewer rules."""
    graph, rep, rules, builtin_names = run.search_graph or run.graph, run.rep, run.rules, run.builtin_names
    iter_limit, node_limit, time_budget_s = run.opts.iter_limit, run.opts.node_limit, run.opts.time_budget_s
    lifted = lift(graph)
    try:
        stats, data = saturate(lifted, rules, iter_limit=iter_limit, node_limit=node_limit,
                               time_budget_s=max(0.5, 0.25 * time_budget_s))
    except SaturationPanic as e:
        # the e-graph is unusable: again without the user rules, then without any rule (never a crash)
        user = [r.name for r in rules if r.name not in builtin_names]
        kept = [r for r in rules if r.name in builtin_names] if user else []
        rep.notes.append(f"egglog panicked ({e}); saturated again without the rules "
                         f"{user if user else [r.name for r in rules]}")
        for name in (user or [r.name for r in rules]):
            rep.rejected.append((f"rule {name}", f"skipped: egglog panicked with it in the rule set ({e})"))
        rules = kept
        rep.rules_used = [r.name for r in rules]
        try:
            lifted = lift(graph)
            stats, data = saturate(lifted, rules, iter_limit=iter_limit, node_limit=node_limit,
                                   time_budget_s=max(0.5, 0.25 * time_budget_s))
        except SaturationPanic as e2:
            rep.notes.append(f"egglog panicked again ({e2}); no rewrite rules used")
            rules = []
            rep.rules_used = []
            lifted = lift(graph)
            stats, data = saturate(lifted, rules, iter_limit=iter_limit, node_limit=node_limit,
                                   time_budget_s=max(0.5, 0.25 * time_budget_s))
    rep.egraph_iterations, rep.egraph_enodes = stats.iterations, stats.enodes
    rep.egraph_eclasses, rep.egraph_stop_reason = stats.eclasses, stats.stop_reason
    rep.rules_fired = dict(sorted(stats.fired.items()))
    run.rules, run.lifted, run.stats, run.data = rules, lifted, stats, data


def _extract_phase(run: _Run) -> None:
    """The cheapest distinct terms of each output's e-class, back as kernel graphs (duplicates pruned)."""
    rep, rules, lifted, data, prune = run.rep, run.rules, run.lifted, run.data, run.prune
    terms_per_class, max_terms = run.opts.terms_per_class, run.opts.max_terms
    ex = EClassTerms(data, terms_per_class)
    originals = tuple(lifted.terms)
    per_root = [_ordered(ex.terms_of(t), t) for t in originals]
    # graphs to lower: (graph, the extracted terms it was built from, graph-level steps applied to them)
    graphs: list[tuple[Graph, tuple[Term, ...], tuple[str, ...]]] = []
    seen: set[str] = set()
    seen_comm: set[tuple[Term, ...]] = set()
    for n_combo, terms in enumerate(itertools.product(*per_root)):
        if len(graphs) >= max_terms or n_combo >= 8 * max_terms:
            break
        comm = tuple(commutation_key(t) for t in terms)
        if terms != originals:
            if comm in seen_comm:  # the same program up to operand order: same μGraphs, same costs
                prune("extracted term: a commuted duplicate")
                continue
            if not ex.consistent(terms):  # an e-class computed two ways: never cheaper than one way
                prune("extracted term: one value computed two ways")
                continue
            if _removes_max_shift(originals, terms):  # (exp-sub may not remove a max shift)
                prune("extracted term: exp of a max the source subtracts (the max shift removed)")
                continue
        seen_comm.add(comm)
        try:
            g2 = term_to_graph(list(terms), lifted.inputs)
        except GraphError as e:
            prune(f"ill-typed term: {str(e).splitlines()[0]}")
            continue
        key = str(g2)
        if key in seen:
            continue
        seen.add(key)
        graphs.append((g2, terms, ()))
    # rewrites the e-graph holds but extraction by size never picks, applied directly to every extracted graph
    # (each also to the graphs the ones before it added) when their rule is in the ruleset: the stable softmax,
    # the loop-friendly cross-entropy, a norm in its projections' prologues (see rewrite/stabilise.py)
    from ..rewrite.stabilise import (
        HOIST_RULES,
        NORM_RULES,
        hoist_row_constants,
        logsumexp_sites,
        norm_into_projections,
        stabilise_softmax,
    )

    direct: tuple[tuple[str, Callable[[Graph], Graph | None], Callable[[Graph], tuple[str, ...]]], ...] = (
        ("softmax-stabilise", stabilise_softmax,
         lambda g0: ("softmax-stabilise", *(("logsumexp-stabilise",) if logsumexp_sites(g0) else ()))),
        ("sum-factor-out", hoist_row_constants, lambda g0: HOIST_RULES),
        ("rms-norm-matmul", norm_into_projections, lambda g0: NORM_RULES),
    )
    names = {r.name for r in rules}
    for trigger, rewrite, used in direct:
        if trigger not in names:
            continue
        for g2, terms, steps in list(graphs):
            g3 = rewrite(g2)
            if g3 is not None and str(g3) not in seen:
                seen.add(str(g3))
                graphs.append((g3, terms, (*steps, *used(g2))))
    rep.terms_extracted = len(graphs)

    run.originals, run.graphs = originals, graphs


def _lower_phase(run: _Run) -> None:
    """Every feasible partition of each extracted graph into μGraphs, ranked by the cost model."""
    rep, graphs, prune, cal, t_start = run.rep, run.graphs, run.prune, run.cal, run.t_start
    o = run.opts
    grids, franges, max_splits, hardware, time_budget_s, top_k = (o.grids, o.franges, o.max_splits, o.hardware,
                                                                  o.time_budget_s, o.top_k)
    max_verify = o.attempts
    # (rank key, lowering, cost, index of its graph in ``graphs``)
    pool: list[tuple[tuple[Any, ...], Lowered, Cost, int]] = []
    for gi, (g2, _, _) in enumerate(graphs):
        lows, rejected = lower_all(g2, grids=grids, franges=franges, max_splits=max_splits, rank=cost, tail=o.tails)
        lows = _with_masks(lows, run.masks)
        for reason, n in rejected.items():
            rep.pruned[reason] = rep.pruned.get(reason, 0) + n
        for li, low in enumerate(lows):
            c = cost(low.mugraph, hardware, cal)
            if c.infeasible:
                prune(c.reason.split(" (")[0])
                continue
            # equal estimates (memory-bound kernels moving the same bytes) go to fewer flops: a rewrite that
            # simplifies without moving fewer bytes (x*y + x*z -> x*(y+z)) is otherwise never tried
            pool.append(((c.time_s, low.mugraph.num_kernels, c.tc_flops + c.other_flops, gi, li), low, c, gi))
        if cpu_seconds() - t_start > 0.8 * time_budget_s:
            rep.notes.append("lowering stopped early: time budget")
            break
    pool.sort(key=lambda p: p[0])
    # identical μGraphs reached from different terms: keep the first (checked on the ranked head only)
    uniq: list[Any] = []
    seen_mg: set[str] = set()
    for entry in pool:
        if len(uniq) < 8 * (max_verify + top_k):
            key = str(entry[1].mugraph)
            if key in seen_mg:
                continue
            seen_mg.add(key)
        uniq.append(entry)
    pool = uniq
    rep.lowered = len(pool)

    run.pool = pool


def _with_masks(lows: list[Lowered], masks: dict[str, Any]) -> list[Lowered]:
    """The lowerings with the causal masks searched as inputs given back (:func:`restore_masks`), each followed by
    its variant that skips the masks' tiles above the diagonal (:func:`with_skips`; verified like any other)."""
    if not masks:
        return lows
    out = []
    for low in lows:
        low = dataclasses.replace(low, mugraph=restore_masks(low.mugraph, masks))
        out.append(low)
        sk = with_skips(low.mugraph)
        if sk is not None:
            out.append(dataclasses.replace(low, mugraph=sk, steps=[*low.steps, "partition.causal_skip"]))
    return out


def _verify_phase(run: _Run) -> None:
    """Verify candidates best first, one per kernel structure, until ``top_k`` (then the variants) or a limit."""
    graph, rep, pool, graphs, originals, check, t_start = (run.graph, run.rep, run.pool, run.graphs, run.originals,
                                                           run.check, run.t_start)
    o = run.opts
    seed, verifier, top_k, variants, time_budget_s = o.seed, o.verifier, o.top_k, o.variants, o.time_budget_s
    max_verify, verify_budget = o.attempts, o.verify_budget
    cands: list[Candidate] = []
    tried = 0
    rep.stop(StopReason.ENOUGH)
    baseline = next((p for p in pool if p[1].steps == ["partition.unfused"] and graphs[p[3]][1] == originals
                     and not graphs[p[3]][2]), None)
    tried_keys: set[int] = set()
    cand_source: list[int] = []  # per candidate, the index of its graph in ``graphs``
    safety: list[Any] = []

    def fp_check(mg: MuGraph, before: bool = False) -> str | None:
        """Why ``mg`` is not finite where the graph is in its dtype (:mod:`.fpsafe`), or None (``before``: only the
        refusal that holds whatever its verdict, before verifying it: ``SafetyChecker.before_verification``)."""
        if not safety:
            from .fpsafe import SafetyChecker

            safety.append(SafetyChecker(graph, seed))
            if not safety[0].numeric:
                rep.notes.append("floating-point check: structural only (the program is too large to evaluate "
                                 "on adversarial inputs here): a candidate must max-shift every exp the source "
                                 "does; one that takes a cancellation-prone difference the source does not is "
                                 "evaluated on the near-constant sets" + ("" if safety[0].near_at_size else
                                                                          ", on a twin of fewer rows"))
        seen = len(safety[0].unevaluated)
        why: str | None = safety[0].before_verification(mg) if before else safety[0].check(mg)
        if len(safety[0].unevaluated) > seen:
            rep.notes.append(f"floating-point check: a candidate takes differences the source does not (of "
                             f"{safety[0].unevaluated[-1]}), rejected: the program is too large for the near-constant "
                             "sets and no twin of fewer rows was proved equal to it")
        return why

    refused: dict[int, str | None] = {}  # id(entry) -> its refusal before verification (computed once)

    def refused_unverified(entry: tuple[Any, ...]) -> bool:
        """Whether the floating-point check refuses ``entry`` whatever its verdict: then it is not verified (no
        verification time or budget spent), only recorded as rejected."""
        if id(entry) not in refused:
            low = entry[1]
            try:
                low.mugraph.check()
                refused[id(entry)] = why = fp_check(low.mugraph, before=True)
            except GraphError:
                refused[id(entry)] = None  # (verification reports it)
                return False
            if why is not None:
                tried_keys.add(id(entry))
                what = f"{low.mugraph.num_kernels}-kernel {low.config.describe() if low.config else 'unfused'}"
                rep.rejected.append((what, f"not verified: {why}"))
        return refused[id(entry)] is not None

    def attempt(entry: tuple[Any, ...]) -> None:
        if refused_unverified(entry):
            return
        t0 = cpu_seconds()
        try:
            _attempt(entry)
        finally:
            seen_s[0] += raw_estimate(entry)
            seen_s[1] += cpu_seconds() - t0

    def _attempt(entry: tuple[Any, ...]) -> None:
        _, low, c, gi = entry
        tried_keys.add(id(entry))
        what = f"{low.mugraph.num_kernels}-kernel {low.config.describe() if low.config else 'unfused'}"
        try:
            low.mugraph.check()
            v = check(graph, low.mugraph)
        except ImportError as e:
            v = _unknown(f"verifier not available: {e}")
        except GraphError as e:
            v = _unknown(f"IR check failed: {str(e).splitlines()[0]}")
        unsafe = fp_check(low.mugraph) if getattr(v, "proved", False) else None
        if unsafe is not None:
            rep.rejected.append((what, f"{type(v).__name__} but {unsafe}"))
        elif getattr(v, "proved", False):
            by = "vm.verify" if verifier is None else "custom verifier"
            if verifier is not None:
                v = _unknown(f"accepted by a custom verifier, not proved by vm.verify (no certificate): "
                             f"{getattr(v, 'reason', v)}", getattr(v, "evidence", ()))
            cands.append(Candidate(low.mugraph, c, v, None, tuple(low.steps), graphs[gi][0], verified_by=by))
            cand_source.append(gi)
        else:
            rep.rejected.append((what, f"{type(v).__name__}: {getattr(v, 'reason', v)}"))

    # diversity: one candidate per kernel structure (grids of its kernels); loop ranges and
    # launch parameters are the GPU profiler's to sweep, not slots in the top-K
    shapes_seen: set[tuple[Any, ...]] = set()
    # keep the last slot for a max-shifted (numerically safe) candidate when the pool has one
    safe_in_pool = top_k > 1 and any(_max_shifted(p[1].mugraph) for p in pool)
    est_spent = 0.0
    # measured / estimated seconds of the verifications so far: the estimate is a model fitted on programs of up to
    # ~1e7 input elements, and it ran 4-6x short on 65M-element vocabulary reductions (cross_entropy_prefill: 4
    # candidates verified in 118 s against a 60 s budget, 2-core CPU, 2026-11-27); later estimates are scaled by it
    # (never down), and a candidate whose scaled estimate would end past the time budget is not started
    seen_s = [0.0, 0.0]
    raw: dict[int, float] = {}  # id(entry) -> verify_estimate_s, computed once for the budget and the ratio

    def raw_estimate(entry: tuple[Any, ...]) -> float:
        if id(entry) not in raw:
            raw[id(entry)] = verify_estimate_s(graph, entry[1].mugraph, entry[2])
        return raw[id(entry)]

    def scaled_estimate(entry: tuple[Any, ...]) -> float:
        est = raw_estimate(entry)
        return est * max(1.0, seen_s[1] / seen_s[0]) if seen_s[0] > 0 else est

    def within_budget(entry: tuple[Any, ...]) -> bool:
        """Whether the time and verification budgets allow verifying ``entry`` (sets the stop reason)."""
        nonlocal est_spent
        elapsed = cpu_seconds() - t_start
        if elapsed > time_budget_s and cands:
            rep.stop(StopReason.TIME_BUDGET)
            return False
        est = scaled_estimate(entry)
        if cands and elapsed + est > time_budget_s:
            rep.stop(StopReason.TIME_BUDGET, f"the next candidate needs ~{est:.0f} s, {elapsed:.0f} of "
                     f"{time_budget_s:.0f} s spent")
            return False
        if cands and est_spent + est > verify_budget:
            rep.stop(StopReason.VERIFY_BUDGET, f"{verify_budget:.0f} s estimated for candidates after the "
                     f"first; the next needs ~{est:.0f} s")
            return False
        if cands:
            est_spent += est
        return True

    for entry in pool:
        if len(cands) >= top_k:
            break
        shape_key = _structure(entry[1].mugraph)
        if shape_key in shapes_seen:
            continue
        if (safe_in_pool and len(cands) == top_k - 1 and not shape_key[-1]
                and not any(_max_shifted(c.mugraph) for c in cands)):
            continue
        if tried >= max_verify:
            rep.stop(StopReason.ATTEMPT_LIMIT, str(max_verify))
            break
        if refused_unverified(entry):  # (an attempt, as when it was verified first; no time charged)
            tried += 1
            continue
        if not within_budget(entry):
            break
        tried += 1
        n_before = len(cands)
        attempt(entry)
        if len(cands) > n_before:
            shapes_seen.add(shape_key)
    if len(cands) < top_k and tried < max_verify and rep.stopped is StopReason.ENOUGH:
        rep.stop(StopReason.EXHAUSTED)
    # siblings of the kept structures (same grids; other loop ranges or block graphs), best structure first
    if variants and cands and rep.stopped in (StopReason.ENOUGH, StopReason.EXHAUSTED):
        n_distinct, n_var = len(cands), 0
        for k in range(n_distinct):
            struct = _structure(cands[k].mugraph)
            sibs = [e for e in pool if id(e) not in tried_keys and _structure(e[1].mugraph) == struct]
            # another loop range first (a stable sort keeps the cost order within each group): at
            # equal estimates the pool lists block-graph siblings (e.g. LoRA's concat fusion) before
            # a K loop, yet the loop is what the GPU ran fastest on lora_bs8 (pipelined 64-deep tiles,
            # 3.12 vs 3.37 us for the one-shot tile; benchmarks/perf/results/run9_lora_probe.json)
            # Loops of 2-3 iterations go after those of 4+ (a 3-stage software pipeline has no steady
            # state in 2 iterations)
            have = _loop_ranges(cands[k].mugraph)

            def sib_key(e: tuple[Any, ...], have: tuple[int, ...] = have) -> tuple[bool, bool]:
                ranges = _loop_ranges(e[1].mugraph)
                return ranges == have, any(1 < r < 4 for r in ranges)

            sibs.sort(key=sib_key)
            got = 0
            for entry in sibs[: 2 * variants]:  # a sibling that fails verification costs a slot's worth
                if got >= variants or not within_budget(entry):
                    break
                n_before = len(cands)
                attempt(entry)
                got += len(cands) - n_before
            n_var += got
            if rep.stopped not in (StopReason.ENOUGH, StopReason.EXHAUSTED):
                break
        rep.notes.append(f"variants: {n_var} loop-range/block-graph sibling(s) of the {n_distinct} "
                         "structure(s) verified")
    if not cands and baseline is not None and id(baseline) not in tried_keys:
        rep.notes.append("no candidate verified within the limits; tried the unfused baseline")
        attempt(baseline)
    rep.verified = len(cands)

    run.cands, run.cand_source = cands, cand_source


def _attribute_phase(run: _Run) -> None:
    """The rules on a derivation of each candidate's terms (replayed saturations)."""
    graph, rep, rules, stats, graphs = run.search_graph or run.graph, run.rep, run.rules, run.stats, run.graphs
    cands, cand_source, node_limit = run.cands, run.cand_source, run.opts.node_limit
    sources = sorted(set(cand_source))
    atts = attribute(graph, rules, stats.fired, [graphs[gi][1] for gi in sources],
                     iterations=max(1, stats.iterations), node_limit=node_limit)
    by_source = dict(zip(sources, atts, strict=True))
    for cand, gi in zip(cands, cand_source, strict=True):
        a = by_source[gi]
        cand.rules = (*a.rules, *graphs[gi][2], *cand.rules)

    if not all(a.exact for a in atts):
        rep.notes.append("rule attribution: a derivation was not reproduced within the limits; "
                         "its candidates name every rule that fired (conservative)")



def _register_known_rules(run: _Run) -> frozenset[str]:
    """Declare the search's lowering steps, its proved built-in rules and the proved user rules as known to the
    certificate checker; the built-in rules that are not proved."""
    from ..rewrite.partition import STEPS
    from ..rewrite.rules import UNPROVED_BUILTINS
    from ..smt.certify import register_rules

    proved_user = [r.name for r in run.rules if r.name not in run.builtin_names and not r.trusted]
    register_rules([*STEPS, *(n for n in run.builtin_names if n not in UNPROVED_BUILTINS), *proved_user])
    return frozenset(UNPROVED_BUILTINS)


def _certify_phase(run: _Run) -> None:
    """A certificate per candidate ``vm.verify`` proved."""
    graph, rep, cands = run.graph, run.rep, run.cands
    verifier, verify_timeout_s = run.opts.verifier, run.opts.verify_timeout_s
    try:
        from ..rewrite.rules import UNPROVED_BUILTINS
        from ..smt.certify import make_certificate

        _register_known_rules(run)
        if verifier is not None and cands:
            rep.notes.append("candidates were accepted by a custom verifier: not Proved by vm.verify, no "
                             "certificates (Candidate.verified_by)")
        for k, cand in enumerate(cands):
            if cand.verified_by != "vm.verify":
                continue
            unproved = [r for r in cand.rules if r in rep.trusted_rules or r in UNPROVED_BUILTINS]
            try:
                cand.certificate = make_certificate(
                    graph, cand.mugraph, cand.verdict, rules=[r for r in cand.rules if r not in unproved],
                    trusted_rules=unproved, timeout_s=verify_timeout_s,
                    triton_source_hash=_triton_source_hash(cand.mugraph),
                )
            except GraphError as e:
                rep.notes.append(f"candidate {k}: no certificate: {str(e).splitlines()[0]}")
    except ImportError:
        rep.notes.append("certificates not made: verimirage.smt.certificate is not available")



def _profile_phase(run: _Run) -> None:
    """Reorder the candidates by GPU timings (``profile=True``)."""
    graph, rep, cands, seed = run.graph, run.rep, run.cands, run.opts.seed
    try:
        from ..backend.profile import select

        timings = select(graph, cands, seed=seed)
        order: list[int] = []
        for tm in timings:
            if tm.ok and tm.index not in order:
                order.append(tm.index)
                cands[tm.index].timing_ms = tm.ms
        order += [i for i in range(len(cands)) if i not in order]
        cands = [cands[i] for i in order]
        rep.notes.append("reordered by GPU timings: " + ", ".join(
            f"#{i}: {cands[k].timing_ms}" for k, i in enumerate(order)))
    except (ImportError, RuntimeError) as e:
        rep.notes.append(f"profile=True but GPU profiling is unavailable: {e}")
    run.cands = cands


#: The phases of a search in order: (name in the report, function, whether it runs).
_PHASES: tuple[tuple[str, Callable[[_Run], None], Callable[[_Run], bool]], ...] = (
    ("rules", _rules_phase, lambda run: True),
    ("saturate", _saturate_phase, lambda run: True),
    ("extract", _extract_phase, lambda run: True),
    ("lower", _lower_phase, lambda run: True),
    ("verify", _verify_phase, lambda run: True),
    ("attribute", _attribute_phase, lambda run: bool(run.cands)),
    ("certify", _certify_phase, lambda run: run.certify),
    ("profile", _profile_phase, lambda run: run.opts.profile and bool(run.cands)),
)


#: seconds per unit of :func:`verify_estimate_s`'s work: the upper range of ``vm.verify`` times of the suite's
#: candidates at batch 1 and 8 on the 2-core development CPU (finite-field code of commit bb69639; observed
#: 0.2x-1.4x of the estimate, lower on an idle machine). A faster verifier makes it conservative, never wrong.
VERIFY_SECONDS_PER_UNIT = 6e-9


def verify_estimate_s(graph: Graph, mugraph: MuGraph, c: Cost | None = None) -> float:
    """A deterministic estimate of ``vm.verify(graph, mugraph)``'s time on a 2-core CPU.

    The finite-field test dominates: per trial (5 assumed) it draws random residues for every input and
    evaluates the candidate, mostly its matmuls; with ``exp`` anywhere values carry two residue parts.
    Model: ``trials * parts * (input elements + tensor-core flops / 64) * VERIFY_SECONDS_PER_UNIT``.
    """
    c = c if c is not None else cost(mugraph)
    n_in = sum(math.prod(t.shape) for t in graph.inputs)
    from ..smt.ff import uses_exp

    parts = 2 if uses_exp(graph) or uses_exp(mugraph) else 1
    return 5 * parts * (n_in + c.tc_flops / 64) * VERIFY_SECONDS_PER_UNIT


def _device_key() -> str | None:
    """Name, capability and torch/triton versions of the current GPU (None without one)."""
    try:
        import torch
        import triton
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    cap = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]} torch {torch.__version__} triton {triton.__version__}"


def _structure(mg: MuGraph) -> tuple[Any, ...]:
    """A μGraph's kernel structure: per kernel its op, or its grid (loop ranges left out), and whether
    it subtracts a running/row max before exp (the numerically safe form is kept beside the plain one)."""
    grids = tuple(n.attr("block").grid if n.op == "custom" else n.op for n in node_list(mg) if n.op != "input")
    return (*grids, _max_shifted(mg))


def _loop_ranges(mg: MuGraph) -> tuple[int, ...]:
    """The for-loop range of each custom kernel of ``mg``, in order."""
    return tuple(n.attr("block").frange for n in node_list(mg) if n.op == "custom")


def _removes_max_shift(originals: Sequence[Term], terms: Sequence[Term]) -> bool:
    """Whether ``terms`` apply ``exp`` to a max the original terms only subtracted before an ``exp``
    (``exp-sub`` on ``exp(a - max a)`` gives ``exp(a) / exp(max a)``: exact over the reals, overflows)."""
    def shifted_maxes(ts: Sequence[Term]) -> set[Term]:
        return {s.args[0].args[1] for t in ts for s in t.subterms()
                if s.op == "exp" and s.args and s.args[0].op == "sub" and s.args[0].args[1].op == "max"}

    def exp_of_max(ts: Sequence[Term]) -> set[Term]:
        return {s.args[0] for t in ts for s in t.subterms() if s.op == "exp" and s.args and s.args[0].op == "max"}

    return bool(shifted_maxes(originals) & (exp_of_max(terms) - exp_of_max(originals)))


def _triton_source_hash(mg: MuGraph) -> str | None:
    """SHA-256 of the Triton module ``vm.compile`` runs for ``mg`` by default (tuned tiles; None without the
    backend)."""
    try:
        from ..backend.tuning import tuned_module
    except ImportError:
        return None
    try:
        return tuned_module(mg).digest
    except Exception as e:  # codegen cannot express it: the certificate then vouches for no source
        log.warning("no Triton source for a candidate: %s", e)
        return None


def _builtin() -> list[Rule]:
    from ..rewrite.rules import all_builtin_rules

    return all_builtin_rules()


def _ordered(terms: list[Term], original: Term) -> list[Term]:
    """The original term first, then the rest in extraction order."""
    return [original] + [t for t in terms if t != original]


# --------------------------------------------------------------------------- ablation


@dataclass
class Ablation:
    """What each rule contributed: best cost and kernel count with the rule disabled."""

    baseline: SearchResult
    without: dict[str, SearchResult]

    def table(self) -> list[tuple[str, float, int, float, int]]:
        """Rows ``(rule, time_without_us, kernels_without, time_with_us, kernels_with)``."""
        base = self.baseline.best
        rows = []
        for name, res in self.without.items():
            b = res.best
            rows.append((
                name,
                b.cost.time_s * 1e6 if b else float("inf"), b.num_kernels if b else -1,
                base.cost.time_s * 1e6 if base else float("inf"), base.num_kernels if base else -1,
            ))
        return rows

    def contributions(self) -> list[tuple[str, bool, bool]]:
        """Rows ``(rule, named, changed)``: whether the baseline's best candidate names the rule (it lies on
        the derivation of the best term: exact attribution, :func:`~verimirage.rewrite.saturate.attribute`)
        and whether disabling the rule changes the best μGraph. The two agree, except where the best term
        also has a derivation without a named rule (then disabling that rule alone changes nothing)."""
        base = self.baseline.best
        rows = []
        for name, res in self.without.items():
            b = res.best
            named = base is not None and name in base.rules
            changed = (b is None) != (base is None) or (
                b is not None and base is not None and str(b.mugraph) != str(base.mugraph))
            rows.append((name, named, changed))
        return rows

    def __str__(self) -> str:
        named = {n for n, used, _ in self.contributions() if used}
        lines = ["rule: best without (us, kernels) -> with (us, kernels)   [*: named by the best candidate]"]
        for name, tw, kw, t, k in self.table():
            lines.append(f"  {name}{' *' if name in named else ''}: {tw:.1f} us, {kw} -> {t:.1f} us, {k}")
        return "\n".join(lines)


def ablate(graph: Graph, *, rules: Sequence[str] | None = None, options: SearchOptions | None = None,
           **overrides: Any) -> Ablation:
    """Run ``superoptimize`` once with all rules and once per rule disabled (default: the rules that
    fired); report what each rule contributed to the best candidate. Options as for ``superoptimize``."""
    opts = SearchOptions.make(options, overrides)
    base = superoptimize(graph, options=opts)
    names = list(rules) if rules is not None else sorted(base.report.rules_fired)
    out = {n: superoptimize(graph, options=dataclasses.replace(opts, disable_rules=(*opts.disable_rules, n)))
           for n in names}
    return Ablation(base, out)


__all__ = ["Ablation", "Candidate", "RuleError", "SearchOptions", "SearchReport", "SearchResult", "StopReason",
           "ablate", "superoptimize", "verify_estimate_s"]
