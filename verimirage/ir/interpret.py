"""One evaluator for every level and every semantic domain.

:func:`run` walks a kernel graph or μGraph. Block graphs are executed
literally — every grid block, every for-loop iteration, accumulators as
written — but vectorised across the grid: a block-level value is an array
``(*batch, *grid, *tile)`` where replicated grid axes have size 1.

A :class:`Domain` supplies the meaning of each registry op on its values
(numpy arrays whose trailing dims are the logical tensor; leading dims are
batch). Data movement (tiling, placing output tiles) is the same for every
domain and lives here, so the finite-field verifier and the float64 reference
share the block-graph semantics exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from .graph import BlockGraph, Graph, Node, OutputMap, ThreadGraph, make_attrs, node_list, output_refs
from .ops import OPS, POW_EXACT_MAX, Prop, TensorType


class Domain(Protocol):
    """A semantic domain: the meaning of registry ops on its values (one with ``composes = True``: the composite
    ops, those of :data:`COMPOSITES`, as their compositions)."""

    name: str

    def apply(self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType],
              out_type: TensorType) -> Any:
        """Result of ``op`` on ``args`` (see ``ir.ops`` for the calling convention)."""
        ...


def align_ranks(args: list[np.ndarray], types: Sequence[TensorType]) -> list[np.ndarray]:
    """Insert size-1 dims in front of each operand's logical dims so all have the largest rank."""
    rank = max(t.rank for t in types)
    out = []
    for a, t in zip(args, types, strict=True):
        if t.rank < rank:
            lead = a.ndim - t.rank
            a = a.reshape(a.shape[:lead] + (1,) * (rank - t.rank) + a.shape[lead:])
        out.append(a)
    return out


Step = tuple[str, tuple[int, ...], dict[str, Any]]


def _rms(ts: Sequence[TensorType], at: dict[str, Any]) -> list[Step]:
    x, ax = ts[0], at["axis"]  # x * rsqrt(mean(x * x) + eps) [* the weight, shaped (n, 1, ..) along the axis]
    out: list[Step] = [("square", (0,), {}), ("mean", (-1,), {"axis": ax}), ("shift", (-1,), {"c": at["eps"]}),
           ("rsqrt", (-1,), {}), ("mul", (0, -1), {})]
    return out + [("reshape", (1,), {"shape": (x.shape[ax],) + (1,) * (x.rank - 1 - ax)}), ("mul", (-2, -1), {})
                  ] * (len(ts) == 2)


def _pow(ts: Sequence[TensorType], at: dict[str, Any]) -> list[Step] | None:
    c = float(at["c"])  # x ** +-0.5: sqrt, rsqrt; an integer |c| <= POW_EXACT_MAX: products, x ** -k = 1 / x ** k
    if c in (0.5, -0.5):
        return [("sqrt" if c > 0 else "rsqrt", (0,), {})]
    if not (c.is_integer() and abs(c) <= POW_EXACT_MAX):
        return None  # (any other exponent: the op itself)
    out: list[Step] = [("mul", (0, -1), {})] * (int(abs(c)) - 1) if c else [("scale", (0,), {"c": 0.0}),
                                                                       ("shift", (-1,), {"c": 1.0})]  # x * 0 + 1
    return out + [("reciprocal", (-1,), {})] * (c < 0)


#: ops defined as compositions of other registry ops: the steps ``(op, operands, attrs)`` on the operand types and
#: attributes (operand ``r >= 0``: the op's own; ``r < 0``: the value ``-r`` steps back; the last step is the
#: result), None for the op itself. A domain that ``composes`` (the finite-field reference, the abstract expressions)
#: runs the composition, and the finite-field degree analysis walks it (:func:`expand`).
COMPOSITES: dict[str, Any] = {
    "neg": lambda ts, at: [("scale", (0,), {"c": -1.0})],
    "silu": lambda ts, at: [("sigmoid", (0,), {}), ("mul", (0, -1), {})],  # x sigmoid(x)
    "tanh": lambda ts, at: [("scale", (0,), {"c": 2.0}), ("sigmoid", (-1,), {}), ("scale", (-1,), {"c": 2.0}),
                            ("shift", (-1,), {"c": -1.0})],  # 2 sigmoid(2x) - 1
    "rms_norm": _rms,
    "pow": _pow,
    "transpose": lambda ts, at: [("permute", (0,), {"dims": tuple({at["a"]: at["b"], at["b"]: at["a"]}.get(d, d)
                                                              for d in range(ts[0].rank))})],  # axes a, b swapped
    "minimum": lambda ts, at: [("scale", (0,), {"c": -1.0}), ("scale", (1,), {"c": -1.0}), ("maximum", (-2, -1), {}),
                               ("scale", (-1,), {"c": -1.0})],  # -maximum(-a, -b)
    "min": lambda ts, at: [("scale", (0,), {"c": -1.0}), ("max", (-1,), at), ("scale", (-1,), {"c": -1.0})],
}


