"""Red team of the torch.compile backend (issue 20): idiomatic-but-tricky modules through
``torch.compile(model, backend=...)`` against eager PyTorch (float64 where the module allows it).

The rule: the backend never turns a working model into an exception, never returns wrong values (NaN where eager
has numbers included), never loses ``requires_grad``, never drops a side effect (input and buffer mutations,
outputs that alias each other). Each finding has a regression test named after it; cheap attacks that held stay
as tests too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import verimirage as vm  # noqa: E402
from verimirage.integrations import capture  # noqa: E402
from verimirage.integrations.dynamo import backend  # noqa: E402
from verimirage.integrations.report import Report  # noqa: E402

OPTS: dict[str, Any] = {"time_budget_s": 5.0, "fallback": "eager", "candidates": 1}
TOL = {torch.float32: 1e-4, torch.float64: 1e-9, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def _flat(o: Any) -> list[Any]:
    if isinstance(o, torch.Tensor):
        return [o]
    if isinstance(o, (list, tuple)):
        return [t for x in o for t in _flat(x)]
    return []


def _same(got: Any, want: Any, what: str) -> None:
    """``got`` equals ``want`` (the eager value, float64 where it could be) within ``got``'s dtype tolerance, with
    NaN and inf at the same places."""
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} vs {tuple(want.shape)}"
    g, w = got.detach().double(), want.detach().double()
    np.testing.assert_array_equal(torch.isnan(g).numpy(), torch.isnan(w).numpy(), err_msg=f"{what}: NaN pattern")
    np.testing.assert_array_equal(torch.isinf(g).numpy(), torch.isinf(w).numpy(), err_msg=f"{what}: inf pattern")
    fin = torch.isfinite(w)
    if bool(fin.any()):
        scale = max(1.0, float(w[fin].abs().max()))
        tol = TOL.get(got.dtype, 1e-4) * scale
        assert float((g[fin] - w[fin]).abs().max()) <= tol, f"{what}: values differ"


def _compiled(model: Any, **opts: Any) -> tuple[Any, Report]:
    rep = Report()
    torch._dynamo.reset()
    return torch.compile(model, backend=backend(report=rep, **{**OPTS, **opts})), rep


def _attack(make: Callable[[], Any], inputs: Callable[[], list[Any]], *, train: bool,
            ref64: bool = True) -> Report:
    """Run ``make()`` compiled and eagerly (float64 when ``ref64``) on the same ``inputs()``; compare outputs,
    ``requires_grad``, the inputs and buffers after the call, and (``train``) every gradient."""
    torch.manual_seed(0)
    model = make()
    ref = copy.deepcopy(model)
    if ref64:
        ref = ref.double()
    cm, rep = _compiled(model)
    xs = inputs()
    xr = [x.detach().clone().double() if ref64 and isinstance(x, torch.Tensor) and x.is_floating_point() else
          x.detach().clone() if isinstance(x, torch.Tensor) else x for x in xs]
    if train:
        xs = [x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        xr = [x.requires_grad_() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xr]
        out, want = cm(*xs), ref(*xr)
    else:
        with torch.no_grad():
            out, want = cm(*xs), ref(*xr)
    fo, fw = _flat(out), _flat(want)
    assert len(fo) == len(fw)
    for i, (a, b) in enumerate(zip(fo, fw, strict=True)):
        _same(a, b, f"output {i}")
        assert a.requires_grad == b.requires_grad, f"output {i}: requires_grad {a.requires_grad}"
    for i, (a, b) in enumerate(zip(xs, xr, strict=True)):
        if isinstance(a, torch.Tensor):
            _same(a, b, f"input {i} after the call")
    for (k, a), (_, b) in zip(model.named_buffers(), ref.named_buffers(), strict=True):
        _same(a, b, f"buffer {k}")
    if train:
        g = torch.Generator().manual_seed(3)
        ws = [torch.rand(t.shape, generator=g, dtype=torch.float64) for t in fo]
        sum((t.double() * w).sum() for t, w in zip(fo, ws, strict=True) if t.requires_grad).backward()
        sum((t * w).sum() for t, w in zip(fw, ws, strict=True) if t.requires_grad).backward()
        for (k, a), (_, b) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
            assert (a.grad is None) == (b.grad is None), k
            if a.grad is not None:
                _same(a.grad, b.grad, f"gradient of {k}")
        for i, (a, b) in enumerate(zip(xs, xr, strict=True)):
            if isinstance(a, torch.Tensor) and a.requires_grad:
                _same(a.grad, b.grad, f"gradient of input {i}")
    return rep


def _feed(gm: Any, lifted: Any, *args: Any) -> dict[str, Any]:
    """The lifted partition's inputs (``in{i}`` and its constants) from a run of ``gm`` on ``args``."""
    vals: dict[Any, Any] = {}

    class Rec(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            vals[n] = super().run_node(n)
            return vals[n]

    Rec(gm).run(*args)
    feed = {f"in{i}": vals[n].numpy() for i, n in enumerate(lifted.inputs)}
    feed.update({k: c.numpy() for k, c in lifted.consts})
    return feed


def _left_ops_say_why(rep: Report) -> None:
    kinds = tuple(r.value for r in capture.Reason)
    for r in rep.left:
        assert (rep.reason_of(r) or "").startswith(kinds), (r.op, rep.reason_of(r))


# --------------------------------------------------------------------------- findings


@pytest.mark.slow
def test_where_leaked_nan_from_the_branch_not_taken() -> None:
    """Finding (high, wrong values): ``torch.where(x > 0, torch.sqrt(x), 0)`` came back with NaN wherever
    ``x < 0``: the comparison was lifted as a 0/1 float and the where as ``m * a + (1 - m) * b``, and
    ``0 * nan`` is NaN (the capture's check runs on inputs in [0.5, 1.5), where nothing is masked). Now the
    registry's ``where`` reads booleans: ATen's, or (since the sixteenth session) the registry's ``greater``."""

    class M(nn.Module):
        def forward(self, x: Any) -> Any:
            safe = torch.where(x > 0, torch.sqrt(x), torch.zeros_like(x)) * 2.0
            capped = torch.where(x < 80.0, torch.exp(x), 0.0)  # exp overflows where it is not taken
            return safe, capped, torch.where(x > 0, x, 0.1 * x)

    x = torch.tensor([[1.0, -2.0, 100.0, 0.0, -0.5, 90.0, 3.0, -7.0]]).repeat(4, 1)
    rep = _attack(M, lambda: [x.clone()], train=False)
    _left_ops_say_why(rep)


def test_where_of_a_lifted_comparison_blames_the_comparison() -> None:
    """A ``where`` of a comparison made in the partition reads the registry's boolean ``greater`` (a select, in
    every domain a branch or the other), never the 0/1 float mask: inf in the branch not taken stays out (since the
    sixteenth session the comparison lifts with it; before, it was left to ATen)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, y: torch.where(x > 0.5, y, 2.0) * 3.0)(torch.randn(3, 4), torch.randn(3, 4))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    lifted = capture.lift(nodes)
    ops = [n.op for n in lifted.graph.nodes]
    assert "greater" in ops and "where" in ops
    x, y = torch.randn(3, 4), torch.tensor(float("inf")).repeat(3, 4)
    (got,) = vm.evaluate(lifted.graph, _feed(gm, lifted, x, y))
    np.testing.assert_array_equal(np.asarray(got), torch.where(x > 0.5, y, 2.0).numpy() * 3.0)


def test_threshold_backward_gave_nan_gradients_where_relu_masks_an_inf() -> None:
    """Finding (high, wrong gradients): ``threshold_backward(grad, x, 0)`` was lifted as ``grad * step(x)``; the
    gradient of ``sqrt(relu(x))`` is inf where ``relu(x) = 0``, which ATen masks to 0 and the product made NaN,
    so every weight gradient of the layer before was NaN. The capture now writes it ``where(x <= 0, 0, grad)``
    (its definition), whose where reads a boolean mask, never a 0/1 float (fast, lift-level check)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(gr: Any, x: Any) -> Any:
        return torch.ops.aten.threshold_backward.default(gr, x, 0) * 2.0

    gr = torch.tensor([[float("inf"), 1.0, float("nan"), -3.0]])
    x = torch.tensor([[-1.0, 2.0, 0.0, 5.0]])
    gm = make_fx(f, tracing_mode="fake")(gr, x)
    assert capture._mask_threshold_backward(gm) == 1
    gm.recompile()
    assert not any(capture.op_name(n) == "threshold_backward" for n in gm.graph.nodes)
    np.testing.assert_array_equal(gm(gr, x).numpy(), f(gr, x).numpy())
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    lifted = capture.lift(nodes)  # the comparison too (a registry boolean, since the sixteenth session)
    (got,) = vm.evaluate(lifted.graph, _feed(gm, lifted, gr, x))
    np.testing.assert_array_equal(np.asarray(got), f(gr, x).numpy())  # 0 where ReLU masks inf and NaN


@pytest.mark.slow
def test_threshold_backward_nan_gradients_end_to_end() -> None:
    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return torch.sqrt(torch.relu(self.lin(x))).sum(-1)

    _attack(M, lambda: [torch.randn(4, 8, generator=torch.Generator().manual_seed(2))], train=True)


@pytest.mark.slow
def test_outputs_that_alias_each_other_lost_their_aliasing() -> None:
    """Finding (medium, dropped side effect): with grad off, ``y, y.t(), y.view(-1)`` came back as three
    separate tensors (eager, aot_eager and Inductor give views of one buffer): the partition held the views
    and its kernels' results alias nothing, so an in-place write to one output did not show in the others. A view
    of another result, of an intermediate another result views, or of an input now stays outside the partition."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            y = torch.tanh(self.lin(x))
            return y, y.t(), y.view(-1), x.t(), torch.exp(x)

    torch.manual_seed(0)
    m = M()
    cm, rep = _compiled(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        a, b, c, xt, e = cm(x)
        want = m(x)
    for i, (g, w) in enumerate(zip((a, b, c, xt, e), want, strict=True)):
        _same(g, w, f"output {i}")
    assert any(p.taken for p in rep.partitions), rep.summary()
    ptr = a.untyped_storage().data_ptr()
    assert b.untyped_storage().data_ptr() == ptr and c.untyped_storage().data_ptr() == ptr
    assert xt.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    b.mul_(0.0)  # the side effect eager has: every view of y sees it
    assert float(a.abs().max()) == 0.0 and float(c.abs().max()) == 0.0
    _left_ops_say_why(rep)


def test_view_results_of_one_intermediate_are_left_outside_the_partition() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (lambda y: (y.t(), y.view(-1)))(torch.exp(x)))(torch.randn(3, 4))
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    with pytest.raises(capture.LiftError) as e:
        capture.lift(nodes)
    assert e.value.alone and capture.op_name(e.value.node) in ("t", "view")
    capture._probe(nodes)  # not an error of the node alone: the partition is proposed again without the view
    gm = make_fx(lambda x: torch.exp(x).t())(torch.randn(3, 4))  # one view of an intermediate: kept inside
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    assert [capture.op_name(n) for n in lifted.outputs] == ["t"]


def test_explain_skipped_the_backward_of_a_model_returning_a_dict() -> None:
    """Finding (low, explain incomplete): ``vm.explain`` ran the backward only for a tensor or a list/tuple of
    tensors, so a model returning a dict (as Hugging Face-style models do) reported its forward graph alone."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            y = torch.tanh(self.lin(x))
            return {"y": y, "norm": (y * y).sum(-1)}

    rep = vm.explain(M(), torch.randn(4, 8), **OPTS)
    assert "backward" in rep.graphs, rep.graphs
    _left_ops_say_why(rep)


def test_one_sided_clamp_was_never_lifted() -> None:
    """Finding (coverage, no wrong value): ``x.clamp(min=eps)`` (one bound) emitted the registry's clamp with
    ``None`` for the other bound, which the graph builder refused, so every one-sided clamp was left behind. It
    lifts as maximum / minimum with a constant; infinite inputs stay infinite as in ATen."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any) -> Any:
        return x.clamp(min=0.1) * 2.0, torch.clamp(x, max=-0.2) + 1.0

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    x[0, 0], x[1, 1] = float("inf"), float("-inf")
    gm = make_fx(f)(x)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    got = vm.evaluate(lifted.graph, _feed(gm, lifted, x))
    for i, (a, b) in enumerate(zip(got, f(x), strict=True)):
        _same(torch.as_tensor(np.asarray(a)).float(), b, f"output {i}")  # inf where ATen has inf


def _masked_rows() -> list[Any]:
    m = torch.zeros(1, 1, 8, 8)
    m[..., 2, :] = float("-inf")  # a padded query: every key masked
    m[..., 5, :4] = float("-inf")
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 8, 4, generator=g), torch.randn(1, 2, 8, 4, generator=g),
            torch.randn(1, 2, 8, 4, generator=g), m]


class _SDPA(nn.Module):
    def forward(self, q: Any, k: Any, v: Any, m: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m) * 1.0


@pytest.mark.slow
def test_sdpa_with_a_row_masked_entirely_gave_nan() -> None:
    """Finding (high, wrong values and gradients): ``F.scaled_dot_product_attention(q, k, v, attn_mask=m)`` with a
    row of ``m`` all -inf (a padded query) is 0 in ATen's fused CPU op and in its gradients; the lifted
    matmul/softmax/matmul gave NaN there, and the backward (``exp(S - lse)``) NaN in every gradient of K and V.
    The fused op with a tensor mask stayed in ATen (040f82a); it lifts again in the safe form (clamped max and
    denominator, statistics 0 on such a row, the backward's statistics clamped finite: issue 20, capture)."""
    for train in (False, True):
        _left_ops_say_why(_attack(_SDPA, _masked_rows, train=train))


def test_fused_attention_with_a_tensor_mask_lifts_to_atens_zeros() -> None:
    """The fused op with a tensor mask lifts (its safe form); on the fully masked row it gives ATen's 0, not NaN
    (tests/test_capture_ops.py checks the statistics, the backward and the kernels)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    xs = _masked_rows()
    gm = make_fx(lambda q, k, v, m: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))(*xs)
    fused = [n for n in gm.graph.nodes if capture.op_name(n).startswith("_scaled_dot_product")]
    assert fused, "expected ATen's fused attention op"
    lifted = capture.lift([fused[0], *[u for u in fused[0].users if capture.op_name(u) == "getitem"]])
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    feed = {f"in{i}": xs[names.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    (_, i, shape, _b) = lifted.out_map[0]
    got = np.asarray(vm.evaluate(lifted.graph, feed)[i]).reshape(shape)
    assert np.all(np.isfinite(got)) and np.all(got[0, :, 2] == 0)
    want = torch.nn.functional.scaled_dot_product_attention(*(x.double() for x in xs))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12)


def test_max_reduction_dropped_nan() -> None:
    """Finding (medium; backend codegen, outside the capture): ``x.amax(-1)`` of a row holding a NaN is NaN in ATen;
    the kernels' ``tl.max`` reduction returned the row's largest number (Triton's interpreter, CPU), and on a GPU
    ``tl.maximum`` (relu, maximum, clamp, the online softmax's running max) drops NaN by default (PTX ``max.f32``).
    The generated modules now reduce with NaN-propagating combines and pass ``propagate_nan=ALL`` elementwise."""
    from verimirage.ir.dtypes import DType
    from verimirage.ir.graph import Graph

    g = Graph()
    x = g.input("x", (4, 8), DType.float32)
    y = g.input("y", (4, 8), DType.float32)
    g.output(g.max(x, 1))
    g.output(g.min(x, 1))
    g.output(g.maximum(g.relu(x), y))
    prog = vm.compile(g)
    xs = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    ys = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    xs[0, 1] = float("nan")
    got = prog(x=xs, y=ys)
    _same(got[0], xs.amax(1, keepdim=True), "amax with a NaN")
    _same(got[1], xs.amin(1, keepdim=True), "amin with a NaN")
    _same(got[2], torch.maximum(torch.relu(xs), ys), "maximum(relu(x), y) with a NaN")
    assert torch.isnan(got[0][0, 0]) and torch.isnan(got[1][0, 0]) and torch.isnan(got[2][0, 1])
    assert "tl.max(" not in prog.source and "tl.min(" not in prog.source and "_max_nan" in prog.source


class _Causal(nn.Module):
    def forward(self, q: Any, k: Any, v: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0) * 1.0


def _causal_inputs(dt: Any, big: float) -> list[Any]:
    """(B, H, L, D) = (1, 1, 4, 8): row 0's kept score is ``-big / 6``, its masked score (column 1) ``big``."""
    q, k = torch.zeros(1, 1, 4, 8, dtype=dt), torch.zeros(1, 1, 4, 8, dtype=dt)
    q[0, 0, 0, 0], k[0, 0, 0, 0], k[0, 0, 1, 0] = 1.0, -big / 6, big
    return [q, k, torch.arange(32.0).reshape(1, 1, 4, 8).to(dt)]


@pytest.mark.slow
@pytest.mark.parametrize("dt, big", [("float16", 6e4), ("float32", 3e38)])
def test_causal_attention_attended_to_masked_positions(dt: str, big: float) -> None:
    """Finding (medium, wrong values: a query read future positions): the lifted fused SDPA with ``is_causal``
    added ``finfo.min`` to the masked scores (ATen: -inf), so a masked score above a kept one by more than
    ``|finfo.min|`` (fp16: 6e4 against -1e4, reachable with ``scale=1.0`` or large activations) won the row's
    softmax: row 0 of the output was ``v[1]`` where ATen gives ``v[0]``. The masked scores are now ``finfo.min``
    itself (``where(tril, s, finfo.min)``: finite, so a fully masked tile of an online softmax stays NaN-free)."""
    xs = _causal_inputs(getattr(torch, dt), big)
    cm, rep = _compiled(_Causal())
    with torch.no_grad():
        got, want = cm(*xs), _Causal()(*xs)
    assert rep.partitions and all(p.taken for p in rep.partitions), rep.summary()
    _same(got, want, "causal attention")
    assert torch.equal(got[0, 0, 0], xs[2][0, 0, 0])  # (row 0 sees column 0 alone)


# --------------------------------------------------------------------------- attacks that held (slow: one compile each)


def _lin() -> Any:
    return nn.Linear(8, 8)


class _Inplace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = _lin()

    def forward(self, x: Any) -> Any:
        y = self.lin(x)
        y.add_(1.0)
        y.mul_(2.0)
        y = y.relu_()
        return y.masked_fill(y > 3.0, 0.5)


class _BatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn, self.lin = nn.BatchNorm1d(8), _lin()

    def forward(self, x: Any) -> Any:
        return torch.relu(self.lin(self.bn(x)))


class _KVCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 16, 8))
        self.register_buffer("v", torch.zeros(2, 16, 8))
        self.lin = _lin()

    def forward(self, x: Any) -> Any:
        k = self.lin(x) * 2.0
        self.k[:, 3:3 + x.shape[1]] = k
        self.v.index_copy_(1, torch.arange(3, 3 + x.shape[1]), k.exp())
        return torch.softmax(x @ self.k.transpose(1, 2) / 2.0, -1) @ self.v


class _Scalars(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.tensor(0.25))
        self.lin = _lin()

    def forward(self, x: Any, t: Any) -> Any:
        return torch.tanh(self.lin(x) * self.scale + self.shift) * t + 0.5 * x / 3.0


class _MultiOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = _lin()

    def forward(self, x: Any) -> Any:
        y = torch.tanh(self.lin(x))
        return y.detach() * 2.0, y.clone(), y.sum().detach(), y.max(-1, keepdim=True).values, y * (y > 0)


class _Mask(nn.Module):
    def forward(self, q: Any, k: Any, m: Any) -> Any:
        return torch.softmax(q @ k.transpose(-1, -2) / 4.0 + m, -1) @ k


class _Reductions(nn.Module):
    def forward(self, x: Any, z: Any) -> Any:
        return (x.sum(1), x.mean(1, keepdim=True), x.amax(-1), torch.softmax(x, 1), z.sum(0), z.sum(1) + 1.0,
                x.var(-1, correction=0))


class _MutateInput(nn.Module):
    def forward(self, x: Any, y: Any) -> Any:
        x[:, :2].mul_(0.0)
        x[1:].add_(y[1:].exp())
        return x.sum(-1) * 2.0


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _lin(), _lin()
        self.b.weight = self.a.weight
        self.c = _lin().requires_grad_(False)  # frozen

    def forward(self, x: Any) -> Any:
        return self.b(torch.tanh(self.a(x))) + self.c(x)


def _mask_inputs() -> list[Any]:
    m = torch.zeros(2, 16, 16)
    m[:, :, 8:] = float("-inf")
    m[:, 3, :] = torch.finfo(torch.float32).min
    g = torch.Generator().manual_seed(4)
    return [torch.randn(2, 16, 8, generator=g), torch.randn(2, 16, 8, generator=g), m]


def _r(*shape: int) -> Any:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


HELD: dict[str, tuple[Callable[[], Any], Callable[[], list[Any]], bool]] = {
    "inplace_chain": (_Inplace, lambda: [_r(4, 8)], True),
    "batchnorm_running_stats": (lambda: _BatchNorm().train(), lambda: [_r(6, 8)], True),
    "kv_cache_buffers": (_KVCache, lambda: [_r(2, 4, 8)], False),
    "zero_dim_params_and_python_floats": (_Scalars, lambda: [_r(4, 8), torch.tensor(2.0)], True),
    "outputs_some_without_grad": (_MultiOut, lambda: [_r(4, 8)], True),
    "neg_inf_and_finfo_min_masks": (_Mask, _mask_inputs, False),
    "size1_and_empty_reductions": (_Reductions, lambda: [_r(4, 1, 8), torch.randn(4, 0)], True),
    "input_mutated_through_slices": (_MutateInput, lambda: [_r(4, 8), _r(4, 8) * 0.5], False),
    "tied_and_frozen_weights": (_Tied, lambda: [_r(4, 8)], True),
    "non_contiguous_inputs": (_MutateInput, lambda: [_r(8, 4).t().clone().t().t(), _r(10, 8)[3:7]], False),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HELD))
def test_held(name: str) -> None:
    make, inputs, train = HELD[name]
    _left_ops_say_why(_attack(make, inputs, train=train))


@pytest.mark.slow
def test_held_shapes_strides_and_modes_across_calls() -> None:
    """Recompiles (new shapes, strides, an expanded input), no_grad then grad then inference_mode: each call
    matches eager, and outputs keep ``requires_grad`` exactly when eager's do."""

    class M(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = _lin()

        def forward(self, x: Any, y: Any) -> Any:
            return torch.relu(self.lin(x)) + y * 2.0

    torch.manual_seed(0)
    m = M()
    cm, rep = _compiled(m)
    calls = [(_r(4, 8), _r(4, 8)), (_r(8, 4).t(), _r(10, 8)[3:7]), (_r(6, 8), _r(1, 8).expand(6, 8)),
             (_r(3, 16)[:, ::2], _r(3, 8))]
    for i, (x, y) in enumerate(calls):
        for mode in ("no_grad", "grad", "inference"):
            ctx = {"no_grad": torch.no_grad, "inference": torch.inference_mode}.get(mode)
            if ctx is None:
                got, want = cm(x, y), m(x, y)
            else:
                with ctx():
                    got, want = cm(x, y), m(x, y)
            _same(got, want, f"call {i} {mode}")
            assert got.requires_grad == want.requires_grad, (i, mode)
    _left_ops_say_why(rep)


#: inputs at the edges of fp32: zeros of both signs, infinities, NaN, denormals, exp's overflow and underflow edges
_SPECIAL = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45, 1e-38, 88.7, -88.7, 89.0, -104.0,
            1e38, -1e38, 3e38, 1.0, -1.0, 0.5, -0.5, 20.0, -20.0, 2.0, 1e-8, -1e-8, 65504.0, 70000.0, 44.0, -45.0,
            1e30, -1e30, 0.1, 3.0]
_UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "silu": torch.nn.functional.silu, "softplus": torch.nn.functional.softplus,
    "reciprocal": torch.reciprocal, "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1), "clamp": lambda x: x.clamp(-1.0, 2.0),
    "amax_plus": lambda x: x.amax(-1, keepdim=True) + x, "where_gt": lambda x: torch.where(x > 0, x, x * 0.1),
}


