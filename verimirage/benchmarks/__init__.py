"""The benchmark suite (API.md): ``names()``, ``get(name, batch=1, small=False)``, expert designs; the models
section (``get_model``) and the decoder layer (``get_layer``)."""

from .designs import DESIGNS, expert, small_design_kw
from .layer import get_layer, layer_cases
from .models import MODELS, Model, get_model, model_names
from .suite import SUITE, Entry, entry, get, names

__all__ = ["DESIGNS", "MODELS", "SUITE", "Entry", "Model", "entry", "expert", "get", "get_layer", "get_model",
           "layer_cases", "model_names", "names", "small_design_kw"]
