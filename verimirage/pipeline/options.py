"""The options of a search, as one frozen, validated value (:class:`SearchOptions`), and why it stopped.

``vm.superoptimize(g, top_k=2)`` and ``vm.superoptimize(g, options=SearchOptions(top_k=2))`` are the
same search: the keywords are the fields of :class:`SearchOptions`, validated once when the value is
made; the search, the search-cache key, the ablation and the report all read that one value.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..rewrite.cost import H100, Calibration, Hardware
from ..rewrite.rules import Rule, Ruleset


class StopReason(enum.StrEnum):
    """Why the verification phase stopped (``SearchReport.stopped``); the value is the report's text."""

    ENOUGH = "enough candidates verified"
    EXHAUSTED = "search space exhausted"
    TIME_BUDGET = "time budget"
    VERIFY_BUDGET = "verification budget"
    ATTEMPT_LIMIT = "verification attempt limit"
    CACHED = "served from the search cache"
    REGIONS = "split into regions"


#: ``SearchOptions.split``: ``"auto"`` (split a program too big for one search, see :mod:`.regions`),
#: ``"never"`` (one search of the whole program, whatever its size), ``"always"`` (regions only)
SPLIT_MODES = ("auto", "never", "always")


def _ints(name: str, v: Any, lo: int) -> tuple[int, ...] | None:
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError(f"SearchOptions.{name}={v!r}; expected a sequence of ints or None")
    out = tuple(v)
    if not out or any(isinstance(x, bool) or not isinstance(x, int) or x < lo for x in out):
        raise ValueError(f"SearchOptions.{name}={v!r}; expected a non-empty sequence of ints >= {lo}")
    return out


