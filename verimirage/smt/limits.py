"""Resource caps of the abstract check: deep programs, big terms, big constants.

The abstract-expression check walks values lazily (a chain of ``n`` ops is a
chain of ``n`` nested element look-ups) and normalises nested terms
recursively. :func:`deep_call` runs such work in a thread with a large stack
and a recursion limit to match, so programs of a few thousand nodes (a
2000-op chain, a for-loop of 4096 iterations) derive instead of failing with
``RecursionError``; past :data:`MAX_DEPTH` frames the error is still a
``RecursionError`` that the caller turns into ``Unknown``.

The other caps (:data:`MAX_PRODUCT_TERMS`, :data:`MAX_CONST_BITS`,
:data:`MAX_QUERY_TERMS`, :data:`MAX_POWER`, :data:`Z3_MEMORY_MB`) turn a
blow-up while terms are built into :class:`verimirage.smt.expr.ResourceLimit`
(an :class:`~verimirage.smt.expr.AbstractionError`, so the verdict is
``Unknown`` with the reason) instead of an exhausted memory.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

#: the recursion limit while :func:`deep_call` runs (Python frames)
MAX_DEPTH = 60_000
#: the stack of the thread :func:`deep_call` starts (bytes; only what is touched is committed)
STACK_BYTES = 1 << 29
#: a product of polynomials with more term pairs than this is not expanded
MAX_PRODUCT_TERMS = 200_000
#: a coefficient (numerator or denominator) longer than this many bits is not kept
MAX_CONST_BITS = 4096
#: a Z3 query over more monomial factors than this is not built
MAX_QUERY_TERMS = 400_000
#: an atom power above this is not multiplied out in a Z3 term (each such power is its own variable)
MAX_POWER = 64
#: Z3's memory cap (MB), set for the process when the Z3 encoding (:mod:`.z3enc`) is imported
Z3_MEMORY_MB = 4096

_STACK_LOCK = threading.Lock()
_DEPTH_LOCK = threading.Lock()
_deep_running = 0
_saved_limit = 0


def deep_call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a fresh thread with a :data:`STACK_BYTES` stack and the recursion
    limit raised to :data:`MAX_DEPTH` while it runs; its result or exception is passed on."""
    global _deep_running, _saved_limit
    box: dict[str, Any] = {}
    ctx = contextvars.copy_context()

    def target() -> None:
        try:
            box["result"] = ctx.run(fn, *args, **kwargs)
        except BaseException as e:  # passed on to the caller below
            box["error"] = e

    with _DEPTH_LOCK:
        if _deep_running == 0:
            _saved_limit = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved_limit, MAX_DEPTH))
        _deep_running += 1
    try:
        started = False
        with _STACK_LOCK:
            old = threading.stack_size()
            try:
                threading.stack_size(STACK_BYTES)
                t = threading.Thread(target=target, name="vm-deep", daemon=True)
                t.start()
                started = True
            except (RuntimeError, ValueError, MemoryError) as e:  # no such stack here: run in this thread
                log.warning("deep_call: no %d-byte thread stack (%s); running on the current stack", STACK_BYTES, e)
            finally:
                threading.stack_size(old)
        if started:
            t.join()
        else:
            target()
    finally:
        with _DEPTH_LOCK:
            _deep_running -= 1
            if _deep_running == 0:
                sys.setrecursionlimit(_saved_limit)
    if "error" in box:
        raise box["error"]
    return box["result"]
