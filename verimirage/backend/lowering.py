"""The ``"triton"`` domain of the op registry: each op's lowering to a Triton expression.

A triton-domain function is called like every domain function,
``fn(args, attrs, in_types, out_types)``, but its values are *source text*:
``args`` are Triton expressions (names of fp32 register tensors, already padded
to power-of-two tile shapes) and the result is the expression text of the op's
value. ``in_types``/``out_types`` are the *logical* types (a mean divides by the
logical length). Codegen adds two private attributes where an op needs them:
``_padded`` (a tuple: the operands' padded shapes, then the result's) and, for
``matmul``, ``_precision`` (the ``tl.dot`` input precision for fp32 operands).

Padding contract (see :mod:`verimirage.backend.codegen`): values may hold
garbage in padded positions; codegen masks operands of ops that mix elements
along a padded axis (reductions, ``rms_norm``, contractions) before calling
these functions, so the functions here are plain algebra.

Loop ops lower to their per-iteration update (operands: the accumulator, then
the iteration's value; ``rescaled_sum`` also gets the rescale factor). The
structural ops ``input``, ``arg``, ``custom`` and ``fused`` are data movement
and kernel structure; codegen lowers them (loads/stores, launches, inline
thread graphs) and they are recorded as reviewed exceptions.

Importing this module needs neither torch nor triton.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..ir.errors import GraphError
from ..ir.opfacts import exempt
from ..ir.ops import OPS, TensorType, implements

#: the most elements one Triton tensor may have (``triton.language`` refuses larger blocks)
TRITON_MAX_NUMEL = 1 << 20
_GELU_C = 0.7978845608028654  # sqrt(2 / pi)


def _unary(template: str) -> Callable[..., str]:
    def fn(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
        return template.format(x=args[0], c=repr(float(attrs.get("c", 0.0))))

    return fn


def _binary(template: str) -> Callable[..., str]:
    def fn(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
        return template.format(a=args[0], b=args[1])

    return fn


for _name, _tpl in [
    ("exp", "tl.exp({x})"),
    ("silu", "({x} * tl.sigmoid({x}))"),
    # tanh(u) = 2 sigmoid(2u) - 1, so 0.5 x (1 + tanh(u)) = x sigmoid(2u)
    ("gelu", f"({{x}} * tl.sigmoid(2.0 * {_GELU_C!r} * ({{x}} + 0.044715 * {{x}} * {{x}} * {{x}})))"),
    ("relu", "tl.maximum({x}, 0.0, propagate_nan=tl.PropagateNan.ALL)"),
    ("sqrt", "tl.sqrt({x})"),
    ("rsqrt", "tl.rsqrt({x})"),
    ("square", "({x} * {x})"),
    # (not ``-x``: Triton's unary minus is ``0 - x``, +0 at +0 where -x is -0: ``1 / -x`` was +inf there)
    ("neg", "({x} * -1.0)"),
    ("scale", "({x} * {c})"),
    ("shift", "({x} + {c})"),
]:
    implements("triton", _name)(_unary(_tpl))

for _name, _tpl in [
    ("add", "({a} + {b})"),
    ("sub", "({a} - {b})"),
    ("mul", "({a} * {b})"),
    ("div", "({a} / {b})"),
    ("maximum", "tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"),
]:
    implements("triton", _name)(_binary(_tpl))


for _name, _tpl in [
    ("log", "tl.log({x})"),
    ("tanh", "_vm_tanh({x})"),  # (a helper of the generated module: HELPERS)
    ("sigmoid", "tl.sigmoid({x})"),
    ("erf", "tl.erf({x})"),
    ("softplus", "_vm_softplus({x})"),
    ("abs", "tl.abs({x})"),
    ("sin", "tl.sin({x})"),
    ("cos", "tl.cos({x})"),
    ("reciprocal", "(1.0 / {x})"),
]:
    implements("triton", _name)(_unary(_tpl))
implements("triton", "minimum")(_binary("tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"))


#: Triton helpers the lowerings call, by name: codegen defines each in a generated module whose kernels use it.
#: tanh: ``2 sigmoid(2x) - 1`` cancelled to 0 below |x| ~ 3e-8 (7% off at 1e-6); now the odd Taylor polynomial
#: below |x| = 0.3125 (truncation < 1e-8 relative), above it ``sign(x) (1 - e) / (1 + e)`` with
#: ``e = exp(-2|x|) <= 0.54`` (1 - e loses at most a factor 2.2), as ``exp2(-2 log2(e) |x|)``: ``ex2.approx.ftz``,
#: without the denormal fix-up ``tl.exp``'s non-ftz ``ex2`` gets (a compare and two multiplies an element; softcap
#: attention's loop 1124 -> 996 sm_90 instructions an iteration). The flush only zeroes ``e < 2**-126``, where
#: ``(1 - e) / (1 + e)`` rounds to 1 either way. softplus: ``log(1 + exp(-|x|))`` rounded
#: ``1 + y`` to 1 for ``y < 6e-8`` (0 at x = -20, not 2.06e-9); now ``log1p(y) = 2 atanh(s)``, ``s = y / (2 + y)
#: <= 1/3``, by its odd series to ``s**13`` (truncation < 2e-8 relative), with no log at all. ``_vm_tanh_logit``:
#: tanh's second branch alone, accurate to 2**-21 absolute (not relative near 0), for a soft cap's tanh read only
#: as a softmax's logits (``codegen._logit_tanh``).
HELPERS: dict[str, str] = {
    "_vm_tanh": """@triton.jit
