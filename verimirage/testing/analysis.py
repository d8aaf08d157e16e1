"""Structural facts about a kernel graph that decide which properties a kernel must have.

Everything here reads the graph only (never runs it): which inputs feed a
softmax's logits and how to shift those logits per row through the inputs,
which outputs are positively homogeneous in which inputs (so norms are
unchanged when their input is scaled), whether the leading dim of the inputs
is a pure batch dim, and the longest reduction (for tolerances).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from ..ir.graph import Graph, Node, Ref, node_list, output_refs
from ..ir.ops import OPS, Prop

# --------------------------------------------------------------------------- result types


@dataclass(frozen=True)
class ShiftPlan:
    """How to add a per-row constant to a softmax's logits by changing inputs.

    The logits are ``matmul(A, B)`` (possibly through ``scale``/``neg``) or an
    input ``X`` itself. For a matmul, row ``pin_index`` of the contraction dim of
    input ``pin`` is set to 1 (in both runs), so that adding ``c / factor`` to
    the matching column of input ``target`` adds ``c`` to every logit of a row.
    For an input, ``c`` is added along ``axis`` directly (``pin`` is None).
    """

    target: str  # input that receives the shift
    target_axis: int  # axis of ``target`` along which the shift is constant
    pin: str | None  # input whose contraction slice is set to 1 (matmul logits)
    pin_axis: int  # the contraction axis of ``pin``
    target_contraction_axis: int  # the contraction axis of ``target`` (matmul logits)
    factor: float  # logits change by ``factor`` * (change of target)


@dataclass(frozen=True)
class SoftmaxSite:
    """``div(exp(z), sum(exp(z), axis))`` with ``z = x`` or ``z = x - max(x, axis)`` (stable)."""

    div: int  # node index of the division
    logits: Ref
    axis: int
    stable: bool
    logit_inputs: tuple[str, ...]  # inputs the logits depend on
    plan: ShiftPlan | None  # None: no way to shift the logits per row via inputs
    invariant_outputs: bool  # every output is unchanged by the plan's shift


@dataclass(frozen=True)
class ScalingProperty:
    """Scaling input ``name`` by ``alpha > 0`` scales output ``i`` by ``alpha ** degrees[i]``."""

    name: str
    degrees: tuple[Fraction, ...]
    through_norm: bool  # some output is invariant (degree 0) and depends on the input via a norm/division
    eps_sensitive: bool  # an rms_norm eps makes the law approximate


@dataclass(frozen=True)
class BatchDim:
    """The leading dim of ``inputs`` is a pure batch dim of size ``size``; outputs carry it at ``output_axes``."""

    size: int
    inputs: tuple[str, ...]
    output_axes: tuple[int, ...]


@dataclass(frozen=True)
class GraphFacts:
    """What :func:`analyze` found."""

    softmax: tuple[SoftmaxSite, ...]
    scaling: tuple[ScalingProperty, ...]
    batch: BatchDim | None
    reduction_length: int
    has_matmul: bool
    depth: int = 1
    norm_inputs: dict[str, int] = field(default_factory=dict)  # input -> norm axis it reaches (tiny regime)
    large_inputs: tuple[str, ...] = ()  # inputs feeding max-shifted logits (large regime)
    #: the large inputs that reach max-shifted logits through no contraction, each with the least factor by which a
    #: chain of ``scale`` ops multiplies it in an ``exp`` (its magnitudes are the exponent's over that factor)
    large_direct: dict[str, float] = field(default_factory=dict)
    #: float16 inputs a norm squares through no contraction (large regime: magnitudes whose squares overflow float16)
    wide_inputs: tuple[str, ...] = ()

    @property
    def stable_softmax(self) -> bool:
        """Whether the graph has a numerically safe softmax."""
        return any(s.stable for s in self.softmax)


# --------------------------------------------------------------------------- helpers


def _input_names(nodes: Sequence[Node]) -> dict[int, str]:
    return {i: n.attr("name") for i, n in enumerate(nodes) if n.op == "input"}


def _ancestors(nodes: Sequence[Node], i: int, *, through_contractions: bool = True) -> set[int]:
    """Node ``i`` and its ancestors (``through_contractions=False``: only those reached through no contraction,
    whose values carry into ``i`` unmultiplied)."""
    seen: set[int] = set()
    stack = [i]
    while stack:
        j = stack.pop()
        if j in seen:
            continue
        seen.add(j)
        if through_contractions or not OPS[nodes[j].op].has(Prop.CONTRACTION):
            stack.extend(a for a, _ in nodes[j].args)
    return seen


def _users(nodes: Sequence[Node]) -> dict[int, list[int]]:
    users: dict[int, list[int]] = {i: [] for i in range(len(nodes))}
    for j, n in enumerate(nodes):
        for a, _ in n.args:
            users[a].append(j)
    return users


def reduction_length(g: Graph) -> int:
    """The longest reduction of the graph (matmul contraction, reduced axis, normalised axis); at least 1."""
    nodes = node_list(g)
    k = 1
    for n in nodes:
        if n.op == "input":
            continue
        in_types = [nodes[a].outs[i] for a, i in n.args]
        d = OPS[n.op]
        if d.index is None:
            continue
        im = d.index_map(in_types, n.attr_dict, n.outs[0])
        for grp in im.reduced:  # reduced axes and contractions
            k = max(k, *(in_types[a].shape[j] for a, j in grp))
        if d.pad is not None:  # mixes elements along its axis (rms_norm's mean of squares)
            k = max(k, in_types[0].shape[n.attr("axis")])
    return k


def depth(g: Graph) -> int:
    """Ops on the longest input-to-output path: rounding steps of an unfused implementation."""
    nodes = node_list(g)
    d: list[int] = []
    for n in nodes:
        d.append(0 if n.op == "input" else 1 + max((d[a] for a, _ in n.args), default=0))
    return max((d[a] for a, _ in output_refs(g)), default=0)


# --------------------------------------------------------------------------- softmax


def _match_softmax(nodes: Sequence[Node], i: int) -> tuple[Ref, int, bool] | None:
    """(logits, axis, stable) if node ``i`` is the division of a softmax."""
    n = nodes[i]
    if n.op != "div":
        return None
    e_ref, s_ref = n.args
    s = nodes[s_ref[0]]
    if s.op != "sum" or s.args[0] != e_ref:
        return None
    axis = s.attr("axis")
    e = nodes[e_ref[0]]
    if e.op != "exp":
        return None
    z_ref = e.args[0]
    z = nodes[z_ref[0]]
    if z.op == "sub":
        x_ref, m_ref = z.args
        m = nodes[m_ref[0]]
        if m.op == "max" and m.args[0] == x_ref and m.attr("axis") == axis:
            return x_ref, axis, True
    return z_ref, axis, False


def _canonical(nodes: Sequence[Node]) -> list[int]:
    """Per node, the first node computing the same value: the same op, attributes, result types and (canonical)
    operands, so a subexpression written twice (two ``exp(x - max(x))`` nodes) is recognised as one."""
    seen: dict[tuple[object, ...], int] = {}
    canon: list[int] = []
    for j, n in enumerate(nodes):
        key = (n.op, repr(sorted(n.attr_dict.items())), tuple((canon[a], i) for a, i in n.args),
               tuple(str(t) for t in n.outs))
        canon.append(seen.setdefault(key, j))
    return canon


def _max_shifted_logits(nodes: Sequence[Node]) -> list[tuple[Ref, float]]:
    """The logits ``x`` of every ``exp(x - max(x, axis))`` (through positive ``scale`` and ``cast`` ops), whatever
    reads it: a softmax, a log-softmax or log-sum-exp, attention with its normaliser apart. An implementation that
    drops the shift overflows once the logits pass ``log`` of the dtype's largest value (the ``large`` regime).
    Each with the product of the positive ``scale`` factors between the exp and the shift."""
    canon = _canonical(nodes)
    out: list[tuple[Ref, float]] = []
    for n in nodes:
        if n.op != "exp":
            continue
        z, c = nodes[n.args[0][0]], 1.0
        while (z.op == "scale" and float(z.attr("c")) > 0) or z.op == "cast":
            c *= float(z.attr("c")) if z.op == "scale" else 1.0
            z = nodes[z.args[0][0]]
        if z.op != "sub":
            continue
        x_ref, m_ref = z.args
        m = nodes[m_ref[0]]
        if m.op == "max" and (canon[m.args[0][0]], m.args[0][1]) == (canon[x_ref[0]], x_ref[1]):
            out.append((x_ref, c))
    return out


#: ops that divide by (or take a root of) their operand, and which operand: the place an ``eps`` guards
_DIVIDES = {"rsqrt": 0, "reciprocal": 0, "sqrt": 0, "div": 1}


def _eps_guarded_reductions(nodes: Sequence[Node]) -> list[int]:
    """The reductions ``r`` (a ``mean`` or ``sum`` along an axis) of every ``rsqrt(r + eps)``, ``sqrt(r + eps)``,
    ``reciprocal(r + eps)`` or ``y / (r + eps)`` with ``eps > 0``: a norm written out by hand (layer norm, RMSNorm
    as ``x * rsqrt(mean(x**2) + eps)``), whose ``eps`` matters only where the rows are (almost) zero (the ``tiny``
    regime): an implementation that drops it divides by zero there."""
    out = []
    for n in nodes:
        pos = _DIVIDES.get(n.op)
        if pos is None or len(n.args) <= pos:
            continue
        z = nodes[n.args[pos][0]]
        if z.op != "shift" or not float(z.attr("c")) > 0:
            continue
        r = z.args[0][0]
        if nodes[r].op in ("mean", "sum") and "axis" in nodes[r].attr_dict:
            out.append(r)
    return out


def _shift_plan(nodes: Sequence[Node], names: dict[int, str], ref: Ref, axis: int) -> ShiftPlan | None:
    factor = 1.0
    while True:
        n = nodes[ref[0]]
        if n.op == "scale":
            factor *= float(n.attr("c"))
            ref = n.args[0]
        elif n.op == "neg":
            factor = -factor
            ref = n.args[0]
        else:
            break
    n = nodes[ref[0]]
    rank = n.outs[0].rank
    if n.op == "input":
        return ShiftPlan(names[ref[0]], axis, None, -1, -1, factor)
    if n.op != "matmul":
        return None
    (a, _), (b, _) = n.args
    if nodes[a].op != "input" or nodes[b].op != "input" or a == b:
        return None
    ra, rb = nodes[a].outs[0].rank, nodes[b].outs[0].rank
    if ra != rank or rb != rank:
        return None
    if axis == rank - 1:  # softmax over columns: pin a row of B, shift a column of A
        return ShiftPlan(names[a], rank - 1, names[b], rank - 2, rank - 1, factor)
    if axis == rank - 2:  # softmax over rows: pin a column of A, shift a row of B
        return ShiftPlan(names[b], rank - 2, names[a], rank - 1, rank - 2, factor)
    return None


def _changed_by(
    nodes: Sequence[Node], names: dict[int, str], changed_inputs: set[str], invariant: set[int]
) -> set[int]:
    """Nodes whose value changes when ``changed_inputs`` change, given ``invariant`` nodes do not."""
    changed: set[int] = set()
    for i, n in enumerate(nodes):
        if n.op == "input":
            if names[i] in changed_inputs:
                changed.add(i)
        elif i not in invariant and any(a in changed for a, _ in n.args):
            changed.add(i)
    return changed


def _softmax_sites(g: Graph) -> list[SoftmaxSite]:
    nodes = node_list(g)
    names = _input_names(nodes)
    outs = output_refs(g)
    sites = []
    for i in range(len(nodes)):
        m = _match_softmax(nodes, i)
        if m is None:
            continue
        x_ref, axis, stable = m
        logit_inputs = tuple(sorted(names[j] for j in _ancestors(nodes, x_ref[0]) if j in names))
        plan = _shift_plan(nodes, names, x_ref, axis)
        invariant = False
        if plan is not None:
            changed = _changed_by(nodes, names, {plan.target}, {i})
            invariant = not any(r[0] in changed for r in outs)
        sites.append(SoftmaxSite(i, x_ref, axis, stable, logit_inputs, plan, invariant))
    return sites


# --------------------------------------------------------------------------- homogeneity


_Deg = tuple[bool, Fraction | None]  # (depends on the input, degree or None when not homogeneous)
_INDEP: _Deg = (False, Fraction(0))


def _degree(n: Node, args: list[_Deg]) -> _Deg:
    if not any(d for d, _ in args):
        return _INDEP
    rule = OPS[n.op].homog
    if rule is None:  # not homogeneous, unless every operand that depends on the input is scale-invariant
        dep = [k for d, k in args if d]
        return (True, Fraction(0)) if all(k == 0 for k in dep) else (True, None)
    k = rule(args, n.attr_dict)
    return (True, None if k is None else Fraction(k))


def _scaling(g: Graph) -> list[ScalingProperty]:
    nodes = node_list(g)
    names = _input_names(nodes)
    outs = output_refs(g)
    norm_nodes = [i for i, n in enumerate(nodes) if OPS[n.op].has(Prop.NORMALISES)]
    has_eps = [i for i in norm_nodes if (nodes[i].attr("eps") or 0) > 0]
    props = []
    for ii, name in names.items():
        deg: list[_Deg] = []
        for n in nodes:
            if n.op == "input":
                deg.append((True, Fraction(1)) if n.attr("name") == name else _INDEP)
            else:
                deg.append(_degree(n, [deg[a] for a, _ in n.args]))
        od = [deg[r[0]] for r in outs]
        if any(k is None for _, k in od) or not any(d for d, _ in od):
            continue
        through = False
        eps = False
        for r, (d, k) in zip(outs, od, strict=True):
            anc = _ancestors(nodes, r[0])
            if d and k == 0 and any(j in anc and ii in _ancestors(nodes, j) for j in norm_nodes):
                through = True
            if d and any(j in anc and ii in _ancestors(nodes, j) for j in has_eps):
                eps = True
        props.append(ScalingProperty(name, tuple(Fraction(k) for _, k in od), through, eps))  # type: ignore[arg-type]
    return props


# --------------------------------------------------------------------------- batch dim


class _NoBatch(Exception):
    pass


def _batch_axis(n: Node, nodes: Sequence[Node], ax: dict[int, int | None]) -> int | None:
    arg_ax = [ax[a] for a, _ in n.args]
    if all(a is None for a in arg_ax):
        return None
    in_types = [nodes[a].outs[k] for a, k in n.args]
    out = n.outs[0]
    im = OPS[n.op].index_map(in_types, n.attr_dict, out)
    # the result dim each operand's batch axis walks with (a reduced or unlinked axis has none)
    pos: set[int] = set()
    for a, x in enumerate(arg_ax):
        if x is None:
            continue
        dests = [o for i, j, o in im.links if i == a and j == x]
        if len(dests) != 1:
            raise _NoBatch
        pos.add(dests[0])
    if len(pos) != 1:
        raise _NoBatch
    p = pos.pop()
    if p in im.whole_out:
        raise _NoBatch
    for a, x in enumerate(arg_ax):  # operands without the batch axis must not vary along it
        if x is None and any(i == a and o == p and in_types[a].shape[j] != 1 for i, j, o in im.links):
            raise _NoBatch
    return p


def _batch(g: Graph) -> BatchDim | None:
    nodes = node_list(g)
    names = _input_names(nodes)
    outs = output_refs(g)
    sizes = sorted({nodes[i].outs[0].shape[0] for i in names if nodes[i].outs[0].rank >= 1} - {1})
    tries = []
    for size in sizes:
        cands = [i for i in names if nodes[i].outs[0].rank >= 1 and nodes[i].outs[0].shape[0] == size]
        if len(cands) > 8:  # keep the search small: only the full set
            tries.append((size, set(cands)))
            continue
        subsets = [{c for k, c in enumerate(cands) if m >> k & 1} for m in range(1, 1 << len(cands))]
        tries.extend((size, s) for s in sorted(subsets, key=len, reverse=True))
    for size, chosen in tries:
        ax: dict[int, int | None] = {}
        try:
            for i, n in enumerate(nodes):
                ax[i] = (0 if i in chosen else None) if n.op == "input" else _batch_axis(n, nodes, ax)
        except _NoBatch:
            continue
        out_axes = [ax[r[0]] if r[1] == 0 else None for r in outs]
        if any(a is None for a in out_axes):
            continue
        return BatchDim(size, tuple(names[i] for i in sorted(chosen)), tuple(a for a in out_axes if a is not None))
    return None


# --------------------------------------------------------------------------- entry point


def analyze(g: Graph) -> GraphFacts:
    """Structural facts of the kernel graph ``g`` (see the module docstring)."""
    nodes = node_list(g)
    names = _input_names(nodes)
    sites = _softmax_sites(g)
    norm_inputs: dict[str, int] = {}
    normed: list[Ref] = []  # the operands norms divide by the size of
    for n in nodes:
        if OPS[n.op].has(Prop.NORMALISES) and "axis" in OPS[n.op].attrs:  # normalises along an axis
            normed.append(n.args[0])
            for j in _ancestors(nodes, n.args[0][0]):
                if j in names and nodes[j].outs[0].rank == n.outs[0].rank:
                    norm_inputs.setdefault(names[j], n.attr("axis"))
    for red in _eps_guarded_reductions(nodes):  # a norm by hand: the reduced operand's inputs of its rank
        operand = nodes[red].args[0]
        normed.append(operand)
        rank = nodes[operand[0]].outs[operand[1]].rank
        for j in _ancestors(nodes, operand[0]):
            if j in names and nodes[j].outs[0].rank == rank:
                norm_inputs.setdefault(names[j], int(nodes[red].attr("axis")) % max(rank, 1))
    # float16 inputs a norm squares with no contraction between: their squares overflow float16 past 256, the norm
    # does not (a kernel squaring in float16 is wrong on LLM-sized activations)
    wide = sorted({names[j] for r in normed for j in _ancestors(nodes, r[0], through_contractions=False)
                   if j in names and nodes[j].outs[0].dtype.short == "f16"})
    shifted = _max_shifted_logits(nodes)
    large = sorted({x for s in sites if s.stable for x in s.logit_inputs}
                   | {names[j] for r, _ in shifted for j in _ancestors(nodes, r[0]) if j in names})
    direct: dict[str, float] = {}
    for r, c in shifted:
        for j in _ancestors(nodes, r[0], through_contractions=False):
            if j in names:
                direct[names[j]] = min(c, direct.get(names[j], c))
    return GraphFacts(
        softmax=tuple(sites),
        scaling=tuple(_scaling(g)),
        batch=_batch(g),
        reduction_length=reduction_length(g),
        depth=depth(g),
        has_matmul=any(OPS[n.op].has(Prop.CONTRACTION) for n in nodes),
        norm_inputs=norm_inputs,
        large_inputs=tuple(large),
        large_direct=direct,
        wide_inputs=tuple(wide),
    )


def describe(f: GraphFacts) -> list[str]:
    """One line per fact, for docstrings and reports."""
    lines = []
    for s in f.softmax:
        kind = "stable" if s.stable else "naive"
        how = "no per-row shift reachable through the inputs"
        if s.plan is not None and s.invariant_outputs:
            how = f"per-row shift via input {s.plan.target!r}" + (f" (pinning {s.plan.pin!r})" if s.plan.pin else "")
        elif s.plan is not None:
            how = "a per-row shift also changes outputs outside the softmax"
        lines.append(f"{kind} softmax over axis {s.axis} of logits from {list(s.logit_inputs)}: {how}")
    for p in f.scaling:
        degs = ", ".join(str(d) for d in p.degrees)
        lines.append(f"scaling {p.name!r} by alpha>0 scales the outputs by alpha**({degs})"
                     + (" (a norm absorbs it)" if p.through_norm else ""))
    if f.batch is not None:
        lines.append(f"leading dim of {list(f.batch.inputs)} is a pure batch dim of size {f.batch.size}")
    lines.append(f"longest reduction: {f.reduction_length}; longest op chain: {f.depth}")
    return lines


def degree_factor(alpha: float, degree: Fraction) -> float:
    """``alpha ** degree`` for a positive ``alpha``."""
    return math.pow(alpha, float(degree))
