"""The benchmark suite (API.md): ``names()``, ``get(name, batch=1, small=False)``, expert designs."""

from .designs import DESIGNS, expert, small_design_kw
from .models import MODELS, Model, get_model, model_names
from .suite import SUITE, Entry, entry, get, names

__all__ = ["DESIGNS", "MODELS", "SUITE", "Entry", "Model", "entry", "expert", "get", "get_model", "model_names",
           "names", "small_design_kw"]
