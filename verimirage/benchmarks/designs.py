"""Hand-written expert μGraphs for the suite's programs.

These are the designs the literature reports (FlashAttention, FlashDecoding,
norm-after-matmul, concat-matmul fusion, fused gated MLP, one block per row),
written directly in the IR. They serve as references: the search must reach
their kernel counts, the verifier must prove them, the backend must compile
them. Each builder takes the suite graph and reads shapes from its inputs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.builders import BlockBuilder, Tensor, ThreadBuilder
from ..ir.errors import GraphError
from ..ir.graph import Graph, MuGraph
from ..ir.ops import TensorType


def _inputs(g: Graph) -> dict[str, TensorType]:
    return {t.name: t.type for t in g.inputs if t.name is not None}


def _program(t: dict[str, TensorType]) -> tuple[MuGraph, list[Tensor]]:
    """A μGraph with the suite graph's inputs (same names, order, types), and those inputs."""
    mg = MuGraph()
    return mg, [mg.input(name, tt.shape, tt.dtype) for name, tt in t.items()]


def _one_kernel(t: dict[str, TensorType], b: BlockBuilder) -> MuGraph:
    """The one-kernel μGraph running block graph ``b`` on every input; its outputs are the program's."""
    mg, ins = _program(t)
    mg.output(*mg.custom(b.build(), ins))
    return mg


def _div_pick(n: int, want: int) -> int:
    """Largest divisor of n that is <= want."""
    for c in range(min(n, want), 0, -1):
        if n % c == 0:
            return c
    return 1


