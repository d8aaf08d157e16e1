"""Law index-mod-div: ``(e % (n*q)) // n = (e // n) % q`` and ``(e % (n*q)) % n = e % n``.

A block-level reshape of a tile of a flattened operand (the decoder layer's attention output ``(8, 4, 1, 128)``
read as ``(1, 4096)`` by 8 blocks of 512) indexes its source by ``(j // 128) % 4`` with ``j`` the flat index;
the block's ``j`` is the global index modulo 512, so the candidate's index was ``((g % 512) // 128)`` where the
program's is ``(g // 128) % 4``: equal for every integer, but different normal forms, and the region's candidate
was left Unknown (its definedness claims, stated on the same sums, did not match the program's either)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import verimirage as vm
from verimirage.smt import expr as E
from verimirage.smt.axioms import check_law


@contextmanager
def _derivation() -> Iterator[E.Derivation]:
    """A fresh derivation, active for the block (the normaliser's laws and index ranges are recorded in it)."""
    d = E.Derivation()
    tok = E.activate(d)
    try:
        yield d
    finally:
        E.deactivate(tok)


def _ev(a: object, env: dict[str, int]) -> int:
    v = a[1]  # type: ignore[index]
    for at, c in a[2]:  # type: ignore[index]
        x = env[at[1]] if at[0] == "v" else _ev(at[1], env)
        v += c * (x if at[0] == "v" else x // at[2] if at[0] == "fd" else x % at[2])
    return int(v)


def test_mod_div_normal_forms_meet_and_evaluate_like_python() -> None:
    assert check_law("index-mod-div")
    r = random.Random(0)
    for _ in range(200):
        with _derivation() as d:
            lo = r.choice([0, -7, 3])
            d.ranges["x"] = (lo, lo + r.choice([64, 100, 4096]))
            n, q = r.choice([1, 2, 4, 128]), r.choice([1, 2, 3, 4])
            c = r.randint(-9, 9)
            x = E.a_add(E.a_var("x"), E.a_const(c))
            inner = E.a_mod(x, n * q)
            got_div, got_mod = E.a_floordiv(inner, n), E.a_mod(inner, n)
            assert got_div == E.a_mod(E.a_floordiv(x, n), q)
            assert got_mod == E.a_mod(x, n)
            for v in range(*d.ranges["x"]):
                env = {"x": v}
                assert _ev(got_div, env) == ((v + c) % (n * q)) // n
                assert _ev(got_mod, env) == ((v + c) % (n * q)) % n


def test_mod_div_not_applied_when_n_does_not_divide() -> None:
    with _derivation() as d:
        d.ranges["x"] = (0, 100)
        x = E.a_var("x")
        got = E.a_floordiv(E.a_mod(x, 12), 8)  # (x % 12) // 8 is not (x // 8) % (12/8)
        for v in range(100):
            assert _ev(got, {"x": v}) == (v % 12) // 8
        assert "index-mod-div" not in d.laws


def test_blocked_flatten_before_a_norm_epilogue_is_proved() -> None:
    """The layer's output-projection region, scaled down: a (2, 4, 1, 8) attention output flattened to (1, 64)
    by a 2-block kernel, then the projection, the residual and the RMSNorm: Proved (was Unknown: normal forms
    ``(g // 8) % 4`` vs ``(g % 32) // 8``)."""
    g = vm.Graph()
    a = g.input("A", (2, 4, 1, 8), "float16")
    w = g.input("W", (64, 64), "float16")
    r = g.input("R", (1, 64), "float16")
    gw = g.input("G", (64,), "float16")
    h = g.add(r, g.matmul(g.reshape(a, (1, 64)), w))
    g.output(h, g.rms_norm(h, gw, axis=1, eps=1e-5))
    mg = vm.MuGraph()
    a2, w2, r2, g2 = (mg.input(n, t.type.shape, t.type.dtype) for n, t in (("A", a), ("W", w), ("R", r), ("G", gw)))
    b = vm.BlockBuilder((2,), 1)
    x = b.input(0, a.type, (0,))
    b.output(b.reshape(x, (1, 32)), (1,))
    (flat,) = mg.custom(b.build(), [a2])
    h2 = mg.add(r2, mg.matmul(flat, w2))
    mg.output(h2, mg.rms_norm(h2, g2, axis=1, eps=1e-5))
    v = vm.verify(g, mg, timeout_s=60)
    assert v.proved, v
