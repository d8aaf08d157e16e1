"""Malformed programs raise vm.GraphError (and nothing else) with a message naming what was wrong."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir import BlockBuilder, BlockGraph, TensorType


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


@case("scale by non-number", "not a finite float32 number")
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


@case("cycle in text", "no earlier node")
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


def _tailed() -> tuple[vm.MuGraph, BlockGraph, Any]:
    mg = vm.MuGraph()
    x = mg.input("x", (7, 4), vm.float16)
    b = BlockBuilder((2,), 1)  # (a masked tail: 2 blocks of 4 rows over 7)
    b.output(b.exp(b.input(0, x.type, (0,), None)), (0,))
    return mg, b.build(), x


@case("masked tail: a result larger than its whole tiles", "the block graph gives")
def _crop_big():  # type: ignore[no-untyped-def]
    mg, bg, x = _tailed()
    mg.custom(bg, [x], [(9, 4)])


@case("masked tail: a result cropped along a dim no grid axis walks", "smaller along a dim the grid walks")
def _crop_unwalked():  # type: ignore[no-untyped-def]
    mg, bg, x = _tailed()
    mg.custom(bg, [x], [(7, 3)])


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


# --------------------------------------------------------------------------- issue 24, finding 6: malformed input
# Every malformed program is a GraphError naming what was wrong, from the builder, Graph.parse,
# Graph.from_json and block-graph text alike; sizes are bounded before anything is allocated.


def _exp_graph(shape: tuple[int, ...] = (4,)) -> vm.Graph:
    g = vm.Graph()
    g.output(g.exp(g.input("x", shape, vm.float32)))
    return g


def _json_with_shape(shape: list[int]) -> str:
    d = json.loads(_exp_graph().to_json())
    for n in d["nodes"]:
        n["outs"][0]["shape"] = shape
    return json.dumps(d)


def _text_with_shape(shape: str) -> str:
    return str(_exp_graph()).replace("[4]", f"[{shape}]")


def test_negative_dim_in_json_is_graph_error() -> None:
    with pytest.raises(vm.GraphError, match=r"shape \(-4,\); expected a tuple of positive ints"):
        vm.Graph.from_json(_json_with_shape([-4]))


@pytest.mark.parametrize("source", ["builder", "text", "json"])
def test_zero_size_input_is_graph_error(source: str) -> None:
    with pytest.raises(vm.GraphError, match="positive ints"):
        if source == "builder":
            _exp_graph((4, 0))
        elif source == "text":
            vm.Graph.parse(_text_with_shape("4,0"))
        else:
            vm.Graph.from_json(_json_with_shape([4, 0]))


@pytest.mark.parametrize("source", ["builder", "text", "json"])
def test_rank0_input_is_graph_error(source: str) -> None:
    with pytest.raises(vm.GraphError, match=r"rank-0 tensors are not supported"):
        if source == "builder":
            _exp_graph(())
        elif source == "text":
            vm.Graph.parse(_text_with_shape(""))
        else:
            vm.Graph.from_json(_json_with_shape([]))


@pytest.mark.parametrize("c", [10**400, -(10**400), float("inf"), float("nan"), 1e39, 1e-300])
def test_overflowing_constant_is_graph_error(c: object) -> None:
    g = vm.Graph()
    x = g.input("x", (4,), vm.float32)
    with pytest.raises(vm.GraphError, match="float32"):
        g.scale(x, c)  # type: ignore[arg-type]
    with pytest.raises(vm.GraphError, match="float32"):
        g.shift(x, c)  # type: ignore[arg-type]
    with pytest.raises(vm.GraphError, match=r"float32|negative"):
        g.rms_norm(x, eps=c)  # type: ignore[arg-type]
    for op, attrs in (("pow", {"c": c}), ("leaky_relu", {"slope": c}), ("clamp", {"lo": c, "hi": 1.0})):
        with pytest.raises(vm.GraphError, match="float32"):
            g.apply(op, [x], attrs)


def test_representable_constants_still_build() -> None:
    g = vm.Graph()
    x = g.input("x", (4,), vm.float32)
    y = g.shift(g.scale(x, 3), -1e9)
    g.output(g.scale(y, 0.0))
    assert vm.Graph.parse(str(g)) == g


@pytest.mark.parametrize("literal", ["1e400", "10**400", "1" + "0" * 400, "1e-320"])
def test_overflowing_constant_in_text_and_json_is_graph_error(literal: str) -> None:
    g = vm.Graph()
    g.output(g.scale(g.input("x", (4,), vm.float32), 2.0))
    with pytest.raises(vm.GraphError):
        vm.Graph.parse(str(g).replace("c=2.0", f"c={literal}"))
    d = json.loads(g.to_json())
    d["nodes"][1]["attrs"]["c"] = {"float": literal} if "*" not in literal else literal
    with pytest.raises(vm.GraphError):
        vm.Graph.from_json(json.dumps(d))
    d["nodes"][1]["attrs"]["c"] = 10**400  # a JSON integer
    with pytest.raises(vm.GraphError, match="float32"):
        vm.Graph.from_json(json.dumps(d))


def _mugraph_text() -> str:
    return str(vm.benchmarks.expert("ntrans", vm.benchmarks.get("ntrans", small=True)))


@pytest.mark.parametrize("grid", ["None", "'x'", "(0,)", "(1, 2, 3, 4)", "(True,)", "2"])
def test_grid_none_in_text_is_graph_error(grid: str) -> None:
    text = _mugraph_text()
    assert "grid=(" in text
    bad = re.sub(r"grid=\([^)]*\)", f"grid={grid}", text, count=1)
    with pytest.raises(vm.GraphError, match="grid"):
        vm.MuGraph.parse(bad)


@pytest.mark.parametrize("frange", ["None", "0", "1.5", "'a'"])
def test_bad_frange_in_text_is_graph_error(frange: str) -> None:
    bad = re.sub(r"frange=\d+", f"frange={frange}", _mugraph_text(), count=1)
    with pytest.raises(vm.GraphError, match="frange"):
        vm.MuGraph.parse(bad)


@pytest.mark.parametrize("mutate", ["omap-none", "imap-str", "shape-neg", "block-shape-huge", "nodes-not-list",
                                    "attrs-list", "dtype", "outputs"])
def test_malformed_mugraph_json_is_graph_error(mutate: str) -> None:
    mg = vm.benchmarks.expert("ntrans", vm.benchmarks.get("ntrans", small=True))
    d = json.loads(mg.to_json())
    custom = next(n for n in d["nodes"] if n["op"] == "custom")
    block = custom["attrs"]["block"]["block"]
    binput = next(n for n in block["nodes"] if n["op"] == "input")
    if mutate == "omap-none":
        block["omaps"] = [None]
    elif mutate == "imap-str":
        binput["attrs"]["imap"] = {"tuple": ["a"]}
    elif mutate == "shape-neg":
        binput["attrs"]["shape"] = {"tuple": [-1, 2]}
    elif mutate == "block-shape-huge":
        binput["attrs"]["shape"] = {"tuple": [2**40, 2**10]}
    elif mutate == "nodes-not-list":
        block["nodes"] = 5
    elif mutate == "attrs-list":
        custom["attrs"] = []
    elif mutate == "dtype":
        d["nodes"][0]["outs"][0]["dtype"] = "f64"
    else:
        d["outputs"] = [[99, 0]]
    with pytest.raises(vm.GraphError):
        vm.MuGraph.from_json(json.dumps(d))


def test_huge_input_is_graph_error_before_allocating() -> None:
    """(2**40,) once made verify try to allocate 8 TiB; now every entry point refuses it up front."""
    with pytest.raises(vm.GraphError, match=r"at most 17179869184 \(2\*\*34\)"):
        _exp_graph((2**40,))
    with pytest.raises(vm.GraphError, match="2\\*\\*34"):
        vm.Graph.from_json(_json_with_shape([2**40]))
    with pytest.raises(vm.GraphError, match="2\\*\\*34"):
        vm.Graph.parse(_text_with_shape(str(2**40)))
    # broadcasting two legal operands to an oversized result
    g = vm.Graph()
    a = g.input("a", (2**20, 1), vm.float16)
    b = g.input("b", (1, 2**20), vm.float16)
    with pytest.raises(vm.GraphError, match="add: result"):
        g.add(a, b)


def test_tensor_too_big_to_evaluate_is_graph_error() -> None:
    """Legal for the IR (< 2**34 elements) but beyond what the evaluator/verifier hold: refused first."""
    g = _exp_graph((2**31,))
    with pytest.raises(vm.GraphError, match=r"evaluate: .*2\*\*30"):
        vm.evaluate(g, {"x": np.zeros(1, dtype=np.float32)})
    with pytest.raises(vm.GraphError, match=r"verify: .*2\*\*30"):
        vm.verify(g, g)
    with pytest.raises(vm.GraphError, match=r"superoptimize: .*2\*\*30"):
        vm.superoptimize(g, cache=False)
    with pytest.raises(vm.GraphError, match=r"testing.inputs: .*2\*\*30"):
        vm.testing.inputs(g)


def test_block_graph_blocks_count_toward_the_evaluation_bound() -> None:
    from verimirage.ir.reference import MAX_EVAL_ELEMENTS, check_evaluable

    assert MAX_EVAL_ELEMENTS == 2**30
    mg = vm.MuGraph()
    xin = mg.input("x", (1024, 8), vm.float16)
    b2 = BlockBuilder((1024,), 1)
    t = b2.input(0, TensorType((1024, 8), vm.float16), (None,), None)  # every block reads all of x
    b2.output(b2.exp(b2.exp(t)), (0,))
    (out,) = mg.custom(b2.build(), [xin])
    mg.output(out)
    check_evaluable(mg, "evaluate")  # 1024 blocks x 8192 elements = 2**23: fine
    b3 = BlockBuilder((256, 256), 1)
    t3 = b3.input(0, TensorType((1024, 32), vm.float16), (None, None), None)  # every block reads all of x
    b3.output(b3.sum(b3.exp(t3), axis=0), (0, 1))
    mg3 = vm.MuGraph()
    x3 = mg3.input("x", (1024, 32), vm.float16)
    (o3,) = mg3.custom(b3.build(), [x3])  # result (256, 8192): small; the exp tiles of all blocks: 2**31
    mg3.output(o3)
    assert o3.shape == (256, 8192)
    with pytest.raises(vm.GraphError, match=r"x 65536 block\(s\)"):
        check_evaluable(mg3, "evaluate")


@pytest.mark.parametrize("shape", [(-4,), (0,), ()])
def test_bad_shapes_rejected_at_every_entry_point(shape: tuple[int, ...]) -> None:
    """A program that bypassed the builder and the readers is still refused by evaluate/verify/superoptimize."""
    from verimirage.ir.graph import Node
    from verimirage.ir.ops import TensorType as TT

    t = TT(shape, vm.float32)
    g = vm.Graph._from_parts([Node("input", (), (("name", "x"),), (t,)), Node("exp", ((0, 0),), (), (t,))],
                             [(1, 0)])
    with pytest.raises(vm.GraphError, match="shape"):
        vm.evaluate(g, {"x": np.zeros(4, dtype=np.float32)})
    with pytest.raises(vm.GraphError, match="shape"):
        vm.verify(g, g)
    with pytest.raises(vm.GraphError, match="shape"):
        vm.superoptimize(g, cache=False)
    with pytest.raises(vm.GraphError, match="shape"):
        vm.MuGraph.from_graph(g).check()


def test_deeply_nested_text_and_json_are_graph_errors() -> None:
    with pytest.raises(vm.GraphError, match="from_json"):
        vm.Graph.from_json("[" * 100000 + "]" * 100000)
    with pytest.raises(vm.GraphError, match="bad attributes"):
        vm.Graph.parse("graph {\n  %0 = input {name='x'} : f32[4]\n  %1 = scale %0 {c=" + "-" * 100000
                       + "1.0} : f32[4]\n  return %1\n}")
    with pytest.raises(vm.GraphError, match="bad attributes"):
        vm.Graph.parse("graph {\n  %0 = input {name=" + "(" * 5000 + "'x'" + ")" * 5000 + "} : f32[4]\n  return %0\n}")



def test_text_parser_used_assert_and_warned_on_malformed_attributes() -> None:
    """The attribute parser checked 'one call of keywords' with an ``assert`` (gone under ``python -O``: a positional
    attribute was then dropped silently) and let Python warn (SyntaxWarning; DeprecationWarning on 3.11) of an invalid
    escape in a string attribute, accepting it. Each is a GraphError naming the line, under -O and with warnings as
    errors alike."""
    import subprocess
    import sys
    from pathlib import Path

    code = r"""