def flash_attention(g: Graph, *, rows: int = 64, kv_tile: int = 64, stable: bool = False, qknorm: bool = False,
                    eps: float = 1e-6) -> MuGraph:
    """One kernel: grid (heads, query-row blocks), for-loop over KV tiles, online softmax."""
    t = _inputs(g)
    qt, kt, vt = t["Q"], t["K"], t["V"]
    h, n, _d = qt.shape
    kv = kt.shape[2]
    rows = _div_pick(n, rows)
    frange = kv // _div_pick(kv, kv_tile)
    b = BlockBuilder((h, n // rows), frange)
    q = b.input(0, qt, (0, 1), None)
    k = b.input(1, kt, (0, None), 2)
    v = b.input(2, vt, (0, None), 1)
    if qknorm:
        q = b.rms_norm(q, axis=2, eps=eps)
        k = b.rms_norm(k, axis=1, eps=eps)
    s = b.matmul(q, k)
    if stable:
        m = b.running_max(b.max(s, axis=2))
        p = b.exp(b.sub(s, m))
        lsum = b.rescaled_sum(b.sum(p, axis=2), m)
        o = b.rescaled_sum(b.matmul(p, v), m)
    else:
        p = b.exp(s)
        lsum = b.loop_sum(b.sum(p, axis=2))
        o = b.loop_sum(b.matmul(p, v))
    b.output(b.div(o, lsum), (0, 1))
    return _one_kernel(t, b)


def split_kv_attention(g: Graph, *, splits: int = 16, rows: int = 64, kv_tile: int = 128, stable: bool = False,
                       qknorm: bool = False, eps: float = 1e-6, combine_rows: int | None = 16) -> MuGraph:
    """Two kernels (FlashDecoding): per KV split, partial sums side by side; then a combine kernel.

    ``combine_rows`` (``None``: ``rows``) is the combine kernel's row tile: fewer rows, more blocks.
    Defaults are the fastest measured on Hopper (benchmarks/perf/NOTES.md).
    """
    t = _inputs(g)
    qt, kt, vt = t["Q"], t["K"], t["V"]
    h, n, _d = qt.shape
    kv = kt.shape[2]
    splits = _div_pick(kv, splits)
    rows = _div_pick(n, rows)
    per_split = kv // splits
    frange = per_split // _div_pick(per_split, kv_tile)
    b = BlockBuilder((h, splits, n // rows), frange)
    q = b.input(0, qt, (0, None, 1), None)
    k = b.input(1, kt, (0, 2, None), 2)
    v = b.input(2, vt, (0, 1, None), 1)
    if qknorm:
        q = b.rms_norm(q, axis=2, eps=eps)
        k = b.rms_norm(k, axis=1, eps=eps)
    s = b.matmul(q, k)
    omap = (0, 2, 1)
    if stable:
        m = b.running_max(b.max(s, axis=2))
        p = b.exp(b.sub(s, m))
        lsum = b.rescaled_sum(b.sum(p, axis=2), m)
        o = b.rescaled_sum(b.matmul(p, v), m)
        b.output(o, omap)
        b.output(lsum, omap)
        b.output(b.loop_max(m), omap)
    else:
        p = b.exp(s)
        b.output(b.loop_sum(b.matmul(p, v)), omap)
        b.output(b.loop_sum(b.sum(p, axis=2)), omap)
    mg, ins = _program(t)
    parts = mg.custom(b.build(), ins)
    # combine: grid (heads, row blocks), for-loop over the splits
    crows = _div_pick(n, combine_rows or rows)
    c = BlockBuilder((h, n // crows), splits)
    o_p = c.input(0, parts[0].type, (0, 1), 2)
    l_p = c.input(1, parts[1].type, (0, 1), 2)
    if stable:
        m_p = c.input(2, parts[2].type, (0, 1), 2)
        rm = c.running_max(m_p)
        w = c.exp(c.sub(m_p, rm))
        o_sum = c.rescaled_sum(c.mul(o_p, w), rm)
        l_sum = c.rescaled_sum(c.mul(l_p, w), rm)
    else:
        o_sum = c.loop_sum(o_p)
        l_sum = c.loop_sum(l_p)
    c.output(c.div(o_sum, l_sum), (0, 1))
    (out,) = mg.custom(c.build(), list(parts))
    mg.output(out)
    return mg


def rmsnorm_linear(g: Graph, *, cols: int = 64, k_tile: int = 128, eps: float = 1e-6) -> MuGraph:
    """One kernel: X W on raw X, the sum of squares accumulated beside it, 1/rms as the epilogue."""
    t = _inputs(g)
    xt, wt = t["X"], t["W"]
    _m, k = xt.shape
    n = wt.shape[1]
    cols = _div_pick(n, cols)
    frange = k // _div_pick(k, k_tile)
    b = BlockBuilder((n // cols,), frange)
    x = b.input(0, xt, (None,), 1)
    w = b.input(1, wt, (1,), 0)
    acc = b.loop_sum(b.matmul(x, w))
    ss = b.loop_sum(b.sum(b.square(x), axis=1))
    r = b.rsqrt(b.shift(b.scale(ss, 1.0 / k), eps))
    b.output(b.mul(acc, r), (1,))
    return _one_kernel(t, b)


def rmsnorm_linear_splitk(g: Graph, *, cols: int = 64, k_tile: int = 128, splits: int = 2,
                          combine_cols: int | None = None, ss_partials: bool = False,
                          eps: float = 1e-6) -> MuGraph:
    """Two kernels (split-K): partial X W per K split side by side, then a combine kernel that sums the
    partials and applies 1/rms. The sum of squares of X is computed in the combine kernel, one K chunk
    per iteration; or (``ss_partials``) accumulated beside X W in kernel 1, one partial per block, and
    summed by the combine kernel (which then never reads X)."""
    t = _inputs(g)
    xt, wt = t["X"], t["W"]
    _m, k = xt.shape
    n = wt.shape[1]
    cols = _div_pick(n, cols)
    splits = _div_pick(k, splits)
    per = k // splits
    frange = per // _div_pick(per, k_tile)
    b = BlockBuilder((n // cols, splits), frange)
    x = b.input(0, xt, (None, 1), 1)
    w = b.input(1, wt, (1, 0), 0)
    b.output(b.loop_sum(b.matmul(x, w)), (1, 0))
    if ss_partials:
        b.output(b.loop_sum(b.sum(b.square(x), axis=1)), (1, 0))
    mg, ins = _program(t)
    parts = mg.custom(b.build(), ins)
    ccols = _div_pick(n, combine_cols or cols)
    if ss_partials:
        ccols = cols  # one sum-of-squares partial per kernel-1 column block
    c = BlockBuilder((n // ccols,), splits)
    p = c.input(0, parts[0].type, (1,), 0)
    acc = c.loop_sum(p)
    if ss_partials:
        ss = c.loop_sum(c.input(1, parts[1].type, (1,), 0))
        operands = [parts[0], parts[1]]
    else:
        xc = c.input(1, xt, (None,), 1)
        ss = c.loop_sum(c.sum(c.square(xc), axis=1))
        operands = [parts[0], ins[0]]
    r = c.rsqrt(c.shift(c.scale(ss, 1.0 / k), eps))
    c.output(c.mul(acc, r), (1,))
    (out,) = mg.custom(c.build(), operands)
    mg.output(out)
    return mg


def lora(g: Graph, *, cols: int = 32, k_tile: int = 64) -> MuGraph:
    """One kernel: X W and X A accumulated over K tiles, then (X A) B added as the epilogue."""
    t = _inputs(g)
    xt, wt, at, bt = t["X"], t["W"], t["A"], t["B"]
    k = xt.shape[1]
    n = wt.shape[1]
    cols = _div_pick(n, cols)
    frange = k // _div_pick(k, k_tile)
    b = BlockBuilder((n // cols,), frange)
    x = b.input(0, xt, (None,), 1)
    w = b.input(1, wt, (1,), 0)
    a = b.input(2, at, (None,), 0)
    bb = b.input(3, bt, (1,), None)
    xw = b.loop_sum(b.matmul(x, w))
    xa = b.loop_sum(b.matmul(x, a))
    b.output(b.add(xw, b.matmul(xa, bb)), (1,))
    return _one_kernel(t, b)


def gated_mlp(g: Graph, *, cols: int = 32, k_tile: int = 128) -> MuGraph:
    """One kernel: both matmuls share X tiles; silu(a) * b as a fused thread-graph epilogue."""
    t = _inputs(g)
    xt, w1t, w2t = t["X"], t["W1"], t["W2"]
    k = xt.shape[1]
    n = w1t.shape[1]
    cols = _div_pick(n, cols)
    frange = k // _div_pick(k, k_tile)
    b = BlockBuilder((n // cols,), frange)
    x = b.input(0, xt, (None,), 1)
    w1 = b.input(1, w1t, (1,), 0)
    w2 = b.input(2, w2t, (1,), 0)
    a1 = b.loop_sum(b.matmul(x, w1))
    a2 = b.loop_sum(b.matmul(x, w2))
    tb = ThreadBuilder()
    u, v = tb.arg(a1.type), tb.arg(a2.type)
    tb.output(tb.mul(tb.silu(u), v))
    b.output(b.fused(tb.build(), [a1, a2]), (1,))
    return _one_kernel(t, b)


def gated_mlp_splitk(g: Graph, *, cols: int = 64, k_tile: int = 128, splits: int = 2,
                     combine_cols: int | None = None) -> MuGraph:
    """Two kernels (split-K): partial X W1 and X W2 per K split side by side, then a combine kernel that
    sums the partials and applies silu(a) * b."""
    t = _inputs(g)
    xt, w1t, w2t = t["X"], t["W1"], t["W2"]
    k = xt.shape[1]
    n = w1t.shape[1]
    cols = _div_pick(n, cols)
    splits = _div_pick(k, splits)
    per = k // splits
    frange = per // _div_pick(per, k_tile)
    b = BlockBuilder((n // cols, splits), frange)
    x = b.input(0, xt, (None, 1), 1)
    w1 = b.input(1, w1t, (1, 0), 0)
    w2 = b.input(2, w2t, (1, 0), 0)
    b.output(b.loop_sum(b.matmul(x, w1)), (1, 0))
    b.output(b.loop_sum(b.matmul(x, w2)), (1, 0))
    mg, ins = _program(t)
    p1, p2 = mg.custom(b.build(), ins)
    ccols = _div_pick(n, combine_cols or cols)
    c = BlockBuilder((n // ccols,), splits)
    a1 = c.loop_sum(c.input(0, p1.type, (1,), 0))
    a2 = c.loop_sum(c.input(1, p2.type, (1,), 0))
    tb = ThreadBuilder()
    u, v = tb.arg(a1.type), tb.arg(a2.type)
    tb.output(tb.mul(tb.silu(u), v))
    c.output(c.fused(tb.build(), [a1, a2]), (1,))
    (out,) = mg.custom(c.build(), [p1, p2])
    mg.output(out)
    return mg


def ntrans(g: Graph, *, rows: int = 1, eps: float = 1e-6) -> MuGraph:
    """One kernel, one block per ``rows`` rows, both norms from the same loads."""
    t = _inputs(g)
    xt, ht, at = t["X"], t["H"], t["alpha"]
    m = xt.shape[0]
    rows = _div_pick(m, rows)
    b = BlockBuilder((m // rows,), 1)
    x = b.input(0, xt, (0,), None)
    h = b.input(1, ht, (0,), None)
    al = b.input(2, at, (0,), None)
    b.output(b.add(b.rms_norm(h, axis=1, eps=eps), x), (0,))
    b.output(b.rms_norm(b.add(x, b.mul(al, x)), axis=1, eps=eps), (0,))
    return _one_kernel(t, b)


def _attn(kind: str, **fixed: bool) -> Callable[..., MuGraph]:
    def build(g: Graph, **kw: object) -> MuGraph:
        f = flash_attention if kind == "flash" else split_kv_attention
        return f(g, **fixed, **kw)  # type: ignore[arg-type]

    return build


#: suite name -> builder of its expert design (from the suite graph)
DESIGNS: dict[str, Callable[..., MuGraph]] = {
    "gqa": _attn("split"),
    "mha": _attn("split"),
    "mqa": _attn("flash"),
    "qknorm_gqa": _attn("split", qknorm=True),
    "gqa_stable": _attn("split", stable=True),
    "mha_stable": _attn("split", stable=True),
    "rmsnorm_linear": rmsnorm_linear,
    "lora": lora,
    "gated_mlp": gated_mlp,
    "ntrans": ntrans,
}


def expert(name: str, g: Graph, **kw: object) -> MuGraph:
    """The expert μGraph for suite program ``name`` built on graph ``g``."""
    try:
        return DESIGNS[name](g, **kw)
    except KeyError:
        raise GraphError(f"designs: no expert design for {name!r}; have {sorted(DESIGNS)}") from None


def small_design_kw(name: str) -> dict[str, int]:
    """Tile parameters that suit the small (CPU) variants: several blocks and loop iterations."""
    if name in ("gqa", "mha", "mqa", "qknorm_gqa", "gqa_stable", "mha_stable"):
        return {"rows": 16, "kv_tile": 32} | ({"splits": 2} if name != "mqa" else {})
    if name in ("rmsnorm_linear", "lora", "gated_mlp"):
        return {"cols": 32, "k_tile": 16}
    return {}
