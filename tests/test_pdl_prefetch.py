"""Programmatic dependent launch (issue 23): a kernel prefetches into L2, before its ``gdc_wait``, the tiles it reads of
the program's inputs (codegen ``PDL_PREFETCH_BYTES``, :meth:`_KernelGen.prefetch_lines`), and under ``pdl="auto"`` a
kernel of few blocks lets the next one launch at its start (``PDL_EARLY_OWN_MAX_BLOCKS``), so that one's blocks
prefetch their weights while it runs. A prefetch changes no value; these tests check that every prefetched address
lies inside one of the program's inputs (never a buffer a kernel writes), that the outputs are the same bits with and
without the prefetches, and where the prefetches and launch triggers sit in the text."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import codegen, runtime, tuning

ROOT = Path(__file__).resolve().parent.parent
CANDS = ROOT / "benchmarks" / "candidates" / "layer"


def _candidate(name: str) -> vm.MuGraph:
    return vm.MuGraph.parse(json.loads((CANDS / f"{name}.json").read_text())["candidates"][0]["mugraph"])


def _functions(src: str) -> dict[str, str]:
    """The generated module's ``@triton.jit`` functions by name."""
    parts = re.split(r"^@triton\.jit\n", src, flags=re.M)[1:]
    return {re.match(r"def (\w+)\(", p).group(1): p for p in parts}  # type: ignore[union-attr]


def _run_recording(ms: Any, tmp: Path, ins: dict[str, Any]) -> tuple[tuple[Any, ...], list[np.ndarray]]:
    """Run module ``ms`` in Triton's interpreter with ``gdc_wait`` / ``gdc_launch_dependents`` as no-ops (one launch
    at a time there) and ``_vm_prefetch`` recording its pointers: the outputs and the recorded addresses."""
    mod = runtime.load_module(runtime.write_module(ms, tmp), ms.source)
    seen: list[np.ndarray] = []
    mod.gdc_wait = lambda: None
    mod.gdc_launch_dependents = lambda: None
    mod._vm_prefetch = lambda p: seen.append(np.asarray(p.handle.data, dtype=np.uint64).ravel())
    outs = mod.forward(*[ins[n] for n in ms.input_names])
    return tuple(o.clone() for o in outs), seen


@pytest.mark.parametrize("case", ["decode_bs1", "decode_bs8"])
@pytest.mark.parametrize("merge", [False, True])
def test_pdl_prefetches_lie_in_the_program_inputs_and_change_no_bits(case: str, merge: bool, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    if not runtime.interpreting():
        pytest.skip("runs the kernels in Triton's interpreter (TRITON_INTERPRET=1)")
    from verimirage.benchmarks.layer_module import make_case

    mg = _candidate(f"{case}_small")
    c = make_case(case, small=True, dtype=torch.float16, seed=3)
    ins = c["graph_inputs"]
    mode = {"pdl": "auto", "merge": merge}
    monkeypatch.setattr(codegen, "PDL_PREFETCH_EARLY_ONLY", False)  # (prefetches in every kernel: the most addresses)
    ms = tuning.tuned_module(mg, mode)
    outs, seen = _run_recording(ms, tmp_path, ins)
    assert seen, "no kernel prefetched"
    spans = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in ins.values()]
    addrs = np.concatenate(seen)
    inside = np.zeros(addrs.shape, dtype=bool)
    for lo, hi in spans:
        inside |= (addrs >= lo) & (addrs < hi)
    assert inside.all(), f"{int((~inside).sum())} of {addrs.size} prefetched addresses outside the program's inputs"
    monkeypatch.setattr(codegen, "PDL_PREFETCH_BYTES", 0)
    plain = tuning.tuned_module(mg, mode)
    assert "_vm_prefetch(" not in plain.source
    outs0, seen0 = _run_recording(plain, tmp_path, ins)
    assert not seen0
    for a, b in zip(outs, outs0, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    ref = vm.evaluate(c["graph"], {k: v.double().numpy() if v.is_floating_point() else v.numpy()
                                   for k, v in ins.items()})
    for o, r in zip(outs, ref, strict=True):
        assert np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r) < 2e-3