def expand(op: str, in_types: Sequence[TensorType], attrs: dict[str, Any]) -> list[Node] | None:
    """The composition of a composite ``op`` (:data:`COMPOSITES`) as a thread-graph-like node list: an ``arg`` node
    per operand, then the steps (typed by the registry's shape rules); its last node is the result. None for an op
    that is not one (or not for these attributes)."""
    steps = COMPOSITES[op](in_types, attrs) if op in COMPOSITES else None
    nodes = [Node("arg", (), (("index", i),), (t,)) for i, t in enumerate(in_types)]
    for o, refs, at in steps or ():
        ts, args = [nodes[r].outs[0] for r in refs], tuple((r % len(nodes), 0) for r in refs)
        nodes.append(Node(o, args, make_attrs(at), (OPS[o].infer(ts, at),)))
    return None if steps is None else nodes


def apply_op(domain: Domain, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType],
             out: TensorType) -> Any:
    """Apply a registry op in ``domain``, aligning operand ranks for broadcasting ops (a composite op in a domain
    that ``composes``: its composition)."""
    sub = expand(op, in_types, attrs) if getattr(domain, "composes", False) else None
    if sub is not None:  # (``domain.composed``, if any, sees the op's result: the abstract domain's sign facts)
        res = run_thread(ThreadGraph(tuple(sub), ((len(sub) - 1, 0),)), args, domain)[0]
        return getattr(domain, "composed", lambda op, args, attrs, res: res)(op, args, attrs, res)
    if OPS[op].has(Prop.BROADCAST) and len({t.rank for t in in_types}) > 1:
        args = align_ranks(args, in_types)
        rank = max(t.rank for t in in_types)
        in_types = [TensorType((1,) * (rank - t.rank) + t.shape, t.dtype) for t in in_types]
    return domain.apply(op, args, attrs, in_types, out)


# --------------------------------------------------------------------------- tiling


def tile_input(x: np.ndarray, shape: tuple[int, ...], grid: tuple[int, ...], imap: tuple[int | None, ...],
               fmap: int | None, frange: int) -> list[np.ndarray]:
    """Per loop iteration, the tiles of ``x`` for every block: arrays ``(*batch, *grid', *tile)``.

    ``grid'`` has the grid's size on the axes that partition ``x`` and 1 on
    replicated axes.
    """
    lead = x.ndim - len(shape)
    axis_of = {d: a for a, d in enumerate(imap) if d is not None}
    new_shape: list[int] = list(x.shape[:lead])
    grid_pos: dict[int, int] = {}
    loop_pos = -1
    tile_pos: list[int] = []
    for j, n in enumerate(shape):
        if j in axis_of:
            a = axis_of[j]
            grid_pos[a] = len(new_shape)
            new_shape.append(grid[a])
            n //= grid[a]
        if j == fmap:
            loop_pos = len(new_shape)
            new_shape.append(frange)
            n //= frange
        tile_pos.append(len(new_shape))
        new_shape.append(n)
    y = x.reshape(new_shape)
    perm = list(range(lead)) + [grid_pos[a] for a in sorted(grid_pos)]
    if loop_pos >= 0:
        perm.append(loop_pos)
    perm += tile_pos
    y = y.transpose(perm)
    # insert size-1 axes for replicated grid axes, in grid order
    for a in range(len(grid)):
        if a not in grid_pos:
            y = np.expand_dims(y, lead + a)
    if loop_pos < 0:
        return [y] * frange
    lp = lead + len(grid)
    if isinstance(y, np.ndarray):  # basic indexing: a view (np.take would copy the whole strided array per step)
        return [y[(slice(None),) * lp + (i,)] for i in range(frange)]
    return [np.take(y, i, axis=lp) for i in range(frange)]


