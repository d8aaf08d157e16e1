"""Red team (fifteenth session): attacks on the verifier, the certificate checker and the floating-point check that
held, kept as tests so they keep holding (findings: ``tests/test_redteam_session15.py``).

* The composed-certificate glue (``smt.certificate._check_composed``, ``smt.glue``) on the committed
  ``layer_decode_bs1_small`` (6 regions): sub-certificates swapped between regions, the regions in reverse order and
  every pair of neighbours swapped (the splice recomposed and rehashed), a node moved to the next region with the
  wiring re-derived, a sub-certificate recording a Triton hash, a region's inputs swapped, a region's μGraph taken
  from another region (rehashed): every one rejected, naming why.
* The finite-field degree model (``ffref.quotient_info``) against sympy (every exp application a fresh symbol, max
  / maximum a random pick per element, where as ``m a + (1 - m) b``) on 1,040 random programs of 4-8 ops (add, sub,
  mul, div, reciprocal, square, sums, means and maxes along either axis, exp, matmul, maximum, concat, permute,
  integer pow, broadcast, where over an input mask or a tril_mask) over 2 x 3 / 3 x 1 / ... inputs, the program,
  its kernels and up to six lowerings each (grids, loops of 3, splits): never below (a sample is kept here).
* The reference evaluator's folded loop products (``ir.interpret._folded_products``: a loop sum of a product of
  loop-split inputs taken as one product in the field domains) against the loop itself and the source, on 105
  lowerings with loops over contracted dims of 48-1000 (odd ones padded): the same residues (a sample kept here);
  and the degree model on 600 random 3-D programs (batched products, permutes, reshapes, reductions along any
  axis) with their kernels and lowerings: never below sympy's degree.
* Odd shapes (3..65 rows and columns, tiles padded) through every lowering's kernels in Triton's interpreter against
  float64: 160 random programs of exp / log / reciprocal / sqrt / rsqrt / sigmoid / tanh / abs / relu / silu chains
  then a sum, mean, max or min along either axis, a softmax, a logsumexp or a product: no mismatch, no error (a
  sample is kept here).
* The checker on 300 mutated composed certificates (region node lists, wiring and certificate indices of the
  wrong types, regions or sub-certificates dropped or duplicated, sub-certificate fields and schemas replaced):
  never an exception, never Proved but where only ``reason`` / ``versions`` changed (a sample is kept here).
* The floating-point check's structural rules added this session keep every committed candidate (422 in
  ``benchmarks/candidates*``, the 31 certificates' μGraphs); after them, ``vm.superoptimize``'s candidates of 16
  LLM-style fp16 programs (masked and scaled attention, logsumexp, cross-entropy, norms before products, gated MLP,
  biases, row scalings, sigmoid gates) and of 240 random ones were finite on 30-60 correlated input sets each
  (inputs filled with, or near, constants from 1e-3 to 6e4 of either sign) wherever the source was.
"""

from __future__ import annotations

import copy
import glob
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline import pricing

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- the glue of composed certificates


