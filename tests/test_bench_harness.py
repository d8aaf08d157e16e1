"""CPU-checkable parts of the GPU harness: the eager baseline computes the suite programs exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from torch_eager import flops, min_bytes, torch_fn  # noqa: E402


@pytest.mark.parametrize("name", vm.benchmarks.names())
def test_eager_baseline_matches_reference(name: str) -> None:
    g = vm.benchmarks.get(name, batch=2, small=True)
    gen = torch.Generator().manual_seed(1)
    ins = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in g.inputs]
    got = torch_fn(g)(*ins)
    got = got if isinstance(got, tuple) else (got,)
    want = vm.evaluate(g, {t.name: x for t, x in zip(g.inputs, ins, strict=True)})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b, rtol=1e-10, atol=1e-12)


def test_floor_inputs() -> None:
    g = vm.benchmarks.get("gated_mlp", batch=1)
    assert flops(g) == 2 * 2 * 8 * 4096 * 4096
    assert min_bytes(g) == 2 * (8 * 4096 + 2 * 4096 * 4096 + 8 * 4096)
