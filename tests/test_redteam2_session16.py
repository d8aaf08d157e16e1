"""Red team (sixteenth session, redteam2): soundness of what runs (the ``torch.compile(backend="verimirage")``
capture, the runtime and its launch modes, the generated kernels) where a wrong result would reach a user while the
proof is about something else. Findings, each with the test named after what went wrong (failing on the code before
its fix), then the attacks that held, kept as tests that would fail if they stopped holding.

The launch modes of sessions 14-15 (programmatic dependent launch with its early loop and L2 prefetches, merged
launches, last-block combines) order launches by the text of the generated kernels; Triton's interpreter runs one
launch at a time and never shows a race. :func:`verimirage.backend.launchcheck.pdl_hazards` reads a module's text and
lists what would let a launch read or write out of order; it is run here on every committed candidate in every mode,
and shown to find each hazard planted in a module. The GPU test runs each mode against the default over many
CUDA-graph replays on alternating input sets."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from verimirage.backend.runtime import interpreting  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
interp = pytest.mark.skipif(not interpreting(), reason="Triton's interpreter (CPU tensors)")

# no numeric check: what the lifting builds is what the kernels compute (the check is a backstop, not the proof)
UNCHECKED: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1, "check": False}


def _compiled(fn: Any, **opts: Any) -> tuple[Any, Any]:
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    rep = Report()
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend(report=rep, **{**UNCHECKED, **opts})), rep


def _same_specials(got: Any, want: Any, tol: float) -> None:
    """``got`` equals float64 ``want``: NaN and infinities at the same places, the finite values within ``tol``."""
    a, b = got.detach().double(), want.detach().double()
    assert torch.equal(torch.isnan(a), torch.isnan(b)), (a, b)
    inf = torch.isinf(b)
    assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], b[inf]), (a, b)
    fin = torch.isfinite(b)
    assert bool(((a[fin] - b[fin]).abs() <= tol * b[fin].abs().clamp(min=1.0)).all()), (a, b)


# --------------------------------------------------------------------------- findings


@interp
@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16"])
def test_logsumexp_of_a_row_whose_max_is_infinite_was_nan(check: bool, dt: str) -> None:
    """Finding (medium): ``torch.logsumexp`` was lifted as ``m + log(sum(exp(x - m)))`` with ``m`` the row max, which
    is NaN (inf - inf) where the max is infinite; ATen shifts only by a finite max and gives -inf for a row of -inf
    (log-probabilities with log 0 = -inf, a fully masked row) and inf for a row holding +inf. The numeric check draws
    finite inputs, so the default (checked) compile returned NaN too. Now the max is clamped to the dtype's finite
    range: the same where it is finite, and the right infinity where it is not."""
    dtype = getattr(torch, dt)

    def fn(x: Any) -> Any:
        return torch.logsumexp(x, -1) * 2, torch.logsumexp(x, (0, 2), keepdim=True) + 1

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 7, generator=g)
    x[0, 0] = -math.inf  # a row of -inf (ATen: -inf)
    x[0, 1, 3] = math.inf  # a row holding +inf (ATen: inf)
    x[0, 2, 2] = -math.inf  # one -inf among finite values (ATen: finite)
    x[0, 3, 1] = math.nan  # NaN (ATen: NaN)
    x[0, 4, :2] = torch.tensor([math.inf, -math.inf])  # both (ATen: inf)
    x[1, 0] = -math.inf  # (with x[0, 0]: the (0, 2) reduction's first slice is -inf throughout)
    x = x.to(dtype)
    cm, rep = _compiled(fn, check=check)
    with torch.no_grad():
        got = cm(x)
    for a, b in zip(got, fn(x.double()), strict=True):
        _same_specials(a, b, 2e-2)
    assert any(p.taken for p in rep.partitions), rep


@interp
@pytest.mark.parametrize("check", [False, True])
def test_cross_entropy_gradient_of_a_batch_whose_targets_are_all_ignored_was_nan(check: bool) -> None:
    """Finding (medium): ``F.cross_entropy`` (mean) on a batch whose every target is ``ignore_index`` (a padding-only
    micro-batch of a language model) has loss 0 / 0 = NaN in ATen but gradient 0: ATen's ``nll_loss_backward``
    writes only the rows whose target is not ignored. The lifted backward divided the gradient by total_weight = 0
    before masking it, (g / 0) * 0 = NaN, so every logit's gradient (and every parameter's after it) was NaN, in the
    default checked compile too (the check draws in-range targets). Now 1 is added to total_weight where no target
    counts (the mask is 0 throughout there), nothing where one does."""
    F = torch.nn.functional

    def fn(x: Any, t: Any) -> Any:
        return F.cross_entropy(x * 2.0, t)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=g)
    cm, rep = _compiled(fn, check=check)
    for t in (torch.full((6,), -100), torch.tensor([-100, 3, -100, -100, 9, -100])):
        xa, xb = x.clone().requires_grad_(), x.double().requires_grad_()
        got, want = cm(xa, t), fn(xb, t)
        got.backward()
        want.backward()
        _same_specials(got, want, 1e-4)
        _same_specials(xa.grad, xb.grad, 1e-4)
    assert any(p.taken and p.kind == "backward" for p in rep.partitions), rep


def test_two_calls_on_one_stream_shared_the_kept_workspace_while_their_launches_interleaved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (medium): a compiled program's lean path keeps one workspace per stream for the intermediate results
    of its kernels and reused it on every call on that stream. Two threads calling the program on one stream (a
    threaded server on the default stream, one model object) interleave their launches there: the C launcher
    releases the GIL between them, Triton's launchers (PDL programs) are one Python call each. Call B's first
    kernel then overwrote the workspace between call A's kernels, and A's next kernel read B's intermediate
    results: a wrong result, no error. Now the kept workspace is used by one call at a time; a call that finds it
    taken gets its own (stream-ordered, returned after its launches are queued).

    Here a lean plan's generated ``run`` (Triton's launcher path, fake launchers and allocator) for two launches,
    the first writing a workspace buffer the second reads; call B is made from inside call A's first launch (where
    another thread's call would interleave): A's two kernels must see A's workspace, B's another one."""
    from types import SimpleNamespace

    from verimirage.backend import runtime

    x = torch.randn(4, 8)
    prog = SimpleNamespace(input_names=["i0"], returns=[("buf", 1)], views=[], n_counters=0,
                           steps=[SimpleNamespace(args=((("in", 0), 2),), outs=((0, (4, 8), "float32"),)),
                                  SimpleNamespace(args=((("buf", 0), 2),), outs=((1, (4, 8), "float32"),))])
    seen: list[tuple[str, int, int]] = []  # (call, kernel, workspace pointer it got)
    state = {"call": "A", "nested": False}
    ns: dict[str, Any] = {}

    def launcher(k: int) -> Any:
        def run(*a: Any) -> None:  # (grid, stream, function, metadata, 3 hook slots, then the arguments)
            seen.append((state["call"], k, a[9 + 3] if k == 0 else a[9]))
            if k == 0 and not state["nested"]:  # another thread's call, between this call's launches
                state["nested"], state["call"] = True, "B"
                ns["run"](x)
                state["call"] = "A"
        return SimpleNamespace(run=run, function=None, packed_metadata=None)

    b0, b1 = torch.empty(4, 8), torch.empty(4, 8)
    launches = [(launcher(0), (1, 1, 1), [x, 8, 1, b0, 8, 1]), (launcher(1), (1, 1, 1), [b0, 8, 1, b1, 8, 1])]
    allocs = iter(range(5000, 6000, 100))
    monkeypatch.setattr(runtime, "_raw_allocator", lambda: (lambda n, s: next(allocs), lambda p: None))
    plan = runtime._LeanPlan.__new__(runtime._LeanPlan)
    plan.signature = [(tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0)]
    plan.guard = plan.out_guard = None
    plan.c_plan = None
    plan.counters = None
    plan.device = x.device
    plan.returned_bufs = [1]
    src, env = plan._source(prog, launches, {0: ((4, 8), torch.float32), 1: ((4, 8), torch.float32)},  # type: ignore[arg-type]
                            {0: 0}, 256, {1})
    hooks = SimpleNamespace(calls=False)
    env.update(MISS=runtime._MISS, DEV=-1, get_device=lambda: -1, get_stream=lambda d: 7, HOOK_IN=hooks,
               HOOK_OUT=hooks, bump=lambda ts: None, DEVICE=x.device, capturing=lambda: False,
               WS=[7, 1000, None], empty=torch.empty, uint8=torch.uint8)
    exec(compile(src, "<lean test>", "exec"), env, ns)
    ns["run"](x)
    ws = {(c, k): w for c, k, w in seen}
    assert sorted(ws) == [("A", 0), ("A", 1), ("B", 0), ("B", 1)], seen
    assert ws["A", 0] == ws["A", 1] and ws["B", 0] == ws["B", 1], seen
    assert ws["A", 0] != ws["B", 0], f"two interleaved calls on one stream got one workspace: {seen}"


