"""Resource caps of the abstract check: deep programs, big terms, big constants.

The abstract-expression check walks values lazily (a chain of ``n`` ops is a
chain of ``n`` nested element look-ups) and normalises nested terms
recursively. It runs in a thread with a :data:`STACK_BYTES` stack and the
recursion limit at :data:`MAX_DEPTH` (:func:`verimirage.smt.deep.deep_call`;
the certificate checker's process makes one such thread for its whole check),
so programs of a few thousand nodes (a 2000-op chain, a for-loop of 4096
iterations) derive instead of failing with ``RecursionError``; past
:data:`MAX_DEPTH` frames the error is still a ``RecursionError`` that the
caller turns into ``Unknown``.

The other caps (:data:`MAX_PRODUCT_TERMS`, :data:`MAX_CONST_BITS`,
:data:`MAX_DERIVED_NODES`, :data:`MAX_QUERY_TERMS`, :data:`MAX_POWER`, :data:`Z3_MEMORY_MB`) turn a
blow-up while terms are built into :class:`verimirage.smt.expr.ResourceLimit`
(an :class:`~verimirage.smt.expr.AbstractionError`, so the verdict is
``Unknown`` with the reason) instead of an exhausted memory.
"""

from __future__ import annotations

#: the recursion limit of a deep-stack thread (Python frames)
MAX_DEPTH = 60_000
#: the stack of a deep-stack thread (bytes; only what is touched is committed)
STACK_BYTES = 1 << 29
#: a product of polynomials with more term pairs than this is not expanded
MAX_PRODUCT_TERMS = 200_000
#: one abstract check's terms, all cases together, have at most this many tree nodes (:func:`.expr.size`)
MAX_DERIVED_NODES = 1 << 24
#: a coefficient (numerator or denominator) longer than this many bits is not kept
MAX_CONST_BITS = 4096
#: a Z3 query over more monomial factors than this is not built
MAX_QUERY_TERMS = 400_000
#: an atom power above this is not multiplied out in a Z3 term (each such power is its own variable)
MAX_POWER = 64
#: Z3's memory cap (MB), set for the process when the Z3 encoding (:mod:`.z3enc`) is imported
Z3_MEMORY_MB = 4096
