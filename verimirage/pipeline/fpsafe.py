"""Floating-point safety of a candidate: finite wherever the source is, and not materially less accurate than the
source, each evaluated in its own dtype.

``vm.verify`` proves two programs equal over the reals; it says nothing about overflow. A rewrite that is exact over
the reals can overflow where the source does not: ``exp(a - max a)`` rewritten to ``exp(a) / exp(max a)`` is ``inf /
inf`` on logits near 100 in fp32. :func:`fp_safety` evaluates the source and the candidate with every node's result
rounded to its dtype (fp16 and fp32 by numpy's casts, bf16 by rounding the fp32 bits to nearest even), on
adversarial inputs (all inputs together at wide uniform values of both signs at growing scales, up to values near
the dtype's largest, large-norm normal values and all-positive ones; then each input alone at a large scale, the
others moderate: a candidate that multiplies before the source normalises, ``(x * w) @ m`` for ``rms_norm(x, w) @
m``, overflows only where one input is large, and where all are the source overflows too; then each input with one
outlier element among tiny ones, the others idle on the outlier's index: a design that scales a tensor by its
largest element flushes the small ones to 0; then rows of a large offset and a small spread, each input alone and
all together: a one-pass variance cancels where the source's centred one does not), and reports the first input set
on which the candidate has a non-finite element where the source's is finite, or an error against the float64
reference above :data:`ERROR_RATIO` (8) times the source's own error there and above :data:`ERROR_FLOOR` of an
output's largest value (the GPU check's float64 tolerance: finite but wrong, e.g. every output 0, or a cancellation
the source does not make). The search (:func:`verimirage.pipeline.superopt.superoptimize`) rejects such a candidate
with that reason. Before it, at every size, a structural check (:meth:`SafetyChecker.structural`): every exp the source
max-shifts stays max-shifted, where the source exps only sums or differences the candidate does too, each exp reading
the inputs of one of the source's (:func:`exps_of_sums`, :func:`exp_reads`), and no operand of a product is a sum (or
a product) the source never rounds to a dtype as narrow (:func:`operand_sums`). A program too large to evaluate on
every set evaluates, at its own size, on the near-constant sets each candidate that takes a cancellation-prone
difference the source does not (:func:`differences`, :meth:`SafetyChecker.cancellation_check`, up to
:data:`NEAR_CONSTANT_FLOPS_LIMIT`; past it on a twin of fewer rows proved equal, :func:`row_twin`): what the whole
check would find there.

Rounding follows the generated code (:mod:`verimirage.backend.codegen`): the candidate's results that it
returns in their dtype, those only other kernels read in fp32 (``codegen.storage_dtype``), the source's every
op result (a kernel's store, as eager ops store it) in its dtype; values inside a kernel in fp32, a matmul's
operands in their dtype; an op's fp32 accumulator (its fact ``accumulates``: an ``rms_norm`` kernel's
sum of squares) in fp32, its overflow counted as the op's result overflowing. Only input sets on
which no intermediate value of the source overflows constrain the candidate (an overflowed intermediate
can leave a finite but meaningless output, e.g. 0 from a softmax whose denominator overflowed).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.dtypes import DType
from ..ir.finfo import DTYPE_MAX
from ..ir.graph import Graph, Ref, node_list, output_refs
from ..ir.interpret import apply_op, run_block
from ..ir.ops import OPS, Prop, TensorType
from ..ir.reference import REF

log = logging.getLogger(__name__)

def round_to(x: Any, dtype: DType) -> np.ndarray:
    """``x`` (float64) rounded to ``dtype`` and back to float64 (overflow gives inf, as the dtype does)."""
    a = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype is DType.float16:
            return a.astype(np.float16).astype(np.float64)
        f = a.astype(np.float32)
        if dtype is DType.float32:
            return f.astype(np.float64)
        # bfloat16: round the fp32 bits to nearest even on the upper 16 bits (NaN kept as NaN)
        u = np.ascontiguousarray(f).view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
        out = r.astype(np.uint32).view(np.float32).astype(np.float64)
        return np.where(np.isnan(f), np.nan, out)


class RoundingDomain:
    """The float64 reference with every op's result rounded: at kernel level to the result's dtype (each
    kernel-level op is a kernel that stores its result), inside kernels to fp32 (the generated kernels
    compute in fp32), with a matmul's operands rounded to their dtype first (``tl.dot`` takes them so).
    ``nonfinite``: whether any result so far had a non-finite element."""

    name = "ref"

    def __init__(self, kernel_level: bool) -> None:
        self.kernel_level = kernel_level
        self.nonfinite = False
        #: whether an op made a NaN from operands without one (``inf - inf``, ``0 * inf``, ``inf / inf``): the
        #: program is undefined somewhere on these inputs (see :data:`SPECIAL_SETS`)
        self.made_nan = False

    def apply(self, op: str, args: list[Any], attrs: dict[str, Any], in_types: Sequence[TensorType],
              out_type: TensorType) -> Any:
        with np.errstate(all="ignore"):
            if op == "matmul" and not self.kernel_level:
                args = [round_to(a, t.dtype) for a, t in zip(args, in_types, strict=True)]
            r = round_to(REF.apply(op, args, attrs, in_types, out_type),
                         out_type.dtype if self.kernel_level else DType.float32)
            acc = OPS[op].accumulates
            if acc is not None and not self.nonfinite and not _accumulator_finite(acc, args, attrs, in_types):
                self.nonfinite = True
        if not (self.nonfinite and self.made_nan) and not np.isfinite(r).all():
            self.nonfinite = True
            if not self.made_nan and np.isnan(r).any() and not any(np.isnan(a).any() for a in args):
                self.made_nan = True
        return r


def _accumulator_finite(acc: Any, args: Sequence[Any], attrs: Mapping[str, Any],
                        in_types: Sequence[TensorType]) -> bool:
    """Whether the fp32 accumulator an op's lowering keeps (its fact ``accumulates``, :class:`~verimirage.ir.opfacts.
    Accumulates`: an ``rms_norm`` kernel's sum of squares) is finite on operands ``args``: evaluated as the kernel
    computes it, inside the kernel in fp32 (a bf16 or fp32 input beyond 1.8e19 has an inf square, and the kernel's
    finite ``x * rsqrt(inf) = 0`` is not its value; the float64 reference alone does not show it)."""
    inner = RoundingDomain(False)
    t = TensorType(in_types[acc.operand].shape, DType.float32)
    if acc.term is None:  # (the operand itself, loaded into fp32)
        tt, terms = t, round_to(args[acc.operand], DType.float32)
    else:
        tt = OPS[acc.term].infer([t], {})
        terms = inner.apply(acc.term, [args[acc.operand]], {}, [t], tt)
    ax = {"axis": int(attrs.get("axis", -1)) % t.rank}
    inner.apply(acc.reduce, [terms], ax, [tt], OPS[acc.reduce].infer([tt], ax))
    return not inner.nonfinite


def made_nan(g: Graph, inputs: Mapping[str, np.ndarray]) -> bool:
    """Whether an op of ``g``, evaluated as :func:`evaluate_in_dtype` does, makes a NaN from operands without one
    (``inf - inf``, ``0 * inf``): ``g`` is undefined somewhere on ``inputs``."""
    return evaluate_in_dtype(g, inputs, nan_made=True)[1]


def evaluate_in_dtype(g: Graph, inputs: Mapping[str, np.ndarray], *,
                      generated: bool = False, nan_made: bool = False) -> tuple[list[np.ndarray], bool]:
    """``g`` evaluated as the generated kernels compute (:class:`RoundingDomain`): inputs and kernel results
    rounded to their dtypes, values inside a kernel to fp32. Returns the outputs (float64 arrays) and
    whether any intermediate value had a non-finite element.

    ``generated``: a kernel's result that the program does not return is kept as the code generator keeps it,
    in fp32 (``backend.codegen.storage_dtype``; a candidate's partial sums between kernels; one that every reader
    only casts for ``tl.dot`` the generated code stores in its dtype, which is the rounding the product's operand
    gets here), else (the source,
    every op of which stores its result as eager ATen ops do) in its dtype. ``nan_made``: the flag returned is instead
    whether an op made a NaN from operands without one (:func:`made_nan`)."""
    kern, blk = RoundingDomain(True), RoundingDomain(False)
    nodes = node_list(g)
    final = set(output_refs(g)) if generated else None
    env: dict[int, list[Any]] = {}

    def stored(i: int, k: int, dtype: DType) -> DType:
        return dtype if final is None or (i, k) in final else DType.float32

    with np.errstate(all="ignore"):
        for i, n in enumerate(nodes):
            if n.op == "input":
                t = n.outs[0]
                env[i] = [round_to(inputs[str(n.attr("name"))], t.dtype)]
            elif n.op == "custom":
                args = [env[a][k] for a, k in n.args]
                types = [nodes[a].outs[k] for a, k in n.args]
                outs = run_block(n.attr("block"), args, types, blk, n.outs)
                env[i] = [round_to(o, stored(i, k, t.dtype)) for k, (o, t) in enumerate(zip(outs, n.outs, strict=True))]
                kern.nonfinite = kern.nonfinite or not all(np.isfinite(o).all() for o in env[i])
            else:
                args = [env[a][k] for a, k in n.args]
                types = [nodes[a].outs[k] for a, k in n.args]
                if final is None:
                    env[i] = [apply_op(kern, n.op, args, n.attr_dict, types, n.outs[0])]
                else:  # (a kernel of its own: in fp32, a matmul's operands in their dtype, its result as stored)
                    r = apply_op(blk, n.op, args, n.attr_dict, types, n.outs[0])
                    env[i] = [round_to(r, stored(i, 0, n.outs[0].dtype))]
        outs = [np.asarray(env[a][k], dtype=np.float64) for a, k in output_refs(g)]
    return outs, (kern.made_nan or blk.made_nan) if nan_made else (kern.nonfinite or blk.nonfinite)


#: (description, kind, scale): scale is a magnitude, or a fraction of the dtype's largest value ("near-max")
INPUT_SETS: tuple[tuple[str, str, float], ...] = (
    ("uniform +-3", "uniform", 3.0),
    ("uniform +-10", "uniform", 10.0),
    ("uniform +-30", "uniform", 30.0),
    ("uniform +-100", "uniform", 100.0),
    ("positive 1..30", "positive", 30.0),
    ("normal x100 (large norms)", "normal", 100.0),
    ("uniform +-1e3", "uniform", 1e3),
    ("uniform +-1e4", "uniform", 1e4),
    ("near the dtype's max", "near-max", 0.5),
)

#: (description, kind, scale) of the sets in which ONE input is large and every other one is at
#: :data:`ALONE_BASE`'s scale (one set per input and entry): scaling all inputs together leaves blind the
#: candidates that multiply before the source normalises, since the source overflows on the same sets (an fp16
#: ``(x * w) @ m`` for ``rms_norm(x, w) @ m`` is inf once ``|x w| > 65504``, x near 3e4 and w near 8, where the
#: source is finite: the twelfth session's red team finding)
ALONE_SETS: tuple[tuple[str, str, float], ...] = (
    ("uniform +-1e3", "uniform", 1e3),
    ("near the dtype's max", "near-max", 0.5),
)

#: the scale of the other inputs in the sets of :data:`ALONE_SETS`
ALONE_BASE: tuple[str, str, float] = ("uniform +-3", "uniform", 3.0)

#: (description, kind, scale) of the sets in which ONE input has one outlier element (its first, at ``scale`` of the
#: dtype's largest value) among elements within +-1e-3, and every other input is :data:`IDLE_BASE` (idle on the
#: outlier's channel): one set per input. A design that scales a whole tensor by its largest element flushes the
#: small elements to 0 where the source keeps them (an fp16 ``(x @ ((w / max|w|) m)) * max|w|`` for
#: ``rms_norm(x, w) @ m`` with ``w = [6e4, 1e-3, ...]`` and ``x`` 0 on the outlier's column: every output 0, the
#: source accurate; the fourteenth session's red team finding). Only the accuracy criterion
#: (:data:`ERROR_RATIO`) sees it: the values are finite.
OUTLIER_SET: tuple[str, str, float] = ("one element near the dtype's max, the rest within +-1e-3", "outlier", 0.5)

#: OUTLIER_PAIRS: besides, for each vector input (rank 1: a norm's weight, a per-channel scale) and each other input
#: of more than one element, the set in which both have an :data:`OUTLIER_SET` outlier (at index 0) and every other
#: input is :data:`IDLE_BASE`: a design that bounds a product of the two by its largest element (``w_0 m_00``)
#: flushes the small products ``w_i m_ij`` beside it. The fourteenth session's fp16 weight tile
#: ``(w_i m_ij) / s``, ``s = max(1, max |w_i m_ij| / 2**15)`` per loop iteration, flushed every output of
#: ``rms_norm(x, w) @ m`` to 0 there (red team session 15) and passed every one-input set.

#: (description, kind, scale) of the sets in which every logit input (:func:`logit_inputs`: those an exp reads) has
#: every row far below zero, within +-3 of ``-scale`` (-6e4: near fp16's lowest, -65,504), the others
#: :data:`ALONE_BASE`'s: one set per entry where the program has a logit input, after the near-constant sets. Every
#: other set spreads a row over both signs or keeps it above zero, so that a row's max is above zero: a shift by a
#: constant, or by a max floored at zero (``relu`` of it: proved equal, a per-row shift), is at or above the row's max
#: there, and only on rows far below zero are all of a row's exps 0 (a softmax 0 / 0, a log-sum-exp log 0 = -inf) where
#: the source's shift by the row's own max keeps them finite (twentieth session). Not 0.9 of the dtype's lowest: in fp32
#: the cross-entropy's hoisted ``sum(t) lse - sum(t x)`` overflows at logits near -3e38 where the source's ``t (lse -
#: x)`` does not, a range no real logit has
BELOW_SETS: tuple[tuple[str, str, float], ...] = (
    ("rows far below zero (-1e4 +-3)", "below", 1e4),
    ("rows far below zero (-6e4 +-3)", "below", 6e4),
)

#: the other inputs of an :data:`OUTLIER_SET` set: :data:`ALONE_BASE`'s values with index 0 of every axis set to 0
#: (whatever axis meets the outlier, its partner there is 0: an idle channel, a pruned row)
IDLE_BASE: tuple[str, str, float] = ("uniform +-3, 0 at index 0 of every axis", "idle", 3.0)

#: (description of) the near-constant sets: ONE input (each floating-point input of more than one element in turn, the
#: others :data:`ALONE_BASE`'s), then every input together (all positive, where the program has more than one such
#: input), rows of a large common offset and a small spread (:data:`NEAR_CONSTANT`). Every row's mean is exactly the
#: offset along every axis, so a source that centres its rows first (a LayerNorm's ``x - mean(x)``, a two-pass
#: variance) is accurate there in its dtype, and a candidate that subtracts two large nearly equal values instead (the
#: one-pass variance ``mean(x^2) - mean(x)^2``: ``mean(x^2)`` rounded to fp32 loses ``offset^2 * 2^-24``, the whole
#: variance once the spread is below about ``offset / 4096``) is grossly wrong where the source is not
#: (:data:`ERROR_RATIO`). No other set draws such rows: every other one spreads each row over its whole scale. Real
#: activations have them (a large DC offset, a residual stream). A source that itself cancels there (a program written
#: as a one-pass variance) is inaccurate on them, and its candidates are then held only to its own error, as on every
#: set. The eighteenth session's LayerNorm fold ``rstd * ((x g) W - mean(x) g^T W)``, whose fp16 operand ``x g``
#: loses ``offset * 2^-12`` (0.47 of the output on the GPU on fp16 rows of 64 and 64.0625, where fp16's own rounding of
#: the row's mean makes the source as wrong), is 0.09 to 0.23 of the output's largest value off on these rows, where
#: the source is within 4e-4: below the eighteenth session's gross-error line (0.25), far above :data:`ERROR_RATIO`
#: times the source's error. A bf16 one-pass variance is caught on rows of 2,048 or more
#: (:data:`NEAR_CONSTANT_ONE_PAIR`); on shorter ones it is exact in fp32.
NEAR_CONSTANT_SET = "near-constant rows (a large offset, a small spread; every row's mean exactly the offset)"

#: per dtype, the near-constant sets' (offset, deviation): every element is the offset (a power of two) plus an
#: integer multiple (within ``deviation``) of the offset's ulp in that dtype on about one element in
#: :data:`NEAR_CONSTANT_DENSITY` (else the offset itself), the deviations in pairs of opposite sign next to each other
#: along every axis (:func:`near_constant`), so that every row, and every run of even length starting at an even
#: index (a row split by a reshape), sums to exactly its length times the offset. The ulp is 2^-4 in fp16, 2^-1 in bf16
#: and 2^-10 in fp32 (deviations up to 0.25), so that a row's variance stays above a norm's epsilon (1e-5); the spread
#: is about 1/4096 of the offset in fp16 (64, the most a row of 1,000 summed in fp16 stays finite at), 1/512 in bf16
#: and 1/200,000 in fp32. bf16's offset was 8 until the twentieth session: a row of one deviation pair (ulp 2^-4) among
#: 4,096 has a variance of 2e-6, below the epsilon, which hid the one-pass variance's loss of it
#: (:data:`NEAR_CONSTANT_ONE_PAIR`).
NEAR_CONSTANT: dict[DType, tuple[float, int]] = {DType.float16: (64.0, 1), DType.bfloat16: (64.0, 1),
                                                  DType.float32: (8192.0, 256)}

#: about one element in this many deviates from the offset in a near-constant set (:data:`NEAR_CONSTANT`): the fewer
#: deviate, the smaller a row's spread against the offset. A LayerNorm program's fp16 one-pass variance (summed in
#: fp32) is 1.4 to 3.2 times the output's largest value off with one element in 16, and 0.03 to 0.12 with one in 4
#: (rows of 64 and 512, four seeds each; the source within 6e-4)
NEAR_CONSTANT_DENSITY = 16

_MANTISSA_BITS = {DType.float16: 10, DType.bfloat16: 7, DType.float32: 23}

#: the dtypes whose inputs get a second near-constant set each (after the others): one deviation pair a row along the
#: last axis (:func:`near_constant`'s ``one_pair``) instead of about one element in :data:`NEAR_CONSTANT_DENSITY`:
#: bf16. A bf16 element that differs from the offset differs by 2^-8 to 2^-7 of it, so one element in 16 off gives a
#: row's variance 2^-18 of the offset squared, and fp32's rounding of ``sum(x^2)`` (2^-24 of it) loses 1.6% of the
#: variance: a one-pass variance ``mean(x^2) - mean(x)^2`` with fp32 statistics is within bf16's floor there. And
#: within one binade ``sum(x^2)`` of bf16 values is exact in fp32 up to 256 of them (with the deviations in pairs, up
#: to 1,024 here), in the emulator (which sums exactly, rounding once) and on a GPU alike: the one-pass form is exact on
#: such rows. With one pair a row of n, the variance ``2 ulp^2 / n`` is lost to fp32's rounding of ``sum(x^2)`` from n
#: = 2,048: the bf16 one-pass variance of a LayerNorm of 4 x 2048 is more than 0.2 of the output's largest value off
#: there, where the source is within 1e-2 (it passed every set before, twentieth session: test_fp_near_constant.py)
NEAR_CONSTANT_ONE_PAIR = frozenset({DType.bfloat16})


def near_constant(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator,
                  one_pair: bool = False) -> np.ndarray:
    """Values of a near-constant set (:data:`NEAR_CONSTANT`) of ``shape`` in ``dtype``: the offset plus deviations of
    whole ulps in pairs of opposite sign, next to each other along every axis (an odd axis's last index 0), each
    exactly representable in ``dtype``. ``one_pair``: one deviation (a pair) in every row pair along the last axis
    instead of about one element in :data:`NEAR_CONSTANT_DENSITY` (:data:`NEAR_CONSTANT_ONE_PAIR`)."""
    offset, q = NEAR_CONSTANT[dtype]
    ulp = offset * 2.0 ** -_MANTISSA_BITS[dtype]
    half = tuple(max(1, n // 2) for n in shape)
    steps, signs = rng.integers(1, q + 1, half), rng.choice([-1.0, 1.0], half)
    keep = rng.random(half) * NEAR_CONSTANT_DENSITY < 1
    if one_pair:  # (one deviation pair a row along the last axis: NEAR_CONSTANT_ONE_PAIR)
        keep = np.arange(half[-1]) == rng.integers(0, half[-1], half[:-1])[..., None]
    d = steps * signs * keep
    for ax, n in enumerate(shape):
        if n > 1:  # (interleave d and -d along ``ax``: positions 2i and 2i + 1)
            d = np.stack([d, -d], axis=ax + 1).reshape((*d.shape[:ax], 2 * d.shape[ax], *d.shape[ax + 1:]))
            if n % 2:
                d = np.concatenate([d, np.zeros_like(np.take(d, [0], axis=ax))], axis=ax)
    return offset + ulp * d


#: (description, pattern) of the special-values sets: one set per floating-point input and entry, that input at
#: :data:`ALONE_BASE`'s values with the pattern written in (a "row": index 0 of every leading axis, the whole last axis;
#: "half of every row": the first half of the last axis everywhere), the others :data:`ALONE_BASE`'s. The finite ones
#: (zeros of both signs, the dtype's smallest normal values) are checked as every other set; on the others (an
#: infinity or a NaN in) the candidate must agree with the source where the source is defined: a finite value where
#: the source's is finite, an infinity (of either sign) where it is infinite, and, for an infinity in a logit
#: (:func:`logit_inputs`), no NaN where the source has none (:meth:`SafetyChecker.special_check`). A set constrains
#: nothing where the source itself is undefined, some op of it making a NaN from operands without one (``inf - inf``;
#: for a NaN set, the same inputs with the NaN read as 0 do) (:func:`made_nan`). The finite sets cannot show what a
#: program does at an infinity: a flash-attention design whose running max is -inf on a row's masked first tiles is
#: NaN on every such row where the source (and ATen's attention) is finite, and a logsumexp shifted by an unclamped
#: max is NaN for a row of -inf where it is -inf (red team session 17).
SPECIAL_SETS: tuple[tuple[str, str], ...] = (
    ("-inf on the first half of every row (an additive mask: left padding)", "-inf-half"),
    ("-inf on one row (a fully masked row, log 0)", "-inf-row"),
    ("one -inf element", "-inf-one"),
    ("one +inf element", "+inf-one"),
    ("one NaN element", "nan-one"),
    ("zeros of both signs on one row", "zero-row"),
    ("the dtype's smallest normal values on one row", "tiny-row"),
)

#: the smallest normal value of each floating-point dtype (:data:`SPECIAL_SETS`' "tiny-row")
_TINY = {DType.float16: 2.0 ** -14, DType.bfloat16: 2.0 ** -126, DType.float32: 2.0 ** -126}


def _special(pattern: str, v: np.ndarray, dtype: DType) -> np.ndarray:
    """``v`` with :data:`SPECIAL_SETS`' ``pattern`` written in (a copy)."""
    v = v.copy()
    row = (0,) * (v.ndim - 1) + (slice(None),)
    if pattern == "-inf-half":
        v[..., : max(1, v.shape[-1] // 2)] = -np.inf
    elif pattern == "-inf-row":
        v[row] = -np.inf
    elif pattern in ("-inf-one", "+inf-one", "nan-one"):
        v[(0,) * v.ndim] = {"-inf-one": -np.inf, "+inf-one": np.inf, "nan-one": np.nan}[pattern]
    elif pattern == "zero-row":
        v[row] = np.where(np.arange(v.shape[-1]) % 2 == 0, 0.0, -0.0)
    else:  # tiny-row
        v[row] = _TINY[dtype] * np.linspace(1.0, 4.0, v.shape[-1]) * np.where(np.arange(v.shape[-1]) % 2, -1.0, 1.0)
    return v


def logit_inputs(g: Graph) -> frozenset[str]:
    """The names of ``g``'s inputs an ``exp`` of it reads (directly or not): its logits, where -inf is a meaningful
    value (a mask, log 0), so that a candidate must give the source's result on an infinity there, NaN only where the
    source is NaN (a logsumexp of a row of -inf is -inf, not NaN). An infinity in any other input (an overflowed or
    uninitialised value) need only keep the source's finite values finite and its infinities infinite: the
    cross-entropy's ``sum(t) * lse - sum(t * x)`` for ``sum(t * (lse - x))`` is NaN where a target of -inf makes the
    source -inf."""
    nodes = node_list(g)
    reads: list[frozenset[str]] = []
    out: set[str] = set()
    for n in nodes:
        r = frozenset({str(n.attr("name"))}) if n.op == "input" else frozenset().union(*(reads[a] for a, _ in n.args))
        reads.append(r)
        if OPS[n.op].has(Prop.EXPONENTIAL):
            out |= r
    return frozenset(out)


def special_inputs(g: Graph, seed: int = 0) -> list[tuple[str, dict[str, np.ndarray], str, str]]:
    """The :data:`SPECIAL_SETS` sets of ``g`` (description, inputs, pattern, the input it is written in), for each
    floating-point input of more than one element in turn (by name)."""
    ts = sorted(g.inputs, key=lambda t: str(t.name))
    out: list[tuple[str, dict[str, np.ndarray], str, str]] = []
    for t in ts:
        if t.dtype not in DTYPE_MAX or math.prod(t.shape) < 2:
            continue
        for what, pattern in SPECIAL_SETS:
            rng = np.random.default_rng([seed, 0x5E, len(out)])
            ins = {str(u.name): (rng.integers(0, 2, tuple(u.shape)).astype(np.float64) if u.dtype is DType.bool
                                 else _values(ALONE_BASE[1], ALONE_BASE[2], DTYPE_MAX[u.dtype], tuple(u.shape), rng))
                   for u in ts}
            ins[str(t.name)] = _special(pattern, ins[str(t.name)], t.dtype)
            out.append((f"{t.name} with {what} (the others {ALONE_BASE[0]})", ins, pattern, str(t.name)))
    return out


#: on an input set on which no value of the source overflows, a candidate's largest error against the float64
#: reference (over an output's elements finite in all three) may be at most this many times the source's own largest
#: error there, both evaluated as the kernels compute in the same dtype on the same inputs, or
#: :data:`ERROR_FLOOR` of the output's largest reference value, whichever is larger: a candidate materially less
#: accurate than the program as written is rejected, one as accurate as it (or more) is kept, and where the source
#: is itself inaccurate the candidate is held only to the source's own error. The committed candidates that the check
#: evaluates are at most 2.8 times the source's error (``prefill_16_small`` on a row of fp16's smallest normal values:
#: 0.019 against 0.0068 of the largest value; every other one at most 1.9 times it, or within the floor: 1,806 outputs
#: on every set, nineteenth session); the LayerNorm fold ``rstd * ((x g) @ W - mean(x) g^T W)`` is 240 to 600 times the
#: source's on fp16 near-constant rows (0.09 to 0.23 of the largest value against 3.8e-4), a one-pass variance more
#: than 3,000 times. The eighteenth session's rule (gross: above 0.25 where the source is within 2e-2) is implied:
#: every candidate it rejected is rejected here
ERROR_RATIO = 8.0

#: per output dtype, the error (relative to the output's largest float64 value) any candidate may have whatever the
#: source's (:data:`ERROR_RATIO`), so that a source exact or nearly exact on a set does not make the rounding of a
#: correct design an error. In fp16 and bf16 the accuracy against float64 that the GPU check accepts of any kernel
#: (``backend.profile.TOLERANCE``); in fp32 a tenth of it. 16 roundings of the dtype (2^-20 in fp32) were too tight in
#: fp32: the cross-entropy's ``sum(t) lse - sum(t x)`` is 1.0-1.2e-6 of the largest value off on uniform +-1e4 fp32
#: inputs, 18-22 times the source's one rounding (5.7e-8); the GPU check's 1e-4 (nineteenth session) let an fp32
#: candidate about 800 roundings off pass. What the committed designs need (twentieth session: the 51 committed
#: candidates of the programs the whole check evaluates, written in fp32): at most 3.3e-6 where they are above 8 times
#: the source's error (cross_entropy's on uniform +-3, 11-15 times the source's 2.2e-7), but for cross_entropy's
#: distributed ``sum(t) lse - sum(t x)`` on near-constant fp32 logits (offset 8192), 1.6-2.5e-4 there, 9-14 times the
#: source's 1.7e-5 (a cancellation: rejected under either floor); 1e-5 leaves those designs three times their need
ERROR_FLOOR: dict[DType, float] = {DType.float16: 2e-3, DType.bfloat16: 1.2e-2, DType.float32: 1e-5}

#: programs whose inputs have more elements than this get the structural check only (see
#: :data:`NUMERIC_FLOPS_LIMIT`; the choice depends on the program only, never on timing)
LARGE_INPUT_ELEMENTS = 1 << 20


def _values(kind: str, s: float, top: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of one input set's ``kind`` at scale ``s`` (``top``: the dtype's largest), clipped to it."""
    if kind == "uniform":
        v = rng.uniform(-s, s, shape)
    elif kind == "positive":
        v = rng.uniform(1.0, s, shape)
    elif kind == "normal":
        v = s * rng.standard_normal(shape)
    elif kind == "idle":
        v = rng.uniform(-s, s, shape)
        for ax in range(len(shape)):
            v[(slice(None),) * ax + (0,)] = 0.0
    elif kind == "below":  # (rows far below zero: -s within +-3)
        v = -s + rng.uniform(-3.0, 3.0, shape)
    elif kind == "outlier":
        v = rng.uniform(-1e-3, 1e-3, shape)
        v[(0,) * len(shape)] = s * top
    else:
        v = rng.uniform(0.25 * s * top, s * top, shape) * rng.choice([-1.0, 1.0], shape)
    return np.clip(v, -top, top)


def adversarial_inputs(g: Graph, seed: int = 0, *,
                       near_constant_only: bool = False) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The input sets of :data:`INPUT_SETS` for ``g``'s inputs (all inputs at that scale), then for each input
    (by name) and each entry of :data:`ALONE_SETS` the set in which that input alone has that scale and the others
    :data:`ALONE_BASE`'s, then for each input of more than one element the :data:`OUTLIER_SET` set (that input one
    outlier among tiny values, the others :data:`IDLE_BASE`), then the pairs of a vector input and another input
    with an outlier each (OUTLIER_PAIRS, beside :data:`OUTLIER_SET`), then the near-constant sets
    (:data:`NEAR_CONSTANT_SET`: each input alone, then every input together; in bf16 also each input alone with one
    deviation pair a row, :data:`NEAR_CONSTANT_ONE_PAIR`), then every logit input far below zero (:data:`BELOW_SETS`)
    (each value clipped to its dtype's range;
    a mask is random 0 / 1 in every set). ``near_constant_only``: the near-constant sets alone, with the values they
    have among all the sets (each set's values are drawn from its own seed)."""
    ts = sorted(g.inputs, key=lambda t: str(t.name))
    plans: list[tuple[str, dict[str, tuple[str, str, float]]]] = [
        (what, {str(t.name): (what, kind, s) for t in ts}) for what, kind, s in INPUT_SETS]
    for t in ts:
        if t.dtype is DType.bool:
            continue
        for what, kind, s in ALONE_SETS:
            plans.append((f"{t.name} alone {what} (the others {ALONE_BASE[0]})",
                          {str(u.name): ((what, kind, s) if u is t else ALONE_BASE) for u in ts}))
    for t in ts:
        if t.dtype is not DType.bool and math.prod(t.shape) > 1:
            plans.append((f"{t.name} {OUTLIER_SET[0]} (the others {IDLE_BASE[0]})",
                          {str(u.name): (OUTLIER_SET if u is t else IDLE_BASE) for u in ts}))
    for t in ts:  # (a vector's outlier beside another input's, see OUTLIER_PAIRS)
        if t.dtype is DType.bool or len(t.shape) != 1 or t.shape[0] < 2:
            continue
        for u in ts:
            if u is not t and u.dtype is not DType.bool and math.prod(u.shape) > 1:
                plans.append((f"{t.name} and {u.name} {OUTLIER_SET[0]} (the others {IDLE_BASE[0]})",
                              {str(v.name): (OUTLIER_SET if v is t or v is u else IDLE_BASE) for v in ts}))
    near = [t for t in ts if t.dtype in NEAR_CONSTANT and math.prod(t.shape) > 1]
    groups = [[t] for t in near] + ([near] if len(near) > 1 else [])
    for j, group in enumerate(groups):  # (the near-constant sets: one input alone, then every input together)
        plans.append((f"{group[0].name} alone {NEAR_CONSTANT_SET} (the others {ALONE_BASE[0]})" if len(group) == 1
                      else f"every input {NEAR_CONSTANT_SET}",
                      {str(t.name): (("near", "near-constant", float(j)) if t in group else ALONE_BASE) for t in ts}))
    for t in near:  # (then one deviation pair a row: NEAR_CONSTANT_ONE_PAIR)
        if t.dtype in NEAR_CONSTANT_ONE_PAIR and len(t.shape) > 1:
            plans.append((f"{t.name} alone {NEAR_CONSTANT_SET}, one deviation pair a row (the others {ALONE_BASE[0]})",
                          {str(u.name): (("near", "near-one-pair", 0.0) if u is t else ALONE_BASE) for u in ts}))
    logits = [t for t in ts if str(t.name) in logit_inputs(g) and t.dtype in DTYPE_MAX]
    for what, kind, sc in BELOW_SETS if logits else ():  # (then every logit far below zero: BELOW_SETS)
        plans.append((f"{', '.join(str(t.name) for t in logits)} {what} (the others {ALONE_BASE[0]})",
                      {str(u.name): ((what, kind, sc) if u in logits else ALONE_BASE) for u in ts}))
    out = []
    for i, (what, per) in enumerate(plans):
        if near_constant_only and NEAR_CONSTANT_SET not in what:
            continue
        rng = np.random.default_rng([seed, 0xF9, i])
        ins = {}
        for t in ts:
            if t.dtype is DType.bool:  # a mask (where): random 0 / 1 in every set
                ins[str(t.name)] = rng.integers(0, 2, tuple(t.shape)).astype(np.float64)
                continue
            _, kind, sc = per[str(t.name)]
            ins[str(t.name)] = (near_constant(tuple(t.shape), t.dtype, rng, kind == "near-one-pair")
                                if kind in ("near-constant", "near-one-pair")
                                else _values(kind, sc, DTYPE_MAX[t.dtype], tuple(t.shape), rng))
        out.append((what, ins))
    return out


#: the uniform scales between :data:`INPUT_SETS`' +-3 and +-10 tried for :func:`edge_inputs`
EDGE_SCALES = (4.0, 5.0, 6.0, 7.0, 8.0)


def edge_inputs(g: Graph, seed: int = 0) -> list[tuple[str, dict[str, np.ndarray]]]:
    """Where ``g`` overflows on every input uniform +-10 but not +-3: every input uniform +-s for the largest ``s`` of
    :data:`EDGE_SCALES` on which ``g`` stays finite (evaluated in its dtype), the edge of its finite range, where a
    candidate's larger intermediate values overflow first (red team 21: ``exp(y + max y)`` for the source's
    ``exp(y - max y)``, ``y = rsqrt(softmax(x))``, NaN from +-5 where the source is finite to +-7 and its sets at +-3
    pass and at +-10 are not read); none otherwise."""
    ts = sorted(g.inputs, key=lambda t: str(t.name))
    if any(t.dtype is DType.bool or t.dtype not in DTYPE_MAX for t in ts):
        return []

    def at(s: float) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([seed, 0xED, int(s)])
        return {str(t.name): _values("uniform", s, DTYPE_MAX[t.dtype], tuple(t.shape), rng) for t in ts}

    with np.errstate(all="ignore"):
        if not evaluate_in_dtype(g, at(10.0))[1]:
            return []  # (finite at +-10: INPUT_SETS reads that range)
        edge = [s for s in EDGE_SCALES if not evaluate_in_dtype(g, at(s))[1]]
    return [(f"uniform +-{edge[-1]:g} (the widest of +-{EDGE_SCALES[0]:g}..+-{EDGE_SCALES[-1]:g} on which the source "
             "stays finite)", at(edge[-1]))] if edge else []


#: programs whose float evaluation costs more than this many matmul flops (or whose inputs have more than
#: :data:`LARGE_INPUT_ELEMENTS` elements) get the structural check only: a full-size attention evaluation
#: takes 2-15 s of CPU per input set on a 2-core machine, several times its verification; the suite's small
#: programs (at most 5.3e5 flops) are checked numerically
NUMERIC_FLOPS_LIMIT = 1e7


def matmul_flops(g: Graph) -> float:
    """Multiply-add flops of ``g``'s kernel-level matmuls (``2 * |out| * k``)."""
    total = 0.0
    nodes = node_list(g)
    for n in nodes:
        if OPS[n.op].has(Prop.CONTRACTION):
            a = nodes[n.args[0][0]].outs[n.args[0][1]]
            total += 2.0 * math.prod(n.outs[0].shape) * a.shape[-1]
    return total


#: programs with a value (an op's result at kernel level) of more elements than this get the structural check only:
#: the input and flop bounds do not bound a broadcast's result (pairwise distances ``sum((x[:, None] - c[None])^2)``
#: of 4096 x 64 points each are 524k input elements and no product, and their difference 2^30 elements, 8 GiB in
#: float64 a value and a set: the evaluation ran out of memory; red team 19b). 2^22 elements: 32 MiB a value; every
#: committed program the numeric check evaluates has at most 2^20
LARGE_VALUE_ELEMENTS = 1 << 22


def largest_value(g: Graph) -> int:
    """The most elements of one value of ``g`` at kernel level (an input, an op's or a kernel's result)."""
    return max((math.prod(t.shape) for n in node_list(g) for t in n.outs), default=0)


def numeric_check_affordable(g: Graph) -> bool:
    """Whether :class:`SafetyChecker` evaluates ``g`` numerically (else: the structural check only)."""
    return (sum(math.prod(t.shape) for t in g.inputs) <= LARGE_INPUT_ELEMENTS
            and matmul_flops(g) <= NUMERIC_FLOPS_LIMIT and largest_value(g) <= LARGE_VALUE_ELEMENTS)


#: a program too large for the whole numeric check (:func:`numeric_check_affordable`) but of at most this many matmul
#: flops and :data:`NEAR_CONSTANT_INPUT_ELEMENTS` input elements evaluates, at its own size, on the near-constant sets
#: (:data:`NEAR_CONSTANT_SET`) each candidate that takes a cancellation-prone difference the source does not
#: (:func:`differences`): the models set's LayerNorm and GroupNorm programs (16 x 4096 rows and a 4096 x 4096
#: projection: about 0.5 s for the source and 0.3 s a candidate a set on the 2-core machine), where a one-pass variance
#: or a LayerNorm fold would otherwise pass on the structural check alone
NEAR_CONSTANT_FLOPS_LIMIT = 2e9

#: see :data:`NEAR_CONSTANT_FLOPS_LIMIT` (2**25 elements: 16 x 4096 activations beside a 4096 x 4096 weight, or a
#: 2048 x 4096 residual stream and its input); also the most elements of one of the program's values
#: (:data:`LARGE_VALUE_ELEMENTS`: a LayerNorm of 2^25 elements peaks near 5.5 GiB on the near-constant sets)
NEAR_CONSTANT_INPUT_ELEMENTS = 1 << 25


def near_constant_affordable(g: Graph) -> bool:
    """Whether :class:`SafetyChecker` evaluates, at ``g``'s size, the candidates with a difference the source does not
    take on the near-constant sets where the whole numeric check is not affordable
    (:data:`NEAR_CONSTANT_FLOPS_LIMIT`)."""
    return (sum(math.prod(t.shape) for t in g.inputs) <= NEAR_CONSTANT_INPUT_ELEMENTS
            and matmul_flops(g) <= NEAR_CONSTANT_FLOPS_LIMIT and largest_value(g) <= NEAR_CONSTANT_INPUT_ELEMENTS)


_MAX_LIKE = ("max", "running_max", "loop_max")


def max_shifted(mg: Graph) -> bool:
    """Whether ``mg`` applies ``exp`` and every ``exp`` (at any level) is of ``x - m`` with ``m`` a max of
    that same ``x`` (``max``, ``running_max``, ``loop_max`` of it, or ``maximum`` with such a max): the
    numerically safe form. A max elsewhere in the program does not count (``exp(a) / exp(max a)`` is not
    shifted). ``rescaled_sum`` (``exp(m_prev - m)`` of a running max) is shifted by construction."""
    shifts = exp_shifts(mg)
    return bool(shifts) and all(s == "max" for s in shifts)


def exps_of_sums(mg: Graph) -> bool:
    """Whether ``mg`` applies ``exp`` and every ``exp`` (at any level) is of a sum or difference ``x +- y`` (any
    ``y``; ``rescaled_sum``'s by construction). ``exp(s - l)`` with ``l`` a row's log-sum-exp (attention from its
    saved statistic; ``exp(s + nl)`` with its negation) is finite for logits near 100 where rule ``exp-sub``'s
    ``exp(s) / exp(l)`` (``exp-add``'s ``exp(s) exp(nl)``) is inf / inf (fp32's exp overflows past 88.7):
    ``vm.superoptimize``'s best candidate of ``exp(S - L) @ V`` (red team, session 15)."""
    shifts = exp_shifts(mg)
    return bool(shifts) and all(s != "none" for s in shifts)


def exp_shifts(mg: Graph) -> list[str]:
    """One entry per ``exp`` of ``mg`` (at any level) and ``rescaled_sum``: ``"max"`` for ``x - m`` with ``m`` a
    max of that same ``x`` (:func:`max_shifted`; a ``rescaled_sum``), ``"sum"`` for another sum or difference,
    else ``"none"``. A max of a max of ``x`` over another axis (the max of the row maxes) is a max over more than the
    values the exp's row sums: a row far below another one has every exp 0 and a softmax of 0 / 0, so it is no max
    shift (a running or loop max joins the tiles of one row: it is)."""
    found: list[str | int] = []  # (an exp of a difference: its index in shifted_exps, labelled once all are seen)
    Val = tuple[Sequence[Any], Ref, Any]  # (the nodes of a scope, a value's ref, the scope's outer resolver)

    def scope(nodes: Sequence[Any], refs: Sequence[Ref], outer: Any) -> Any:
        """The resolver of a thread graph's ``arg`` k: the value ``refs[k]`` of the scope ``nodes`` it is fused in."""
        return lambda k: (nodes, refs[k], outer)

    def resolve(v: Val) -> Val:
        """Through a thread graph's ``arg`` to the block value it stands for, and through a ``fused`` node to the
        thread graph value it returns."""
        nodes, (i, k), outer = v
        while True:
            n = nodes[i]
            if n.op == "arg" and outer is not None:
                nodes, (i, k), outer = outer(n.attr("index"))
            elif n.op == "fused":
                tg = n.attr("thread")
                nodes, (i, k), outer = tg.nodes, tg.outputs[k], scope(nodes, n.args, outer)
            else:
                return nodes, (i, k), outer

    def same(u: Val, w: Val, depth: int = 0) -> bool:
        """Whether ``u`` and ``w`` are one value: the same node, or the same op with the same attributes and result
        type over the same values (a thread graph that recomputes the chain a block value was computed by: the max
        of the block value is the max of the recomputed one, which rounds the same)."""
        (un, (ui, uk), uo), (wn, (wi, wk), wo) = resolve(u), resolve(w)
        if un is wn and (ui, uk) == (wi, wk):
            return True
        a, b = un[ui], wn[wi]
        if a.op == "input" and b.op == "input" and un is wn and id(un) in kernel_of:
            # (two operands of one kernel that are one kernel-level value read through the same maps: one tile; a
            # kernel taking x twice shifted by maximum(max x1, max x2 + 1000) passed as "not computed from x1")
            args = kernel_of[id(un)][1].args
            return args[a.attr("arg")] == args[b.attr("arg")] and all(
                a.attr(k) == b.attr(k) for k in ("imap", "fmap", "shape")) and a.outs == b.outs
        if (depth > 16 or a.op in ("input", "arg", "custom") or a.op != b.op or a.attrs != b.attrs or uk != wk
                or a.outs[uk] != b.outs[wk] or len(a.args) != len(b.args)):
            return False
        return all(same((un, r, uo), (wn, q, wo), depth + 1) for r, q in zip(a.args, b.args, strict=True))

    def reads(v: Val, x: Val) -> bool:
        """Whether ``v`` is computed from ``x`` (a value :func:`same` as it, within ``v``'s kernel; each value visited
        once: a program's values share operands)."""
        todo, seen = [v], set()
        while todo:
            u = todo.pop()
            nodes, (i, k), outer = resolve(u)
            if (id(nodes), i, k) in seen:
                continue
            seen.add((id(nodes), i, k))
            if same(u, x):
                return True
            if nodes[i].op not in ("input", "arg", "custom"):
                todo += [(nodes, r, outer) for r in nodes[i].args]
        return False

    def sources(v: Val) -> set[Any]:
        """The program inputs (by name) ``v`` is computed from, followed through kernels: a block input to the
        kernel-level value it reads, a kernel's result to its block's output (each value visited once)."""
        todo, seen, out = [v], set(), set()
        while todo:
            nodes, (i, k), outer = resolve(todo.pop())
            if (id(nodes), i, k) in seen:
                continue
            seen.add((id(nodes), i, k))
            n = nodes[i]
            if n.op == "input" and id(nodes) in kernel_of:
                kn, cn = kernel_of[id(nodes)]
                todo.append((kn, cn.args[n.attr("arg")], None))
            elif n.op == "custom":
                bg = n.attr("block")
                kernel_of.setdefault(id(bg.nodes), (nodes, n))
                todo.append((bg.nodes, bg.outputs[k], None))
            elif n.op in ("input", "arg"):
                out.add(str(n.attr("name")) if n.op == "input" else (id(nodes), i, k))
            else:
                todo += [(nodes, r, outer) for r in n.args]
        return out

    #: a block graph's nodes (by id) -> (the kernel-level nodes, the custom node holding it)
    kernel_of: dict[int, tuple[Sequence[Any], Any]] = {}

    def whole_tiles(n: Any, ga: Any) -> bool:
        """Whether block input ``n`` (of a kernel of grid and loop ``ga``) reads its operand in whole tiles, no masked
        tail: a tail's zero padding enters the first kernel's maxima (``max(row max, 0)``: an over-shift, every exp 0
        on a row far below zero), which the partials' exact tiling of their own output does not show."""
        imap, fmap = n.attr("imap"), n.attr("fmap")
        return all(t * math.prod(p for p, d in zip(ga.grid, imap, strict=True) if d == k)
                   * (ga.frange if fmap == k else 1) == size
                   for k, (t, size) in enumerate(zip(n.outs[0].shape, n.attr("shape"), strict=True)))

    def same_across(u: Val, w: Val, ga: Any, depth: int = 0) -> bool:
        """:func:`same` for ``u`` in one kernel and ``w`` in another of the same grid and loop (``ga``): block inputs
        are one value where they read one kernel-level value through the same maps (the loop's where there is one)."""
        (un, (ui, uk), uo), (wn, (wi, wk), wo) = resolve(u), resolve(w)
        a, b = un[ui], wn[wi]
        if a.op == "input" and b.op == "input":
            ka, kb = kernel_of.get(id(un)), kernel_of.get(id(wn))
            return (ka is not None and kb is not None and ka[0] is kb[0]
                    and ka[1].args[a.attr("arg")] == kb[1].args[b.attr("arg")]
                    and a.attr("imap") == b.attr("imap") and a.attr("shape") == b.attr("shape") and a.outs == b.outs
                    and (ga.frange == 1 or a.attr("fmap") == b.attr("fmap")) and whole_tiles(a, ga))
        if (depth > 16 or a.op in ("input", "arg", "custom") or a.op != b.op or a.attrs != b.attrs or uk != wk
                or a.outs[uk] != b.outs[wk] or len(a.args) != len(b.args)):
            return False
        return all(same_across((un, r, uo), (wn, q, wo), ga, depth + 1) for r, q in zip(a.args, b.args, strict=True))

    def moves(v: Val, axes: Sequence[Any], depth: int = 0) -> dict[Any, set[int]] | None:
        """Per grid axis in ``axes`` (and ``"loop"``): the dims of ``v``'s tile along which the tiles its leaves read
        move when the block moves on that axis (or the loop iterates); None where that is not followed (a reduction, a
        reshape, a contracted dim, an op not listed)."""
        nodes, (i, k), outer = resolve(v)
        n = nodes[i]
        rank = len(n.outs[k].shape)
        if depth > 32:
            return None
        if n.op == "input":
            imap, fmap = n.attr("imap"), n.attr("fmap")
            got: dict[Any, set[int]] = {g: set() if imap[g] is None else {imap[g]} for g in axes if g != "loop"}
            got["loop"] = set() if fmap is None else {fmap}
            return got
        if n.op == "matmul" and n.args[0] == n.args[1]:
            return None
        subs = [moves((nodes, r, outer), axes, depth + 1) for r in n.args]
        if any(m is None for m in subs):
            return None
        out: dict[Any, set[int]] = {g: set() for g in [*axes, "loop"]}
        for r, m in zip(n.args, subs, strict=True):
            assert m is not None
            ra = len(nodes[r[0]].outs[r[1]].shape)
            for g, ds in m.items():
                for d in ds:
                    if n.op == "matmul":
                        kdim = ra - 1 if r == n.args[0] else ra - 2
                        if d == kdim:
                            return None
                        e = d + rank - ra
                    elif n.op == "transpose":
                        e = {n.attr("a"): n.attr("b"), n.attr("b"): n.attr("a")}.get(d, d)
                    elif n.op == "loop_sum" or OPS[n.op].has(Prop.ELEMENTWISE):
                        e = d + rank - ra
                    else:
                        return None
                    out[g].add(e)
        return out

    def producer(p: Val) -> tuple[Any, Any, int, Any, Any] | None:
        """Where ``p`` is an unlooped block input of a kernel B reading an output of another kernel A: (the input node,
        A's custom node, the output's index, A's block graph, B's)."""
        bn, (pi, _), _ = resolve(p)
        pn = bn[pi]
        if pn.op != "input" or id(bn) not in kernel_of or pn.attr("fmap") is not None:
            return None
        kn, cb = kernel_of[id(bn)]
        ai, ak = cb.args[pn.attr("arg")]
        ca = kn[ai]
        return None if ca.op != "custom" else (pn, ca, ak, ca.attr("block"), cb.attr("block"))

    def max_of_partials(p: Val, axis: int, x: Val) -> bool:
        """Whether ``max(p, axis)``, ``p`` a block input of kernel B reading the per-block maxima (partials) another
        kernel A wrote, is the max of the row of ``x`` it is broadcast against in B: a row split over blocks, its
        second pass shifted by the max of the first pass's partial maxima. Shown where A and B have one grid and
        loop, no causal skip; A's blocks tile its output exactly (each partial stored); B reads ``p`` unlooped, on
        every grid axis either whole or the slab A's block wrote, its tile A's with ``axis`` grown (A writes one
        partial along ``axis``); A's partial is a max over one axis ``r`` (over every iteration where it loops) of a
        value computed as ``x`` is from the same operands' tiles read through the same maps; and every grid axis B
        reads whole, and the loop, moves those tiles along ``r`` alone: the partials ``M`` maxes are of one row."""
        got = producer(p)
        if got is None:
            return False
        pn, ca, ak, ga, gb = got
        if ga.grid != gb.grid or ga.frange != gb.frange or ga.flimit is not None or gb.flimit is not None:
            return False
        odims, imap, vshape = ga.omaps[ak].dims, pn.attr("imap"), ca.outs[ak].shape
        if any(n > 1 and d is not None and d != od for n, d, od in zip(ga.grid, imap, odims, strict=True)):
            return False
        if any(n > 1 and ga.type_of(ga.outputs[ak]).shape[od] * n != vshape[od]
               for n, od in zip(ga.grid, odims, strict=True)):
            return False
        ta, tb = ga.type_of(ga.outputs[ak]).shape, pn.outs[0].shape
        if len(ta) != len(tb) or ta[axis] != 1 or any(
                t != u for d, (t, u) in enumerate(zip(ta, tb, strict=True)) if d != axis):
            return False
        xn, (xi, xk), _ = resolve(x)
        xs = xn[xi].outs[xk].shape
        whole = [g for g, (n, d) in enumerate(zip(ga.grid, imap, strict=True)) if n > 1 and d is None]

        def partial(v: Val, acc: bool, depth: int = 0) -> bool:
            """A's ``v`` is a max over one axis (over every iteration where A loops) of ``x``'s chain in A."""
            nodes, (i, _), outer = resolve(v)
            n = nodes[i]
            if depth > 8:
                return False
            if n.op in ("running_max", "loop_max"):
                return partial((nodes, n.args[0], outer), True, depth + 1)
            big = DTYPE_MAX[DType.float32]
            if n.op == "clamp" and n.attr("hi") >= big and n.attr("lo") <= -big:
                return partial((nodes, n.args[0], outer), acc, depth + 1)
            if n.op != "max" or not (acc or ga.frange == 1):
                return False
            a = (nodes, n.args[0], outer)
            r = int(n.attr("axis"))
            an, (aj, ak_), _ = resolve(a)
            sh = an[aj].outs[ak_].shape
            if sh != xs or tuple(1 if d == r else t for d, t in enumerate(sh)) != ta or not same_across(a, x, ga):
                return False
            m = moves(x, whole)
            return m is not None and all(m[g] <= {r} for g in whole) and (ga.frange == 1 or m["loop"] <= {r})

        return partial((ga.nodes, ga.outputs[ak], None), False)

    Corr = tuple[dict[int, int], frozenset[int]]  # (B's grid axis -> A's, A's split axes)

    def combine_of(p: Val, axis: int) -> tuple[Any, int, Corr] | None:
        """Where ``max(p, axis)`` in kernel B combines the partial maxima another kernel A wrote along ``axis`` (a split
        decode's combine: B has a grid axis for each of A's but the split ones): ``(A's block graph, the output, the
        grid axes' correspondence)``. B reads ``p`` unlooped and every partial along ``axis`` (A's axes that B lacks,
        the splits, write along ``axis`` alone, one partial a block); each other grid axis of B reads the slab of one of
        A's of the same size; A's blocks tile that output exactly, none skipped."""
        got = producer(p)
        if got is None:
            return None
        pn, ca, ak, ga, gb = got
        if ga.flimit is not None or gb.flimit is not None:
            return None
        odims, vshape = ga.omaps[ak].dims, ca.outs[ak].shape
        ta, tb = ga.type_of(ga.outputs[ak]).shape, pn.outs[0].shape
        if (len(ta) != len(tb) or ta[axis] != 1 or tb[axis] != vshape[axis]
                or any(t != u for d, (t, u) in enumerate(zip(ta, tb, strict=True)) if d != axis)):
            return None
        moving = {od for n, od in zip(ga.grid, odims, strict=True) if n > 1}
        if any(ta[d] * math.prod(n for n, od in zip(ga.grid, odims, strict=True) if od == d) != vshape[d]
               for d in range(len(vshape))):
            return None  # (A's tiles cover its output exactly)
        corr: dict[int, int] = {}
        for g, (n, d) in enumerate(zip(gb.grid, pn.attr("imap"), strict=True)):
            if n == 1:
                continue
            hit = [a for a, (na, od) in enumerate(zip(ga.grid, odims, strict=True)) if od == d and na == n]
            if d is None or d == axis or len(hit) != 1:
                return None
            corr[g] = hit[0]
        splits = frozenset(a for a, n in enumerate(ga.grid) if n > 1 and a not in corr.values())
        if any(odims[a] != axis for a in splits) or not moving <= {odims[a] for a in corr.values()} | {axis}:
            return None
        return ga, ak, (corr, splits)

    def same_row(u: Val, w: Val, c: Corr, depth: int = 0) -> bool:
        """:func:`same` for ``u`` in kernel A and ``w`` in kernel B of :func:`combine_of`'s correspondence ``c``: block
        inputs are one value where they read one kernel-level value, unlooped, through corresponding maps, and A's
        split axes do not move the read (each split block of A computes the value B's block does)."""
        (un, (ui, uk), uo), (wn, (wi, wk), wo) = resolve(u), resolve(w)
        a, b = un[ui], wn[wi]
        corr, splits = c
        if a.op == "input" and b.op == "input":
            ka, kb = kernel_of.get(id(un)), kernel_of.get(id(wn))
            ia, ib = a.attr("imap"), b.attr("imap")
            return (ka is not None and kb is not None and ka[0] is kb[0]
                    and ka[1].args[a.attr("arg")] == kb[1].args[b.attr("arg")] and a.attr("fmap") is None
                    and b.attr("fmap") is None and a.attr("shape") == b.attr("shape") and a.outs == b.outs
                    and all(ia[corr[g]] == ib[g] for g in corr) and all(ia[s] is None for s in splits)
                    and all(ib[g] is None for g, n in enumerate(kb[1].attr("block").grid) if n > 1 and g not in corr))
        if (depth > 16 or a.op in ("input", "arg", "custom") or a.op != b.op or a.attrs != b.attrs or uk != wk
                or a.outs[uk] != b.outs[wk] or len(a.args) != len(b.args)):
            return False
        return all(same_row((un, r, uo), (wn, q, wo), c, depth + 1) for r, q in zip(a.args, b.args, strict=True))

    def joins(m2: Val, m: Val) -> Corr | bool:
        """Whether ``m2`` is ``m`` (:func:`same`; True), a running or loop max of it, or (a :data:`Corr`) the max of the
        partial maxima another kernel wrote as such a max of ``m`` (:func:`combine_of`): a max of ``m`` over more of the
        row, at or above it and equal to it on the tiles where ``m`` is the largest; else False."""
        nodes, (i, _), outer = resolve(m2)
        n = nodes[i]
        if same(m2, m):
            return True
        if n.op in ("running_max", "loop_max"):
            return joins((nodes, n.args[0], outer), m)
        if n.op == "max":
            c = combine_of((nodes, n.args[0], outer), int(n.attr("axis")))
            if c is not None and joins((c[0].nodes, c[0].outputs[c[1]], None), m) is True:
                return c[2]
        return False

    def combined_max(p: Val, axis: int, x: Val, e: Any, depth: int) -> bool:
        """Whether ``max(p, axis)`` (kernel B) is a max of ``x``'s row: the max of the partial maxima kernel A wrote
        (:func:`combine_of`), each a max of a value of A that is ``x`` (:func:`same_row`: the split decode's new score,
        which every split block of A computes and B again)."""
        c = combine_of(p, axis)
        if c is None:
            return False
        ga, ak, corr = c
        xa = [(ga.nodes, (j, k), None) for j, nd in enumerate(ga.nodes) for k in range(len(nd.outs))
              if same_row((ga.nodes, (j, k), None), x, corr)]
        return any(is_max_of((ga.nodes, ga.outputs[ak], None), v, e, depth + 1) for v in xa[:1])

    def is_max_of(m: Val, x: Val, e: Any = None, depth: int = 0) -> bool:
        """Whether ``m`` is a max of ``x``: at or above every value of ``x``'s row, and one of them or another score
        summed beside them (the ``maximum`` case); ``e``: the exp of ``x - m`` being labelled."""
        nodes, (i, _), outer = resolve(m)
        n = nodes[i]
        if depth > 8:
            return False
        if same(m, x):
            return True
        if n.op in _MAX_LIKE:
            a = (nodes, n.args[0], outer)
            if same(a, x):
                return True
            if n.op == "max" and (max_of_partials(a, int(n.attr("axis")), x)
                                  or combined_max(a, int(n.attr("axis")), x, e, depth)):
                return True
            if n.op == "max":  # (a max of a max of x: over a range beyond x's own max unless over a size-1 axis)
                an, (ai, ak), _ = resolve(a)
                if an[ai].outs[ak].shape[int(n.attr("axis"))] != 1:
                    return False
            return is_max_of(a, x, e, depth + 1)
        if n.op == "maximum":
            # (one operand a max of x; each other one a max of x too, or another score of the row: a value not computed
            # from x that reads a program input x does not (the decode's new score, its key's weight, beside the
            # cache's), exp'd shifted by this same maximum and summed with x's exps into a normaliser (a divisor, a
            # reciprocal's or a log's operand): that sum has the term exp(0) = 1 where the other score is the maximum.
            # A value computed from x (a max of x plus 1000, the sum of |x|, the max of x's operand read whole or
            # computed so in another kernel), or one the program does not exp so (1000 times the new score, whose own
            # exp is of the score), is above the exp'd values of a row: each exp of the row 0 and its softmax 0 / 0)
            vs = [(nodes, r, outer) for r in n.args]
            hits = [is_max_of(v, x, e, depth + 1) for v in vs]
            return any(hits) and all(h or (not reads(v, x) and bool(sources(v) - sources(x))
                                          and summed_beside(v, m, e, depth))
                                     for h, v in zip(hits, vs, strict=True))
        big = DTYPE_MAX[DType.float32]
        if n.op == "clamp" and n.attr("hi") >= big and n.attr("lo") <= -big:
            # (a max floored at fp32's lowest finite value, RUNNING_MAX_FLOOR: still >= every x, and a row's own max
            # wherever it has a finite score; a higher floor is above a row of scores below it, every exp of the row
            # 0 and its softmax 0 / 0: exp(x - clamp(max x, 1e4)) is proved equal and NaN on every row of +-3)
            return is_max_of((nodes, n.args[0], outer), x, e, depth + 1)
        return False

    #: each exp of a difference (at any level): (the exp node, the difference's two operands)
    shifted_exps: list[tuple[Any, Val, Val]] = []
    #: per normaliser (a divisor, a reciprocal's or a log's operand), the exps (by node id) it sums with positive
    #: weights through sums and data movement: the softmax denominators; ``live``: those an output of the program is
    #: computed from (a normaliser nothing reads shows nothing about the rows the program returns)
    normalisers: list[frozenset[int]] = []
    live: set[int] = set()

    def summed_beside(v: Val, m: Val, e: Any, depth: int) -> bool:
        """Whether operand ``v`` of the maximum ``m`` that shifts the exp ``e`` is another score of ``e``'s row: the
        program exps ``y - m'`` (``m'`` :func:`same` as ``m``) with ``v`` that ``y`` or a max of it, and one
        normaliser sums that exp and ``e``."""
        for e2, y, m2 in shifted_exps:
            j = joins(m2, m) if e2 is not e else False
            if j is False or not any(summed(e, k) and summed(e2, k) for k in live):
                continue
            if (same(v, y) or is_max_of(v, y, e2, depth + 1)) if j is True else same_row(v, y, j):
                return True
        return False

    def summed(e: Any, k: int) -> bool:
        """Whether normaliser ``k`` sums exp ``e`` or one computed as it is (a thread graph's recomputation)."""
        return id(e) in normalisers[k] or any(id(f) in normalisers[k] and same(x, y) and same(m, m2)
                                              for f, x, m in shifted_exps for g, y, m2 in shifted_exps if g is e)

    #: (the exps a value sums with positive weights, the normalisers it reads, whether it is >= 0: a sum with a term
    #: that may be negative, ``(sum e_x + e_v) + -e_v``, sums no exp in this sense, its value may be 0 where e_v is 1)
    P = tuple[frozenset[int], frozenset[int], bool]

    def positive(n: Any, nodes: Sequence[Any], a: list[P]) -> P:
        """:func:`_walk_values`' step for :data:`normalisers`."""
        deps: frozenset[int] = frozenset().union(*(v[1] for v in a))
        if n.op in ("div", "reciprocal", "log"):
            deps |= {len(normalisers)}
            normalisers.append(a[-1][0] if a[-1][2] else frozenset())
        if n.op == "exp":
            return frozenset({id(n)}), deps, True
        nonneg = all(v[2] for v in a)
        if n.op in ("add", "sum", "mean", "loop_sum", "reshape", "permute", "transpose", "broadcast_to", "cast",
                    "concat") or (n.op == "scale" and float(n.attr("c")) > 0):
            return (frozenset().union(*(v[0] for v in a)) if nonneg else frozenset()), deps, nonneg
        if n.op == "rescaled_sum":  # (the running sum of its first operand, each step weighted by an exp)
            return a[0][0], deps, a[0][2]
        if n.op == "mul" and len(a) == 2 and nonneg:  # (a value weighted by an exp: a split's partial sum rescaled)
            ex = [nodes[r[0]].op == "exp" for r in n.args]
            kept: frozenset[int] = frozenset().union(*(v[0] for v, x in zip(a, ex, strict=True) if not x))
            return (kept if any(ex) else frozenset()), deps, True
        return frozenset(), deps, False

    def walk(nodes: Sequence[Any], outer: Any) -> None:
        for n in nodes:
            if n.op == "custom":
                kernel_of[id(n.attr("block").nodes)] = (nodes, n)
        for n in nodes:
            if n.op == "custom":
                walk(n.attr("block").nodes, None)
            elif n.op == "fused":
                walk(n.attr("thread").nodes, scope(nodes, n.args, outer))
            elif n.op == "rescaled_sum":
                found.append("max")
            elif n.op == "exp":
                an, (ai, _), ao = resolve((nodes, n.args[0], outer))
                a = an[ai]
                if a.op == "sub":
                    found.append(len(shifted_exps))
                    shifted_exps.append((n, (an, a.args[0], ao), (an, a.args[1], ao)))
                else:
                    found.append("sum" if a.op == "add" else "none")

    walk(node_list(mg), None)
    if shifted_exps:
        live.update(*(v[1] for v in _walk_values(mg, lambda name: (frozenset(), frozenset(), False), positive)))
    return [f if isinstance(f, str) else "max" if is_max_of(shifted_exps[f][2], shifted_exps[f][1], shifted_exps[f][0])
            else "sum" for f in found]


#: ops whose result is a sum of their operands' values (and products: a sum of products)
_SUMS = frozenset({"add", "sub", "sum", "loop_sum"})
#: ops through which a sum stays a sum of the same values (data movement, a constant factor)
_SUM_KEEPING = frozenset({"permute", "reshape", "broadcast_to", "slice", "transpose", "concat", "cast", "scale", "neg"})


#: a sum named by the program inputs it reads and the largest value of the dtype it is rounded to
Sum = tuple[frozenset[str], float]


def operand_sums(g: Graph) -> tuple[frozenset[Sum], frozenset[Sum]]:
    """See :func:`reads_of` (its first two parts)."""
    operands, sums, _ = reads_of(g)
    return operands, sums


#: a difference (an ``add`` or ``sub``, at any level) whose two operands read a common program input, at least one of
#: them through a sum of many values (:func:`differences`): the program inputs both operands read together, and how
#: many of the two carry such a sum (1 or 2)
Difference = tuple[frozenset[str], int]


def _sums_values(op: str) -> bool:
    """Whether ``op``'s result sums many values (a ``sum`` or ``mean``, a product's accumulation, a loop's sum, a norm
    op's statistic): a value of a row's size, against which a difference of it and another value of the same row can
    cancel."""
    d = OPS[op]
    return (((d.has(Prop.REDUCTION) or d.has(Prop.LOOP)) and d.family != "max") or d.has(Prop.CONTRACTION)
            or d.accumulates is not None)


def differences(g: Graph) -> frozenset[Difference]:
    """The kinds of :func:`difference_counts` (each difference's inputs and sums)."""
    return frozenset(difference_counts(g))


def difference_counts(g: Graph) -> Counter[Difference]:
    """The cancellation-prone differences of ``g`` (:data:`Difference`), each with how many times ``g`` takes one of
    that kind (a candidate that takes more of a kind than the source, one being its own, is evaluated: a source's
    two-sum difference of ``x`` hid a candidate's one-pass variance of ``x`` when only the kinds were compared):
    every ``add`` / ``sub`` (at any level, through
    kernels' and thread graphs' arguments) whose two operands read a common program input and at least one of which
    carries a sum of many values (:func:`_sums_values`, through any later op). Where the operands are nearly equal,
    their difference keeps only the bits their rounding left: the source's centring ``x - mean(x)`` is ``({x}, 1)``;
    a one-pass variance ``mean(x^2) - mean(x)^2`` is ``({x}, 2)``; the LayerNorm fold ``(x g) @ W - mean(x) (g^T W)``
    is ``({x, g, W}, 2)``. A candidate with a difference the source does not take (:meth:`SafetyChecker.check`) is
    evaluated on the near-constant sets even where the program is too large for the whole numeric check
    (:data:`NEAR_CONSTANT_FLOPS_LIMIT`)."""
    found: dict[Difference, set[int]] = {}
    # (the program inputs it reads, whether it carries a sum of many values, whether it is a max or min of values: a
    # value among them, so that ``s - max(s)`` subtracts two of the same values' roundings: the max shift, no
    # cancellation; and a hash of its computation, so that one difference computed twice, a kernel's recomputation of
    # another's chain, counts once)
    V = tuple[frozenset[str], bool, bool, int]

    def step(n: Any, nodes: Sequence[Any], a: list[V]) -> V:
        reads: frozenset[str] = frozenset().union(*(v[0] for v in a))
        d = OPS[n.op]
        sig = hash((n.op, str(n.attrs), tuple(v[3] for v in a)))
        if d.has(Prop.ELEMENTWISE) and d.has(Prop.BINARY) and d.has(Prop.LINEAR) and len(a) == 2 \
                and a[0][0] & a[1][0] and (a[0][1] or a[1][1]) \
                and not any(u[2] and u[0] <= w[0] for u, w in ((a[0], a[1]), (a[1], a[0]))):
            # (an add or a sub: linear in each operand)
            found.setdefault((reads, int(a[0][1]) + int(a[1][1])), set()).add(sig)
        summed = _sums_values(n.op) or any(v[1] for v in a)
        # (a max, min, running or loop max, maximum: one of its operands' values; a clamp of one: a floor)
        selected = d.family == "max" or (d.family == "clamp" and any(v[2] for v in a))
        return reads, summed, selected, sig

    _walk_values(g, lambda name: (frozenset({name}), False, False, hash(("input", name))), step)
    return Counter({k: len(v) for k, v in found.items()})


def _walk_values(g: Graph, leaf: Any, step: Any) -> list[Any]:
    """Walks ``g`` at every level, a value per node result: ``leaf(name)`` for a program input, a kernel's (thread
    graph's) input the value of the argument it reads, a kernel's (thread graph's) results the values of its block's
    outputs, and ``step(node, nodes, operand values)`` for every other node (the value of each of its results;
    ``nodes``: the node's scope). Returns the values of ``g``'s outputs."""

    def walk(nodes: Sequence[Any], args: Sequence[Any]) -> list[list[Any]]:
        vals: list[list[Any]] = []
        for n in nodes:
            a = [vals[j][k] for j, k in n.args]
            if n.op == "input":
                idx = n.attr("arg")
                vals.append([args[idx] if idx is not None else leaf(str(n.attr("name")))])
            elif n.op == "arg":
                vals.append([args[n.attr("index")]])
            elif n.op in ("custom", "fused"):
                sub = n.attr("block" if n.op == "custom" else "thread")
                inner = walk(sub.nodes, a)
                vals.append([inner[j][k] for j, k in sub.outputs])
            else:
                vals.append([step(n, nodes, a)] * max(1, len(n.outs)))
        return vals

    top = walk(node_list(g), [])
    return [top[i][k] for i, k in output_refs(g)]


def exp_reads(g: Graph) -> frozenset[frozenset[str]]:
    """The program inputs each ``exp`` (at any level; and each ``rescaled_sum``, an exp of a running max's change)
    reads, one set per distinct argument: :func:`reads_of`'s third part."""
    return reads_of(g)[2]


def reads_of(g: Graph) -> tuple[frozenset[Sum], frozenset[Sum], frozenset[frozenset[str]]]:
    """``(operands, sums)``: the sums (``add`` / ``sub``, ``sum``, loop sums and products, each a sum of products)
    that reach an operand of a product, at any level (through data movement, casts and constant factors; a kernel's
    result or block input read as the value it carries), and every sum, each named by the program inputs it reads
    and the largest value of its dtype (an operand's: ``tl.dot`` takes its operands in their dtype; a sum's
    result's). Such an operand is inf once it passes its dtype's largest value though each value summed is
    finite; where the source rounds the same sum to a dtype no wider (a residual it stores, then normalises), it
    overflows with it. ``x @ (w1 + w2)`` (rule ``matmul-add-factor``) for ``x @ w1 + x @ w2`` is inf at
    ``w1 = w2 = 4e4`` in fp16 (at ``1.8e38`` in bf16 and fp32) where the source, which never forms ``w1 + w2``, is
    finite (red team, session 15; bf16 and fp32: session 16), and ``x @ (a @ b)`` (rule ``matmul-assoc``) for
    ``(x @ a) @ b`` is inf at ``a, b`` near 100 and ``x`` near 1e-4 in fp16 (session 16); the numeric check's
    input sets (all inputs at one scale, or one input alone large) never make two inputs large and another small.
    Third, :func:`exp_reads`: the inputs each exp's argument reads."""
    operands: set[Sum] = set()
    sums: set[Sum] = set()
    exps: set[frozenset[str]] = set()
    V = tuple[frozenset[str], "frozenset[str] | None"]  # (inputs it reads, those of the sum it carries, or None)

    def step(n: Any, nodes: Sequence[Any], a: list[V]) -> V:
        reads: frozenset[str] = frozenset().union(*(v[0] for v in a))
        product = OPS[n.op].has(Prop.CONTRACTION)
        if product:
            operands.update((v[1], DTYPE_MAX.get(nodes[j].outs[k].dtype, math.inf))
                            for (j, k), v in zip(n.args, a, strict=True) if v[1] is not None)
        carried = next((v[1] for v in a if v[1] is not None), None) if n.op in _SUM_KEEPING else None
        if n.op in _SUMS or product:
            carried = reads
            sums.add((reads, DTYPE_MAX.get(n.outs[0].dtype, math.inf)))
        if n.op in ("exp", "rescaled_sum"):
            exps.add(reads if n.op == "exp" else a[1][0])
        return reads, carried

    _walk_values(g, lambda name: (frozenset({name}), None), step)
    return frozenset(operands), frozenset(sums), frozenset(exps)


#: the rows of a program's twin (:func:`row_twin`)
TWIN_ROWS = 16


def row_twin(source: Graph, candidate: Graph, rows: int = TWIN_ROWS) -> tuple[Graph, Graph] | None:
    """The source and the candidate on ``rows`` of their rows, or None: the row count ``n`` is the leading size of a
    program input of two or more axes that no input has along another axis (the reductions along rows keep their
    length), a multiple of ``rows``; every dimension of size ``n`` (types, kernels' operand shapes) becomes ``rows``,
    every grid size ``n / t`` (tiles of ``t`` rows) ``rows / t``, a constant ``1 / n`` (a mean over rows) ``1 / rows``
    (``(shape|src)=(...)``: kernels' operands, reshapes).
    Built from the programs' texts: a twin that does not parse, or is not proved equal to the source's twin
    (:meth:`SafetyChecker._rows_check`), is no twin."""
    import re

    leading = [int(t.shape[0]) for t in source.inputs if len(t.shape) >= 2]
    inner = {int(d) for t in source.inputs for d in t.shape[1:]} | {int(t.shape[0]) for t in source.inputs
                                                                    if len(t.shape) < 2}
    sizes = sorted({n for n in leading if n not in inner and n > rows and n % rows == 0},
                   key=lambda n: (leading.count(n), n))
    if not sizes:
        return None
    n = sizes[-1]

    def dims(m: Any) -> str:
        return m.group(1) + ", ".join(str(rows) if int(x) == n else x.strip() for x in m.group(2).split(",")
                                      if x.strip()) + m.group(3)

    def grid(m: Any) -> str:
        vs = [int(x) for x in m.group(2).split(",") if x.strip()]
        out = [v * rows // n if v > 1 and n % v == 0 and n // v <= rows and v * rows % n == 0 else v for v in vs]
        return m.group(1) + ", ".join(map(str, out)) + ("," if len(out) == 1 else "") + m.group(3)

    def shrink(text: str) -> str:
        text = re.sub(r"(\b(?:f16|bf16|f32|bool)\[)([0-9, ]*)(\])", lambda m: dims(m).replace(", ", ","), text)
        text = re.sub(r"((?:shape|src)=\()([0-9, ]+?)(,?\))", dims, text)
        text = re.sub(r"(grid=\()([0-9, ]+)(\))", grid, text)
        return text.replace(f"c={1 / n!r}", f"c={1 / rows!r}")

    try:
        twin = type(source).parse(shrink(str(source))), type(candidate).parse(shrink(str(candidate)))
    except Exception:  # (a twin that does not parse is no twin)
        return None
    # (a reduction over the rows, or over a loop or a split along them, is 16 long in the twin: its rounding at n rows
    # is not what the twin shows where a difference takes it, e.g. a one-pass variance over a batch's rows, exact at
    # 16, off at 4,096; a mean of the rows' results taken last, a loss's, is no difference)
    return twin if not any(_shrunk_difference(a, b) for a, b in zip((source, candidate), twin, strict=True)) else None


def _levels(g: Graph) -> list[tuple[Any, Sequence[Any]]]:
    """Every node of ``g`` at every level with its scope, in one order (kernels' and thread graphs' nodes after
    their node)."""
    out: list[tuple[Any, Sequence[Any]]] = []

    def walk(nodes: Sequence[Any]) -> None:
        for n in nodes:
            out.append((n, nodes))
            if n.op in ("custom", "fused"):
                walk(n.attr("block" if n.op == "custom" else "thread").nodes)

    walk(node_list(g))
    return out


def _reduced(n: Any, nodes: Sequence[Any]) -> int | None:
    """How long the reduction node ``n`` is (a reduction op's axis, a product's contraction, a kernel's loop)."""
    if n.op == "custom":
        return int(n.attr("block").frange)
    if n.op == "matmul":
        return int(nodes[n.args[0][0]].outs[n.args[0][1]].shape[-1])
    if OPS[n.op].reduce is not None:
        return int(nodes[n.args[0][0]].outs[n.args[0][1]].shape[int(n.attr("axis"))])
    return None


def _shrunk_difference(g: Graph, twin: Graph) -> bool:
    """Whether a reduction of ``g`` that ``twin`` (``g`` with fewer rows) shortens (its loop's accumulators, where a
    kernel's loop) feeds an ``add`` or a ``sub``."""
    shrunk: set[int] = set()
    pairs = list(zip(_levels(g), _levels(twin), strict=False))
    if len(pairs) != len(_levels(g)) or any(n.op != m.op for (n, _), (m, _) in pairs):
        return True  # (not the same program: no twin)
    for (n, ns), (m, ms) in pairs:
        if _reduced(n, ns) != _reduced(m, ms):
            shrunk |= ({id(x) for x in m.attr("block").nodes if x.op in ("loop_sum", "loop_max", "rescaled_sum")}
                       if m.op == "custom" else {id(m)})
    hit: list[bool] = []

    def step(n: Any, nodes: Sequence[Any], a: list[bool]) -> bool:
        if n.op in ("add", "sub") and any(a):
            hit.append(True)
        return id(n) in shrunk or any(a)

    _walk_values(twin, lambda name: False, step)
    return bool(hit)


class SafetyChecker:
    """Checks candidates against one source program; the source's evaluations are made once.

    ``numeric`` (default: :func:`numeric_check_affordable`): evaluate on the adversarial inputs; otherwise
    only the structural check: where the source subtracts the max before every ``exp``, the candidate must
    too (:func:`max_shifted`), where it exps only sums or differences the candidate must too
    (:func:`exps_of_sums`), and no operand of a product is a sum (or a product) the source does not round to a
    dtype as narrow (:func:`operand_sums`; at every size); and a candidate that takes a cancellation-prone difference
    the source does not (:func:`differences`) is evaluated at the program's size on the near-constant sets
    (:meth:`cancellation_check`, where :func:`near_constant_affordable`).
    """

    def __init__(self, source: Graph, seed: int = 0, numeric: bool | None = None) -> None:
        self.source = source
        self.seed = seed
        self.numeric = numeric_check_affordable(source) if numeric is None else numeric
        self.sets = adversarial_inputs(source, seed) if self.numeric else []
        if self.numeric:
            self.sets += edge_inputs(source, seed)
        #: the index in ``sets`` of each special-values set with an infinity or a NaN in -> its pattern
        #: (:data:`SPECIAL_SETS`; the finite ones are checked as the others)
        self.special: dict[int, str] = {}
        #: the special sets (by index) whose infinity is in a logit (:func:`logit_inputs`)
        self.strict: set[int] = set()
        logits = logit_inputs(source)
        for what, ins, pattern, name in special_inputs(source, seed) if self.numeric else []:
            if pattern not in ("zero-row", "tiny-row"):
                self.special[len(self.sets)] = pattern
                if "inf" in pattern and name in logits:
                    self.strict.add(len(self.sets))
            self.sets.append((what, ins))
        self._src: dict[int, tuple[list[np.ndarray], bool]] = {}
        self._ref: dict[int, list[np.ndarray]] = {}
        self._defined: dict[int, bool] = {}
        self._src_shifted: bool | None = None
        self._src_sums: frozenset[Sum] = frozenset()
        self._src_exps: frozenset[frozenset[str]] = frozenset()
        self._src_diffs = False
        self._src_differences: Counter[Difference] | None = None
        #: whether candidates of a program too large for the whole numeric check that take a difference the source
        #: does not are evaluated on the near-constant sets (:meth:`cancellation_check`)
        self.near_at_size = not self.numeric and near_constant_affordable(source)
        #: the candidates (their differences the source does not take) that :meth:`cancellation_check` could not
        #: evaluate, even on a twin of fewer rows (:func:`row_twin`), and rejected (read by the search's report)
        self.unevaluated: list[str] = []
        #: the checkers of the row twins of the source (:meth:`_rows_check`), by the twin's text
        self._twins: dict[str, SafetyChecker] = {}

    def structural(self, candidate: Graph) -> str | None:
        """Why ``candidate`` fails the structural check: the source max-shifts every exp, it does not; the source
        exps only sums or differences, it does not (:func:`exps_of_sums`); or it rounds a sum to a dtype for a product
        that the source rounds to no dtype as narrow (:func:`operand_sums`)."""
        if self._src_shifted is None:
            self._src_shifted = max_shifted(self.source)
            self._src_diffs = exps_of_sums(self.source)
            operands, sums, self._src_exps = reads_of(self.source)
            self._src_sums = operands | sums
        if self._src_shifted and not max_shifted(candidate):
            return ("floating point: the source subtracts the max before every exp and the candidate does not "
                    "(exp overflows where the source stays finite)")
        if self._src_diffs and not exps_of_sums(candidate):
            return ("floating point: the source applies exp only to sums or differences and the candidate to a "
                    "value it has not shifted (exp(a) / exp(b) overflows where exp(a - b) stays finite)")
        parts = sorted(sorted(r) for r in exp_reads(candidate) - self._src_exps) if self._src_diffs else []
        if parts:
            return (f"floating point: the source applies exp only to sums or differences and the candidate exps a part "
                    f"of one, a value of {', '.join('+'.join(r) for r in parts)} alone (exp(a + b) / exp(c + d) "
                    "overflows where exp(a + b - c - d) stays finite)")
        new = sorted({(tuple(sorted(r)), top) for r, top in operand_sums(candidate)[0]
                      if not any(r == r2 and t2 <= top for r2, t2 in self._src_sums)})
        if new:
            dt = {v: {"f16": "fp16", "f32": "fp32"}.get(k.short, k.short) for k, v in DTYPE_MAX.items()}[new[0][1]]
            return (f"floating point: the candidate sums {', '.join('+'.join(r) for r, _ in new)} into an {dt} "
                    f"operand of a product (rounded to its dtype for tl.dot: inf once the sum passes "
                    f"{new[0][1]:.5g}) and the source rounds no such sum to a dtype as narrow")
        return None

    def source_outputs(self, i: int) -> tuple[list[np.ndarray], bool]:
        """The source's outputs on input set ``i`` and whether any of its intermediate values overflowed
        (cached)."""
        if i not in self._src:
            self._src[i] = evaluate_in_dtype(self.source, self.sets[i][1])
        return self._src[i]

    def reference(self, i: int) -> list[np.ndarray]:
        """The source's outputs on input set ``i`` in float64 (its inputs rounded to their dtypes; cached)."""
        if i not in self._ref:
            from ..ir.reference import evaluate

            ins = self.sets[i][1]
            with np.errstate(all="ignore"):
                self._ref[i] = [np.asarray(o, dtype=np.float64) for o in evaluate(
                    self.source, {str(t.name): round_to(ins[str(t.name)], t.dtype) for t in self.source.inputs})]
        return self._ref[i]

    def check(self, candidate: Graph) -> str | None:
        """None if ``candidate`` is finite wherever the source is, and not materially less accurate than the source
        (:data:`ERROR_RATIO`), on every input set on which no value of the source overflows (where it
        does, the source's finite outputs are not its values: an overflowed softmax denominator gives 0); else why
        not. The structural check runs first; where the program is too large to evaluate on every set (``numeric``
        False), only :meth:`cancellation_check` follows it."""
        why = self.structural(candidate)
        if why is not None:
            return why
        return self.numeric_check(candidate) if self.numeric else self.cancellation_check(candidate)

    def cancellation_check(self, candidate: Graph) -> str | None:
        """Where the program is too large for the whole numeric check: why ``candidate``, which takes a
        cancellation-prone difference the source does not (:func:`differences`: a one-pass variance, a LayerNorm
        fold), fails the near-constant sets (:data:`NEAR_CONSTANT_SET`) evaluated at the program's size, as the whole
        check would on those sets; None if it takes no such difference or passes them. A program too large even for
        those (:func:`near_constant_affordable`) passes with the candidate noted in :attr:`unevaluated`."""
        what = self._new_differences(candidate)
        if not what:
            return None
        if not self.near_at_size:
            return self._rows_check(candidate, what)
        if not self.sets:
            self.sets = adversarial_inputs(self.source, self.seed, near_constant_only=True)
        why = self.numeric_check(candidate)
        return None if why is None else (f"{why} (evaluated at the program's size on the near-constant sets: the "
                                         f"candidate takes differences the source does not, of {what})")

    def _new_differences(self, candidate: Graph) -> str:
        """The cancellation-prone differences (:func:`differences`) ``candidate`` takes that the source does not, named
        for a refusal ('' where none)."""
        if self._src_differences is None:
            self._src_differences = difference_counts(self.source)
        new = sorted((sorted(r), k, m) for (r, k), m in (difference_counts(candidate) - self._src_differences).items())
        return ", ".join(f"{{{', '.join(r)}}} ({'two sums' if k == 2 else 'a sum and a value'}"
                         f"{f'; {m} more than the source' if (frozenset(r), k) in self._src_differences else ''})"
                         for r, k, m in new)

    def before_verification(self, candidate: Graph) -> str | None:
        """The refusal :meth:`check` gives ``candidate`` whatever its verdict, found without evaluating or verifying
        anything: the structural check, and past :func:`near_constant_affordable` a difference the source does not take
        with no twin of fewer rows (:func:`row_twin`); else None (then :meth:`check` decides once it is proved). The
        search refuses such a candidate before verifying it (twenty-first session: at full size each was verified
        first, ~14 CPU-s, then refused)."""
        why = self.structural(candidate)
        if why is not None or self.numeric or self.near_at_size:
            return why
        what = self._new_differences(candidate)
        if what and row_twin(self.source, candidate) is None:
            return self._rows_check(candidate, what)
        return None

    def _rows_check(self, candidate: Graph, what: str) -> str | None:
        """:meth:`cancellation_check` past :func:`near_constant_affordable`: the candidate and the source on
        :data:`TWIN_ROWS` of their rows (:func:`row_twin`), proved equal there, evaluated on the twin source's
        near-constant sets; rejected where no such twin is built or proved (nineteenth session: accepted with a note
        in :attr:`unevaluated`, cross_entropy_prefill's four)."""
        twin = row_twin(self.source, candidate)
        why = "no twin of fewer rows" if twin is None else None
        if twin is not None:
            from ..smt.verify import verify  # (z3: only for candidates flagged past the limit)

            v: Any
            try:
                v = verify(twin[0], twin[1])
            except Exception as e:  # (a twin the verifier cannot take is no twin)
                v = e
            if not getattr(v, "proved", False):
                why = f"its twin of {TWIN_ROWS} rows is not proved equal to the source's ({type(v).__name__})"
        if why is not None:
            self.unevaluated.append(what)
            return (f"floating point: the candidate takes differences the source does not (of {what}), the program is "
                    f"too large to evaluate it on the near-constant sets, and {why}: its accuracy is not shown")
        assert twin is not None
        rows = self._twins.setdefault(str(twin[0]), SafetyChecker(twin[0], self.seed, numeric=False))
        if not rows.sets:
            rows.sets = adversarial_inputs(twin[0], self.seed, near_constant_only=True)
        why = rows.numeric_check(twin[1])
        return None if why is None else (f"{why} (evaluated on {TWIN_ROWS} rows of the program, proved equal to the "
                                         f"source's, on the near-constant sets: the candidate takes differences the "
                                         f"source does not, of {what})")

    def numeric_check(self, candidate: Graph) -> str | None:
        """The numeric part of :meth:`check` alone (every input set; None where ``numeric`` is False)."""
        for i in range(len(self.sets)):
            if not self.source_defined(i) if i in self.special else self.source_outputs(i)[1]:
                continue  # (the source is undefined there, or one of its values overflowed)
            why = self._compare(candidate, i)
            if why is not None:
                return why
        return None

    def source_defined(self, i: int) -> bool:
        """Whether special set ``i`` constrains candidates: no op of the source makes a NaN from operands without one
        there (for a set with a NaN in: on the same inputs with the NaN read as 0) (cached)."""
        if i not in self._defined:
            ins = self.sets[i][1]
            if self.special[i] == "nan-one":
                ins = {k: np.nan_to_num(v, nan=0.0, posinf=np.inf, neginf=-np.inf) for k, v in ins.items()}
            self._defined[i] = not made_nan(self.source, ins)
        return self._defined[i]

    def _compare(self, candidate: Graph, i: int) -> str | None:
        """Why ``candidate`` fails input set ``i`` (the source evaluated there constrains it), or None. On a finite set:
        non-finite where the source is finite, or materially less accurate (:func:`_worse_than_source`); on a special
        set with an infinity or a NaN in (:data:`SPECIAL_SETS`): finite where the source is infinite too, and, for an
        infinity in a logit, NaN where the source is not."""
        what, ins = self.sets[i]
        src, _ = self.source_outputs(i)
        try:
            cand, _ = evaluate_in_dtype(candidate, ins, generated=True)
        except Exception as e:  # (a program the float evaluator cannot run is not safe to call safe)
            return f"floating point: the candidate cannot be evaluated in its dtype: {e}"
        for k, (x, y) in enumerate(zip(src, cand, strict=True)):
            dt = candidate.outputs[k].dtype.short
            if i in self.strict:  # (an infinity in a logit: the source's result, NaN only where it is NaN)
                bad = ~np.isnan(x) & (np.isnan(y) | (np.isinf(x) != np.isinf(y)))
            elif i in self.special:  # (elsewhere: finite where it is finite, infinite where it is infinite)
                bad = (np.isfinite(x) & ~np.isfinite(y)) | (np.isinf(x) & np.isfinite(y))
            else:
                bad = np.isfinite(x) & ~np.isfinite(y)
            if bad.any():
                idx = tuple(int(v) for v in np.argwhere(bad)[0])
                n = f"{int(bad.sum())}/{bad.size}"
                how = (f"differs from the source where the source is defined at {n} values" if i in self.special
                       else f"has {n} non-finite values where the source is finite")
                return (f"floating point: on {what} inputs, evaluated in {dt}, the candidate {how} (output {k}, e.g. "
                        f"index {idx}: source {x[idx]:.4g}, candidate {y[idx]})")
        for k, (r, x, y) in enumerate(zip(self.reference(i), src, cand, strict=True)):
            dtype = candidate.outputs[k].dtype
            why = _worse_than_source(r, x, y, dtype)
            if why is not None:
                return f"floating point: on {what} inputs, evaluated in {dtype.short}, output {k}: {why}"
        return None

    def special_check(self, candidate: Graph, i: int) -> str | None:
        """Why ``candidate`` disagrees with the source on special set ``i`` (an infinity or a NaN in, see
        :data:`SPECIAL_SETS`), or None (also where the source is undefined there: :meth:`source_defined`)."""
        return self._compare(candidate, i) if self.source_defined(i) else None


def _worse_than_source(ref: np.ndarray, src: np.ndarray, cand: np.ndarray, dtype: DType) -> str | None:
    """Why ``cand`` (an output of dtype ``dtype``) is materially less accurate than ``src`` against the float64 ``ref``
    (:data:`ERROR_RATIO`, :data:`ERROR_FLOOR`; errors relative to the largest value of ``ref``, over the elements
    finite in all three), or None."""
    ok = np.isfinite(ref) & np.isfinite(src) & np.isfinite(cand)
    if not ok.any():
        return None
    scale = float(np.abs(np.where(ok, ref, 0.0)).max())
    if not 0.0 < scale < math.inf:
        return None
    with np.errstate(invalid="ignore"):  # (inf - inf where not ok: masked)
        src_err = float(np.abs(np.where(ok, src - ref, 0.0)).max())
        err = np.abs(np.where(ok, cand - ref, 0.0))
    worst = tuple(int(v) for v in np.unravel_index(int(np.argmax(err)), err.shape))
    floor = ERROR_FLOOR.get(dtype, ERROR_FLOOR[DType.float32])
    if err[worst] <= max(ERROR_RATIO * src_err, floor * scale):
        return None
    times = f"{err[worst] / src_err:.3g} times" if src_err > 0 else "above 0, which is"
    return (f"the candidate's error {err[worst]:.3g} is {err[worst] / scale:.2g} of the output's largest value "
            f"{scale:.4g}, {times} the source's ({src_err / scale:.2g} of it; allowed: {ERROR_RATIO:g} times the "
            f"source's, or {floor:.2g} of the largest value in {dtype.short}) (e.g. index {worst}: float64 "
            f"{ref[worst]:.4g}, source {src[worst]:.4g}, candidate {cand[worst]:.4g})")


def fp_safety(source: Graph, candidate: Graph, seed: int = 0) -> str | None:
    """None if ``candidate``, evaluated in its own dtype, is finite wherever ``source`` is, and not materially less
    accurate than it (:data:`ERROR_RATIO`), on the adversarial inputs (:func:`adversarial_inputs`); else
    the reason (see the module docstring)."""
    return SafetyChecker(source, seed).check(candidate)


__all__ = ["ALONE_BASE", "ALONE_SETS", "BELOW_SETS", "DTYPE_MAX", "Difference", "ERROR_FLOOR", "ERROR_RATIO",
           "IDLE_BASE", "INPUT_SETS", "LARGE_VALUE_ELEMENTS", "NEAR_CONSTANT", "NEAR_CONSTANT_DENSITY",
           "NEAR_CONSTANT_FLOPS_LIMIT", "NEAR_CONSTANT_INPUT_ELEMENTS", "NEAR_CONSTANT_ONE_PAIR", "NEAR_CONSTANT_SET",
           "OUTLIER_SET", "RoundingDomain", "SPECIAL_SETS", "SafetyChecker", "TWIN_ROWS", "adversarial_inputs",
           "difference_counts", "differences", "evaluate_in_dtype", "exps_of_sums", "exp_shifts", "exp_reads",
           "fp_safety", "largest_value", "made_nan", "matmul_flops", "near_constant", "near_constant_affordable",
           "numeric_check_affordable", "operand_sums", "reads_of", "row_twin", "round_to", "logit_inputs",
           "special_inputs"]