def _vm_tanh(x):
    a = tl.abs(x)
    x2 = x * x
    p = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (-0.05396825396825397
        + x2 * (0.021869488536155203 + x2 * -0.008863235529902197)))))
    e = tl.exp2(a * -2.8853900817779268)
    r = (1.0 - e) / (1.0 + e)
    return tl.where(a < 0.3125, p, tl.where(x < 0.0, -r, r))
""",
    "_vm_tanh_logit": """@triton.jit
def _vm_tanh_logit(x):
    e = tl.exp2(tl.abs(x) * -2.8853900817779268)
    r = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0.0, -r, r)
""",
    "_vm_softplus": """@triton.jit
def _vm_softplus(x):
    y = tl.exp(-tl.abs(x))
    s = y / (2.0 + y)
    s2 = s * s
    q = 1.0 + s2 * (0.3333333333333333 + s2 * (0.2 + s2 * (0.14285714285714285 + s2 * (0.1111111111111111
        + s2 * (0.09090909090909091 + s2 * 0.07692307692307693)))))
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL) + 2.0 * s * q
""",
}


@implements("triton", "where")
def _where(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.where({args[0]} != 0.0, {args[1]}, {args[2]})"


_TL_CAST = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32"}


@implements("triton", "cast")
def _cast(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    """Round the fp32 register value to the target dtype (codegen computes in fp32 again after it)."""
    return f"{args[0]}.to({_TL_CAST[str(attrs['dtype'])]}).to(tl.float32)"


@implements("triton", "clamp")
def _clamp(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return (f"tl.minimum(tl.maximum({args[0]}, {float(attrs['lo'])!r}, propagate_nan=tl.PropagateNan.ALL), "
            f"{float(attrs['hi'])!r}, propagate_nan=tl.PropagateNan.ALL)")


@implements("triton", "leaky_relu")
def _leaky_relu(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.where({args[0]} >= 0.0, {args[0]}, {args[0]} * {float(attrs['slope'])!r})"


@implements("triton", "step", "greater")
def _step(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.where({args[0]} > {float(attrs['c'])!r}, 1.0, 0.0)"


@implements("triton", "pow")
def _pow(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    """Small integer exponents as products, 0.5 as sqrt, other integers as ``|x| ** c`` through exp(c log |x|)
    with the sign of ``x`` for odd ``c`` (exp(c log x) is NaN at every negative x: ``x ** 10`` at -2 gave NaN,
    not 1024), other exponents through exp(c log x) (NaN at negative x, as ``x ** c``), at -inf ``+inf`` (c > 0)
    or ``0`` (c < 0) as IEEE ``pow`` and ATen (log(-inf) is NaN)."""
    x, c = args[0], float(attrs["c"])
    if c.is_integer() and abs(c) <= 8:
        k = int(abs(c))
        if k == 0:
            return f"tl.where({x} == {x}, 1.0, 1.0)"
        prod = " * ".join([x] * k)
        return f"(1.0 / ({prod}))" if c < 0 else f"({prod})"
    if c == 0.5:
        return f"tl.sqrt({x})"
    if c == -0.5:
        return f"tl.rsqrt({x})"
    if c.is_integer():
        mag = f"tl.exp({c!r} * tl.log(tl.abs({x})))"
        neg = f"(({x} < 0.0) | (1.0 / {x} < 0.0))"  # (-0.0 too: x ** -3 is -inf there)
        return f"tl.where({neg}, {mag} * -1.0, {mag})" if int(c) % 2 else mag
    at_ninf = "float('inf')" if c > 0 else "0.0"
    return f"tl.where({x} == float('-inf'), {at_ninf}, tl.exp({c!r} * tl.log({x})))"


@implements("triton", "min")
def _min(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.reduce({args[0]}, {attrs['axis']}, _min_nan, keep_dims=True)"  # (NaN propagates, as in ATen)


@implements("triton", "sum")
def _sum(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.sum({args[0]}, axis={attrs['axis']}, keep_dims=True)"


@implements("triton", "mean")
def _mean(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    n = in_types[0].shape[attrs["axis"]]
    return f"(tl.sum({args[0]}, axis={attrs['axis']}, keep_dims=True) * {1.0 / n!r})"


@implements("triton", "max")
def _max(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.reduce({args[0]}, {attrs['axis']}, _max_nan, keep_dims=True)"  # (NaN propagates, as in ATen)


def _index_on_axis(rank: int, axis: int) -> str:
    """Indexing text that lifts a 1-d tensor onto ``axis`` of a rank-``rank`` tensor."""
    if rank == 1:
        return ""
    return "[" + ", ".join(":" if i == axis else "None" for i in range(rank)) + "]"


@implements("triton", "rms_norm")
def _rms_norm(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    x = args[0]
    ax = attrs["axis"]
    n = in_types[0].shape[ax]
    eps = float(attrs["eps"])
    r = f"tl.rsqrt(tl.sum({x} * {x}, axis={ax}, keep_dims=True) * {1.0 / n!r} + {eps!r})"
    if len(args) == 2:
        return f"({x} * {r} * {args[1]}{_index_on_axis(in_types[0].rank, ax)})"
    return f"({x} * {r})"


@implements("triton", "matmul")
def _matmul(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    """``tl.dot`` of 2-d or 3-d operands already cast to the matmul's dtype (codegen reshapes around it)."""
    prec = attrs.get("_precision")
    extra = f", input_precision={prec!r}" if prec and in_types[0].dtype.short == "f32" else ""
    acc = f", {args[2]}" if len(args) == 3 else ""
    return f"tl.dot({args[0]}, {args[1]}{acc}{extra})"


