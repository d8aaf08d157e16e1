"""Real models' gaps closed in the nineteenth session: a composition that divides by a value the program itself
divides by (Gemma-2's soft-capped cross-entropy backward), padding modes, transposed convolutions.

The composition of proved regions asked every value one region makes and another reads to be defined for all inputs
(``smt.glue.undefined_fed``). Cross entropy's backward divides by the forward's ``total_weight`` (a runtime input of
the backward graph), so the value ``grad / total_weight`` crossing two regions was refused although the program
itself divides by it: no candidate of the whole backward partition was proved (85% of the module's ops). The value
now need only be defined wherever every output of the program is, the program's own conditions (those free of
output indices) as facts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import verimirage as vm
from verimirage.ir.graph import MuGraph
from verimirage.smt.certificate import check_text
from verimirage.smt.certify import make_certificate, make_composed_certificate
from verimirage.smt.glue import live_ops, region_of, undefined_fed

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import unseen_programs as up  # noqa: E402

from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 10.0, "fallback": "eager", "candidates": 1}


def _composed_of(g: vm.Graph, mugraph_of: dict[int, vm.Graph]) -> Any:
    """One region per live op of ``g`` (region k's μGraph ``mugraph_of[k]``, else its own graph), each proved; the
    regions and their composed certificate."""
    regs = [region_of(g, [i]) for i in sorted(live_ops(g))]
    certs = []
    for k, r in enumerate(regs):
        mg = MuGraph.from_graph(mugraph_of.get(k, r.graph))
        v = vm.verify(r.graph, mg)
        assert v.proved, v.reason
        certs.append(make_certificate(r.graph, mg, v))
    return regs, make_composed_certificate(g, regs, certs, "capture19")


def _divided_by_a_count() -> vm.Graph:
    """``(x / broadcast(n)) * w``: the division's value crosses into the product's region; the program divides by
    ``n`` too (nll_loss's backward: the gradient over ``total_weight``)."""
    g = vm.Graph()
    x, n, w = g.input("x", (2, 4), vm.float32), g.input("n", (1, 1), vm.float32), g.input("w", (2, 4), vm.float32)
    g.output(g.mul(g.div(x, g.broadcast_to(n, (2, 4))), w))
    return g


def test_composition_refused_a_division_the_program_itself_makes() -> None:
    g = _divided_by_a_count()
    regs, cc = _composed_of(g, {})
    assert undefined_fed(g, regs) is None
    v = check_text(cc.to_json())
    assert v.proved, v.reason


def _one_output_guards_the_division() -> tuple[vm.Graph, vm.Graph]:
    """Outputs ``2 (x / n)`` and ``where(m, x / n, z)``; the where's region μGraph reads the quotient outside its
    branch too (``+ 0 * r1``). At ``n = 0`` the first output is undefined but the second is defined (``z`` where
    ``m`` is false), and the splice would give NaN there."""
    g = vm.Graph()
    x, n = g.input("x", (2, 4), vm.float32), g.input("n", (1, 1), vm.float32)
    m, z = g.input("m", (2, 4), vm.bool), g.input("z", (2, 4), vm.float32)
    q = g.div(x, g.broadcast_to(n, (2, 4)))
    g.output(g.scale(q, 2.0), g.where(m, q, z))
    h = vm.Graph()
    r0, r1, r2 = h.input("r0", (2, 4), vm.bool), h.input("r1", (2, 4), vm.float32), h.input("r2", (2, 4), vm.float32)
    h.output(h.add(h.where(r0, r1, r2), h.scale(r1, 0.0)))
    return g, h


def test_a_value_one_output_needs_but_another_does_not_still_must_be_defined() -> None:
    """The program's conditions are facts only when every output needs them: here the second output is defined at
    ``n = 0``, so the quotient crossing into its region must be defined by itself (it is not: refused)."""
    g, h = _one_output_guards_the_division()
    regs = [region_of(g, [i]) for i in sorted(live_ops(g))]
    k = next(i for i, r in enumerate(regs) if any(n.op == "where" for n in r.graph.nodes))
    regs, cc = _composed_of(g, {k: h})
    ins = {"x": np.ones((2, 4)), "n": np.zeros((1, 1)), "m": np.zeros((2, 4), bool), "z": np.full((2, 4), 3.0)}
    with np.errstate(all="ignore"):
        got = vm.evaluate(MuGraph.parse(cc.mugraph_text), ins)[1]
    assert np.isnan(got).all()  # (the splice: NaN where the program's second output is 3)
    assert undefined_fed(g, regs) is not None
    v = check_text(cc.to_json())
    assert not v.proved and "may be undefined" in v.reason, v.reason


def test_a_fact_of_an_output_index_is_no_fact_of_a_crossing_value() -> None:
    """``slice(log(x), 0:1)``: the output needs ``x[o] > 0`` for its one index only; the log crossing into the
    slice's region is needed over both elements, so it must still be defined by signs (refused)."""
    g = vm.Graph()
    g.output(g.slice(g.log(g.input("x", (2,), vm.float32)), 0, 0, 1))
    regs = [region_of(g, [i]) for i in sorted(live_ops(g))]
    assert undefined_fed(g, regs) is not None


@pytest.mark.slow
def test_gemma2_softcap_cross_entropy_backward_divided_by_the_forward_count_was_not_composed() -> None:
    model, xs = up.build("gemma2_softcap_ce", dtype=torch.float32)
    want, wgrads = up.reference(model, xs, True)
    rep = Report()
    got, grads = up.compiled(model, xs, True, OPTS, rep)
    assert rep.coverage == 1.0, rep.summary()
    assert up.rel_err(got, want) < 1e-5
    for g, w in zip(grads, wgrads, strict=True):
        assert (g is None) == (w is None) and (g is None or up.rel_err(g, w) < 1e-5)


# --------------------------------------------------------------------------- padding modes, slice_scatter, copy

#: (input shape, F.pad list, mode): 1-, 2- and 3-d, asymmetric, a pad as wide as the dim allows (reflect: n - 1)
PADS = [((2, 3, 6), (1, 2), "reflect"), ((2, 3, 5, 6), (2, 1, 0, 3), "reflect"), ((1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2),
                                                                                   "reflect"),
        ((2, 3, 4), (3, 3), "reflect"), ((2, 3, 6), (1, 2), "replicate"), ((2, 3, 5, 6), (2, 1, 0, 3), "replicate"),
        ((1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2), "replicate"), ((2, 3, 1), (2, 1), "replicate"),
        ]


def _lift_fx(fn: Any, *xs: Any) -> Any:
    """``fn`` traced (dead code dropped: a vjp traces the forward too), lifted, evaluated in float64 against ATen."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from verimirage.integrations import capture

    gm = make_fx(fn, tracing_mode="fake")(*xs)
    gm.graph.eliminate_dead_code()
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    places = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    named = {f"in{i}": xs[places.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    named.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(lifted.graph, named)
    with torch.no_grad():
        want = fn(*(x.double() for x in xs))
    for (kind, i, shape, _b), w in zip(lifted.out_map, want if isinstance(want, (list, tuple)) else [want],
                                       strict=True):
        assert kind == "out"
        np.testing.assert_allclose(got[i].reshape(shape), w.numpy(), rtol=1e-12, atol=1e-12)
    return gm


@pytest.mark.parametrize("case", PADS, ids=[f"{c[2]}-{len(c[0]) - 2}d-{c[1]}" for c in PADS])
def test_padding_modes_lift_forward_and_backward(case: tuple[Any, ...]) -> None:
    """``F.pad`` in reflect and replicate modes (``padding_mode`` of a conv) were left to ATen ('op not in the
    registry'): lifted, the forward and its gradient equal to ATen's in float64."""
    shape, pad, mode = case
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    _lift_fx(lambda x: F.pad(x, pad, mode=mode) * 2.0, x)
    gy = torch.randn(*F.pad(x, pad, mode=mode).shape, generator=torch.Generator().manual_seed(2))

    def grad(gy: Any, x: Any) -> Any:
        from torch.func import vjp

        return vjp(lambda t: F.pad(t, pad, mode=mode), x)[1](gy)[0] * 1.0

    gm = _lift_fx(grad, gy, x)
    assert any(str(n.target).split(".")[1].endswith("_backward") for n in gm.graph.nodes if n.op == "call_function")


@pytest.mark.parametrize(("dim", "start", "end"), [(1, 2, 5), (0, 0, 1), (1, -2, None), (2, 1, None)])
def test_slice_scatter_and_copy_lift(dim: int, start: Any, end: Any) -> None:
    aten = torch.ops.aten
    base = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(3))
    win = base.narrow(dim, 0, len(range(base.shape[dim])[slice(start, end)]))
    src = torch.randn(*win.shape, generator=torch.Generator().manual_seed(4))
    _lift_fx(lambda b, s: aten.slice_scatter(b * 1.0, aten.copy(b.new_empty(win.shape), s * 3.0), dim, start,
                                             end), base, src)




def _trains_whole(model: nn.Module, xs: list[Any]) -> None:
    """A training step of ``model`` through the backend: every op in verified kernels, the output and every gradient
    within float32 tolerance of the float64 copy's."""
    want, wgrads = up.reference(model, xs, True)
    rep = Report()
    got, grads = up.compiled(model, xs, True, OPTS, rep)
    assert rep.coverage == 1.0 and not rep.left, rep.summary()
    assert up.rel_err(got, want) < 1e-5
    for g, w in zip(grads, wgrads, strict=True):
        assert g is not None and up.rel_err(g, w) < 1e-5


class _PaddedConv(nn.Module):
    """A Conv1d with a ``padding_mode`` (reflect: HiFi-GAN / MelGAN vocoders; replicate; circular: periodic
    domains), then SiLU."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 4, kernel_size=3, padding=2, padding_mode=mode)

    def forward(self, x: Any) -> Any:
        return F.silu(self.conv(x))


@pytest.mark.slow  # (about 25 s each on a loaded 2-core machine)
@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
def test_a_conv_with_a_padding_mode_trains_in_the_kernels(mode: str) -> None:
    """Through ``torch.compile``: the pad, the convolution and their backward all in verified kernels (circular
    as torch writes it: ``new_empty``, ``copy``, ``slice_scatter``; its backward with ``zeros_like`` and
    ``slice_backward``), the output and every gradient within float32 tolerance of float64."""
    torch.manual_seed(0)
    _trains_whole(_PaddedConv(mode), [torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1))])


class _DCGANUp(nn.Module):
    """DCGAN's generator block: a 4x4 stride-2 transposed convolution with padding 1 (overlapping windows),
    BatchNorm-free here, then ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 2, kernel_size=4, stride=2, padding=1)

    def forward(self, x: Any) -> Any:
        return F.relu(self.up(x))


@pytest.mark.slow  # (the kernels' runs in Triton's interpreter: about 2 minutes on a loaded 2-core machine)
def test_dcgan_transposed_convolution_with_a_bias_was_not_proved() -> None:
    """The bias was added to the result viewed as ``(N, C, H W)``: the scatter of the strided dim then read a
    concatenation at ``(o // W) mod 2`` of the merged index, which the verifier's abstraction cannot resolve
    ('piecewise value at ((_o2//6)%2)'), so DCGAN's up-convolution stayed in ATen; the bias is now added to
    ``(N, C, H, W)`` as ``(C, 1, 1)``. Forward and training, against float64."""
    torch.manual_seed(0)
    _trains_whole(_DCGANUp(), [torch.randn(1, 4, 2, 3, generator=torch.Generator().manual_seed(1))])


@pytest.mark.parametrize(("shifts", "dims"), [((-1, -1), (1, 2)), ((2,), (0,)), (3, None), ((5, -7), (2, 1))])
def test_roll_lifts_forward_and_backward(shifts: Any, dims: Any) -> None:
    """``torch.roll`` (Swin's shifted windows) was left to ATen ('op not in the registry'): two slices
    concatenated per dim (over the flattened tensor without ``dims``); its gradient is the roll back."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(5))
    _lift_fx(lambda x: torch.roll(x * 2.0, shifts, dims), x)
    gy = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(6))

    def grad(gy: Any, x: Any) -> Any:
        from torch.func import vjp

        return vjp(lambda t: torch.roll(t, shifts, dims), x)[1](gy)[0] * 1.0

    _lift_fx(grad, gy, x)


def _buckets_lookup(w: Any) -> Any:
    """T5-style: a table looked up at indices made in the forward from positions alone (a constant)."""
    c = torch.arange(4)
    return F.embedding((c[:, None] - c[None, :]).abs().clamp(max=2), w) * 2.0


def test_embedding_at_indices_made_in_the_forward_lifts_with_its_gradient() -> None:
    """T5's relative position bias looks its table up at buckets computed from the positions alone; they are known
    while lifting, so the lookup is slices of the table's rows (and its gradient the rows' sums): both were left to
    ATen ('data-dependent indexing'), with the bucket arithmetic ('a constant only ATen ops read')."""
    w = torch.randn(5, 3, generator=torch.Generator().manual_seed(7))
    _lift_fx(_buckets_lookup, w)
    gy = torch.randn(4, 4, 3, generator=torch.Generator().manual_seed(8))

    def grad(gy: Any, w: Any) -> Any:
        from torch.func import vjp

        return vjp(_buckets_lookup, w)[1](gy)[0] * 1.0

    _lift_fx(grad, gy, w)


def test_weight_norm_lifts() -> None:
    """``nn.utils.parametrizations.weight_norm`` computes ``g v / |v|`` in every forward
    (``_weight_norm_interface``), which was left to ATen ('op not in the registry'): lifted, both its results equal
    to ATen's in float64."""
    v = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(9))
    g = torch.rand(4, 1, 1, generator=torch.Generator().manual_seed(10)) + 0.5
    _lift_fx(lambda v, g: [t * 1.0 for t in torch._weight_norm_interface(v, g, 0)], v, g)
