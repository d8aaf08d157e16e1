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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx as fx

from .capture import CaptureOptions, PartitionRunner, transform
from .report import Report

log = logging.getLogger(__name__)

_KEEP: list[Any] = []

#: Reports of the most recent compilations by the plain ``backend="verimirage"`` (newest last, at most 16).
REPORTS: list[Report] = []


def _decompositions() -> dict[Any, Any]:
    """ATen ops decomposed before the capture sees them (backward ops the op table writes as simpler ops)."""
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    return get_decompositions([aten.native_layer_norm_backward])


def _capture(gm: fx.GraphModule, opts: CaptureOptions, rep: Report, kind: str) -> list[PartitionRunner]:
    """:func:`transform`, and on any failure of the capture itself the graph as it was (never an error)."""
    import copy

    orig = copy.deepcopy(gm.graph)
    try:
        return transform(gm, opts, rep, kind)
    except Exception as e:
        log.warning("verimirage: the capture of a %s graph failed (%s: %s); the whole graph goes to the fallback",
                    kind, type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
        gm.graph = orig
        gm.recompile()
        return []


def _fallback(opts: CaptureOptions, example_inputs: Sequence[Any]) -> str:
    if opts.fallback != "auto":
        return opts.fallback
    cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    return "inductor" if cuda else "eager"


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: CaptureOptions | Mapping[str, Any]
                  | None = None, report: Report | None = None) -> Callable[..., Any]:
    """The backend: compile Dynamo's FX graph ``gm`` through AOTAutograd, the capture and the fallback."""
    opts = CaptureOptions.of(options)
    rep = report if report is not None else Report()
    if report is None:
        REPORTS.append(rep)
        del REPORTS[:-16]
    if _fallback(opts, example_inputs) == "inductor":
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(g: fx.GraphModule, ex: Sequence[Any], **kw: Any) -> Any:
            kind = "backward" if kw.get("is_backward") else ("inference" if kw.get("is_inference") else "forward")
            runners = _capture(g, opts, rep, kind)
            with inductor_config.patch(fx_graph_cache=False):
                out = compile_fx_inner(g, ex, **kw)
            _KEEP.extend(runners)  # the compiled code may not hold the graph module that holds them
            return out

        # Inductor's caches are keyed by the graph, not by the inner compiler: a graph Inductor compiled
        # before would be served without the capture ever seeing it
        with functorch_config.patch(enable_autograd_cache=False), inductor_config.patch(fx_graph_cache=False):
            compiled: Callable[..., Any] = compile_fx(  # type: ignore[assignment]
                gm, example_inputs, inner_compile=inner, config_patches={"fx_graph_cache": False})
        return compiled

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind: str) -> Callable[..., Any]:
        def comp(g: fx.GraphModule, ex: Sequence[Any]) -> Any:
            runners = _capture(g, opts, rep, kind)
            fn = make_boxed_func(g.forward)
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

    ``mode="reduce-overhead"`` (or ``"max-autotune"``) compiles each partition with
    ``vm.compile(..., cuda_graph=True)``: its kernels are replayed as one CUDA graph and its outputs are
    copied out of the graph's buffers, so nothing the model returns is overwritten by a later call.
    Without a GPU (Triton's interpreter) the partitions run without graphs.
    """
    if mode not in _MODES:
        raise ValueError(f"verimirage backend: mode={mode!r}; expected one of {sorted(m for m in _MODES if m)}")
    opts = CaptureOptions.of(options)
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
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)]
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
