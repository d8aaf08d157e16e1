"""The persistent-kernel lowering (issue 23's stretch, opt-in ``VERIMIRAGE_PERSISTENT``): every kernel of a composed
μGraph as tasks of one launch, dependencies tracked by completion counters in device memory (codegen
``generate(persistent=True)``, :func:`verimirage.backend.codegen._persistent_kernel`).

Triton's interpreter runs a launch's blocks one after another, so here the kernel runs on one block (every wait is
satisfied when reached: the path the interpreter supports); what many co-resident blocks do is checked by simulating
the task schedule under arbitrary interleavings (no deadlock, no task before a kernel it reads), by the sm_90 compile
(acquire and release at GPU scope, no non-coherent loads) and on the GPU (benchmarks/persistent_check.py)."""

from __future__ import annotations

import dataclasses
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
    # (the split-KV attention member, two 128 x 128 tiles a block, keeps 8 bytes a thread on the stack at 16 warps;
    # the layer before it had none; the inlined members spilled 392)
    assert rep["stack"] <= 16 and rep["regs"] <= 128, rep


# ----------------------------------------------------------------------------- tile waits (VERIMIRAGE_PERSISTENT_TILES)


def _members(ms: object, mg: vm.MuGraph) -> list[tuple[int, int, int, list[str]]]:
    """Per task branch of ``kp``: (member node, first task, tasks, the branch's lines)."""
    src: str = ms.source  # type: ignore[attr-defined]
    body = src[src.index("def kp("):src.index("\n    tl.debug_barrier()\n    done")]
    parts = re.split(r"\n        (if task < \d+:|elif task < \d+:|else:)", body)[1:]
    out, start = [], 0
    (kp,) = ms.kernels  # type: ignore[attr-defined]
    for m, j in enumerate(kp.members):
        head, text = parts[2 * m], parts[2 * m + 1]
        end = int(re.search(r"\d+", head).group()) if "task <" in head else kp.grid[0]
        out.append((j, start, end - start, text.split("\n")))
        start = end
    return out


