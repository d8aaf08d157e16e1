"""Well-formedness checks, one per IR level.

Builders check as they go; these checks re-derive everything from the nodes
alone, so they also guard programs read from text, JSON or certificates.
Errors name the offending node, ``GraphError(message, nodes, i)`` (:mod:`.builders` shows it and its operands).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import GraphError
from .graph import BlockGraph, Graph, MuGraph, Node, Ref, ThreadGraph, live_nodes, node_list, output_refs, tile_shape
from .limits import check_shape
from .ops import LOOP_OPS, OPS, Level, TensorType, get_op


def _at(nodes: Sequence[Node], i: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; a GraphError it raises is raised again at node ``i``."""
    try:
        return fn(*args)
    except GraphError as e:
        raise GraphError(str(e), nodes, i) from None


def _check_refs(nodes: Sequence[Node], i: int) -> list[TensorType]:
    types = []
    for a, k in nodes[i].args:
        if not (isinstance(a, int) and 0 <= a < i):
            raise GraphError(f"{nodes[i].op}: operand %{a} is no earlier node (cycle or dangling reference)", nodes, i)
        if not (isinstance(k, int) and 0 <= k < len(nodes[a].outs)):
            raise GraphError(f"{nodes[i].op}: operand %{a}.{k}: node %{a} has {len(nodes[a].outs)} result(s)", nodes, i)
        types.append(nodes[a].outs[k])
    return types


def _check_op(nodes: Sequence[Node], i: int, level: Level, in_types: list[TensorType]) -> None:
    n = nodes[i]
    if n.op not in OPS:
        raise GraphError(f"unknown op {n.op!r}", nodes, i)
    d = get_op(n.op)
    if not d.levels & level:
        raise GraphError(f"{n.op}: not allowed in a {str(level.name).lower()} graph", nodes, i)
    keys = {k for k, _ in n.attrs}
    optional = set(d.hooks.get("block_only", ())) if level != Level.KERNEL else set()
    if not set(d.egg_attrs()) <= keys <= set(d.egg_attrs()) | optional:
        raise GraphError(f"{n.op}: attributes {sorted(keys)}; expected {sorted(d.attrs)}", nodes, i)
    out = _at(nodes, i, d.infer, in_types, n.attr_dict)
    _at(nodes, i, check_shape, f"{n.op}: result", out.shape)
    for key in ("axis", "a", "b"):
        v = n.attr(key)
        if v is not None and v < 0:
            raise GraphError(f"{n.op}: {key}={v}; stored axes are non-negative", nodes, i)
    if n.outs != (out,):
        raise GraphError(f"{n.op}: recorded result {', '.join(map(str, n.outs))}; the shape rule gives {out}", nodes, i)


def _check_outputs(nodes: Sequence[Node], outputs: Sequence[Ref], what: str) -> None:
    if not outputs:
        raise GraphError(f"{what} has no outputs; expected at least one (call output())")
    for a, k in outputs:
        if not (isinstance(a, int) and 0 <= a < len(nodes) and 0 <= k < len(nodes[a].outs)):
            raise GraphError(f"{what}: output %{a}.{k} is not a value of this graph")


def check_program(g: Graph, *, unused_inputs: bool = False) -> None:
    """Check a kernel graph or μGraph; raise GraphError showing the offending node.

    An input no output depends on is an error (a program to optimize or run should not take it) unless
    ``unused_inputs`` (e.g. for ``vm.verify``, where it is just a constant function of that input).
    """
    nodes = node_list(g)
    outputs = output_refs(g)
    names: set[str] = set()
    allow_custom = isinstance(g, MuGraph)
    for i, n in enumerate(nodes):
        in_types = _check_refs(nodes, i)
        for t in n.outs:
            if not isinstance(t, TensorType):
                raise GraphError(f"{n.op}: result type {t!r}; expected a TensorType", nodes, i)
            _at(nodes, i, check_shape, f"{n.op}: result", t.shape)
        if n.op == "input":
            name = n.attr("name")
            if n.args or [k for k, _ in n.attrs] != ["name"] or len(n.outs) != 1:
                raise GraphError("input: expected no operands, one attribute name and one result", nodes, i)
            if not isinstance(name, str) or name in names:
                raise GraphError(f"input: name {name!r} is not a fresh identifier", nodes, i)
            names.add(name)
        elif n.op == "custom":
            if not allow_custom:
                raise GraphError("custom kernels are allowed in a MuGraph only", nodes, i)
            bg = n.attr("block")
            if not isinstance(bg, BlockGraph) or len(n.attrs) != 1:  # (an attribute the printer does not show: none)
                raise GraphError("custom: expected one attribute, block, a BlockGraph", nodes, i)
            try:
                outs = bg.result_types(in_types)
            except GraphError as e:
                raise GraphError(f"custom: {e}", nodes, i) from None
            _at(nodes, i, check_crops, bg, outs, n.outs)
        else:
            _check_op(nodes, i, Level.KERNEL, in_types)
    _check_outputs(nodes, outputs, "graph")
    if unused_inputs:
        return
    live = live_nodes(nodes, outputs)
    for i, n in enumerate(nodes):
        if n.op == "input" and i not in live:
            raise GraphError(f"input {n.attr('name')!r} is not used by any output", nodes, i)


