"""GPU selection: time candidates x tile configurations and put the fastest first.

:func:`select` compiles every candidate μGraph under every
:class:`~verimirage.backend.codegen.LaunchConfig`, checks each against the
float64 reference once per candidate, times it with
``triton.testing.do_bench_cudagraph`` (median; falls back to ``do_bench`` when
capture fails) and returns :class:`Timing` records, fastest first (failures
last, with their reason). Results are cached on disk
(:class:`~verimirage.backend.cache.DiskCache` ``"select"``) under a key of the
graph text, every candidate's text, the input shapes/dtypes/strides, the
configurations, the GPU's name and compute capability, and the
verimirage/codegen/Triton/torch versions — a key of the graph alone would serve
timings from another GPU.

A cache hit is not trusted (:func:`cached_timings`): every record must name,
by the SHA-256 of its μGraph text, one of the candidates given to this call
(which the caller has just verified), with a known configuration, a finite
positive time or a failure, and every (candidate, configuration) pair exactly
once; and (with ``check=True``, the default) each candidate's fastest
configuration is run once more against the float64 reference before it is used. A record that fails any of this is
reported, the entry removed and the selection measured again.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..ir.graph import Graph
from .cache import DiskCache, key_of
from .codegen import CODEGEN_VERSION, LaunchConfig, TileOptions

log = logging.getLogger(__name__)

#: The default configurations: the measured per-kernel rules (``tuning.recommend``) first, then
#: whole-program configs that won somewhere in the sweeps (benchmarks/perf/NOTES.md): dot rows padded to
#: 16 (mma.sync; skinny matmuls) with 3 or 4 stages, and 64-row wgmma tiles with 3 stages.
DEFAULT_CONFIGS: tuple[LaunchConfig, ...] = (
    LaunchConfig(tuned=True),
    LaunchConfig(4, 3, TileOptions(dot_min_m=16)),
    LaunchConfig(4, 3, TileOptions(dot_min_m=16, dot_batch1=True)),
    LaunchConfig(4, 4, TileOptions(dot_min_m=16)),
    LaunchConfig(4, 3),
)

_CHOSEN: dict[str, LaunchConfig] = {}


def chosen_config(program: Any) -> LaunchConfig | None:
    """The config :func:`select` timed fastest for ``program`` (by μGraph text) in this process, if any."""
    try:
        return _CHOSEN.get(_mugraph_text(program))
    except Exception:  # not a program: compile() reports that
        return None


@dataclass(frozen=True)
class Timing:
    """One (candidate, configuration) measurement: median milliseconds, or the reason it failed."""

    index: int  # position of the candidate in the list given to select()
    candidate: Any
    config: LaunchConfig
    ms: float | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether it compiled, matched the reference and was timed."""
        return self.ms is not None and self.error is None


def _mugraph_text(c: Any) -> str:
    g = c.mugraph if hasattr(c, "mugraph") and not isinstance(c, Graph) else c
    return str(g)


