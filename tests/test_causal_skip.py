"""Causal attention whose masked elements weigh exactly 0 (issues 22 and 23): the form a kernel may skip masked
tiles of, its meaning against SDPA, its online-softmax lowering and what the verifier says of the other form."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.benchmarks import get_model
from verimirage.benchmarks.models import MASKED, masked_attention
from verimirage.rewrite.partition import lower_all


def _attention(h: int, n: int, d: int, *, zero_masked: bool, dt: vm.DType = vm.float32,
               cap: float | None = None) -> vm.Graph:
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, d), dt), g.input("K", (h, d, n), dt), g.input("V", (h, n, d), dt)
    m = g.input("M", (1, n, n), vm.bool)
    g.output(masked_attention(g, q, k, v, m, cap=cap, zero_masked=zero_masked))
    return g


def _ins(h: int, n: int, d: int, rng: np.random.Generator, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"Q": rng.uniform(-1, 1, (h, n, d)) * scale, "K": rng.uniform(-1, 1, (h, d, n)),
            "V": rng.uniform(-1, 1, (h, n, d)), "M": np.tril(np.ones((n, n), dtype=bool))[None]}


def test_zero_masked_attention_is_sdpa_where_the_masked_form_is_not() -> None:
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    h, n, d = 2, 16, 8
    ins = _ins(h, n, d, rng)
    q, k, v = (torch.tensor(ins[x]) for x in "QKV")
    want = F.scaled_dot_product_attention(q, k.transpose(1, 2), v, is_causal=True, scale=1.0).numpy()
    new, old = _attention(h, n, d, zero_masked=True), _attention(h, n, d, zero_masked=False)
    np.testing.assert_allclose(vm.evaluate(new, ins)[0], want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(vm.evaluate(old, ins)[0], want, rtol=1e-10, atol=1e-12)
    # every logit MASKED + 5: SDPA and the zero-masked form average the kept elements alone; the masked form gives
    # each masked element exp(-5) of a kept one's weight
    ins2 = dict(ins, Q=np.full((h, n, d), 1.0), K=np.full((h, d, n), (MASKED + 5.0) / d))
    q2, k2 = torch.tensor(ins2["Q"]), torch.tensor(ins2["K"])
    want2 = F.scaled_dot_product_attention(q2, k2.transpose(1, 2), v, is_causal=True, scale=1.0).numpy()
    np.testing.assert_allclose(vm.evaluate(new, ins2)[0], want2, rtol=1e-10, atol=1e-12)
    assert not np.allclose(vm.evaluate(old, ins2)[0], want2, atol=1e-3)


def test_a_fully_masked_row_is_nan_in_the_zero_masked_form() -> None:
    # 0 / 0: undefined over the reals, NaN in floats (the masked form averages V over the row instead)
    rng = np.random.default_rng(1)
    ins = _ins(1, 16, 8, rng)
    ins["M"] = ins["M"].copy()
    ins["M"][0, 3, :] = False
    out = vm.evaluate(_attention(1, 16, 8, zero_masked=True), ins)[0]
    assert np.isnan(out[0, 3]).all() and np.isfinite(np.delete(out, 3, axis=1)).all()


def test_the_two_mask_forms_are_different_functions_to_the_verifier() -> None:
    # over the reals a masked element weighs exp(MASKED - m) > 0 in one form and 0 in the other: never Proved
    old, new = _attention(1, 16, 16, zero_masked=False), _attention(1, 16, 16, zero_masked=True)
    v = vm.verify(old, new)
    assert not isinstance(v, vm.Proved), v


def _divided_after(h: int, n: int, d: int, eps: float | None = None) -> vm.Graph:
    """``where(M, exp(c - max c), 0) V / sum(...)`` (the division after the matmul, as the search rewrites it);
    ``eps``: the masked branch ``eps`` instead of 0."""
    g = vm.Graph()
    q, k, v = g.input("Q", (h, n, d), vm.float32), g.input("K", (h, d, n), vm.float32), \
        g.input("V", (h, n, d), vm.float32)
    m = g.input("M", (1, n, n), vm.bool)
    s = g.matmul(q, k)
    c = g.where(m, s, g.shift(g.scale(s, 0.0), MASKED))
    z = g.scale(c, 0.0) if eps is None else g.shift(g.scale(c, 0.0), eps)
    e = g.where(m, g.exp(g.sub(c, g.max(c, axis=2))), z)
    g.output(g.div(g.matmul(e, v), g.sum(e, axis=2)))
    return g


def _looped(mg: vm.Graph) -> bool:
    return any(n.op == "rescaled_sum" for k in mg.nodes if k.op == "custom" for n in k.attr("block").nodes)


def test_zero_masked_attention_lowers_to_an_online_softmax_that_is_proved_and_fp_safe() -> None:
    from verimirage.pipeline.fpsafe import SafetyChecker

    g = _attention(2, 32, 16, zero_masked=True)
    lows, _ = lower_all(_divided_after(2, 32, 16), franges=(2,))
    mg = next(low.mugraph for low in lows if _looped(low.mugraph))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    assert SafetyChecker(g, 0).check(mg) is None
    ins = _ins(2, 32, 16, np.random.default_rng(2))
    np.testing.assert_allclose(vm.evaluate(mg, ins)[0], vm.evaluate(g, ins)[0], rtol=1e-10, atol=1e-12)


def test_the_online_softmax_needs_an_exact_zero_in_the_masked_branch() -> None:
    # where(M, exp(c - m), eps) does not rescale with exp(c - m): no rescaled accumulator may be built for it
    lows, _ = lower_all(_divided_after(1, 32, 16, eps=1e-3), franges=(2,))
    assert lows and not any(_looped(low.mugraph) for low in lows)
    lows, _ = lower_all(_divided_after(1, 32, 16), franges=(2,))
    assert any(_looped(low.mugraph) for low in lows)


def test_the_models_causal_programs_weigh_masked_elements_zero() -> None:
    for name in ("causal_attention", "softcap_attention"):
        g = get_model(name, small=True)
        assert any(n.op == "where" and g.nodes[n.args[2][0]].op == "scale" for n in g.nodes), name
