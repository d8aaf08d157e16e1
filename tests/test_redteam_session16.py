"""Red team (sixteenth session): findings against the verifier, the certificate checker and what they trust, each
with the test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held16.py``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm

PROOFS = Path(__file__).resolve().parent.parent / "proofs"

def _exp_program(shape: tuple[int, int] = (16, 32)) -> tuple[vm.Graph, vm.MuGraph]:
    g = vm.Graph()
    x = g.input("X", shape, vm.float16)
    g.output(g.exp(g.add(x, x)))
    return g, vm.MuGraph.parse(str(g).replace("graph {", "mugraph {", 1))


def _hashed_certificate() -> Any:
    """A certificate of :func:`_exp_program` that records the Triton hash of the module ``vm.compile`` runs."""
    from verimirage.backend.tuning import tuned_module
    from verimirage.smt.certify import certify

    g, mg = _exp_program()
    return certify(g, mg, triton_source_hash=tuned_module(mg).digest)


def test_check_regenerated_the_triton_module_with_no_time_or_size_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium; a certificate you are handed holds the caller for as long as it likes): ``vm.check_certificate``
    (``check-cert``) regenerates the Triton module from the certificate's μGraph in the calling process, before the
    checker's verdict, with no bound: the checker process's time and memory caps do not cover it. A 0.75 MB μGraph
    of elementwise ops held ``check_certificate(cert, wall_s=2)`` 47-52 s (the code generator's time grows faster
    than the text; a 100 MB certificate: hours). Now a text over ``MAX_REGENERATE_CHARS`` is not regenerated (a
    rejection naming the limit), and the regeneration runs on a thread given until the check's wall-clock limit
    (``wall_s`` / ``$VERIMIRAGE_CHECK_SECONDS``): past it, a rejection naming the limit."""
    from verimirage.backend import tuning
    from verimirage.pipeline import certificates as P

    cert = _hashed_certificate()
    assert P.check_certificate(cert, isolate=False).proved  # (the certificate is right)
    release, calls = threading.Event(), []
    real = tuning.triton_digest

    def slow(mugraph: Any, mode: Any = None) -> str:  # (a code generator that takes its time)
        calls.append(mugraph)
        release.wait(45)
        return real(mugraph, mode)

    monkeypatch.setattr(tuning, "triton_digest", slow)
    try:
        t0 = time.monotonic()
        v = P.check_certificate(cert, isolate=False, wall_s=6)
        took = time.monotonic() - t0
    finally:
        release.set()
    assert not v.proved and "time limit" in v.reason, v.reason
    assert took < 25, took
    # a μGraph text over the bound is not handed to the code generator at all
    monkeypatch.setattr(P, "MAX_REGENERATE_CHARS", len(cert.mugraph_text) - 1)
    calls.clear()
    v = P.check_certificate(cert, isolate=False)
    assert not v.proved and "MAX_REGENERATE_CHARS" in v.reason and not calls, v.reason
    v = P.check_certificate(cert, isolate=False, mode="merge")  # (a launch mode's module likewise)
    assert not v.proved and "MAX_REGENERATE_CHARS" in v.reason and not calls, v.reason


@pytest.mark.parametrize(("field", "bad"), [("graph_text", None), ("mugraph_text", 7), ("queries", "q"),
                                            ("queries", 1.5), ("laws", {}), ("laws", [1]), ("cases", True),
                                            ("ff", []), ("reason", 3), ("versions", [1]), ("rules", [None])])
def test_wrong_typed_certificate_field_was_rejected_without_naming_it(field: str, bad: Any) -> None:
    """Finding (low; an unclear message, or none): a certificate field of the wrong JSON type was rejected through
    the checker's catch-all (``the check failed: AttributeError: 'NoneType' object has no attribute 'encode'`` for
    ``graph_text: null``, ``TypeError: object of type 'float' has no len()`` for ``queries: 1.5``), or as a
    mismatch (``laws: {}``: "laws differ from the re-derivation"; ``queries: "q"``: "1 stored queries"), and a
    wrong-typed ``reason`` or ``versions`` was accepted. The reader now checks every field against its declared
    type and names the field, what it got and what it expected."""
    from verimirage.smt.certificate import check_text

    d = json.loads(_hashed_certificate().to_json())
    d[field] = bad
    v = check_text(json.dumps(d))
    want = f"field {field!r}: got {json.dumps(bad)}; expected "
    assert not v.proved and want in v.reason and "the check failed" not in v.reason, v.reason
    if field in ("graph_text", "laws"):  # a sub-certificate of a certificate by regions is read the same way
        c = json.loads((PROOFS / "layer_decode_bs1_small.json").read_text())
        c["certificates"][0][field] = bad
        v = check_text(json.dumps(c))
        assert not v.proved and f"sub-certificate 0: certificate: {want}" in v.reason, v.reason


