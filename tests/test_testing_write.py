"""vm.testing.write_tests: generated modules pass for correct kernels and fail for planted wrong ones.

The generated modules are run with pytest in a subprocess (one for all of them, to pay pytest's and torch's start-up
once), exactly as a user would run them; the kernels below are module-level functions of this file, which the modules
find by reference (by module name, or by this file's path when the name does not import in the new process).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

import verimirage as vm
from verimirage.testing import error_ratio, kernel_ref, load_kernel, make_inputs, tolerances, write_tests
from verimirage.testing.runner import run_pytest as run_generated

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- kernels under test


def lora_torch(X, W, A, B):
    """A correct LoRA: float32 arithmetic, float16 result."""
    return (X.float() @ W.float() + (X.float() @ A.float()) @ B.float()).half()


def lora_planted(X, W, A, B):
    """A wrong LoRA: the low-rank term is scaled by 1.01."""
    return (X.float() @ W.float() + 1.01 * ((X.float() @ A.float()) @ B.float())).half()


def attention_torch(Q, K, V):
    """A correct attention (stable softmax in float32)."""
    return (torch.softmax(Q.float() @ K.float(), dim=-1) @ V.float()).half()


def attention_unsafe(Q, K, V):
    """Wrong for the stable graph: a naive softmax (no max subtracted), overflowing for large logits."""
    e = torch.exp(Q.float() @ K.float())
    return ((e / e.sum(-1, keepdim=True)) @ V.float()).half()


def lora_scaled(X, W, A, B, *, c):
    return (X.float() @ W.float() + c * ((X.float() @ A.float()) @ B.float())).half()


def small(name):
    return vm.benchmarks.get(name, small=True)


def expert(name):
    g = small(name)
    return vm.benchmarks.expert(name, g, **vm.benchmarks.small_design_kw(name))


# --------------------------------------------------------------------------- running generated modules


def run_pytest(tmp_path: Path, *modules: Path) -> dict[str, str]:
    """Run pytest on ``modules`` in a fresh process; outcome per 'module::test'.

    PYTHONPATH is the repository root only, not this tests/ dir: the kernels are found through this file's path.
    """
    return run_generated(modules, cwd=tmp_path, pythonpath=[ROOT])


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Write the modules once and run them all in one pytest subprocess."""
    d = tmp_path_factory.mktemp("generated")
    written = {
        "lora_ok": write_tests(small("lora"), d / "test_lora_ok.py", kernel=lora_torch, seed=1),
        "lora_bad": write_tests(small("lora"), d / "test_lora_bad.py", kernel=lora_planted, seed=1, explore=True,
                                explore_examples=10),
        "attn_ok": write_tests(small("gqa_stable"), d / "test_attn_ok.py", kernel=attention_torch, seed=1),
        "attn_bad": write_tests(small("gqa_stable"), d / "test_attn_bad.py", kernel=attention_unsafe, seed=1,
                                shrink=False),
        "lora_expert": write_tests(small("lora"), d / "test_lora_expert.py", kernel=expert("lora"), seed=1,
                                   max_examples=5),
        "lora_default": write_tests(small("lora"), d / "test_lora_default.py", seed=1, max_examples=5),
        "rms_expert": write_tests(small("rmsnorm_linear"), d / "test_rms_expert.py", kernel=expert("rmsnorm_linear"),
                                  seed=1, max_examples=5),
    }
    results = run_pytest(d, *(w.path for w in written.values()))
    return written, results


def outcomes(results, module):
    return {k.split("::")[1]: v for k, v in results.items() if k.startswith(f"test_{module}::")}


@pytest.mark.slow  # these share the `generated` fixture: one pytest subprocess of ~40 s CPU
def test_lora_module_passes_for_a_correct_kernel(generated):
    _, results = generated
    got = outcomes(results, "lora_ok")
    assert set(got) == {"test_matches_reference", "test_scaling_X", "test_batch_slice", "test_deterministic"}
    assert set(got.values()) == {"passed"}, results["__output__"]


@pytest.mark.slow
def test_lora_module_fails_for_the_planted_kernel_and_pins_the_failure(generated):
    written, results = generated
    got = outcomes(results, "lora_bad")
    assert got["test_matches_reference"] == "failed", results["__output__"]
    # 1.01 x a linear term is still linear and batch-independent: the metamorphic tests rightly pass
    assert got["test_scaling_X"] == got["test_batch_slice"] == got["test_deterministic"] == "passed"
    w = written["lora_bad"]
    assert w.pinned and all("differs" in p for p in w.pinned)
    text = w.path.read_text()
    assert "@example(case=strategies.decode_inputs(PINNED[0]" in text


@pytest.mark.slow
def test_attention_module_passes_for_a_correct_kernel(generated):
    written, results = generated
    got = outcomes(results, "attn_ok")
    assert {"test_matches_reference", "test_softmax_shift_0", "test_scaling_V", "test_batch_slice",
            "test_deterministic"} == set(got)
    assert set(got.values()) == {"passed"}, results["__output__"]
    assert "REGIMES = ('normal', 'large', 'mixed')" in written["attn_ok"].path.read_text()


@pytest.mark.slow
def test_attention_module_fails_for_a_numerically_unsafe_kernel(generated):
    _, results = generated
    got = outcomes(results, "attn_bad")
    assert got["test_matches_reference"] == "failed", results["__output__"]


