"""Real models' gaps closed in the twentieth session.

A concatenation read through a reshape that splits its axis over two output indices was Unknown: Swin's shifted
windows (``torch.roll``, two slices concatenated, then the window partition's view) are read at ``4*_o0 + _o1``, T5's
looked-up bias rows viewed as ``(T, T, H)`` at ``4*_o2 + _o3``. The verifier's abstraction splits an output's index
box into cases where a concatenation's pieces meet (:func:`verimirage.smt.abstract.derive_all`); it split only on the
first output index of the read and only where that index alone, at coefficient 1, crosses a piece boundary. It now
cuts whichever output index's values, taken one at a time, fall in different pieces (an undecided value alone), and an
index a case holds at one value is that constant (so ``4*_o0 + _o1`` at ``_o0 = 1`` is ``4 + _o1``).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.smt.certificate import check_text
from verimirage.smt.certify import make_certificate
from verimirage.smt.verdict import Outcome
from verimirage.smt.verify import abstract_check

F32 = vm.float32


def _rolled(n: int, s: int, split: tuple[int, ...], order: tuple[int, int] = (0, 1)) -> vm.Graph:
    """``x``'s rows rolled by ``-s`` (two slices concatenated: torch.roll's lifting), viewed as ``split`` rows (a
    reshape that spreads the concatenated axis over several output indices); ``order`` (1, 0): the pieces swapped."""
    g = vm.Graph()
    x = g.input("X", (n, 5), F32)
    parts = [g.slice(x, 0, s, n), g.slice(x, 0, 0, s)]
    g.output(g.reshape(g.concat([parts[i] for i in order], 0), (*split, 5)))
    return g


def _row_by_row(n: int, s: int, split: tuple[int, ...]) -> vm.Graph:
    """The same rows, each row of the split's last-but-one axis made of its own slices (no reshape of the roll)."""
    g = vm.Graph()
    x = g.input("X", (n, 5), F32)
    w = split[-1]
    rows = []
    for q in range(n // w):
        at = [(q * w + i + s) % n for i in range(w)]
        cut = [0, *(i for i in range(1, w) if at[i] != at[i - 1] + 1), w]
        runs = [g.slice(x, 0, at[a], at[b - 1] + 1) for a, b in itertools.pairwise(cut)]
        rows.append(g.reshape(runs[0] if len(runs) == 1 else g.concat(runs, 0), (1, w, 5)))
    g.output(g.reshape(g.concat(rows, 0), (*split, 5)))
    return g


SPLITS = [(8, 3, (2, 4)), (8, 3, (4, 2)), (12, 5, (3, 4)), (12, 5, (2, 2, 3)), (16, 1, (4, 4))]


@pytest.mark.parametrize(("n", "s", "split"), SPLITS, ids=[f"{n}-{s}-{'x'.join(map(str, p))}" for n, s, p in SPLITS])
def test_a_concat_read_through_a_reshape_over_two_output_indices_was_unknown(n: int, s: int,
                                                                             split: tuple[int, ...]) -> None:
    a, b = _rolled(n, s, split), _row_by_row(n, s, split)
    r = abstract_check(a, b)
    assert r.outcome == Outcome.PROVED, r.reason  # (was "piecewise value at 4*_o0+_o1 cannot be resolved")
    v = vm.verify(a, b)
    assert v.proved, v.reason
    mg = MuGraph.from_graph(b)
    cert = make_certificate(a, mg, vm.verify(a, mg))
    checked = check_text(cert.to_json())  # (the checker re-derives the same cases)
    assert checked.proved, checked.reason


@pytest.mark.parametrize(("n", "s", "split"), SPLITS[:3], ids=["8-3-2x4", "8-3-4x2", "12-5-3x4"])
def test_the_pieces_in_the_wrong_order_are_never_proved(n: int, s: int, split: tuple[int, ...]) -> None:
    a, b = _rolled(n, s, split, order=(1, 0)), _row_by_row(n, s, split)
    assert abstract_check(a, b).outcome != Outcome.PROVED
    v = vm.verify(a, b)
    assert v.outcome == Outcome.REFUTED, v  # (the finite-field trials tell them apart)


def _window_sums(rolled: bool, order: tuple[int, int] = (0, 1)) -> vm.Graph:
    """Windows of 4 rows summed: of the roll by -2 viewed ``(2, 4, 5)`` (the sum's index and the output's in one
    read, ``4*_o0 + r``, as Swin's backward sums over a window), or the same windows gathered by slices; ``order``
    (1, 0): the second window's two runs swapped."""
    g = vm.Graph()
    x = g.input("X", (8, 5), F32)
    if rolled:
        r = g.concat([g.slice(x, 0, 2, 8), g.slice(x, 0, 0, 2)], 0)
        g.output(g.sum(g.reshape(r, (2, 4, 5)), 1))
        return g
    runs = [g.slice(x, 0, 6, 8), g.slice(x, 0, 0, 2)]
    last = g.sum(g.concat([runs[i] for i in order], 0), 0)
    g.output(g.reshape(g.concat([g.sum(g.slice(x, 0, 2, 6), 0), last], 0), (2, 1, 5)))
    return g


def test_a_concat_read_at_a_reduction_and_an_output_index_was_unknown() -> None:
    """The read's index holds the sum's variable and an output index: the sum cannot split its range while the
    output index varies; the case is cut on the output index first (its values one at a time, the sum's range
    known), then the sum splits its range in each case."""
    a, b = _window_sums(True), _window_sums(False)
    r = abstract_check(a, b)
    assert r.outcome == Outcome.PROVED, r.reason
    assert vm.verify(a, b).proved
    wrong = _window_sums(False, order=(1, 0))  # (a sum, so the same function: proved too)
    assert vm.verify(a, wrong).proved
    shifted = vm.Graph()
    x = shifted.input("X", (8, 5), F32)
    r = shifted.concat([shifted.slice(x, 0, 3, 8), shifted.slice(x, 0, 0, 3)], 0)  # (rolled by -3: other windows)
    shifted.output(shifted.sum(shifted.reshape(r, (2, 4, 5)), 1))
    assert abstract_check(shifted, b).outcome != Outcome.PROVED
    assert vm.verify(shifted, b).outcome == Outcome.REFUTED


torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_programs as up  # noqa: E402

from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 10.0, "fallback": "eager", "candidates": 1}


