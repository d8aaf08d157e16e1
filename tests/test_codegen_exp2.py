"""A softmax's ``exp(x - max x)`` is emitted as ``tl.exp2`` with log2(e) folded into one FMA (codegen 11, issue 22):
which exps qualify, and that the kernels still match float64 in the interpreter, large logits and NaN included."""

from __future__ import annotations

import numpy as np
import pytest

import verimirage as vm
from verimirage.backend.codegen import _LOG2E, generate

pytest.importorskip("egglog")  # the search (rewrite/) needs it; the GPU machine has none
from verimirage.pipeline import pricing
from verimirage.rewrite.partition import lower_all

H, N, D = 2, 32, 16


def _attention(shift: str, dt: vm.DType = vm.float32) -> vm.Graph:
    """softmax(Q K) V with the logits shifted by their own row max (``own``), by the max of another input's rows
    (``other``) or not at all (``none``)."""
    g = vm.Graph()
    q, k, v = g.input("Q", (H, N, D), dt), g.input("K", (H, D, N), dt), g.input("V", (H, N, D), dt)
    s = g.matmul(q, k)
    if shift == "own":
        s = g.sub(s, g.max(s, axis=2))
    elif shift == "other":
        y = g.input("Y", (H, N, N), vm.float32)
        s = g.sub(s, g.max(y, axis=2))
    e = g.exp(s)
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    return g


def _fused(g: vm.Graph, frange: int) -> vm.Graph:
    lows, _ = lower_all(g, grids=(H,), franges=(frange,), rank=pricing.cost)
    return next(low.mugraph for low in lows if low.mugraph.num_kernels == 1)


def _ins(rng: np.random.Generator, scale: float, other: bool = False) -> dict[str, np.ndarray]:
    ins = {"Q": rng.uniform(-1, 1, (H, N, D)) * scale, "K": rng.uniform(-1, 1, (H, D, N)),
           "V": rng.uniform(-1, 1, (H, N, D))}
    if other:
        ins["Y"] = rng.uniform(-1, 1, (H, N, N))
    return ins


def _run(mg: vm.Graph, ins: dict[str, np.ndarray], half: bool = False) -> np.ndarray:
    torch = pytest.importorskip("torch")
    names = [t.name for t in mg.inputs]
    out = vm.compile(mg)(*[torch.tensor(ins[x], dtype=torch.float16 if half else torch.float32) for x in names])
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.double().numpy()


@pytest.mark.parametrize("frange", [1, 2])  # one tile (max) and the online softmax (running_max)
def test_a_max_shifted_exp_is_exp2_and_matches_float64(frange: int) -> None:
    """fp16 kernels (every input and output fp16): exp2 (ex2.approx.ftz); a flushed term times an fp16 V value
    stays far below fp16's resolution (codegen._flush_harmless)."""
    g = _attention("own", vm.float16)
    mg = _fused(g, frange)
    src = generate(mg).source
    assert f") * {_LOG2E})" in src and "tl.exp(" not in src, src
    rng = np.random.default_rng(3)
    # scale 60: logits up to ~1000 apart in a row, so most terms underflow (flushed to 0 by exp2's ftz)
    for scale in (1.0, 60.0):
        ins = {k: v.astype(np.float16).astype(np.float64) for k, v in _ins(rng, scale).items()}
        np.testing.assert_allclose(_run(mg, ins, half=True), vm.evaluate(g, ins)[0], rtol=4e-3, atol=2e-3)


@pytest.mark.parametrize("frange", [1, 2])
def test_an_fp32_softmax_keeps_its_subnormal_terms(frange: int) -> None:
    """Red team finding (twelfth session, tests/test_redteam_session12.py): with fp32 (or bf16) V a term flushed
    below 2**-126 times a V value near 3e38 is an output's size, so an fp32 kernel's softmax keeps tl.exp (and
    the online rescale too): the exp2 form only where the flush cannot show."""
    g = _attention("own")
    mg = _fused(g, frange)
    src = generate(mg).source
    assert "tl.exp2(" not in src and "tl.exp(" in src, src
    rng = np.random.default_rng(3)
    ins = _ins(rng, 1.0)
    # every row of head 0: logits 0, -88.5 (exp: 3.6e-39, subnormal in fp32), -1000...; V's row at key 1 3e38
    ins["Q"][0] = 0.0
    ins["Q"][0, :, 0] = 1.0
    ins["K"][0] = -1000.0
    ins["K"][0, 0, 0] = 0.0
    ins["K"][0, 0, 1] = -88.5
    ins["V"][0, 0] = 0.0
    ins["V"][0, 1] = 3e38
    want = vm.evaluate(g, ins)[0]
    assert abs(want[0, 0, 0]) > 0.5  # the subnormal term times 3e38 is of the row's size
    np.testing.assert_allclose(_run(mg, ins), want, rtol=1e-4, atol=1e-5)