# --------------------------------------------------------------------------- launch ordering (held)


def _committed_mugraphs(per_file: int = 2) -> list[tuple[str, str]]:
    """(file, μGraph text) of the first ``per_file`` candidates of every committed candidate and proof file
    (``benchmarks/perf/determinism.py`` lists them)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("determinism", ROOT / "benchmarks" / "perf" / "determinism.py")
    assert spec is not None and spec.loader is not None
    det = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(det)
    return [(f, t) for f, _, t in det.committed(per_file, ROOT)]


def test_no_launch_of_a_committed_candidate_reads_or_writes_out_of_order_in_any_mode_held(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (93 committed μGraphs x 8 modes x 2 PDL settings, ``vm.compile``'s tuned modules; and 389 x 12 + 389 x 14
    of plain ``generate`` in the session's scan): in every module, every launch waits exactly once, unconditionally,
    before any store, atomic, member call or mention of memory but the program's inputs; the first launch neither
    loads nor lets the next one start before its wait; every launch writes only its own buffers. Also with the
    PDL knobs at their most aggressive (every launch started early, prefetches everywhere, in the first launch too)."""
    import verimirage as vm
    from verimirage.backend import codegen, tuning
    from verimirage.backend.launchcheck import pdl_hazards

    mgs = _committed_mugraphs()
    assert len(mgs) >= 80
    modes = [{"pdl": p, "merge": m, "last_block": lb} for p in ("auto", "start") for m in (False, True)
             for lb in (False, True)]
    bad: list[str] = []
    checked = 0
    for aggressive in (False, True):
        if aggressive:
            monkeypatch.setattr(codegen, "PDL_EARLY_OWN_MAX_BLOCKS", 1 << 30)
            monkeypatch.setattr(codegen, "PDL_PREFETCH_EARLY_ONLY", False)
            monkeypatch.setattr(codegen, "PDL_PREFETCH_FIRST_MAX_BLOCKS", 1 << 30)
        for f, text in mgs:
            mg = vm.MuGraph.parse(text)
            for mode in modes:
                ms = tuning.tuned_module(mg, mode)
                checked += 1
                bad += [f"{f} {tuning.mode_name(mode)}: {h}" for h in pdl_hazards(ms.source)]
    assert not bad, bad[:10]
    assert checked == 16 * len(mgs)


