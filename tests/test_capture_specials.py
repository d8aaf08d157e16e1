"""The compile-time numeric check (kernels against the partition's ATen ops) at special values (eighteenth session):
besides its random finite inputs it writes a row of -inf, one +inf and one NaN into the floating-point inputs
(``capture.CHECK_SPECIALS``) and, wherever the ATen ops themselves make no NaN there, the kernels must give ATen's
results, infinities and NaNs included."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from verimirage.integrations import capture  # noqa: E402
from verimirage.integrations.dynamo import backend  # noqa: E402
from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1}


def _run(f: Any, *xs: Any) -> tuple[Any, Report]:
    torch._dynamo.reset()
    rep = Report()
    with torch.no_grad():
        out = torch.compile(f, backend=backend(report=rep, **OPTS))(*xs)
    return out, rep


def test_the_numeric_check_passed_kernels_finite_where_aten_is_infinite(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels that agree with ATen on finite inputs but give a finite value where ATen's is inf (a clamped or
    saturated result: what the seventeenth session's nll_loss gave for a picked -inf) passed the check, which drew
    only finite inputs, and the partition was taken. Now the +inf set catches them: the partition stays in ATen."""
    real = capture.PartitionRunner.kernels

    def saturating(self: Any, xs: Any) -> Any:
        return [torch.nan_to_num(y, posinf=3e38, neginf=-3e38) for y in real(self, xs)]

    monkeypatch.setattr(capture.PartitionRunner, "kernels", saturating)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    out, rep = _run(lambda x: torch.relu(x) * 2.0 + 1.0, x)
    assert not any(p.taken for p in rep.partitions), rep.summary()
    reasons = " ".join(str(p.reason) for p in rep.partitions)
    assert "inf" in reasons and "differs from the ATen ops" in reasons, reasons
    assert torch.allclose(out, torch.relu(x) * 2 + 1)


def test_kernels_that_keep_atens_special_values_are_taken() -> None:
    """The same program with its real kernels passes the special sets (relu of +inf is inf, of NaN NaN)."""
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    _out, rep = _run(lambda x: torch.relu(x) * 2.0 + 1.0, x)
    assert rep.coverage == 1.0, rep.summary()


def test_special_sets_skip_inputs_where_aten_is_undefined() -> None:
    """A softmax of a row of -inf is NaN in ATen (``-inf - -inf``): that set constrains nothing and is not drawn;
    one +inf also makes NaN (``inf - inf``); a NaN in is kept (the NaN was not made). ATen's fused attention reading
    a non-finite operand gives its kernel's own result (the CPU flash kernel: 0 for a query row holding NaN, where
    the math path gives NaN): not a reference either."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    gm = make_fx(lambda x: torch.softmax(x, -1))(x)
    assert "makes a NaN" in str(capture.undefined_at(gm, [capture._with_special(x, "-inf-row")]))
    assert capture.undefined_at(gm, [capture._with_special(x, "+inf-one")]) is not None
    assert capture.undefined_at(gm, [capture._with_special(x, "nan-one")]) is None
    assert capture.undefined_at(gm, [x]) is None
    q = torch.randn(1, 1, 3, 4, generator=torch.Generator().manual_seed(2))
    att = make_fx(lambda q: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q)[0])(q)
    assert "non-finite operand" in str(capture.undefined_at(att, [capture._with_special(q, "nan-one")]))


def test_special_sets_keep_strides_and_write_broadcast_inputs_once() -> None:
    """A transposed input keeps its strides; an expanded input (stride 0: GQA's keys repeated over heads) gets the
    value in its memory, so every alias holds it (writing element by element into it raised, and the capture of
    gqa_expand's whole graph failed)."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))
    y = capture._with_special(x.t(), "-inf-row")
    assert y.stride() == x.t().stride() and bool(torch.isinf(y[0]).all()) and not bool(torch.isinf(y[1:]).any())
    e = torch.randn(2, 1, 4, generator=torch.Generator().manual_seed(2)).expand(2, 3, 4)
    z = capture._with_special(e, "nan-one")
    assert z.stride() == e.stride() and bool(torch.isnan(z[0, :, 0]).all()) and int(torch.isnan(z).sum()) == 3
    r = capture._with_special(e, "-inf-row")
    assert bool(torch.isinf(r[0, :, :]).all()) and not bool(torch.isinf(r[1]).any())


def _left_padded(s: Any) -> Any:
    """A softmax over scores whose first key every row masks (a left-padding mask made in the forward, -inf)."""
    t = s.shape[-1]
    m = torch.zeros(t, t)
    m[:, 0] = float("-inf")
    return torch.softmax(s + m, dim=-1) * 2.0


def test_nan_at_a_masked_score_kept_a_padded_softmax_out_of_the_kernels() -> None:
    """Contract: a score a constant -inf mask removes is not read (the lifted softmax holds the mask as its kept
    booleans and gives those entries a weight of exactly 0, as ATen's fused attention kernels skip masked keys), so at a
    NaN or +inf there the kernels give the softmax of the row's kept scores, where ATen's ``s + -inf`` is NaN on the
    whole row. The check's NaN set (written into the first score, which this mask removes) demanded ATen's NaN there,
    which no kernel of the lifted program gives: the partition stayed in ATen (coverage 0). Now that set constrains
    nothing, as a +inf there already did (ATen's add makes the NaN); a NaN at a kept score still propagates."""
    s = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    rep = Report()
    f = torch.compile(_left_padded, backend=backend(report=rep, **OPTS))
    with torch.no_grad():
        assert torch.allclose(f(s), _left_padded(s), atol=1e-6)
        assert rep.coverage == 1.0, rep.summary()
        masked, kept = s.clone(), s.clone()
        masked[0, 3, 0] = float("nan")
        kept[0, 3, 5] = float("nan")
        got = f(masked)
        assert bool(torch.isnan(_left_padded(masked)[0, 3]).all())  # (ATen's decomposed softmax: NaN on the row)
        assert bool(torch.isfinite(got).all())
        want = torch.softmax(s[..., 1:], dim=-1) * 2.0  # (the softmax of the kept scores)
        assert torch.allclose(got[..., 1:], want, atol=1e-6) and not bool(got[..., 0].any())
        got = f(kept)
        assert bool(torch.isnan(got[0, 3]).all()) and torch.equal(torch.isnan(got), torch.isnan(_left_padded(kept)))


def test_undefined_at_names_a_constant_minus_inf_mask_added_to_a_nan() -> None:
    """The mask must be a constant the forward makes: a mask passed in as an input is added as it is (NaN + -inf is
    NaN in the kernels too), and its set still constrains them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    s = torch.randn(1, 4, 4, generator=torch.Generator().manual_seed(1))
    gm = make_fx(_left_padded)(s)
    at_masked, at_kept = s.clone(), s.clone()
    at_masked[0, 2, 0] = float("nan")
    at_kept[0, 2, 1] = float("nan")
    assert "constant -inf mask" in str(capture.undefined_at(gm, [at_masked]))
    assert capture.undefined_at(gm, [at_kept]) is None
    m = torch.zeros(4, 4)
    m[:, 0] = float("-inf")
    given = make_fx(lambda s, m: torch.softmax(s + m, dim=-1))(s, m)
    assert capture.undefined_at(given, [at_masked, m]) is None
