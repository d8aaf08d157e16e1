"""The checks a generated test module runs: reference comparison and metamorphic properties.

Tolerances
----------
A kernel output ``out`` of dtype ``d`` passes against the float64 reference
``ref`` when, elementwise,

    |out - ref| <= rtol * |ref| + atol * rms(ref) + floor

with ``rtol = atol = u * (4 + log2(K) + D)``: ``u`` the unit roundoff of the
working precision (2**-11 for float16, 2**-8 for bfloat16, 2**-24 for float32,
or 2**-11 for float32 graphs with a matmul when TF32 is allowed, as Triton's
``tl.dot`` does by default on a GPU), ``K`` the graph's longest reduction
(matmul contraction, reduced or normalised axis): a pairwise or blocked
``K``-term sum rounds ``log2(K)`` times along any path (and errors measured
against ``rms(ref)`` do not grow like the worst-case ``K u``), and ``D`` the
longest chain of ops (an
unfused kernel rounds every intermediate to the dtype; Triton's CPU
interpreter truncates rather than rounds bfloat16). ``rms(ref)`` is the output's
root-mean-square, so cancellation in a single element does not demand more
than the precision can give; ``floor`` covers results in the subnormal range.
These are a few ulps: a kernel that is 1% off fails.

Inputs whose reference result is not finite, or does not fit the output
dtype, are outside the program's domain and are rejected (``assume``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.graph import Graph
from ..ir.reference import evaluate
from .analysis import BatchDim, ScalingProperty, ShiftPlan, analyze, degree_factor

UNIT_ROUNDOFF: dict[str, float] = {"f16": 2.0**-11, "bf16": 2.0**-8, "f32": 2.0**-24}
TF32_ROUNDOFF = 2.0**-11
_FINFO = {"f16": (65504.0, 2.0**-24), "bf16": (3.3895e38, 2.0**-133), "f32": (3.4028e38, 2.0**-149)}


@dataclass(frozen=True)
class Tolerance:
    """Allowed error of one output: ``rtol * |ref| + atol * rms(ref) + floor`` (see the module docstring)."""

    dtype: str
    rtol: float
    atol: float
    floor: float
    reduction_length: int = 1
    depth: int = 1

    def allowed(self, ref: np.ndarray) -> np.ndarray:
        """Elementwise allowed |error| for reference values ``ref``."""
        finite = ref[np.isfinite(ref)]
        rms = float(np.sqrt(np.mean(finite * finite))) if finite.size else 0.0
        return self.rtol * np.abs(ref) + self.atol * rms + self.floor


def tolerances(g: Graph, *, allow_tf32: bool = True) -> list[Tolerance]:
    """One :class:`Tolerance` per output of ``g`` (per-dtype, scaled by the longest reduction)."""
    facts = analyze(g)
    k = facts.reduction_length
    depth = facts.depth
    out = []
    for t in g.outputs:
        d = t.dtype.short
        u = UNIT_ROUNDOFF[d]
        if d == "f32" and allow_tf32 and facts.has_matmul:
            u = TF32_ROUNDOFF
        r = u * (4.0 + math.log2(k) + depth)
        out.append(Tolerance(d, r, r, 4.0 * _FINFO[d][1], k, depth))
    return out


# --------------------------------------------------------------------------- running kernels


def as_numpy(t: Any) -> np.ndarray:
    """A float64 numpy copy of a torch tensor (or array)."""
    if hasattr(t, "detach"):
        return t.detach().cpu().double().numpy()
    return np.asarray(t, dtype=np.float64)


def call(kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any]) -> list[Any]:
    """``kernel(*inputs in g's order)`` as a list of output tensors, checked for count, shape and dtype."""
    import torch

    args = [case[n] for n in g.input_names()]
    res = kernel(*args)
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    want = g.outputs
    assert len(outs) == len(want), f"kernel returned {len(outs)} output(s); the graph has {len(want)}"
    for i, (o, t) in enumerate(zip(outs, want, strict=True)):
        assert isinstance(o, torch.Tensor), f"output {i}: kernel returned {type(o).__name__}; expected a torch.Tensor"
        assert tuple(o.shape) == t.shape, f"output {i}: shape {tuple(o.shape)}; expected {t.shape}"
        exp_dt = getattr(torch, t.dtype.torch_name)
        assert o.dtype == exp_dt, f"output {i}: dtype {o.dtype}; expected {exp_dt}"
    return outs


def reference(g: Graph, case: Mapping[str, Any]) -> list[np.ndarray]:
    """Float64 reference outputs; rejects (hypothesis ``assume``) inputs outside the program's domain."""
    from hypothesis import assume

    refs = evaluate(g, case)
    for r, t in zip(refs, g.outputs, strict=True):
        assume(bool(np.all(np.isfinite(r))))
        assume(bool(np.all(np.abs(r) <= _FINFO[t.dtype.short][0] / 2)))
    return refs


def assert_close(
    outs: Sequence[Any], refs: Sequence[np.ndarray], tols: Sequence[Tolerance], what: str = "kernel vs reference",
    slack: float = 1.0,
) -> None:
    """Assert every output is within its tolerance (times ``slack``) of its reference; a readable message if not."""
    for i, (o, r, tol) in enumerate(zip(outs, refs, tols, strict=True)):
        got = as_numpy(o)
        allowed = slack * tol.allowed(r)
        err = np.abs(got - r)
        bad = ~(err <= allowed)  # NaN counts as bad
        if bad.any():
            ratio = np.where(allowed > 0, err / np.maximum(allowed, 1e-300), np.inf)
            ratio = np.where(np.isnan(ratio), np.inf, ratio)
            j = np.unravel_index(int(np.argmax(ratio)), r.shape)
            raise AssertionError(
                f"{what}: output {i} ({tol.dtype}) differs at {int(bad.sum())} of {bad.size} elements; worst at "
                f"{tuple(int(x) for x in j)}: got {float(got[j]):.6g}, expected {float(r[j]):.6g}, "
                f"|error| {err[j]:.3g} > allowed "
                f"{allowed[j]:.3g} (rtol={tol.rtol * slack:.3g}, atol={tol.atol * slack:.3g} x rms, "
                f"K={tol.reduction_length}, D={tol.depth}); max |error| / allowed = {float(np.max(ratio)):.3g}"
            )


def error_ratio(outs: Sequence[Any], refs: Sequence[np.ndarray], tols: Sequence[Tolerance]) -> float:
    """max |error| / allowed over all outputs (< 1 passes); inf for NaN where the reference is finite."""
    worst = 0.0
    for o, r, tol in zip(outs, refs, tols, strict=True):
        err = np.abs(as_numpy(o) - r)
        allowed = tol.allowed(r)
        ratio = np.where(np.isnan(err), np.inf, err / np.maximum(allowed, 1e-300))
        worst = max(worst, float(np.max(ratio)) if ratio.size else 0.0)
    return worst


def check_reference(
    kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any], tols: Sequence[Tolerance],
    refs: Sequence[np.ndarray] | None = None,
) -> None:
    """The kernel matches the float64 reference on ``case`` (``refs``: the reference outputs, if computed already)."""
    refs = reference(g, case) if refs is None else refs
    outs = call(kernel, g, case)
    assert_close(outs, refs, tols)