def test_no_pdl_knob_setting_lets_a_launch_read_or_write_out_of_order_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (the session's scan: 137 committed μGraphs x 3 modes x all 16 settings of the boolean PDL knobs, 6,576
    modules): whichever of codegen's boolean PDL options is on (prefetches only where started early or everywhere,
    prefetches in a first launch that starts the next one, a start or a last-block launch before an early loop: the
    ones being measured for the models set), no launch of a module reads or writes out of order. Here the 16
    settings on the candidates with the most launches and early loops."""
    import itertools

    import verimirage as vm
    from verimirage.backend import codegen, tuning
    from verimirage.backend.launchcheck import pdl_hazards

    knobs = sorted(k for k in dir(codegen) if k.startswith("PDL_") and isinstance(getattr(codegen, k), bool))
    assert len(knobs) >= 4, knobs
    picked = [(f, t) for f, t in _committed_mugraphs(1)
              if any(n in f for n in ("lora_scaled", "cross_entropy.json", "decode_bs1_small", "gelu_mlp"))]
    assert len(picked) >= 4, picked
    bad = []
    for combo in itertools.product([False, True], repeat=len(knobs)):
        for k, v in zip(knobs, combo, strict=True):
            monkeypatch.setattr(codegen, k, v)
        for f, text in picked:
            for mode in ({"pdl": "auto"}, {"pdl": "auto", "merge": True, "last_block": True}):
                ms = tuning.tuned_module(vm.MuGraph.parse(text), mode)
                bad += [f"{f} {mode} {dict(zip(knobs, combo, strict=True))}: {h}" for h in pdl_hazards(ms.source)]
    assert not bad, bad[:5]


def test_compile_generates_without_pdl_a_module_whose_launches_could_run_out_of_order(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Defence in depth: ``vm.compile`` under PDL checks the module it generated (``pdl_hazards``) and, should the
    check find a hazard (a code generator change the committed candidates do not exercise), generates the module
    without PDL and says so, rather than run launches that could overlap out of order."""
    from test_pdl_early_loop import LORA3

    import verimirage as vm
    from verimirage.backend import runtime

    monkeypatch.setattr(runtime, "_pdl_wanted", lambda: "auto")
    prog = vm.compile(vm.MuGraph.parse(LORA3))
    assert "gdc_wait()" in prog.path.read_text() and prog.launch_mode.get("pdl") == "auto"
    monkeypatch.setattr(runtime, "pdl_hazards", lambda src: ["k6: a planted hazard"])
    with caplog.at_level("WARNING", logger="verimirage.backend.runtime"):
        prog = vm.compile(vm.MuGraph.parse(LORA3))
    assert "gdc_" not in prog.path.read_text() and "pdl" not in prog.launch_mode
    assert "a planted hazard" in caplog.text and "without PDL" in caplog.text


