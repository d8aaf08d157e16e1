"""Finite-field semantics of every registry op (domain ``"ff"``) and the randomized equivalence test.

Values
------
A tensor's finite-field value (:class:`FV`) has two *parts*: residues mod ``p``
and residues mod ``q``, where ``q`` is a prime dividing ``p - 1`` (we use safe
primes ``p = 2q + 1``, ``2**20 <= p < 2**21``). The pair is the fingerprint of
a real value under the ring maps to Z_p and Z_q. A q-residue of ``-1`` marks a
q-part that has no meaning (see exp); a value whose q-part is ``None`` has no
meaningful q-part anywhere (what ``exp`` returns).

Each part is computed **on demand** (:class:`Part`, a memoised thunk over the
parts it reads). The test asks only for the p-parts of the outputs, so a part
that cannot reach an output's p-part is never computed: the p-part of ``Q K^T``
in attention (exp reads only the q-part), the q-part of ``V`` (it never reaches
an exp), every q-part of a program without exp. Which part an op reads is part
of its meaning below ("reads"); nothing else decides what is computed, so a
part a result depends on is always computed (tests/test_verify.py checks
programs where q-parts do reach an exp through every kind of op).

Op meanings
-----------
* ``add, sub, mul, neg, square, scale, shift, matmul, sum, mean``: ring
  operations in both parts (each part reads the same part of the operands);
  constants ``c`` are exact rationals
  (:func:`verimirage.smt.consts.const_fraction`) mapped into Z_p and Z_q.
* ``div``: multiplication by the modular inverse; **division by zero is defined
  as multiplication by 0** (the inverse of 0 is taken to be 0), in each part.
* ``exp(x) = g ** (x mod q) mod p`` with ``g`` of order ``q`` in Z_p*, so
  ``exp(a + b) = exp(a) * exp(b)`` holds exactly (a table of ``g**k`` for k in
  [0, q), built once per field and cached). Its p-part reads the q-part of
  ``x``; the result has no meaningful q-part. If ``exp`` is applied to a value
  whose q-part has no meaning (e.g. ``exp(exp(x))``), the field records a
  *q-violation* and the test can only answer Unknown.
* ``gelu, relu, sqrt``: per-trial random functions (a keyed 64-bit mix)
  of the p-residue of the argument, giving both parts of the result (both read
  the p-part). ``rsqrt(x)`` is the inverse of ``sqrt(x)`` (so ``rsqrt =
  1/sqrt`` exactly). ``rms_norm(x) = x * rsqrt(mean(x*x) + eps)`` with that
  ``rsqrt`` (times the weight).
* ``sigmoid(x) = 1 / (1 + exp(-x))`` exactly in the p-part (through exp,
  which reads the argument's q-part; ``1 + exp(-x)`` is never 0); the q-part
  is a random function of the argument, so an exp may read the result: it
  stands for an uninterpreted function, and the real sigmoid is both at once.
  Where the argument has no q-part (silu after attention) both parts are that
  random function, as for an opaque op. ``tanh(x) = 2 sigmoid(2x) - 1`` and
  ``silu(x) = x sigmoid(x)`` are defined through it, in both parts (so
  soft-capped logits ``exp(c tanh(s / c))`` are tested, and equal their
  sigmoid form).
* ``log``: the p-part is a per-trial random function of the argument's
  p-residue (like tanh); the q-part is the *discrete log* of that residue:
  ``k`` for ``+-g**k``, meaningless (-1) for 0. It is the homomorphism
  (Z_p*, *) -> (Z_q, +) inverse to exp, so ``log(exp(u) * y) = u + log(y)``
  holds exactly on q-parts. Programs equal only through log's laws (the
  max-shifted logsumexp and the plain one) differ in their p-parts and are
  compared on their q-parts instead (:func:`ff_test_q`: ``P.q = Q.q`` is
  ``exp(P) = exp(Q)``, and exp is injective on the reals). The discrete log
  forgets the sign (-1 has discrete log 0): ``log(-y) = log(y)`` and
  ``exp(log y) = +-y`` in this model, neither a law of the reals. So a
  program in which an exp reads a log's value is not tested (unknown,
  :func:`verimirage.smt.ffref.exp_after_log`) unless the log's argument is
  an exp's value (or a product, quotient or square of such: a square in the
  field, where ``exp(log y) = y`` exactly), and a candidate that takes log
  of a value the target does not is rejected by the abstract check's
  definedness (:mod:`verimirage.smt.defined`). No probability is stated for
  the q-world comparison (the discrete log has no polynomial degree): it is
  evidence, and the abstract check proves such pairs by its ``log-exp`` law.
* ``max``, ``maximum``: a genuine total order on values: lexicographic on
  (p-residue, q-part), a meaningless q-part counting as the smallest. It is
  associative, commutative and idempotent, so a tiled max equals the flat max,
  and programs that subtract *some* max before ``exp`` (stable softmax, online
  softmax) test equal to the unshifted ones, as they are in real arithmetic.
  The p-part of the result is the max of the p-parts (reads p only); its
  q-part reads both parts.
* ``concat``, ``transpose``: data movement (each part separately).

The test compares the p-parts of the outputs, by default through a random
bilinear projection ``sum(O * U * r) mod p`` per output (:func:`observe`,
:mod:`verimirage.smt.ff.proj`: the projection is pushed back through the ops
linear in one operand, so e.g. attention's ``P V`` is never formed), which
adds ``2 / p`` to the per-trial bound. The stated bound (which divides
by the smaller prime q) bounds the p-part polynomial identity test alone, so
it holds whatever q-parts are computed. Inputs get independent uniform residues
per (trial, input, part) from separate streams, so every part of every input
has the same value whichever parts are computed and in which order.

Matmuls are exact: residues in [0, p) are multiplied with float64 BLAS in
chunks of at most 2048 along the contraction dim, so every partial sum is an
integer below 2**53. Grid axes that only one operand varies along (a block's
replicated tile) are folded into the rows or columns of one product.

Speed
-----
For a search, :class:`FFReference` evaluates the *target* once per trial (seed)
and keeps its outputs, so each candidate costs one program evaluation per
trial; exp tables are cached per field. Trial inputs are kept too: always when
small, else within the sharing budget when every trial's fit in half of it. The
target's big products (exp fused or not) are kept too, and a candidate product
whose operand rows and columns are, element for element, rows and columns of a
kept one is taken from it instead of recomputed (:mod:`verimirage.smt.ff.share`). In a
process that has started CUDA, big products (exp fused or not) run on the GPU
and come back into host arrays (:mod:`verimirage.smt.ff.gpu`). See
``verimirage/smt/PERF.md``.

Layout
------
This package is the *fast* engine: an accelerator for the search and the verifier, not part of what a
``Proved`` certificate rests on. The certificate checker (:mod:`verimirage.smt.certificate`) evaluates
with the reference evaluator :mod:`verimirage.smt.ffref` instead, which implements the same meanings
plainly; tests/test_ffref.py holds the two equal value for value (random programs, the mutation corpus,
every suite pair).

* :mod:`.field` -- field parameters: safe primes, the field of a seed, rational constants, exp tables;
* :mod:`.values` -- lazy values (:class:`FV` of two :class:`Part` thunks);
* :mod:`.arith` -- helpers on residue arrays (fast mod, inverses, marks, the oracles' keyed mix);
* :mod:`.meanings` -- the ``"ff"`` meaning of every registry op (registered on import), :class:`FFDomain`;
* :mod:`.products` -- the exact product engine (BLAS chunks, folded batch axes, fused exp epilogues),
  with :mod:`.share` (products shared between the programs of a trial) and :mod:`.gpu` (products on a GPU);
* :mod:`.proj` -- random bilinear projections pushed back through linear ops;
* :mod:`.degree` -- degree bounds and the stated false-accept bound;
* :mod:`.trials` -- the trial driver: inputs, :class:`FFReference`, :func:`ff_test`, threads.
"""

