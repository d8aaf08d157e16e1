"""Triton backend: code generation, runtime, GPU selection and PyTorch integration.

Importing this package registers the ``"triton"`` domain of the op registry
(pure Python); torch and triton are imported only by the runtime modules.
"""

from __future__ import annotations

from . import lowering as lowering  # registers the "triton" domain