def _launch_coords(info: object, local: int) -> tuple[int, ...]:
    """Block-graph grid coordinates of block ``local`` of a (non-flat) kernel (launch axes, x fastest)."""
    g = (*info.grid, 1, 1)[:3]  # type: ignore[attr-defined]
    launch = (local % g[0], (local // g[0]) % g[1], local // (g[0] * g[1]))
    return tuple(launch[la] for la in info.launch_axes)  # type: ignore[attr-defined]


def _local_of(info: object, coords: tuple[int, ...]) -> int:
    g = (*info.grid, 1, 1)[:3]  # type: ignore[attr-defined]
    launch = [0, 0, 0]
    for a, la in enumerate(info.launch_axes):  # type: ignore[attr-defined]
        launch[la] = coords[a]
    return launch[0] + g[0] * launch[1] + g[0] * g[1] * launch[2]


def _true_reads(mg: vm.MuGraph, members: list[int], infos: dict[int, object]) -> dict[tuple[int, int], set]:
    """(consumer node, its block) -> {(producer node, producer block)} whose written elements the block's tiles hold,
    element by element from the maps (independent of codegen's boxes): each producer block's slab of its output
    (omaps) marked in an owner array, each consumer input tile's slice (imap; whole dims otherwise) looked up in it,
    through views by flat index (a view is a row-major reshape)."""
    from verimirage.backend.wrap import to_kernels

    nodes = node_list(to_kernels(mg))
    views = {i for i, n in enumerate(nodes) if n.op == "custom"} - set(members)
    owner: dict[tuple[int, int], np.ndarray] = {}
    for p in members:
        pb, info = nodes[p].attr("block"), infos[p]
        flat = not info.launch_axes
        for k, t in enumerate(nodes[p].outs):
            own = np.full(t.shape, -1, dtype=np.int64)
            for local in range(int(np.prod(info.grid))):
                if flat:  # (a flat kernel: 'blocks' are not the block graph's; every element owned by all)
                    own[...] = -2
                    break
                co = _launch_coords(info, local)
                sl = [slice(None)] * len(t.shape)
                for a, d in enumerate(pb.omaps[k].dims):
                    size = t.shape[d] // pb.grid[a]
                    sl[d] = slice(co[a] * size, (co[a] + 1) * size)
                own[tuple(sl)] = local
            assert flat or (own >= 0).all()
            owner[(p, k)] = own.reshape(-1)
    out: dict[tuple[int, int], set] = {}
    for j in members:
        bg, info = nodes[j].attr("block"), infos[j]
        for local in range(int(np.prod(info.grid))):
            co = _launch_coords(info, local) if info.launch_axes else None
            need: set = set()
            for n in bg.nodes:
                if n.op != "input":
                    continue
                r = nodes[j].args[n.attr("arg")]
                while r[0] in views:
                    r = nodes[r[0]].args[0]
                if r[0] not in members:
                    continue
                shape = nodes[j].args[n.attr("arg")]
                shape = nodes[shape[0]].outs[shape[1]].shape
                sl = [slice(None)] * len(shape)
                if co is None:
                    need |= {(r[0], b) for b in range(int(np.prod(infos[r[0]].grid)))}
                    continue
                for a, d in enumerate(n.attr("imap")):
                    if d is not None:
                        size = shape[d] // bg.grid[a]
                        sl[d] = slice(co[a] * size, (co[a] + 1) * size)
                idx = np.arange(int(np.prod(shape))).reshape(shape)[tuple(sl)].reshape(-1)
                got = set(np.unique(owner[r].reshape(-1)[idx]).tolist())
                if -2 in got:
                    got = set(range(int(np.prod(infos[r[0]].grid))))
                need |= {(r[0], b) for b in got}
            out[(j, local)] = need
    return out


def _waited(ms: object, mg: vm.MuGraph) -> dict[tuple[int, int], set]:
    """(consumer node, its block) -> {(producer node, producer block)} the generated ``kp`` makes it wait for:
    every block of a kernel whose counter it waits on, and the flags its tile waits' ``fb`` expressions name
    (evaluated, as the kernel computes them, for every block of the consumer)."""
    branches = _members(ms, mg)
    blocks = {j: n for j, _, n, _ in branches}
    by_counter, by_flag = {}, {}
    for j, _, _, lines in branches:
        for line in lines:
            if (c := re.search(r'atomic_add\(ctr_ptr \+ (\d+), 1, sem="release"', line)):
                by_counter[int(c.group(1))] = j
            if (f := re.search(r'atomic_add\(ctr_ptr \+ (\d+) \+ task', line)):
                by_flag[int(f.group(1))] = j
    out: dict[tuple[int, int], set] = {}
    for j, start, n, lines in branches:
        whole = {by_counter[int(c)] for c in re.findall(r'ctr_ptr \+ (\d+), 0, sem="acquire"', "\n".join(lines))}
        tiles = []
        for k, line in enumerate(lines):
            if (f := re.match(r"\s*fb = ctr_ptr \+ (\d+) \+ (.*)$", line)):
                width = int(re.search(r"tl.arange\(0, (\d+)\)", lines[k - 1]).group(1))
                size = int(re.search(r"fl < (\d+)", lines[k + 1]).group(1))
                tiles.append((by_flag[int(f.group(1))], f.group(2), width, size))
        for local in range(n):
            need = {(p, b) for p in whole for b in range(blocks[p])}
            for p, expr, width, size in tiles:
                fl = np.arange(width)
                vals = eval(expr, {"fl": fl, "task": start + local})
                vals = np.broadcast_to(vals, fl.shape)[fl < size]
                assert ((vals >= 0) & (vals < blocks[p])).all()
                need |= {(p, int(b)) for b in vals}
            out[(j, local)] = need
    return out


def _plain_infos(mg: vm.MuGraph, members: tuple[int, ...]) -> dict[int, object]:
    """Each member's own KernelInfo (its launch grid and launch axes; none for a flat kernel), as codegen makes it."""
    from verimirage.backend import tuning
    from verimirage.backend.codegen import _inline_masks, kernel_source
    from verimirage.backend.wrap import to_kernels

    nodes = node_list(to_kernels(mg))
    out = {}
    for j in members:
        bg = nodes[j].attr("block")
        at = [nodes[a].outs[k] for a, k in nodes[j].args]
        out[j] = kernel_source(bg, at, f"k{j}", tuning.recommend(bg, at).tiles, inline=_inline_masks(nodes, nodes[j]),
                               device_fn=True)[1]
    return out


@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8", "split_kv", "split_kv_stable", "split_k", "small"])
def test_tile_waits_cover_every_producer_tile_a_task_reads(case: str) -> None:
    from test_last_block import CASES

    from verimirage.backend import tuning

    if case == "small":
        mgs = [vm.MuGraph.from_graph(_program())]
    elif case in CASES:
        mgs = [vm.MuGraph.parse(CASES[case])]
    else:
        doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}.json").read_text())
        mgs = [vm.MuGraph.parse(c["mugraph"]) for c in doc["candidates"][:2]]
    for mg in mgs:
        ms = generate(mg, tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, persistent=True, tile_waits=True)
        (kp,) = ms.kernels
        infos = _plain_infos(mg, kp.members)
        truth = _true_reads(mg, list(kp.members), infos)
        waited = _waited(ms, mg)
        first = {j: s for j, s, _, _ in _members(ms, mg)}
        for key, need in truth.items():
            missing = need - waited[key]
            assert not missing, f"task {key} reads producer blocks {sorted(missing)[:5]} it does not wait for"
            # (every wait is for a task of smaller index: the no-deadlock argument holds)
            assert all(first[p] + b < first[key[0]] + key[1] for p, b in waited[key])
        if case != "small":
            assert "fb = ctr_ptr" in ms.source  # (kernels here read part of another's blocks)


def test_tile_wait_check_fails_when_a_task_misses_a_producer_tile() -> None:
    # the coverage check above must catch a wait that leaves out a block its task reads: shrink each tile wait of
    # the layer's decode_bs1 by one block (the last flag of its box) and the check must name a missing block
    from verimirage.backend import tuning

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / "decode_bs1.json").read_text())
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    ms = generate(mg, tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, persistent=True, tile_waits=True)
    (kp,) = ms.kernels
    truth = _true_reads(mg, list(kp.members), _plain_infos(mg, kp.members))
    sizes = sorted(set(int(s) for s in re.findall(r"while tl.sum\(tl.where\(fl < (\d+)", ms.source)))
    assert sizes
    for size in sizes:
        bad = ms.source.replace(f"fl < {size}", f"fl < {size - 1}")
        waited = _waited(dataclasses.replace(ms, source=bad), mg)
        assert any(need - waited[key] for key, need in truth.items()), f"a box of {size} less one went unnoticed"


