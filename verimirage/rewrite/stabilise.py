"""Direct graph rewrites the search applies to every extracted graph: the numerically safe softmax, and row
constants hoisted out of reductions.

``exp(a) / sum_k exp(a)``  ->  ``exp(a - max_k a) / sum_k exp(a - max_k a)``, and
``log(sum_k exp(a))``  ->  ``max_k a + log(sum_k exp(a - max_k a))`` (the max added back after a log: the
logsumexp of a log-softmax or a cross-entropy);

The e-graph holds both forms in one e-class (rule ``softmax-stabilise``), and
extraction by cost always prefers the plain one, which overflows fp16 (and
fp16 tensor-core operands) for logits beyond ~11. The search therefore also
lowers the stabilised form of every extracted graph, so the safe design is
among the candidates (and the GPU profiler, which checks every candidate
against the float64 reference, picks a correct one). Like every search
step, its output is re-verified.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir.builders import Tensor
from ..ir.graph import Graph, MuGraph, node_list, output_refs
from ..ir.ops import OPS, Prop

REDUCTION_OPS = frozenset(n for n, o in OPS.items() if o.has(Prop.REDUCTION))


def _softmax_sites(g: Graph) -> dict[int, int]:
    """exp node -> axis, for every ``exp(a)`` (``a`` not already max-shifted) that is summed along an axis.

    Replacing such an ``exp(a)`` by ``exp(a - max(a))`` scales it by a per-row constant; the program is
    unchanged when that constant cancels (softmax, deferred or not). Whether it does is the verifier's
    call: the candidates built from this graph are verified like every other.
    """
    nodes = node_list(g)
    sites: dict[int, int] = {}
    for n in nodes:
        if n.op != "sum":
            continue
        e = n.args[0][0]
        if nodes[e].op != "exp" or nodes[e].outs[0].shape[n.attr("axis")] == 1:
            continue
        a = nodes[e].args[0][0]
        m = nodes[nodes[a].args[1][0]] if nodes[a].op == "sub" else None
        if m is not None and (m.op == "max" or (m.op == "clamp" and nodes[m.args[0][0]].op == "max")):
            continue  # already stable (a clamped max: a logsumexp's, below)
        sites.setdefault(e, n.attr("axis"))
    return sites


def logsumexp_sites(g: Graph) -> bool:
    """Whether :func:`stabilise_softmax` adds a max back after a log in ``g`` (a plain logsumexp: its step is
    then ``logsumexp-stabilise`` too)."""
    nodes = node_list(g)
    sites = _softmax_sites(g)
    sums = {i for i, n in enumerate(nodes) if n.op == "sum" and n.args[0][0] in sites
            and sites[n.args[0][0]] == n.attr("axis")}
    return any(n.op == "log" and n.args[0][0] in sums for n in nodes)


def stabilise_softmax(g: Graph) -> Graph | None:
    """``g`` with every plain softmax in the max-subtracted form, or None if it has none."""
    sites = _softmax_sites(g)
    if not sites:
        return None
    from .partition import RUNNING_MAX_FLOOR

    nodes = node_list(g)
    exps = sites
    # the exp sites a log reads the sum of (a logsumexp): their max is clamped to fp32's finite range, so that a row of
    # -inf gives -inf (log 0 + the clamped max), as the source and ATen's logsumexp do, not -inf + log(sum(exp(NaN)))
    logged = {nodes[n.args[0][0]].args[0][0] for n in nodes
              if n.op == "log" and nodes[n.args[0][0]].op == "sum" and nodes[n.args[0][0]].args[0][0] in exps}
    out = Graph()
    val: dict[int, Tensor] = {}
    maxes: dict[int, Tensor] = {}  # exp site or sum of one -> the max subtracted in it
    for i, n in enumerate(nodes):
        args = [val[a] for a, _ in n.args]
        if n.op == "input":
            val[i] = out.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        elif i in exps:
            a = args[0]
            maxes[i] = out.max(a, axis=exps[i])
            if i in logged:
                maxes[i] = out.clamp(maxes[i], *RUNNING_MAX_FLOOR)
            val[i] = out.exp(out.sub(a, maxes[i]))
        elif n.op == "sum" and n.args[0][0] in exps and exps[n.args[0][0]] == n.attr("axis"):
            val[i] = out.sum(args[0], axis=n.attr("axis"))
            maxes[i] = maxes[n.args[0][0]]
        elif n.op == "log" and n.args[0][0] in maxes and n.args[0][0] not in exps:
            val[i] = out.add(maxes[n.args[0][0]], out.log(args[0]))  # log(S e^-m) + m = log S
        else:
            attrs: dict[str, Any] = n.attr_dict
            val[i] = out._emit(n.op, args, attrs)
    out.output(*[val[a] for a, _ in output_refs(g)])
    out.check()
    return out


def _const_along(t: Any, x: Any, axis: int) -> bool:
    """Whether ``t`` (same rank as ``x``) is constant along ``axis`` where ``x`` varies."""
    return t.rank == x.rank and t.shape[axis] == 1 and x.shape[axis] > 1


def hoist_row_constants(g: Graph) -> Graph | None:
    """``g`` with every ``sum_k t * (c - x)`` (also ``t * -(x - c)``, ``t * (x - c)``, either factor order) for
    a ``c`` constant along ``k``, computed from a reduction along ``k``, and ``t`` (not computed from ``c``),
    ``x`` of full size along it written ``sum_k(t) * c - sum_k(t * x)`` (or its negation); None if it has
    none. See the module docstring. (A centred square ``sum_k (x - m) * (x - m)`` is not hoisted: its ``t``
    reads ``m``, and ``sum(d x) - m sum(d)`` would cancel where the variance does not.)"""
    nodes = node_list(g)
    anc: list[frozenset[int]] = []  # the nodes each node's value is computed from (itself included)
    for i, n in enumerate(nodes):
        anc.append(frozenset({i}).union(*(anc[a] for a, _ in n.args)))

    def post_reduction(c: int, ax: int) -> bool:  # computed from a reduction along ``ax`` (known after a pass)
        return any(nodes[j].op in REDUCTION_OPS and nodes[j].attr("axis") % nodes[j].outs[0].rank == ax
                   for j in anc[c])

    sites: dict[int, tuple[int, int, int, int]] = {}  # sum node -> (t, x, c, sign of x)
    for i, n in enumerate(nodes):
        if n.op != "sum" or nodes[n.args[0][0]].op != "mul":
            continue
        ax = n.attr("axis") % n.outs[0].rank
        prod = nodes[n.args[0][0]]
        for t, d in (prod.args, prod.args[::-1]):
            dn, sign = nodes[d[0]], 1
            if dn.op == "neg":
                dn, sign = nodes[dn.args[0][0]], -1
            if dn.op != "sub":
                continue
            (a, _), (b, _) = dn.args
            ta, tb, tt = nodes[a].outs[0], nodes[b].outs[0], nodes[t[0]].outs[0]
            full = prod.outs[0]
            if tt.shape != full.shape:
                continue
            if ta.shape == full.shape and _const_along(tb, full, ax):  # sign * (x - c)
                sites[i] = (t[0], a, b, sign)
            elif tb.shape == full.shape and _const_along(ta, full, ax):  # sign * (c - x)
                sites[i] = (t[0], b, a, -sign)
            if i in sites:
                tt_, _, c_, _ = sites[i]
                if c_ in anc[tt_] or not post_reduction(c_, ax):  # (a centred square: not this form)
                    del sites[i]
                    continue
                break
    if not sites:
        return None
    # the nodes the rewritten outputs read (a site reads t, x and c, not its product)
    live = _live(g, lambda i: list(sites[i][:3]) if i in sites else [a for a, _ in nodes[i].args])
    out = Graph()
    val: dict[int, Tensor] = {}
    for i, n in enumerate(nodes):
        if i not in live and n.op != "input":
            continue
        args = [val[a] for a, _ in n.args] if i not in sites else []
        if n.op == "input":
            val[i] = out.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        elif i in sites:
            tn, xn, cn, sign = sites[i]
            ax = n.attr("axis")
            tc = out.mul(out.sum(val[tn], axis=ax), val[cn])
            tx = out.sum(out.mul(val[tn], val[xn]), axis=ax)
            val[i] = out.sub(tx, tc) if sign > 0 else out.sub(tc, tx)
        else:
            val[i] = out._emit(n.op, args, n.attr_dict)
    out.output(*[val[a] for a, _ in output_refs(g)])
    out.check(unused_inputs=True)
    return out


def _live(g: Graph, reads: Callable[[int], list[int]]) -> set[int]:
    """The nodes of ``g`` its outputs reach, where node ``i`` reads the nodes ``reads(i)`` (a rewrite's sites read
    other nodes than their own arguments)."""
    live: set[int] = set()
    todo = [a for a, _ in output_refs(g)]
    while todo:
        i = todo.pop()
        if i not in live:
            live.add(i)
            todo += reads(i)
    return live


#: the rules whose composition :func:`hoist_row_constants` applies (recorded as its candidates' steps)
HOIST_RULES = ("neg-sub", "mul-sub-distrib", "sum-sub-split", "sum-factor-out")


def norm_into_projections(g: Graph) -> Graph | None:
    """``g`` with every ``rms_norm(x, w) @ m`` (the norm along ``x``'s last axis, the contracted one, with a weight
    ``w``) written ``(x @ (w m)) * rsqrt(sum(x^2) / n + eps)``, ``w`` scaling the rows of ``m``: the norm in the
    projection's prologue (each block scales its weight tile's rows by ``w``; the row statistic is a loop sum,
    applied after the loop); None if it has none. (An unweighted norm's form comes out of the e-graph:
    rms-norm-expand, then matmul-rowscale.)

    Why the weight side and not ``((x * w) @ m) * r``: the source rounds ``x r w`` (at most ``sqrt(n) |w|``) to its
    dtype, the form ``(x * w) @ m`` rounds the unnormalised ``x w`` to it for the product's operand, which in fp16
    is inf once ``|x w| > 65504`` (x near 3e4, w near 8) where the source is finite (the twelfth session's red team
    finding, ``tests/test_redteam_session12.py``). Here the operands are ``x`` (an input, exact) and the weight tile
    ``w m``, which the lowering does not round: :func:`prologue_norm_scales` moves ``w`` back to the activation side
    with the row statistic computed before the loop, so that the product's operand is ``x r w``, the source's own
    rounded value, and the weight tile goes to ``tl.dot`` as loaded; the last multiply by ``r`` (times ``1 / r``
    after the loop) is the source's output up to fp32 rounding.

    Rule ``rms-norm-matmul`` (with ``mean-as-sum``) in one step: the e-graph holds a form of it, but
    extraction by size ranks it below the plain one in every class (a gated FFN reads the norm twice), so
    the search also lowers it directly. Like every search step, its output is re-verified."""
    nodes = node_list(g)
    sites: dict[int, int] = {}  # matmul node -> its rms_norm operand
    for i, n in enumerate(nodes):
        if n.op != "matmul":
            continue
        a = n.args[0][0]
        nn = nodes[a]
        x = nn.args[0][0] if nn.op == "rms_norm" and len(nn.args) == 2 else -1  # (unweighted: the e-graph's own)
        if x < 0:
            continue
        xt = nodes[x].outs[nn.args[0][1]]
        if nn.attr("axis") % xt.rank != xt.rank - 1 or xt.rank != n.outs[0].rank:
            continue
        sites[i] = a
    if not sites:
        return None
    # the nodes the rewritten outputs read (a site reads x, w and m, not the norm)
    live = _live(g, lambda i: [a for a, _ in (nodes[sites[i]].args + nodes[i].args[1:] if i in sites
                                              else nodes[i].args)])
    out = Graph()
    val: dict[tuple[int, int], Tensor] = {}
    parts: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
    for i, n in enumerate(nodes):
        if i not in live and n.op != "input":
            continue
        if n.op == "input":
            val[(i, 0)] = out.input(n.attr("name"), n.outs[0].shape, n.outs[0].dtype)
        elif i in sites:
            if sites[i] not in parts:  # (one row statistic and one weight column per norm, whatever reads it)
                nn = nodes[sites[i]]
                xv, wv = val[nn.args[0]], val[nn.args[1]]
                ax = xv.type.rank - 1
                k = xv.type.shape[ax]
                ss = out.sum(out.square(xv), axis=ax)
                parts[sites[i]] = (xv, out.reshape(wv, (k, 1)),
                                   out.rsqrt(out.shift(out.scale(ss, 1.0 / k), nn.attr("eps"))))
            xv, wcol, r = parts[sites[i]]
            val[(i, 0)] = out.mul(out.matmul(xv, out.mul(wcol, val[n.args[1]])), r)
        else:
            val[(i, 0)] = out._emit(n.op, [val[a] for a in n.args], n.attr_dict)
    out.output(*[val[r] for r in output_refs(g)])
    out.check(unused_inputs=True)
    return out


def _row_scaled_weight(bg: Any, j: int) -> tuple[int, int, int] | None:
    """For block node ``j`` of ``bg``, a product ``a @ (c * t)`` (either factor order) whose right operand scales
    the rows of a tile ``t`` by a column ``c`` (shape ``(k, 1)``, a reshape of a rank-1 value: a norm's weight,
    :func:`norm_into_projections`): (the mul node, ``c``'s node, ``t``'s node); else None."""
    n = bg.nodes[j]
    if n.op != "matmul":
        return None
    b = n.args[1][0]
    m = bg.nodes[b]
    if m.op != "mul":
        return None
    for (c, _), (t, _) in (m.args, m.args[::-1]):
        cn, tt = bg.nodes[c], bg.nodes[t].outs[0]
        ct = cn.outs[0]
        if (cn.op == "reshape" and ct.rank == 2 and ct.shape[1] == 1 and tt.rank >= 2 and tt.shape[-2] == ct.shape[0]
                and bg.nodes[cn.args[0][0]].outs[0].rank == 1):
            return b, c, t
    return None


def _weight_to_the_right(bg: Any) -> Any:
    """``bg`` with every block product ``(x * w) @ t`` of two block input tiles, ``w`` rank-1 along ``x``'s last
    (contracted) dim, written ``x @ (reshape(w, (k, 1)) * t)`` (then rewritten by :func:`prologue_norm_scales`); ``bg``
    itself if it has none. Equal over the reals. The left form is what the e-graph reaches for a weighted norm
    deferred past its projection (rms-norm-weight, rms-norm-expand, mul-assoc, matmul-rowscale:
    ``((x * w) @ m) * r``), whose operand ``x * w`` is inf in fp16 once ``|x w| > 65504`` where the source's
    ``x r w`` is finite; and the floating-point check evaluates only programs small enough, so it is rewritten
    wherever it is lowered rather than left to the check."""
    from ..ir.graph import BlockGraph, Node, make_attrs

    nodes = bg.nodes
    sites: dict[int, tuple[int, int]] = {}  # matmul -> (x's node, w's node)
    for j, n in enumerate(nodes):
        if n.op != "matmul":
            continue
        a = nodes[n.args[0][0]]
        if a.op != "mul" or not all(nodes[r].op == "input" for r, _ in a.args):
            continue
        (p, _), (q, _) = a.args
        for xi, wi in ((p, q), (q, p)):
            xt, wt = nodes[xi].outs[0], nodes[wi].outs[0]
            if (wt.rank == 1 and xt.rank >= 2 and xt.shape[-1] == wt.shape[0] and a.outs[0].shape == xt.shape
                    and len(nodes[wi].attr("shape")) == 1):
                sites[j] = (xi, wi)
                break
    if not sites:
        return bg
    new: list[Node] = []
    remap: dict[int, int] = {}
    for j, n in enumerate(nodes):
        if j not in sites:
            new.append(Node(n.op, tuple((remap[a], o) for a, o in n.args), n.attrs, n.outs))
            remap[j] = len(new) - 1
            continue
        xi, wi = sites[j]
        wn, tn = nodes[wi], nodes[n.args[1][0]].outs[n.args[1][1]]
        (full,) = wn.attr("shape")
        col = wn.outs[0].shape[0]
        new.append(Node("reshape", ((remap[wi], 0),), make_attrs({"shape": (full, 1), "src": (full,)}),
                        (type(wn.outs[0])((col, 1), wn.outs[0].dtype),)))
        new.append(Node("mul", ((len(new) - 1, 0), (remap[n.args[1][0]], n.args[1][1])), (),
                        (type(tn)(tuple(tn.shape), tn.dtype),)))
        new.append(Node("matmul", ((remap[xi], 0), (len(new) - 1, 0)), n.attrs, n.outs))
        remap[j] = len(new) - 1
    outs = [(remap[a], o) for a, o in bg.outputs]
    keep = _live_nodes(new, outs)
    pos = {j: k for k, j in enumerate(j for j in range(len(new)) if j in keep or new[j].op == "input")}
    kept = tuple(Node(n.op, tuple((pos[a], o) for a, o in n.args), n.attrs, n.outs)
                 for j, n in enumerate(new) if j in pos)
    return BlockGraph(bg.grid, bg.frange, kept, tuple((pos[a], o) for a, o in outs), bg.omaps, bg.flimit)


def _live_nodes(nodes: list[Any], outs: list[tuple[int, int]]) -> set[int]:
    """The indices of ``nodes`` (a block's) that ``outs`` read, directly or not."""
    live: set[int] = set()
    todo = [a for a, _ in outs]
    while todo:
        i = todo.pop()
        if i not in live:
            live.add(i)
            todo += [a for a, _ in nodes[i].args]
    return live


def _norm_scale_chain(bg: Any, a: int, kargs: Any) -> tuple[tuple[tuple[str, float], ...], int] | None:
    """The affine chain ``f`` of the row norm of block input ``a`` (of a kernel with operands ``kargs``), where
    ``bg`` applies one after its loop: a value ``rsqrt(f(ss))`` (in a block node or a fused thread graph) of ``ss =
    loop_sum(sum(square(a')))`` along ``a``'s last (contracted) dim, ``a'`` ``a`` or a block input loading the same
    tile of the same operand, ``f`` a chain of ``scale``/``shift`` ops (``ss / k + eps``: an RMS norm's statistic;
    ``rms-norm-expand``); as ``((op, c), ...)`` in application order, with the node of ``ss``. None where ``bg`` has
    none, or two different ones."""
    nodes = bg.nodes
    last = nodes[a].outs[0].rank - 1

    def tile(j: int) -> tuple[Any, ...]:
        n = nodes[j]
        return (kargs[n.attr("arg")], n.attr("imap"), n.attr("fmap"), n.attr("shape"), n.outs[0])

    same = {j for j, n in enumerate(nodes) if n.op == "input" and tile(j) == tile(a)}
    sq = {j for j, n in enumerate(nodes) if n.op == "square" and n.args[0][0] in same and n.args[0][1] == 0}
    ss = {j for j, n in enumerate(nodes) if n.op == "sum" and n.args[0][0] in sq
          and n.attr("axis") % n.outs[0].rank == last}
    if bg.frange > 1:
        ss = {j for j, n in enumerate(nodes) if n.op == "loop_sum" and n.args[0][0] in ss}
    found: set[tuple[tuple[str, float], ...]] = set()

    def walk(ns: Any, origin: Callable[[int], bool]) -> None:
        for n in ns:
            if n.op != "rsqrt":
                continue
            chain: list[tuple[str, float]] = []
            j = n.args[0][0]
            while ns[j].op in ("scale", "shift"):
                chain.append((ns[j].op, float(ns[j].attr("c"))))
                j = ns[j].args[0][0]
            if origin(j) and ns[j].outs[0].shape == (*nodes[a].outs[0].shape[:-1], 1):
                found.add(tuple(reversed(chain)))

    walk(nodes, lambda j: j in ss)
    for n in nodes:
        if n.op == "fused":
            tg = n.attr("thread")

            def arg_of_ss(j: int, n: Any = n, tg: Any = tg) -> bool:
                return bool(tg.nodes[j].op == "arg" and n.args[tg.nodes[j].attr("index")][0] in ss)

            walk(tg.nodes, arg_of_ss)
    return (next(iter(found)), min(ss)) if len(found) == 1 else None


def prologue_norm_scales(mg: Graph) -> MuGraph | None:
    """``mg`` with every block product ``a @ (c * t)`` whose right operand scales a weight tile's rows by a norm's
    weight column ``c = reshape(w, (k, 1))`` (:func:`_row_scaled_weight`; ``a`` a block input tile, normalised by
    ``bg`` after its loop: :func:`_norm_scale_chain`) written ``((a / s) * w) @ t`` times ``s`` after the loop,
    ``s = sqrt(f(sum(a_row ** 2)))`` the norm's own ``1 / r`` computed before the loop from the block's whole rows of
    ``a`` (the operand loaded once more without the loop's map); None if it has no such product. Raises
    :class:`ValueError` where a weight-scaled product has no norm statistic to take ``s`` from (the lowering is
    then dropped: its operand ``c t`` is unbounded).

    Equal over the reals (``s > 0``: ``f`` adds the norm's ``eps``). In floating point the rounded operand
    ``(a / s) * w`` is the source's own ``rms_norm(a, w)`` (``a r w``, ``r = 1 / s``, up to the order of fp32
    roundings), rounded to the dtype for ``tl.dot`` as the source rounds it: finite wherever the source's is and
    flushed nowhere the source's is not, in fp16, bf16 and fp32 alike; the weight tile ``t`` goes to ``tl.dot`` as
    loaded. The loop sum times ``s * r`` (in one step where the block multiplies it by a row factor ``r``:
    :func:`_fold_rescaled`) is the source's output up to two fp32 roundings. (Before: the
    weight tile's rows times ``w``, bounded by one ``s = max(1, max |w_i t_ij| / 2**15)`` per loop iteration, which
    flushed products ``2**40`` below the tile's largest to 0, red team session 15, and cost 1.12-1.50x on an H100
    for its two reductions a tile.) See :func:`norm_into_projections`."""
    from ..ir.graph import BlockGraph, Node, make_attrs, tile_shape
    from ..ir.ops import TensorType

    nodes = list(node_list(mg))
    changed = False
    for i, kn in enumerate(nodes):
        if kn.op != "custom":
            continue
        bg: BlockGraph = _weight_to_the_right(kn.attr("block"))
        sites = {j: s for j in range(len(bg.nodes)) if (s := _row_scaled_weight(bg, j)) is not None}
        if not sites:
            continue
        chains: dict[int, tuple[tuple[tuple[str, float], ...], int]] = {}
        for j in sites:
            a = bg.nodes[j].args[0][0]
            an = bg.nodes[a]
            chain = _norm_scale_chain(bg, a, kn.args) if an.op == "input" and bg.nodes[j].args[0][1] == 0 else None
            w_src = bg.nodes[sites[j][1]].args[0]
            if (chain is None or bg.type_of(w_src).shape[-1:] != an.outs[0].shape[-1:]
                    or an.outs[0].rank != bg.nodes[sites[j][2]].outs[0].rank):
                raise ValueError(f"block product %{j} scales its weight tile by a norm weight with no norm "
                                 "statistic of its left operand in the block to bound it by")
            chains[a] = chain
        readers: dict[int, list[int]] = {}
        for j, n in enumerate(bg.nodes):
            for r, _ in n.args:
                readers.setdefault(r, []).append(j)
        new: list[Node] = []
        remap: dict[int, int] = {}
        after: dict[int, int] = {}  # a product's loop_sum node -> the s it is multiplied by after the loop
        kargs = list(kn.args)

        def add(node: Node, new: list[Node] = new) -> int:
            new.append(node)
            return len(new) - 1

        def ref(r: tuple[int, int], remap: dict[int, int] = remap) -> tuple[int, int]:
            return (remap[r[0]], r[1])

        scales: dict[int, int] = {}  # a's block input node -> its s (before the loop)
        operands: dict[tuple[int, tuple[int, int]], int] = {}  # (a, w) -> the node of (a / s) * w

        def statistic(x: tuple[int, int], xt: Any, f: Any) -> int:  # sqrt(f(sum(x ** 2))) along x's last dim
            st = TensorType((*xt.shape[:-1], 1), xt.dtype)
            v = add(Node("sum", ((add(Node("square", (x,), (), (xt,))), 0),), make_attrs({"axis": xt.rank - 1}),
                         (st,)))
            for op, c in f:
                v = add(Node(op, ((v, 0),), make_attrs({"c": c}), (st,)))
            return add(Node("sqrt", ((v, 0),), (), (st,)))

        for a, (f, _) in chains.items():
            if bg.frange == 1:  # (no loop: from the tile itself, where the first product reads it)
                continue
            ad = bg.nodes[a].attr_dict
            ad["fmap"] = None
            ad["arg"] = len(kargs)  # (the kernel takes the operand once more: one input node per load)
            kargs.append(kn.args[bg.nodes[a].attr("arg")])
            dt = bg.nodes[a].outs[0].dtype
            ft = TensorType(tuple(tile_shape("block input", ad["shape"], bg.grid, ad["imap"], None, bg.frange)), dt)
            scales[a] = statistic((add(Node("input", (), make_attrs(ad), (ft,))), 0), ft, f)
        rescaled: dict[int, tuple[int, int]] = {}  # a product (or its loop sum) times s -> (that value, s)
        for j, n in enumerate(bg.nodes):
            if j not in sites:
                remap[j] = add(_fold_rescaled(n, tuple(ref(r) for r in n.args), rescaled, new))
                if j in after:  # (a rescaled product's loop sum: times s after the loop)
                    rescaled[len(new)] = (remap[j], after[j])
                    remap[j] = add(Node("mul", ((remap[j], 0), (after[j], 0)), (), n.outs))
                continue
            _, c, t = sites[j]
            (a, _), _ = n.args
            at = bg.nodes[a].outs[0]
            if a not in scales:
                scales[a] = statistic(ref((a, 0)), at, chains[a][0])
            sc = scales[a]
            w_src = bg.nodes[c].args[0]
            if (a, w_src) not in operands:  # (one operand for the products of one norm: a gated FFN's gate and up)
                operands[(a, w_src)] = add(Node("mul", ((add(Node("div", (ref((a, 0)), (sc, 0)), (), (at,))), 0),
                                                        ref(w_src)), (), (at,)))
            remap[j] = add(Node("matmul", ((operands[(a, w_src)], 0), ref((t, 0))), n.attrs, n.outs))
            rd = readers.get(j, [])
            if len(rd) == 1 and bg.nodes[rd[0]].op == "loop_sum":
                after[rd[0]] = sc
            else:
                rescaled[len(new)] = (remap[j], sc)
                remap[j] = add(Node("mul", ((remap[j], 0), (sc, 0)), (), n.outs))
        outs = [ref(o) for o in bg.outputs]
        keep = _live_nodes(new, outs)  # (the weight columns and the scaled weight tiles, read by nothing now)
        pos = {j: k for k, j in enumerate(j for j in range(len(new)) if j in keep or new[j].op == "input")}
        kept = tuple(Node(n.op, tuple((pos[r], o) for r, o in n.args), n.attrs, n.outs)
                     for j, n in enumerate(new) if j in pos)
        nodes[i] = _kernel_with(kn, kargs, bg, kept, [(pos[r], o) for r, o in outs])
        changed = True
    return _checked(mg, nodes) if changed else None


def _fold_rescaled(n: Any, args: tuple[tuple[int, int], ...], rescaled: dict[int, tuple[int, int]],
                   new: list[Any]) -> Any:
    """Block node ``n`` (operands ``args`` in ``new``) with each product of a rescaled value ``v s``
    (:func:`prologue_norm_scales`: ``rescaled`` maps its node to ``(v, s)``) by a row factor ``y`` (a value of
    ``s``'s shape: the norm's ``r``, which cancels ``s``) written ``v * (s * y)``, in a block node or in a fused
    thread graph; the nodes it needs (``s * y``) are appended to ``new``. Equal over the reals; in floating point
    ``v s`` is the output over ``r``, inf in bf16 and fp32 where the output times the row's rms passes 3.4e38 and the
    source's output is finite (red team session 16), and ``s * y`` is about 1."""
    from ..ir.graph import Node, ThreadGraph, make_attrs

    def row_factor(r: tuple[int, int], s: int) -> bool:
        return bool(new[r[0]].outs[r[1]].shape == new[s].outs[0].shape)

    if n.op == "mul":
        for p in (0, 1):
            a, y = args[p], args[1 - p]
            if a[1] == 0 and a[0] in rescaled and row_factor(y, rescaled[a[0]][1]):
                v, s = rescaled[a[0]]
                new.append(Node("mul", ((s, 0), y), (), (new[y[0]].outs[y[1]],)))
                return Node("mul", ((v, 0), (len(new) - 1, 0)), n.attrs, n.outs)
        return Node(n.op, args, n.attrs, n.outs)
    folded = {k: rescaled[a[0]] for k, a in enumerate(args) if a[1] == 0 and a[0] in rescaled}
    if n.op != "fused" or not folded:
        return Node(n.op, args, n.attrs, n.outs)
    tg: ThreadGraph = n.attr("thread")
    kargs = list(args)
    s_index: dict[int, int] = {}  # s's block node -> the thread operand it is
    for k, (v, s) in folded.items():
        kargs[k] = (v, 0)
        if s not in s_index:
            s_index[s] = len(kargs)
            kargs.append((s, 0))
    tn: list[Any] = [t for t in tg.nodes if t.op == "arg"]
    tn += [Node("arg", (), make_attrs({"index": k}), (new[s].outs[0],)) for s, k in s_index.items()]
    tremap = {j: tn.index(t) for j, t in enumerate(tg.nodes) if t.op == "arg"}
    s_arg = {k: len(tn) - len(s_index) + i for i, k in enumerate(s_index.values())}
    of = {j: s_arg[s_index[folded[t.attr("index")][1]]] for j, t in enumerate(tg.nodes)
          if t.op == "arg" and t.attr("index") in folded}  # (a rescaled operand's arg node -> s's)
    whole: dict[int, int] = {}

    def read(r: tuple[int, int]) -> tuple[int, int]:  # (a rescaled operand read as itself: v * s)
        if r[0] not in of:
            return (tremap[r[0]], r[1])
        if r[0] not in whole:
            tn.append(Node("mul", ((tremap[r[0]], 0), (of[r[0]], 0)), (), tg.nodes[r[0]].outs))
            whole[r[0]] = len(tn) - 1
        return (whole[r[0]], 0)

    for j, t in enumerate(tg.nodes):
        if t.op == "arg":
            continue
        fold = [p for p in (0, 1) if t.op == "mul" and t.args[p][0] in of
                and tg.nodes[t.args[1 - p][0]].outs[t.args[1 - p][1]].shape == tn[of[t.args[p][0]]].outs[0].shape]
        if fold:
            a, y = t.args[fold[0]], read(t.args[1 - fold[0]])
            tn.append(Node("mul", ((of[a[0]], 0), y), (), (tn[y[0]].outs[y[1]],)))
            tn.append(Node("mul", ((tremap[a[0]], 0), (len(tn) - 1, 0)), t.attrs, t.outs))
        else:
            tn.append(Node(t.op, tuple(read(r) for r in t.args), t.attrs, t.outs))
        tremap[j] = len(tn) - 1
    attrs = dict(n.attrs)
    attrs["thread"] = ThreadGraph(tuple(tn), tuple(read(r) for r in tg.outputs))
    return Node("fused", tuple(kargs), make_attrs(attrs), n.outs)


def _kernel_with(kn: Any, kargs: list[Any], bg: Any, block_nodes: Any, outs: list[tuple[int, int]]) -> Any:
    """Kernel node ``kn`` with operands ``kargs`` and its block ``bg``'s nodes and outputs replaced."""
    from ..ir.graph import BlockGraph, Node, make_attrs

    attrs = dict(kn.attrs)
    attrs["block"] = BlockGraph(bg.grid, bg.frange, tuple(block_nodes), tuple(outs), bg.omaps, bg.flimit)
    return Node(kn.op, tuple(kargs), make_attrs(attrs), kn.outs)


def _checked(mg: Graph, nodes: list[Any]) -> MuGraph:
    """The μGraph of kernel-level ``nodes`` with ``mg``'s outputs, checked."""
    out = MuGraph._from_parts(nodes, output_refs(mg))
    out.check(unused_inputs=True)
    return out


def _scaled_sites(bg: Any) -> dict[int, int]:
    """The scaled weight columns of block ``bg`` (the old ``scale_weight_tiles``' form, whatever its scale): each
    ``div(c, s)`` that is a factor of a block product's right operand, ``c`` a weight column (a reshape to
    ``(k, 1)`` of a rank-1 value) -> ``s``'s node."""
    out: dict[int, int] = {}
    for n in bg.nodes:
        if n.op != "matmul" or bg.nodes[n.args[1][0]].op != "mul":
            continue
        for d, _ in bg.nodes[n.args[1][0]].args:
            dn = bg.nodes[d]
            if dn.op != "div":
                continue
            cn = bg.nodes[dn.args[0][0]]
            ct = cn.outs[0]
            if (cn.op == "reshape" and ct.rank == 2 and ct.shape[1] == 1
                    and bg.nodes[cn.args[0][0]].outs[0].rank == 1):
                out[d] = dn.args[1][0]
    return out


def unscale_weight_tiles(mg: Graph) -> MuGraph | None:
    """``mg`` with the old ``scale_weight_tiles``' scaling taken out (sessions 13-15: the weight tile's rows times
    ``w / s``), whatever form its scale ``s`` has: each weight
    column ``c / s`` of a block product's right operand read as ``c``, each product (or loop sum) ``v * s`` as
    ``v``, the nodes only ``s`` read dropped, and a block input that then reads nothing and loads an operand another
    block input loads too (the weight vector loaded once more for ``s``) dropped with its kernel operand; None if
    ``mg`` has no scaled weight tile. Used to re-derive a stored candidate's scaled form from its core
    (:func:`rederive_weight_scales`)."""
    from ..ir.graph import Node, make_attrs

    nodes = list(node_list(mg))
    changed = False
    for i, kn in enumerate(nodes):
        if kn.op != "custom":
            continue
        bg = kn.attr("block")
        sites = _scaled_sites(bg)
        if not sites:
            continue
        scales = set(sites.values())
        alias: dict[int, int] = {d: bg.nodes[d].args[0][0] for d in sites}
        for j, n in enumerate(bg.nodes):
            if n.op == "mul" and j not in alias and any(a in scales for a, _ in n.args):
                (v, _), = [a for a in n.args if a[0] not in scales]
                alias[j] = v

        def res(j: int, alias: dict[int, int] = alias) -> int:
            while j in alias:
                j = alias[j]
            return j

        outs = [(res(a), o) for a, o in bg.outputs]
        args = {j: tuple((res(a), o) for a, o in n.args) for j, n in enumerate(bg.nodes)}
        live: set[int] = set()
        todo = [a for a, _ in outs]
        while todo:
            j = todo.pop()
            if j not in live and j not in alias:
                live.add(j)
                todo += [a for a, _ in args[j]]
        loads: dict[int, int] = {}  # kernel operand -> block inputs loading it
        for n in bg.nodes:
            if n.op == "input":
                loads[n.attr("arg")] = loads.get(n.attr("arg"), 0) + 1
        drop_args: set[int] = set()
        for j, n in enumerate(bg.nodes):
            if n.op == "input" and j not in live and loads[n.attr("arg")] == 1:
                k = kn.args[n.attr("arg")]
                if sum(1 for a in kn.args if a == k) > 1:  # (the same value loaded by another block input)
                    drop_args.add(n.attr("arg"))
                    continue
            if n.op == "input" and j not in alias:
                live.add(j)
        kargs = [a for k, a in enumerate(kn.args) if k not in drop_args]
        renum = {k: k - sum(1 for d in drop_args if d < k) for k in range(len(kn.args)) if k not in drop_args}
        pos = {j: p for p, j in enumerate(sorted(live))}
        kept = []
        for j in sorted(live):
            n = bg.nodes[j]
            attrs = n.attrs
            if n.op == "input":
                ad = n.attr_dict
                ad["arg"] = renum[ad["arg"]]
                attrs = make_attrs(ad)
            kept.append(Node(n.op, tuple((pos[a], o) for a, o in args[j]), attrs, n.outs))
        nodes[i] = _kernel_with(kn, kargs, bg, kept, [(pos[a], o) for a, o in outs])
        changed = True
    return _checked(mg, nodes) if changed else None


def rederive_weight_scales(mg: Graph) -> Graph:
    """``mg`` in the current pass's form (:func:`prologue_norm_scales`) from its unscaled core
    (:func:`unscale_weight_tiles`) where it carries an old scaled weight tile; ``mg`` itself where it has none. A
    stored candidate whose text differs from this carries a form the current pass no longer produces (a stale
    candidate: the thirteenth session's one ``s = max |w|`` per block, which flushed small weights to 0 in fp16, or
    the fourteenth's ``s`` per loop iteration, which flushed products ``2**40`` below its tile's largest)."""
    core = unscale_weight_tiles(mg)
    if core is None:
        return mg
    return prologue_norm_scales(core) or core


#: the rules whose composition :func:`norm_into_projections` applies (recorded as its candidates' steps)
NORM_RULES = ("rms-norm-matmul", "mean-as-sum")
