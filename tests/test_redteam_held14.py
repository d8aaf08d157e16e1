"""Red team (fourteenth session): attacks on what the thirteenth session landed that held, kept as tests so they keep
holding. Kernels run in Triton's interpreter against float64 (``vm.evaluate``).

* The weight-side norm prologue (``stabilise.norm_into_projections``, ``_weight_to_the_right``,
  ``scale_weight_tiles``, since the sixteenth session ``prologue_norm_scales``): a transposed weight, batched
  products, one norm weight shared by two norms, the norm also
  an output, its weight also read elsewhere, a computed weight matrix; fp16, bf16, fp32; weights of -300 and 0
  mixed with ordinary ones, all zero, all -50 times, 1e-3 times, activations zero on every third column: every
  scaled lowering (3 per case, 18 cases) proved and within a few times the source's own error of float64 (the
  flush of tiny weights beside a huge one was a finding: ``test_redteam_session14.py``).
* Merged launches (``VERIMIRAGE_MERGE=1``): 210 random programs (elementwise, matmuls, reductions, reshapes that
  become views, transposes, slices, several outputs, outputs read by later kernels), three lowerings each: the
  interpreter's results match float64; so do 40 each as one persistent launch (``VERIMIRAGE_PERSISTENT=plain``,
  one block in the interpreter) and with last-block programs (``VERIMIRAGE_LASTBLOCK=1``); a sample is kept here.
* The floating-point check on 27 small programs (norms, softmax, logsumexp, activations, scaled products) in fp16
  and bf16: no lowering and no search candidate rejected; ``out=`` tensors aliasing an input are computed apart
  and copied; wrong inputs to a compiled program get clear errors.
* ``Graph.from_json`` and the text parser on 7,000 mutated committed μGraphs: only GraphError.
* The certificate checker on 1,100 mutated committed certificates (plain and composed; field types, deleted and
  duplicated entries, texts edited with their hashes recomputed): never an exception, never Proved for changed
  programs; a sample is kept here.
* The finite-field degree model after 6ff02fe (``ffref.quotient_info`` alone): sums, products and matmuls of
  quotients, merged / broadcast / permuted quotients, where, concat, reciprocal of a sum, exp of a sum of
  quotients, on the program, its kernels and its lowerings: never below the sympy degree (max along an axis was
  a finding: ``test_redteam_session14.py``).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.pipeline import pricing

ROOT = Path(__file__).resolve().parent.parent


def _norm_cases(dt: vm.DType) -> dict[str, vm.Graph]:
    out = {}
    g = vm.Graph()
    x, w, wt = g.input("X", (4, 48), dt), g.input("G", (48,), dt), g.input("WT", (32, 48), dt)
    g.output(g.matmul(g.rms_norm(x, w, eps=1e-5), g.transpose(wt, 0, 1)))
    out["transposed"] = g
    g = vm.Graph()
    x, y, w = g.input("X", (4, 64), dt), g.input("Y", (4, 64), dt), g.input("G", (64,), dt)
    m, v = g.input("W", (64, 16), dt), g.input("V", (64, 16), dt)
    g.output(g.add(g.matmul(g.rms_norm(x, w, eps=1e-5), m), g.matmul(g.rms_norm(y, w, eps=1e-5), v)))
    out["shared_weight"] = g
    g = vm.Graph()
    x, w, m = g.input("X", (4, 64), dt), g.input("G", (64,), dt), g.input("W", (64, 16), dt)
    h = g.rms_norm(x, w, eps=1e-5)
    g.output(g.matmul(h, m), h)
    out["norm_also_output"] = g
    return out


@pytest.mark.parametrize("dt", [vm.float16, vm.bfloat16])
def test_scaled_weight_tiles_match_float64_on_extreme_norm_weights(dt: vm.DType) -> None:
    torch = pytest.importorskip("torch")
    from verimirage.pipeline.fpsafe import evaluate_in_dtype
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import norm_into_projections

    tdt = torch.float16 if dt is vm.float16 else torch.bfloat16
    rng = np.random.default_rng(1)
    for name, g in _norm_cases(dt).items():
        gn = norm_into_projections(g)
        assert gn is not None, name
        low = next(lw.mugraph for lw in lower_all(gn, rank=pricing.cost)[0]
                   if "partition.prologue_norm_scales" in lw.steps and lw.mugraph.num_kernels == 1)
        assert " sqrt " in str(low) and isinstance(vm.verify(g, low), vm.Proved), name
        fn = vm.compile(low)
        for kind in ("mixed", "zero", "negative", "tiny"):
            ins = {}
            for t in g.inputs:
                v = rng.uniform(-1, 1, t.shape)
                if str(t.name) == "G":
                    v = {"mixed": rng.uniform(0.5, 1.5, t.shape), "zero": np.zeros(t.shape),
                         "negative": -50 * rng.uniform(0.5, 1.5, t.shape), "tiny": 1e-3 * rng.uniform(0.5, 1.5, t.shape)
                         }[kind]
                    if kind == "mixed":
                        v[::3], v[1::5] = -300.0, 0.0
                elif str(t.name) in ("X", "Y"):
                    v[..., ::3] = 0.0
                ins[str(t.name)] = torch.tensor(v, dtype=tdt).double().numpy()
            want = vm.evaluate(g, ins)
            src, _ = evaluate_in_dtype(g, ins)
            outs = fn(*(torch.tensor(ins[str(t.name)], dtype=tdt) for t in g.inputs))
            outs = outs if isinstance(outs, (tuple, list)) else [outs]
            for o, w_, s_ in zip(outs, want, src, strict=True):
                got = o.double().numpy()
                scale = np.abs(w_).max() + 1e-30
                assert np.isfinite(got).all(), (name, kind)
                err, src_err = np.abs(got - w_).max() / scale, np.abs(s_ - w_).max() / scale
                assert err <= max(4 * src_err, 2e-3), (name, kind, err, src_err)


def _random_program(rng: random.Random) -> vm.Graph | None:
    g = vm.Graph()
    dt = rng.choice([vm.float32, vm.float16])
    vals = [g.input("A", (4, 8), dt), g.input("B", (4, 8), dt), g.input("C", (8, 4), dt)]
    for _ in range(rng.randint(3, 8)):
        x = rng.choice(vals)
        r = rng.random()
        try:
            if r < 0.3:
                same = [v for v in vals if v.shape == x.shape]
                y = (g.add if r < 0.2 else g.mul)(x, rng.choice(same))
            elif r < 0.4:
                y = g.exp(g.scale(x, 0.1)) if rng.random() < 0.5 else g.relu(x)
            elif r < 0.5 and len(x.shape) == 2:
                y = g.reshape(x, (x.shape[1], x.shape[0]))
            elif r < 0.6 and len(x.shape) == 2:
                y = g.transpose(x, 0, 1)
            elif r < 0.7 and len(x.shape) == 2:
                y = g.sum(x, axis=rng.choice([0, 1]))
            elif r < 0.85 and len(x.shape) == 2:
                ms = [v for v in vals if len(v.shape) == 2 and v.shape[0] == x.shape[1]]
                if not ms:
                    continue
                y = g.matmul(x, rng.choice(ms))
            elif x.shape[0] > 1:
                y = g.slice(x, 0, 1, x.shape[0])
            else:
                continue
        except vm.GraphError:
            continue
        vals.append(y)
    g.output(vals[-1], *rng.sample(vals[3:-1], min(2, len(vals) - 4)))
    try:
        g.check()
    except vm.GraphError:
        return None
    return g


@pytest.mark.parametrize(("env", "value"), [("VERIMIRAGE_MERGE", "1"), ("VERIMIRAGE_PERSISTENT", "plain"),
                                            ("VERIMIRAGE_LASTBLOCK", "1")])
def test_merged_launches_of_random_programs_match_float64(monkeypatch: pytest.MonkeyPatch, env: str,
                                                          value: str) -> None:
    torch = pytest.importorskip("torch")
    from verimirage.rewrite.partition import lower_all

    monkeypatch.setenv(env, value)
    rng = random.Random(14)
    merged = checked = 0
    while checked < (12 if env == "VERIMIRAGE_MERGE" else 6):
        g = _random_program(rng)
        if g is None:
            continue
        lows = lower_all(g, rank=pricing.cost)[0]
        tdt = torch.float16 if g.inputs[0].dtype is vm.float16 else torch.float32
        ins = {str(t.name): torch.tensor(np.random.default_rng(checked).standard_normal(t.shape), dtype=tdt)
               for t in g.inputs}
        want = vm.evaluate(g, {k: v.double().numpy() for k, v in ins.items()})
        for low in [lows[0], *rng.sample(lows[1:], min(2, len(lows) - 1))]:
            try:
                fn = vm.compile(low.mugraph)
            except vm.GraphError as e:  # (a reshape of padded non-power-of-two tiles: a clear refusal)
                assert "power" in str(e)
                continue
            merged += any(k.members and len(k.members) > 1 for k in fn.kernels) or (
                env == "VERIMIRAGE_PERSISTENT" and len(fn.kernels) < low.mugraph.num_kernels)
            outs = fn(**ins)
            outs = outs if isinstance(outs, (tuple, list)) else [outs]
            for o, w in zip(outs, want, strict=True):
                tol = 3e-3 if tdt is torch.float16 else 1e-5
                assert np.abs(o.double().numpy() - w).max() <= tol * (np.abs(w).max() + 1e-9), str(low.mugraph)
        checked += 1
    assert merged > 0 or env == "VERIMIRAGE_LASTBLOCK"  # (some launch did merge kernels)


def _mutate(o: object, rng: random.Random) -> object:
    vals: list[object] = [0, -1, 1, 3, 2**62, -2**40, 1.5, "x", None, [], [0], {}, True, "f16", float("nan")]
    if isinstance(o, dict):
        o = dict(o)
        if o and rng.random() < 0.6:
            k = rng.choice(list(o))
            r = rng.random()
            if r < 0.1:
                del o[k]
            else:
                o[k] = rng.choice(vals) if r < 0.4 else _mutate(o[k], rng)
        return o
    if isinstance(o, list):
        o = list(o)
        if o and rng.random() < 0.6:
            i = rng.randrange(len(o))
            o[i] = rng.choice(vals) if rng.random() < 0.4 else _mutate(o[i], rng)
        elif o:
            o.append(o[-1])
        return o
    if isinstance(o, bool):
        return not o
    if isinstance(o, int):
        return rng.choice([0, -1, o + 1, o - 1, 2**70, 2 * o])
    if isinstance(o, str):
        if len(o) > 40 and rng.random() < 0.7:
            i = rng.randrange(len(o))
            return o[:i] + rng.choice(["0", "1", "f32", "-", "x", ""]) + o[i + 1:]
        return rng.choice([o, o + "x", "", "f32"])
    return o


def test_mutated_program_json_and_text_raise_only_graph_errors() -> None:
    from verimirage.ir.serial import from_json, to_json

    texts = [json.loads((ROOT / "proofs" / f).read_text())["mugraph_text"] for f in ("lora_bs1.json",
                                                                                    "ntrans_bs1.json")]
    rng = random.Random(14)
    for _ in range(150):
        d = json.loads(to_json(vm.MuGraph.parse(rng.choice(texts))))
        for _ in range(rng.randint(1, 3)):
            d = _mutate(d, rng)  # type: ignore[assignment]
        try:
            g = from_json(json.dumps(d))
            vm.MuGraph.parse(str(g)) if isinstance(g, vm.MuGraph) else vm.Graph.parse(str(g))
        except vm.GraphError:
            pass
        text = rng.choice(texts)
        i = rng.randrange(len(text))
        with contextlib.suppress(vm.GraphError):
            vm.MuGraph.parse(text[:i] + rng.choice(["0", "-1", "(", ")", "f32", "", "99999999999"]) + text[i + 1:])


@pytest.mark.parametrize(("name", "tries"), [("ntrans_bs1.json", 40), ("layer_decode_bs1_small.json", 8)])
def test_mutated_certificates_are_rejected_never_a_crash_or_proved(name: str, tries: int) -> None:
    from verimirage.smt.certificate import check_text, sha256

    d0 = json.loads((ROOT / "proofs" / name).read_text())
    rng = random.Random(14)
    for _ in range(tries):
        d = _mutate(copy.deepcopy(d0), rng)
        if isinstance(d, dict) and rng.random() < 0.5:  # the texts' hashes made to match
            for k in ("graph", "mugraph"):
                if isinstance(d.get(f"{k}_text"), str):
                    d[f"{k}_sha256"] = sha256(d[f"{k}_text"])
        v = check_text(json.dumps(d))  # (never raises)
        if v.proved:
            assert isinstance(d, dict) and d.get("graph_text") == d0["graph_text"]
            assert d.get("mugraph_text") == d0["mugraph_text"] and d.get("certificates") == d0.get("certificates")


# --------------------------------------------------------------------------- the finite-field degree model (issue 24)
# After 6ff02fe (one degree model: ffref.quotient_info alone) each case's sympy degree (numerator and denominator
# over the common denominator, every exp application a fresh symbol, exp arguments' degrees too) was never above
# ffref.degree_bound of the program, its kernels and its lowerings (with grid splits and for-loops); nor on 250
# random rational / exp / max programs (max and maximum as any fixed pick). Max along an axis was a finding
# (test_redteam_session14.py).


def _degree_cases(k: int) -> dict[str, Any]:
    f = vm.float32

    def new(*shapes: tuple[int, ...]) -> tuple[vm.Graph, list[Any]]:
        g = vm.Graph()
        return g, [g.input(n, s, f) for n, s in zip("xyzwm", shapes, strict=False)]

    def matmul_of_quotients() -> vm.Graph:  # classes along the contracted dim on both sides: k denominators
        g, (x, y, z, w) = new((2, k), (1, k), (k, 2), (k, 1))
        g.output(g.matmul(g.div(x, y), g.div(z, w)))
        return g

    def merged_then_summed() -> vm.Graph:  # (k, 2) quotients by row, merged into one axis, then a sum
        g, (x, y) = new((k, 2), (k, 1))
        g.output(g.sum(g.reshape(g.div(x, y), (1, 2 * k)), 1))
        return g

    def broadcast_permuted_summed() -> vm.Graph:
        g, (x, y) = new((1, k), (1, k))
        q = g.broadcast_to(g.div(x, y), (2, k))
        g.output(g.sum(g.permute(q, (1, 0)), 0))
        return g

    def where_of_quotients_summed() -> vm.Graph:  # m a + (1 - m) b, each with its own denominator per element
        g, (x, y, z, w) = new((1, k), (1, k), (1, k), (1, k))
        m = g.input("m", (1, k), vm.bool)
        g.output(g.sum(g.where(m, g.div(x, y), g.div(z, w)), 1))
        return g

    def concat_of_quotients_summed() -> vm.Graph:
        g, (x, y, z, w) = new((1, k), (1, k), (1, k), (1, 1))
        g.output(g.sum(g.concat([g.div(x, y), g.div(z, w)], 1), 1))
        return g

    def exp_of_a_sum_of_quotients() -> vm.Graph:  # the atom's argument: degree k; the result: 1 + ...
        g, (x, y, z) = new((1, k), (1, k), (1, 1))
        g.output(g.mul(g.exp(g.sum(g.div(x, y), 1)), z))
        return g

    def reciprocal_of_a_sum_then_summed() -> vm.Graph:  # 1 / sum_j x_j / y_j, then summed with another quotient
        g, (x, y, z) = new((2, k), (2, k), (2, 1))
        r = g.reciprocal(g.sum(g.div(x, y), 1))
        g.output(g.sum(g.add(r, g.div(z, g.square(z))), 0))
        return g

    def mean_of_squares_of_quotients() -> vm.Graph:
        g, (x, y) = new((1, k), (1, k))
        g.output(g.mean(g.square(g.div(x, y)), 1))
        return g

    return {fn.__name__: fn for fn in (matmul_of_quotients, merged_then_summed, broadcast_permuted_summed,
                                       where_of_quotients_summed, concat_of_quotients_summed,
                                       exp_of_a_sum_of_quotients, reciprocal_of_a_sum_then_summed,
                                       mean_of_squares_of_quotients)}


@pytest.mark.parametrize("name", sorted(_degree_cases(3)))
def test_degree_bound_is_above_the_sympy_degree_held(name: str) -> None:
    sp = pytest.importorskip("sympy")
    pytest.importorskip("egglog")
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.interpret import run
    from verimirage.ir.reference import REF
    from verimirage.rewrite.partition import lower_all
    from verimirage.smt import ffref as R

    fresh, arg_degree = itertools.count(), [0]

    def degree(e: Any) -> int:
        gens = sorted(sp.sympify(e).free_symbols, key=str) or [sp.Symbol("z")]
        num, den = sp.fraction(sp.cancel(sp.together(e)))
        return max(sp.Poly(p, *gens).total_degree() for p in (num, den))

    class Sym:  # the field's where and reciprocal; every exp application a fresh symbol
        name = "ref"

        def apply(self, op: str, args: list[Any], attrs: dict[str, Any], it: Any, ot: Any) -> Any:
            if op == "where":
                return args[0] * args[1] + (1 - args[0]) * args[2]
            if op == "reciprocal":
                return np.vectorize(lambda e: sp.Integer(1) / e, otypes=[object])(args[0])
            if op == "exp":
                arg_degree[0] = max(arg_degree[0], *(degree(e) for e in np.asarray(args[0]).reshape(-1)))
                return np.vectorize(lambda e: sp.Symbol(f"E{next(fresh)}"), otypes=[object])(args[0])
            return REF.apply(op, args, attrs, it, ot)

    g = _degree_cases(3)[name]()
    ins = {str(t.name): np.array(sp.symbols(f"{t.name}_0:{math.prod(t.shape)}"), dtype=object).reshape(t.shape)
           for t in g.inputs}
    true = max(degree(e) for o in run(g, ins, Sym()) for e in np.asarray(o, dtype=object).reshape(-1))
    true = max(true, arg_degree[0])
    assert true >= 3  # (every case is a sum or product over the 3 classes: the bound has something to count)
    lows = [low.mugraph for low in lower_all(g, grids=[1, 2], franges=[1, 3], max_splits=4, rank=pricing.cost)[0][:4]]
    for p in (g, to_kernels(g), *lows):
        assert R.degree_bound(p)[0] >= true, (name, true, str(p))
