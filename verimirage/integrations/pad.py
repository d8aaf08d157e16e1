"""Lifting the padding modes other than zeros, and the in-place writes a functional graph records as new tensors.

``F.pad(x, p, mode="reflect")`` (``nn.Conv2d(..., padding_mode="reflect")``) is ATen's ``reflection_pad{1,2,3}d``
and ``mode="replicate"`` its ``replication_pad{1,2,3}d``; per padded dim (the last first, as ``F.pad``'s list), the
result is a concatenation of the input with slices of it: for reflect the ``lo`` rows ``x[lo], ..., x[1]`` before
and ``x[n-2], ..., x[n-1-hi]`` after (one-row slices: the registry has no reversal), for replicate the first and
last rows broadcast ``lo`` and ``hi`` times. The backward is the adjoint: the gradient's middle rows, plus each
reflected row's gradient added at the row it copies (placed among zeros), or the first and last rows' gradients
summed with theirs.

``mode="circular"`` is written by torch as a functional graph of in-place writes: an uninitialised tensor
(``new_empty``), ``copy`` of a slice into a slice of it and ``slice_scatter`` of the result back, once per side,
and for the backward ``new_empty_strided``, ``copy``, ``zeros_like``, ``slice_scatter`` and ``slice_backward``.
Lifted here: ``slice_scatter(base, src, dim, start, end, step)`` (the base with a window replaced: a concatenation of
the base's slices around ``src``), ``copy(dst, src)`` (``src`` in ``dst``'s dtype and shape; ``dst``'s values are
not read) and the allocations (``new_empty``, ``empty_like``, ... whose values ATen leaves unspecified: zeros here, one
of the values they may hold; what reads them before they are written is compared with ATen's by the capture's check
like any other result, and refused where it differs).
"""

from __future__ import annotations

import math
from typing import Any

from ..ir.builders import Tensor
from .aten import LV, Ctx, Reason, Unsupported, _constant, _shape, emit, handles, op_of, vm_dtype

__all__: list[str] = []

#: the allocations whose values ATen leaves unspecified (lifted as zeros)
#: (``empty`` and ``empty_strided``, which read no tensor whose device they could be checked against, are not)
UNINITIALISED = ("empty_like", "new_empty", "new_empty_strided")


