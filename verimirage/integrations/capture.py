"""ATen-level capture: lift registry-expressible regions of an ATen graph into verified kernels.

:func:`transform` takes one ATen graph (a forward, backward or inference
graph from AOTAutograd), finds the nodes the op table
(:mod:`verimirage.integrations.aten`) can lift, groups them into partitions
(:class:`~torch.fx.passes.infra.partitioner.CapabilityBasedPartitioner`),
lifts each partition into a ``vm.Graph``, superoptimizes and compiles it,
checks the kernels once on random inputs against the partition's ATen ops,
and replaces the partition by one call to the custom op ``verimirage::run``.
Everything else stays in the graph for the fallback backend. Nothing here
raises on a model: a node or partition that cannot be taken is left in place
and recorded in the :class:`~verimirage.integrations.report.Report` with its
reason; a partition whose kernels fail at their first real call falls back to
its ATen ops for good (recorded too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import operator
import os
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch.fx.passes.operator_support import OperatorSupportBase

from ..ir.dtypes import DType
from ..ir.errors import GraphError
from ..ir.graph import Graph
from .aten import (
    COMPLEX_OPS,
    COMPLEX_VIEWS,
    CREATION_OPS,
    FILL_READERS,
    HANDLERS,
    HELD,
    INDEX_OPERANDS,
    LV,
    NEGATED_READERS,
    SPECIAL_VALUES_OWN,
    VIEW_OPS,
    Ctx,
    Reason,
    Unsupported,
    constant_value,
    index_bounds,
    negated_floats,
    reads_negated,
    unread_args,
    vm_dtype,
)
from .report import OpRecord, PartitionReport, Report

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureOptions:
    """Options of the ``verimirage`` torch.compile backend and of :func:`verimirage.explain`.

    ``fallback``: ``"auto"`` (Inductor when the inputs are on a GPU, else eager), ``"inductor"`` or
    ``"eager"``. ``time_budget_s``: search time per partition. ``search``: further keyword options of
    :func:`verimirage.superoptimize`. ``check``: run each partition's kernels once on random inputs
    against its ATen ops before taking it. ``profile``: time each partition's kernels against what the
    fallback runs for it (Inductor's code for the partition when the fallback is Inductor, its ATen ops
    when eager) and keep the faster; then time each whole captured graph against the graph compiled by
    the fallback alone and keep the faster (so the backend is never slower than the fallback on the
    example inputs' shapes). Timed on the GPU with CUDA-graph replays (``triton.testing.do_bench_cudagraph``);
    on a CPU with a wall clock (where Triton's interpreter always loses). ``None`` (the default): on where the
    graph's tensors are on a GPU, off on a CPU (:meth:`profiling`), so a model wrapped on a GPU is never slower
    than its fallback on the example inputs' shapes. ``min_compute_ops``: smaller partitions stay with the
    fallback. ``cuda_graph``: replay each partition's kernels as one CUDA graph (outputs copied out).
    ``chain_limit``: a partition holds a matmul ``D`` that consumes (through other ops) the result of a matmul
    ``U`` of the same partition only when ``U``'s reduction and ``D``'s output columns are both at most this
    wide (attention: ``softmax(Q K^T) V`` with head dims of 64-256); otherwise the partition is cut before
    ``D`` (an MLP's up and down projections: one fused kernel would recompute ``U`` for every column tile of
    ``D`` or hold ``D``'s whole rows). ``None``: never cut. ``inductor``: Inductor config patches for the
    Inductor fallback (``{"max_autotune": True}``: compare with and fall back to max-autotune's code).
    ``compile_workers``: threads compiling one partition's kernels at once on a GPU (1: one after another).
    ``candidates``: with ``profile``, how many of the search's verified candidates (the best by the
    cost model, then its siblings) are compiled, checked and timed; the fastest is kept (1: the best only).
    """

    fallback: str = "auto"
    time_budget_s: float = 30.0
    search: Mapping[str, Any] = field(default_factory=dict)
    check: bool = True
    profile: bool | None = None
    min_compute_ops: int = 1
    cuda_graph: bool = False
    chain_limit: int | None = 256
    inductor: Mapping[str, Any] = field(default_factory=dict)
    compile_workers: int = 8
    candidates: int = 4

    def profiling(self, device: torch.device | str) -> bool:
        """Whether partitions and graphs on ``device`` are timed against the fallback (``profile``, or with
        ``profile=None`` whether ``device`` is a GPU)."""
        if self.profile is not None:
            return bool(self.profile)
        return torch.device(device).type == "cuda"

    def __post_init__(self) -> None:
        if self.profile is not None and not isinstance(self.profile, bool):
            raise ValueError(f"profile={self.profile!r}; expected None (on a GPU only), True or False")
        if self.fallback not in ("auto", "inductor", "eager"):
            raise ValueError(f"fallback={self.fallback!r}; expected 'auto', 'inductor' or 'eager'")
        if not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s={self.time_budget_s!r}; expected > 0")
        if self.chain_limit is not None and not (isinstance(self.chain_limit, int) and self.chain_limit >= 1):
            raise ValueError(f"chain_limit={self.chain_limit!r}; expected None or an int >= 1")
        if not (isinstance(self.compile_workers, int) and self.compile_workers >= 1):
            raise ValueError(f"compile_workers={self.compile_workers!r}; expected an int >= 1")
        if not (isinstance(self.candidates, int) and self.candidates >= 1):
            raise ValueError(f"candidates={self.candidates!r}; expected an int >= 1")

    @classmethod
    def of(cls, options: CaptureOptions | Mapping[str, Any] | None) -> CaptureOptions:
        """Options from an instance, a dict (``torch.compile(..., options={...})``) or None."""
        if options is None:
            return cls()
        if isinstance(options, CaptureOptions):
            return options
        known = set(cls.__dataclass_fields__)
        given = dict(options.items())
        bad = sorted(set(given) - known)
        if bad:
            raise ValueError(f"verimirage backend: unknown option(s) {bad}; expected some of {sorted(known)}")
        return cls(**given)


# --------------------------------------------------------------------------- node facts


def op_name(n: fx.Node) -> str:
    """The ATen op name of a node (overload packet name: ``addmm``, ``_softmax``...)."""
    t = n.target
    if t is operator.getitem:
        return "getitem"
    name = getattr(t, "__name__", str(t))
    packet = getattr(t, "_overloadpacket", None)
    if packet is not None:
        name = getattr(packet, "__name__", name)
    return str(name).split(".")[0]


def _vals(n: fx.Node) -> list[Any]:
    v = n.meta.get("val")
    return list(v) if isinstance(v, (list, tuple)) else [v]


def is_tensor_op(n: fx.Node) -> bool:
    """A call producing at least one tensor (what coverage counts)."""
    return n.op == "call_function" and any(isinstance(v, torch.Tensor) for v in _vals(n))


#: ATen ops that allocate without computing anything (what coverage does not count)
ALLOC_OPS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})


def is_compute(n: fx.Node) -> bool:
    """A tensor op that computes (not a view, alias, tuple access or uninitialised allocation)."""
    return is_tensor_op(n) and op_name(n) not in VIEW_OPS and op_name(n) not in ALLOC_OPS


def _static_shape(t: torch.Tensor) -> tuple[int, ...]:
    shape = []
    for s in t.shape:
        if not isinstance(s, int):
            raise Unsupported(Reason.DYNAMIC_SHAPE, f"dynamic shape {tuple(t.shape)}")
        shape.append(s)
    return tuple(shape)


def _out_meta(n: fx.Node) -> Any:
    v = n.meta.get("val")
    if isinstance(v, torch.Tensor):
        return (_static_shape(v), v.dtype)
    if isinstance(v, (list, tuple)):
        return [(_static_shape(x), x.dtype) if isinstance(x, torch.Tensor) else None for x in v]
    raise Unsupported(Reason.NOT_TENSOR, f"{n.name} has no tensor result")


#: the largest constant (in elements) the capture computes while lifting (:func:`foldable`)
FOLD_MAX = 1 << 20


def foldable(n: fx.Node) -> bool:
    """Whether the capture may compute fx node ``n`` while lifting once every tensor it reads is such a constant
    (a causal or sliding-window mask, a rotary table made in the forward): an ATen op that makes a tensor (or reads
    tensors), deterministic, writing no operand, with a static result of at most :data:`FOLD_MAX` elements. Its
    readers in the partition get the value as a constant input."""
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload) or op_name(n) in ALLOC_OPS:
        return False
    if torch.Tag.nondeterministic_seeded in t.tags or t._schema.is_mutable:
        return False
    v = n.meta.get("val")
    if not isinstance(v, torch.Tensor) or not all(isinstance(d, int) for d in v.shape) or v.numel() > FOLD_MAX:
        return False
    leaves = [*n.args, *n.kwargs.values()]
    leaves += [x for a in leaves if isinstance(a, (list, tuple)) for x in a]
    if any(isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)) for a in leaves):
        return False
    return bool(n.all_input_nodes) or op_name(n) in CREATION_OPS




def _known(a: fx.Node, folded: Mapping[fx.Node, torch.Tensor] | set[fx.Node]) -> bool:
    return a in folded or HELD in a.meta


def constant_nodes(nodes: Sequence[fx.Node]) -> set[fx.Node]:
    """The nodes of ``nodes`` (in graph order) that :func:`foldable` makes constants: each reads only such nodes
    (or tensors the graph holds, :data:`HELD`)."""
    out: set[fx.Node] = set()
    for n in nodes:
        if foldable(n) and all(_known(a, out) for a in n.all_input_nodes):
            out.add(n)
    return out


def hold_constants(gm: fx.GraphModule) -> None:
    """Note in each ``get_attr`` node's meta (:data:`HELD`) the small tensor it reads (a constant the traced graph
    holds), so that the ops reading it can be computed while lifting."""
    from torch._subclasses.fake_tensor import FakeTensor

    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v: Any = gm
            for part in str(n.target).split("."):
                v = getattr(v, part, None)
            if isinstance(v, torch.Tensor) and not isinstance(v, (torch.nn.Parameter, FakeTensor)) \
                    and v.numel() <= FOLD_MAX:
                n.meta[HELD] = v  # (read, never written: the ops computed from it make new tensors)


def saved_constants(gm: fx.GraphModule) -> dict[str, torch.Tensor]:
    """The outputs of forward graph ``gm`` that are integer or boolean constants it makes (:func:`constant_nodes`:
    T5's relative position buckets, computed from positions alone; exact on any device, unlike a float folded on the
    CPU), by node name: AOTAutograd saves them for the backward, whose placeholders are named as the forward's outputs
    they stand for (:func:`hold_saved`)."""
    hold_constants(gm)
    folded: dict[fx.Node, torch.Tensor] = {}
    for n in gm.graph.nodes:
        if foldable(n) and all(_known(a, folded) for a in n.all_input_nodes) and (c := _fold(n, folded)) is not None:
            folded[n] = c
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return {a.name: folded[a] for a in outs if isinstance(a, fx.Node) and a in folded
            and not (folded[a].is_floating_point() or folded[a].is_complex())}


def hold_saved(gm: fx.GraphModule, saved: Mapping[str, torch.Tensor]) -> None:
    """Hold (:data:`HELD`) on each placeholder of backward graph ``gm`` the constant its forward saved under the
    placeholder's name (:func:`saved_constants`; of the same shape and dtype), so that the ops reading it (an
    embedding's gradient at saved buckets) are lifted as they are in the forward."""
    for n in gm.graph.nodes:
        v, c = n.meta.get("val"), saved.get(n.name)
        if n.op == "placeholder" and c is not None and isinstance(v, torch.Tensor) and v.shape == c.shape \
                and v.dtype == c.dtype:
            n.meta[HELD] = c


def _fold(n: fx.Node, folded: Mapping[fx.Node, torch.Tensor]) -> torch.Tensor | None:
    """fx node ``n``'s value computed by its ATen op on the CPU from the constants it reads (None if that fails)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    def real(a: Any) -> Any:
        return (folded[a] if a in folded else a.meta[HELD]) if isinstance(a, fx.Node) else a

    kwargs = {k: fx.node.map_aggregate(a, real) for k, a in n.kwargs.items() if k not in ("device", "pin_memory")}
    v = n.meta["val"]
    try:
        with unset_fake_temporarily():
            r = n.target(*fx.node.map_aggregate(n.args, real), **kwargs)  # type: ignore[operator]
    except Exception:  # e.g. an op that wants its device: it is lifted (or left) as it is
        log.debug("computing %s while lifting failed", n.format_node(), exc_info=True)
        return None
    if not isinstance(r, torch.Tensor) or tuple(r.shape) != tuple(v.shape) or r.dtype != v.dtype:
        return None
    return r


# --------------------------------------------------------------------------- lifting


class LiftError(Exception):
    """Lifting failed at ``node``."""

    def __init__(self, node: fx.Node, reason: Reason, message: str, *, alone: bool = False) -> None:
        super().__init__(message)
        self.node, self.reason, self.message = node, reason, message
        #: the failure comes from where the partition ends (a mask leaving it), not from the node itself
        self.alone = alone


@dataclass
class Lifted:
    """A partition as a ``vm.Graph``: its inputs (fx nodes), outputs, and how graph outputs map back."""

    graph: Graph
    nodes: list[fx.Node]
    inputs: list[fx.Node]
    outputs: list[fx.Node]
    #: per partition output: ("out", index into graph outputs), ("in", index into inputs) or ("const", index into
    #: const_outs), ATen shape, bcast
    out_map: list[tuple[str, int, tuple[int, ...], bool]]
    out_meta: list[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]]]
    consts: list[tuple[str, torch.Tensor]]
    #: inputs that are integer tensors in ATen (class indices, :data:`INDEX_OPERANDS`, or integers the partition
    #: only converts to a float): the graph's float input (float32 for indices), which the runner makes from them
    int_inputs: frozenset[int] = frozenset()
    #: per use of an index input: (input position, classes, ignore): a valid index is in ``[0, classes)`` or equals
    #: ``ignore`` (:func:`~verimirage.integrations.aten.index_bounds`); the runner checks them on entry, as ATen does
    index_bounds: tuple[tuple[int, int, int | None], ...] = ()
    #: tensors the ATen ops read but the kernels do not (arguments a handler leaves unread: a shape-only input, SDPA's
    #: RNG state): passed after ``inputs`` to the partition, for its ATen ops (the check, the fallback) only
    extra: tuple[fx.Node, ...] = ()
    #: complex64 inputs: the graph's input is their real view (``torch.view_as_real``), which the runner makes
    complex_inputs: frozenset[int] = frozenset()
    #: the values of ("const", i) outputs: constants computed while lifting that are read outside the partition too
    const_outs: list[torch.Tensor] = field(default_factory=list)


def lift(nodes: Sequence[fx.Node], *, strict: bool = False) -> Lifted:
    """Lift ``nodes`` (a partition, in graph order) into a ``vm.Graph``; LiftError names the node that failed.

    ``strict``: no registry layout ops (views the kernels cannot express become boundaries).
    """
    g = Graph()
    ctx = Ctx(g)
    ctx.strict = strict
    env: dict[fx.Node, Any] = ctx.env
    inputs: list[fx.Node] = []
    inside = set(nodes)
    input_ref: dict[Any, int] = {}
    input_pos: dict[fx.Node, int] = {}
    int_inputs: set[int] = set()
    bounds: list[tuple[int, int, int | None]] = []
    extra: list[fx.Node] = []
    int_uses: dict[fx.Node, torch.dtype] = {}  # integer input -> the float dtype its readers take it as
    complex_inputs: set[int] = set()
    folded: dict[fx.Node, torch.Tensor] = ctx.folded  # constants computed while lifting (foldable)

    def val(a: Any, user: fx.Node) -> Any:
        if isinstance(a, fx.Node) and a in folded and a not in env:
            r = constant_value(ctx, folded[a], a, user)
            if r.fill is None:
                env[a] = r
            return r
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            pos = INDEX_OPERANDS.get(op_name(user))
            index = (pos is not None and len(user.args) > pos and user.args[pos] is a and isinstance(v, torch.Tensor)
                     and v.dtype in (torch.int64, torch.int32))
            use = torch.float32 if index else _int_use(a, user)
            if index:  # checked on entry by the runner (ATen raises for an index out of range, the mask gives 0)
                b = index_bounds(op_name(user), user.args)
                if b is None or (a in env and a not in input_pos):
                    raise LiftError(user, Reason.LAYOUT, f"index operand {a.name}: its range cannot be checked")
                bounds.append((input_pos.get(a, len(inputs)), *b))
            if a in int_uses and use != int_uses[a]:
                raise LiftError(user, Reason.DTYPE, f"operand {a.name}: an integer tensor read as such (only its "
                                                    "conversion to a float, its equality with a constant or its "
                                                    "use as a class index enter the kernels)")
            if a in env:
                return env[a]
            if not isinstance(v, torch.Tensor):
                raise LiftError(user, Reason.NOT_TENSOR, f"operand {a.name} is not a tensor")
            try:
                shape = _static_shape(v)
                if v.dtype == torch.complex64:  # held as its real view, made by the runner on entry
                    complex_inputs.add(len(inputs))
                    shape = (*shape, 2)
                dt = DType.float32 if v.dtype == torch.complex64 else vm_dtype(use if use is not None else v.dtype)
            except Unsupported as e:
                raise LiftError(user, e.reason, f"operand {a.name}: {e}") from None
            if use is not None:
                # an integer (or boolean) tensor converted to a float, compared with a constant, or class indices
                # (read only through an equality mask, aten._one_hot): converted on entry by the runner
                int_uses[a] = use
                int_inputs.add(len(inputs))
            # a rank-0 tensor (Inductor's ``full([], 0.0)`` in ReLU's gradient) is a (1,) input standing for shape ()
            t = g.input(f"in{len(inputs)}", shape or (1,), dt)
            input_ref[t.ref] = len(inputs)
            input_pos[a] = len(inputs)
            inputs.append(a)
            env[a] = LV(t, shape, cplx=len(inputs) - 1 in complex_inputs, integral=use == torch.float32,
                        mask=use == torch.float32 and v.dtype == torch.bool and op_name(user) in _BOOL_COUNTS)
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(val(x, user) for x in a)
        if isinstance(a, (torch.SymInt, torch.SymFloat)):
            raise LiftError(user, Reason.DYNAMIC_SHAPE, f"symbolic value {a}")
        return a

    for n in nodes:
        if foldable(n) and all(_known(a, folded) for a in n.all_input_nodes):
            c = _fold(n, folded)
            if c is not None:
                folded[n] = c
                # (a tensor the graph holds is read by the partition's ATen ops, the check and the fallback)
                extra.extend(a for a in n.all_input_nodes if a not in folded and a not in extra)
                continue
        try:
            if n.target is operator.getitem:
                srcn, idx = n.args[0], n.args[1]
                src = val(srcn, n)
                r = src[idx] if isinstance(src, (list, tuple)) and isinstance(idx, int) else None
                if r is None and isinstance(src, (list, tuple)) and not n.users:
                    continue  # an unused result the lifting did not make (max.dim's indices)
                if not isinstance(r, LV):
                    what = op_name(srcn) if isinstance(srcn, fx.Node) else str(srcn)
                    raise Unsupported(Reason.LAYOUT, f"result {idx} of {what} is not lifted (saved statistics)")
                env[n] = r
                continue
            name = op_name(n)
            h = HANDLERS.get(name)
            if h is None or n.op != "call_function":
                raise Unsupported(Reason.NOT_IN_REGISTRY, f"no lifting for aten.{name}")
            ctx.node = n
            if getattr(h, "refuses", False):  # an op the registry cannot express: say why before anything else
                h(ctx, [], {}, None)
            out = _out_meta(n)
            skip = unread_args(name, n.args)
            args = [a if i in skip else val(a, n) for i, a in enumerate(n.args)]
            extra.extend(a for i, a in enumerate(n.args) if i in skip and isinstance(a, fx.Node) and a not in inside
                         and isinstance(a.meta.get("val"), torch.Tensor) and a not in extra)
            kwargs = {k: val(a, n) for k, a in n.kwargs.items()}
            if not reads_negated(name, args, kwargs):  # ~m read as numbers (or not as a mask): its 0/1 floats
                pos = NEGATED_READERS.get(name)
                args = [negated_floats(ctx, a) if isinstance(a, LV) and a.negated and i != pos else a
                        for i, a in enumerate(args)]
                kwargs = {k: negated_floats(ctx, a) if isinstance(a, LV) and a.negated else a
                          for k, a in kwargs.items()}
            if any(isinstance(a, LV) and a.fill is not None for a in (*args, *kwargs.values())) \
                    and name not in FILL_READERS:
                raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} of a value holding -inf (held as the lowest "
                                                          "finite value, which only a softmax reads as -inf)")
            if any(isinstance(a, LV) for a in kwargs.values()) and name not in ("where",) and not name.startswith(
                "_scaled_dot"
            ) and name != "scaled_dot_product_attention":
                raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name} with tensor keyword arguments")
            if (kwargs.get("device") is not None or kwargs.get("layout") is not None) and name not in CREATION_OPS:
                vdev = n.args[0].meta.get("val") if isinstance(n.args[0], fx.Node) else None
                if not isinstance(vdev, torch.Tensor) or torch.device(kwargs.get("device") or vdev.device) != \
                        vdev.device:
                    raise Unsupported(Reason.LAYOUT, f"aten.{name} moves data to another device")
            ctx.node = n
            first = out[0] if isinstance(out, list) else out
            ctx.out_dtype = None
            if first is not None and first[1].is_floating_point:
                with contextlib.suppress(Unsupported):
                    ctx.out_dtype = vm_dtype(first[1])
            cview = False
            if any(isinstance(a, LV) and a.cplx for a in (*args, *kwargs.values())):
                if name in COMPLEX_VIEWS and isinstance(out, tuple):  # the view of the real view, the 2 kept last
                    out, cview = ((*out[0], 2), torch.float32), True
                elif name not in COMPLEX_OPS:
                    raise Unsupported(Reason.DTYPE, f"aten.{name} of a complex tensor")
            res = h(ctx, args, kwargs, out)
            if cview and isinstance(res, LV):
                res = dataclasses.replace(res, cplx=True)
            _check_result(name, res, out)
            env[n] = res
        except LiftError:
            raise
        except Unsupported as e:
            blame = e.blame if e.blame in inside else n
            raise LiftError(blame, e.reason, str(e)) from None
        except GraphError as e:
            raise LiftError(n, Reason.LAYOUT if "shape" in str(e) else Reason.NOT_IN_REGISTRY, str(e)) from None
        except Exception as e:  # a handler bug must not break the model: the node stays with the fallback
            log.debug("lifting %s failed", n.format_node(), exc_info=True)
            raise LiftError(n, Reason.NOT_IN_REGISTRY, f"{type(e).__name__}: {e}") from None
    outputs = [n for n in nodes if any(u not in inside for u in n.users)]
    _check_aliases(outputs, inside)
    out_map: list[tuple[str, int, tuple[int, ...], bool]] = []
    out_meta: list[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]]] = []
    gouts: list[Any] = []
    const_outs: list[torch.Tensor] = []
    seen: dict[Any, int] = {}
    for n in outputs:
        if n in folded:  # a constant read outside too (a mask the backward reads): the runner returns its value
            mv = n.meta["val"]
            out_meta.append((tuple(int(s) for s in mv.shape), mv.dtype, tuple(int(s) for s in mv.stride())))
            out_map.append(("const", len(const_outs), tuple(mv.shape), False))
            const_outs.append(folded[n])
            continue
        v = env[n]
        if not isinstance(v, LV):
            raise LiftError(n, Reason.LAYOUT, f"{n.name}: its results are used outside, but not all are lifted")
        if v.cplx:
            raise LiftError(n, Reason.DTYPE, f"{n.name}: a complex value used outside the partition (the kernels "
                                             "hold it as its real view)", alone=True)
        # a comparison's booleans (0/1 floats, LV.mask) or a count (LV.integral) used outside: the runner converts
        # the kernels' floats to ATen's booleans or integers on exit (exact: 0 and 1, integers below 2**24)
        held = n.meta["val"].dtype == torch.bool if v.mask else v.integral and not n.meta["val"].is_floating_point()
        if v.mask and not held:
            raise LiftError(n, Reason.DTYPE, f"{n.name}: a comparison's booleans used outside the partition as "
                                             f"{n.meta['val'].dtype}", alone=True)
        if v.negated and n.meta["val"].dtype == torch.bool:  # (~causal saved for the backward): its 0/1 floats
            v = negated_floats(ctx, v)
        if v.negated:
            raise LiftError(n, Reason.NOT_IN_REGISTRY, f"{n.name}: a negated boolean used outside the partition (the "
                                                       "kernels read it by swapping a where's branches)", alone=True)
        if v.fill is not None:
            raise LiftError(n, Reason.NOT_IN_REGISTRY, f"{n.name}: a masked_fill(-inf) used outside the partition "
                                                       "(the kernels hold -inf as the lowest finite value)",
                            alone=True)
        mv = n.meta["val"]
        out_meta.append((tuple(int(s) for s in mv.shape), mv.dtype, tuple(int(s) for s in mv.stride())))
        if v.t.ref in input_ref:
            out_map.append(("in", input_ref[v.t.ref], v.shape, v.bcast))
            continue
        if v.t.ref not in seen:
            seen[v.t.ref] = len(gouts)
            gouts.append(v.t)
        out_map.append(("out", seen[v.t.ref], v.shape, v.bcast))
    if not gouts:
        raise LiftError(nodes[-1], Reason.NO_COMPUTE, "the partition computes nothing")
    g.output(*gouts)
    live = g.live()
    for a, i in input_ref.items():
        if a[0] not in live:
            # an input only views leave the partition with: those views stay outside
            user = next(u for u in nodes if inputs[i] in u.all_input_nodes)
            raise LiftError(user, Reason.NO_COMPUTE, f"{user.name} only passes a view of an input through")
    consts = ctx.consts
    if any(n.op == "input" and i not in live for i, n in enumerate(g.nodes)):
        # a constant no output reads (nll_loss's total_weight of reduction none): the search refuses an unused input
        g = _without_dead_inputs(g, live)
        names = set(g.input_names())
        consts = [(name, c) for name, c in consts if name in names]
    return Lifted(g, list(nodes), inputs, outputs, out_map, out_meta, consts, frozenset(int_inputs),
                  tuple(bounds), tuple(a for a in extra if a not in inputs), frozenset(complex_inputs),
                  const_outs)


def _without_dead_inputs(g: Graph, live: set[int]) -> Graph:
    """``g`` without its inputs no output depends on, nor the nodes that read them (other nodes no output reads
    stay: the graph's text, a plan's key, is unchanged where every input is read)."""
    at: dict[int, int] = {}
    kept: list[Any] = []
    for i, n in enumerate(g.nodes):
        if (n.op == "input" and i not in live) or any(a not in at for a, _ in n.args):
            continue
        at[i] = len(kept)
        kept.append(dataclasses.replace(n, args=tuple((at[a], k) for a, k in n.args)))
    return Graph._from_parts(kept, [(at[a], k) for a, k in g.outputs_refs])


#: ATen ops whose result is a view of their first operand (shares its memory)
ALIAS_OPS = frozenset({"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "flatten", "unflatten", "view_as",
                       "_reshape_alias", "expand", "t", "transpose", "permute", "detach", "alias", "slice", "select",
                       "as_strided", "diagonal", "unfold"})


def plan_key(g: Graph | str) -> str:
    """The text a lifted partition (a Graph or its text) is looked up by in a search plan: its text with every
    ``transpose`` written as the ``permute`` it is (the same two axes swapped). The lift spells one layout both ways
    (``aten.t`` and ``aten.transpose`` as ``transpose``, ``aten.permute`` as ``permute``) and which ATen op a trace
    holds depends on where it was traced (a device's training partitions held ``transpose`` where the CPU-made
    plan's keys had ``permute``), so both spellings of a partition get one key. Only the lookup: what is served is
    re-checked against the partition's own graph."""
    from ..ir.graph import Node, make_attrs, node_list, output_refs

    graph: Graph = Graph.parse(g) if isinstance(g, str) else g
    nodes = []
    for n in node_list(graph):
        if n.op == "transpose":
            dims = list(range(n.outs[0].rank))
            a, b = int(n.attr("a")) % len(dims), int(n.attr("b")) % len(dims)
            dims[a], dims[b] = dims[b], dims[a]
            n = Node("permute", n.args, make_attrs({"dims": tuple(dims)}), n.outs)
        nodes.append(n)
    return str(Graph._from_parts(nodes, output_refs(graph)))


#: ATen arithmetic that converts an integer operand to the float dtype of its result (a loss over a count)
_INT_ARITH = frozenset({"add", "sub", "mul", "div", "rsub"})
#: ATen ops that read booleans as 0/1 (a count, a negation)
_BOOL_COUNTS = frozenset({"sum", "bitwise_not", "logical_not"})

#: integers below this are exact in float32
_EXACT_INT = 2**24

#: ATen ops converting a tensor's dtype
_CASTS = frozenset({"_to_copy", "convert_element_type"})


def _int_use(a: fx.Node, user: fx.Node) -> torch.dtype | None:
    """The float dtype ``user`` reads integer (or boolean) tensor ``a`` as, where that read is all ``user`` does
    with it: a conversion to a float (position ids ``.float()``, BERT's ``attention_mask.to(dtype)``: that dtype) or
    an equality with an integer constant below 2**24 (``target == ignore_index``: float32, in which such an
    equality is exact for every integer, a larger one rounding to a float still larger than the constant). The
    partition's runner makes that conversion on entry (``x.to(dtype)``, ATen's own); else None."""
    v, out = a.meta.get("val"), user.meta.get("val")
    name = op_name(user)
    if not (isinstance(v, torch.Tensor) and isinstance(out, torch.Tensor) and user.args
            and a not in user.kwargs.values() and list(user.args).count(a) == 1) or v.is_floating_point() \
            or v.is_complex():
        return None
    if name in _INT_ARITH and out.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return out.dtype  # ATen converts the integer operand to the result's float dtype
    if user.args[0] is not a:
        return None
    if v.dtype == torch.bool and name in _BOOL_COUNTS and (name == "sum" or any(
            op_name(u) == "sum" for u in user.users)):
        return torch.float32  # booleans counted, or negated for a count: 0/1 floats (aten.LV.mask)
    if name in ("eq", "ne") and len(user.args) == 2 and isinstance(user.args[1], int) \
            and not isinstance(user.args[1], bool) and abs(user.args[1]) < _EXACT_INT and v.dtype != torch.bool:
        return torch.float32
    if name not in _CASTS or not out.is_floating_point():
        return None
    return out.dtype if out.dtype in (torch.float16, torch.bfloat16, torch.float32) else None


#: ATen ops whose results (a tuple) are views of their first operand
_MULTI_VIEWS = frozenset({"split", "split_with_sizes", "unbind"})


def _alias_root(n: fx.Node, inside: set[fx.Node]) -> fx.Node:
    """The node whose memory ``n`` views, following view ops inside the partition (``n`` itself if none)."""
    while True:
        name = op_name(n)
        src = n.args[0] if n.args else None
        if name == "getitem" and isinstance(src, fx.Node) and op_name(src) in _MULTI_VIEWS and \
                src.args and isinstance(src.args[0], fx.Node):
            src = src.args[0]
        elif name not in ALIAS_OPS or not isinstance(src, fx.Node):
            return n
        if src not in inside:
            return src
        n = src


def _check_aliases(outputs: Sequence[fx.Node], inside: set[fx.Node]) -> None:
    """A partition result that views another result, an intermediate another result views, or an input of the
    partition aliases it in ATen; the kernels' results alias nothing (a later in-place write to one would not show
    in the other). Such a view stays outside the partition (LiftError on it, ``alone``)."""
    roots = {o: _alias_root(o, inside) for o in outputs}
    for o, r in roots.items():
        if r is o:
            continue
        if r not in inside or r in roots or any(q is not o and roots[q] is r for q in outputs):
            raise LiftError(o, Reason.LAYOUT, f"{o.name} is a view ({op_name(o)}) of {r.name}, which the model also "
                            "reads outside the partition: the view stays in ATen, so the results alias as they do "
                            "in eager", alone=True)


def _check_result(name: str, res: Any, out: Any) -> None:
    pairs = zip(res, out, strict=False) if isinstance(out, list) else [(res, out)]
    for r, o in pairs:
        if r is None or o is None:
            continue
        if not isinstance(r, LV):
            raise Unsupported(Reason.NOT_IN_REGISTRY, f"aten.{name}: no lifted result")
        shape, dt = o
        if r.cplx:  # a complex value held as its real view (LV.cplx); never a partition result
            if dt != torch.complex64 or r.shape != (*shape, 2):
                raise Unsupported(Reason.DTYPE, f"aten.{name}: a complex64 value {r.shape} where ATen has {dt}")
            continue
        if r.integral and not dt.is_floating_point and dt != torch.bool:  # a count (LV.integral)
            if r.shape != tuple(shape):
                raise Unsupported(Reason.LAYOUT, f"aten.{name}: lifted shape {r.shape}, ATen has {tuple(shape)}")
            continue
        if r.mask and dt == torch.bool:  # a comparison held as 0/1 (LV.mask); never a partition result
            if r.shape != tuple(shape):
                raise Unsupported(Reason.LAYOUT, f"aten.{name}: lifted shape {r.shape}, ATen has {tuple(shape)}")
            continue
        if r.mask:
            raise Unsupported(Reason.DTYPE, f"aten.{name}: a mask where ATen has {dt}")
        if r.shape != tuple(shape):
            raise Unsupported(Reason.LAYOUT, f"aten.{name}: lifted shape {r.shape}, ATen has {tuple(shape)}")
        if r.t.dtype != vm_dtype(dt):
            raise Unsupported(Reason.DTYPE, f"aten.{name}: lifted dtype {r.t.dtype}, ATen has {dt}")
        if not r.bcast and math.prod(r.t.shape) != math.prod(shape):
            raise Unsupported(Reason.LAYOUT, f"aten.{name}: lifted {tuple(r.t.shape)} for {tuple(shape)}")


# --------------------------------------------------------------------------- running partitions


#: pid -> runner; the graph module that calls a runner holds it (so it lives as long as the compiled graph)
_RUNNERS: weakref.WeakValueDictionary[int, PartitionRunner] = weakref.WeakValueDictionary()
_NEXT_PID = [0]
_OP: Any = None


def _custom_op() -> Any:
    """The custom op ``verimirage::run(pid, xs) -> list[Tensor]`` (defined once per process)."""
    global _OP
    if _OP is not None:
        return _OP
    if hasattr(torch.ops, "verimirage") and hasattr(torch.ops.verimirage, "run"):
        _OP = torch.ops.verimirage.run.default
        return _OP

    @torch.library.custom_op("verimirage::run", mutates_args=())
    def run(pid: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return _RUNNERS[pid](xs)

    @run.register_fake  # type: ignore[misc]
    def _fake(pid: int, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        dev = xs[0].device if xs else torch.device("cpu")
        return [torch.empty_strided(s, st, dtype=d, device=dev) for s, d, st in _RUNNERS[pid].lifted.out_meta]

    _OP = torch.ops.verimirage.run.default
    return _OP


class PartitionRunner:
    """Runs one taken partition: its kernels, or its ATen ops for good once the kernels failed."""

    def __init__(self, lifted: Lifted, program: Any, eager: fx.GraphModule, record: PartitionReport) -> None:
        self.lifted, self.program, self.eager, self.record = lifted, program, eager, record
        self.failed = False
        self.consts: dict[str, torch.Tensor] = {}
        self.cuda_graph = bool(getattr(program, "cuda_graph", False))
        #: the dtype each integer input is converted to on entry (its graph input's: float32 for class indices)
        dts = {t.name: getattr(torch, t.dtype.torch_name) for t in lifted.graph.inputs}
        self._entry_dtypes = {i: dts[f"in{i}"] for i in lifted.int_inputs}

    def _consts(self, device: torch.device) -> list[torch.Tensor]:
        out = []
        for name, c in self.lifted.consts:
            key = f"{name}@{device}"
            if key not in self.consts:
                self.consts[key] = c.to(device)
            out.append(self.consts[key])
        return out

    def _const_out(self, i: int, xs: Sequence[torch.Tensor]) -> torch.Tensor:
        """The constant output ``i`` on the inputs' device."""
        dev = xs[0].device if xs else torch.device("cpu")
        key = f"out{i}@{dev}"
        if key not in self.consts:
            self.consts[key] = self.lifted.const_outs[i].to(dev)
        return self.consts[key]

    def _named(self, xs: Sequence[torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
        dev = xs[0].device if xs else torch.device("cpu")
        ints = self.lifted.int_inputs
        xs = xs[:len(self.lifted.inputs)]  # (the extra tensors are for the ATen ops)
        want, cplx = self._entry_dtypes, self.lifted.complex_inputs
        xs = [torch.view_as_real(x.resolve_conj()) if i in cplx else x for i, x in enumerate(xs)]
        named = {f"in{i}": (x.to(want[i]) if i in ints else x).reshape(1) if x.dim() == 0 else
                 (x.to(want[i]) if i in ints else x) for i, x in enumerate(xs)}  # rank 0: (1,) (lift)
        consts = self._consts(dev)
        named.update(zip((n for n, _ in self.lifted.consts), consts, strict=True))
        return named, consts

    def precompile(self, xs: Sequence[torch.Tensor], workers: int) -> int:
        """Compile the kernels for a call on ``xs`` in ``workers`` threads (see
        :func:`verimirage.backend.precompile.precompile`); the number of kernels compiled so."""
        from ..backend.precompile import precompile

        named, _ = self._named(xs)
        return precompile(self.program, workers=workers, **named)

    def kernels(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The partition's outputs from the verified kernels (raises on a launch failure)."""
        named, consts = self._named(xs)
        held = {c.data_ptr() for c in consts}
        # the memory of the inputs, and of the results handed out so far: a verified μGraph may return an input
        # itself (x * 1.0 -> x) or one value for two outputs, and torch refuses a custom op result aliasing
        # either (a RuntimeError in the user's forward; red team, session 13)
        taken = {_storage(x) for x in (*xs, *named.values()) if x.numel()}
        res = self.program(**named)
        outs = res if isinstance(res, tuple) else (res,)
        got = []
        used: set[int] = set()
        for (kind, i, shape, bcast), (_, dt, stride) in zip(self.lifted.out_map, self.lifted.out_meta, strict=True):
            y = outs[i] if kind == "out" else self._const_out(i, xs) if kind == "const" else \
                xs[i].to(self._entry_dtypes[i]) if i in self._entry_dtypes else xs[i]
            if y.dtype != dt and not dt.is_floating_point:  # booleans or a count the kernels hold as floats
                y = y != 0 if dt == torch.bool else y.to(dt)
            if bcast:
                y = y.reshape(tuple(y.shape)[len(y.shape) - len(_strip(y.shape)):]).expand(shape)
            y = y.reshape(shape)
            # custom op results may alias neither inputs nor each other (nor a CUDA graph's buffers)
            if (kind != "out" or bcast or i in used or self.cuda_graph or y.data_ptr() in held
                    or (y.numel() and _storage(y) in taken)):
                # (a constant the partition passes through is the runner's own tensor: never handed out)
                y = y.contiguous().clone()
            elif kind == "out":
                used.add(i)
            if y.numel():
                taken.add(_storage(y))
            if y.numel() > 1 and tuple(y.stride()) != stride:
                # the ATen graph may view the result relying on the strides the original op gave it
                y = with_strides(y, shape, stride)
            got.append(y)
        return got

    def check_indices(self, xs: Sequence[torch.Tensor]) -> None:
        """Raise as ATen does for a class index out of range (``nll_loss``'s target, ``gather``'s index): the
        kernels read indices through a one-hot mask, which matches no class there and would silently give 0.
        On the CPU an ``IndexError`` naming the index; on a GPU a device-side assert (``torch._assert_async``, no
        host synchronisation, what ATen's CUDA kernels do too). A few elementwise ops on the indices per call."""
        for pos, classes, ignore in self.lifted.index_bounds:
            x = xs[pos]
            bad = (x < 0) | (x >= classes)
            if ignore is not None:
                bad &= x != ignore
            if x.device.type == "cpu":
                if bool(bad.any()):
                    raise IndexError(f"verimirage partition {self.record.name}: index {int(x[bad].flatten()[0])} "
                                     f"is out of bounds (expected 0 <= index < {classes}"
                                     + ("" if ignore is None else f" or the ignore_index {ignore}") + ")")
            else:
                torch._assert_async(~bad.any(), f"verimirage partition {self.record.name}: a class index is "
                                                 f"out of bounds (expected 0 <= index < {classes})")

    def __call__(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.check_indices(xs)
        if not self.failed:
            try:
                return self.kernels(xs)
            except Exception as e:
                self.failed = True
                self.record.taken = False
                self.record.reason = f"{Reason.COMPILE_FAILED.value}: {type(e).__name__}: {e}"
                log.warning("verimirage: partition %s failed at its first call (%s: %s); it runs on its ATen ops "
                            "from now on", self.record.name, type(e).__name__, str(e)[:300])
        out = self.eager(*xs)
        return [o.clone() if any(o is x for x in xs) else o for o in out]


def _storage(t: torch.Tensor) -> int:
    """The address of ``t``'s storage (the same for every view of it)."""
    return int(t.untyped_storage().data_ptr())


def with_strides(y: torch.Tensor, shape: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """A copy of ``y`` laid out with ``stride``. Where ``stride`` is 0 on a dim of size > 1 (the partition's result
    is an ``expand`` of a smaller tensor, e.g. GQA's keys repeated over heads), one slice along that dim is stored
    and expanded (a copy into overlapping memory is an error)."""
    shape, stride = tuple(shape), tuple(stride)
    zero = {d for d, (n, st) in enumerate(zip(shape, stride, strict=True)) if st == 0 and n > 1}
    if not zero:
        return torch.empty_strided(shape, stride, dtype=y.dtype, device=y.device).copy_(y)
    z = y[tuple(slice(0, 1) if d in zero else slice(None) for d in range(len(shape)))]
    base = torch.empty_strided(tuple(z.shape), stride, dtype=y.dtype, device=y.device).copy_(z)
    return base.expand(shape)


def _strip(s: Sequence[int]) -> tuple[int, ...]:
    s = tuple(s)
    i = 0
    while i < len(s) and s[i] == 1:
        i += 1
    return s[i:]


def eager_module(gm: fx.GraphModule, lifted: Lifted, *, aten_casts: bool = True) -> fx.GraphModule:
    """The partition's ATen ops as a GraphModule (inputs and outputs in the lifted order).

    ``aten_casts``: prims casts become ``aten._to_copy`` (to run eagerly); False keeps the nodes as they are
    (for a compiler that decomposes ``_to_copy`` into the prims cast itself, such as Inductor)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, n in enumerate(lifted.inputs):
        p = g.placeholder(f"in{i}")
        p.meta = dict(n.meta)
        env[n] = p
    for i, n in enumerate(lifted.extra):
        p = g.placeholder(f"extra{i}")
        p.meta = dict(n.meta)
        env[n] = p
    prims_cast = getattr(getattr(torch.ops, "prims", None), "convert_element_type", None)
    for n in lifted.nodes:
        c = g.node_copy(n, lambda a: env[a])
        if aten_casts and prims_cast is not None and c.target is getattr(prims_cast, "default", None):
            # prims run their Python reference in eager mode (hundreds of µs); the ATen cast is one kernel
            src, dt = c.args[0], c.args[1] if len(c.args) > 1 else c.kwargs.get("dtype")
            c.target = torch.ops.aten._to_copy.default
            c.args, c.kwargs = (src,), {"dtype": dt}
        env[n] = c
    g.output(tuple(env[n] for n in lifted.outputs))
    return fx.GraphModule(gm, g)


def _example(n: fx.Node, gen: torch.Generator, device: torch.device, signed: float = 0.0,
             index: tuple[int, int | None] | None = None) -> torch.Tensor:
    """A random tensor with the node's shape, dtype and strides (views in the partition rely on them); a tensor the
    graph holds (:data:`HELD`, computed with while lifting) is itself."""
    if HELD in n.meta:
        return n.meta[HELD].to(device)
    return example_like(n.meta["val"], gen, device, signed, index)


def example_like(v: torch.Tensor, gen: torch.Generator, device: torch.device, signed: float = 0.0,
                 index: tuple[int, int | None] | None = None) -> torch.Tensor:
    """A random real tensor with ``v``'s shape, dtype and strides (``v`` may be a fake tensor).

    Floats in [0.5, 1.5) (no NaN from sqrt / log / rsqrt), or with ``signed`` > 0 in [-signed, signed) (both
    signs: a kernel computing ``relu(x)`` or ``|x|`` where ``x`` is meant agrees on positive inputs), booleans at
    random, integers 0 (a valid index into anything, so no device-side assert), or with ``index = (classes,
    ignore)`` (a class index, :attr:`Lifted.index_bounds`) at random in ``[0, classes)``, every seventh one from
    the second ``ignore`` where that is not None (all zeros told no kernel reading the index from one that ignores
    it). Raises ``Unsupported`` for a symbolic shape.
    """
    shape = _static_shape(v)
    stride = tuple(int(s) for s in v.stride())
    size = 1 + sum((d - 1) * st for d, st in zip(shape, stride, strict=True) if d > 0)
    if v.dtype == torch.bool:
        buf = torch.rand(size, generator=gen) > 0.5
    elif v.is_complex():
        r = torch.rand(2, size, generator=gen, dtype=torch.float32)
        r = (2.0 * r - 1.0) * signed if signed > 0 else r + 0.5
        buf = torch.complex(r[0], r[1]).to(v.dtype)
    elif v.is_floating_point():
        r = torch.rand(size, generator=gen, dtype=torch.float32)
        buf = ((2.0 * r - 1.0) * signed if signed > 0 else r + 0.5).to(v.dtype)
    elif index is not None and index[0] > 0:
        buf = torch.randint(0, index[0], (size,), generator=gen).to(v.dtype)
        if index[1] is not None:
            buf[1::7] = index[1]
    else:
        buf = torch.zeros(size, dtype=v.dtype)
    return torch.as_strided(buf.to(device), shape, stride)


_TOL = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}


#: the smallest normal number of each dtype: below it values are stored with an absolute rounding error
_TINY = {torch.float16: 2.0**-14, torch.bfloat16: 2.0**-126, torch.float32: 2.0**-126}


def _elementwise_slack(mag: torch.Tensor, tol: float, dtype: torch.dtype) -> torch.Tensor:
    """Per element, ``tol`` of its own magnitude ``mag`` plus a typical one (the median nonzero magnitude, which a
    few huge elements do not move) plus the dtype's smallest normal (fp16 subnormals round by 6e-8): the
    largest-error test alone let one huge element hide wrong small ones (``[1e6, 5, 5, 5]`` passed for
    ``[1e6, 1, 1, 1]``)."""
    nz = mag[mag > 0]
    return tol * (mag + (float(nz.median()) if nz.numel() else 0.0) + max(1e-6, _TINY.get(dtype, 0.0)))


def _same_specials(a64: torch.Tensor, b64: torch.Tensor) -> bool:
    """Whether ``a64`` is non-finite exactly where ``b64`` is, with the same value there (``inf`` of the same sign,
    NaN for NaN): finiteness alone let ``-inf`` or NaN stand for ``+inf`` (red team, session 13)."""
    if a64.shape != b64.shape:
        return False
    fin = torch.isfinite(b64)
    if not torch.equal(torch.isfinite(a64), fin):
        return False
    return torch.equal(torch.isnan(a64), torch.isnan(b64)) and torch.equal(a64[torch.isinf(b64)],
                                                                           b64[torch.isinf(b64)])


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the kernels' output ``a`` matches the ATen ops' ``b``: integer and boolean results exactly (an index
    one off is wrong, whatever its magnitude), floating-point ones within the dtype's tolerance of the largest
    magnitude and, element by element, of their own plus the median one; non-finite values identical."""
    if not (a.is_floating_point() and b.is_floating_point()):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.detach().cpu(), b.detach().cpu())
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    fin = torch.isfinite(b64)
    if not _same_specials(a64, b64):
        return False
    if not bool(fin.any()):
        return True
    scale = float(b64[fin].abs().max()) + 1e-6
    tol = _TOL.get(b.dtype, 2e-3)
    err = (a64[fin] - b64[fin]).abs()
    return float(err.max()) <= tol * scale and bool((err <= _elementwise_slack(b64[fin].abs(), tol, b.dtype)).all())


def reference64(gm: fx.GraphModule, lifted: Lifted, xs: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """The partition's outputs computed in float64: its ATen ops on the inputs upcast, every floating-point
    cast and dtype argument made float64. None when the ops do not run so (the caller keeps its verdict)."""
    m = eager_module(gm, lifted)
    floats = {torch.float16, torch.bfloat16, torch.float32}
    for n in m.graph.nodes:
        if n.op != "call_function":
            continue
        if isinstance(n.kwargs.get("dtype"), torch.dtype) and n.kwargs["dtype"] in floats:
            n.kwargs = {**n.kwargs, "dtype": torch.float64}
        n.args = tuple(torch.float64 if isinstance(a, torch.dtype) and a in floats else a for a in n.args)
        if op_name(n) in ("_softmax", "_log_softmax") and len(n.args) > 2 and n.args[2] is True:
            n.args = (*n.args[:2], False, *n.args[3:])
    m.recompile()
    try:
        out = m(*[x.double() if x.is_floating_point() else x for x in xs])
    except Exception as e:
        log.debug("float64 reference failed: %s: %s", type(e).__name__, e)
        return None
    return [o.double() for o in out]


def as_accurate(got: torch.Tensor, aten: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether ``got`` is as close to the float64 value ``ref`` as the ATen ops' ``aten`` (within twice their
    largest error, or the dtype's tolerance; and each element within twice theirs there, or the tolerance of its
    own magnitude plus the median one), and finite exactly where ``ref`` is."""
    if not got.is_floating_point():  # (an integer or boolean result is exact or wrong: see _close)
        return False
    g, a, r = (t.detach().double().cpu() for t in (got, aten, ref))
    fin = torch.isfinite(r)
    if not _same_specials(g, r):
        return False
    if not bool(fin.any()):
        return True
    scale = float(r[fin].abs().max()) + 1e-6
    err_a = float((a[fin] - r[fin]).abs().max()) if torch.equal(torch.isfinite(a), fin) else 0.0
    err_g = float((g[fin] - r[fin]).abs().max())
    tol = _TOL.get(got.dtype, 2e-3)
    # and element by element: within twice the ATen ops' error there, or the tolerance of its own magnitude plus
    # the median one, or twice the ATen ops' largest error relative to that same magnitude (a result computed
    # through half-precision intermediates, an fp32 rstd of fp16 rows with little spread, say, carries their
    # rounding at every element: the ATen ops' error is as large, only at other elements). Each allowance is
    # proportional to the element's own magnitude, so one huge element still hides no wrong small one.
    eg = (g[fin] - r[fin]).abs()
    ea = (a[fin] - r[fin]).abs() if torch.equal(torch.isfinite(a), fin) else torch.zeros_like(eg)
    slack = _elementwise_slack(r[fin].abs(), tol, got.dtype)
    ratio = float((ea / slack).max()) if ea.numel() else 0.0  # the ATen ops' worst error in units of the slack
    near = torch.maximum(2.0 * ea, max(1.0, 2.0 * ratio) * slack)
    return err_g <= max(2.0 * err_a, tol * scale) and bool((eg <= near).all())


def time_us(fn: Any, xs: Sequence[Any], device: torch.device) -> float:
    """Median time of ``fn(xs)`` in µs: on a GPU, its work replayed as a CUDA graph
    (``triton.testing.do_bench_cudagraph``: the device time, without the host's launch overhead, which at
    small shapes decides a comparison launched from Python and is not what a compiled model replays), or
    ``do_bench`` when ``fn`` cannot be captured; on a CPU, a wall clock."""
    if device.type == "cuda":
        from triton.testing import do_bench, do_bench_cudagraph

        fn(list(xs))  # compiled and allocated before any capture
        torch.cuda.synchronize()
        try:
            return float(do_bench_cudagraph(lambda: fn(list(xs)), rep=20, return_mode="median")) * 1e3
        except Exception as e:
            log.info("verimirage: timing without a CUDA graph (capture failed: %s: %s)", type(e).__name__,
                     str(e)[:200])
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
            return float(do_bench(lambda: fn(list(xs)), warmup=5, rep=20, return_mode="median")) * 1e3
    fn(list(xs))
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn(list(xs))
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[1] * 1e6


#: ``fallback_for(eager_module, example_inputs)``: the fallback's code for a partition, callable on a list of
#: tensors (Inductor's compiled partition, say); None or a failure: the partition's ATen ops, run eagerly
FallbackFor = Any


def compile_partition(gm: fx.GraphModule, lifted: Lifted, opts: CaptureOptions, record: PartitionReport,
                      device: torch.device, fallback_for: FallbackFor = None) -> PartitionRunner | None:
    """Search, compile and check one partition; None (with the reason in ``record``) when it is not taken.

    With ``opts.profile`` the kernels are timed against the fallback's code for the partition
    (``fallback_for``, see :data:`FallbackFor`) and the partition is left to the fallback when slower.
    """
    import verimirage as vm

    t0 = time.perf_counter()
    try:
        res = vm.superoptimize(lifted.graph, time_budget_s=opts.time_budget_s, **dict(opts.search))
    except Exception as e:
        record.reason = f"{Reason.SEARCH_FAILED.value}: {type(e).__name__}: {e}"
        log.warning("verimirage: search failed for %s: %s", record.name, e)
        return None
    record.search_s = time.perf_counter() - t0
    record.split, record.regions = res.report.split, [str(r) for r in res.report.regions]
    if not res.candidates:
        record.reason = f"{Reason.NO_CANDIDATE.value} ({res.report.stop_reason})"
        return None
    profile = opts.profiling(device)
    pool = [res.best, *[c for c in res.candidates if c is not res.best]]
    # the cost model ranks verified siblings (loop ranges, tile shapes) least reliably: with the profile, up to
    # ``opts.candidates`` of them are compiled, checked and timed, and the fastest is kept
    pool = pool[:max(1, opts.candidates)] if profile else pool[:1]
    eager = eager_module(gm, lifted)

    def build(cand: Any) -> PartitionRunner | str:
        try:
            prog = vm.compile(cand, cuda_graph=True) if opts.cuda_graph else vm.compile(cand)
        except Exception as e:
            return f"{Reason.COMPILE_FAILED.value}: {type(e).__name__}: {e}"
        prog.copy_returned_inputs = False  # (an input the FX graph returns, a constant passed through: as it did)
        return PartitionRunner(lifted, prog, eager, record)

    def chosen(cand: Any, runner: PartitionRunner) -> PartitionRunner:
        cost = getattr(cand, "cost", None)
        record.estimated_us = None if cost is None else cost.time_s * 1e6
        record.kernels = [k.name for k in runner.program.kernels]
        return runner

    if not (opts.check or profile):
        r0 = build(pool[0])
        if isinstance(r0, str):
            record.reason = r0
            return None
        return chosen(pool[0], r0)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        sets = [(ys, want, "random inputs") for ys, want in _check_sets(lifted, eager, device)]
        xs = sets[0][0]
        sets += _special_sets(lifted, eager, sets[-1][0])
        best: tuple[float, Any, PartitionRunner] | None = None
        first_failure: str | None = None
        for ci, cand in enumerate(pool):
            runner = build(cand)
            fail = runner if isinstance(runner, str) else next(
                (f for ys, want, what in sets
                 if (f := _check_runner(runner, ys, want, gm, lifted, opts, device, record.name, what)) is not None),
                None)
            if fail is not None:
                first_failure = first_failure or fail
                log.info("verimirage: %s: candidate %d: %s", record.name, ci, fail)
                if profile:
                    record.candidates_us.append(None)
                continue
            assert not isinstance(runner, str)
            if not profile:
                return chosen(cand, runner)
            try:
                us = time_us(runner.kernels, xs, device)
            except Exception as e:
                first_failure = first_failure or (f"{Reason.COMPILE_FAILED.value}: timing failed: "
                                                  f"{type(e).__name__}: {str(e)[:200]}")
                record.candidates_us.append(None)
                continue
            record.candidates_us.append(us)
            log.info("verimirage: %s: candidate %d of %d: %.1f us", record.name, ci, len(pool), us)
            if best is None or us < best[0]:
                best = (us, cand, runner)
        if best is None:
            record.reason = first_failure or f"{Reason.NO_CANDIDATE.value} (none checked)"
            log.warning("verimirage: %s: %s; the partition stays with the fallback", record.name, record.reason)
            return None
        record.measured_us, cand, runner = best
        chosen(cand, runner)
        what, fb = "its ATen ops", None
        if fallback_for is not None:
            try:
                fb = fallback_for(eager_module(gm, lifted, aten_casts=False), xs)
                what = "the fallback's code for it"
            except Exception as e:
                log.warning("verimirage: %s: the fallback could not compile the partition alone (%s: %s); "
                            "timing against its ATen ops", record.name, type(e).__name__, str(e)[:200])
        if fb is None:
            fb = lambda a: eager(*a)  # noqa: E731
        try:
            record.fallback_us = time_us(fb, xs, device)
        except Exception as e:
            record.reason = f"{Reason.COMPILE_FAILED.value}: timing failed: {type(e).__name__}: {str(e)[:200]}"
            log.warning("verimirage: timing %s failed: %s; the partition stays with the fallback", record.name, e)
            return None
        if record.measured_us > record.fallback_us:
            record.reason = (f"{Reason.SLOWER.value}: {record.measured_us:.1f} us vs "
                             f"{record.fallback_us:.1f} us for {what}")
            log.info("verimirage: %s: %s", record.name, record.reason)
            return None
    return runner


def _finite(outs: Sequence[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(o).all()) for o in outs if o.is_floating_point())


def _index_ranges(lifted: Lifted) -> dict[int, tuple[int, int | None]]:
    """Per class-index input (position): the classes every use of it has and the ignore value all of them share
    (None if any use has none), from :attr:`Lifted.index_bounds`."""
    out: dict[int, tuple[int, int | None]] = {}
    for pos, classes, ignore in lifted.index_bounds:
        c, ig = out.get(pos, (classes, ignore))
        out[pos] = (min(c, classes), ig if ig == ignore else None)
    return out


def _check_sets(lifted: Lifted, eager: Any, device: torch.device) -> list[tuple[list[torch.Tensor], Any]]:
    """The input sets (with the ATen ops' outputs on them) a partition's kernels are checked on: inputs in
    [0.5, 1.5) and inputs of both signs in [-1, 1), each kept where the ATen ops' results are finite (in half
    precision a chain of products over positive inputs overflows: a backward partition's results were inf or NaN
    for the kernels and the ATen ops alike, and the check could neither pass nor mean anything); the signed set is
    shrunk by 16 up to twice until they are. Where no signed set is finite (``sqrt`` or ``log`` of one input is NaN
    at every scale), a set with the inputs signed one at a time, each one kept where the ATen results stay finite
    (the other inputs' signs are still checked). Class indices are random valid ones in every set. The first set is
    the one that is timed; when no set gives finite results, the positive one alone (its non-finite values must
    then be matched exactly)."""
    nodes = (*lifted.inputs, *lifted.extra)
    # (integers converted to floats on entry: small random ones, as position ids)
    index = {i: (8, None) for i in lifted.int_inputs} | _index_ranges(lifted)
    gen = torch.Generator().manual_seed(0)
    xs = [_example(n, gen, device, index=index.get(i)) for i, n in enumerate(nodes)]
    positive = (xs, eager(*xs))
    sets = [positive] if _finite(positive[1]) else []
    for scale in (1.0, 1.0 / 16, 1.0 / 256):
        gen = torch.Generator().manual_seed(1)
        ys = [_example(n, gen, device, signed=scale, index=index.get(i)) for i, n in enumerate(nodes)]
        out = eager(*ys)
        if _finite(out):
            sets.append((ys, out))
            break
    else:
        gen = torch.Generator().manual_seed(2)
        ys, out, signed = list(xs), positive[1], False
        for i, n in enumerate(nodes):
            if i in index or not xs[i].is_floating_point() or HELD in n.meta:
                continue
            trial = [*ys[:i], _example(n, gen, device, signed=1.0), *ys[i + 1:]]
            tout = eager(*trial)
            if _finite(tout):
                ys, out, signed = trial, tout, True
        if signed:
            sets.append((ys, out))
    return sets or [positive]


#: the special values the compile-time check writes into the partition's floating-point inputs, one input and one
#: pattern a set (:data:`verimirage.pipeline.fpsafe.SPECIAL_SETS`' infinite and NaN patterns: a row of -inf, as a
#: fully masked row or log 0, one +inf, one NaN): on each set where the ATen ops themselves make no NaN (no op of
#: them gives a NaN from operands without one: ``inf - inf``, ``0 * inf``), the kernels must give their results,
#: the same infinities and NaNs at the same places. The random sets alone let a kernel be finite where ATen is
#: infinite, or NaN where it is finite (the seventeenth session's nll_loss at a picked -inf, ReLU's gradient at NaN)
CHECK_SPECIALS: tuple[str, ...] = ("-inf-row", "+inf-one", "nan-one")

#: at most this many special sets a partition: each is one more run of the kernels (in Triton's interpreter, the
#: forwards of swiglu, sdpa_mask and llama_block together took 11-22 s with 4 sets against 8-12 s without, three
#: interleaved pairs of runs on the loaded 2-core machine; 6 sets took about 2.3 times as long). The pairs (input,
#: pattern) are taken diagonally, the inputs with the most elements first: the first sets put each pattern in
#: another input
CHECK_SPECIALS_MAX = 4


def _with_special(x: torch.Tensor, pattern: str) -> torch.Tensor:
    """A copy of ``x`` (same strides, also a broadcast input's stride 0) with :data:`CHECK_SPECIALS`' ``pattern``
    written in: ``-inf-row``: the last axis at index 0 of the others; ``+inf-one`` / ``nan-one``: the first element
    (written into the memory, so where strides alias an element, every alias holds it, as in a broadcast input)."""
    shape, stride = tuple(x.shape), tuple(x.stride())
    size = 1 + sum((d - 1) * st for d, st in zip(shape, stride, strict=True) if d > 0)
    buf = torch.as_strided(x, (size,), (1,), x.storage_offset()).clone()
    if pattern == "-inf-row":
        n, st = (shape[-1], stride[-1]) if shape else (1, 1)
        buf[torch.arange(n) * st] = -math.inf
    else:
        buf[0] = math.inf if pattern == "+inf-one" else math.nan
    return torch.as_strided(buf, shape, stride)


def undefined_at(gm: fx.GraphModule, xs: Sequence[torch.Tensor]) -> str | None:
    """Why the ATen ops of ``gm`` run on ``xs`` constrain nothing there, or None: some op gives a NaN from tensor
    operands without one (``inf - inf``, ``0 * inf``: undefined), a fused attention op reads a non-finite operand
    (:data:`SPECIAL_VALUES_OWN`: its kernel's own result), or a constant -inf mask is added to a NaN
    (:func:`_masks_a_nan`: a masked entry, which the kernels do not read). An op that fails counts too."""
    def tensors(v: Any) -> list[torch.Tensor]:
        return [t for t in (v if isinstance(v, (list, tuple)) else [v])
                if isinstance(t, torch.Tensor) and t.is_floating_point()]

    live: set[fx.Node] = set()  # (the nodes whose values depend on an input; the others are constants: a mask)

    class Watch(fx.Interpreter):
        why: str | None = None

        def run_node(self, n: fx.Node) -> Any:
            if (n.op == "placeholder" and HELD not in n.meta) or any(a in live for a in n.all_input_nodes):
                live.add(n)  # (a placeholder the lifting holds, HELD, is a constant: the -inf a mask is filled with)
            if self.why is None and n.op == "call_function" and op_name(n) in SPECIAL_VALUES_OWN and any(
                    not bool(torch.isfinite(t).all()) for a in n.all_input_nodes for t in tensors(self.env[a])):
                self.why = f"aten.{op_name(n)} reads a non-finite operand"
            if self.why is None and n.op == "call_function" and op_name(n) == "add" and _masks_a_nan(
                    [(self.env.get(a) if isinstance(a, fx.Node) else a, isinstance(a, fx.Node) and a not in live)
                     for a in n.args[:2]]):
                self.why = "aten.add adds a constant -inf mask to a NaN (a masked entry, which the kernels do not read)"
            out = super().run_node(n)
            if self.why is None and n.op == "call_function" and any(bool(torch.isnan(t).any()) for t in tensors(out)) \
                    and not any(bool(torch.isnan(t).any()) for a in n.all_input_nodes for t in tensors(self.env[a])):
                self.why = f"aten.{op_name(n)} makes a NaN"
            return out

    w = Watch(gm)
    try:
        w.run(*xs)
    except Exception as e:
        return f"the ATen ops fail ({type(e).__name__})"
    return w.why


def _masks_a_nan(operands: Sequence[tuple[Any, bool]]) -> bool:
    """Whether two ``add`` operands ``(value, constant)`` are a constant holding -inf (a mask the forward makes) and a
    tensor that is NaN where the mask is -inf. ATen's sum is NaN there, and its softmax NaN on the whole row; the
    lifted softmax never reads a masked entry (``aten.constant_value`` holds the mask's -inf as its kept booleans,
    the scores there as the dtype's lowest finite value, their weights exactly 0), as ATen's fused attention kernels do
    not: it is finite there, the softmax of the row's kept scores. A +inf there is ``inf - inf`` (ATen's add makes the
    NaN) and constrains nothing either; -inf there is -inf in both."""
    if len(operands) != 2:
        return False
    for (m, const), (x, _) in (operands, operands[::-1]):
        if const and isinstance(m, torch.Tensor) and isinstance(x, torch.Tensor) and m.is_floating_point() \
                and x.is_floating_point():
            try:
                m_b, x_b = torch.broadcast_tensors(m, x)
            except RuntimeError:
                return False
            if bool((torch.isneginf(m_b) & torch.isnan(x_b)).any()):
                return True
    return False


def _special_sets(lifted: Lifted, eager: fx.GraphModule, base: list[torch.Tensor]
                  ) -> list[tuple[list[torch.Tensor], Any, str]]:
    """The special-value sets of a partition (:data:`CHECK_SPECIALS`, at most :data:`CHECK_SPECIALS_MAX`, the
    (input, pattern) pairs taken diagonally): ``base``
    (a random set) with one pattern written in one floating-point input of at least 2 elements (not a class index,
    not a constant the graph holds), each kept where the ATen ops are defined (:func:`undefined_at`); with the ATen
    ops' results and a description. A set that cannot be made is left out (logged): the check never fails the
    capture."""
    nodes = (*lifted.inputs, *lifted.extra)
    index = set(lifted.int_inputs) | {pos for pos, _c, _i in lifted.index_bounds}
    order = sorted((i for i, n in enumerate(nodes)
                    if i not in index and HELD not in n.meta and base[i].is_floating_point() and base[i].numel() > 1),
                   key=lambda i: (-base[i].numel(), i))
    out: list[tuple[list[torch.Tensor], Any, str]] = []
    pairs = [(order[(r + k) % len(order)], pattern) for r in range(len(order))
             for k, pattern in enumerate(CHECK_SPECIALS)]
    for i, pattern in pairs:
        if len(out) >= CHECK_SPECIALS_MAX:
            return out
        try:
            ys = [*base[:i], _with_special(base[i], pattern), *base[i + 1:]]
            if undefined_at(eager, ys) is None:
                out.append((ys, eager(*ys), f"input {i} with {pattern}"))
        except Exception as e:  # (e.g. a dtype the pattern cannot be written in)
            log.debug("special set %s of input %d not made: %s: %s", pattern, i, type(e).__name__, e)
    return out


def _check_runner(runner: PartitionRunner, xs: list[torch.Tensor], want: Sequence[torch.Tensor],
                  gm: fx.GraphModule, lifted: Lifted, opts: CaptureOptions, device: torch.device,
                  name: str, what: str = "random inputs") -> str | None:
    """Compile (in parallel on a GPU) and run ``runner``'s kernels on ``xs``; None when every output matches the
    ATen ops' ``want`` (or is as close to float64 as they are), else why not."""
    if device.type == "cuda" and opts.compile_workers > 1:
        t1 = time.perf_counter()
        try:
            k = runner.precompile(xs, opts.compile_workers)
            log.info("verimirage: %s: %d kernel(s) compiled in %.1f s", name, k, time.perf_counter() - t1)
        except Exception as e:  # the first call compiles what is missing (and reports a real failure)
            log.info("verimirage: %s: parallel compile failed (%s: %s)", name, type(e).__name__, e)
    try:  # (a kernel Triton refuses for shared memory is compiled again at one stage by the runtime's first launch)
        got = runner.kernels(xs)
    except Exception as e:
        log.warning("verimirage: %s: the kernels fail (%s); the partition stays with the fallback", name, e)
        return f"{Reason.COMPILE_FAILED.value}: {type(e).__name__}: {str(e)[:300]}"
    ref64: list[torch.Tensor] | None = None
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
            ok = False
        elif _close(a, b):
            ok = True
        else:
            # in half precision, rounding the ATen ops do differently (a softmax over fp16 logits of ~500,
            # say) can move both results far from each other: then the kernels must be as close to the
            # float64 value of the partition as the ATen ops are
            if ref64 is None:
                ref64 = reference64(gm, lifted, xs) or []
            ok = bool(ref64) and as_accurate(a, b, ref64[i])
        if not ok:
            reason = f"{Reason.NUMERIC.value}: output {i} differs from the ATen ops on {what}"
            log.warning("verimirage: %s: %s; the partition stays with the fallback", name, reason)
            if os.environ.get(DUMP_ENV):
                try:
                    _dump_numeric(os.environ[DUMP_ENV], name, runner, xs, got, want, gm, lifted)
                except Exception as e:  # (a diagnosis must not change the verdict)
                    log.warning("verimirage: %s: the numeric dump failed: %s: %s", name, type(e).__name__, e)
            return reason
    return None


#: environment variable naming a file to which every numeric-check failure is appended (one JSON line: the
#: partition's graph and μGraph, its inputs' shapes and strides, and per output the errors of the kernels against
#: the ATen ops, the float64 reference of the ATen ops and the μGraph's own float64 value on the same inputs)
DUMP_ENV = "VERIMIRAGE_CAPTURE_DUMP"


def _dump_numeric(path: str, name: str, runner: PartitionRunner, xs: Sequence[torch.Tensor],
                  got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], gm: fx.GraphModule,
                  lifted: Lifted) -> None:
    """Append the diagnosis of one numeric-check failure to ``path`` (see :data:`DUMP_ENV`)."""
    import json

    import numpy as np

    from ..backend.runtime import compile as vm_compile
    from ..ir.reference import evaluate

    ref64 = reference64(gm, lifted, xs) or []
    mug = getattr(runner.program, "mugraph", None)
    mu64: list[Any] = []
    if mug is not None:
        named, _ = runner._named(xs)
        try:
            mu64 = evaluate(mug, {k: v.detach().double().cpu().numpy() for k, v in named.items()})
        except Exception as e:
            log.warning("verimirage: %s: the μGraph's float64 evaluation failed: %s: %s", name, type(e).__name__, e)
    outs = []
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
        rec: dict[str, Any] = {"i": i, "shape": list(b.shape), "dtype": str(b.dtype), "stride": list(b.stride()),
                               "close": bool(tuple(a.shape) == tuple(b.shape) and _close(a, b))}
        if a64.shape == b64.shape:
            d = (a64 - b64).abs().nan_to_num(nan=math.inf).flatten()
            rec.update(max_abs=float(d.max()) if d.numel() else 0.0, max_want=float(b64.abs().max()),
                       median_want=float(b64.abs().median()))
            worst = torch.topk(d, min(5, d.numel())).indices.tolist()
            r = ref64[i].cpu().flatten() if i < len(ref64) else None
            m = mu64[rec["i"]].reshape(-1) if i < len(mu64) and np.size(mu64[i]) == d.numel() else None
            for key, val in (("ref64", r), ("mu64", None if m is None else torch.from_numpy(np.asarray(m)))):
                if val is not None:
                    rec[f"max_abs_kernel_vs_{key}"] = float((a64.flatten() - val).abs().max())
                    rec[f"max_abs_aten_vs_{key}"] = float((b64.flatten() - val).abs().max())
            rec["worst"] = [{"index": j, "kernel": float(a64.flatten()[j]), "aten": float(b64.flatten()[j]),
                             "ref64": None if r is None else float(r[j]),
                             "mu64": None if m is None else float(m[j])} for j in worst]
        outs.append(rec)
    line: dict[str, Any] = {}
    if mug is not None and mu64:
        # the program's own outputs against the μGraph's float64 value, under its configuration and under simpler
        # ones (one stage; 16-row dots: mma.sync instead of wgmma; 8 and 2 warps): a configuration that agrees where
        # the tuned one does not points at the compiler (Triton 3.6 miscompiled 64-row wgmma beside a side use of
        # the streamed operand: benchmarks/perf/NOTES.md), one that disagrees everywhere at the code generator
        from ..backend.codegen import LaunchConfig, TileOptions

        named, _ = runner._named(xs)
        progs: list[tuple[str, Any]] = [("tuned", runner.program)]
        if any(x.is_cuda for x in xs):
            for cfg in (LaunchConfig(4, 1), LaunchConfig(4, 1, TileOptions(dot_min_m=16)),
                        LaunchConfig(8, 1, TileOptions(dot_min_m=16)), LaunchConfig(2, 1, TileOptions(dot_min_m=16))):
                try:
                    progs.append((cfg.key(), vm_compile(mug, config=cfg)))
                    progs[-1][1].copy_returned_inputs = runner.program.copy_returned_inputs
                except Exception as e:
                    line.setdefault("config_errors", []).append(f"{cfg.key()}: {type(e).__name__}: {str(e)[:200]}")
        rows: dict[str, Any] = {}
        for label, prog in progs:
            try:
                res = prog(**named)
                outs_p = res if isinstance(res, tuple) else (res,)
                rows[label] = [float((o.detach().double().cpu().reshape(-1)
                                      - torch.from_numpy(np.asarray(m, dtype=np.float64).reshape(-1))).abs().max())
                               / max(1e-30, float(np.abs(np.asarray(m)).max())) for o, m in zip(outs_p, mu64,
                                                                                               strict=True)]
            except Exception as e:
                rows[label] = f"{type(e).__name__}: {str(e)[:200]}"
        line["program_vs_mu64_rel"] = rows  # per program output: max |program - μGraph float64| / max |μGraph|
    line |= {"partition": name, "graph": str(lifted.graph), "mugraph": None if mug is None else str(mug),
             "inputs": [{"shape": list(x.shape), "stride": list(x.stride()), "dtype": str(x.dtype)} for x in xs],
             "aten_ops": [str(n.format_node()) for n in lifted.nodes],
             "launch": getattr(runner.program, "launch", None), "outputs": outs}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


# --------------------------------------------------------------------------- the graph pass


class _Support(OperatorSupportBase):
    def __init__(self, ok: set[fx.Node]) -> None:
        self.ok = ok

    def is_node_supported(self, submodules: Any, node: fx.Node) -> bool:
        return node in self.ok


_COMPARISONS = frozenset({"le", "lt", "ge", "gt", "eq", "ne"})


def _isolated(n: fx.Node, consts: set[fx.Node] | None = None) -> tuple[Reason, str] | None:
    """None if ``n`` lifts on its own (with the constants it reads, ``consts``), else why not."""
    if n.op != "call_function":
        return Reason.NOT_TENSOR, "not a call"
    if n.target is operator.getitem:
        return None
    getitems = [u for u in n.users if u.target is operator.getitem]
    src = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
    if op_name(n) in ("bitwise_not", "logical_not") and src is not None and op_name(src) in _COMPARISONS:
        return None  # ~(x <= c): a comparison made in the partition, negated (alone it would be a boolean input)
    before: list[fx.Node] = []
    todo = [a for a in n.all_input_nodes if consts and a in consts]
    while todo:  # the constants it reads, computed while lifting with it (constant indices)
        a = todo.pop()
        if a not in before:
            before.append(a)
            todo += [b for b in a.all_input_nodes if b in (consts or ())]
    order = {m: i for i, m in enumerate(n.graph.nodes)} if before else {}
    try:
        _probe([*sorted(before, key=order.__getitem__), n, *getitems])
    except LiftError as e:
        if e.node in before:  # a constant it cannot read as one (a -inf mask): ATen makes it, it is an input then
            return _isolated(n)
        return e.reason, e.message
    return None


def _probe(nodes: list[fx.Node]) -> None:
    try:
        lift(nodes)
    except LiftError as e:
        if e.reason is Reason.NO_COMPUTE or e.alone:
            return  # a view on its own computes nothing, a mask leaves nothing: either may be lifted in a partition
        raise


def transform(gm: fx.GraphModule, opts: CaptureOptions, report: Report, kind: str,
              fallback_for: FallbackFor = None) -> list[PartitionRunner]:
    """Replace the partitions of ATen graph ``gm`` that verimirage takes by verified kernels (in place).

    ``fallback_for``: what the fallback would run for a partition, for ``opts.profile`` (:data:`FallbackFor`).

    Returns the runners of the taken partitions: the caller keeps them alive as long as the compiled code
    (the custom op finds them in a weak table).
    """
    from torch.fx.passes.tools_common import legalize_graph

    gidx = report.new_graph(kind)
    rewrote = _mask_threshold_backward(gm) + _unused_attention_state(gm)
    hold_constants(gm)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    why: dict[fx.Node, tuple[Reason, str]] = {}
    ok: set[fx.Node] = set()
    consts = constant_nodes(nodes)  # computed while lifting (a mask made in the forward), whatever their op
    for n in nodes:
        r = None if n in consts else _isolated(n, consts)
        if r is None:
            ok.add(n)
        else:
            why[n] = r
    # getitem of an unsupported node is unsupported
    for n in nodes:
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node) and n.args[0] not in ok:
            ok.discard(n)
            why[n] = why.get(n.args[0], (Reason.NOT_IN_REGISTRY, "its source is not lifted"))
    # a constant none of whose readers (through other constants) lifts: ATen makes it, with that reason
    useful: set[fx.Node] = set()
    for n in reversed(nodes):
        if n in consts and any(u in useful or (u in ok and u not in consts) for u in n.users):
            useful.add(n)
    for n in consts - useful:
        ok.discard(n)
        why[n] = (Reason.CONSTANT, "made in the forward and read only by ops left to ATen")
    device = _device(gm)
    op = None
    taken = 0
    runners: list[PartitionRunner] = []
    in_part: dict[fx.Node, int] = {}
    strict: set[fx.Node] = set()
    cuts: set[fx.Node] = set()
    for rnd in range(3):
        retry = False
        spliced: set[fx.Node] = set()
        for lp in _propose(gm, ok, why, strict, opts.chain_limit, cuts):
            if spliced.intersection((*lp.inputs, *lp.extra)):
                # it reads a partition taken before it (a matmul chain cut in two): its inputs are now that
                # partition's results, so it is lifted again (the same graph, inputs in the same order)
                try:
                    lp = lift(lp.nodes, strict=bool(strict.intersection(lp.nodes)))
                except LiftError as e:
                    ok.discard(e.node)
                    why[e.node] = (e.reason, e.message)
                    retry = True
                    continue
            ncomp = sum(is_compute(n) for n in lp.nodes)
            rec = report.new_partition(gidx, [op_name(n) for n in lp.nodes if is_tensor_op(n)])
            runner = None
            if ncomp < opts.min_compute_ops:
                rec.reason = f"{Reason.NO_COMPUTE.value}: {ncomp} compute op(s) < min_compute_ops"
            else:
                runner = compile_partition(gm, lp, opts, rec, device, fallback_for)
            extra = [n for n in lp.nodes if op_name(n) in SPLIT_ON_FAILURE]
            if runner is None and rnd < 2 and extra and ncomp > len(extra) and \
                    (rec.reason or "").startswith(Reason.NO_CANDIDATE.value):
                # the gradient padding ops joined two partitions that verified apart: apart again
                _note_retry(report, f"{kind}{gidx}", rec, ncomp, f"without its {sorted({op_name(n) for n in extra})}")
                for n in extra:
                    ok.discard(n)
                    why[n] = (Reason.NO_CANDIDATE, f"left out of partition {rec.name}, which had no verified "
                                                   f"candidate with it ({rec.reason})")
                retry = True
                continue
            if runner is None and rnd < 2 and ncomp >= BISECT_MIN and \
                    (rec.reason or "").startswith(Reason.NO_CANDIDATE.value):
                # no verified candidate for the whole: its halves (in graph order) are searched apart, so one
                # piece the verifier cannot prove does not leave the rest of a large partition behind
                comp = [n for n in lp.nodes if is_compute(n)]
                cuts.add(comp[len(comp) // 2])
                _note_retry(report, f"{kind}{gidx}", rec, ncomp, "in two halves")
                retry = True
                continue
            if runner is None and rnd < 2 and _layout_failure(lp, rec):
                # the kernels could not express a view: again with views as partition boundaries
                _note_retry(report, f"{kind}{gidx}", rec, ncomp, "split at its views")
                strict |= set(lp.nodes)
                retry = True
                continue
            idx = report.add_partition(rec)
            for n in lp.nodes:
                in_part[n] = idx
                ok.discard(n)
            if runner is None:
                continue
            rec.taken = True
            taken += 1
            runners.append(runner)
            op = op or _custom_op()
            pid = _NEXT_PID[0]
            _NEXT_PID[0] += 1
            _RUNNERS[pid] = runner
            _splice(gm, lp, op, pid)
            spliced.update(lp.nodes)
        if not retry:
            break
    for n in nodes:
        if not is_tensor_op(n) or n.target is operator.getitem:
            continue
        part = in_part.get(n)
        r = why.get(n)
        if part is None and r is None and is_compute(n):  # every op left behind says why
            r = (Reason.UNPARTITIONED, "no partition held it after the capture's retries")
        report.ops.append(OpRecord(gidx, op_name(n), n.name, is_compute(n), part,
                                   None if r is None else r[0].value, None if r is None else r[1]))
    if taken or rewrote:
        legalize_graph(gm)
        gm.graph.lint()
        gm.recompile()
    log.info("verimirage: %s graph: %s", kind, report.summary(gidx))
    return runners


def _note_retry(report: Any, graph: str, rec: Any, ncomp: int, how: str) -> None:
    """Log and note in the report that partition ``rec`` of ``graph`` was not taken whole and is tried again ``how``."""
    log.info("verimirage: %s: %s; again %s", rec.name, rec.reason, how)
    report.notes.append(f"{graph}: a partition of {ncomp} compute ops was not taken whole ({rec.reason}); "
                        f"tried again {how}")


def _mask_threshold_backward(gm: fx.GraphModule) -> int:
    """Write each ``threshold_backward(grad, x, c)`` as ``where(x <= c, 0, grad)`` (its definition), in place.

    The comparison then stays in ATen and the ``where`` lifts with its booleans: lifted whole, ``grad * step(x)``
    is NaN where ``grad`` is inf or NaN and ``x <= c`` (``sqrt(relu(x))``'s gradient at 0 is inf, which ATen
    masks to 0). Returns the number of nodes rewritten."""
    aten = torch.ops.aten
    k = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or op_name(n) != "threshold_backward" or len(n.args) != 3 or n.kwargs:
            continue
        gr, x, c = n.args
        xv, v = x.meta.get("val") if isinstance(x, fx.Node) else None, n.meta.get("val")
        if not (isinstance(gr, fx.Node) and isinstance(xv, torch.Tensor) and isinstance(v, torch.Tensor)
                and isinstance(c, (int, float)) and not isinstance(c, bool)):
            continue
        try:
            with getattr(xv, "fake_mode", None) or contextlib.nullcontext():
                mv = aten.le.Scalar(xv, c)
                wv = aten.where.ScalarSelf(mv, 0.0, gr.meta["val"])
        except Exception:  # no meta to give the new nodes: the node stays as it was
            continue
        if tuple(wv.shape) != tuple(v.shape) or wv.dtype != v.dtype:
            continue
        with gm.graph.inserting_before(n):
            m = gm.graph.call_function(aten.le.Scalar, (x, c))
            w = gm.graph.call_function(aten.where.ScalarSelf, (m, 0.0, gr))
        m.meta["val"], w.meta["val"] = mv, wv
        n.replace_all_uses_with(w)
        gm.graph.erase_node(n)
        k += 1
    return k


#: results of the CUDA attention ops that only a dropout reads (its random-number state) or that describe nested
#: (packed) batches, by op name: with ``dropout_p == 0`` nothing reads their values
_ATTENTION_STATE = {"_scaled_dot_product_flash_attention": (2, 3, 6, 7, 8),
                    "_scaled_dot_product_efficient_attention": (2, 3),
                    "_scaled_dot_product_cudnn_attention": (2, 3, 6, 7, 8)}


def _unused_attention_state(gm: fx.GraphModule) -> int:
    """Give each read of a CUDA attention op's random-number state (or empty nested-batch offsets) a tensor of its
    own, allocated like it (``empty_strided``), where the op has no dropout, so the op can be lifted: the forward
    graph of a training step saves that state for the backward op, which reads it only with a dropout. Returns
    the number of results so replaced."""
    from .aten import SDPA_ARGS

    k = 0
    for n in list(gm.graph.nodes):
        name = op_name(n) if n.op == "call_function" else ""
        if name not in _ATTENTION_STATE:
            continue
        dpos = SDPA_ARGS[name][1]
        p = n.kwargs.get("dropout_p", n.args[dpos] if dpos is not None and dpos < len(n.args) else 0.0)
        if not isinstance(p, (int, float)) or p != 0:
            continue
        for u in list(n.users):
            if u.target is not operator.getitem or u.args[1] not in _ATTENTION_STATE[name] or not u.users:
                continue
            v = u.meta.get("val")
            if not isinstance(v, torch.Tensor):
                continue
            try:
                size, stride = list(_static_shape(v)), [int(x) for x in v.stride()]
            except Unsupported:
                continue
            with gm.graph.inserting_before(u):
                e = gm.graph.call_function(torch.ops.aten.empty_strided.default, (size, stride),
                                           {"dtype": v.dtype, "device": v.device})
            e.meta["val"] = v
            u.replace_all_uses_with(e)
            gm.graph.erase_node(u)
            k += 1
    return k


_LAYOUT_OPS = frozenset({"reshape", "broadcast_to", "permute", "slice"})

#: a partition of at least this many compute ops with no verified candidate is tried again in two halves
BISECT_MIN = 4

#: ATen ops that pad or make constants (gradients of slices): a partition that has no verified candidate with
#: them is tried again without them (they tend to join partitions that verify apart)
SPLIT_ON_FAILURE = frozenset({"slice_backward", "new_zeros", "new_full", "full", "zeros"})


def _layout_failure(lp: Lifted, rec: PartitionReport) -> bool:
    """Whether a partition with registry layout ops failed to compile, launch or check."""
    failed = (rec.reason or "").startswith((Reason.COMPILE_FAILED.value, Reason.NUMERIC.value))
    return failed and any(n.op in _LAYOUT_OPS for n in lp.graph.nodes)


_MATMULS = frozenset({"mm", "bmm", "matmul", "addmm", "baddbmm"})
_ATTENTION = frozenset({"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                        "_scaled_dot_product_cudnn_attention"})


def _shape_of(a: Any) -> tuple[int, ...] | None:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    if not isinstance(v, torch.Tensor):
        return None
    try:
        return _static_shape(v)
    except Unsupported:
        return None


def matmul_dims(n: fx.Node) -> tuple[int, int] | None:
    """(reduction width K, output columns N) of a matmul-like ATen node (attention: head dims), else None."""
    name = op_name(n)
    if name in _MATMULS:
        off = 1 if name in ("addmm", "baddbmm") else 0
        if len(n.args) < off + 2:
            return None
        a, b = _shape_of(n.args[off]), _shape_of(n.args[off + 1])
        if not a or not b:
            return None
        return a[-1], b[-1]
    if name in _ATTENTION and len(n.args) >= 3:
        q, v = _shape_of(n.args[0]), _shape_of(n.args[2])
        if not q or not v:
            return None
        return q[-1], v[-1]
    return None


def split_chains(nodes: Sequence[fx.Node], limit: int | None) -> list[list[fx.Node]]:
    """Cut a partition (``nodes`` in graph order) before every matmul ``D`` that consumes, through other ops
    of the partition, a matmul ``U`` of it with ``K(U) > limit`` or ``N(D) > limit`` (see
    :attr:`CaptureOptions.chain_limit`). ``D`` and what depends on it go to a new part; views and other
    ops that feed only that part (and depend on no matmul) follow it. Each part is cut again as needed.
    Returns the parts, each in graph order (one part, ``nodes`` itself, when nothing is cut)."""
    if limit is None:
        return [list(nodes)]
    todo, done = [list(nodes)], []
    while todo:
        rest = todo.pop()
        inside = set(rest)
        anc: dict[fx.Node, frozenset[fx.Node]] = {}
        cut = None
        for n in rest:
            a: frozenset[fx.Node] = frozenset().union(*(anc[i] for i in n.all_input_nodes if i in inside))
            dims = matmul_dims(n)
            if dims is not None:
                if any((matmul_dims(u) or (0, 0))[0] > limit for u in a) or (a and dims[1] > limit):
                    cut = n
                    break
                a = a | {n}
            anc[n] = a
        if cut is None:
            done.append(rest)
            continue
        pos = rest.index(cut)
        part = {cut}
        for n in rest[pos + 1:]:
            if any(i in part for i in n.all_input_nodes):
                part.add(n)
        for n in reversed(rest[:pos]):  # views of weights and the like, used only by the new part
            users = [u for u in n.users if u in inside]
            if users and all(u in part for u in users) and not anc.get(n) and matmul_dims(n) is None:
                part.add(n)
        todo.append([n for n in rest if n in part])
        todo.append([n for n in rest if n not in part])
    order = {n: i for i, n in enumerate(nodes)}
    return sorted((p for p in done if p), key=lambda p: order[p[0]])


def _propose(gm: fx.GraphModule, ok: set[fx.Node], why: dict[fx.Node, tuple[Reason, str]],
             strict: set[fx.Node], chain_limit: int | None = None,
             cuts: set[fx.Node] | None = None) -> list[Lifted]:
    """Partitions of the supported nodes ``ok``, cut at matmul chains (:func:`split_chains`) and before each
    node of ``cuts`` (a partition's nodes in graph order: no cycle), each lifted (nodes that fail to lift leave
    ``ok``)."""
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    for _ in range(len(nodes) + 1):
        parts = CapabilityBasedPartitioner(gm, _Support(ok), allows_single_node_partition=True).propose_partitions()
        lifted: list[Lifted] = []
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        failed = False
        pieces = [q for p in parts for q in split_chains(sorted(p.nodes, key=lambda n: order[n]), chain_limit)]
        pieces = [q for p in pieces for q in _cut_before(p, cuts or set())]
        for pn in pieces:
            if not any(is_compute(n) for n in pn):
                for n in pn:
                    why[n] = (Reason.NO_COMPUTE, "a view between ops that are not taken")
                continue
            try:
                lifted.append(lift(pn, strict=bool(strict.intersection(pn))))
            except LiftError as e:
                bad = e.node
                if bad.target is operator.getitem and isinstance(bad.args[0], fx.Node):
                    # the partitioner keeps a multi-result node's getitems with it whatever ``ok`` says: the node
                    # itself leaves (else the same partition comes back until the loop gives up on all of them)
                    bad = bad.args[0]
                ok.discard(bad)
                why[bad] = (e.reason, e.message)
                for u in list(bad.users):
                    if u.target is operator.getitem:
                        ok.discard(u)
                        why[u] = (e.reason, e.message)
                failed = True
                break
        if not failed:
            return lifted
    return []


def _cut_before(nodes: list[fx.Node], cuts: set[fx.Node]) -> list[list[fx.Node]]:
    """``nodes`` (in graph order) cut before each node of ``cuts``: every edge between the pieces runs forward."""
    out: list[list[fx.Node]] = [[]]
    for n in nodes:
        if n in cuts and out[-1]:
            out.append([])
        out[-1].append(n)
    return out


def _device(gm: fx.GraphModule) -> torch.device:
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


def _splice(gm: fx.GraphModule, lp: Lifted, op: Any, pid: int) -> None:
    g = gm.graph
    inside = set(lp.nodes)
    last = lp.nodes[-1]
    with g.inserting_after(last):
        call = g.call_function(op, (pid, [*lp.inputs, *lp.extra]))
    call.meta["val"] = [n.meta.get("val") for n in lp.outputs]
    prev = call
    for i, o in enumerate(lp.outputs):
        with g.inserting_after(prev):
            gi = g.call_function(operator.getitem, (call, i))
        gi.meta = {"val": o.meta.get("val")}
        if "tensor_meta" in o.meta:
            gi.meta["tensor_meta"] = o.meta["tensor_meta"]
        o.replace_all_uses_with(gi, delete_user_cb=lambda u: u not in inside)
        prev = gi
    for n in reversed(lp.nodes):
        g.erase_node(n)
