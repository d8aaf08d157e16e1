"""Programs whose dims are not powers of two get the fusions of their power-of-two twins (benchmarks/odd_shapes.py).

Finding (held-out sweep, 2026-11-27): an axis whose size has several odd prime factors and few factors of two (a
vocabulary of 50,257 = 29 x 1733, or 1,155 = 3 x 5 x 7 x 11) was offered only 1 or n blocks (the block counts were
powers of two and the counts giving power-of-two tiles): every tiling of the LM head's columns padded a 1,155-wide
tile to 2,048 and ran out of shared memory, so the soft-capped head took 4 unfused kernels (8.9 us est.) where its
twin takes 1. An axis with no tiling of at least 16 padded by at most a quarter now has every divisor as a block
count (55 blocks of 21 columns: 1 kernel, 2.2 us est.).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.rewrite.partition import _grid_divisors, _pow2_divisors


def _softcap_head(m: int, k: int, v: int, dt: Any) -> vm.Graph:
    """The held-out logit_softcap: ``30 tanh(x @ w / 30)`` over a vocabulary of ``v``."""
    g = vm.Graph()
    x, w = g.input("x", (m, k), dt), g.input("w", (k, v), dt)
    g.output(g.scale(g.tanh(g.scale(g.matmul(x, w), 1 / 30)), 30.0))
    return g


def test_axes_with_sixteen_as_a_factor_keep_their_block_counts() -> None:
    """Every size the models set and the suite use at full size is a multiple of 16 (tiles of 16 pad nothing):
    their configs are unchanged; so are sizes with a tiling padded by at most a quarter (216 = 8 x 27: tiles of 27,
    padded to 32)."""
    for n in (4096, 3584, 4608, 6144, 11008, 13824, 14336, 151936, 32000, 3136, 1024, 48, 16, 216, 344):
        assert _grid_divisors(n) == sorted(set(_pow2_divisors(n)) | {n // t for t in _pow2_divisors(n)})


def test_an_axis_with_odd_factors_has_every_divisor_as_a_block_count() -> None:
    assert _grid_divisors(1155) == [d for d in range(1, 1156) if 1155 % d == 0]
    assert {29, 1733} <= set(_grid_divisors(50257))
    assert _grid_divisors(197) == [1, 197]  # a prime: nothing between (a masked tail tile is not built)


#: per dtype: the largest difference from the float64 reference over max(1, |reference|)
TOL = {"float16": 2e-2, "float32": 1e-4}


@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_a_vocabulary_with_odd_factors_gets_its_twins_one_kernel_and_matches_float64(dt: str) -> None:
    import torch

    g = _softcap_head(8, 64, 1155, getattr(vm, dt))
    twin = vm.superoptimize(_softcap_head(8, 64, 1024, getattr(vm, dt)), cache=False).best
    res = vm.superoptimize(g, cache=False)
    best = res.best
    assert isinstance(best.verdict, vm.Proved)
    assert best.mugraph.num_kernels <= twin.mugraph.num_kernels == 1
    rng = np.random.default_rng(5)
    ins = {t.name: rng.standard_normal(t.shape) / 2 for t in g.inputs}
    (want,) = vm.evaluate(g, ins)
    out = vm.compile(best)(*[torch.tensor(ins[t.name], dtype=getattr(torch, dt)) for t in g.inputs])
    out = out[0] if isinstance(out, (list, tuple)) else out
    err = float(np.abs(out.double().numpy() - want).max()) / max(1.0, float(np.abs(want).max()))
    assert err < TOL[dt], err


@pytest.mark.slow  # an sm_90 compile in a subprocess: minutes on a loaded 2-core machine
def test_the_divisor_grid_kernel_compiles_for_sm90(tmp_path: Path) -> None:
    from verimirage.backend.codegen import generate
    from verimirage.backend.gpucompile import compile_modules
    from verimirage.backend.runtime import write_module

    best = vm.superoptimize(_softcap_head(8, 64, 1155, vm.float16), cache=False).best
    rep = compile_modules([write_module(generate(best.mugraph), tmp_path)])
    assert all(r["ok"] for kernels in rep.values() for r in kernels.values()), rep


def test_the_sweeps_programs_build_and_its_tables_render() -> None:
    """benchmarks/odd_shapes.py: every family builds a well-typed graph at its twin's and its odd dims, and a row
    is rendered next to its twin (and its kernels before)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import odd_shapes

    for build, twin, odd in odd_shapes.FAMILIES.values():
        for dims in [twin, *(d for d, _ in odd)]:
            build(*dims).check()
    rows = [{"family": "geglu", "dims": [16, 128, 512], "what": "twin", "search_s": 1.0, "kernels": 1,
             "est_us": 2.4, "proved": True},
            {"family": "geglu", "dims": [16, 128, 344], "what": "11008 / 32", "search_s": 1.0, "kernels": 1,
             "est_us": 3.5, "proved": True}]
    before = [{**rows[1], "kernels": 3}]
    table = odd_shapes.render(rows, before).splitlines()
    assert table[3] == "| geglu | (16, 128, 344) | 11008 / 32 | 1 | 3.5 | 1.0 | yes | 1 | 2.4 | 3 |"
