"""Red team (twelfth session): attacks on what the eleventh session landed that held, kept as tests so they keep
holding. Kernels run in Triton's interpreter against float64 (``vm.evaluate``).

* ``norm_into_projections`` (rule ``rms-norm-matmul``): a projection of a transposed weight, two norms of one ``x``
  with different weights and eps, a norm also read elsewhere, ``h @ h^T``, rank-3 batches broadcast on either side,
  a chain of products: each rewrite is the same function and ``vm.verify`` proves it against the source; a norm
  that is the right operand, along axis 0, read through a reshape or a transpose is not rewritten. Searches of
  three of these returned only candidates equal to the source (float64).
* Codegen 12 (a concat of slices loaded directly, rotations as ``(j + h) % size``): 288 random concats of 1-4
  slices (rotations by any amount, permutations, a piece repeated, pieces of two inputs, negations), rows 4-16,
  dims 8-32 (12: padded), in one-kernel lowerings with grids and loops: none off.
* Along the rows too: 165 random concats of slices along axis 0 (32 loaded as rotations): none off.
* Weighted norms along other axes than the last: ``rms_norm(x, w, axis=a)`` against its expansion with ``w`` placed
  along the normalised axis (Proved) and along another (Refuted), axes 0, 1, -2, -1 and a middle axis of a rank-3
  ``x``: the verifier's meaning of the weight is the reference's.
* Region splits with norms (``_norm_to_readers``, the reader merge): 61 random programs of products, weighted norms
  (two weights, two eps), transposed weights, residual adds, silu and products, several outputs, split with regions
  of 3-6 ops: no crash, every returned candidate Proved and equal to the source in float64, its certificate
  re-checked where checked.
* Codegen 11 (``exp(x - max x)`` as ``exp2((x - m) * log2e)``): the max over the other axis, the exp times another
  input, a softmax feeding a product, logits of scale 30 and 100: none off in the interpreter. (On a GPU
  ``tl.exp2`` flushes results below 2**-126 to zero: a finding, tests/test_redteam_session12.py, fixed in afead57.)
* The degree analysis (``ffref.quotient_info``): 1,500 random rational programs (division, pow -3..3, square, shift,
  scale, mean, sum, transpose, layouts, concat, products, several outputs) and 440 more with where (a bool mask,
  often last: the test fails when where's degree drops its mask's), each also as kernels and lowered (grids 1-2,
  loops 1-2): the stated degree was never under the sympy degree.
* The served plan's re-check (``corpus_capture.recheck``): 19 junk items (None, numbers, lists, dicts without a
  certificate or with a non-JSON / empty / wrong-schema one, a non-canonical text, another shape, 100 kB of junk,
  deeply nested headers) are each refused with a reason; the good item after them is served.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline import pricing
from verimirage.rewrite.stabilise import norm_into_projections

F = vm.float32


def _norm_programs() -> dict[str, vm.Graph]:
    out: dict[str, vm.Graph] = {}

    def new() -> vm.Graph:
        return vm.Graph()

    g = new()
    x, w, W = g.input("X", (3, 8), F), g.input("G", (8,), F), g.input("W", (4, 8), F)
    g.output(g.matmul(g.rms_norm(x, w, eps=1e-3), g.transpose(W, 0, 1)))
    out["transposed_weight"] = g
    g = new()
    x, w1, w2 = g.input("X", (3, 8), F), g.input("G1", (8,), F), g.input("G2", (8,), F)
    a, b = g.input("A", (8, 4), F), g.input("B", (8, 4), F)
    g.output(g.add(g.matmul(g.rms_norm(x, w1, eps=1e-3), a), g.matmul(g.rms_norm(x, w2, eps=0.5), b)))
    out["two_norms_two_weights_two_eps"] = g
    g = new()
    x, w, a = g.input("X", (3, 8), F), g.input("G", (8,), F), g.input("A", (8, 4), F)
    h = g.rms_norm(x, w, eps=1e-3)
    g.output(g.matmul(h, a), g.shift(h, 1.0))
    out["norm_also_read_elsewhere"] = g
    g = new()
    h = g.rms_norm(g.input("X", (8, 8), F), g.input("G", (8,), F), eps=1e-3)
    g.output(g.matmul(h, g.transpose(h, 0, 1)))
    out["norm_times_its_transpose"] = g
    g = new()
    g.output(g.matmul(g.rms_norm(g.input("X", (2, 3, 8), F), g.input("G", (8,), F), eps=1e-3),
                      g.input("A", (1, 8, 4), F)))
    out["rank3_weight_broadcast"] = g
    g = new()
    g.output(g.matmul(g.rms_norm(g.input("X", (1, 3, 8), F), g.input("G", (8,), F), eps=1e-3),
                      g.input("A", (2, 8, 4), F)))
    out["rank3_x_broadcast"] = g
    g = new()
    h = g.rms_norm(g.input("X", (3, 8), F), g.input("G", (8,), F), eps=1e-3)
    g.output(g.matmul(g.matmul(h, g.input("A", (8, 4), F)), g.input("B", (4, 2), F)))
    out["chain"] = g
    # not sites: the norm the right operand, along axis 0, read through a reshape or a transpose
    g = new()
    g.output(g.matmul(g.input("A", (8, 8), F), g.rms_norm(g.input("X", (8, 8), F), g.input("G", (8,), F), eps=1e-3)))
    out["-right_operand"] = g
    g = new()
    g.output(g.matmul(g.rms_norm(g.input("X", (8, 8), F), g.input("G", (8,), F), axis=0, eps=1e-3),
                      g.input("A", (8, 4), F)))
    out["-axis_0"] = g
    g = new()
    h = g.rms_norm(g.input("X", (3, 8), F), g.input("G", (8,), F), eps=1e-3)
    g.output(g.matmul(g.reshape(h, (3, 8)), g.input("A", (8, 4), F)))
    out["-through_a_reshape"] = g
    g = new()
    h = g.rms_norm(g.transpose(g.input("X", (3, 8), F), 0, 1), g.input("G", (3,), F), eps=1e-3)
    g.output(g.matmul(g.transpose(h, 0, 1), g.input("A", (8, 4), F)))
    out["-of_a_transpose"] = g
    return out


@pytest.mark.parametrize("name", list(_norm_programs()))
def test_norm_into_projections_variants_held(name: str) -> None:
    g = _norm_programs()[name]
    gn = norm_into_projections(g)
    if name.startswith("-"):
        assert gn is None
        return
    assert gn is not None
    rng = np.random.default_rng(0)
    ins = {str(t.name): rng.standard_normal(t.shape) for t in g.inputs}
    for x, y in zip(vm.evaluate(g, ins), vm.evaluate(gn, ins), strict=True):
        np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-12)
    assert isinstance(vm.verify(g, gn), vm.Proved)


def _run(mg: Any, ins: dict[str, np.ndarray]) -> np.ndarray:
    torch = pytest.importorskip("torch")
    o = vm.compile(mg)(*[torch.tensor(ins[str(t.name)], dtype=torch.float32) for t in mg.inputs])
    return (o[0] if isinstance(o, (tuple, list)) else o).double().numpy()


_CONCATS = [  # (dim, [(start, stop, negated, input)]): rotations by 3 and 5 of 8, a permutation, a piece repeated,
    (8, [(3, 8, True, "X"), (0, 3, False, "X")]),  # pieces of two inputs, an unpadded 12
    (16, [(5, 16, False, "X"), (0, 5, True, "X")]),
    (16, [(8, 12, False, "X"), (0, 8, True, "X"), (12, 16, False, "X")]),
    (8, [(0, 4, True, "X"), (0, 4, False, "X")]),
    (16, [(8, 16, True, "Y"), (0, 8, False, "X")]),
    (12, [(6, 12, True, "X"), (0, 6, False, "X")]),
]


@pytest.mark.parametrize("case", range(len(_CONCATS)))
def test_concat_of_slices_loaded_directly_held(case: int) -> None:
    pytest.importorskip("egglog")
    from verimirage.rewrite.partition import lower_all

    d, pieces = _CONCATS[case]
    g = vm.Graph()
    src = {"X": g.input("X", (8, d), F), "C": g.input("C", (8, d), F)}
    if any(p[3] == "Y" for p in pieces):
        src["Y"] = g.input("Y", (8, d), F)
    parts = [g.slice(src[i], 1, a, b) for a, b, _, i in pieces]
    cat = g.concat([g.neg(p) if neg else p for p, (_, _, neg, _) in zip(parts, pieces, strict=True)], 1)
    g.output(g.add(g.mul(cat, src["C"]), src["X"]))
    rng = np.random.default_rng(case)
    ins = {str(t.name): rng.uniform(-1, 1, t.shape) for t in g.inputs}
    want = vm.evaluate(g, ins)[0]
    lows, _ = lower_all(g, grids=(1, 2), franges=(1,), rank=pricing.cost)
    mgs = [low.mugraph for low in lows if low.mugraph.num_kernels == 1][:2]
    assert mgs
    for mg in mgs:
        np.testing.assert_allclose(_run(mg, ins), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["column_max", "times_another_input", "softmax_then_product"])
def test_exp2_of_a_max_shift_held(kind: str) -> None:
    pytest.importorskip("egglog")
    from verimirage.backend.codegen import generate
    from verimirage.rewrite.partition import lower_all

    g = vm.Graph()
    x, y = g.input("X", (8, 32), F), g.input("Y", (8, 32), F)
    if kind == "column_max":  # (the max along the other axis than the sum's)
        e = g.exp(g.sub(x, g.max(x, 0)))
        g.output(g.mul(g.div(e, g.sum(e, 1)), y))
    elif kind == "times_another_input":
        g.output(g.mul(g.exp(g.sub(x, g.max(x, 1))), y))
    else:
        e = g.exp(g.sub(x, g.max(x, 1)))
        g.output(g.add(g.div(g.matmul(e, g.input("W", (32, 16), F)), g.sum(e, 1)), g.sum(y, 1)))
    lows, _ = lower_all(g, grids=(1, 2), franges=(1, 2), rank=pricing.cost)
    mgs = [low.mugraph for low in lows[:6]]
    for mg in mgs:  # (fp32 kernels keep tl.exp since afead57; either way the kernel is float64's value)
        assert "tl.exp" in generate(mg).source
    rng = np.random.default_rng(1)
    ins = {str(t.name): rng.standard_normal(t.shape) * 30 for t in g.inputs}
    want = vm.evaluate(g, ins)[0]
    for mg in mgs:
        np.testing.assert_allclose(_run(mg, ins), want, rtol=1e-4, atol=1e-6 * np.abs(want).max())


def _rational_program(rng: random.Random) -> vm.Graph:
    g = vm.Graph()
    vals = [g.input("a", (2, 4), F), g.input("b", (2, 4), F), g.input("c", (1, 4), F)]
    for _ in range(rng.randint(2, 7)):
        x = rng.choice(vals)
        shp, n = tuple(x.shape), math.prod(x.shape)
        op = rng.choice(["div", "mul", "add", "sub", "pow", "pow", "where", "square", "shift", "scale", "mean",
                         "sum", "transpose", "reshape", "matmul", "reciprocal", "concat"])
        same = [v for v in vals if tuple(v.shape) == shp]
        try:
            if op in ("div", "mul", "add", "sub"):
                r = getattr(g, op)(x, rng.choice(same + [vals[2]] * (shp[-1:] == (4,))))
            elif op == "pow":
                r = g.pow(x, rng.choice([2, 3, -1, -2, -3]))
            elif op == "where":  # (the mask's meaning in the field: m a + (1 - m) b, of degree deg m + ...)
                r = g.where(g.input(f"m{len(vals)}", shp, vm.bool), x, rng.choice(same))
            elif op in ("square", "reciprocal"):
                r = getattr(g, op)(x)
            elif op == "shift":
                r = g.shift(x, 1.5)
            elif op == "scale":
                r = g.scale(x, 0.5)
            elif op in ("sum", "mean"):
                r = getattr(g, op)(x, rng.randrange(len(shp)))
            elif op == "transpose":
                r = g.transpose(x, 0, -1) if len(shp) > 1 else x
            elif op == "reshape":
                r = g.reshape(x, rng.choice([s for s in [(n,), (1, n), (n, 1), (2, n // 2)]
                                             if math.prod(s) == n and min(s) > 0]))
            elif op == "concat":
                r = g.concat([x, rng.choice(same)], rng.randrange(len(shp)))
            else:
                ys = [v for v in vals if len(shp) >= 2 and len(v.shape) >= 2 and v.shape[-2] == shp[-1]]
                r = g.matmul(x, rng.choice(ys)) if ys else x
        except vm.GraphError:
            continue
        if math.prod(r.shape) <= 16:
            vals.append(r)
    if rng.random() < 0.4:  # (a where last: its mask's degree is not hidden by the rest's slack)
        x = vals[-1]
        vals.append(g.where(g.input("mlast", x.shape, vm.bool), x, rng.choice([v for v in vals if v.shape == x.shape])))
    g.output(*([vals[-1]] + ([vals[-2]] if len(vals) > 5 and rng.random() < 0.3 else [])))
    return g


@pytest.mark.slow
def test_degree_bounds_with_pow_where_and_kernels_held() -> None:
    sp = pytest.importorskip("sympy")
    pytest.importorskip("egglog")
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.interpret import run
    from verimirage.ir.reference import REF
    from verimirage.rewrite.partition import lower_all
    from verimirage.smt import ffref as R

    class Sym:  # the reference with the field's where and exact integer powers (sympy objects)
        name = "ref"

        def apply(self, op: str, args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
            if op == "where":
                return args[0] * args[1] + (1 - args[0]) * args[2]
            if op in ("pow", "reciprocal"):
                c = int(float(attrs["c"])) if op == "pow" else -1
                return np.vectorize(lambda e: sp.Integer(1) / e ** (-c) if c < 0 else e**c, otypes=[object])(args[0])
            return REF.apply(op, args, attrs, it, ot)

    rng = random.Random(12)
    for _ in range(40):
        g = _rational_program(rng)
        try:
            g.check(unused_inputs=True)
        except vm.GraphError:
            continue
        ins = {str(t.name): np.array(sp.symbols(f"{t.name}_0:{math.prod(t.shape)}"), dtype=object).reshape(t.shape)
               for t in g.inputs}
        true = 0
        for o in run(g, ins, Sym()):
            for e in np.asarray(o, dtype=object).reshape(-1):
                gens = sorted(sp.sympify(e).free_symbols, key=str) or [sp.Symbol("z")]
                num, den = sp.fraction(sp.cancel(sp.together(e)))
                true = max(true, *(sp.Poly(p, *gens).total_degree() for p in (num, den)))
        lows = lower_all(g, grids=[1, 2], franges=[1, 2], max_splits=4, rank=pricing.cost)[0]
        mgs = [to_kernels(g), *(low.mugraph for low in lows[:6])]
        stated = [R.quotient_info(g)[0], R.degree_bound(g)[0]] + [min(R.quotient_info(m)[0], R.degree_bound(m)[0])
                                                                    for m in mgs]
        assert min(stated) >= true, (str(g), true, stated)


@pytest.mark.slow
def test_plan_recheck_refuses_junk_items_with_reasons_held() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture as cc

    from verimirage.ir.graph import Graph, MuGraph

    g = Graph.parse("graph {\n  %0 = input {name='in0'} : f32[4,8]\n  %1 = exp %0 : f32[4,8]\n"
                    "  %2 = sum %1 {axis=1} : f32[4,1]\n  return %2\n}")
    good = str(MuGraph.from_graph(g))
    junk: list[Any] = [None, 5, 1.5, [good], {"mugraph": 1}, {"mugraph": good}, {"mugraph": good, "certificate": None},
                       {"mugraph": good, "certificate": "not json"}, {"mugraph": good, "certificate": "{}"},
                       {"mugraph": good, "certificate": json.dumps({"schema": "verimirage-composed-certificate/1"})},
                       {"mugraph": good, "certificate": "[]"},
                       {"mugraph": good, "certificate": json.dumps({"schema": 5})},
                       good.replace("f32[4,8]", "f32[4,9]"), "x" * 100000, good + "\n", "mugraph {" * 5000]
    served, why = cc.recheck(g, [*junk, good], 3, {})
    assert [str(m) for m in served] == [good] and len(why) == len(junk)



@pytest.mark.parametrize("axis", [0, 1, -2, -1])
def test_weighted_norm_along_any_axis_verifies_as_the_reference_held(axis: int) -> None:
    for where_w, equal in (((4, 1), axis in (0, -2)), ((1, 4), axis in (1, -1))):
        g, h = vm.Graph(), vm.Graph()
        g.output(g.rms_norm(g.input("X", (4, 4), F), g.input("G", (4,), F), axis=axis, eps=1e-3))
        x, w = h.input("X", (4, 4), F), h.input("G", (4,), F)
        r = h.rsqrt(h.shift(h.mean(h.square(x), axis), 1e-3))
        h.output(h.mul(h.mul(x, r), h.reshape(w, where_w)))
        v = vm.verify(g, h)
        assert isinstance(v, vm.Proved if equal else vm.Refuted), (axis, where_w, v)