def _lora3_auto() -> str:
    from test_pdl_early_loop import LORA3

    import verimirage as vm
    from verimirage.backend import codegen

    # the three-launch form the planted hazards name (codegen's last-block rules, on since 08:27 UTC, make it two)
    saved = codegen.PDL_LASTBLOCK_BEFORE_EARLY_LOOP, codegen.PDL_START_BEFORE_EARLY_LOOP
    codegen.PDL_LASTBLOCK_BEFORE_EARLY_LOOP = codegen.PDL_START_BEFORE_EARLY_LOOP = False
    try:
        return codegen.generate(vm.MuGraph.parse(LORA3), pdl="auto").source
    finally:
        codegen.PDL_LASTBLOCK_BEFORE_EARLY_LOOP, codegen.PDL_START_BEFORE_EARLY_LOOP = saved


def _plant(src: str, kernel: str, old: str, new: str) -> str:
    """``src`` with ``old`` replaced by ``new`` once inside ``def kernel(...)``'s body."""
    at = src.index(f"def {kernel}(")
    end = src.find("\n\n\n", at)
    body = src[at:end]
    assert old in body, (kernel, old)
    return src[:at] + body.replace(old, new, 1) + src[end:]


def test_pdl_hazard_check_finds_each_planted_hazard_held() -> None:
    """The check is not vacuous: on the scaled LoRA's PDL module (three launches: the first waits first, the second
    lets the third launch before its own wait, the third streams X and W before its wait) it finds nothing, and it
    finds each hazard planted in that text: a store, a return or a read of a buffer before a wait, a missing or
    conditional wait, a first launch that loads or lets the next start before its wait, a launch writing an input or
    a buffer another launch writes, and a prefetch function that loads."""
    from verimirage.backend.launchcheck import pdl_hazards

    src = _lora3_auto()
    assert pdl_hazards(src) == []
    store_k5 = re.search(r"    tl\.store\(o0_ptr.*\n", src[src.index("def k5("):]).group(0)  # type: ignore[union-attr]
    planted = {
        "store before the wait": _plant(src, "k5", "    gdc_wait()\n", store_k5 + "    gdc_wait()\n"),
        "buffer read in the early loop": _plant(src, "k6", "tl.load(a1_ptr", "tl.load(a3_ptr"),
        "return before the wait": _plant(src, "k6", "    gdc_wait()\n", "    if pid0 > 7:\n        return\n"
                                                                         "    gdc_wait()\n"),
        "no wait": _plant(src, "k6", "    gdc_wait()\n", ""),
        "conditional wait": _plant(src, "k6", "    gdc_wait()\n", "    if pid0 == 0:\n        gdc_wait()\n"),
        "two waits": _plant(src, "k6", "    gdc_launch_dependents()", "    gdc_wait()"),
        "first launch lets the next start first": _plant(src, "k4", "    gdc_wait()\n    gdc_launch_dependents()\n",
                                                         "    gdc_launch_dependents()\n    gdc_wait()\n"),
        "first launch loads an input first": _plant(
            src, "k4", "    gdc_wait()\n", "    e0 = tl.load(a0_ptr)\n    gdc_wait()\n"),
        "an input written": src.replace("t6_0, t6_0.stride(0), t6_0.stride(1), **LAUNCH['k6']",
                                        "X, X.stride(0), X.stride(1), **LAUNCH['k6']"),
        "a buffer written twice": src.replace("t5_0, t5_0.stride(0), t5_0.stride(1), **LAUNCH['k5']",
                                              "t4_0, t4_0.stride(0), t4_0.stride(1), **LAUNCH['k5']"),
        "a prefetch function that loads": _plant(src, "k6", "    pid0 = tl.program_id(0)\n",
                                                 "    pid0 = tl.program_id(0)\n    k6_pf(pid0, a3_ptr)\n")
        + "\n\n@triton.jit\ndef k6_pf(p0, q_ptr):\n    e = tl.load(q_ptr)\n",
    }
    for what, text in planted.items():
        assert text != src, what
        assert pdl_hazards(text), what