def _finite_where_the_source_is(g: vm.Graph, inputs: dict[str, Any], **search: Any) -> list[tuple[str, ...]]:
    """The rules of every candidate ``vm.superoptimize(g)`` returns that is non-finite on ``inputs`` (evaluated as
    the kernels compute) where the source is finite (asserted)."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    src, overflowed = evaluate_in_dtype(g, inputs)
    assert not overflowed and all(np.isfinite(o).all() for o in src)
    res = vm.superoptimize(g, cache=False, **search)
    assert res.candidates
    return [c.rules for c in res.candidates
            if not all(np.isfinite(o).all() for o in evaluate_in_dtype(c.mugraph, inputs, generated=True)[0])]


@pytest.mark.parametrize("shape", [(64, 16, 256, 16), (4096, 64, 1024, 64)])
def test_reassociated_product_rounded_a_product_of_two_weights_to_fp16_and_the_fp_check_passed_it(
        shape: tuple[int, int, int, int]) -> None:
    """Finding (medium-low; a Proved best candidate that is inf where the source is finite, behind an opt-in rule):
    with ``rulesets=["algebra"]`` (which turns on ``matmul-assoc``), the best candidate of the fp16 ``(X @ A) @ B``
    (X 64 x 16, A 16 x 256, B 256 x 16, so ``A @ B`` is the cheap bracketing) was ``X @ (A @ B)``: ``A @ B`` is
    rounded to fp16 for ``tl.dot`` and is inf at ``A``, ``B`` near 100 where the source, with ``X`` near 1e-4,
    never leaves 50. The numeric check ran (small size) and passed it: its input sets never make two inputs large
    and the third small; at 4096 x 64 x 1024 x 64 only the structural check runs, which followed sums (add/sub)
    into product operands, not products. Now a product's result (and a sum reduction, a loop sum) counts as a sum:
    no operand of a product may be one the source never rounds to a dtype as narrow."""
    import numpy as np

    m, d, r, n = shape
    g = vm.Graph()
    x, a, b = g.input("X", (m, d), vm.float16), g.input("A", (d, r), vm.float16), g.input("B", (r, n), vm.float16)
    g.output(g.matmul(g.matmul(x, a), b))
    rng = np.random.default_rng(16)
    inputs = {"X": rng.uniform(-1e-4, 1e-4, (m, d)), "A": rng.uniform(-100, 100, (d, r)),
              "B": rng.uniform(50, 100, (r, n))}
    assert _finite_where_the_source_is(g, inputs, rulesets=["algebra"]) == []


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(16, 32, 32), (2048, 1024, 1024)])
def test_factored_product_summed_two_wide_weights_and_the_fp_check_passed_it(dtype: str,
                                                                             shape: tuple[int, int, int]) -> None:
    """Finding (low; the values are extreme): the fifteenth session's rule against ``x @ (w1 + w2)`` for
    ``x @ w1 + x @ w2`` (rule ``matmul-add-factor``) looked at fp16 operands only. In bf16 and fp32 the sum is
    formed in fp32 and is inf once it passes 3.4e38: with the weights near 1.8e38 and ``x`` near 1e-3, the best
    candidate (every candidate, at both sizes) was inf where the source is finite, and the numeric check (small
    size) passed it. Now the rule compares each operand's dtype range with the source's sums'."""
    import numpy as np

    m, d, n = shape
    dt = getattr(vm, dtype)
    g = vm.Graph()
    x, a, b = g.input("X", (m, d), dt), g.input("A", (d, n), dt), g.input("B", (d, n), dt)
    g.output(g.add(g.matmul(x, a), g.matmul(x, b)))
    rng = np.random.default_rng(16)
    inputs = {"X": rng.uniform(-1e-3, 1e-3, (m, d)), "A": rng.uniform(1.75e38, 1.8e38, (d, n)),
              "B": rng.uniform(1.75e38, 1.8e38, (d, n))}
    assert _finite_where_the_source_is(g, inputs) == []


