"""The benchmark suite (API.md): ``names()``, ``get(name, batch=1, small=False)``, expert designs."""

from .designs import DESIGNS, expert, small_design_kw
from .suite import SUITE, Entry, entry, get, names

__all__ = ["DESIGNS", "SUITE", "Entry", "entry", "expert", "get", "names", "small_design_kw"]
