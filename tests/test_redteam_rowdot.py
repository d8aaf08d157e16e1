"""Red team (tenth session): one-row products (``TileOptions.row_dot``), their reshaped weights
(``row_weight_reshape``) and chunked deep dots, attacked in the interpreter against float64."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import TileOptions, generate
from verimirage.benchmarks.designs import _inputs, _one_kernel
from verimirage.ir.builders import BlockBuilder


def _reshaped_weights(wshape: tuple[int, ...], rshape: tuple[int, int]) -> tuple[vm.Graph, vm.MuGraph]:
    """``X (1, K) @ reshape(W, (K, N))`` in one block (one step)."""
    k = rshape[0]
    g = vm.Graph()
    x = g.input("X", (1, k), vm.float16)
    w = g.input("W", wshape, vm.float16)
    g.output(g.matmul(x, g.reshape(w, rshape)))
    t = _inputs(g)
    b = BlockBuilder((1,), 1)
    xi = b.input(0, t["X"], (None,), None)
    wi = b.input(1, t["W"], (None,), None)
    b.output(b.matmul(xi, b.reshape(wi, rshape)), (0,))
    return g, _one_kernel(t, b)


def test_row_weight_reshape_took_a_regrouping_reshape_for_a_re_dim() -> None:
    """Finding (high): row_weight_reshape compared only the padded shapes, so W (10, 24) reshaped to (12, 20)
    (both padded to (16, 32)) was loaded as the dot's (K, N) operand unchanged: a Proved μGraph compiled to a
    kernel reading W's rows as the reshape's (max error 0.51 on outputs of at most 0.48). Now the true shapes
    must agree too; this reshape goes to the ordinary lowering, which refuses it with a GraphError."""
    g, mg = _reshaped_weights((10, 24), (12, 20))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    with pytest.raises(vm.GraphError, match="merges or splits dims"):
        generate(mg, tiles=TileOptions(dot_min_m=16))


def test_row_weight_reshape_still_loads_a_re_dim_as_the_dot_operand() -> None:
    import torch

    g, mg = _reshaped_weights((1, 24, 32), (24, 32))  # only a size-1 dim dropped: the load is the operand
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "tl.dot(" in src and "tl.reshape(v1" not in src
    rng = np.random.default_rng(1)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.3).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()}).double().numpy()
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max() + 1e-3