def test_pdl_prefetches_precede_the_wait_and_read_only_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    # the full-size bs1 layer (codegen only): each prefetch comes before its function's gdc_wait (a merged launch's
    # members' prefetch functions are called before the launch's wait), prefetches only operands that are the
    # program's inputs, and the default module (no PDL, the certificates' digest) has none
    mg = _candidate("decode_bs1")
    monkeypatch.setattr(codegen, "PDL_PREFETCH_EARLY_ONLY", False)
    ms = tuning.tuned_module(mg, {"pdl": "auto", "merge": True})
    fns = _functions(ms.source)
    with_pf = [n for n, f in fns.items() if "_vm_prefetch(" in f and n != "_vm_prefetch"]
    assert len(with_pf) >= 8  # (the weights' and the caches' readers: the split-KV attention reads both caches)
    for name in with_pf:
        body = fns[name]
        if "gdc_wait()" in body:
            assert body.rindex("_vm_prefetch(") < body.index("gdc_wait()"), name
        else:  # a member's prefetch function: its launch calls it before the wait
            assert name.endswith("_pf"), name
            launch = next(f for f in fns.values() if f"{name}(" in f and "gdc_wait()" in f)
            assert launch.index(f"{name}(") < launch.index("gdc_wait()")
    # the operands prefetched are inputs of the μGraph: the launch step's refs of those args are ("in", i)
    from verimirage.backend.wrap import to_kernels
    from verimirage.ir.graph import node_list

    nodes = node_list(to_kernels(mg))
    for k in ms.kernels:
        for j in k.members or (k.node,):
            name = f"k{j}_pf" if k.members else k.name
            text = fns.get(name, "")
            for a in set(re.findall(r"_vm_prefetch\(a(\d+)_ptr", text)):
                src = nodes[nodes[j].args[int(a)][0]]
                assert src.op == "input", (name, a, src.op)
    assert "_vm_prefetch" not in tuning.tuned_module(mg).source


def test_pdl_auto_starts_the_next_launch_early_after_a_kernel_of_few_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    # bs1: the first RMSNorm (one block) is followed by the q projection (128 blocks): "auto" used to trigger the next
    # launch at the end (the next kernel has more than PDL_EARLY_MAX_BLOCKS blocks); now at its start, since the
    # norm's one block leaves the other SMs to the projection's blocks, which prefetch their weights meanwhile
    mg = _candidate("decode_bs1")
    monkeypatch.setattr(codegen, "PDL_EARLY_OWN_MAX_BLOCKS", 64)  # (off by default since run 20)
    fns = _functions(tuning.tuned_module(mg, {"pdl": "auto", "merge": True}).source)
    first = fns["k14"]
    assert first.index("gdc_launch_dependents()") < first.index("tl.load(")
    # the gate/up projection (224 blocks) before the down projection (128): still at its end (the q projection, 128
    # blocks before the k / v projections' 256, was the example until the three shared one launch, session 19)
    q = fns["k27"]
    assert q.index("gdc_launch_dependents()") > q.index("tl.store(")
    monkeypatch.setattr(codegen, "PDL_EARLY_OWN_MAX_BLOCKS", 0)
    before = _functions(tuning.tuned_module(mg, {"pdl": "auto", "merge": True}).source)["k14"]
    assert before.index("gdc_launch_dependents()") > before.index("tl.store(")