def check_crops(bg: BlockGraph, whole: Sequence[TensorType], recorded: Sequence[TensorType]) -> None:
    """GraphError unless each recorded result is the block graph's (``whole`` tiles), maybe cropped along dims the
    grid walks (a masked tail)."""
    if len(whole) != len(recorded) or any(t.dtype != o.dtype or t.rank != o.rank or any(m != s and not (
            d in om.dims and 0 < m < s) for d, (m, s) in enumerate(zip(t.shape, o.shape, strict=True)))
            for t, o, om in zip(recorded, whole, bg.omaps, strict=True)):
        raise GraphError(f"custom: recorded results {tuple(recorded)}; the block graph gives {tuple(whole)} (or "
                         "smaller along a dim the grid walks)")


def thread_result_types(tg: ThreadGraph, in_types: Sequence[TensorType]) -> tuple[TensorType, ...]:
    """Result types of ``tg`` applied to operands of ``in_types``; GraphError on mismatch."""
    check_thread(tg)
    args = [n for n in tg.nodes if n.op == "arg"]
    if len(args) != len(in_types):
        raise GraphError(f"fused: the thread graph takes {len(args)} operand(s), got {len(in_types)}")
    for n, t in zip(args, in_types, strict=True):
        if n.outs[0] != t:
            raise GraphError(f"fused: thread operand {n.attr('index')} is {n.outs[0]}, got {t}")
    return tuple(tg.type_of(r) for r in tg.outputs)


def check_thread(tg: ThreadGraph) -> None:
    """Check a thread graph: ``arg`` nodes numbered in order, then elementwise ops."""
    nodes = tg.nodes
    nargs = 0
    for i, n in enumerate(nodes):
        in_types = _check_refs(nodes, i)
        if n.op == "arg":
            if n.attr("index") != nargs or n.args or len(n.outs) != 1:
                raise GraphError(f"arg: expected index {nargs}, no operands and one result", nodes, i)
            nargs += 1
        else:
            _check_op(nodes, i, Level.THREAD, in_types)
    _check_outputs(nodes, tg.outputs, "thread graph")


def _tile_for(bg: BlockGraph, nodes: Sequence[Node], i: int) -> TensorType:
    n = nodes[i]
    keys = sorted(k for k, _ in n.attrs)
    if keys != ["arg", "fmap", "imap", "shape"] or n.args or len(n.outs) != 1:
        raise GraphError("block input: expected attributes arg, fmap, imap, shape; no operands; one result", nodes, i)
    shape = n.attr("shape")
    if not isinstance(shape, tuple):
        raise GraphError(f"block input: shape {shape!r}; expected a tuple of positive ints", nodes, i)
    _at(nodes, i, check_shape, "block input", shape)
    t = _at(nodes, i, tile_shape, f"block input {n.attr('arg')}", shape, bg.grid, n.attr("imap"), n.attr("fmap"),
            bg.frange)
    out = TensorType(t, n.outs[0].dtype)
    if out != n.outs[0]:
        raise GraphError(f"block input: recorded tile {n.outs[0]}; the maps give {out}", nodes, i)
    return out


