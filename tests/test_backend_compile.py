"""Backend: every generated kernel compiles for sm_90; golden snapshots of the suite's kernels.

The sm_90 compile runs in a separate process (verimirage.backend.gpucompile):
the interpreter accepts programs the GPU compiler rejects, and compiling in a
process that already ran interpreted kernels can fail spuriously. A matmul
kernel whose PTX has ``wgmma`` used Hopper's tensor cores.

Golden files: tests/golden/<program>.py hold the generated module of each
suite program's expert design (small shapes, fp16). A change in codegen that
changes a kernel fails here; if it is meant, regenerate with
``VERIMIRAGE_UPDATE_GOLDEN=1 pytest tests/test_backend_compile.py`` and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import verimirage as vm
from verimirage.backend.codegen import LaunchConfig, TileOptions, generate
from verimirage.backend.gpucompile import compile_modules
from verimirage.backend.runtime import ensure_mode, write_module
from verimirage.benchmarks.designs import expert, small_design_kw

ensure_mode()  # CPU-only machine: TRITON_INTERPRET=1 before anything imports triton

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("VERIMIRAGE_UPDATE_GOLDEN") == "1"


def _programs() -> list[tuple[str, object]]:
    progs: list[tuple[str, object]] = []
    for name in vm.benchmarks.names():
        g = vm.benchmarks.get(name, small=True)
        progs.append((f"{name}-expert", expert(name, g, **small_design_kw(name))))
        progs.append((f"{name}-plain", g))
    for name in ("gqa_stable", "gated_mlp"):
        g = vm.benchmarks.get(name, small=True, dtype=vm.bfloat16)
        progs.append((f"{name}-expert-bf16", expert(name, g, **small_design_kw(name))))
    from test_backend import _block_mix  # ragged tiles, in-block concat/transpose

    progs.append(("block-mix-f16", _block_mix(vm.float16)[1]))
    g = vm.Graph()
    x = g.input("X", (3, 40), vm.float16)
    w = g.input("W", (40, 24), vm.float16)
    r = g.input("R", (1, 40), vm.float16)
    g.output(g.matmul(x, w), g.matmul(r, w), g.concat([x, r], axis=0), g.transpose(x, 0, 1))
    progs.append(("ragged-f16", g))
    return progs


@pytest.mark.slow  # the sm_90 compiles take minutes with a cold Triton cache (a fresh clone, CI)
def test_every_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    paths: dict[str, tuple[Path, object]] = {}
    for label, prog in _programs():
        ms = generate(prog)
        paths[label] = (write_module(ms, tmp_path), ms)
    report = compile_modules([p for p, _ in paths.values()])
    failures = []
    n_dot = 0
    for label, (path, ms) in paths.items():
        rep = report[str(path)]
        assert set(rep) == {k.name for k in ms.kernels}, label
        for k in ms.kernels:
            r = rep[k.name]
            if not r["ok"]:
                failures.append(f"{label}/{k.name}: {r['error']}")
            elif k.uses_dot and k.row_dots_only:  # one-row products: 16-row dots, mma.sync by design
                if not r["mma"]:
                    failures.append(f"{label}/{k.name}: a one-row tl.dot kernel without mma in its PTX")
            elif k.uses_dot:
                n_dot += 1
                if not r["wgmma"]:
                    failures.append(f"{label}/{k.name}: a tl.dot kernel without wgmma in its PTX")
    assert not failures, "\n".join(failures)
    assert n_dot >= 20


@pytest.mark.slow  # the sm_90 compiles take minutes with a cold Triton cache (a fresh clone, CI)
def test_small_dot_padding_falls_back_to_mma(tmp_path: Path) -> None:
    # with 16-row dot padding the compiler cannot use wgmma (64 rows per warp group) and emits mma.sync:
    # the reason the default pads dot rows to 64
    g = vm.benchmarks.get("gated_mlp", small=True)
    ms = generate(expert("gated_mlp", g, **small_design_kw("gated_mlp")), LaunchConfig(
        tiles=TileOptions(dot_min_m=16)).tiles)
    path = write_module(ms, tmp_path)
    (rep,) = compile_modules([path]).values()
    (r,) = rep.values()
    assert r["ok"] and r["mma"] and not r["wgmma"]


@pytest.mark.parametrize("name", vm.benchmarks.names())
def test_golden_source(name: str) -> None:
    g = vm.benchmarks.get(name, small=True)
    src = generate(expert(name, g, **small_design_kw(name))).source
    path = GOLDEN / f"{name}.py"
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"golden file {path} is missing; create it with VERIMIRAGE_UPDATE_GOLDEN=1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
    assert src == path.read_text(), f"generated source of {name} changed; see the module docstring"


CODEGEN_CASES = Path(__file__).parent / "cases" / "codegen"


def _case(path: Path) -> vm.MuGraph:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
    return vm.MuGraph.parse(text)


@pytest.mark.slow  # the sm_90 compiles take minutes with a cold Triton cache (a fresh clone, CI)
def test_full_size_attention_kernels_compile_specialised_and_pipeline(tmp_path: Path) -> None:
    # Kernels the search produced at full size, compiled as the GPU's JIT specialises them (contiguous,
    # 16-aligned: the pipeliner then makes asynchronous copies). *_layout_crash: a load squeezed to rank 2
    # beside a reshaped operand of the same tl.dot failed Triton 3.6's TritonGPURemoveLayoutConversions;
    # one_head_per_block_unpipelined: rank-3 loads reshaped before tl.dot were never turned into cp.async.
    cases = sorted(CODEGEN_CASES.glob("*.mugraph"))
    assert len(cases) >= 5
    paths: dict[str, Path] = {}
    for case in cases:
        for label, tiles in (("rank2", TileOptions(dot_min_m=16)), ("batch1", TileOptions(dot_min_m=16,
                                                                                          dot_batch1=True))):
            paths[f"{case.stem}/{label}"] = write_module(generate(_case(case), tiles), tmp_path)
    report = compile_modules(list(paths.values()))
    failures = [f"{label}/{k}: {r['error']}" for label, p in paths.items() for k, r in report[str(p)].items()
                if not r["ok"]]
    assert not failures, "\n".join(failures)
    for label in ("rank2", "batch1"):
        (r,) = report[str(paths[f"one_head_per_block_unpipelined/{label}"])].values()
        assert r["cp_async"] > 0, label


def test_every_stored_benchmark_candidate_generates() -> None:
    # benchmarks/candidates holds the verified candidates the H100 harness profiles. Each must lower under the
    # tile options of the default configurations: codegen refuses (GraphError) a register tensor above Triton's
    # 2**20-element limit, which is how the LoRA concat-fusion candidates failed on the GPU before codegen 4.
    import json

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "candidates"
    files = sorted(root.glob("*.json"))
    assert len(files) == 20
    n = 0
    for f in files:
        for c in json.loads(f.read_text())["candidates"]:
            m = vm.MuGraph.parse(c["mugraph"])
            for tiles in (TileOptions(), TileOptions(dot_min_m=16), TileOptions(dot_min_m=16, dot_batch1=True)):
                ms = generate(m, tiles)  # raises GraphError on an oversized register tensor
                assert len(ms.kernels) == m.num_kernels, f.name
                helpers = ms.source.count("def _max_nan(") + ms.source.count("def _min_nan(")  # (reductions' combines)
                assert ms.source.count("@triton.jit") - helpers == m.num_kernels, f.name
                n += 1
    assert n > 500
