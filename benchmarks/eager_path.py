"""GPU measurement of the eager path (issue 28): host cost of a verimirage call against PyTorch's.

    python benchmarks/eager_path.py [--cases gqa_bs8 ...] [--out DIR] [--budget-s 330] [--set models]
    python benchmarks/eager_path.py --merge RUN.json [--results benchmarks/results/latest.json]

For every suite case of ``benchmarks/results/latest.json`` (the harness's last run; ``--set models``: every
models-set case of ``models.json``, candidates from ``candidates_models/``) it compiles the μGraph
that run selected, with the launch configuration it selected (the candidates were searched and verified
on a CPU machine; no search here), checks it against the float64 reference, and times on one GPU:

* ``vm_graph_us``: CUDA-graph replay of the program (``do_bench_cudagraph``, median) — device time;
* ``vm_plain_us``: ``do_bench`` (median; L2 cleared before each call, as the harness's ``*_plain_us``) of
  the ordinary call, which takes the lean launch path; ``vm_forward_plain_us``: the same call through the
  generated ``forward`` and ``JITFunction.run`` (the path before the lean one); ``vm_cg_plain_us``: the
  ``compile(..., cuda_graph=True)`` program (input copies plus one replay);
* ``vm_out_*``: the same call with caller-provided output tensors (``out=``: no allocation per call);
* ``*_host_us``: host seconds per call of 200 back-to-back calls (no synchronisation inside the loop, so
  the host runs ahead of the GPU), and ``*_loop_us``: the same loop's wall time per call up to the final
  synchronisation (what a Python loop of calls costs: the larger of host and device time);
* the same for PyTorch eager (the program op by op) and ``torch.compile`` (default mode: the plain-path
  host cost of a compiled callable; it is the harness's ``max-autotune-no-cudagraphs`` minus autotuning)
  and ``torch.compile(mode="reduce-overhead")`` (its CUDA graphs).

Per-kernel host overhead, as the issue defines it: ``(vm_plain_us - vm_graph_us) / kernels`` (but
``do_bench`` clears the L2 before each call and the GPU's memset hides up to ~100 µs of host time, so this
mixes cold-cache time in and leaves host time out); the host time a loop of calls exposes:
``(vm_loop_us - vm_graph_us) / kernels``; and the host time itself: ``vm_host_us / kernels``.
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
    """Median µs of ``fn``: ``do_bench`` (L2 cleared before each call) or ``do_bench_cudagraph``."""
    from triton.testing import do_bench, do_bench_cudagraph

    if cudagraph:
        return 1e3 * float(do_bench_cudagraph(fn, rep=100, return_mode="median"))
    return 1e3 * float(do_bench(fn, warmup=20, rep=100, return_mode="median"))


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


def measure(prefix: str, fn: Any, row: dict[str, Any], graph: bool = False) -> None:
    row[f"{prefix}_plain_us"] = bench(fn, cudagraph=False)
    row[f"{prefix}_host_us"], row[f"{prefix}_loop_us"] = loop(fn)
    if graph:
        row[f"{prefix}_graph_us"] = bench(fn, cudagraph=True)


def run_case(src: dict[str, Any], args: argparse.Namespace, t_start: float) -> dict[str, Any]:
    name, batch = src["name"], src.get("batch") or 1
    g = vm.benchmarks.get_model(name) if args.set == "models" else vm.benchmarks.get(name, batch=batch)
    ins = make_inputs(g, name, seed=batch)
    f = torch_fn(g)
    ref = f(*[x.double() for x in ins])
    mg, cfg = selected(src, args.candidates)
    row: dict[str, Any] = {"case": src["case"], "kernels": mg.num_kernels, "config": None if cfg is None else cfg.key()}
    fn = vm.compile(mg, config=cfg)
    old = vm.compile(mg, config=cfg)
    old.lean = False  # the generated forward through JITFunction.run: the path before the lean one
    cg = vm.compile(mg, config=cfg, cuda_graph=True)
    out, out_old, out_cg = fn(*ins), old(*ins), cg(*ins)
    row["vm_err"] = rel_err(out, ref)
    outs = out if isinstance(out, tuple) else (out,)
    row["lean_equals_forward"] = all(torch.equal(a, b) for a, b in
                                     zip(outs, out_old if isinstance(out_old, tuple) else (out_old,), strict=True))
    row["graph_equals_forward"] = all(torch.equal(a, b) for a, b in
                                      zip(outs, out_cg if isinstance(out_cg, tuple) else (out_cg,), strict=True))
    row["lean_plans"] = len(fn._plans)
    measure("vm", lambda: fn(*ins), row, graph=True)
    obuf = tuple(torch.empty_like(o) for o in outs)
    oarg = obuf[0] if len(obuf) == 1 else obuf
    fn(*ins, out=oarg)
    row["out_equals_forward"] = all(torch.equal(a, b) for a, b in zip(obuf, outs, strict=True))
    measure("vm_out", lambda: fn(*ins, out=oarg), row)
    measure("vm_forward", lambda: old(*ins), row)
    measure("vm_cg", lambda: cg(*ins), row)
    measure("vm_cg_static", lambda: cg(*cg.static_inputs), row)
    k = row["kernels"]
    row["host_per_launch_us"] = (row["vm_plain_us"] - row["vm_graph_us"]) / k
    row["host_direct_per_launch_us"] = row["vm_host_us"] / k
    row["out_host_per_launch_us"] = row["vm_out_host_us"] / k
    row["exposed_per_launch_us"] = (row["vm_loop_us"] - row["vm_graph_us"]) / k
    row["out_exposed_per_launch_us"] = (row["vm_out_loop_us"] - row["vm_graph_us"]) / k
    row["forward_host_per_launch_us"] = (row["vm_forward_plain_us"] - row["vm_graph_us"]) / k
    row["eager_err"] = rel_err(f(*ins), ref)
    measure("eager", lambda: f(*ins), row)
    if not args.no_inductor and time.perf_counter() - t_start < args.budget_s:
        try:
            torch._dynamo.reset()
            cf = torch.compile(f)
            row["inductor_err"] = rel_err(cf(*ins), ref)
            measure("inductor", lambda: cf(*ins), row)
            torch._dynamo.reset()
            cr = torch.compile(f, mode="reduce-overhead")
            for _ in range(3):
                cr(*ins)
            measure("inductor_ro", lambda: cr(*ins), row)
        except Exception as e:
            row["inductor_error"] = f"{type(e).__name__}: {e}"[:300]
    elif not args.no_inductor:
        row["inductor_error"] = "skipped: time budget"
    return row


def host_us(fn: Any, n: int = 2000) -> float:
    """Best-of-5 host µs per call of ``fn`` (no synchronisation inside)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return best