def whole_tiles(tile: tuple[int, ...], dims: Sequence[int | None], counts: Sequence[int]) -> tuple[int, ...]:
    """``tile`` times the blocks or iterations walking each dim: ``counts[j]`` of them walk ``dims[j]`` (or none)."""
    return tuple(n * int(np.prod([k for d, k in zip(dims, counts, strict=True) if d == j])) for j, n in enumerate(tile))


def fit(domain: Domain, x: Any, have: tuple[int, ...], want: tuple[int, ...], dtype: Any) -> Any:
    """``x`` of shape ``have`` zero-padded or cropped to ``want`` (a masked tail; registry ops: each domain's 0)."""
    for d, w in enumerate(want):
        t, h, have = TensorType(have, dtype), have[d], (*have[:d], w, *have[d + 1:])
        if w < h:
            x = apply_op(domain, "slice", [x], {"axis": d, "start": 0, "stop": w}, [t], TensorType(have, dtype))
        elif w > h:  # (zeros: a causal mask true nowhere, of rank >= 2, cast and reshaped; concatenated)
            sh = (*t.shape[:d], w - h, *t.shape[d + 1:])
            at, pad, mt = {"shape": (1, *sh), "offset": ~sum(sh)}, TensorType(sh, dtype), TensorType((1, *sh), dtype)
            m = OPS["tril_mask"].infer([], at)
            z = apply_op(domain, "cast", [apply_op(domain, "tril_mask", [], at, [], m)], {"dtype": dtype}, [m], mt)
            z = apply_op(domain, "reshape", [z], {"shape": sh}, [mt], pad)
            x = apply_op(domain, "concat", [x, z], {"axis": d}, [t, pad], TensorType(have, dtype))
    return x


def place_output(v: np.ndarray, tile: tuple[int, ...], grid: tuple[int, ...], omap: OutputMap) -> np.ndarray:
    """Assemble per-block tiles ``(*batch, *grid, *tile)`` into the kernel's output tensor."""
    r = len(tile)
    ng = len(grid)
    lead = v.ndim - ng - r
    v = np.broadcast_to(v, v.shape[:lead] + tuple(grid) + tuple(tile))
    axis_for_dim = {d: a for a, d in enumerate(omap.dims)}
    perm = list(range(lead))
    shape = list(v.shape[:lead])
    for j in range(r):
        if j in axis_for_dim:
            a = axis_for_dim[j]
            perm.append(lead + a)
            shape.append(grid[a] * tile[j])
        else:
            shape.append(tile[j])
        perm.append(lead + ng + j)
    return v.transpose(perm).reshape(shape)  # (a copy for numpy arrays; lazy values of other domains keep their type)


# --------------------------------------------------------------------------- walkers


def _eval_node(nodes: Sequence[Node], i: int, env: dict[int, list[Any]], domain: Domain) -> None:
    """Evaluate plain (registry or fused) node ``i`` into ``env``."""
    n = nodes[i]
    args = [env[a][k] for a, k in n.args]
    in_types = [nodes[a].outs[k] for a, k in n.args]
    if n.op == "fused":
        env[i] = run_thread(n.attr("thread"), args, domain)
    else:
        env[i] = [apply_op(domain, n.op, args, n.attr_dict, in_types, n.outs[0])]


def _run_nodes(nodes: Sequence[Node], env: dict[int, list[Any]], domain: Domain) -> None:
    """Evaluate every node not yet in ``env``, in order."""
    for i in range(len(nodes)):
        if i not in env:
            _eval_node(nodes, i, env, domain)


def run_thread(tg: ThreadGraph, args: list[Any], domain: Domain) -> list[Any]:
    """Evaluate a thread graph on operand values."""
    env: dict[int, list[Any]] = {}
    for i, n in enumerate(tg.nodes):
        if n.op == "arg":
            env[i] = [args[n.attr("index")]]
    _run_nodes(tg.nodes, env, domain)
    return [env[a][k] for a, k in tg.outputs]


