"""Two findings of the seventeenth session's decoder-layer work (issue 23), each a regression test that fails on
the code before it:

* a kernel without a for-loop read its tiles of the program's inputs only after its PDL wait, however many
  (the decode layer's split-KV attention: 64 KB of K and V a block, its 16.8 MB stream started only once the rotary
  kernel before it had completed); now it loads them before the wait (``KernelInfo.early_loads``) and the launch
  before it lets it launch at its start;
* a norm's row statistic computed before a projection's loop (``codegen._KernelGen.emit_chunked_sum``) reduced each
  chunk across the block, whose barrier held the next chunk's load: 32 memory round trips one after another (the
  layer's q projection shape, 23.3 us weighted against 9.6 unweighted on an H100); now the chunks add up
  elementwise and the row is reduced once after their loop;
* that kernel at several rows (16-row mma.sync, its operand ``x r w`` computed and stored for the dot every
  iteration) ran at 4 warps with one block an SM: 40.5 / 42.0 us against 21.7 / 22.4 at 8 warps (rmsnorm_linear's
  shapes, 96 blocks; unweighted 20.7): ``tuning.recommend`` gives it 8.

Kernels run in Triton's interpreter (the PDL calls and L2 prefetches removed: the interpreter has no griddepcontrol)
against float64.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import PDL_EARLY_LOADS_MIN_BYTES, generate
from verimirage.backend.launchcheck import pdl_hazards

#: Y = X @ W (two blocks of 64 columns), then Z = Y @ C in one step (no loop), C's tile (128, COLS) a block
TWO = """mugraph {{
  %0 = input {{name='X'}} : f16[16,128]
  %1 = input {{name='W'}} : f16[128,128]
  %2 = input {{name='C'}} : f16[128,{n}]
  %3 = custom %0, %1 {{frange=1, grid=(2,)}} : f16[16,128] {{
    %0 = input {{arg=0, fmap=None, imap=(None,), shape=(16, 128)}} : f16[16,128]
    %1 = input {{arg=1, fmap=None, imap=(1,), shape=(128, 128)}} : f16[128,64]
    %2 = matmul %0, %1 : f16[16,64]
    output %2 {{omap=(1,)}}
  }}
  %4 = custom %3, %2 {{frange=1, grid=(2,)}} : f16[16,{n}] {{
    %0 = input {{arg=0, fmap=None, imap=(None,), shape=(16, 128)}} : f16[16,128]
    %1 = input {{arg=1, fmap=None, imap=(1,), shape=(128, {n})}} : f16[128,{half}]
    %2 = matmul %0, %1 : f16[16,{half}]
    output %2 {{omap=(1,)}}
  }}
  return %4
}}"""

_MEM = re.compile(r"tl\.(load|store|atomic_\w+)\(")


def _two(n: int) -> str:
    return TWO.format(n=n, half=n // 2)


def _kernel(source: str, name: str) -> str:
    k = source[source.index(f"def {name}("):]
    return k[:k.index("\n\n\n")] if "\n\n\n" in k else k


def _early_loads(text: str, pdl: str = "end") -> bool:
    """``KernelInfo.early_loads`` of the second kernel of ``text``, generated on its own with the program's inputs as
    the operands it may read before its wait."""
    from verimirage.backend.codegen import kernel_source, to_kernels
    from verimirage.ir.graph import node_list

    nodes = node_list(to_kernels(vm.MuGraph.parse(text)))
    n = nodes[4]
    ats = [nodes[a].outs[k] for a, k in n.args]
    early = frozenset(q for q, (a, _) in enumerate(n.args) if nodes[a].op == "input")
    return kernel_source(n.attr("block"), ats, "k4", pdl=pdl, early_args=early)[1].early_loads


def _before_wait(k: str) -> str:
    return k[k.index("):\n"):k.index("gdc_wait()")]


def test_a_loopless_kernel_read_its_large_input_tiles_only_after_its_pdl_wait() -> None:
    ms = generate(vm.MuGraph.parse(_two(512)), pdl="auto")  # C's tile: 128 x 256 fp16 = 64 KB a block
    assert PDL_EARLY_LOADS_MIN_BYTES <= 128 * 256 * 2
    k4 = _kernel(ms.source, "k4")
    early = _before_wait(k4)
    # C (a program input) is loaded before the wait, Y (k3's result) and the store after it
    assert "tl.load(a1_ptr" in early and "a0_ptr" not in early and "tl.store(" not in early
    assert "tl.load(a0_ptr" in k4[k4.index("gdc_wait()"):]
    assert _early_loads(_two(512)) and not _early_loads(_two(512), pdl="")
    # the program's first launch still waits before any memory access, and lets k4 launch at its start
    k3 = _kernel(ms.source, "k3")
    assert not _MEM.search(_before_wait(k3)) and "gdc_wait()\n    gdc_launch_dependents()" in k3
    assert pdl_hazards(ms.source) == []
    # without PDL nothing moves
    assert "gdc_" not in generate(vm.MuGraph.parse(_two(512))).source


def test_a_loopless_kernel_with_small_input_tiles_still_waits_first() -> None:
    ms = generate(vm.MuGraph.parse(_two(64)), pdl="auto")  # C's tile: 128 x 32 fp16 = 8 KB a block
    k4 = _kernel(ms.source, "k4")
    assert not _MEM.search(_before_wait(k4)) and not _early_loads(_two(64))


def test_early_loads_compute_the_same_as_without_pdl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from verimirage.backend.runtime import load_module

    mg = vm.MuGraph.parse(_two(512))
    rng = np.random.default_rng(5)
    xs = {n: (rng.standard_normal(s) * 0.3).astype(np.float16) for n, s in
          (("X", (16, 128)), ("W", (128, 128)), ("C", (128, 512)))}
    ref = xs["X"].astype(np.float64) @ xs["W"].astype(np.float64) @ xs["C"].astype(np.float64)
    for mode in ("", "auto"):
        src = "\n".join(ln for ln in generate(mg, pdl=mode).source.splitlines()
                        if "gdc_" not in ln and not ln.lstrip().startswith("_vm_prefetch(")) + "\n"
        mod = load_module(tmp_path / f"two_{mode or 'plain'}.py", src)
        (out,) = mod.forward(*(torch.tensor(xs[n]) for n in ("X", "W", "C")))
        err = np.abs(out.double().numpy() - ref).max() / np.abs(ref).max()
        assert err < 5e-3, (mode, err)


def _weighted(rows: int, k: int, n: int) -> vm.MuGraph:
    """rms_norm(x, w) @ W in the new form (``stabilise.prologue_norm_scales``): the best-estimated
    one-kernel lowering with a for-loop."""
    import verimirage.rewrite.partition as P
    import verimirage.rewrite.stabilise as st
    from verimirage.pipeline import pricing

    h = vm.float16
    g = vm.Graph()
    x, w, wt = g.input("X", (rows, k), h), g.input("G", (k,), h), g.input("W", (k, n), h)
    g.output(g.matmul(g.rms_norm(x, w, axis=1, eps=1e-5), wt))
    gn = st.norm_into_projections(g)
    assert gn is not None
    keep = P._norm_operands
    P._norm_operands = lambda low: low  # type: ignore[assignment]
    try:
        lows = [low.mugraph for low in P.lower_all(gn, rank=pricing.cost)[0] if low.mugraph.num_kernels == 1
                and "frange=1," not in str(low.mugraph)]
    finally:
        P._norm_operands = keep  # type: ignore[assignment]
    forms = [m for m in (st.prologue_norm_scales(m) for m in lows) if m is not None]
    return min(forms, key=pricing.cost)


def test_prologue_row_statistic_reduced_each_chunk_across_the_block(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from verimirage.backend.runtime import load_module

    mg = _weighted(1, 1024, 64)
    src = generate(mg).source
    # the statistic's chunk loop (before the projection's loop) adds chunks elementwise: no reduction inside it
    m = re.search(r"\n    for (kc\d+) in range\(0, (\d+)\):\n((?:        .*\n)+)", src)
    assert m is not None and int(m.group(2)) == 1024 // 128, src
    assert "tl.sum(" not in m.group(3) and "tl.load(" in m.group(3)
    assert re.match(r"    r\d+ = tl\.sum\(r\d+, axis=1, keep_dims=True\)\n", src[m.end():])
    rng = np.random.default_rng(7)
    xs = {"X": rng.uniform(-1, 1, (1, 1024)), "G": rng.uniform(0.5, 1.5, 1024),
          "W": rng.uniform(-0.05, 0.05, (1024, 64))}
    xs = {k_: v.astype(np.float16) for k_, v in xs.items()}
    x64 = xs["X"].astype(np.float64)
    ref = (x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-5) * xs["G"].astype(np.float64)) @ xs[
        "W"].astype(np.float64)
    mod = load_module(tmp_path / "weighted.py", src)
    (out,) = mod.forward(*(torch.tensor(xs[n]) for n in ("X", "G", "W")))
    err = np.abs(out.double().numpy() - ref).max() / np.abs(ref).max()
    assert err < 5e-3, err


def test_weighted_prologue_kernel_alone_on_its_sm_ran_at_four_warps() -> None:
    from verimirage.backend.tuning import kernel_shape, recommend
    from verimirage.ir.graph import node_list

    def config(mg: vm.MuGraph) -> tuple[int, bool, int, int]:
        nodes = node_list(mg)
        n = next(x for x in nodes if x.op == "custom")
        ats = [nodes[a].outs[k] for a, k in n.args]
        s = kernel_shape(n.attr("block"), ats)
        return recommend(n.attr("block"), ats).num_warps, s.operand_chain, s.dot_rows, s.blocks

    warps, chain, rows, blocks = config(_weighted(2, 1024, 2048))
    assert chain and rows == 2 and blocks <= 132 and warps == 8
    # one row (a 16-row row dot): 4 warps measured faster (the q projection's shape: 15.1 against 21.2 us)
    warps, chain, rows, _ = config(_weighted(1, 1024, 2048))
    assert chain and rows == 1 and warps == 4
