"""Running generated kernels on torch tensors: :func:`compile`.

``compile(candidate_or_mugraph_or_graph)`` generates the Triton module
(:mod:`.codegen`), writes it to ``<cache dir>/kernels/vm_<sha256>.py``
(Triton's JIT reads kernel source through ``inspect``) and executes the text it
just generated and hashed as a module, never the file or a bytecode cache
(:func:`load_module`). The result is a :class:`CompiledProgram`, callable on
torch tensors positionally in the graph's input order or by input name.

GPU or interpreter
------------------
On a machine with CUDA the kernels are compiled by Triton and launched on the
current CUDA stream (so CUDA-graph capture works). On a CPU-only machine the
same kernels run in Triton's interpreter: Triton decides at ``@triton.jit``
time, from the environment variable ``TRITON_INTERPRET``, whether a kernel is
interpreted, so the runtime sets ``TRITON_INTERPRET=1`` *before importing a
generated module* when ``torch.cuda.is_available()`` is false and the variable
is unset. Set ``TRITON_INTERPRET=1`` yourself to force the interpreter.
"""

from __future__ import annotations

import builtins
import hashlib
import linecache
import logging
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import node_list
from ..ir.ops import TensorType
from .cache import atomic_write, cache_dir
from .codegen import LaunchConfig, ModuleSource, TileOptions, generate

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_MODULES: dict[str, ModuleType] = {}


def interpreting() -> bool:
    """Whether kernels run in Triton's interpreter (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def ensure_mode() -> bool:
    """Set ``TRITON_INTERPRET=1`` on a machine without CUDA (unless set); returns whether interpreting."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            log.info("no CUDA device: running Triton kernels in the interpreter (TRITON_INTERPRET=1)")
            os.environ["TRITON_INTERPRET"] = "1"
    if interpreting():
        _check_triton_import_mode()
        _patch_interpreter_bf16_dot()
    return interpreting()


def _check_triton_import_mode() -> None:
    """Fail clearly if triton was imported before ``TRITON_INTERPRET=1`` was set.

    Triton's own library functions (``tl.sum``, ``tl.sigmoid``, ...) are
    ``@triton.jit`` functions made when ``triton.language`` is imported; made
    without the interpreter flag they cannot run inside interpreted kernels.
    """
    if "triton.language.standard" not in sys.modules:
        return
    from triton.runtime.interpreter import InterpretedFunction

    std = sys.modules["triton.language.standard"]
    if not isinstance(getattr(std, "sum", None), InterpretedFunction):
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so its library functions cannot run in the "
            "interpreter this CPU-only machine needs; set TRITON_INTERPRET=1 in the environment (or call "
            "verimirage.backend.runtime.ensure_mode() before importing triton)"
        )


_PATCHED = False


def _patch_interpreter_bf16_dot() -> None:
    """Make the interpreter's ``tl.dot`` read bf16 operands as numbers.

    Triton 3.6's interpreter stores bf16 tensors as raw ``uint16`` bits and its
    ``create_dot`` multiplies those bits as integers. This wrapper widens bf16
    operands to float32 (exactly: bf16 is the top half of a float32) first, so
    interpreted bf16 kernels compute what the GPU computes (bf16 products,
    fp32 accumulation). Only the interpreter is touched; compiled kernels are not.
    """
    global _PATCHED
    if _PATCHED:
        return
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti

    orig = ti.InterpreterBuilder.create_dot

    def widen(h: Any) -> Any:
        if h.dtype.scalar == tl.bfloat16:
            bits = np.asarray(h.data).astype(np.uint32) << np.uint32(16)
            return ti.TensorHandle(bits.view(np.float32), tl.float32)
        return h

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any, **kwargs: Any) -> Any:
        return orig(self, widen(a), widen(b), d, *args, **kwargs)

    ti.InterpreterBuilder.create_dot = create_dot
    _PATCHED = True


def write_module(ms: ModuleSource, directory: Path | None = None) -> Path:
    """Write the generated source to ``<dir>/vm_<digest>.py`` (atomically, unless it already holds that text).

    The file exists for Triton (its JIT reads kernel source through ``inspect``) and for tracebacks; what
    runs is never read back from it: :func:`load_module` executes the generated text itself.
    """
    d = Path(directory) if directory is not None else cache_dir() / "kernels"
    path = d / f"vm_{ms.digest[:24]}.py"
    try:
        same = path.read_bytes() == ms.source.encode()
    except OSError:
        same = False
    if not same:
        atomic_write(path, ms.source)
    return path


def load_module(path: Path, source: str | None = None) -> ModuleType:
    """Execute generated kernel ``source`` as a fresh module whose file is ``path`` (once per text and mode).

    Nothing is imported from disk: no bytecode cache (``__pycache__``) is read or written, and the text run
    is ``source`` (the generated text, just hashed), never the file's content. The file must hold exactly
    that text (it is rewritten if not, e.g. after tampering); the text is also put in ``linecache`` under
    the file's name, so Triton's JIT, which reads kernel source through ``inspect``, sees the same text
    even if the file changes afterwards. ``source=None`` (old callers) reads the file once and runs that
    text, still never its bytecode.
    """
    ensure_mode()
    path = Path(path)
    if source is None:
        source = path.read_text()
    digest = hashlib.sha256(source.encode()).hexdigest()
    key = f"{digest}:{interpreting()}"
    with _LOCK:
        mod = _MODULES.get(key)
        if mod is None:
            try:
                on_disk = path.read_bytes()
            except OSError:
                on_disk = None
            if on_disk != source.encode():
                if on_disk is not None:
                    log.warning("generated module %s differs from the generated text; rewriting it", path)
                atomic_write(path, source)
            filename = str(path.resolve())
            # mtime None: linecache never re-reads (or drops) this entry from the file
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
            code = builtins.compile(source, filename, "exec", dont_inherit=True)
            modname = f"verimirage_kernels.{path.stem}{'_interp' if interpreting() else ''}"
            mod = ModuleType(modname)
            mod.__file__ = filename
            sys.modules[modname] = mod  # Triton resolves a kernel's globals through its module
            exec(code, mod.__dict__)
            _MODULES[key] = mod
    return mod


