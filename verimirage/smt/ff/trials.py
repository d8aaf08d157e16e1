"""The trial driver of the fast finite-field test: trial inputs, :class:`FFReference` (a target's
evaluations kept for many candidates), :func:`ff_test`, trial threads and projections.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import dataclasses
import gc
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.errors import GraphError
from ...ir.graph import Graph, node_list
from ...ir.interpret import run
from ...ir.ops import OPS, Prop
from ..verdict import Outcome
from . import gpu as ffgpu
from . import share as ffshare
from .degree import degree_bound, degree_info, projection_bound, stated_bound, trials_needed, uses_exp
from .field import Field, safe_primes
from .heap import heap_arrays
from .meanings import FFDomain
from .products import _one_blas_thread
from .values import FV, Part, _frozen, fv_of, ints, stacked

#: per trial, the target's inputs are kept by :class:`FFReference` when they take at most this many bytes
INPUT_CACHE_BYTES = 24 << 20



@dataclass(frozen=True)
class FFResult:
    """Outcome of the finite-field test."""

    outcome: Outcome  # PROVED: equal on every trial; REFUTED: a trial differs (``output``, ``index``); else UNKNOWN
    reason: str
    p: tuple[int, ...]
    q: tuple[int, ...]
    g: tuple[int, ...]
    seeds: tuple[int, ...]
    trials: int
    per_trial_bound: float
    bound: float
    seconds: float
    output: int | None = None
    #: where output ``output`` differs (None in a refutation not located yet: see ``locate`` of :func:`ff_test`)
    index: tuple[int, ...] | None = None
    #: the refuting trial's inputs in the stacked form (None: not made; :func:`refutation_inputs` makes them)
    inputs: dict[str, np.ndarray] | None = None
    field_trial: int | None = None
    #: whether the outputs were compared through random bilinear projections (:mod:`verimirage.smt.ff.proj`)
    projected: bool = False
    #: where the big products ran (:func:`verimirage.smt.ff.gpu.describe`)
    device: str = "cpu"
    #: the false-accept probability this test states (None: it states none; ``bound`` is then the per-node
    #: model's figure only): element-wise applications counted, and only for programs without order or
    #: oracle ops (:func:`stated_bound`)
    stated_bound: float | None = None
    #: why no probability is stated, or how the stated one was made
    bound_note: str = ""



_GEN_CHUNK = 1 << 20


class _Draws:
    """One input part's residues, drawn once (uniform in [0, m), int32 draws in chunks of :data:`_GEN_CHUNK` from
    the part's own stream) in whichever kind is asked first; the other kind is converted from that array (the
    same values). Holds the arrays, never the parts (so no reference cycle keeps them alive)."""

    __slots__ = ("args", "made")

    def __init__(self, shape: tuple[int, ...], seed: int, index: int, part: int, m: int) -> None:
        self.args = (shape, seed, index, part, m)
        self.made: np.ndarray | None = None

    def __call__(self, dtype: type) -> np.ndarray:
        if self.made is not None:
            return _frozen(self.made.astype(dtype))
        shape, seed, index, part, m = self.args
        rng = np.random.default_rng([seed, 0x5EED, part, index])
        out: np.ndarray = np.empty(shape, dtype=dtype)
        flat = out.reshape(-1)
        for s in range(0, flat.size, _GEN_CHUNK):
            n = min(_GEN_CHUNK, flat.size - s)
            flat[s : s + n] = rng.integers(0, m, size=n, dtype=np.int32)
        self.made = out
        return _frozen(out)


def _input_part(shape: tuple[int, ...], seed: int, index: int, part: int, m: int) -> Part:
    """An input's part: float64 (inputs mostly feed matmuls, which read float64 residues) with its int64 twin
    made now, each drawn only if asked for: an input read by element-wise ops alone is never held as float64
    as well (the twin is drawn, not converted, when it is asked for first)."""
    draws = _Draws(shape, seed, index, part, m)
    f = Part(lambda: draws(np.float64), kind="f")
    f._twin = Part(lambda: draws(np.int64), kind="i")
    return f


def input_values(g: Graph, fld: Field, seed: int) -> dict[str, FV]:
    """Fresh uniform random residues for every input of ``g``, from ``seed``, as lazy values.

    Each (input, part) has its own stream (inputs in name order), so a part has the same value
    whether or not, and in whichever order, the other parts are made.
    """
    vals = {}
    for i, t in enumerate(sorted(g.inputs, key=lambda t: str(t.name))):
        shape = tuple(t.shape)
        vals[str(t.name)] = FV(shape, _input_part(shape, seed, i, 0, fld.p), _input_part(shape, seed, i, 1, fld.q))
    return vals


def trial_inputs(g: Graph, fld: Field, seed: int, *, q_part: bool = True) -> dict[str, np.ndarray]:
    """The inputs of :func:`input_values` as arrays ``(2, *shape)`` (p- and q-residues), or
    ``(1, *shape)`` with ``q_part=False``; the p-parts are the same either way."""
    out = {}
    for k, v in input_values(g, fld, seed).items():
        out[k] = stacked(v) if q_part else ints(v.p)[None]
    return out



def default_seeds(seed: int, n: int) -> tuple[int, ...]:
    """The first ``n`` trial seeds derived from ``seed`` (a prefix of one fixed stream)."""
    return tuple(int(s) for s in np.random.default_rng([seed, 0xF1E1D]).integers(0, 1 << 62, size=n))


def _first_difference(x: np.ndarray, y: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first element where the p-residues ``x`` and ``y`` differ, or None."""
    x0, y0 = np.broadcast_arrays(x, y)
    if np.array_equal(x0, y0):
        return None
    return tuple(int(v) for v in np.argwhere(x0 != y0)[0])


