"""A kernel's result that other kernels read only as a ``tl.dot`` operand is stored in its IR dtype
(``codegen.DOT_OPERAND_STORAGE``), every other result passed between kernels in fp32.

Every reader casts such an operand to its dtype for the dot, so rounding it once at the store gives the same operand
bits and halves what each reader loads: layernorm_linear's projection blocks each read the whole normalised
activation, in fp32 as many bytes a loop iteration as their weight tile (BENCHMARKS.md, "LayerNorm + projection",
eighteenth session)."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend import codegen
from verimirage.ir.dtypes import DType
from verimirage.ir.graph import node_list, output_refs

#: layernorm_linear's two-kernel design (the models pick's structure) at 16 x 64 x 32; ``{use}`` is how the
#: projection reads the normalised activation
TWO_KERNELS = """mugraph {{
  %0 = input {{name='X'}} : f16[16,64]
  %1 = input {{name='G'}} : f16[64]
  %2 = input {{name='B'}} : f16[64]
  %3 = input {{name='W'}} : f16[64,{n}]
  %4 = custom %0, %1, %2 {{frange=1, grid=(16,)}} : f16[16,64] {{
    %0 = input {{arg=0, fmap=None, imap=(0,), shape=(16, 64)}} : f16[1,64]
    %1 = input {{arg=1, fmap=None, imap=(None,), shape=(64,)}} : f16[64]
    %2 = input {{arg=2, fmap=None, imap=(None,), shape=(64,)}} : f16[64]
    %3 = sum %0 {{axis=1}} : f16[1,1]
    %4 = scale %3 {{c=0.015625}} : f16[1,1]
    %5 = sub %0, %4 : f16[1,64]
    %6 = square %5 : f16[1,64]
    %7 = sum %6 {{axis=1}} : f16[1,1]
    %8 = scale %7 {{c=0.015625}} : f16[1,1]
    %9 = shift %8 {{c=1e-05}} : f16[1,1]
    %10 = rsqrt %9 : f16[1,1]
    %11 = mul %5, %10 : f16[1,64]
    %12 = mul %11, %1 : f16[1,64]
    %13 = add %12, %2 : f16[1,64]
    output %13 {{omap=(0,)}}
  }}
  %5 = custom %3, %4 {{frange=4, grid=({g},)}} : f16[16,{n}] {{
    %0 = input {{arg=0, fmap=0, imap=(1,), shape=(64, {n})}} : f16[16,{t}]
    %1 = input {{arg=1, fmap=1, imap=(None,), shape=(16, 64)}} : f16[16,16]
{use}
    %4 = loop_sum %3 : f16[16,{t}]
    output %4 {{omap=(1,)}}
  }}
  return %5
}}"""

DOT = """    %2 = matmul %1, %0 : f16[16,{t}]
    %3 = scale %2 {c=1.0} : f16[16,{t}]"""
SCALED = """    %2 = scale %1 {c=0.5} : f16[16,16]
    %3 = matmul %2, %0 : f16[16,{t}]"""


def _mugraph(use: str, n: int = 32, g: int = 2) -> vm.MuGraph:
    t = n // g
    return vm.MuGraph.parse(TWO_KERNELS.format(n=n, g=g, t=t, use=use.replace("{t}", str(t))))


def _storage(mg: vm.MuGraph) -> DType:
    nodes = node_list(mg)
    return codegen.storage_dtype(nodes, set(output_refs(mg)), (4, 0))


def _graph() -> vm.Graph:
    from verimirage.benchmarks.models import get_model

    return get_model("layernorm_linear", small=True)


@pytest.fixture
def storage_flag():
    saved = codegen.DOT_OPERAND_STORAGE
    yield
    codegen.DOT_OPERAND_STORAGE = saved


def test_a_dot_operand_between_kernels_is_stored_in_its_dtype(storage_flag) -> None:
    mg = _mugraph(DOT)
    assert vm.verify(_graph(), mg).proved
    assert _storage(mg) is DType.float16
    src = codegen.generate(mg).source
    assert "dtype=torch.float32" not in src and src.count("torch.empty((16, 64), device=X.device, dtype=torch.float16)")
    codegen.DOT_OPERAND_STORAGE = False
    assert _storage(mg) is DType.float32
    assert "torch.empty((16, 64), device=X.device, dtype=torch.float32)" in codegen.generate(mg).source


def test_a_value_read_by_another_op_stays_fp32(storage_flag) -> None:
    # the projection scales the activation before its product: that op reads the stored value in fp32
    assert _storage(_mugraph(SCALED)) is DType.float32


def test_a_degenerate_product_operand_stays_fp32(storage_flag) -> None:
    # one output column a block: the product is a broadcast multiply summed in fp32, not a tl.dot
    assert _storage(_mugraph(DOT, n=2, g=2)) is DType.float32


def test_split_partials_stay_fp32(storage_flag) -> None:
    from verimirage.rewrite.partition import build, configs, normalise, split_input_uses

    g = vm.Graph()
    x, w = g.input("X", (16, 64), vm.float16), g.input("W", (64, 32), vm.float16)
    g.output(g.matmul(x, w))
    an = split_input_uses(normalise(g))
    cfg = next(c for c in configs(an) if c.splits > 1)
    mg = build(an, cfg).mugraph
    nodes = node_list(mg)
    final = set(output_refs(mg))
    passed = [(i, 0) for i, n in enumerate(nodes) if n.op == "custom" and (i, 0) not in final]
    assert passed and all(codegen.storage_dtype(nodes, final, r) is DType.float32 for r in passed)


def test_dot_operand_storage_gives_the_same_bits(storage_flag) -> None:
    import torch

    g = _graph()
    mg = _mugraph(DOT)
    rng = np.random.default_rng(3)
    arrs = {t.name: rng.standard_normal(t.shape) * 0.5 for t in g.inputs}
    arrs["X"] = arrs["X"] + 2.0
    ins = [torch.tensor(arrs[t.name], dtype=torch.float16) for t in g.inputs]
    outs = []
    for flag in (False, True):
        codegen.DOT_OPERAND_STORAGE = flag
        outs.append(vm.compile(mg)(*ins).clone())
    assert torch.equal(outs[0], outs[1])
    ref = vm.evaluate(g, arrs)[0]
    assert np.linalg.norm(outs[1].double().numpy() - ref) / np.linalg.norm(ref) < 2e-3


def test_a_reshape_of_a_kernel_result_read_by_a_dot_stayed_a_view(storage_flag) -> None:
    """Finding (this session, before landing): a kernel that only reshapes another kernel's fp32 result is a view
    of its buffer (no launch); stored in fp16 for the dot that reads it, it became a copy launch: the decoder layer's
    committed candidates took 1-2 launches more (layer_np decode_bs8 15 -> 16, prefill_512 25 -> 27)."""
    import json
    from pathlib import Path

    from verimirage.backend import tuning

    doc = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "candidates" / "layer_np" /
                      "decode_bs8.json").read_text())
    mg = vm.MuGraph.parse(doc["candidates"][0]["mugraph"])
    counts = []
    for flag in (False, True):
        codegen.DOT_OPERAND_STORAGE = flag
        counts.append(len(tuning.tuned_module(mg).kernels))
    assert counts[0] == counts[1] == 15
