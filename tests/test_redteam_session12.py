"""Red team (twelfth session): findings against what the eleventh session landed and its open lows, each with the
test that failed before its fix. The attacks that held are kept in ``tests/test_redteam_held12.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from verimirage.ir.reference import gelu_tanh, sigmoid, silu
from verimirage.pipeline import pricing


def _mp_exact(f: str, xs: list[float]) -> np.ndarray:
    mp = pytest.importorskip("mpmath")
    with mp.workdps(400):  # (1 + tanh z at z ~ -400 needs ~350 digits not to cancel in mpmath too)
        c = mp.sqrt(2 / mp.pi)
        out = []
        for x in map(mp.mpf, xs):
            sig = 1 / (1 + mp.exp(-x))
            out.append(float({"gelu": 0.5 * x * (1 + mp.tanh(c * (x + mp.mpf("0.044715") * x**3))),
                              "sigmoid": sig, "silu": x * sig}[f]))
    return np.array(out)


@pytest.mark.parametrize("f", ["gelu", "sigmoid", "silu"])
def test_gelu_tanh_reference_cancelled_below_minus_seven(f: str) -> None:
    """Finding (open low of the eleventh session): the float64 GELU-tanh reference ``0.5 x (1 + tanh z)`` cancels
    for x < -7 (at -8: 100% off; at -9.5 it is 0 for -1.8e-26), and the sigmoid reference ``(1 + tanh(x / 2)) / 2``
    likewise below x ~ -30 (relative error 1e-3 at -30, 1.0 at -37). Both are now ``x sigmoid(2 z)`` (the kernel's
    own form, backend/lowering.py) and ``e^min(x, 0) / (1 + e^-|x|)``: within a few ulp everywhere."""
    xs = [-600.0, -80.0, -37.0, -30.0, -20.0, -9.5, -8.0, -7.0, -3.0, -1.0, -1e-3, -1e-12, 1e-12, 0.5, 2.0, 8.0, 40.0]
    want = _mp_exact(f, xs)
    got = {"gelu": gelu_tanh, "sigmoid": sigmoid, "silu": silu}[f](np.array(xs))
    tiny = np.abs(want) < 1e-300  # (underflows to 0 in float64: only the sign and the zero are asked for)
    np.testing.assert_array_equal(got[tiny], 0.0 * want[tiny])
    np.testing.assert_allclose(got[~tiny], want[~tiny], rtol=1e-13, atol=0)
    specials = np.array([-np.inf, np.inf, np.nan, 0.0, -0.0])
    with np.errstate(all="ignore"):
        assert np.array_equal(sigmoid(specials), [0.0, 1.0, np.nan, 0.5, 0.5], equal_nan=True)
        g = gelu_tanh(specials)
    assert np.isnan(g[0]) and g[1] == np.inf and np.isnan(g[2]) and g[3] == 0.0 and np.signbit(g[4])


def test_capture_close_let_a_huge_element_hide_wrong_small_ones() -> None:
    """Finding (open low of the eleventh session): the backend's check of a partition's kernels against its ATen ops
    (``capture._close``, and ``as_accurate`` against float64 after it) compared the largest error with the tolerance
    times the largest magnitude, so ``[1e6, 5, 5, 5]`` passed for ``[1e6, 1, 1, 1]`` (and ``[1e4, 1.5, ...]`` in fp16).
    Each element is now also held to the tolerance of its own magnitude plus the median one."""
    torch = pytest.importorskip("torch")
    from verimirage.integrations.capture import _close, as_accurate

    for dt, wrong in ((torch.float32, 5.0), (torch.float16, 1.5), (torch.bfloat16, 1.5)):
        want = torch.tensor([1e4 if dt == torch.float16 else 1e6, 1.0, 1.0, 1.0]).to(dt)
        bad = want.clone()
        bad[1:] = wrong
        assert not _close(bad, want), dt
        assert not as_accurate(bad, want, want.double()), dt
        # rounding-sized differences (and an element as far from float64 as ATen's) still pass
        noisy = (want.double() * (1 + torch.tensor([1e-3, -1e-3, 2e-3, 0.0], dtype=torch.float64))).to(dt)
        assert _close(noisy, want), dt
        assert as_accurate(noisy, noisy, want.double()), dt
    # a softmax over large fp16 logits: ATen's fp16 result is far from float64, the kernel's closer: accepted
    x = torch.linspace(-3, 3, 64, dtype=torch.float64).reshape(4, 16) * 150
    ref = x.softmax(1)
    aten = x.half().softmax(1)
    got = ref.half()
    assert as_accurate(got, aten, ref)
    off = got.clone()
    off[0, :4] = off[0, :4] * 2 + 0.01  # (small probabilities beside a row's ~1: wrong by far more than rounding)
    assert not as_accurate(off, aten, ref)
    # a peaky fp16 softmax (its median probability 1.1e-7, an fp16 subnormal): results rounded one subnormal step
    # (6e-8) apart still pass (the per-element slack has the dtype's smallest normal in it)
    p = torch.full((1, 4096), math.exp(-16.0), dtype=torch.float64)
    p[0, 0] = 1.0
    p = p / p.sum()
    a16 = p.half()
    k16 = a16.clone()
    k16[0, 1::2] += 2.0**-24
    assert _close(k16, a16) and as_accurate(k16, a16, p)


@pytest.mark.gpu
def test_exp2_of_a_max_shift_flushes_subnormal_terms_a_later_factor_scales_up() -> None:
    """Finding (twelfth session, low, GPU only: the interpreter does not flush; fixed in afead57, exp2 only where
    the flush cannot show, codegen._flush_harmless, with tests/test_codegen_exp2.py): codegen 11 emitted a softmax's
    ``exp(x - max x)`` as ``tl.exp2((x - m) * log2e)``, whose ``ex2.approx.ftz`` flushes results below 2**-126 to 0.
    ``_max_shift`` justifies that by the row holding exp(0) = 1, but it matches any ``exp(x - max x)``, whatever
    reads it: times a per-element factor (here ``* y``, or ``P @ V`` with such a V row) a flushed term is an output
    of its row's size. ``exp(x - max x) * y`` with x = [0, -88.5, ...], y = [1, 3e38, ...] (fp32): float64 1.10 at
    [0, 1], and the pair is Proved. Only factors above ~1e36 (fp32 / bf16) make it visible."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("z3")  # (vm.verify; the device has z3 only where benchmarks/device_env.sh installed it)
    import verimirage as vm

    f32 = vm.float32
    t = vm.TensorType((2, 4), f32)
    mg = vm.MuGraph()
    x, y = mg.input("X", t.shape, f32), mg.input("Y", t.shape, f32)
    b = vm.BlockBuilder((1,))
    xi, yi = b.input(0, t, (0,)), b.input(1, t, (0,))
    b.output(b.mul(b.exp(b.sub(xi, b.max(xi, axis=1))), yi), (0,))
    (o,) = mg.custom(b.build(), [x, y])
    mg.output(o)
    g = vm.Graph()
    gx, gy = g.input("X", t.shape, f32), g.input("Y", t.shape, f32)
    g.output(g.mul(g.exp(g.sub(gx, g.max(gx, 1))), gy))
    assert isinstance(vm.verify(g, mg), vm.Proved)
    xs = np.array([[0.0, -88.5, -1.0, -2.0], [0.0, -100.0, -1.0, -90.0]])
    ys = np.array([[1.0, 3e38, 1.0, 1.0], [1.0, 1e38, 1.0, 3e38]])
    want = vm.evaluate(g, {"X": xs, "Y": ys})[0]
    tx, ty = (torch.tensor(v, dtype=torch.float32, device="cuda") for v in (xs, ys))
    got = vm.compile(mg)(tx, ty).double().cpu().numpy()
    # the flushed term: exp(-88.5) = 3.7e-39 is an fp32 subnormal, and times 3e38 an output of its row's size
    np.testing.assert_allclose(got[0, 1], want[0, 1], rtol=1e-4)
    # elsewhere fp32 itself rounds: exp(-100) = 3.7e-44 keeps 5 bits as a subnormal (3.78e-44 in fp32, 1.7% off
    # float64, times 1e38, on the device's first run of this test, 2026-11-27): the kernel must agree with fp32
    # arithmetic with subnormals (torch's expf), which is what no flush means
    ref32 = (torch.exp(tx - tx.amax(1, keepdim=True)) * ty).double().cpu().numpy()
    np.testing.assert_allclose(got, ref32, rtol=1e-4)
    np.testing.assert_allclose(got, want, rtol=2e-2)


