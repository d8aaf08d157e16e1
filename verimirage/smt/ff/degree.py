"""What the finite-field test's bounds read off a program: degree bounds and the stated false-accept bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...ir.graph import Graph, node_list, output_refs
from ...ir.ops import FAMILY_EXP, OPS, POW_EXACT_MAX, Prop
from .field import safe_primes

# --------------------------------------------------------------------------- the randomized test


#: ops the finite-field test models by an order on residues (max) or a keyed random function of a residue:
#: on them the test is evidence, not a probability (e.g. residues are >= 0, so ``maximum(x, 0) = x``)
ORDER_ORACLE_OPS = frozenset({"max", "maximum", "loop_max", "running_max", "relu", "sqrt", "rsqrt", "silu", "gelu",
                              "rms_norm"})


@dataclass(frozen=True)
class DegreeInfo:
    """What the stated bounds of the finite-field test read off a program (:func:`degree_info`).

    ``degree``: a bound on the degree of every output as a rational function ``N / D`` (``max(deg N, deg D)``)
    of the inputs and the atoms, each exp / oracle *node* one atom; ``opaque``: the number of such nodes
    (the per-node model of the trial count). ``applications``: element-wise applications of those ops plus
    element-wise divisions weighted by their divisor's degree (each element is a separate application: the
    figure the honest, element-wise bound counts). ``order_oracle``: the ops of :data:`ORDER_ORACLE_OPS` it uses.
    """

    degree: int
    opaque: int
    applications: int
    order_oracle: tuple[str, ...]


def _order_or_oracle(op: str, attrs: dict[str, Any], nargs: int) -> bool:
    """Whether the registry models ``op`` in the field by an order (max-like) or a keyed random function."""
    d = OPS[op]
    if d.has(Prop.STRUCTURAL) or d.has(Prop.LOOP) or d.has(Prop.EXPONENTIAL):
        return False
    return d.family == "max" or d.degree_of([1] * nargs, attrs).opaque > 0


def _exact_degree(op: str, attrs: dict[str, Any], a: list[Any], shapes: list[Any], rank: int,
                  align: Callable[..., frozenset[int]]) -> tuple[Any, int] | None:
    """``(N, D, varying axes)`` of the ops added for real models whose field meaning is exact (cast, where,
    reciprocal, integer powers, minimum/min as the order's other operand), and the divisor degree each
    element divides by (0: none); None for every other op (handled by :func:`degree_info` itself)."""
    def deg(v: Any) -> int:
        return int(max(v[0], v[1]))

    if op == "cast":
        return a[0], 0
    if op == "where":  # m a + (1 - m) b over the common denominator Da Db
        m, x, y = a
        vary = frozenset().union(*(align(v, s, rank) for v, s in zip(a, shapes, strict=True)))
        return (deg(m) + max(x[0] + y[1], y[0] + x[1]), x[1] + y[1] + m[1], vary), 0
    if op == "minimum":  # a + b - maximum(a, b): add-like, as maximum
        x, y = a
        vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
        return (max(x[0] + y[1], y[0] + x[1]), x[1] + y[1], vx | vy), 0
    if op == "min":
        ax = attrs["axis"] % len(shapes[0])
        return (a[0][0], a[0][1], frozenset(a[0][2] - {ax})), 0
    if op == "reciprocal":  # Dx / Nx: every element divides by its numerator
        x = a[0]
        nx = frozenset(ax for ax, sz in enumerate(shapes[0]) if sz != 1)
        return (x[1], x[0], x[2] | (nx if x[0] else frozenset())), max(1, deg(x))
    if op == "pow":
        c = float(attrs["c"])
        if not (c.is_integer() and abs(c) <= POW_EXACT_MAX):
            return None  # an oracle (or sqrt's): an atom
        k, x = int(abs(c)), a[0]
        if k == 0:
            return (0, 0, frozenset()), 0
        if c > 0:
            return (k * x[0], k * x[1], x[2]), 0
        nx = frozenset(ax for ax, sz in enumerate(shapes[0]) if sz != 1)
        return (k * x[1], k * x[0], x[2] | (nx if x[0] else frozenset())), k * max(1, deg(x))
    return None


def degree_info(g: Graph) -> DegreeInfo:
    """The degree bounds of ``g`` (:class:`DegreeInfo`).

    Sound for sums of quotients: each value is tracked as ``N / D`` with ``deg N <= n``, ``deg D <= d`` and the
    axes along which ``D`` may differ between elements; a reduction of ``m`` elements along such an axis
    puts them over a common denominator (``n + (m - 1) d``, ``m d``); one along an axis ``D`` is constant on
    keeps ``d`` (the softmax normaliser). Values coming out of a kernel's blocks, or a loop's iterations, are
    taken to vary along every axis.
    """
    opaque = [0, 0, 0]  # max argument degree of an atom, atom nodes, element-wise applications
    orders: set[str] = set()
    V = tuple[int, int, frozenset[int]]  # (n, d, axes where the denominator may vary)

    def deg(v: V) -> int:
        return max(v[0], v[1])

    def align(v: V, shape: Sequence[int], out_rank: int) -> frozenset[int]:
        off = out_rank - len(shape)
        return frozenset(a + off for a in v[2] if shape[a] != 1)

    def allaxes(v: V, rank: int) -> V:
        return (v[0], v[1], frozenset(range(rank)) if v[1] else frozenset())

    def reduce(v: V, ax: int, m: int) -> V:
        n, d, vary = v
        if d and ax in vary:
            n, d = n + (m - 1) * d, m * d
        return (n, d, frozenset(vary - {ax}))

    def walk(nodes: Sequence[Any], in_vals: list[V], reps: int, frange: int, post: list[bool] | None) -> list[V]:
        vals: list[V] = []
        for i, n in enumerate(nodes):
            a = [vals[j] for j, _ in n.args]
            shapes = [nodes[j].outs[k].shape for j, k in n.args]
            out = n.outs[0].shape if n.outs else ()
            rank = len(out)
            times = reps * (frange if post is not None and not post[i] else 1)
            elems = math.prod(out) * times
            if n.op in ("input", "arg"):
                idx = n.attr("arg") if n.op == "input" and n.attr("arg") is not None else n.attr("index")
                v = in_vals[idx] if idx is not None and idx < len(in_vals) else (1, 0, frozenset())
                vals.append(allaxes(v, rank) if n.op == "input" and post is not None else v)
                continue
            if n.op == "custom":
                blk = n.attr("block")
                outs = walk(blk.nodes, a, reps * blk.num_blocks, blk.frange, blk.post_loop())
                vals.append(allaxes(max(outs, key=deg) if outs else (1, 0, frozenset()), rank))
                continue
            if n.op == "fused":
                outs = walk(n.attr("thread").nodes, a, times, 1, None)
                vals.append(allaxes(max(outs, key=deg) if outs else (1, 0, frozenset()), rank))
                continue
            if n.op in ORDER_ORACLE_OPS or _order_or_oracle(n.op, n.attr_dict, len(a)):
                orders.add(n.op)
            exact = _exact_degree(n.op, n.attr_dict, a, shapes, rank, align)
            if exact is not None:  # registry ops with an exact polynomial / rational meaning
                v, divided = exact
                vals.append(v)
                opaque[2] += elems * divided
                continue
            if n.op in ("mul", "div"):
                x, y = a
                vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
                if n.op == "mul":
                    vals.append((x[0] + y[0], x[1] + y[1], vx | vy))
                else:  # x / y = (Nx Dy) / (Dx Ny); each element's divisor may vanish in the field
                    ny = frozenset(ax + rank - len(shapes[1]) for ax, s in enumerate(shapes[1]) if s != 1)
                    vals.append((x[0] + y[1], x[1] + y[0], vx | vy | (ny if y[0] else frozenset())))
                    opaque[2] += elems * max(1, deg(y))
            elif n.op in ("add", "sub", "maximum"):
                x, y = a
                vx, vy = align(x, shapes[0], rank), align(y, shapes[1], rank)
                vals.append((max(x[0] + y[1], y[0] + x[1]), x[1] + y[1], vx | vy))
            elif n.op == "square":
                vals.append((2 * a[0][0], 2 * a[0][1], a[0][2]))
            elif n.op in ("neg", "scale", "running_max"):
                vals.append(a[0])
            elif n.op == "shift":
                vals.append((deg(a[0]), a[0][1], a[0][2]))
            elif n.op == "transpose":
                i0, i1 = n.attr("a") % rank, n.attr("b") % rank
                sw = {i0: i1, i1: i0}
                vals.append((a[0][0], a[0][1], frozenset(sw.get(x, x) for x in a[0][2])))
            elif n.op in ("sum", "mean", "max"):
                ax = n.attr("axis") % len(shapes[0])
                v = a[0] if n.op == "max" else reduce(a[0], ax, shapes[0][ax])
                vals.append((v[0], v[1], frozenset(v[2] - {ax})))
            elif n.op == "matmul":
                x, y = a
                ra, rb = len(shapes[0]), len(shapes[1])
                kx, ky = ra - 1, rb - 2
                vary = frozenset(ax + rank - ra for ax in x[2] if ax < ra - 2 and shapes[0][ax] != 1)
                vary |= frozenset(ax + rank - rb for ax in y[2] if ax < rb - 2 and shapes[1][ax] != 1)
                vary |= ({rank - 2} if ra - 2 in x[2] else set()) | ({rank - 1} if rb - 1 in y[2] else set())
                pv: V = (x[0] + y[0], x[1] + y[1], frozenset({0}) if (kx in x[2] or ky in y[2]) else frozenset())
                r = reduce(pv, 0, shapes[0][-1])
                vals.append((r[0], r[1], frozenset(vary)))
            elif n.op == "concat":
                nd = max(x[0] for x in a), max(x[1] for x in a)
                vary = frozenset().union(*(x[2] for x in a))
                ax = n.attr("axis") % rank
                vals.append((nd[0], nd[1], vary | ({ax} if nd[1] else frozenset())))
            elif n.op in ("loop_sum", "rescaled_sum"):
                x = a[0]
                n_, d_ = (x[0] + (frange - 1) * x[1], frange * x[1]) if x[1] else (x[0], 0)
                if n.op == "rescaled_sum":  # acc * exp(m_prev - m) + x: one more atom factor
                    n_ += 1 + a[1][0]
                    opaque[1] += 1
                    opaque[2] += elems * frange
                vals.append((n_, d_, frozenset(range(rank)) if d_ else frozenset()))
            elif n.op == "loop_max":
                vals.append(allaxes(a[0], rank))
            elif n.op == "rms_norm":
                # x * rsqrt(mean(x*x) + eps) [* w]: the rsqrt an atom
                opaque[0] = max(opaque[0], 2 * deg(a[0]))
                opaque[1] += 1
                opaque[2] += (elems // max(1, shapes[0][n.attr("axis") % rank])) * max(1, 2 * deg(a[0]))
                vary = frozenset().union(*(align(x, s, rank) for x, s in zip(a, shapes, strict=True)))
                vals.append((sum(x[0] for x in a) + 1, sum(x[1] for x in a), vary))
            else:  # exp, the oracles, and any op not known here: a fresh atom per node
                arg = max((deg(x) for x in a), default=1)
                opaque[0] = max(opaque[0], arg)
                opaque[1] += 1
                opaque[2] += elems * max(1, arg)
                vals.append((1, 0, frozenset()))
        return vals

    nodes = node_list(g)
    vals = walk(nodes, [], 1, 1, None)
    out = max((deg(vals[i]) for i, _ in output_refs(g)), default=1)
    return DegreeInfo(max(out, opaque[0], 1), opaque[1], opaque[2], tuple(sorted(orders)))


def _node_model_degree(g: Graph) -> tuple[int, int]:
    """The per-node model's (degree, opaque) as first written (kept so that recorded bounds stay the same
    where it is at least the sound degree of :func:`degree_info`)."""
    deg_opaque = [0, 0]

    def walk(nodes: Sequence[Any], in_deg: list[int]) -> list[int]:
        d: list[int] = []
        for n in nodes:
            a = [d[i] for i, _ in n.args]
            if n.op in ("input", "arg"):
                idx = n.attr("arg") if n.op == "input" and n.attr("arg") is not None else n.attr("index")
                d.append(in_deg[idx] if idx is not None and idx < len(in_deg) else 1)
                continue
            if n.op == "custom":
                outs = walk(n.attr("block").nodes, a)
                d.append(max(outs) if outs else 1)
                continue
            if n.op == "fused":
                d.append(max(walk(n.attr("thread").nodes, a) or [1]))
                continue
            dg = OPS[n.op].degree_of(a, n.attr_dict)
            deg_opaque[1] += dg.opaque
            if dg.opaque:
                deg_opaque[0] = max(deg_opaque[0], dg.inner)
            d.append(dg.result)
        return d

    nodes = node_list(g)
    ds = walk(nodes, [])
    out = max((ds[i] for i, _ in output_refs(g)), default=1)
    return max(out, deg_opaque[0]), deg_opaque[1]


def degree_bound(g: Graph) -> tuple[int, int]:
    """(degree, opaque) for the per-node model bound: a rational-function degree bound of the outputs, sound
    for sums of quotients (:func:`degree_info`; never below the figure first used, so recorded bounds stay),
    and the number of exp / nonlinear-unary nodes, treating each such node's result as a fresh variable."""
    d0, o0 = _node_model_degree(g)
    return max(d0, degree_info(g).degree), o0