def held_bytes(values: Mapping[str, FV]) -> int:
    """Bytes of the arrays computed so far for the parts of ``values`` (and their int/float twins)."""
    n = 0
    for v in values.values():
        for part in (v.p, v.q):
            while part is not None:
                if part._val is not None:
                    n += part._val.nbytes
                part = part._twin
    return n


def _nbytes(g: Graph) -> int:
    return sum(8 * 2 * math.prod(t.shape) for t in g.inputs)


def _trial_bytes(g: Graph) -> int:
    """About the bytes a trial of ``g`` holds at once: its inputs' two parts and two values the size of its
    largest computed value (an op's operand and its result), 8 bytes a residue. (A cross entropy over a
    vocabulary holds its two inputs and two values of their size: 4 GiB of 16 at 512 x 151,936.)"""
    big = max((math.prod(o.shape) for n in node_list(g) if n.op != "input" for o in n.outs), default=0)
    return _nbytes(g) + 8 * 2 * 2 * big


def _run_lazy(g: Graph, inputs: Mapping[str, FV], fld: Field) -> list[FV]:
    return list(run(g, inputs, FFDomain(fld)))


#: environment variable: the most threads the finite-field test runs trials on (default: usable cores, at most 4)
THREADS_ENV = "VERIMIRAGE_FF_THREADS"
#: the trials of one test in flight at once hold at most about this many bytes of values (:func:`_trial_bytes`)
PARALLEL_BYTES = 6 << 30
#: a trial whose values take at least this many bytes runs alone, in the calling thread: worker threads map and
#: fault in fresh pages for every big array (their glibc arenas), and on the shared CPU box two such trials at once
#: cost 1.6-1.9x the CPU time of the same trials one after the other (qk_layernorm_attention: 45-51 against 27.5
#: CPU-s; the system time of page faults), where the calling thread reuses its heap (:mod:`.heap`)
SERIAL_BYTES = 1 << 30