# --------------------------------------------------------------------------- launch modes against the default

#: committed candidates the launch-mode replay test runs: the scaled LoRA's three launches (a "pre" launch, an
#: early loop), a cross entropy (a split max and sum, last-block combines), the small decoder layer (six launches,
#: merged launches, L2 prefetches) and a split-KV attention with an online-softmax combine
RACE_CASES = ["candidates_models/lora_scaled", "candidates_models/cross_entropy", "candidates/layer/decode_bs1_small",
              "candidates/gqa_stable_bs8"]

#: launch modes (environment, codegen knobs) the replay test compares with the default module's results
RACE_MODES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "pdl=auto": ({"VERIMIRAGE_PDL": "auto"}, {}),
    "pdl=auto,merge,last_block": ({"VERIMIRAGE_PDL": "auto", "VERIMIRAGE_MERGE": "1", "VERIMIRAGE_LASTBLOCK": "1"}, {}),
    "pdl=start,every launch early,prefetch everywhere": (
        {"VERIMIRAGE_PDL": "start"}, {"PDL_EARLY_OWN_MAX_BLOCKS": 1 << 30, "PDL_PREFETCH_EARLY_ONLY": False,
                                      "PDL_PREFETCH_FIRST_MAX_BLOCKS": 1 << 30}),
    "persistent,tile_waits": ({"VERIMIRAGE_PERSISTENT": "1", "VERIMIRAGE_PERSISTENT_TILES": "1"}, {}),
}


