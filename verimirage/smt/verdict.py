"""Three-valued verdicts: :class:`Proved`, :class:`Refuted`, :class:`Unknown`, and their :class:`Outcome`.

A verdict is an immutable value carrying its evidence: which checks ran, with
what parameters, how long they took, and (for a proof) the stated bound on the
probability that the finite-field test accepted a wrong pair. A timeout, a
node limit or an unsupported construct is :class:`Unknown`, never
:class:`Proved`. Nothing in verimirage returns a bare bool for equivalence.

One vocabulary: every check of ``verimirage.smt`` (the abstract check, the fast
finite-field test, the reference evaluator's trials, the certificate checker's
steps, a search-cache re-check) reports an :class:`Outcome`, and a verdict's
:attr:`Verdict.outcome` is the same three values. (Z3's own answers, ``unsat`` /
``sat`` / ``unknown``, are the solver's and stay its strings.)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .reading import CheckMethods, VerdictMethods
else:  # (the readers' conveniences: :mod:`.reading` puts them on these classes when verimirage.smt is imported; the
    # certificate checker's process never does, a Proved depends on none of them)
    CheckMethods = VerdictMethods = object


class Outcome(enum.StrEnum):
    """What a check, or a verdict, found: the pair is equal (``PROVED``; for a randomized test, equal on every
    trial), differs (``REFUTED``, with a witness), or neither could be shown (``UNKNOWN``, with the reason).
    A str enum: ``Outcome.PROVED == "proved"`` and it is written to JSON as ``"proved"``."""

    PROVED = "proved"
    REFUTED = "refuted"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Check(CheckMethods):
    """The record of one check: its name, its outcome, parameters, seconds taken, details."""

    name: str
    outcome: Outcome
    params: tuple[tuple[str, Any], ...] = ()
    seconds: float = 0.0
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # (ValueError for any other word)


@dataclass(frozen=True)
class Verdict(VerdictMethods):
    """Base class of verdicts. ``reason`` says why; ``evidence`` lists the checks that ran."""

    reason: str
    evidence: tuple[Check, ...] = field(default=())
    #: the verdict as an :class:`Outcome` (each kind of verdict states its own)
    outcome: ClassVar[Outcome] = Outcome.UNKNOWN

    @property
    def proved(self) -> bool:
        """True only for :class:`Proved`."""
        return self.outcome is Outcome.PROVED


@dataclass(frozen=True)
class Proved(Verdict):
    """Both checks proved the two programs equal."""

    outcome = Outcome.PROVED


@dataclass(frozen=True)
class Refuted(Verdict):
    """The programs differ. ``counterexample`` holds the inputs (and, when they differ, float64 outputs)."""

    outcome = Outcome.REFUTED
    counterexample: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Unknown(Verdict):
    """Neither proved nor refuted (timeout, unsupported construct, abstraction too weak, ...)."""


__all__ = ["Check", "Outcome", "Proved", "Refuted", "Unknown", "Verdict"]