@pytest.mark.parametrize("name", ["split_kv", "split_kv_stable", "split_k"])
def test_tile_waits_match_float64_and_leave_counters_zero(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # split reductions whose combine blocks each read a few split blocks: tile waits, in the interpreter (one block:
    # the kernels' own code in order) against float64 and, bit for bit, against the kernels launched one by one
    torch = pytest.importorskip("torch")
    from test_last_block import CASES

    from verimirage.ir.reference import evaluate

    mg = vm.MuGraph.parse(CASES[name])
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT", "1")
    monkeypatch.setenv("VERIMIRAGE_PERSISTENT_TILES", "1")
    fn = vm.compile(mg)
    assert "fb = ctr_ptr" in fn.source
    monkeypatch.delenv("VERIMIRAGE_PERSISTENT")
    ref_fn = vm.compile(mg)
    for seed in (2, 3):
        rng = np.random.default_rng(seed)
        xs = {t.name: (rng.standard_normal(t.type.shape) / 2).astype(np.float16) for t in mg.inputs}
        (ref,) = evaluate(mg, {k: v.astype(np.float64) for k, v in xs.items()})
        ins = [torch.from_numpy(xs[n]) for n in mg.input_names()]
        got = fn(*ins).double().numpy()
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
        assert np.array_equal(got, ref_fn(*ins).double().numpy())
        kept = fn.counters(torch.device("cpu"))
        assert kept.numel() == fn.n_counters and not kept.any(), f"counters left at {kept.tolist()}"


@pytest.mark.slow
def test_tile_waits_compile_for_sm90(tmp_path: Path) -> None:
    # the vector of flags is read with GPU-scope acquire loads, the flags set with releases; no non-coherent loads
    from test_last_block import CASES

    from verimirage.backend.gpucompile import compile_modules

    ms = generate(vm.MuGraph.parse(CASES["split_kv"]), persistent=True, tile_waits=True)
    path = tmp_path / "tiles_mod.py"
    path.write_text(ms.source)
    rep = compile_modules([path])[str(path)]["kp"]
    assert rep["ok"], rep["error"]
    assert "fb = ctr_ptr" in ms.source and rep["acquire"] >= 2 and rep["release"] >= 2 and rep["nc_loads"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8"])
def test_layer_tile_waits_compile_for_sm90(case: str, tmp_path: Path) -> None:
    # decode_bs8 has consumer blocks that read one producer block (a box of one): its flag pointer was a scalar
    # beside a vector mask, which Triton's sm_90 front end refused ('error encountered during parsing'; the
    # interpreter broadcast it)
    from verimirage.backend import tuning
    from verimirage.backend.gpucompile import compile_modules

    doc = json.loads((ROOT / "benchmarks" / "candidates" / "layer" / f"{case}.json").read_text())
    ms = generate(vm.MuGraph.parse(doc["candidates"][0]["mugraph"]),
                  tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles, persistent=True, tile_waits=True)
    path = tmp_path / f"{case}_tiles.py"
    path.write_text(ms.source)
    rep = compile_modules([path])[str(path)]["kp"]
    assert rep["ok"], rep["error"]
    assert rep["nc_loads"] == 0
