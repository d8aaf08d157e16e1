"""Generated kernels as ``torch.library`` custom operators.

:func:`register` defines ``<namespace>::<name>`` with the graph's inputs as
tensor arguments, registers the compiled program as its CPU (interpreter) and
CUDA implementation and a fake (meta) implementation that only allocates the
output shapes, so ``torch.compile`` traces through code calling it and
``torch.library.opcheck`` passes.
"""

from __future__ import annotations

import keyword
from typing import Any

from ..ir.errors import GraphError
from .runtime import CompiledProgram
from .runtime import compile as vm_compile

_LIBS: dict[str, Any] = {}
_REGISTERED: dict[str, tuple[str, Any]] = {}


def register(program: Any, name: str, *, namespace: str = "verimirage") -> Any:
    """Register ``program`` (Candidate, MuGraph, Graph or CompiledProgram) as ``torch.ops.<namespace>.<name>``.

    Returns the op (an ``OpOverloadPacket``). Registering the same program under
    the same name again returns the existing op; another program under a taken
    name is an error.
    """
    import torch

    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"register: op name {name!r}; expected a Python identifier")
    fn = program if isinstance(program, CompiledProgram) else vm_compile(program)
    qual = f"{namespace}::{name}"
    text = str(fn.mugraph)
    if qual in _REGISTERED:
        if _REGISTERED[qual][0] == text:
            return getattr(getattr(torch.ops, namespace), name)
        raise ValueError(f"register: {qual} is already registered for another program")
    for n in fn.input_names:
        if keyword.iskeyword(n):
            raise GraphError(f"register: input name {n!r} is a Python keyword; rename the input")
    args = ", ".join(f"Tensor {n}" for n in fn.input_names)
    outs = fn.output_types
    ret = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    lib = _LIBS.get(namespace)
    if lib is None:
        lib = _LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
    lib.define(f"{name}({args}) -> {ret}")

    def impl(*xs: Any) -> Any:
        res = fn(*xs)
        res_t = res if isinstance(res, tuple) else (res,)
        # outputs must not alias inputs (an output that is an input is passed through by forward)
        ids = {id(x) for x in xs}
        res_t = tuple(r.clone() if id(r) in ids else r for r in res_t)
        return res_t[0] if len(res_t) == 1 else res_t

    def fake(*xs: Any) -> Any:
        res = tuple(
            xs[0].new_empty(t.shape, dtype=getattr(torch, t.dtype.torch_name)) for t in outs
        )
        return res[0] if len(res) == 1 else res

    lib.impl(name, impl, "CPU")
    lib.impl(name, impl, "CUDA")
    torch.library.register_fake(qual, fake, lib=lib)
    _REGISTERED[qual] = (text, fn)
    return getattr(getattr(torch.ops, namespace), name)
