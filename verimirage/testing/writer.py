"""``write_tests``: a standalone pytest + hypothesis module that checks a kernel for a graph.

The written module embeds the graph (JSON, with its text form in comments),
the kernel reference (see :mod:`verimirage.testing.kernels`), the
tolerances, and the properties that the graph's structure implies (see
:mod:`verimirage.testing.analysis`):

* ``test_matches_reference`` — the kernel against the float64 reference
  (``vm.evaluate``) on every applicable value regime (each one at least
  once, as an explicit example) and memory layout;
* ``test_softmax_shift_*`` — a per-row shift of a softmax's logits (made
  through the inputs) leaves the outputs unchanged;
* ``test_scaling_*`` — scaling an input by a power of two scales each output
  by ``alpha**degree`` (degree 0: a norm is unchanged by scaling its input);
* ``test_batch_slice`` — the results for a gather of the leading batch dim
  (slice, permutation, repetition) equal that gather of the results;
* ``test_deterministic`` — two runs are bit-identical and leave the inputs
  unchanged;
* ``test_kernel_is_verified`` — for a μGraph kernel, ``vm.verify`` proves it
  equal to the graph.

With ``explore=True`` the kernel is run while writing, and a failing input
found for a regime is pinned as an ``@example`` (its exact bytes and memory
layout), so the failure is re-checked first on every run.

On a machine without CUDA the module sets ``TRITON_INTERPRET=1`` before the
kernel is loaded, so Triton kernels run in the interpreter; with CUDA the
tensors live on the GPU and kernels run compiled.
"""

from __future__ import annotations

import logging
import pprint
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph
from .analysis import analyze, describe
from .checks import check_reference, tolerances
from .kernels import kernel_ref, load_kernel
from .strategies import REGIMES, applicable_regimes, encode_inputs, inputs

log = logging.getLogger(__name__)

ALPHAS: tuple[float, ...] = (0.25, 0.5, 2.0, 4.0)


@dataclass
class WrittenTests:
    """What :func:`write_tests` wrote: the path, the tests, the facts they rest on, the pinned failures."""

    path: Path
    tests: list[str]
    facts: list[str]
    kernel: str
    pinned: list[str] = field(default_factory=list)


def _default_kernel(graph: Graph) -> tuple[dict[str, Any], str]:
    import verimirage as vm

    res = vm.superoptimize(graph)
    best = res.best
    if best is None:
        raise GraphError("write_tests: superoptimize found no verified candidate; pass kernel= explicitly")
    desc = f"vm.compile of the best verified candidate of vm.superoptimize (cost {best.cost}, rules {list(best.rules)})"
    return {"kind": "mugraph", "json": best.mugraph.to_json()}, desc


def _explore(
    graph: Graph, kernel: Any, regimes: Sequence[str], allow_nc: bool, n: int, seed: int
) -> list[tuple[str, Any, str]]:
    """Failing inputs found by running ``kernel``: (regime, input dict, message), one per regime at most."""
    import numpy as np
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from ..ir.reference import evaluate

    tols = tolerances(graph)
    found = []
    for regime in regimes:
        msgs: dict[int, str] = {}

        def fails(case: Any, msgs: dict[int, str] = msgs) -> bool:
            refs = evaluate(graph, case)
            if not all(np.all(np.isfinite(r)) for r in refs):
                return False
            try:
                check_reference(kernel, graph, case, tols, refs)
            except AssertionError as e:
                msgs[id(case)] = str(e).splitlines()[0]
                return True
            except Exception as e:  # a crash is a failure too
                msgs[id(case)] = f"{type(e).__name__}: {e}".splitlines()[0]
                return True
            return False

        st = inputs(graph, regimes=(regime,), allow_noncontiguous=allow_nc)
        try:
            case = find(
                st,
                fails,
                settings=settings(max_examples=n, deadline=None, database=None,
                                  suppress_health_check=list(HealthCheck)),
                random=__import__("random").Random(seed),
            )
        except NoSuchExample:
            continue
        fails(case)  # the message of the shrunk example
        found.append((regime, case, msgs.get(id(case), "fails")))
        log.info("write_tests: pinned a failing %s-regime input: %s", regime, msgs.get(id(case)))
    return found