def uses_exp(g: Graph) -> bool:
    """Whether ``g`` applies ``exp`` anywhere (``rescaled_sum`` does, inside block graphs)."""

    def walk(nodes: Sequence[Any]) -> bool:
        for n in nodes:
            if n.op in OPS and (OPS[n.op].family == FAMILY_EXP or OPS[n.op].hooks.get("uses_exp")):
                return True
            if n.op == "custom" and walk(n.attr("block").nodes):
                return True
            if n.op == "fused" and walk(n.attr("thread").nodes):
                return True
        return False

    return walk(node_list(g))

#: the largest false-accept bound a ``Proved`` verdict may rest on (fewer trials, e.g. ``trials=1``, give Unknown)
MAX_ACCEPTABLE_BOUND = 2.0**-40


def stated_bound(infos: Sequence[DegreeInfo], trials: int, project: bool) -> tuple[float | None, str]:
    """The false-accept probability the test states after ``trials`` equal trials of programs with
    ``infos`` (:func:`degree_info`), with the reason; None where it states none.

    Per trial ``(2 * degree + applications + 1) / q + projection``: every element-wise exp / oracle
    application and every element's divisor counts (an atom's argument may coincide with another's, a
    divisor may vanish, in each element separately). Programs with max / relu / sqrt-family ops get no
    probability at all: residues are ordered (``maximum(x, 0) = x`` holds in every field) and the oracles are
    keyed functions of one residue, so the field test is evidence there, not a bound. Nor does a figure above
    :data:`MAX_ACCEPTABLE_BOUND`."""
    orders = sorted({o for i in infos for o in i.order_oracle})
    if orders:
        return None, (f"no probability stated: {', '.join(orders)} are modelled by an order on residues or keyed "
                      "oracles (the field test is evidence there, not a bound)")
    deg = max(i.degree for i in infos)
    apps = sum(i.applications for i in infos)
    q_min = int(safe_primes()[0] - 1) // 2
    per = min(1.0, (2 * deg + apps + 1) / q_min + (projection_bound() if project else 0.0))
    bound = per ** max(trials, 0)
    if bound > MAX_ACCEPTABLE_BOUND:
        return None, (f"no probability stated: {apps} element-wise exp/division application(s) at degree {deg} "
                      f"give {bound:.3g} after {trials} trial(s) (above {MAX_ACCEPTABLE_BOUND:.3g}); the "
                      "per-node model bound is not a probability for them")
    return bound, f"element-wise: degree {deg}, {apps} application(s), {trials} trial(s)"


def trials_needed(per_trial: float, target_log2: float = 60.0, minimum: int = 2) -> int:
    """Independent trials so that ``per_trial ** n <= 2**-target_log2``."""
    if per_trial >= 1:
        return 0
    return max(minimum, math.ceil(target_log2 / -math.log2(per_trial)))


def projection_bound() -> float:
    """What comparing projections adds to the per-trial bound: ``2 / p`` for the smallest prime ``p``."""
    return 2.0 / float(safe_primes()[0])
