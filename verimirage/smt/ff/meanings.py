"""The ``"ff"`` meaning of every registry op on lazy values (registered on import), and :class:`FFDomain`.

What each op means is documented in :mod:`verimirage.smt.ff`; the reference evaluator
:mod:`verimirage.smt.ffref` implements the same meanings plainly and tests/test_ffref.py holds the two equal.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from ...ir.errors import GraphError
from ...ir.ops import OPAQUE, OPS, POW_EXACT_MAX, TensorType, implements, neg_axis, opaque_key, tril
from ..consts import const_fraction
from .arith import _inv, _mark, _mix, _modi, _ring_arr, _ring_q, _sum_mod
from .field import _FIELD, Field, _exp_gather, _exp_table_f32, current_field
from .products import _CHUNK, _matmul_mod, exp_epilogue
from .values import FV, Part, _lazy, _lazy_f, as_kind


class FFDomain:
    """The finite-field domain for :func:`verimirage.ir.interpret.run` (one field per instance).

    Values are :class:`FV`; ops build the parts of their result lazily (see the module docstring).
    """

    name = "ff"

    def __init__(self, fld: Field) -> None:
        self.field = fld

    def apply(
        self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType], out_type: TensorType
    ) -> Any:
        fn = OPS[op].domains.get("ff")
        if fn is None:
            raise GraphError(f"op {op!r} has no meaning in the 'ff' domain")
        tok = _FIELD.set(self.field)
        try:
            return fn(args, attrs, in_types, [out_type])
        finally:
            _FIELD.reset(tok)



# --------------------------------------------------------------------------- op meanings (on FV)


def _ring(kind: str, a: FV, b: FV) -> FV:
    f = current_field()
    shape = np.broadcast_shapes(a.shape, b.shape)
    p = _lazy(lambda x, y, m=f.p: _ring_arr(kind, x, y, m), a.p, b.p)
    p._lin = ("ring", kind, a.p, a.shape, b.p, b.shape)
    if a.q is None or b.q is None:
        return FV(shape, p, None)
    marks = a.qmarks or b.qmarks
    q = _lazy(lambda x, y, m=f.q: _ring_q(kind, x, y, m, marks), a.q, b.q)
    return FV(shape, p, q, marks)


def _binop(kind: str) -> Callable[..., FV]:
    def fn(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
        return _ring(kind, args[0], args[1])

    return fn


for _k in ("add", "sub", "mul", "div"):
    implements("ff", _k)(_binop(_k))


def _affine(x: FV, c: Fraction, kind: str) -> FV:
    """``x * c`` (kind "mul") or ``x + c`` (kind "add") for a rational constant ``c``.

    Each part is ``a * v + b mod m`` of a source part ``v``; an affine map of a part that is itself an affine map
    not computed yet reads that part's source with the composed constants (``a2 (a1 v + b1) + b2``), so a chain
    of scalings and shifts (tanh's ``2 sigmoid(2 x / c) - 1``, a mask's ``0 * s - 30000``) is one pass over the
    array: the same residues, exactly (ring identities mod m)."""
    f = current_field()
    cp, cq = f.const(c)

    def part(src: Part, cm: int, m: int, marks: bool) -> Part:
        a, b = (cm, 0) if kind == "mul" else (1, cm)
        if src._aff is not None and not src.ready:  # compose with the affine map that makes ``src``
            src, a0, b0 = src._aff
            a, b = a * a0 % m, (a * b0 + b) % m

        def fn(v: np.ndarray, a: int = a, b: int = b) -> np.ndarray:
            if a == 0:  # a constant (a mask's ``0 * s - 30000``): written once, ``v`` read only for marks
                r = np.full(v.shape, b, dtype=np.int64)
            else:
                r = np.add(v, b) if a == 1 else np.multiply(v, a)
                if a != 1 and b:
                    r += b
                r = _modi(r, m)
            return _mark(r, v) if marks else r

        out = _lazy(fn, src)
        out._aff = (src, a, b)
        if b == 0:
            out._lin = ("scale", src, a)
        return out

    p = part(x.p, cp, f.p, False)
    q = None if x.q is None else part(x.q, cq, f.q, x.qmarks)
    return FV(x.shape, p, q, x.qmarks)


@implements("ff", "maximum")
def _ff_maximum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    a, b = args
    shape = np.broadcast_shapes(a.shape, b.shape)
    p = _lazy(np.maximum, a.p, b.p)  # equal p-residues: either operand gives the same p-residue
    if a.q is None and b.q is None:
        return FV(shape, p, None)

    a_has, b_has = a.q is not None, b.q is not None

    # lexicographic order on (p-residue, q-part), a meaningless q-part (-1, or no q-part) being the smallest
    def qpart(ap: np.ndarray, bp: np.ndarray, *qs: np.ndarray) -> np.ndarray:
        it = iter(qs)
        aq = next(it) if a_has else np.int64(-1)
        bq = next(it) if b_has else np.int64(-1)
        take_a = (ap > bp) | ((ap == bp) & (aq >= bq))
        return np.where(take_a, aq, bq).astype(np.int64, copy=False)

    deps = [a.p, b.p] + ([a.q] if a.q is not None else []) + ([b.q] if b.q is not None else [])
    return FV(shape, p, _lazy(qpart, *deps), a.qmarks or b.qmarks or not (a_has and b_has))


@implements("ff", "neg")
def _ff_neg(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], Fraction(-1), "mul")


@implements("ff", "square")
def _ff_square(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _ring("mul", args[0], args[0])


@implements("ff", "scale")
def _ff_scale(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], const_fraction(attrs["c"]), "mul")


@implements("ff", "shift")
def _ff_shift(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _affine(args[0], const_fraction(attrs["c"]), "add")


def _exp(x: FV) -> FV:
    f = current_field()
    shape = x.shape
    if x.q is None:
        def none() -> np.ndarray:
            f.q_violations += math.prod(shape)
            return np.ones(shape, dtype=np.int64)  # (the test answers Unknown)

        return FV(shape, Part(none), None)
    marks = x.qmarks
    lin = x.q._lin
    if not marks and lin is not None and lin[0] == "matmul" and not x.q.ready:
        # exp of a product's q-part: each row block of the float64 product is reduced mod q and looked up
        # while in cache (the product's int64 q-part is never formed; if another op reads it, it is made then)
        tag = ("exp", f.p, f.q, f.g)
        epi = exp_epilogue(f.p, f.q, f.g)
        fused = Part(lambda av, bv: _matmul_mod(av, bv, f.q, epi=(epi, np.float64, tag)),
                     (as_kind(lin[1], "f"), as_kind(lin[3], "f")), kind="f")
        return FV(shape, fused, None)

    def fn(xq: np.ndarray) -> np.ndarray:
        if marks:
            bad = xq < 0
            if bad.any():
                f.q_violations += int(bad.sum())
                xq = np.maximum(xq, 0)
        return _exp_gather(_exp_table_f32(f.p, f.q, f.g), xq)

    # float64 residues: its readers are mostly a sum and a matmul (an int64 twin is made if needed)
    return FV(shape, Part(fn, (as_kind(x.q, "i"),), kind="f"), None)


@implements("ff", "exp")
def _ff_exp(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _exp(args[0])


_SALT = {"silu": 1, "gelu": 2, "relu": 3, "sqrt": 4}


def _salt(name: str) -> int:
    """The oracle salt of function ``name``: fixed for the first four, else a stable hash of the name
    (which includes the op's attributes, so ``leaky_relu(0.1)`` and ``leaky_relu(0.2)`` differ)."""
    if name in _SALT:
        return _SALT[name]
    return 16 + zlib.crc32(name.encode())


def opaque(op: str) -> Callable[..., FV]:
    """The ``"ff"`` meaning of a unary op with no exact algebraic image (tanh, erf, log, ...): a fixed
    random function of its argument, drawn per trial (keyed by the field's key) and shared by both
    programs, so agreement holds for *every* function in its place. :func:`degree_bound` counts each
    application as opaque (a fresh variable, an atom of :func:`verimirage.smt.ffref.quotient_info`)."""

    def fn(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
        return _oracle(opaque_key(op, attrs), args[0])

    return fn


def _oracle(name: str, x: FV, inverse: bool = False) -> FV:
    """A per-trial random function of ``x``'s p-residue giving both parts (``inverse``: their inverses)."""
    f = current_field()
    salt = _salt(name)
    z = Part(lambda v, k=f.key, s=salt: _mix(v, k, s), (as_kind(x.p, "i"),), kind="u")  # raw bits

    def part(shift: int, m: int) -> Callable[[np.ndarray], np.ndarray]:
        def fn(zz: np.ndarray) -> np.ndarray:
            r = ((zz >> np.uint64(shift)) % np.uint64(m)).astype(np.int64)
            return _inv(r, m) if inverse else r

        return fn

    return FV(x.shape, Part(part(0, f.p), (z,)), Part(part(21, f.q), (z,)))


implements("ff", "sqrt")(lambda args, attrs, it, ot: _oracle("sqrt", args[0]))


@implements("ff", "rsqrt")
def _ff_rsqrt(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _oracle("sqrt", args[0], inverse=True)


for _u in OPAQUE:  # (pow: below, exact for the exponents with a composition)
    implements("ff", _u)(opaque(_u))


@implements("ff", "log")
def _ff_log(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """``log``: the p-part is a random function of the argument's p-residue (as for tanh); the q-part is
    the discrete log of that residue (:func:`verimirage.smt.ff.field._log_table`, -1 for 0), the exact
    inverse of exp's ``g ** (q-part)``: ``log(exp(u) * y) = u + log(y)`` holds on q-parts, which the
    q-world comparison reads (:func:`verimirage.smt.ff.trials.ff_test_q`). Its reads: p of the argument."""
    x = args[0]
    f = current_field()
    table = f.log_table()
    q = Part(lambda v: table[v], (as_kind(x.p, "i"),))
    return FV(x.shape, _oracle("log", x).p, q, qmarks=True)


def _sigmoid(x: FV) -> FV:
    """1 / (1 + exp(-x)): exact, since exp is (1 + exp(-x) is never 0: exp's values have odd order q)."""
    e = _exp(_affine(x, Fraction(-1), "mul"))
    return _reciprocal(_affine(e, Fraction(1), "add"))


def _sigmoid_op(x: FV) -> FV:
    """The meaning of sigmoid: the p-part ``1 / (1 + exp(-x))`` (exp reads ``x``'s q-part), the q-part a random
    function of ``x`` (an exp may read the result: soft-capped logits; it stands for an uninterpreted function,
    and the real sigmoid is both at once); where ``x`` has no q-part (computed by an exp: silu after
    attention), that random function in both parts, as for an opaque op. tanh and silu are defined through
    it (``2 sigmoid(2x) - 1``, ``x sigmoid(x)``) in both parts."""
    o = _oracle("sigmoid", x)
    return o if x.q is None else FV(x.shape, _sigmoid(x).p, o.q)


implements("ff", "sigmoid")(lambda args, attrs, it, ot: _sigmoid_op(args[0]))
implements("ff", "tanh")(lambda args, attrs, it, ot: _affine(_affine(  # 2 sigmoid(2x) - 1
    _sigmoid_op(_affine(args[0], Fraction(2), "mul")), Fraction(2), "mul"), Fraction(-1), "add"))
implements("ff", "silu")(lambda args, attrs, it, ot: _ring("mul", args[0], _sigmoid_op(args[0])))  # x sigmoid(x)


def _ones_like(x: FV) -> FV:
    return _affine(_affine(x, Fraction(0), "mul"), Fraction(1), "add")


def _reciprocal(x: FV) -> FV:
    return _ring("div", _ones_like(x), x)


@implements("ff", "reciprocal")
def _ff_reciprocal(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _reciprocal(args[0])


@implements("ff", "pow")
def _ff_pow(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """Integer exponents up to POW_EXACT_MAX: exact products (negative: of the inverse); x**0.5 and
    x**-0.5 are sqrt and rsqrt's random function; other exponents: a random function keyed by ``c``."""
    x = args[0]
    c = float(attrs["c"])
    if c.is_integer() and abs(c) <= POW_EXACT_MAX:
        k = int(abs(c))
        if k == 0:
            return _ones_like(x)
        y = x
        for _ in range(k - 1):
            y = _ring("mul", y, x)
        return _reciprocal(y) if c < 0 else y
    if c in (0.5, -0.5):
        return _oracle("sqrt", x, inverse=c < 0)
    return _oracle(opaque_key("pow", attrs), x)


@implements("ff", "minimum")
def _ff_minimum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """``-maximum(-a, -b)`` (the composition the reference evaluator runs, :data:`verimirage.ir.interpret.COMPOSITES`):
    exactly one of the operands, in both parts."""
    neg = [_affine(v, Fraction(-1), "mul") for v in args]
    return _affine(_ff_maximum(neg, attrs, in_types, out_types), Fraction(-1), "mul")


@implements("ff", "min")
def _ff_min(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """``-max(-x)`` along the axis (the reference's composition): one element of each row, in both parts, so a tiled
    min equals the flat one and ``minimum`` of partial mins."""
    x = _affine(args[0], Fraction(-1), "mul")
    return _affine(_order_reduce(x, neg_axis(attrs["axis"], in_types[0].rank), np.max, _max_q), Fraction(-1), "mul")


@implements("ff", "tril_mask")
def _ff_tril(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """The causal mask's 0 and 1, in both parts."""
    t = np.ascontiguousarray(tril(attrs["shape"], attrs["offset"]))
    return FV(t.shape, Part.of(t), Part.of(t))


@implements("ff", "where")
def _ff_where(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    """``m * a + (1 - m) * b``: exact on masks m in {0, 1} (the only values a vm.bool input takes), so two
    programs equal as polynomials in m are equal for every mask."""
    f = current_field()
    m, a, b = args
    shape = np.broadcast_shapes(m.shape, a.shape, b.shape)

    # computed as ``m * (a - b) + b`` with one reduction mod the modulus at the end (the same residues: a ring
    # identity; |m * (a - b) + b| < 2**43 is exact in int64), a q-residue -1 wherever an operand's is; where every
    # m is 0 or 1 (a causal mask's tril, a mask made of them) that is ``a`` where m is 1 and ``b`` where it is 0,
    # residues of [0, mod) already: one selection (np.where) instead of five passes
    def fused(mod: int, marks: bool) -> Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
        def fn(mv: np.ndarray, av: np.ndarray, bv: np.ndarray) -> np.ndarray:
            if mv.size and int(mv.min()) >= 0 and int(mv.max()) <= 1:
                r = np.where(np.broadcast_to(mv, shape) != 0, av, bv)
                return _mark(r, mv, av, bv) if marks else r
            r = np.multiply(np.subtract(av, bv), mv)
            if r.shape != shape:
                r = np.broadcast_to(r, shape).copy()
            r += bv
            r = _modi(r, mod)
            return _mark(r, mv, av, bv) if marks else r

        return fn

    p = _lazy(fused(f.p, False), m.p, a.p, b.p)
    if m.q is None or a.q is None or b.q is None:
        return FV(shape, p, None)
    marks = m.qmarks or a.qmarks or b.qmarks
    return FV(shape, p, _lazy(fused(f.q, marks), m.q, a.q, b.q), marks)


implements("ff", "cast")(lambda args, attrs, it, ot: args[0])  # real-valued meaning: the value itself


def _reduce_sum(x: FV, ax: int) -> FV:
    f = current_field()
    shape = list(x.shape)
    shape[ax] = 1

    def qfn(v: np.ndarray) -> np.ndarray:
        ok = (v >= 0).all(axis=ax, keepdims=True)
        return np.where(ok, np.maximum(v, 0).sum(axis=ax, keepdims=True) % f.q, -1)

    p = Part(lambda v, m=f.p: _sum_mod(v, ax, m), (x.p,))  # reads the part in whichever kind it is
    p._lin = ("sum", x.p, x.shape, ax)
    if x.q is None:
        q = None
    elif x.qmarks:
        q = _lazy(qfn, x.q)
    else:
        q = Part(lambda v, m=f.q: _sum_mod(v, ax, m), (x.q,))
    return FV(shape, p, q, x.qmarks)


@implements("ff", "sum")
def _ff_sum(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _reduce_sum(args[0], neg_axis(attrs["axis"], in_types[0].rank))


@implements("ff", "mean")
def _ff_mean(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    ax = attrs["axis"]
    s = _reduce_sum(args[0], neg_axis(ax, in_types[0].rank))
    return _affine(s, Fraction(1, in_types[0].shape[ax]), "mul")


@implements("ff", "max")
def _ff_max(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    return _order_reduce(args[0], neg_axis(attrs["axis"], in_types[0].rank), np.max, _max_q)


def _order_reduce(x: FV, ax: int, reduce_p: Callable[..., np.ndarray],
                  reduce_q: Callable[[np.ndarray, np.ndarray, int], np.ndarray]) -> FV:
    """max or min along ``ax`` (keepdims) in the order on (p-residue, q-part): ``reduce_p`` of the p-parts,
    ``reduce_q`` picks the q-part among the elements of that p-residue."""
    shape = list(x.shape)
    shape[ax] = 1
    p = _lazy(lambda v: reduce_p(v, axis=ax, keepdims=True), x.p)
    if x.q is None:
        return FV(shape, p, None)
    return FV(shape, p, _lazy(lambda vp, vq: reduce_q(vp, vq, ax), x.p, x.q), x.qmarks)


def _max_q(vp: np.ndarray, vq: np.ndarray, ax: int) -> np.ndarray:
    """The q-part of the max along ``ax`` (keepdims) of the values with p-residues ``vp`` and q-parts ``vq``
    (``-1``: meaningless), in the order (p-residue, then q-part), so the result does not depend on the
    order of the elements: the q-part at the largest p-residue, or where that p-residue occurs more than
    once along ``ax``, the largest q-part among those elements."""
    vp, vq = np.broadcast_arrays(vp, vq)
    ax %= vp.ndim
    i = np.expand_dims(np.argmax(vp, axis=ax), ax)
    top = np.take_along_axis(vp, i, ax)
    out = np.take_along_axis(vq, i, ax)
    ties = np.count_nonzero(vp == top, axis=ax, keepdims=True) > 1
    if ties.any():
        where = np.nonzero(ties)
        rows = tuple(w for d, w in enumerate(where) if d != ax)
        sub_p, sub_q = np.moveaxis(vp, ax, -1)[rows], np.moveaxis(vq, ax, -1)[rows]
        out[where] = np.where(sub_p == top[where][:, None], sub_q, -2).max(axis=-1)
    return out


def _matmul_q(x: np.ndarray, y: np.ndarray, q: int, marks: bool) -> np.ndarray:
    """The q-part of ``x @ y``: a row of ``x`` or column of ``y`` with a meaningless element gives
    meaningless results."""
    if not marks:
        return _matmul_mod(x, y, q)
    x_bad = np.asarray(x < 0)
    y_bad = np.asarray(y < 0)
    out = np.array(_matmul_mod(np.maximum(x, 0), np.maximum(y, 0), q))
    bad = np.asarray(x_bad.any(axis=-1))[..., :, None] | np.asarray(y_bad.any(axis=-2))[..., None, :]
    if bad.any():
        out[np.broadcast_to(bad, out.shape)] = -1
    return out


def _row_scaling(part: Part, shape: tuple[int, ...]) -> tuple[Part, Part, str] | None:
    """``(base, scale, "mul" | "div")`` when ``part`` (of ``shape``) is ``base op scale`` with ``scale``
    constant along the last axis (a row scaling, which a matmul may apply to its product instead)."""
    lin = part._lin
    if lin is None or lin[0] != "ring" or lin[1] not in ("mul", "div") or len(shape) < 2:
        return None
    _, kind, x, xs, y, ys = lin
    if ys[-1] == 1 and xs == shape:
        return x, y, kind
    if kind == "mul" and xs[-1] == 1 and ys == shape:
        return y, x, kind
    return None


@implements("ff", "matmul")
def _ff_matmul(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    f = current_field()
    a, b = args
    shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    rs = _row_scaling(a.p, a.shape)
    if rs is not None and not a.p.ready:
        # a = base op s with s constant along the contraction: (base op s) @ b == (base @ b) op s, exactly
        base, sc, op = rs

        def scaled(x: np.ndarray, y: np.ndarray, sv: np.ndarray, m: int = f.p) -> np.ndarray:
            prod = _matmul_mod(x, y, m)
            return _modi(np.multiply(prod, _inv(sv, m) if op == "div" else sv), m)

        p = Part(scaled, (as_kind(base, "f"), as_kind(b.p, "f"), as_kind(sc, "i")))
    else:
        p = _lazy_f(lambda x, y, m=f.p: _matmul_mod(x, y, m), a.p, b.p)
    p._lin = ("matmul", a.p, a.shape, b.p, b.shape)
    if a.q is None or b.q is None:
        return FV(shape, p, None)
    marks = a.qmarks or b.qmarks
    qp = _lazy_f(lambda x, y, m=f.q: _matmul_q(x, y, m, marks), a.q, b.q)
    if a.shape[-1] <= _CHUNK:
        qp._lin = ("matmul", a.q, a.shape, b.q, b.shape)  # read by a fused exp (see _exp)
    return FV(shape, p, qp, marks)


@implements("ff", "rms_norm")
def _ff_rms(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    x = args[0]
    rank = in_types[0].rank
    ax = attrs["axis"]
    nax = neg_axis(ax, rank)
    ms = _affine(_reduce_sum(_ring("mul", x, x), nax), Fraction(1, in_types[0].shape[ax]), "mul")
    ms = _affine(ms, const_fraction(attrs["eps"]), "add")
    y = _ring("mul", x, _oracle("sqrt", ms, inverse=True))
    if len(args) == 2:
        w = args[1]
        y = _ring("mul", y, w.reshape(w.shape + (1,) * (-nax - 1)))
    return y


@implements("ff", "concat")
def _ff_concat(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    r = in_types[0].rank
    ax = neg_axis(attrs["axis"], r)
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - r] for a in args))
    shapes = [batch + a.shape[a.ndim - r :] for a in args]
    out_shape = list(shapes[0])
    out_shape[ax] = sum(s[ax] for s in shapes)

    def cat(*vs: np.ndarray) -> np.ndarray:
        return np.concatenate([np.broadcast_to(v, s) for v, s in zip(vs, shapes, strict=True)], axis=ax)

    p = _lazy(cat, *(a.p for a in args))
    p._lin = ("concat", tuple(a.p for a in args), tuple(a.shape for a in args), ax % len(out_shape))
    if all(a.q is None for a in args):
        return FV(out_shape, p, None)
    qs = [a.q if a.q is not None else Part.of(np.broadcast_to(np.int64(-1), a.shape)) for a in args]
    marks = any(a.qmarks or a.q is None for a in args)
    return FV(out_shape, p, _lazy(cat, *qs), marks)


@implements("ff", "transpose")
def _ff_transpose(args: list[FV], attrs: dict[str, Any], in_types: Any, out_types: Any) -> FV:
    r = in_types[0].rank
    x = args[0]
    i, j = neg_axis(attrs["a"], r) % x.ndim, neg_axis(attrs["b"], r) % x.ndim
    perm = list(range(x.ndim))
    perm[i], perm[j] = perm[j], perm[i]
    return x.transpose(perm)