def _run(name: str, train: bool) -> Report:
    model, xs = up.build(name)
    want, wgrads = up.reference(model, xs, train)
    rep = Report()
    got, grads = up.compiled(model, xs, train, OPTS, rep)
    assert up.rel_err(got, want) < 1e-5
    for g, w in zip(grads, wgrads, strict=True):
        assert g is not None and up.rel_err(g, w) < 1e-5
    return rep


@pytest.mark.slow  # (about 40 s on a loaded 2-core machine)
def test_swin_shifted_windows_train_in_the_kernels() -> None:
    """Swin's shifted-window block: the forward's LayerNorm, roll, window partition and qkv projection and the whole
    backward were left to ATen (69% / 55%); now only the relative bias table's lookup at a buffer of indices (data)
    and its gradient's ``index_put`` are."""
    rep = _run("swin_shifted_window", True)
    assert {r.op for r in rep.left} <= {"index", "index_put"}, rep.summary()


@pytest.mark.slow  # (about 40 s on a loaded 2-core machine)
def test_t5_relative_bias_rows_viewed_per_head_lift() -> None:
    """T5's block: the bias rows looked up at the buckets, concatenated and viewed ``(T, T, H)``, are read at
    ``4*_o2 + _o3``: the whole-layer partition's composition was Unknown (57% of the forward); now 100%."""
    rep = _run("t5_block", False)
    assert rep.coverage == 1.0 and not rep.left, rep.summary()


def _lift(fn: Any, *xs: Any) -> Any:
    """``fn`` traced and lifted (:func:`verimirage.integrations.capture.lift`); the lifting and its outputs against
    ATen in float64 on ``xs``."""
    import numpy as np
    from torch.fx.experimental.proxy_tensor import make_fx

    from verimirage.integrations import capture

    gm = make_fx(fn, tracing_mode="fake")(*xs)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    places = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    named = {f"in{i}": xs[places.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    named.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(lifted.graph, named)
    with torch.no_grad():
        want = fn(*(x.double() if x.is_floating_point() else x for x in xs))
    (_kind, i, shape, _b), = lifted.out_map
    np.testing.assert_array_equal(got[i].reshape(shape), want.numpy())
    return lifted


def _mean_over_kept(g: Any, n: Any, m: Any) -> Any:
    """Label smoothing's backward: the gradient over the count of kept tokens, broadcast to the tokens and filled
    with 0 at the ignored ones (``masked_fill(expand(g / n), ignored, 0)``)."""
    return torch.ops.aten.masked_fill.Scalar((g * 0.25 / n).expand(8), m, 0).neg()


def test_a_fill_over_a_broadcast_division_was_never_proved() -> None:
    """``masked_fill(expand(g / n), m, 0)`` was lifted as ``where(m, 0, g / n)``: the kernels compute ``g / n``
    everywhere, the fill hides it, and no candidate (not even the lifted graph itself as a μGraph) was proved
    defined wherever the source is ('the candidate's div needs in1[0] != 0'): label smoothing's backward stayed in
    ATen (88%). It is lifted as ``where(m, 0, g) / where(m, 1, n)``, equal to ATen's result in float64 (all
    tokens ignored and n = 0 included: 0 / 1)."""
    m = torch.tensor([True, False, False, True, False, True, False, False])
    for n, mask in ((torch.tensor([3.0]), m), (torch.tensor([0.0]), torch.ones(8, dtype=torch.bool))):
        lifted = _lift(_mean_over_kept, torch.tensor([2.0]), n, mask)
    v = vm.verify(lifted.graph, MuGraph.from_graph(lifted.graph))
    assert v.proved, v.reason


@pytest.mark.slow  # (about 20 s on a loaded 2-core machine)
def test_label_smoothing_trains_in_the_kernels() -> None:
    rep = _run("label_smoothed_ce", True)
    assert rep.coverage == 1.0 and not rep.left, rep.summary()


class _Buckets(torch.nn.Module):
    """T5-style: a table looked up at buckets made in the forward from positions alone (AOTAutograd saves them for
    the backward, where they are an input)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5, 3, generator=torch.Generator().manual_seed(11)))

    def forward(self, x: Any) -> Any:
        c = torch.arange(4)
        return torch.nn.functional.embedding((c[:, None] - c[None, :]).abs().clamp(max=2), self.w) * x


def test_an_embedding_gradient_at_buckets_the_forward_saved_lifts() -> None:
    """The backward graph gets the buckets as a saved tensor (an input), so ``embedding_dense_backward`` read
    indices that were data and stayed in ATen (T5's training step 99%). The forward's constant outputs are now held
    on the backward's placeholders of the same names (of the same shape and dtype): the gradient is lifted, and every
    gradient matches float64."""
    model = _Buckets()
    x = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(12))
    want, wgrads = up.reference(model, [x], True)
    rep = Report()
    got, grads = up.compiled(model, [x], True, OPTS, rep)
    assert rep.coverage == 1.0 and not rep.left, rep.summary()
    assert up.rel_err(got, want) < 1e-6
    for g, w in zip(grads, wgrads, strict=True):
        assert g is not None and up.rel_err(g, w) < 1e-6
