"""A loaded dot operand converted to the dot's dtype before its broadcast and reshape
(``codegen._KernelGen.early_casts``): the compiler then folds the load's ``.to(tl.float32)`` into the conversion
(rotary attention's candidate 0 29.2 -> 26.2 µs on the H100, attn18). Beside the online softmax's P reshaped from rank
3, only for the tile shapes of ``codegen.SQUEEZE_BESIDE_RESHAPE``: with others Triton 3.6's
TritonGPURemoveLayoutConversions failed, as it does for V loaded squeezed beside P (the suite's gqa_stable_bs1,
mha_stable_bs1 and mha_stable_bs8 candidate 0, ``(64, 128) @ (128, 64)``: the first form of the change, branch
attn18-rcast, broke their sm_90 compile). Whatever the shapes where the product's accumulator is not reshaped around
it (none, or carried in the dot's shape: a split's plain ``exp`` partial sums, the non-stable decode attention;
``codegen.EARLY_CAST_BESIDE_CARRIED``, twentieth session): those compile; the online softmax's rescaled accumulator,
reshaped to the dot's shape and back, is what the layout pass failed beside."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import codegen
from verimirage.backend.codegen import SQUEEZE_BESIDE_RESHAPE, TileOptions, generate
from verimirage.backend.tuning import tuned_module

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
EARLY = re.compile(r"[xy]\d+ = tl\.(?:reshape|broadcast_to)\(v\d+\.to\(tl\.\w+\)")
#: the suite's stable decode attention designs whose k3 broke (V (1, 128, 64) beside P (1, 64, 128) reshaped)
BROKE = [("candidates", "gqa_stable_bs1", 0), ("candidates", "mha_stable_bs1", 0), ("candidates", "mha_stable_bs8", 0)]


def _stored(folder: str, case: str, idx: int) -> str:
    return str(json.loads((BENCH / folder / f"{case}.json").read_text())["candidates"][idx]["mugraph"])


def _small_rotary() -> str:
    """rotary_attention's candidate 0 with its tiles kept: 1 head, 256 tokens (2 blocks of 128 queries, 4 key tiles
    of 64)."""
    text = _stored("candidates_models", "rotary_attention", 0)
    for a, b in (("[16,1024,64]", "[1,256,64]"), ("(16, 1024, 64)", "(1, 256, 64)"), ("[1024,64]", "[256,64]"),
                 ("(1024, 64)", "(256, 64)"), ("frange=16, grid=(16, 8)", "frange=4, grid=(1, 2)")):
        assert a in text
        text = text.replace(a, b)
    return text


@pytest.mark.parametrize("folder,case,idx", BROKE)
def test_early_cast_beside_a_reshaped_p_broke_the_sm90_layout_pass(folder: str, case: str, idx: int) -> None:
    # the products of these designs' k3 are (64, 128) @ (128, 64): V keeps its conversion after the reshape
    for tiles in (None, TileOptions(dot_min_m=16), TileOptions()):
        mg = vm.MuGraph.parse(_stored(folder, case, idx))
        src = tuned_module(mg).source if tiles is None else generate(mg, tiles).source
        assert not EARLY.search(src), case
        assert re.search(r"y\d+ = tl\.reshape\(v2, \(128, 64\)\)\.to\(tl\.float16\)", src), case
    assert ((64, 128), (128, 64)) not in SQUEEZE_BESIDE_RESHAPE


#: the suite's non-stable decode attention designs whose split kernel k3 carries its P @ V accumulator in the dot's
#: shape (a plain exp, no running max): V converted before its reshape beside P since the twentieth session
CARRIED = [("candidates", "gqa_bs1", 0), ("candidates", "mqa_bs1", 0), ("candidates", "qknorm_gqa_bs1", 0)]


def _small_split_decode() -> str:
    """gqa_bs1's candidate 0 with its tiles kept: 1 head group, 64 query rows, 512 keys (2 splits of 2 key tiles of
    128), the combine over the 2 splits' partial sums in 16-row tiles."""
    text = _stored("candidates", "gqa_bs1", 0)
    pairs = [("[2,256,64]", "[1,64,64]"), ("(2, 256, 64)", "(1, 64, 64)"), ("[2,64,4096]", "[1,64,512]"),
             ("(2, 64, 4096)", "(1, 64, 512)"), ("[2,4096,64]", "[1,512,64]"), ("(2, 4096, 64)", "(1, 512, 64)"),
             ("grid=(2, 4, 16)", "grid=(1, 1, 2)"), ("[2,256,1024]", "[1,64,128]"),
             ("(2, 256, 1024)", "(1, 64, 128)"), ("[2,256,16]", "[1,64,2]"), ("(2, 256, 16)", "(1, 64, 2)"),
             ("frange=16, grid=(2, 16)", "frange=2, grid=(1, 4)")]
    for a, b in pairs:
        assert a in text, a
        text = text.replace(a, b)
    return text


