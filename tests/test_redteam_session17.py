"""Red team, seventeenth session: regression tests, each named after what went wrong and failing on the code
before its fix (see /work/wt/report_redteam17.md for the ranking)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm


def _gated_norm_ffn(t: int, h: int, n: int) -> vm.Graph:
    g = vm.Graph()
    x, w = g.input("X", (t, h), vm.bfloat16), g.input("w", (h,), vm.bfloat16)
    wg, wu = g.input("Wg", (h, n), vm.bfloat16), g.input("Wu", (h, n), vm.bfloat16)
    a = g.rms_norm(x, w, axis=1, eps=1e-6)
    g.output(g.mul(g.sigmoid(g.matmul(a, wg)), g.matmul(a, wu)))
    return g


def test_bf16_gated_norm_prologue_multiplied_both_accumulators_by_the_rms_before_dividing_it_out() -> None:
    """Finding (low; extreme values): the sixteenth session's open bf16 prologue item, in its fused form. For
    ``sigmoid(rms_norm(X, w) @ Wg) * (rms_norm(X, w) @ Wu)`` in bf16 the ``prologue_norm_scales`` candidates fed
    ``acc_g * s`` and ``acc_u * s`` (``s`` the row's rms, computed before the loop) into the fused epilogue, which then
    multiplied each by ``rsqrt(mean(X^2) + eps)``: with ``X`` near 3e4 and the up projection near 1.5e37 (``w`` near
    1e30), ``acc_u * s`` is inf in fp32 where the source is finite. Now each is ``acc * (s * rsqrt(...))`` inside the
    thread graph (``s`` one more operand of it): finite, and still Proved."""
    import numpy as np

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    t, h, n = 64, 256, 64
    g = _gated_norm_ffn(t, h, n)
    rng = np.random.default_rng(0)
    inputs = {"X": rng.uniform(-3e4, 3e4, (t, h)), "w": rng.uniform(5e29, 1e30, (h,)),
              "Wg": rng.uniform(-3e4, 3e4, (h, n)), "Wu": rng.uniform(-3e4, 3e4, (h, n))}
    src, overflowed = evaluate_in_dtype(g, inputs)
    assert not overflowed and np.isfinite(src[0]).all()
    res = vm.superoptimize(g, cache=False, top_k=8, variants=1, time_budget_s=120)
    pro = [c for c in res.candidates if "partition.prologue_norm_scales" in c.rules]
    assert pro, "no prologue candidate was searched"
    for c in pro:
        out = evaluate_in_dtype(c.mugraph, inputs, generated=True)[0][0]
        assert np.isfinite(out).all(), c.rules
        assert np.abs(out - src[0]).max() <= 2e-2 * np.abs(src[0]).max()
        assert isinstance(vm.verify(g, c.mugraph), vm.Proved)



@pytest.mark.parametrize("shifted", [False, True])
def test_softmax_stabiliser_raised_key_error_on_a_sum_over_two_axes_of_an_exp(shifted: bool) -> None:
    """Finding (low-medium; a crash of the search): ``log(sum(sum(exp(x - c), 1), 0))`` with ``c`` an input (not a
    max), or a plain ``exp(x)``, made ``stabilise.stabilise_softmax`` raise ``KeyError`` (its table of maxes is keyed
    by sum nodes too, then read through the table of exps), and ``vm.superoptimize`` with it: a captured partition
    went to the fallback (redteam2, session 16). Now the second sum is copied as it is (the stabilised graph is then
    not equal to the source, and the verifier drops it), and the search returns the plain designs, Proved."""
    from verimirage.rewrite.stabilise import stabilise_softmax

    g = vm.Graph()
    x = g.input("x", (8, 16), vm.float32)
    g.output(g.log(g.sum(g.sum(g.exp(g.sub(x, g.input("c", (8, 1), vm.float32)) if shifted else x), axis=1),
                         axis=0)))
    assert stabilise_softmax(g) is not None
    res = vm.superoptimize(g, cache=False, time_budget_s=60)
    assert res.candidates and all(isinstance(vm.verify(g, cand.mugraph), vm.Proved) for cand in res.candidates)


def test_check_certificate_read_and_parsed_a_certificate_file_of_any_size(tmp_path: Path) -> None:
    """Open item of red team 16 (low; the caller's memory and time): ``check_certificate(path)`` read and parsed the
    whole file in the calling process before the capped checker saw it (a 17 MB file of one JSON string was read,
    parsed and sent to the child). Now a file over ``MAX_CERT_BYTES`` (16 MiB, ~290x the largest committed
    certificate) is not read past the cap: a CertificateError naming the limit, before any parsing."""
    from verimirage.checkcall import MAX_CERT_BYTES
    from verimirage.smt.certificate import CertificateError

    p = tmp_path / "big.json"
    p.write_bytes(b'{"schema": "' + b"x" * (MAX_CERT_BYTES + 1024) + b'"}')
    with pytest.raises(CertificateError, match="larger than 16,777,216 bytes"):
        vm.check_certificate(p)
    with pytest.raises(CertificateError, match="larger than"):
        vm.check_certificate(p, isolate=False)


@pytest.mark.parametrize("payload", [b"\xff\xfe not utf-8", b"[" * 200_000 + b"]" * 200_000, b"oversize"],
                         ids=["not-utf8", "nested", "oversize"])
def test_corrupt_search_cache_entry_raised_out_of_superoptimize(payload: bytes, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium-low; a crash, against the cache's contract that a bad entry is a miss, never the caller's
    exception): a search-cache entry that was not UTF-8 (``UnicodeDecodeError``) or was nested too deeply
    (``RecursionError``) raised out of ``vm.superoptimize``, every call, until someone deleted the file; and an entry
    was read and parsed whatever its size. Now ``DiskCache.get`` reads at most ``MAX_ENTRY_BYTES`` (64 MiB; here
    lowered) and discards the entry with a warning: the search runs again and stores a good one."""
    from verimirage.backend import cache as K
    from verimirage.pipeline import search_cache as S

    monkeypatch.setenv("VERIMIRAGE_CACHE_DIR", str(tmp_path))
    g = vm.Graph()
    g.output(g.exp(g.input("x", (4, 8), vm.float32)))
    first = vm.superoptimize(g, time_budget_s=30)
    (entry,) = S.entry_path("0" * 64).parent.glob("*.json")
    if payload == b"oversize":
        monkeypatch.setattr(K, "MAX_ENTRY_BYTES", entry.stat().st_size - 1)
    else:
        entry.write_bytes(payload)
    again = vm.superoptimize(g, time_budget_s=30)
    assert str(again.best.mugraph) == str(first.best.mugraph) and isinstance(again.best.verdict, vm.Proved)
    assert "served from the search cache" not in again.best.verdict.reason


def test_malformed_attribute_text_printed_a_syntax_warning() -> None:
    """Open item of red team 16 (low; noise): parsing text with an attribute like ``c=1if 1else 2`` or ``1e309x``
    printed Python's ``SyntaxWarning: invalid decimal literal`` to stderr (from ``ast.parse`` of the attributes)
    before the GraphError. Now the parser's own pseudo-file turns those warnings into the SyntaxError it already
    rejects: a GraphError only, nothing on stderr."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = ("import verimirage as vm\n"
            "for a in ('c=1if 1else 2', 'c=1e309x', 'c=0x1for', 'c=[1for x in y]'):\n"
            "    try:\n"
            "        vm.Graph.parse('graph {\\n  %0 = input {name=\"x\"} : f32[4]\\n'\n"
            "                       '  %1 = scale %0 {' + a + '} : f32[4]\\n  return %1\\n}')\n"
            "    except vm.GraphError as e:\n"
            "        print('bad attributes' in str(e))\n")
    r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)}, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["True"] * 4, (r.stdout, r.stderr)
    assert r.stderr == "", r.stderr


def test_compiled_program_returned_the_callers_input_tensor_as_its_output() -> None:
    """Open item of red team 16 (low; decided here): a μGraph ``return %0`` (Proved for ``scale(x, 1.0)``) compiled
    to a program that returned the caller's tensor object itself, so the caller's later in-place update of its input
    (a cache written in place, an optimizer step) silently changed the "result" too, which no eager run of the
    source's ops does. Now an output that is a program input is returned as a copy (generated ``forward`` and the
    lean path's ``run`` alike), one copy per output."""
    torch = pytest.importorskip("torch")
    g = vm.Graph()
    g.output(g.scale(g.input("x", (4, 8), vm.float32), 1.0))
    mg = vm.MuGraph.parse("mugraph {\n  %0 = input {name='x'} : f32[4,8]\n  return %0, %0\n}")
    two = vm.Graph()
    xx = two.input("x", (4, 8), vm.float32)
    two.output(two.scale(xx, 1.0), two.scale(xx, 1.0))
    assert isinstance(vm.verify(two, mg), vm.Proved)
    x = torch.randn(4, 8)
    keep = x.clone()
    a, b = vm.compile(mg)(x)
    assert a is not x and a.data_ptr() != x.data_ptr() and torch.equal(a, keep)
    x.add_(1.0)  # (the caller updates its input in place)
    assert torch.equal(a, keep) and torch.equal(b, keep)


def test_lean_path_returned_the_callers_input_tensor_as_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for the lean path's generated ``run`` (GPU only; here its source, generated for a fake plan with one
    launch writing the second output, and run on the CPU): the output that is the program's input is a copy."""
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    from verimirage.backend import runtime

    x = torch.randn(4, 8)
    prog = SimpleNamespace(input_names=["i0"], returns=[("in", 0), ("buf", 0)], views=[], n_counters=0,
                           steps=[SimpleNamespace(args=((("in", 0), 2),), outs=((0, (4, 8), "float32"),))])
    launched: list[int] = []
    kern = SimpleNamespace(run=lambda *a: launched.append(1), function=None, packed_metadata=None)
    b0 = torch.empty(4, 8)
    monkeypatch.setattr(runtime, "_raw_allocator", lambda: None)
    plan = runtime._LeanPlan.__new__(runtime._LeanPlan)
    plan.signature = [(tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0)]
    plan.guard = plan.out_guard = None
    plan.c_plan = None
    plan.counters = None
    plan.device = x.device
    plan.returned_bufs = [0]
    src, env = plan._source(prog, [(kern, (1, 1, 1), [x, 8, 1, b0, 8, 1])],  # type: ignore[arg-type]
                            {0: ((4, 8), torch.float32)}, {}, 0, {0})
    hooks = SimpleNamespace(calls=False)
    env.update(MISS=runtime._MISS, DEV=-1, get_device=lambda: -1, get_stream=lambda d: 7, HOOK_IN=hooks,
               HOOK_OUT=hooks, bump=lambda ts: None, DEVICE=x.device, capturing=lambda: False,
               WS=[None, 0, None], empty=torch.empty, uint8=torch.uint8)
    ns: dict[str, Any] = {}
    exec(compile(src, "<lean test>", "exec"), env, ns)
    out = ns["run"](x)
    assert launched == [1] and out is not runtime._MISS
    assert out[0] is not x and torch.equal(out[0], x)


def _masked_attention(n: int, d: int = 16) -> vm.Graph:
    g = vm.Graph()
    q, k = g.input("Q", (1, n, d), vm.float16), g.input("K", (1, d, n), vm.float16)
    v, bias = g.input("V", (1, n, d), vm.float16), g.input("BIAS", (1, n, n), vm.float16)
    s = g.add(g.matmul(q, k), bias)
    s = g.sub(s, g.max(s, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def test_online_softmax_gave_nan_on_every_row_whose_first_key_tiles_a_mask_sets_to_minus_inf() -> None:
    """Finding (high; a wrong result with no error, on ordinary inputs): attention with an additive mask
    ``softmax(Q K + BIAS) @ V`` (fp16, 512 keys), BIAS -inf on the first half of the keys (left padding; a sliding
    window or any -inf mask whose first key tiles are all masked for a row does the same). The source, and ATen's
    attention, are finite there; every flash (``partition.online_softmax``) and split-KV candidate the search
    returned, the best included, gave NaN on every such row: the tile max of a masked tile is -inf, so the running
    max is -inf, and ``exp(x - m)`` and ``exp(m_prev - m)`` are ``exp(-inf + inf) = NaN`` from then on. The
    Triton kernels did the same (checked in the interpreter below). Neither the verifier (the reals) nor the
    floating-point check (finite inputs only) could see it. Now a tile's max is floored at fp32's lowest finite
    value before it enters the running max (``partition.RUNNING_MAX_FLOOR``)."""
    import numpy as np
    import torch

    from verimirage.pipeline.fpsafe import evaluate_in_dtype

    n = 512
    g = _masked_attention(n)
    rng = np.random.default_rng(0)
    ins = {"Q": rng.uniform(-1, 1, (1, n, 16)), "K": rng.uniform(-1, 1, (1, 16, n)),
           "V": rng.uniform(-1, 1, (1, n, 16)), "BIAS": np.zeros((1, n, n))}
    ins["BIAS"][:, :, : n // 2] = -np.inf
    src, _ = evaluate_in_dtype(g, ins)
    assert np.isfinite(src[0]).all()
    res = vm.superoptimize(g, cache=False, top_k=4, variants=2, time_budget_s=300)
    online = [c for c in res.candidates if "partition.online_softmax" in c.rules]
    assert online and "partition.online_softmax" in res.best.rules
    for c in online:
        out = evaluate_in_dtype(c.mugraph, ins, generated=True)[0][0]
        assert np.isfinite(out).all(), c.rules
        assert np.abs(out - src[0]).max() < 1e-2
    names = [str(t.name) for t in res.best.mugraph.inputs]
    ran = vm.compile(res.best.mugraph)(*(torch.tensor(ins[k], dtype=torch.float16) for k in names))
    scores = torch.tensor(ins["Q"]) @ torch.tensor(ins["K"]) + torch.tensor(ins["BIAS"])
    want = torch.softmax(scores, -1) @ torch.tensor(ins["V"])
    assert torch.isfinite(ran).all() and (ran.double() - want).abs().max() < 1e-2


def _fp_reason(source: vm.Graph, candidate: vm.Graph) -> str | None:
    from verimirage.pipeline.fpsafe import SafetyChecker

    return SafetyChecker(source, numeric=True).check(candidate)


def test_fp_check_drew_only_finite_inputs_and_passed_a_flash_design_that_is_nan_on_masked_rows() -> None:
    """Open item of red team 16 (the numeric check drew finite inputs only), with the finding above: the check
    passed every flash design of masked attention although each is NaN on a row whose first key tiles are -inf.
    Now it also draws special-values sets (``fpsafe.SPECIAL_SETS``: -inf on half of every row or on one row, one
    +-inf, one NaN, zeros of both signs, the smallest normal values), each in one input at a time: the unfloored
    running max (the old lowering, rebuilt here by turning the floor's ``clamp m`` into ``maximum m, m``) is
    rejected, the floored one passes."""
    res = vm.superoptimize(_masked_attention(256), cache=False, top_k=2, variants=1, time_budget_s=300)
    best = next(c.mugraph for c in res.candidates if "partition.online_softmax" in c.rules)
    text = str(best)
    assert " clamp " in text
    old = vm.MuGraph.parse("\n".join(
        ln.split(" clamp ")[0] + " maximum " + (m := ln.split(" clamp ")[1].split(" {")[0]) + ", " + m + " : "
        + ln.split(" : ")[1] if " clamp " in ln else ln for ln in text.splitlines()))
    assert isinstance(vm.verify(_masked_attention(256), old), vm.Proved)
    why = _fp_reason(_masked_attention(256), old)
    assert why is not None and "BIAS with -inf on the first half" in why, why
    assert _fp_reason(_masked_attention(256), best) is None


def _logsumexp(shift: str) -> vm.Graph:
    g = vm.Graph()
    x = g.input("X", (8, 64), vm.float32)
    if shift == "none":
        g.output(g.log(g.sum(g.exp(x), axis=1)))
        return g
    m = g.max(x, axis=1)
    if shift == "clamped":
        m = g.clamp(m, -3.4028234663852886e38, 3.4028234663852886e38)
    g.output(g.add(m, g.log(g.sum(g.exp(g.sub(x, m)), axis=1))))
    return g


def test_fp_check_passed_a_logsumexp_that_is_nan_on_a_row_of_minus_inf() -> None:
    """The search's own logsumexp stabilisation (``stabilise_softmax``: ``max + log(sum(exp(x - max)))``) was NaN on
    a row of -inf where the source ``log(sum(exp(x)))`` (and ATen's logsumexp) is -inf: redteam2's capture finding of
    session 16, which the finite input sets could not see. The special sets reject that form (an infinity in a logit:
    no NaN where the source has none); the stabiliser now clamps the max it adds back to fp32's finite range, which
    passes, is Proved, and is what the search returns."""
    from verimirage.rewrite.stabilise import stabilise_softmax

    src = _logsumexp("none")
    why = _fp_reason(src, _logsumexp("max"))
    assert why is not None and "X with -inf on one row" in why, why
    assert _fp_reason(src, _logsumexp("clamped")) is None
    st = stabilise_softmax(src)
    assert st is not None and " clamp " in str(st) and _fp_reason(src, st) is None
    assert isinstance(vm.verify(src, st), vm.Proved)


def test_special_values_reject_no_candidate_where_the_source_is_undefined_or_the_infinity_is_not_a_logit() -> None:
    """What the special sets must not reject: a stabilised softmax where the source ``exp(x) / sum(exp(x))`` itself
    makes a NaN (``inf / inf`` at a +inf logit: the source is undefined on that set), and the cross-entropy's hoisted
    ``sum(t) * lse - sum(t * x)``, NaN where a target of -inf makes the source -inf (an infinity outside the logits:
    both non-finite is agreement)."""
    g = vm.Graph()
    x = g.input("X", (8, 64), vm.float32)
    e = g.exp(x)
    g.output(g.div(e, g.sum(e, axis=1)))
    c = vm.Graph()
    xc = c.input("X", (8, 64), vm.float32)
    ec = c.exp(c.sub(xc, c.max(xc, axis=1)))
    c.output(c.div(ec, c.sum(ec, axis=1)))
    assert _fp_reason(g, c) is None
    src, hoisted = vm.Graph(), vm.Graph()
    for h in (src, hoisted):
        x, t = h.input("X", (8, 64), vm.float32), h.input("T", (8, 64), vm.float32)
        lse = h.add(h.max(x, axis=1), h.log(h.sum(h.exp(h.sub(x, h.max(x, axis=1))), axis=1)))
        if h is src:
            h.output(h.sum(h.mul(t, h.sub(lse, x)), axis=1))
        else:
            h.output(h.sub(h.mul(h.sum(t, axis=1), lse), h.sum(h.mul(t, x), axis=1)))
    assert isinstance(vm.verify(src, hoisted), vm.Proved)
    assert _fp_reason(src, hoisted) is None
