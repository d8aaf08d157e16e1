"""Deep-stack calls for in-process work (not on the trusted path: it passes a result or an exception on, it makes none).

The abstract-expression check recurses per op (:mod:`.limits`). :func:`deep_call` runs it in a thread with a
:data:`~.limits.STACK_BYTES` stack and the recursion limit raised to :data:`~.limits.MAX_DEPTH` while any such call
runs (calls may overlap: the verifier's threads, an in-process certificate check). The certificate checker's process
does not use it: it makes one such thread for its whole check (:func:`verimirage.smt.certificate._child_main`).
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .limits import MAX_DEPTH, STACK_BYTES

T = TypeVar("T")
log = logging.getLogger(__name__)

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