import verimirage as vm
for attrs in ["1, name='x'", "name='x'), g(2", "name='x', z='\\d'"]:
    try:
        vm.Graph.parse("graph {\n  %0 = input {" + attrs + "} : f32[4]\n  return %0\n}")
        print("accepted", attrs)
    except vm.GraphError as e:
        print(str(e).splitlines()[0])
"""
    root = Path(__file__).resolve().parent.parent
    for flags in (["-O"], ["-W", "error"]):
        r = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
        assert r.returncode == 0 and "Warning" not in r.stderr, (flags, r.stderr[-2000:])
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 3 and all(ln.startswith("parse: line 2: bad attributes {") for ln in lines), (flags, lines)

_JUNK = [None, -1, 0, 1, "x", 1e400, [], {}, 2**70, True, 1.5, [1], [-3, 2], {"tuple": [None]}, {"float": "nan"},
         {"float": "1e999"}, {"tuple": [-1]}, {"block": {}}, "f16", [[0, 0]], {"tuple": []}]
_TOKENS = ["None", "-1", "0", "()", "(0,)", "1e400", "'x'", "%99", "f16[]", "f16[0]", "{", "}", "10**40", "[1,2]",
           "(None,)", "grid=None", "frange=0", "omap=None", "(2**40,)", "True"]


def _leaf_paths(o: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [path] if path else []
    if isinstance(o, dict):
        for k, v in o.items():
            out += _leaf_paths(v, (*path, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            out += _leaf_paths(v, (*path, i))
    return out


def test_mutated_programs_raise_only_graph_error() -> None:
    """Seeded fuzz: random edits of program text and JSON, and random builder calls, never leak another error."""
    import random

    from verimirage.ir.ops import OPS, Level

    rng = random.Random(0)
    progs: list[vm.Graph] = [vm.benchmarks.get("gated_mlp", small=True), vm.benchmarks.get("lora", small=True)]
    progs.append(vm.benchmarks.expert("ntrans", vm.benchmarks.get("ntrans", small=True)))
    for _ in range(300):
        p = rng.choice(progs)
        cls = vm.MuGraph if isinstance(p, vm.MuGraph) else vm.Graph
        try:
            if rng.random() < 0.5:
                d = json.loads(p.to_json())
                *where, last = rng.choice(_leaf_paths(d))
                o: object = d
                for k in where:
                    o = o[k]  # type: ignore[index]
                o[last] = rng.choice(_JUNK)  # type: ignore[index]
                cls.from_json(json.dumps(d))
            else:
                toks = str(p).split(" ")
                toks[rng.randrange(len(toks))] = rng.choice(_TOKENS)
                cls.parse(" ".join(toks))
        except vm.GraphError:
            pass
    vals = [None, -1, 0, 2, "x", 1e400, 10**400, (), (0,), (2**40,), True, float("nan"), (1, None), 2**70, object()]
    ops = [o for o in OPS.values() if o.levels & Level.KERNEL and o.name not in ("input", "custom")]
    for _ in range(300):
        g = vm.Graph()
        xs = [g.input("a", (4, 8), vm.float16), g.input("b", (8, 4), vm.float16), g.input("c", (1, 8), vm.float16)]
        op = rng.choice(ops)
        n = op.arity if op.arity is not None else rng.randint(0, 3)
        args = [rng.choice([*xs, None]) for _ in range(n)]
        with contextlib.suppress(vm.GraphError):
            g.apply(op.name, args, {k: rng.choice(vals) for k in op.attrs})


def test_complex_input_to_evaluate_is_graph_error() -> None:
    g = _exp_graph()
    with pytest.raises(vm.GraphError, match="complex"):
        vm.evaluate(g, {"x": np.zeros(4, dtype=complex)})


def test_a_check_error_names_its_node_and_the_builders_show_it() -> None:
    # eighteenth session: the trusted check raises GraphError(message, nodes, i); its own text is the message, and
    # ir/builders.py (never imported by the certificate checker's process) shows the node and its operands
    text = "graph {\n  %0 = input {name='x'} : f16[4,8]\n  %1 = exp %0 : f16[4,9]\n  return %1\n}"
    with pytest.raises(vm.GraphError) as e:
        vm.Graph.parse(text)
    msg, nodes, i = e.value.args
    assert (i, nodes[i].op) == (1, "exp") and msg == "exp: recorded result f16[4,9]; the shape rule gives f16[4,8]"
    assert str(e.value).splitlines() == [msg, "  at      %1 = exp %0 : f16[4,9]",
                                         "  operand %0 = input {name='x'} : f16[4,8]"]
