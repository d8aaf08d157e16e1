"""The subexpression query for pruning partial candidates during search.

``may_be_subexpression(partial, target)`` asks: can the values ``partial``
computes be part of a program equal to ``target``? It is a fast, conservative
over-approximation of "is a subexpression of the target's abstract expression
(under the algebra's laws)".

How it decides
--------------
The ring operations (add, sub, mul, div, matmul, sums, scaling, data movement)
can be rearranged freely by the laws, so they never cause pruning. The
*uninterpreted* functions cannot: in the abstract expressions (and in the
finite-field test) ``exp``, ``silu``, ``gelu``, ``relu``, ``sqrt``/``rsqrt``
and ``max`` are opaque, so a program equal to the target can only apply such a
function to an argument equal to one the target applies it to. Each application
is summarised as an *atom*: its function family and the set of program inputs
its argument depends on. A partial program is pruned (``False``) only if one of
its atoms is not *covered* by the target: the target applies a covering family
and the atom's inputs are among the inputs of the target's arguments of those
families (their union: exp(a + b) = exp(a) exp(b) may merge or split them):

* ``exp`` (also inside ``rescaled_sum``): covered by ``exp`` (exp(a - m)
  rescaling keeps the inputs of the target's arguments);
* ``max`` (``max``, ``maximum``, ``loop_max``, ``running_max``): covered by
  ``max``, ``exp`` or ``relu`` (a max subtracted before exp is the softmax
  shift, valid whatever the target's form);
* ``sqrt`` family (``sqrt``, ``rsqrt``, the root inside ``rms_norm``):
  covered by the ``sqrt`` family (rsqrt = 1/sqrt);
* ``silu``, ``gelu``, ``relu``: by the same function.

Guarantee: ``False`` only when some value the partial program computes applies
an opaque function the target's family never applies, or applies it to an
argument that depends on an input none of the target's arguments of that
family depends on. In a program equal to the
target such a value would have to cancel out (be multiplied by zero or
subtracted from itself), which no rewrite of the search produces; so the query
**never returns False for a sub-result of a real design**. ``True`` means only
"not ruled out". Results are cached by program structure (canonical text).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from ..ir.builders import Tensor
from ..ir.errors import GraphError
from ..ir.graph import BlockGraph, Graph, Node, ThreadGraph, node_list
from ..ir.opfacts import FAMILY_COVERS
from ..ir.ops import OPS

log = logging.getLogger(__name__)

Deps = frozenset[str] | None  # input names a value depends on; None: unknown (never pruned)
Atom = tuple[str, Deps]



def _covered_by(family: str) -> tuple[str, ...]:
    """Which target families cover a partial program's atom of ``family`` (the registry's FAMILY_COVERS)."""
    return FAMILY_COVERS.get(family, (family,))


def _union(ds: Sequence[Deps]) -> Deps:
    out: set[str] = set()
    for d in ds:
        if d is None:
            return None
        out |= d
    return frozenset(out)


class _Analysis:
    """Per node of one program level: the inputs each result depends on and the atoms the node applies."""

    def __init__(self, nodes: Sequence[Node], arg_deps: Sequence[Deps]) -> None:
        self.nodes = nodes
        self.deps: list[list[Deps]] = []
        self.atoms: list[frozenset[Atom]] = []
        for n in nodes:
            a = [self.deps[i][k] for i, k in n.args]
            own: set[Atom] = set()
            if n.op == "input":
                if n.attr("name") is not None:  # kernel-level input
                    d: list[Deps] = [frozenset([str(n.attr("name"))])]
                else:  # block-level input: the kernel operand it reads
                    k = n.attr("arg")
                    d = [arg_deps[k] if k is not None and k < len(arg_deps) else None]
            elif n.op == "arg":
                k = n.attr("index")
                d = [arg_deps[k] if k is not None and k < len(arg_deps) else None]
            elif n.op == "custom":
                inner = _Analysis(n.attr("block").nodes, a)
                own |= inner.all_atoms()
                d = [inner.deps[i][k] for i, k in n.attr("block").outputs]
            elif n.op == "fused":
                tg: ThreadGraph = n.attr("thread")
                inner = _Analysis(tg.nodes, a)
                own |= inner.all_atoms()
                d = [inner.deps[i][k] for i, k in tg.outputs]
            else:
                u = _union(a)
                d = [u] * len(n.outs)
                od = OPS[n.op]
                if od.family is not None:
                    # rescaled_sum: acc * exp(m_prev - m) + x (the 2nd operand's family); rms_norm: x * rsqrt(..)
                    k = od.hooks.get("family_arg")
                    own.add((od.family, u if k is None else a[k]))
            self.deps.append(d)
            self.atoms.append(frozenset(own))

    def all_atoms(self) -> frozenset[Atom]:
        out: set[Atom] = set()
        for s in self.atoms:
            out |= s
        return frozenset(out)

    def atoms_upto(self, i: int) -> frozenset[Atom]:
        """Atoms of node ``i`` and all its ancestors."""
        seen = {i}
        todo = [i]
        out: set[Atom] = set()
        while todo:
            j = todo.pop()
            out |= self.atoms[j]
            for a, _ in self.nodes[j].args:
                if a not in seen:
                    seen.add(a)
                    todo.append(a)
        return frozenset(out)


_CACHE: dict[str, tuple[frozenset[Atom], frozenset[str]]] = {}
_CACHE_MAX = 2048


def _program_atoms(g: Graph) -> tuple[frozenset[Atom], frozenset[str]]:
    """All atoms of a program and its input names, cached by canonical text."""
    key = f"{type(g).__name__}\n{g}"
    r = _CACHE.get(key)
    if r is None:
        r = (_Analysis(node_list(g), ()).all_atoms(), frozenset(str(t.name) for t in g.inputs))
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = r
    return r


def _covered(atom: Atom, target: frozenset[Atom], inputs: frozenset[str]) -> bool:
    fam, d = atom
    if d is None:
        return True
    if not d <= inputs:
        return False
    cover: set[str] = set()
    for tf, td in target:
        if tf in _covered_by(fam):
            if td is None:
                return True
            cover |= td
    return any(tf in _covered_by(fam) for tf, _ in target) and d <= cover


@lru_cache(maxsize=4096)
def _query(partial_atoms: frozenset[Atom], target_atoms: frozenset[Atom], inputs: frozenset[str]) -> bool:
    return all(_covered(a, target_atoms, inputs) for a in partial_atoms)


def partial_atoms(partial: Any) -> frozenset[Atom]:
    """The atoms (opaque function family, input dependencies) a partial program or tensor computes."""
    if isinstance(partial, Tensor):
        if not isinstance(partial.owner, Graph):
            raise GraphError("may_be_subexpression: the tensor does not belong to a kernel graph or μGraph; "
                             "pass its BlockGraph instead")
        return _Analysis(node_list(partial.owner), ()).atoms_upto(partial.ref[0])
    if isinstance(partial, Graph):
        return _program_atoms(partial)[0]
    if isinstance(partial, BlockGraph):  # operands unknown: block inputs depend on anything
        return _Analysis(partial.nodes, ()).all_atoms()
    raise GraphError(f"may_be_subexpression: got a {type(partial).__name__}; expected a vm.Graph, vm.MuGraph, "
                     "BlockGraph or a Tensor of a graph")


def may_be_subexpression(partial: Any, target: Graph) -> bool:
    """Can the values ``partial`` computes be part of a program equal to ``target``?

    ``partial``: a (partial) ``vm.Graph``/``vm.MuGraph`` (every value it computes is asked about), a
    ``Tensor`` of one (that value and its ancestors), or a ``BlockGraph`` (its operands are taken to
    depend on anything). **Never returns False for a sub-result of a real design** (see the module
    docstring for the exact condition); False prunes: no program equal to ``target`` can contain it.
    Cached by program structure.
    """
    if not isinstance(target, Graph):
        raise GraphError(f"may_be_subexpression: the target is a {type(target).__name__}; expected a vm.Graph "
                         "or vm.MuGraph")
    t_atoms, inputs = _program_atoms(target)
    ok = _query(partial_atoms(partial), t_atoms, inputs)
    if not ok:
        log.debug("pruned: partial atoms %s not covered by the target's %s", partial_atoms(partial), t_atoms)
    return ok


def explain(partial: Any, target: Graph) -> list[Atom]:
    """The partial program's atoms that no target atom covers (empty: not pruned)."""
    t_atoms, inputs = _program_atoms(target)
    return sorted((a for a in partial_atoms(partial) if not _covered(a, t_atoms, inputs)),
                  key=lambda a: (a[0], sorted(a[1] or ())))


__all__ = ["explain", "may_be_subexpression", "partial_atoms"]
