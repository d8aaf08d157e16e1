"""Verification: verdicts, the finite-field domain, abstract expressions and Z3 queries, certificates.

Imports neither torch nor triton. Importing this package registers the
``ff`` and ``abstract`` meanings of every registry op.
"""

from . import abstract as abstract
from . import ff as ff
from . import prune as prune
from .verdict import Check, Proved, Refuted, Unknown, Verdict

__all__ = ["Check", "Proved", "Refuted", "Unknown", "Verdict", "abstract", "ff", "prune"]
