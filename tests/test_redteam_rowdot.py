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
    must agree too; this reshape goes to the ordinary lowering. (That refused it with a GraphError until 9c19b08;
    a padded tile's regrouping reshape is now one ``tl.gather`` of the flattened tile, so the kernel must compute the
    reshape's values: checked against float64.)"""
    import torch

    g, mg = _reshaped_weights((10, 24), (12, 20))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    src = generate(mg, tiles=TileOptions(dot_min_m=16)).source
    assert "tl.gather(" in src  # the regrouping, not W's rows loaded as the operand
    rng = np.random.default_rng(1)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.3).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()}).double().numpy()
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max() + 1e-3


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


def _decode_attention(h: int, hb: int, d: int, kv: int, kvt: int, dt: vm.DType) -> tuple[vm.Graph, vm.MuGraph]:
    """Stable decode attention (one query row a head), ``hb`` heads a block, an online softmax over ``kv / kvt``
    key tiles: both products are row products (batched ones when ``hb > 1``), the accumulators rescaled."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, 1, d), dt), g.input("K", (h, d, kv), dt), g.input("V", (h, kv, d), dt)
    s = g.matmul(q, k)
    p = g.exp(g.sub(s, g.max(s, 2)))
    g.output(g.div(g.matmul(p, v), g.sum(p, 2)))
    t = _inputs(g)
    b = BlockBuilder((h // hb,), kv // kvt)
    qi, ki, vi = b.input(0, t["Q"], (0,), None), b.input(1, t["K"], (0,), 2), b.input(2, t["V"], (0,), 1)
    si = b.matmul(qi, ki)
    m = b.running_max(b.max(si, axis=2))
    pi = b.exp(b.sub(si, m))
    b.output(b.div(b.rescaled_sum(b.matmul(pi, vi), m), b.rescaled_sum(b.sum(pi, axis=2), m)), (0,))
    return g, _one_kernel(t, b)


@pytest.mark.parametrize("h,hb,d,kv,kvt", [(6, 3, 24, 60, 20), (4, 1, 16, 64, 32)])
def test_batched_row_dots_in_an_online_softmax_held(h: int, hb: int, d: int, kv: int, kvt: int) -> None:
    """Held (the session's run: 24 such kernels and 26 P @ V / chunked variants, fp16 and bf16, 3 heads a block,
    odd tiles, an infinite weight): Proved, and the kernel matches float64."""
    import torch

    g, mg = _decode_attention(h, hb, d, kv, kvt, vm.float16)
    assert isinstance(vm.verify(g, mg), vm.Proved)
    assert generate(mg, tiles=TileOptions(dot_min_m=16)).source.count("tl.dot(") == 2
    rng = np.random.default_rng(2)
    ins = {t.name: (rng.standard_normal(t.shape) * 0.5).astype(np.float16).astype(np.float64) for t in g.inputs}
    (ref,) = vm.evaluate(g, ins)
    got = vm.compile(mg)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in ins.items()}).double().numpy()
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max() + 1e-3