_HEADER = '''"""Property-based tests of a kernel for a verimirage graph (written by verimirage.testing.write_tests).

Kernel: {kernel_desc}

What the graph's structure implies (each is a test below where it applies):
{facts}

Run on its own: pytest {name}
(without CUDA the kernel runs in Triton's interpreter; with CUDA, on the GPU).
Regenerate with vm.testing.write_tests instead of editing.
"""
# ruff: noqa
from __future__ import annotations

import functools
import os
from fractions import Fraction

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel module is imported

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import verimirage as vm
from verimirage.testing import checks, kernels, strategies
from verimirage.testing.analysis import BatchDim, ScalingProperty, ShiftPlan

# The graph under test:
{graph_text}
GRAPH = vm.Graph.from_json({graph_json!r})

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KERNEL_REF = {kernel_ref}

# Per-output tolerances: |out - ref| <= rtol*|ref| + atol*rms(ref) + floor, rtol = atol = u*(4 + log2(K) + D).
TOLS = {tols}
REGIMES = {regimes!r}
NONCONTIGUOUS = {allow_nc!r}
MAX_EXAMPLES = {max_examples} if DEVICE == "cpu" else {gpu_max_examples}
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    phases={phases},
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
FEW = settings(SETTINGS, max_examples=max(2, MAX_EXAMPLES // 4))

INPUTS = strategies.inputs(GRAPH, regimes=REGIMES, allow_noncontiguous=NONCONTIGUOUS, device=DEVICE)
NORMAL = strategies.inputs(GRAPH, regimes=("normal",), allow_noncontiguous=NONCONTIGUOUS, device=DEVICE)

# Failing inputs found while writing (exact bytes and memory layout), re-checked first.
PINNED = {pinned}


def every_regime(test):
    """One input of each value regime as an explicit example: hypothesis samples the regimes at random, and ten
    examples drew no ``large`` one for a float16 norm whose kernel squared in float16 (it passed)."""
    for regime in REGIMES:
        test = example(case=strategies.make_inputs(GRAPH, regime, 0, device=DEVICE))(test)
    return test


@functools.cache
def kernel():
    """The kernel under test, loaded once."""
    return kernels.load_kernel(KERNEL_REF)
'''


def _seed_deco(seed: int | None) -> str:
    return f"@hypothesis_seed({seed})\n" if seed is not None else ""


