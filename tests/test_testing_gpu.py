"""Generated test modules on a GPU, at the suite's full sizes (skipped without CUDA; run on the device machine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import verimirage as vm
from verimirage.testing import run_pytest, write_tests

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
KERNELS = '''
import torch

def lora(X, W, A, B):
    return (X.float() @ W.float() + (X.float() @ A.float()) @ B.float()).half()

def lora_planted(X, W, A, B):
    return (X.float() @ W.float() + 1.01 * ((X.float() @ A.float()) @ B.float())).half()
'''


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_generated_modules_on_the_gpu(tmp_path):
    (tmp_path / "gpu_kernels.py").write_text(KERNELS)
    lora = vm.benchmarks.get("lora")
    mods = {
        "lora_torch": write_tests(lora, tmp_path / "test_lora_torch.py", kernel=f"{tmp_path}/gpu_kernels.py:lora",
                                  seed=0, gpu_max_examples=30),
        "lora_planted": write_tests(lora, tmp_path / "test_lora_planted.py",
                                    kernel=f"{tmp_path}/gpu_kernels.py:lora_planted", seed=0, gpu_max_examples=30),
    }
    for name in ("lora", "rmsnorm_linear", "gated_mlp", "ntrans", "gqa_stable"):
        g = vm.benchmarks.get(name)
        mods[f"{name}_expert"] = write_tests(g, tmp_path / f"test_{name}_expert.py",
                                             kernel=vm.benchmarks.expert(name, g), seed=0, gpu_max_examples=15,
                                             shrink=False)
    res = run_pytest([m.path for m in mods.values()], cwd=tmp_path, pythonpath=[ROOT],
                     extra_args=["-k", "not verified"])
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir, "gpu_generated_tests.json").write_text(json.dumps(res, indent=1))
    got = {k: v for k, v in res.items() if k != "__output__"}
    assert all(v == "passed" for k, v in got.items() if k.startswith("test_lora_torch::")), res["__output__"]
    assert got["test_lora_planted::test_matches_reference"] == "failed"
    for name in ("lora", "rmsnorm_linear", "gated_mlp", "ntrans"):
        assert all(v == "passed" for k, v in got.items() if k.startswith(f"test_{name}_expert::")), (name, res)
