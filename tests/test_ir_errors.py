"""Malformed programs raise vm.GraphError (and nothing else) with a message naming what was wrong."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir import BlockBuilder, TensorType


def _g() -> tuple[vm.Graph, object, object]:
    g = vm.Graph()
    return g, g.input("a", (4, 8), vm.float16), g.input("b", (8, 3), vm.float16)


CASES: dict[str, tuple[Callable[[], object], str]] = {}


def case(name: str, match: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    def deco(f: Callable[[], object]) -> Callable[[], object]:
        CASES[name] = (f, match)
        return f

    return deco


@case("matmul contraction mismatch", r"matmul: operands f16\[4,8\], f16\[4,8\]; expected the contraction dims")
def _mm():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.matmul(a, a)


@case("matmul rank 1", "rank >= 2")
def _mm1():  # type: ignore[no-untyped-def]
    g = vm.Graph()
    x = g.input("x", (4,), vm.float16)
    g.matmul(x, x)


@case("broadcast mismatch", r"add: operands f16\[4,8\], f16\[8,3\]; expected shapes that broadcast")
def _bc():  # type: ignore[no-untyped-def]
    g, a, b = _g()
    g.add(a, b)


@case("axis out of range", r"sum: operand f16\[4,8\] has no axis 2")
def _ax():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.sum(a, axis=2)


@case("axis not int", "axis must be an int")
def _axs():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.max(a, axis="1")  # type: ignore[arg-type]


@case("dtype mismatch", "one dtype")
def _dt():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    c = g.input("c", (4, 8), vm.float32)
    g.mul(a, c)


@case("bad dtype", "dtype")
def _bdt():  # type: ignore[no-untyped-def]
    vm.Graph().input("x", (2,), "float64")


@case("bad shape", "positive ints")
def _bsh():  # type: ignore[no-untyped-def]
    vm.Graph().input("x", (2, 0), vm.float16)


@case("duplicate input name", "already an input")
def _dup():  # type: ignore[no-untyped-def]
    g, _, _ = _g()
    assert g
    g.input("a", (1,), vm.float16)


@case("operand from another graph", "belongs to another graph")
def _other():  # type: ignore[no-untyped-def]
    _, a, _ = _g()
    h = vm.Graph()
    h.exp(a)


@case("output from another graph", "belongs to another graph")
def _other_out():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    vm.Graph().output(g.exp(a))


@case("operand not a tensor", "expected a Tensor")
def _nt():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.add(a, 1.0)  # type: ignore[arg-type]


@case("rms weight shape", r"weight of shape \(8,\)")
def _rw():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    w = g.input("w", (4,), vm.float16)
    g.rms_norm(a, w)


@case("concat mismatch", "equal sizes on every dim but the concat axis")
def _cc():  # type: ignore[no-untyped-def]
    g, a, b = _g()
    g.concat([a, b], axis=0)


@case("scale by non-number", "finite Python number")
def _sc():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.scale(a, float("nan"))


@case("unused input", "input 'b' is not used")
def _unused():  # type: ignore[no-untyped-def]
    g, a, _ = _g()
    g.output(g.exp(a))
    g.check()


@case("no outputs", "no outputs")
def _noout():  # type: ignore[no-untyped-def]
    g, _, _ = _g()
    g.check()


@case("missing input value", "missing input 'b'")
def _missing():  # type: ignore[no-untyped-def]
    g, a, b = _g()
    g.output(g.matmul(a, b))
    vm.evaluate(g, {"a": np.zeros((4, 8))})


@case("wrong input shape", r"'a' has shape \(8, 4\); expected \(4, 8\)")
def _wrongshape():  # type: ignore[no-untyped-def]
    g, a, b = _g()
    g.output(g.matmul(a, b))
    vm.evaluate(g, {"a": np.zeros((8, 4)), "b": np.zeros((8, 3))})


@case("cycle in text", "not an earlier node")
def _cycle():  # type: ignore[no-untyped-def]
    vm.Graph.parse(
        "graph {\n  %0 = input {name='x'} : f16[2]\n  %1 = add %0, %2 : f16[2]\n  %2 = exp %1 : f16[2]\n  return %2\n}"
    )


@case("wrong recorded type in text", "shape rule gives")
def _rec():  # type: ignore[no-untyped-def]
    vm.Graph.parse("graph {\n  %0 = input {name='x'} : f16[2,3]\n  %1 = sum %0 {axis=1} : f16[2,3]\n  return %1\n}")


@case("unknown op in text", "unknown op 'frobnicate'")
def _unk():  # type: ignore[no-untyped-def]
    vm.Graph.parse("graph {\n  %0 = input {name='x'} : f16[2]\n  %1 = frobnicate %0 : f16[2]\n  return %1\n}")


@case("truncated text", "unexpected end")
def _trunc():  # type: ignore[no-untyped-def]
    vm.Graph.parse("graph {\n  %0 = input {name='x'} : f16[2]\n")


@case("bad json", "not JSON")
def _json():  # type: ignore[no-untyped-def]
    vm.Graph.from_json("{nope")


@case("json wrong schema", "schema")
def _schema():  # type: ignore[no-untyped-def]
    vm.Graph.from_json('{"schema": "other/9"}')


@case("block partition does not divide", "does not divide into 3 blocks")
def _bdiv():  # type: ignore[no-untyped-def]
    b = BlockBuilder((3,), 1)
    b.input(0, TensorType((8, 4), vm.float16), (0,), None)


@case("block loop does not divide", "for-loop's 3 iterations")
def _fdiv():  # type: ignore[no-untyped-def]
    b = BlockBuilder((2,), 3)
    b.input(0, TensorType((8, 4), vm.float16), (0,), 1)


@case("omap not one dim per grid axis", "one distinct output dim per grid axis")
def _omap():  # type: ignore[no-untyped-def]
    b = BlockBuilder((2, 2), 1)
    x = b.input(0, TensorType((8, 4), vm.float16), (0, 1), None)
    b.output(b.exp(x), (0, 0))
    b.build()


@case("loop-body value as output", "not an accumulated result")
def _body_out():  # type: ignore[no-untyped-def]
    b = BlockBuilder((2,), 2)
    x = b.input(0, TensorType((8, 4), vm.float16), (0,), 1)
    b.output(b.exp(x), (0,))
    b.build()


@case("rescaled_sum without running max", "must be a running_max")
def _resc():  # type: ignore[no-untyped-def]
    b = BlockBuilder((2,), 2)
    x = b.input(0, TensorType((8, 4), vm.float16), (0,), 1)
    b.rescaled_sum(x, b.max(x, axis=1))


@case("custom operand shape mismatch", "expects operand 0 of shape")
def _cust():  # type: ignore[no-untyped-def]
    b = BlockBuilder((2,), 1)
    x = b.input(0, TensorType((8, 4), vm.float16), (0,), None)
    b.output(b.exp(x), (0,))
    mg = vm.MuGraph()
    y = mg.input("y", (8, 8), vm.float16)
    mg.custom(b.build(), [y])


@case("custom in a plain graph text", "allowed in a MuGraph only")
def _cust_plain():  # type: ignore[no-untyped-def]
    g = vm.benchmarks.get("ntrans", small=True)
    text = str(vm.benchmarks.expert("ntrans", g)).replace("mugraph {", "graph {", 1)
    vm.Graph.parse(text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_raises_graph_error(name: str) -> None:
    f, match = CASES[name]
    with pytest.raises(vm.GraphError, match=match):
        f()


def test_graph_error_is_a_value_error_only() -> None:
    assert issubclass(vm.GraphError, ValueError)


def test_check_error_shows_node_in_text_form() -> None:
    with pytest.raises(vm.GraphError) as ei:
        vm.Graph.parse("graph {\n  %0 = input {name='x'} : f16[2,3]\n  %1 = sum %0 {axis=1} : f16[2,3]\n  return %1\n}")
    assert "%1 = sum %0 {axis=1} : f16[2,3]" in str(ei.value)
    assert "%0 = input {name='x'}" in str(ei.value)