def _op1(domain: Domain, op: str, args: list[Any], t: TensorType, t2: TensorType | None = None) -> Any:
    types = [t] if t2 is None else [t, t2]
    return apply_op(domain, op, args, {}, types, t)


def run_block(bg: BlockGraph, args: Sequence[Any], arg_types: Sequence[TensorType], domain: Domain,
              out_types: Sequence[TensorType] | None = None) -> list[Any]:
    """Evaluate a block graph literally on the kernel's operands; its outputs, cropped to ``out_types`` (a tail)."""
    nodes = bg.nodes
    post = bg.post_loop()
    tiles: dict[int, list[Any]] = {}
    shapes = {n.attr("arg"): whole_tiles(n.outs[0].shape, (*n.attr("imap"), n.attr("fmap")), (*bg.grid, bg.frange))
              for n in nodes if n.op == "input"}  # (the operands zero-padded to whole tiles)
    padded = {k: fit(domain, args[k], arg_types[k].shape, s, arg_types[k].dtype) for k, s in shapes.items()}
    for i, n in enumerate(nodes):
        if n.op == "input":
            k = n.attr("arg")
            tiles[i] = tile_input(padded[k], shapes[k], bg.grid, n.attr("imap"), n.attr("fmap"), bg.frange)
    acc = _folded_products(bg, padded, shapes, domain) if domain.name in ("ff", "ffref") and not bg.flimit else {}
    skip = {nodes[i].args[0][0] for i in acc}
    run_max: dict[int, Any] = {}
    body_env: dict[int, list[Any]] = {}
    prev_m: dict[int, Any] = {}
    for it in range(bg.frange):
        b0 = loop_active(bg, it)
        if bg.flimit and b0 >= bg.grid[bg.flimit[0]]:
            continue  # the iteration runs in no block: every accumulator keeps its value
        was = (dict(acc), dict(run_max))
        body_env = {i: [t[it]] for i, t in tiles.items()}
        for i, n in enumerate(nodes):
            if post[i] or i in body_env or i in skip:
                continue
            if n.op == "running_max":
                (a, k), t = n.args[0], n.outs[0]
                x = body_env[a][k]
                prev_m[i] = run_max.get(i)
                run_max[i] = x if it == 0 else _op1(domain, "maximum", [run_max[i], x], t, t)
                body_env[i] = [run_max[i]]
            else:
                _eval_node(nodes, i, body_env, domain)
        for i, n in enumerate(nodes):
            if n.op not in ("loop_sum", "loop_max", "rescaled_sum") or n.args[0][0] in skip:
                continue
            (a, k), t = n.args[0], n.outs[0]
            x = body_env[a][k]
            if it == 0:
                acc[i] = x
            elif n.op != "rescaled_sum":  # loop_sum, loop_max: acc + x, maximum(acc, x)
                acc[i] = _op1(domain, "add" if n.op == "loop_sum" else "maximum", [acc[i], x], t, t)
            else:  # rescaled_sum: acc * exp(m_prev - m) + x
                mi = n.args[1][0]
                mt = nodes[mi].outs[0]
                d = _op1(domain, "sub", [prev_m[mi], run_max[mi]], mt, mt)
                f = _op1(domain, "exp", [d], mt)
                scaled = _op1(domain, "mul", [acc[i], f], t, mt)
                acc[i] = _op1(domain, "add", [scaled, x], t, t)
        for state, before in zip((acc, run_max), was, strict=True) if b0 else ():  # blocks before b0: as they were
            for i in state:
                state[i] = _select_blocks(domain, bg, before[i], state[i], nodes[i].outs[0], b0)
    env: dict[int, list[Any]] = {i: v for i, v in body_env.items() if not post[i]}
    for i in acc:
        env[i] = [acc[i]]
    _run_nodes(nodes, env, domain)
    outs = []
    for r, ((a, k), om) in enumerate(zip(bg.outputs, bg.omaps, strict=True)):
        v, t = place_output(env[a][k], nodes[a].outs[k].shape, bg.grid, om), nodes[a].outs[k]  # (then the crop)
        outs.append(v if out_types is None else fit(domain, v, whole_tiles(t.shape, om.dims, bg.grid),
                                                    out_types[r].shape, t.dtype))
    return outs


