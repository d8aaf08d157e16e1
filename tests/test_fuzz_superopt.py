"""Self-fuzzing: random graphs through verimirage's own pipeline (bounded, seeded, CPU).

* every candidate ``vm.superoptimize`` returns evaluates equal to the graph (float64 reference), is Proved, and the
  compiled best kernel matches the reference within the per-dtype tolerances;
* ``vm.compile`` of the graph itself (kernel-level op wrapping) matches the reference.

Graphs come from ``vm.testing.graphs(safe=True)``: values bounded, divisions and roots only of quantities bounded away
from zero, so fixed tolerances are meaningful. Inputs come from the ``normal`` regime with random layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import verimirage as vm
from verimirage.testing import graphs, inputs, tolerances
from verimirage.testing.checks import check_reference

FUZZ = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,  # seeded: the same graphs on every run (CI), hypothesis' database still replays failures
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
GRAPHS = graphs(max_ops=4, dims=(2, 4, 8, 16), max_rank=3, dtypes=(vm.float16, vm.float32), max_numel=2048)


def close64(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to float64 rounding (relative to the output's scale), NaN where NaN."""
    scale = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) + 1e-30
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-9 * scale, equal_nan=True))


@FUZZ
@given(g=GRAPHS, data=st.data())
def test_superoptimized_candidates_equal_the_graph_and_the_best_kernel_matches(g, data):
    res = vm.superoptimize(g, time_budget_s=20.0, top_k=3)
    assert res.candidates, f"no verified candidate for\n{g}\n{res.report}"
    for _ in range(2):
        case = data.draw(inputs(g, regimes=("normal",)), label="inputs")
        ref = vm.evaluate(g, case)
        for c in res.candidates:
            assert isinstance(c.verdict, vm.Proved), f"candidate with verdict {c.verdict}:\n{c.mugraph}"
            got = vm.evaluate(c.mugraph, case)
            for i, (a, b) in enumerate(zip(ref, got, strict=True)):
                assert close64(a, b), f"candidate output {i} differs from the graph:\n{g}\n{c.mugraph}"
    fn = vm.compile(res.best)
    case = data.draw(inputs(g, regimes=("normal",)), label="kernel inputs")
    check_reference(fn, g, case, tolerances(g))


@pytest.mark.slow  # runs every drawn graph's kernels in the Triton interpreter
@FUZZ
@given(g=GRAPHS, data=st.data())
def test_compiled_graph_matches_the_reference(g, data):
    fn = vm.compile(g)
    for _ in range(2):
        case = data.draw(inputs(g, regimes=("normal", "mixed")), label="inputs")
        check_reference(fn, g, case, tolerances(g))
