"""``torch.compile(backend="verimirage")`` at ATen's special values, and constants a model makes in its forward
(seventeenth session). Each wrong result found has a test named after it, failing on the code before the fix: the
kernels' results are compared with ATen's own (special values: inf, NaN where ATen has them) or with the float64
copy of the module (per-dtype tolerances).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_programs as up  # noqa: E402

from verimirage.integrations.dynamo import backend  # noqa: E402
from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1}
INF, NAN = float("inf"), float("nan")


def _compiled(f: Callable[..., Any], xs: list[Any], *, train: bool = False) -> tuple[list[Any], list[Any], Report]:
    """``f`` on ``xs`` through the backend and in eager ATen: (compiled results, ATen's, report); ``train``: the
    results are the output and the gradients of its sum with respect to the float inputs."""
    torch._dynamo.reset()
    rep = Report()
    cf = torch.compile(f, backend=backend(report=rep, **OPTS))

    def run(fn: Callable[..., Any]) -> list[Any]:
        if not train:
            with torch.no_grad():
                return [fn(*xs)]
        ys = [x.detach().clone().requires_grad_() if x.is_floating_point() else x for x in xs]
        out = fn(*ys)
        out.sum().backward()
        return [out.detach()] + [y.grad for y in ys if y.is_floating_point()]

    return run(cf), run(f), rep


def _same(got: list[Any], want: list[Any], rep: Report, tol: float = 1e-5) -> None:
    """Equal up to ``tol`` where finite, and the same infinities and NaNs (ATen's special values)."""
    for g, w in zip(got, want, strict=True):
        assert torch.equal(torch.isnan(g), torch.isnan(w)), f"NaN at other places: {g} vs ATen {w} ({rep.summary()})"
        assert torch.equal(torch.isinf(g) & (g > 0), torch.isinf(w) & (w > 0)), f"+inf: {g} vs {w}"
        assert torch.equal(torch.isinf(g) & (g < 0), torch.isinf(w) & (w < 0)), f"-inf: {g} vs {w}"
        fin = torch.isfinite(w)
        assert torch.allclose(g[fin], w[fin], atol=tol, rtol=tol), f"{g} vs ATen {w} ({rep.summary()})"


def _logp() -> torch.Tensor:
    return torch.log_softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(3)), -1)


# --------------------------------------------------------------------------- nll_loss / gather at -inf and NaN


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nll_loss_of_a_picked_minus_inf_log_probability_was_finite(reduction: str) -> None:
    """log 0 = -inf picked by a target: ATen's loss is inf. The lifting multiplied the clamped log-probabilities by
    a 0/1 class mask and summed, so a picked -inf read as the lowest float (loss ~3.4e38: a user's ``isfinite(loss)``
    skip would not fire). Now a select: ``where(t_i == c, x, 0)``."""
    x = _logp()
    x[0, 2] = -INF
    got, want, rep = _compiled(lambda x, t: F.nll_loss(x, t, reduction=reduction), [x, torch.tensor([2, 1, 0])])
    assert rep.coverage == 1.0, rep.summary()
    assert torch.isinf(want[0]) and want[0] > 0
    _same(got, want, rep)


def test_nll_loss_was_nan_where_a_class_not_picked_was_nan() -> None:
    """ATen reads only ``x[i, t_i]``: a NaN (or +inf) log-probability of another class leaves the loss finite. The
    clamp-and-multiply lifting made it ``NaN * 0 = NaN`` (and ``inf``, clamped, ``max * 0 = 0``)."""
    x = _logp()
    x[1, 3], x[2, 4] = NAN, INF
    t = torch.tensor([2, 1, 0])
    for f in (lambda x, t: F.nll_loss(x, t), lambda x, t: x.gather(1, t[:, None]) * 2):
        got, want, rep = _compiled(f, [x, t])
        assert rep.coverage == 1.0, rep.summary()
        assert bool(torch.isfinite(want[0]).all())
        _same(got, want, rep)


