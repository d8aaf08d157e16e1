"""Red team, session 14 (redteam2): the launch paths that landed this session (last-block combines, the persistent
kernel, merged-launch stage fitting, ``profile.select(input_sets=)``, ``capture.plan_key``). Findings, each with the
test named after what went wrong (failing on the code before its fix); the attacks that held are in
tests/test_redteam_held14_launch.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from verimirage.backend import codegen, runtime

torch = pytest.importorskip("torch")


def _counters_helper() -> Any:
    """The generated modules' ``_vm_counters`` (codegen's helper text, run as a generated module runs it)."""
    ns: dict[str, Any] = {"torch": torch}
    exec(compile(codegen._COUNTERS_HELPER, "<counters helper>", "exec"), ns)
    return ns["_vm_counters"]


def _lean_run_with_counters(counters: Any, streams: list[int], capturing: list[bool]) -> tuple[Any, list[int]]:
    """A lean plan's generated ``run`` (CPU, Triton's launcher path) for one last-block launch reading input 0 and
    the program's counters; the fake launcher records the counters' pointer each launch gets. ``streams`` and
    ``capturing`` are read by the plan's stream getter and capture check at each call (their last element)."""
    x = torch.randn(4, 8)
    prog = SimpleNamespace(input_names=["i0"], returns=[("buf", 0)], views=[], n_counters=4, path="lean_test.py",
                           steps=[SimpleNamespace(args=((("in", 0), 2), (("ctr", 4), 1)),
                                                  outs=((0, (4, 8), "float32"),))],
                           counters=lambda device, stream=None: counters(device, 4, stream))
    seen: list[int] = []

    def launcher(*a: Any) -> None:  # (grid, stream, function, metadata, 3 hooks' slots, then the arguments)
        seen.append(a[9 + 3])  # x, its 2 strides, then the counters' pointer

    kern = SimpleNamespace(run=launcher, function=None, packed_metadata=None)
    call = [x, 8, 1, counters(x.device, 4, 0), 1, torch.empty(4, 8), 8, 1]
    plan = runtime._LeanPlan.__new__(runtime._LeanPlan)
    plan.signature = [(tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0)]
    plan.guard = plan.out_guard = None
    plan.c_plan = None
    plan.device = x.device
    plan.returned_bufs = [0]
    plan.counters = counters(x.device, 4, 0)
    real = runtime._capture_checker
    runtime._capture_checker = lambda: (lambda: capturing[-1])  # type: ignore[assignment]
    try:
        src, env = plan._source(prog, [(kern, (1, 1, 1), call)], {0: ((4, 8), torch.float32)}, {}, 0,  # type: ignore[arg-type]
                                {0})
    finally:
        runtime._capture_checker = real  # type: ignore[assignment]
    hooks = SimpleNamespace(calls=False)
    env.update(MISS=runtime._MISS, DEV=-1, get_device=lambda: -1, get_stream=lambda d: streams[-1], HOOK_IN=hooks,
               HOOK_OUT=hooks, bump=lambda ts: None, DEVICE=plan.device, capturing=lambda: capturing[-1])
    ns: dict[str, Any] = {}
    exec(compile(src, "<lean test>", "exec"), env, ns)
    return (lambda: ns["run"](x)), seen


def test_calls_on_two_streams_shared_one_counter_buffer() -> None:
    """Finding (medium; opt-in VERIMIRAGE_LASTBLOCK / VERIMIRAGE_PERSISTENT): a program's completion counters were
    one buffer per device, kept by the generated module and baked into the lean launcher as a constant, while the
    runtime keeps a workspace per stream precisely so that calls on several streams may run at once. Two calls on two
    streams at once then counted each other's blocks: a group's combine ran on another launch's arrivals (partials
    not yet written, a launch whose combine never runs: its output left unwritten), and persistent tasks passed their
    waits early or spun forever. Now each stream has its own counters (the lean launcher looks them up per call), and
    a CUDA-graph capture gets fresh zeroed ones, shared with no later call."""
    helper = _counters_helper()
    cpu = torch.device("cpu")
    a, b = helper(cpu, 4, 11), helper(cpu, 4, 22)
    assert a.data_ptr() != b.data_ptr() and helper(cpu, 4, 11) is a  # (kept per stream, reused on that stream)
    streams, capturing = [11], [False]
    run, seen = _lean_run_with_counters(helper, streams, capturing)
    run()
    run()
    streams.append(22)
    run()
    capturing.append(True)
    run()
    capturing.append(False)
    streams.append(11)
    run()
    assert seen[0] == seen[1] == seen[4] == a.data_ptr(), "one stream's calls keep its counters"
    assert seen[2] == b.data_ptr(), "another stream's call got the first stream's counters"
    assert seen[3] not in (a.data_ptr(), b.data_ptr()), "a CUDA-graph capture shared a kept counter buffer"