class _Unary(nn.Module):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: Any) -> Any:
        return _UNARY[self.name](x * 1.0) + 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_UNARY))
def test_held_special_values(name: str) -> None:
    """Held (the session: 44 ops x fp32 / fp16 / bf16 on these values, and 23 tie and boundary cases of amax, maximum,
    clamp, relu, abs, hardtanh, threshold, where, layer_norm... with their gradients in float64): the compiled
    model's values and its NaN / inf pattern are eager's, in eager's own dtype (fp32 here: exp(89) is inf in both)."""
    x = torch.tensor(_SPECIAL, dtype=torch.float32).reshape(4, 8)
    cm, rep = _compiled(_Unary(name))
    with torch.no_grad():
        got, want = cm(x.clone()), _Unary(name)(x.clone())
    assert rep.partitions and all(p.taken for p in rep.partitions), rep.summary()
    _same(got, want, name)


def _lifted_vs_aten(fn: Callable[..., Any], *xs: Any) -> tuple[np.ndarray, np.ndarray]:
    """The lifted graph of ``fn``'s ATen graph evaluated in float64, and ATen's value in float64."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="fake")(*xs)
    lifted = capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])
    ph = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    named = {f"in{i}": xs[ph.index(p.name)].double().numpy() for i, p in enumerate(lifted.inputs)}
    named.update({name: c.double().numpy() for name, c in lifted.consts})
    got = np.asarray(vm.evaluate(lifted.graph, named)[lifted.out_map[0][1]])
    want = fn(*(x.double() if x.is_floating_point() else x for x in xs))
    want = want[0] if isinstance(want, (tuple, list)) else want  # (the first result)
    return got.reshape(tuple(want.shape)), want.numpy()


@pytest.mark.parametrize("op", ["nll_loss_forward", "gather"])
def test_nll_loss_of_a_row_with_a_masked_class_was_nan(op: str) -> None:
    """Finding (tenth session, medium: a NaN loss where eager has numbers): the lifted nll_loss / gather picked
    ``x[i, t_i]`` as ``sum_c x[i, c] * [c == t_i]``, so a -inf log-probability of another class (a logit masked to
    -inf: a banned token) gave ``-inf * 0 = NaN`` and the row's loss NaN where ATen's is finite. x is now clamped
    to its dtype's finite range before the mask multiplies it (the same value for every finite element)."""
    aten = torch.ops.aten
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    logits[:, 4] = -float("inf")
    x, t = logits.log_softmax(1), torch.tensor([0, 3, 5, 2])
    if op == "nll_loss_forward":
        got, want = _lifted_vs_aten(lambda x, t: aten.nll_loss_forward(x, t, None, 0, -100), x, t)
    else:
        got, want = _lifted_vs_aten(lambda x, i: aten.gather(x, 1, i), x, t.reshape(4, 1))
    assert np.all(np.isfinite(want))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
