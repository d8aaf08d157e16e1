"""The benchmark suite and its expert designs."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks import SUITE, expert, small_design_kw

NAMES = vm.benchmarks.names()


def test_suite_names_cover_the_issue() -> None:
    for n in ["gqa", "mha", "mqa", "qknorm_gqa", "rmsnorm_linear", "lora", "gated_mlp", "ntrans", "gqa_stable",
              "mha_stable"]:
        assert n in NAMES
    for e in SUITE.values():
        assert e.source and e.expert and e.expert_kernels in (1, 2)


@pytest.mark.parametrize(
    "name,batch,shapes",
    [
        ("gqa", 1, {"Q": (2, 256, 64), "K": (2, 64, 4096), "V": (2, 4096, 64)}),
        ("gqa", 8, {"Q": (16, 256, 64), "K": (16, 64, 4096), "V": (16, 4096, 64)}),
        ("mha", 1, {"Q": (32, 16, 64), "K": (32, 64, 4096), "V": (32, 4096, 64)}),
        ("mqa", 8, {"Q": (8, 1024, 64), "K": (8, 64, 4096), "V": (8, 4096, 64)}),
        ("rmsnorm_linear", 1, {"X": (2, 4096), "W": (4096, 6144)}),
        ("lora", 1, {"X": (16, 256), "W": (256, 4096), "A": (256, 16), "B": (16, 4096)}),
        ("gated_mlp", 8, {"X": (64, 4096), "W1": (4096, 4096), "W2": (4096, 4096)}),
        ("ntrans", 1, {"X": (8, 4096), "H": (8, 4096), "alpha": (8, 4096)}),
    ],
)
def test_full_size_shapes(name: str, batch: int, shapes: dict[str, tuple[int, ...]]) -> None:
    g = vm.benchmarks.get(name, batch=batch)
    assert {t.name: t.shape for t in g.inputs} == shapes
    assert all(t.dtype == vm.float16 for t in g.inputs)


def test_stable_variant_subtracts_the_row_max() -> None:
    text = str(vm.benchmarks.get("gqa_stable", small=True))
    assert "max" in text and "sub" in text
    assert "max" not in str(vm.benchmarks.get("gqa", small=True))


def test_bad_suite_requests() -> None:
    with pytest.raises(vm.GraphError, match="unknown program 'nope'"):
        vm.benchmarks.get("nope")
    with pytest.raises(vm.GraphError, match="batch"):
        vm.benchmarks.get("gqa", batch=0)


def _rand_inputs(g: vm.Graph, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape) for t in g.inputs}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [1, 8])
def test_small_expert_designs_equal_reference(name: str, batch: int) -> None:
    g = vm.benchmarks.get(name, batch=batch, small=True)
    mg = expert(name, g, **small_design_kw(name))
    assert mg.num_kernels == SUITE[name].expert_kernels or (name in ("gqa", "mha") and mg.num_kernels == 2)
    ins = _rand_inputs(g, batch)
    for a, b in zip(vm.evaluate(g, ins), vm.evaluate(mg, ins), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
    assert vm.MuGraph.parse(str(mg)) == mg
    assert vm.MuGraph.from_json(mg.to_json()) == mg


@pytest.mark.parametrize("name", ["gqa_stable", "rmsnorm_linear", "ntrans", "mha"])
def test_full_size_designs_evaluate_in_seconds(name: str) -> None:
    g = vm.benchmarks.get(name, batch=1)
    mg = expert(name, g)
    ins = _rand_inputs(g, 0)
    for a, b in zip(vm.evaluate(g, ins), vm.evaluate(mg, ins), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)


def test_stable_designs_survive_logits_that_overflow_a_naive_softmax() -> None:
    g = vm.benchmarks.get("gqa_stable", small=True)
    ins = _rand_inputs(g, 3)
    ins["Q"] = ins["Q"] * 40.0  # logits ~ 1e3: exp overflows float64 without the max subtracted
    want = vm.evaluate(g, ins)[0]
    assert np.isfinite(want).all()
    for kw in ({"splits": 2, "rows": 16, "kv_tile": 32}, {"splits": 4, "rows": 32, "kv_tile": 16}):
        got = vm.evaluate(expert("gqa_stable", g, **kw), ins)[0]
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    flash = vm.benchmarks.designs.flash_attention(g, rows=16, kv_tile=32, stable=True)
    np.testing.assert_allclose(vm.evaluate(flash, ins)[0], want, rtol=1e-9, atol=1e-12)


def test_dropping_the_rescale_changes_the_result() -> None:
    """The evaluator runs loops literally: an online softmax without rescale is wrong, and we see it."""
    g = vm.benchmarks.get("gqa_stable", small=True)
    good = vm.benchmarks.designs.flash_attention(g, rows=16, kv_tile=32, stable=True)
    bad_text = str(good).replace("rescaled_sum", "loop_sum")
    # loop_sum takes one operand: drop the running-max operand on those lines
    lines = []
    for ln in bad_text.splitlines():
        if "loop_sum" in ln:
            head, _, rest = ln.partition(" : ")
            head = head.rsplit(",", 1)[0]
            ln = f"{head} : {rest}"
        lines.append(ln)
    bad = vm.MuGraph.parse("\n".join(lines))
    ins = _rand_inputs(g, 5)
    ins["Q"] *= 4
    assert not np.allclose(vm.evaluate(bad, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-3)


def test_dot_rendering_has_nested_clusters() -> None:
    g = vm.benchmarks.get("gated_mlp", small=True)
    dot = expert("gated_mlp", g, **small_design_kw("gated_mlp")).to_dot()
    assert dot.startswith("digraph") and dot.count("subgraph") == 2 and "fused" in dot and "grid=(2,)" in dot
    assert "digraph" in g.to_dot()


def test_import_ir_does_not_import_torch_or_triton() -> None:
    import subprocess
    import sys

    code = (
        "import sys, verimirage, verimirage.ir, verimirage.benchmarks\n"
        "bad = [m for m in ('torch', 'triton', 'egglog') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
