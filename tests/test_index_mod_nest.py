"""Law index-mod-nest: ``n*((e // n) % m) + e % n = e % (n*m)`` (twenty-first session).

Whisper large-v3's cross-attention block at full size (benchmarks/unseen_graphs6.py) had every whole-program candidate
that writes the attention output in column blocks Unknown: the output projection reads that output through a
transpose and a reshape that flatten the heads, so the candidate indexes ``v_enc`` by ``16*((r // 16) % 4) + r % 16``
(a block of 16 columns and the column within it) where the program indexes it by ``r % 64``: equal for every integer
``r``, but different normal forms ("z3 says sat"). The search fell back to regions (4 kernels, 2.8x est.)."""

from __future__ import annotations

import random

from test_index_mod_div import _derivation, _ev  # (the tests folder is on the path)

import verimirage as vm
from verimirage.smt import expr as E
from verimirage.smt.axioms import check_law


def test_mod_nest_normal_forms_meet_and_evaluate_like_python() -> None:
    assert check_law("index-mod-nest")
    r = random.Random(0)
    for _ in range(200):
        with _derivation() as d:
            lo = r.choice([0, -7, 3])
            d.ranges["x"] = (lo, lo + r.choice([64, 100, 1024]))
            d.ranges["y"] = (0, r.choice([1, 3, 8]))
            n, m, k = r.choice([2, 4, 16]), r.choice([2, 3, 4]), r.choice([1, -1, 3])
            x = E.a_add(E.a_add(E.a_var("x"), E.a_const(r.randint(-9, 9))), E.a_var("y"), r.choice([1, 5, 7]))
            nested = E.a_add(E.a_scale(E.a_mod(E.a_floordiv(x, n), m), k * n), E.a_scale(E.a_mod(x, n), k))
            assert nested == E.a_scale(E.a_mod(x, n * m), k)
            for v in range(*d.ranges["x"]):
                for w in range(*d.ranges["y"]):
                    env = {"x": v, "y": w}
                    assert _ev(nested, env) == k * (_ev(x, env) % (n * m))


