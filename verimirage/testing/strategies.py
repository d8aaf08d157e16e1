"""Hypothesis strategies: input dicts for a graph, and random well-formed graphs.

Inputs are drawn as a few small choices (value regime, a seed, a memory
layout per input) and then filled with numpy's generator, so drawing is fast
for tensors of thousands of elements and hypothesis shrinks towards the
normal regime and contiguous layouts.

Value regimes (see :data:`REGIMES`):

``normal``
    every input standard normal, clipped to [-3, 3].
``large``
    inputs that feed max-shifted logits (``exp(x - max(x))``: a numerically
    safe softmax, log-softmax or log-sum-exp) get magnitudes up to 8 where a
    contraction makes the logits (logits of a few hundred), and up to 1.25
    times ``log`` of the dtype's largest value (over the exponent's scale
    factor) where the input itself reaches the logits, so ``exp`` overflows
    float32, bfloat16 and float16 unless the row max is subtracted; float16
    inputs that a norm squares (no contraction between) get magnitudes up to
    2048, whose squares overflow float16 but not the norm; the others are
    normal.
``tiny``
    inputs that reach an ``rms_norm``, or a norm written out (a reduction
    under ``rsqrt``, ``sqrt``, ``reciprocal`` or a division, with an ``eps``
    added), get magnitudes 1e-4..1e-2 and whole rows (fibres along the
    normalised axis) of exact zeros, where a norm divides by almost nothing
    or by ``sqrt(eps)``; the others are normal.
``mixed``
    every input has random signs and magnitudes spread over 2**-6..2**1,
    with some exact zeros.

Layouts: a tensor is a view into a larger buffer whose other elements are
NaN (a kernel that reads outside the view produces NaN): ``contiguous``,
``transposed`` (the last two dims swapped in memory), ``padded`` (rows of a
wider buffer), ``strided`` (every other element of the last dim) and
``offset`` (a slice of the leading dim, so the storage offset is not zero).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..ir.builders import Tensor
from ..ir.dtypes import DType, float32
from ..ir.errors import GraphError
from ..ir.graph import Graph, node_list, output_refs
from ..ir.reference import check_evaluable
from .analysis import GraphFacts, analyze

REGIMES: tuple[str, ...] = ("normal", "large", "tiny", "mixed")
LAYOUTS: tuple[str, ...] = ("contiguous", "transposed", "padded", "strided", "offset")


def _torch() -> Any:
    import torch

    return torch


def torch_dtype(dt: DType) -> Any:
    """The ``torch`` dtype of a verimirage dtype."""
    return getattr(_torch(), dt.torch_name)


def applicable_regimes(g: Graph, facts: GraphFacts | None = None) -> tuple[str, ...]:
    """The regimes that mean something for ``g``.

    ``large`` only where a max-shifted ``exp`` is written (a naive ``exp``
    overflows there by the program's own definition) or a norm squares a
    float16 input, ``tiny`` only where a norm divides (an ``rms_norm``, or a
    reduction plus an ``eps`` divided by).
    """
    f = facts or analyze(g)
    regs = ["normal"]
    if f.large_inputs or f.wide_inputs:
        regs.append("large")
    if f.norm_inputs:
        regs.append("tiny")
    regs.append("mixed")
    return tuple(regs)


class Inputs(dict):  # type: ignore[type-arg]
    """A drawn input dict (name -> torch tensor) that remembers how it was drawn.

    Its ``repr`` is short (regime, seed, layouts, shapes), so hypothesis'
    falsifying-example reports stay readable.
    """

    regime: str = "given"
    seed: int = 0
    layouts: Mapping[str, str] = {}

    def __repr__(self) -> str:
        parts = []
        for k, v in self.items():
            lay = self.layouts.get(k, "?") if self.layouts else "?"
            parts.append(f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')} {lay}")
        return f"Inputs(regime={self.regime!r}, seed={self.seed}, {{{', '.join(parts)}}})"


# --------------------------------------------------------------------------- values


#: ``log`` of each dtype's largest value: ``exp`` overflows above it
_LOG_MAX = {"f16": math.log(65504.0), "bf16": math.log(3.3895e38), "f32": math.log(3.4028e38)}


def _large_bound(dt: DType, factor: float | None) -> float:
    """The ``large`` regime's magnitude: 8 for an input a contraction multiplies into the logits (``factor`` None),
    else past the dtype's ``exp`` overflow once the exponent's ``scale`` factor (at most 1 counted) has multiplied it
    (logits of up to 8 overflowed nothing in float32: a kernel dropping the max shift passed)."""
    if factor is None:
        return 8.0
    return 1.25 * _LOG_MAX.get(dt.short, _LOG_MAX["f32"]) / min(1.0, max(factor, 1e-3))


def _values(rng: np.random.Generator, shape: tuple[int, ...], kind: str, norm_axis: int | None,
            large: float = 8.0) -> np.ndarray:
    if kind == "normal":
        return np.clip(rng.standard_normal(shape), -3.0, 3.0)
    if kind == "large":
        return rng.uniform(-large, large, shape)
    if kind == "wide":  # float16 a norm squares: |x| past 256 (x * x overflows float16), below 2048
        return rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.uniform(6.0, 11.0, shape)
    if kind == "tiny":
        v = rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(-4.0, -2.0, shape)
        if norm_axis is not None and len(shape) > 0:
            mshape = list(shape)
            mshape[norm_axis] = 1
            keep = rng.random(mshape) >= 0.3  # about 30% of the normalised rows are exactly zero
            v = v * keep
        return v
    if kind == "mixed":
        v = rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.uniform(-6.0, 1.0, shape)
        return np.where(rng.random(shape) < 0.05, 0.0, v)
    raise GraphError(f"testing: unknown value regime {kind!r}; expected one of {REGIMES}")


def _input_kind(regime: str, name: str, facts: GraphFacts) -> str:
    if regime == "large":
        return "large" if name in facts.large_inputs else "wide" if name in facts.wide_inputs else "normal"
    if regime == "tiny":
        return "tiny" if name in facts.norm_inputs else "normal"
    return regime


def _layouts_for(shape: tuple[int, ...], allow: bool) -> list[str]:
    if not allow or len(shape) == 0:
        return ["contiguous"]
    out = ["contiguous", "padded", "strided", "offset"]
    if len(shape) >= 2:
        out.insert(1, "transposed")
    return out


def place(values: Any, layout: str) -> Any:
    """A tensor equal to ``values`` (a contiguous torch tensor) laid out as ``layout``.

    The view's buffer holds NaN wherever the view does not look.
    """
    torch = _torch()
    shape = tuple(values.shape)
    dt = values.dtype
    if layout == "contiguous":
        return values.clone()
    if layout == "transposed" and len(shape) >= 2:
        buf = torch.full((*shape[:-2], shape[-1], shape[-2]), float("nan"), dtype=dt, device=values.device)
        view = buf.transpose(-1, -2)
    elif layout == "padded":
        buf = torch.full((*shape[:-1], shape[-1] + 3), float("nan"), dtype=dt, device=values.device)
        view = buf[..., 1 : 1 + shape[-1]]
    elif layout == "strided":
        buf = torch.full((*shape[:-1], 2 * shape[-1]), float("nan"), dtype=dt, device=values.device)
        view = buf[..., ::2]
    elif layout == "offset":
        buf = torch.full((shape[0] + 2, *shape[1:]), float("nan"), dtype=dt, device=values.device)
        view = buf[1 : 1 + shape[0]]
    else:
        raise GraphError(f"testing: unknown layout {layout!r} for shape {shape}; expected one of {LAYOUTS}")
    view.copy_(values)
    return view


def make_inputs(
    g: Graph,
    regime: str,
    seed: int,
    layouts: Mapping[str, str] | None = None,
    *,
    device: str = "cpu",
    facts: GraphFacts | None = None,
) -> Inputs:
    """The input dict drawn for ``regime`` and ``seed`` (deterministic), on ``device``."""
    torch = _torch()
    f = facts or analyze(g)
    rng = np.random.default_rng(seed)
    out = Inputs()
    out.regime, out.seed, out.layouts = regime, seed, dict(layouts or {})
    for t in g.inputs:
        assert t.name is not None
        kind = _input_kind(regime, t.name, f)
        v = _values(rng, t.shape, kind, f.norm_inputs.get(t.name), _large_bound(t.dtype, f.large_direct.get(t.name)))
        tv = torch.from_numpy(np.ascontiguousarray(v)).to(torch_dtype(t.dtype)).to(device)
        out[t.name] = place(tv, out.layouts.get(t.name, "contiguous"))
    return out


def inputs(
    graph: Graph,
    *,
    regimes: Sequence[str] | None = None,
    allow_noncontiguous: bool = True,
    device: str = "cpu",
) -> st.SearchStrategy[Inputs]:
    """A hypothesis strategy of input dicts for ``graph``: name -> torch tensor of the input's dtype and shape.

    ``regimes``: value regimes to draw from (:data:`REGIMES`); by default
    those that apply to the graph (:func:`applicable_regimes`).
    ``allow_noncontiguous``: also draw transposed, padded, strided and offset
    views of larger NaN-filled buffers with the same logical shape.
    ``device``: where the tensors live (``"cuda"`` on a GPU machine).
    """
    if not isinstance(graph, Graph):
        raise GraphError(f"testing.inputs: expected a vm.Graph, got {type(graph).__name__}")
    check_evaluable(graph, "testing.inputs")  # every example is checked against the float64 reference
    facts = analyze(graph)
    regs = tuple(regimes) if regimes is not None else applicable_regimes(graph, facts)
    bad = [r for r in regs if r not in REGIMES]
    if bad or not regs:
        raise GraphError(f"testing.inputs: regimes {list(regs)}; expected a non-empty subset of {list(REGIMES)}")
    specs = [(t.name, t.shape) for t in graph.inputs]

    @st.composite
    def draw(data: Any) -> Inputs:
        regime = data(st.sampled_from(regs))
        seed = data(st.integers(0, 2**32 - 1))
        layouts = {str(n): data(st.sampled_from(_layouts_for(s, allow_noncontiguous))) for n, s in specs}
        return make_inputs(graph, regime, seed, layouts, device=device, facts=facts)

    return draw()


# --------------------------------------------------------------------------- pinned examples


def encode_inputs(case: Mapping[str, Any]) -> dict[str, Any]:
    """A literal-friendly encoding of an input dict, preserving each tensor's exact memory layout."""
    torch = _torch()
    enc: dict[str, Any] = {"__meta__": {}}
    if isinstance(case, Inputs):
        enc["__meta__"] = {"regime": case.regime, "seed": case.seed, "layouts": dict(case.layouts)}
    for name, t in case.items():
        st_ = t.untyped_storage()
        n = st_.nbytes() // t.element_size()
        base = torch.empty(0, dtype=t.dtype, device=t.device)
        base.set_(st_, 0, (n,), (1,))
        ints = base.detach().cpu().view(torch.int16 if t.element_size() == 2 else torch.int32)
        enc[name] = {
            "dtype": str(t.dtype).removeprefix("torch."),
            "size": list(t.shape),
            "stride": list(t.stride()),
            "offset": int(t.storage_offset()),
            "data": base64.b64encode(ints.numpy().tobytes()).decode("ascii"),
        }
    return enc


def decode_inputs(enc: Mapping[str, Any], *, device: str = "cpu") -> Inputs:
    """The input dict that :func:`encode_inputs` encoded, on ``device``, with the same layouts."""
    torch = _torch()
    out = Inputs()
    meta = enc.get("__meta__", {})
    out.regime = meta.get("regime", "pinned")
    out.seed = meta.get("seed", 0)
    out.layouts = meta.get("layouts", {})
    for name, e in enc.items():
        if name == "__meta__":
            continue
        dt = getattr(torch, e["dtype"])
        raw = np.frombuffer(base64.b64decode(e["data"]), dtype=np.int16 if dt != torch.float32 else np.int32)
        base = torch.from_numpy(raw.copy()).view(dt).to(device)
        out[name] = base.as_strided(tuple(e["size"]), tuple(e["stride"]), e["offset"])
    return out


# --------------------------------------------------------------------------- random graphs

GRAPH_OPS: tuple[str, ...] = (
    "matmul", "add", "sub", "mul", "div", "exp", "silu", "gelu", "relu", "sqrt", "rsqrt", "square", "neg",
    "scale", "sum", "mean", "max", "rms_norm", "concat", "transpose", "softmax",
)


@dataclass(frozen=True)
class _Mag:
    """A bound on |value| and, when positive, a lower bound on the value (for safe division and roots)."""

    hi: float
    lo: float | None = None


class _GraphDraw:
    def __init__(self, data: Any, dims: Sequence[int], dtype: DType, max_rank: int, safe: bool, cap: float,
                 max_numel: int) -> None:
        self.data = data
        self.dims = list(dims)
        self.dtype = dtype
        self.max_rank = max_rank
        self.safe = safe
        self.cap = cap
        self.max_numel = max_numel
        self.g = Graph()
        self.pool: list[tuple[Tensor, _Mag]] = []
        self.n_inputs = 0

    def new_input(self, shape: tuple[int, ...]) -> tuple[Tensor, _Mag]:
        t = self.g.input(f"x{self.n_inputs}", shape, self.dtype)
        self.n_inputs += 1
        item = (t, _Mag(3.0))
        self.pool.append(item)
        return item

    def random_shape(self) -> tuple[int, ...]:
        rank = self.data(st.integers(1, self.max_rank))
        return tuple(self.data(st.sampled_from(self.dims)) for _ in range(rank))

    def pick(self, ok: Any = None) -> tuple[Tensor, _Mag] | None:
        """An operand: usually the latest value (so graphs grow deep), else any value of the pool."""
        cands = [p for p in self.pool if ok is None or ok(p)]
        if not cands:
            return None
        if self.data(st.integers(0, 3)) != 0:
            return cands[-1]
        return self.data(st.sampled_from(cands))

    def partner(self, shape: tuple[int, ...], positive: bool = False) -> tuple[Tensor, _Mag]:
        """An operand that broadcasts with ``shape``: from the pool, or a new input (maybe with size-1 dims)."""
        same = [p for p in self.pool if p[0].shape == shape and (not positive or p[1].lo)]
        if same and self.data(st.booleans()):
            return self.data(st.sampled_from(same))
        bshape = tuple(1 if self.data(st.integers(0, 3)) == 0 else d for d in shape)
        if len(bshape) > 1 and self.data(st.integers(0, 3)) == 0:
            bshape = bshape[1:]  # lower rank: numpy aligns trailing dims
        t, m = self.new_input(bshape)
        if positive:
            e = self.g.exp(t)
            item = (e, _Mag(math.exp(m.hi), math.exp(-m.hi)))
            self.pool.append(item)
            return item
        return t, m

    def add(self, t: Tensor, m: _Mag) -> bool:
        if self.safe and (not math.isfinite(m.hi) or m.hi > self.cap):
            return False
        if math.prod(t.shape) > self.max_numel:
            return False
        self.pool.append((t, m))
        return True

    def step(self, op: str) -> Tensor | None:
        g, data = self.g, self.data
        safe = self.safe
        if op in ("exp", "silu", "gelu", "relu", "sqrt", "rsqrt", "square", "neg", "scale"):
            need_pos = safe and op in ("sqrt", "rsqrt")
            item = self.pick((lambda p: p[1].lo is not None and p[1].lo > 0) if need_pos else None)
            if item is None or (safe and op == "exp" and item[1].hi > 6.0):
                return None
            x, m = item
            if op == "exp":
                r, mm = g.exp(x), _Mag(math.exp(m.hi), math.exp(-m.hi))
            elif op == "sqrt":
                r, mm = g.sqrt(x), _Mag(math.sqrt(m.hi), math.sqrt(m.lo) if m.lo else None)
            elif op == "rsqrt":
                r = g.rsqrt(x)
                mm = _Mag(1 / math.sqrt(m.lo) if m.lo else math.inf, 1 / math.sqrt(m.hi) if m.hi > 0 else None)
            elif op == "square":
                r, mm = g.square(x), _Mag(m.hi**2, m.lo**2 if m.lo else None)
            elif op == "scale":
                c = data(st.sampled_from([0.5, 2.0, -1.5, 0.125, 3.0]))
                r, mm = g.scale(x, c), _Mag(abs(c) * m.hi, c * m.lo if m.lo and c > 0 else None)
            elif op == "relu":
                r, mm = g.relu(x), _Mag(m.hi, m.lo)
            else:
                r, mm = getattr(g, op)(x), _Mag(m.hi)
            return r if self.add(r, mm) else None
        if op in ("add", "sub", "mul", "div"):
            x, m = self.pick()  # type: ignore[misc]
            y, n = self.partner(x.shape, positive=safe and op == "div")
            if data(st.booleans()) and op != "div":
                x, m, y, n = y, n, x, m
            if op == "add":
                r, mm = g.add(x, y), _Mag(m.hi + n.hi, m.lo + n.lo if m.lo and n.lo else None)
            elif op == "sub":
                r, mm = g.sub(x, y), _Mag(m.hi + n.hi)
            elif op == "mul":
                r, mm = g.mul(x, y), _Mag(m.hi * n.hi, m.lo * n.lo if m.lo and n.lo else None)
            else:
                hi = m.hi / n.lo if n.lo else math.inf
                r, mm = g.div(x, y), _Mag(hi, m.lo / n.hi if m.lo and n.lo else None)
            return r if self.add(r, mm) else None
        if op == "matmul":
            item = self.pick(lambda p: p[0].shape and len(p[0].shape) >= 2)
            if item is None:
                return None
            x, m = item
            k = x.shape[-1]
            want = (*x.shape[:-2], k)
            mates = [p for p in self.pool if len(p[0].shape) >= 2 and p[0].shape[:-1] == want]
            if mates and data(st.booleans()):
                y, n = data(st.sampled_from(mates))
            else:
                y, n = self.new_input((*want, data(st.sampled_from(self.dims))))
            r = g.matmul(x, y)
            return r if self.add(r, _Mag(k * m.hi * n.hi)) else None
        if op in ("sum", "mean", "max"):
            x, m = self.pick()  # type: ignore[misc]
            ax = data(st.integers(0, len(x.shape) - 1))
            r = getattr(g, op)(x, ax)
            size = x.shape[ax]
            mm = _Mag(m.hi * (size if op == "sum" else 1), (m.lo * (size if op == "sum" else 1)) if m.lo else None)
            return r if self.add(r, mm) else None
        if op == "rms_norm":
            x, m = self.pick()  # type: ignore[misc]
            ax = data(st.integers(0, len(x.shape) - 1))
            w = None
            wm = 1.0
            if data(st.booleans()):
                w, wmag = self.new_input((x.shape[ax],))
                wm = wmag.hi
            eps = data(st.sampled_from([1e-6, 1e-5]))
            r = g.rms_norm(x, w, axis=ax, eps=eps)
            return r if self.add(r, _Mag(math.sqrt(x.shape[ax]) * wm)) else None
        if op == "concat":
            x, m = self.pick()  # type: ignore[misc]
            ax = data(st.integers(0, len(x.shape) - 1))
            if data(st.booleans()):
                y, n = x, m
            else:
                shape = list(x.shape)
                shape[ax] = data(st.sampled_from(self.dims))
                y, n = self.new_input(tuple(shape))
            r = g.concat([x, y], ax)
            return r if self.add(r, _Mag(max(m.hi, n.hi), min(m.lo, n.lo) if m.lo and n.lo else None)) else None
        if op == "softmax":  # a composite: exp(x [- max(x)]) / sum(exp(x [- max(x)]))
            x, m = self.pick()  # type: ignore[misc]
            ax = data(st.integers(0, len(x.shape) - 1))
            stable = data(st.booleans())
            if not stable and safe and m.hi > 6.0:
                return None
            z = g.sub(x, g.max(x, ax)) if stable else x
            e = g.exp(z)
            r = g.div(e, g.sum(e, ax))
            return r if self.add(r, _Mag(1.0, math.exp(-2 * m.hi) / x.shape[ax])) else None
        if op == "transpose":
            item = self.pick(lambda p: len(p[0].shape) >= 2)
            if item is None:
                return None
            x, m = item
            a = data(st.integers(0, len(x.shape) - 1))
            b = data(st.integers(0, len(x.shape) - 1).filter(lambda v: v != a))
            r = g.transpose(x, a, b)
            return r if self.add(r, m) else None
        raise GraphError(f"testing.graphs: unknown op {op!r}; expected one of {GRAPH_OPS}")


def _prune(g: Graph) -> Graph:
    """``g`` without the nodes (inputs included) that no output depends on."""
    nodes = node_list(g)
    live = sorted(g.live())
    new_index = {old: i for i, old in enumerate(live)}
    kept = [replace(nodes[i], args=tuple((new_index[a], k) for a, k in nodes[i].args)) for i in live]
    return Graph._from_parts(kept, [(new_index[a], k) for a, k in output_refs(g)])


def graphs(
    *,
    ops: Sequence[str] = GRAPH_OPS,
    min_ops: int = 1,
    max_ops: int = 6,
    dims: Sequence[int] = (1, 2, 3, 4, 8),
    max_rank: int = 3,
    dtypes: Sequence[DType] = (float32,),
    safe: bool = True,
    magnitude_cap: float = 1e3,
    max_numel: int = 4096,
) -> st.SearchStrategy[Graph]:
    """A hypothesis strategy of random well-formed kernel graphs, built with the public ``vm.Graph`` API.

    Each graph has ``min_ops..max_ops`` ops drawn from ``ops`` (matmul,
    elementwise, reductions, rms_norm, concat, transpose, scale, and
    ``softmax``: the naive or max-subtracted pattern written out) on inputs
    named ``x0, x1, ...`` whose dims come from ``dims``; one or two outputs.

    ``safe=True`` keeps graphs numerically tame for inputs in [-3, 3] (the
    ``normal`` regime of :func:`inputs`): divisions and roots only of
    values bounded away from zero (exp-derived), ``exp`` only of bounded
    values, every intermediate bounded by ``magnitude_cap`` — so a kernel
    can be compared with the float64 reference under fixed tolerances.
    """
    unknown = [o for o in ops if o not in GRAPH_OPS]
    if unknown or not ops:
        raise GraphError(f"testing.graphs: ops {unknown or list(ops)}; expected a non-empty subset of {GRAPH_OPS}")
    if not 1 <= min_ops <= max_ops:
        raise GraphError(f"testing.graphs: min_ops={min_ops}, max_ops={max_ops}; expected 1 <= min_ops <= max_ops")

    @st.composite
    def draw(data: Any) -> Graph:
        dtype = data(st.sampled_from(list(dtypes)))
        b = _GraphDraw(data, dims, dtype, max_rank, safe, magnitude_cap, max_numel)
        b.new_input(b.random_shape())
        target = data(st.integers(min_ops, max_ops))
        made: list[Tensor] = []
        attempts = 0
        while len(made) < target and attempts < 4 * max_ops:
            attempts += 1
            r = b.step(data(st.sampled_from(list(ops))))
            if r is not None:
                made.append(r)
        if not made:  # every draw was rejected: fall back to one op that always applies
            x, _ = b.pool[0]
            made.append(b.g.neg(x))
        outs = [made[-1]]
        earlier = [t for t in made[:-1] if t.ref != made[-1].ref]
        if earlier and data(st.integers(0, 3)) == 0:
            outs.append(data(st.sampled_from(earlier)))
        b.g.output(*outs)
        g = _prune(b.g)
        g.check()
        return g

    return draw()
