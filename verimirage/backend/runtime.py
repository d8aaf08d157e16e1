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
import math
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from ..ir.errors import GraphError
from ..ir.graph import node_list
from ..ir.ops import TensorType
from .cache import atomic_write, cache_dir
from .codegen import INT32_INDEX, LaunchConfig, ModuleSource, arg_storage, generate
from .launchcheck import pdl_hazards

log = logging.getLogger(__name__)

_builtin_compile = builtins.compile  # this module's ``compile`` is verimirage's
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


def load_module(path: Path, source: str) -> ModuleType:
    """Execute generated kernel ``source`` as a fresh module whose file is ``path`` (once per text and mode).

    Nothing is imported from disk: no bytecode cache (``__pycache__``) is read or written, and the text run
    is ``source`` (the generated text, just hashed), never the file's content. The file must hold exactly
    that text (it is rewritten if not, e.g. after tampering); the text is also put in ``linecache`` under
    the file's name, so Triton's JIT, which reads kernel source through ``inspect``, sees the same text
    even if the file changes afterwards.
    """
    ensure_mode()
    path = Path(path)
    if not isinstance(source, str):
        raise TypeError(f"load_module: source is a {type(source).__name__}; expected the generated text")
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


#: Returned by a lean runner when the inputs are not the ones its plan was made for (the checked path then
#: runs: it raises the clear error, or makes or finds the plan for these inputs).
_MISS = object()

#: Byte alignment of the buffers the lean launcher carves out of one workspace allocation.
_WS_ALIGN = 256