def test_nll_loss_without_reduction_left_an_unused_constant_and_fell_back() -> None:
    """reduction="none": the lifting made a total_weight constant no output read; the search refused the graph
    ("input 'const1' is not used by any output") and the whole loss ran in ATen. Dead nodes are now dropped."""
    x = _logp()
    x[0, 2] = -INF
    got, want, rep = _compiled(lambda x, t: F.nll_loss(x, t, reduction="none", ignore_index=1),
                               [x, torch.tensor([2, 1, 0])])
    assert rep.coverage == 1.0, rep.summary()
    _same(got, want, rep)


# --------------------------------------------------------------------------- comparisons at NaN


_X = torch.tensor([1.0, NAN, -1.0, 0.0, INF, -INF, 0.15, 2.0]).repeat(2, 1)
_Y = torch.arange(16.0).reshape(2, 8) + 1
_CMPS = {"le": lambda x: x <= 0.3, "ge": lambda x: x >= 0.3, "lt": lambda x: x < 0.3, "gt": lambda x: x > 0.3,
         "not_le": lambda x: ~(x <= 0.3), "not_ge": lambda x: ~(x >= 0.3), "not_gt": lambda x: ~(x > 0.3),
         "not_lt": lambda x: ~(x < 0.3)}


@pytest.mark.parametrize("cmp", sorted(_CMPS))
def test_le_and_ge_were_true_at_nan(cmp: str) -> None:
    """ATen's ``x <= c`` and ``x >= c`` are false at NaN (their negations true). The lifting wrote ``le`` as
    ``not (x > c)``, true at NaN: ``where(x <= c, y, -y)`` took the wrong branch and ``(x <= c).float()`` was 1.
    Both as a ``where`` mask and as numbers, against ATen."""
    c = _CMPS[cmp]
    for f in (lambda x, y: torch.where(c(x * 2), y, -y), lambda x, y: c(x * 2).to(y.dtype) * y):
        got, want, rep = _compiled(f, [_X, _Y])
        assert rep.coverage == 1.0, rep.summary()
        _same(got, want, rep)


def test_relu_gradient_was_zero_at_a_nan_activation() -> None:
    """ReLU's gradient ``where(out <= 0, 0, grad)`` passes the gradient at a NaN output (ATen); the lifted ``le``
    (true at NaN) made it 0."""
    got, want, rep = _compiled(lambda x, y: torch.relu(x * 2) * y, [_X, _Y], train=True)
    assert rep.coverage == 1.0, rep.summary()
    assert float(want[1][0, 1]) == 2 * float(_Y[0, 1])
    _same(got, want, rep)


@pytest.mark.parametrize("cmp", ["gt", "le"])
def test_a_comparison_of_half_values_used_the_constant_unrounded(cmp: str) -> None:
    """ATen compares a half tensor with ``0.3`` rounded to half (0.30005): ``half(0.3) > 0.3`` is False. The
    lifting compared with 0.3 itself, so that element (and every half equal to the rounded constant) took the
    other branch."""
    x = torch.tensor([0.3, 0.2, 0.5, -1.0], dtype=torch.float16).repeat(2, 1)
    f = _CMPS[cmp]
    got, want, rep = _compiled(lambda x: torch.where(f(x), 1.0, -1.0) + x, [x])
    assert rep.coverage == 1.0, rep.summary()
    _same(got, want, rep, tol=1e-3)


# --------------------------------------------------------------------------- constants made in the forward


def test_a_mask_made_in_the_forward_is_computed_while_lifting() -> None:
    """Mistral's sliding window ``ones(t, t, bool).tril().triu(1 - w)`` made in the forward and passed to SDPA
    (whose mask the decomposition turns into ``where(keep, 0, -inf)``): computed once while lifting, the -inf
    entries held as a kept mask the softmax reads. ``tril``, ``triu`` and the -inf ``scalar_tensor`` were left to
    ATen (no registry op, a constant that is not finite)."""
    model, xs = up.build("mistral_sliding_layer")
    want, _ = up.reference(model, xs, False)
    rep = Report()
    got, _ = up.compiled(model, xs, False, OPTS, rep)
    assert up.rel_err(got, want) < 2e-4
    assert rep.coverage == 1.0 and {"tril", "triu", "scalar_tensor"} <= {o for p in rep.partitions for o in p.ops}, \
        rep.summary()