def _torch_dtype(t: TensorType) -> Any:
    import torch

    return getattr(torch, t.dtype.torch_name)


class CompiledProgram:
    """A μGraph compiled to Triton kernels: call it on torch tensors.

    ``fn(*tensors)`` in the graph's input order, or ``fn(**{name: tensor})``;
    returns one tensor, or a tuple for several outputs. Shapes and dtypes must
    be the graph's exactly; strides are free.
    """

    def __init__(self, ms: ModuleSource, path: Path, module: ModuleType, config: LaunchConfig,
                 per_kernel: Mapping[str, LaunchConfig] | None = None) -> None:
        self.source = ms.source
        self.path = path
        self.module = module
        self.mugraph = ms.mugraph
        self.kernels = ms.kernels
        self.input_names = ms.input_names
        self.input_types = tuple(t.type for t in ms.mugraph.inputs)
        self.output_types = ms.output_types
        self.config = config
        self.launch: dict[str, dict[str, int]] = {}
        for k in self.kernels:
            c = (per_kernel or {}).get(k.name, config)
            self.launch[k.name] = {"num_warps": c.num_warps, "num_stages": c.num_stages}
        self._forward = module.forward

    def _bind(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any]:
        names = self.input_names
        if len(args) > len(names):
            raise TypeError(f"compiled program takes {len(names)} input(s) {list(names)}; got {len(args)} positional")
        vals: dict[str, Any] = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k not in names:
                raise TypeError(f"compiled program: unknown input {k!r}; the inputs are {list(names)}")
            if k in vals:
                raise TypeError(f"compiled program: input {k!r} given twice (positionally and by name)")
            vals[k] = v
        missing = [n for n in names if n not in vals]
        if missing:
            raise TypeError(f"compiled program: missing input(s) {missing}; the inputs are {list(names)}")
        import torch

        out = []
        device = None
        for n, t in zip(names, self.input_types, strict=True):
            x = vals[n]
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"input {n!r}: expected a torch.Tensor, got {type(x).__name__}")
            if tuple(x.shape) != t.shape:
                raise ValueError(f"input {n!r}: shape {tuple(x.shape)}; expected {t.shape}")
            if x.dtype != _torch_dtype(t):
                raise TypeError(f"input {n!r}: dtype {x.dtype}; expected {_torch_dtype(t)} (no implicit casts)")
            if device is None:
                device = x.device
            elif x.device != device:
                raise ValueError(f"input {n!r}: on {x.device}, but earlier inputs are on {device}")
            out.append(x)
        if device is not None:
            if interpreting() and device.type != "cpu":
                raise ValueError(f"inputs are on {device}, but kernels run in Triton's interpreter; pass CPU tensors")
            if not interpreting() and device.type != "cuda":
                raise ValueError(f"inputs are on {device}; compiled Triton kernels need CUDA tensors")
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        xs = self._bind(args, kwargs)
        self.module.LAUNCH.update({k: dict(v) for k, v in self.launch.items()})
        outs = self._forward(*xs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        return f"<CompiledProgram {len(self.kernels)} kernel(s) from {self.path}>"


def _chosen_config(program: Any) -> LaunchConfig | None:
    """The configuration ``profile.select`` measured fastest for this program in this process, if any."""
    from .profile import chosen_config

    return chosen_config(program)


def compile(
    program: Any,
    *,
    config: LaunchConfig | None = None,
    per_kernel: Mapping[str, LaunchConfig] | None = None,
    directory: Path | str | None = None,
) -> CompiledProgram:
    """Compile a Candidate (its ``.mugraph``), MuGraph or Graph to a callable on torch tensors.

    ``config`` sets the tile options and launch parameters of every kernel
    (``per_kernel`` overrides the launch parameters by kernel name). Without
    one, the configuration :func:`verimirage.backend.profile.select` found
    fastest for this μGraph in this process is used if there is one, else each
    kernel gets :func:`verimirage.backend.tuning.recommend`'s (measured rules);
    ``LaunchConfig(tuned=True)`` asks for the latter explicitly.
    ``directory`` is where the generated module is written (default: the
    cache directory, see :mod:`.cache`).
    """
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"compile: config {config!r}; expected a LaunchConfig")
    if config is None:
        config = _chosen_config(program)
    if config is None or config.tuned:
        from . import tuning

        config = LaunchConfig(tuned=True)
        ms = generate(program, tiles_for=lambda bg, at: tuning.recommend(bg, at).tiles)
        nodes = node_list(ms.mugraph)
        tuned: dict[str, LaunchConfig] = {}
        for k in ms.kernels:
            n = nodes[k.node]
            tuned[k.name] = tuning.recommend(n.attr("block"), [nodes[a].outs[j] for a, j in n.args])
        per_kernel = tuned | dict(per_kernel or {})
    else:
        tiles: TileOptions = config.tiles
        ms = generate(program, tiles)
    path = write_module(ms, Path(directory) if directory is not None else None)
    try:
        mod = load_module(path, ms.source)
    except Exception as e:
        raise GraphError(f"compile: the generated module {path} does not import: {e}") from e
    log.debug("compiled %d kernel(s) into %s", len(ms.kernels), path)
    return CompiledProgram(ms, path, mod, config, per_kernel)
