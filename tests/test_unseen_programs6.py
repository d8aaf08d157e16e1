"""Held-out programs, sixth set (benchmarks/unseen_graphs6.py): full-size ``vm.Graph`` programs of open LLMs (Qwen3,
Falcon, Whisper, Mixtral, DeepSeek-V3, GPT-2 XL, BERT, CLIP, Aya 23), here as their scaled-down twins (the same ops,
dtypes and structure).

Each twin is superoptimized (the search cache off; every candidate Proved) and its best candidate's kernels, run in
Triton's interpreter, compared with the float64 reference. The full-size searches and their times are the benchmark
script's (``benchmarks/results/unseen6/``), not CI's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_graphs4 as u4
import unseen_graphs5 as u5
import unseen_graphs6 as u6
from test_unseen_programs5 import twin_is_proved_and_matches_float64


@pytest.mark.parametrize("name", list(u6.PROGRAMS))
def test_sixth_set_twin_is_proved_and_matches_float64(name: str) -> None:
    g = u6.build(name, small=True)
    twin_is_proved_and_matches_float64(name, g, u6.program_inputs(g))


def test_sixth_set_full_sizes_build_and_are_priced() -> None:
    """Every full-size program builds and checks, has the twin's inputs, and the one-kernel-per-op estimate the
    table divides by exists; none is a program of an earlier held-out set."""
    for name in u6.PROGRAMS:
        g = u6.build(name)
        assert u4.unfused_estimate_s(g) > 0
        assert [t.name for t in g.inputs] == [t.name for t in u6.build(name, small=True).inputs]
        assert name not in u4.PROGRAMS and name not in u5.PROGRAMS


def test_sixth_set_router_masks_choose_k_experts_a_row() -> None:
    """The routers' choice inputs are ``topk``'s: exactly 2 of Mixtral's 8 experts a row, 8 of DeepSeek-V3's."""
    for name, k in (("mixtral_router_top2_renorm", 2), ("deepseek_v3_sigmoid_router", 8)):
        for small in (True, False):
            m = u6.program_inputs(u6.build(name, small))["topk_mask"]
            assert m.dtype == bool and (m.sum(axis=1) == k).all()