def device_info() -> dict[str, Any]:
    """Name and compute capability of the current CUDA device (RuntimeError without one)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("select: needs a CUDA GPU (timing kernels in the CPU interpreter is meaningless)")
    i = torch.cuda.current_device()
    return {"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i))}


def versions() -> dict[str, str]:
    """Versions that change what kernels are generated or how fast they run."""
    import torch
    import triton

    from .. import __version__

    return {"verimirage": __version__, "codegen": CODEGEN_VERSION, "triton": triton.__version__,
            "torch": torch.__version__}


def selection_key(graph: Graph, candidates: Sequence[Any], configs: Sequence[LaunchConfig],
                  input_meta: Sequence[Mapping[str, Any]], device: Mapping[str, Any],
                  vers: Mapping[str, str]) -> str:
    """The cache key of one selection problem (see the module docstring for what it covers)."""
    return key_of({
        "graph": str(graph),
        "candidates": [_mugraph_text(c) for c in candidates],
        "configs": [c.key() for c in configs],
        "inputs": list(input_meta),
        "device": dict(device),
        "versions": dict(vers),
    })


def _inputs(graph: Graph, seed: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for t in graph.inputs:
        x = torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.5
        out[str(t.name)] = x.to(getattr(torch, t.type.dtype.torch_name)).cuda()
    return out


#: Largest relative Frobenius error ``|out - ref| / |ref|`` against the float64 reference accepted per
#: output dtype. Correct kernels measure 2e-4 to 6e-4 in fp16 (1e-3 in bf16) on every suite case; a
#: Triton 3.6 miscompile seen on an H100 (64-row wgmma beside a side use of the streamed operand) gave
#: 3.5e-3 to 7.6e-3 and must be rejected (benchmarks/perf/NOTES.md).
TOLERANCE = {"f16": 2e-3, "bf16": 1.2e-2, "f32": 1e-4}


def _tolerance(dtype: str) -> float:
    return TOLERANCE[dtype]


#: How much the largest element error (over the largest reference magnitude) is discounted against the
#: relative Frobenius error in :func:`rel_error`: correct fp16 kernels measure <= ~1e-3 before the discount.
LOCAL_DISCOUNT = 8.0

#: The per-element term's discount (see :func:`rel_error`): an element may be off by 20 tolerances of its own
#: magnitude plus the median magnitude (4% in fp16). A correct fp16 attention whose softmax is peaky (scores of
#: std ~10: rotary's rotated Q and K stored as fp16, as the program's types say) is off by up to ~2% there: at
#: the local discount (8) every rotary_attention candidate was rejected on an H100 (2026-11-26, 0.0022 > 0.002;
#: 0.0176 before the discount, 0.012-0.021 simulated, tests/test_redteam_lows.py). 40 (its first value) passed
#: a wrong fp16 kernel whose elements of typical size beside one large element were 12% off (bf16: 60%):
#: tests/test_redteam_session12.py::test_per_element_discount_of_40_passed_typical_elements_off_by_12_percent
ELEM_DISCOUNT = 20.0


#: The smallest normal number per output dtype: results below it are stored with an absolute (not relative)
#: rounding error, so :func:`rel_error`'s per-element term measures against at least this magnitude.
TINY = {"f16": 2.0**-14, "bf16": 2.0**-126, "f32": 2.0**-126}
_TORCH_SHORT = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}


def rel_error(out: Any, ref: Any, dtype: str | None = None) -> float:
    """Error of ``out`` (a tensor or array) against the float64 array ``ref``: the largest of the relative
    Frobenius error, the largest element error over the largest reference magnitude, and the largest per-element
    error ``|out_i - ref_i| / (|ref_i| + s)`` with ``s`` the median of the nonzero ``|ref|`` (a typical
    magnitude no few large elements move) plus the output dtype's :data:`TINY` (``dtype``, a short name, or the
    tensor's own), divided by :data:`LOCAL_DISCOUNT` and :data:`ELEM_DISCOUNT`.

    The local term catches a miscompile confined to a few elements (one wrong 16-element row of a 4096 x 4096 fp16
    output moves the Frobenius error by ~1e-3 only, under the fp16 tolerance). The per-element term catches wrong
    small elements beside a huge one: ``[1e6, 5, 5, 5]`` for ``[1e6, 1, 1, 1]`` measured 5e-7 by the other two."""
    import numpy as np

    if dtype is None:
        dtype = _TORCH_SHORT.get(str(getattr(out, "dtype", "")), "f32")
    if hasattr(ref, "detach") and hasattr(out, "detach"):
        return _rel_error_torch(out, ref, dtype)
    got = out.detach().double().cpu().numpy() if hasattr(out, "detach") else np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return math.inf
    d = np.abs(got - r)
    a = np.abs(r)
    frob = float(np.linalg.norm(d)) / max(float(np.linalg.norm(r)), 1e-30)
    local = float(d.max(initial=0.0)) / max(float(a.max(initial=0.0)), 1e-30)
    nz = a[a > 0]
    s = (float(np.median(nz)) if nz.size else 0.0) + TINY.get(dtype, TINY["f32"])
    elem = float((d / np.maximum(a + s, 1e-30)).max(initial=0.0))
    return max(frob, local / LOCAL_DISCOUNT, elem / ELEM_DISCOUNT)


def _rel_error_torch(out: Any, ref: Any, dtype: str) -> float:
    """:func:`rel_error` of two torch tensors, computed in float64 where ``ref`` lies (the GPU for a reference
    computed there: a 2048 x 32000 output is no longer copied to the host and reduced by numpy once per
    candidate and configuration). The same three terms; the median of an even count is the mean of the two
    middle values, as numpy's."""
    import torch

    r = ref.detach().to(torch.float64)
    got = out.detach().to(device=r.device, dtype=torch.float64)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    d = (got - r).abs().reshape(-1)
    a = r.abs().reshape(-1)
    frob = float(torch.linalg.vector_norm(d)) / max(float(torch.linalg.vector_norm(r)), 1e-30)
    dmax = float(d.max()) if d.numel() else 0.0
    amax = float(a.max()) if a.numel() else 0.0
    local = dmax / max(amax, 1e-30)
    nz = a[a > 0]
    n = nz.numel()
    med = 0.0
    if n:
        lo = float(torch.kthvalue(nz, (n + 1) // 2).values)
        med = lo if n % 2 else (lo + float(torch.kthvalue(nz, n // 2 + 1).values)) / 2.0
    s = med + TINY.get(dtype, TINY["f32"])
    elem = float((d / torch.clamp(a + s, min=1e-30)).max()) if d.numel() else 0.0
    return max(frob, local / LOCAL_DISCOUNT, elem / ELEM_DISCOUNT)


def _remember(timings: Sequence[Timing]) -> None:
    """Record each candidate's fastest config so a later ``compile(candidate)`` launches with it."""
    best: dict[str, LaunchConfig] = {}
    for t in timings:  # fastest first
        if t.ok:
            best.setdefault(_mugraph_text(t.candidate), t.config)
    _CHOSEN.update(best)


def _text_sha(c: Any) -> str:
    return hashlib.sha256(_mugraph_text(c).encode()).hexdigest()


_RECORD_KEYS = frozenset({"index", "mugraph_sha256", "config", "ms", "error"})


def timing_records(timings: Sequence[Timing]) -> list[dict[str, Any]]:
    """The JSON records the selection cache stores for ``timings`` (fastest first)."""
    return [{"index": t.index, "mugraph_sha256": _text_sha(t.candidate), "config": t.config.key(), "ms": t.ms,
             "error": t.error} for t in timings]


def cached_timings(records: Any, candidates: Sequence[Any], configs: Sequence[LaunchConfig]) -> list[Timing]:
    """Timings rebuilt from stored ``records``; ValueError unless they fit this very selection problem.

    Each record must name one of ``candidates`` (its index, and the SHA-256 of that candidate's μGraph
    text), one of ``configs``, and either a finite positive time or a failure reason; every (candidate,
    config) pair appears exactly once, fastest first and failures last. Nothing here shows that a time was
    really measured or that an output matched the reference: :func:`select` re-runs the chosen kernels.
    """
    if not isinstance(records, list):
        raise ValueError(f"selection records: a {type(records).__name__}; expected a list")
    by_cfg = {c.key(): c for c in configs}
    shas = [_text_sha(c) for c in candidates]
    out: list[Timing] = []
    seen: set[tuple[int, str]] = set()
    for r in records:
        if not isinstance(r, dict) or set(r) != _RECORD_KEYS:
            raise ValueError(f"selection record {r!r:.120}: expected the keys {sorted(_RECORD_KEYS)}")
        i, cfg, ms, err = r["index"], r["config"], r["ms"], r["error"]
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(candidates):
            raise ValueError(f"selection record: candidate index {i!r}; expected 0..{len(candidates) - 1}")
        if r["mugraph_sha256"] != shas[i]:
            raise ValueError(f"selection record: candidate {i} is not the μGraph the record names (by sha256)")
        if not isinstance(cfg, str) or cfg not in by_cfg:
            raise ValueError(f"selection record: unknown configuration {cfg!r}")
        if (i, cfg) in seen:
            raise ValueError(f"selection record: candidate {i} with configuration {cfg} twice")
        seen.add((i, cfg))
        if ms is None:
            if not isinstance(err, str) or not err:
                raise ValueError("selection record: neither a time nor a failure reason")
        elif isinstance(ms, bool) or not isinstance(ms, (int, float)) or not (math.isfinite(ms) and ms > 0):
            raise ValueError(f"selection record: time {ms!r}; expected a finite positive number of ms")
        elif err is not None:
            raise ValueError("selection record: both a time and a failure reason")
        out.append(Timing(i, candidates[i], by_cfg[cfg], None if ms is None else float(ms), err))
    if len(seen) != len(candidates) * len(configs):
        raise ValueError(f"selection records: {len(seen)} (candidate, configuration) pairs; expected "
                         f"{len(candidates) * len(configs)}")
    order = [(t.ms is None, t.ms if t.ms is not None else 0.0) for t in out]
    if order != sorted(order):
        raise ValueError("selection records are not fastest first")
    return out


#: How a (candidate, configuration) whose GPU output fails the float64 check is reported in its record's ``error``
#: (``benchmarks/bench.py`` lists every such record under its tables: a verified program computing a wrong result)
WRONG_OUTPUT = "output differs from the float64 reference"


def _check_output(res: Any, ref: Sequence[Any], graph: Graph) -> None:
    """ValueError unless ``res`` matches the float64 reference ``ref`` within :data:`TOLERANCE`."""
    res_t = res if isinstance(res, tuple) else (res,)
    for o, r, t in zip(res_t, ref, graph.outputs, strict=True):
        err = rel_error(o, r, t.dtype.short)
        tol = _tolerance(t.dtype.short)
        if not err <= tol:
            raise ValueError(f"{WRONG_OUTPUT}: rel. error {err:.3g} > {tol:g}"
                             f" ({t.dtype.short})")


#: a docstring of a generated module (the module's names the μGraph, a kernel's its block graph's grid)
_DOCSTRING = re.compile(r'"""[\s\S]*?"""')


def select(
    graph: Graph,
    candidates: Sequence[Any],
    *,
    configs: Sequence[LaunchConfig] = DEFAULT_CONFIGS,
    inputs: Mapping[str, Any] | None = None,
    check: bool = True,
    use_cuda_graph: bool = True,
    rep_ms: int = 50,
    cache: bool = True,
    cache_root: Path | None = None,
    seed: int = 0,
    reference: Sequence[Any] | None = None,
    input_sets: Sequence[Mapping[str, Any]] | None = None,
) -> list[Timing]:
    """Time every candidate under every config on the current GPU; fastest first.

    ``candidates`` are Candidates, MuGraphs or Graphs computing ``graph``.
    ``inputs`` (CUDA tensors by name) default to seeded random ones. With
    ``check`` each candidate's output is compared with ``vm.evaluate`` (float64)
    first; a mismatch or a compile error is a failed :class:`Timing`.
    ``reference``: the float64 outputs of ``graph`` on ``inputs`` when the caller
    has them (torch tensors, compared on their device; one per output), instead
    of ``vm.evaluate`` on the host (seconds for LLM-size programs).
    ``rep_ms``: the timing window of each ``do_bench_cudagraph`` call.
    ``input_sets``: more input sets (by name, as ``inputs``: same shapes, dtypes and strides) that every timing
    rotates through after ``inputs``, one call a set, the time divided by their count; the candidates are then
    ranked L2-cold when the sets together exceed the cache, as a model's layer finds its weights (METHOD.md: "rotate
    among several input sets"; warm, qkv_bias's profiled pick ran 15.1 us rotated against 13.9 for another
    candidate on an H100, benchmarks/perf/NOTES.md session 13d). Outputs are checked on ``inputs``.
    """
    if not candidates:
        raise ValueError("select: no candidates given")
    if not configs:
        raise ValueError("select: no configurations given")
    dev = device_info()  # before importing triton.testing: on a CPU machine nothing of triton is loaded here
    import torch
    import triton.testing

    from ..ir.reference import evaluate
    from .runtime import compile as vm_compile

    xs = dict(inputs) if inputs is not None else _inputs(graph, seed)
    meta: list[dict[str, Any]] = [{"name": t.name, "shape": list(t.shape), "dtype": t.type.dtype.short,
                                   "stride": list(xs[str(t.name)].stride())} for t in graph.inputs]
    sets = [xs, *(dict(s) for s in input_sets or ())]
    for j, s in enumerate(sets[1:], 1):
        for inp in graph.inputs:
            x, y = xs[str(inp.name)], s.get(str(inp.name))
            if y is None or tuple(y.shape) != tuple(x.shape) or y.dtype != x.dtype or y.stride() != x.stride():
                raise ValueError(f"select: input set {j}: input {inp.name!r} is "
                                 f"{None if y is None else (tuple(y.shape), y.dtype, y.stride())}; expected "
                                 f"{(tuple(x.shape), x.dtype, x.stride())} as in `inputs`")
    if len(sets) > 1:
        meta.append({"rotate": len(sets)})
    key = selection_key(graph, candidates, configs, meta, dev, versions())
    store = DiskCache("select", cache_root) if cache else None
    ref: Any = None
    if check and reference is not None:
        if len(reference) != len(graph.outputs):
            raise ValueError(f"select: {len(reference)} reference output(s) for a graph of {len(graph.outputs)}")
        ref = list(reference)
    elif check:
        ref = evaluate(graph, {k: v.detach().cpu() for k, v in xs.items()})
    if store is not None:
        hit = store.get(key)
        if hit is not None:
            try:
                res = cached_timings(hit, candidates, configs)
                if ref is not None:  # the kernels about to be used are run against the reference again
                    rechecked: set[int] = set()
                    for t in res:
                        if t.ok and t.index not in rechecked:
                            rechecked.add(t.index)
                            fn = vm_compile(t.candidate, config=t.config)
                            out_t = fn(**xs)
                            torch.cuda.synchronize()
                            _check_output(out_t, ref, graph)
            except Exception as e:  # a bad entry is measured again, never used
                log.warning("select: cache entry %s rejected and removed (%s: %s); measuring again", key[:16],
                            type(e).__name__, str(e)[:300])
                store.path(key).unlink(missing_ok=True)
            else:
                log.info("select: cache hit %s", key[:12])
                _remember(res)
                return res

    out: list[Timing] = []
    #: (generated source without its docstrings, launch parameters) -> the Timing of the first (candidate,
    #: config) that ran them: another that generates the same module (batchnorm_relu's six μGraphs as one flat
    #: kernel) is not checked and timed again (the same code on the same inputs): it gets that result
    done: dict[tuple[str, str], Timing] = {}
    for ci, cand in enumerate(candidates):
        for cfg in configs:
            t0 = time.perf_counter()
            same: tuple[str, str] | None = None
            try:
                fn = vm_compile(cand, config=cfg)
                if isinstance(getattr(fn, "source", None), str):  # (its docstrings name the μGraph and its grid)
                    same = (_DOCSTRING.sub("", fn.source), repr(sorted(getattr(fn, "launch", {}).items())))
                if same is not None and same in done:
                    out.append(Timing(ci, cand, cfg, done[same].ms, done[same].error))
                    continue
                res = fn(**xs)
                torch.cuda.synchronize()
                # every (candidate, config) is checked: the generated code differs per config, and so
                # can the compiler's mistakes
                if ref is not None:
                    _check_output(res, ref, graph)
                bench = triton.testing.do_bench_cudagraph if use_cuda_graph else triton.testing.do_bench
                run = lambda fn=fn: [fn(**x) for x in sets]  # noqa: E731
                try:
                    ms = bench(run, rep=rep_ms, return_mode="median")
                except Exception as e:  # capture can fail (e.g. allocator state): time without graphs
                    log.info("select: CUDA-graph timing failed (%s); using do_bench", e)
                    ms = triton.testing.do_bench(run, rep=rep_ms, return_mode="median")
                out.append(Timing(ci, cand, cfg, float(ms) / len(sets)))
            except Exception as e:
                out.append(Timing(ci, cand, cfg, None, f"{type(e).__name__}: {e}"[:500]))
            if same is not None:
                done.setdefault(same, out[-1])
            log.debug("select: candidate %d config %s took %.1fs", ci, cfg.key(), time.perf_counter() - t0)
    out.sort(key=lambda t: (t.ms is None, t.ms if t.ms is not None else 0.0))
    _remember(out)
    if store is not None:
        store.put(key, timing_records(out))
    return out
