"""The float64 evaluator matches an independent torch computation on random well-formed graphs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import verimirage as vm

torch = pytest.importorskip("torch")
F = torch.nn.functional

UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": torch.exp,
    "silu": F.silu,
    "gelu": lambda t: F.gelu(t, approximate="tanh"),
    "relu": torch.relu,
    "sqrt": lambda t: torch.sqrt(t.abs() + 0.5),
    "rsqrt": lambda t: torch.rsqrt(t.abs() + 0.5),
    "square": torch.square,
    "neg": torch.neg,
}
BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 1.0),
}


@st.composite
def programs(draw: st.DrawFn) -> tuple[vm.Graph, dict[str, np.ndarray], list[Any]]:
    """A random graph, its inputs, and the torch float64 results of the same ops."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    g = vm.Graph()
    vals: list[tuple[Any, Any]] = []  # (graph tensor, torch tensor)
    inputs: dict[str, np.ndarray] = {}
    extra: list[tuple[Any, Any]] = []  # weights: inputs that are not candidates for operands
    for i in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
        a = rng.uniform(-1.5, 1.5, shape)
        inputs[f"x{i}"] = a
        vals.append((g.input(f"x{i}", shape, vm.float32), torch.tensor(a)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "matmul", "rms", "transpose", "concat", "scale"]))
        x, tx = vals[draw(st.integers(0, len(vals) - 1))]
        r = len(x.shape)
        if kind == "unary":
            name = draw(st.sampled_from(sorted(UNARY)))
            if name in ("sqrt", "rsqrt"):  # keep the operand positive the same way on both sides
                x = g.shift(g.relu(x) + g.relu(g.neg(x)), 0.5)
                tx = tx.abs() + 0.5
                vals.append((getattr(g, name)(x), torch.sqrt(tx) if name == "sqrt" else torch.rsqrt(tx)))
            else:
                vals.append((getattr(g, name)(x), UNARY[name](tx)))
        elif kind == "binary":
            y, ty = vals[draw(st.integers(0, len(vals) - 1))]
            try:
                np.broadcast_shapes(x.shape, y.shape)
            except ValueError:
                continue
            name = draw(st.sampled_from(sorted(BINARY)))
            if name == "div":
                den = g.shift(g.relu(y) + g.relu(g.neg(y)), 1.0)
                vals.append((g.div(x, den), BINARY[name](tx, ty)))
            else:
                vals.append((getattr(g, name)(x, y), BINARY[name](tx, ty)))
        elif kind == "reduce":
            ax = draw(st.integers(-r, r - 1))
            name = draw(st.sampled_from(["sum", "mean", "max"]))
            tr = {"sum": tx.sum(ax, keepdim=True), "mean": tx.mean(ax, keepdim=True),
                  "max": tx.amax(ax, keepdim=True)}[name]
            vals.append((getattr(g, name)(x, axis=ax), tr))
        elif kind == "matmul" and r >= 2:
            n = draw(st.integers(1, 4))
            name = f"w{len(inputs)}"
            w = rng.uniform(-1, 1, (x.shape[-1], n))
            inputs[name] = w
            wi = g.input(name, w.shape, vm.float32)
            extra.append((wi, torch.tensor(w)))
            vals.append((g.matmul(x, wi), tx @ torch.tensor(w)))
        elif kind == "rms":
            ax = draw(st.integers(0, r - 1))
            vals.append((g.rms_norm(x, axis=ax, eps=1e-3), tx * torch.rsqrt(tx.square().mean(ax, keepdim=True) + 1e-3)))
        elif kind == "transpose" and r >= 2:
            a, b = draw(st.integers(0, r - 1)), draw(st.integers(0, r - 1))
            vals.append((g.transpose(x, a, b), tx.transpose(a, b)))
        elif kind == "concat":
            ax = draw(st.integers(0, r - 1))
            vals.append((g.concat([x, g.exp(x)], axis=ax), torch.cat([tx, tx.exp()], ax)))
        elif kind == "scale":
            # constants are float32-representable: 0 or 1.2e-38 <= |c| <= 3.4e38 (verimirage.ir.limits)
            c = draw(st.floats(-3, 3, allow_nan=False).filter(lambda c: c == 0 or abs(c) >= 1e-30))
            vals.append((g.scale(x, c), tx * c))
    # outputs: the last value plus every input not otherwise used, so the graph is well formed
    g.output(vals[-1][0])
    want = [vals[-1][1]]
    live = g.live()
    for t, tt in vals + extra:
        if t.node.op == "input" and t.ref[0] not in live:
            g.output(g.scale(t, 2.0))
            want.append(tt * 2.0)
    return g, inputs, want


@given(programs())
def test_evaluate_matches_torch(p: tuple[vm.Graph, dict[str, np.ndarray], list[Any]]) -> None:
    g, inputs, want = p
    got = vm.evaluate(g, inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.float64
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)


@given(programs())
def test_text_and_json_round_trip(p: tuple[vm.Graph, dict[str, np.ndarray], list[Any]]) -> None:
    g, _, _ = p
    assert vm.Graph.parse(str(g)) == g
    assert vm.Graph.from_json(g.to_json()) == g
    assert str(vm.Graph.parse(str(g))) == str(g)


def test_evaluate_accepts_torch_inputs_and_mugraphs() -> None:
    g = vm.benchmarks.get("lora", small=True)
    mg = vm.benchmarks.expert("lora", g, **vm.benchmarks.small_design_kw("lora"))
    gen = torch.Generator().manual_seed(0)
    ins = {t.name: torch.randn(t.shape, generator=gen, dtype=torch.float16) for t in g.inputs}
    (a,) = vm.evaluate(g, ins)
    (b,) = vm.evaluate(mg, ins)
    x, w, aa, bb = (ins[k].double().numpy() for k in ("X", "W", "A", "B"))
    np.testing.assert_allclose(a, x @ w + (x @ aa) @ bb, rtol=1e-12)
    np.testing.assert_allclose(b, a, rtol=1e-12)