def test_a_nan_logit_makes_its_row_nan_as_in_the_graph() -> None:
    g = _attention("own")
    mg = _fused(g, 2)
    ins = _ins(np.random.default_rng(4), 1.0)
    ins["Q"][1, 5, 3] = np.nan
    ins["K"][0, 2, 7] = np.inf  # every row of head 0 meets an infinite logit (sign by Q's element)
    want = vm.evaluate(g, ins)[0]
    got = _run(mg, ins)
    assert np.isnan(want[1, 5]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("shift", ["other", "none"])
def test_an_exp_not_shifted_by_its_own_max_keeps_tl_exp(shift: str) -> None:
    # exp(x - max y) or exp(x) need not hold a 1 in each row: a flushed term could be the whole row
    g = _attention(shift)
    mg = _fused(g, 1)
    src = generate(mg).source
    assert "tl.exp(" in src and "tl.exp2(" not in src, src
    ins = _ins(np.random.default_rng(5), 1.0, other=shift == "other")
    np.testing.assert_allclose(_run(mg, ins), vm.evaluate(g, ins)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dt", ["float16", "float32"])
def test_a_max_shifted_exp_times_another_value_keeps_tl_exp(dt: str) -> None:
    """``exp(x - max x) * y`` (the red team's graph): a product by a value other than a contraction with an fp16
    input can scale a flushed term up, in fp16 as in fp32, so it keeps tl.exp."""
    f = getattr(vm, dt)
    t = vm.TensorType((2, 4), f)
    mg = vm.MuGraph()
    x, y = mg.input("X", t.shape, f), mg.input("Y", t.shape, f)
    b = vm.BlockBuilder((1,))
    xi, yi = b.input(0, t, (0,)), b.input(1, t, (0,))
    b.output(b.mul(b.exp(b.sub(xi, b.max(xi, axis=1))), yi), (0,))
    (o,) = mg.custom(b.build(), [x, y])
    mg.output(o)
    src = generate(mg).source
    assert "tl.exp(" in src and "tl.exp2(" not in src, src


def _floored_flash(n: int, frange: int, lo: float, hi: float) -> tuple[vm.Graph, vm.Graph]:
    """``softmax(Q K + BIAS) @ V`` (fp16) and its online softmax over ``frange`` key tiles, each tile's max
    clamped to ``[lo, hi]`` before the running max (``partition.RUNNING_MAX_FLOOR``'s form when the bounds are
    fp32's finite range)."""
    f16 = vm.float16
    g = vm.Graph()
    q, k = g.input("Q", (H, n, D), f16), g.input("K", (H, D, n), f16)
    v, bias = g.input("V", (H, n, D), f16), g.input("BIAS", (H, n, n), f16)
    s = g.add(g.matmul(q, k), bias)
    e = g.exp(g.sub(s, g.max(s, axis=2)))
    g.output(g.matmul(g.div(e, g.sum(e, axis=2)), v))
    mg = vm.MuGraph()
    ts = [mg.input("Q", (H, n, D), f16), mg.input("K", (H, D, n), f16), mg.input("V", (H, n, D), f16),
          mg.input("BIAS", (H, n, n), f16)]
    b = vm.BlockBuilder((H,), frange)
    qt, kt = b.input(0, ts[0].type, (0,)), b.input(1, ts[1].type, (0,), 2)
    vt, bt = b.input(2, ts[2].type, (0,), 1), b.input(3, ts[3].type, (0,), 2)
    st = b.add(b.matmul(qt, kt), bt)
    m = b.running_max(b.clamp(b.max(st, axis=2), lo, hi))
    et = b.exp(b.sub(st, m))
    b.output(b.div(b.rescaled_sum(b.matmul(et, vt), m), b.rescaled_sum(b.sum(et, axis=2), m)), (0,))
    (o,) = mg.custom(b.build(), ts)
    mg.output(o)
    return g, mg


def test_the_floored_online_softmax_lost_its_exp2() -> None:
    """The seventeenth session's floor (``partition.RUNNING_MAX_FLOOR``: each tile's max clamped to fp32's finite
    range before the running max) put a clamp between ``max`` and ``running_max``, and ``_max_shift`` no longer
    recognised the softmax: every floored online softmax (causal, softcap, rotary, bias attention, the stored
    candidates re-derived by ``rewrite/floor.py``) went back to ``tl.exp``, the non-ftz ex2 with ptxas's fix-up
    (codegen 11's 5-10% on the H100 undone). Such a clamp changes only infinite maxes, so the exp2 form's flush
    argument still holds (``codegen._finite_identity_clamp``); checked here against float64, with rows whose
    first key tiles a -inf bias masks (the floor's case), logits ~1000 apart (most terms flushed) and a NaN."""
    n = 64
    lo, hi = -3.4028234663852886e38, 3.4028234663852886e38
    g, mg = _floored_flash(n, 4, lo, hi)
    src = generate(mg).source
    assert "tl.exp(" not in src, src
    assert src.count(f") * {_LOG2E})") == 2, src  # the terms and the rescale
    rng = np.random.default_rng(7)
    for scale in (1.0, 60.0):
        ins = {"Q": rng.uniform(-1, 1, (H, n, D)) * scale, "K": rng.uniform(-1, 1, (H, D, n)),
               "V": rng.uniform(-1, 1, (H, n, D)), "BIAS": np.zeros((H, n, n))}
        ins["BIAS"][0, :, : n // 2] = -np.inf  # head 0: the first two key tiles of every row masked
        ins["BIAS"][1, 3, 5] = np.nan
        ins = {k: v.astype(np.float16).astype(np.float64) for k, v in ins.items()}
        want = vm.evaluate(g, ins)[0]
        got = _run(mg, ins, half=True)
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want[1, 3]).all()
        np.testing.assert_allclose(got, want, rtol=4e-3, atol=2e-3, equal_nan=True)


@pytest.mark.parametrize("bounds", [(0.0, 3.4028234663852886e38), (-3.4028234663852886e38, 1e4)])
def test_a_clamp_of_the_max_that_changes_finite_values_keeps_tl_exp(bounds: tuple[float, float]) -> None:
    """A clamp that can move a finite max (``lo = 0`` puts ``m`` above a row of negative logits, whose terms can
    then all be below 2**-126) is not looked through: ``tl.exp``, as for any exp not shifted by its own max."""
    _, mg = _floored_flash(64, 4, *bounds)
    src = generate(mg).source
    assert "tl.exp(" in src, src