def _fake_persistent_program(tasks: int) -> Any:
    """A program of one persistent kernel ``kp`` (``tasks`` tasks) on input 0, for :class:`runtime._LeanPlan` on the
    CPU: its fake JIT function compiles to a fake kernel per input signature (the 16-byte alignment of the input, as
    Triton specialises) and records the grid of each real launch."""
    launched: list[tuple[int, ...]] = []

    class Kern:
        def __init__(self, aligned: bool) -> None:
            self.aligned, self.function, self.packed_metadata = aligned, None, None
            self.run = lambda *a: launched.append(tuple(a[:3]))

    class Jit:
        def run(self, *call: Any, grid: Any, warmup: bool, **launch: Any) -> Any:
            kern = Kern(call[0].data_ptr() % 16 == 0)
            if not warmup:
                launched.append(tuple(grid))
            return kern

    step = SimpleNamespace(kernel="kp", grid=(tasks,), args=((("in", 0), 1),), outs=((0, (4,), "float32"),))
    prog = SimpleNamespace(input_names=["i0"], returns=[("buf", 0)], views=[], n_counters=0, steps=[step],
                           counters=None, module=SimpleNamespace(kp=Jit(), LAUNCH={}),
                           launch={"kp": {"num_warps": 4, "num_stages": 1}},
                           persistent={"kp"}, grids={}, path=SimpleNamespace(name="fake.py", stem="fake"))
    return prog, launched


def test_a_persistent_grid_sized_for_one_specialisation_was_launched_for_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (low-medium; opt-in VERIMIRAGE_PERSISTENT): the persistent kernel's grid (the blocks that can be
    co-resident, from the compiled kernel's registers and shared memory) was computed once per program, for the first
    input signature's compiled kernel, and every later lean plan launched that grid. Another signature (an unaligned
    input: another specialisation, its own registers) compiles another kernel, which may fit fewer blocks an SM: its
    grid is then not co-resident, and a block spins for a task whose block never gets an SM (a hang under
    VERIMIRAGE_PERSISTENT=plain; a refused cooperative launch under =1). Now each plan sizes the grid for its own
    kernel, and the grid the generated forward uses is the least of them."""
    monkeypatch.setattr(runtime, "_device_getter", lambda: (lambda: 0))
    monkeypatch.setattr(runtime, "_stream_getter", lambda: (lambda d: 0))
    monkeypatch.setattr(runtime, "_tensor_guard", lambda xs: None)
    monkeypatch.setenv("VERIMIRAGE_LAUNCHER", "triton")
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, device: (4 if kern.aligned else 1, 10))
    prog, launched = _fake_persistent_program(100)
    base = torch.zeros(64)
    aligned, unaligned = base[:1], base[1:2]  # (4 bytes past a 64-byte aligned start)
    assert aligned.data_ptr() % 16 == 0 and unaligned.data_ptr() % 16 != 0
    runtime._LeanPlan(prog, [aligned])  # type: ignore[arg-type]
    runtime._LeanPlan(prog, [unaligned])  # type: ignore[arg-type]
    assert launched[0] == (40,), launched  # (4 blocks an SM, 10 SMs)
    assert launched[1] == (10,), f"the unaligned kernel fits 10 co-resident blocks; launched {launched[1]}"
    assert prog.grids["kp"] == (10,)  # (what forward launches: co-resident for either kernel)


def test_an_interrupted_interpreted_launch_left_every_later_call_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (low; Triton's interpreter only, opt-in VERIMIRAGE_LASTBLOCK): a last-block launch interrupted
    mid-grid (KeyboardInterrupt, or any exception raised in a block) left its group's counter at the count of the
    blocks that had arrived; the module keeps the counters, so every later call's group combined that many blocks
    early, silently wrong, and left the counter as it found it (wrong for good). On a GPU a launch runs to its end
    (or the context is lost). The interpreter's counters (on the CPU) are now zeroed at every call."""
    import numpy as np
    from test_last_block import SPLIT_K, _inputs, _run
    from triton.runtime import interpreter as ti

    if not runtime.interpreting():
        pytest.skip("Triton's interpreter (blocks one after another on the CPU)")
    import verimirage as vm
    from verimirage.ir.graph import MuGraph

    monkeypatch.setattr(codegen, "LASTBLOCK_MAX_TILES", 16)
    mg = MuGraph.parse(SPLIT_K)
    f1 = vm.compile(mg, last_block=True)
    xs = _inputs(mg, 1)
    want = _run(vm.compile(mg, last_block=False), mg, xs)
    builder = ti.interpreter_builder
    real = builder.set_grid_idx
    seen = [0]

    def interrupt_at_the_third_block(x: int, y: int, z: int) -> None:
        seen[0] += 1
        if seen[0] == 3:
            raise KeyboardInterrupt
        real(x, y, z)

    monkeypatch.setattr(builder, "set_grid_idx", interrupt_at_the_third_block)
    with pytest.raises(KeyboardInterrupt):
        _run(f1, mg, xs)
    monkeypatch.setattr(builder, "set_grid_idx", real)
    for _ in range(2):
        assert np.array_equal(_run(f1, mg, xs), want), "a call after the interrupted one combined too early"