def loop_active(bg: BlockGraph, it: int) -> int:
    """The first block on ``bg.flimit``'s axis running iteration ``it`` (``d it <= a b + c``; the axis's size: none)."""
    if bg.flimit is None or bg.flimit[3] * it <= bg.flimit[2]:
        return 0
    axis, a, c, d = bg.flimit
    return bg.grid[axis] if a == 0 else min(-(-(d * it - c) // a), bg.grid[axis])


def _select_blocks(domain: Domain, bg: BlockGraph, old: Any, new: Any, t: TensorType, b0: int) -> Any:
    """``old`` in the blocks before ``b0`` on ``bg.flimit``'s axis, ``new`` from it on (registry layout ops)."""
    ax, ng, g = bg.flimit[0], len(bg.grid), bg.grid[bg.flimit[0]]  # type: ignore[index]
    gs = [tuple(v.shape[v.ndim - t.rank - ng: v.ndim - t.rank]) for v in (old, new)]
    shape = tuple(g if k == ax else max(x, y) for k, (x, y) in enumerate(zip(*gs, strict=True))) + t.shape
    ft = TensorType(shape, t.dtype)
    o, n = (apply_op(domain, "broadcast_to", [v], {"shape": shape}, [TensorType(s + t.shape, t.dtype)], ft)
            for v, s in zip((old, new), gs, strict=True))
    part = [TensorType((*shape[:ax], w, *shape[ax + 1:]), t.dtype) for w in (b0, g - b0)]
    lo = apply_op(domain, "slice", [o], {"axis": ax, "start": 0, "stop": b0}, [ft], part[0])
    hi = apply_op(domain, "slice", [n], {"axis": ax, "start": b0, "stop": g}, [ft], part[1])
    return apply_op(domain, "concat", [lo, hi], {"axis": ax}, part, ft)


def _folded_products(bg: BlockGraph, args: Mapping[int, Any], shapes: Mapping[int, tuple[int, ...]],
                     domain: Domain) -> dict[int, Any]:
    """By node: each loop_sum (sole reader) of a product of inputs split on the contracted dim as one product."""
    nodes, out, reads = bg.nodes, {}, [a[0] for n in bg.nodes for a in n.args] + [a[0] for a in bg.outputs]
    for i, n in enumerate(nodes):  # (sum_k A_k B_k = A B: the loop's tiles are consecutive pieces of the block's dim)
        j = n.args[0][0] if n.op == "loop_sum" and bg.frange > 1 and reads.count(n.args[0][0]) == 1 else -1
        ab = [nodes[a] for a, _ in nodes[j].args] if j >= 0 and OPS[nodes[j].op].has(Prop.CONTRACTION) else []
        fm = [x.attr("fmap") if x.op == "input" else None for x in ab]  # (split on A's last dim, B's second last)
        if len(ab) == 2 and fm == [ab[0].outs[0].rank - 1, ab[1].outs[0].rank - 2]:
            whole = [tile_input(args[x.attr("arg")], shapes[x.attr("arg")], bg.grid, x.attr("imap"), None, 1)[0]
                     for x in ab]
            types = [TensorType(tuple(whole[t].shape[-ab[t].outs[0].rank:]), ab[t].outs[0].dtype) for t in (0, 1)]
            out[i] = apply_op(domain, nodes[j].op, whole, nodes[j].attr_dict, types, n.outs[0])
    return out


def run(g: Graph, inputs: Mapping[str, Any], domain: Domain) -> list[Any]:
    """Evaluate a kernel graph or μGraph in ``domain`` on input values keyed by name."""
    nodes = node_list(g)
    env: dict[int, list[Any]] = {}
    for i, n in enumerate(nodes):
        if n.op == "input":
            env[i] = [inputs[n.attr("name")]]
        elif n.op == "custom":
            args = [env[a][k] for a, k in n.args]
            types = [nodes[a].outs[k] for a, k in n.args]
            env[i] = run_block(n.attr("block"), args, types, domain, n.outs)
        else:
            _eval_node(nodes, i, env, domain)
    return [env[a][k] for a, k in output_refs(g)]
