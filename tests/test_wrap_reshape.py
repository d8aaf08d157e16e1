"""The default kernel of a reshape that merges or splits dims (backend/wrap.py ``_reshape_block``).

Before: the grid walked only the dims a reshape keeps, so GroupNorm's ``(16, 512, 1024) -> (16, 32, 16384)``
ran as 16 blocks each copying 512K elements (about 0.5 ms each on an H100). Now each merged or split group is
split along its leading dims into the same number of blocks on both sides.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import verimirage as vm
import verimirage.backend.wrap as wrap
from verimirage.backend.codegen import generate
from verimirage.backend.runtime import compile as vcompile
from verimirage.backend.wrap import to_kernels
from verimirage.benchmarks.models import get_model

CASES = [
    ((2, 32, 16), (2, 8, 64), 16),
    ((2, 8, 64), (2, 32, 16), 16),
    ((2, 4, 16), (8, 16), 4),
    ((8, 16), (2, 4, 16), 4),
    ((4, 16, 8), (4, 8, 16), 8),
    ((2, 3, 16, 4), (2, 3, 64), 6),
]


def test_group_norm_reshapes_are_not_one_block_per_batch() -> None:
    # the full-size GroupNorm: both reshape kernels get 512 blocks of 16384 elements (were 16 blocks)
    grids = [k.grid for k in generate(get_model("group_norm")).kernels]
    assert grids[0] == (32, 16) and grids[-3] == (32, 16)
    assert all(int(np.prod(gr)) >= 16 for gr in grids)


@pytest.mark.parametrize(("shape", "new", "blocks"), CASES)
def test_reshape_kernel_splits_groups_and_copies_exactly(monkeypatch: pytest.MonkeyPatch, shape: tuple[int, ...],
                                                         new: tuple[int, ...], blocks: int) -> None:
    monkeypatch.setattr(wrap, "MAX_TILE", 4)  # small tiles, so the small shapes split their groups
    g = vm.Graph()
    g.output(g.reshape(g.input("X", shape, vm.float32), new))
    mg = to_kernels(g)
    mg.check()
    (kern,) = generate(g).kernels
    assert int(np.prod(kern.grid)) == blocks
    a = np.random.default_rng(3).standard_normal(shape)
    np.testing.assert_array_equal(vm.evaluate(mg, {"X": a})[0], a.reshape(new))
    out = vcompile(g)(torch.tensor(a, dtype=torch.float32))
    out = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_array_equal(out.numpy(), a.reshape(new).astype(np.float32))


@pytest.mark.parametrize(("shape", "new"), [((32, 512, 128), (8, 2048, 128)), ((8, 2048, 128), (32, 512, 128)),
                                            ((16, 512, 1024), (16, 32, 16384))])
def test_reshape_kernel_tile_counts_the_kept_last_dim(shape: tuple[int, ...], new: tuple[int, ...]) -> None:
    """Layer prefill finding: ``(8, 2048, 128) -> (32, 512, 128)`` sized its group's blocks without the kept
    128-wide last dim, ran as one block of 2**21 elements and failed in Triton's compiler on the GPU (2**20
    elements per tensor). Every reshape kernel's tile stays within Triton's limit."""
    from verimirage.backend.lowering import TRITON_MAX_NUMEL
    from verimirage.rewrite.cost import _largest_tile

    g = vm.Graph()
    g.output(g.reshape(g.input("X", shape, vm.float16), new))
    (k,) = generate(g).kernels
    assert int(np.prod(k.grid)) > 1
    bg = to_kernels(vm.MuGraph.from_graph(g)).nodes[-1].attr("block")
    assert _largest_tile(bg) <= TRITON_MAX_NUMEL
