"""Red team (fifteenth session, redteam2): attacks on the user-facing execution paths that held, kept as compact tests
that would fail if they stopped holding (the findings are in ``tests/test_redteam2_session15.py``).

The capture's lifting is checked with the numeric check off (``check=False``): what the kernels compute is then
what the lifting built, compared with ATen in float64 on inputs of both signs, large magnitudes and special values
(the check itself draws inputs in [0.5, 1.5) and [-1, 1) only)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from verimirage.backend.runtime import interpreting  # noqa: E402

interp = pytest.mark.skipif(not interpreting(), reason="Triton's interpreter (CPU tensors)")

UNCHECKED: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1, "check": False}
CHECKED: dict[str, Any] = {**UNCHECKED, "check": True}


def _compiled(fn: Any, opts: dict[str, Any]) -> tuple[Any, Any]:
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    rep = Report()
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend(report=rep, **opts)), rep


def _input_sets(shapes: list[tuple[int, ...]]) -> dict[str, list[Any]]:
    g = torch.Generator().manual_seed(3)
    sets = {"normal": [torch.randn(s, generator=g) for s in shapes],
            "large": [torch.randn(s, generator=g) * 30 for s in shapes],
            "negative": [-torch.rand(s, generator=g) * 3 for s in shapes]}
    special = []
    for k, s in enumerate(shapes):
        t = torch.randn(s, generator=g)
        flat = t.view(-1)
        for i, v in enumerate((0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e4, -1e4)):
            flat[(i * 7 + 3 * k) % flat.numel()] = v
        special.append(t)
    sets["special"] = special
    return sets


def _agree(got: Any, want: Any, tol: float = 1e-4) -> str | None:
    """None when ``got`` equals the float64 ``want`` within ``tol`` (relative to max(1, |want|)), specials alike."""
    a, b = got.detach().double(), want.detach().double()
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if not torch.equal(torch.isnan(a), torch.isnan(b)):
        return "NaN at other places"
    inf = torch.isinf(b)
    if not torch.equal(torch.isinf(a), inf) or not torch.equal(a[inf], b[inf]):
        return "infinities differ"
    fin = torch.isfinite(b)
    err = (a[fin] - b[fin]).abs()
    if err.numel() and bool((err > tol * b[fin].abs().clamp(min=1.0)).any()):
        return f"max error {float(err.max()):.3g}"
    return None


#: name -> (function, input shapes): ATen forms whose arguments the lifting reads (defaults, keywords, negative
#: dims, alpha/beta, one-sided and inverted bounds, broadcasting)
LIFTED: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]] = {
    "clamp_one_sided": (lambda x: torch.clamp(x, min=0.1) * 2 + torch.clamp(x, max=-0.2), [(4, 6)]),
    "clamp_inverted": (lambda x: torch.clamp(x, 0.7, -0.5) * 2, [(4, 6)]),
    "hardtanh_relu6": (lambda x: F.hardtanh(x) * 2 + F.relu6(x), [(4, 6)]),
    "leaky_slopes": (lambda x: F.leaky_relu(x, -0.5) + F.leaky_relu(x, 2.0) * 3, [(4, 6)]),
    "maximum_minimum": (lambda x, y: torch.maximum(x, y) * 2 - torch.minimum(x, y), [(4, 6), (4, 6)]),
    "amax_amin_dims": (lambda x: x.amax((0, 2)) * 2 + x.amin(-1, keepdim=True).sum((0, 2)), [(2, 3, 4)]),
    "mean_negative_dims": (lambda x: x.mean((-1, 0), keepdim=True) * 2, [(2, 3, 4)]),
    "var_corrections": (lambda x: x.var(-1, correction=2) + x.var(0, unbiased=False).sum() + x.std(-1), [(5, 7)]),
    "addmm_beta_alpha": (lambda b, x, w: torch.addmm(b, x, w, beta=0.5, alpha=2.0), [(3, 5), (3, 4), (4, 5)]),
    "baddbmm": (lambda b, x, w: torch.baddbmm(b, x, w, beta=2.0, alpha=0.5), [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
    "matmul_broadcast": (lambda x, w: torch.tanh(x @ w) + (x @ w) * 0.5, [(2, 3, 4), (1, 4, 5)]),
    "permute_negative": (lambda x: x.permute(-1, -3, -2).exp() + 1, [(2, 3, 4)]),
    "split_chunk_narrow": (lambda x: x.split(3, -1)[1][:, :2] * x.chunk(3, -1)[0] + x.narrow(1, 1, 2),
                           [(3, 6)]),
    "scalar_first": (lambda x: (2.0 - x) * (3.0 + x) / (1.0 + x.abs()), [(3, 4)]),
    "pow_table": (lambda x: x ** 3 + (x * x + 1) ** 1.5 + (x * x + 1) ** -2 + x ** 7 * 1e-3, [(3, 4)]),
    "softmax_log_softmax_dim0": (lambda x: torch.softmax(x, 0) + torch.log_softmax(x, 1), [(2, 3, 4)]),
    "layer_rms_norm_weights": (lambda x, w, b: F.layer_norm(x, (4,), w, b, eps=1e-3) + F.rms_norm(x, (4,), w,
                                                                                                  eps=1e-3),
                               [(2, 3, 4), (4,), (4,)]),
    "where_scalar_branch": (lambda x, m: torch.where(m > 0, x.exp(), 2.0), [(3, 4), (3, 4)]),
    "stack_norm": (lambda x, y: torch.stack([x, y], -1).norm(dim=-1) + F.normalize(x, dim=-1), [(3, 4), (3, 4)]),
}


@interp
@pytest.mark.parametrize("name", sorted(LIFTED))
def test_lifted_aten_forms_match_float64_unchecked_held(name: str) -> None:
    """Held (19 forms x 4 input sets): with the numeric check off, every form's kernels equal ATen's float64 values
    on normal, large, negative and special inputs (NaN, +-inf, +-0, subnormal-ish, 1e4) where ATen is finite, and
    are non-finite exactly where it is."""
    fn, shapes = LIFTED[name]
    cm, rep = _compiled(fn, UNCHECKED)
    with torch.no_grad():
        for what, xs in _input_sets(shapes).items():
            got = cm(*[x.clone() for x in xs])
            want = fn(*[x.double() for x in xs])
            if what == "special" and name == "stack_norm":
                continue  # (inf - inf in the reference's own norm of a row with both infinities)
            assert (why := _agree(got, want)) is None, (name, what, why)
    assert any(p.taken for p in rep.partitions), rep


def _mut_input(x: Any, w: Any) -> Any:
    x.mul_(2.0)
    return torch.tanh(x @ w)


def _copy_into_input(x: Any, w: Any) -> Any:
    y = x @ w
    x.copy_(torch.tanh(x))
    return y


def _views_of_result(x: Any, w: Any) -> Any:
    y = torch.exp(x @ w * 0.1)
    y.add_(1.0)
    return y, y.t(), y[1:, ::2], x


def _same_twice(x: Any, w: Any) -> Any:
    a = (x @ w) * 1.0
    return a, a, x * 1.0


@interp
@pytest.mark.parametrize("fn", [_mut_input, _copy_into_input, _views_of_result, _same_twice],
                         ids=lambda f: f.__name__)
def test_mutations_and_aliasing_through_the_backend_held(fn: Any) -> None:
    """Held: in-place ops on inputs and results, views of a result, an input returned, one value returned twice:
    the compiled function's results, its inputs' state afterwards and which results alias which inputs and results
    are eager's (checked run, non-contiguous inputs)."""
    x0, w0 = torch.randn(6, 10).t().contiguous().t(), torch.randn(20, 7)[::2]
    xa, wa, xb, wb = x0.clone(), w0.clone(), x0.clone(), w0.clone()
    cm, rep = _compiled(fn, CHECKED)
    with torch.no_grad():
        got, want = cm(xa, wa), fn(xb, wb)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xa, xb, rtol=1e-4, atol=1e-5)

    def alias(s: Any, t: Any) -> bool:
        return bool(s.untyped_storage().data_ptr() == t.untyped_storage().data_ptr())

    for i in range(len(got)):
        for t_got, t_want in ((xa, xb), (wa, wb), *((got[k], want[k]) for k in range(i))):
            assert alias(got[i], t_got) == alias(want[i], t_want), (fn.__name__, i)
    assert any(p.taken for p in rep.partitions)