def race_run(case: str, modes: dict[str, tuple[dict[str, str], dict[str, Any]]], calls: int, replays: int,
             monkeypatch: pytest.MonkeyPatch, device: str) -> dict[str, Any]:
    """Candidate ``case``'s first μGraph compiled in the default mode and in each of ``modes``, on three input sets:
    each mode's first results against the default's (fp16 tolerance: modes may contract multiply-adds differently),
    then ``calls`` plain calls and ``replays`` CUDA-graph replays (on a GPU) cycling through the sets, each compared
    bit for bit with that mode's first result on its set (a race would vary). Returns, per mode, the largest
    difference from the default and the count of elements that differed between calls."""
    import verimirage as vm
    from verimirage.backend import codegen

    folder, _, name = case.rpartition("/")
    doc = json.loads((ROOT / "benchmarks" / folder / f"{name}.json").read_text())
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    gen = torch.Generator(device=device).manual_seed(0)
    sets = [[(0.5 * torch.randn(t.type.shape, generator=gen, device=device)).to(getattr(torch,
                                                                                        t.type.dtype.torch_name))
             for t in mg.inputs] for _ in range(3)]

    def outs(r: Any) -> list[Any]:
        return [o.clone() for o in (r if isinstance(r, tuple) else (r,))]

    for k in ("VERIMIRAGE_PDL", "VERIMIRAGE_MERGE", "VERIMIRAGE_LASTBLOCK", "VERIMIRAGE_PERSISTENT",
              "VERIMIRAGE_PERSISTENT_TILES"):
        monkeypatch.delenv(k, raising=False)
    f0 = vm.compile(mg)
    want = [outs(f0(*xs)) for xs in sets]
    report: dict[str, Any] = {}
    for mode, (env, knobs) in modes.items():
        with monkeypatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            for k, v in knobs.items():
                mp.setattr(codegen, k, v)
            f1 = vm.compile(mg)
            fg = vm.compile(mg, cuda_graph=True) if device == "cuda" else None
        first = [outs(f1(*xs)) for xs in sets]
        worst = 0.0
        for a, b in zip(first, want, strict=True):
            for x, y in zip(a, b, strict=True):
                scale = max(1.0, float(y.double().abs().max()))
                worst = max(worst, float((x.double() - y.double()).abs().max()) / scale)
        bad = torch.zeros((), dtype=torch.int64, device=device)
        for i in range(calls):
            for x, y in zip(outs(f1(*sets[i % 3])), first[i % 3], strict=True):
                bad += (x != y).sum()
        if fg is not None:
            gfirst = [outs(fg(*xs)) for xs in sets]
            for a, b in zip(gfirst, first, strict=True):
                for x, y in zip(a, b, strict=True):
                    bad += (x != y).sum()
            for i in range(replays):
                r = fg(*sets[i % 3])
                for x, y in zip(r if isinstance(r, tuple) else (r,), first[i % 3], strict=True):
                    bad += (x != y).sum()
        report[mode] = {"kernels": len(f1.kernels), "worst_vs_default": worst, "differed": int(bad)}
    return report


@interp
def test_launch_modes_race_run_on_the_interpreter_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (and the GPU test's harness checked where it can run): on the CPU, the small decoder layer merged with
    last-block combines and as one persistent kernel gives the default module's results, the same bits every call.
    (PDL is off in the interpreter, which has no griddepcontrol.)"""
    modes = {k: v for k, v in RACE_MODES.items() if k in ("pdl=auto,merge,last_block", "persistent,tile_waits")}
    rep = race_run("candidates/layer/decode_bs1_small", modes, 2, 0, monkeypatch, "cpu")
    for mode, r in rep.items():
        assert r["differed"] == 0 and r["worst_vs_default"] < 2e-2, (mode, r)


@pytest.mark.gpu
@pytest.mark.parametrize("case", RACE_CASES)
def test_every_launch_mode_gives_the_default_results_over_many_graph_replays(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU, where launches overlap under PDL: each launch mode (PDL auto with its early loops, "pre" launches
    and prefetches; PDL with merged launches and last-block combines; PDL starting every launch early with
    prefetches everywhere, the first launch too; the persistent kernel with tile waits) gives the default module's
    results within fp16 rounding, and over 100 plain calls and 600 CUDA-graph replays cycling through three input
    sets, exactly its own first results on each set (a launch reading a buffer before its producer wrote it would
    read the previous set's values). ``RACE_OUT``, if set, is a folder the per-mode figures are written to;
    ``RACE_MODES`` (names joined by ";") runs only those modes."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    only = [m for m in os.environ.get("RACE_MODES", "").split(";") if m]  # (a subset, for a short device call)
    rep = race_run(case, {k: v for k, v in RACE_MODES.items() if not only or k in only}, 100, 600, monkeypatch,
                   "cuda")
    if os.environ.get("RACE_OUT"):
        out = Path(os.environ["RACE_OUT"]) / (case.replace("/", "_") + ".json")
        out.write_text(json.dumps({"case": case, "device": torch.cuda.get_device_name(), "modes": rep}, indent=1))
    for mode, r in rep.items():
        assert r["differed"] == 0, (case, mode, r)
        assert r["worst_vs_default"] < 2e-2, (case, mode, r)
