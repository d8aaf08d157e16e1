"""A time budget for the abstract derivation (outside the trusted path: it can only stop a check).

The abstract check's derivation (:mod:`verimirage.smt.abstract`, :mod:`verimirage.smt.expr`) is pure
Python in one thread; only Z3's queries had a time limit, so a program whose terms grow slowly (a composed
full-size decoder layer) held its caller for many minutes. Importing this module installs
:func:`checkpoint` as :data:`verimirage.smt.expr.checkpoint`; :func:`set_budget` gives the derivation
running in the current context a deadline in CPU seconds of its thread (and a cancel event). Past the deadline,
or once the event is set, :func:`checkpoint` raises :class:`DerivationStopped`, which the abstract check turns
into ``Unknown`` with the reason. The certificate checker never imports it: its derivations have no budget but its
process's own time cap.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from . import expr as E

#: the derivation of one check stops after this many times its query time limit ...
DERIVE_TIME_FACTOR = 2.0
#: ... but never before this many seconds (derivations of seconds must not depend on machine load)
DERIVE_MIN_S = 120.0

#: (deadline, the thread it is of, cancel event) of the derivation running in this context, if it has a budget: the
#: deadline is on the CPU clock of the thread that set it (``time.thread_time``; twenty-first session: on the wall
#: clock a niced full-size check at load 12 had ~30 CPU-s of its 120 s and was Unknown), in another thread that the
#: context was copied to on the wall clock (``time.monotonic``, the seconds left when it was set)
_BUDGET: contextvars.ContextVar[tuple[float, int, float, threading.Event | None] | None] = contextvars.ContextVar(
    "vm_derive_budget", default=None)
_ticks = 0


class DerivationStopped(Exception):
    """The derivation ran past its time budget or was cancelled (:func:`checkpoint`)."""


def derive_budget_s(timeout_s: float) -> float:
    """The time budget of an abstract derivation whose Z3 queries get ``timeout_s``."""
    return max(DERIVE_MIN_S, DERIVE_TIME_FACTOR * timeout_s)


def set_budget(seconds: float, cancel: threading.Event | None = None) -> contextvars.Token[Any]:
    """Give the derivation in this context ``seconds`` of this thread's CPU from now (and stop it once ``cancel`` is
    set); undo with :func:`reset_budget`."""
    return _BUDGET.set((time.thread_time() + seconds, threading.get_ident(), time.monotonic() + seconds, cancel))


def reset_budget(token: contextvars.Token[Any]) -> None:
    """Undo :func:`set_budget`."""
    _BUDGET.reset(token)


def checkpoint() -> None:
    """Every 1024th call, look at this context's budget: raise :class:`DerivationStopped` past its deadline
    or once its cancel event is set. Without a budget it only counts."""
    global _ticks
    _ticks += 1
    if _ticks & 1023:
        return
    b = _BUDGET.get()
    if b is None:
        return
    deadline, owner, wall_deadline, cancel = b
    if cancel is not None and cancel.is_set():
        raise DerivationStopped("cancelled")
    if (time.thread_time() > deadline if threading.get_ident() == owner else time.monotonic() > wall_deadline):
        raise DerivationStopped("the abstract derivation ran past its time budget")


E.checkpoint = checkpoint
