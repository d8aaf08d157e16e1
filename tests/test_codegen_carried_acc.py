"""A loop's ``tl.dot`` accumulator is carried in the dot's own shape (issue 20: ``rmsnorm_linear``'s training
partition failed Triton's sm_90 compile, "operand #0 does not dominate this use", on ``tl.reshape`` of the
loop-carried accumulator around the dot of a batch of one: ``tl.reshape(tl.dot(x, y, tl.reshape(acc, (128, 32))),
(1, 128, 32))``; the H200 training run of 2026-11-26 21:22, ``benchmarks/results/capture/h200_2026-11-26_s12``).
The accumulator now stays ``(128, 32)`` through the loop and is reshaped once after it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import tuning

#: a loop-carried value reshaped inside the loop around a dot (what Triton's pipeliner failed on)
RESHAPED_ACC = re.compile(r"tl\.dot\([^()]*, tl\.reshape\(v\d+,")


def _batch_one_product(b: int = 4, m: int = 128, k: int = 1408, n: int = 32) -> vm.Graph:
    # one kernel per op: the product's tiles are (1, rows, cols) with a loop over K, read by another kernel
    g = vm.Graph()
    y = g.matmul(g.input("X", (b, m, k), vm.float16), g.input("W", (k, n), vm.float16))
    g.output(g.exp(g.scale(y, c=0.01)))
    return g


def test_a_batch_one_product_carries_its_accumulator_in_the_dots_shape() -> None:
    g = _batch_one_product(2, 64, 256, 32)
    src = tuning.tuned_module(g).source
    assert "for it in range(" in src and "tl.dot(" in src
    assert not RESHAPED_ACC.search(src), src
    carried = re.search(r"(v\d+) = tl\.zeros\(\((\d+), (\d+)\), tl\.float32\)", src)
    assert carried and f"{carried[1]}_r = tl.reshape({carried[1]}, (1, " in src
    rng = np.random.default_rng(0)
    xs = {"X": rng.standard_normal((2, 64, 256)) * 0.1, "W": rng.standard_normal((256, 32)) * 0.1}
    xs = {k: v.astype(np.float16).astype(np.float64) for k, v in xs.items()}
    (ref,) = vm.evaluate(g, xs)
    torch = pytest.importorskip("torch")
    got = vm.compile(g)(**{k: torch.tensor(v, dtype=torch.float16) for k, v in xs.items()})
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=2e-3, atol=2e-3)


@pytest.mark.slow  # sm_90 compiles in a subprocess
def test_a_batch_one_product_accumulated_in_a_loop_compiles_for_sm90(tmp_path: Path) -> None:
    """The rmsnorm_linear training partition's kernel shape ((1, 128, 32) tiles, a loop of 11 over K = 1408):
    compiled for sm_90 as Triton's JIT specialises it, at 2 and 4 stages (it failed at both before)."""
    pytest.importorskip("triton")
    from verimirage.backend.gpucompile import compile_modules

    src = tuning.tuned_module(_batch_one_product()).source
    assert not RESHAPED_ACC.search(src)
    paths = []
    for stages in (2, 4):
        p = tmp_path / f"s{stages}.py"
        p.write_text(src.replace("'num_stages': 2}", f"'num_stages': {stages}}}"))
        paths.append(p)
    rep = compile_modules(paths)
    bad = {p: {k: r["error"][-300:] for k, r in ks.items() if not r["ok"]} for p, ks in rep.items()}
    assert not any(bad.values()), bad
    assert all(r["wgmma"] for ks in rep.values() for r in ks.values() if r["cp_async"])
