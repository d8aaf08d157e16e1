"""vm.testing strategies and structural analysis: inputs(), graphs(), the facts the generated tests rest on."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import verimirage as vm
from verimirage.testing import (
    analyze,
    applicable_regimes,
    decode_inputs,
    encode_inputs,
    graphs,
    inputs,
    make_inputs,
    torch_evaluate,
)
from verimirage.testing.analysis import degree_factor
from verimirage.testing.checks import gather_case, shifted_case

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small(name: str) -> vm.Graph:
    return vm.benchmarks.get(name, small=True)


# --------------------------------------------------------------------------- inputs()


@FAST
@given(case=inputs(small("ntrans")))
def test_inputs_have_the_graph_shapes_and_dtypes(case):
    g = small("ntrans")
    assert list(case) == g.input_names()
    for t in g.inputs:
        v = case[t.name]
        assert isinstance(v, torch.Tensor)
        assert tuple(v.shape) == t.shape
        assert v.dtype == torch.float16
        assert torch.isfinite(v).all()  # NaN lives only outside the view


def test_inputs_draw_noncontiguous_views_of_nan_filled_buffers():
    g = small("lora")
    seen = set()
    for lay in ("transposed", "padded", "strided", "offset"):
        case = make_inputs(g, "normal", 3, {"X": lay})
        x = case["X"]
        assert not x.is_contiguous() or x.storage_offset() != 0
        storage = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
        assert torch.isnan(storage).any() == (lay != "transposed"), lay  # a transpose covers its buffer
        seen.add((tuple(x.stride()), x.storage_offset()))
        # same values as the contiguous draw: the layout changes memory, not the logical tensor
        assert torch.equal(x, make_inputs(g, "normal", 3)["X"])
    assert len(seen) == 4


def test_inputs_rejects_unknown_regimes():
    with pytest.raises(vm.GraphError, match="regimes"):
        inputs(small("lora"), regimes=("huge",))


def test_applicable_regimes_follow_the_structure():
    assert applicable_regimes(small("gqa_stable")) == ("normal", "large", "mixed")
    assert applicable_regimes(small("gqa")) == ("normal", "mixed")  # a naive softmax overflows by definition
    assert applicable_regimes(small("rmsnorm_linear")) == ("normal", "large", "tiny", "mixed")  # (fp16 X, squared)
    assert applicable_regimes(small("lora")) == ("normal", "mixed")


def test_large_regime_overflows_a_naive_softmax():
    g = small("gqa_stable")
    case = make_inputs(g, "large", 0)
    logits = case["Q"].double() @ case["K"].double()
    assert logits.abs().max() > 89  # exp overflows float32 (and float16) unless the row max is subtracted
    assert torch.isinf(torch.exp(logits.float())).any()
    ref = vm.evaluate(g, case)[0]
    assert np.isfinite(ref).all()


def test_tiny_regime_has_zero_rows_where_the_norm_divides():
    g = small("rmsnorm_linear")
    case = make_inputs(g, "tiny", 1)
    x = case["X"].double()
    assert x.abs().max() < 0.02
    big = make_inputs(vm.benchmarks.get("rmsnorm_linear", batch=8, small=True), "tiny", 1)["X"].double()
    assert ((big == 0).all(dim=1)).any()  # whole normalised rows of zeros
    assert case["W"].abs().max() > 1  # only the normalised input is tiny


def test_encode_decode_keeps_bytes_and_layout():
    g = small("gqa_stable")
    case = make_inputs(g, "mixed", 7, {"Q": "transposed", "K": "strided", "V": "offset"})
    back = decode_inputs(encode_inputs(case))
    assert back.regime == "mixed" and back.seed == 7
    for k, v in case.items():
        w = back[k]
        assert w.stride() == v.stride() and w.storage_offset() == v.storage_offset()
        assert torch.equal(v.view(torch.int16), w.view(torch.int16)) if v.is_contiguous() else torch.equal(v, w)


# --------------------------------------------------------------------------- analysis


def test_analysis_of_the_suite():
    f = analyze(small("gqa_stable"))
    (s,) = f.softmax
    assert s.stable and s.axis == 2 and s.plan is not None and s.invariant_outputs
    assert (s.plan.target, s.plan.pin) == ("Q", "K")
    assert f.batch is not None and f.batch.inputs == ("Q", "K", "V") and f.batch.size == 2
    assert f.reduction_length == 128
    f = analyze(small("qknorm_gqa"))
    assert f.softmax[0].plan is None  # logits pass through rms_norm: no shift through the inputs
    assert {p.name for p in f.scaling if p.through_norm} == {"Q", "K"}
    f = analyze(small("lora"))
    assert f.batch is not None and f.batch.inputs == ("X",)  # B also has 16 rows, but they are contracted
    assert [(p.name, [int(d) for d in p.degrees]) for p in f.scaling] == [("X", [1])]
    f = analyze(small("gated_mlp"))
    assert [p.name for p in f.scaling] == ["W2"]  # silu breaks homogeneity in X and W1


@pytest.mark.parametrize("name", ["gqa", "gqa_stable", "mha_stable", "rmsnorm_linear", "lora", "ntrans", "qknorm_gqa"])
def test_metamorphic_laws_hold_for_the_reference(name):
    """The laws the analysis claims hold exactly (up to float64 rounding and eps) for vm.evaluate."""
    g = small(name)
    f = analyze(g)
    case = make_inputs(g, "normal", 11)
    ref = vm.evaluate(g, case)
    for s in f.softmax:
        if s.plan is not None and s.invariant_outputs:
            a, b = shifted_case(g, case, s.plan, 5)
            assert any(not torch.equal(a[k], b[k]) for k in a)
            for x, y in zip(vm.evaluate(g, a), vm.evaluate(g, b), strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-12)
    for p in f.scaling:
        scaled = {k: v * 4 if k == p.name else v for k, v in case.items()}
        for x, y, d in zip(ref, vm.evaluate(g, scaled), p.degrees, strict=True):
            np.testing.assert_allclose(y, x * degree_factor(4, d), rtol=1e-5 if p.eps_sensitive else 1e-9,
                                       atol=1e-5 if p.eps_sensitive else 1e-12)
    if f.batch is not None:
        idx = [f.batch.size - 1] + [0] * (f.batch.size - 1)
        part = vm.evaluate(g, gather_case(case, f.batch, idx))
        for x, y, ax in zip(ref, part, f.batch.output_axes, strict=True):
            np.testing.assert_allclose(y, np.take(x, idx, axis=ax), rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- graphs()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(dims=(1, 2, 3, 4), max_ops=7), seed=st.integers(0, 2**16))
def test_evaluate_matches_an_independent_torch_float64_computation(g, seed):
    g.check()
    assert vm.Graph.parse(str(g)) == g
    case = make_inputs(g, "normal", seed)
    ref = vm.evaluate(g, case)
    alt = torch_evaluate(g, case)
    for r, a, t in zip(ref, alt, g.outputs, strict=True):
        assert r.shape == t.shape == tuple(a.shape)
        np.testing.assert_allclose(r, a.numpy(), rtol=1e-10, atol=1e-10, equal_nan=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(dims=(2, 3, 4), max_ops=6), seed=st.integers(0, 2**16))
def test_analysis_laws_hold_on_random_graphs(g, seed):
    """Whatever scaling or batch law the analysis claims of a random graph holds for the reference."""
    f = analyze(g)
    case = make_inputs(g, "normal", seed)
    ref = vm.evaluate(g, case)
    for p in f.scaling:
        scaled = {k: v * 2 if k == p.name else v for k, v in case.items()}
        for x, y, d in zip(ref, vm.evaluate(g, scaled), p.degrees, strict=True):
            np.testing.assert_allclose(y, x * degree_factor(2, d), rtol=1e-4 if p.eps_sensitive else 1e-9,
                                       atol=1e-4 if p.eps_sensitive else 1e-9, equal_nan=True)
    for s in f.softmax:
        if s.plan is not None and s.invariant_outputs:
            a, b = shifted_case(g, case, s.plan, seed)
            for x, y in zip(vm.evaluate(g, a), vm.evaluate(g, b), strict=True):
                np.testing.assert_allclose(x, y, rtol=1e-8, atol=1e-8, equal_nan=True)
    if f.batch is not None:
        idx = list(range(f.batch.size))[::-1]
        part = vm.evaluate(g, gather_case(case, f.batch, idx))
        for x, y, ax in zip(ref, part, f.batch.output_axes, strict=True):
            np.testing.assert_allclose(y, np.take(x, idx, axis=ax), rtol=1e-12, atol=1e-12, equal_nan=True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs(dims=(2, 4, 8), max_ops=6))
def test_safe_graphs_stay_finite_and_bounded(g):
    case = make_inputs(g, "normal", 0)
    for r in vm.evaluate(g, case):
        assert np.isfinite(r).all()
        assert np.abs(r).max() <= 1e3 + 1e-9


def test_graphs_options_are_checked():
    with pytest.raises(vm.GraphError, match="ops"):
        graphs(ops=("fft",))
    with pytest.raises(vm.GraphError, match="min_ops"):
        graphs(min_ops=3, max_ops=2)