@pytest.mark.slow
def test_expert_designs_through_vm_compile_pass(generated):
    _, results = generated
    for mod in ("lora_expert", "rms_expert"):
        got = outcomes(results, mod)
        assert got.pop("test_kernel_is_verified") in ("passed", "skipped")  # skipped until vm.verify lands
        assert got and set(got.values()) == {"passed"}, (mod, results["__output__"])
    assert "test_scaling_X" in outcomes(results, "rms_expert")  # the norm absorbs a scaling of X


@pytest.mark.slow
def test_default_module_tests_the_best_verified_candidate(generated):
    """kernel=None (API.md): the module compiles the best verified candidate and re-proves it."""
    written, results = generated
    got = outcomes(results, "lora_default")
    assert got["test_kernel_is_verified"] == "passed", results["__output__"]
    assert set(got.values()) == {"passed"}, results["__output__"]
    assert written["lora_default"].kernel.startswith("vm.compile of the best verified candidate")


# --------------------------------------------------------------------------- in-process checks


def test_the_planted_error_is_far_outside_the_tolerance_and_correct_kernels_far_inside():
    g = small("lora")
    tols = tolerances(g)
    good, bad = [], []
    for seed in range(4):
        case = make_inputs(g, "normal", seed)
        ref = vm.evaluate(g, case)
        good.append(error_ratio([lora_torch(*case.values())], ref, tols))
        half = case["X"] @ case["W"] + (case["X"] @ case["A"]) @ case["B"]  # float16 intermediates: still correct
        good.append(error_ratio([half], ref, tols))
        bad.append(error_ratio([lora_planted(*case.values())], ref, tols))
    assert max(good) < 0.3 and min(bad) > 1.2, (good, bad)


def test_tolerances_scale_with_dtype_and_reduction_length():
    f16 = tolerances(small("lora"))[0]
    f32 = tolerances(vm.benchmarks.get("lora", small=True, dtype=vm.float32))[0]
    f32_strict = tolerances(vm.benchmarks.get("lora", small=True, dtype=vm.float32), allow_tf32=False)[0]
    long = tolerances(vm.benchmarks.get("lora", small=True, dtype=vm.float16).copy())[0]
    assert f32_strict.rtol < f16.rtol and f32.rtol == f16.rtol  # TF32 dots round like float16
    assert long == f16
    g = vm.Graph()
    x = g.input("x", (4, 1024), vm.float16)
    g.output(g.sum(x, 1))
    assert tolerances(g)[0].rtol > f16.rtol  # K = 1024 > 32


def test_expert_split_kv_attention_survives_large_logits():
    # regression: partial maxima, sums and outputs between the split-KV kernels were stored in fp16
    # (error ratio ~10 for logits of a few hundred); codegen now keeps inter-kernel values in fp32
    g = small("gqa_stable")
    fn = vm.compile(expert("gqa_stable"))
    case = make_inputs(g, "large", 0)
    assert error_ratio([fn(*case.values())], vm.evaluate(g, case), tolerances(g)) <= 1


def test_kernel_references():
    assert kernel_ref(lora_torch) == {"kind": "import", "target": f"{__name__}:lora_torch", "file": __file__}
    assert load_kernel(kernel_ref(lora_torch)) is lora_torch
    assert kernel_ref("verimirage.testing.torch_ref:torch_kernel")["target"].endswith(":torch_kernel")
    assert kernel_ref(f"{__file__}:lora_torch")["file"] == str(Path(__file__).resolve())
    part = functools.partial(lora_scaled, c=2.0)
    ref = kernel_ref(part)
    assert ref["kind"] == "pickle"
    X, W, A, B = make_inputs(small("lora"), "normal", 0).values()
    assert torch.equal(load_kernel(ref)(X, W, A, B), part(X, W, A, B))
    assert kernel_ref(expert("lora"))["kind"] == "mugraph"
    with pytest.raises(vm.GraphError, match="lambda or closure"):
        kernel_ref(lambda *a: a[0])

    def inner(*a):
        return a[0]

    with pytest.raises(vm.GraphError, match="module level"):
        kernel_ref(inner)
    with pytest.raises(vm.GraphError, match="module:function"):
        kernel_ref("no_colon_here")


def test_write_tests_rejects_bad_arguments(tmp_path):
    with pytest.raises(vm.GraphError, match=r"\.py"):
        write_tests(small("lora"), tmp_path / "x.txt", kernel=lora_torch)
    with pytest.raises(vm.GraphError, match="regimes"):
        write_tests(small("lora"), tmp_path / "test_x.py", kernel=lora_torch, regimes=("loud",))
    with pytest.raises(vm.GraphError, match="kernel-level"):
        write_tests(expert("lora"), tmp_path / "test_x.py", kernel=lora_torch)


def test_default_kernel_is_the_best_verified_candidate(tmp_path):
    """kernel=None: vm.compile(vm.superoptimize(g).best), its μGraph embedded in the module."""
    g = small("lora")
    res = vm.superoptimize(g)
    if res.best is None:
        pytest.fail(f"superoptimize(lora) returned no verified candidate (needs vm.verify):\n{res.report}")
    w = write_tests(g, tmp_path / "test_lora_default.py")
    assert "test_kernel_is_verified" in w.tests
    text = w.path.read_text()
    assert "'kind': 'mugraph'" in text
    case = make_inputs(g, "normal", 0)
    out = load_kernel(kernel_ref(res.best))(*case.values())
    assert error_ratio([out], vm.evaluate(g, case), tolerances(g)) < 1
    np.testing.assert_equal(len(w.facts) > 0, True)