def ff_workers(trials: int, nbytes: int) -> int:
    """How many trials to evaluate at once: usable cores (or ``$VERIMIRAGE_FF_THREADS``), at most
    ``trials``, and few enough that the trials' values (``nbytes`` each: :func:`_trial_bytes`) stay under
    :data:`PARALLEL_BYTES` together; one when a trial's take :data:`SERIAL_BYTES` or more."""
    n = ffshare.env_int(THREADS_ENV, 0, 1, GraphError)
    if not n:
        try:
            n = min(4, len(os.sched_getaffinity(0)))
        except AttributeError:  # not Linux
            n = min(4, os.cpu_count() or 1)
    if nbytes >= SERIAL_BYTES:
        return 1
    return max(1, min(n, trials, PARALLEL_BYTES // max(1, nbytes)))


@contextlib.contextmanager
def collect_here() -> Iterator[None]:
    """Hold automatic garbage collection off until the block ends, so that worker threads started inside
    it never run a collection; cyclic garbage waits for the next collection on whichever thread allocates
    after the block (normally the caller's). Objects that must be freed on the thread that made them
    (egglog's e-graphs, left in cycles by a search) are otherwise dropped by a worker thread that happens
    to trigger a collection, which egglog refuses (and leaks them). No collection is forced here: a full
    one costs ~0.2 s in a process with torch, Z3 and egglog loaded, more than a small verification."""
    if not gc.isenabled():  # nested, or the caller manages collection itself
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _run_trials(trial: Callable[[int], FFResult | None], n: int, workers: int,
                decided: threading.Event | None = None) -> FFResult | None:
    """Run ``trial(0) .. trial(n - 1)`` (``workers`` at a time) and return the first (lowest-index)
    non-None result, or None. No trial starts after an earlier one returned a result; ``decided`` is set
    then, so that trials already running (all of a later index, whose results are not read) may stop
    early; the answer does not depend on ``workers`` (trials are independent and deterministic)."""
    with _one_blas_thread(), collect_here(), heap_arrays():  # once for all threads: per-call set/restore would race
        if workers <= 1:
            for ti in range(n):
                r = trial(ti)
                if r is not None:
                    return r
            return None
        ctx = contextvars.copy_context()
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vm-ff") as pool:
            # a window of ``workers`` trials in flight, collected in order: trial ti + workers starts
            # only once trial ti is known to have passed
            futs = {ti: pool.submit(ctx.copy().run, trial, ti) for ti in range(min(workers, n))}
            for ti in range(n):
                try:
                    r = futs.pop(ti).result()
                except BaseException:
                    if decided is not None:
                        decided.set()
                    raise
                if r is not None:
                    if decided is not None:
                        decided.set()  # (before the pool's exit waits for the trials still running)
                    for f in futs.values():
                        f.cancel()
                    return r
                if ti + workers < n:
                    futs[ti + workers] = pool.submit(ctx.copy().run, trial, ti + workers)
        return None


#: per (trial, output): the stream of a projection's random factors (:func:`observe`)
_PROJ_SALT = 0x9B0F


def projection_factors(shape: tuple[int, ...], seed: int, k: int, m: int) -> list[np.ndarray]:
    """The random factors ``U`` (over ``shape[:-1]``) and ``r`` (over the last axis) of output ``k``'s
    projection in the trial of ``seed``: residues uniform in [0, m), each of rank ``len(shape)``."""
    rng = np.random.default_rng([seed, _PROJ_SALT, k])
    r = rng.integers(0, m, size=(1,) * (len(shape) - 1) + shape[-1:], dtype=np.int64)
    if len(shape) < 2:
        return [r]
    return [rng.integers(0, m, size=(*shape[:-1], 1), dtype=np.int64), r]


def observe(out: FV, seed: int, k: int, fld: Field, project: bool) -> np.ndarray:
    """What the test compares of output ``k``: its p-residues, or (``project``, rank >= 1) the residue
    ``sum(O * U * r) mod p`` of :func:`projection_factors`, pushed through ``O``'s linear operations."""
    if not project or not out.shape:
        return ints(out.p)
    from .proj import project as _project

    return np.array([_project(out.p, out.shape, projection_factors(out.shape, seed, k, fld.p), fld.p)],
                    dtype=np.int64)



class FFReference:
    """A target program's finite-field evaluations, cached per trial seed, to test many candidates.

    Each candidate costs one evaluation per trial: the target's compared values (and, when small,
    its inputs) are computed once per seed and reused. Seeds are a fixed stream from ``seed``, so
    every candidate is tested on the same trials. ``project``: compare random bilinear projections
    of the outputs (:func:`observe`; the default) instead of every element. ``keep_shared``: keep the
    target's big products for the candidates of later :meth:`compare` calls (within the process-wide budget of
    :mod:`verimirage.smt.ff.share`); a one-off comparison drops each trial's when the trial is done, so that
    the next trial's arrays reuse their memory.
    """

    def __init__(self, target: Graph, *, seed: int = 0, target_log2: float = 60.0, project: bool = True,
                 keep_shared: bool = True) -> None:
        self.target = target
        #: keep the target's big products for later candidates (False: drop a trial's once its candidate is done)
        self.keep_shared = keep_shared
        self.seed = seed
        self.target_log2 = target_log2
        self.project = project
        self.degree, self.opaque = degree_bound(target)
        self.info = degree_info(target)
        self.uses_exp = uses_exp(target)
        from ..ffref import exp_after_log

        #: an exp reads a log's value: not tested (see ff_test_q)
        self.exp_after_log = exp_after_log(target)
        self._outs: dict[int, tuple[list[np.ndarray], int]] = {}
        self._inputs: dict[int, dict[str, FV]] = {}
        #: the target's big products per seed, which candidates reuse (:mod:`verimirage.smt.ff.share`)
        self.shared = ffshare.Store()

    def inputs(self, s: int, fld: Field) -> dict[str, FV]:
        """The trial inputs for seed ``s`` (lazy values; kept when small, or held by :meth:`hold_inputs`)."""
        ins = self._inputs.get(s)
        if ins is None:
            ins = self.shared.held_inputs(s)
        if ins is None:
            ins = input_values(self.target, fld, s)
            if _nbytes(self.target) <= INPUT_CACHE_BYTES:
                self._inputs[s] = ins
        return ins

    def hold_inputs(self, s: int, ins: dict[str, FV], trials: int) -> bool:
        """After a trial of seed ``s``: keep its inputs ``ins`` (those computed) for later candidates, within the
        budget of :mod:`verimirage.smt.ff.share`, while the inputs held for this target's trials take at most
        half of it (more would evict each other, and the products, before a later candidate reads them): every
        trial's when ``trials`` trials' worth fit, else those of the first trials that fit (the others are
        drawn again by each candidate: the models set's MLP weights, 0.5 s per 58.7M-element draw). Whether
        they are kept."""
        if s in self._inputs:
            return True
        n = held_bytes(ins)
        half = ffshare.budget() // 2
        if n * trials > half and self.shared.held_input_bytes(but=s) + n > half:
            return False
        return self.shared.hold_inputs(s, ins, n)

    def outputs(self, s: int, inputs: Mapping[str, FV] | None = None) -> tuple[list[np.ndarray], int]:
        """The target's compared values (:func:`observe`) for seed ``s`` and its q-violation count
        (cached). ``inputs``: this trial's inputs when the caller already has them."""
        r = self._outs.get(s)
        if r is None:
            fld = Field.from_seed(s)
            with ffshare.storing(self.shared.entries(s)):
                outs = _run_lazy(self.target, inputs if inputs is not None else self.inputs(s, fld), fld)
                r = ([observe(o, s, k, fld, self.project) for k, o in enumerate(outs)], fld.q_violations)
            self._outs[s] = r
        return r

    def full_outputs(self, s: int, inputs: Mapping[str, FV]) -> list[np.ndarray]:
        """The target's output p-parts for seed ``s``, every element (not cached)."""
        fld = Field.from_seed(s)
        return [ints(o.p) for o in _run_lazy(self.target, inputs, fld)]

    def compare(self, cand: Graph, *, seeds: Sequence[int] | None = None, trials: int | None = None,
                cancel: threading.Event | None = None, locate: bool = True) -> FFResult:
        """Evaluate ``cand`` on the target's trials and compare every output (see :func:`ff_test`). ``cancel``:
        once set, no further trial starts and the result is ``unknown`` ("cancelled") unless a trial already
        refuted; a cancelled test never proves. ``locate``: see :func:`ff_test`."""
        return self._compare(cand, seeds, trials, cancel, locate)

    def locate(self, cand: Graph, r: FFResult) -> FFResult:
        """``r``, a refutation of ``cand`` whose projections differed, with the index where its output differs
        (both programs evaluated again, every element, on the refuting trial); any other result unchanged."""
        if r.outcome != Outcome.REFUTED or r.index is not None or r.output is None or r.field_trial is None:
            return r
        s, k, ti = r.seeds[-1], r.output, r.field_trial
        fld = Field.from_seed(s)
        ins = input_values(self.target, fld, s)
        idx = _first_difference(self.full_outputs(s, ins)[k], ints(_run_lazy(cand, ins, fld)[k].p))
        if idx is None:
            raise RuntimeError(f"ff: the projections of output {k} differ in trial {ti} but the outputs are equal "
                               "(a bug in verimirage.smt.ff.proj)")
        return dataclasses.replace(r, index=idx, reason=f"output {k} differs at index {idx} in trial {ti} (p={fld.p})")

    def _compare(self, cand: Graph, seeds: Sequence[int] | None, trials: int | None,
                 cancel: threading.Event | None = None, locate: bool = True) -> FFResult:
        t0 = time.perf_counter()
        db, ob = degree_bound(cand)
        deg = max(self.degree, db)
        opaque = self.opaque + ob
        q_min = int(safe_primes()[0] - 1) // 2
        per = min(1.0, (2 * deg + opaque + 1) / q_min + (projection_bound() if self.project else 0.0))
        if seeds is None:
            n = trials if trials is not None else trials_needed(per, self.target_log2)
            seeds = default_seeds(self.seed, max(n, 1))
        seeds = tuple(int(s) for s in seeds)
        p_only = not (self.uses_exp or uses_exp(cand))
        from ..ffref import exp_after_log

        if self.exp_after_log or exp_after_log(cand):
            return FFResult(Outcome.UNKNOWN, "an exp reads a value computed by log (exp(log y) is +-y in the field's "
                            "model of log): not tested", (), (), (), seeds, 0, per, 1.0,
                            time.perf_counter() - t0)
        where, failed = ffgpu.describe(), ffgpu.failures()
        ps = tuple(Field.from_seed(s).p for s in seeds)
        qs = tuple(Field.from_seed(s).q for s in seeds)
        gs = tuple(Field.from_seed(s).g for s in seeds)

        decided = threading.Event()  # an earlier trial's result is the answer: a trial still running is not read

        def trial(ti: int) -> FFResult | None:
            if cancel is not None and cancel.is_set():
                return FFResult(Outcome.UNKNOWN, f"cancelled before trial {ti}", ps[:ti], qs[:ti], gs[:ti],
                                seeds[:ti], ti, per, 1.0, time.perf_counter() - t0, projected=self.project,
                                device=where)
            if decided.is_set():
                return None
            s = seeds[ti]
            fld = Field.from_seed(s)
            ins = self.inputs(s, fld)
            outs_a, viol_a = self.outputs(s, ins)
            r = None
            if not decided.is_set():
                with ffshare.finding(self.shared.entries(s)):
                    r = candidate_trial(ti, s, fld, ins, outs_a, viol_a)
            if not self.keep_shared:
                self.shared.drop(s)  # (no later candidate will read them; later trials reuse the memory)
            elif not self.hold_inputs(s, ins, len(seeds)):
                # later candidates get new input arrays, so they find these products by value only: keep those
                # worth it (a thin product, found by address only, would just hold its inputs' memory)
                self.shared.prune(s, lambda e: ffshare.worth_sharing(e.a, e.b))
            else:
                self.shared.prune(s, lambda e: True)  # (count the inputs they are views of)
            return r

        def candidate_trial(ti: int, s: int, fld: Field, ins: dict[str, FV], outs_a: list[np.ndarray],
                            viol_a: int) -> FFResult | None:
            outs_b = _run_lazy(cand, ins, fld)
            common = dict(p=ps[: ti + 1], q=qs[: ti + 1], g=gs[: ti + 1], seeds=seeds[: ti + 1], trials=ti + 1,
                          per_trial_bound=per, projected=self.project, device=where)
            for k, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
                idx = _first_difference(x, observe(y, s, k, fld, self.project))
                if idx is not None and self.project and y.shape:
                    # the projections differ: the outputs differ somewhere
                    if not locate:
                        return FFResult(Outcome.REFUTED, f"output {k}'s projections differ in trial {ti} "
                                        f"(p={fld.p}; not located)", bound=1.0, seconds=time.perf_counter() - t0,
                                        output=k, field_trial=ti, **common)  # type: ignore[arg-type]
                    # find where, every element computed
                    idx = _first_difference(self.full_outputs(s, ins)[k], ints(y.p))
                    if idx is None:
                        raise RuntimeError(f"ff: the projections of output {k} differ in trial {ti} but the "
                                           "outputs are equal (a bug in verimirage.smt.ff.proj)")
                if idx is not None:  # (the inputs are made when wanted: refutation_inputs)
                    return FFResult(Outcome.REFUTED, f"output {k} differs at index {idx} in trial {ti} (p={fld.p})",
                                    bound=1.0, seconds=time.perf_counter() - t0, output=k, index=idx,
                                    field_trial=ti, **common)  # type: ignore[arg-type]
            del outs_b
            viol = viol_a + fld.q_violations
            if viol:
                return FFResult(Outcome.UNKNOWN, f"a program applies exp to a value with no meaningful q-part "
                                f"({viol} elements in trial {ti}): the exp algebra cannot be tested",
                                bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
            return None

        stop = _run_trials(trial, len(seeds), ff_workers(len(seeds), _trial_bytes(self.target)), decided)
        if ffgpu.failures() > failed:
            where += " (some products on the CPU: the device failed)"
        if stop is not None:
            return dataclasses.replace(stop, seconds=time.perf_counter() - t0, device=where)
        bound = per ** len(seeds)
        outcome = Outcome.PROVED if per < 1 else Outcome.UNKNOWN
        stated, note = stated_bound((self.info, degree_info(cand)), len(seeds), self.project)
        reason = (f"{len(seeds)} trial(s) equal{' (p-only: no exp)' if p_only else ''}; per-node model "
                  f"bound {bound:.3g}; " + (f"false-accept bound {stated:.3g}" if stated is not None else note)
                  if outcome == Outcome.PROVED else "degree too high for a meaningful bound")
        return FFResult(outcome, reason, ps, qs, gs, seeds, len(seeds), per, bound,
                        time.perf_counter() - t0, projected=self.project, device=where,
                        stated_bound=stated if outcome == Outcome.PROVED else None, bound_note=note)


def ff_test(
    a: Graph, b: Graph, *, seeds: Sequence[int] | None = None, seed: int = 0, trials: int | None = None,
    target_log2: float = 60.0, reference: FFReference | None = None, project: bool = True,
    cancel: threading.Event | None = None, locate: bool = True,
) -> FFResult:
    """Evaluate ``a`` and ``b`` in fresh random fields on fresh random inputs; compare every output.

    The stated bound (per trial ``(2 * degree + opaque + 1) / q``, independent trials multiplied)
    models exp and the nonlinear unary ops as fresh random values (the model of Mirage's analysis).
    ``project`` (the default): each output is compared through a random bilinear projection
    (:func:`observe`), which adds ``2 / p`` per trial; otherwise element by element.
    ``reference``: an :class:`FFReference` of ``a`` (same seed) whose cached outputs are reused.
    ``cancel``: see :meth:`FFReference.compare` (a cancelled test is ``unknown``, never ``proved``).
    ``locate`` (the default): a refutation whose projections differ is located (both programs evaluated again,
    every element); False leaves ``index`` None (:func:`ff_test_p_or_q` locates one it keeps). A refutation's
    ``inputs`` are not made here: :func:`refutation_inputs`.
    """
    if reference is None or reference.seed != seed or reference.target_log2 != target_log2 or (
            reference.project != project) or (reference.target is not a and str(reference.target) != str(a)):
        reference = FFReference(a, seed=seed, target_log2=target_log2, project=project, keep_shared=False)
    return reference.compare(b, seeds=seeds, trials=trials, cancel=cancel, locate=locate)


def ff_test_q(a: Graph, b: Graph, seeds: Sequence[int] | None = None, *, seed: int = 0,
              target_log2: float = 60.0) -> FFResult:
    """The q-world comparison of programs that apply log: every element of every output's q-part, in the
    fields of ``seeds`` on the trial inputs of :func:`ff_test`.

    log's q-part is the discrete log of its argument's p-residue, the exact inverse of exp (``log(exp(u) * y)
    = u + log(y)`` holds there), while its p-part is a random function, blind to those laws; so programs equal
    only through log's laws (logsumexp and its max-shifted form) differ in their p-parts and agree here.
    Comparing ``P.q`` is comparing ``exp(P)`` (``g`` has order q) and exp is injective on the reals, so this
    tests ``P = Q`` as the p-part comparison does. It answers unknown where an output has no meaningful q-part
    (an exp's value) or an exp reads a log's value (:func:`verimirage.smt.ffref.exp_after_log`: ``exp(log y)``
    is ``+-y`` in this model). The discrete log has no polynomial degree: no probability is stated (like
    max's order on residues, the test is evidence); the abstract check proves such pairs by its own laws
    (``log-exp``), and both must agree for Proved. log of a negative argument equals log of its absolute
    value here (-1 has discrete log 0): the definedness check of the abstract side rejects a candidate that
    takes log where the target does not."""
    from ..ffref import exp_after_log

    t0 = time.perf_counter()
    db, ob = degree_bound(a)
    db2, ob2 = degree_bound(b)
    q_min = int(safe_primes()[0] - 1) // 2
    per = min(1.0, (2 * max(db, db2) + ob + ob2 + 1) / q_min)
    if seeds is None:
        seeds = default_seeds(seed, max(trials_needed(per, target_log2), 1))
    seeds = tuple(int(s) for s in seeds)
    fields = [Field.from_seed(s) for s in seeds]
    common = dict(p=tuple(f.p for f in fields), q=tuple(f.q for f in fields), g=tuple(f.g for f in fields),
                  seeds=seeds, trials=len(seeds), per_trial_bound=1.0, projected=False)
    if exp_after_log(a) or exp_after_log(b):
        return FFResult(Outcome.UNKNOWN, "q-world: an exp reads a value computed by log (exp(log y) is +-y in the "
                        "field's model): not tested", bound=1.0, seconds=time.perf_counter() - t0,
                        **common)  # type: ignore[arg-type]
    with heap_arrays():
        stop = _q_trials(a, b, seeds, fields, common, t0)
    if stop is not None:
        return stop
    bound = per ** len(seeds)
    common["per_trial_bound"] = per
    return FFResult(Outcome.PROVED if per < 1 else Outcome.UNKNOWN,
                    f"{len(seeds)} trial(s) equal in the q-world (log as exp's inverse); per-node model bound "
                    f"{bound:.3g}", bound=bound, seconds=time.perf_counter() - t0, stated_bound=None,
                    bound_note="no probability stated: log is modelled by a discrete log (the field test is "
                    "evidence there, not a bound)", **common)  # type: ignore[arg-type]


def _q_trials(a: Graph, b: Graph, seeds: tuple[int, ...], fields: list[Field], common: dict[str, Any],
              t0: float) -> FFResult | None:
    """The trials of :func:`ff_test_q`: the first that is not equal (its result), or None."""
    for ti, (s, fld) in enumerate(zip(seeds, fields, strict=True)):
        ins = input_values(a, fld, s)
        outs_a = _run_lazy(a, ins, fld)
        outs_b = _run_lazy(b, ins, fld)
        for k, (x, y) in enumerate(zip(outs_a, outs_b, strict=True)):
            if x.q is None or y.q is None:
                return FFResult(Outcome.UNKNOWN, f"q-world: output {k} has no meaningful q-part (an exp's value)",
                                bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
            xq, yq = ints(x.q), ints(y.q)
            if (xq < 0).any() or (yq < 0).any():
                return FFResult(Outcome.UNKNOWN, f"q-world: output {k} has meaningless q-residues in trial {ti}",
                                bound=1.0, seconds=time.perf_counter() - t0, **common)  # type: ignore[arg-type]
            idx = _first_difference(xq, yq)
            if idx is not None:
                return FFResult(Outcome.REFUTED, f"q-world: output {k} differs at index {idx} in trial {ti} "
                                f"(q={fld.q})", bound=1.0, seconds=time.perf_counter() - t0, output=k, index=idx,
                                field_trial=ti, **common)  # type: ignore[arg-type]
        if fld.q_violations:
            return FFResult(Outcome.UNKNOWN, f"q-world: exp of a meaningless q-part ({fld.q_violations} elements in "
                            f"trial {ti})", bound=1.0, seconds=time.perf_counter() - t0,
                            **common)  # type: ignore[arg-type]
    return None


def applies_log(a: Graph, b: Graph) -> bool:
    """Whether ``a`` or ``b`` applies log (so that :func:`ff_test_p_or_q` may replace a p-part refutation)."""
    from ..ffref import ops_in

    return "log" in ops_in(a) | ops_in(b)


def ff_test_p_or_q(a: Graph, b: Graph, r: FFResult, *, seed: int = 0) -> FFResult:
    """``r`` (the p-part test of ``a`` and ``b``), or, when it found a difference and a program applies log,
    the q-world test (:func:`ff_test_q`) on the same trials if that finds them equal. A refutation kept is
    located (:meth:`FFReference.locate`) if ``r`` was not (:func:`ff_test` with ``locate=False``)."""
    if r.outcome != Outcome.REFUTED:
        return r
    if applies_log(a, b):
        rq = ff_test_q(a, b, seed=seed)
        if rq.outcome == Outcome.PROVED:
            return rq
    return FFReference(a, seed=seed, project=r.projected, keep_shared=False).locate(b, r)


def refutation_inputs(a: Graph, r: FFResult) -> dict[str, np.ndarray]:
    """The inputs of refutation ``r``'s trial (of :func:`ff_test` or :func:`ff_test_q` on target ``a``) in the
    stacked form of :func:`trial_inputs`: ``r.inputs``, or made again from the trial's seed."""
    if r.inputs is not None:
        return r.inputs
    s = r.seeds[-1]
    return trial_inputs(a, Field.from_seed(s), s)


def ff_domain_ops() -> list[str]:
    """Registry ops with an ff meaning (for tests)."""
    return sorted(n for n, o in OPS.items() if "ff" in o.domains and not o.has(Prop.STRUCTURAL))


def run_ff(g: Graph, inputs: Mapping[str, np.ndarray], fld: Field) -> list[np.ndarray]:
    """Evaluate ``g`` in field ``fld`` on input arrays in the stacked form (leading axis: p-residues,
    then, if present, q-residues with -1 where meaningless); every part of every output is computed
    and returned in the stacked form ``(2, *shape)`` (a meaningless q-part is -1)."""
    outs = _run_lazy(g, {k: fv_of(v) for k, v in inputs.items()}, fld)
    return [stacked(o) for o in outs]
