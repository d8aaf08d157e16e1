"""A reduction beside a pipelined ``tl.dot`` in one for-loop.

Triton 3.6 on an H100 computed ``rms_norm(x) @ W`` (8 x 4096 x 14336, fp16; 64 padded rows, 4 warps, 3 or 4
stages) wrong in 13 of 40 runs when the kernel summed ``x * x`` inside the loop that also ran the product; the
same kernel accumulating ``x * x`` elementwise and summing once after the loop was right in 60 of 60 runs, and as
fast (BENCHMARKS.md, "A wrong result under pipelining"). Code generation now defers such reductions
(``codegen.deferred_reductions``); these tests hold the form and its meaning.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import verimirage as vm

BARE = """mugraph {{
  %0 = input {{name='X'}} : f16[8,{k}]
  %1 = input {{name='W'}} : f16[{k},{n}]
  %2 = custom %0, %1 {{frange={it}, grid=({g},)}} : f16[8,{n}] {{
    %0 = input {{arg=0, fmap=1, imap=(None,), shape=(8, {k})}} : f16[8,64]
    %1 = input {{arg=1, fmap=0, imap=(1,), shape=({k}, {n})}} : f16[64,64]
    %2 = matmul %0, %1 : f16[8,64]
    %3 = loop_sum %2 : f16[8,64]
    %4 = square %0 : f16[8,64]
    %5 = {stat} %4 {{axis=1}} : f16[8,1]
    %6 = {loop} %5 : f16[8,1]
    %7 = fused %3, %6 : f16[8,64] {{
      %0 = arg {{index=0}} : f16[8,64]
      %1 = arg {{index=1}} : f16[8,1]
      %2 = {post} %1 : f16[8,1]
      %3 = mul %0, %2 : f16[8,64]
      return %3
    }}
    output %7 {{omap=(1,)}}
  }}
  return %2
}}"""


def _mugraph(k: int, n: int, stat: str) -> vm.MuGraph:
    loop, post = {"sum": ("loop_sum", "rsqrt"), "max": ("loop_max", "exp")}[stat]
    return vm.MuGraph.parse(BARE.format(k=k, n=n, it=k // 64, g=n // 64, stat=stat, loop=loop, post=post))


def _loop_body(src: str) -> str:
    m = re.search(r"\n(\s*)for it in range\(0, \d+\):\n((?:\1\s+.*\n)+)", src)
    assert m is not None, src
    return m.group(2)


@pytest.mark.parametrize("stat", ["sum", "max"])
def test_norm_matmul_summed_its_rows_beside_a_pipelined_dot_and_the_gpu_gave_wrong_rows(stat: str) -> None:
    """The loop runs the product and accumulates the tile elementwise; the reduction comes after the loop, and the
    interpreter's result equals the μGraph's own meaning (float64) within fp16's tolerance."""
    mg = _mugraph(512, 256, stat)
    prog = vm.compile(mg)
    body = _loop_body(prog.source)
    assert "tl.dot(" in body
    assert not re.search(r"tl\.(sum|max|min|reduce)\(", body), body
    after = prog.source.split(body, 1)[1]
    assert re.search(r"tl\.(sum|reduce)\(v\d+_e, (axis=)?1", after), after
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (8, 512)).astype(np.float16)
    w = (rng.uniform(-1, 1, (512, 256)) * 0.05).astype(np.float16)
    if stat == "max":
        x = (x * 0.1).astype(np.float16)  # (exp of the row max stays small)
    want = vm.evaluate(mg, {"X": x.astype(np.float64), "W": w.astype(np.float64)})[0]
    import torch

    got = prog(torch.tensor(x), torch.tensor(w)).double().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-3 * np.abs(want).max())


def test_a_reduction_used_inside_its_loop_is_not_deferred() -> None:
    """A reduction whose value the loop itself reads (an online softmax's running max, gqa_stable's committed best
    candidate) stays in the loop: deferring it would change what the loop computes."""
    import json
    from pathlib import Path

    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/candidates/gqa_stable_bs1.json").read_text())
    src = vm.compile(vm.MuGraph.parse(doc["candidates"][0]["mugraph"])).source
    bodies = re.findall(r"\n(\s*)for it in range\(0, \d+\):\n((?:\1\s+.*\n)+)", src)
    assert bodies, src
    assert any("tl.dot(" in b and re.search(r"tl\.(max|reduce)\(", b) for _, b in bodies), src


@pytest.mark.gpu
def test_norm_matmul_gave_wrong_rows_on_the_gpu_under_pipelining() -> None:
    """The failing case itself: 40 runs on one set of inputs, every output bit-equal and within fp16's tolerance of
    float64 (before the change 13 of 40 runs differed, max relative error 5e-2)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    mg = _mugraph(4096, 14336, "sum")
    prog = vm.compile(mg)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(8, 4096, generator=g) * 2 - 1).half()
    w = ((torch.rand(4096, 14336, generator=g) * 2 - 1) * 0.05).half()
    x64, w64 = x.double(), w.double()
    want = (x64 * torch.rsqrt((x64 * x64).sum(1, keepdim=True))) @ w64
    xd, wd = x.cuda(), w.cuda()
    junk = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    first = None
    for i in range(40):
        if i % 2:
            junk @ junk
        got = prog(xd, wd).double().cpu()
        err = float((got - want).abs().max() / want.abs().max())
        assert err < 1e-3, f"run {i}: relative error {err:.2e}"
        first = got if first is None else first
        assert torch.equal(got, first), f"run {i} differs from run 0"


@pytest.mark.gpu
def test_every_committed_candidate_gives_the_same_bits_on_every_run() -> None:
    """Each committed candidate (the best of every candidate and proof file), 10 runs on one set of inputs: the
    kernels are deterministic by construction, so a run that differs is a race below the generator."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks/perf/determinism.py"
    spec = importlib.util.spec_from_file_location("determinism", path)
    assert spec is not None and spec.loader is not None
    det = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(det)
    bad = {}
    for f, r, t in det.committed(1):
        row = det.run_one(t, 10)
        if row is not None and row["runs_differing"]:
            bad[f"{f}#{r}"] = row
    assert not bad, bad
