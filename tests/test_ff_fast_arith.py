"""The fast finite-field engine's shortcuts (issue 22 item 5) give exactly the residues of the plain computation.

* inverses of large arrays through a table (``arith._inv_table``) instead of ``x**(m-2)``;
* chains of scalings and shifts composed into one affine map (``meanings._affine``);
* ``where(m, a, b)`` as ``m * (a - b) + b`` in one pass (``meanings._ff_where``).

Each is compared with the plain formula and with the reference evaluator (:mod:`verimirage.smt.ffref`), p- and
q-parts, every element, on programs that go through them (softcap, sigmoid, silu, masks, marked q-parts).
"""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.smt import ff as FF
from verimirage.smt import ffref as R
from verimirage.smt.ff import arith as A
from verimirage.smt.ff import safe_primes

SEEDS = (11, 2**40 + 3, 7)


def _fermat(x: np.ndarray, m: int) -> np.ndarray:
    return np.array([pow(int(v) % m, m - 2, m) for v in x.ravel()], dtype=np.int64).reshape(x.shape)


@pytest.mark.parametrize("which", [0, -1])
def test_inverse_table_is_the_modular_inverse(which: int) -> None:
    p = int(safe_primes()[which])
    for m in (p, (p - 1) // 2):  # a field's p and q
        t = A._inv_table(m)
        assert t.shape == (m,) and t[0] == 0 and not t.flags.writeable
        rng = np.random.default_rng(m)
        x = rng.integers(-3 * m, 3 * m, size=A.INV_TABLE_MIN + 17)
        x[::97] = 0
        x[1::89] = m  # a multiple of m: inverse 0
        x[2::83] = -1
        got = A._inv(x, m)
        assert got.dtype == np.int64
        sample = np.arange(0, x.size, 37)
        assert np.array_equal(got[sample], _fermat(x[sample], m))
        nz = x % m != 0
        assert np.array_equal(got[nz] * (x[nz] % m) % m, np.ones(int(nz.sum()), dtype=np.int64))
        assert not got[~nz].any()


def test_inverse_table_refuses_a_composite_modulus() -> None:
    with pytest.raises((RuntimeError, ValueError)):
        A._inv_table(1_000_001)  # 101 * 9901


def _same_values(prog: vm.Graph, seed: int) -> None:
    """Every output, both parts, equal in the fast engine and the reference evaluator (as tests/test_ffref.py)."""
    f, fast = R.field_of(seed), FF.Field.from_seed(seed)
    ins = R.trial_inputs(prog, f, seed)
    outs, viol = R.evaluate(prog, ins, f)
    fouts = FF.run_ff(prog, FF.trial_inputs(prog, fast, seed), fast)
    for k, (x, y) in enumerate(zip(outs, fouts, strict=True)):
        assert np.array_equal(x[0], y[0]), f"output {k}: p-parts differ"
        assert np.array_equal(x[1], y[1]), f"output {k}: q-parts differ"
    assert (viol > 0) == (fast.q_violations > 0)


def _chains() -> vm.Graph:
    """Affine chains (also read half-way), masks, softcap, sigmoid, silu, division and marked q-parts."""
    g = vm.Graph()
    x = g.input("x", (4, 64), vm.float32)
    y = g.input("y", (4, 64), vm.float32)
    m = g.input("m", (4, 64), vm.bool)
    row = g.input("row", (1, 64), vm.bool)  # a mask broadcast over the rows
    s = g.scale(x, 0.02)
    mid = g.neg(g.scale(s, 2.0))  # read again below: computed once and composed into its readers
    cap = g.scale(g.tanh(s), 50.0)
    masked = g.where(m, cap, g.shift(g.scale(cap, 0.0), -30000.0))
    marked = g.maximum(g.exp(x), y)  # q-part meaningless (-1) where exp's side wins
    outs = [
        masked,
        g.exp(g.sub(masked, g.max(masked, axis=1))),
        g.shift(g.scale(g.shift(mid, 1.0), -3.0), 0.5),
        g.mul(mid, y),
        g.shift(g.scale(g.neg(marked), 3.0), 1.0),
        g.apply("sigmoid", [g.scale(y, 0.5)]),
        g.apply("silu", [g.shift(x, 2.0)]),
        g.div(g.shift(y, 1.0), g.shift(g.scale(x, 2.0), 3.0)),
        g.reciprocal(g.scale(y, -1.0)),
        g.where(m, marked, g.scale(y, 2.0)),  # where: one pass, -1 where an operand's q-part is
        g.where(row, g.sum(x, 1), y),
        g.where(row, g.exp(x), y),  # no q-part
        g.shift(g.scale(marked, 0.0), 5.0),  # a constant, -1 where the q-part is meaningless
    ]
    g.output(*outs)
    return g


@pytest.mark.parametrize("table", [False, True])
def test_affine_chains_and_inverses_match_the_reference(table: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(A, "INV_TABLE_MIN", 1 if table else 1 << 60)
    g = _chains()
    for s in SEEDS:
        _same_values(g, s)


def test_an_affine_chain_is_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """``shift(scale(neg(scale(x))))``: one affine map of ``x`` is computed, not four."""
    g = vm.Graph()
    x = g.input("x", (8, 8), vm.float32)
    g.output(g.shift(g.scale(g.neg(g.scale(x, 0.5)), 3.0), -2.0))
    calls: list[int] = []
    real = A._modi

    def counting(v: np.ndarray, mod: int) -> np.ndarray:
        calls.append(v.size)
        return real(v, mod)

    from verimirage.smt.ff import meanings

    monkeypatch.setattr(meanings, "_modi", counting)
    fld = FF.Field.from_seed(SEEDS[0])
    outs = FF.run_ff(g, FF.trial_inputs(g, fld, SEEDS[0]), fld)
    assert len(calls) == 2  # the p-part and the q-part, each one map of x
    ref, _ = R.evaluate(g, R.trial_inputs(g, R.field_of(SEEDS[0]), SEEDS[0]), R.field_of(SEEDS[0]))
    assert np.array_equal(outs[0], ref[0])