def test_a_merged_launch_fitted_each_member_alone_while_triton_allocates_their_sum() -> None:
    """Finding (low; opt-in VERIMIRAGE_MERGE, a slowdown, not a wrong result): ``merged_config`` chose the stages
    under which each member's shared memory fits alone, but one launch of several device functions holds all their
    buffers side by side (Triton 3.6, sm_90 compile, 2026-11-27: two 64 x 4096 x 4096 fp16 products merged took
    262,144 bytes at the rules' 8 stages, 131,072 each alone; the limit is 232,448): Triton refused the launch and
    the runtime's retry ran it at one stage, unpipelined. Three such products (q, k, v projections of a layer at
    64 rows) now take the most stages under which their estimates together fit."""
    from dataclasses import replace

    import verimirage as vm
    from verimirage.backend import tuning
    from verimirage.backend.resources import SM90, smem_estimate
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.graph import node_list

    g = vm.Graph()
    x = g.input("X", (64, 4096), vm.float16)
    for i in range(3):
        g.output(g.matmul(x, g.input(f"W{i}", (4096, 4096), vm.float16)))
    nodes = node_list(to_kernels(vm.MuGraph.from_graph(g)))
    ks = [(n.attr("block"), [nodes[a].outs[j] for a, j in n.args]) for n in nodes if n.op == "custom"]
    cs = [tuning.recommend(bg, at) for bg, at in ks]
    pairs = list(zip(ks, cs, strict=True))

    def together(stages: int) -> int:
        return sum(smem_estimate(bg, at, replace(ci, num_stages=stages)) for (bg, at), ci in pairs)

    assert len(ks) == 3 and all(smem_estimate(bg, at, ci) <= SM90.smem_per_block for (bg, at), ci in pairs)
    c = runtime.merged_config(cs, [bg.num_blocks for bg, _ in ks], [(bg, at, None) for bg, at in ks])
    need = together(c.num_stages)
    assert need <= SM90.smem_per_block, f"{c.num_stages} stages: {need} bytes of shared memory in one launch"
    more = together(c.num_stages + 1)
    assert c.num_stages == cs[0].num_stages or more > SM90.smem_per_block  # (the most stages that fit)


