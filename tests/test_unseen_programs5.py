"""Held-out programs, fifth set (benchmarks/unseen_graphs5.py): full-size ``vm.Graph`` programs of open LLMs (Phi-3,
Qwen2, DeepSeek-V2, Llama-3, Gemma-2), here as their scaled-down twins (the same ops, dtypes and structure).

Each twin is superoptimized (the search cache off; every candidate Proved) and its best candidate's kernels, run in
Triton's interpreter, compared with the float64 reference. The full-size searches and their times are the benchmark
script's (``benchmarks/results/unseen5/``), not CI's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_graphs4 as u4  # noqa: E402
import unseen_graphs5 as u5  # noqa: E402

import verimirage as vm  # noqa: E402

#: relative tolerance of an output against float64 over max(1, its largest magnitude), per dtype
TOL = {"float16": 2e-2, "float32": 1e-4}
_TORCH = {vm.float16: torch.float16, vm.float32: torch.float32, vm.bool: torch.bool}


def twin_is_proved_and_matches_float64(name: str, g: vm.Graph, ins: dict[str, np.ndarray]) -> None:
    """Search twin ``g`` (every candidate Proved, the best fewer kernels than one per op) and compare its best
    candidate's kernels, run on ``ins`` in Triton's interpreter, with the float64 reference (also the sixth set's)."""
    res = vm.superoptimize(g, cache=False, progress=False, time_budget_s=30.0)
    assert res.candidates and all(isinstance(c.verdict, vm.Proved) for c in res.candidates), str(res.report)
    assert res.best is not None and res.best.mugraph.num_kernels < vm.MuGraph.from_graph(g).num_kernels
    ref = vm.evaluate(g, ins)
    out = vm.compile(res.best.mugraph)(*[torch.from_numpy(np.asarray(ins[t.name])).to(_TORCH[t.dtype])
                                         for t in g.inputs])
    outs = out if isinstance(out, (list, tuple)) else [out]
    tol = max(TOL.get(t.dtype.name, 0.0) for t in [*g.inputs, *g.outputs])
    for o, r in zip(outs, ref, strict=True):
        assert np.isfinite(r).all(), f"{name}: the reference is not finite on the program's inputs"
        e = float(np.abs(o.double().numpy() - r).max()) / max(1.0, float(np.abs(r).max()))
        assert e < tol, f"{name}: error {e:.2e} against float64 (tolerance {tol})"


@pytest.mark.parametrize("name", list(u5.PROGRAMS))
def test_fifth_set_twin_is_proved_and_matches_float64(name: str) -> None:
    g = u5.build(name, small=True)
    twin_is_proved_and_matches_float64(name, g, u4.program_inputs(g))


def test_fifth_set_full_sizes_build_and_are_priced() -> None:
    """Every full-size program builds and checks, has the twin's inputs, and the one-kernel-per-op estimate the
    table divides by exists; none is a program of the fourth set."""
    for name in u5.PROGRAMS:
        g = u5.build(name)
        assert u4.unfused_estimate_s(g) > 0
        assert [t.name for t in g.inputs] == [t.name for t in u5.build(name, small=True).inputs]
        assert name not in u4.PROGRAMS
