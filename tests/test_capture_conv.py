"""``aten.convolution`` and ``aten.convolution_backward`` lifted as im2col + matmul (``integrations/conv.py``).

Each lifted graph is evaluated in float64 by the reference interpreter against ATen (forward, and every subset of
the backward's gradients), then small conv modules run through ``torch.compile(backend="verimirage")`` (kernels in
Triton's interpreter) against their float64 copies, outputs and gradients.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_capture_ops import _lift_and_compare, _x  # noqa: E402

from verimirage.integrations.dynamo import backend  # noqa: E402
from verimirage.integrations.report import Report  # noqa: E402

aten = torch.ops.aten

#: (input shape, weight shape, stride, padding, dilation, groups, bias): Whisper's two Conv1d stems, a ViT patch
#: embedding (with and without a remainder the convolution drops), ConvNeXt's depthwise 7x7 (here 3x3), a grouped
#: dilated convolution of mixed strides, a pointwise one, a strided dilated Conv1d whose padding exceeds a window, a
#: 3-d one, ResNet's strided 1x1 downsampling of an odd size, a strided dilated padded 3x3 whose sizes no stride divides
CASES = [
    ((2, 3, 8), (4, 3, 3), (1,), (1,), (1,), 1, True),
    ((2, 4, 9), (4, 4, 3), (2,), (1,), (1,), 1, True),
    ((2, 3, 16, 16), (5, 3, 4, 4), (4, 4), (0, 0), (1, 1), 1, True),
    ((2, 3, 10, 10), (5, 3, 4, 4), (4, 4), (0, 0), (1, 1), 1, False),
    ((2, 4, 7, 7), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4, True),
    ((2, 4, 7, 6), (6, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2, True),
    ((1, 2, 5, 5), (3, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1, True),
    ((1, 2, 9), (3, 2, 3), (3,), (2,), (2,), 1, False),
    ((1, 2, 3, 4, 4), (2, 2, 2, 2, 2), (2, 2, 2), (0, 1, 0), (1, 1, 1), 1, True),
    ((1, 2, 7, 6), (3, 2, 1, 1), (2, 2), (0, 0), (1, 1), 1, True),
    ((2, 3, 9, 8), (4, 3, 3, 3), (3, 2), (2, 1), (2, 1), 1, False),
]


def _conv(case: tuple[Any, ...]) -> Any:
    _xs, _ws, s, p, d, groups, bias = case
    return lambda x, w, b: aten.convolution(x, w, b if bias else None, list(s), list(p), list(d), False,
                                            [0] * len(s), groups)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-s{c[2]}" for c in CASES])
def test_convolution_lifts_as_columns_and_a_matmul(case: tuple[Any, ...]) -> None:
    xs, ws = case[0], case[1]
    _lift_and_compare(_conv(case), _x(*xs), _x(*ws, seed=1), _x(ws[0], seed=2))


@pytest.mark.parametrize("mask", [(True, True, True), (False, True, True), (True, False, False), (False, False, True)])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-s{c[2]}" for c in CASES])
def test_convolution_backward_lifts(case: tuple[Any, ...], mask: tuple[bool, bool, bool]) -> None:
    """Every subset of the gradients ``output_mask`` asks for; the input (weight) is read only for the weight's
    (input's) gradient, as a shape otherwise (``aten.unread_args``)."""
    xs, ws, s, p, d, groups, _bias = case
    x, w = _x(*xs), _x(*ws, seed=1)
    gy = _x(*_conv(case)(x, w, None).shape, seed=3)

    def fb(gy: Any, x: Any, w: Any) -> list[Any]:
        r = aten.convolution_backward(gy, x, w, [ws[0]], list(s), list(p), list(d), False, [0] * len(s), groups,
                                      list(mask))
        return [t for t in r if t is not None]

    lifted = _lift_and_compare(fb, gy, x, w)
    assert len(lifted.inputs) == 1 + mask[1] + mask[0]  # (the gradient, and the operands read)


#: transposed convolutions: (input shape, weight shape (C_in, C_out/G, *K), stride, padding, output_padding,
#: dilation, groups): a Conv1d upsampler with output_padding, a 2-d 4x4 stride-2 upsampler (DCGAN, U-Net), a grouped
#: dilated one
TRANSPOSED = [
    ((2, 4, 5), (4, 3, 3), (2,), (1,), (1,), (1,), 1),
    ((1, 4, 3, 3), (4, 2, 4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1),
    ((2, 4, 3, 4), (4, 1, 3, 2), (1, 2), (0, 1), (0, 1), (2, 1), 2),
]


@pytest.mark.parametrize("case", TRANSPOSED, ids=[f"{c[0]}-{c[1]}" for c in TRANSPOSED])
def test_transposed_convolution_lifts_as_the_input_gradient_it_is(case: tuple[Any, ...]) -> None:
    xs, ws, s, p, op, d, groups = case
    x, w, b = _x(*xs), _x(*ws, seed=1), _x(ws[1] * groups, seed=2)
    conv = lambda x, w, b: aten.convolution(x, w, b, list(s), list(p), list(d), True, list(op), groups)  # noqa: E731
    _lift_and_compare(conv, x, w, b)
    gy = _x(*conv(x, w, b).shape, seed=3)

    def backward(mask: list[bool]) -> Any:
        def fb(gy: Any, x: Any, w: Any) -> list[Any]:
            r = aten.convolution_backward(gy, x, w, [ws[1] * groups], list(s), list(p), list(d), True, list(op),
                                          groups, mask)
            return [t for t in r if t is not None]

        return fb

    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        _lift_and_compare(backward(mask), gy, x, w)


class _Stem(nn.Module):
    """Whisper's stem (two Conv1d with GELU, the second of stride 2), then channels last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(4, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(8, 8, kernel_size=3, stride=2, padding=1)

    def forward(self, x: Any) -> Any:
        return F.gelu(self.conv2(F.gelu(self.conv1(x)))).permute(0, 2, 1)


class _Patch(nn.Module):
    """ViT's patch embedding: a strided patch conv, flattened to tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, 16, kernel_size=4, stride=4)

    def forward(self, x: Any) -> Any:
        return self.proj(x).flatten(2).transpose(1, 2)


class _Depthwise(nn.Module):
    """ConvNeXt's depthwise conv then channels last."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(8, 8, kernel_size=3, padding=1, groups=8)

    def forward(self, x: Any) -> Any:
        return self.dw(x).permute(0, 2, 3, 1)


class _Upsample(nn.Module):
    """U-Net's up-convolution (a 2x2 stride-2 transposed convolution doubling the resolution), then SiLU. (DCGAN's
    4x4 stride-2 one with padding 1: ``tests/test_capture_session19.py``.)"""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(8, 4, kernel_size=2, stride=2)

    def forward(self, x: Any) -> Any:
        return F.silu(self.up(x))


MODULES = {"whisper_stem": (_Stem, (2, 4, 8)), "vit_patch": (_Patch, (2, 3, 8, 8)),
           "convnext_depthwise": (_Depthwise, (2, 8, 4, 4)), "unet_upsample": (_Upsample, (2, 8, 3, 3))}


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["forward", "train"])
@pytest.mark.parametrize("name", list(MODULES))
def test_conv_modules_run_in_the_kernels_and_match_float64(name: str, train: bool) -> None:
    """Every convolution (and its backward) is taken into a verified partition; the outputs and every gradient
    within float32 tolerance of the module's float64 copy."""
    import copy

    cls, shape = MODULES[name]
    torch.manual_seed(0)
    model = cls()
    ref = copy.deepcopy(model).double()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    rep = Report()
    cm = torch.compile(model, backend=backend(report=rep, time_budget_s=8.0, fallback="eager", candidates=1))
    xr = x.double()
    if train:
        x, xr = x.clone().requires_grad_(), xr.clone().requires_grad_()
        out, want = cm(x), ref(xr)
        wts = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
        (out * wts).sum().backward()
        (want * wts.double()).sum().backward()
        pairs = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)]
        pairs.append((x.grad, xr.grad))
    else:
        with torch.no_grad():
            out, want = cm(x), ref(xr)
        pairs = []
    for a, b in [(out, want), *pairs]:
        assert a is not None and b is not None
        tol = 2e-5 * max(1.0, float(b.abs().max()))
        assert float((a.double() - b).abs().max()) <= tol, rep.summary()
    convs = [r for r in rep.left if "convolution" in r.op]
    assert not convs, [f"{r.op}: {rep.reason_of(r)}" for r in convs]
    assert rep.coverage == 1.0, rep.summary()
