"""How a generated test module finds the kernel it tests.

A written module must run on its own, in a fresh process, so the kernel is
recorded as data (a :data:`KernelRef` dict, a Python literal) that
:func:`load_kernel` turns back into a callable:

``{"kind": "mugraph", "json": ...}``
    a μGraph (the best verified candidate, by default, or one given as
    ``kernel=``): the module runs ``vm.compile`` on it. Nothing outside the
    module is needed, and the module also re-proves the μGraph equal to the
    graph.
``{"kind": "import", "target": "pkg.mod:qualname", "file": "/abs/path/mod.py"}``
    an importable object: a module-level function or class of any module,
    including a test module. It is imported by module name; if that fails in
    the new process (a test file that is not on ``sys.path``, a script run as
    ``__main__``), the module is loaded from ``file`` instead. This is pickle's
    "by reference" rule made robust to how pytest imported the test.
``{"kind": "pickle", "data": base64, "paths": [...]}``
    any other picklable object (e.g. ``functools.partial`` of a module-level
    function, an instance of a module-level class); ``paths`` are prepended
    to ``sys.path`` before unpickling so the modules it names can be found.

Lambdas and closures (``<locals>`` in their qualname) cannot be referenced:
:func:`kernel_ref` rejects them with a message saying to define the kernel at
module level or to pass ``"module:function"``.
"""

from __future__ import annotations

import base64
import importlib
import importlib.util
import os
import pickle
import sys
import types
from pathlib import Path
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import MuGraph

KernelRef = dict[str, Any]


def _module_file(modname: str) -> str | None:
    mod = sys.modules.get(modname)
    f = getattr(mod, "__file__", None)
    return str(Path(f).resolve()) if f else None


def _resolve(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _load_module(modname: str, file: str | None) -> Any:
    if modname != "__main__":
        try:
            return importlib.import_module(modname)
        except ImportError:
            if not file:
                raise
    if not file or not os.path.exists(file):
        raise ImportError(f"cannot import module {modname!r} and its file {file!r} does not exist")
    name = modname if modname != "__main__" else f"_vm_kernel_{Path(file).stem}"
    if name in sys.modules:
        return sys.modules[name]
    parent = str(Path(file).parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file!r} as a module")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def kernel_ref(kernel: Any) -> KernelRef:
    """The :data:`KernelRef` recording ``kernel`` (a "module:name" string, a μGraph, a Candidate or a callable)."""
    if isinstance(kernel, str):
        if ":" not in kernel:
            raise GraphError(
                f"write_tests: kernel {kernel!r}; expected 'module:function' or 'path/to/file.py:function'"
            )
        mod, _, qual = kernel.rpartition(":")
        file = None
        if mod.endswith(".py"):
            file = str(Path(mod).resolve())
            mod = Path(mod).stem
        return {"kind": "import", "target": f"{mod}:{qual}", "file": file}
    if isinstance(kernel, MuGraph):
        return {"kind": "mugraph", "json": kernel.to_json()}
    if hasattr(kernel, "mugraph") and isinstance(kernel.mugraph, MuGraph):  # a Candidate
        return {"kind": "mugraph", "json": kernel.mugraph.to_json()}
    if not callable(kernel):
        raise GraphError(
            f"write_tests: kernel is {type(kernel).__name__}; expected a callable on torch tensors, a vm.MuGraph, "
            "a Candidate, or 'module:function'"
        )
    modname: str | None = getattr(kernel, "__module__", None)
    qname: str | None = getattr(kernel, "__qualname__", None)
    if modname and qname and "<" not in qname:
        loaded = sys.modules.get(modname)
        try:
            same = loaded is not None and _resolve(loaded, qname) is kernel
        except AttributeError:
            same = False
        if same:
            return {"kind": "import", "target": f"{modname}:{qname}", "file": _module_file(modname)}
    if isinstance(kernel, types.FunctionType) and qname and "<" in qname:
        raise GraphError(
            f"write_tests: kernel {qname!r} is a lambda or closure, which a new process cannot find; define it at "
            "module level or pass 'module:function'"
        )
    try:
        data = pickle.dumps(kernel)
    except Exception as e:
        raise GraphError(
            f"write_tests: cannot reference kernel {kernel!r} ({type(e).__name__}: {e}); define it as a module-level "
            "function (lambdas and closures cannot be referenced) or pass 'module:function'"
        ) from None
    paths = sorted({str(Path(f).parent) for m in list(sys.modules.values())
                    if (f := getattr(m, "__file__", None)) and m.__name__.split(".")[0] in _mentioned(data)})
    return {"kind": "pickle", "data": base64.b64encode(data).decode("ascii"), "paths": paths}


def _mentioned(data: bytes) -> set[str]:
    """Top-level module names that a pickle refers to."""
    import pickletools

    names = set()
    strings: list[str] = []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(str(arg))
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(strings[-2].split(".")[0])
        elif op.name == "GLOBAL":
            names.add(str(arg).split(" ")[0].split(".")[0])
    return names


def load_kernel(ref: KernelRef) -> Any:
    """The callable recorded by :func:`kernel_ref` (compiling a μGraph with ``vm.compile``)."""
    kind = ref.get("kind")
    if kind == "mugraph":
        import verimirage as vm

        return vm.compile(MuGraph.from_json(ref["json"]))
    if kind == "import":
        modname, _, qual = ref["target"].rpartition(":")
        return _resolve(_load_module(modname, ref.get("file")), qual)
    if kind == "pickle":
        for p in ref.get("paths", []):
            if p not in sys.path:
                sys.path.append(p)
        return pickle.loads(base64.b64decode(ref["data"]))
    raise GraphError(f"load_kernel: unknown kernel reference kind {kind!r}; expected mugraph, import or pickle")
