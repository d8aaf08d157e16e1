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
