"""The laws the abstract-expression normaliser uses, each with a check on concrete random values.

Every normalising step of :mod:`verimirage.smt.expr` records one of these
names; the tests run :func:`check_law` for each on random float64 values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Checker = Callable[[np.random.Generator], bool]


def _close(a: Any, b: Any) -> bool:
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-9))


def _divmod(r: np.random.Generator) -> bool:
    t = int(r.integers(1, 9))
    e = r.integers(0, 1000, size=50)
    return bool(np.all((e // t) * t + e % t == e))


def _nested_div(r: np.random.Generator) -> bool:
    f, m = int(r.integers(2, 9)), int(r.integers(1, 9))
    a = r.integers(0, 1000, size=50)
    b = r.integers(0, f, size=50)
    x = f * a + b
    return bool(np.all(x // (f * m) == a // m) and np.all(x % (f * m) == f * (a % m) + b))


def _mod_div(r: np.random.Generator) -> bool:
    n, q = int(r.integers(1, 9)), int(r.integers(1, 9))
    k = n * q
    e = r.integers(-1000, 1000, size=50)
    return bool(np.all((e % k) // n == (e // n) % q) and np.all((e % k) % n == e % n))


def _mod_nest(r: np.random.Generator) -> bool:
    n, m = int(r.integers(1, 9)), int(r.integers(1, 9))
    e, k = r.integers(-1000, 1000, size=50), r.integers(-50, 50, size=50)
    return bool(np.all(n * ((e // n + k) % m) + e % n == (e + n * k) % (n * m)))


def _sum_shift(r: np.random.Generator) -> bool:
    f = r.standard_normal(40)
    c, n = 7, 20
    return _close(sum(f[v + c] for v in range(n)), sum(f[k] for k in range(c, c + n)))


def _split_merge(r: np.random.Generator) -> bool:
    f = r.standard_normal(30)
    return _close(f[0:12].sum() + f[12:30].sum(), f[0:30].sum())


def _block_merge(r: np.random.Generator) -> bool:
    f = r.standard_normal(40)
    a, s, n = 3, 6, 5
    return _close(sum(sum(f[k] for k in range(a + s * v, a + s * v + s)) for v in range(n)), f[a : a + s * n].sum())


def _fold(r: np.random.Generator) -> bool:
    f = r.standard_normal((12, 5))
    a, b = 3, 9
    unrolled = 0.0
    for k in range(a, b):  # f(a) + f(a+1) + ... + f(b-1), one term at a time
        unrolled += f[k, 2] * f[k].sum()
    return _close(unrolled, float((f[a:b, 2] * f[a:b].sum(axis=1)).sum()))  # the sum over [a, b), vectorised


def _max_merge(r: np.random.Generator) -> bool:
    f = r.standard_normal(30)
    return _close(max(f[0:12].max(), f[8:30].max()), f[0:30].max())


def _max_flatten(r: np.random.Generator) -> bool:
    a, b, c = r.standard_normal(3)
    return _close(max(max(a, b), c), max(a, max(c, b))) and _close(max(a, a), a)


def _interchange(r: np.random.Generator) -> bool:
    f = r.standard_normal((5, 7))
    a = r.standard_normal(5)
    outer_i = sum(a[i] * sum(f[i, j] for j in range(7)) for i in range(5))
    outer_j = sum(sum(a[i] * f[i, j] for i in range(5)) for j in range(7))
    return _close(outer_i, outer_j)


def _log_mul(r: np.random.Generator) -> bool:
    a, y, e, p = r.uniform(-3, 3), r.uniform(-3, 3), float(r.integers(-3, 4)), r.uniform(0.1, 5)
    return _close(np.log(np.abs(a**e * y)), e * np.log(np.abs(a)) + np.log(np.abs(y))) and _close(
        np.log(1 / p), -np.log(p))


AXIOMS: dict[str, tuple[str, Checker]] = {
    "index-divmod": ("(e // t) * t + e % t = e, and e // t = 0, e % t = e for e in [0, t)", _divmod),
    "index-nested-div": ("(f*a + b) // (f*m) = a // m and (f*a + b) % (f*m) = f*(a % m) + b for b in [0, f)",
                         _nested_div),
    "index-mod-div": ("(e % (n*q)) // n = (e // n) % q and (e % (n*q)) % n = e % n", _mod_div),
    "index-mod-nest": ("n*((e // n + r) % m) + e % n = (e + n*r) % (n*m) for integers e, r", _mod_nest),
    "distribute": ("(a + b) * c = a*c + b*c", lambda r: _close(*(lambda a, b, c: ((a + b) * c, a * c + b * c))(
        *r.standard_normal(3)))),
    "div-monomial": ("a / (c * m) = a * c**-1 * m**-1", lambda r: _close(*(lambda a, c, m: (a / (c * m), a / c / m))(
        *r.uniform(0.5, 2, 3)))),
    "div-content": ("a / (c*m*P) = a * c**-1 * m**-1 * inv(P)", lambda r: _close(
        *(lambda a, c, m, p: (a / (c * m * p), a * (1 / c) * (1 / m) * (1 / p)))(*r.uniform(0.5, 2, 4)))),
    "exp-add": ("exp(a + c*b) = exp(a) * exp(b)**c", lambda r: _close(
        *(lambda a, b, c: (np.exp(a + c * b), np.exp(a) * np.exp(b) ** c))(*r.standard_normal(3)))),
    "log-exp": ("log(exp(u) * y) = u + log(y) (both sides defined where y > 0); log(exp(u)) = u",
                lambda r: _close(*(lambda u, y: (np.log(np.exp(u) * y), u + np.log(y)))(
                    r.standard_normal(), r.uniform(0.1, 5))) and _close(*(lambda u: (np.log(np.exp(u)), u))(
                    r.standard_normal()))),
    "log-mul": ("log(a**e * y) = e log(a) + log(y), log(1 / P) = -log(P) (for log |.|; log on positive values)",
                _log_mul),
    "sum-distribute": ("sum_i (f_i + g_i) = sum_i f_i + sum_i g_i", lambda r: _close(
        *(lambda f, g: ((f + g).sum(), f.sum() + g.sum()))(r.standard_normal(9), r.standard_normal(9)))),
    "sum-const": ("sum_{i in [lo,hi)} c = (hi - lo) * c", lambda r: _close(
        *(lambda c: (sum(c for _ in range(3, 10)), 7 * c))(r.standard_normal()))),
    "sum-factor-out": ("sum_i a * f_i = a * sum_i f_i", lambda r: _close(
        *(lambda a, f: ((a * f).sum(), a * f.sum()))(r.standard_normal(), r.standard_normal(9)))),
    "sum-shift": ("sum_{v in [0,n)} f(v + c) = sum_{k in [c, c+n)} f(k)", _sum_shift),
    "sum-split-merge": ("sum_[a,b) f + sum_[b,c) f = sum_[a,c) f", _split_merge),
    "sum-block-merge": ("sum_{v in [0,n)} sum_{k in [a+s*v, a+s*v+s)} f(k) = sum_{k in [a, a+s*n)} f(k)",
                        _block_merge),
    "sum-fold": ("f(a) + f(a+1) + ... + f(b-1) = sum_[a,b) f (terms equal but for one constant index)", _fold),
    "sum-interchange": ("sum_i sum_j f_ij = sum_j sum_i f_ij (ranges independent of i and j)", _interchange),
    "max-flatten": ("max(max(a, b), c) = max(a, b, c); max(a, a) = a", _max_flatten),
    "max-range-merge": ("max(max_[a,c) f, max_[b,d) f) = max_[a,d) f for a <= b <= c", _max_merge),
    "concat-select": ("concat(x, y)[i] = x[i] for i < len(x), y[i - len(x)] otherwise", lambda r: bool(
        (lambda x, y: np.concatenate([x, y])[3] == x[3] and np.concatenate([x, y])[6] == y[1])(
            r.standard_normal(5), r.standard_normal(4)))),
    "concat-split": ("sum over a range split where a concat changes piece", lambda r: _close(
        *(lambda x, y: (np.concatenate([x, y]).sum(), x.sum() + y.sum()))(r.standard_normal(5), r.standard_normal(4)))),
    "tril-select": ("tril_mask(offset=o)[i, j] = 1 where j <= i + o, 0 elsewhere (torch.ones(n, m).tril(o))",
                    lambda r: bool((lambda n, m, o: np.array_equal(
                        np.tril(np.ones((n, m)), o), np.less_equal.outer(-np.arange(n), -np.arange(m) + o) * 1.0))(
                        int(r.integers(1, 9)), int(r.integers(1, 9)), int(r.integers(-3, 4))))),
    "rsqrt-def": ("rsqrt(x) = sqrt(x)**-1", lambda r: _close(*(lambda x: (1 / np.sqrt(x), np.sqrt(x) ** -1))(
        r.uniform(0.1, 5)))),
    "mean-def": ("mean_i f_i = (1/n) sum_i f_i", lambda r: _close(*(lambda f: (f.mean(), f.sum() / 9))(
        r.standard_normal(9)))),
    "rms-def": ("rms_norm(x)_j = x_j * sqrt((1/n) sum_i x_i**2 + eps)**-1 [* w_j]", lambda r: _close(
        *(lambda x: (x / np.sqrt(np.mean(x * x) + 1e-6), x * (np.sum(x**2) / 9 + 1e-6) ** -0.5))(
            r.standard_normal(9)))),
}


def check_law(name: str, trials: int = 20, seed: int = 0) -> bool:
    """Check law ``name`` on ``trials`` random draws."""
    _, fn = AXIOMS[name]
    r = np.random.default_rng(seed)
    return all(fn(r) for _ in range(trials))