def test_a_kernel_refused_at_eight_stages_ran_at_one_instead_of_the_most_that_fit(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (low; a slowdown): the first launch's retry after Triton's OutOfResources (shared memory) went
    straight to one stage (no software pipelining), where the stages the estimate gave were one or two too many (the
    estimate counts a wgmma loop's pipeline one buffer short: 64 x 4096 x 4096 at 2, 3, 4 stages estimated 16,384,
    32,768, 49,152 bytes, Triton allocated 32,768, 49,152, 65,536, sm_90 compile 2026-11-27; a merged launch's
    members share its memory). Now each retry drops one stage, and the kernel keeps the most Triton takes."""
    import numpy as np
    from triton.runtime.errors import OutOfResources

    import verimirage as vm
    from verimirage.backend.codegen import LaunchConfig

    g = vm.Graph()
    x = g.input("X", (16, 32), vm.float16)
    g.output(g.matmul(x, g.input("W", (32, 16), vm.float16)))
    fn = vm.compile(vm.MuGraph.from_graph(g), config=LaunchConfig(4, 8), directory=tmp_path)
    (name,) = fn.launch
    loads: list[int] = []

    def fake_load(jit: object, call: object, grid: object, launch: dict) -> None:  # refuses above 5 stages
        loads.append(launch["num_stages"])
        if launch["num_stages"] > 5:
            raise OutOfResources(16384 * launch["num_stages"], 81920, "shared memory")

    monkeypatch.setattr(runtime, "_load_kernel", fake_load)
    dev = "cpu" if runtime.interpreting() else "cuda"
    xs = {"X": torch.randn(16, 32).half().to(dev), "W": torch.randn(32, 16).half().to(dev)}
    got = fn(**xs).float().cpu().numpy()
    np.testing.assert_allclose(got, (xs["X"].float() @ xs["W"].float()).cpu().numpy(), rtol=1e-2, atol=1e-2)
    assert fn.launch[name]["num_stages"] == 5, f"ran at {fn.launch[name]['num_stages']} stages (tried {loads})"


#: an elementwise producer over 8 row blocks (runs of 16 bytes: the tuning rules emit it flat) whose results a
#: second kernel sums block by block in its loop: a split/combine pair by the plan's structural test
_FLAT_SPLIT = """mugraph {
  %0 = input {name='X'} : f16[64,8]
  %1 = custom %0 {frange=1, grid=(8,)} : f16[64,8] {
    %0 = input {arg=0, fmap=None, imap=(0,), shape=(64, 8)} : f16[8,8]
    %1 = exp %0 : f16[8,8]
    output %1 {omap=(0,)}
  }
  %2 = custom %1 {frange=8, grid=(1,)} : f16[8,8] {
    %0 = input {arg=0, fmap=0, imap=(None,), shape=(64, 8)} : f16[8,8]
    %1 = loop_sum %0 : f16[8,8]
    output %1 {omap=(0,)}
  }
  return %2
}"""


def test_a_flat_elementwise_split_crashed_compile_with_last_block() -> None:
    """Finding (low-medium; opt-in VERIMIRAGE_LASTBLOCK): a kernel the tuning rules emit flat (one flat index range,
    its blocks not its block graph's grid) was paired as a split with the kernel reducing its results, and
    ``_last_block_kernel`` indexed the flat kernel's (empty) launch axes: ``vm.compile(..., last_block=True)`` raised
    IndexError for a valid program (a flat launch with the grid's launch axes would have counted arrivals the flat
    grid never makes: a combine that never runs). A split emitted flat now keeps its own launch."""
    import numpy as np

    import verimirage as vm
    from verimirage.backend import tuning
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.graph import MuGraph, node_list

    mg = MuGraph.parse(_FLAT_SPLIT)
    nodes = node_list(to_kernels(mg))
    assert codegen.last_block_plan(nodes, 1, 2) is not None  # (structurally a pair)
    assert tuning.recommend(nodes[1].attr("block"), [nodes[0].outs[0]]).tiles.flat  # (emitted flat)
    fn = vm.compile(mg, last_block=True)
    assert len(fn.kernels) == 2 and not any(k.last_block for k in fn.kernels)
    x = torch.randn(64, 8).half()
    ref = np.exp(x.double().numpy()).reshape(8, 8, 8).sum(0)
    got = fn(x if runtime.interpreting() else x.cuda()).double().cpu().numpy()
    np.testing.assert_allclose(got, ref, rtol=2e-3, atol=2e-3)


def test_a_plan_key_that_is_no_graph_stopped_the_whole_serve(tmp_path: Any) -> None:
    """Finding (low; the device runs' plans): serving a plan (``corpus_capture._serve_plan``) now parses every key
    to look it up by ``capture.plan_key``; one key that was not a graph's text (a corrupt or hand-edited plan: nothing
    read from disk is trusted) raised GraphError out of the serve's setup, ending the device run instead of missing
    one entry. Such an entry is now left out, named in the stats, and every other entry is served."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import corpus_capture as cc

    import verimirage as vm
    from verimirage.ir.graph import Graph, MuGraph

    real = vm.superoptimize
    g = Graph.parse("""graph {
  %0 = input {name='in0'} : f32[4,8]
  %1 = exp %0 : f32[4,8]
  %2 = sum %1 {axis=1} : f32[4,1]
  return %2
}""")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"not a graph": ["x"], str(g): [str(MuGraph.from_graph(g))]}))
    stats: dict[str, Any] = {}
    try:
        cc._serve_plan(path, stats, limit=2)
        r = vm.superoptimize(g)
    finally:
        vm.superoptimize = real
    assert [str(c) for c in r.candidates] == [str(MuGraph.from_graph(g))] and stats["hit"] == 1
    assert stats["bad_keys"] == ["not a graph"]


