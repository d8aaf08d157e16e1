"""Slices and concats of register tiles in aligned power-of-two chunks lower to tl.split / tl.join
(backend/lowering.py). The one-hot selection they used made the fused rotary-attention kernel (two slices
and a concat of each Q and K tile) run 4.4 ms on an H100 against torch.compile's 50 µs (models set,
2026-11-26); other slices and concats keep the one-hot form. (Slices of a block input itself are loaded directly
since codegen 12: tests/test_codegen_rotate.py; the graphs here slice a computed tile.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verimirage as vm
from verimirage.backend.codegen import generate
from verimirage.backend.runtime import compile as vcompile
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all

CASES = [
    ((2, 4, 16), 2, [(8, 16), (0, 8)], True),  # rotate-half
    ((2, 8, 16), 1, [(4, 8), (0, 4)], True),  # a middle axis
    ((4, 32), 1, [(0, 8), (24, 32), (8, 16), (16, 24)], True),  # four chunks of a longer axis
    ((4, 24), 1, [(8, 16), (0, 8)], False),  # an axis of 24 (padded to 32): one-hot
    ((4, 16), 1, [(3, 11), (0, 3)], False),  # unaligned pieces: one-hot
]


@pytest.mark.parametrize(("shape", "ax", "parts", "fast"), CASES)
def test_chunked_slice_concat_lowering_and_values(shape: tuple[int, ...], ax: int, parts: list[tuple[int, int]],
                                                  fast: bool) -> None:
    g = vm.Graph()
    x = g.scale(g.input("X", shape, vm.float32), 2.0)  # (a computed tile: see the module docstring)
    pieces = [g.slice(x, ax, a, b) for a, b in parts]
    g.output(g.concat([g.neg(p) if i % 2 == 0 else p for i, p in enumerate(pieces)], axis=ax))
    # one kernel: the slices and the concat act on register tiles
    fused = next(lo.mugraph for lo in lower_all(g, cuts=False, rank=pricing.cost)[0] if lo.mugraph.num_kernels == 1)
    src = generate(fused).source
    assert ("tl.split" in src and "tl.join" in src) == fast
    a = np.random.default_rng(7).standard_normal(shape)
    ref = vm.evaluate(g, {"X": a})[0]
    out = vcompile(fused)(torch.tensor(a, dtype=torch.float32))
    out = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-6)
