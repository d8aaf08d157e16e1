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

import math
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
        if nodes[a].op == "sub" and nodes[nodes[a].args[1][0]].op == "max":
            continue  # already stable
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
    nodes = node_list(g)
    exps = sites
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
            val[i] = out.exp(out.sub(a, maxes[i]))
        elif n.op == "sum" and n.args[0][0] in maxes and exps[n.args[0][0]] == n.attr("axis"):
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
    ``w m``, which the lowering bounds (:func:`scale_weight_tiles`: each tile's rows divided by ``s >= 1``,
    ``max(1, max |w m| / 2**15)`` over the tile in fp16, the product multiplied by ``s`` in fp32), so no rounded operand
    overflows; the fp32 accumulator holds at most ``n |x| |m| max(1, |w|)`` (below 2.9e14 n in
    fp16) and the last multiply by ``r`` is the source's output up to rounding. In bf16 (fp32's exponent range)
    the accumulator can still overflow where ``|x| |m|`` is near 3e38 / n and the source's normalised operand is
    not -- the same limit as the unweighted ``(x @ m) * r`` (rmsnorm_linear's design).

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
    (contracted) dim, written ``x @ (reshape(w, (k, 1)) * t)`` (then bounded by :func:`scale_weight_tiles`); ``bg``
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


def scale_weight_tiles(mg: Graph) -> MuGraph | None:
    """``mg`` with every block product ``a @ (c * t)`` whose right operand scales a weight tile's rows by a norm's
    weight column ``c`` (:func:`_row_scaled_weight`) written ``(a @ ((c / s) * t)) * s``; None if it has none.

    A weight tile (rank 2): ``s = clamp(max_ij |c_i t_ij| / 2**e, 1, dtype max)`` over the loop iteration's tile,
    ``2**e`` the dtype's largest power of 2 (fp16 2**15; bf16 and fp32 2**126, a normal fp32 constant), the product
    multiplied by ``s`` before it is summed: the operand ``(c / s) t`` is at most ``2**e``, and ``s`` is 1 (no
    scaling at all: the operand is ``c t`` itself) unless a product nears the dtype's largest value. (One ``s =
    max |w|`` per block flushed ``(w_i / s) t_ij`` to 0 for small weights beside a huge one: ``w = [6e4, 1e-3, ...]``
    gave 0 in fp16 where the source is accurate, red team session 14; in bf16 the same with ``w`` near 1e38, which
    the floating-point check's outlier sets found in session 15.) A batched tile (rank 3 or more): ``s =
    clamp(max |w|, 1, dtype max)``, one scalar per block: the max over the block's whole slice of the weight vector
    ``w`` when ``c`` reshapes a block input (loaded once more without the loop's map, before the loop; the
    product's loop sum stays inside ``tl.dot`` and is multiplied by ``s`` after the loop), else over the loop
    iteration's tile (the product multiplied by ``s`` before it is summed); it still flushes a small weight's row
    beside a huge weight (open).

    Equal over the reals (``s >= 1``). In floating point the product's operand ``(c / s) t``, rounded to the dtype
    for ``tl.dot``, is bounded where ``c t`` overflows fp16 once ``|c t| > 65504`` (a weight near 300 on a row the
    activations leave near 0 gives ``0 * inf``: NaN where the source is finite); the sum of products times ``s`` is
    an fp32 value of at most ``k |a| |c t|``. See :func:`norm_into_projections`."""
    from ..ir.finfo import DTYPE_MAX
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
        readers: dict[int, list[int]] = {}
        for j, n in enumerate(bg.nodes):
            for a, _ in n.args:
                readers.setdefault(a, []).append(j)
        new: list[Node] = []
        remap: dict[int, int] = {}
        after: dict[int, int] = {}  # a product's loop_sum node -> the scale s it is multiplied by after the loop

        def add(node: Node, new: list[Node] = new) -> int:
            new.append(node)
            return len(new) - 1

        def ref(r: tuple[int, int], remap: dict[int, int] = remap) -> tuple[int, int]:
            return (remap[r[0]], r[1])

        # per weight vector that is a block input: s over the block's slice of it, from a second load without fmap
        whole: dict[int, int] = {}  # the weight's block input node -> the node of its s
        kargs = list(kn.args)

        def ranged(site: tuple[int, int, int], bg: BlockGraph = bg) -> bool:  # (a tile: s from its products' range)
            return bool(bg.nodes[site[2]].outs[0].rank == 2)

        for site in sites.values():
            c = site[1]
            src = bg.nodes[c].args[0][0]
            wn = bg.nodes[src]
            if wn.op != "input" or wn.attr("fmap") is None or src in whole or ranged(site):
                continue
            ad = wn.attr_dict
            ad["fmap"] = None
            ad["arg"] = len(kargs)  # (the kernel takes the weight vector once more: one input node per operand)
            kargs.append(kn.args[wn.attr("arg")])
            full = tile_shape("block input", ad["shape"], bg.grid, ad["imap"], None, bg.frange)
            ft = TensorType(tuple(full), wn.outs[0].dtype)
            one = TensorType((1,), wn.outs[0].dtype)
            w_all = add(Node("input", (), make_attrs(ad), (ft,)))
            ab = add(Node("abs", ((w_all, 0),), (), (ft,)))
            mx = add(Node("max", ((ab, 0),), make_attrs({"axis": 0}), (one,)))
            whole[src] = add(Node("clamp", ((mx, 0),), make_attrs({"hi": DTYPE_MAX[ft.dtype], "lo": 1.0}), (one,)))
        for j, n in enumerate(bg.nodes):
            if j not in sites:
                remap[j] = add(Node(n.op, tuple(ref(a) for a in n.args), n.attrs, n.outs))
                if j in after:  # (a scaled product's loop sum: times s after the loop)
                    remap[j] = add(Node("mul", ((remap[j], 0), (after[j], 0)), (), n.outs))
                continue
            b, c, t = sites[j]
            ct, bt = bg.nodes[c].outs[0], bg.nodes[b].outs[0]
            src = bg.nodes[c].args[0][0]
            if ranged(sites[j]):  # s = max(1, max |c_i t_ij| / 2**e) over this iteration's tile
                tt = bg.nodes[t].outs[0]
                # (2**e: the dtype's largest power of 2, at most 2**126: 2**-e a normal fp32 constant)
                e = min(math.floor(math.log2(DTYPE_MAX[ct.dtype])), 126)
                col, one = TensorType((tt.shape[0], 1), tt.dtype), TensorType((1, 1), tt.dtype)
                rows = add(Node("max", ((add(Node("abs", (ref((t, 0)),), (), (tt,))), 0),), make_attrs({"axis": 1}),
                                (col,)))
                prod = add(Node("mul", ((rows, 0), (add(Node("abs", ((remap[c], 0),), (), (ct,))), 0)), (), (col,)))
                mx = add(Node("max", ((prod, 0),), make_attrs({"axis": 0}), (one,)))
                sc = add(Node("clamp", ((add(Node("scale", ((mx, 0),), make_attrs({"c": 2.0**-e}), (one,))), 0),),
                              make_attrs({"hi": DTYPE_MAX[ct.dtype], "lo": 1.0}), (one,)))
            elif src in whole:
                sc = whole[src]
            else:  # (the weight column is computed in the block: s over this iteration's tile)
                one = TensorType((1, 1), ct.dtype)
                ab = add(Node("abs", ((remap[c], 0),), (), (ct,)))
                mx = add(Node("max", ((ab, 0),), make_attrs({"axis": 0}), (one,)))
                sc = add(Node("clamp", ((mx, 0),), make_attrs({"hi": DTYPE_MAX[ct.dtype], "lo": 1.0}), (one,)))
            cs = add(Node("div", ((remap[c], 0), (sc, 0)), (), (ct,)))
            wt = add(Node("mul", tuple((cs, 0) if a[0] == c else ref(a) for a in bg.nodes[b].args), (), (bt,)))
            remap[j] = add(Node("matmul", (ref(n.args[0]), (wt, 0)), n.attrs, n.outs))
            rd = readers.get(j, [])
            if src in whole and not ranged(sites[j]) and len(rd) == 1 and bg.nodes[rd[0]].op == "loop_sum":
                after[rd[0]] = sc
            else:
                remap[j] = add(Node("mul", ((remap[j], 0), (sc, 0)), (), n.outs))
        outs = [ref(o) for o in bg.outputs]
        keep = _live_nodes(new, outs)  # (the unscaled weight tiles, read by nothing now, dropped)
        pos = {j: k for k, j in enumerate(j for j in range(len(new)) if j in keep or new[j].op == "input")}
        kept = tuple(Node(n.op, tuple((pos[a], o) for a, o in n.args), n.attrs, n.outs)
                     for j, n in enumerate(new) if j in pos)
        nodes[i] = _kernel_with(kn, kargs, bg, kept, [(pos[a], o) for a, o in outs])
        changed = True
    return _checked(mg, nodes) if changed else None


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
    """The scaled weight columns of block ``bg`` (:func:`scale_weight_tiles`' form, whatever its scale): each
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
    """``mg`` with :func:`scale_weight_tiles`' scaling taken out, whatever form its scale ``s`` has: each weight
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
    """``mg``'s weight tiles scaled as :func:`scale_weight_tiles` scales them now, from ``mg``'s unscaled core
    (:func:`unscale_weight_tiles`); ``mg`` itself where it has no scaled weight tile. A stored candidate whose
    text differs from this carries a form the current pass no longer produces (a stale candidate: e.g. the
    thirteenth session's one ``s = max |w|`` per block, which flushed small weights to 0 in fp16)."""
    core = unscale_weight_tiles(mg)
    if core is None:
        return mg
    return scale_weight_tiles(core) or core


#: the rules whose composition :func:`norm_into_projections` applies (recorded as its candidates' steps)
NORM_RULES = ("rms-norm-matmul", "mean-as-sum")
