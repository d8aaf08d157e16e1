"""The capture's numeric check on the inputs it draws (issue 20; the thirteenth session's H100 training run).

The device dump (``VERIMIRAGE_CAPTURE_DUMP``, ``benchmarks/results/capture/h100_2026-11-27_train_dump/``) showed the
"output k differs from the ATen ops" rejections of the H200 training run were not kernels disagreeing with their
μGraphs: on inputs in [0.5, 1.5) a backward partition's chain of fp16 products overflowed, the kernels and the ATen
ops gave the same inf / NaN, and the check could neither pass nor mean anything; and an encoder layer's fp32 rstd of
fp16 rows was off by the same rounding as the ATen ops', only at other elements."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from verimirage.integrations import capture  # noqa: E402


def _lifted(f: Any, *xs: Any) -> tuple[Any, Any]:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(f)(*xs)
    return gm, capture.lift([n for n in gm.graph.nodes if n.op == "call_function"])


def test_check_on_positive_inputs_overflowed_a_chain_of_fp16_products_for_the_aten_ops_too() -> None:
    """Three fp16 products over 64 positive terms reach 64**3 > 65504: the positive set's ATen results are inf, so
    the check draws inputs of both signs (and smaller, until the ATen results are finite) and checks on those."""
    def f(x: Any, a: Any, b: Any, c: Any) -> Any:
        return ((x @ a) @ b) @ c

    ts = [torch.ones(16, 64, dtype=torch.float16), *[torch.ones(64, 64, dtype=torch.float16)] * 3]
    gm, lifted = _lifted(f, *ts)
    eager = capture.eager_module(gm, lifted)
    sets = capture._check_sets(lifted, eager, torch.device("cpu"))
    assert len(sets) == 1, "the positive set overflows and must not be used"
    (xs, want), = sets
    assert all(bool(torch.isfinite(w).all()) for w in want)
    assert float(xs[0].min()) < 0 < float(xs[0].max())  # both signs
    # the old check's only set: the ATen ops' own result is not finite there
    gen = torch.Generator().manual_seed(0)
    old = [capture._example(n, gen, torch.device("cpu")) for n in (*lifted.inputs, *lifted.extra)]
    assert not bool(torch.isfinite(eager(*old)[0]).all())


def test_check_on_positive_inputs_took_relu_of_x_for_x() -> None:
    """A finite partition is checked on both sets: a kernel computing relu(x) * 2 where x * 2 is meant agrees with
    the ATen ops on every positive input, and the signed set tells them apart."""
    def f(x: Any) -> Any:
        return x * 2.0

    gm, lifted = _lifted(f, torch.ones(8, 8))
    eager = capture.eager_module(gm, lifted)
    sets = capture._check_sets(lifted, eager, torch.device("cpu"))
    assert len(sets) == 2
    wrong = [torch.relu(xs[0]) * 2.0 for xs, _ in sets]
    assert capture._close(wrong[0], sets[0][1][0])  # the positive set alone passed it
    assert not capture._close(wrong[1], sets[1][1][0])


def test_as_accurate_rejected_a_kernel_as_close_to_float64_as_the_aten_ops_at_other_elements() -> None:
    """An fp32 statistic of fp16 data carries the data's rounding at every element: the kernels' error at one
    element may exceed the ATen ops' error at that element while being no larger than theirs elsewhere."""
    gen = torch.Generator().manual_seed(0)
    r = 0.09 + 0.01 * torch.rand(512, generator=gen, dtype=torch.float64)
    noise = 6e-3 * r  # relative rounding carried from fp16 rows, three times fp32's check tolerance
    aten, got = r.clone(), r.clone()
    aten[::2] += noise[::2]
    got[1::2] += noise[1::2] * 0.8
    assert capture.as_accurate(got.float(), aten.float(), r)
    # ... but one element ten times the ATen ops' worst relative error is still wrong
    bad = got.clone()
    bad[7] = r[7] * (1 + 4e-2)
    assert not capture.as_accurate(bad.float(), aten.float(), r)
    # and a huge element does not lend its allowance to small ones
    r2 = torch.cat([torch.tensor([1e4], dtype=torch.float64), r])
    a2 = torch.cat([torch.tensor([1e4 * (1 + 4e-3)], dtype=torch.float64), r])
    g2 = torch.cat([torch.tensor([1e4], dtype=torch.float64), r * (1 + 3e-2)])  # 40 absolute would pass it
    assert not capture.as_accurate(g2.float(), a2.float(), r2)
