"""An input read in two index roles (partition.split_input_uses).

Rotary attention applies the cos/sin tables (N, D) to the query rows and to the key rows. The analysis gave
both one label, so the key dim (reduced by softmax @ V) was the query dim too: at full size every fused
lowering came out with the wrong output shape and the verifier rejected all 21 (models set, 22 kernels
unfused). Each role now reads the table through an alias input (the same tensor passed twice).
"""

from __future__ import annotations

import numpy as np
import torch

import verimirage as vm
from verimirage.backend.runtime import compile as vcompile
from verimirage.benchmarks.models import rotary
from verimirage.ir.graph import node_list, output_refs
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all, normalise, split_input_uses


def _rotary_attention(h: int = 2, n: int = 64, d: int = 16) -> vm.Graph:
    g = vm.Graph()
    q, k, v = (g.input(nm, (h, n, d), vm.float32) for nm in "QKV")
    cos, sin = g.input("COS", (n, d), vm.float32), g.input("SIN", (n, d), vm.float32)
    s = g.matmul(rotary(g, q, cos, sin), g.transpose(rotary(g, k, cos, sin), 1, 2))
    e = g.exp(g.sub(s, g.max(s, axis=2)))
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def test_tables_get_one_alias_per_role_and_q_and_k_stay_whole() -> None:
    an = split_input_uses(normalise(_rotary_attention()))
    assert an.alias == {"COS__use1": "COS", "SIN__use1": "SIN"}
    # the query rows are data-parallel again (they were merged with the reduced key rows)
    assert len(an.data_parallel()) >= 2


def test_row_tiled_lowerings_have_the_right_shape_and_verify() -> None:
    g = _rotary_attention()
    want = [g.type_of(r) for r in output_refs(g)]
    lows, _ = lower_all(g, cuts=False, rank=pricing.cost)
    row_tiled = []
    for lo in lows:
        mg = lo.mugraph
        assert [mg.type_of(r) for r in output_refs(mg)] == want
        assert [n.attr("name") for n in node_list(mg) if n.op == "input"] == ["Q", "K", "V", "COS", "SIN"]
        for n in node_list(mg):
            if n.op == "custom":
                bg = n.attr("block")
                q_in = [b for b in node_list(bg) if b.op == "input" and b.attr("arg") == 0]
                if q_in and 1 in q_in[0].attr("imap"):
                    row_tiled.append(lo)
    assert row_tiled, "no lowering splits the query rows over the grid"
    assert isinstance(vm.verify(g, row_tiled[0].mugraph), vm.Proved)
    # the kernel reads each table twice (one argument per role) and computes the float64 reference
    rng = np.random.default_rng(5)
    ins = {t.name: rng.standard_normal(t.shape) * 0.5 for t in g.inputs}
    ref = vm.evaluate(g, ins)[0]
    out = vcompile(row_tiled[0].mugraph)(*[torch.tensor(ins[t.name], dtype=torch.float32) for t in g.inputs])
    out = out[0] if isinstance(out, (tuple, list)) else out
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5