class _LeanPlan:
    """One input signature's launches, resolved once: the lean path of :class:`CompiledProgram` on a GPU.

    Made on the first call with inputs of a given signature (shapes, dtypes, strides, 16-byte alignment of
    the data pointers, device): that call launches each kernel through ``JITFunction.run``, which compiles
    or finds the Triton kernel specialised for exactly these arguments and returns it (a
    ``triton.compiler.CompiledKernel``). Every launch's grid, launch parameters and integer arguments are then
    fixed; only data pointers change. Two small functions are generated from that (see :meth:`_source`):

    * ``run(*xs)`` checks the signature (PyTorch's C tensor guard, else the same check in Python; returning
      :data:`_MISS` on any difference, so the checked path runs), allocates the program's outputs, takes the
      workspace for its intermediate values and launches every kernel in one call of the program-wide C
      launcher (:mod:`.launch`: parameters packed here, pointers filled per call), or, where that launcher
      does not serve a kernel, calls each kernel's Triton launcher directly; no argument specialisation,
      cache-key hashing or launch hooks on the way. It returns what the program returns (one tensor, or a
      tuple);
    * ``run_out(out, *xs)`` does the same into caller-provided output tensors (``out=``): no allocation. It also
      checks that each ``out`` tensor has the program's output shape, dtype, device, contiguous layout and a
      16-byte aligned pointer, overlaps no input and no other output and does not require grad (else
      :data:`_MISS`: the checked path computes into fresh outputs and copies them over, where PyTorch's
      ``copy_`` refuses a leaf that requires grad outside ``torch.no_grad()``, as any in-place op does).
      ``None`` where a program output is an input itself or one buffer is returned twice (the checked path
      serves those).

    Outputs of at most ``_TEMPLATE_BYTES`` (256 KiB) are allocated by ``torch.empty_like`` of a template of
    their shape that the plan keeps (one such buffer per small output, held as long as the program); larger ones
    by ``new_empty``.

    The workspace is one allocation: a buffer kept for the stream that first called (reused by later calls
    on that stream, which run after the earlier calls' kernels; by one call at a time, since two threads calling
    on one stream interleave their launches there) and a fresh allocation from PyTorch's caching allocator,
    given back after the launches are queued, on any other stream, while another call holds the kept buffer, or
    while a CUDA graph is being captured (a captured graph must not share the kept buffer with later calls).
    """

    #: the program's completion counters on this device (set in ``__init__``; None for a program without any, and
    #: for a plan built field by field)
    counters: Any = None

    def __init__(self, prog: CompiledProgram, xs: Sequence[Any]) -> None:
        import torch
        from triton import knobs

        from .precompile import first_calls

        self.device = xs[0].device
        get_device = _device_getter()
        dev_index = get_device()
        bufs: dict[int, Any] = {}

        def value(ref: tuple[str, int]) -> Any:
            return value_of(ref, xs, bufs, prog.views, prog.counters)

        buf_meta: dict[int, tuple[tuple[int, ...], Any]] = {}
        launches: list[tuple[Any, tuple[int, int, int], list[Any]]] = []
        for st, jit, call in first_calls(prog, value, bufs, self.device):  # (as precompile's and _first_launch's)
            for bi, shape, dt in st.outs:
                buf_meta[bi] = (shape, getattr(torch, dt))
            grid = prog.grids.get(st.kernel, st.grid)
            if st.kernel in prog.persistent:  # the grid co-resident for the kernel this signature compiles to
                def build(launch: dict[str, Any], jit: Any = jit, call: list[Any] = call, st: Any = st) -> Any:
                    k = jit.run(*call, grid=st.grid, warmup=True, **launch)
                    return k.result() if hasattr(k, "result") else k  # (Triton's async compile mode)
                kern = persistent_stages(build, prog.launch[st.kernel], self.device)
                prog.module.LAUNCH[st.kernel] = dict(prog.launch[st.kernel])
                grid = (persistent_grid(kern, math.prod(st.grid), self.device),)
                # (another specialisation or device may fit fewer blocks: forward's grid is the least seen)
                prog.grids[st.kernel] = min(grid, prog.grids.get(st.kernel, grid))
                log.info("compiled program %s: persistent kernel %s, %d tasks on %d blocks (%s)", prog.path.name,
                         st.kernel, math.prod(st.grid), grid[0], prog.launch[st.kernel])
            kern = jit.run(*call, grid=grid, warmup=False, **prog.launch[st.kernel])
            if hasattr(kern, "result"):  # pragma: no cover - only under Triton's async compile mode
                kern = kern.result()
            g = (*grid, 1, 1)
            launches.append((kern, (g[0], g[1], g[2]), call))
        #: what this first call computed (returned to the caller that made the plan)
        copy = getattr(prog, "copy_returned_inputs", True)
        self.first_outputs = tuple(value(r).clone() if r[0] == "in" and copy else value(r) for r in prog.returns)
        returned = {r[1] for r in prog.returns if r[0] == "buf"}
        ws_off: dict[int, int] = {}
        ws = 0
        for bi, (shape, dt) in buf_meta.items():
            if bi not in returned:
                ws_off[bi] = ws
                nbytes = math.prod(shape) * dt.itemsize
                ws += -(-nbytes // _WS_ALIGN) * _WS_ALIGN
        self.signature = [(tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0) for x in xs]
        #: the workspace kept for one stream: [stream handle or None, pointer, the tensor holding it]
        self.kept_workspace: list[Any] = [None, 0, None]
        #: the pointers a launch takes, in order: the inputs', the returned buffers', the workspace's
        self.returned_bufs = [bi for bi in buf_meta if bi in returned]
        #: the program's completion counters (last-block-combines launches) on this device, or None: kept by the
        #: generated module, zero between launches (:attr:`~verimirage.backend.codegen.ModuleSource.counters`)
        self.counters = prog.counters(self.device) if prog.n_counters else None
        self.c_plan = self._c_plan(prog, launches, dev_index, ws_off, bool(ws))
        #: which launcher the plan calls: "c" (one C call for every kernel, :mod:`.launch`) or "triton"
        self.launcher = "c" if self.c_plan is not None else "triton"
        #: the inputs' signature as one C check (PyTorch's tensor guard: type, dispatch keys, dtype, device,
        #: sizes, strides, requires_grad), else None; when it fails, the Python check decides
        self.guard = _tensor_guard(xs)
        #: the same for ``out=`` tensors (the program's outputs: contiguous, not requiring grad)
        self.out_guard = _tensor_guard([t.detach() for t in self.first_outputs])
        src, env = self._source(prog, launches, buf_meta, ws_off, ws, returned)
        env.update(MISS=_MISS, empty=torch.empty, uint8=torch.uint8, DEVICE=self.device, DEV=dev_index,
                   get_device=get_device, get_stream=_stream_getter(), capturing=_capture_checker(),
                   bump=_version_bumper(), WS=self.kept_workspace,
                   HOOK_IN=knobs.runtime.launch_enter_hook, HOOK_OUT=knobs.runtime.launch_exit_hook)
        ns: dict[str, Any] = {}
        self.source = src
        exec(_builtin_compile(src, f"<verimirage lean launcher {prog.path.stem}>", "exec"), env, ns)
        self.run: Callable[..., Any] = ns["run"]
        self.run_out: Callable[..., Any] | None = ns.get("run_out")

    def _c_plan(self, prog: CompiledProgram, launches: Sequence[tuple[Any, tuple[int, int, int], list[Any]]],
                dev_index: int, ws_off: Mapping[int, int], has_ws: bool) -> Any:
        """The program-wide C launcher's plan for these launches (:mod:`.launch`), or None (Triton's launchers)."""
        if os.environ.get("VERIMIRAGE_LAUNCHER", "c").lower() == "triton":
            return None
        from . import launch

        n = len(prog.input_names)
        src: dict[tuple[str, int], tuple[int, int]] = {("in", i): (i, 0) for i in range(n)}
        for j, bi in enumerate(self.returned_bufs):
            src[("buf", bi)] = (n + j, 0)
        w = n + len(self.returned_bufs)
        for bi, off in ws_off.items():
            src[("buf", bi)] = (w, off)
        for j in range(len(prog.views)):
            src[("view", j)] = src[_view_base(prog.views, ("view", j))]
        if self.counters is not None:  # (the counters' pointer last: the calling stream's, passed on every call)
            src[("ctr", prog.n_counters)] = (w + int(has_ws), 0)
        try:
            entries = []
            for st, (kern, grid, call) in zip(prog.steps, launches, strict=True):
                refs = iter([*(r for r, _ in st.args), *(("buf", bi) for bi, _, _ in st.outs)])
                sources = [None if isinstance(a, int) else src[next(refs)] for a in call]
                entries.append(launch.kernel_entry(kern, call, grid, sources))
            return launch.make_plan(dev_index, w + int(has_ws) + int(self.counters is not None), entries)
        except Exception as e:  # a kernel this launcher does not serve, or no C compiler: Triton's launchers
            log.info("compiled program %s: Triton's launchers (%s: %s)", prog.path.name, type(e).__name__, e)
            return None

    def _source(self, prog: CompiledProgram, launches: Sequence[tuple[Any, tuple[int, int, int], list[Any]]],
                buf_meta: Mapping[int, tuple[tuple[int, ...], Any]], ws_off: Mapping[int, int], ws: int,
                returned: set[int]) -> tuple[str, dict[str, Any]]:
        """The text of ``run(*xs)`` and ``run_out(out, *xs)`` and the constants they refer to."""
        import torch

        raw_alloc = _raw_allocator()
        n = len(prog.input_names)
        env: dict[str, Any] = {}
        xs = [f"x{i}" for i in range(n)]
        single = len(prog.returns) == 1
        copy = getattr(prog, "copy_returned_inputs", True)
        rets = [(f"x{r[1]}.clone()" if copy else f"x{r[1]}") if r[0] == "in" else f"b{r[1]}" for r in prog.returns]
        ret_line = f"    return {rets[0]}" if single else f"    return ({', '.join(rets)},)"

        def head(name: str, lead: str) -> list[str]:
            # the signature check of the inputs: any difference (or an exception: not a tensor, ...) is a miss
            lines = [f"def {name}({lead}*xs):",
                     "    if HOOK_IN.calls or HOOK_OUT.calls or get_device() != DEV:",
                     "        return MISS", "    try:", f"        {', '.join(xs)}{',' if n == 1 else ''} = xs"]
            lines += [f"        p{i} = x{i}.data_ptr()" for i in range(n)]
            conds = []
            for i, (shape, dt, stride, _) in enumerate(self.signature):
                env[f"D{i}"] = dt
                conds.append(f"x{i}.shape != {shape!r} or x{i}.dtype is not D{i} or x{i}.get_device() != DEV or "
                             f"x{i}.stride() != {stride!r} or x{i}.is_neg()")
            # 16-byte alignment as specialised: one test for the aligned pointers, one per unaligned one
            on = [f"p{i}" for i, s in enumerate(self.signature) if s[3]]
            align = ([f"({' | '.join(on)}) & 15"] if on else []) + [
                f"p{i} & 15 == 0" for i, s in enumerate(self.signature) if not s[3]]
            check = "(" + "\n                or ".join(conds) + ")"
            if self.guard is not None:  # the C guard first; the Python check only where it says no
                env["GUARD"] = self.guard
                check = f"(not GUARD({', '.join(xs)}) and {check})"
            lines += [f"        if {check}:", "            return MISS"]
            if align:
                lines += [f"        if {' or '.join(align)}:", "            return MISS"]
            return lines

        ptr: dict[tuple[str, int], str] = {("in", i): f"p{i}" for i in range(n)}
        for bi in buf_meta:
            ptr[("buf", bi)] = f"q{bi}" if bi in returned else f"(w + {ws_off[bi]})"
        for j in range(len(prog.views)):
            ptr[("view", j)] = ptr[_view_base(prog.views, ("view", j))]
        ctr_lines: list[str] = []
        if self.counters is not None:  # (the calling stream's counters: kept per stream, a capture's own)
            kept: dict[int, int] = {}
            capturing = _capture_checker()
            _reserve_capture_counters(self.device, prog.n_counters)

            def counters_for(stream: int) -> Any:
                if capturing():  # (a CUDA graph capture's own: no call outside it shares them)
                    got = _capture_counters(self.device, prog.n_counters, stream, str(prog.path))
                    if got is not None:
                        return got
                    # (no capture id or no zeroed buffer left: fresh ones, zeroed in the graph each replay)
                    return torch.zeros(prog.n_counters, dtype=torch.int32, device=self.device)
                _reserve_capture_counters(self.device, prog.n_counters)
                t = prog.counters(self.device, stream)
                kept[stream] = t.data_ptr()
                return t

            env["CT"], env["CT_FOR"] = kept, counters_for
            ctr_lines = ["    CTR = CT.get(stream)", "    if CTR is None or capturing():",
                         "        ct = CT_FOR(stream)", "        CTR = ct.data_ptr()"]
            ptr[("ctr", prog.n_counters)] = "CTR"
        launch_lines: list[str] = []
        if self.c_plan is not None:  # every kernel in one C call: the pointers, the rest is in the plan
            from . import launch

            env["LAUNCH"], env["PLAN"] = launch.module().launch, self.c_plan
            srcs = [f"p{i}" for i in range(n)] + [f"q{bi}" for bi in self.returned_bufs] + (["w"] if ws else []) + (
                ["CTR"] if self.counters is not None else [])
            launch_lines.append(f"    LAUNCH(PLAN, stream, {', '.join(srcs)})")
        for k, (st, (kern, grid, call)) in enumerate(zip(prog.steps, launches, strict=True)):
            if self.c_plan is not None:
                break
            launcher = kern.run
            env[f"F{k}"], env[f"M{k}"] = kern.function, kern.packed_metadata
            args: list[str] = []
            refs = [*(r for r, _ in st.args), *(("buf", bi) for bi, _, _ in st.outs)]
            ri = 0
            for a in call:
                if isinstance(a, int):
                    args.append(repr(a))
                else:
                    args.append(ptr[refs[ri]])
                    ri += 1
            direct = (getattr(launcher, "global_scratch_size", 1) == 0 and getattr(launcher, "profile_scratch_size", 1)
                      == 0 and hasattr(launcher, "launch"))
            if direct:  # the compiled C launcher itself: no scratch buffers to allocate
                env[f"L{k}"] = launcher.launch
                call_head = (f"L{k}({grid[0]}, {grid[1]}, {grid[2]}, stream, F{k}, "
                             f"{bool(launcher.launch_cooperative_grid)}, {bool(launcher.launch_pdl)}, None, None, "
                             f"M{k}, None, None, None")
            else:
                env[f"L{k}"] = launcher
                call_head = f"L{k}({grid[0]}, {grid[1]}, {grid[2]}, stream, F{k}, M{k}, None, None, None"
            launch_lines.append(f"    {call_head}, {', '.join(args)})")
        body: list[str] = list(ctr_lines)
        if ws and raw_alloc is not None:
            # the workspace: the buffer kept for this stream, else one straight from PyTorch's caching allocator
            # (no tensor: stream-ordered like a tensor's memory, returned after the launches are queued)
            # (one call at a time on the kept one: two threads calling on one stream interleave their launches
            # there, the C launcher releasing the GIL between them, and one call's kernels would read the other's
            # intermediate results; a call that finds it taken gets its own)
            env["ws_alloc"], env["ws_free"], env["WSLOCK"] = *raw_alloc, threading.Lock()
            body += ["    if stream == WS[0] and not capturing() and WSLOCK.acquire(False):", "        try:",
                     "            w = WS[1]", *("        " + line for line in launch_lines), "        finally:",
                     "            WSLOCK.release()",
                     "    elif WS[0] is None and not capturing():",
                     f"        wt = empty({ws}, dtype=uint8, device=DEVICE)",
                     "        w = wt.data_ptr()", *("    " + line for line in launch_lines),
                     "        WS[:] = (stream, w, wt)",
                     "    else:", f"        w = ws_alloc({ws}, stream)", "        try:",
                     *("        " + line for line in launch_lines), "        finally:", "            ws_free(w)"]
        else:
            if ws:
                body += [f"    wt = empty({ws}, dtype=uint8, device=DEVICE)", "    w = wt.data_ptr()"]
            body += launch_lines
        # run: fresh outputs. A small output is allocated by empty_like of a kept template of its shape (no size
        # to parse: 1.95 µs against new_empty's 2.73 and torch.empty's 3.55 on an H200 host, 2026-11-26); a
        # large one by new_empty on a kept empty tensor of its dtype and device (no template held in memory)
        lines = head("run", "")
        lines += ["    except Exception:", "        return MISS", "    stream = get_stream(DEV)"]
        env["empty_like"] = torch.empty_like
        for bi, (shape, dt) in buf_meta.items():
            if bi in returned:
                template = _output_template(shape, dt, self.device)
                if template is not None:
                    env[f"T{bi}"] = template
                    lines += [f"    b{bi} = empty_like(T{bi})", f"    q{bi} = b{bi}.data_ptr()"]
                else:
                    env[f"T{bi}"] = torch.empty(0, dtype=dt, device=self.device)
                    lines += [f"    b{bi} = T{bi}.new_empty({shape!r})", f"    q{bi} = b{bi}.data_ptr()"]
        lines += [*body, ret_line]
        # run_out: into the caller's tensors, checked; only where every output is its own buffer
        out_bufs = [r[1] for r in prog.returns if r[0] == "buf"]
        if len(out_bufs) == len(prog.returns) and len(set(out_bufs)) == len(out_bufs):
            lines += ["", *head("run_out", "out, ")]
            outs = [f"b{bi}" for bi in out_bufs]
            lines.append(f"        {outs[0]} = out" if single else f"        {', '.join(outs)}, = out")
            spans = {}
            for i, (shape, dt, stride, _) in enumerate(self.signature):
                spans[f"p{i}"] = 0 if 0 in shape else dt.itemsize * (1 + sum((s - 1) * t for s, t in
                                                                              zip(shape, stride, strict=True)))
            conds, places = [], []
            for bi in out_bufs:
                shape, dt = buf_meta[bi]
                env[f"D_b{bi}"] = dt
                lines.append(f"        q{bi} = b{bi}.data_ptr()")
                conds.append(f"b{bi}.shape != {shape!r} or b{bi}.dtype is not D_b{bi} or b{bi}.get_device() != DEV "
                             f"or b{bi}.stride() != {_contiguous_strides(shape)!r} or b{bi}.requires_grad or "
                             f"b{bi}.is_neg()")
                places.append(f"(q{bi} & 15 != 0)")
                size = math.prod(shape) * dt.itemsize
                for p, span in spans.items():  # no overlap with an input or an earlier output
                    if size and span:
                        places.append(f"({p} < q{bi} + {size} and q{bi} < {p} + {span})")
                spans[f"q{bi}"] = size
            check = "(" + "\n                or ".join(conds) + ")"
            if self.out_guard is not None:  # contiguous, this shape, dtype and device, no grad: one C check
                env["OGUARD"] = self.out_guard
                check = f"(not OGUARD({', '.join(outs)}) and {check})"
            lines += [f"        if {check}:", "            return MISS",
                      "        if (" + "\n                or ".join(places) + "):", "            return MISS",
                      "    except Exception:", "        return MISS", "    stream = get_stream(DEV)", *body]
            lines.append(f"    bump(({', '.join(outs)},))")
            lines.append("    return out")
        return "\n".join(lines) + "\n", env


def value_of(ref: tuple[str, int], xs: Sequence[Any], bufs: dict[int, Any],
             views: Sequence[tuple[tuple[str, int], tuple[int, ...]]],
             counters: Callable[[Any], Any] | None = None) -> Any:
    """The tensor of ``ref`` (:data:`~verimirage.backend.codegen.ValueRef`) in a call on inputs ``xs`` with the
    launcher's buffers ``bufs``: a view (:attr:`ModuleSource.views`) is its source's memory under its shape; the
    counters (``("ctr", n)``) are ``counters(device)`` (:meth:`CompiledProgram.counters`)."""
    if ref[0] == "view":
        src, shape = views[ref[1]]
        return value_of(src, xs, bufs, views, counters).view(shape)
    if ref[0] == "ctr":
        if counters is None:
            raise ValueError("value_of: a last-block launch's counters, but no counters given")
        return counters(xs[0].device)
    return xs[ref[1]] if ref[0] == "in" else bufs[ref[1]]


def _view_base(views: Sequence[tuple[tuple[str, int], tuple[int, ...]]], ref: tuple[str, int]) -> tuple[str, int]:
    """The value whose memory the view ``ref`` (``("view", j)``, :attr:`ModuleSource.views`) is; ``ref`` itself when
    it is not a view."""
    while ref[0] == "view":
        ref = views[ref[1]][0]
    return ref


#: Largest output (bytes) the lean path keeps an allocation template of (see :func:`_output_template`).
_TEMPLATE_BYTES = 1 << 18


def _output_template(shape: tuple[int, ...], dt: Any, device: Any) -> Any:
    """A tensor whose ``empty_like`` is a fresh contiguous tensor of ``shape``, dtype ``dt`` on ``device``, or
    None for outputs over :data:`_TEMPLATE_BYTES` (the template is a real allocation, held by the plan)."""
    import torch

    if math.prod(shape) * dt.itemsize > _TEMPLATE_BYTES:
        return None
    t = torch.empty(shape, dtype=dt, device=device)
    probe = torch.empty_like(t)
    if (tuple(probe.shape) != tuple(shape) or probe.dtype != dt or probe.device != t.device
            or probe.stride() != _contiguous_strides(shape)):
        return None
    return t


def _element_span(t: Any) -> int:
    """How many elements apart a tensor's first and last elements lie, plus one (its numel when contiguous)."""
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0


def _byte_span(t: Any) -> tuple[int, int]:
    """The bytes ``[start, end)`` a tensor's elements occupy (empty for a tensor without elements)."""
    if t.numel() == 0:
        return (0, 0)
    start = t.data_ptr()
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return (start, start + (last + 1) * t.element_size())


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a row-major contiguous tensor of ``shape`` (PyTorch's, size-1 dimensions included)."""
    strides: list[int] = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


#: zeroed counter buffers kept for CUDA graph captures, per (device, count): each is made outside any capture (and
#: waited for), then given to one (capture, stream) for good (:func:`_capture_counters`); never freed, since a graph
#: may be replayed for as long as the process runs
CAPTURE_RESERVE = 4
_CAPTURE_SPARE: dict[tuple[Any, int], list[Any]] = {}
_CAPTURE_GIVEN: dict[tuple[Any, int, int, int, str], Any] = {}
_CAPTURE_LOCK = threading.Lock()


def _reserve_capture_counters(device: Any, n: int) -> None:
    """Keep :data:`CAPTURE_RESERVE` zeroed buffers of ``n`` int32 counters on ``device`` for captures (call outside
    any capture): made on the current stream and waited for, so no graph replayed later on any stream can see them
    unzeroed."""
    if len(_CAPTURE_SPARE.get((device, n), ())) >= CAPTURE_RESERVE:
        return  # (the usual case, on every call of a program with counters: no lock taken)
    import torch

    with _CAPTURE_LOCK:
        spare = _CAPTURE_SPARE.setdefault((device, n), [])
        if len(spare) >= CAPTURE_RESERVE:
            return
        while len(spare) < CAPTURE_RESERVE:
            spare.append(torch.zeros(n, dtype=torch.int32, device=device))
        if torch.device(device).type == "cuda":
            torch.cuda.current_stream(device).synchronize()


def _capture_counters(device: Any, n: int, stream: int, owner: str) -> Any:
    """The counters a last-block launch takes while ``stream`` is captured into a CUDA graph, or None where none
    can be given (the caller then makes fresh ones, zeroed in the graph). One zeroed buffer from the reserve per
    (capture, stream, program ``owner``): the calls of one capture on one stream run one after another in every
    replay, each leaving the counters at zero, as the calls on one stream outside a capture share theirs; a
    branch of the capture on another stream, and every other capture (its id: the driver's), gets its own, so
    graphs replayed at once never count each other's blocks. This keeps a fill kernel out of the graph (H100,
    2026-11-27: lora_scaled's last-block design 17.47 us a call with the fill, 15.44 without)."""
    cid = _capture_id(stream)
    if cid is None:
        return None
    key = (device, n, cid, stream, owner)
    with _CAPTURE_LOCK:
        got = _CAPTURE_GIVEN.get(key)
        if got is None:
            spare = _CAPTURE_SPARE.get((device, n))
            if not spare:
                return None
            got = _CAPTURE_GIVEN[key] = spare.pop()
        return got


_CAPTURE_INFO: list[Any] = []


def _capture_id(stream: int) -> int | None:
    """The id of the CUDA graph capture raw stream handle ``stream`` is part of (the driver's
    ``cuStreamGetCaptureInfo``, unique within the process), or None: not capturing, or no such driver function."""
    import ctypes

    if not _CAPTURE_INFO:
        fn: Any = None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            # (the plain name last, given seven arguments: whichever version it is takes them, the unused last)
            for name, nargs in (("cuStreamGetCaptureInfo_v3", 7), ("cuStreamGetCaptureInfo_v2", 6),
                                ("cuStreamGetCaptureInfo", 7)):
                f = getattr(lib, name, None)
                if f is not None:
                    f.restype = ctypes.c_int
                    fn = (f, nargs)
                    break
        except OSError:
            fn = None
        _CAPTURE_INFO.append(fn)
    got = _CAPTURE_INFO[0]
    if got is None:
        return None
    f, nargs = got
    status, cid = ctypes.c_int(0), ctypes.c_uint64(0)
    # (the graph, its dependencies and their edge data: optional outputs, not asked for)
    rc = f(ctypes.c_void_p(stream), ctypes.byref(status), ctypes.byref(cid), *([None] * (nargs - 3)))
    return int(cid.value) if rc == 0 and status.value == 1 else None  # (1: CU_STREAM_CAPTURE_STATUS_ACTIVE)


def _capture_checker() -> Callable[[], bool]:
    """Whether the current CUDA stream is capturing a graph, as a cheap callable."""
    import torch

    return getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)  # type: ignore[no-any-return]


def _version_bumper() -> Callable[[tuple[Any, ...]], Any]:
    """``bump(tensors)``: bump the tensors' version counters, as an in-place PyTorch op does (so autograd sees
    the lean path's writes into ``out`` tensors); PyTorch's C function where it takes a tuple, else its wrapper."""
    import torch
    from torch.autograd.graph import increment_version

    bump: Callable[[tuple[Any, ...]], Any] | None = getattr(torch._C, "_increment_version", None)
    try:
        if bump is None:
            raise TypeError("no torch._C._increment_version")
        bump((torch.empty(0),))
    except Exception:  # pragma: no cover - a torch whose C function takes one tensor
        return increment_version
    return bump


def _raw_allocator() -> tuple[Callable[[int, int], int], Callable[[int], None]] | None:
    """PyTorch's caching allocator without a tensor: ``(alloc(nbytes, stream) -> pointer, free(pointer))``."""
    import torch

    alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
    free = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
    return None if alloc is None or free is None else (alloc, free)


def _copy_each(dst: Sequence[Any], src: Sequence[Any]) -> None:
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


def _tensor_guard(xs: Sequence[Any]) -> Callable[..., bool] | None:
    """``check(*tensors)``: whether tensors match ``xs`` in Python type, dispatch keys, dtype, device, sizes,
    strides and requires_grad, in one C call (PyTorch's own tensor guard, the one ``torch.compile`` checks its
    inputs with), or None where this PyTorch has none (the lean path then checks in Python alone)."""
    if os.environ.get("VERIMIRAGE_TENSOR_GUARD", "1") == "0":
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards

        # one list of sizes (strides) per tensor, every entry an int: all of them checked (None: not checked)
        sizes: Any = [list(x.shape) for x in xs]
        strides: Any = [list(x.stride()) for x in xs]
        guard = TensorGuards(*xs, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
        if guard.check(*xs) is not True:
            return None
    except Exception as e:  # another PyTorch's signature: the Python check alone
        log.debug("no tensor guard (%s: %s)", type(e).__name__, e)
        return None
    return guard.check  # type: ignore[no-any-return]


def _device_getter() -> Callable[[], int]:
    """The index of the current CUDA device, as a cheap callable (the lean path checks it on every call)."""
    import torch

    return getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)  # type: ignore[no-any-return]


def _stream_getter() -> Callable[[int], int]:
    """Triton's own way to read the current CUDA stream (a raw handle) of a device."""
    from triton.runtime import driver

    return driver.active.get_current_stream  # type: ignore[no-any-return]


class CompiledProgram:
    """A μGraph compiled to Triton kernels: call it on torch tensors.

    ``fn(*tensors)`` in the graph's input order, or ``fn(**{name: tensor})``;
    returns one tensor, or a tuple for several outputs. Shapes and dtypes must
    be the graph's exactly; strides are free. Dense tensors only (a sparse or nested one is a clear
    error). The kernels have no backward: the outputs carry no autograd history even where an input
    requires grad (logged once per program as a warning); ``torch.compile(model,
    backend="verimirage")`` compiles a model's backward.

    **Fresh outputs.** Every call returns new tensors: an output that is one of the program's inputs (a μGraph
    ``return %0``, e.g. for ``scale(x, 1.0)``) is a copy, never the caller's tensor object, so that the caller
    mutating its input afterwards does not change the result (as with the source program's ops in eager mode), one
    copy per output (``copy_returned_inputs``; the torch.compile backend's partitions turn it off). A kernel's result
    listed twice (``return %1, %1``) is one tensor returned twice, as a Python function returning ``(y, y)`` would.
    (Under ``cuda_graph=True`` the outputs are the graph's static buffers, see below.)

    **Launch cost.** On a GPU, a call with positional inputs whose signature
    (shapes, dtypes, strides, 16-byte alignment, device) was seen before takes
    the *lean path*: a generated function checks that signature (one C call)
    and launches the already compiled kernels (one C call for all of them,
    :mod:`verimirage.backend.launch`), with one allocation per output and one
    workspace for intermediate values
    (:class:`_LeanPlan`). Any difference falls back to the checked path,
    which raises the clear error for wrong inputs, or compiles and remembers a
    plan for the new signature. In Triton's interpreter every call takes the
    checked path and the generated ``forward``.

    **Output tensors.** ``fn(*tensors, out=t)`` (``out=(t1, t2, ...)`` for
    several outputs) writes the results into the caller's tensors and returns
    ``out``, as PyTorch's ``out=`` arguments do: no allocation per call. They
    must have the outputs' shapes and dtypes and the inputs' device (else the
    clear error); the lean path writes into them directly when they are
    contiguous, 16-byte aligned and overlap no input and no other output,
    otherwise the results are computed into fresh tensors and copied over.
    (If the graph has an input named ``out``, ``out=`` is that input.)

    **CUDA graphs.** ``compile(..., cuda_graph=True)`` returns a program that
    captures its launches into one CUDA graph on the first call and replays it
    afterwards (static shapes): inputs are copied into the graph's static input
    buffers (``static_inputs``; a tensor that *is* the static buffer is not
    copied), and the outputs returned are the graph's static output buffers,
    **overwritten by the next call** (clone them to keep them), as with
    PyTorch's ``torch.cuda.graphs.make_graphed_callables`` / cudagraph trees.
    """

    def __init__(self, ms: ModuleSource, path: Path, module: ModuleType, config: LaunchConfig,
                 per_kernel: Mapping[str, LaunchConfig] | None = None, cuda_graph: bool = False,
                 cooperative: bool = False, mode: Mapping[str, Any] | None = None, tuned: bool = False) -> None:
        from .tuning import launch_mode

        self.source = ms.source
        #: the sha256 of :attr:`source`, the module text written to :attr:`path` and executed (``ms.digest``)
        self.module_digest = ms.digest
        #: the launch mode the module was generated for (:func:`verimirage.backend.tuning.launch_mode`: the options
        #: that differ from the default; ``{}``: the default module)
        self.launch_mode = launch_mode(mode)
        #: whether every kernel has :func:`verimirage.backend.tuning.recommend`'s tiles (no config, profiled selection
        #: or fit), so the module is regenerable from the μGraph and :attr:`launch_mode` alone
        #: (``vm.check_certificate(cert, compiled=program)``)
        self.tuned_tiles = tuned
        self.path = path
        self.module = module
        self.mugraph = ms.mugraph
        self.kernels = ms.kernels
        self.steps = ms.steps
        self.returns = ms.returns
        self.views = ms.views
        #: how many completion counters the last-block-combines launches use (0: none)
        self.n_counters = ms.counters
        self.input_names = ms.input_names
        self.input_types = tuple(t.type for t in ms.mugraph.inputs)
        self.output_types = ms.output_types
        self.config = config
        self.launch: dict[str, dict[str, int]] = {}
        for k in self.kernels:
            c = (per_kernel or {}).get(k.name, config)
            self.launch[k.name] = {"num_warps": c.num_warps, "num_stages": c.num_stages}
            if ms.pdl:
                self.launch[k.name]["launch_pdl"] = True
            if k.persistent and cooperative and not interpreting():
                self.launch[k.name]["launch_cooperative_grid"] = True
        #: the persistent kernels (:func:`persistent_grid`) and their grids on a GPU: each lean plan launches the grid
        #: co-resident for its own compiled kernel, and this holds the least of them; ``forward`` launches it (one
        #: block, always co-resident, until a plan sets it)
        self.persistent = {k.name for k in self.kernels if k.persistent}
        self.grids: dict[str, tuple[int]] = {}
        self._forward = module.forward
        self._dtypes = tuple(_torch_dtype(t) for t in self.input_types)
        #: whether calls may take the lean path (off in the interpreter, or after a plan failed to build)
        self.lean = not interpreting() and bool(self.steps)
        self._plans: dict[tuple[Any, ...], _LeanPlan] = {}
        #: whether an output that is one of the program's inputs is returned as a copy (the default: see "Fresh
        #: outputs" above); the torch.compile backend's partitions return it as is, as the FX graph they replace did
        #: (a constant passed through costs no copy kernel a call). Read when a call's plan is made.
        self.copy_returned_inputs = True
        self._fast: Callable[..., Any] | None = None
        self._fast_out: Callable[..., Any] | None = None
        self._out_kw = "out" not in self.input_names  # whether out= names output tensors (not an input)
        self.cuda_graph = cuda_graph
        self._graph: Any = None
        #: the CUDA graph's input buffers (``cuda_graph=True``, after the first call), in input order
        self.static_inputs: tuple[Any, ...] = ()
        self._static_outputs: tuple[Any, ...] = ()
        self._foreach_copy: Callable[[Sequence[Any], Sequence[Any]], Any] = _copy_each
        #: the input signatures whose kernels are compiled and loaded (:meth:`_first_launch`)
        self._loaded: set[tuple[Any, ...]] = set()
        self._grad_warned = False  # (an input requiring grad was warned about once: no backward here)

    def counters(self, device: Any, stream: int | None = None) -> Any:
        """The int32 completion counters of the last-block-combines and persistent launches on ``device`` for the
        calls on CUDA stream ``stream`` (a raw handle; None: the current stream): the generated module's, allocated
        zeroed on first use and kept (each launch leaves its counters at zero, so every later call on that stream
        finds them so). Each stream has its own, so calls on several streams at once do not count each other's
        blocks; while a CUDA graph is captured, fresh zeroed ones (the graph's own)."""
        return self.module._vm_counters(device, self.n_counters, stream)

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
        for n, t, dt in zip(names, self.input_types, self._dtypes, strict=True):
            x = vals[n]
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"input {n!r}: expected a torch.Tensor, got {type(x).__name__}")
            if x.layout != torch.strided or x.is_nested:  # (their sizes, strides or memory are not a dense tensor's)
                raise TypeError(f"input {n!r}: a {'nested' if x.is_nested else str(x.layout).removeprefix('torch.')} "
                                "tensor; expected a dense (torch.strided) tensor (x.to_dense())")
            if tuple(x.shape) != t.shape:
                raise ValueError(f"input {n!r}: shape {tuple(x.shape)}; expected {t.shape}")
            if x.dtype != dt:
                raise TypeError(f"input {n!r}: dtype {x.dtype}; expected {dt} (no implicit casts)")
            if device is None:
                device = x.device
            elif x.device != device:
                raise ValueError(f"input {n!r}: on {x.device}, but earlier inputs are on {device}")
            if x.requires_grad and torch.is_grad_enabled() and not self._grad_warned:
                # the kernels have no backward: the outputs carry no autograd history, so a loss built on them would
                # silently give no gradient through this program to its inputs
                self._grad_warned = True
                log.warning("compiled program %s: input %r requires grad, but a compiled program has no backward: its "
                            "outputs carry no autograd history (no gradient flows to its inputs); call it under "
                            "torch.no_grad() or on detached tensors, or train with torch.compile(model, "
                            "backend='verimirage'), which compiles the backward too", self.path.name, n)
            if x.is_neg():  # a negative-bit view: its memory holds -x (kernels read memory): materialise x
                x = x.resolve_neg()
            if not x.is_contiguous() and _element_span(x) >= INT32_INDEX:  # a view spanning more than int32 reaches
                x = x.contiguous()
            out.append(x)
        if device is not None:
            if interpreting() and device.type != "cpu":
                raise ValueError(f"inputs are on {device}, but kernels run in Triton's interpreter; pass CPU tensors")
            if not interpreting() and device.type != "cuda":
                raise ValueError(f"inputs are on {device}; compiled Triton kernels need CUDA tensors")
        return out

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not kwargs:
            fast = self._fast
            if fast is not None:
                res = fast(*args)
                if res is not _MISS:
                    return res
        else:
            fast_out = self._fast_out
            if fast_out is not None and len(kwargs) == 1 and self._out_kw and "out" in kwargs:
                res = fast_out(kwargs["out"], *args)  # positional inputs, out=: straight to the lean runner
                if res is not _MISS:
                    return res
            return self._call_kw(args, kwargs)
        if self.cuda_graph:
            return self._call_graph(args, {})
        return self._result(self._launch(self._bind(args, {})))

    def _result(self, outs: Sequence[Any]) -> Any:
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _call_kw(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call with keywords: inputs by name and/or ``out=`` (caller-provided output tensors)."""
        names = self.input_names
        out = kwargs.pop("out", None) if "out" not in names else None
        pos: tuple[Any, ...] | None = args
        if kwargs:  # every input by name: the same call positionally (else the checked path says what is off)
            try:
                pos = tuple(kwargs[n] for n in names) if not args and len(kwargs) == len(names) else None
            except KeyError:
                pos = None
        if out is None:
            if pos is not None and self._fast is not None:
                res = self._fast(*pos)
                if res is not _MISS:
                    return res
            if self.cuda_graph:
                return self._call_graph(args, kwargs)
            return self._result(self._launch(self._bind(args, kwargs)))
        fast_out = self._fast_out
        if pos is not None and fast_out is not None:
            res = fast_out(out, *pos)
            if res is not _MISS:
                return res
        # the checked path: clear errors for wrong inputs or out tensors; else compute and copy into out
        xs = self._bind(args, kwargs)
        outs = self._check_out(out, xs)
        res = self._call_graph(args, kwargs) if self.cuda_graph else self._result(self._launch(xs))
        for o, r in zip(outs, res if isinstance(res, tuple) else (res,), strict=True):
            o.copy_(r)
        return out

    def _check_out(self, out: Any, xs: Sequence[Any]) -> tuple[Any, ...]:
        """The ``out=`` tensors as a tuple, checked against the program's outputs (raises the clear error)."""
        import torch

        n = len(self.output_types)
        if isinstance(out, torch.Tensor):
            outs: tuple[Any, ...] = (out,)
        elif isinstance(out, (tuple, list)):
            outs = tuple(out)
        else:
            raise TypeError(f"out: expected a torch.Tensor or a tuple of {n}; got {type(out).__name__}")
        if len(outs) != n:
            raise TypeError(f"out: {len(outs)} tensor(s); this program has {n} output(s)")
        device = xs[0].device if xs else None
        spans = []
        for i, (o, t) in enumerate(zip(outs, self.output_types, strict=True)):
            if not isinstance(o, torch.Tensor):
                raise TypeError(f"out[{i}]: expected a torch.Tensor, got {type(o).__name__}")
            if tuple(o.shape) != t.shape:
                raise ValueError(f"out[{i}]: shape {tuple(o.shape)}; expected {t.shape}")
            if o.dtype != _torch_dtype(t):
                raise TypeError(f"out[{i}]: dtype {o.dtype}; expected {_torch_dtype(t)} (no implicit casts)")
            if device is not None and o.device != device:
                raise ValueError(f"out[{i}]: on {o.device}, but the inputs are on {device}")
            spans.append(_byte_span(o))
        for i, (a0, a1) in enumerate(spans):
            for j in range(i):
                b0, b1 = spans[j]
                if a0 < b1 and b0 < a1:
                    raise ValueError(f"out[{j}] and out[{i}] overlap in memory; give each output its own tensor")
        return outs

    def _launch(self, xs: list[Any]) -> tuple[Any, ...]:
        """Run the kernels on checked inputs: through a lean plan where possible, else ``forward``."""
        if self.lean and not self._hooks_set():
            cur = _device_getter()()
            key = (cur, *((tuple(x.shape), x.dtype, x.get_device(), tuple(x.stride()), x.data_ptr() % 16 == 0)
                          for x in xs))
            plan = self._plans.get(key)
            if plan is not None:
                res = plan.run(*xs)
                if res is not _MISS:
                    self._remember(plan)
                    return (res,) if len(self.returns) == 1 else tuple(res)
            elif xs and xs[0].get_device() == cur:
                self._first_launch(xs)
                try:
                    plan = _LeanPlan(self, xs)
                except Exception as e:  # an unexpected Triton internals change: keep working, without the lean path
                    log.warning("compiled program %s: no lean launch path (%s: %s); using the generated forward",
                                self.path.name, type(e).__name__, e)
                    self.lean = False
                else:
                    self._plans[key] = plan
                    self._remember(plan)
                    outs = plan.first_outputs
                    plan.first_outputs = ()
                    return tuple(outs)
        self._first_launch(xs)
        self.module.LAUNCH.update({k: dict(v) for k, v in self.launch.items()})
        if self.grids:
            self.module.GRID.update(self.grids)
        outs = tuple(self._forward(*xs))
        if self.copy_returned_inputs and any(r[0] == "in" for r in self.returns):
            outs = tuple(o.clone() if r[0] == "in" else o for o, r in zip(outs, self.returns, strict=True))
        return outs

    def _first_launch(self, xs: list[Any]) -> None:
        """Compile and load every kernel for a call on ``xs`` before its first launch (once per input signature).

        Shared memory is known only once Triton has compiled a kernel: a kernel it refuses for shared memory
        (``OutOfResources``) at more than one pipeline stage is compiled again at one stage fewer, until Triton
        takes it (its warps and tiles kept; each retry logged with the kernel's name and what Triton reported: the
        estimate it was given stages by can be short, e.g. one buffer of a wgmma loop, and a merged launch's members
        share its memory), so every way of running a compiled program gets the retry and keeps the most stages that
        fit. Any other failure, or the same one at one stage, is raised as the launch would."""
        from .precompile import first_calls

        if not xs:
            return
        sig = tuple((x.device, tuple(x.shape), x.dtype, tuple(x.stride()), x.data_ptr() % 16 == 0) for x in xs)
        if sig in self._loaded:
            return
        bufs: dict[int, Any] = {}
        for st, jit, call in first_calls(self, lambda r: value_of(r, xs, bufs, self.views, self.counters), bufs,
                                         xs[0].device):
            cfg = self.launch[st.kernel]
            while True:
                try:
                    _load_kernel(jit, call, st.grid, cfg)
                    break
                except Exception as e:
                    if _layout_pass_failed(e) and cfg.get("num_warps", 4) > 4:
                        log.warning("compiled program %s: kernel %s at %d warps: Triton's layout passes failed (%s); "
                                    "compiled again at %d (stages and tiles kept)", self.path.name, st.kernel,
                                    cfg["num_warps"], str(e)[:80], cfg["num_warps"] // 2)
                        cfg["num_warps"] //= 2
                        continue
                    if not _out_of_shared_memory(e) or cfg.get("num_stages", 1) <= 1:
                        raise
                    log.warning("compiled program %s: kernel %s at %d pipeline stages: %s; compiled again at %d "
                                "(warps and tiles kept)", self.path.name, st.kernel, cfg["num_stages"], e,
                                cfg["num_stages"] - 1)
                    cfg["num_stages"] -= 1
        self._loaded.add(sig)

    def _remember(self, plan: _LeanPlan) -> None:
        """Make ``plan`` the one plain calls try first (not for ``cuda_graph=True``: its calls replay the graph)."""
        if not self.cuda_graph:
            self._fast, self._fast_out = plan.run, plan.run_out

    @staticmethod
    def _hooks_set() -> bool:
        """Whether Triton launch hooks (e.g. its profiler's) are installed: then every launch goes through Triton."""
        from triton import knobs

        return bool(knobs.runtime.launch_enter_hook.calls or knobs.runtime.launch_exit_hook.calls)

    def _call_graph(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """``cuda_graph=True``: copy the inputs into the static buffers and replay the captured graph."""
        statics = self.static_inputs
        if statics and not kwargs and len(args) == len(statics):
            ok = True
            for x, s, dt in zip(args, statics, self._dtypes, strict=True):
                try:
                    if x.shape != s.shape or x.dtype is not dt or x.device != s.device:
                        ok = False
                        break
                except AttributeError:
                    ok = False
                    break
            if ok:
                self._copy_in(args)
                self._graph.replay()
                outs = self._static_outputs
                return outs[0] if len(outs) == 1 else outs
        xs = self._bind(args, kwargs)
        if self._graph is None:
            self._capture(xs)
        elif xs[0].device != statics[0].device:
            raise ValueError(f"inputs are on {xs[0].device}, but this program's CUDA graph was captured on "
                             f"{statics[0].device}")
        self._copy_in(xs)
        self._graph.replay()
        outs = self._static_outputs
        return outs[0] if len(outs) == 1 else outs

    def _copy_in(self, xs: Sequence[Any]) -> None:
        """Copy the inputs that are not the static buffers themselves into them (one foreach copy for several)."""
        dst, src = [], []
        for x, s in zip(xs, self.static_inputs, strict=True):
            if x is not s:
                dst.append(s)
                src.append(x)
        if len(dst) == 1:
            dst[0].copy_(src[0])
        elif dst:
            self._foreach_copy(dst, src)

    def _capture(self, xs: list[Any]) -> None:
        """Capture the launches on static copies of ``xs`` into one CUDA graph (first call of ``cuda_graph=True``)."""
        import torch

        if interpreting():
            raise ValueError("cuda_graph=True needs a CUDA device; kernels run in Triton's interpreter here")
        statics = tuple(torch.empty(x.shape, dtype=x.dtype, device=x.device) for x in xs)
        for s, x in zip(statics, xs, strict=True):
            s.copy_(x)
        side = torch.cuda.Stream(device=xs[0].device)
        side.wait_stream(torch.cuda.current_stream(xs[0].device))
        with torch.cuda.stream(side):  # compile and make the plan outside the capture
            self._launch(list(statics))
        torch.cuda.current_stream(xs[0].device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = self._launch(list(statics))
        self._graph, self.static_inputs, self._static_outputs = graph, statics, tuple(outs)
        self._foreach_copy = getattr(torch, "_foreach_copy_", None) or _copy_each

    def __repr__(self) -> str:
        graph = ", CUDA graph" if self.cuda_graph else ""
        return f"<CompiledProgram {len(self.kernels)} kernel(s){graph} from {self.path}>"


def _load_kernel(jit: Any, call: Sequence[Any], grid: Any, launch: Mapping[str, Any]) -> None:
    """Compile ``jit`` for the arguments ``call`` under ``launch`` (Triton's cache: once) and load it on the current
    device, which raises Triton's ``OutOfResources`` where it needs more shared memory than the device has; nothing
    runs. Nothing to do in Triton's interpreter."""
    if interpreting():
        return
    kern = jit.run(*call, grid=grid, warmup=True, **launch)
    if hasattr(kern, "result"):  # pragma: no cover - only under Triton's async compile mode
        kern = kern.result()
    kern._init_handles()


def _layout_pass_failed(e: BaseException) -> bool:
    """Whether ``e`` is Triton's compiler failing in its MLIR passes (``PassManager::run failed``): Triton 3.6's layout
    pass fails on some layouts at 8 warps that it compiles at 4 (an operand loaded squeezed beside a reshaped one,
    ``codegen.SQUEEZE_BESIDE_RESHAPE``), so fewer warps are tried (the warps change no result)."""
    return isinstance(e, RuntimeError) and "PassManager::run failed" in str(e)


def _out_of_shared_memory(e: BaseException) -> bool:
    """Whether ``e`` is Triton's refusal of a kernel for its shared memory (which fewer pipeline stages lower)."""
    from triton.runtime.errors import OutOfResources

    return isinstance(e, OutOfResources) and e.name == "shared memory"


def _chosen_config(program: Any) -> LaunchConfig | None:
    """The configuration ``profile.select`` measured fastest for this program in this process, if any."""
    from .profile import chosen_config

    return chosen_config(program)


def _fit_kernels(ms: ModuleSource, config: LaunchConfig) -> dict[str, tuple[list[tuple[Any, list[Any], LaunchConfig]],
                                                                               LaunchConfig]]:
    """Launches of ``ms`` whose shared memory under ``config`` exceeds the target's limit: each with its kernels'
    ``(node, operand types, fitted configuration)`` (:func:`verimirage.backend.resources.fit`: fewer stages, then
    16-row dot padding, whose tiles the caller generates again) and the launch's configuration. A merged launch
    (``generate(merge=True)``) holds every member's shared memory side by side: its stages are the most under which
    the members' estimates together fit (:func:`merged_config`). A kernel no configuration fits is left to Triton,
    which reports it."""
    from .resources import ResourceError, fit

    nodes = node_list(ms.mugraph)
    store = arg_storage(ms.mugraph)
    out: dict[str, tuple[list[tuple[Any, list[Any], LaunchConfig]], LaunchConfig]] = {}
    for k in ms.kernels:
        members: list[tuple[Any, list[Any], LaunchConfig]] = []
        for i in k.members or (k.node,):
            n = nodes[i]
            at = [nodes[a].outs[j] for a, j in n.args]
            try:
                c = fit(n.attr("block"), at, config, arg_store=store[i])
            except ResourceError as e:
                log.warning("compile: kernel %s: %s", k.name, e)
                c = config
            members.append((n, at, c))
        launch = members[0][2]
        if len(members) > 1:
            least = min(c.num_stages for _, _, c in members)
            launch = replace(merged_config([replace(c, num_stages=least) for _, _, c in members], (),
                                           [(n.attr("block"), at, store[i]) for (n, at, _), i in
                                            zip(members, k.members, strict=True)]), num_warps=config.num_warps)
        if launch != config or any(c.tiles != config.tiles for _, _, c in members):
            out[k.name] = ([(n, at, replace(c, num_stages=launch.num_stages)) for n, at, c in members], launch)
    return out


def _merge_wanted() -> bool:
    """Whether :func:`compile` runs the kernels that read nothing another writes as one launch (codegen's
    ``merge``): ``VERIMIRAGE_MERGE=1`` in the environment; off by default while it is being measured."""
    return os.environ.get("VERIMIRAGE_MERGE", "").strip().lower() in ("1", "on", "true", "yes")


def merged_config(configs: Sequence[LaunchConfig], blocks: Sequence[int] = (),
                  kernels: Sequence[tuple[Any, Sequence[Any], Sequence[Any] | None]] = (), *,
                  fit_smem: bool = True) -> LaunchConfig:
    """The launch parameters of one launch from its kernels' own (:func:`verimirage.backend.tuning.recommend`'s,
    with ``blocks`` their block counts): the most warps any of them takes, and the pipeline stages of the kernel with
    the most blocks (one launch has one of each), fewer where a kernel's shared memory does not fit under them.
    (The rules give a kernel of at most 66 blocks up to 8 stages; in a launch of more blocks that depth would leave one
    block an SM: the layer's k and v projections of 32 blocks beside the q projection's 128.)

    ``kernels``: each kernel's ``(block graph, operand types, operands' element types in memory or None)``; the
    stages are then those of the kernel with the most blocks among the kernels that run a for-loop (a ``frange``
    above 1, or a one-step product codegen emits as a loop of K chunks, :func:`verimirage.backend.tuning.
    kernel_shape`'s ``chunks``): a kernel without one has no software pipeline, so its stages mean nothing to it
    (H100 2026-11-27 19:06 UTC, benchmarks/results/layer20_h100_2026-11-27/: the decoder layer's bs1 q projection, a
    16-step loop of 128 blocks, merged with the k and v projections' one-step split kernels of 256 blocks each took
    their 2 stages, and the layer ran 199.5 us against 189.9 for a design one launch longer), and, with
    ``fit_smem``, the most under which the kernels' shared memory together fits, each with its own tiles
    (:func:`verimirage.backend.resources.smem_estimate`, summed: Triton allocates every member's buffers in the one
    launch; one stage where none fits, the tiles kept, as ``resources.fit(keep_tiles=True)`` does for one kernel).
    Shared memory does not depend on the warps, so the most warps fit wherever the stages do."""
    from .resources import SM90, smem_estimate
    from .tuning import kernel_shape

    pick: Sequence[int] = range(len(configs))
    if kernels:
        shapes = [kernel_shape(bg, at) for bg, at, _ in kernels]
        pick = [k for k, sh in enumerate(shapes) if sh.frange > 1 or sh.chunks] or pick
    most = max(pick, key=lambda k: (blocks[k] if blocks else 0, -k))
    stages = configs[most].num_stages
    if kernels and fit_smem:  # (one launch holds every member's shared memory side by side: Triton 3.6 gave two
        # merged 64 x 4096 x 4096 products 262,144 bytes at 8 stages, each alone 131,072, sm_90 compile 2026-11-27:
        # the sum must fit)
        def need(s: int) -> int:
            return sum(smem_estimate(bg, at, replace(c, num_stages=s), store)
                       for c, (bg, at, store) in zip(configs, kernels, strict=True))

        stages = next((s for s in range(stages, 0, -1) if need(s) <= SM90.smem_per_block), 1)
    from .tuning import regroups

    warps = max(c.num_warps for c in configs)
    if warps >= 16 and kernels and any(c.num_warps < 16 and regroups(bg)
                                       for c, (bg, _, _) in zip(configs, kernels, strict=True)):
        # a member kept under 16 warps for its regrouped tile (tuning._measured: Triton 3.6 raced on it at 16, wrong
        # results on an H100) is not raised to 16 by the launch it shares (red team 19: persistent launches of the
        # layer's decode_bs1 μGraphs ran six such kernels at 16)
        warps = 8
    return LaunchConfig(warps, stages, configs[0].tiles, tuned=configs[0].tuned)



def _last_block_wanted() -> bool:
    """Whether :func:`compile` runs each split kernel and its combine kernel as one launch, the combine in the last
    block of each group to finish (codegen's ``last_block``): ``VERIMIRAGE_LASTBLOCK=1`` in the environment; off by
    default while it is being measured."""
    return os.environ.get("VERIMIRAGE_LASTBLOCK", "").strip().lower() in ("1", "on", "true", "yes")


def _persistent_wanted() -> str:
    """Whether :func:`compile` runs the whole program as one persistent launch (codegen's ``persistent``): from
    ``VERIMIRAGE_PERSISTENT`` in the environment, "1" (launched as a cooperative grid: the driver refuses a grid
    that cannot be co-resident) or "plain" (an ordinary launch, the grid sized by the occupancy check alone); ""
    (off) otherwise, the default: measured slower than merged launches (BENCHMARKS.md, "A decoder layer")."""
    v = os.environ.get("VERIMIRAGE_PERSISTENT", "").strip().lower()
    if v in ("1", "on", "true", "yes", "coop"):
        return "coop"
    return "plain" if v == "plain" else ""


def _occupancy(kern: Any, device: Any) -> tuple[int, int]:
    """(blocks of compiled kernel ``kern`` that fit one SM at once, the device's SMs): CUDA's occupancy calculator
    (``cuOccupancyMaxActiveBlocksPerMultiprocessor``, from the kernel's registers, shared memory and threads), else
    the same arithmetic from the kernel's resources and the device's limits."""
    import ctypes

    import torch

    props = torch.cuda.get_device_properties(device)
    sms = int(props.multi_processor_count)
    if hasattr(kern, "_init_handles"):
        kern._init_handles()
    warps = int(kern.metadata.num_warps)
    shared = int(kern.metadata.shared)
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        rc = cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(kern.function),
                                                              ctypes.c_int(32 * warps), ctypes.c_size_t(shared))
        if rc == 0:
            return int(n.value), sms
        log.info("persistent kernel: cuOccupancyMaxActiveBlocksPerMultiprocessor returned %d; estimating", rc)
    except (OSError, AttributeError) as e:
        log.info("persistent kernel: no CUDA occupancy calculator (%s); estimating", e)
    regs_warp = -(-max(int(getattr(kern, "n_regs", 255)), 1) * 32 // 256) * 256
    by_regs = (int(getattr(props, "regs_per_multiprocessor", 65536)) // regs_warp) // warps
    smem = int(getattr(props, "shared_memory_per_multiprocessor", 233472))
    by_smem = smem // (shared + 1024) if shared else 32
    by_threads = int(getattr(props, "max_threads_per_multi_processor", 2048)) // (32 * warps)
    return max(0, min(by_regs, by_smem, by_threads, 32)), sms


#: A persistent kernel's pipeline stages are lowered (:func:`persistent_stages`) until at least this many of its blocks
#: fit one SM: the layer's first persistent kernel ran one block an SM (decode_bs1: 16 warps, 4 stages, 120 KB of
#: shared memory for the FFN's gate/up task), every task of every kernel then with one block's loads in flight an SM.
PERSISTENT_MIN_BLOCKS = 2


def persistent_stages(build: Callable[[dict[str, Any]], Any], launch: dict[str, Any], device: Any) -> Any:
    """The compiled persistent kernel ``build(launch)`` (Triton's compiled kernel for launch parameters ``launch``),
    with ``launch["num_stages"]`` lowered one at a time (down to 1; ``launch`` is updated in place) while fewer than
    :data:`PERSISTENT_MIN_BLOCKS` of its blocks fit an SM (:func:`_occupancy`: CUDA's occupancy calculator on the
    compiled kernel's registers and shared memory). One launch has one stage count for every task, and the shared
    memory of the most deeply pipelined task decides how many blocks an SM holds; the stages change no value (the
    same code, its loads' buffering only). Where even one stage leaves too few, and registers are the limit, the
    registers a thread are capped (``launch["maxnreg"]``) at what :data:`PERSISTENT_MIN_BLOCKS` blocks leave each
    thread (kept only if that many then fit; ptxas spills what does not fit: the layer's decode_bs1 with tile waits,
    16 warps, 80 registers -> 64 and 32 bytes of stack)."""
    kern = build(launch)
    while launch.get("num_stages", 1) > 1 and _occupancy(kern, device)[0] < PERSISTENT_MIN_BLOCKS:
        launch["num_stages"] -= 1
        kern = build(launch)
    if _occupancy(kern, device)[0] < PERSISTENT_MIN_BLOCKS and "maxnreg" not in launch:
        # (registers the limit: cap them at what that many blocks leave a thread, in steps of 8; ptxas may spill)
        cap = 65536 // (PERSISTENT_MIN_BLOCKS * 32 * int(launch.get("num_warps", 4))) // 8 * 8
        if cap >= 24:
            capped = build({**launch, "maxnreg": cap})
            if _occupancy(capped, device)[0] >= PERSISTENT_MIN_BLOCKS:
                launch["maxnreg"] = cap
                return capped
    return kern


def _persistent_tiles() -> bool:
    """Whether a persistent kernel's tasks wait for the producer blocks they read rather than whole producer kernels
    (codegen's ``tile_waits``): ``VERIMIRAGE_PERSISTENT_TILES=1``; off by default until measured."""
    return os.environ.get("VERIMIRAGE_PERSISTENT_TILES", "").strip().lower() in ("1", "on", "true", "yes")


def _persistent_warps() -> int | None:
    """``VERIMIRAGE_PERSISTENT_WARPS`` (4, 8 or 16): the warps of a persistent kernel instead of the most any of its
    kernels takes (:func:`merged_config`); None when unset. For measuring the uniform block shape."""
    v = os.environ.get("VERIMIRAGE_PERSISTENT_WARPS", "").strip()
    if not v:
        return None
    if v not in ("1", "2", "4", "8", "16", "32"):
        raise ValueError(f"VERIMIRAGE_PERSISTENT_WARPS={v!r}; expected a power of two from 1 to 32")
    return int(v)


def persistent_grid(kern: Any, tasks: int, device: Any) -> int:
    """The blocks to launch persistent kernel ``kern`` (``tasks`` tasks) with on ``device``: at most one per task and
    no more than can be co-resident (:func:`_occupancy`), since a block may wait for another's task. Raises
    GraphError where not one block fits an SM."""
    per_sm, sms = _occupancy(kern, device)
    if per_sm < 1:
        raise GraphError(f"compile: the persistent kernel ({kern.metadata.num_warps} warps, {kern.n_regs} registers, "
                         f"{kern.metadata.shared} bytes of shared memory) fits no SM; its blocks cannot be co-resident "
                         "(run the program without VERIMIRAGE_PERSISTENT)")
    return max(1, min(tasks, per_sm * sms))


def _pdl_wanted() -> str:
    """How :func:`compile` generates kernels for programmatic dependent launch (codegen's ``pdl``): from
    ``VERIMIRAGE_PDL`` in the environment, "start", "end" or "auto" ("1": "end"); "" (off) otherwise, the default while
    it is being measured (benchmarks/perf/NOTES.md session 13), and always in Triton's interpreter, which has no
    ``griddepcontrol``."""
    v = os.environ.get("VERIMIRAGE_PDL", "").strip().lower()
    v = "end" if v == "1" else v
    return v if v in ("start", "end", "auto") and not interpreting() else ""


def compile(
    program: Any,
    *,
    config: LaunchConfig | None = None,
    per_kernel: Mapping[str, LaunchConfig] | None = None,
    directory: Path | str | None = None,
    cuda_graph: bool = False,
    last_block: bool | None = None,
) -> CompiledProgram:
    """Compile a Candidate (its ``.mugraph``), MuGraph or Graph to a callable on torch tensors.

    ``config`` sets the tile options and launch parameters of every kernel
    (``per_kernel`` overrides the launch parameters by kernel name). Without
    one, the configuration :func:`verimirage.backend.profile.select` found
    fastest for this μGraph in this process is used if there is one, else each
    kernel gets :func:`verimirage.backend.tuning.recommend`'s (measured rules);
    ``LaunchConfig(tuned=True)`` asks for the latter explicitly. A kernel that would need more shared
    memory than the GPU allows under ``config`` gets fewer pipeline stages, then 16-row ``tl.dot`` padding
    (:func:`verimirage.backend.resources.fit`; logged), instead of failing at launch; a kernel
    Triton still refuses for shared memory is compiled again one stage fewer at a time by its first launch
    (:meth:`CompiledProgram._first_launch`).
    ``directory`` is where the generated module is written (default: the
    cache directory, see :mod:`.cache`). ``cuda_graph=True`` captures the
    program's launches into a CUDA graph on the first call and replays it
    afterwards; the outputs it returns are overwritten by the next call (see
    :class:`CompiledProgram`). It needs a CUDA device. ``last_block=True`` runs
    each split reduction's combine kernel inside its split kernel's launch, in
    the last block of each group to finish (one launch instead of two; the two
    launches' results bit for bit in Triton's interpreter and for sum combines on
    an H100, where an online softmax's combine differed by one fp16 unit in a few
    fixed elements, BENCHMARKS.md "Last-block combines"); None:
    ``VERIMIRAGE_LASTBLOCK`` decides (off unless set).

    The program is called as ``fn(*tensors)`` or ``fn(**{name: tensor})``;
    ``fn(*tensors, out=t)`` (a tuple for several outputs) writes the results
    into the caller's tensors instead of allocating them. On a GPU, repeated
    calls with inputs of the same shapes, dtypes, strides and device take a
    lean launch path (a cached signature check, then one C call that launches every kernel);
    wrong inputs still get the clear errors.
    """
    if not isinstance(cuda_graph, bool):
        raise TypeError(f"compile: cuda_graph={cuda_graph!r}; expected True or False")
    if config is not None and not isinstance(config, LaunchConfig):
        raise TypeError(f"compile: config {config!r}; expected a LaunchConfig")
    if config is None:
        config = _chosen_config(program)
    pdl = _pdl_wanted()
    merge = _merge_wanted()
    persistent = _persistent_wanted()
    tiles = bool(persistent) and _persistent_tiles()
    if last_block is None:
        last_block = _last_block_wanted()
    elif not isinstance(last_block, bool):
        raise TypeError(f"compile: last_block={last_block!r}; expected True, False or None")
    # (codegen's options that change the module's text: its launch mode, tuning.MODE_OPTIONS)
    mode: dict[str, Any] = {"pdl": pdl, "merge": merge, "last_block": last_block, "persistent": bool(persistent),
                            "tile_waits": tiles}
    recommended = config is None or config.tuned  # (recommend's tiles: regenerable from the μGraph and mode)
    given, asked = dict(per_kernel or {}), config

    def make(mode: dict[str, Any]) -> tuple[ModuleSource, LaunchConfig, Mapping[str, LaunchConfig]]:
        """The module for ``mode``, the configuration and the per-kernel launch parameters it runs with."""
        cfg, per = asked, given
        if cfg is None or cfg.tuned:
            from . import tuning

            cfg = LaunchConfig(tuned=True)
            # (a merged launch has one num_warps: kernels the rules give different warps stay apart; measured on an
            # H100, benchmarks/perf/NOTES.md session 14: the layer's q projection (4 warps) merged with the k and v
            # projections' broadcast products (16 warps) ran 36.3 us at 16 warps against 26.6 apart)
            ms = tuning.tuned_module(program, mode)
            nodes = node_list(ms.mugraph)
            store = arg_storage(ms.mugraph)
            tuned: dict[str, LaunchConfig] = {}
            for k in ms.kernels:
                members = k.members or (k.node,)
                ats = [[nodes[a].outs[j] for a, j in nodes[i].args] for i in members]
                cs = [tuning.recommend(nodes[i].attr("block"), at) for i, at in zip(members, ats, strict=True)]
                # (the tiles are recommend's, which the certificate's digest vouches for; the stages also fit each
                # kernel's operands' element types in memory: fp32 buffers between kernels double a pipelined tile)
                tuned[k.name] = merged_config(cs, [nodes[i].attr("block").num_blocks for i in members],
                                              [(nodes[i].attr("block"), at, store[i])
                                               for i, at in zip(members, ats, strict=True)])
            if persistent and (w := _persistent_warps()) is not None:
                tuned = {k: replace(c, num_warps=w) for k, c in tuned.items()}
            per = tuned | given
        else:
            ms = generate(program, cfg.tiles, **mode)
            fitted = _fit_kernels(ms, cfg)
            if fitted:  # some launches need less shared memory than cfg gives them: regenerate those
                fixed = {(str(n.attr("block")), tuple(nodes_t)): c
                         for ks, _ in fitted.values() for n, nodes_t, c in ks}
                ms = generate(program, tiles_for=lambda bg, at: fixed.get((str(bg), tuple(at)), cfg).tiles, **mode)
                per = {k: c for k, (_, c) in fitted.items()} | given
        return ms, cfg, per

    ms, config, per_kernel = make(mode)
    per_kernel = _cap_regrouping_warps(ms, config, per_kernel)
    if mode["pdl"] and (hazards := pdl_hazards(ms.source)):
        # (the generated module's own launch order, read from its text: a launch that could read or write out of
        # order under programmatic dependent launch is never run so; launchcheck.pdl_hazards)
        log.warning("compile: the module generated for programmatic dependent launch could read or write out of "
                    "order (%s); generating it without PDL", "; ".join(hazards[:3]))
        mode["pdl"] = ""
        ms, config, per_kernel = make(mode)
        per_kernel = _cap_regrouping_warps(ms, config, per_kernel)
    path = write_module(ms, Path(directory) if directory is not None else None)
    try:
        mod = load_module(path, ms.source)
    except Exception as e:
        raise GraphError(f"compile: the generated module {path} does not import: {e}") from e
    log.debug("compiled %d kernel(s) into %s", len(ms.kernels), path)
    _log_unvouched(ms, path, mode, recommended)
    if cuda_graph and interpreting():
        raise ValueError("compile: cuda_graph=True needs a CUDA device; kernels run in Triton's interpreter here")
    return CompiledProgram(ms, path, mod, config, per_kernel, cuda_graph=cuda_graph, cooperative=persistent == "coop",
                           mode=mode, tuned=recommended)


def _cap_regrouping_warps(ms: ModuleSource, config: LaunchConfig,
                          per_kernel: Mapping[str, LaunchConfig]) -> dict[str, LaunchConfig]:
    """``per_kernel`` with every launch that holds a kernel regrouping a tile (:func:`verimirage.backend.tuning.
    regroups`) at most 8 warps, whatever asked for more: a ``LaunchConfig(num_warps=16)`` given to :func:`compile`,
    a ``per_kernel`` entry, ``VERIMIRAGE_PERSISTENT_WARPS``. Triton 3.6 on sm_90 computes such kernels WRONG at 16
    warps (every run different: ``tuning._measured``), so the request is lowered, with a warning naming the kernels,
    rather than run."""
    from .tuning import regroups

    nodes = node_list(ms.mugraph)
    out = dict(per_kernel)
    lowered = []
    for k in ms.kernels:
        c = out.get(k.name, config)
        if c.num_warps > 8 and any(regroups(nodes[i].attr("block")) for i in k.members or (k.node,)):
            out[k.name] = replace(c, num_warps=8)
            lowered.append(f"{k.name} ({c.num_warps})")
    if lowered:
        log.warning("compile: %s regroup a tile, which Triton 3.6 computes wrong above 8 warps on sm_90; they run at "
                    "8 warps", ", ".join(lowered))
    return out


def _log_unvouched(ms: ModuleSource, path: Path, mode: Mapping[str, Any], tuned: bool) -> None:
    """Say (INFO) when the module ``compile`` wrote is not the one a certificate's ``triton_source_sha256`` records
    (:func:`verimirage.backend.tuning.triton_digest`: recommend's tiles, the default launch mode): a launch mode
    (``VERIMIRAGE_MERGE``, ``VERIMIRAGE_PDL``, ``last_block`` / ``VERIMIRAGE_LASTBLOCK``, ``VERIMIRAGE_PERSISTENT``),
    which ``vm.check_certificate(cert, compiled=prog)`` regenerates and compares, or tiles from a config, a profiled
    selection or a shared-memory fit, which no certificate vouches for."""
    from .tuning import mode_name

    name = mode_name(mode)
    if not tuned:
        log.info("compile: module %s (sha256 %s...) has tiles from a launch config (given, profiled or fitted to "
                 "shared memory), not recommend's: no certificate vouches for this module's text (launch mode %s)",
                 path.name, ms.digest[:16], name)
    elif name != "default":
        log.info("compile: module %s (sha256 %s...) is generated for launch mode %s; a certificate's "
                 "triton_source_sha256 records the default mode's module: vm.check_certificate(cert, compiled=program) "
                 "regenerates this one from the certificate's μGraph and compares", path.name, ms.digest[:16], name)