from .degree import (
    MAX_ACCEPTABLE_BOUND,
    ORDER_ORACLE_OPS,
    DegreeInfo,
    degree_bound,
    degree_info,
    projection_bound,
    stated_bound,
    trials_needed,
    uses_exp,
)
from .field import P_MAX, Field, current_field, safe_primes
from .meanings import FFDomain, opaque, opaque_key
from .products import exp_epilogue
from .trials import (
    INPUT_CACHE_BYTES,
    PARALLEL_BYTES,
    THREADS_ENV,
    FFReference,
    FFResult,
    applies_log,
    collect_here,
    default_seeds,
    ff_domain_ops,
    ff_test,
    ff_test_p_or_q,
    ff_test_q,
    ff_workers,
    held_bytes,
    input_values,
    observe,
    projection_factors,
    refutation_inputs,
    run_ff,
    trial_inputs,
)
from .values import FV, Part, as_kind, fv_of, ints, stacked

__all__ = [
    "FV", "INPUT_CACHE_BYTES", "MAX_ACCEPTABLE_BOUND", "ORDER_ORACLE_OPS", "PARALLEL_BYTES", "P_MAX", "THREADS_ENV",
    "DegreeInfo", "FFDomain", "FFReference", "FFResult", "Field", "Part", "applies_log", "as_kind", "collect_here",
    "current_field", "default_seeds", "degree_bound", "degree_info", "exp_epilogue", "ff_domain_ops", "ff_test",
    "ff_test_p_or_q", "ff_test_q", "ff_workers", "fv_of", "held_bytes", "input_values", "ints", "observe",
    "opaque", "opaque_key", "projection_bound", "projection_factors", "refutation_inputs", "run_ff", "safe_primes",
    "stacked", "stated_bound", "trial_inputs",
    "trials_needed", "uses_exp",
]