def write_tests(
    graph: Graph,
    path: str | Path,
    *,
    kernel: Any = None,
    regimes: Sequence[str] | None = None,
    allow_noncontiguous: bool = True,
    max_examples: int = 10,
    gpu_max_examples: int = 100,
    explore: bool = False,
    explore_examples: int = 30,
    seed: int | None = None,
    allow_tf32: bool = True,
    shrink: bool = True,
) -> WrittenTests:
    """Write a standalone pytest + hypothesis module at ``path`` that checks a kernel for ``graph``.

    ``kernel``: ``None`` (``vm.compile`` of ``vm.superoptimize(graph).best``,
    its μGraph embedded in the module), a ``vm.MuGraph`` or Candidate (compiled
    with ``vm.compile``), a ``"module:function"`` or ``"file.py:function"``
    string, or a callable on torch tensors (inputs in ``graph.inputs`` order;
    returns a tensor or a tuple), recorded by reference — see
    :mod:`verimirage.testing.kernels` for what can be referenced.
    ``regimes``: value regimes of the reference test (default: those that
    apply). ``max_examples`` / ``gpu_max_examples``: hypothesis examples per
    test without / with CUDA. ``explore``: run the kernel now and pin failing
    inputs as ``@example``s. ``seed``: fix hypothesis' seed in the module.
    ``allow_tf32``: float32 matmuls may round like TF32 (Triton's default).
    ``shrink``: let hypothesis shrink failures (off: faster failing runs for slow kernels).
    """
    if not isinstance(graph, Graph) or isinstance(graph, MuGraph):
        raise GraphError(f"write_tests: expected a kernel-level vm.Graph, got {type(graph).__name__}")
    graph.check()
    facts = analyze(graph)
    regs = tuple(regimes) if regimes is not None else applicable_regimes(graph, facts)
    if not regs or any(r not in REGIMES for r in regs):
        raise GraphError(f"write_tests: regimes {list(regs)}; expected a non-empty subset of {list(REGIMES)}")
    path = Path(path)
    if path.suffix != ".py":
        raise GraphError(f"write_tests: path {str(path)!r}; expected a .py file (pytest collects test_*.py)")

    if kernel is None:
        ref, kdesc = _default_kernel(graph)
    else:
        ref = kernel_ref(kernel)
        kdesc = {"mugraph": "vm.compile of a given μGraph", "import": f"{ref.get('target')}",
                 "pickle": f"pickled {type(kernel).__name__}"}[ref["kind"]]
        if ref["kind"] != "mugraph":
            loaded = load_kernel(ref)  # fail now, not in the written module
            if ref["kind"] == "import" and loaded is not kernel and not isinstance(kernel, str):
                log.warning("write_tests: %s resolves to a different object than the kernel given", ref["target"])

    pinned: list[tuple[str, Any, str]] = []
    if explore:
        live = load_kernel(ref) if kernel is None or isinstance(kernel, (str, MuGraph)) or ref["kind"] == "mugraph" \
            else kernel
        pinned = _explore(graph, live, regs, allow_noncontiguous, explore_examples, 0 if seed is None else seed)

    tols = tolerances(graph, allow_tf32=allow_tf32)
    graph_text = "\n".join("#   " + line for line in str(graph).splitlines())
    fact_lines = describe(facts)
    body = [
        _HEADER.format(
            kernel_desc=kdesc,
            facts="\n".join(f"  - {x}" for x in fact_lines),
            name=path.name,
            graph_text=graph_text,
            graph_json=graph.to_json(),
            kernel_ref=pprint.pformat(ref, width=110, sort_dicts=False),
            tols="[\n    " + ",\n    ".join(f"checks.{t!r}" for t in tols) + ",\n]",
            regimes=regs,
            allow_nc=allow_noncontiguous,
            max_examples=max_examples,
            gpu_max_examples=gpu_max_examples,
            phases="tuple(Phase)" if shrink else "tuple(p for p in Phase if p is not Phase.shrink)",
            pinned=pprint.pformat([encode_inputs(c) for _, c, _ in pinned], width=110, compact=True, sort_dicts=False),
        )
    ]
    tests = []
    sd = _seed_deco(seed)

    ex = "".join(
        f"@example(case=strategies.decode_inputs(PINNED[{i}], device=DEVICE))  # {reg}: {msg[:150]}\n"
        for i, (reg, _, msg) in enumerate(pinned)
    )
    body.append(
        f"\n\n{sd}@SETTINGS\n@given(case=INPUTS)\n{ex}@every_regime\ndef test_matches_reference(case):\n"
        f'    """The kernel matches the float64 reference (vm.evaluate) within the per-dtype tolerances."""\n'
        f"    checks.check_reference(kernel(), GRAPH, case, TOLS)\n"
    )
    tests.append("test_matches_reference")

    k = 0
    for s in facts.softmax:
        if s.plan is None or not s.invariant_outputs:
            continue
        body.append(
            f"\n\nSHIFT_{k} = {s.plan!r}\n\n\n{sd}@SETTINGS\n"
            f"@given(case=NORMAL, shift_seed=st.integers(0, 2**32 - 1))\n"
            f"def test_softmax_shift_{k}(case, shift_seed):\n"
            f'    """The {"stable" if s.stable else "naive"} softmax over axis {s.axis} is unchanged by a per-row '
            f'shift of its logits."""\n'
            f"    checks.check_softmax_shift(kernel(), GRAPH, case, SHIFT_{k}, shift_seed, TOLS)\n"
        )
        tests.append(f"test_softmax_shift_{k}")
        k += 1

    for p in facts.scaling:
        ident = "".join(c if c.isalnum() else "_" for c in p.name)
        kind = "a norm absorbs the scale" if p.through_norm else "the outputs are homogeneous in it"
        body.append(
            f"\n\nSCALING_{ident} = {p!r}\n\n\n{sd}@SETTINGS\n@given(case=NORMAL, alpha=st.sampled_from({ALPHAS!r}))\n"
            f"def test_scaling_{ident}(case, alpha):\n"
            f'    """Scaling input {p.name!r} by alpha scales the outputs by alpha**degree ({kind})."""\n'
            f"    checks.check_scaling(kernel(), GRAPH, case, SCALING_{ident}, alpha, TOLS)\n"
        )
        tests.append(f"test_scaling_{ident}")

    if facts.batch is not None:
        b = facts.batch
        body.append(
            f"\n\nBATCH = {b!r}\n\n\n{sd}@SETTINGS\n"
            f"@given(case=INPUTS, idx=st.lists(st.integers(0, {b.size - 1}), min_size={b.size}, max_size={b.size}))\n"
            f"def test_batch_slice(case, idx):\n"
            f'    """Results for a gather of the leading batch dim equal that gather of the results."""\n'
            f"    checks.check_batch(kernel(), GRAPH, case, BATCH, idx, TOLS)\n"
        )
        tests.append("test_batch_slice")

    body.append(
        f"\n\n{sd}@FEW\n@given(case=INPUTS)\ndef test_deterministic(case):\n"
        f'    """Two runs are bit-identical and the inputs are left unchanged."""\n'
        f"    checks.check_deterministic(kernel(), GRAPH, case)\n"
    )
    tests.append("test_deterministic")

    if ref["kind"] == "mugraph":
        body.append(
            "\n\ndef test_kernel_is_verified():\n"
            '    """The embedded μGraph is proved equal to the graph."""\n'
            '    pytest.importorskip("verimirage.smt.verify", reason="vm.verify is not available in this install")\n'
            "    verdict = vm.verify(GRAPH, vm.MuGraph.from_json(KERNEL_REF['json']))\n"
            "    assert isinstance(verdict, vm.Proved), verdict\n"
        )
        tests.append("test_kernel_is_verified")

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(body))
    log.info("write_tests: wrote %s (%s)", path, ", ".join(tests))
    return WrittenTests(path, tests, fact_lines, kdesc, [f"{r}: {m}" for r, _, m in pinned])
