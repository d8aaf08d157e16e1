"""Last-block-combines launches (codegen's ``last_block``): a split kernel and its combine kernel as one launch.

The interpreter runs a launch's blocks one after another, so the block that arrives last at its group's counter
is normally the group's highest program id; the order tests re-map the interpreter's block indices through a
permutation, so the last to arrive is any block of the group, and the early ones really find the counter short.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import codegen
from verimirage.backend.codegen import _launch_units, generate, last_block_pairs, last_block_plan
from verimirage.backend.runtime import interpreting
from verimirage.backend.wrap import to_kernels
from verimirage.ir.graph import MuGraph, node_list

#: the interpreter tests run where kernels are interpreted (the CPU machine); the GPU test below runs on CUDA
interp = pytest.mark.skipif(not interpreting(), reason="Triton's interpreter (block order, CPU tensors)")

#: split-KV attention, plain sums (o, l): 2 heads, 64 query rows in 2 blocks, 512 keys in 4 splits of 2 steps; the
#: combine's 16-row... 8-row tiles, 4 per split block's 32 rows
SPLIT_KV = """mugraph {
  %0 = input {name='Q'} : f16[2,64,16]
  %1 = input {name='K'} : f16[2,16,512]
  %2 = input {name='V'} : f16[2,512,16]
  %3 = custom %0, %1, %2 {frange=2, grid=(2, 2, 4)} : f16[2,64,64], f16[2,64,4] {
    %0 = input {arg=0, fmap=None, imap=(0, 1, None), shape=(2, 64, 16)} : f16[1,32,16]
    %1 = input {arg=1, fmap=2, imap=(0, None, 2), shape=(2, 16, 512)} : f16[1,16,64]
    %2 = input {arg=2, fmap=1, imap=(0, None, 1), shape=(2, 512, 16)} : f16[1,64,16]
    %3 = matmul %0, %1 : f16[1,32,64]
    %4 = exp %3 : f16[1,32,64]
    %5 = matmul %4, %2 : f16[1,32,16]
    %6 = loop_sum %5 : f16[1,32,16]
    %7 = sum %4 {axis=2} : f16[1,32,1]
    %8 = loop_sum %7 : f16[1,32,1]
    output %6 {omap=(0, 1, 2)}
    output %8 {omap=(0, 1, 2)}
  }
  %4 = custom %3.0, %3.1 {frange=4, grid=(2, 8)} : f16[2,64,16] {
    %0 = input {arg=0, fmap=2, imap=(0, 1), shape=(2, 64, 64)} : f16[1,8,16]
    %1 = input {arg=1, fmap=2, imap=(0, 1), shape=(2, 64, 4)} : f16[1,8,1]
    %2 = loop_sum %0 : f16[1,8,16]
    %3 = loop_sum %1 : f16[1,8,1]
    %4 = div %2, %3 : f16[1,8,16]
    output %4 {omap=(0, 1)}
  }
  return %4
}"""

#: the same with the max-shifted online softmax: partials (o, l, m), combined by rescaling to the running max
SPLIT_KV_STABLE = """mugraph {
  %0 = input {name='Q'} : f16[2,64,16]
  %1 = input {name='K'} : f16[2,16,512]
  %2 = input {name='V'} : f16[2,512,16]
  %3 = custom %0, %1, %2 {frange=2, grid=(2, 2, 4)} : f16[2,64,64], f16[2,64,4], f16[2,64,4] {
    %0 = input {arg=0, fmap=None, imap=(0, 1, None), shape=(2, 64, 16)} : f16[1,32,16]
    %1 = input {arg=1, fmap=2, imap=(0, None, 2), shape=(2, 16, 512)} : f16[1,16,64]
    %2 = input {arg=2, fmap=1, imap=(0, None, 1), shape=(2, 512, 16)} : f16[1,64,16]
    %3 = matmul %0, %1 : f16[1,32,64]
    %4 = max %3 {axis=2} : f16[1,32,1]
    %5 = running_max %4 : f16[1,32,1]
    %6 = sub %3, %5 : f16[1,32,64]
    %7 = exp %6 : f16[1,32,64]
    %8 = matmul %7, %2 : f16[1,32,16]
    %9 = rescaled_sum %8, %5 : f16[1,32,16]
    %10 = sum %7 {axis=2} : f16[1,32,1]
    %11 = rescaled_sum %10, %5 : f16[1,32,1]
    %12 = loop_max %5 : f16[1,32,1]
    output %9 {omap=(0, 1, 2)}
    output %11 {omap=(0, 1, 2)}
    output %12 {omap=(0, 1, 2)}
  }
  %4 = custom %3.0, %3.1, %3.2 {frange=4, grid=(2, 8)} : f16[2,64,16] {
    %0 = input {arg=0, fmap=2, imap=(0, 1), shape=(2, 64, 64)} : f16[1,8,16]
    %1 = input {arg=1, fmap=2, imap=(0, 1), shape=(2, 64, 4)} : f16[1,8,1]
    %2 = input {arg=2, fmap=2, imap=(0, 1), shape=(2, 64, 4)} : f16[1,8,1]
    %3 = running_max %2 : f16[1,8,1]
    %4 = sub %2, %3 : f16[1,8,1]
    %5 = exp %4 : f16[1,8,1]
    %6 = mul %0, %5 : f16[1,8,16]
    %7 = rescaled_sum %6, %3 : f16[1,8,16]
    %8 = sub %2, %3 : f16[1,8,1]
    %9 = exp %8 : f16[1,8,1]
    %10 = mul %1, %9 : f16[1,8,1]
    %11 = rescaled_sum %10, %3 : f16[1,8,1]
    %12 = div %7, %11 : f16[1,8,16]
    output %12 {omap=(0, 1)}
  }
  return %4
}"""

#: split-K skinny product: X (8, 256) @ W (256, 128), 2 column blocks x 4 K splits (partials side by side along
#: the rows), combined in 32-column tiles (2 per split column block) with a relu epilogue
SPLIT_K = """mugraph {
  %0 = input {name='X'} : f16[8,256]
  %1 = input {name='W'} : f16[256,128]
  %2 = custom %0, %1 {frange=2, grid=(2, 4)} : f16[32,128] {
    %0 = input {arg=0, fmap=1, imap=(None, 1), shape=(8, 256)} : f16[8,32]
    %1 = input {arg=1, fmap=0, imap=(1, 0), shape=(256, 128)} : f16[32,64]
    %2 = matmul %0, %1 : f16[8,64]
    %3 = loop_sum %2 : f16[8,64]
    output %3 {omap=(1, 0)}
  }
  %3 = custom %2 {frange=4, grid=(4,)} : f16[8,128] {
    %0 = input {arg=0, fmap=0, imap=(1,), shape=(32, 128)} : f16[8,32]
    %1 = loop_sum %0 : f16[8,32]
    %2 = relu %1 : f16[8,32]
    output %2 {omap=(1,)}
  }
  return %3
}"""

#: split-KV attention whose combine has the split's own row tiles: one combine block per group (decode_gqa's shape)
SPLIT_KV_ONE = SPLIT_KV.replace("{frange=4, grid=(2, 8)}", "{frange=4, grid=(2, 2)}").replace(
    "f16[1,8,16]", "f16[1,32,16]").replace("f16[1,8,1]", "f16[1,32,1]")

CASES = {"split_kv": SPLIT_KV, "split_kv_stable": SPLIT_KV_STABLE, "split_k": SPLIT_K, "split_kv_one": SPLIT_KV_ONE}


#: the code generator's own limit (what a program compiled outside these tests gets)
DEFAULT_TILES = codegen.LASTBLOCK_MAX_TILES


@pytest.fixture(autouse=True)
def _many_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here lets a group run up to 16 combine blocks (the default, 1, is what the H100 measured faster),
    so the ``for j`` walk over a group's combine blocks is exercised (a test may set the default back)."""
    monkeypatch.setattr(codegen, "LASTBLOCK_MAX_TILES", 16)


