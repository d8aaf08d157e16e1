"""Lifting ``aten.convolution`` and ``aten.convolution_backward`` into the registry's ops (im2col and a matmul).

A convolution of ``x`` ``(N, C, *S)`` with ``w`` ``(O, C/G, *K)`` (stride ``s``, zero padding ``p``, dilation ``d``,
``G`` groups) is a matmul once the input is gathered into columns: ``cols[n, c, k, l] = xp[n, c, k d + l s]`` per
spatial dim (``xp`` the input with ``p`` zeros each side), then ``y[n, g] = W[g] @ cols[n, g]`` with ``W`` the
weight viewed as ``(G, O/G, C/G * prod K)``. The gather needs only the registry's layout ops, per spatial dim:

- a *patch* dim (``s == K``, ``d == 1``: ViT's patch embedding, ConvNeXt's stem): the window ``[0, K Lo)`` viewed
  as ``(Lo, K)``, a reshape (no copy of each offset);
- any other dim: for each offset ``k``, the window ``[k d, k d + s Lo)`` viewed as ``(Lo, s)`` and its column 0
  (a slice when ``s == 1``), the ``K`` offsets concatenated along a new dim.

A depthwise convolution (one input and one output channel a group: ConvNeXt's 7x7) multiplies the columns by the
weight and sums over the offsets instead of a matmul of inner size ``prod K``.

The backward gives ``dW`` as the matmul of the output gradient with the same columns (the batch and positions
contracted), the bias's gradient as a sum, and the input's gradient as ``W^T @ dY`` scattered back: per spatial dim
each offset's columns are spread out by the stride (zeros between), placed at ``k d - p`` and summed (the adjoint of
the gather), which again needs only slices, reshapes, concatenations of zeros and adds.

A transposed convolution (``nn.ConvTranspose``: decoders, U-Nets) is the input gradient of the convolution it
transposes, and its backward that convolution and its weight gradient with input and output swapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..ir.builders import Tensor
from ..ir.dtypes import DType
from .aten import LV, Ctx, Reason, Unsupported, _constant, _num, _shape, emit, handles

__all__ = ["Conv"]


@dataclass(frozen=True)
class Conv:
    """The static description of one convolution: batch ``n``, channels ``c`` in and ``o`` out, ``groups``, input
    sizes ``size``, kernel ``k``, ``stride``, ``pad``, ``dil`` (one entry a spatial dim) and output sizes ``lo``."""

    n: int
    c: int
    o: int
    groups: int
    size: tuple[int, ...]
    k: tuple[int, ...]
    stride: tuple[int, ...]
    pad: tuple[int, ...]
    dil: tuple[int, ...]
    lo: tuple[int, ...]

    @property
    def kp(self) -> int:
        """Offsets per output position (the product of the kernel sizes)."""
        return math.prod(self.k)

    @property
    def lp(self) -> int:
        """Output positions (the product of the output sizes)."""
        return math.prod(self.lo)

    @property
    def depthwise(self) -> bool:
        """One input and one output channel a group."""
        return self.groups == self.c == self.o

    def patch(self, i: int) -> bool:
        """Whether spatial dim ``i`` is gathered as non-overlapping patches (a reshape)."""
        return self.stride[i] == self.k[i] and (self.dil[i] == 1 or self.k[i] == 1) and self.pad[i] == 0


def _ints(v: Any, n: int, what: str) -> tuple[int, ...]:
    if _num(v):
        return (int(v),) * n
    if not isinstance(v, (list, tuple)) or not all(_num(e) for e in v):
        raise Unsupported(Reason.DYNAMIC_SHAPE, f"convolution with a non-static {what} {v!r}")
    vs = tuple(int(e) for e in v)
    return vs * n if len(vs) == 1 else vs


def _float(v: Any) -> bool:
    return isinstance(v, LV) and not (v.mask or v.cplx or v.negated or v.integral or v.fill is not None)


def _shape_of(v: Any) -> tuple[int, ...]:
    """The ATen shape of a lifted value, or of an fx node the handler does not read (:func:`aten.unread_args`)."""
    if isinstance(v, LV):
        return v.shape
    val = v.meta.get("val") if hasattr(v, "meta") else None
    if val is None or not hasattr(val, "shape"):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "convolution of an operand that is not a tensor")
    return tuple(int(d) for d in val.shape)


def describe(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, transposed: Any, output_padding: Any,
             groups: Any) -> Conv:
    """The :class:`Conv` of ATen's ``convolution`` arguments (the operands lifted values, or fx nodes whose shapes
    only are read), or Unsupported naming what cannot be lifted."""
    xs, ws = _shape_of(x), _shape_of(w)
    if transposed:
        raise Unsupported(Reason.NOT_IN_REGISTRY, "a transposed convolution here (describe_transposed)")
    nd = len(xs) - 2
    if nd < 1 or len(ws) != nd + 2:
        raise Unsupported(Reason.LAYOUT, f"convolution of an input of rank {len(xs)} (batched inputs "
                                         "(N, C, *spatial) are lifted)")
    if any(int(e) for e in (output_padding or [])):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "convolution with output_padding")
    if isinstance(padding, str):
        raise Unsupported(Reason.LAYOUT, f"convolution with padding {padding!r}")
    st, pd, dl = _ints(stride, nd, "stride"), _ints(padding, nd, "padding"), _ints(dilation, nd, "dilation")
    if not (len(st) == len(pd) == len(dl) == nd) or min(st) < 1 or min(dl) < 1 or min(pd) < 0:
        raise Unsupported(Reason.LAYOUT, f"convolution with stride {st}, padding {pd}, dilation {dl}")
    n, c, size = xs[0], xs[1], tuple(xs[2:])
    o, k = ws[0], tuple(ws[2:])
    gr = int(groups) if _num(groups) else 0
    if gr < 1 or c % gr or o % gr or ws[1] * gr != c:
        raise Unsupported(Reason.LAYOUT, f"convolution with groups={groups!r} of {c} channels into {o}")
    lo = tuple((size[i] + 2 * pd[i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(nd))
    if min(lo) < 1:
        raise Unsupported(Reason.LAYOUT, f"convolution with an empty output {lo}")
    return Conv(n, c, o, gr, size, k, st, pd, dl, lo)


class _Zeros:
    """Zero tensors of a partition's dtype, one constant input a shape."""

    def __init__(self, ctx: Ctx, torch_dtype: Any) -> None:
        self.ctx, self.dtype = ctx, torch_dtype
        self.made: dict[tuple[int, ...], Tensor] = {}

    def __call__(self, shape: tuple[int, ...]) -> Tensor:
        if shape not in self.made:
            self.made[shape] = self.ctx.exact(_constant(self.ctx, shape, self.dtype, 0.0))
        return self.made[shape]


