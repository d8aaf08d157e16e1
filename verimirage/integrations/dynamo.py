"""``torch.compile(model, backend="verimirage")`` and ``vm.explain``.

Dynamo's graph goes through AOTAutograd, which traces it to ATen ops and
hands over the forward and backward graphs (or one inference graph) of
core ATen ops. On each, :func:`verimirage.integrations.capture.transform`
replaces the regions the registry can express by verified kernels; the rest
goes to the fallback backend: Inductor when the inputs are on a GPU, eager
PyTorch on a CPU (option ``fallback``). Nothing raises on a model: what
cannot be taken is recorded with its reason in a :class:`Report`, logged at
INFO level when the backend compiles and returned by :func:`explain`.

Options (:class:`CaptureOptions`) come from ``torch.compile(model,
backend="verimirage", options={...})`` or from :func:`backend`. The backend is
registered under the entry point group ``torch_dynamo_backends`` (name
``verimirage``) and also on import of this module.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from .aten import Reason
from .capture import (
    CaptureOptions,
    PartitionRunner,
    hold_saved,
    is_compute,
    is_tensor_op,
    op_name,
    saved_constants,
    transform,
)
from .report import OpRecord, Report

log = logging.getLogger(__name__)

_KEEP: list[Any] = []

#: Reports of the most recent compilations by the plain ``backend="verimirage"`` (newest last, at most 16).
REPORTS: list[Report] = []


def _decompositions() -> dict[Any, Any]:
    """ATen ops decomposed before the capture sees them (backward ops the op table writes as simpler ops)."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([aten.native_layer_norm_backward, aten.native_group_norm_backward])