def test_pdl_defaults_prefetch_nowhere_a_launch_waits_for_work_outside_the_program() -> None:
    # run 20 (H100, 2026-11-27): prefetches in a program's first kernel (its wait is for work outside the program) and
    # a few-block kernel starting the next launch early made the models set slower (residual_rmsnorm 23.7 -> 31.5 us,
    # layernorm_linear 16.1 -> 22.3); by default a kernel prefetches only where the launch before it let it start
    # early, and "auto" starts the next launch early only where that one has few blocks
    # (the first launch prefetches only as PDL_PREFETCH_FIRST_START allows: a one-step launch that lets the next one
    # launch at its start, which the q projection of session 20's bs1 design, 64 blocks, gets apart, not merged)
    mg = _candidate("decode_bs1")
    for merge in (False, True):
        ms = tuning.tuned_module(mg, {"pdl": "auto", "merge": merge})
        fns = _functions(ms.source)
        first = ms.kernels[0]
        name = f"k{first.members[0]}_pf" if first.members else first.name
        f = fns.get(name, "")
        starts = "gdc_launch_dependents()" in f and f.index("gdc_launch_dependents()") < f.index("tl.store(")
        assert "_vm_prefetch(" not in f or (codegen.PDL_PREFETCH_FIRST_START and starts), name
        q = fns.get("k15", "")
        if "gdc_launch_dependents()" in fns["k14"]:  # the one-block norm before the q projection's launch
            nxt = math.prod(ms.kernels[1].grid)
            assert (fns["k14"].index("gdc_launch_dependents()") > fns["k14"].index("tl.store(")) == (
                nxt > codegen.PDL_EARLY_MAX_BLOCKS), merge
        assert "_vm_prefetch(" not in q or q.index("_vm_prefetch(") < q.index("gdc_wait()")


def test_pdl_prefetch_in_a_first_launch_of_one_wave_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # PDL_PREFETCH_FIRST_MAX_BLOCKS: the program's first launch prefetches where its grid is at most that many blocks
    # (off by default); lora_scaled's first kernel has 16 blocks, residual_rmsnorm's thousands
    _three_launch_lora(monkeypatch)
    monkeypatch.setattr(codegen, "PDL_PREFETCH_FIRST_START", False)
    assert not _first_prefetches("lora_scaled") and not _first_prefetches("residual_rmsnorm")
    monkeypatch.setattr(codegen, "PDL_PREFETCH_FIRST_MAX_BLOCKS", 132)
    assert _first_prefetches("lora_scaled") and not _first_prefetches("residual_rmsnorm")


def _first_prefetches(case: str) -> bool:
    """Whether the first launch of ``case``'s first committed models candidate prefetches (pdl "auto")."""
    doc = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{case}.json").read_text())
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    fns = _functions(codegen.generate(mg, pdl="auto").source)
    first = next(f for n, f in fns.items() if re.fullmatch(r"k\d+", n))
    return "_vm_prefetch(" in first


def _three_launch_lora(monkeypatch: pytest.MonkeyPatch) -> None:
    """Codegen's last-block rules off (on by default since 08:27 UTC): lora_scaled's split and its sum as two launches,
    the first one the rules below are about (a last-block launch takes no prefetch)."""
    monkeypatch.setattr(codegen, "PDL_LASTBLOCK_BEFORE_EARLY_LOOP", False)
    monkeypatch.setattr(codegen, "PDL_START_BEFORE_EARLY_LOOP", False)


def test_pdl_prefetch_in_a_first_launch_without_a_loop_that_starts_the_next_at_its_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # PDL_PREFETCH_FIRST_START (H100 2026-11-27 07:17, pdl_models_ab_h100_2026-11-27_0717.json): lora_scaled's first
    # kernel (X A's one-step split, "start") prefetches (16.88 -> 16.42 us); a first launch that starts the next only
    # at its end (layernorm_linear's one-step LayerNorm: 16.32 -> 16.52 with prefetches) or streams in a for-loop
    # (decode_gqa's split attention, "start": 31.10 -> 31.71) does not
    assert codegen.PDL_PREFETCH_FIRST_START and codegen.PDL_PREFETCH_FIRST_MAX_BLOCKS == 0
    _three_launch_lora(monkeypatch)
    assert _first_prefetches("lora_scaled")
    for case in ("layernorm_linear", "decode_gqa", "activations", "qkv_bias", "residual_rmsnorm"):
        assert not _first_prefetches(case), case
    src = codegen.generate(vm.MuGraph.parse(json.loads((ROOT / "benchmarks" / "candidates_models" /
                                                        "decode_gqa.json").read_text())["candidates"][0]["mugraph"]),
                           pdl="auto").source
    first = next(f for n, f in _functions(src).items() if re.fullmatch(r"k\d+", n))
    assert first.index("gdc_wait()") < first.index("gdc_launch_dependents()") < first.index("for it in")
