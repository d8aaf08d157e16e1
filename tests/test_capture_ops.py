"""Lifting of the ATen ops issue 20 left behind: each lifted graph is evaluated (float64) against ATen.

Cheap: no search, no kernels; ``make_fx`` traces the ATen ops, :func:`capture.lift` lifts them and the
reference interpreter runs the lifted ``vm.Graph``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

import verimirage as vm  # noqa: E402
from verimirage.integrations import capture  # noqa: E402
from verimirage.integrations.aten import Reason  # noqa: E402
from verimirage.integrations.report import PartitionReport  # noqa: E402

aten = torch.ops.aten


def _lift_and_compare(fn: Callable[..., Any], *xs: Any) -> capture.Lifted:
    gm = make_fx(fn, tracing_mode="fake")(*xs)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    lifted = capture.lift(nodes)
    named = {f"in{i}": xs[[n.name for n in gm.graph.nodes if n.op == "placeholder"].index(p.name)].double().numpy()
             for i, p in enumerate(lifted.inputs)}
    named.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(lifted.graph, named)
    want = fn(*(x.double() for x in xs))
    want = want if isinstance(want, (list, tuple)) else [want]
    for (kind, i, shape, _b), w in zip(lifted.out_map, want, strict=True):
        assert kind == "out"
        np.testing.assert_allclose(got[i].reshape(shape), w.numpy(), rtol=1e-12, atol=1e-12)
    return lifted


def _x(*shape: int, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def test_threshold_backward_is_grad_times_a_step_mask() -> None:
    y = torch.relu(_x(4, 6))  # zeros exactly where ReLU's gradient is 0
    lifted = _lift_and_compare(lambda g, y: aten.threshold_backward(g, y, 0.0), _x(4, 6, seed=1), y)
    assert "step" in {n.op for n in lifted.graph.nodes}


def test_threshold_backward_with_a_nonzero_threshold() -> None:
    _lift_and_compare(lambda g, x: aten.threshold_backward(g, x, 0.25), _x(3, 5, seed=2), _x(3, 5, seed=3))


@pytest.mark.parametrize("slope", [0.1, 0.0, 1.5])
def test_leaky_relu_backward(slope: float) -> None:
    _lift_and_compare(lambda g, x: aten.leaky_relu_backward(g, x, slope, False), _x(4, 6, seed=4), _x(4, 6, seed=5))


def test_new_zeros_and_full_are_constants() -> None:
    lifted = _lift_and_compare(lambda x: x + x.new_zeros((4, 6)) + torch.full((4, 6), 2.5), _x(4, 6))
    assert len(lifted.consts) == 2 and float(lifted.consts[1][1].flatten()[0]) == 2.5


@pytest.mark.parametrize("start,end", [(1, 3), (0, 2), (2, 5), (0, 5)])
def test_slice_backward_pads_with_zeros(start: int, end: int) -> None:
    _lift_and_compare(lambda g: aten.slice_backward(g * 2.0, [4, 5, 3], 1, start, end, 1), _x(4, end - start, 3))


def test_max_dim_values_lift_when_the_indices_are_unused() -> None:
    _lift_and_compare(lambda x: x - x.max(-1, keepdim=True).values, _x(3, 7))


def _lift_eval(fn: Callable[..., Any], *xs: Any) -> capture.Lifted:
    """Lift ``fn``'s ATen graph (integer operands included) and compare its float64 evaluation with ATen's."""
    gm = make_fx(fn, tracing_mode="fake")(*xs)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [xs[ph.index(p.name)].double() for p in lifted.inputs]
    named = {f"in{i}": (v.reshape(1) if v.dim() == 0 else v).numpy() for i, v in enumerate(vals)}  # rank 0: (1,)
    named.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(lifted.graph, named)
    want = fn(*(x.double() if x.is_floating_point() else x for x in xs))
    want = want if isinstance(want, (list, tuple)) else [want]
    for (kind, i, shape, _b), w in zip(lifted.out_map, want, strict=True):
        assert kind == "out"
        np.testing.assert_allclose(np.asarray(got[i]).reshape(shape), w.numpy(), rtol=1e-12, atol=1e-12)
    return lifted


_T = torch.tensor([0, 5, 2, -100, 5])  # a class twice, and one ignored row


@pytest.mark.parametrize("reduction", [0, 1, 2])
@pytest.mark.parametrize("ignore", [-100, 2])
def test_nll_loss_forward_lifts_through_a_class_mask(reduction: int, ignore: int) -> None:
    """``nll_loss_forward``: the loss (per row, summed or over the count of targets kept) and total_weight, from
    the integer targets read as float32 through an equality mask with the class numbers; a target equal to
    ``ignore_index`` (in range or not) counts nowhere."""
    t = torch.where(_T == -100, torch.tensor(ignore), _T)
    lifted = _lift_eval(lambda x, t: aten.nll_loss_forward(x, t, None, reduction, ignore), _x(5, 6).log_softmax(1),
                        t)
    assert lifted.int_inputs == frozenset({[p.name for p in lifted.inputs].index("t_1")})
    assert {"greater", "abs"} <= {n.op for n in lifted.graph.nodes}  # (the target's class picked by a select)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss_backward_lifts(reduction: int) -> None:
    x = _x(5, 6).log_softmax(1)
    _, tw = aten.nll_loss_forward(x, _T, None, reduction, -100)
    go = _x(5, seed=3) if reduction == 0 else torch.tensor(0.7)
    _lift_eval(lambda g, x, t, w: aten.nll_loss_backward(g, x, t, None, reduction, -100, w), go, x, _T, tw)


def test_gather_of_one_index_per_row_lifts() -> None:
    _lift_eval(lambda x, i: aten.gather(x, 1, i), _x(5, 6), torch.tensor([[0], [5], [2], [3], [5]]))


def test_integer_operands_lift_only_as_indices() -> None:
    """An integer tensor is a float32 input only where an index op reads it; any op making integers stays in ATen
    (``t + 1`` in float32 is not an integer op)."""
    gm = make_fx(lambda x, t: x * (t + 1), tracing_mode="fake")(_x(5), _T)
    with pytest.raises(capture.LiftError) as e:
        capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    assert e.value.reason is Reason.DTYPE


def test_max_dim_whose_indices_are_read_says_why() -> None:
    gm = make_fx(lambda x: x.max(-1)[1] + 0, tracing_mode="fake")(_x(3, 7))
    with pytest.raises(capture.LiftError) as e:
        capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    assert "first maximum" in e.value.message


@pytest.mark.parametrize("fn,word", [
    (lambda x, t: x.scatter(1, t, 1.0), "indices"),
])  # _safe_softmax lifts since 5b8abb1 (tests/test_capture.py)
def test_inexpressible_ops_fall_back_with_their_reason(fn: Callable[..., Any], word: str) -> None:
    x, t = _x(4, 6), torch.tensor([0, 5, 2, 1])
    gm = make_fx(fn, tracing_mode="fake")(x, t.view(4, 1) if "scatter" in word + str(fn.__code__.co_names) else t)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    with pytest.raises(capture.LiftError) as e:
        capture.lift(nodes)
    assert e.value.reason is Reason.INDEXED and word in e.value.message, e.value.message


def _masked(c: float, *, mask: bool = True) -> vm.Graph:
    g = vm.Graph()
    gr, x = g.input("g", (4, 8), vm.float32), g.input("x", (4, 8), vm.float32)
    g.output(g.apply("mul", [gr, g.apply("step", [x], {"c": c})], {}) if mask else g.apply("scale", [gr], {"c": 1.0}))
    return g


def test_verifier_proves_a_step_mask_equal_to_itself_only() -> None:
    """step is an uninterpreted function of its argument and threshold: sound, never confused with another."""
    assert isinstance(vm.verify(_masked(0.0), _masked(0.0)), vm.Proved)
    assert not isinstance(vm.verify(_masked(0.0), _masked(0.5)), vm.Proved)
    assert not isinstance(vm.verify(_masked(0.0), _masked(0.0, mask=False)), vm.Proved)


def test_mixed_dtype_elementwise_ops_promote_like_aten() -> None:
    """An fp16 weight times an fp32 activation (Inductor's decomposed fp16 LayerNorm) is an fp32 product."""
    w, x = _x(6).half(), _x(4, 6, seed=1)
    gm = make_fx(lambda x, w: x * w + w, tracing_mode="fake")(x, w)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    assert "cast" in {n.op for n in lifted.graph.nodes}
    order = [p.name for p in gm.graph.nodes if p.op == "placeholder"]
    named = {f"in{i}": (x, w)[order.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    (got,) = vm.evaluate(lifted.graph, named)
    np.testing.assert_allclose(got, (x.double() * w.double() + w.double()).numpy(), rtol=1e-12)


def test_a_constant_the_partition_passes_through_is_never_handed_out() -> None:
    """A custom op's results must not alias state: the runner's cached constant is copied, every call."""
    from verimirage.integrations.report import PartitionReport

    x = _x(4, 6)
    gm = make_fx(lambda x: (x * 2.0, x.new_zeros((4, 6))), tracing_mode="fake")(x)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    runner = capture.PartitionRunner(lifted, vm.compile(lifted.graph), gm, PartitionReport(0, 0, "inference", []))
    a, b = runner.kernels([x]), runner.kernels([x])
    held = {c.data_ptr() for c in runner.consts.values()}
    assert torch.equal(a[1], torch.zeros(4, 6)) and torch.equal(a[0], x * 2.0)
    assert a[1].data_ptr() not in held and b[1].data_ptr() not in held and a[1].data_ptr() != b[1].data_ptr()


def _masked_attention_inputs(dtype: Any = torch.float32) -> list[Any]:
    m = torch.zeros(1, 1, 8, 8)
    m[..., 2, :] = float("-inf")  # a padded query: every key masked
    m[..., 5, :4] = float("-inf")
    g = torch.Generator().manual_seed(0)
    return [*(torch.randn(1, 2, 8, 4, generator=g, dtype=dtype) for _ in range(4)), m.to(dtype)]


def _masked_attention(q: Any, k: Any, v: Any, do: Any, m: Any) -> Any:
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[:2]
    return (o, lse, *aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, False,
                                                                                attn_mask=m))


def test_fused_attention_with_a_tensor_mask_lifts_in_its_safe_form() -> None:
    """The red team's finding test_sdpa_with_a_row_masked_entirely_gave_nan: a query row masked entirely to -inf is
    0 in ATen's fused op, its saved log-sum-exp 0, its gradients 0; the lifted softmax gave NaN. The fused op with
    a tensor mask lifts again, its softmax and statistics in the safe form (clamped max and denominator, the
    log-sum-exp through ``step``) and its backward with the statistics clamped finite: every output, the masked
    rows included, equals ATen's (float64, exactly up to rounding)."""
    xs = _masked_attention_inputs()
    lifted = _lift_and_compare(_masked_attention, *xs)
    ops = {n.op for n in lifted.graph.nodes}
    assert {"clamp", "step"} <= ops
    o, lse, dq = _masked_attention(*(x.double() for x in xs))[:3]
    assert torch.all(o[0, :, 2] == 0) and torch.all(lse[0, :, 2] == 0) and torch.all(dq[0, :, 2] == 0)


def test_fused_attention_with_a_tensor_mask_backward_reads_infinite_statistics_safely() -> None:
    """A saved log-sum-exp of -inf for a fully masked row (what a lifted forward without the safe form saved) gives
    gradients of 0 there, not NaN: the backward clamps the statistics."""
    q, k, v, do, m = _masked_attention_inputs()

    def bw(q: Any, k: Any, v: Any, do: Any, m: Any, o: Any, lse: Any) -> Any:
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, o, lse, 0.0, False, attn_mask=m)

    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=m)[:2]
    lse_inf = lse.clone()
    lse_inf[0, :, 2] = float("-inf")
    gm = make_fx(bw)(q, k, v, do, m, o, lse_inf)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [q, k, v, do, m, o, lse_inf]
    feed = {f"in{i}": vals[names.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    got = vm.evaluate(lifted.graph, feed)
    want = bw(q, k, v, do, m, o, lse)  # ATen's own statistics (0 on the masked row)
    for (_, i, shape, _b), w in zip(lifted.out_map, want, strict=True):
        r = np.asarray(got[i]).reshape(shape)
        assert np.all(np.isfinite(r))
        np.testing.assert_allclose(r, w.double().numpy(), rtol=1e-5, atol=1e-6)


def test_fused_attention_with_a_tensor_mask_kernels_match_aten() -> None:
    """The lifted graph compiled as it is (one kernel per op, Triton's interpreter on a CPU) gives ATen's 0 on the
    fully masked row (the kernels' max, clamp, exp and division on -inf), forward and backward."""
    xs = _masked_attention_inputs()
    gm = make_fx(_masked_attention)(*xs)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    feed = {f"in{i}": xs[names.index(p.name)] for i, p in enumerate(lifted.inputs)}
    feed.update(dict(lifted.consts))
    res = vm.compile(lifted.graph)(**feed)
    res = res if isinstance(res, tuple) else (res,)
    want = _masked_attention(*(x.double() for x in xs))
    for (_, i, shape, _b), w in zip(lifted.out_map, want, strict=True):
        r = res[i].reshape(shape).double()
        assert torch.isfinite(r).all()
        torch.testing.assert_close(r, w, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- CUDA attention ops (fake CUDA tensors)


def _fake_cuda_graph(fn: Callable[..., Any], *shapes: tuple[tuple[int, ...], Any]) -> Any:
    """``fn`` traced on fake CUDA tensors (no GPU needed): the ATen graph a GPU trace gives, values in meta only."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        xs = [torch.empty(s, device="cuda", dtype=dt) for s, dt in shapes]
        return make_fx(fn)(*xs)


def _attention64(q: Any, k: Any, v: Any, m: Any, causal: bool) -> tuple[Any, Any]:
    """Output and log-sum-exp of attention by ATen's fused CPU op (float64: 0 on a row masked entirely, in the
    output, the statistics and the gradients)."""
    o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m)[:2]
    return o, lse


def _eval_lifted(gm: Any, vals: dict[str, Any]) -> tuple[capture.Lifted, list[Any]]:
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    feed = {f"in{i}": vals[p.name].detach().double().numpy() for i, p in enumerate(lifted.inputs)}
    feed.update({name: c.double().numpy() for name, c in lifted.consts})
    got = vm.evaluate(lifted.graph, feed)
    return lifted, [torch.as_tensor(np.asarray(got[i])).reshape(shape) for _, i, shape, _b in lifted.out_map]


@pytest.mark.parametrize("op", ["flash", "efficient"])
def test_cuda_attention_forward_and_backward_lift(op: str) -> None:
    """``_scaled_dot_product_flash_attention`` / ``_efficient_attention`` and their backwards (what a training step
    traced on a GPU holds) lift: output and log-sum-exp (the efficient op's with 32 rows: not padded) and the three
    gradients (read from the saved statistics) equal the float64 attention and its autograd gradients."""
    B, H, L, D = 1, 2, 32, 16
    dt = torch.float16 if op == "flash" else torch.float32
    qkv = [((B, H, L, D), dt)] * 3
    causal = op == "flash"
    if op == "flash":
        fwd = _fake_cuda_graph(lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[:2],
                               *qkv)
        bwd = _fake_cuda_graph(lambda do, q, k, v, o, lse, s0, s1: aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, o, lse, None, None, L, L, 0.0, True, s0, s1), *qkv, *qkv[:2], ((B, H, L), torch.float32),
            ((2,), torch.uint64), ((), torch.uint64))
    else:
        mshape = ((B, 1, L, L), dt)
        fwd = _fake_cuda_graph(lambda q, k, v, m: aten._scaled_dot_product_efficient_attention(q, k, v, m, True)[:2],
                               *qkv, mshape)
        bwd = _fake_cuda_graph(
            lambda do, q, k, v, m, o, lse, s0, s1: aten._scaled_dot_product_efficient_attention_backward(
                do, q, k, v, m, o, lse, s0, s1, 0.0, [True, True, True, False]),
            *qkv, *qkv[:1], mshape, qkv[0], ((B, H, L), torch.float32), ((), torch.int64), ((), torch.int64))
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    m = None
    if op == "efficient":
        m = torch.zeros(B, 1, L, L, dtype=torch.float64)
        m[..., 3, :] = float("-inf")  # a padded query
        m[..., 7, 5:] = float("-inf")
    o, lse = _attention64(q, k, v, m, causal)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    ph = [n.name for n in fwd.graph.nodes if n.op == "placeholder"]
    _, (go, glse) = _eval_lifted(fwd, dict(zip(ph, [q, k, v, m], strict=False)))
    tol = {"rtol": 1e-2, "atol": 1e-2} if dt == torch.float16 else {"rtol": 1e-6, "atol": 1e-7}
    if m is not None:
        assert torch.all(go[0, :, 3] == 0) and torch.all(glse[0, :, 3] == 0)  # the fully masked row
    torch.testing.assert_close(go, o.detach(), **tol)
    torch.testing.assert_close(glse, lse.detach(), **tol)
    ph = [n.name for n in bwd.graph.nodes if n.op == "placeholder"]
    vals = [do, q, k, v, o.detach(), lse.detach()]
    if op == "efficient":
        vals.insert(4, m)
    _, grads = _eval_lifted(bwd, dict(zip(ph, vals, strict=False)))
    for a, b in zip(grads, (dq, dk, dv), strict=True):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, **tol)


def test_cuda_efficient_attention_backward_reads_padded_statistics() -> None:
    """The memory-efficient op saves its log-sum-exp padded to a multiple of 32 rows (+inf beyond the queries): its
    backward lifts, reading the first rows (a slice); its forward's padded statistics are not lifted (the op with
    them stays in ATen, the op without them lifts)."""
    B, H, L, D = 1, 2, 8, 16
    qkv = [((B, H, L, D), torch.float32)] * 3
    bwd = _fake_cuda_graph(
        lambda do, q, k, v, o, lse, s0, s1: aten._scaled_dot_product_efficient_attention_backward(
            do, q, k, v, None, o, lse, s0, s1, 0.0, [True, True, True, False]),
        *qkv, qkv[0], qkv[0], ((B, H, 32), torch.float32), ((), torch.int64), ((), torch.int64))
    g = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    o, lse = _attention64(q, k, v, None, False)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    padded = torch.cat([lse.detach(), torch.full((B, H, 32 - L), float("inf"), dtype=torch.float64)], -1)
    ph = [n.name for n in bwd.graph.nodes if n.op == "placeholder"]
    lifted, grads = _eval_lifted(bwd, dict(zip(ph, [do, q, k, v, o.detach(), padded], strict=False)))
    assert "slice" in {n.op for n in lifted.graph.nodes}
    for a, b in zip(grads, (dq, dk, dv), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    fwd = _fake_cuda_graph(lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[:2],
                           *qkv)
    with pytest.raises(capture.LiftError, match="not lifted"):
        capture.lift([n for n in fwd.graph.nodes if n.op == "call_function"])
    fwd0 = _fake_cuda_graph(lambda q, k, v: aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[0],
                            *qkv)
    capture.lift([n for n in fwd0.graph.nodes if n.op == "call_function"])


def test_cuda_attention_state_of_a_training_forward_is_not_a_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step's forward graph on a GPU saves the flash op's random-number state for the backward; with no
    dropout nothing reads it, so each read gets a tensor of its own (``empty_strided``, not counted as compute) and
    the attention is taken with the ops around it; the report lists no compute op left behind."""
    from verimirage.integrations.report import Report

    B, H, L, D = 1, 2, 16, 16

    def fwd(q: Any, k: Any, v: Any) -> Any:
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)
        return r[0] * 2.0, r[0], r[1], r[6], r[7]

    gm = _fake_cuda_graph(fwd, *[((B, H, L, D), torch.float16)] * 3)
    monkeypatch.setattr(vm, "superoptimize", lambda g, **kw: _found(g))
    rep = Report()
    runners = capture.transform(gm, capture.CaptureOptions(check=False, profile=False), rep, "forward")
    assert len(runners) == 1 and rep.partitions[0].taken
    ops = [capture.op_name(n) for n in gm.graph.nodes if n.op == "call_function"]
    assert "_scaled_dot_product_flash_attention" not in ops and ops.count("empty_strided") == 2
    assert rep.counts == (2, 2) and not rep.left  # the attention and the mul; the allocations are not compute
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert [capture.op_name(a) for a in out[3:]] == ["empty_strided"] * 2
    assert out[3].meta["val"].dtype == torch.uint64 and tuple(out[3].meta["val"].shape) == (2,)


def _found(g: Any) -> Any:
    import types

    return types.SimpleNamespace(candidates=[g], best=g, report=types.SimpleNamespace(
        stop_reason="test", split=False, regions=[]))


def _math_attention64(q: Any, k: Any, v: Any, m: Any) -> Any:
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + m
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_cuda_efficient_attention_backward_gives_the_masks_gradient() -> None:
    """With the mask's gradient asked for (a mask that requires grad: the corpus's training steps make every float
    input require grad), the memory-efficient backward's fourth result is dS reduced over the dims the mask is
    broadcast along; it lifts and equals autograd's gradient of the float64 attention."""
    B, H, L, D = 2, 2, 32, 16
    qkv = [((B, H, L, D), torch.float32)] * 3
    mshape = (B, 1, 1, L)  # a padding mask, broadcast over heads and queries
    bwd = _fake_cuda_graph(
        lambda do, q, k, v, m, o, lse, s0, s1: aten._scaled_dot_product_efficient_attention_backward(
            do, q, k, v, m, o, lse, s0, s1, 0.0, [True, True, True, True]),
        *qkv, qkv[0], (mshape, torch.float32), qkv[0], ((B, H, L), torch.float32), ((), torch.int64),
        ((), torch.int64))
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    m = torch.randn(mshape, generator=g, dtype=torch.float64)
    m[..., 20:] = -1e4
    m.requires_grad_()
    o, lse = _math_attention64(q, k, v, m)
    grads = torch.autograd.grad(o, (q, k, v, m), do)
    ph = [n.name for n in bwd.graph.nodes if n.op == "placeholder"]
    _, got = _eval_lifted(bwd, dict(zip(ph, [do, q, k, v, m, o, lse], strict=False)))
    assert len(got) == 4
    for a, b in zip(got, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_cuda_cudnn_attention_forward_and_backward_lift() -> None:
    """cuDNN's attention (what SDPA may pick on an H100) keeps its statistics' reduced dim, (B, H, L, 1): its forward
    gives them, its backward reads them; both equal the float64 attention (and its autograd gradients)."""
    B, H, L, D = 1, 2, 16, 16
    qkv = [((B, H, L, D), torch.float16)] * 3
    fwd = _fake_cuda_graph(lambda q, k, v: aten._scaled_dot_product_cudnn_attention(q, k, v, None, True)[:2], *qkv)
    bwd = _fake_cuda_graph(
        lambda do, q, k, v, o, lse, s0, s1: aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, o, lse, s0, s1, None, None, None, L, L, 0.0, False),
        *qkv, qkv[0], qkv[0], ((B, H, L, 1), torch.float32), ((), torch.int64), ((), torch.int64))
    g = torch.Generator().manual_seed(6)
    q, k, v, do = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    o, lse = _math_attention64(q, k, v, torch.zeros(L, L, dtype=torch.float64))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    ph = [n.name for n in fwd.graph.nodes if n.op == "placeholder"]
    _, (go, glse) = _eval_lifted(fwd, dict(zip(ph, [q, k, v], strict=True)))
    torch.testing.assert_close(go, o.detach(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(glse, lse.detach().unsqueeze(-1), rtol=1e-2, atol=1e-2)
    ph = [n.name for n in bwd.graph.nodes if n.op == "placeholder"]
    _, grads = _eval_lifted(bwd, dict(zip(ph, [do, q, k, v, o.detach(), lse.detach().unsqueeze(-1)], strict=False)))
    for a, b in zip(grads, (dq, dk, dv), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


def test_a_rank0_tensor_input_lifts_as_one_element() -> None:
    """Inductor writes ReLU's gradient as ``where(x <= 0, full([], 0.0), grad)``: a ``where`` whose branch is a
    rank-0 tensor made outside the partition could not lift ("rank-0 tensors are not supported"), so on the GPU path
    every ReLU backward stayed in ATen. A rank-0 input is now a (1,) input standing for shape (); the kernels get it
    reshaped, and the values equal ATen's."""
    def f(m: Any, z: Any, g: Any) -> Any:
        return aten.where.self(m, z, g) * 2.0

    m = _x(4, 6, seed=8) > 0
    z, g = torch.tensor(0.25), _x(4, 6, seed=9)
    gm = make_fx(f)(m, z, g)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    assert [tuple(t.shape) for t in lifted.graph.inputs if t.name == "in1"] == [(1,)]
    runner = capture.PartitionRunner(lifted, vm.compile(lifted.graph), capture.eager_module(gm, lifted),
                                     PartitionReport(0, 0, "inference", ["where", "mul"]))
    (got,) = runner.kernels([m, z, g])
    torch.testing.assert_close(got, f(m, z, g))


def test_unread_tensor_arguments_reach_the_partitions_aten_ops() -> None:
    """Finding (H100 run, session 9: ``KeyError: getitem_6``, the whole backward graph of sdpa_causal / sdpa_mask
    training sent to the fallback): the flash backward's RNG state (philox seed and offset, tensors its lifting
    does not read) was not an input of the partition, so building the partition's ATen module (the numeric check,
    the fallback) failed. Such arguments are now the partition's extra inputs, handed to its ATen ops only."""
    B, H, L, D = 1, 2, 32, 16
    qkv = [((B, H, L, D), torch.float16)] * 3
    bwd = _fake_cuda_graph(lambda do, q, k, v, o, lse, s0, s1: aten._scaled_dot_product_flash_attention_backward(
        do, q, k, v, o, lse, None, None, L, L, 0.0, True, s0, s1), *qkv, *qkv[:2], ((B, H, L), torch.float32),
        ((2,), torch.uint64), ((), torch.uint64))
    lifted = capture.lift([n for n in bwd.graph.nodes if n.op == "call_function"])
    ph = [n.name for n in bwd.graph.nodes if n.op == "placeholder"]
    assert [n.name for n in lifted.extra] == ph[-2:]  # the seed and the offset
    m = capture.eager_module(bwd, lifted)
    assert len([n for n in m.graph.nodes if n.op == "placeholder"]) == len(lifted.inputs) + 2
