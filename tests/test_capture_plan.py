"""The device run's search plans (``benchmarks/corpus_capture.py``): made from the graphs a GPU sees (fake CUDA
tensors on this CPU), and re-checked against each partition where they are served (nothing read from disk is
trusted)."""

from __future__ import annotations

import copy
import json
import signal
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import verimirage as vm
from verimirage.benchmarks import modules as corpus
from verimirage.ir.graph import Graph, MuGraph

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import corpus_capture as cc

_G = """graph {
  %0 = input {name='in0'} : f32[4,8]
  %1 = exp %0 : f32[4,8]
  %2 = sum %1 {axis=1} : f32[4,1]
  return %2
}"""


def _graph(op: str) -> Graph:
    return Graph.parse(_G.replace("exp", op))


def test_served_plan_is_rechecked_against_the_partition(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_serve_plan`` serves a plan's μGraph only after it re-checks against the partition's own lifted graph
    (``vm.verify`` and the floating-point check): a μGraph of another function under the partition's key (a
    tampered or stale plan) is not served; an entry none of whose μGraphs re-checks is a miss (the lifted graph
    itself runs, op by op) and its graph is listed for the next plan."""
    monkeypatch.setattr(vm, "superoptimize", vm.superoptimize)  # put back after the test
    g, other, g2 = _graph("exp"), _graph("tanh"), _graph("sigmoid")
    good, bad = str(MuGraph.from_graph(g)), str(MuGraph.from_graph(other))
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({str(g): [bad, good], str(g2): [bad]}))
    stats: dict[str, Any] = {}
    cc._serve_plan(path, stats, limit=2)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # (served inside a compilation, as on the device)
        r = vm.superoptimize(g)
    assert [str(c) for c in r.candidates] == [good]  # the wrong one is dropped, the right one served
    assert r.best is r.candidates[0] and stats["hit"] == 1
    assert len(stats["rejections"]) == 1 and "not proved" in stats["rejections"][0]
    r2 = vm.superoptimize(g2)
    assert r2.candidates == [g2] and r2.report.stop_reason == "the plan's μGraphs did not re-check"
    assert stats["rejected"] == 1 and stats["missed"] == [str(g2)]
    r3 = vm.superoptimize(_graph("neg"))  # not in the plan
    assert stats["miss"] == 1 and r3.report.stop_reason == "not in the plan"


def test_recheck_rejects_a_non_canonical_text_and_caps_what_it_serves() -> None:
    """A plan μGraph whose text does not print back the same is not served, and at most ``limit`` are served
    (each one verified); verdicts are remembered for this process only."""
    g = _graph("exp")
    good = str(MuGraph.from_graph(g))
    memo: dict[tuple[str, str], str | None] = {}
    served, why = cc.recheck(g, [good.replace("\n", "\n\n", 1), good, good], 1, memo)
    assert [str(m) for m in served] == [good] and len(why) == 1 and "canonical" in why[0]
    assert memo[(str(g), good)] is None


@pytest.mark.slow
def test_fake_cuda_trace_partitions_have_plans(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan made from the fake-CUDA trace (``make_plan``'s default) holds every partition the GPU's graph has:
    attention with a padding mask traced on CUDA runs the memory-efficient kernel, its mask padded, sliced and
    expanded (``slice``, ``expand``: as on an H100), which the CPU trace (the CPU's fused attention op) does not
    have, so a plan made on the CPU misses the GPU's attention partition and the fake-CUDA plan does not."""
    planned: list[str] = []

    def search(g: Any, **kw: Any) -> Any:
        planned.append(str(g))
        c = types.SimpleNamespace(mugraph=MuGraph.from_graph(g))
        return types.SimpleNamespace(candidates=[c], best=c)

    monkeypatch.setattr(vm, "superoptimize", search)
    cuda_plan, cpu_plan = tmp_path / "cuda.json", tmp_path / "cpu.json"
    cc.make_plan(["sdpa_mask"], corpus.SMALL, torch.float16, 1.0, cuda_plan)
    cc.make_plan(["sdpa_mask"], corpus.SMALL, torch.float16, 1.0, cpu_plan, cuda=False)
    assert vm.superoptimize is search  # put back
    seen: list[str] = []

    def record(g: Any, **kw: Any) -> Any:
        seen.append(str(g))
        raise cc._Planned()  # (no retries in halves: the partitions as proposed)

    monkeypatch.setattr(vm, "superoptimize", record)
    from verimirage.integrations.capture import CaptureOptions

    rep = cc.trace("sdpa_mask", corpus.SMALL, torch.float16, CaptureOptions(check=False), cuda=True)
    ops = [o for p in rep.partitions for o in p.ops]
    assert "_scaled_dot_product_efficient_attention" in ops and "slice" in ops and "expand" in ops
    cuda, cpu = json.loads(cuda_plan.read_text()), json.loads(cpu_plan.read_text())
    assert seen and all(k in cuda for k in seen)
    assert any(k not in cpu for k in seen)
    assert all(isinstance(v, list) and MuGraph.parse(v[0]) for v in cuda.values())