def _capture(gm: fx.GraphModule, opts: CaptureOptions, rep: Report, kind: str, fallback_for: Any = None,
             saved: dict[str, torch.Tensor] | None = None) -> list[PartitionRunner]:
    """:func:`transform`, and on any failure of the capture itself the graph as it was (never an error). ``saved``:
    one AOTAutograd compilation's constants its forward graph makes and saves (:func:`capture.saved_constants`, noted
    from the forward, compiled first), held on its backward's placeholders (:func:`capture.hold_saved`)."""
    import copy

    orig = copy.deepcopy(gm.graph)
    gidx = len(rep.graphs)
    try:
        if saved is not None and kind == "forward":
            saved.update(saved_constants(gm))
        elif saved is not None and kind == "backward":
            hold_saved(gm, saved)
        return transform(gm, opts, rep, kind, fallback_for)
    except Exception as e:
        log.warning("verimirage: the capture of a %s graph failed (%s: %s); the whole graph goes to the fallback",
                    kind, type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
        gm.graph = orig
        gm.recompile()
        reason = f"{Reason.CAPTURE_FAILED.value} ({type(e).__name__}: {str(e)[:200]})"
        if len(rep.graphs) <= gidx:
            rep.new_graph(kind)
        if not any(r.graph == gidx for r in rep.ops):  # it failed before listing the ops: each op says why
            for n in gm.graph.nodes:
                if is_tensor_op(n) and n.target is not operator.getitem:
                    rep.ops.append(OpRecord(gidx, op_name(n), n.name, is_compute(n), None,
                                            Reason.CAPTURE_FAILED.value, reason))
        _drop(rep, gidx, reason)  # nothing of it runs in verimirage kernels: the report says so
        return []


def _drop(rep: Report, gidx: int, reason: str) -> None:
    """Mark every taken partition of graph ``gidx`` as left to the fallback, with ``reason``."""
    for p in rep.partitions:
        if p.graph == gidx and p.taken:
            p.taken, p.reason = False, reason
    rep.notes.append(f"{rep.graphs[gidx]}{gidx}: {reason}")
    log.warning("verimirage: %s graph %d: %s", rep.graphs[gidx], gidx, reason)


def _inputs_like(ex: Sequence[Any]) -> list[Any] | None:
    """Random real inputs like the example inputs ``ex`` (fake or real); None if one is symbolic."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .capture import example_like

    gen = torch.Generator().manual_seed(1)
    out: list[Any] = []
    with unset_fake_temporarily():
        for x in ex:
            if isinstance(x, torch.Tensor):
                try:
                    out.append(example_like(x, gen, x.device))
                except Exception:
                    return None
            elif isinstance(x, (int, float, bool)) and not isinstance(x, (torch.SymInt, torch.SymFloat)):
                out.append(x)
            else:
                return None
    return out


def _faster(captured: Callable[[list[Any]], Any], plain: Callable[[], Callable[[list[Any]], Any]],
            ex: Sequence[Any], rep: Report, gidx: int) -> Callable[[list[Any]], Any]:
    """The captured graph's code, or the fallback's code for the whole graph (``plain()``) when that is faster.

    Both are called boxed (on a list of inputs) and timed on random inputs like ``ex``; a failure of the
    captured code here is a failure of the capture (the fallback's code is returned, with the reason).
    """
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from .capture import time_us

    xs = _inputs_like(ex)
    if xs is None:
        return captured
    dev = next((x.device for x in xs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    try:
        fb = plain()
    except Exception as e:  # nothing to compare with: keep the checked partitions
        log.warning("verimirage: the fallback alone failed to compile a %s graph (%s)", rep.graphs[gidx], e)
        return captured
    with unset_fake_temporarily(), torch.no_grad():
        try:
            t_vm = time_us(captured, xs, dev)
        except Exception as e:
            _drop(rep, gidx, f"compile or launch failed: the captured graph failed on random inputs "
                             f"({type(e).__name__}: {str(e)[:200]})")
            return fb
        t_fb = time_us(fb, xs, dev)
    rep.graph_times.append({"graph": gidx, "kind": rep.graphs[gidx], "captured_us": t_vm, "fallback_us": t_fb})
    if t_vm > t_fb:
        _drop(rep, gidx, f"slower than the fallback: the captured graph ran {t_vm:.1f} us, the fallback's "
                         f"code for the whole graph {t_fb:.1f} us")
        return fb
    return captured


def _boxed(f: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    def run(args: list[Any]) -> Any:
        return f(*args)

    return run


def _fallback(opts: CaptureOptions, example_inputs: Sequence[Any]) -> str:
    if opts.fallback != "auto":
        return opts.fallback
    cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    return "inductor" if cuda else "eager"


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: CaptureOptions | Mapping[str, Any]
                  | None = None, report: Report | None = None) -> Callable[..., Any]:
    """The backend: compile Dynamo's FX graph ``gm`` through AOTAutograd, the capture and the fallback."""
    opts = CaptureOptions.of(options)
    if opts.profile is None:  # on a GPU, what is taken is timed against the fallback (never slower)
        dev = next((x.device for x in example_inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        opts = dataclasses.replace(opts, profile=opts.profiling(dev))
    rep = report if report is not None else Report()
    if report is None:
        REPORTS.append(rep)
        del REPORTS[:-16]
    saved: dict[str, torch.Tensor] = {}  # (this graph's forward's saved constants: _capture)
    if _fallback(opts, example_inputs) == "inductor":
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def partition_fallback(egm: fx.GraphModule, xs: Sequence[Any]) -> Callable[[list[Any]], Any]:
            # what Inductor would run for the partition: its code for the partition's ATen ops alone,
            # compiled like the graph around it (on fake tensors of the compilation's fake mode)
            from torch._guards import TracingContext, detect_fake_mode, tracing

            mode = detect_fake_mode()
            fakes = [mode.from_tensor(x, static_shapes=True) if mode is not None else x for x in xs]
            # a tracing context of its own: the graph's context collects the graph's output strides
            with tracing(TracingContext(mode)), inductor_config.patch(fx_graph_cache=False):
                code = compile_fx_inner(egm, fakes)
            return lambda a: code(list(a))

        def inner(g: fx.GraphModule, ex: Sequence[Any], **kw: Any) -> Any:
            import copy

            kind = "backward" if kw.get("is_backward") else ("inference" if kw.get("is_inference") else "forward")
            orig = copy.deepcopy(g)
            gidx = len(rep.graphs)
            runners = _capture(g, opts, rep, kind, partition_fallback if opts.profile else None, saved)

            def plain() -> Any:
                with inductor_config.patch(fx_graph_cache=False):
                    return compile_fx_inner(orig, ex, **kw)

            plain_strides: list[Any] = []

            def plain_again() -> Any:
                # a second compilation of this graph: the tracing context keeps the output strides of the code
                # AOTAutograd will run, so they are set aside and put back unless the plain code is chosen
                from torch._guards import TracingContext

                tc = TracingContext.try_get()
                strides = getattr(tc, "output_strides", None)
                if strides is None:
                    return plain()
                kept = list(strides)
                strides.clear()
                try:
                    code = plain()
                except BaseException:
                    strides[:] = kept
                    raise
                plain_strides.extend(strides)
                strides[:] = kept
                return code

            if not runners:
                return plain()
            try:
                with inductor_config.patch(fx_graph_cache=False):
                    out: Any = compile_fx_inner(g, ex, **kw)
            except Exception as e:  # never an error: the graph as it was goes to Inductor
                _drop(rep, gidx, f"compile or launch failed: Inductor could not compile the captured graph "
                                 f"({type(e).__name__}: {str(e)[:200]})")
                from torch._guards import TracingContext

                tc = TracingContext.try_get()
                if tc is not None and tc.output_strides:
                    tc.output_strides.clear()  # anything the failed compilation left
                return plain()
            _KEEP.extend(runners)  # the compiled code may not hold the graph module that holds them
            if opts.profile:
                chosen = _faster(out, plain_again, ex, rep, gidx)
                if chosen is not out and plain_strides:  # the plain code runs: its output strides
                    from torch._guards import TracingContext

                    tc = TracingContext.try_get()
                    if tc is not None and tc.output_strides is not None:
                        tc.output_strides[:] = plain_strides
                out = chosen
            return out

        # Inductor's caches are keyed by the graph, not by the inner compiler: a graph Inductor compiled
        # before would be served without the capture ever seeing it
        with functorch_config.patch(enable_autograd_cache=False), inductor_config.patch(fx_graph_cache=False):
            compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
                gm, example_inputs, inner_compile=inner, config_patches={**opts.inductor, "fx_graph_cache": False})
        return compiled

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable[..., Any]:
        def comp(g: fx.GraphModule, ex: Sequence[Any]) -> Any:
            import copy

            orig = copy.deepcopy(g) if opts.profile else g
            gidx = len(rep.graphs)
            runners = _capture(g, opts, rep, kind, saved=saved)
            run = _boxed(g.forward)
            if runners and opts.profile:
                run = _faster(run, lambda: _boxed(orig.forward), ex, rep, gidx)
            fn = make_boxed_func(lambda *a: run(list(a)))
            fn._verimirage_runners = runners  # alive as long as the compiled function
            return fn

        return comp

    aot = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                       inference_compiler=compiler("inference"), decompositions=_decompositions())
    return aot(gm, example_inputs)


#: torch.compile modes this backend accepts; those with CUDA graphs replay each partition as one graph
_MODES = {None: False, "default": False, "reduce-overhead": True, "max-autotune": True,
          "max-autotune-no-cudagraphs": False}


def verimirage_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
                       options: CaptureOptions | Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """TorchDynamo backend ``"verimirage"`` (``torch.compile(model, backend="verimirage", options={...})``).

    ``mode="max-autotune"`` (with or without CUDA graphs) also gives the Inductor fallback
    ``max_autotune=True``, so partitions are compared with (and fall back to) max-autotune's code.
    ``mode="reduce-overhead"`` (or ``"max-autotune"``) compiles each partition with
    ``vm.compile(..., cuda_graph=True)``: its kernels are replayed as one CUDA graph and its outputs are
    copied out of the graph's buffers, so nothing the model returns is overwritten by a later call.
    Without a GPU (Triton's interpreter) the partitions run without graphs.
    """
    if mode not in _MODES:
        raise ValueError(f"verimirage backend: mode={mode!r}; expected one of {sorted(m for m in _MODES if m)}")
    opts = CaptureOptions.of(options)
    if mode in ("max-autotune", "max-autotune-no-cudagraphs") and "max_autotune" not in opts.inductor:
        opts = dataclasses.replace(opts, inductor={**opts.inductor, "max_autotune": True})
    if _MODES[mode] and not opts.cuda_graph:
        from ..backend.runtime import ensure_mode

        if not ensure_mode():
            opts = dataclasses.replace(opts, cuda_graph=True)
    return compile_graph(gm, example_inputs, options=opts)


def backend(*, report: Report | None = None, **options: Any) -> Callable[..., Any]:
    """A backend with these :class:`CaptureOptions` (e.g. ``torch.compile(m, backend=backend(fallback="eager"))``)."""
    opts = CaptureOptions.of(options)

    def be(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_graph(gm, example_inputs, options=opts, report=report)

    return be


def explain(model: Any, *example_inputs: Any, backward: bool | None = None, **options: Any) -> Report:
    """Compile ``model`` with the verimirage backend, run it on ``example_inputs``, and report what was taken.

    ``backward``: also run a backward pass (default: when grad is enabled and an output requires grad),
    so the backward graph is captured too. ``options``: :class:`CaptureOptions`. Returns a
    :class:`Report` (``.coverage``, ``.partitions``, ``.left``; ``print(report)`` for a table).
    """
    rep = Report()
    compiled = torch.compile(model, backend=backend(report=rep, **options))
    out = compiled(*example_inputs)
    from torch.utils._pytree import tree_leaves

    outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]  # dicts, nested tuples, dataclasses
    grads = [o for o in outs if o.requires_grad]
    if backward is None:
        backward = torch.is_grad_enabled() and bool(grads)
    if backward and grads:
        torch.autograd.backward([o.sum() for o in grads])
    log.info("verimirage explain: %s", rep.summary())
    return rep


def register() -> None:
    """Make ``backend="verimirage"`` available to torch.compile (the entry point does this too)."""
    from torch._dynamo import list_backends, register_backend

    if "verimirage" not in list_backends(exclude_tags=()):
        register_backend(name="verimirage")(verimirage_backend)


register()

__all__ = ["REPORTS", "CaptureOptions", "Report", "backend", "compile_graph", "explain", "register",
           "verimirage_backend"]
