"""Red team (twelfth session): findings against what the eleventh session landed and its open lows, each with the
test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held12.py``."""

from __future__ import annotations

import numpy as np
import pytest

from verimirage.ir.reference import gelu_tanh, sigmoid, silu


def _mp_exact(f: str, xs: list[float]) -> np.ndarray:
    mp = pytest.importorskip("mpmath")
    with mp.workdps(400):  # (1 + tanh z at z ~ -400 needs ~350 digits not to cancel in mpmath too)
        c = mp.sqrt(2 / mp.pi)
        out = []
        for x in map(mp.mpf, xs):
            sig = 1 / (1 + mp.exp(-x))
            out.append(float({"gelu": 0.5 * x * (1 + mp.tanh(c * (x + mp.mpf("0.044715") * x**3))),
                              "sigmoid": sig, "silu": x * sig}[f]))
    return np.array(out)


@pytest.mark.parametrize("f", ["gelu", "sigmoid", "silu"])
def test_gelu_tanh_reference_cancelled_below_minus_seven(f: str) -> None:
    """Finding (open low of the eleventh session): the float64 GELU-tanh reference ``0.5 x (1 + tanh z)`` cancels
    for x < -7 (at -8: 100% off; at -9.5 it is 0 for -1.8e-26), and the sigmoid reference ``(1 + tanh(x / 2)) / 2``
    likewise below x ~ -30 (relative error 1e-3 at -30, 1.0 at -37). Both are now ``x sigmoid(2 z)`` (the kernel's
    own form, backend/lowering.py) and ``e^min(x, 0) / (1 + e^-|x|)``: within a few ulp everywhere."""
    xs = [-600.0, -80.0, -37.0, -30.0, -20.0, -9.5, -8.0, -7.0, -3.0, -1.0, -1e-3, -1e-12, 1e-12, 0.5, 2.0, 8.0, 40.0]
    want = _mp_exact(f, xs)
    got = {"gelu": gelu_tanh, "sigmoid": sigmoid, "silu": silu}[f](np.array(xs))
    tiny = np.abs(want) < 1e-300  # (underflows to 0 in float64: only the sign and the zero are asked for)
    np.testing.assert_array_equal(got[tiny], 0.0 * want[tiny])
    np.testing.assert_allclose(got[~tiny], want[~tiny], rtol=1e-13, atol=0)
    specials = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0])
    with np.errstate(all="ignore"):
        assert np.array_equal(sigmoid(specials), [0.0, 1.0, np.nan, 0.5, 0.5], equal_nan=True)
        g = gelu_tanh(specials)
    assert np.isnan(g[0]) and g[1] == np.inf and np.isnan(g[2]) and g[3] == 0.0 and np.signbit(g[4])