def test_mod_nest_not_applied_unless_the_coefficients_match() -> None:
    """``n*((e // n) % m) + 2*(e % n)`` is not ``e % (n*m)`` plus anything the law gives: left as it is, its value
    kept."""
    with _derivation() as d:
        d.ranges["x"] = (0, 200)
        x = E.a_var("x")
        for cm, cn in ((16, 2), (8, 1), (16, -1)):
            got = E.a_add(E.a_scale(E.a_mod(E.a_floordiv(x, 16), 4), cm), E.a_scale(E.a_mod(x, 16), cn))
            for v in range(200):
                assert _ev(got, {"x": v}) == cm * ((v // 16) % 4) + cn * (v % 16)
        assert "index-mod-nest" not in d.laws


#: Whisper's cross-attention block scaled down (4 tokens, 4 heads of 64, 30 encoder states) as the search lowered
#: it: the attention kernel writes its output in 4 column blocks of 16 (``omap=(0, 2)``), the projection kernel
#: reads it whole through the transpose and the heads-merging reshape
_CANDIDATE = """mugraph {
  %0 = input {name='x'} : f16[4,256]
  %1 = input {name='w_q'} : f16[256,256]
  %2 = input {name='b_q'} : f16[1,256]
  %3 = input {name='k_enc'} : f16[4,64,30]
  %4 = input {name='v_enc'} : f16[4,30,64]
  %5 = input {name='w_o'} : f16[256,256]
  %6 = input {name='b_o'} : f16[1,256]
  %7 = custom %0, %1, %2, %3, %4 {frange=1, grid=(4, 4)} : f16[4,4,64] {
    %0 = input {arg=0, fmap=None, imap=(None, None), shape=(4, 256)} : f16[4,256]
    %1 = input {arg=1, fmap=None, imap=(1, None), shape=(256, 256)} : f16[256,64]
    %2 = input {arg=2, fmap=None, imap=(1, None), shape=(1, 256)} : f16[1,64]
    %3 = input {arg=3, fmap=None, imap=(0, None), shape=(4, 64, 30)} : f16[1,64,30]
    %4 = input {arg=4, fmap=None, imap=(0, 2), shape=(4, 30, 64)} : f16[1,30,16]
    %5 = matmul %0, %1 : f16[4,64]
    %6 = add %5, %2 : f16[4,64]
    %7 = scale %6 {c=0.125} : f16[4,64]
    %8 = reshape %7 {shape=(4, 1, 64), src=(4, 64)} : f16[4,1,64]
    %9 = transpose %8 {a=0, b=1} : f16[1,4,64]
    %10 = matmul %9, %3 : f16[1,4,30]
    %11 = max %10 {axis=2} : f16[1,4,1]
    %12 = sub %10, %11 : f16[1,4,30]
    %13 = exp %12 : f16[1,4,30]
    %14 = sum %13 {axis=2} : f16[1,4,1]
    %15 = div %13, %14 : f16[1,4,30]
    %16 = matmul %15, %4 : f16[1,4,16]
    output %16 {omap=(0, 2)}
  }
  %8 = custom %5, %6, %7 {frange=1, grid=(16,)} : f16[4,256] {
    %0 = input {arg=0, fmap=None, imap=(1,), shape=(256, 256)} : f16[256,16]
    %1 = input {arg=1, fmap=None, imap=(1,), shape=(1, 256)} : f16[1,16]
    %2 = input {arg=2, fmap=None, imap=(None,), shape=(4, 4, 64)} : f16[4,4,64]
    %3 = transpose %2 {a=0, b=1} : f16[4,4,64]
    %4 = reshape %3 {shape=(4, 256), src=(4, 4, 64)} : f16[4,256]
    %5 = matmul %4, %0 : f16[4,16]
    %6 = add %5, %1 : f16[4,16]
    output %6 {omap=(1,)}
  }
  return %8
}"""


def _cross_attention(t: int = 4, h: int = 4, d: int = 64, n: int = 30) -> vm.Graph:
    g = vm.Graph()
    x = g.input("x", (t, h * d), vm.float16)
    wq, bq = g.input("w_q", (h * d, h * d), vm.float16), g.input("b_q", (1, h * d), vm.float16)
    k, v = g.input("k_enc", (h, d, n), vm.float16), g.input("v_enc", (h, n, d), vm.float16)
    wo, bo = g.input("w_o", (h * d, h * d), vm.float16), g.input("b_o", (1, h * d), vm.float16)
    q = g.transpose(g.reshape(g.scale(g.add(g.matmul(x, wq), bq), d ** -0.5), (t, h, d)), 0, 1)
    s = g.matmul(q, k)
    e = g.exp(g.sub(s, g.max(s, axis=2)))
    o = g.matmul(g.div(e, g.sum(e, axis=2)), v)
    g.output(g.add(g.matmul(g.reshape(g.transpose(o, 0, 1), (t, h * d)), wo), bo))
    return g


def test_heads_flattened_over_column_blocks_were_unknown() -> None:
    from verimirage.smt.verify import abstract_check

    g, mg = _cross_attention(), vm.MuGraph.parse(_CANDIDATE)
    r = abstract_check(g, mg, timeout_s=30.0)
    assert r.outcome.value == "proved" and "index-mod-nest" in r.laws, r.reason
    assert isinstance(vm.verify(g, mg), vm.Proved)
    # the heads merged without the transpose (token and head swapped) is another function: not proved
    bad = vm.MuGraph.parse(_CANDIDATE.replace("%4 = reshape %3 {shape=(4, 256)", "%4 = reshape %2 {shape=(4, 256)"))
    assert not isinstance(vm.verify(g, bad), vm.Proved)
    assert abstract_check(g, bad, timeout_s=30.0).outcome.value != "proved"