def test_lean_plan_first_call_passes_each_kernel_the_buffers_and_strides_it_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean plan's first call (CPU, fake JIT functions) builds every step's arguments as precompile's
    ``first_calls`` does (one copy of that code since the docs engineer's unification): an input and its strides, the
    step's fresh output buffer and its strides, and a later step reading the earlier step's buffer (the same tensor);
    the intermediate buffer goes to the workspace, the returned one is the plan's first output."""
    monkeypatch.setattr(runtime, "_device_getter", lambda: (lambda: 0))
    monkeypatch.setattr(runtime, "_stream_getter", lambda: (lambda d: 0))
    monkeypatch.setattr(runtime, "_tensor_guard", lambda xs: None)
    monkeypatch.setenv("VERIMIRAGE_LAUNCHER", "triton")
    calls: dict[str, list[Any]] = {}

    class Jit:
        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, *call: Any, grid: Any, warmup: bool, **launch: Any) -> Any:
            calls[self.name] = list(call)
            return SimpleNamespace(run=lambda *a: None, function=None, packed_metadata=None)

    s1 = SimpleNamespace(kernel="k1", grid=(2,), args=((("in", 0), 2),), outs=((0, (3, 5), "float32"),))
    s2 = SimpleNamespace(kernel="k2", grid=(1,), args=((("buf", 0), 2),), outs=((1, (3,), "float16"),))
    prog = SimpleNamespace(input_names=["i0"], returns=[("buf", 1)], views=[], n_counters=0, steps=[s1, s2],
                           counters=None, module=SimpleNamespace(k1=Jit("k1"), k2=Jit("k2")),
                           launch={"k1": {"num_warps": 4}, "k2": {"num_warps": 4}}, persistent=set(), grids={},
                           path=SimpleNamespace(name="fake.py", stem="fake"))
    x = torch.randn(5, 3).t()  # (a transposed input: strides (1, 3))
    plan = runtime._LeanPlan(prog, [x])  # type: ignore[arg-type]
    x_, sx0, sx1, b0, sb0, sb1 = calls["k1"]
    assert x_ is x and (sx0, sx1) == (1, 3) and b0.shape == (3, 5) and (sb0, sb1) == (5, 1)
    b0_, sa0, sa1, b1, sb = calls["k2"]
    assert b0_ is b0 and (sa0, sa1) == (5, 1), "the second kernel reads the first kernel's own buffer"
    assert b1.shape == (3,) and b1.dtype == torch.float16 and sb == 1
    assert plan.first_outputs == (b1,) and plan.returned_bufs == [1]
