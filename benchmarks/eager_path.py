"""GPU measurement of the eager path (issue 28): host cost of a verimirage call against PyTorch's.

    python benchmarks/eager_path.py [--cases gqa_bs8 ...] [--out DIR] [--budget-s 330] [--set models]
    python benchmarks/eager_path.py --merge RUN.json [--results benchmarks/results/latest.json] [--key K --note N]

For every suite case of ``benchmarks/results/latest.json`` (the harness's last run; ``--set models``: every
models-set case of ``models.json``, candidates from ``candidates_models/``) it compiles the μGraph
that run selected, with the launch configuration it selected (the candidates were searched and verified
on a CPU machine; no search here), checks it against the float64 reference, and times on one GPU.

Device time, from CUDA-graph replays: ``vm_graph_us`` (``do_bench_cudagraph``: the same inputs replayed
back to back, so a warm L2) and ``vm_graph_cold_us`` (``do_bench`` of one call's graph: the L2 cleared before
each replay, as for the plain timings).

Plain calls (the lean launch path): ``vm_plain_us`` (``do_bench``: L2 cleared before each call, the harness's
``*_plain_us``; the GPU's 256 MB clearing memset runs while the host prepares the call, so host time up to that
memset's is hidden) and ``vm_plain_warm_us`` (CUDA events around each of 200 back-to-back calls, nothing
cleared: warm L2 like the graph's; host time shows where the GPU waits for the launch).

**Host overhead** (the issue's "per-kernel host overhead"): ``vm_host_us``, the host time of one call measured
directly: the GPU is put to sleep (``torch.cuda._sleep``) for longer than a batch of calls takes, each call is
timed by the CPU clock (no synchronisation inside; the launches just queue), median of 300 calls
(``host_busy``). ``host_per_launch_us = vm_host_us / kernels``; ``out_host_per_launch_us`` the same with
``out=`` tensors. The issue's formula ``(plain - graph) / kernels`` is reported like for like in both cache
states (``cold_plain_minus_graph_per_launch_us``: do_bench against the cold graph; ``warm_plain_minus_graph``:
back-to-back events against ``do_bench_cudagraph``) and as the earlier runs computed it
(``mixed_plain_minus_graph_per_launch_us``: cold plain minus warm graph, which counts the L2 clearing's cost as
host overhead). Also: ``vm_launch_only_us`` (the lean path's one C launcher call alone), ``vm_before_host_us``
(the lean path as of run 5: Triton's launcher per kernel, the Python signature check), ``vm_forward_host_us``
(the generated ``forward`` through ``JITFunction.run``), and PyTorch eager (op by op) and ``torch.compile``
(default mode) by the same measures. Outputs are checked against the float64 reference and between paths.
Writes ``eager_path.json`` and ``eager_path.md`` into ``--out`` after every case.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import loop, make_inputs
from torch_eager import rel_err, torch_fn

import verimirage as vm
from verimirage.backend.profile import DEFAULT_CONFIGS

log = logging.getLogger("eager_path")
HERE = Path(__file__).resolve().parent


def bench(fn: Any, cudagraph: bool) -> float:
    """Median µs of ``fn``: ``do_bench`` (L2 cleared before each call) or ``do_bench_cudagraph`` (warm L2)."""
    from triton.testing import do_bench, do_bench_cudagraph

    if cudagraph:
        return 1e3 * float(do_bench_cudagraph(fn, rep=60, return_mode="median"))
    return 1e3 * float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def bench_warm(fn: Any, n: int = 200) -> float:
    """Median µs between CUDA events recorded around each of ``n`` back-to-back calls, no L2 clearing (the cache
    state of a CUDA-graph replay): device time where the GPU is the bottleneck, host time plus device time where
    the host is (the GPU then waits for each launch)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return 1e3 * ts[n // 2]


def graph_of(fn: Any) -> Any:
    """A CUDA graph of one call of ``fn`` (captured on a side stream after warm-up calls)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


_SLEEP = {"cycles_per_us": 0.0}


def host_busy(fn: Any, n: int = 20, batches: int = 15) -> tuple[float, bool]:
    """Host µs of one call of ``fn`` with the GPU kept busy: each batch queues a GPU sleep long enough to outlast
    ``n`` calls, then times each call with the CPU clock (``perf_counter_ns`` around the Python call; no
    synchronisation inside). The launches only queue (the GPU is asleep), so this is the host's own cost, free of
    device time and cache state. Returns the median over all calls and whether every batch's sleep outlasted its
    calls (the GPU busy throughout)."""
    if not _SLEEP["cycles_per_us"]:
        torch.cuda._sleep(1_000_000)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        torch.cuda.synchronize()
        _SLEEP["cycles_per_us"] = 10_000_000 / (1e3 * a.elapsed_time(b))
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    est = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    cycles = int(_SLEEP["cycles_per_us"] * (3 * n * est + 2000))
    pc = time.perf_counter_ns
    samples: list[int] = []
    busy = True
    for _ in range(batches):
        torch.cuda._sleep(cycles)
        done = torch.cuda.Event()
        done.record()
        for _ in range(n):
            t = pc()
            fn()
            samples.append(pc() - t)
        busy = busy and not done.query()
        torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2] / 1e3, busy


def selected(row: dict[str, Any], candidates: Path | None = None) -> tuple[Any, Any]:
    """The μGraph and launch configuration the harness run selected for ``row``'s case."""
    text = row["verimirage_mugraph"]
    mg = vm.MuGraph.parse(text)
    doc = json.loads(((candidates or HERE / "candidates") / f"{row['case']}.json").read_text())
    ranks = [i for i, c in enumerate(doc["candidates"]) if str(vm.MuGraph.parse(c["mugraph"])) == str(mg)]
    by_str = {str(c): c for c in DEFAULT_CONFIGS}
    tried = sorted((t for t in row["candidates"] if t["error"] is None and t["rank"] in ranks), key=lambda t: t["ms"])
    cfg = by_str.get(tried[0]["config"]) if tried else None
    return mg, cfg



def measure(prefix: str, fn: Any, row: dict[str, Any], plain: bool = True, warm: bool = False,
            loop_too: bool = True) -> None:
    """The plain-call fields of ``fn`` under ``prefix``: host time with the GPU busy (``_host_us``), ``do_bench``
    (``_plain_us``, cold L2), back-to-back events (``_plain_warm_us``, warm L2) and a loop's wall time."""
    row[f"{prefix}_host_us"], row[f"{prefix}_host_busy_ok"] = host_busy(fn)
    if plain:
        row[f"{prefix}_plain_us"] = bench(fn, cudagraph=False)
    if warm:
        row[f"{prefix}_plain_warm_us"] = bench_warm(fn)
    if loop_too:
        row[f"{prefix}_loop_host_us"], row[f"{prefix}_loop_us"] = loop(fn)


def _lean_variant(mg: Any, cfg: Any, ins: Sequence[Any], env: dict[str, str]) -> Any:
    """The program compiled again, its lean plan made under environment ``env`` (e.g. Triton's launchers)."""
    prog = vm.compile(mg, config=cfg)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        prog(*ins)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return prog


def run_case(src: dict[str, Any], args: argparse.Namespace, t_start: float) -> dict[str, Any]:
    name, batch = src["name"], src.get("batch") or 1
    g = vm.benchmarks.get_model(name) if args.set == "models" else vm.benchmarks.get(name, batch=batch)
    ins = make_inputs(g, name, seed=batch)
    f = torch_fn(g)
    ref = f(*[x.double() for x in ins])
    mg, cfg = selected(src, args.candidates)
    k = mg.num_kernels
    row: dict[str, Any] = {"case": src["case"], "kernels": k, "config": None if cfg is None else cfg.key()}
    fn = vm.compile(mg, config=cfg)
    old = vm.compile(mg, config=cfg)
    old.lean = False  # the generated forward through JITFunction.run: the path before the lean one
    before = _lean_variant(mg, cfg, ins, {"VERIMIRAGE_LAUNCHER": "triton", "VERIMIRAGE_TENSOR_GUARD": "0"})
    out, out_old, out_before = fn(*ins), old(*ins), before(*ins)
    row["vm_err"] = rel_err(out, ref)
    outs = out if isinstance(out, tuple) else (out,)

    def same_as_out(other: Any) -> bool:
        return all(torch.equal(x, y) for x, y in zip(outs, other if isinstance(other, tuple) else (other,),
                                                      strict=True))

    row["lean_equals_forward"] = same_as_out(out_old)
    row["c_launcher_equals_triton_launcher"] = same_as_out(out_before)
    plan = next(iter(fn._plans.values()), None)
    if plan is None:
        raise RuntimeError("no lean plan was made for this program")
    row["launcher"], row["tensor_guard"] = plan.launcher, plan.guard is not None
    row["lean_plans"] = len(fn._plans)
    # device time: CUDA-graph replays, warm L2 (do_bench_cudagraph) and cold L2 (do_bench of one call's graph)
    row["vm_graph_us"] = bench(lambda: fn(*ins), cudagraph=True)
    graph = graph_of(lambda: fn(*ins))
    row["vm_graph_cold_us"] = bench(graph.replay, cudagraph=False)
    del graph
    measure("vm", lambda: fn(*ins), row, warm=True)
    obuf = tuple(torch.empty_like(o) for o in outs)
    oarg = obuf[0] if len(obuf) == 1 else obuf
    fn(*ins, out=oarg)
    row["out_equals_forward"] = all(torch.equal(a, b) for a, b in zip(obuf, outs, strict=True))
    measure("vm_out", lambda: fn(*ins, out=oarg), row, warm=True, loop_too=False)
    if plan.c_plan is not None and plan.run_out is not None:  # the launch alone: the one C call, these pointers
        from triton.runtime import driver

        from verimirage.backend import launch

        by_buf = {r[1]: o for r, o in zip(fn.returns, obuf, strict=True)}
        ptrs = [x.data_ptr() for x in ins] + [by_buf[bi].data_ptr() for bi in plan.returned_bufs]
        if plan.kept_workspace[0] is not None:
            ptrs.append(plan.kept_workspace[1])
        go, pl, stream_of, dev = launch.module().launch, plan.c_plan, driver.active.get_current_stream, \
            torch.cuda.current_device()
        try:
            row["vm_launch_only_us"], _ = host_busy(lambda: go(pl, stream_of(dev), *ptrs))
        except Exception as e:
            log.warning("%s: launch-only timing: %s: %s", src["case"], type(e).__name__, e)
    row["vm_before_host_us"], _ = host_busy(lambda: before(*ins))
    row["vm_before_out_host_us"], _ = host_busy(lambda: before(*ins, out=oarg))
    row["vm_forward_host_us"], _ = host_busy(lambda: old(*ins))
    row["host_per_launch_us"] = row["vm_host_us"] / k
    row["out_host_per_launch_us"] = row["vm_out_host_us"] / k
    row["cold_plain_minus_graph_per_launch_us"] = (row["vm_plain_us"] - row["vm_graph_cold_us"]) / k
    row["warm_plain_minus_graph_per_launch_us"] = (row["vm_plain_warm_us"] - row["vm_graph_us"]) / k
    row["mixed_plain_minus_graph_per_launch_us"] = (row["vm_plain_us"] - row["vm_graph_us"]) / k
    row["exposed_per_launch_us"] = (row["vm_loop_us"] - row["vm_graph_us"]) / k
    row["eager_err"] = rel_err(f(*ins), ref)
    measure("eager", lambda: f(*ins), row)
    if not args.no_inductor and time.perf_counter() - t_start < args.budget_s:
        try:
            torch._dynamo.reset()
            cf = torch.compile(f)
            row["inductor_err"] = rel_err(cf(*ins), ref)
            measure("inductor", lambda: cf(*ins), row)
        except Exception as e:
            row["inductor_error"] = f"{type(e).__name__}: {e}"[:300]
    elif not args.no_inductor:
        row["inductor_error"] = "skipped: time budget"
    return row


def micro() -> dict[str, float]:
    """Host µs of the pieces of a call on this machine (``host_busy``: GPU asleep, median of per-call CPU times):
    Python, an allocation, the signature check, an ATen op, a Triton launch, the C launcher of the lean path."""
    import triton
    import triton.language as tl
    from torch._C._dynamo.guards import TensorGuards
    from triton.runtime import driver

    from verimirage.backend import launch as vml

    @triton.jit
    def _touch(p):
        tl.store(p + tl.arange(0, 16), tl.load(p + tl.arange(0, 16)) + 1)

    x = torch.randn(1024, device="cuda").half()
    y = torch.randn(1024, device="cuda").half()
    k = _touch[(1,)](x)
    run = k.run
    tri, fun, meta = run.launch, k.function, k.packed_metadata
    get_stream, dev = driver.active.get_current_stream, torch.cuda.current_device()
    ptr = x.data_ptr()
    shape, stride, dt = x.shape, x.stride(), x.dtype
    guard = TensorGuards(x, dynamic_dims_sizes=[list(x.shape)], dynamic_dims_strides=[list(x.stride())]).check
    z = torch.empty_like(x)
    pieces: dict[str, Any] = {
        "python_noop_us": lambda: None,
        "torch_empty_us": lambda: torch.empty((2, 32, 16), dtype=torch.float16, device=x.device),
        "new_empty_us": lambda: x.new_empty((2, 32, 16)),
        "empty_like_us": lambda: torch.empty_like(x),
        "check_one_input_us": lambda: (x.data_ptr() & 15 != 0 or x.shape != shape or x.dtype is not dt
                                       or x.get_device() != dev or x.stride() != stride),
        "guard_one_input_us": lambda: (x.data_ptr() & 15 or not guard(x)),
        "stream_and_device_us": lambda: (torch._C._cuda_getDevice(), get_stream(dev)),
        "capture_check_us": torch._C._cuda_isCurrentStreamCapturing,
        "aten_add_us": lambda: torch.add(x, y),
        "aten_add_out_us": lambda: torch.add(x, y, out=z),
        "triton_jit_launch_us": lambda: _touch[(1,)](x),
        "triton_launcher_us": lambda: tri(1, 1, 1, get_stream(dev), fun, False, False, None, None, meta, None, None,
                                          None, ptr),
    }
    try:
        entry = vml.kernel_entry(k, [x], (1, 1, 1), [(0, 0)])
        plan = vml.make_plan(dev, 1, [entry])
        go = vml.module().launch
        before = x.clone()
        go(plan, get_stream(dev), ptr)
        torch.cuda.synchronize()
        pieces["c_launcher_ok"] = float(torch.equal(x[:16], before[:16] + 1))
        pieces["c_launcher_us"] = lambda: go(plan, get_stream(dev), ptr)
    except Exception as e:
        log.warning("C launcher: %s: %s", type(e).__name__, e)
    out: dict[str, float] = {}
    for name, fn in pieces.items():
        out[name] = fn if isinstance(fn, float) else host_busy(fn)[0]
    return out


def table(doc: dict[str, Any]) -> str:
    def f(r: dict[str, Any], key: str) -> str:
        v = r.get(key)
        return f"{v:.1f}" if isinstance(v, float) else "-"

    cols = [("k", "kernels"), ("graph", "vm_graph_us"), ("graph cold", "vm_graph_cold_us"),
            ("plain", "vm_plain_us"), ("plain warm", "vm_plain_warm_us"), ("host/call", "vm_host_us"),
            ("**host/k**", "host_per_launch_us"), ("out= host/k", "out_host_per_launch_us"),
            ("launch only", "vm_launch_only_us"), ("before: host/call", "vm_before_host_us"),
            ("forward: host/call", "vm_forward_host_us"),
            ("(plain-graph cold)/k", "cold_plain_minus_graph_per_launch_us"),
            ("(plain warm-graph)/k", "warm_plain_minus_graph_per_launch_us"),
            ("(plain-graph)/k mixed", "mixed_plain_minus_graph_per_launch_us"),
            ("eager plain", "eager_plain_us"), ("torch.compile plain", "inductor_plain_us"),
            ("eager host", "eager_host_us"), ("torch.compile host", "inductor_host_us")]
    lines = [
        f"Device: {doc['device']} · date {doc['date']} · torch {doc['torch']} · triton {doc['triton']}",
        "",
        "| case | " + " | ".join(c for c, _ in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error'][:120]} |")
            continue
        lines.append(f"| {r['case']} | " + " | ".join(str(r.get(key, "-")) if key == "kernels" else f(r, key)
                                                      for _, key in cols) + " |")
    if "micro" in doc:
        lines += ["", "Host µs per call of the pieces: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["micro"].items())]
    return "\n".join(lines) + "\n"


#: the eager-path fields merged into each row of the harness's results (``--merge``)
MERGED = ("kernels", "launcher", "tensor_guard", "vm_graph_us", "vm_graph_cold_us", "vm_plain_us",
          "vm_plain_warm_us", "vm_host_us", "vm_host_busy_ok", "vm_loop_us", "vm_loop_host_us", "vm_out_plain_us",
          "vm_out_plain_warm_us", "vm_out_host_us", "vm_launch_only_us", "vm_before_host_us",
          "vm_before_out_host_us", "vm_forward_host_us", "host_per_launch_us", "out_host_per_launch_us",
          "cold_plain_minus_graph_per_launch_us", "warm_plain_minus_graph_per_launch_us",
          "mixed_plain_minus_graph_per_launch_us", "exposed_per_launch_us", "eager_plain_us", "eager_host_us",
          "eager_loop_us", "inductor_plain_us", "inductor_host_us", "inductor_loop_us", "vm_err", "eager_err",
          "inductor_err", "lean_equals_forward", "c_launcher_equals_triton_launcher", "out_equals_forward")


def merge(run: dict[str, Any], results: Path, source: str, key: str = "eager_path", note: str = "") -> int:
    """Write one eager-path run's plain and graph fields into the harness's results (``latest.json``): per row
    under ``key`` (the run's own figures, from its device), and the run's device, date and pieces at the top
    under the same key (``note``: what the run was, e.g. which code)."""
    doc = json.loads(results.read_text())
    by_case = {r["case"]: r for r in run["rows"] if "error" not in r}
    n = 0
    for row in doc["rows"]:
        r = by_case.get(row["case"])
        if r is None:
            row.pop(key, None)
            continue
        row[key] = {k: r[k] for k in MERGED if k in r}
        n += 1
    doc[key] = {k: run[k] for k in ("device", "capability", "date", "torch", "triton", "selected_from")
                if k in run} | {"source": source, "note": note, "micro": run.get("micro", {}), "cases": n,
                                "fields": FIELDS}
    results.write_text(json.dumps(doc, indent=1) + "\n")
    return n


FIELDS = ("per row: benchmarks/eager_path.py's fields, µs. vm_graph_us: CUDA-graph replay, warm L2 "
          "(do_bench_cudagraph); vm_graph_cold_us: one call's graph under do_bench (L2 cleared); vm_plain_us: "
          "do_bench of the plain call (L2 cleared; host hidden behind the clearing memset); vm_plain_warm_us: "
          "events around back-to-back calls (warm L2); vm_host_us: host time of one call, measured by the CPU "
          "clock with the GPU asleep (median) = the host overhead; host_per_launch_us = vm_host_us / kernels; "
          "vm_out_*: with out= tensors; cold_/warm_plain_minus_graph_per_launch_us: the issue's (plain - graph)/k "
          "in one cache state; mixed_: cold plain minus warm graph (the earlier runs' figure); vm_launch_only_us: "
          "the C launcher call alone; vm_before_host_us: the lean path with Triton's launchers and the Python "
          "check (run 5's code); eager_*, inductor_*: PyTorch eager and torch.compile by the same measures")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="*", default=None, help="case names (e.g. gqa_bs8); default: all of latest.json")
    ap.add_argument("--set", choices=["suite", "models"], default="suite",
                    help="the suite (latest.json, candidates/) or the models set (models.json, candidates_models/)")
    ap.add_argument("--results", type=Path, default=None, help="the harness results the programs are taken from "
                    "(default: results/latest.json, or results/models.json with --set models)")
    ap.add_argument("--candidates", type=Path, default=None, help="their candidate files (default: candidates/, "
                    "or candidates_models/ with --set models)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results"))
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0, help="no new torch.compile after this many seconds")
    ap.add_argument("--key", default="eager_path", help="with --merge: the row key the fields go under")
    ap.add_argument("--note", default="", help="with --merge: what the run was (kept with its device and date)")
    ap.add_argument("--merge", type=Path, default=None, metavar="RUN_JSON",
                    help="no measurement: write RUN_JSON's fields into --results (rows' eager_path) and exit")
    args = ap.parse_args()
    models = args.set == "models"
    args.results = args.results or HERE / "results" / ("models.json" if models else "latest.json")
    args.candidates = args.candidates or HERE / ("candidates_models" if models else "candidates")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.merge is not None:
        n = merge(json.loads(args.merge.read_text()), args.results, str(args.merge), args.key, args.note)
        log.info("merged %d case(s) of %s into %s", n, args.merge, args.results)
        return 0
    if not torch.cuda.is_available():
        print("eager_path: needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    t_start = time.perf_counter()
    src = json.loads(args.results.read_text())
    rows = [r for r in src["rows"] if "verimirage_mugraph" in r and (not args.cases or r["case"] in args.cases)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
        "torch": torch.__version__, "triton": triton.__version__, "selected_from": f"{args.results.name} of "
        f"{src['date']} ({src['device']})", "rows": [],
    }
    doc["micro"] = micro()
    log.info("micro %s", doc["micro"])
    for r in rows:
        t0 = time.perf_counter()
        try:
            row = run_case(r, args, t_start)
        except Exception as e:
            log.exception("case %s failed", r["case"])
            row = {"case": r["case"], "error": f"{type(e).__name__}: {e}"[:500]}
        row["wall_s"] = time.perf_counter() - t0
        doc["rows"].append(row)
        log.info("%s", row)
        (out / "eager_path.json").write_text(json.dumps(doc, indent=1))
        (out / "eager_path.md").write_text(table(doc))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