def test_rotary_frequencies_from_an_integer_arange_are_computed_while_lifting() -> None:
    """HF's ``inv_freq = 1 / base ** (arange(0, d, 2, dtype=int64).float() / d)`` and a ``finfo.min`` causal mask
    ``full((t, t), min).triu(1)`` (Qwen2) made in the forward: constants, not "dtype int64" / "no registry op"."""
    model, xs = up.build("qwen2_attention")
    want, _ = up.reference(model, xs, False)
    rep = Report()
    got, _ = up.compiled(model, xs, False, OPTS, rep)
    assert up.rel_err(got, want) < 2e-4
    assert rep.coverage == 1.0, rep.summary()


class _ConstMask(nn.Module):
    """Attention with a float mask made in the forward that masks one query's row entirely (-inf throughout)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        t = q.shape[-2]
        m = torch.full((t, t), -INF).triu(1)
        m[0] = -INF  # (index_put on a constant: computed while lifting too)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


@pytest.mark.parametrize("train", [False, True])
def test_attention_with_a_constant_minus_inf_mask_and_a_row_masked_throughout(train: bool) -> None:
    """ATen gives 0 for the row masked throughout (and 0 gradients); the constant mask's kept entries say which
    weights are exactly 0, and that row's denominator is 0, read as 1."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 2, 4, 8, generator=g) for _ in range(3)]
    got, want, rep = _compiled(_ConstMask(), xs, train=train)
    assert float(want[0][0, :, 0].abs().max()) == 0.0
    _same(got, want, rep)
    assert not any(r.op == "_scaled_dot_product_flash_attention_for_cpu" for r in rep.left), rep.summary()


def test_a_constant_holding_minus_inf_read_by_anything_else_stays_in_aten() -> None:
    """A -inf constant is held as its finite part plus a kept mask that only a softmax or attention reads; any
    other reader (here ``maximum``) leaves the constant to ATen, with the reason, and the result stays right."""
    x = torch.randn(2, 4)
    got, want, rep = _compiled(lambda x: torch.maximum(x * 2, torch.full((1, 4), -INF)) + 1, [x])
    _same(got, want, rep)
    assert any("-inf" in (r.detail or "") for r in rep.left), \
        rep.summary()


# --------------------------------------------------------------------------- equality of floats, guarded divisions


@pytest.mark.parametrize("form", ["where_eq", "where_ne", "mask_eq"])
def test_an_equality_of_floats_lifts_with_atens_values_at_nan_and_signed_zero(form: str) -> None:
    """``x == c`` of floats (F.normalize's ``n == 0``): neither above nor below c and not NaN (``!=`` true at NaN),
    -0 equal to 0, against ATen; it stayed in ATen before ("no registry op")."""
    x = torch.tensor([1.0, NAN, -1.0, 0.0, INF, -0.0, 0.3, 2.0]).repeat(2, 1)
    f = {"where_eq": lambda x, y: torch.where(x * 2 == 0.6, y, -y),
         "where_ne": lambda x, y: torch.where(x * 2 != 0, y, -y),
         "mask_eq": lambda x, y: (x * 2 == 0).to(y.dtype) * y}[form]
    got, want, rep = _compiled(f, [x, _Y])
    assert rep.coverage == 1.0, rep.summary()
    _same(got, want, rep)


def test_normalize_trains_with_its_equality_in_the_kernels() -> None:
    """``F.normalize``'s backward: its ``n == 0`` now lifts; the ``masked_fill`` of the division it guards stays in
    ATen (its kernels would divide where the fill hides the result: no verified candidate), the result is right."""
    y = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    got, want, rep = _compiled(lambda y: F.normalize(y * 2 - 1, dim=-1), [y], train=True)
    assert {r.op for r in rep.left} <= {"masked_fill"} and any(p.taken and "eq" in p.ops for p in rep.partitions), \
        rep.summary()
    _same(got, want, rep)