@pytest.mark.parametrize("idx", [(Ellipsis, slice(None, 4)), (Ellipsis, slice(4, None)), (slice(None), None, 1),
                                 Ellipsis, slice(None), (slice(1, 3), slice(None, None, 2)), -1, None,
                                 (0, Ellipsis, slice(1, None)), (slice(None), slice(0, 8))])
def test_index_ops_are_the_ops_of_this_torchs_indexing(idx: Any) -> None:
    """The view ops :func:`index_ops` finds on a meta tensor are those C++ indexing records (on a CPU tensor, traced
    by ``make_fx``), argument for argument, and give the same values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3, 5, 2, 8)

    def ops(f: Any) -> list[Any]:
        return [(n.target, n.args[1:], n.kwargs) for n in make_fx(f)(x).graph.nodes if n.op == "call_function"]

    def replay(t: torch.Tensor) -> torch.Tensor:
        for op, args, kwargs in cc.index_ops(t, idx):
            t = op(t, *args, **kwargs)
        return t

    assert ops(lambda t: t[idx]) == ops(replay)
    assert torch.equal(replay(x), x[idx])


def test_index_ops_refuse_an_index_that_reads_a_tensor() -> None:
    x = torch.randn(4, 4)
    for idx in (torch.tensor([0, 1]), [0, 1], True, (slice(None), torch.tensor([1]))):
        with pytest.raises(ValueError):
            cc.index_ops(x, idx)


def test_fake_cuda_trace_of_python_indexing() -> None:
    """Rotary embeddings index in Python (``x[..., :n]``), which on a fake CUDA tensor took a CUDA device guard a
    CPU-only build lacks (``PyTorch is not linked with support for cuda devices``: rotary_attention, llama_block,
    gqa_expand were traced on the CPU instead). Now traced on fake CUDA: the GPU's flash attention and rotary's
    slices, as the H100 run's partitions were (session 10), and indexing is C++'s again afterwards."""
    from verimirage.integrations.capture import CaptureOptions

    def record(g: Any, **kw: Any) -> Any:
        raise cc._Planned()

    real = vm.superoptimize
    vm.__dict__["superoptimize"] = record
    try:
        rep = cc.trace("rotary_attention", corpus.SMALL, torch.float16, CaptureOptions(check=False), cuda=True)
    finally:
        vm.__dict__["superoptimize"] = real
    ops = [o for p in rep.partitions for o in p.ops]
    assert "_scaled_dot_product_flash_attention" in ops and ops.count("slice") == 4 and ops.count("cat") == 2
    assert "__getitem__" not in torch.Tensor.__dict__


def test_fake_cuda_trace_refuses_a_training_step() -> None:
    """Autograd on a fake CUDA tensor aborts a CPU-only process (its device guard): the trace refuses instead."""
    from verimirage.integrations.capture import CaptureOptions

    with pytest.raises(ValueError, match="training step"):
        cc.trace("mlp_relu", corpus.SMALL, torch.float16, CaptureOptions(check=False), train=True, cuda=True)


@pytest.mark.gpu
def test_training_step_graph_capture_after_uncaptured_steps() -> None:
    """The harness's training-step timing (``step_graph_time``) captures forward and backward as one CUDA graph
    after uncaptured steps on the same side stream (the correctness check, ``do_bench``), eager and compiled (the
    last session's capture failed for every variant); after the replays the gradients are the step's."""
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)).cuda().half()
    x = torch.randn(32, 64, device="cuda", dtype=torch.half, requires_grad=True)
    params = list(model.parameters())
    ref = copy.deepcopy(model)  # (other leaves: the default stream never touches the timed ones)
    ref(x.detach().clone().requires_grad_()).float().sum().backward()
    want = [p.grad for p in ref.parameters()]
    side = torch.cuda.Stream()
    for f in (model, torch.compile(model)):
        def step(f: Any = f) -> None:
            f(x).float().sum().backward()

        with torch.cuda.stream(side):
            for p in params:
                p.grad = None
            step()  # an uncaptured step first, as the harness's correctness check
        us = cc.step_graph_time(step, [*params, x], side, rep_ms=5.0)
        assert 0 < us < 1e5
        torch.cuda.synchronize()
        for p, w in zip(params, want, strict=True):
            torch.testing.assert_close(p.grad, w, rtol=2e-2, atol=2e-2)


def test_a_plan_certificate_must_be_about_the_partition_and_recheck() -> None:
    """A plan item with a certificate (what ``make_plan`` writes) is served only when the certificate names exactly
    the partition's lifted graph and the served μGraph, and the independent checker re-checks it: a certificate of
    another partition, or one edited, is not served."""
    from verimirage.smt.certify import certify

    g, other = _graph("exp"), _graph("tanh")
    mg = MuGraph.from_graph(g)
    cert = certify(g, mg).to_json()
    foreign = {"mugraph": str(mg), "certificate": certify(other, MuGraph.from_graph(other)).to_json()}
    edited = json.loads(cert)
    edited["laws"] = ["made-up-law"]
    items = [foreign, {"mugraph": str(mg), "certificate": json.dumps(edited)}, {"mugraph": str(mg),
                                                                              "certificate": cert}]
    served, why = cc.recheck(g, items, 2, {})
    assert [str(m) for m in served] == [str(mg)]
    assert "not about this partition" in why[0] and "does not re-check" in why[1], why


_LAYOUT = """graph {
  %0 = input {name='in0'} : f32[8,4]
  %1 = transpose %0 {a=0, b=1} : f32[4,8]
  %2 = exp %1 : f32[4,8]
  %3 = sum %2 {axis=1} : f32[4,1]
  return %3
}"""


def test_a_partition_hits_its_plan_entry_in_either_layout_spelling(tmp_path: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (the device training runs): the lift writes ``aten.t``/``aten.transpose`` as ``transpose`` and
    ``aten.permute`` as ``permute``, and a device's training partitions held ``transpose`` where the CPU-made plan's
    keys had ``permute`` (7 of the H200 s12 medium run's 35 misses): ``plan_key`` gives both spellings one key, the
    plan is looked up by it, and what is served is re-checked against the partition's own graph (a certificate about
    the other spelling is not taken as is: the pair is proved here)."""
    from verimirage.integrations.capture import plan_key
    from verimirage.smt.certify import certify

    monkeypatch.setattr(vm, "superoptimize", vm.superoptimize)  # put back after the test
    tr = Graph.parse(_LAYOUT)
    pe = Graph.parse(_LAYOUT.replace("transpose %0 {a=0, b=1}", "permute %0 {dims=(1, 0)}"))
    assert str(tr) != str(pe) and plan_key(tr) == plan_key(pe) == plan_key(str(pe))
    assert plan_key(_graph("exp")) == str(_graph("exp"))  # nothing else changes
    mg = MuGraph.from_graph(pe)
    for traced, planned in ((tr, pe), (pe, tr)):
        path = tmp_path / "plan.json"
        item = {"mugraph": str(mg), "certificate": certify(planned, mg).to_json()}
        path.write_text(json.dumps({str(planned): [item]}))
        stats: dict[str, Any] = {}
        cc._serve_plan(path, stats, limit=2)
        r = vm.superoptimize(traced)
        assert stats == {"hit": 1, "recheck_s": stats["recheck_s"]} and [str(c) for c in r.candidates] == [str(mg)]
    # a μGraph of another function under the other spelling's key is still not served
    wrong = str(MuGraph.from_graph(Graph.parse(_LAYOUT.replace("exp", "tanh"))))
    served, why = cc.recheck(tr, [wrong], 2, {})
    assert not served and "not proved" in why[0]


def test_gpu_lock_serialises_processes_and_reenters(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device run's warm-up processes and its timing process share one lock file: a second holder waits
    until the first lets go, and a process that holds it already re-enters it (a recompile inside a timing would
    otherwise wait for itself)."""
    import subprocess
    import time

    lock = tmp_path / "gpu.lock"
    monkeypatch.setenv(cc.GPU_LOCK_ENV, str(lock))
    holder = ("import fcntl,sys,time; f=open(sys.argv[1],'a'); fcntl.flock(f, fcntl.LOCK_EX); "
              "open(sys.argv[2],'w').close(); time.sleep(1.5)")
    held = tmp_path / "held"
    p = subprocess.Popen([sys.executable, "-c", holder, str(lock), str(held)])
    try:
        while not held.exists():
            time.sleep(0.02)
        t0 = time.perf_counter()
        with cc.gpu_lock(), cc.gpu_lock():  # waits for the other process, then re-enters
            waited = time.perf_counter() - t0
    finally:
        p.wait()
    assert waited > 0.5
    assert cc._LOCK_DEPTH == [0]


def test_warm_ups_run_first_and_the_warmed_module_is_timed_first(tmp_path: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpu_run(warmers=k)`` times a module only once its warm-up process has finished it (or died), the
    first warmed first, and ends its warm-ups."""
    marks: list[Path] = []

    class Proc:
        def __init__(self, dead: bool) -> None:
            self.dead = dead

        def poll(self) -> int | None:
            return 0 if self.dead else None

        def terminate(self) -> None:
            self.dead = True

        def wait(self, timeout: float | None = None) -> int:
            return 0

    procs = [Proc(False), Proc(False)]

    def spawn(jobs: list[tuple[str, bool]], k: int, *, marks: Path, **kw: Any) -> list[Any]:
        (marks / "b.train").touch()  # the second process's module is warmed first
        seen.append(marks)
        return procs

    seen = marks
    order: list[str] = []

    def one(name: str, **kw: Any) -> dict[str, Any]:
        order.append(name)
        if name == "b":
            (marks[0] / "a.train").touch()
        return {"name": name}

    monkeypatch.setattr(cc, "_spawn_warmers", spawn)
    monkeypatch.setattr(cc, "gpu_one", one)
    monkeypatch.setattr(cc, "install_gpu_lock", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test")
    monkeypatch.setenv(cc.GPU_LOCK_ENV, str(tmp_path / "unused.lock"))  # (gpu_run sets its own; undone after)
    monkeypatch.setitem(vm.__dict__, "superoptimize", vm.superoptimize)  # (gpu_run's _no_search replaces it)
    cc.gpu_run([], ["a", "b"], dims=corpus.SMALL, dtype=torch.float16, budget=1.0, out=tmp_path / "o", plan=None,
               deadline_s=60.0, warmers=2)
    rows = [json.loads(x) for x in (tmp_path / "o" / "train.jsonl").read_text().splitlines()]
    assert order == ["b", "a"] and [r["name"] for r in rows] == ["b", "a"] and all(r["warmed"] for r in rows)
    assert all(p.dead for p in procs) and not marks[0].exists()


def test_the_training_device_run_lists_every_corpus_module() -> None:
    """``corpus_gpu.sh PART=3`` times the training step of every corpus module (issue 20: per module, forward and
    forward+backward): its list is the corpus, each module once."""
    import re

    text = (Path(__file__).resolve().parent.parent / "benchmarks" / "corpus_gpu.sh").read_text()
    m = re.search(r"^train_all=((?:[^\n]*\\\n)*[^\n]*)$", text, re.M)
    assert m is not None
    names = m.group(1).replace("\\\n", "").split(",")
    assert sorted(names) == sorted(corpus.names()) and len(names) == len(set(names))


def test_training_variants_are_retimed_interleaved(monkeypatch: pytest.MonkeyPatch) -> None:
    """The training variants' graphs are replayed again in rounds, one variant after another (a device drift is
    shared, not decisive); each time is the median of all its rounds, the first timing kept beside it."""
    calls: list[str] = []

    def replays(g: str, n: int, reps: int = 10) -> list[float]:
        assert reps == cc.ROUND_REPLAYS
        calls.append(g)
        return {"a": [10.0, 11.0], "b": [20.0, 21.0]}[g]

    monkeypatch.setattr(cc, "replays", replays)
    monkeypatch.delenv(cc.GPU_LOCK_ENV, raising=False)
    res: dict[str, Any] = {"compile_graph_us": 12.0, "verimirage_graph_us": 25.0}
    cc._interleave({"compile": ([("a", 4)], None), "verimirage": ([("b", 4)], None)}, res)
    assert calls == ["a", "b"] * cc.ROUNDS
    assert res["compile_graph_us"] == 10.5 and res["compile_graph_us_first"] == 12.0
    assert res["verimirage_graph_us"] == 20.5 and res["verimirage_graph_us_first"] == 25.0
    assert res["graph_rounds"] == cc.ROUNDS


def test_restamp_plan_serves_a_certificate_of_an_older_code_generator(tmp_path: Any) -> None:
    """A plan certificate records the Triton hash of the code generator that made it; after a code-generator change
    the device's re-check rejects it (H100, 2026-11-26 20:00: 22 decode entries' cheapest designs rejected, costlier
    siblings served). ``restamp_plan`` records today's hash (the re-check still regenerates and compares: a wrong
    hash is never served) and drops an item the code generator cannot express."""
    from verimirage.backend.tuning import triton_digest
    from verimirage.smt.certify import certify

    g = _graph("exp")
    mg = MuGraph.from_graph(g)
    cert = certify(g, mg, triton_source_hash="0" * 64).to_json()
    cant = {"mugraph": str(mg).replace("exp", "slice"), "certificate": cert}  # (does not parse: never served)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({str(g): [{"mugraph": str(mg), "certificate": cert}, cant]}))
    served, why = cc.recheck(g, json.loads(path.read_text())[str(g)], 2, {})
    assert not served and "sha256" in why[0], why
    assert cc.restamp_plan(path) == (1, 1)
    items = json.loads(path.read_text())[str(g)]
    assert len(items) == 1 and json.loads(items[0]["certificate"])["triton_source_sha256"] == triton_digest(mg)
    served, why = cc.recheck(g, items, 2, {})
    assert [str(m) for m in served] == [str(mg)], why
    assert cc.restamp_plan(path) == (0, 0)


@pytest.mark.slow
@pytest.mark.parametrize("dims", ["decode", "medium"])
def test_stored_decode_plan_matches_todays_code_generator(dims: str) -> None:
    """Every item of the committed decode plan (the forward timings') and medium plan (the training steps') has a
    Triton module today, and every certificate records its hash (else the device rejects it: run
    ``corpus_capture.py --restamp-plan`` after a code-generator change)."""
    path = Path(__file__).resolve().parent.parent / f"benchmarks/results/capture/plan_{dims}_fp16.json"
    stale = []
    for key, items in json.loads(path.read_text()).items():
        for item in items:
            digest = cc._digest(item)  # raises where the code generator cannot express it
            if isinstance(item, dict):
                old = json.loads(item["certificate"]).get("triton_source_sha256")
                if old is not None and old != digest:
                    stale.append(key.splitlines()[1])
    assert not stale, f"{len(stale)} stale certificate hash(es): run corpus_capture.py --restamp-plan"


_FAKE_WORKER = r"""
import json, os, signal, sys, time
PREFIX = sys.argv[1]
for line in sys.stdin:
    name, train = json.loads(line)
    print("noise from a library", flush=True)
    if name == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if name == "hang":
        time.sleep(60)
    sys.stdout.write(PREFIX + json.dumps({"row": {"name": name, "train": train, "pid": os.getpid()},
                                          "missed": ["g_" + name]}) + "\n")
    sys.stdout.flush()
"""


def test_a_crashed_or_hung_module_is_recorded_and_the_sweep_goes_on(tmp_path: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (H100, 18:40 UTC): a segfault in the run's own autotuning (exit 139) ended the forward sweep at
    gpt2_block, so no module after it was timed and the crash was in no results row. Each module now runs in a
    worker process: one that dies (SIGSEGV here) or runs past its timeout gets a row with the reason, and the next
    module runs in a new worker; a worker that is fine is reused."""
    import sys

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "test")
    cmd = [sys.executable, "-c", _FAKE_WORKER, cc.WORKER_DONE]
    out = tmp_path / "o"
    cc.gpu_run(["a", "crash", "b", "hang", "c"], [], dims=corpus.SMALL, dtype=torch.float16, budget=1.0, out=out,
               plan=None, deadline_s=60.0, worker=cmd, module_timeout_s=3.0)
    rows = [json.loads(x) for x in (out / "forward.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == ["a", "crash", "b", "hang", "c"]
    by = {r["name"]: r for r in rows}
    assert "SIGSEGV" in by["crash"]["error"] and by["crash"]["worker_failed"]
    assert "timed out" in by["hang"]["error"] and by["hang"]["worker_failed"]
    assert "error" not in by["a"] and "error" not in by["b"] and by["a"]["device"] == "test"
    assert by["a"]["pid"] != by["b"]["pid"] != by["c"]["pid"]  # a new worker after each failure
    assert sorted(json.loads((out / "misses.json").read_text())) == ["g_a", "g_b", "g_c"]
    # the tables list the failure with its reason
    table = cc.gpu_table(out)
    assert "crash" in table and "SIGSEGV" in table


_HUNG_WORKER = r"""
import faulthandler, json, signal, sys, time
trace = open(sys.argv[1], "a")
faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True)
def hung_in_this_function():
    time.sleep(60)
for line in sys.stdin:
    hung_in_this_function()
"""


def test_periodic_stack_dumps_crashed_workers_so_a_hung_one_dumps_its_stacks_when_it_is_killed(tmp_path: Any) -> None:
    """Finding (H100, 2026-11-27 16:49 UTC): llama_block's and gpt2_block's forwards died by SIGSEGV exactly at the
    workers' 30 s watchdog dump (``faulthandler.dump_traceback_later(30, repeat=True)``), their dumps cut off
    mid-line while the parallel compile pool's threads ran (walking running threads' stacks is not safe on Python
    3.12). Workers now dump only when the parent is about to kill them for a hang (:data:`HANG_SIGNAL`): the stack of
    the hung function still reaches the trace file."""
    import sys

    trace = tmp_path / "faulthandler_forward.txt"
    w = cc.Worker([sys.executable, "-c", _HUNG_WORKER, str(trace)])
    try:
        row, _missed, why = w.run(("m", False), 3.0)
    finally:
        w.kill()
    assert row is None and why is not None and "timed out" in why
    assert cc.HANG_SIGNAL == signal.SIGUSR1
    assert "hung_in_this_function" in trace.read_text()


def test_a_healthy_worker_runs_every_module(tmp_path: Any) -> None:
    """One worker process runs one module after another while none fails (its start is paid once)."""
    import sys

    w = cc.Worker([sys.executable, "-c", _FAKE_WORKER, cc.WORKER_DONE])
    try:
        got = [w.run((n, False), 30.0) for n in ("a", "b")]
    finally:
        w.close()
    assert [g[2] for g in got] == [None, None] and w.started == 1
    assert got[0][0] is not None and got[1][0] is not None and got[0][0]["pid"] == got[1][0]["pid"]
    assert w.proc is not None and w.proc.returncode == 0


def test_recheck_verdicts_are_shared_by_the_processes_of_one_run(tmp_path: Any) -> None:
    """The warm-ups' plan re-check verdicts reach the timing worker through the run's private file (the same
    pair is not proved twice); a line still being written is read on a later look-up, and only verdicts of this
    run's own form are taken."""
    path = tmp_path / "verdicts.jsonl"
    a, b = cc.SharedVerdicts(path), cc.SharedVerdicts(path)
    k1, k2 = ("graph", "item 1"), ("graph", "item 2")
    assert k1 not in b
    a[k1] = None
    a[k2] = "ValueError: not proved equal"
    assert k1 in b and b[k1] is None and b[k2] == "ValueError: not proved equal"
    k3 = ("graph", "item 3")
    with open(path, "a") as f:  # another process half-way through its line
        f.write('{"k": "' + cc.SharedVerdicts.digest(k3) + '", "v": nu')
    assert k3 not in b
    with open(path, "a") as f:
        f.write("ll}\n")
    assert k3 in b and b[k3] is None
    with open(path, "a") as f:  # not a verdict: ignored
        f.write(json.dumps({"k": cc.SharedVerdicts.digest(("graph", "item 4")), "v": 1}) + "\n")
    assert ("graph", "item 4") not in b


def test_rechecked_once_per_run_across_processes(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``recheck`` with the shared memo: a second process (a second memo on the same file) serves the entry
    without proving it again."""
    g = _graph("exp")
    calls: list[int] = []
    real = vm.verify

    def verify(*a: Any, **kw: Any) -> Any:
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(vm, "verify", verify)
    path = tmp_path / "v.jsonl"
    text = str(MuGraph.from_graph(g))
    served1, why1 = cc.recheck(g, [text], 1, cc.SharedVerdicts(path))
    served2, why2 = cc.recheck(g, [text], 1, cc.SharedVerdicts(path))
    assert len(served1) == len(served2) == 1 and not why1 and not why2
    assert len(calls) == 1


def test_the_device_run_starts_its_worker_with_the_runs_settings(tmp_path: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``corpus_capture.py --gpu-run`` (what corpus_gpu.sh runs) runs its modules in a worker process whose command
    line carries the run's plan, dims, budget and candidates, and is itself a valid worker invocation."""
    got: dict[str, Any] = {}
    monkeypatch.setattr(cc, "gpu_run", lambda *a, **kw: got.update(kw))
    plan = tmp_path / "plan.json"
    cc.main(["", "--train-names", "mlp_relu,swiglu", "--gpu-run", str(tmp_path / "o"), "--plan", str(plan),
             "--dims", "medium", "--budget", "3", "--candidates", "2", "--module-timeout", "99", "--limit", "500"])
    cmd = got["worker"]
    assert cmd[0] == sys.executable and cmd[1].endswith("corpus_capture.py")
    assert got["module_timeout_s"] == 99.0 and got["limit_s"] == 500.0
    seen: dict[str, Any] = {}
    monkeypatch.setattr(cc, "_worker_main", lambda **kw: seen.update(kw))
    cc.main(cmd[2:])
    assert seen["plan"] == plan and seen["dims"] == corpus.MEDIUM and seen["budget"] == 3.0
    assert seen["candidates"] == 2 and seen["kind"] == "train" and seen["out"] == tmp_path / "o"
    cc.main(["", "--train-names", "a", "--gpu-run", str(tmp_path / "o"), "--in-process"])
    assert got["worker"] is None