def _pads(ctx: Ctx, v: Any, pad: Any, what: str) -> list[tuple[int, int, int]]:
    """Per padded dim of ``v``: ``(dim, lo, hi)`` from ``F.pad``'s list (the last dim first)."""
    if not isinstance(v, LV) or v.mask or v.cplx or v.negated or v.fill is not None or v.integral:
        raise Unsupported(Reason.NOT_IN_REGISTRY, f"{what} of anything but a float tensor")
    if not isinstance(pad, (list, tuple)) or len(pad) % 2 or not all(isinstance(p, int) for p in pad) \
            or len(pad) // 2 > len(v.shape) or min(pad, default=0) < 0:
        raise Unsupported(Reason.LAYOUT, f"{what} with padding {pad!r} (static, non-negative sizes)")
    if not ctx.layout("slice"):
        raise Unsupported(Reason.LAYOUT, f"{what} needs the registry's slice")
    r = len(v.shape)
    return [(r - 1 - i, int(pad[2 * i]), int(pad[2 * i + 1])) for i in range(len(pad) // 2)]


def _rows(g: Any, t: Tensor, d: int, idx: list[int]) -> list[Tensor]:
    return [emit(g, "slice", t, d, i, i + 1) for i in idx]


def _zeros(ctx: Ctx, like: Tensor, d: int, k: int, dt: Any) -> list[Tensor]:
    if k <= 0:
        return []
    shape = list(like.shape)
    shape[d] = k
    return [ctx.exact(_constant(ctx, shape, dt, 0.0))]


def _cat(g: Any, parts: list[Tensor], d: int) -> Tensor:
    return parts[0] if len(parts) == 1 else emit(g, "concat", parts, d)


def _check_sizes(reflect: bool, n: int, lo: int, hi: int) -> None:
    if reflect and max(lo, hi) >= n:
        raise Unsupported(Reason.LAYOUT, f"a reflection pad ({lo}, {hi}) of a dim of {n} (each must be below it)")
    if not reflect and n < 1:
        raise Unsupported(Reason.LAYOUT, "a replication pad of an empty dim")


@handles("reflection_pad1d", "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
         "replication_pad3d")
def _pad_mode(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``F.pad(x, pad, mode="reflect" | "replicate")``: per padded dim, the input between slices of itself."""
    reflect = op_of(ctx).startswith("reflection")
    g, t = ctx.g, ctx.exact(args[0]) if isinstance(args[0], LV) else None
    for d, lo, hi in _pads(ctx, args[0], args[1], "a reflection or replication pad"):
        assert t is not None
        n = t.shape[d]
        _check_sizes(reflect, n, lo, hi)
        if reflect:
            parts = [*_rows(g, t, d, list(range(lo, 0, -1))), t, *_rows(g, t, d, list(range(n - 2, n - 2 - hi, -1)))]
        else:
            parts = [t]
            for k, at, row in ((lo, 0, 0), (hi, 1, n - 1)):
                if k:
                    shape = list(t.shape)
                    shape[d] = k
                    parts.insert(at * len(parts), emit(g, "broadcast_to", emit(g, "slice", t, d, row, row + 1),
                                                       tuple(shape)))
        t = _cat(g, parts, d)
    assert t is not None
    return LV(t, _shape(out))


@handles("reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
         "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward")
def _pad_mode_bw(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """The adjoint of :func:`_pad_mode` (``grad_output, self, padding``; ``self`` only for its shape)."""
    reflect = op_of(ctx).startswith("reflection")
    gr, pad = args[0], args[2]
    shape, dt = out
    g = ctx.g
    pads = _pads(ctx, gr, pad, "a reflection or replication pad's gradient")
    t = ctx.exact(gr)
    for d, lo, hi in pads:
        n = shape[d]
        _check_sizes(reflect, n, lo, hi)
        if t.shape[d] != n + lo + hi:
            raise Unsupported(Reason.LAYOUT, f"a pad's gradient of {t.shape[d]} rows for {n} + {lo} + {hi}")
        mid = emit(g, "slice", t, d, lo, lo + n) if lo or hi else t
        if reflect:  # input row i gets the rows that copy it: lo - i (1 <= i <= lo), lo + 2 n - 2 - i (after)
            terms = [mid]
            if lo:
                terms.append(_cat(g, [*_zeros(ctx, mid, d, 1, dt), *_rows(g, t, d, list(range(lo - 1, -1, -1))),
                                      *_zeros(ctx, mid, d, n - 1 - lo, dt)], d))
            if hi:
                after = [lo + 2 * n - 2 - i for i in range(n - 1 - hi, n - 1)]
                terms.append(_cat(g, [*_zeros(ctx, mid, d, n - 1 - hi, dt), *_rows(g, t, d, after),
                                      *_zeros(ctx, mid, d, 1, dt)], d))
            t = terms[0]
            for x in terms[1:]:
                t = emit(g, "add", t, x)
        elif n == 1:
            t = emit(g, "sum", t, d)
        else:  # the first row's gradient summed with the lo rows before it, the last's with the hi rows after
            first = emit(g, "sum", emit(g, "slice", t, d, 0, lo + 1), d) if lo else emit(g, "slice", t, d, 0, 1)
            last = emit(g, "sum", emit(g, "slice", t, d, lo + n - 1, lo + n + hi), d) if hi else \
                emit(g, "slice", t, d, lo + n - 1, lo + n)
            inner = [emit(g, "slice", t, d, lo + 1, lo + n - 1)] if n > 2 else []
            t = _cat(g, [first, *inner, last], d)
    return LV(t, tuple(shape))


@handles("slice_scatter")
def _slice_scatter(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``slice_scatter(base, src, dim, start, end, step)``: ``base`` with its window ``[start, end)`` along ``dim``
    replaced by ``src`` (step 1; a functional graph's write into a slice)."""
    base, src = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    start = args[3] if len(args) > 3 else kwargs.get("start")
    end = args[4] if len(args) > 4 else kwargs.get("end")
    step = args[5] if len(args) > 5 else kwargs.get("step", 1)
    if not (isinstance(base, LV) and isinstance(src, LV)) or any(
            v.mask or v.cplx or v.negated or v.fill is not None for v in (base, src)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "slice_scatter of anything but float tensors")
    if int(step) != 1:
        raise Unsupported(Reason.LAYOUT, f"slice_scatter with step {step}")
    shape = _shape(out)
    d = int(dim) % len(shape)
    n = shape[d]
    s = 0 if start is None else max(0, min(n, int(start) + n if int(start) < 0 else int(start)))
    e = n if end is None else max(s, min(n, int(end) + n if int(end) < 0 else int(end)))
    if src.shape[d] != e - s:
        raise Unsupported(Reason.LAYOUT, f"slice_scatter of {src.shape[d]} rows into [{s}, {e})")
    if e == s:
        return base
    g, b = ctx.g, ctx.exact(base)
    parts = ([emit(g, "slice", b, d, 0, s)] if s else []) + [ctx.exact(src)] + \
        ([emit(g, "slice", b, d, e, n)] if e < n else [])
    if len(parts) > 1 and not ctx.layout("slice"):
        raise Unsupported(Reason.LAYOUT, "slice_scatter needs the registry's slice")
    return LV(_cat(g, parts, d), shape)


@handles("copy")
def _copy(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``copy(dst, src)``: ``src`` converted to ``dst``'s dtype and broadcast to its shape (``dst``'s values are not
    read: :func:`verimirage.integrations.aten.unread_args`)."""
    src = args[1]
    shape, dt = out
    if not isinstance(src, LV) or src.mask or src.cplx or src.negated or src.fill is not None \
            or not dt.is_floating_point:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "copy of anything but a float tensor into a float tensor")
    t = ctx.exact(src)
    if t.dtype != vm_dtype(dt):
        t = emit(ctx.g, "cast", t, vm_dtype(dt))
    if tuple(t.shape) != tuple(shape):
        return LV(t, tuple(shape), bcast=True)
    return LV(t, tuple(shape))


@handles(*UNINITIALISED, "zeros_like")
def _zeros_like(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``zeros_like(x)``, and an allocation whose values ATen leaves unspecified, as zeros (see the module's
    docstring); ``x`` is read only for its shape."""
    shape, dt = out
    if not dt.is_floating_point:
        raise Unsupported(Reason.DTYPE, f"an allocation of dtype {dt}")
    return _constant(ctx, shape, dt, 0.0)


@handles("roll")
def _roll(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``torch.roll(x, shifts, dims)`` (Swin's shifted windows; its gradient is the roll back): per dim, the last
    ``shift`` rows then the others, a concatenation of two slices. Without ``dims``, over the flattened tensor."""
    v = args[0]
    shifts = args[1] if len(args) > 1 else kwargs.get("shifts")
    dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts or [])
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if not isinstance(v, LV) or v.mask or v.cplx or v.negated or v.fill is not None:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "roll of anything but a float tensor")
    if not all(isinstance(s, int) for s in (*shifts, *dims)) or len(shifts) != max(len(dims), 1):
        raise Unsupported(Reason.LAYOUT, f"roll by {shifts!r} along {dims!r} (static shifts, one a dim)")
    if not ctx.layout("slice"):
        raise Unsupported(Reason.LAYOUT, "roll needs the registry's slice")
    g, shape = ctx.g, _shape(out)
    t = ctx.exact(v)
    flat = not dims
    if flat:
        t, dims = emit(g, "reshape", t, (math.prod(shape),)), [0]
    for s, d in zip(shifts, dims, strict=True):
        d %= len(t.shape)
        n = t.shape[d]
        k = s % n if n else 0
        if k:
            t = emit(g, "concat", [emit(g, "slice", t, d, n - k, n), emit(g, "slice", t, d, 0, n - k)], d)
    return LV(emit(g, "reshape", t, shape) if flat else t, shape)


@handles("_weight_norm_interface")
def _weight_norm(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[LV, LV]:
    """``torch._weight_norm_interface(v, g, dim)`` (``nn.utils.parametrizations.weight_norm``: vocoders, WaveNet):
    ``(v g / |v|, |v|)``, the norm over every dim of ``v`` but ``dim`` (kept as size 1, ``g``'s shape)."""
    v, gain = args[0], args[1]
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    if not all(isinstance(a, LV) and not (a.mask or a.cplx or a.negated or a.fill is not None) for a in (v, gain)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "_weight_norm_interface of anything but float tensors")
    g, t = ctx.g, ctx.exact(v)
    r = len(v.shape)
    d = int(dim) % r if int(dim) != -1 else r - 1
    sq = emit(g, "square", t)
    for a in range(r):
        if a != d:
            sq = emit(g, "sum", sq, a)
    norm = emit(g, "sqrt", sq)  # (1, .., n_d, .., 1): g's shape
    if tuple(norm.shape) != tuple(gain.shape) or tuple(norm.shape) != tuple(out[1][0]):
        raise Unsupported(Reason.LAYOUT, f"_weight_norm_interface with g of shape {gain.shape}")
    w = emit(g, "mul", t, emit(g, "div", ctx.exact(gain), norm))
    return LV(w, _shape(out[0])), LV(norm, tuple(out[1][0]))
