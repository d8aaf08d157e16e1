"""The finite-field trials run on several threads without changing any verdict."""

from __future__ import annotations

import threading
import time

import pytest

import verimirage as vm
from verimirage.ir.errors import GraphError
from verimirage.smt import ff
from verimirage.smt.ff import FFResult, ff_test, ff_workers
from verimirage.smt.ff import trials as FFtrials
from verimirage.smt.ff.trials import _run_trials


def _res(ti: int) -> FFResult:
    return FFResult("refuted", f"trial {ti}", (), (), (), (), ti + 1, 0.5, 1.0, 0.0, field_trial=ti)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_run_trials_returns_the_lowest_failing_trial_and_starts_none_after_it(workers: int) -> None:
    started: list[int] = []
    lock = threading.Lock()

    def trial(ti: int) -> FFResult | None:
        with lock:
            started.append(ti)
        time.sleep(0.05 if ti == 2 else 0.0)  # trial 3 finishes (and fails) before trial 2
        return _res(ti) if ti in (2, 3) else None

    r = _run_trials(trial, 8, workers)
    assert r is not None and r.field_trial == 2
    assert max(started) <= 2 + workers - 1  # nothing started after trial 2 was known to fail
    assert sorted(started) == list(range(len(started)))


def test_run_trials_passes_when_every_trial_passes() -> None:
    seen: list[int] = []
    assert _run_trials(lambda ti: seen.append(ti), 5, 2) is None  # type: ignore[func-returns-value]
    assert sorted(seen) == [0, 1, 2, 3, 4]


def test_ff_workers_env_and_memory_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ff.THREADS_ENV, "3")
    assert ff_workers(4, 1) == 3
    assert ff_workers(2, 1) == 2  # never more than the trials
    monkeypatch.setattr(ff.trials, "SERIAL_BYTES", ff.PARALLEL_BYTES)
    assert ff_workers(4, ff.PARALLEL_BYTES // 2) == 2  # the trials' values must fit together
    assert ff_workers(4, ff.PARALLEL_BYTES * 2) == 1
    monkeypatch.setattr(ff.trials, "SERIAL_BYTES", 1 << 30)
    assert ff_workers(4, (1 << 30) - 1) == 3
    assert ff_workers(4, 1 << 30) == 1  # a big trial runs alone (in the calling thread)
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(ff.THREADS_ENV, bad)
        with pytest.raises(GraphError, match=ff.THREADS_ENV):
            ff_workers(4, 1)


def _attention(wrong_row: bool) -> tuple[vm.Graph, vm.Graph]:
    def build(shift: bool) -> vm.Graph:
        g = vm.Graph()
        q, k, v = g.input("Q", (2, 4, 8), "f16"), g.input("K", (2, 8, 16), "f16"), g.input("V", (2, 16, 8), "f16")
        s = g.matmul(q, k)
        if shift:
            s = g.sub(s, g.max(s, axis=2))
        e = g.exp(s)
        g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
        return g

    a, b = build(False), build(True)
    if wrong_row:  # the normaliser over the wrong axis
        b = vm.Graph()
        q, k, v = b.input("Q", (2, 4, 8), "f16"), b.input("K", (2, 8, 16), "f16"), b.input("V", (2, 16, 8), "f16")
        e = b.exp(b.matmul(q, k))
        b.output(b.matmul(b.div(e, b.sum(e, axis=1)), v))
    return a, b


@pytest.mark.parametrize("wrong", [False, True])
def test_ff_result_is_the_same_on_one_or_several_threads(monkeypatch: pytest.MonkeyPatch, wrong: bool) -> None:
    a, b = _attention(wrong)
    results = []
    for n in ("1", "4"):
        monkeypatch.setenv(ff.THREADS_ENV, n)
        r = ff_test(a, b, seed=7)
        results.append((r.outcome, r.seeds, r.p, r.q, r.g, r.trials, r.bound, r.output, r.index, r.field_trial))
    assert results[0] == results[1]
    assert results[0][0] == ("refuted" if wrong else "proved")


def test_verify_refutes_with_the_abstract_check_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _attention(True)
    monkeypatch.setenv(ff.THREADS_ENV, "2")
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted)
    assert [c.name for c in v.evidence] == ["finite-field"]
    assert isinstance(vm.verify(*_attention(False)), vm.Proved)


class _Finalised:
    """Cyclic garbage that records the thread that finalised it (egglog e-graphs must be dropped on
    the thread that made them; a worker thread's collection leaks them with an unraisable error)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.me = self

    def __del__(self) -> None:
        self.log.append(threading.current_thread().name)


def test_verify_runs_its_threads_with_automatic_collection_held_off(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from verimirage.smt import verify as verify_mod

    seen: list[tuple[str, bool, str]] = []
    real_abs, real_trials = verify_mod.abstract_check, FFtrials._run_trials

    def abs_spy(*a, **k):  # type: ignore[no-untyped-def]
        seen.append(("abstract", gc.isenabled(), threading.current_thread().name))
        return real_abs(*a, **k)

    def trials_spy(trial, n, workers, decided=None):  # type: ignore[no-untyped-def]
        def spied(ti: int):  # type: ignore[no-untyped-def]
            seen.append(("trial", gc.isenabled(), threading.current_thread().name))
            return trial(ti)

        return real_trials(spied, n, max(2, workers), decided)

    monkeypatch.setattr(verify_mod, "abstract_check", abs_spy)
    monkeypatch.setattr(FFtrials, "_run_trials", trials_spy)
    g = vm.benchmarks.get("lora", batch=1, small=True)
    log: list[str] = []
    gc.collect()
    _Finalised(log)  # cyclic garbage made before the verification
    assert isinstance(verify_mod.verify(g, g), vm.Proved)
    caller = threading.current_thread().name
    assert {kind for kind, _, _ in seen} == {"abstract", "trial"}
    assert any(name != caller for _, _, name in seen)  # really on worker threads
    for kind, enabled, _ in seen:  # no worker thread can run a collection
        assert not enabled, kind
    assert gc.isenabled()
    assert log in ([], [caller])  # if collected at all so far, then on the caller's thread
    gc.collect()
    assert log == [caller]


def test_collect_here_nests_and_leaves_a_disabled_gc_alone() -> None:
    import gc

    with ff.collect_here():
        assert not gc.isenabled()
        with ff.collect_here():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with ff.collect_here():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
