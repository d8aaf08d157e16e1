"""Verification: verdicts, the finite-field domain, abstract expressions and Z3 queries, certificates.

Imports neither torch nor triton. Importing this package registers the
``abstract`` meaning of every registry op; the fast finite-field engine
(:mod:`.ff`, which registers the ``ff`` meanings) and :mod:`.prune` load on
first use of ``verimirage.smt.ff`` / ``verimirage.smt.prune`` (or when
:mod:`.verify` is imported), so the certificate checker can run without them.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import abstract as abstract
from . import reading  # noqa: F401  (puts the readers' conveniences on Verdict and Check)
from .verdict import Check, Outcome, Proved, Refuted, Unknown, Verdict

__all__ = ["Check", "Outcome", "Proved", "Refuted", "Unknown", "Verdict", "abstract", "ff", "prune"]


def __getattr__(name: str) -> Any:
    if name in ("ff", "prune"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
