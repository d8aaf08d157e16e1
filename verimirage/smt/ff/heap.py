"""Big arrays of the finite-field trials from the heap, where a freed value's memory is reused (no fresh pages).

glibc serves an allocation above its mmap threshold (at most 32 MiB) with fresh pages from ``mmap`` and unmaps them
when it is freed, so every full-size value of a trial (622 MB each for 512 x 151,936 logits) is faulted in again,
page by page; on the shared CPU box that costs 0.1-0.5 s of system time per such array, far more than the arithmetic
on it (~0.02 s), and it was two thirds of the CPU time of the largest held-out programs. While the trials run,
:func:`heap_arrays` has glibc serve big blocks from the heap instead (``M_MMAP_MAX`` 0, the heap trimmed only above
2 GiB free at its top), so a freed value's memory is the next value's. When the last such block ends, the thresholds
are set to what glibc's dynamic thresholds reach in a process that frees big arrays (mmap above 32 MiB, trim above
64 MiB) and the free heap is given back to the system (``malloc_trim``): the peak is unchanged, nothing is held after.

Threads allocate from their own arenas, which map big blocks whatever the setting, so this helps the trials run in
the calling thread (:func:`verimirage.smt.ff.trials.ff_workers` runs big ones there). Not glibc (or
``$VERIMIRAGE_FF_HEAP=0``): nothing is changed. Values are the same either way: only where memory comes from changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import threading
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

#: environment variable: "0" leaves glibc's allocation thresholds alone during the trials
HEAP_ENV = "VERIMIRAGE_FF_HEAP"

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
_DEFAULT_MMAP_MAX = 65536
_MMAP_THRESHOLD = 32 << 20  # glibc's largest (dynamic) mmap threshold on 64-bit
_TRIM_HELD = (1 << 31) - 1  # (mallopt takes an int)
_TRIM_AFTER = 64 << 20  # twice the mmap threshold, as glibc's dynamic threshold sets it

_lock = threading.Lock()
_depth = 0


@lru_cache(maxsize=1)
def _libc() -> Any | None:
    """glibc's ``mallopt`` and ``malloc_trim`` (None elsewhere)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):  # pragma: no cover (an unusual libc)
        return None


def enabled() -> bool:
    """Whether :func:`heap_arrays` changes anything here (glibc, and ``$VERIMIRAGE_FF_HEAP`` is not "0")."""
    return os.environ.get(HEAP_ENV, "1") != "0" and _libc() is not None


@contextlib.contextmanager
def heap_arrays() -> Iterator[None]:
    """Serve big blocks from the heap while the block runs (nested or concurrent uses share one setting: the
    first sets it, the last one out sets the lasting thresholds and trims the heap)."""
    global _depth
    libc = _libc() if enabled() else None
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
            libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_HELD)
            libc.mallopt(_M_MMAP_MAX, 0)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_AFTER)
                libc.malloc_trim(0)
