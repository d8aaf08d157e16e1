"""Red team (eleventh session): the lows the tenth session left open, each with its regression test.

Lifted ATen ops against ATen itself (its NaN / inf pattern and its errors), and the codegen's fp32 lowerings against
float64."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import verimirage as vm  # noqa: E402
from verimirage.integrations import capture  # noqa: E402
from verimirage.integrations.report import PartitionReport  # noqa: E402

# --------------------------------------------------------------------------- SDPA with +inf in its mask


def _sdpa_mask(kind: str) -> torch.Tensor:
    m = torch.zeros(1, 1, 4, 4)
    if kind == "pinf":
        m[..., 1, 2] = float("inf")
    elif kind == "pinf_row":
        m[..., 1, :] = float("inf")
    elif kind == "ninf_row":
        m[..., 1, :] = float("-inf")
    elif kind == "nan":
        m[..., 1, 2] = float("nan")
    elif kind == "mix":
        m[..., 1, 2] = float("inf")
        m[..., 2, :] = float("-inf")
        m[..., 3, 0] = float("nan")
    elif kind == "big":
        m[..., 1, 2] = 3e38
    return m


def _sdpa_lifted(kind: str) -> tuple[Any, list[torch.Tensor], Any]:
    from torch.fx.experimental.proxy_tensor import make_fx

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 2, 4, 4, generator=g) for _ in range(3)] + [_sdpa_mask(kind)]

    def f(q: Any, k: Any, v: Any, m: Any) -> Any:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)

    gm = make_fx(f)(*xs)
    fused = [n for n in gm.graph.nodes if capture.op_name(n).startswith("_scaled_dot_product")]
    lifted = capture.lift([fused[0], *[u for u in fused[0].users if capture.op_name(u) == "getitem"]])
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    args = [xs[names.index(p.name)] for p in lifted.inputs]
    return lifted, args, f(*xs)


def _same_pattern(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN pattern")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"{what}: inf pattern")
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-4, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("kind", ["finite", "pinf", "pinf_row", "ninf_row", "nan", "mix", "big"])
def test_sdpa_with_a_plus_inf_in_its_mask_gave_inf_where_aten_gives_nan(kind: str) -> None:
    """Finding (tenth session, low): with a +inf in the additive mask of the fused attention, ATen's output row and
    its log-sum-exp are NaN (``exp(inf - inf)``); the lifted safe softmax clamped the row max and the denominator
    to the finite range and gave +-inf (output) and 3.4e38 (statistics). The denominator is now
    ``clamp(t, 1, max) + 0 * t``: NaN where ``t`` is infinite, unchanged elsewhere. -inf rows (ATen: 0), NaN and
    finite masks kept what they gave."""
    lifted, args, want = _sdpa_lifted(kind)
    got = vm.evaluate(lifted.graph, {f"in{i}": a.numpy() for i, a in enumerate(args)})
    for j, (_, i, shape, _b) in enumerate(lifted.out_map):
        _same_pattern(np.asarray(got[i]).reshape(shape), want[j].numpy(), f"{kind}: result {j}")


def test_sdpa_with_a_plus_inf_in_its_mask_compiled_kernels() -> None:
    """The same through the generated kernels (fp32, Triton's interpreter): NaN where ATen has NaN, ATen's 0 on a
    row masked entirely to -inf, ATen's values elsewhere."""
    lifted, args, want = _sdpa_lifted("mix")
    outs = vm.compile(lifted.graph)(*args)
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for j, (_, i, shape, _b) in enumerate(lifted.out_map):
        _same_pattern(np.asarray(outs[i]).reshape(shape), want[j].numpy(), f"kernels: result {j}")


# --------------------------------------------------------------------------- nll_loss / gather index range


def _runner(fn: Any, *xs: Any) -> tuple[capture.PartitionRunner, list[Any]]:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*xs)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    args = [xs[ph.index(p.name)] for p in lifted.inputs]
    return capture.PartitionRunner(lifted, None, gm, PartitionReport(0, 0, "inference", [])), args


