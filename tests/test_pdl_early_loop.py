"""Programmatic dependent launch: a later kernel's for-loop over the program's inputs runs before its wait
(``codegen.generate(pdl=...)``'s ``early_args``, ``KernelInfo.early_loop``; issue 22, lora_scaled's three-kernel
design), the kernel before it lets it launch before its own wait ("pre"), and what that may and may not read early.
Kernels run in Triton's interpreter (with the PDL calls and L2 prefetches removed: the interpreter has no
griddepcontrol) against float64."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import KernelInfo, generate

#: a LoRA of rank 16 as the search's three-kernel design: X A in split partials, their sum, then X W over a K loop
#: with (X A) B added after it (benchmarks/candidates_models/lora_scaled.json, candidate 0, scaled down)
LORA3 = """mugraph {
  %0 = input {name='X'} : f16[16,64]
  %1 = input {name='W'} : f16[64,64]
  %2 = input {name='A'} : f16[64,16]
  %3 = input {name='B'} : f16[16,64]
  %4 = custom %0, %2 {frange=1, grid=(1, 2)} : f16[16,32] {
    %0 = input {arg=0, fmap=1, imap=(0, 1), shape=(16, 64)} : f16[16,32]
    %1 = input {arg=1, fmap=0, imap=(None, 0), shape=(64, 16)} : f16[32,16]
    %2 = matmul %0, %1 : f16[16,16]
    %3 = loop_sum %2 : f16[16,16]
    output %3 {omap=(0, 1)}
  }
  %5 = custom %4 {frange=2, grid=(1,)} : f16[16,16] {
    %0 = input {arg=0, fmap=1, imap=(0,), shape=(16, 32)} : f16[16,16]
    %1 = loop_sum %0 : f16[16,16]
    output %1 {omap=(0,)}
  }
  %6 = custom %0, %1, %3, %5 {frange=2, grid=(2,)} : f16[16,64] {
    %0 = input {arg=0, fmap=1, imap=(None,), shape=(16, 64)} : f16[16,32]
    %1 = input {arg=1, fmap=0, imap=(1,), shape=(64, 64)} : f16[32,32]
    %2 = input {arg=2, fmap=None, imap=(1,), shape=(16, 64)} : f16[16,32]
    %3 = input {arg=3, fmap=None, imap=(None,), shape=(16, 16)} : f16[16,16]
    %4 = matmul %0, %1 : f16[16,32]
    %5 = loop_sum %4 : f16[16,32]
    %6 = matmul %3, %2 : f16[16,32]
    %7 = scale %6 {c=2.0} : f16[16,32]
    %8 = add %5, %7 : f16[16,32]
    output %8 {omap=(1,)}
  }
  return %6
}"""

_MEM = re.compile(r"tl\.(load|store|atomic_\w+)\(")


def _kernels(source: str) -> dict[str, str]:
    out = {}
    for k in source.split("@triton.jit")[1:]:
        m = re.search(r"def (k\d+)\(", k)  # (not the helpers: _vm_prefetch, ...)
        if m is not None:
            out[m.group(1)] = k[:k.index("\n\n\n")] if "\n\n\n" in k else k
    return out


def _before_wait(k: str) -> str:
    """The kernel's statements before its wait (its ``def`` line left out)."""
    return k[k.index("):\n"):k.index("gdc_wait()")]


