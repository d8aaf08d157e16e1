"""Finding (issue 22, cross_entropy): the one-kernel-per-row split of the mean over rows (16 blocks of one row,
then a combine) was rejected with "z3 says sat": each split derives as the row's term at a constant index
(``f(0) + f(1) + ... + f(15)``), the source as ``sum_r f(r)``. Runs of terms equal but for one constant index
now fold into a sum (law sum-fold, in the canonical retry of the abstract check); gaps, other coefficients and
missing rows are still not proved.
"""

from __future__ import annotations

import verimirage as vm
from verimirage.benchmarks.models import get_model
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all
from verimirage.smt.axioms import AXIOMS, check_law
from verimirage.smt.verify import abstract_check


def _row_sum(rows: list[int], n: int = 4, scale: list[float] | None = None) -> tuple[vm.Graph, vm.Graph]:
    a = vm.Graph()
    x = a.input("X", (n, 8), vm.float32)
    a.output(a.sum(a.exp(x), axis=0))
    b = vm.Graph()
    y = b.input("X", (n, 8), vm.float32)
    acc = None
    for j, r in enumerate(rows):
        t = b.exp(b.slice(y, 0, r, r + 1))
        if scale is not None:
            t = b.scale(t, scale[j])
        acc = t if acc is None else b.add(acc, t)
    assert acc is not None
    b.output(acc)
    return a, b


def test_sum_fold_is_a_checked_law() -> None:
    assert "sum-fold" in AXIOMS and check_law("sum-fold")


def test_rows_added_one_by_one_equal_the_sum() -> None:
    a, b = _row_sum([0, 1, 2, 3])
    r = abstract_check(a, b)
    assert r.outcome == "proved" and "sum-fold" in r.laws


def test_a_missing_or_repeated_or_rescaled_row_is_not_proved() -> None:
    for rows, scale in (([0, 1, 3], None), ([0, 1, 2, 2], None), ([0, 1, 2, 3], [1.0, 1.0, 2.0, 1.0])):
        a, b = _row_sum(rows, scale=scale)
        assert abstract_check(a, b).outcome != "proved", rows
        assert not isinstance(vm.verify(a, b), vm.Proved), rows


def test_cross_entropy_one_row_per_split_is_proved() -> None:
    g = get_model("cross_entropy", small=True)
    lows, _ = lower_all(g, cuts=False, rank=pricing.cost)
    per_row = [lo for lo in lows if lo.config is not None and lo.config.splits == g.inputs[0].shape[0]]
    assert per_row
    assert isinstance(vm.verify(g, per_row[0].mugraph), vm.Proved)