def check_block(bg: BlockGraph, in_types: Sequence[TensorType] | None) -> None:
    """Check a block graph (and, if given, that it fits operands of ``in_types``)."""
    if not (isinstance(bg.grid, tuple) and 1 <= len(bg.grid) <= 3 and all(type(g) is int and g >= 1 for g in bg.grid)):
        raise GraphError(f"block graph: grid {bg.grid!r}; expected a tuple of 1 to 3 positive ints")
    if type(bg.frange) is not int or bg.frange < 1:
        raise GraphError(f"block graph: frange {bg.frange!r}; expected a positive int")
    if (fl := bg.flimit) is not None and not (isinstance(fl, tuple) and len(fl) == 4 and all(type(v) is int for v in fl)
                                             and 0 <= fl[0] < len(bg.grid) and min(fl[1:3]) >= 0 and fl[3] >= 1):
        raise GraphError(f"block graph: flimit {fl!r}; expected (axis, a, c, d): a grid axis, a >= 0, c >= 0, d >= 1")
    nodes = bg.nodes
    post: list[bool] = []
    invariant: list[bool] = []
    seen_args: set[int] = set()
    for i, n in enumerate(nodes):
        types = _check_refs(nodes, i)
        arg_post = [post[a] for a, _ in n.args]
        arg_inv = [invariant[a] for a, _ in n.args]
        if n.op == "input":
            _tile_for(bg, nodes, i)
            arg = n.attr("arg")
            if not isinstance(arg, int) or arg < 0:
                raise GraphError(f"block input: arg {arg!r}; expected an operand index >= 0", nodes, i)
            if arg in seen_args:
                raise GraphError(f"block input: operand {arg} is read twice; expected one input node each", nodes, i)
            seen_args.add(arg)
            if in_types is not None:
                if arg >= len(in_types):
                    raise GraphError(f"block input: operand {arg}; the kernel has {len(in_types)} operand(s)", nodes, i)
                if in_types[arg].shape != n.attr("shape") or in_types[arg].dtype != n.outs[0].dtype:
                    raise GraphError(f"block input: expects operand {arg} of shape {n.attr('shape')}, got "
                           f"{in_types[arg]}", nodes, i)
            post.append(False)
            invariant.append(n.attr("fmap") is None)
            continue
        if n.op == "fused":
            tg = n.attr("thread")
            if not isinstance(tg, ThreadGraph) or len(n.attrs) != 1:  # (an attribute the printer does not show: none)
                raise GraphError("fused: expected one attribute, thread, a ThreadGraph", nodes, i)
            outs = _at(nodes, i, thread_result_types, tg, types)
            if outs != n.outs:
                raise GraphError(f"fused: recorded results {n.outs}; the thread graph gives {outs}", nodes, i)
        else:
            _check_op(nodes, i, Level.BLOCK, types)
        if n.op in LOOP_OPS:
            if any(arg_post):
                raise GraphError(f"{n.op}: its operand is computed after the loop; expected a loop value", nodes, i)
            if n.op == "rescaled_sum" and nodes[n.args[1][0]].op != "running_max":
                raise GraphError("rescaled_sum: the second operand must be a running_max", nodes, i)
        is_post = n.op in ("loop_sum", "loop_max", "rescaled_sum") or any(arg_post)
        if is_post and bg.frange > 1:
            for (a, _), p, inv in zip(n.args, arg_post, arg_inv, strict=True):
                if n.op not in LOOP_OPS and not p and not inv:
                    raise GraphError(f"{n.op}: mixes a post-loop value with %{a}, which changes every "
                           "iteration; expected loop accumulators or loop-invariant values", nodes, i)
        post.append(is_post)
        invariant.append(n.op not in LOOP_OPS and all(arg_inv))
    if in_types is not None and seen_args != set(range(len(in_types))):
        raise GraphError(f"block graph reads operands {sorted(seen_args)}; the kernel has {len(in_types)} "
                         "operand(s), expected each read exactly once")
    _check_outputs(nodes, bg.outputs, "block graph")
    if len(bg.omaps) != len(bg.outputs):
        raise GraphError(f"block graph: {len(bg.outputs)} outputs but {len(bg.omaps)} omaps")
    for (a, k), om in zip(bg.outputs, bg.omaps, strict=True):
        t = nodes[a].outs[k]
        dims: Any = om.dims
        if len(dims) != len(bg.grid) or len(set(dims)) != len(dims):
            raise GraphError(f"output omap {dims}: expected one distinct output dim per grid axis {bg.grid}", nodes, a)
        if not all(isinstance(d, int) and 0 <= d < t.rank for d in dims):
            raise GraphError(f"output omap {dims}: dims must be within the tile's rank {t.rank}", nodes, a)
        if bg.frange > 1 and not post[a] and not invariant[a]:
            raise GraphError("output: a loop-body value is not an accumulated result; use loop_sum/loop_max", nodes, a)