def test_search_cache_key_missed_changes_to_the_search_driver() -> None:
    """Finding (low; stale results, still re-checked): the search cache's key covers a digest of the code that decides
    a search result, ``CODE_PACKAGES = ("ir", "rewrite", "smt")``, written when ``superoptimize`` lived in
    ``rewrite/``. The search driver, its floating-point check, the regions and the options have since moved to
    ``pipeline/`` and the cost model asks the backend's launch model: a change to any of them (a fix to the fp
    check's rules, a new lowering choice in ``superopt``) kept serving results the new code would not return
    (re-checked by the certificate checker and the current fp check, so never unproved; but not this code's
    result, and ``recheck="best"`` serves the old best). Now ``pipeline/`` and ``backend/launch_model.py`` are
    hashed too."""
    import inspect

    from verimirage.backend import launch_model
    from verimirage.pipeline import fpsafe, options, pricing, regions, search_cache, superopt, synth

    hashed = {p.resolve() for _, p in search_cache.code_files()}
    for mod in (superopt, fpsafe, regions, synth, options, pricing, launch_model):
        assert Path(inspect.getfile(mod)).resolve() in hashed, mod.__name__


def test_mugraph_declaring_its_inputs_in_another_order_was_certified_and_served_and_ran_another_function(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium-high; wrong values, silently, from a served and re-checked candidate): the checker compared the
    two programs' inputs as a *sorted* list of names and types, so a μGraph of ``X @ W`` that declares ``W`` before
    ``X`` (``%0 = input W; %1 = input X; matmul %1, %0``) was Proved and its certificate re-checked. But a compiled
    program is called positionally in its own declaration order: ``vm.compile(mg)(x, w)`` computed ``w @ x`` (error
    18 on 16 x 16 normal inputs). A search-cache entry holding that μGraph with its (valid) certificate passed every
    check of ``search_cache.load`` and was served by ``vm.superoptimize``. The checker now requires the same inputs
    in the same order, and the search keeps no candidate that declares them in another."""
    import torch

    from verimirage.pipeline import search_cache
    from verimirage.pipeline.pricing import cost
    from verimirage.pipeline.superopt import Candidate, SearchReport, SearchResult
    from verimirage.smt.certificate import check_text
    from verimirage.smt.certify import make_certificate

    g = vm.Graph()
    g.output(g.matmul(g.input("X", (16, 16), vm.float32), g.input("W", (16, 16), vm.float32)))
    swapped = vm.MuGraph.parse("mugraph {\n  %0 = input {name='W'} : f32[16,16]\n  %1 = input {name='X'} : "
                               "f32[16,16]\n  %2 = matmul %1, %0 : f32[16,16]\n  return %2\n}")
    v = vm.verify(g, swapped)  # (equal as functions of named inputs: vm.verify's meaning)
    assert v.proved
    x, w = torch.randn(16, 16), torch.randn(16, 16)
    assert (vm.compile(swapped)(x, w) - x @ w).abs().max() > 1  # (called positionally: w @ x)
    cert = make_certificate(g, swapped, v)
    r = check_text(cert.to_json())
    assert not r.proved and "names, order" in r.reason, r.reason
    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    key = search_cache.cache_key(g, {"red": "team"})
    search_cache.save(key, SearchResult([Candidate(swapped, cost(swapped), v, cert, ())], SearchReport()))
    assert search_cache.load(key, g, recheck="all") is None
    # the search's default verifier keeps no such candidate
    from verimirage.pipeline.superopt import _default_verifier

    assert not _default_verifier(g, 10.0, 0)(g, swapped).proved


@pytest.mark.parametrize("shape", [(16, 32, 16), (256, 256, 64)])
def test_exp_of_a_difference_of_two_sums_split_into_a_quotient_of_exps_overflowed_and_the_fp_check_passed_it(
        shape: tuple[int, int, int]) -> None:
    """Finding (medium; a Proved best candidate that is inf where the source is finite, default rules): attention
    with a bias from a softmax statistic kept in two parts (the max ``M`` and the log-sum ``LL``, as a split-KV
    combine or ring attention keeps them), ``exp((Q K + B) - (M + LL)) @ V`` in fp16. Rules exp-sub and
    defer-normalisation give ``(exp(Q K + B) @ V) / exp(M + LL)``: inf / inf at logits near 100, where the source
    is at most 1. The fifteenth session's rule (where the source exps only sums or differences, the candidate must
    too) passed it, both exps being of sums; at 16 x 32 x 16 the numeric check ran and passed it too (its input
    sets never put the logits and the statistic near 100 together). Now, where the source exps only sums or
    differences, every exp of the candidate must read the same program inputs as one of the source's."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    t, n, d = shape
    g = vm.Graph()
    q, k, v = g.input("Q", (1, t, d), vm.float16), g.input("K", (1, d, n), vm.float16), g.input("V", (1, n, d),
                                                                                               vm.float16)
    b, m, ll = g.input("B", (1, t, n), vm.float16), g.input("M", (1, t, 1), vm.float16), g.input("LL", (1, t, 1),
                                                                                               vm.float16)
    g.output(g.matmul(g.exp(g.sub(g.add(g.matmul(q, k), b), g.add(m, ll))), v))
    rng = np.random.default_rng(16)
    qs, ks = rng.uniform(-1, 1, (1, t, d)), rng.uniform(-1, 1, (1, d, n))
    inputs = {"Q": qs, "K": ks, "V": rng.uniform(-1, 1, (1, n, d)), "B": 100 - qs @ ks + rng.uniform(-1, 1, (1, t, n)),
              "M": np.full((1, t, 1), 95.0), "LL": np.full((1, t, 1), 5.0 + np.log(n))}
    src, _ = evaluate_in_dtype(g, inputs)
    assert np.abs(src[0]).max() < 64  # (the source is finite and small)
    assert _finite_where_the_source_is(g, inputs, top_k=4, variants=1) == []


