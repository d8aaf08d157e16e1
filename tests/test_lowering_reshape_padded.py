"""A reshape that merges or splits dims whose register tiles are padded (backend/lowering.py ``_reshape``).

Finding (issue 20, corpus run of 2026-11-26): the lowering raised ``GraphError: reshape ... merges or splits dims
whose tiles are padded`` whenever a merged or split group was padded on either side, e.g. attention's
``(2, 4, 2, 8) -> (8, 16)`` feeding an output projection whose rows are padded to the ``tl.dot`` minimum, or a
backward's ``(2, 4, 24) -> (8, 24)`` read from a tile padded to ``(2, 64, 64)``. About 20 corpus partitions that
had verified candidates failed to compile and were split at their views. Power-of-two groups are now reshaped on
their logical sizes (cut, reshaped, grown back with zeros).
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
import torch

import verimirage as vm
from verimirage.backend.codegen import generate
from verimirage.backend.lowering import _reshape
from verimirage.backend.runtime import compile as vcompile
from verimirage.ir.errors import GraphError
from verimirage.ir.ops import TensorType
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all

# a numpy stand-in for the few tl functions the reshape lowering emits (same semantics as Triton's)
_TL = types.SimpleNamespace(
    reshape=lambda x, s: np.reshape(x, s),
    permute=lambda x, p: np.transpose(x, p),
    split=lambda x: (x[..., 0], x[..., 1]),
    join=lambda a, b: np.stack([a, b], axis=-1),
    where=np.where,
    broadcast_to=np.broadcast_to,
    arange=lambda a, b: np.arange(a, b),
    zeros_like=np.zeros_like,
)

CASES = [
    # (logical shape, new shape, operand tile, result tile)
    ((2, 4, 2, 8), (8, 16), (2, 4, 2, 8), (64, 16)),  # merged rows padded to the dot minimum
    ((2, 4, 16), (2, 4, 2, 8), (2, 64, 16), (2, 64, 64, 16)),  # split dims padded, a kept dim padded
    ((2, 4, 24), (8, 24), (2, 64, 64), (16, 64)),  # an operand dim of the merge padded (cut to its data)
    ((2, 4, 32), (8, 32), (2, 4, 64), (16, 64)),
    ((8, 16), (2, 4, 16), (64, 16), (2, 4, 16)),  # a split whose operand dim is padded
    ((2, 4, 16), (8, 16), (2, 4, 16), (8, 16)),  # unpadded: one tl.reshape
]


def _eval(expr: str, x: np.ndarray) -> np.ndarray:
    return np.asarray(eval(expr, {"tl": _TL, "x": x}))  # our own generated text


@pytest.mark.parametrize(("old", "new", "p_in", "p_out"), CASES)
def test_padded_reshape_moves_every_logical_element(old: tuple[int, ...], new: tuple[int, ...],
                                                     p_in: tuple[int, ...], p_out: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    tile = rng.standard_normal(p_in) * 1e6  # padding holds garbage: the lowering must not read it into data
    data = rng.standard_normal(old)
    tile[tuple(slice(0, n) for n in old)] = data
    expr = _reshape(["x"], {"_padded": (p_in, p_out)}, [TensorType(old, vm.float32)], [TensorType(new, vm.float32)])
    out = _eval(expr, tile)
    assert out.shape == p_out
    np.testing.assert_array_equal(out[tuple(slice(0, n) for n in new)], data.reshape(new))
    assert expr.count("x") == 1  # the operand is read once: no expression blow-up


def test_a_padded_merge_of_sizes_that_are_not_powers_of_two_is_a_clear_error() -> None:
    with pytest.raises(GraphError, match="not all powers of two"):
        _reshape(["x"], {"_padded": ((4, 8), (32,))}, [TensorType((3, 8), vm.float32)],
                 [TensorType((24,), vm.float32)])


def _fused(g: vm.Graph) -> Any:
    return next(lo.mugraph for lo in lower_all(g, cuts=False, rank=pricing.cost)[0] if lo.mugraph.num_kernels == 1)


def test_attention_heads_merged_into_padded_dot_rows_compile_and_match() -> None:
    """The corpus's shape: ``exp(X)`` of ``(2, 4, 2, 8)`` merged to ``(8, 16)`` rows of a ``tl.dot`` (padded)."""
    g = vm.Graph()
    x = g.input("X", (2, 4, 2, 8), vm.float32)
    w = g.input("W", (16, 16), vm.float32)
    g.output(g.matmul(g.reshape(g.exp(x), (8, 16)), w))
    fused = _fused(g)
    generate(fused)  # raised GraphError before
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 4, 2, 8)), rng.standard_normal((16, 16))
    out = vcompile(fused)(torch.tensor(a, dtype=torch.float32), torch.tensor(b, dtype=torch.float32))
    out = out[0] if isinstance(out, (tuple, list)) else out
    np.testing.assert_allclose(out.numpy(), np.exp(a).reshape(8, 16) @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # an sm_90 compile in a subprocess: minutes on a loaded 2-core machine
def test_padded_reshape_kernels_compile_for_sm90(tmp_path: Any) -> None:
    from verimirage.backend.gpucompile import compile_modules
    from verimirage.backend.runtime import write_module

    g = vm.Graph()
    a = g.input("A", (2, 4, 24), vm.float16)
    b = g.input("B", (8, 24), vm.float16)
    g.output(g.matmul(g.permute(g.reshape(g.exp(a), (8, 24)), (1, 0)), b))  # an operand dim cut, a dim grown
    ms = generate(_fused(g))
    rep = compile_modules([write_module(ms, tmp_path)])
    assert all(r["ok"] for kernels in rep.values() for r in kernels.values()), rep


def test_a_concat_by_join_whose_result_is_padded_further_is_grown_with_zeros() -> None:
    """Finding (corpus, rotary_attention training): rotate-half's ``concat(-x2, x1)`` of two unpadded ``(.., 4)``
    pieces by ``tl.join`` made an ``(.., 8)`` tile where the result's dim class was padded to 16 (the head dim is
    a ``tl.dot`` operand's): the kernel failed in the interpreter ("incompatible dimensions at index 3: 8 and
    16") and the backward partition was split at its views, leaving the attention backward behind."""
    from verimirage.backend.lowering import _concat

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 4, 4))
    t = TensorType((2, 4, 4), vm.float32)
    expr = _concat(["a", "b"], {"axis": 2, "_padded": ((2, 4, 4), (2, 4, 4), (2, 4, 16))}, [t, t],
                   [TensorType((2, 4, 8), vm.float32)])
    out = np.asarray(eval(expr, {"tl": _TL, "a": a, "b": b}))
    assert out.shape == (2, 4, 16)
    np.testing.assert_array_equal(out[..., :8], np.concatenate([a, b], axis=2))
    np.testing.assert_array_equal(out[..., 8:], 0.0)