@pytest.mark.parametrize("folder,case,idx", CARRIED)
def test_early_cast_beside_a_reshaped_p_with_a_carried_accumulator(folder: str, case: str, idx: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    mg = vm.MuGraph.parse(_stored(folder, case, idx))
    src = tuned_module(mg).source
    # P (64, 128) reshaped from rank 3 beside V (1, 128, 64), the accumulator carried (64, 64): V converted first
    assert re.search(r"y\d+ = tl\.reshape\(v2\.to\(tl\.float16\), \(128, 64\)\)", src), case
    assert re.search(r"tl\.dot\(x\d+, y\d+, v\d+\)", src), case
    monkeypatch.setattr(codegen, "EARLY_CAST_BESIDE_CARRIED", False)  # codegen 16-17: the shape list alone
    old = tuned_module(mg).source
    assert re.search(r"y\d+ = tl\.reshape\(v2, \(128, 64\)\)\.to\(tl\.float16\)", old), case


def test_one_step_product_beside_a_reshaped_p_keeps_the_late_cast() -> None:
    # capture plan_medium #28's first design: one step, P (64, 128) @ V (128, 64) without an accumulator. The early
    # cast compiled there but measured mixed on one-step kernels (H100: this design 3.79 -> 3.91 us, plan_large #4
    # 188.1 -> 183.6): only a loop's carried accumulator takes it
    plan = json.loads((BENCH / "results" / "capture" / "plan_medium_fp16.json").read_text())
    first = list(plan.values())[28][0]
    src = tuned_module(vm.MuGraph.parse(first if isinstance(first, str) else first["mugraph"])).source
    assert "for it in" not in src
    assert re.search(r"y\d+ = tl\.reshape\(v2, \(128, 64\)\)\.to\(tl\.float16\)", src)


def test_early_cast_beside_a_carried_accumulator_matches_float64_in_the_interpreter() -> None:
    torch = pytest.importorskip("torch")
    mg = vm.MuGraph.parse(_small_split_decode())
    assert re.search(r"y\d+ = tl\.reshape\(v2\.to\(tl\.float16\), \(128, 64\)\)", generate(mg).source)
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(0, 0.3, (1, 64, 64)), rng.normal(0, 0.3, (1, 64, 512)), rng.normal(0, 0.3, (1, 512, 64))
    ins = [torch.tensor(x, dtype=torch.float16) for x in (q, k, v)]
    got = vm.compile(mg)(*ins)
    got = (got[0] if isinstance(got, (tuple, list)) else got).double().numpy()
    q, k, v = (x.double().numpy() for x in ins)
    p = np.exp(q @ k)
    ref = (p / p.sum(-1, keepdims=True)) @ v
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_rotary_converts_v_before_its_reshape() -> None:
    src = tuned_module(vm.MuGraph.parse(_stored("candidates_models", "rotary_attention", 0))).source
    assert "y6 = tl.reshape(v2.to(tl.float16), (64, 64))" in src  # V beside P (128, 64): a SQUEEZE_BESIDE_RESHAPE pair
    assert "x5 = tl.reshape(v27, (128, 64)).to(tl.float16)" in src  # P, computed, keeps its conversion after


def test_early_cast_rotary_matches_float64_in_the_interpreter() -> None:
    torch = pytest.importorskip("torch")
    mg = vm.MuGraph.parse(_small_rotary())
    assert EARLY.search(generate(mg).source)
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(0, 0.3, (1, 256, 64)) for _ in range(3))
    ang = rng.uniform(0, 6.28, (256, 64))
    ins = [torch.tensor(x, dtype=torch.float16) for x in (q, k, v, np.cos(ang), np.sin(ang))]
    got = vm.compile(mg)(*ins)
    got = (got[0] if isinstance(got, (tuple, list)) else got).double().numpy()
    q, k, v, c, s = (x.double().numpy() for x in ins)

    def rot(x: np.ndarray) -> np.ndarray:
        return x * c + np.concatenate([-x[..., 32:], x[..., :32]], axis=-1) * s

    sc = rot(q) @ rot(k).transpose(0, 2, 1)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.slow  # sm_90 compiles, minutes with a cold Triton cache
def test_early_cast_kernels_compile_for_sm90(tmp_path: Path) -> None:
    """The designs that broke, rotary's, and the suite's candidates whose kernels the early cast changes, at 4 warps
    with 2 and 3 stages, rotary's (a (128, 64) @ (64, 64) product) also at 8 warps, the fastest in attn18's probe.
    (A (64, 64) @ (64, 64) one beside P may fail at 8 warps, as with the squeezed V: the runtime compiles it again at
    4. benchmarks/compile_check.py checks every committed candidate.)"""
    pytest.importorskip("triton")
    from verimirage.backend.gpucompile import compile_modules

    picks = [*BROKE, ("candidates_models", "rotary_attention", 0), ("candidates", "gqa_bs8", 0),
             ("candidates", "gqa_stable_bs8", 0), ("candidates", "qknorm_gqa_bs8", 0), *CARRIED]
    paths = []
    for folder, case, idx in picks:
        src = tuned_module(vm.MuGraph.parse(_stored(folder, case, idx))).source
        assert bool(EARLY.search(src)) == ((folder, case, idx) not in BROKE), case
        for warps, stages in ((4, 2), (4, 3), (8, 2)) if case in ("rotary_attention", "gqa_bs1") else ((4, 2), (4, 3)):
            path = tmp_path / f"{case}_{idx}_w{warps}_s{stages}.py"
            path.write_text(re.sub(r"'num_warps': 4, 'num_stages': 2", f"'num_warps': {warps}, 'num_stages': {stages}",
                                   src))
            paths.append(path)
    rep = compile_modules(paths)
    bad = {p: {k: r["error"][-200:] for k, r in ks.items() if not r["ok"]} for p, ks in rep.items()}
    assert not any(bad.values()), bad