def test_composed_certificate_glue_tampering_is_rejected_held() -> None:
    from verimirage.smt import glue
    from verimirage.smt.certificate import check_text, sha256

    d0 = json.loads((ROOT / "proofs" / "layer_decode_bs1_small.json").read_text())
    g = vm.Graph.parse(d0["graph_text"])
    regs = [glue.region_of(g, r["nodes"]) for r in d0["regions"]]
    mgs = [vm.MuGraph.parse(d0["certificates"][r["certificate"]]["mugraph_text"]) for r in d0["regions"]]

    def rejected(d: dict[str, Any], why: str) -> None:
        v = check_text(json.dumps(d))
        assert not v.proved and why in v.reason, v.reason

    d = copy.deepcopy(d0)
    d["regions"][1]["certificate"], d["regions"][2]["certificate"] = 2, 1
    rejected(d, "about another program")
    d = copy.deepcopy(d0)
    d["regions"] = d["regions"][::-1]
    rejected(d, "cannot be spliced")
    for i in range(len(regs) - 1):  # neighbours swapped, the splice recomposed where it can be
        order = list(range(len(regs)))
        order[i], order[i + 1] = order[i + 1], order[i]
        with pytest.raises(KeyError):
            glue.compose(g, [regs[k] for k in order], [mgs[k] for k in order])
        d = copy.deepcopy(d0)
        d["regions"] = [d0["regions"][k] for k in order]
        rejected(d, "region")
    d = copy.deepcopy(d0)
    d["regions"][2]["nodes"].append(d["regions"][1]["nodes"].pop())
    for r in d["regions"]:
        reg = glue.region_of(g, r["nodes"])
        r["inputs"], r["outputs"] = [list(x) for x in reg.inputs], [list(x) for x in reg.outputs]
    rejected(d, "about another program")
    d = copy.deepcopy(d0)
    d["certificates"][0]["triton_source_sha256"] = "0" * 64
    rejected(d, "records a Triton hash")
    d = copy.deepcopy(d0)
    r = d["regions"][1]
    r["inputs"][0], r["inputs"][1] = r["inputs"][1], r["inputs"][0]
    rejected(d, "its wiring")
    d = copy.deepcopy(d0)
    c = d["certificates"][3]
    c["mugraph_text"] = d0["certificates"][4]["mugraph_text"]
    c["mugraph_sha256"] = sha256(c["mugraph_text"])
    rejected(d, "sub-certificate 3")


def test_mutated_composed_certificates_are_rejected_held() -> None:
    import random

    from verimirage.smt.certificate import check_text

    d0 = json.loads((ROOT / "proofs" / "layer_decode_bs1_small.json").read_text())
    rng = random.Random(15)
    weird: list[Any] = [True, False, None, 1.0, -1, 2**70, "0", [], {}, [[0]], 1e308, "r0", [0, 0]]
    for _ in range(40):
        d = copy.deepcopy(d0)
        r, c = rng.choice(d["regions"]), rng.choice(d["certificates"])
        kind = rng.randrange(7)
        if kind == 0:
            r["nodes"][rng.randrange(len(r["nodes"]))] = rng.choice(weird)
        elif kind == 1:
            r["certificate"] = rng.choice([*weird, 1, 5, 6])
        elif kind == 2:
            r[rng.choice(["nodes", "inputs", "outputs", "certificate"])] = rng.choice(weird)
        elif kind == 3:
            d["regions"] = rng.choice([[], d["regions"][:3], [*d["regions"], d["regions"][0]]])
        elif kind == 4:
            d["certificates"] = rng.choice([[], d["certificates"][:2], [*d["certificates"], d["certificates"][0]]])
        elif kind == 5:
            c[rng.choice(sorted(set(c) - {"reason", "versions", "triton_source_sha256"}))] = rng.choice(weird)
        else:
            c["schema"] = rng.choice(["verimirage-composed-certificate/1", "x", None])
        v = check_text(json.dumps(d))  # (never raises)
        assert not v.proved, (kind, v.reason)


# --------------------------------------------------------------------------- the degree model against sympy


def _degree(sp: Any, e: Any) -> int:
    e = sp.sympify(e)
    gens = sorted(e.free_symbols, key=str) or [sp.Symbol("z")]
    num, den = sp.fraction(sp.cancel(sp.together(e)))
    return max(sp.Poly(p, *gens).total_degree() for p in (num, den))


def _random_program(rng: np.random.Generator) -> vm.Graph | None:
    shapes = [(2, 3), (3, 3), (1, 3), (3, 1), (2, 1), (3, 2)]
    g = vm.Graph()
    vals = [g.input(f"i{k}", shapes[rng.integers(len(shapes))], vm.float32) for k in range(3)]
    for step in range(int(rng.integers(4, 9))):
        op = str(rng.choice(["add", "mul", "div", "sub", "recip", "square", "sum", "max", "exp", "matmul", "maximum",
                             "concat", "permute", "pow", "tril", "mean", "bcast", "where"]))
        a, b = vals[rng.integers(len(vals))], vals[rng.integers(len(vals))]
        try:
            if op in ("add", "mul", "div", "sub", "maximum"):
                v = getattr(g, op)(a, b)
            elif op in ("sum", "max", "mean"):
                v = getattr(g, op)(a, int(rng.integers(2)))
            elif op == "concat":
                v = g.concat([a, b], int(rng.integers(2)))
            elif op == "pow":
                v = g.pow(a, float(rng.choice([-2, 2, 3, -1])))
            elif op == "tril":
                v = g.where(g.tril_mask(a.type.shape, 0), a, b)
            elif op == "where":
                v = g.where(g.input(f"m{step}", a.type.shape, vm.bool), a, b)
            else:
                v = {"recip": g.reciprocal, "square": g.square, "exp": g.exp, "permute": lambda t: g.permute(t, (1, 0)),
                     "bcast": lambda t: g.broadcast_to(t, (3, 3))}[op](a) if op != "matmul" else g.matmul(a, b)
        except vm.GraphError:
            continue
        vals.append(v)
    g.output(vals[-1])
    from verimirage.ir.graph import node_list
    from verimirage.smt.glue import live_ops

    g.check(unused_inputs=True)
    if g.outputs[0].type.rank != 2 or len(live_ops(g)) != sum(n.op != "input" for n in node_list(g)):
        return None  # (dead nodes: the lowerings drop them, the symbolic run would count them)
    return g


