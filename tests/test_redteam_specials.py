"""Red team (tenth session): special values through the generated kernels (interpreter) against the float64
reference (``vm.evaluate``, numpy's IEEE ``power``), which ATen agrees with."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm

_XS = [-2.0, -1.0, -0.5, -0.0, 0.0, 1.5, -np.inf, np.inf, np.nan, 1.0, -1.001, -3e-20, 7.0, -7.0, 0.999, 3e-20]


def _pow_kernel_vs_reference(c: float) -> tuple[np.ndarray, np.ndarray]:
    import torch

    g = vm.Graph()
    g.output(g.pow(g.input("X", (1, len(_XS)), vm.float32), c))
    xs = np.array([_XS])
    ref = vm.evaluate(g, {"X": xs})[0].astype(np.float32)
    got = vm.compile(g)(torch.tensor(xs, dtype=torch.float32)).numpy()
    return got, ref


def _same(got: np.ndarray, ref: np.ndarray) -> bool:
    return bool(np.allclose(got, ref, rtol=1e-4, atol=0, equal_nan=True)
                and np.array_equal(np.signbit(got[~np.isnan(got)]), np.signbit(ref[~np.isnan(ref)])))


@pytest.mark.parametrize("c", [10.0, 9.0, -9.0, 16.0])
def test_pow_with_an_integer_exponent_above_8_was_nan_at_negative_inputs(c: float) -> None:
    """Finding (medium): pow with an integer exponent of magnitude > 8 was emitted as exp(c log x), NaN at every
    negative x (x ** 10 at -2: NaN, not 1024; x ** 9 at -2: NaN, not -512). Now |x| ** c with x's sign for odd c."""
    got, ref = _pow_kernel_vs_reference(c)
    assert _same(got, ref), (got, ref)


@pytest.mark.parametrize("c", [1.5, -1.5, 2.5])
def test_pow_at_negative_infinity_was_nan(c: float) -> None:
    """Known low (ninth session): x ** 1.5 at -inf gave NaN (log(-inf)); IEEE pow, numpy and ATen give +inf
    (c > 0) or 0 (c < 0). Negative finite x stay NaN, as there."""
    got, ref = _pow_kernel_vs_reference(c)
    assert _same(got, ref), (got, ref)