def _inputs(mg: MuGraph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: (rng.standard_normal(t.type.shape) / 2).astype(np.float16) for t in mg.inputs
            if t.name is not None}


def _run(fn: object, mg: MuGraph, xs: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    out = fn(*(torch.from_numpy(xs[n]) for n in mg.input_names()))  # type: ignore[operator]
    return out.float().numpy()


def test_last_block_plan_reads_the_split_structure() -> None:
    """The plans of the three split reductions: matched axes (with the combine's refinement), group sizes."""
    want = {
        "split_kv": (((0, 0, 1), (1, 1, 4)), 4, 4, 4),  # heads 1:1, rows 4 combine tiles per split row block
        "split_kv_stable": (((0, 0, 1), (1, 1, 4)), 4, 4, 4),
        "split_k": (((0, 0, 2),), 4, 2, 2),  # columns 2 combine tiles per split column block; 4 K splits counted
        "split_kv_one": (((0, 0, 1), (1, 1, 1)), 4, 4, 1),
    }
    for name, text in CASES.items():
        nodes = node_list(to_kernels(MuGraph.parse(text)))
        s, c = [i for i, n in enumerate(nodes) if n.op == "custom"]
        plan = last_block_plan(nodes, s, c)
        assert plan is not None, name
        assert (plan.matched, plan.count, plan.groups, plan.tiles) == want[name], name
        assert last_block_plan(nodes, c, s) is None  # (the other way round is no split/combine pair)


def test_last_block_plan_refuses_what_is_no_split_reduction() -> None:
    """Two kernels of an elementwise chain (nothing gathered, no loop over partials) keep their two launches, and so
    does a combine whose group would run more than LASTBLOCK_MAX_TILES blocks in one."""
    g = vm.Graph()
    x = g.input("X", (64, 64), vm.float16)
    g.output(g.exp(g.relu(x)))
    nodes = node_list(to_kernels(MuGraph.from_graph(g)))
    ks = [i for i, n in enumerate(nodes) if n.op == "custom"]
    assert len(ks) == 2 and last_block_plan(nodes, ks[0], ks[1]) is None
    head, comb = SPLIT_K.split("  %3 = custom")
    n = 4 * codegen.LASTBLOCK_MAX_TILES  # (combine tiles per split column block: n / 2 > LASTBLOCK_MAX_TILES)
    wide = head + "  %3 = custom" + comb.replace("grid=(4,)", f"grid=({n},)").replace("f16[8,32]", f"f16[8,{128 // n}]")
    assert 128 % n == 0
    nodes = node_list(to_kernels(MuGraph.parse(wide)))
    assert last_block_plan(nodes, 2, 3) is None
    nodes = node_list(to_kernels(MuGraph.parse(SPLIT_K)))
    assert last_block_plan(nodes, 2, 3) is not None


def test_last_block_pairs_name_what_generate_fuses() -> None:
    """The cost model's view (last_block_pairs): the pairs and plans of the launches generate(last_block=True) makes."""
    for text in CASES.values():
        mg = MuGraph.parse(text)
        pairs = last_block_pairs(mg)
        ms = generate(mg, last_block=True)
        assert [(s, c) for s, c, _ in pairs] == [k.members for k in ms.kernels if k.last_block]
        assert [p for _, _, p in pairs] == [k.last_block[0] for k in ms.kernels if k.last_block]


def test_last_block_by_default_only_where_a_group_has_one_combine_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the measured default (LASTBLOCK_MAX_TILES = 1), a combine 4x finer than its split keeps its two launches
    and one at the split's own tiles becomes one launch."""
    assert DEFAULT_TILES == 1
    monkeypatch.setattr(codegen, "LASTBLOCK_MAX_TILES", DEFAULT_TILES)
    assert len(generate(MuGraph.parse(SPLIT_KV), last_block=True).steps) == 2
    assert len(generate(MuGraph.parse(SPLIT_KV_ONE), last_block=True).steps) == 1


def test_last_block_launch_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """One launch instead of two; the counters are taken first; the combine is called from the counter's branch
    (in the block graph's launch order, then with the split kernel's query tiles launched first:
    ``codegen.SHARER_ORDER``, where a group's counter follows the launch axes)."""
    monkeypatch.setattr(codegen, "SHARER_ORDER", False)
    mg = MuGraph.parse(SPLIT_KV_STABLE)
    two, one = generate(mg), generate(mg, last_block=True)
    assert len(two.steps) == 2 and len(one.steps) == 1 and two.counters == 0 and one.counters == 4
    (k,) = one.kernels
    assert k.members == (3, 4) and k.last_block is not None and k.last_block[1] == 0
    assert one.steps[0].args[0] == (("ctr", 4), 1)
    src = one.source
    assert 'tl.atomic_add(ctr_ptr + 0 + tl.program_id(0) * 2 + tl.program_id(1), 1, sem="acq_rel", scope="gpu")' \
        in src
    assert src.index("tl.debug_barrier()") < src.index("tl.atomic_add(")
    assert "if arrived == 3:" in src and "tl.atomic_xchg(" in src
    monkeypatch.setattr(codegen, "SHARER_ORDER", True)
    src = generate(mg, last_block=True).source
    assert 'tl.atomic_add(ctr_ptr + 0 + tl.program_id(1) * 2 + tl.program_id(0), 1, sem="acq_rel", scope="gpu")' \
        in src
    assert "k4(tl.program_id(1), tl.program_id(0) * 4 + j % 4, 0," in src


@interp
@pytest.mark.parametrize("name", sorted(CASES))
def test_last_block_equals_two_launches_bit_for_bit(name: str) -> None:
    """The one-launch program computes what the two-launch program does, bit for bit, and matches float64; calls
    after the first (counters reused) too, and the counters are all zero after every call."""
    mg = MuGraph.parse(CASES[name])
    f2 = vm.compile(mg, last_block=False)
    f1 = vm.compile(mg, last_block=True)
    assert len(f1.kernels) == 1 and len(f2.kernels) == 2
    for seed in (0, 1):
        xs = _inputs(mg, seed)
        ref = vm.evaluate(mg, {k: v.astype(np.float64) for k, v in xs.items()})[0]
        a, b = _run(f2, mg, xs), _run(f1, mg, xs)
        assert np.array_equal(a, b), f"{name}: the last-block launch differs from the two launches"
        err = np.abs(b - ref).max() / max(np.abs(ref).max(), 1e-6)
        assert err < 2e-2, f"{name}: {err:.3g} of float64"
        import torch

        assert int(f1.counters(torch.device("cpu")).abs().sum()) == 0


@pytest.fixture
def block_order(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """``block_order(perm)``: the interpreter runs a launch's k-th block as block ``perm(n)[k]`` of its grid."""
    from triton.runtime import interpreter as ti

    builder = ti.interpreter_builder
    orig = builder.set_grid_idx

    def use(perm):  # type: ignore[no-untyped-def]
        def set_grid_idx(x: int, y: int, z: int) -> None:
            gx, gy, gz = builder.grid_dim
            n = gx * gy * gz
            k = perm(n)[(x * gy + y) * gz + z]
            orig(k // (gy * gz), (k // gz) % gy, k % gz)

        monkeypatch.setattr(builder, "set_grid_idx", set_grid_idx)

    return use


@interp
@pytest.mark.parametrize("order", ["reversed", "shuffled"])
@pytest.mark.parametrize("name", ["split_kv_stable", "split_k"])
def test_last_block_any_arrival_order(name: str, order: str, block_order) -> None:  # type: ignore[no-untyped-def]
    """Blocks run in another order (reversed, or a random permutation): the block that arrives last at its group's
    counter is then another block of the group (not the group's last program id), and the others find the count
    short; the results are still the two-launch program's, bit for bit, and the counters end at zero."""
    import torch

    mg = MuGraph.parse(CASES[name])
    xs = _inputs(mg, 3)
    want = _run(vm.compile(mg, last_block=False), mg, xs)
    f1 = vm.compile(mg, last_block=True)
    rng = np.random.default_rng(7)
    cache: dict[int, list[int]] = {}

    def perm(n: int) -> list[int]:
        if n not in cache:
            cache[n] = list(range(n))[::-1] if order == "reversed" else [int(v) for v in rng.permutation(n)]
        return cache[n]

    block_order(perm)
    got = _run(f1, mg, xs)
    assert np.array_equal(got, want)
    assert int(f1.counters(torch.device("cpu")).abs().sum()) == 0


@interp
def test_last_block_waits_for_every_block_of_its_group(block_order) -> None:  # type: ignore[no-untyped-def]
    """The control for the order tests: counters that start one short of zero (a launch that did not reset them)
    make a group combine before its last partial is written, and the result is wrong. The counter, not the
    program id, decides who combines."""
    import torch

    mg = MuGraph.parse(SPLIT_K)
    f1 = vm.compile(mg, last_block=True)
    xs = _inputs(mg, 5)
    want = _run(vm.compile(mg, last_block=False), mg, xs)
    block_order(lambda n: list(range(n))[::-1])
    ctr = torch.ones(f1.n_counters, dtype=torch.int32)  # (forward zeroes the module's own in the interpreter)
    real = f1.module._vm_counters
    f1.module._vm_counters = lambda device, n, stream=None, reset=False: ctr
    try:
        bad = _run(f1, mg, xs)
    finally:
        f1.module._vm_counters = real  # (the module is shared by every program compiled to it)
    assert not np.array_equal(bad, want)


@interp
def test_last_block_counts_launches_of_a_program_with_two_pairs() -> None:
    """Two split reductions in one program (two split-K products, the second reading the first's result): two
    last-block launches, each with its own counters (offsets 0 and the first's group count)."""
    text = SPLIT_K.replace("  return %3\n}", "").replace(
        "  %1 = input {name='W'} : f16[256,128]\n",
        "  %1 = input {name='W'} : f16[256,128]\n  %9 = input {name='W2'} : f16[128,128]\n")
    text = text.replace("%9 = input", "%2 = input").replace("%2 = custom %0, %1", "%3 = custom %0, %1").replace(
        "%3 = custom %2 {", "%4 = custom %3 {")
    text += """  %5 = custom %4, %2 {frange=2, grid=(2, 4)} : f16[32,128] {
    %0 = input {arg=0, fmap=1, imap=(None, 1), shape=(8, 128)} : f16[8,16]
    %1 = input {arg=1, fmap=0, imap=(1, 0), shape=(128, 128)} : f16[16,64]
    %2 = matmul %0, %1 : f16[8,64]
    %3 = loop_sum %2 : f16[8,64]
    output %3 {omap=(1, 0)}
  }
  %6 = custom %5 {frange=4, grid=(4,)} : f16[8,128] {
    %0 = input {arg=0, fmap=0, imap=(1,), shape=(32, 128)} : f16[8,32]
    %1 = loop_sum %0 : f16[8,32]
    output %1 {omap=(1,)}
  }
  return %6
}"""
    mg = MuGraph.parse(text)
    nodes = node_list(to_kernels(mg))
    assert len(_launch_units(nodes, set(), False)) == 4
    ms = generate(mg, last_block=True)
    assert len(ms.steps) == 2 and ms.counters == 4
    assert [k.last_block[1] for k in ms.kernels if k.last_block] == [0, 2]
    xs = _inputs(mg, 2)
    a = _run(vm.compile(mg, last_block=False), mg, xs)
    b = _run(vm.compile(mg, last_block=True), mg, xs)
    assert np.array_equal(a, b)


@pytest.mark.slow
def test_last_block_kernels_compile_for_sm90(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every last-block launch compiles for sm_90 (a separate process), plain and specialised, with the counter's
    add as an acquire-release atomic at GPU scope and the reset as a relaxed exchange."""
    from verimirage.backend.gpucompile import compile_modules
    from verimirage.backend.runtime import write_module
    from verimirage.backend.tuning import recommend

    paths = [write_module(generate(MuGraph.parse(t), tiles_for=lambda bg, at: recommend(bg, at).tiles,
                                   last_block=True), tmp_path) for t in CASES.values()]
    report = compile_modules(paths)
    for path, kernels in report.items():
        assert len(kernels) == 1, path
        (rep,) = kernels.values()
        assert rep["ok"], rep["error"]
        assert any("acq_rel" in a and "gpu" in a and "add" in a for a in rep["atom"]), rep["atom"]
        assert any("exch" in a for a in rep["atom"]), rep["atom"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["models/decode_gqa", "gqa_bs1", "gqa_stable_bs8"])
def test_last_block_has_no_race_over_many_replays(case: str) -> None:
    """On the GPU, where blocks really run at once: a committed candidate as one last-block launch, called 200 times
    and replayed 2,000 times in a CUDA graph on two alternating input sets, gives every time exactly what its first
    call on that set gave (a race would vary), that is the two-launch program's output bit for bit where the
    combine only adds (gqa) and within one fp16 unit where it rescales by products (an online softmax's
    combine, decode_gqa's and gqa_stable's: ptxas may contract its multiply-adds differently, H100 2026-11-27);
    its counters are zero after."""
    import json

    import torch

    folder, _, name = case.rpartition("/")
    root = Path(__file__).resolve().parents[1] / "benchmarks"
    doc = json.loads((root / ("candidates_" + folder if folder else "candidates") / f"{name}.json").read_text())
    mg = MuGraph.parse(doc["candidates"][0]["mugraph"])
    f2 = vm.compile(mg, last_block=False)
    f1 = vm.compile(mg, last_block=True)
    fg = vm.compile(mg, last_block=True, cuda_graph=True)
    assert len(f1.kernels) < len(f2.kernels)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sets = [[(0.3 * torch.randn(t.type.shape, generator=gen, device="cuda")).to(getattr(torch, t.type.dtype.torch_name))
             for t in mg.inputs] for _ in range(2)]
    want = [f2(*xs).clone() for xs in sets]
    first = [f1(*xs).clone() for xs in sets]
    rescales = "rescaled_sum" in str(mg)  # an online softmax's combine (decode_gqa's, gqa_stable's): by products
    for w, f in zip(want, first, strict=True):
        if rescales:
            torch.testing.assert_close(f, w, rtol=2e-3, atol=1e-5)
        else:
            assert torch.equal(f.view(torch.int16), w.view(torch.int16))
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    for i in range(200):
        bad += (f1(*sets[i % 2]).view(torch.int16) != first[i % 2].view(torch.int16)).sum()
    for i in range(2000):
        bad += (fg(*sets[i % 2]).view(torch.int16) != first[i % 2].view(torch.int16)).sum()
    torch.cuda.synchronize()
    assert int(bad) == 0, f"{int(bad)} elements differed between calls of the one-launch program"
    assert int(f1.counters(sets[0][0].device).abs().sum()) == 0


def test_last_block_with_pdl_and_merge() -> None:
    """With programmatic dependent launch the one launch waits for its predecessor before anything (its device
    functions do not); with merged launches a split and a combine that are each a launch of their own still pair."""
    mg = MuGraph.parse(SPLIT_KV_STABLE)
    ms = generate(mg, pdl="end", last_block=True)
    (k,) = ms.kernels
    body = ms.source[ms.source.index(f"def {k.name}("):]
    assert body.index("gdc_wait()") < body.index("k3(") and body.index("tl.atomic_add(") < body.index(
        "gdc_launch_dependents()")
    dev = ms.source[ms.source.index("def k3("):ms.source.index(f"def {k.name}(")]
    assert "gdc_wait" not in dev
    merged = generate(mg, merge=True, last_block=True)
    assert [kk.members for kk in merged.kernels] == [(3, 4)] and merged.source == generate(mg, last_block=True).source


def test_last_block_pairs_listed_a_split_emitted_flat() -> None:
    """Finding (the red team, 2026-11-27): ``last_block_pairs`` (the cost model's view) listed an elementwise split
    kernel the tiles emit flat with the kernel summing its results, while ``generate(last_block=True)`` keeps such a
    pair two launches (61d30da). Given the same tiles, the pairs are now what generate fuses: none under the tuned
    tiles (``vm.compile``'s default; the rules emit the producer flat), the pair under tiles that emit nothing flat."""
    from test_redteam_session14_launch import _FLAT_SPLIT

    from verimirage.backend import tuning

    mg = MuGraph.parse(_FLAT_SPLIT)

    def tuned(bg: object, at: object) -> object:
        return tuning.recommend(bg, at).tiles  # type: ignore[arg-type]

    for kw in ({"tiles_for": tuned}, {"tiles": codegen.TileOptions(flat=1024)}, {}):
        ms = generate(mg, last_block=True, **kw)  # type: ignore[arg-type]
        fused = [k.members for k in ms.kernels if k.last_block]
        assert [(s, c) for s, c, _ in last_block_pairs(mg, **kw)] == fused, kw  # type: ignore[arg-type]
        assert fused == ([] if kw else [(1, 2)])