@pytest.mark.parametrize("mode", ["auto", "start", "end"])
def test_pdl_a_later_kernels_input_loop_runs_before_its_wait(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from verimirage.backend import codegen

    # (the split and its combine apart, as "auto" had them before PDL_LASTBLOCK_BEFORE_EARLY_LOOP)
    monkeypatch.setattr(codegen, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP", False)
    ms = generate(vm.MuGraph.parse(LORA3), pdl=mode)
    ks = _kernels(ms.source)
    assert list(ks) == ["k4", "k5", "k6"]
    # the program's first kernel waits before any memory access: a kernel before the program may still write X
    assert not _MEM.search(_before_wait(ks["k4"]))
    # the combine reads only the first kernel's partials: it waits first
    assert not _MEM.search(_before_wait(ks["k5"]))
    # the last kernel streams X and W (program inputs) before its wait; T (k5's result) and every store after it
    early = _before_wait(ks["k6"])
    assert "for it in" in early and "tl.load(a0_ptr" in early and "tl.load(a1_ptr" in early
    assert "a3_ptr" not in early and "tl.store(" not in early
    assert "tl.load(a3_ptr" in ks["k6"][ks["k6"].index("gdc_wait()"):]
    # "auto": the combine lets the last kernel launch before its own wait, the first kernel only after its wait
    if mode == "auto":
        assert "gdc_launch_dependents()\n    gdc_wait()" in ks["k5"]
        assert "gdc_wait()\n    gdc_launch_dependents()" in ks["k4"]
    else:
        assert "gdc_launch_dependents()\n    gdc_wait()" not in ms.source
    assert all(k.count("gdc_wait()") == 1 and k.count("gdc_launch_dependents()") == 1 for k in ks.values())


def test_pdl_auto_runs_a_split_and_its_combine_as_one_launch_before_an_early_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" with PDL_LASTBLOCK_BEFORE_EARLY_LOOP and PDL_START_BEFORE_EARLY_LOOP (off by default: measured slower,
    # see codegen): the split X A and its sum run as one last-block launch, which lets the weight stream launch at its
    # start (once it has waited: it is the program's first): one launch hop before the stream instead of two
    from verimirage.backend import codegen

    monkeypatch.setattr(codegen, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP", True)
    monkeypatch.setattr(codegen, "PDL_START_BEFORE_EARLY_LOOP", True)
    ms = generate(vm.MuGraph.parse(LORA3), pdl="auto")
    assert [k.name for k in ms.kernels] == ["k4_5", "k6"]
    assert ms.kernels[0].members == (4, 5) and ms.counters == 1
    lb = ms.source[ms.source.index("def k4_5("):]
    lb = lb[:lb.index("\n\n\n")]
    # the first launch waits before it triggers and before any memory access; it triggers once, at its start
    assert lb.count("gdc_wait()") == 1 and lb.count("gdc_launch_dependents()") == 1
    assert lb.index("gdc_wait()") < lb.index("gdc_launch_dependents()") < lb.index("k4(")
    k6 = _kernels(ms.source)["k6"]
    early = _before_wait(k6)
    assert "for it in" in early and "tl.load(a1_ptr" in early and "a3_ptr" not in early and "tl.store(" not in early
    # without pdl, or with last-block launches not wanted there, the three launches stay
    assert [k.name for k in generate(vm.MuGraph.parse(LORA3)).kernels] == ["k4", "k5", "k6"]
    assert [k.name for k in generate(vm.MuGraph.parse(LORA3), pdl="end").kernels] == ["k4", "k5", "k6"]


def test_pdl_auto_keeps_a_split_and_its_combine_apart_where_no_early_loop_follows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the last kernel takes K in one step (no for-loop to run before its wait): no hop to save, so the split and its
    # combine stay two launches, as with last-block launches off
    from verimirage.backend import codegen

    monkeypatch.setattr(codegen, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP", True)
    monkeypatch.setattr(codegen, "PDL_START_BEFORE_EARLY_LOOP", True)
    text = LORA3.replace("%6 = custom %0, %1, %3, %5 {frange=2, grid=(2,)}",
                         "%6 = custom %0, %1, %3, %5 {frange=1, grid=(2,)}").replace(
        "%0 = input {arg=0, fmap=1, imap=(None,), shape=(16, 64)} : f16[16,32]\n"
        "    %1 = input {arg=1, fmap=0, imap=(1,), shape=(64, 64)} : f16[32,32]",
        "%0 = input {arg=0, fmap=1, imap=(None,), shape=(16, 64)} : f16[16,64]\n"
        "    %1 = input {arg=1, fmap=0, imap=(1,), shape=(64, 64)} : f16[64,32]")
    assert text != LORA3
    ms = generate(vm.MuGraph.parse(text), pdl="auto")
    assert [k.name for k in ms.kernels] == ["k4", "k5", "k6"] and ms.counters == 0


def test_pdl_early_loop_is_reported_and_off_without_pdl() -> None:
    from verimirage.backend.codegen import kernel_source, to_kernels
    from verimirage.ir.graph import node_list

    mg = to_kernels(vm.MuGraph.parse(LORA3))
    nodes = node_list(mg)
    n = nodes[6]
    ats = [nodes[a].outs[k] for a, k in n.args]
    early: KernelInfo = kernel_source(n.attr("block"), ats, "k6", pdl="end", early_args=frozenset({0, 1, 2}))[1]
    assert early.early_loop
    # T (operand 3) read in the loop's place: no early loop when the loop reads an operand not in early_args
    src, info = kernel_source(n.attr("block"), ats, "k6", pdl="end", early_args=frozenset({0}))
    assert not info.early_loop and not _MEM.search(_before_wait(src))
    src, info = kernel_source(n.attr("block"), ats, "k6", early_args=frozenset({0, 1, 2}))
    assert not info.early_loop and "gdc_" not in src


def test_pdl_reordered_kernels_compute_the_same_as_without_pdl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the epilogue term hoisted before the loop ((X A) B) moves after it: with the PDL calls removed (the interpreter
    # has none) the module computes the program's float64 result, as the module without PDL does
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from verimirage.backend.runtime import load_module

    mg = vm.MuGraph.parse(LORA3)
    rng = np.random.default_rng(3)
    xs = {n: (rng.standard_normal(s) * 0.5).astype(np.float16) for n, s in
          (("X", (16, 64)), ("W", (64, 64)), ("A", (64, 16)), ("B", (16, 64)))}
    ref = xs["X"].astype(np.float64) @ xs["W"].astype(np.float64) + 2.0 * (
        xs["X"].astype(np.float64) @ xs["A"].astype(np.float64)) @ xs["B"].astype(np.float64)
    from verimirage.backend import codegen

    for mode in ("", "auto", "auto+lb"):  # (auto+lb: the split and its sum as one last-block launch)
        monkeypatch.setattr(codegen, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP", mode == "auto+lb")
        ms = generate(mg, pdl=mode.split("+")[0])
        assert len(ms.kernels) == (2 if mode == "auto+lb" else 3)
        src = ms.source
        src = "\n".join(ln for ln in src.splitlines()
                         if "gdc_" not in ln and not ln.lstrip().startswith("_vm_prefetch(")) + "\n"
        mod = load_module(tmp_path / f"lora3_{mode.replace('+', '_') or 'plain'}.py", src)
        (out,) = mod.forward(*(torch.tensor(xs[n]) for n in ("X", "W", "A", "B")))
        err = np.abs(out.double().numpy() - ref).max() / np.abs(ref).max()
        assert err < 5e-3, (mode, err)


def test_pdl_a_kernel_reading_an_earlier_kernels_result_is_not_launched_before_that_kernels_successor_waits() -> None:
    # "pre" only where the next kernel reads nothing but the program's inputs and this kernel's results: were k6 to
    # read k4's partials too, k5 could not let it launch before k5's wait (k4 may still be running then)
    text = LORA3.replace("%6 = custom %0, %1, %3, %5 {", "%6 = custom %0, %1, %3, %5, %4 {").replace(
        "    %8 = add %5, %7 : f16[16,32]\n",
        "    %8 = add %5, %7 : f16[16,32]\n    %9 = input {arg=4, fmap=None, imap=(None,), shape=(16, 32)} : "
        "f16[16,32]\n")
    ms = generate(vm.MuGraph.parse(text), pdl="auto")
    assert "gdc_launch_dependents()\n    gdc_wait()" not in ms.source


def test_layout_pass_failure_is_retried_at_fewer_warps() -> None:
    from verimirage.backend.runtime import _layout_pass_failed, _out_of_shared_memory

    assert _layout_pass_failed(RuntimeError("PassManager::run failed"))
    assert not _layout_pass_failed(RuntimeError("something else")) and not _layout_pass_failed(ValueError("x"))
    assert not _out_of_shared_memory(RuntimeError("PassManager::run failed"))


def test_chained_kernel_with_a_bias_stream_gets_four_stages() -> None:
    import json

    from verimirage.backend import tuning
    from verimirage.backend.codegen import to_kernels
    from verimirage.ir.graph import node_list

    root = Path(__file__).resolve().parent.parent / "benchmarks" / "candidates_models"

    def configs(name: str) -> list[tuple[int, int]]:
        out = []
        for c in json.loads((root / f"{name}.json").read_text())["candidates"][:2]:
            nodes = node_list(to_kernels(vm.MuGraph.parse(c["mugraph"])))
            for n in nodes:
                if n.op == "custom":
                    cfg = tuning.recommend(n.attr("block"), [nodes[a].outs[k] for a, k in n.args])
                    s = tuning.kernel_shape(n.attr("block"), [nodes[a].outs[k] for a, k in n.args])
                    out.append((cfg.num_stages, s.chained, s.side_stream))
        return out

    # the bias on the scores: a tile from DRAM each iteration beside the two products
    assert all(st == 4 and ch and side for st, ch, side in configs("bias_attention"))
    # the causal mask (bool) and rotary's cos / sin (they feed a product's operand, not its result) are no such stream
    for name in ("causal_attention", "rotary_attention"):
        assert all(st == 3 and not side for st, ch, side in configs(name) if ch), name


def test_pdl_statements_moved_after_the_loop_never_read_a_name_reassigned() -> None:
    # the statements before the loop that must follow the wait (and those computed from them) move after the loop
    # only where the names they read keep their values: not one the loop assigns, nor one assigned twice before it
    from verimirage.backend.codegen import _KernelGen

    kg = object.__new__(_KernelGen)
    kg.early_args = frozenset({0})
    body = ["v0 = tl.load(a0_ptr + it)", "acc = acc + v0"]
    pre = ["acc = tl.zeros((4,), tl.float32)", "t = tl.load(a1_ptr)", "u = t * 2.0"]
    assert kg._after_loop(pre, body) == (["acc = tl.zeros((4,), tl.float32)"], ["t = tl.load(a1_ptr)", "u = t * 2.0"])
    # a late statement reading the loop's accumulator would see its final value after the loop: nothing moves
    assert kg._after_loop([*pre, "w = u + acc"], body)[1] == []
    # ... nor where a name it reads is assigned again before the loop
    assert kg._after_loop(["c = tl.load(a1_ptr)", "d = c * 2.0", "c = tl.zeros((4,), tl.float32)"], body)[1] == []
    # ... nor where the loop itself reads what must wait (then the wait goes before the loop)
    assert kg._after_loop(pre, [*body, "acc = acc + tl.load(a1_ptr + it)"])[1] == []
