"""The finite-field trials of a large program hold no more than they need (twentieth session, heldout20).

qwen2_cross_entropy (512 x 151,936 logits) peaked at 19.5-20.3 GiB: the p-part test of a log program, refuted
as expected (the candidate is equal only through log's laws, which the q-world test checks), located the
difference (the target evaluated again, every element) and drew every input again in the stacked form for the
counterexample, in two trials at once, before the q-world test replaced the refutation. Now a refutation is
located only when it is kept, its inputs are made only when a verdict records them, an input read by
element-wise ops alone is drawn as int64 only, and a trial whose values would not fit beside another's runs
alone.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.models import cross_entropy
from verimirage.smt.ff import FFReference, Field, ff_test, ff_test_p_or_q, ff_workers, refutation_inputs, trial_inputs
from verimirage.smt.ff import heap as FFheap
from verimirage.smt.ff import trials as FFtrials
from verimirage.smt.ff.trials import _run_trials, _trial_bytes
from verimirage.smt.verdict import Outcome


def _ce(stable: bool, shape: tuple[int, int] = (4, 16)) -> vm.Graph:
    g = vm.Graph()
    g.output(cross_entropy(g, g.input("X", shape, vm.float32), g.input("T", shape, vm.float32), stable=stable))
    return g


def test_a_log_program_refuted_in_the_p_world_made_counterexample_inputs_and_located_it(monkeypatch) -> None:
    """Proved through the q-world test: no stacked inputs were made and the target was never evaluated a second
    time to locate a difference the q-world test then replaced (on the old code both happened in every trial
    that refuted, 10 GiB of the 20 GiB peak at full size)."""
    made: list[str] = []
    orig_inputs, orig_full = FFtrials.trial_inputs, FFReference.full_outputs
    monkeypatch.setattr(FFtrials, "trial_inputs", lambda *a, **k: made.append("inputs") or orig_inputs(*a, **k))
    monkeypatch.setattr(FFReference, "full_outputs",
                        lambda self, *a, **k: made.append("located") or orig_full(self, *a, **k))
    v = vm.verify(_ce(True), _ce(False))
    assert isinstance(v, vm.Proved), v.reason
    assert "q-world" in str(v.evidence[0].params) or "no probability" in v.reason
    assert made == []


def _wrong_pair() -> tuple[vm.Graph, vm.Graph]:
    """Two programs that differ (no log): ``X W`` against ``X W + X W`` (twice the value)."""
    gs = []
    for twice in (False, True):
        g = vm.Graph()
        x, w = g.input("X", (2, 4, 8), vm.float32), g.input("W", (2, 8, 4), vm.float32)
        y = g.matmul(x, w)
        g.output(g.add(y, y) if twice else y)
        gs.append(g)
    return gs[0], gs[1]


def test_an_unlocated_refutation_is_located_where_it_is_kept() -> None:
    a, b = _wrong_pair()
    located = ff_test(a, b, seed=3)
    lazy = ff_test(a, b, seed=3, locate=False)
    assert located.outcome == lazy.outcome == Outcome.REFUTED
    assert located.index is not None and lazy.index is None and lazy.output == located.output
    kept = ff_test_p_or_q(a, b, lazy, seed=3)
    assert (kept.output, kept.index, kept.field_trial, kept.reason) == (
        located.output, located.index, located.field_trial, located.reason)


def test_refutation_inputs_are_the_trial_inputs_and_a_refuted_verdict_records_them() -> None:
    a, b = _wrong_pair()
    r = ff_test(a, b, seed=5)
    assert r.outcome == Outcome.REFUTED and r.inputs is None
    want = trial_inputs(a, Field.from_seed(r.seeds[-1]), r.seeds[-1])
    got = refutation_inputs(a, r)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted)
    cex = v.counterexample
    fld = cex["ff_field"]
    assert all(np.array_equal(cex["ff_inputs"][k], x)
               for k, x in trial_inputs(a, Field.from_seed(fld["seed"]), fld["seed"]).items())


@pytest.mark.parametrize("first", ["f", "i"])
def test_an_input_part_is_drawn_once_in_the_kind_asked_first_with_the_same_values(first: str) -> None:
    d = FFtrials._input_part((3, 70000), 11, 2, 0, 1_000_003)
    twin = d._twin
    assert twin is not None and twin.kind == "i"
    parts = {"f": d, "i": twin}
    a = parts[first].get()
    assert not a.flags.writeable
    assert not parts["i" if first == "f" else "f"].ready  # the other kind is not made until asked for
    b = parts["i" if first == "f" else "f"].get()
    assert a.dtype != b.dtype and np.array_equal(a, b)
    fresh = FFtrials._input_part((3, 70000), 11, 2, 0, 1_000_003).get()  # drawn as float64 first
    assert np.array_equal(fresh, a)


def test_an_input_read_by_element_wise_ops_alone_is_never_held_as_float64() -> None:
    g = _ce(True)
    ref = FFReference(g)
    fld = Field.from_seed(7)
    ins = ref.inputs(7, fld)
    ref.outputs(7, ins)
    made = []
    for v in ins.values():
        for part in (v.p, v.q):
            assert not part.ready  # (float64) never made
            assert part._twin is not None
            made.append(part._twin.ready)
    assert list(ins) == ["T", "X"] and made == [True, False, True, True]  # T's p-part, X's two (exp reads q)


def test_a_trial_whose_values_would_not_fit_beside_another_runs_alone() -> None:
    big = _ce(True, (512, 151936))  # not evaluated: its size only
    assert _trial_bytes(big) > FFtrials.PARALLEL_BYTES // 2
    assert ff_workers(4, _trial_bytes(big)) == 1
    small = _ce(True)
    assert _trial_bytes(small) == FFtrials._nbytes(small) + 8 * 2 * 2 * 4 * 16


def test_run_trials_tells_the_trials_still_running_that_the_answer_is_decided() -> None:
    decided, started = threading.Event(), threading.Event()
    seen: dict[int, bool] = {}

    def trial(ti: int) -> FFtrials.FFResult | None:
        if ti == 1:  # still running when trial 0's refutation decides the answer (the pool waits for it)
            started.set()
            seen[ti] = decided.wait(10)
            return None
        assert started.wait(10)
        return FFtrials.FFResult(Outcome.REFUTED, "x", (), (), (), (), 1, 0.5, 1.0, 0.0, field_trial=0)

    r = _run_trials(trial, 4, 2, decided)
    assert r is not None and r.field_trial == 0
    assert decided.is_set() and seen == {1: True}


@pytest.mark.skipif(not FFheap.enabled(), reason="glibc only")
def test_a_big_array_freed_during_the_trials_is_reused_without_fresh_pages() -> None:
    import resource

    def touch() -> int:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a = np.empty(96 << 17)  # 96 MiB: above glibc's largest mmap threshold
        a.fill(1.0)
        del a
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    with FFheap.heap_arrays(), FFheap.heap_arrays():  # (nested: one setting)
        touch()
        again = touch()
    fresh = touch()  # after the block: mapped (and faulted in) again
    assert again * 4 < fresh, (again, fresh)


def test_where_on_a_0_1_mask_selects_the_same_residues_as_the_ring_form() -> None:
    """A mask of 0s and 1s (tril) selects; any other m (a bool input's residues, a -1 mark) takes the ring form
    ``m (a - b) + b``; both give the residues the reference evaluator gives."""
    from verimirage.smt import ffref

    for mask_input in (False, True):
        g = vm.Graph()
        s = g.input("S", (3, 8, 8), vm.float32)
        m = g.input("M", (1, 8, 8), vm.bool) if mask_input else g.tril_mask((8, 8))
        c = g.where(m, s, g.shift(g.scale(s, 0.0), -1e4))
        g.output(g.where(m, g.exp(g.sub(c, g.max(c, axis=2))), g.scale(c, 0.0)))
        fld = Field.from_seed(13)
        ins = trial_inputs(g, fld, 13)
        fast = FFtrials.run_ff(g, ins, fld)[0]
        (ref,), _ = ffref.evaluate(g, ins, ffref.field_of(13))
        assert (fld.p, fld.q) == (ffref.field_of(13).p, ffref.field_of(13).q)
        assert np.array_equal(fast[0], ref[0]) and np.array_equal(fast[1], ref[1])