@pytest.mark.parametrize("form", ["and", "or", "not_and", "and_float"])
def test_and_or_of_comparisons_lift(form: str) -> None:
    """``(x >= lo) & (x <= hi)`` (clamp's gradient mask, OLMo's ``clip_qkv``) and ``|``: nested selects for a
    ``where``, 0/1 floats for arithmetic, De Morgan under ``~``; at NaN as ATen (every comparison false)."""
    x = torch.tensor([1.0, NAN, -1.0, 0.0, INF, -0.0, 0.3, 9.0]).repeat(2, 1)
    f = {"and": lambda x, y: torch.where((x >= -0.5) & (x <= 0.5), y, -y),
         "or": lambda x, y: torch.where((x < -0.5) | (x > 0.5), y, -y),
         "not_and": lambda x, y: torch.where(~((x >= -0.5) & (x <= 0.5)), y, -y),
         "and_float": lambda x, y: ((x >= -0.5) & (x <= 0.5)).float() * y}[form]
    got, want, rep = _compiled(f, [x, _Y])
    assert rep.coverage == 1.0, rep.summary()
    _same(got, want, rep)


def test_constant_index_lists_lift_as_slices() -> None:
    """Falcon's multi-query split ``fused[:, :, [-2]]``: the index list is a tensor the traced graph holds; read
    while lifting, it is a slice (runs of consecutive indices, concatenated), not "data-dependent indexing"."""
    model, xs = up.build("falcon_mqa_layer")
    want, _ = up.reference(model, xs, False)
    rep = Report()
    got, _ = up.compiled(model, xs, False, OPTS, rep)
    assert up.rel_err(got, want) < 2e-4
    assert rep.coverage == 1.0 and "index" in {o for p in rep.partitions if p.taken for o in p.ops}, rep.summary()

    def pick(x: torch.Tensor) -> torch.Tensor:
        return x[:, [3, 0, 1, 1, -1]] * 2

    got2, want2, rep2 = _compiled(pick, [torch.randn(2, 6)])
    assert rep2.coverage == 1.0, rep2.summary()
    _same(got2, want2, rep2)


def test_a_negated_causal_mask_saved_for_the_backward_lifts() -> None:
    """Gemma 2's ``scores.masked_fill(~causal, -inf)`` in a training step: the forward hands ``~causal`` to the
    backward (a negated boolean leaving the partition), which was left to ATen; it now leaves as the 0/1 floats of
    its value, converted to ATen's booleans on exit."""
    model, xs = up.build("gemma2_attn_softcap")
    want, wgrads = up.reference(model, xs, True)
    rep = Report()
    got, grads = up.compiled(model, xs, True, OPTS, rep)
    assert up.rel_err(got, want) < 2e-4
    for g, w in zip(grads, wgrads, strict=True):
        assert up.rel_err(g, w) < 2e-4
    assert rep.coverage == 1.0, rep.summary()


def test_the_composition_check_had_no_time_budget_and_held_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whisper's encoder forward through the backend did not finish in 25 minutes: the search's composition check
    (``glue.undefined_fed``, a pure-Python abstract derivation) ran with no budget, so only its checkpoints could
    stop it and none had a deadline. It now runs under the derivation budget and, past it, the composition is not
    proved (fails closed). Here a derivation that never ends, with a budget of 0.3 s."""
    import time

    import verimirage as vm
    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.options import SearchOptions
    from verimirage.pipeline.superopt import _composed_verdict
    from verimirage.smt import budget, expr, glue

    def endless(graph: Any, regions: Any) -> None:
        while True:
            expr.checkpoint()

    monkeypatch.setattr(glue, "undefined_fed", endless)
    monkeypatch.setattr(budget, "derive_budget_s", lambda timeout_s: 0.3)
    g = vm.Graph()
    x = g.input("x", (2,), vm.float32)
    g.output(g.exp(x))
    mg = MuGraph.from_graph(g)
    t0 = time.monotonic()
    v = _composed_verdict(g, mg, [vm.verify(g, mg)], SearchOptions(), [])
    assert time.monotonic() - t0 < 30
    assert not v.proved and "budget" in v.reason, v.reason
