"""The persistent-kernel lowering (issue 23's stretch, opt-in ``VERIMIRAGE_PERSISTENT``): every kernel of a composed
μGraph as tasks of one launch, dependencies tracked by completion counters in device memory (codegen
``generate(persistent=True)``, :func:`verimirage.backend.codegen._persistent_kernel`).

Triton's interpreter runs a launch's blocks one after another, so here the kernel runs on one block (every wait is
satisfied when reached: the path the interpreter supports); what many co-resident blocks do is checked by simulating
the task schedule under arbitrary interleavings (no deadlock, no task before a kernel it reads), by the sm_90 compile
(acquire and release at GPU scope, no non-coherent loads) and on the GPU (benchmarks/persistent_check.py)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

# (three independent products, a kernel reading two of them, one reading the third, one reading both of those;
# the kernel nodes a node reads, through views)
from test_merge_launch import _reads
from test_merge_launch import _three_projections as _program

import verimirage as vm
from verimirage.backend import runtime
from verimirage.backend.codegen import generate, persistent_tasks
from verimirage.ir.errors import GraphError
from verimirage.ir.graph import node_list

ROOT = Path(__file__).resolve().parent.parent


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = {"X": rng.standard_normal((16, 32)) * 0.3, **{f"W{i}": rng.standard_normal((32, 16)) * 0.3 for i in range(3)}}
    return {k: v.astype(np.float16).astype(np.float64) for k, v in xs.items()}


def _branches(source: str) -> list[tuple[str, set[int], bool]]:
    """Per task branch of the persistent kernel ``kp`` in ``source``, in order: (the kernel it calls, the counters
    it waits for, whether it counts its completion)."""
    body = source[source.index("def kp("):]
    body = body[:body.index("\n    tl.debug_barrier()\n    done")]
    out: list[tuple[str, set[int], bool]] = []
    for part in re.split(r"\n        (?:if task < \d+:|elif task < \d+:|else:)", body)[1:]:
        called = re.search(r"\n            (k\d+)\(", part)
        assert called is not None
        waits = {int(w) for w in re.findall(r"ctr_ptr \+ (\d+), 0, sem=\"acquire\"", part)}
        out.append((called.group(1), waits, 'sem="release"' in part))
    return out


def _simulate(table: list[tuple[int, int, tuple[int, ...]]], blocks: int, rng: random.Random) -> None:
    """Run the task table on ``blocks`` co-resident blocks, each taking its tasks ``b, b + blocks, ...`` in order, one
    step of a random runnable block at a time; fails on a deadlock (tasks left, no block can go on)."""
    total = sum(n for _, n, _ in table)
    kernel_of = [m for m, (_, n, _) in enumerate(table) for _ in range(n)]
    done = [0] * len(table)
    nxt = list(range(blocks))
    while any(t < total for t in nxt):
        ready = [b for b, t in enumerate(nxt) if t < total
                 and all(done[w] == table[w][1] for w in table[kernel_of[t]][2])]
        assert ready, f"deadlock with {blocks} blocks: next tasks {nxt}"
        b = rng.choice(ready)
        done[kernel_of[nxt[b]]] += 1
        nxt[b] += blocks
    assert done == [n for _, n, _ in table]


def test_persistent_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERIMIRAGE_PERSISTENT", raising=False)
    assert runtime._persistent_wanted() == ""
    for v, want in (("1", "coop"), ("on", "coop"), ("plain", "plain"), ("bogus", ""), ("0", "")):
        monkeypatch.setenv("VERIMIRAGE_PERSISTENT", v)
        assert runtime._persistent_wanted() == want


def test_persistent_program_is_one_launch_and_matches_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    g = _program()
    mg = vm.MuGraph.from_graph(g)
    plain = generate(mg)
    ms = generate(mg, persistent=True)
    assert len(ms.steps) == 1 and ms.kernels[0].persistent
    assert ms.kernels[0].members == tuple(k.node for k in plain.kernels)
    assert ms.kernels[0].grid == (sum(int(np.prod(k.grid)) for k in plain.kernels),)
    assert ms.counters == len(ms.kernels[0].members) + 1  # (one a kernel, one for the blocks that finished)
    assert ms.steps[0].args[0] == (("ctr", ms.counters), 1)  # (the program's counter buffer, first)
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT", "1")
    fn = vm.compile(mg)
    assert [k.name for k in fn.kernels] == ["kp"]
    monkeypatch.delenv("VERIMIRAGE_PERSISTENT")
    ref_fn = vm.compile(mg)
    for seed in (1, 2):
        xs = _inputs(seed)
        (ref,) = vm.evaluate(g, xs)
        ins = {k: torch.tensor(v, dtype=torch.float16) for k, v in xs.items()}
        got = fn(**ins).double().numpy()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
        assert np.array_equal(got, ref_fn(**ins).double().numpy())  # the same kernels: the same bits


def test_persistent_kernel_parameters_match_its_launch_step() -> None:
    # the first GPU run's lean launcher passed the counters where the first output goes (the step's operands, then
    # its outputs, then the counters were appended after the operands): every later parameter got the wrong value,
    # and Triton refused to compile (2026-11-27 02:00, H100); the step's values must line up with the parameters
    ms = generate(vm.MuGraph.from_graph(_program()), persistent=True)
    (st,) = ms.steps
    sig = list(ms.kernels[0].signature)
    ptrs = [p for p in sig if p.endswith("_ptr")]
    ops = [*st.args, *((("buf", bi), len(shape)) for bi, shape, _ in st.outs)]  # (the runtime's order)
    assert sum(1 + rank for _, rank in ops) == len(sig)
    assert ops[0][0][0] == "ctr" and ptrs[0] == "ctr_ptr"
    kinds = [p.split("_")[1][0] for p in ptrs[1:]]  # (m<j>_a<k>_ptr: an operand; m<j>_o<k>_ptr: an output)
    assert kinds == ["a"] * (len(st.args) - 1) + ["o"] * len(st.outs)


def test_persistent_kernel_leaves_its_counters_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # the program's counter buffer is kept (one per device, as the last-block launches' is): it must be zero again
    # after each launch, else the next launch's waits would pass before their producers finished
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT", "1")
    fn = vm.compile(vm.MuGraph.from_graph(_program()))
    xs = _inputs(3)
    ins = {k: torch.tensor(v, dtype=torch.float16) for k, v in xs.items()}
    (ref,) = vm.evaluate(_program(), xs)
    for _ in range(2):
        got = fn(**ins).double().numpy()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
        kept = fn.counters(torch.device("cpu"))
        assert kept.numel() == fn.n_counters and not kept.any(), f"counters left at {kept.tolist()}"


@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8"])
def test_scaled_down_layer_persistent_matches_float64(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from verimirage.benchmarks import get_layer
    from verimirage.benchmarks.layer_module import make_case

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}_small.json").read_text())
    g = get_layer(case, small=True)
    c = make_case(case, small=True, dtype=torch.float16, seed=2)
    ins = c["graph_inputs"]
    ref = vm.evaluate(g, {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in ins.items()})
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT", "1")
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    fn = vm.compile(mg)
    assert len(fn.steps) == 1
    outs = fn(*[ins[t.name] for t in g.inputs])
    for o, r in zip(outs if isinstance(outs, tuple) else (outs,), ref, strict=True):
        assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) < 2e-3


@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8"])
def test_layer_tasks_wait_for_every_kernel_they_read_and_never_deadlock(case: str) -> None:
    # the full-size layer's committed candidates (codegen only): each kernel's branch waits for exactly the kernels
    # it reads (through views), those come earlier, each kernel another waits for counts its completions, and the
    # schedule finishes on 1, 3 and 132 co-resident blocks under random interleavings
    from verimirage.backend.wrap import to_kernels

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}.json").read_text())
    for cand in doc["candidates"][:2]:
        mg = vm.MuGraph.parse(cand["mugraph"])
        ms = generate(mg, persistent=True)
        (kp,) = ms.kernels
        nodes = node_list(to_kernels(mg))
        views = {i for i, n in enumerate(nodes) if n.op == "custom"} - set(kp.members)
        branches = _branches(ms.source)
        assert [b[0] for b in branches] == [f"k{j}" for j in kp.members]
        pos = {j: m for m, j in enumerate(kp.members)}
        waited = set()
        for m, (_, waits, _) in enumerate(branches):
            want = {pos[r] for r in _reads(nodes, kp.members[m], views)}
            assert waits == want and all(w < m for w in waits)
            waited |= waits
        assert {m for m, b in enumerate(branches) if b[2]} == waited
        blocks = [int(np.prod(ms.kernels[0].grid))]  # (the total)
        sizes = [int(np.prod(generate(mg).kernels[[k.node for k in generate(mg).kernels].index(j)].grid))
                 for j in kp.members]
        assert sum(sizes) == blocks[0]
        table = persistent_tasks(kp.members, sizes, {j: list(_reads(nodes, j, views)) for j in kp.members})
        rng = random.Random(0)
        for g_blocks in (1, 3, 132):
            _simulate(table, g_blocks, rng)


def test_persistent_tasks_refuse_a_kernel_before_what_it_reads() -> None:
    assert persistent_tasks([4, 5], [2, 3], {5: [4]}) == [(0, 2, ()), (2, 3, (0,))]
    with pytest.raises(GraphError, match="not scheduled before it"):
        persistent_tasks([5, 4], [3, 2], {5: [4]})


def test_persistent_grid_is_at_most_what_is_co_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    class K:
        n_regs = 255

        class metadata:
            num_warps = 16
            shared = 200_000

    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (1, 132))
    assert runtime.persistent_grid(K(), 1684, None) == 132
    assert runtime.persistent_grid(K(), 40, None) == 40
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (2, 132))
    assert runtime.persistent_grid(K(), 1684, None) == 264
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (0, 132))
    with pytest.raises(GraphError, match="fits no SM"):
        runtime.persistent_grid(K(), 1684, None)


@pytest.mark.slow
def test_persistent_kernel_compiles_for_sm90_with_gpu_scope_acquire_and_release(tmp_path: Path) -> None:
    from verimirage.backend.gpucompile import compile_modules

    ms = generate(vm.MuGraph.from_graph(_program()), persistent=True)
    path = tmp_path / "persistent_mod.py"
    path.write_text(ms.source)
    rep = compile_modules([path])[str(path)]["kp"]
    assert rep["ok"], rep["error"]
    waits = len(re.findall(r'sem="acquire"', ms.source))
    counts = len(re.findall(r'sem="release"', ms.source))
    assert rep["acquire"] >= waits + 1 and rep["release"] >= counts + 1  # (+1: the acq_rel of the last block)
    assert rep["nc_loads"] == 0  # tasks read what other tasks wrote in this launch: no non-coherent loads
    assert rep["bar_sync"] > 0


def test_persistent_members_are_called_not_inlined() -> None:
    # the members' device functions are @triton.jit(noinline=True) (their own registers, their parameters passed at
    # the call); the persistent kernel itself and the merged launches' device functions are plain @triton.jit
    mg = vm.MuGraph.from_graph(_program())
    ms = generate(mg, persistent=True)
    (kp,) = ms.kernels
    for j in kp.members:
        assert f"@triton.jit(noinline=True)\ndef k{j}(" in ms.source
    assert "@triton.jit\ndef kp(" in ms.source
    assert "noinline" not in generate(mg, merge=True).source


def test_persistent_stages_lowered_until_two_blocks_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    # one launch has one stage count: the most deeply pipelined task's shared memory decides the blocks an SM holds
    # (the layer's first persistent kernel: 4 stages, 120 KB, one block an SM); stages go down until
    # PERSISTENT_MIN_BLOCKS fit, never below 1, and the launch parameters are updated in place
    built: list[int] = []

    def build(launch: dict[str, int]) -> int:
        built.append(launch["num_stages"])
        return launch["num_stages"]

    fits = {4: 1, 3: 1, 2: 2, 1: 4}  # (stages -> blocks an SM)
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (fits[kern], 132))
    launch = {"num_warps": 16, "num_stages": 4}
    assert runtime.persistent_stages(build, launch, None) == 2
    assert launch == {"num_warps": 16, "num_stages": 2} and built == [4, 3, 2]
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (1, 132))
    launch = {"num_warps": 16, "num_stages": 3}
    assert runtime.persistent_stages(build, launch, None) == 1 and launch["num_stages"] == 1
    monkeypatch.setattr(runtime, "_occupancy", lambda kern, dev: (2, 132))
    built.clear()
    assert runtime.persistent_stages(build, {"num_stages": 4}, None) == 4 and built == [4]


def test_persistent_warps_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VERIMIRAGE_PERSISTENT_WARPS", raising=False)
    assert runtime._persistent_warps() is None
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT_WARPS", "8")
    assert runtime._persistent_warps() == 8
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT_WARPS", "6")
    with pytest.raises(ValueError, match="VERIMIRAGE_PERSISTENT_WARPS"):
        runtime._persistent_warps()


@pytest.mark.slow
def test_layer_persistent_kernel_spilled_registers(tmp_path: Path) -> None:
    # the first persistent kernel of the layer (decode_bs1, 16 warps, 4 stages; its members inlined) took 128
    # registers and spilled 392 bytes a thread on sm_90 (ptxas; at 4 warps 255 registers and 1,376 bytes): the
    # compiler hoisted every member's loop-invariant values out of the task loop. Called, not inlined: no stack
    import importlib.util

    from verimirage.backend import tuning
    from verimirage.backend.gpucompile import compile_modules

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / "decode_bs1.json").read_text())
    ms = generate(vm.MuGraph.parse(doc["candidates"][0]["mugraph"]),
                  tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, persistent=True)
    path = tmp_path / "layer_persistent.py"
    path.write_text(ms.source.replace("'kp': {'num_warps': 4, 'num_stages': 2}",
                                      "'kp': {'num_warps': 16, 'num_stages': 4}"))
    spec = importlib.util.spec_from_file_location("layer_persistent", path)
    assert spec is not None and spec.loader is not None
    rep = compile_modules([path])[str(path)]["kp"]
    assert rep["ok"], rep["error"]
    if rep["regs"] < 0:
        pytest.skip("no cuobjdump beside Triton: registers unknown")
    assert rep["stack"] == 0 and rep["regs"] <= 128, rep