def test_per_element_discount_of_40_passed_typical_elements_off_by_12_percent() -> None:
    """Finding (twelfth session, medium: the profiler's check of the GPU kernels against float64): the eleventh
    session's per-element discount of 40 lets each element be off by 40 tolerances of (its magnitude + the median),
    i.e. 16% of a typical element in fp16 (96% in bf16), and beside one large element (which hides them from the
    Frobenius and largest-error terms) 8 of 4096 elements off by 12% (fp16) or 60% (bf16) passed: 0.0015 <= 0.002,
    0.0075 <= 0.012. The term is there for exactly that case (``[1e6, 5, 5, 5]`` for ``[1e6, 1, 1, 1]``). At 20 the
    correct rotary kernels that motivated 40 (0.0176 on the H100, 0.012-0.021 simulated) still pass (2x margin)."""
    from verimirage.backend.profile import TOLERANCE, rel_error

    ref = np.ones(4096)
    ref[0] = 1e4
    for dt, off in (("f16", 1.12), ("f32", 1.12), ("bf16", 1.6)):
        bad = ref.copy()
        bad[1:9] *= off
        assert rel_error(bad, ref, dt) > TOLERANCE[dt], dt
        ok = ref * (1 + 0.2 * TOLERANCE[dt] * np.cos(np.arange(4096)))  # (rounding-sized errors pass)
        assert rel_error(ok, ref, dt) <= TOLERANCE[dt], dt