@dataclass(frozen=True)
class SearchOptions:
    """Every option of ``superoptimize`` (see its docstring for what each does). Frozen and validated."""

    time_budget_s: float = 60.0
    node_limit: int = 4000
    iter_limit: int = 6
    rulesets: tuple[str | Ruleset, ...] | None = None
    disable_rules: tuple[str, ...] = ()
    extra_rules: tuple[Rule | Ruleset, ...] = ()
    grids: tuple[int, ...] | None = None
    franges: tuple[int, ...] | None = None
    max_splits: int = 32
    top_k: int = 4
    variants: int = 0
    terms_per_class: int = 6
    max_terms: int = 12
    max_verify: int | None = None
    verify_budget_s: float | None = None
    hardware: Hardware = H100
    calibration: Calibration | None = None
    profile: bool = False
    seed: int = 0
    progress: bool | None = None
    verify_timeout_s: float = 10.0
    verifier: Callable[[Any, Any], Any] | None = field(default=None, compare=False)
    cache: bool = True
    recheck_cache: bool = False
    split: str = "auto"
    region_ops: int = 12
    whole_ops: int = 24
    window_ops: int = 0
    tails: bool = True

    def __post_init__(self) -> None:
        def put(name: str, v: Any) -> None:
            object.__setattr__(self, name, v)

        for name in ("time_budget_s", "verify_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"SearchOptions.{name}={v!r}; expected a positive number of seconds")
            put(name, float(v))
        if self.verify_budget_s is not None:
            v = self.verify_budget_s
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"SearchOptions.verify_budget_s={v!r}; expected a number >= 0 or None")
            put("verify_budget_s", float(v))
        for name, lo in (("node_limit", 1), ("iter_limit", 0), ("max_splits", 1), ("top_k", 1), ("variants", 0),
                         ("terms_per_class", 1), ("max_terms", 1), ("seed", -(2**63)), ("region_ops", 1),
                         ("whole_ops", 1), ("window_ops", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"SearchOptions.{name}={v!r}; expected an int >= {lo}")
        if self.max_verify is not None and (isinstance(self.max_verify, bool) or not isinstance(self.max_verify, int)
                                            or self.max_verify < 1):
            raise ValueError(f"SearchOptions.max_verify={self.max_verify!r}; expected an int >= 1 or None")
        for name in ("profile", "cache", "recheck_cache", "tails"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"SearchOptions.{name}={getattr(self, name)!r}; expected True or False")
        if self.split not in SPLIT_MODES:
            raise ValueError(f"SearchOptions.split={self.split!r}; expected one of {list(SPLIT_MODES)}")
        if self.progress is not None and not isinstance(self.progress, bool):
            raise TypeError(f"SearchOptions.progress={self.progress!r}; expected True, False or None")
        if not isinstance(self.hardware, Hardware):
            raise TypeError(f"SearchOptions.hardware={self.hardware!r}; expected a Hardware")
        if self.calibration is not None and not isinstance(self.calibration, Calibration):
            raise TypeError(f"SearchOptions.calibration={self.calibration!r}; expected a Calibration or None")
        if self.verifier is not None and not callable(self.verifier):
            raise TypeError(f"SearchOptions.verifier={self.verifier!r}; expected a callable or None")
        for name in ("rulesets", "disable_rules", "extra_rules"):
            v = getattr(self, name)
            if v is None and name == "rulesets":
                continue
            if isinstance(v, (str, bytes, Rule, Ruleset)) or not isinstance(v, Sequence):
                raise TypeError(f"SearchOptions.{name}={v!r}; expected a sequence (list or tuple)")
            put(name, tuple(v))
        if any(not isinstance(r, (str, Ruleset)) for r in self.rulesets or ()):
            raise TypeError(f"SearchOptions.rulesets={self.rulesets!r}; expected theory names or Ruleset objects")
        if any(not isinstance(r, str) for r in self.disable_rules):
            raise TypeError(f"SearchOptions.disable_rules={self.disable_rules!r}; expected rule or theory names")
        if any(not isinstance(r, (Rule, Ruleset)) for r in self.extra_rules):
            raise TypeError(f"SearchOptions.extra_rules={self.extra_rules!r}; expected Rule or Ruleset objects")
        put("grids", _ints("grids", self.grids, 1))
        put("franges", _ints("franges", self.franges, 1))

    @classmethod
    def make(cls, options: SearchOptions | None = None, overrides: Mapping[str, Any] | None = None) -> SearchOptions:
        """``options`` (default: all defaults) with the keyword ``overrides`` applied; a keyword that is not an
        option is a TypeError naming the options."""
        if options is not None and not isinstance(options, SearchOptions):
            raise TypeError(f"superoptimize: options={options!r}; expected a SearchOptions")
        base = options if options is not None else cls()
        over = dict(overrides or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(over) - names)
        if unknown:
            raise TypeError(f"superoptimize: unknown option(s) {unknown}; the options are {sorted(names)}")
        return dataclasses.replace(base, **over) if over else base

    @property
    def attempts(self) -> int:
        """Candidates to try verifying at most (``max_verify``, default ``3 * top_k + 3``)."""
        return self.max_verify if self.max_verify is not None else 3 * self.top_k + 3

    @property
    def verify_budget(self) -> float:
        """Estimated verification seconds after the first verified candidate (default half the time budget)."""
        return self.verify_budget_s if self.verify_budget_s is not None else 0.5 * self.time_budget_s

    @property
    def cacheable(self) -> bool:
        """Whether a search under these options may use the search cache (not with a custom verifier or
        user rules, whose results the cache cannot re-check)."""
        return self.cache and self.verifier is None and not self.extra_rules

    def cache_fields(self, device: str | None) -> dict[str, Any]:
        """What the search-cache key records of these options (every option that changes the result;
        ``progress``, ``cache`` and ``recheck_cache`` do not). ``device``: the GPU a profiled order belongs to."""
        return {
            "time_budget_s": self.time_budget_s, "node_limit": self.node_limit, "iter_limit": self.iter_limit,
            "rulesets": None if self.rulesets is None else [r if isinstance(r, str) else r.name for r in self.rulesets],
            "disable_rules": sorted(self.disable_rules), "grids": None if self.grids is None else list(self.grids),
            "franges": None if self.franges is None else list(self.franges), "max_splits": self.max_splits,
            "top_k": self.top_k, "variants": self.variants,
            "terms_per_class": self.terms_per_class, "max_terms": self.max_terms, "max_verify": self.max_verify,
            "verify_budget_s": self.verify_budget_s, "hardware": repr(self.hardware),
            "calibration": repr(self.calibration), "profile": self.profile, "seed": self.seed,
            "verify_timeout_s": self.verify_timeout_s,
            "device": device if self.profile else None,
            "split": self.split, "region_ops": self.region_ops, "whole_ops": self.whole_ops,
            **({"window_ops": self.window_ops} if self.window_ops else {}),  # (keys of searches without it unchanged)
            **({"tails": False} if not self.tails else {}),
        }

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        d = SearchOptions()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(d, f.name)
                or (f.name == "verifier" and self.verifier is not None)}

    def __str__(self) -> str:
        ch = self.changed()
        if not ch:
            return "defaults"
        def show(v: Any) -> str:
            if isinstance(v, tuple):
                return "[" + ", ".join(x if isinstance(x, str) else getattr(x, "name", repr(x)) for x in v) + "]"
            return getattr(v, "__name__", None) or repr(v) if callable(v) else repr(v)
        return ", ".join(f"{k}={show(v)}" for k, v in ch.items())


__all__ = ["SearchOptions", "StopReason"]
