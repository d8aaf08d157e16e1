"""Real models' gaps, twenty-first session: the abstract derivation's size is bounded.

The twentieth session's per-value concat cuts (:func:`verimirage.smt.abstract._split`, 8f83240) let the Whisper
stem's composition check (``smt.glue.undefined_fed -> derive_all -> derive_on``) derive an output it used to give
up on at once: LayerNorm, attention and GELU over two convolutions at one time step. A term is a graph of shared
tuples, but hashing, comparing and printing it (the canonical sorts' keys) walk it as a tree, which grows by a factor
at every nesting: one derivation built terms of a million tree nodes, its sort keys alone took gigabytes, and the
CI worker was killed at 22 GB. The derivation had a time budget, checked every 1024th step, and each step was
hashing such a tree. Now every polynomial a derivation builds is charged its tree size
(:func:`verimirage.smt.expr.size`) against one budget shared by all the cases of a check
(:data:`verimirage.smt.limits.MAX_DERIVED_NODES`): past it the check is Unknown, naming the bound. The cut key cache
is bounded by characters too. The per-value cuts are back under that bound (tests/test_capture_session20.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.smt import abstract as A
from verimirage.smt import expr as E
from verimirage.smt import limits
from verimirage.smt.verdict import Outcome
from verimirage.smt.verify import abstract_check

ROOT = Path(__file__).resolve().parent.parent
F32 = vm.float32

#: runs one composition check in a child capped at 3 GiB of address space (the old code's derivation grew past
#: 13 GB: it must not take the machine down with it); prints its answer and the child's peak RSS (KB)
_CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import verimirage as vm
from verimirage.smt import deep, glue
case = json.load(open(sys.argv[1]))
g = vm.Graph.parse(case["graph"])
why = deep.deep_call(glue.undefined_fed, g, [glue.region_of(g, m) for m in case["regions"]])
print(json.dumps([why, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))
"""


@pytest.mark.slow  # (15-55 s on the loaded 2-core machine: the derivation runs up to its bound)
def test_concat_cuts_blew_derivation_memory_on_whisper_stem() -> None:
    """The Whisper stem's composition check with the per-value cuts on: it derived for minutes past 13 GB (the
    xdist worker was killed); now the derivation stops at its size bound and the composition is not shown
    defined (fails closed: Unknown), within a few hundred MB."""
    case = ROOT / "tests" / "cases" / "whisper_stem_composition.json"
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(case)], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the composition check ran past 300 s")
    assert r.returncode == 0, r.stderr[-2000:]  # (a MemoryError under the cap fails here)
    why, peak_kb = json.loads(r.stdout.strip().splitlines()[-1])
    assert why is not None and f"more than {limits.MAX_DERIVED_NODES} nodes" in why, why
    assert peak_kb < 1_500_000, peak_kb


def _doubling(n: int) -> vm.Graph:
    """``x <- x + exp(x)``, ``n`` times: a graph of ``n`` nodes whose expression's tree doubles at each (each step's
    sum holds the last one twice: beside its exp and inside it)."""
    g = vm.Graph()
    x = g.input("X", (2,), F32)
    for _ in range(n):
        x = g.add(x, g.exp(x))
    g.output(x)
    return g


def test_a_term_whose_tree_doubles_ends_in_unknown_naming_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # (monkeypatch.setattr raises on code without the bound: the 40 doublings, 2**40 tree nodes, never start there)
    monkeypatch.setattr(limits, "MAX_DERIVED_NODES", 1 << 20)
    g = _doubling(40)
    r = abstract_check(g, g)
    assert r.outcome == Outcome.UNKNOWN and f"more than {1 << 20} nodes" in r.reason, r.reason
    v = vm.verify(g, g)
    assert not v.proved and "nodes" in v.reason, v.reason
    small = _doubling(8)  # (2**8-fold: well inside the bound, proved as before)
    assert abstract_check(small, small).outcome == Outcome.PROVED


def _rolled(n: int) -> vm.Graph:
    """``x``'s rows rolled by -1 and viewed ``(n // 4, 4, 3)``, each element through a few exps (so each case's
    derivation costs nodes): the per-value cuts make several cases."""
    g = vm.Graph()
    x = g.input("X", (n, 3), F32)
    y = g.reshape(g.concat([g.slice(x, 0, 1, n), g.slice(x, 0, 0, 1)], 0), (n // 4, 4, 3))
    for _ in range(4):
        y = g.add(y, g.exp(y))
    g.output(y)
    return g


def test_the_bound_is_shared_by_every_case_of_a_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cuts are not free: each case's derivation is charged to one budget, so a check of many cases stops where
    one case alone would pass."""
    g = _rolled(16)
    cases, _ = A.derive_all([g])
    assert len(cases[0]) > 2
    room = [limits.MAX_DERIVED_NODES]
    A.derive_on(g, cases[0][0], 0, room)
    one = limits.MAX_DERIVED_NODES - room[0]  # (the nodes one case's terms have)
    monkeypatch.setattr(limits, "MAX_DERIVED_NODES", 2 * one)
    A.derive_on(g, cases[0][0], 0)  # (one case alone fits)
    with pytest.raises(E.ResourceLimit, match="nodes"):
        A.derive_all([g])
    assert abstract_check(g, g).outcome == Outcome.UNKNOWN