def _bits(t: Any) -> Any:
    import torch

    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def check_deterministic(kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any]) -> None:
    """Two runs give bit-identical outputs, and the inputs are left unchanged."""
    import torch

    before = {k: _bits(v).clone() for k, v in case.items()}
    a = call(kernel, g, case)
    b = call(kernel, g, case)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(_bits(x), _bits(y)), f"output {i} differs between two runs on the same inputs"
    for k, v in case.items():
        assert torch.equal(_bits(v), before[k]), f"the kernel modified its input {k!r}"


# --------------------------------------------------------------------------- metamorphic properties


def shifted_case(
    g: Graph, case: Mapping[str, Any], plan: ShiftPlan, seed: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two input dicts whose softmax logits differ by a per-row constant and agree elsewhere.

    For matmul logits, slice 0 of ``plan.pin``'s contraction dim is set to 1
    in both; the shift goes into slice 0 of the target's contraction dim, so
    the change of each row's logits is exactly one element's change (rounding
    of the shifted input cannot break the per-row constancy). For logits that
    are an input, values and shifts are put on a grid that the dtype holds
    exactly.
    """
    import torch

    rng = np.random.default_rng(seed)
    base = {k: v.clone() for k, v in case.items()}
    tgt = base[plan.target]
    if plan.pin is not None:
        pin = base[plan.pin]
        pin.select(plan.pin_axis, 0).fill_(1.0)
        col = tgt.select(plan.target_contraction_axis, 0)
        shift = torch.from_numpy(rng.uniform(-4, 4, tuple(col.shape))).to(col.dtype).to(col.device)
        shifted = {k: v.clone() for k, v in base.items()}
        shifted[plan.target].select(plan.target_contraction_axis, 0).add_(shift)
        return base, shifted
    mant = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24}[tgt.dtype]
    q = 2.0 ** (5 - mant)  # values below 32 on a grid of q are exact in the dtype
    v = as_numpy(tgt)
    v = np.clip(np.round(v / q) * q, -12, 12)
    shape = list(v.shape)
    shape[plan.target_axis] = 1
    c = np.round(rng.uniform(-8, 8, shape) / q) * q
    t0 = torch.from_numpy(v).to(tgt.dtype).to(tgt.device)
    t1 = torch.from_numpy(v + c).to(tgt.dtype).to(tgt.device)
    base[plan.target].copy_(t0)
    shifted = {k: x.clone() for k, x in base.items()}
    shifted[plan.target].copy_(t1)
    return base, shifted


def check_softmax_shift(
    kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any], plan: ShiftPlan, seed: int,
    tols: Sequence[Tolerance],
) -> None:
    """Softmax is unchanged by a per-row shift of its logits: the kernel's outputs agree on both inputs."""
    a, b = shifted_case(g, case, plan, seed)
    ra = reference(g, a)
    oa = call(kernel, g, a)
    ob = call(kernel, g, b)
    assert_close(ob, [as_numpy(x) for x in oa], tols, "softmax shift invariance (shifted vs unshifted run)",
                 slack=2.0)
    assert_close(oa, ra, tols, "kernel vs reference (unshifted run)")


def check_scaling(
    kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any], prop: ScalingProperty, alpha: float,
    tols: Sequence[Tolerance],
) -> None:
    """Scaling input ``prop.name`` by ``alpha`` (a power of two: exact) scales output i by ``alpha**degree_i``."""
    scaled = {k: (v * alpha if k == prop.name else v) for k, v in case.items()}
    reference(g, case)
    reference(g, scaled)
    base = call(kernel, g, case)
    out = call(kernel, g, scaled)
    want = [as_numpy(x) * degree_factor(alpha, d) for x, d in zip(base, prop.degrees, strict=True)]
    what = f"scaling {prop.name!r} by {alpha} (outputs x alpha**{[str(d) for d in prop.degrees]})"
    assert_close(out, want, tols, what, slack=2.0)


def gather_case(case: Mapping[str, Any], batch: BatchDim, idx: Sequence[int]) -> dict[str, Any]:
    """Inputs with the batch dim gathered at ``idx`` (other inputs unchanged)."""
    import torch

    out = {}
    for k, v in case.items():
        if k in batch.inputs:
            out[k] = v.index_select(0, torch.tensor(list(idx), device=v.device)).contiguous()
        else:
            out[k] = v
    return out


def check_batch(
    kernel: Callable[..., Any], g: Graph, case: Mapping[str, Any], batch: BatchDim, idx: Sequence[int],
    tols: Sequence[Tolerance],
) -> None:
    """The results for a gather (slice, permutation, repetition) of the batch equal that gather of the results."""
    import torch

    reference(g, case)
    full = call(kernel, g, case)
    part = call(kernel, g, gather_case(case, batch, idx))
    want = [as_numpy(o.index_select(ax, torch.tensor(list(idx), device=o.device)))
            for o, ax in zip(full, batch.output_axes, strict=True)]
    assert_close(part, want, tols, f"batch consistency (batch indices {list(idx)})", slack=2.0)