@pytest.mark.slow
def test_bf16_norm_prologue_multiplied_the_accumulator_by_the_rms_before_dividing_it_out() -> None:
    """Finding (low; extreme values; open in session 16, fixed in session 17): ``rms_norm(X, w) @ W`` in bf16 at
    256 x 512 x 256 (above the numeric check's limit). The ``partition.prologue_norm_scales`` candidates (the 5th to
    8th by cost) computed ``acc = ((X / r) w) @ W`` with ``r`` the row's rms, then ``acc * r``, then
    ``* rsqrt(mean(X^2) + eps)``: with ``X`` near 3e4 (``r`` 1.7e4) and the output near 1.5e37 (``w`` near 1e30,
    ``W`` near 3e4), ``acc * r`` is inf in fp32 where the source is finite (fp16 held: its output and ``r`` are at
    most 65504). Now the pass multiplies ``acc`` by ``r * rsqrt(...)`` (about 1) in one step
    (``stabilise._fold_rescaled``)."""
    import numpy as np

    t, h, n = 256, 512, 256
    g = vm.Graph()
    x, w, wm = g.input("X", (t, h), vm.bfloat16), g.input("w", (h,), vm.bfloat16), g.input("W", (h, n), vm.bfloat16)
    g.output(g.matmul(g.rms_norm(x, w, axis=1, eps=1e-6), wm))
    rng = np.random.default_rng(0)
    inputs = {"X": rng.uniform(-3e4, 3e4, (t, h)), "w": rng.uniform(5e29, 1e30, (h,)),
              "W": rng.uniform(-3e4, 3e4, (h, n))}
    assert _finite_where_the_source_is(g, inputs, top_k=4, variants=1, time_budget_s=60) == []
    res = vm.superoptimize(g, cache=False, top_k=4, variants=1, time_budget_s=60)
    assert any("partition.prologue_norm_scales" in c.rules for c in res.candidates)  # (the form was searched)
