"""What the finite-field test's bounds read off a program: degree bounds and the stated false-accept bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...ir.graph import Graph, node_list
from ...ir.interpret import expand
from ...ir.opfacts import FAMILY_EXP
from ...ir.ops import OPS, Prop, TensorType
from .. import ffref
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


def _order_or_oracle(op: str, attrs: dict[str, Any], in_types: Sequence[TensorType]) -> bool:
    """Whether the registry models ``op`` in the field by an order (max-like) or a keyed random function: not by
    the rational function of its operands that the reference's degree analysis gives it
    (:data:`verimirage.smt.ffref.DEGREE_RULES`: ring operations, data movement, ``where`` as ``m a + (1 - m) b``),
    nor through its composition (``ir.interpret.expand``: an integer power's products, ``neg``, ``transpose``).
    Constants (a causal mask) are data."""
    d = OPS[op]
    if d.has(Prop.STRUCTURAL) or d.has(Prop.LOOP) or d.has(Prop.EXPONENTIAL) or d.has(Prop.CONSTANT):
        return False
    if d.family == "max":
        return True
    sub = expand(op, in_types, attrs)
    if sub is not None:
        return any(_order_or_oracle(m.op, m.attr_dict, [sub[j].outs[k] for j, k in m.args]) for m in sub
                   if m.op != "arg")
    return op not in ffref.DEGREE_RULES


def degree_info(g: Graph) -> DegreeInfo:
    """The degree bounds of ``g`` (:class:`DegreeInfo`): the reference evaluator's sums-of-quotients analysis
    (:func:`verimirage.smt.ffref.quotient_info`, the one the certificate checker uses) and the order / oracle
    ops of :data:`ORDER_ORACLE_OPS` it uses, at any level."""
    degree, atoms, applications = ffref.quotient_info(g)
    orders: set[str] = set()

    def walk(nodes: Sequence[Any]) -> None:
        for n in nodes:
            if n.op == "custom":
                walk(n.attr("block").nodes)
            elif n.op == "fused":
                walk(n.attr("thread").nodes)
            elif n.op not in ("input", "arg") and (n.op in ORDER_ORACLE_OPS or _order_or_oracle(
                    n.op, n.attr_dict, [nodes[j].outs[k] for j, k in n.args])):
                orders.add(n.op)

    walk(node_list(g))
    return DegreeInfo(degree, atoms, applications, tuple(sorted(orders)))


def degree_bound(g: Graph) -> tuple[int, int]:
    """(degree, atoms) for the per-node model bound: a rational-function degree bound of the outputs, sound
    for sums of quotients (:func:`degree_info`), and the number of exp / oracle nodes, treating each such node's
    result as a fresh variable: the reference evaluator's :func:`verimirage.smt.ffref.degree_bound`, which the
    certificate checker uses."""
    return ffref.degree_bound(g)


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