def _with(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1:])


def _fit(g: Any, zeros: _Zeros, t: Tensor, axis: int, start: int, length: int) -> Tensor:
    """The window ``[start, start + length)`` of ``t`` along ``axis``, zeros where it lies outside ``t``."""
    n = t.shape[axis]
    lo, hi = max(start, 0), min(start + length, n)
    if (lo, hi) != (0, n):
        t = emit(g, "slice", t, axis, lo, hi)
    parts = [t]
    if lo - start > 0:
        parts.insert(0, zeros(_with(tuple(t.shape), axis, lo - start)))
    if start + length - hi > 0:
        parts.append(zeros(_with(tuple(t.shape), axis, start + length - hi)))
    return t if len(parts) == 1 else emit(g, "concat", parts, axis)


def _phases(g: Any, zeros: _Zeros, t: Tensor, a: int, cv: Conv, i: int) -> tuple[Tensor, int]:
    """Spatial dim ``i`` (at axis ``a`` of ``t``) of stride ``s > 1``, zero-padded, as a grid ``(M, s)`` of rows of
    ``s`` consecutive positions, and ``e``: padded position ``e + m`` (``m``: ``m d + l s`` of a window) is the grid's
    ``divmod(e + m, s)``. The left padding is grown by ``e`` to a multiple of ``s`` and every part (zeros, the
    input's whole rows, its last partial row) is viewed as rows on its own before the rows are concatenated, so a
    strided read is a slice of rows and one of a phase column: a concatenation read only along its own axis,
    which the verifier's abstraction resolves (a concatenation read at ``s l + c`` it cannot)."""
    k, s, d, lo, p, size = cv.k[i], cv.stride[i], cv.dil[i], cv.lo[i], cv.pad[i], cv.size[i]
    shape = tuple(t.shape)
    head, tail = shape[:a], shape[a + 1:]
    e = (-p) % s
    rows_left, (whole, rem) = (p + e) // s, divmod(size, s)
    need = -(-(e + (k - 1) * d + s * (lo - 1) + 1) // s)  # rows holding every position a window reads
    parts = []
    if rows_left:
        parts.append(zeros((*head, rows_left, s, *tail)))
    if whole:
        body = t if rem == 0 else emit(g, "slice", t, a, 0, whole * s)
        parts.append(emit(g, "reshape", body, (*head, whole, s, *tail)))
    if rem:
        last = emit(g, "reshape", emit(g, "slice", t, a, whole * s, size), (*head, 1, rem, *tail))
        parts.append(emit(g, "concat", [last, zeros((*head, 1, s - rem, *tail))], a + 1))
    have = rows_left + whole + (1 if rem else 0)
    if need > have:
        parts.append(zeros((*head, need - have, s, *tail)))
    return (parts[0] if len(parts) == 1 else emit(g, "concat", parts, a)), e


def columns(ctx: Ctx, cv: Conv, x: Tensor, zeros: _Zeros) -> Tensor:
    """im2col: ``(N, C, K_1, ..., K_n, Lo_1, ..., Lo_n)`` with ``cols[.., k, l] = xp[.., k d + l s]`` (``xp``: ``x``
    with the zero padding)."""
    g = ctx.g
    t = x
    nd = len(cv.k)
    for i in range(nd):
        a = 2 + 2 * i  # (N, C, [K_j, Lo_j for j < i], S_i, ...)
        k, s, d, lo, p = cv.k[i], cv.stride[i], cv.dil[i], cv.lo[i], cv.pad[i]
        shape = tuple(t.shape)
        if cv.patch(i):  # the window [0, K Lo) of the padded dim as (Lo, K), then (K, Lo)
            t = _fit(g, zeros, t, a, -p, k * lo)
            t = emit(g, "reshape", t, (*shape[:a], lo, k, *shape[a + 1:]))
            if k > 1 and lo > 1:
                t = emit(g, "transpose", t, a, a + 1)
            else:
                t = emit(g, "reshape", t, (*shape[:a], k, lo, *shape[a + 1:]))
            continue
        pieces = []
        if s == 1:
            t = _fit(g, zeros, t, a, -p, (k - 1) * d + lo)  # padded (and grown so every window fits)
            for j in range(k):
                piece = t if (j * d, lo) == (0, t.shape[a]) else emit(g, "slice", t, a, j * d, j * d + lo)
                pieces.append(emit(g, "reshape", piece, (*shape[:a], 1, lo, *shape[a + 1:])))
        else:
            grid, e = _phases(g, zeros, t, a, cv, i)
            for j in range(k):
                q, r = divmod(e + j * d, s)
                piece = emit(g, "slice", emit(g, "slice", grid, a, q, q + lo), a + 1, r, r + 1)
                pieces.append(emit(g, "reshape", piece, (*shape[:a], 1, lo, *shape[a + 1:])))
        t = pieces[0] if k == 1 else emit(g, "concat", pieces, a)
    # (N, C, K_1, Lo_1, ..., K_n, Lo_n) -> (N, C, K_1, ..., K_n, Lo_1, ..., Lo_n)
    order = (0, 1, *(2 + 2 * i for i in range(nd)), *(3 + 2 * i for i in range(nd)))
    if nd > 1:
        t = emit(g, "permute", t, order)
    return t


def _weight(g: Any, cv: Conv, w: Tensor) -> Tensor:
    """The weight as ``(G, O/G, C/G * prod K)`` (``(O, C prod K)`` for one group)."""
    cg, og = cv.c // cv.groups, cv.o // cv.groups
    return emit(g, "reshape", w, (cv.o, cg * cv.kp) if cv.groups == 1 else (cv.groups, og, cg * cv.kp))


def _grouped_cols(g: Any, cv: Conv, cols: Tensor) -> Tensor:
    """The columns as ``(N, G, C/G * prod K, prod Lo)`` (``(N, C prod K, prod Lo)`` for one group)."""
    cg = cv.c // cv.groups
    return emit(g, "reshape", cols, (cv.n, cv.c * cv.kp, cv.lp) if cv.groups == 1 else
                (cv.n, cv.groups, cg * cv.kp, cv.lp))


def _args(args: list[Any], kwargs: dict[str, Any], names: tuple[str, ...], first: int) -> list[Any]:
    return [args[i] if len(args) > i else kwargs.get(nm) for i, nm in enumerate(names, start=first)]


_CONV_ARGS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def _check_dtypes(*ts: Tensor) -> DType:
    dts = {t.dtype for t in ts}
    if len(dts) != 1:
        raise Unsupported(Reason.DTYPE, f"convolution of mixed dtypes {sorted(d.name for d in dts)}")
    return dts.pop()


def _conv_product(ctx: Ctx, cv: Conv, tx: Tensor, tw: Tensor, zeros: _Zeros) -> Tensor:
    """The convolution of ``tx`` by ``tw``: ``(N, O, prod Lo)``, ``(N, G, O/G, prod Lo)`` or, depthwise,
    ``(N, C, 1, prod Lo)`` (row-major the same as ``(N, O, *Lo)``)."""
    g = ctx.g
    cols = columns(ctx, cv, tx, zeros)
    if cv.depthwise:  # (N, C, prod K, prod Lo) * (C, prod K, 1), summed over the offsets
        return emit(g, "sum", emit(g, "mul", emit(g, "reshape", cols, (cv.n, cv.c, cv.kp, cv.lp)),
                                   emit(g, "reshape", tw, (cv.c, cv.kp, 1))), 2)
    return emit(g, "matmul", _weight(g, cv, tw), _grouped_cols(g, cv, cols))


def _out_grouped(g: Any, cv: Conv, t: Tensor) -> Tensor:
    """An output-side tensor ``(N, O, *Lo)`` as ``(N, O, prod Lo)`` (one group, not depthwise) or ``(N, G, O/G,
    prod Lo)``: a single-channel convolution (one group and depthwise) needs the 4-d form, or its depthwise products
    multiply across the batch (red team 18, 2c7257d)."""
    return emit(g, "reshape", t, (cv.n, cv.o, cv.lp) if cv.groups == 1 and not cv.depthwise else
                (cv.n, cv.groups, cv.o // cv.groups, cv.lp))


def _input_grad(ctx: Ctx, cv: Conv, tw: Tensor, tgy: Tensor, zeros: _Zeros) -> Tensor:
    """``W^T @ dY`` scattered back (:func:`scatter_columns`): ``(N, C, *S)``."""
    g = ctx.g
    dy = _out_grouped(g, cv, tgy)
    if cv.depthwise:
        dcols = emit(g, "mul", emit(g, "reshape", tw, (cv.c, cv.kp, 1)), dy)  # (N, C, prod K, prod Lo)
    else:
        wr = _weight(g, cv, tw)
        dcols = emit(g, "matmul", emit(g, "transpose", wr, len(wr.shape) - 2, len(wr.shape) - 1), dy)
    dcols = emit(g, "reshape", dcols, (cv.n, cv.c, *cv.k, *cv.lo))
    return scatter_columns(ctx, cv, dcols, zeros)


def _weight_grad(ctx: Ctx, cv: Conv, tx: Tensor, tgy: Tensor, zeros: _Zeros) -> Tensor:
    """``dY @ cols(X)^T``, the batch and positions contracted: ``(O, C/G prod K)`` or ``(G, O/G, C/G prod K)``
    (depthwise ``(1, C, prod K, 1)``), row-major the weight's shape."""
    g = ctx.g
    G, cg, og = cv.groups, cv.c // cv.groups, cv.o // cv.groups
    dy = _out_grouped(g, cv, tgy)
    cols = columns(ctx, cv, tx, zeros)
    if cv.depthwise:  # sum over the batch and positions of dy * cols
        prod = emit(g, "mul", emit(g, "reshape", cols, (cv.n, cv.c, cv.kp, cv.lp)), dy)
        return emit(g, "sum", emit(g, "sum", prod, 3), 0)
    gc = _grouped_cols(g, cv, cols)
    if G == 1:  # (O, N Lo) @ (N Lo, C prod K)
        a = emit(g, "reshape", emit(g, "permute", dy, (1, 0, 2)), (cv.o, cv.n * cv.lp))
        b = emit(g, "reshape", emit(g, "permute", gc, (0, 2, 1)), (cv.n * cv.lp, cv.c * cv.kp))
    else:  # (G, O/G, N Lo) @ (G, N Lo, C/G prod K)
        a = emit(g, "reshape", emit(g, "permute", dy, (1, 2, 0, 3)), (G, og, cv.n * cv.lp))
        b = emit(g, "reshape", emit(g, "permute", gc, (1, 0, 3, 2)), (G, cv.n * cv.lp, cg * cv.kp))
    return emit(g, "matmul", a, b)


def describe_transposed(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, output_padding: Any,
                        groups: Any) -> Conv:
    """The :class:`Conv` whose input gradient a transposed convolution is (``nn.ConvTranspose``): the convolution of
    the transposed convolution's output ``(N, C_out, *S)`` by its weight ``(C_in, C_out/G, *K)`` back to its input
    ``(N, C_in, *L)``, ``S = (L - 1) s - 2 p + d (K - 1) + output_padding + 1``."""
    xs, ws = _shape_of(x), _shape_of(w)
    nd = len(xs) - 2
    if nd < 1 or len(ws) != nd + 2:
        raise Unsupported(Reason.LAYOUT, f"transposed convolution of an input of rank {len(xs)}")
    if isinstance(padding, str):
        raise Unsupported(Reason.LAYOUT, f"transposed convolution with padding {padding!r}")
    st, pd, dl = _ints(stride, nd, "stride"), _ints(padding, nd, "padding"), _ints(dilation, nd, "dilation")
    op = _ints(output_padding or 0, nd, "output_padding")
    gr = int(groups) if _num(groups) else 0
    if not (len(st) == len(pd) == len(dl) == len(op) == nd) or min(st) < 1 or min(dl) < 1 or min(pd) < 0 \
            or min(op) < 0 or any(o >= s for o, s in zip(op, st, strict=True)) or gr < 1 or xs[1] != ws[0] \
            or ws[0] % gr:
        raise Unsupported(Reason.LAYOUT, f"transposed convolution with stride {st}, padding {pd}, dilation {dl}, "
                                         f"output_padding {op}, groups {groups!r}")
    k, lo = tuple(ws[2:]), tuple(xs[2:])
    size = tuple((lo[i] - 1) * st[i] - 2 * pd[i] + dl[i] * (k[i] - 1) + op[i] + 1 for i in range(nd))
    if min(size) < 1:
        raise Unsupported(Reason.LAYOUT, f"transposed convolution with an empty output {size}")
    cv = Conv(xs[0], ws[1] * gr, ws[0], gr, size, k, st, pd, dl, lo)
    assert all((size[i] + 2 * pd[i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 == lo[i] for i in range(nd))
    return cv


def _bias_added(ctx: Ctx, y: Tensor, bias: Any, tx: Tensor, shape: tuple[int, ...]) -> Tensor:
    """``y`` plus the per-channel ``bias`` (dim 1 of ``shape``, which ``y`` holds as ``y.shape``)."""
    if bias is None:
        return y
    if not isinstance(bias, LV):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "convolution with a bias that is not a tensor")
    g = ctx.g
    tb = ctx.exact(bias)
    _check_dtypes(tx, tb)
    if math.prod(y.shape) != math.prod(shape):
        raise Unsupported(Reason.LAYOUT, "convolution: a result of another size")
    if tuple(y.shape) == tuple(shape):  # (a transposed convolution's (N, C, *S): its spatial dims kept apart, since
        # a read at (o // S_1) mod s of them merged is one the verifier's abstraction cannot resolve, DCGAN's 4x4/2)
        return emit(g, "add", y, emit(g, "reshape", tb, (shape[1], *(1,) * (len(shape) - 2))))
    # the result as (N, C, rest) against the bias as (C, 1): the same row-major data
    flat = (shape[0], shape[1], math.prod(shape[2:]))
    return emit(g, "add", y if tuple(y.shape) == flat else emit(g, "reshape", y, flat),
                emit(g, "reshape", tb, (shape[1], 1)))


@handles("convolution")
def _convolution(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> LV:
    """``aten.convolution`` (``nn.Conv1d/2d/3d``): im2col (:func:`columns`) and a matmul (a product and a sum for a
    depthwise convolution), the bias added per output channel; a transposed one (``nn.ConvTranspose``) as the
    input gradient of the convolution it transposes (:func:`describe_transposed`, :func:`scatter_columns`)."""
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (_float(x) and _float(w)):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "convolution of a tensor that is not a float tensor")
    stride, padding, dilation, transposed, output_padding, groups = _args(args, kwargs, _CONV_ARGS, 3)
    tx, tw = ctx.exact(x), ctx.exact(w)
    _check_dtypes(tx, tw)
    zeros = _Zeros(ctx, out[1])
    if transposed:
        cv = describe_transposed(x, w, stride, padding, dilation, output_padding, groups)
        y = _input_grad(ctx, cv, tw, tx, zeros)
    else:
        cv = describe(x, w, stride, padding, dilation, transposed, output_padding, groups)
        y = _conv_product(ctx, cv, tx, tw, zeros)
    y = _bias_added(ctx, y, bias, tx, _shape(out))
    return LV(y, _shape(out), src=ctx.node if tuple(y.shape) != _shape(out) else None)


def _scatter_last(ctx: Ctx, cv: Conv, i: int, t: Tensor, zeros: _Zeros) -> Tensor:
    """Spatial dim ``i``'s columns, the last two axes of ``t`` ``(..., K_i, Lo_i)``, added back where they were read:
    ``(..., S_i)``. Kept last so that spreading by the stride is a merge of the two trailing axes (the verifier's
    abstraction resolves ``j mod s`` of a trailing output index; not of an index merged with later axes)."""
    g = ctx.g
    k, s, d, lo, p, size = cv.k[i], cv.stride[i], cv.dil[i], cv.lo[i], cv.pad[i], cv.size[i]
    shape = tuple(t.shape)
    head = shape[:-2]
    a = len(head)
    if cv.patch(i):  # (K, Lo) -> (Lo, K) -> the window [0, K Lo) of the padded dim
        if k > 1 and lo > 1:
            t = emit(g, "transpose", t, a, a + 1)
        return _fit(g, zeros, emit(g, "reshape", t, (*head, lo * k)), a, p, size)
    total = None
    for j in range(k):
        piece = t if k == 1 else emit(g, "slice", t, a, j, j + 1)  # (.., 1, Lo)
        if s > 1:  # spread by the stride: (Lo, 1) and s - 1 zero columns, read as (Lo s)
            piece = emit(g, "reshape", piece, (*head, lo, 1))
            piece = emit(g, "concat", [piece, zeros((*head, lo, s - 1))], a + 1)
        piece = emit(g, "reshape", piece, (*head, lo * s))
        # padded positions [j d, j d + s Lo) are input positions [j d - p, ...): the part inside [0, size)
        start = j * d - p
        if start + lo * s <= 0 or start >= size:
            continue
        piece = _fit(g, zeros, piece, a, -start, size)
        total = piece if total is None else emit(g, "add", total, piece)
    return total if total is not None else zeros((*head, size))


def scatter_columns(ctx: Ctx, cv: Conv, dcols: Tensor, zeros: _Zeros) -> Tensor:
    """col2im, the adjoint of :func:`columns`: ``(N, C, K_1, ..., K_n, Lo_1, ..., Lo_n)`` back to ``(N, C, *S)``,
    each column added where it was read (the padding dropped); one spatial dim at a time, its axes moved last
    (:func:`_scatter_last`)."""
    g = ctx.g
    nd = len(cv.k)
    t = dcols
    axes = ["n", "c", *(f"k{i}" for i in range(nd)), *(f"l{i}" for i in range(nd))]
    for i in reversed(range(nd)):
        want = [x for x in axes if x not in (f"k{i}", f"l{i}")] + [f"k{i}", f"l{i}"]
        if want != axes:
            t = emit(g, "permute", t, tuple(axes.index(x) for x in want))
        t = _scatter_last(ctx, cv, i, t, zeros)
        axes = [*want[:-2], f"s{i}"]
    final = ["n", "c", *(f"s{i}" for i in range(nd))]
    if final != axes:
        t = emit(g, "permute", t, tuple(axes.index(x) for x in final))
    return t


@handles("convolution_backward")
def _convolution_backward(ctx: Ctx, args: list[Any], kwargs: dict[str, Any], out: Any) -> tuple[Any, Any, Any]:
    """``aten.convolution_backward``: the input's gradient (``W^T @ dY`` scattered back, :func:`scatter_columns`),
    the weight's (``dY @ cols^T``, the batch and positions contracted) and the bias's (a sum), as ``output_mask``
    asks. Of a transposed convolution (the input gradient of a convolution ``C``): the input's gradient is ``C``
    of ``dY``, the weight's is ``C``'s weight gradient with the roles of input and output swapped."""
    gy, x, w = args[0], args[1], args[2]
    stride, padding, dilation, transposed, output_padding, groups, mask = _args(
        args, kwargs, (*_CONV_ARGS, "output_mask"), 4)
    want = [bool(m) for m in (mask or (True, True, True))]
    # the operands each asked-for gradient reads (aten.unread_args leaves the others as fx nodes)
    if not (_float(gy) and (_float(x) or not want[1]) and (_float(w) or not want[0])):
        raise Unsupported(Reason.NOT_IN_REGISTRY, "convolution_backward of a tensor that is not a float tensor")
    g = ctx.g
    tgy = ctx.exact(gy)
    tx = ctx.exact(x) if want[1] else tgy
    tw = ctx.exact(w) if want[0] else tgy
    _check_dtypes(tx, tw, tgy)
    zeros = _Zeros(ctx, out[0][1] if out[0] is not None else (out[1] or out[2])[1])
    res: list[Any] = [None, None, None]
    if transposed:  # C maps the output (N, C_out, *S) back to the input (N, C_in, *L)
        cv = describe_transposed(x, w, stride, padding, dilation, output_padding, groups)
        if want[0]:
            res[0] = LV(_conv_product(ctx, cv, tgy, tw, zeros), _shape(out[0]), src=ctx.node)
        if want[1]:
            res[1] = LV(_weight_grad(ctx, cv, tgy, tx, zeros), _shape(out[1]), src=ctx.node)
    else:
        cv = describe(x, w, stride, padding, dilation, transposed, output_padding, groups)
        if want[0]:
            res[0] = LV(_input_grad(ctx, cv, tw, tgy, zeros), _shape(out[0]))
        if want[1]:
            res[1] = LV(_weight_grad(ctx, cv, tx, tgy, zeros), _shape(out[1]), src=ctx.node)
    if want[2] and out[2] is not None:
        shape = _shape_of(gy)
        gb = emit(g, "sum", emit(g, "sum", emit(g, "reshape", tgy, (shape[0], shape[1], math.prod(shape[2:]))), 2), 0)
        res[2] = LV(gb, _shape(out[2]), src=ctx.node)
    return res[0], res[1], res[2]
