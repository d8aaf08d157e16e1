"""Red-team attacks on the value-guarded log rules' soundness and on the exact sigmoid / tanh / silu meanings,
all of which held (kept as tests so that they keep holding).

* ``log(f * sigmoid(z)) -> log(f) + log(sigmoid(z))`` is right only where ``f > 0``; for factors ``f`` that the
  sign analysis could take for positive but are not (differences and negations of exps, negative scales,
  sums of products, square roots of squares, ``maximum``/``minimum``/``where`` with one positive operand,
  tanh/silu/erf/gelu of anything, reductions of anything, ...), ``vm.verify`` does not prove the split (the
  candidate is less defined than the source); for positive factors (controls) it does.
* wrong identities of the exact sigmoid, tanh = 2 sigmoid(2x) - 1 and silu = x sigmoid(x) are not proved.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import verimirage as vm

S = (2, 4)
Fn = Callable[..., object]

#: factors f(g, x, y, z, m) that are <= 0 somewhere (or undefined where a split would be defined)
NOT_POSITIVE: dict[str, Fn] = {
    "sub-of-exps": lambda g, x, y, z, m: g.sub(g.exp(x), g.exp(y)),
    "neg-of-exp": lambda g, x, y, z, m: g.neg(g.exp(x)),
    "negative-scale-of-exp": lambda g, x, y, z, m: g.scale(g.exp(x), -2.0),
    "sum-of-products": lambda g, x, y, z, m: g.add(g.mul(g.exp(x), y), g.mul(g.exp(y), g.exp(z))),
    "sqrt-of-square": lambda g, x, y, z, m: g.sqrt(g.square(x)),
    "sqrt-times-any": lambda g, x, y, z, m: g.mul(g.sqrt(g.exp(y)), x),
    "rsqrt-over-a-difference": lambda g, x, y, z, m: g.div(g.rsqrt(g.exp(y)), g.sub(x, y)),
    "maximum-of-non-positives": lambda g, x, y, z, m: g.maximum(x, g.neg(g.exp(y))),
    "minimum-one-positive": lambda g, x, y, z, m: g.minimum(g.exp(x), y),
    "where-one-positive": lambda g, x, y, z, m: g.where(m, g.exp(x), y),
    "square": lambda g, x, y, z, m: g.square(x),
    "abs": lambda g, x, y, z, m: g.abs(x),
    "relu": lambda g, x, y, z, m: g.relu(x),
    "exp-shifted-down": lambda g, x, y, z, m: g.shift(g.exp(x), -1.0),
    "any-shifted-up": lambda g, x, y, z, m: g.shift(x, 1.0),
    "tanh-of-any": lambda g, x, y, z, m: g.tanh(x),
    "silu-of-any": lambda g, x, y, z, m: g.silu(x),
    "erf-of-any": lambda g, x, y, z, m: g.erf(x),
    "gelu-of-any": lambda g, x, y, z, m: g.gelu(x),
    "sigmoid-minus-half": lambda g, x, y, z, m: g.shift(g.sigmoid(x), -0.5),
    "odd-power": lambda g, x, y, z, m: g.pow(x, 3.0),
    "reciprocal": lambda g, x, y, z, m: g.reciprocal(x),
    "mean-of-any": lambda g, x, y, z, m: g.mean(x, axis=1),
    "max-of-any": lambda g, x, y, z, m: g.max(x, axis=1),
    "square-of-exp-minus-one": lambda g, x, y, z, m: g.square(g.shift(g.exp(x), -1.0)),
    "clamp-from-zero": lambda g, x, y, z, m: g.clamp(x, 0.0, 1.0),
    "difference-of-softplus": lambda g, x, y, z, m: g.sub(g.softplus(x), g.softplus(y)),
    "sqrt-of-exp-times-negative": lambda g, x, y, z, m: g.mul(g.pow(g.exp(x), 0.5), g.neg(g.exp(y))),
}

#: positive factors: the split is right and proved
POSITIVE: dict[str, Fn] = {
    "sum-of-exps": lambda g, x, y, z, m: g.add(g.exp(x), g.exp(y)),
    "tanh-of-exp": lambda g, x, y, z, m: g.tanh(g.exp(x)),
    "mean-of-exp-times-rsqrt": lambda g, x, y, z, m: g.mul(g.mean(g.exp(x), axis=1), g.rsqrt(g.exp(y))),
}


def _prog(body: Fn) -> vm.Graph:
    g = vm.Graph()
    x, y, z = (g.input(n, S, vm.float32) for n in ("x", "y", "z"))
    m = g.input("m", S, vm.bool)
    g.output(g.add(body(g, x, y, z, m), g.scale(g.where(m, g.add(x, y), z), 0.0)))  # (every input read)
    return g


def _split_pair(f: Fn) -> tuple[vm.Graph, vm.Graph]:
    src = _prog(lambda g, x, y, z, m: g.log(g.mul(f(g, x, y, z, m), g.sigmoid(z))))
    cand = _prog(lambda g, x, y, z, m: g.add(g.log(f(g, x, y, z, m)), g.log(g.sigmoid(z))))
    return src, cand


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    k = 0.0 if seed == 0 else 1.0  # (seed 0: all zeros, where squares and their roots are not positive)
    return {"x": k * rng.standard_normal(S), "y": k * rng.standard_normal(S), "z": k * rng.standard_normal(S),
            "m": rng.random(S) < 0.5}


@pytest.mark.parametrize("name", sorted(NOT_POSITIVE))
def test_log_split_of_a_factor_not_positive_is_not_proved(name: str) -> None:
    f = NOT_POSITIVE[name]
    probe = _prog(lambda g, x, y, z, m: f(g, x, y, z, m))
    vals = np.concatenate([np.ravel(vm.evaluate(probe, _inputs(s))[0]) for s in range(8)])
    assert (~(vals > 0)).any(), "the attack needs a factor that is not positive everywhere"
    src, cand = _split_pair(f)
    v = vm.verify(src, cand)
    assert not v.proved, v.reason


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_log_split_of_a_positive_factor_is_proved(name: str) -> None:
    src, cand = _split_pair(POSITIVE[name])
    v = vm.verify(src, cand)
    assert v.proved, v.reason


def _x(body: Callable[[vm.Graph, object], object]) -> vm.Graph:
    g = vm.Graph()
    g.output(body(g, g.input("x", S, vm.float32)))
    return g


#: wrong identities of sigmoid, tanh and silu (each next to a right one: the comment)
WRONG: dict[str, tuple[Callable[..., object], Callable[..., object]]] = {
    # sigmoid(-x) = 1 - sigmoid(x)
    "sigmoid-is-one-minus-itself": (lambda g, x: g.sigmoid(x), lambda g, x: g.shift(g.neg(g.sigmoid(x)), 1.0)),
    # tanh(x) = 1 - 2 sigmoid(-2x)
    "tanh-is-one-minus-two-sigmoid-of-2x": (lambda g, x: g.tanh(x),
                                            lambda g, x: g.shift(g.scale(g.sigmoid(g.scale(x, 2.0)), -2.0), 1.0)),
    # tanh(-x) = -tanh(x)
    "tanh-is-even": (lambda g, x: g.tanh(g.neg(x)), lambda g, x: g.tanh(x)),
    # silu(x) - silu(-x) = x
    "silu-is-odd": (lambda g, x: g.silu(g.neg(x)), lambda g, x: g.neg(g.silu(x))),
    # silu(x) + silu(-x) = x tanh(x / 2)
    "silu-plus-silu-of-neg-is-x-tanh-x": (lambda g, x: g.add(g.silu(x), g.silu(g.neg(x))),
                                          lambda g, x: g.mul(x, g.tanh(x))),
    "sigmoid-of-2x-is-its-square": (lambda g, x: g.sigmoid(g.scale(x, 2.0)),
                                    lambda g, x: g.mul(g.sigmoid(x), g.sigmoid(x))),
    # sigmoid(x) = exp(x) / (1 + exp(x))
    "sigmoid-is-exp-over-two-plus-exp": (lambda g, x: g.sigmoid(x),
                                         lambda g, x: g.div(g.exp(x), g.shift(g.exp(x), 2.0))),
    "tanh-is-two-sigmoid-minus-one": (lambda g, x: g.tanh(x), lambda g, x: g.shift(g.scale(g.sigmoid(x), 2.0), -1.0)),
    "silu-is-sigmoid-of-x-squared": (lambda g, x: g.silu(x), lambda g, x: g.sigmoid(g.square(x))),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_sigmoid_tanh_silu_identity_is_not_proved(name: str) -> None:
    a, b = (_x(f) for f in WRONG[name])
    ins = {"x": np.random.default_rng(0).standard_normal(S)}
    assert not np.allclose(vm.evaluate(a, ins)[0], vm.evaluate(b, ins)[0])  # (the pair is wrong)
    v = vm.verify(a, b)
    assert not v.proved, v.reason