@implements("triton", "transpose")
def _transpose(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    perm = list(range(in_types[0].rank))
    perm[attrs["a"]], perm[attrs["b"]] = perm[attrs["b"]], perm[attrs["a"]]
    return f"tl.permute({args[0]}, {tuple(perm)})"


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _split_chunk(x: str, shape: tuple[int, ...], ax: int, c: int, i: int) -> str:
    """Chunk ``i`` of length ``c`` along axis ``ax`` of tile ``x`` (``shape[ax] / c`` a power of two), by
    halving: a reshape to ``(..., 2, half, ...)``, the 2 moved last, ``tl.split`` (no one-hot selection)."""
    cur = list(shape)
    n = cur[ax] // c
    while n > 1:
        half = n // 2
        shp = (*cur[:ax], 2, half * c, *cur[ax + 1:])
        perm = (*(d for d in range(len(shp)) if d != ax), ax)
        x = f"tl.split(tl.permute(tl.reshape({x}, {shp}), {perm}))[{1 if i >= half else 0}]"
        i %= half
        cur[ax] = half * c
        n = half
    return x


def _concat_by_join(xs: list[str], padded: list[tuple[int, ...]], lengths: list[int], ax: int) -> str | None:
    """Concatenation of a power-of-two number of equal, unpadded power-of-two pieces along ``ax`` by pairwise
    ``tl.join`` (the new last dim moved to ``ax`` and merged): rotary's ``concat(-x2, x1)``. None if not so."""
    k = len(xs)
    h = lengths[0]
    if not _pow2(k) or k < 2 or not _pow2(h) or any(n != h for n in lengths) or \
            any(p != padded[0] or p[ax] != h for p in padded):
        return None
    shape = list(padded[0])
    while len(xs) > 1:
        r = len(shape)
        perm = (*range(ax), r, *range(ax, r))
        merged = (*shape[:ax], 2 * shape[ax], *shape[ax + 1:])
        xs = [f"tl.reshape(tl.permute(tl.join({a}, {b}), {perm}), {merged})" for a, b in zip(xs[::2], xs[1::2],
                                                                                             strict=True)]
        shape = list(merged)
    return xs[0]


@implements("triton", "concat")
def _concat(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    """Concatenation of register tiles by one-hot selection (codegen loads concats of inputs directly).

    Needs ``_padded``; each operand is placed at its logical offset along the axis of the padded result.
    """
    padded = attrs["_padded"]
    ax = attrs["axis"]
    rank = in_types[0].rank
    p_out = padded[-1][ax]
    fast = _concat_by_join(list(args), [tuple(p) for p in padded[:-1]], [t.shape[ax] for t in in_types], ax)
    if fast is not None:  # the joined pieces fill sum(lengths); a result padded beyond that gets zeros after them
        return _grow_leading(fast, [*padded[0][:ax], sum(t.shape[ax] for t in in_types), *padded[0][ax + 1:]],
                             ax, p_out)
    for p in padded[:-1]:
        numel = math.prod(p) * p_out
        if numel > TRITON_MAX_NUMEL:
            raise GraphError(
                f"codegen: concat of computed tiles {[tuple(q) for q in padded[:-1]]} along axis {ax} needs a "
                f"one-hot selection of {numel} elements, above Triton's limit of {TRITON_MAX_NUMEL} per tensor; "
                "only concats of block inputs (loaded directly) and concats feeding one matmul split at the same "
                "points (a sum of products) have other lowerings")
    terms = []
    start = 0
    for x, t, p in zip(args, in_types, padded[:-1], strict=False):
        pj = p[ax]
        src = "[" + ", ".join([":"] * (ax + 1) + ["None"] + [":"] * (rank - ax - 1)) + "]"
        lift = ", ".join(["None"] * ax + [":", "None"] + ["None"] * (rank - ax - 1))
        lift_o = ", ".join(["None"] * ax + ["None", ":"] + ["None"] * (rank - ax - 1))
        sel = (
            f"((tl.arange(0, {pj})[{lift}] + {start} == tl.arange(0, {p_out})[{lift_o}]) & "
            f"(tl.arange(0, {pj})[{lift}] < {t.shape[ax]}))"
        )
        terms.append(f"tl.sum(tl.where({sel}, {x}{src}, 0.0), axis={ax})")
        start += t.shape[ax]
    return "(" + " + ".join(terms) + ")"


@implements("triton", "permute")
def _permute(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    return f"tl.permute({args[0]}, {tuple(attrs['dims'])})"


@implements("triton", "broadcast_to")
def _broadcast_to(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    """New leading dims by a reshape, then ``tl.broadcast_to`` the padded result shape (needs ``_padded``)."""
    p_in, p_out = tuple(attrs["_padded"][0]), tuple(attrs["_padded"][-1])
    x = args[0]
    if len(p_out) > len(p_in):
        x = f"tl.reshape({x}, {(1,) * (len(p_out) - len(p_in)) + p_in})"
    return f"tl.broadcast_to({x}, {p_out})"


def _grow_leading(x: str, shape: list[int], ax: int, to: int) -> str:
    """Tile ``x`` of ``shape`` grown along ``ax`` to ``to`` (a multiple ``f`` of ``shape[ax]``) with zeros after
    its data: a new dim of ``f`` before ``ax`` (``tl.broadcast_to``), all but its first entry zeroed, merged
    into ``ax`` (row-major: entry 0 is positions ``0..shape[ax]-1``). ``x`` appears once. Updates ``shape``."""
    f = to // shape[ax]
    if f == 1:
        return x
    s1 = (*shape[:ax], 1, *shape[ax:])
    sf = (*shape[:ax], f, *shape[ax:])
    idx = ", ".join(["None"] * ax + [":"] + ["None"] * (len(shape) - ax))
    shape[ax] = to
    return (f"tl.reshape(tl.where(tl.arange(0, {f})[{idx}] == 0, tl.broadcast_to(tl.reshape({x}, {s1}), {sf}), 0), "
            f"{tuple(shape)})")


def _index_text(j: str, sizes: Sequence[int], *, bounded: bool) -> list[str]:
    """The row-major multi-index over ``sizes`` of flat index expression ``j``: one expression per dim (``0`` for
    a size-1 dim), each in range (``bounded``: ``j`` is below ``prod(sizes)``, so the leading one needs no
    ``%``)."""
    out = []
    for d, (st, n) in enumerate(zip(_strides(sizes), sizes, strict=True)):
        if n == 1:
            out.append("0")
            continue
        q = j if st == 1 else f"({j} // {st})"
        lead = all(m == 1 for m in sizes[:d])
        out.append(q if bounded and lead else f"({q} % {n})")
    return out


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[d + 1:]) for d in range(len(shape))]


def _reshape_by_gather(x: str, old: tuple[int, ...], new: tuple[int, ...], p_in: tuple[int, ...],
                       p_out: tuple[int, ...]) -> str:
    """Row-major reshape ``old -> new`` of tile ``x`` padded to ``p_in`` into a tile padded to ``p_out``, for any
    sizes: the tile flattened (a ``tl.reshape`` of the padded tile, exact), one ``tl.gather`` whose index maps
    each result position to the operand position holding the same logical element (result position -> its
    logical index over ``new`` -> the logical index over ``old`` -> the padded operand position), and the
    positions outside ``new`` set to zero, as the power-of-two path grows them. ``x`` appears once; padding of
    the operand is never read into data."""
    n_in, n_out = math.prod(p_in), math.prod(p_out)
    for n in (n_in, n_out):
        if n > TRITON_MAX_NUMEL:
            raise GraphError(f"codegen: reshape {old} -> {new} of a padded tile {p_in} -> {p_out} needs a gather of "
                             f"{n} elements, above Triton's limit of {TRITON_MAX_NUMEL} per tensor")
    j = f"tl.arange(0, {n_out})"
    outs = _index_text(j, p_out, bounded=True)
    valid = " & ".join(f"({o} < {n})" for o, n, p in zip(outs, new, p_out, strict=True) if p != n)
    logical = " + ".join(f"{o} * {st}" if st != 1 else o
                         for o, st, n in zip(outs, _strides(new), new, strict=True) if n != 1) or "0"
    ins = _index_text(f"({logical})", old, bounded=False)
    src = " + ".join(f"{i} * {st}" if st != 1 else i
                     for i, st, n in zip(ins, _strides(p_in), old, strict=True) if n != 1) or "0"
    flat = f"tl.gather(tl.reshape({x}, ({n_in},)), {src}, 0)"
    return f"tl.reshape({f'tl.where({valid}, {flat}, 0)' if valid else flat}, {tuple(p_out)})"


@implements("triton", "reshape")
def _reshape(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    """``tl.reshape`` of the padded tile.

    Exact as it stands when every merged or split group of dims is unpadded (size-1 dims and kept dims carry
    their padding along). A group padded on either side whose dims all have power-of-two sizes is reshaped on
    its logical sizes: each padded operand dim cut to its data (the leading chunk, by ``tl.split``), one
    ``tl.reshape``, and each padded result dim grown back to its tile size with zeros after the data. Other
    padded groups (a size that is not a power of two inside a merge: 3 heads of 80 as 240 columns) are moved by
    one ``tl.gather`` of the flattened tile (:func:`_reshape_by_gather`).
    """
    from ..ir.ops import reshape_groups

    p_in, p_out = tuple(attrs["_padded"][0]), tuple(attrs["_padded"][-1])
    old, new = in_types[0].shape, out_types[0].shape
    bad = [(og, ng) for og, ng in reshape_groups(old, new)
           if (len(og) > 1 or len(ng) > 1) and ([p_in[d] for d in og] != [old[d] for d in og]
                                                or [p_out[d] for d in ng] != [new[d] for d in ng])]
    if not bad:
        return f"tl.reshape({args[0]}, {p_out})"
    odd = sorted({old[d] for og, _ in bad for d in og} | {new[d] for _, ng in bad for d in ng})
    if not all(_pow2(n) for n in odd):
        return _reshape_by_gather(args[0], old, new, p_in, p_out)
    x, cur = args[0], list(p_in)
    for og, _ in bad:
        for d in og:
            if cur[d] != old[d]:
                x = _split_chunk(x, tuple(cur), d, old[d], 0)
                cur[d] = old[d]
    mid = list(p_out)
    for _, ng in bad:
        for e in ng:
            mid[e] = new[e]
    if math.prod(cur) != math.prod(mid):  # pragma: no cover - kept dims share one padded size (dim classes)
        raise GraphError(f"codegen: reshape {old} -> {new}: tiles {tuple(cur)} -> {tuple(mid)} differ in size")
    x = f"tl.reshape({x}, {tuple(mid)})"
    for _, ng in bad:
        for e in ng:
            x = _grow_leading(x, mid, e, p_out[e])
    return x


@implements("triton", "slice")
def _slice(args: Sequence[str], attrs: dict[str, Any], in_types: Sequence[TensorType], out_types: Any) -> str:
    """Elements ``start + i`` along the axis, by one-hot selection (Triton tiles have no slicing)."""
    padded = attrs["_padded"]
    ax, start = attrs["axis"], int(attrs["start"])
    rank = in_types[0].rank
    p_in, p_out = padded[0][ax], padded[-1][ax]
    c = int(attrs["stop"]) - start
    if p_in == in_types[0].shape[ax] and p_out == c and _pow2(p_in) and _pow2(c) and start % c == 0:
        # an aligned power-of-two chunk of an unpadded power-of-two axis: split, no one-hot selection
        return _split_chunk(args[0], tuple(padded[0]), ax, c, start // c)
    numel = math.prod(padded[0]) * p_out
    if numel > TRITON_MAX_NUMEL:
        raise GraphError(f"codegen: slice of a tile {tuple(padded[0])} along axis {ax} needs a one-hot selection "
                         f"of {numel} elements, above Triton's limit of {TRITON_MAX_NUMEL} per tensor")
    src = "[" + ", ".join([":"] * (ax + 1) + ["None"] + [":"] * (rank - ax - 1)) + "]"
    lift = ", ".join(["None"] * ax + [":", "None"] + ["None"] * (rank - ax - 1))
    lift_o = ", ".join(["None"] * ax + ["None", ":"] + ["None"] * (rank - ax - 1))
    sel = f"(tl.arange(0, {p_in})[{lift}] == tl.arange(0, {p_out})[{lift_o}] + {start})"
    return f"tl.sum(tl.where({sel}, {args[0]}{src}, 0.0), axis={ax})"


@implements("triton", "loop_sum")
def _loop_sum(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"({args[0]} + {args[1]})"


@implements("triton", "loop_max", "running_max")
def _loop_max(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    return f"tl.maximum({args[0]}, {args[1]}, propagate_nan=tl.PropagateNan.ALL)"


@implements("triton", "rescaled_sum")
def _rescaled_sum(args: Sequence[str], attrs: dict[str, Any], in_types: Any, out_types: Any) -> str:
    """``acc * alpha + x`` with ``alpha = exp(m_prev - m)`` computed by codegen."""
    return f"({args[0]} * {args[2]} + {args[1]})"


for _name in ("input", "arg", "custom", "fused"):
    if "triton" not in OPS[_name].domains:
        exempt(
            "triton",
            _name,
            "structural op: codegen lowers it as data movement or kernel structure "
            "(tile loads/stores, kernel launches, inline thread graphs)",
        )
exempt("triton", "tril_mask", "a causal mask is computed inside each kernel that reads it, from the tile's indices "
                              "(codegen: _KernelGen.tril_expr), never by a kernel of its own")
