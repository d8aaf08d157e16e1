"""Whole layers whose pieces verified but whose composition did not (eighteenth session).

The search splits a large partition into regions and composes their proved μGraphs; the composition is Proved only
when every value one region makes and another reads is defined for all inputs, by the signs of its ops alone
(``smt.glue.undefined_fed``). A softmax over scores with a constant -inf mask made in the forward (CLIP's text
encoder: ``torch.full(-inf).triu(1)``) divided by ``sum(where(kept, exp(s - max), 0))``, which may be 0 by signs,
so CLIP's layer was never proved whole and the retry left the mask to ATen (90% of its ops). The denominator now
names a column the constant keeps in every row (``aten._kept_sum``): an exp plus a sum of exps and zeros, positive.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_programs as up  # noqa: E402

from verimirage.integrations.dynamo import backend  # noqa: E402
from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 10.0, "fallback": "eager", "candidates": 1}


@pytest.mark.slow
def test_clip_layer_with_its_minus_inf_causal_mask_was_not_proved_composed() -> None:
    model, xs = up.build("clip_text_layer", dtype=torch.float32)
    want, _ = up.reference(model, xs, False)
    rep = Report()
    got, _ = up.compiled(model, xs, False, OPTS, rep)
    assert rep.coverage == 1.0, rep.summary()
    assert not rep.notes, rep.notes  # (taken whole: no retry without the mask's ops)
    assert up.rel_err(got, want) < 1e-5


def _causal_softmax(s: Any) -> Any:
    t = s.shape[-1]
    return torch.softmax(s + torch.full((t, t), float("-inf")).triu(1), dim=-1) * 2.0


def test_causal_softmax_keeps_atens_nan_on_a_row_whose_kept_scores_are_all_minus_inf() -> None:
    """The positive form of the denominator changes no value: a row whose kept scores are -inf is 0 / 0, NaN, as
    in ATen; the other rows match ATen."""
    s = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(0))
    s[0, 3, :] = -float("inf")
    torch._dynamo.reset()
    rep = Report()
    with torch.no_grad():
        got = torch.compile(_causal_softmax, backend=backend(report=rep, **OPTS))(s)
    want = _causal_softmax(s)
    assert rep.coverage == 1.0, rep.summary()
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and bool(torch.isnan(want[0, 3]).all())
    fin = ~torch.isnan(want)
    assert torch.allclose(got[fin], want[fin], atol=1e-6, rtol=1e-5)


def test_the_softmax_denominator_names_a_column_every_row_keeps() -> None:
    """The lifted graph (float64, against ATen): the causal mask keeps the first key in every row; a mask keeping no
    column in every row (a sliding window) keeps the plain sum."""
    from test_capture_ops import _lift_and_compare, _x

    lifted = _lift_and_compare(_causal_softmax, _x(2, 5, 5))
    ops = [n.op for n in lifted.graph.nodes]
    assert ops.count("where") == 3 and "slice" in ops  # (the fill, the numerator, the other columns' sum)

    def window(s: Any) -> Any:
        t = s.shape[-1]
        i = torch.arange(t)
        far = (i[:, None] - i[None, :] >= 2) | (i[None, :] > i[:, None])
        return torch.softmax(s + torch.zeros(t, t).masked_fill(far, float("-inf")), dim=-1)

    lifted = _lift_and_compare(window, _x(2, 5, 5))
    assert "slice" not in [n.op for n in lifted.graph.nodes]