_ATEN = torch.ops.aten
_X = torch.randn(4, 5, generator=torch.Generator().manual_seed(0)).log_softmax(1)
_CASES: dict[str, tuple[Any, int, int | None]] = {  # fn(x, index), classes, ignore
    "nll_loss_forward": (lambda x, t: _ATEN.nll_loss_forward(x, t, None, 1, -100), 5, -100),
    "nll_loss_forward_ignore_3": (lambda x, t: _ATEN.nll_loss_forward(x, t, None, 0, 3), 5, 3),
    "nll_loss_backward": (lambda x, t: _ATEN.nll_loss_backward(torch.ones(()), x, t, None, 2, -100,
                                                               torch.ones(())), 5, -100),
    "gather": (lambda x, i: _ATEN.gather(x, 1, i), 5, None),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_nll_loss_with_a_target_out_of_range_returned_a_value(case: str) -> None:
    """Finding (tenth session, low: a value where ATen raises): the lifted nll_loss (and gather, its backward) read
    the target through a one-hot mask, which matches no class for a target outside ``[0, classes)``: the loss
    was silently 0 for that row (``cross_entropy(logits, t)`` with t = 5 of 5 classes returned a number through
    the backend; eager raises ``IndexError: Target 5 is out of bounds``). The lifted partition now records each
    index input's bounds (``Lifted.index_bounds``) and its runner checks them on entry (CPU: IndexError; GPU: a
    device-side assert, as ATen's CUDA kernels)."""
    fn, classes, ignore = _CASES[case]

    def index(t: list[int]) -> torch.Tensor:
        return torch.tensor(t).reshape(4, 1) if case == "gather" else torch.tensor(t)

    runner, args = _runner(fn, _X, index([0, 4, 1, 2]))
    pos = [i for i, _, _ in runner.lifted.index_bounds]
    assert runner.lifted.index_bounds and set(pos) == set(runner.lifted.int_inputs)
    assert {(c, ig) for _, c, ig in runner.lifted.index_bounds} == {(classes, ignore)}
    i = pos[0]
    for t in ([0, 4, 1, 2], [0, ignore if ignore is not None else 0, 1, 2]):
        args[i] = index(t)
        runner.check_indices(args)  # in range (or the ignore_index): no error
    for t in ([0, 5, 1, 2], [0, -1, 1, 2], [0, 1, 2, 99]):
        args[i] = index(t)
        with pytest.raises(IndexError, match="out of bounds"):
            runner.check_indices(args)
        with pytest.raises((IndexError, RuntimeError)):  # ATen agrees
            fn(_X, index(t))


@pytest.mark.slow
def test_nll_loss_with_a_target_out_of_range_through_the_backend() -> None:
    """End to end: ``cross_entropy`` compiled with the verimirage backend (its partition taken: linear,
    log_softmax, nll_loss) raises for a target of 5 of 5 classes, as eager does; an ignored target is fine."""
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 5)

        def forward(self, x: Any, t: Any) -> Any:
            return torch.nn.functional.cross_entropy(self.lin(x), t)

    torch.manual_seed(0)
    rep, m = Report(), M()
    torch._dynamo.reset()
    cm = torch.compile(m, backend=backend(report=rep, time_budget_s=5.0, fallback="eager", candidates=1))
    x = torch.randn(4, 8)
    with torch.no_grad():
        for t in ([0, 4, 1, 2], [0, -100, 1, 2]):
            torch.testing.assert_close(cm(x, torch.tensor(t)), m(x, torch.tensor(t)))
        assert rep.partitions and all(p.taken for p in rep.partitions), rep.summary()
        with pytest.raises(IndexError, match="out of bounds"):
            cm(x, torch.tensor([0, 5, 1, 2]))