class _Buffered(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(6, 7))
        self.lin = torch.nn.Linear(7, 7)

    def forward(self, x: Any, w: Any) -> Any:
        y = torch.exp(x @ w * 0.1)
        self.acc.add_(y.detach())
        return self.lin(y * self.acc)


@interp
def test_buffer_mutation_strided_inputs_and_recompiles_held() -> None:
    """Held: a buffer mutated in forward, trained through with transposed, sliced and expanded inputs (a
    recompile for the new strides), gives eager's outputs, gradients and buffer state, call after call."""
    import copy

    torch.manual_seed(0)
    m = _Buffered()
    ref = copy.deepcopy(m).double()
    cm, rep = _compiled(m, CHECKED)
    for x, w in ((torch.randn(10, 6).t(), torch.randn(10, 7)), (torch.randn(1, 10).expand(6, 10),
                                                                 torch.randn(10, 14)[:, ::2])):
        x, w = x.requires_grad_(), w.requires_grad_()
        out = cm(x, w)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        want = ref(xr, wr)
        (out * out).sum().backward()
        (want * want).sum().backward()
        torch.testing.assert_close(out.double(), want, rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(w.grad.double(), wr.grad, rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(m.lin.weight.grad.double(), ref.lin.weight.grad, rtol=2e-4, atol=2e-4)
        torch.testing.assert_close(m.acc.double(), ref.acc, rtol=2e-4, atol=2e-4)
    assert any(p.taken for p in rep.partitions)


@interp
def test_compiled_program_user_errors_are_clear_held() -> None:
    """Held: a compiled program names the input and what it expected for an array, a wrong dtype, a tensor on
    another device, too many or unknown inputs, and ``out=`` tensors of the wrong shape or dtype; ``out=`` tensors
    that are views (transposed, or of an input) get the right values."""
    import numpy as np
    from test_redteam2_session15 import exp_matmul_program

    _, fn = exp_matmul_program()
    X, W = torch.randn(4, 6), torch.randn(6, 3)
    cases = [((X.numpy(), W), {}, TypeError, "input 'x': expected a torch.Tensor, got ndarray"),
             ((X.double(), W), {}, TypeError, "input 'x': dtype torch.float64; expected torch.float32"),
             ((X.to("meta"), W.to("meta")), {}, ValueError, "Triton's interpreter; pass CPU tensors"),
             ((X, W, W), {}, TypeError, "takes 2 input"),
             ((X, W), {"y": X}, TypeError, "unknown input 'y'"),
             ((X, W), {"out": torch.empty(3, 3)}, ValueError, r"out\[0\]: shape \(3, 3\); expected \(4, 3\)"),
             ((X, W), {"out": torch.empty(4, 3, dtype=torch.int32)}, TypeError, r"out\[0\]: dtype torch.int32")]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fn(*args, **kw)
    want = np.exp(X.double().numpy() @ W.double().numpy())
    for out in (torch.empty(3, 4).t(), torch.empty(4, 8)[:, 2:5]):
        assert fn(X, W, out=out) is out
        np.testing.assert_allclose(out.double().numpy(), want, rtol=1e-4)
    xin = X.clone()
    fn(xin[:, :6], W, out=xin[:, :3])  # the result written over its own input
    np.testing.assert_allclose(xin[:, :3].double().numpy(), want, rtol=1e-4)


@interp
@pytest.mark.parametrize("mode", ["default", "merge", "lastblock", "persistent_tiles"])
def test_launch_modes_and_tile_options_at_odd_shapes_held(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Held (session totals: 5 programs x 3 candidates x 6 random tile configurations, and 3 programs x 5 launch
    modes x up to 4 candidates, at sizes 1, 97, 130, 200, 307, 517, 1031): the kernels of every verified
    candidate, in every launch mode and under non-default tile options (dot padding, row dots, flat kernels,
    rank-2 causal, unrolling, stream order), match float64. Here: an RMSNorm-projection-SiLU and a one-row product
    at odd sizes, each candidate in one mode, default and two non-default tile configurations."""
    import numpy as np

    import verimirage as vm
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    env = {"merge": {"VERIMIRAGE_MERGE": "1"}, "lastblock": {"VERIMIRAGE_LASTBLOCK": "1"},
           "persistent": {"VERIMIRAGE_PERSISTENT": "1"},
           "persistent_tiles": {"VERIMIRAGE_PERSISTENT": "1", "VERIMIRAGE_PERSISTENT_TILES": "1"}}.get(mode, {})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfgs = [None, LaunchConfig(num_warps=1, num_stages=1, tiles=TileOptions(dot_min_m=16, unroll_max=0, row_dot=0,
                                                                            rank2=False, stream_order=False)),
            LaunchConfig(num_warps=8, num_stages=3, tiles=TileOptions(dot_min_nk=32, evict_once=True, dot_batch1=True,
                                                                      row_dot=64, flat=128))]
    dt = vm.float16
    g1 = vm.Graph()
    x = g1.input("x", (3, 67), dt)
    wn = g1.input("wn", (67,), dt)
    w = g1.input("w", (67, 11), dt)
    g1.output(g1.silu(g1.matmul(g1.rms_norm(x, wn, axis=-1, eps=1e-6), w)))
    g2 = vm.Graph()
    x = g2.input("x", (1, 200), dt)
    w = g2.input("w", (200, 40), dt)
    g2.output(g2.matmul(x, w))
    rng = np.random.default_rng(0)
    for g in (g1, g2):
        res = vm.superoptimize(g, time_budget_s=10)
        ins = {t.name: torch.tensor(rng.standard_normal(t.shape)).half() for t in g.inputs}
        ref = vm.evaluate(g, {k: v.double().numpy() for k, v in ins.items()})[0]
        for cand in res.candidates[:2]:
            for cfg in cfgs:
                got = vm.compile(cand, config=cfg)(**ins).double().numpy()
                np.testing.assert_allclose(got, ref, rtol=1.6e-2, atol=1.6e-2 * max(1.0, float(np.abs(ref).max())))


def _masked_scores(q: Any, k: Any, v: Any) -> Any:
    """Attention over a mask whose first query row is masked throughout (ATen: a NaN row) by masked_fill(-inf)."""
    s = (q @ k.transpose(-1, -2)).to(q.dtype)
    keep = torch.zeros(q.shape[-2], k.shape[-2], dtype=torch.bool)
    keep[1:, :2] = True
    return torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v


@interp
@pytest.mark.parametrize("which", ["gqa_causal", "masked_fill_row"])
def test_attention_forms_unchecked_train_held(which: str) -> None:
    """Held: SDPA with fewer KV heads than query heads (enable_gqa, causal, a scale) and a masked_fill(-inf)
    softmax with a row masked throughout, forward and backward with the numeric check off: the kernels' outputs and
    gradients equal ATen's in float64 (the masked row NaN where ATen's is)."""
    g = torch.Generator().manual_seed(2)
    if which == "gqa_causal":
        xs = [torch.randn(1, 6, 3, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g),
              torch.randn(1, 2, 5, 4, generator=g)]

        def fn(q: Any, k: Any, v: Any) -> Any:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.3)
    else:
        xs = [torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g),
              torch.randn(1, 2, 5, 4, generator=g)]
        fn = _masked_scores
    cm, rep = _compiled(fn, UNCHECKED)
    xa = [x.clone().requires_grad_() for x in xs]
    x64 = [x.double().requires_grad_() for x in xs]
    got, want = cm(*xa), fn(*x64)
    assert _agree(got, want) is None
    got.nan_to_num().sum().backward()
    want.nan_to_num().sum().backward()
    for a, b in zip(xa, x64, strict=True):
        assert _agree(a.grad, b.grad) is None, which
    assert sum(p.taken for p in rep.partitions) >= 2, rep