def test_fp16_norm_in_the_prologue_overflows_where_the_source_is_finite_and_the_fp_check_passes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding (twelfth session, medium; fixed in the thirteenth): the search's floating-point check
    (pipeline/fpsafe.py) scaled every input together, so where a candidate multiplies before the normalisation the
    source makes first, the source overflowed on the same input sets and they constrained nothing. The eleventh
    session's rule ``rms-norm-matmul`` (norm_into_projections) made ``((x * w) @ m) * r`` of ``rms_norm(x, w) @ m``:
    in fp16 the dot operand ``x * w`` is inf once ``|x w| > 65504`` (x near 3e4, w near 8: the Triton kernel gave
    NaN, the source a finite result within 4e-4 of float64), and the check passed it; ``vm.verify`` proves it (over
    the reals). Now (1) the check also scales each input alone (``fpsafe.ALONE_SETS``) and rejects that form, and
    (2) the lowering's product operand is the source's own ``x r w``, the row statistic computed before the loop
    (``rewrite.stabilise.prologue_norm_scales``, which also rewrites the old form wherever a lowering has it, as the
    e-graph reaches it by rms-norm-weight, mul-assoc and matmul-rowscale): finite on the same inputs, and passed by
    the stronger check. The old form's kernel is built here with that lowering step off."""
    pytest.importorskip("egglog")
    import verimirage as vm
    from verimirage.pipeline.fpsafe import evaluate_in_dtype, fp_safety
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import norm_into_projections

    h = vm.float16
    g = vm.Graph()
    g.output(g.matmul(g.rms_norm(g.input("X", (4, 64), h), g.input("G", (64,), h), eps=1e-5),
                      g.input("W", (64, 32), h)))
    old = vm.Graph()  # the eleventh session's form: x scaled by w in the prologue, the dot operand x * w
    x, w, m = old.input("X", (4, 64), h), old.input("G", (64,), h), old.input("W", (64, 32), h)
    r = old.rsqrt(old.shift(old.scale(old.sum(old.square(x), axis=1), 1 / 64), 1e-5))
    old.output(old.mul(old.matmul(old.mul(x, w), m), r))
    gn = norm_into_projections(g)
    assert gn is not None
    rng = np.random.default_rng(0)
    ins = {"X": rng.uniform(-3e4, 3e4, (4, 64)), "G": rng.uniform(-8, 8, 64), "W": rng.uniform(-0.1, 0.1, (64, 32))}
    ins = {k: v.astype(np.float16).astype(np.float64) for k, v in ins.items()}
    (src,), src_over = evaluate_in_dtype(g, ins)
    assert np.isfinite(src).all() and not src_over
    import verimirage.rewrite.stabilise as st

    with monkeypatch.context() as mp:
        mp.setattr(st, "prologue_norm_scales", lambda mg: None)
        old_mg = next(low.mugraph for low in lower_all(old, rank=pricing.cost)[0] if low.mugraph.num_kernels == 1)
    for form, safe in ((old_mg, False), (gn, True), (old, True)):
        mg = form if safe is False else next(low.mugraph for low in lower_all(form, rank=pricing.cost)[0]
                                             if low.mugraph.num_kernels == 1)
        assert isinstance(vm.verify(g, mg), vm.Proved)
        (cand,), _ = evaluate_in_dtype(mg, ins)
        assert np.isfinite(cand).all() == safe  # (the hazard is real for the old form, gone for the new one)
        why = fp_safety(g, mg)
        assert (why is None) == safe, why
        if not safe:
            assert "alone" in str(why)  # (found by scaling one input alone: every together set passes it)
        else:
            np.testing.assert_allclose(cand, src, rtol=0, atol=2e-3 * np.abs(src).max())
