"""The finite-field test computes parts on demand: what it skips must never matter.

* a difference that only a q-part can show (it reaches an output through exp) is found through every
  kind of op, including q-parts made from p-parts (the oracles, max) and V's q-part in attention;
* lazy evaluation gives the values an eager one does (every part of every node computed), on every
  corpus program, so the deferred row scaling and the float64/int64 twins change nothing;
* the folded matmul equals a naive exact one for every broadcast pattern;
* the skipping is real: the target of gqa never makes V's q-part nor the p-part of Q K^T.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks.designs import expert
from verimirage.smt import ff as FF
from verimirage.smt.ff import field as FFfield
from verimirage.smt.ff import meanings as FFmean
from verimirage.smt.ff import products as FFprod
from verimirage.smt.ff import trials as FFtrials

sys.path.insert(0, str(Path(__file__).parent / "cases"))
from corpus import CASES

F16 = vm.float16


def _graph(shapes: dict, body) -> vm.Graph:
    g = vm.Graph()
    ins = [g.input(n, s, F16) for n, s in shapes.items()]
    r = body(g, *ins)
    g.output(*(r if isinstance(r, tuple) else (r,)))
    return g


XY = {"X": (4, 8), "Y": (4, 8)}
XO = {"X": (4, 8)}
XOS = {"X": (8, 8)}
XYS = {"X": (8, 8), "Y": (8, 8)}
QKV = {"Q": (2, 8, 16), "K": (2, 16, 32), "V": (2, 32, 16)}
QK = {"Q": (2, 8, 16), "K": (2, 16, 32)}


def _softmax(g, a, axis=2):
    e = g.exp(a)
    return g.div(e, g.sum(e, axis=axis))


# (name, shapes, right, wrong): exp reads a value whose only difference between ``right`` and ``wrong``
# comes through the named op, so only its q-part can show it
Q_REACHES_EXP = [
    ("add", XY, lambda g, x, y: g.exp(g.add(x, y)), lambda g, x, y: g.exp(g.add(x, g.scale(y, 2.0)))),
    ("sub", XY, lambda g, x, y: g.exp(g.sub(x, y)), lambda g, x, y: g.exp(g.sub(y, x))),
    ("mul", XY, lambda g, x, y: g.exp(g.mul(x, y)), lambda g, x, y: g.exp(g.mul(x, g.shift(y, 1.0)))),
    ("div", XY, lambda g, x, y: g.exp(g.div(x, y)), lambda g, x, y: g.exp(g.div(y, x))),
    ("neg", XO, lambda g, x: g.exp(g.neg(x)), lambda g, x: g.exp(x)),
    ("square", XY, lambda g, x, y: g.exp(g.square(g.add(x, y))), lambda g, x, y: g.exp(g.mul(x, y))),
    ("scale", XO, lambda g, x: g.exp(g.scale(x, 3.0)), lambda g, x: g.exp(g.scale(x, 2.0))),
    ("shift", XO, lambda g, x: g.exp(g.shift(x, 3.0)), lambda g, x: g.exp(g.shift(x, 2.0))),
    ("matmul", XYS, lambda g, x, y: g.exp(g.matmul(x, y)), lambda g, x, y: g.exp(g.matmul(y, x))),
    ("sum", XO, lambda g, x: g.exp(g.sum(x, 1)), lambda g, x: g.exp(g.mean(x, 1))),
    ("mean", XY, lambda g, x, y: g.exp(g.mean(g.add(x, y), 0)), lambda g, x, y: g.exp(g.mean(g.sub(x, y), 0))),
    ("max", XY, lambda g, x, y: g.exp(g.sub(x, g.max(y, 1))),
     lambda g, x, y: g.exp(g.sub(x, g.max(g.scale(y, 2.0), 1)))),
    ("maximum", XY, lambda g, x, y: g.exp(g.maximum(x, y)),
     lambda g, x, y: g.exp(g.maximum(x, g.scale(y, 2.0)))),
    ("silu", XY, lambda g, x, y: g.exp(g.add(g.silu(x), y)), lambda g, x, y: g.exp(g.add(g.silu(y), x))),
    ("gelu", XO, lambda g, x: g.exp(g.gelu(x)), lambda g, x: g.exp(g.gelu(g.scale(x, 2.0)))),
    ("relu", XO, lambda g, x: g.exp(g.relu(x)), lambda g, x: g.exp(g.relu(g.neg(x)))),
    ("sqrt", XO, lambda g, x: g.exp(g.sqrt(x)), lambda g, x: g.exp(g.rsqrt(x))),
    ("rsqrt", XO, lambda g, x: g.exp(g.rsqrt(x)), lambda g, x: g.exp(g.rsqrt(g.scale(x, 2.0)))),
    ("rms_norm", XO, lambda g, x: g.exp(g.rms_norm(x, axis=1)), lambda g, x: g.exp(g.rms_norm(x, axis=0))),
    ("concat", XY, lambda g, x, y: g.exp(g.concat([x, y], 1)), lambda g, x, y: g.exp(g.concat([y, x], 1))),
    ("transpose", XOS, lambda g, x: g.exp(g.transpose(x, 0, 1)), lambda g, x: g.exp(x)),
    # V's q-part reaches an exp (in plain attention it is dead)
    ("attention-v", QKV, lambda g, q, k, v: g.matmul(_softmax(g, g.matmul(q, k)), g.exp(v)),
     lambda g, q, k, v: g.matmul(_softmax(g, g.matmul(q, k)), g.exp(g.scale(v, 2.0)))),
    # the p-part of Q K^T reaches the output as well as its q-part (in plain attention the p-part is dead)
    ("attention-scores", QK, lambda g, q, k: g.mul(g.exp(g.matmul(q, k)), g.matmul(q, k)),
     lambda g, q, k: g.mul(g.exp(g.matmul(q, k)), g.scale(g.matmul(q, k), 2.0))),
]


@pytest.mark.parametrize("case", Q_REACHES_EXP, ids=[c[0] for c in Q_REACHES_EXP])
def test_a_difference_only_a_q_part_shows_is_found(case) -> None:
    name, shapes, right, wrong = case
    a, b = _graph(shapes, right), _graph(shapes, wrong)
    assert FF.ff_test(a, a).outcome == "proved"
    r = FF.ff_test(a, b)
    assert r.outcome == "refuted", (name, r.reason)
    v = vm.verify(a, b)
    assert isinstance(v, vm.Refuted) and "finite-field" in v.caught_by()


def test_q_parts_through_loops_and_online_softmax() -> None:
    """A μGraph whose rescaled_sum reads a running max made from the scores: dropping the rescale is
    found by the finite field (the corpus's dropped-rescale case, asked of ff_test directly)."""
    c = {c.name: c for c in CASES}
    assert FF.ff_test(c["online-softmax-stable"].a(), c["online-softmax-stable"].b()).outcome == "proved"
    assert FF.ff_test(c["dropped-rescale"].a(), c["dropped-rescale"].b()).outcome == "refuted"


class _Eager(FF.FFDomain):
    """Every part of every node computed as soon as the node is built (no laziness at all)."""

    def apply(self, op, args, attrs, in_types, out_type):
        r = super().apply(op, args, attrs, in_types, out_type)
        r.p.get()
        if r.q is not None:
            r.q.get()
        return r


def _eager(g: vm.Graph, vals: dict, fld: FF.Field) -> list[np.ndarray]:
    from verimirage.ir.interpret import run

    return [FF.stacked(o) for o in run(g, {k: FF.fv_of(v) for k, v in vals.items()}, _Eager(fld))]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_lazy_values_equal_eager_values(case) -> None:
    for prog in (case.a(), case.b()):
        fld = FF.Field.from_seed(99)
        vals = FF.trial_inputs(prog, fld, 5)
        lazy = FF.run_ff(prog, vals, FF.Field.from_seed(99))
        eager = _eager(prog, vals, FF.Field.from_seed(99))
        for x, y in zip(lazy, eager, strict=True):
            assert np.array_equal(x[0], y[0])
            both = (x[1] >= 0) & (y[1] >= 0)
            assert np.array_equal(x[1][both], y[1][both])


def _naive(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    return np.matmul(a.astype(object), b.astype(object)) % m


@pytest.mark.parametrize("sa,sb", [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((2, 1, 3, 4), (1, 5, 4, 2)),
    ((2, 3, 1, 3, 4), (2, 1, 4, 4, 6)),
    ((1, 1, 3, 4), (2, 3, 4, 5)),
    ((4, 1, 2, 3, 4), (1, 1, 1, 4, 2)),
    ((2, 3, 4), (2, 4, 5)),
])
def test_folded_matmul_is_exact(sa, sb) -> None:
    f = FF.Field.from_seed(3)
    rng = np.random.default_rng(0)
    a = rng.integers(0, f.p, sa)
    b = rng.integers(0, f.p, sb)
    got = FFprod._matmul_mod(a, b, f.p)
    want = _naive(a, b, f.p)
    assert got.shape == want.shape and got.tolist() == want.tolist()
    got_f = FFprod._matmul_mod(a.astype(np.float64), np.swapaxes(np.swapaxes(b, -1, -2).copy(), -1, -2), f.p)
    assert got_f.tolist() == want.tolist()


def test_row_scaled_matmul_with_zero_divisors() -> None:
    """matmul(div(E, s), V) is computed as (E @ V) / s: rows with s = 0 give 0 either way."""
    f = FF.Field.from_seed(4)
    rng = np.random.default_rng(1)
    sh = {"E": (2, 3, 5), "S": (2, 3, 1), "V": (2, 5, 4)}
    g = _graph(sh, lambda g, e, s, v: g.matmul(g.div(e, s), v))
    e = rng.integers(0, f.p, (2, 3, 5))
    s = rng.integers(0, f.p, (2, 3, 1))
    s[0, 1, 0] = 0
    v = rng.integers(0, f.p, (2, 5, 4))
    (out,) = FF.run_ff(g, {"E": e[None], "S": s[None], "V": v[None]}, f)
    inv = np.array([[[pow(int(x), f.p - 2, f.p)] for x in row[:, 0]] for row in s], dtype=object)
    want = np.matmul((e.astype(object) * inv) % f.p, v.astype(object)) % f.p
    assert out[0].tolist() == want.tolist()
    assert (out[0][0, 1] == 0).all()


def test_dead_parts_are_not_computed(monkeypatch) -> None:
    made: list[tuple[int, int]] = []
    mods: list[int] = []
    orig_input, orig_mm = FFtrials._input_part, FFprod._matmul_mod

    def input_part(shape, seed, index, part, m):
        p = orig_input(shape, seed, index, part, m)
        fn = p._fn

        def gen():
            made.append((index, part))
            return fn()

        p._fn = gen
        return p

    def matmul_mod(a, b, m, epi=None):
        mods.append(m)
        return orig_mm(a, b, m, epi=epi)

    monkeypatch.setattr(FFtrials, "_input_part", input_part)
    monkeypatch.setattr(FFmean, "_matmul_mod", matmul_mod)
    g = vm.benchmarks.get("gqa", batch=1, small=True)
    fld = FF.Field.from_seed(11)
    ref = FF.FFReference(g, project=False)
    ref.outputs(11, ref.inputs(11, fld))
    # inputs in name order: K, Q, V; part 0 = p, 1 = q
    assert sorted(made) == [(0, 1), (1, 1), (2, 0)]  # K and Q: q-parts only; V: p-part only
    assert sorted(mods) == sorted([fld.q, fld.p])  # Q K^T mod q only, P V mod p only
    # compared through a projection, P V is never formed: P (V r) is a matrix-vector product
    made.clear()
    mods.clear()
    ref = FF.FFReference(g)
    ref.outputs(11, ref.inputs(11, fld))
    assert sorted(made) == [(0, 1), (1, 1), (2, 0)]
    assert mods == [fld.q]
    made.clear()
    r = FF.ff_test(g, expert("gqa", g, rows=16, kv_tile=32, splits=2), seeds=[11])
    assert r.outcome == "proved"
    assert (2, 1) not in made and (0, 0) not in made and (1, 0) not in made


def test_exp_gather_matches_take_in_every_layout() -> None:
    from verimirage.smt.ff.field import _exp_gather, _exp_table, _exp_table_f32

    fld = FF.Field.from_seed(7)
    t64, t32 = _exp_table(fld.p, fld.q, fld.g), _exp_table_f32(fld.p, fld.q, fld.g)
    assert np.array_equal(t32.astype(np.int64), t64)  # float32 holds every entry exactly (< 2**21)
    rng = np.random.default_rng(3)
    big = rng.integers(0, fld.q, size=(6, 70, 130))  # > one chunk
    for idx in (big, big.transpose(2, 0, 1), big[:, ::3, 5:], big[:1, :2, :3], np.zeros((0, 4), np.int64)):
        got = _exp_gather(t32, idx)
        assert got.dtype == np.float64 and got.shape == idx.shape
        assert np.array_equal(got, t64[idx].astype(np.float64))


def test_blocked_matmul_and_fused_exp_are_exact() -> None:
    """Products of >= 2**18 elements are reduced in cache-sized row blocks, and exp of a product's q-part
    looks its blocks up directly: both against int64 numpy (exact here) and the table gather."""
    f = FF.Field.from_seed(5)
    rng = np.random.default_rng(2)
    a = rng.integers(0, f.q, (2, 300, 24))
    b = rng.integers(0, f.q, (2, 24, 1000))
    assert FFprod._BLOCK_ELEMS <= 2 * 300 * 1000
    want = (a @ b) % f.q
    got = FFprod._matmul_mod(a.astype(np.float64), b.astype(np.float64), f.q)
    assert got.dtype == np.int64 and np.array_equal(got, want)
    # through the ff domain: exp(matmul) (fused) == the table at the product's residues
    tok = FFfield._FIELD.set(f)
    try:
        fa = FF.FV(a.shape, FF.Part.of(a), FF.Part.of(a))
        fb = FF.FV(b.shape, FF.Part.of(b), FF.Part.of(b))
        s = FFmean._ff_matmul([fa, fb], {}, None, None)
        e = FFmean._exp(s)
        assert not s.q.ready  # the q-part is not formed by the fused exp
        got_e = FF.ints(e.p)
        assert not s.q.ready
    finally:
        FFfield._FIELD.reset(tok)
    assert np.array_equal(got_e, FFfield._exp_table(f.p, f.q, f.g)[want])


@pytest.mark.parametrize("ax", [0, 1, 2, -1, -3])
def test_max_q_part_is_the_lexicographic_max(ax) -> None:
    # the q-part of the max in the order (p-residue, q-part), -1 (meaningless) smallest: against the key
    # formula it replaced, on residues drawn from a tiny range so that ties at the max are everywhere
    rng = np.random.default_rng(ax % 3)
    vp = rng.integers(0, 4, (5, 6, 7))
    vq = rng.integers(-1, 9, (5, 6, 7))
    key = vp * 100 + (vq + 1)
    want = np.take_along_axis(vq, np.expand_dims(np.argmax(key, axis=ax), ax), ax)
    got = FFmean._max_q(vp, vq, ax)
    assert np.array_equal(got, want)
    assert (np.count_nonzero(vp == vp.max(axis=ax, keepdims=True), axis=ax) > 1).any()  # ties were tested
    # a broadcast p-part (constant along the axis: every element ties)
    vp1 = vp[:1] if ax % 3 != 0 else vp[:, :1]
    bp = np.broadcast_to(vp1, vp.shape)
    want = np.take_along_axis(vq, np.expand_dims(np.argmax(bp * 100 + (vq + 1), axis=ax), ax), ax)
    assert np.array_equal(FFmean._max_q(vp1, vq, ax), want)