def test_degree_bound_is_above_sympy_on_random_programs_held() -> None:
    sp = pytest.importorskip("sympy")
    pytest.importorskip("egglog")
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.interpret import run
    from verimirage.ir.reference import REF
    from verimirage.rewrite.partition import lower_all
    from verimirage.smt import ffref as R

    class Sym:  # the field's meanings over sympy: exp a fresh symbol per element, max-like a random pick
        name = "ref"

        def __init__(self, rng: np.random.Generator) -> None:
            self.rng, self.fresh, self.arg = rng, itertools.count(), 0

        def apply(self, op: str, args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
            if op == "where":
                return args[0] * args[1] + (1 - args[0]) * args[2]
            if op == "reciprocal":
                return np.vectorize(lambda e: sp.Integer(1) / e, otypes=[object])(args[0])
            if op == "pow":
                return np.vectorize(lambda e: e ** int(attrs["c"]), otypes=[object])(args[0])
            if op == "exp":
                self.arg = max(self.arg, *(_degree(sp, e) for e in np.asarray(args[0]).reshape(-1)))
                return np.vectorize(lambda e: sp.Symbol(f"E{next(self.fresh)}"), otypes=[object])(args[0])
            if op == "maximum":
                a, b = np.broadcast_arrays(np.asarray(args[0], dtype=object), np.asarray(args[1], dtype=object))
                return np.where(self.rng.random(a.shape) < 0.5, a, b)
            if op in ("max", "min"):
                a = np.asarray(args[0], dtype=object)
                ax = attrs["axis"] % a.ndim
                idx = self.rng.integers(0, a.shape[ax], size=(*a.shape[:ax], 1, *a.shape[ax + 1:]))
                return np.take_along_axis(a, idx, axis=ax)
            if op == "tril_mask":
                return REF.apply(op, args, attrs, it, ot).astype(object)
            return REF.apply(op, args, attrs, it, ot)

    rng = np.random.default_rng(15)
    done, highest = 0, 0
    while done < 24:
        g = _random_program(rng)
        if g is None:
            continue
        done += 1
        ins = {str(t.name): np.array(sp.symbols(f"{t.name}_0:{math.prod(t.shape)}"), dtype=object).reshape(t.shape)
               for t in g.inputs}
        true = 0
        for rep in range(2):
            d = Sym(np.random.default_rng(rep))
            outs = run(g, ins, d)
            true = max(true, d.arg, *(_degree(sp, e) for o in outs for e in np.asarray(o, dtype=object).reshape(-1)))
        progs = [g, to_kernels(g)]
        if "tril_mask" not in str(g):  # (a mask alone is no kernel-level op the partitioner lowers)
            lows = lower_all(g, rank=pricing.cost, grids=[1, 2], franges=[1, 3], max_splits=4)[0]
            progs += [low.mugraph for low in lows[:4]]
        for p in progs:
            assert R.degree_bound(p)[0] >= true, (true, str(g), str(p))
        highest = max(highest, true)
    assert highest >= 3  # (the sample has programs whose degree the bound must count)


# --------------------------------------------------------------------------- the folded loop products


@pytest.mark.parametrize("shape", [(4, 300, 16), (3, 520, 40)])
def test_folded_loop_products_are_the_loop_held(shape: tuple[int, int, int]) -> None:
    pytest.importorskip("egglog")
    from verimirage.ir import interpret as I
    from verimirage.rewrite.partition import lower_all
    from verimirage.smt import ffref as R

    m, k, n = shape
    g = vm.Graph()
    x, w = g.input("X", (m, k), vm.float32), g.input("W", (k, n), vm.float32)
    g.output(g.add(g.matmul(x, w), g.matmul(g.exp(x), g.square(w))))
    fld = R.field_of(12345)
    ins = R.trial_inputs(g, fld, 12345)
    (want,), _ = R.evaluate(g, ins, fld)
    looped = 0
    for low in lower_all(g, rank=pricing.cost, grids=[1, 2], franges=[2, 3, 4], max_splits=4)[0]:
        (folded,), _ = R.evaluate(low.mugraph, ins, fld)
        orig = I._folded_products
        I._folded_products = lambda *a, **kw: {}  # (the loop, iteration by iteration)
        try:
            (plain,), _ = R.evaluate(low.mugraph, ins, fld)
        finally:
            I._folded_products = orig
        looped += "loop_sum" in str(low.mugraph)
        assert np.array_equal(folded[0], plain[0]) and np.array_equal(plain[0], want[0]), low.steps
    assert looped


# --------------------------------------------------------------------------- odd shapes through the kernels


@pytest.mark.parametrize("case", ["log_min_rows", "softmax_odd", "lse_cols", "rsqrt_matmul"])
def test_odd_shape_lowerings_match_float64_held(case: str) -> None:
    torch = pytest.importorskip("torch")
    from verimirage.rewrite.partition import lower_all

    f = vm.float32
    g = vm.Graph()
    x = g.input("X", (7, 37), f)
    if case == "log_min_rows":
        g.output(g.min(g.log(x), 0))
    elif case == "softmax_odd":
        e = g.exp(g.sub(g.tanh(x), g.max(g.tanh(x), 1)))
        g.output(g.div(e, g.sum(e, 1)))
    elif case == "lse_cols":
        g.output(g.log(g.sum(g.exp(g.reciprocal(x)), 0)))
    else:
        g.output(g.matmul(g.rsqrt(x), g.input("W", (37, 17), f)))
    rng = np.random.default_rng(3)
    ins = {str(t.name): rng.uniform(0.2, 2.0, t.shape) for t in g.inputs}
    want = vm.evaluate(g, ins)[0]
    lows = lower_all(g, rank=pricing.cost)[0][:3]
    assert lows
    for low in lows:
        got = vm.compile(low.mugraph)(**{k: torch.tensor(v, dtype=torch.float32) for k, v in ins.items()})
        np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


# --------------------------------------------------------------------------- the structural fp rules keep the corpus


def test_structural_fp_rules_keep_every_committed_candidate_held() -> None:
    from verimirage.pipeline.fpsafe import exp_reads, exps_of_sums, operand_sums

    pairs: list[tuple[str, list[str]]] = []
    for p in sorted(glob.glob(str(ROOT / "proofs" / "*.json"))
                    + glob.glob(str(ROOT / "benchmarks" / "**" / "*.json"), recursive=True)):
        try:
            d = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and isinstance(d.get("graph_text"), str) and isinstance(d.get("mugraph_text"), str):
            pairs.append((d["graph_text"], [d["mugraph_text"]]))
        if isinstance(d, dict) and isinstance(d.get("graph"), str) and isinstance(d.get("candidates"), list):
            pairs.append((d["graph"], [c["mugraph"] for c in d["candidates"] if isinstance(c, dict)]))
    checked = 0
    for gt, mts in pairs:
        g = vm.Graph.parse(gt)
        ops, sums = operand_sums(g)
        shifted = exps_of_sums(g)
        for mt in mts:
            mg = vm.MuGraph.parse(mt)
            checked += 1
            assert all(any(r == r2 and t2 <= t for r2, t2 in ops | sums) for r, t in operand_sums(mg)[0]), mt[:200]
            assert not shifted or (exps_of_sums(mg) and exp_reads(mg) <= exp_reads(g)), mt[:200]
    assert checked >= 400