_TINY = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                        void**);
static launch_t cu_launch = NULL;
/* launch(function, gx, gy, gz, block_x, shared_bytes, stream, *pointer_args): cuLaunchKernel, GIL held */
static PyObject* launch(PyObject* self, PyObject* const* args, Py_ssize_t n) {
  uint64_t v[48];
  void* params[48];
  if (n < 7 || n > 44) { PyErr_SetString(PyExc_TypeError, "launch: 7 to 44 arguments"); return NULL; }
  if (!cu_launch) {
    void* h = dlopen("libcuda.so.1", RTLD_LAZY);
    cu_launch = h ? (launch_t)dlsym(h, "cuLaunchKernel") : NULL;
    if (!cu_launch) { PyErr_SetString(PyExc_RuntimeError, "no cuLaunchKernel"); return NULL; }
  }
  for (Py_ssize_t i = 0; i < n; i++) v[i] = PyLong_AsUnsignedLongLong(args[i]);
  if (PyErr_Occurred()) return NULL;
  Py_ssize_t k = 0;
  for (Py_ssize_t i = 7; i < n; i++) params[k++] = &v[i];
  uint64_t scratch = 0;
  params[k++] = &scratch;  /* Triton's global and profile scratch pointers */
  params[k++] = &scratch;
  int r = cu_launch((void*)v[0], (unsigned)v[1], (unsigned)v[2], (unsigned)v[3], (unsigned)v[4], 1, 1,
                    (unsigned)v[5], (void*)v[6], params, NULL);
  if (r) { PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel: error %d", r); return NULL; }
  Py_RETURN_NONE;
}
static PyMethodDef methods[] = {{"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch"},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "vm_tiny_launch", NULL, -1, methods};
PyMODINIT_FUNC PyInit_vm_tiny_launch(void) { return PyModule_Create(&mod); }
"""


def tiny_launcher() -> Any:
    """A minimal C launcher (``cuLaunchKernel`` with the GIL held, arguments as integers): the floor a launch
    from Python could reach, measured against Triton's own launcher in ``micro``."""
    from triton.runtime.build import compile_module_from_src

    return compile_module_from_src(_TINY, "vm_tiny_launch", libraries=["dl"])


def micro() -> dict[str, float]:
    """Host cost of the pieces of a call on this machine: Python, an allocation, an ATen op, a Triton launch."""
    import triton
    import triton.language as tl
    from triton import knobs
    from triton.runtime import driver

    @triton.jit
    def _touch(p):
        tl.store(p + tl.arange(0, 16), tl.load(p + tl.arange(0, 16)) + 1)

    x = torch.zeros(1024, dtype=torch.float16, device="cuda")
    y = torch.zeros(1024, dtype=torch.float16, device="cuda")
    k = _touch[(1,)](x)
    run = k.run
    launch, fun, meta = run.launch, k.function, k.packed_metadata
    get_stream, dev = driver.active.get_current_stream, torch.cuda.current_device()
    ptr = x.data_ptr()
    shape, stride, dt = x.shape, x.stride(), x.dtype
    out = {
        "python_noop_us": host_us(lambda: None),
        "torch_empty_us": host_us(lambda: torch.empty((2, 32, 16), dtype=torch.float16, device=x.device)),
        "new_empty_us": host_us(lambda: x.new_empty((2, 32, 16))),
        "check_one_input_us": host_us(lambda: (x.data_ptr() & 15 != 0 or x.shape != shape or x.dtype is not dt
                                               or x.get_device() != dev or x.stride() != stride)),
        "stream_and_device_us": host_us(lambda: (torch._C._cuda_getDevice(), get_stream(dev))),
        "aten_add_us": host_us(lambda: torch.add(x, y)),
        "aten_add_inplace_us": host_us(lambda: x.add_(1.0)),
        "triton_jit_launch_us": host_us(lambda: _touch[(1,)](x)),
        "triton_launcher_us": host_us(lambda: launch(1, 1, 1, get_stream(dev), fun, False, False, None, None, meta,
                                                      None, None, None, ptr)),
        "foreach_copy_3_us": host_us(lambda: torch._foreach_copy_([x, x, x], [y, y, y])),
        "copy_us": host_us(lambda: x.copy_(y)),
    }
    z = torch.empty_like(x)
    out["aten_add_out_us"] = host_us(lambda: torch.add(x, y, out=z))
    capturing = torch._C._cuda_isCurrentStreamCapturing
    out["capture_check_us"] = host_us(capturing)
    bump = torch._C._increment_version
    out["version_bump_us"] = host_us(lambda: bump((x,)))
    try:  # the floor of a launch from Python: a minimal C launcher (experiment; not used by verimirage)
        tiny = tiny_launcher()
        tl_launch, bx, shmem = tiny.launch, 32 * meta[0], meta[2]
        s = get_stream(dev)
        tl_launch(fun, 1, 1, 1, bx, shmem, s, ptr)
        torch.cuda.synchronize()
        before = x.clone()
        tl_launch(fun, 1, 1, 1, bx, shmem, s, ptr)
        torch.cuda.synchronize()
        out["tiny_launcher_ok"] = float(torch.equal(x[:16], before[:16] + 1))
        out["tiny_launcher_us"] = host_us(lambda: tl_launch(fun, 1, 1, 1, bx, shmem, get_stream(dev), ptr))
    except Exception as e:
        log.warning("tiny launcher: %s: %s", type(e).__name__, e)
    alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
    free = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
    if alloc is not None and free is not None:
        out["raw_alloc_free_us"] = host_us(lambda: free(alloc(8704, get_stream(dev))))
    del knobs
    return out


def table(doc: dict[str, Any]) -> str:
    def f(r: dict[str, Any], key: str) -> str:
        v = r.get(key)
        return f"{v:.1f}" if isinstance(v, float) else "-"

    lines = [
        f"Device: {doc['device']} · date {doc['date']} · torch {doc['torch']} · triton {doc['triton']}",
        "",
        "| case | k | vm graph | vm plain | (plain-graph)/k | vm host/call | host/k | out= host/call | out= host/k | "
        "(loop-graph)/k | before: host/call | cuda_graph=True loop (copy / static) | eager plain | "
        "torch.compile plain | eager loop | torch.compile loop | reduce-overhead loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        lines.append(
            f"| {r['case']} | {r.get('kernels') or '-'} | {f(r, 'vm_graph_us')} | {f(r, 'vm_plain_us')} | "
            f"{f(r, 'host_per_launch_us')} | {f(r, 'vm_host_us')} | {f(r, 'host_direct_per_launch_us')} | "
            f"{f(r, 'vm_out_host_us')} | {f(r, 'out_host_per_launch_us')} | {f(r, 'exposed_per_launch_us')} | "
            f"{f(r, 'vm_forward_host_us')} | {f(r, 'vm_cg_loop_us')} / {f(r, 'vm_cg_static_loop_us')} | "
            f"{f(r, 'eager_plain_us')} | {f(r, 'inductor_plain_us')} | {f(r, 'eager_loop_us')} | "
            f"{f(r, 'inductor_loop_us')} | {f(r, 'inductor_ro_loop_us')} |"
        )
    if "micro" in doc:
        lines += ["", "Host µs per call of the pieces: " + ", ".join(f"{k} {v:.2f}" for k, v in doc["micro"].items())]
    return "\n".join(lines) + "\n"


#: the eager-path fields merged into each row of the harness's results (``--merge``)
MERGED = ("kernels", "vm_graph_us", "vm_plain_us", "vm_host_us", "vm_loop_us", "vm_out_plain_us", "vm_out_host_us",
          "vm_out_loop_us", "vm_forward_host_us", "vm_cg_loop_us", "vm_cg_static_loop_us", "host_per_launch_us",
          "host_direct_per_launch_us", "out_host_per_launch_us", "exposed_per_launch_us",
          "out_exposed_per_launch_us", "eager_plain_us", "eager_host_us", "eager_loop_us", "inductor_plain_us",
          "inductor_host_us", "inductor_loop_us", "inductor_ro_loop_us", "vm_err", "lean_equals_forward",
          "out_equals_forward", "graph_equals_forward")


def merge(run: dict[str, Any], results: Path, source: str) -> int:
    """Write one eager-path run's plain and graph fields into the harness's results (``latest.json``): per row
    under ``eager_path`` (the run's own figures, from its device), and the run's device and date at the top."""
    doc = json.loads(results.read_text())
    by_case = {r["case"]: r for r in run["rows"] if "error" not in r}
    n = 0
    for row in doc["rows"]:
        r = by_case.get(row["case"])
        if r is None:
            row.pop("eager_path", None)
            continue
        row["eager_path"] = {k: r[k] for k in MERGED if k in r}
        n += 1
    doc["eager_path"] = {k: run[k] for k in ("device", "capability", "date", "torch", "triton", "selected_from")
                         if k in run} | {"source": source, "micro": run.get("micro", {}), "cases": n,
                                         "fields": "per row under eager_path: benchmarks/eager_path.py's fields "
                                                   "(µs; *_graph_us: CUDA-graph replay, *_plain_us: do_bench, "
                                                   "*_host_us / *_loop_us: host / wall time per call of a loop "
                                                   "of calls, vm_out_*: with out= tensors)"}
    results.write_text(json.dumps(doc, indent=1) + "\n")
    return n


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
    ap.add_argument("--merge", type=Path, default=None, metavar="RUN_JSON",
                    help="no measurement: write RUN_JSON's fields into --results (rows' eager_path) and exit")
    args = ap.parse_args()
    models = args.set == "models"
    args.results = args.results or HERE / "results" / ("models.json" if models else "latest.json")
    args.candidates = args.candidates or HERE / ("candidates_models" if models else "candidates")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.merge is not None:
        n = merge(json.loads(args.merge.read_text()), args.results, str(args.merge.name))
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
