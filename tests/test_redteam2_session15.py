"""Red team (fifteenth session, redteam2): silently wrong results and crashes on the user-facing execution paths
(``torch.compile(backend="verimirage")``, ``vm.compile`` and its launch modes, ``vm.testing``, the capture's numeric
check), each with the test that failed before its fix. The attacks that held are in
``tests/test_redteam2_held15.py``."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

# no numeric check: what the lifting builds is what the kernels compute (the check is a backstop, not the proof)
UNCHECKED: dict[str, Any] = {"time_budget_s": 8.0, "fallback": "eager", "candidates": 1, "check": False}


def _compiled(fn: Any, **opts: Any) -> tuple[Any, Any]:
    from verimirage.integrations.dynamo import backend
    from verimirage.integrations.report import Report

    rep = Report()
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend(report=rep, **{**UNCHECKED, **opts})), rep


def test_rsub_with_alpha_dropped_alpha() -> None:
    """Finding (medium): ``torch.rsub(x, c, alpha=a)`` is ``c - a x``; the lifting read ``rsub`` as ``c - x`` (alpha
    was applied only to ``add``/``sub``), so the verified kernels computed another function. The numeric check then
    refused the partition, but with ``check=False`` (a documented option) the compiled model returned ``c - x``
    silently. Now alpha scales ``self`` in ``rsub`` (and ``other`` in ``add``/``sub``)."""
    x, w = torch.randn(4, 6), torch.randn(6, 5)
    for fn in (lambda x, w: torch.rsub(x @ w, 2.0, alpha=3.0),
               lambda x, w: torch.rsub(x @ w, w.sum(0), alpha=-0.5),
               lambda x, w: torch.sub(x @ w, w.sum(0), alpha=3.0)):
        cm, rep = _compiled(fn)
        with torch.no_grad():
            got, want = cm(x, w), fn(x.double(), w.double())
        assert any(p.taken for p in rep.partitions), rep
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def _stable_programs() -> dict[str, Any]:
    """Programs with max-shifted logits that vm.testing did not test at large logits (each over an input itself)."""
    import verimirage as vm

    out = {}
    for dt in (vm.float32, vm.float16, vm.bfloat16):
        g = vm.Graph()
        x = g.input("x", (4, 32), dt)
        s = g.sub(x, g.max(x, axis=1))
        g.output(g.sub(s, g.log(g.sum(g.exp(s), axis=1))))
        out[f"log_softmax_{dt.short}"] = g
        g = vm.Graph()
        x = g.input("x", (4, 32), dt)  # the stable softmax with its numerator written twice
        g.output(g.div(g.exp(g.sub(x, g.max(x, axis=1))), g.sum(g.exp(g.sub(x, g.max(x, axis=1))), axis=1)))
        out[f"softmax_twice_{dt.short}"] = g
        g = vm.Graph()
        x = g.input("x", (4, 32), dt)
        e = g.exp(g.scale(g.sub(x, g.max(x, axis=1)), 0.5))
        g.output(g.div(e, g.sum(e, axis=1)))
        out[f"softmax_{dt.short}"] = g
    return out


@pytest.mark.parametrize("name", sorted(_stable_programs()))
def test_generated_tests_passed_a_softmax_kernel_without_its_max_shift(name: str) -> None:
    """Finding (medium, ``vm.testing``): the ``large`` value regime, the only one in which a kernel that drops a
    softmax's max shift (``exp(x) / sum(exp(x))``) overflows, was drawn only for a ``div(exp(z), sum(exp(z)))`` whose
    ``z = x - max(x)`` was one node, and at magnitudes up to 8 even where the input *is* the logits: a log-softmax,
    a softmax written with its numerator twice, and any float32 or bfloat16 softmax over an input (``exp(8)`` is
    finite) got only the ``normal`` and ``mixed`` regimes, and the generated module of each passed the naive
    kernel (``write_tests(g, kernel=naive)``: all tests passed). Now every ``exp(x - max(x))`` (subexpressions
    compared by value) marks the inputs reaching ``x`` for the ``large`` regime, drawn past the dtype's ``exp``
    overflow where no contraction lies between the input and the logits."""
    import numpy as np

    import verimirage as vm
    from verimirage.testing import applicable_regimes, make_inputs

    g = _stable_programs()[name]
    assert "large" in applicable_regimes(g)
    overflowed = 0
    for seed in range(3):
        case = make_inputs(g, "large", seed)
        x = case["x"]
        ref = vm.evaluate(g, case)[0]
        assert np.isfinite(ref).all()  # the program itself is defined there
        e = torch.exp(x * (0.5 if name.startswith("softmax_") and "twice" not in name else 1.0))  # the naive kernel
        naive = (x - torch.log(e.sum(-1, keepdim=True))) if "log" in name else e / e.sum(-1, keepdim=True)
        overflowed += int(not bool(torch.isfinite(naive).all()))
    assert overflowed == 3


def exp_matmul_program() -> tuple[Any, Any]:
    """``exp(x @ w)`` for x (4, 6) and w (6, 3) in float32, and its compiled program (the unfused graph's kernels)."""
    import verimirage as vm

    g = vm.Graph()
    x = g.input("x", (4, 6), vm.float32)
    w = g.input("w", (6, 3), vm.float32)
    g.output(g.exp(g.matmul(x, w)))
    return g, vm.compile(g)


def test_compiled_program_on_a_sparse_or_grad_requiring_input(caplog: pytest.LogCaptureFixture) -> None:
    """Finding (low): ``vm.compile(...)`` called on a sparse COO, sparse CSR or nested tensor raised PyTorch's internal
    errors ("Cannot access data pointer of Tensor that doesn't have storage", "Sparse CSR tensors do not have
    is_contiguous", "NestedTensorImpl doesn't support sizes") instead of naming the input and what is expected; and
    an input requiring grad gave outputs without autograd history, silently (a loss built on them gets no gradient
    through the program). Now the first is a TypeError naming the input and the layout, the second a warning (once
    per program) that the program has no backward."""
    import logging

    import verimirage as vm
    from verimirage.backend.runtime import interpreting

    if not interpreting():
        pytest.skip("CPU tensors in Triton's interpreter")
    g, fn = exp_matmul_program()
    X, W = torch.randn(4, 6), torch.randn(6, 3)
    for bad, what in ((X.to_sparse(), "sparse_coo"), (X.to_sparse_csr(), "sparse_csr"),
                      (torch.nested.nested_tensor([X[0], X[1]]), "nested")):
        with pytest.raises(TypeError, match=f"input 'x': a {what} tensor; expected a dense"):
            fn(bad, W)
    with caplog.at_level(logging.WARNING, logger="verimirage"):
        out = fn(X, W.clone().requires_grad_())
        fn(X, W.clone().requires_grad_())
    assert not out.requires_grad
    assert sum("has no backward" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verimirage"), torch.no_grad():
        vm.compile(g)(X, W.clone().requires_grad_())  # under no_grad: nothing to warn about
    assert not any("has no backward" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(out, torch.exp(X @ W), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["rms", "layer"])
@pytest.mark.parametrize("dt", ["float16", "bfloat16", "float32"])
def test_generated_tests_passed_a_norm_kernel_without_its_eps(form: str, dt: str) -> None:
    """Finding (medium, ``vm.testing``): the ``tiny`` regime (near-zero and all-zero rows, where a norm's ``eps``
    is all that keeps ``x * rsqrt(mean(x**2) + eps)`` finite) was drawn only for the ``rms_norm`` op: a norm written
    out (``x * rsqrt(mean(x**2) + eps)``, a layer norm by hand) got the ``normal`` and ``mixed`` regimes, where
    ``eps`` moves nothing the half-precision tolerances see, and the generated module passed a kernel that drops
    ``eps`` (all tests passed for fp16 and bf16) although it gives NaN on a zero row (padding) where the program
    gives 0. Now a reduction under ``rsqrt``/``sqrt``/``reciprocal``/a division with a positive ``eps`` added marks
    the inputs of its operand for the ``tiny`` regime, along the reduced axis."""
    import numpy as np

    import verimirage as vm
    from verimirage.testing import applicable_regimes, make_inputs
    from verimirage.testing.checks import assert_close, tolerances

    g = vm.Graph()
    x = g.input("x", (6, 32), getattr(vm, dt))
    d = g.sub(x, g.mean(x, axis=1)) if form == "layer" else x
    g.output(g.mul(d, g.rsqrt(g.shift(g.mean(g.square(d), axis=1), 1e-5))))
    assert "tiny" in applicable_regimes(g)

    def no_eps(t: Any) -> Any:
        f = t.float()
        f = f - f.mean(-1, keepdim=True) if form == "layer" else f
        return (f * torch.rsqrt((f * f).mean(-1, keepdim=True))).to(t.dtype)

    caught = 0
    for seed in range(4):
        case = make_inputs(g, "tiny", seed)
        ref = vm.evaluate(g, case)
        assert np.isfinite(ref[0]).all()
        try:
            assert_close([no_eps(case["x"])], ref, tolerances(g))
        except AssertionError:
            caught += 1
    assert caught == 4


def test_neg_of_positive_zero_was_positive_zero_in_the_kernels() -> None:
    """Finding (low; signed zeros, as the eleventh session's ``pow`` finding): ``neg`` was lowered as Triton's unary
    minus, which Triton emits as ``0 - x``: ``+0`` at ``x = +0`` where ``-x`` (ATen, numpy, the float64 reference)
    is ``-0``, so ``1 / -x`` (``reciprocal(neg(x))``, or ``(-x) ** -3``) was ``+inf`` where the reference is ``-inf``,
    in every candidate (the plain graph's kernels too); the negated pieces of a rotary concat the same. Now a
    negation is ``x * -1.0`` (exact, the sign of every value flipped, zeros included)."""
    import numpy as np

    import verimirage as vm
    from verimirage.backend.runtime import interpreting

    if not interpreting():
        pytest.skip("CPU tensors in Triton's interpreter")
    g = vm.Graph()
    x = g.input("x", (2, 8), vm.float32)
    g.output(g.reciprocal(g.neg(x)), g.pow(g.neg(x), -3.0))
    z = torch.tensor([[0.0, -0.0, 1.0, -2.0, float("inf"), -float("inf"), 0.5, 0.0]] * 2)
    want = vm.evaluate(g, {"x": z.double().numpy()})
    for got, ref in zip(vm.compile(g)(z), want, strict=True):
        np.testing.assert_array_equal(got.double().numpy(), ref)
        assert np.array_equal(np.signbit(got.double().numpy()), np.signbit(ref))


def test_generated_tests_passed_a_float16_norm_kernel_squaring_in_float16(tmp_path: Any) -> None:
    """Finding (medium, ``vm.testing``): no value regime drew a float16 norm's input past 256, where its square
    overflows float16 (LLM activations have outliers of hundreds to thousands): a kernel computing ``mean(x * x)`` with
    the squares in float16 gives 0 there where the program is finite, and its generated module passed. And the
    regimes were sampled at random by hypothesis: ten examples could draw none of one. Now float16 inputs a norm
    squares (no contraction between) get magnitudes 64-2048 in the ``large`` regime, and the reference test runs one
    input of every regime as an explicit example."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import verimirage as vm
    from verimirage.testing import applicable_regimes, make_inputs, write_tests

    g = vm.Graph()
    x = g.input("x", (4, 64), vm.float16)
    w = g.input("w", (64,), vm.float16)
    g.output(g.rms_norm(x, w, axis=-1, eps=1e-6))
    assert "large" in applicable_regimes(g)
    case = make_inputs(g, "large", 0)
    assert float(case["x"].abs().max()) > 256 and float(case["w"].abs().max()) < 4
    (tmp_path / "planted.py").write_text(textwrap.dedent('''
        import torch

        def rms_squares_in_fp16(x, w):
            ms = (x * x).float().mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(ms + 1e-6) * w.float()).to(x.dtype)
        '''))
    sys.path.insert(0, str(tmp_path))
    try:
        write_tests(g, tmp_path / "test_planted.py", kernel="planted:rms_squares_in_fp16", seed=1)
    finally:
        sys.path.remove(str(tmp_path))
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        "test_planted.py", "-k", "matches_reference"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "PYTHONPATH": f"{root}:{tmp_path}"})
    assert "1 failed" in r.stdout, r.stdout[-2000:]
