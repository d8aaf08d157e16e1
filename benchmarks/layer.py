"""The decoder-layer benchmark (issue 23): search + verify here, then time the layer on a GPU.

    python benchmarks/layer.py prepare [--cases ...] [--small] [--out DIR] [--time-budget-s S] [--cert DIR]
    python benchmarks/layer.py plan    [--cases ...] [--small] [--out DIR]   # the region search, unverified
    python benchmarks/layer.py prove   [--cases ...] [--candidates DIR] [--cert DIR]  # verify a plan (no egglog)
    python benchmarks/layer.py check   [--cases ...] [--candidates DIR]      # CPU: interpreter vs float64
    python benchmarks/layer.py regroup --cases CASE --from-cert CERT --nodes A-B --cert OUT [--alternatives N]
    python benchmarks/layer.py gpu     [--cases ...] [--candidates DIR] [--out DIR] [--no-inductor]

``prepare`` (a CPU machine) superoptimizes each case's kernel graph
(:func:`verimirage.benchmarks.get_layer`), verifies it, and writes the verified candidates (μGraph text,
kernels, cost estimate, rules) to ``DIR/<case>.json`` (``<case>_small.json`` for the scaled-down
layer), like benchmarks/prepare_candidates.py; ``--cert`` saves the best candidate's certificate.
``check`` runs the written candidates of the scaled-down layer in Triton's interpreter against the
float64 reference. ``gpu`` loads the candidates of the full-size layer, compiles the best ones with
``cuda_graph=True`` (the whole layer one CUDA graph), checks them against float64 (the PyTorch module in
float64 on the GPU), and times, all as CUDA-graph replays (medians): verimirage; ``torch.compile
(mode="max-autotune")`` of the same ``nn.Module`` (:mod:`verimirage.benchmarks.layer_module`, CUDA
graphs on; and ``mode="max-autotune-no-cudagraphs"`` captured into one graph by ``do_bench_cudagraph``, as a
check of the first); eager (captured into a graph by ``do_bench_cudagraph``); and the floor (the weights and the
KV cache once through memory at the measured copy bandwidth). Per case it reports the launches (kernels
per layer, counted by the profiler for the baselines), the bytes moved (verimirage: the cost model's
count) against the weights' size, what the CUDA graph still pays for (the replay's time against the
sum of its kernels' times; the kernels' times by name), each time against the floor. verimirage is timed first,
before the baselines' compiles run in the process. ``--pdl`` (default "auto") compiles verimirage's kernels for
programmatic dependent launch (``VERIMIRAGE_PDL``: each kernel waits for the one before it, then the next may be
placed early; benchmarks/perf/NOTES.md session 13); the best candidate is then also timed without it. Rows go to
``--out``/layer.json (default benchmarks/results), written after every case.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import verimirage as vm
from verimirage.benchmarks.layer import dims, get_layer, layer_cases

log = logging.getLogger("layer")
HERE = Path(__file__).resolve().parent
DEFAULT_CANDIDATES = HERE / "candidates" / "layer"
#: ``prepare``/``plan --window-ops N``: the search by regions also tries runs of three regions of at most N ops as
#: one (``SearchOptions.window_ops``; 24 takes the attention's Q K^T, softmax and P @ V regions, 20 ops, as one
#: split-KV kernel and its combine). Off by default: the bs1 plan took 333 s with it (07:54 UTC 2026-11-27, the
#: 2-core machine shared by eight sessions), past the issue's five minutes for search and verify
WINDOW_OPS = 0


def _file(directory: Path, case: str, small: bool) -> Path:
    return directory / f"{case}{'_small' if small else ''}.json"


def _verdict(v: Any) -> str:
    return str(v.summary()) if hasattr(v, "summary") else str(v)


# --------------------------------------------------------------------------- prepare (CPU)


def prepare(case: str, small: bool, out: Path, *, time_budget_s: float, top_k: int, cert_dir: Path | None,
            verify_timeout_s: float = 300.0, max_verify: int | None = None,
            window_ops: int = WINDOW_OPS) -> dict[str, Any]:
    """Search + verify ``case``; write its candidate file (and the best's certificate); return the summary.

    ``verify_timeout_s``: the verifier's Z3 time limit per candidate (a whole layer's abstract check takes
    ~40 s scaled down and ~130 s at full size on the 2-core machine: superoptimize's default 10 s leaves it
    Unknown)."""
    g = get_layer(case, small)
    t0 = time.perf_counter()
    res = vm.superoptimize(g, top_k=top_k, time_budget_s=time_budget_s, cache=False,
                           verify_timeout_s=verify_timeout_s, max_verify=max_verify, window_ops=window_ops)
    dt = time.perf_counter() - t0
    doc: dict[str, Any] = {
        "case": case,
        "small": small,
        "graph": str(g),
        "search_s": dt,
        "time_budget_s": time_budget_s,
        "verify_timeout_s": verify_timeout_s,
        "report": str(res.report),
        "candidates": [
            {"mugraph": str(c.mugraph), "kernels": c.num_kernels, "cost_us": c.cost.time_s * 1e6,
             "bytes": c.cost.bytes, "rules": list(c.rules), "verdict": _verdict(c.verdict)}
            for c in res.candidates
        ],
    }
    out.mkdir(parents=True, exist_ok=True)
    tmp = _file(out, case, small).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(_file(out, case, small))  # whole, for a GPU run waiting on it (gpu --wait-s)
    if cert_dir is not None and res.candidates:
        cert_dir.mkdir(parents=True, exist_ok=True)
        path = cert_dir / f"layer_{case}{'_small' if small else ''}.json"
        res.best.certificate.save(str(path))
        doc["certificate"] = str(path)
    log.info("%s%s: %.1f s, %d candidate(s), kernels %s", case, " (small)" if small else "", dt,
             len(res.candidates), [c.num_kernels for c in res.candidates])
    return doc


def plan(case: str, small: bool, out: Path, *, time_budget_s: float, window_ops: int = WINDOW_OPS) -> dict[str, Any]:
    """The search side of ``case``'s search by regions, unverified (:func:`verimirage.pipeline.superopt.plan_regions`):
    the regions and their μGraphs, for :func:`prove` to verify elsewhere (the GPU host, which has no egglog);
    also the composition's cost and its floating-point structure check. Written to ``DIR/<case>.plan.json``."""
    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.fpsafe import SafetyChecker
    from verimirage.pipeline.pricing import cost
    from verimirage.pipeline.superopt import plan_regions
    from verimirage.rewrite.rules import UNPROVED_BUILTINS
    from verimirage.smt.glue import compose

    g = get_layer(case, small)
    t0 = time.perf_counter()
    out_ = plan_regions(g, time_budget_s=time_budget_s, window_ops=window_ops)
    composed = compose(g, out_.regions, out_.mugraphs)
    c = cost(composed)
    doc = {"case": case, "small": small, "graph": str(g), "plan_s": time.perf_counter() - t0,
           "regions": [list(r.nodes) for r in out_.regions], "mugraphs": [str(m) for m in out_.mugraphs],
           "rules": [[x for x in r.rules if x not in UNPROVED_BUILTINS] for r in out_.reports],
           "trusted_rules": [[x for x in r.rules if x in UNPROVED_BUILTINS] for r in out_.reports],
           "report": [str(r) for r in out_.reports], "composed": str(composed), "kernels": composed.num_kernels,
           "cost_us": c.time_s * 1e6, "bytes": c.bytes,
           "fp_unsafe": SafetyChecker(g, 0).check(composed)}
    assert isinstance(composed, MuGraph)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{case}{'_small' if small else ''}.plan.json").write_text(json.dumps(doc, indent=1))
    log.info("%s: planned in %.1f s, %d regions, %d kernels", case, doc["plan_s"], len(doc["regions"]),
             doc["kernels"])
    return doc


def prove(case: str, small: bool, directory: Path, cert_dir: Path | None, *,
          verify_timeout_s: float = 300.0) -> dict[str, Any]:
    """Verify a :func:`plan`: each distinct region's μGraph against its region (``vm.verify``, a certificate
    each), the composition by its glue (a composed certificate); writes the candidate file as :func:`prepare`
    does (and the certificate to ``cert_dir``). Uses no egglog (runs on the GPU host)."""
    from verimirage.backend.tuning import triton_digest
    from verimirage.ir.graph import MuGraph
    from verimirage.smt.certify import make_certificate, make_composed_certificate
    from verimirage.smt.glue import compose, region_of
    from verimirage.smt.verify import Verifier

    g = get_layer(case, small)
    name = f"{case}{'_small' if small else ''}"
    p = json.loads((directory / f"{name}.plan.json").read_text())
    if p["graph"] != str(g) or p["fp_unsafe"] is not None:
        raise ValueError(f"{case}: the plan is for another graph, or its composition is unsafe: {p['fp_unsafe']}")
    t0 = time.perf_counter()
    regions = [region_of(g, nodes) for nodes in p["regions"]]
    mgs = [MuGraph.parse(t) for t in p["mugraphs"]]
    made: dict[tuple[str, str], Any] = {}
    secs = []
    for reg, mg, rules, trusted in zip(regions, mgs, p["rules"], p["trusted_rules"], strict=True):
        key = (str(reg.graph), str(mg))
        if key not in made:
            t1 = time.perf_counter()
            v = Verifier(reg.graph).check(mg, timeout_s=verify_timeout_s)  # (one-shot: its cache freed after)
            if not v.proved:
                raise ValueError(f"{case}: a region's μGraph is not proved: {v.reason}")
            made[key] = make_certificate(reg.graph, mg, v, rules, trusted, timeout_s=verify_timeout_s)
            secs.append(time.perf_counter() - t1)
    composed = compose(g, regions, mgs)
    assert str(composed) == p["composed"]
    reason = (f"by regions: {len(regions)} region μGraph(s) each proved against its region, the composition by "
              "its glue (congruence)")
    subs = [made[(str(r.graph), str(m))] for r, m in zip(regions, mgs, strict=True)]
    cert = make_composed_certificate(g, regions, subs, reason, triton_digest(composed))
    prove_s = time.perf_counter() - t0
    doc = {"case": case, "small": small, "graph": str(g), "search_s": p["plan_s"] + prove_s,
           "plan_s": p["plan_s"], "prove_s": prove_s, "region_verify_s": secs, "report": "\n".join(p["report"]),
           "candidates": [{"mugraph": str(composed), "kernels": composed.num_kernels, "cost_us": p["cost_us"],
                           "bytes": p["bytes"], "rules": sorted({x for r in p["rules"] for x in r}),
                           "verdict": f"Proved: {reason}"}]}
    (directory / f"{name}.json").write_text(json.dumps(doc, indent=1))
    if cert_dir is not None:
        cert_dir.mkdir(parents=True, exist_ok=True)
        cert.save(cert_dir / f"layer_{name}.json")
    log.info("%s: proved in %.1f s (%d distinct regions)", case, prove_s, len(made))
    return doc


def regroup(case: str, small: bool, directory: Path, cert_in: Path, members: list[int], cert_out: Path, *,
            time_budget_s: float = 120.0, verify_timeout_s: float = 300.0, alternatives: int = 0,
            grids: list[int] | None = None, franges: list[int] | None = None,
            max_splits: int | None = None) -> dict[str, Any]:
    """Re-search a composed candidate with some of its regions as one: the regions of ``cert_in`` (a composed
    certificate of ``case``) whose nodes lie in ``members`` (graph node indices) become one region, searched whole
    (``vm.superoptimize``, ``split="never"``: a fusion across the boundaries the region split drew, e.g. an
    attention's two products and its softmax as one split-KV kernel pair; a union of unrelated parts, such as the
    q, k and v projections' rotary regions, as one region per connected part: the k projection's split-K combine
    with its rotary), its best μGraph verified against it; the others keep their μGraphs and certificates. The
    composition is re-certified (``cert_out``, with its Triton digest) and re-checked (``vm.check_certificate``),
    checked for floating-point safety, and put first in ``DIR/<case>.json`` (the other candidates after it).

    ``alternatives`` > 0: ``members`` may be one region (a connected one): its ``alternatives`` best verified
    candidates (the search's best structure and its ``variants``: the same grids, other loop ranges; best by cost
    first, the region's own μGraph skipped) each make a composition, certified as ``cert_out`` with ``_alt<k>``
    before its suffix and appended to the file's candidates (for the GPU to rank: the cost model ranks such
    siblings least reliably). ``grids`` / ``franges`` / ``max_splits``: the search's allowed per-axis block counts,
    loop ranges and most KV splits (``SearchOptions.grids`` / ``franges`` / ``max_splits``)."""
    from verimirage.ir.graph import MuGraph, node_list
    from verimirage.rewrite.partition import connected_parts
    from verimirage.rewrite.rules import UNPROVED_BUILTINS
    from verimirage.smt.certificate import Certificate, ComposedCertificate
    from verimirage.smt.certify import make_certificate, read_certificate
    from verimirage.smt.glue import region_of
    from verimirage.smt.verify import Verifier

    g = get_layer(case, small)
    old = read_certificate(cert_in.read_text())
    if not isinstance(old, ComposedCertificate) or old.graph_text != str(g):
        raise ValueError(f"{cert_in}: not a composed certificate of {case}")
    want = set(members)
    regions, mgs, subs, merged, own = [], [], [], [], []
    for r in old.regions:
        sub = Certificate.from_json(json.dumps(old.certificates[r["certificate"]]))
        if set(r["nodes"]) <= want:
            merged.append(r["nodes"])
            own.append(sub.mugraph_text)
            if len(merged) > 1:
                continue
            regions.append(None)
            mgs.append(None)
            subs.append(None)
            continue
        regions.append(region_of(g, r["nodes"]))
        mgs.append(MuGraph.parse(sub.mugraph_text))
        subs.append(sub)
    nodes = sorted(i for ns in merged for i in ns)
    if len(merged) < (1 if alternatives else 2) or set(nodes) != want:
        raise ValueError(f"{case}: nodes {sorted(want)} are not a union of "
                         f"{'one or more' if alternatives else 'two or more'} of the candidate's regions")
    # each connected part of the union its own region, searched whole (the normal search by regions splits a region
    # into its connected parts too: one kernel over unrelated parts has no grid axis they share)
    parts = connected_parts(node_list(g), nodes)
    if alternatives and len(parts) > 1:
        raise ValueError(f"{case}: alternatives of a union of {len(parts)} connected parts (one part only)")
    t0 = time.perf_counter()
    made: list[list[Any]] = []  # per part: its verified (region, μGraph, certificate, found), best first
    for part in parts:
        reg = region_of(g, part)
        res = vm.superoptimize(reg.graph, top_k=1, variants=max(0, alternatives - 1), time_budget_s=time_budget_s,
                               grids=tuple(grids) if grids else None, franges=tuple(franges) if franges else None,
                               **({"max_splits": max_splits} if max_splits else {}),
                               cache=False, split="never", verify_timeout_s=verify_timeout_s)
        got = []
        for cand in res.candidates:
            mg = cand.mugraph
            if not getattr(cand.verdict, "proved", False) or (alternatives and str(mg) in own):
                continue
            v = Verifier(reg.graph).check(mg, timeout_s=verify_timeout_s)
            if not v.proved:
                raise ValueError(f"{case}: the merged region's μGraph is not proved: {v.reason}")
            rules = [x for x in cand.rules if x not in UNPROVED_BUILTINS]
            trusted = [x for x in cand.rules if x in UNPROVED_BUILTINS]
            found = (f"{part[0]}..{part[-1]}: {mg.num_kernels} kernel(s), {cost_us(mg):.1f} us est. "
                     f"({', '.join(cand.rules)})")
            got.append((reg, mg, make_certificate(reg.graph, mg, v, rules, trusted, timeout_s=verify_timeout_s), found))
            if len(got) >= max(1, alternatives):
                break
        if not got:
            raise ValueError(f"{case}: no verified candidate for the merged region's part {part[0]}..{part[-1]}"
                             + (" other than its own μGraph" if alternatives else ""))
        made.append(got)
    at = regions.index(None)
    path = _file(directory, case, small)
    doc = json.loads(path.read_text())
    picks = [[m[0] for m in made]] if not alternatives else [[m] for m in made[0]]
    for k, pick in enumerate(picks):
        regs, mgs_k, subs_k = list(regions), list(mgs), list(subs)
        regs[at:at + 1] = [r for r, _, _, _ in pick]
        mgs_k[at:at + 1] = [m for _, m, _, _ in pick]
        subs_k[at:at + 1] = [c for _, _, c, _ in pick]
        out = cert_out if not alternatives else cert_out.with_name(f"{cert_out.stem}_alt{k}{cert_out.suffix}")
        how = (f"regroup{f', as its {len(parts)} connected parts' if len(parts) > 1 else ''}" if not alternatives
               else f"regroup, its alternative {k}")
        entry = _certified_composition(case, g, regs, mgs_k, subs_k, nodes, how, out)
        found = "; ".join(f for _, _, _, f in pick)
        if alternatives:
            doc["candidates"].append(entry)
            doc["report"] += (f"\nregroup: candidate {len(doc['candidates']) - 1} is {cert_in.name}'s composition "
                              f"with region {nodes[0]}..{nodes[-1]} re-searched, its alternative {k} (searched in "
                              f"{time.perf_counter() - t0:.1f} s): {found}; certificate {out}")
        else:
            doc["candidates"].insert(0, entry)
            doc["report"] += (f"\nregroup: candidate 0 is the former candidate 0 ({cert_in.name}) with regions "
                              f"{merged} as one region {nodes[0]}..{nodes[-1]}, searched whole in "
                              f"{time.perf_counter() - t0:.1f} s ({len(parts)} connected part(s)): {found}; "
                              f"certificate {out}")
        log.info("%s: regrouped %s -> %d kernels, %.1f us est.", case, merged, entry["kernels"], entry["cost_us"])
    path.write_text(json.dumps(doc, indent=1))
    return doc


def cost_us(mg: Any) -> float:
    """The cost model's estimate of ``mg`` in µs."""
    from verimirage.pipeline.pricing import cost

    return float(cost(mg).time_s * 1e6)


def _certified_composition(case: str, g: Any, regions: list[Any], mgs: list[Any], subs: list[Any], nodes: list[int],
                           how: str, cert_out: Path) -> dict[str, Any]:
    """The regions' μGraphs composed, checked for floating-point safety, certified (``cert_out``, with the Triton
    digest) and re-checked; its candidate entry."""
    from verimirage.backend.tuning import triton_digest
    from verimirage.pipeline.fpsafe import SafetyChecker
    from verimirage.pipeline.pricing import cost
    from verimirage.smt.certify import make_composed_certificate
    from verimirage.smt.glue import compose

    composed = compose(g, regions, mgs)
    unsafe = SafetyChecker(g, 0).check(composed)
    if unsafe is not None:
        raise ValueError(f"{case}: the composition is not floating-point safe: {unsafe}")
    reason = (f"by regions: {len(regions)} region μGraph(s) each proved against its region, the composition by its "
              f"glue (congruence); region {nodes[0]}..{nodes[-1]} re-searched whole ({how})")
    cert = make_composed_certificate(g, regions, subs, reason, triton_digest(composed))
    cert_out.parent.mkdir(parents=True, exist_ok=True)
    cert.save(cert_out)
    verdict = vm.check_certificate(cert_out)
    if not isinstance(verdict, vm.Proved):
        raise ValueError(f"{case}: the regrouped certificate does not re-check: {verdict}")
    c = cost(composed)
    rules_all = sorted({x for s in subs for x in s.rules})
    return {"mugraph": str(composed), "kernels": composed.num_kernels, "cost_us": c.time_s * 1e6, "bytes": c.bytes,
            "rules": rules_all, "verdict": f"Proved: {reason}"}


def load(directory: Path, case: str, small: bool) -> tuple[vm.Graph, list[Any], dict[str, Any]]:
    """The graph of ``case`` and the verified candidates written for it (ValueError if made for another graph)."""
    g = get_layer(case, small)
    doc = json.loads(_file(directory, case, small).read_text())
    if doc["graph"] != str(g):
        raise ValueError(f"{case}: the candidate file {_file(directory, case, small)} was made for another graph")
    return g, [vm.MuGraph.parse(c["mugraph"]) for c in doc["candidates"]], doc


# --------------------------------------------------------------------------- check (CPU interpreter)


def check(case: str, directory: Path, *, seed: int = 0, max_candidates: int = 1) -> list[dict[str, Any]]:
    """Run the scaled-down case's candidates in Triton's interpreter against the float64 reference
    (``vm.evaluate`` of the graph on the same inputs); returns one row per candidate."""
    import numpy as np
    import torch

    from verimirage.benchmarks.layer_module import make_case

    g, cands, _ = load(directory, case, small=True)
    c = make_case(case, small=True, dtype=torch.float16, seed=seed)
    ins = c["graph_inputs"]
    ref = vm.evaluate(g, {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in ins.items()})
    rows = []
    for i, mg in enumerate(cands[:max_candidates]):
        fn = vm.compile(mg)
        outs = fn(*[ins[t.name] for t in g.inputs])
        outs = outs if isinstance(outs, tuple) else (outs,)
        errs = [float(np.linalg.norm(o.double().numpy() - r) / np.linalg.norm(r))
                for o, r in zip(outs, ref, strict=True)]
        rows.append({"case": case, "rank": i, "kernels": mg.num_kernels, "rel_err": max(errs)})
    return rows


# --------------------------------------------------------------------------- gpu


def _bench(fn: Any, cudagraph: bool) -> float:
    """Median µs of ``fn``: ``do_bench_cudagraph`` (captures ``fn``'s launches into a graph) or ``do_bench``
    (for ``fn`` that already replays a CUDA graph); on a CPU (the harness's dry run) the median of 3 calls."""
    import torch
    from triton.testing import do_bench, do_bench_cudagraph

    if not torch.cuda.is_available():
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        return sorted(ts)[1]

    if cudagraph:
        return 1e3 * float(do_bench_cudagraph(fn, rep=300, return_mode="median"))
    return 1e3 * float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def ceilings() -> dict[str, float]:
    """Measured device copy bandwidth (bytes read + written per second) and fp16 matmul rate."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = 1 << (30 if dev == "cuda" else 24)
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    bw = 2 * n / (_bench(lambda: b.copy_(a), cudagraph=False) * 1e-6)
    m = 8192 if dev == "cuda" else 256
    dt = torch.float16 if dev == "cuda" else torch.float32
    x = torch.randn(m, m, device=dev, dtype=dt)
    y = torch.randn(m, m, device=dev, dtype=dt)
    tm = _bench(lambda: x @ y, cudagraph=False) * 1e-6
    return {"copy_bytes_per_s": bw, "fp16_flops_per_s": 2 * m**3 / tm}


def _kernels(fn: Any, per_name: dict[str, float] | None = None) -> tuple[int | None, float | None]:
    """Kernels one call of ``fn`` launches and the sum of their device times (µs), by the profiler (None when
    it records no kernel, e.g. inside a replayed graph on some CUPTI versions); ``per_name`` (if given) gets
    each kernel's time by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        return None, None
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
           and not e.name.startswith(("Memcpy", "Memset", "cudaGraph"))]
    if not evs:
        return None, None
    if per_name is not None:
        for e in evs:
            per_name[e.name] = per_name.get(e.name, 0.0) + e.device_time
    return len(evs), sum(e.device_time for e in evs)


def _kernel_medians(fn: Any, reps: int = 5) -> dict[str, float]:
    """Each kernel's device time (µs, by name) over ``reps`` profiled calls of ``fn``: the median per name."""
    import statistics

    seen: dict[str, list[float]] = {}
    for _ in range(reps):
        per: dict[str, float] = {}
        _kernels(fn, per)
        for k, v in per.items():
            seen.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in seen.items()}


#: uniform launch configurations a ``gpu --sweep-configs`` run times every kernel of the layer under (besides the
#: per-kernel rules, ``tuning.recommend``): what the rules should pick, kernel by kernel
SWEEP = ((4, 3, 16), (4, 4, 16), (4, 6, 16), (8, 4, 16), (4, 3, 64))


def config_sweep(mg: Any, ordered: list[Any]) -> dict[str, dict[str, float]]:
    """Per-kernel medians (µs) of ``mg`` under the per-kernel rules and each :data:`SWEEP` configuration (every
    kernel the same one, fitted to shared memory as ``vm.compile`` does); a configuration that fails is
    recorded as its error."""
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    out: dict[str, Any] = {}
    for c in [LaunchConfig(tuned=True), *(LaunchConfig(w, st, TileOptions(dot_min_m=m)) for w, st, m in SWEEP)]:
        try:
            fn = vm.compile(mg, config=c)
            _precompile(fn, ordered)
            out[c.key()] = _kernel_medians(lambda fn=fn: fn(*ordered))
        except Exception as e:
            out[c.key()] = {"error": f"{type(e).__name__}: {e}"[:200]}  # type: ignore[dict-item]
    return out


def _precompile(fn: Any, ordered: list[Any]) -> None:
    """Compile ``fn``'s kernels side by side before its first call (``ptxas`` is ~1.4 s a kernel); a failure here is
    only logged (the first call compiles them one by one, and reports what fails)."""
    from verimirage.backend.precompile import precompile

    try:
        t0 = time.perf_counter()
        n = precompile(fn, *ordered, workers=16)
        log.info("precompiled %d kernel(s) in %.1f s", n, time.perf_counter() - t0)
    except Exception as e:
        log.warning("precompile failed (%s: %s); the first call compiles the kernels", type(e).__name__, e)


def _rel(out: Any, ref: Any) -> float:
    from torch_eager import rel_err

    return float(rel_err(out, ref))


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` set to ``value`` inside, as it was after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _pdl(mode: str) -> contextlib.AbstractContextManager[None]:
    """``vm.compile`` inside generates kernels for programmatic dependent launch in ``mode`` ("off": none; see
    ``VERIMIRAGE_PDL``, :func:`verimirage.backend.runtime._pdl_wanted`)."""
    return _env("VERIMIRAGE_PDL", "" if mode == "off" else mode)


def _merge(on: bool) -> contextlib.AbstractContextManager[None]:
    """``vm.compile`` inside runs the kernels that read nothing another writes as one launch, or not
    (``VERIMIRAGE_MERGE``, :func:`verimirage.backend.runtime._merge_wanted`)."""
    return _env("VERIMIRAGE_MERGE", "1" if on else "")


def _persistent(mode: str) -> contextlib.AbstractContextManager[None]:
    """The runtime's persistent-kernel mode ("coop", "plain" or "off") for the compiles inside
    (``VERIMIRAGE_PERSISTENT``, :func:`verimirage.backend.runtime._persistent_wanted`)."""
    return _env("VERIMIRAGE_PERSISTENT", {"coop": "1", "plain": "plain"}.get(mode, ""))


#: how many times a ``gpu --persistent`` run calls a persistent program before timing it (a race shows as outputs
#: that differ between calls on the same inputs)
PERSISTENT_REPEATS = 20


#: launch parameters a ``gpu --merge both`` run also times every merged launch under (num_warps, num_stages)
MERGE_SWEEP = ((4, 4), (8, 4), (16, 4), (8, 2))


def gpu_case(case: str, directory: Path, ceil: dict[str, float], *, inductor: bool, top_k: int,
             small: bool = False, per_op: bool = True, wait_until: float = 0.0,
             sweep: bool = False, pdl: str = "auto", merge: str = "off",
             inductor_repeats: int = 1, merge_sweep: bool = False, persistent: tuple[str, ...] = ()) -> dict[str, Any]:
    """Time one case on the GPU (see the module docstring). Without a GPU (``small``, the harness's dry run):
    the same steps on the CPU, kernels in Triton's interpreter, no CUDA graphs, no profiler counts.

    ``pdl``: the verimirage program's kernels use programmatic dependent launch in this mode ("off", "start",
    "end", "auto"); with a mode other than "off" the best candidate is also timed without it
    (``verimirage_nopdl_us``), and its per-kernel times are always those of the program without it (the
    profiler's time of a kernel launched early includes its wait for the one before). ``merge`` ("off", "on",
    "both"): candidates compiled with independent kernels merged into one launch (``VERIMIRAGE_MERGE``), or both
    ways (each timed; the best reported, ``merge`` in the row says which); ``merge_sweep``: the best candidate's
    merged program is also timed with every merged launch under each :data:`MERGE_SWEEP` configuration
    (``merge_sweep_us``). ``inductor_repeats``: torch.compile compiled (caches off after the first) and timed this
    many times; ``inductor_us`` is the median, ``inductor_us_runs`` each. ``persistent`` (modes, "coop" and/or
    "plain"): the top candidates also as one persistent launch (``VERIMIRAGE_PERSISTENT``) in each mode, each first
    called :data:`PERSISTENT_REPEATS` times on the same inputs (every output must be the same: a race would show), then
    timed; ``persistent`` in the row lists them, ``persistent_us`` the fastest correct one (not counted in
    ``verimirage_us``)."""
    import torch

    from verimirage.benchmarks.layer_module import DecodeLayer, make_case

    cuda = torch.cuda.is_available()
    c = make_case(case, small=small, dtype=torch.float16 if cuda else torch.float32, device="cuda" if cuda else "cpu",
                  seed=0)
    m, xs, g, gins = c["module"], c["inputs"], c["graph"], c["graph_inputs"]
    if not cuda:  # the graph's kernels take fp16 inputs: the module runs in float32 on the CPU
        gins = {k: v.half() if v.is_floating_point() else v for k, v in gins.items()}
    d = dims(small)
    with torch.no_grad():
        m64 = copy.deepcopy(m).double()
        ref = m64(*[x.double() for x in xs])
        ref_new = None
        if isinstance(m64, DecodeLayer):  # the new key and value the step wrote into the cache's last slot
            ref_new = tuple(cc[:, :, d.kv_len].reshape(-1, 1, d.head) for cc in (m64.k_cache, m64.v_cache))
        del m64
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    wbytes = 2 * d.weight_elems()
    kv = sum(t.numel() * t.element_size() for n, t in gins.items() if n in ("KC", "VC"))
    from torch_eager import flops

    fl = flops(g)
    row: dict[str, Any] = {"case": case, "weights_bytes": wbytes, "kv_bytes": kv, "flops": fl}
    row["floor_bytes_us"] = 1e6 * (wbytes + kv) / ceil["copy_bytes_per_s"]
    row["floor_us"] = max(row["floor_bytes_us"], 1e6 * fl / ceil["fp16_flops_per_s"])
    ordered = [gins[t.name] for t in g.inputs]
    # verimirage: the verified candidates, each the whole layer in one CUDA graph
    try:
        while wait_until and time.time() < wait_until and not _file(directory, case, small).is_file():
            time.sleep(5)  # a search running beside this run (prepare in the background) writes it
        _, cands, doc = load(directory, case, small=small)
        row["search_s"] = doc["search_s"]
        row["num_candidates"] = len(cands)
        if not cands:
            raise ValueError("the search returned no verified candidate for the full-size layer")
        best: tuple[float, int, Any] | None = None
        tried = []
        row["pdl"] = pdl
        best_merged = False

        def run(mg: Any, merged: bool, per_kernel: dict[str, Any] | None = None) -> tuple[Any, float, float]:
            with _pdl(pdl), _merge(merged):
                fn = vm.compile(mg, cuda_graph=cuda, per_kernel=per_kernel)
            if cuda:
                _precompile(fn, ordered)
            outs = fn(*ordered)
            outs = outs if isinstance(outs, tuple) else (outs,)
            err = _rel(outs[0].clone(), ref)
            if ref_new is not None:
                err = max(err, _rel(tuple(o.clone() for o in outs[1:]), ref_new))
            return fn, _bench(lambda fn=fn: fn(*(fn.static_inputs or ordered)), cudagraph=False), err

        ways = {"off": (False,), "on": (True,), "both": (False, True)}[merge]
        for i, mg in enumerate(cands[:top_k]):
            for merged in ways:
                try:
                    fn, us, err = run(mg, merged)
                    tried.append({"rank": i, "kernels": mg.num_kernels, "merged": merged, "launches": len(fn.steps),
                                  "us": us, "err": err})
                    if err < 2e-2 and (best is None or us < best[0]):
                        best, best_merged = (us, i, fn), merged
                except Exception as e:
                    tried.append({"rank": i, "kernels": mg.num_kernels, "merged": merged,
                                  "error": f"{type(e).__name__}: {e}"[:300]})
        row["candidates"] = tried
        if best is not None:
            us, i, fn = best
            mg = cands[i]
            row.update(verimirage_us=us, verimirage_err=next(t["err"] for t in tried if t["rank"] == i
                                                             and t["merged"] == best_merged),
                       launches=len(fn.steps), kernels=mg.num_kernels, verimirage_rank=i, merge=best_merged,
                       verimirage_bytes=doc["candidates"][i].get("bytes"))
            if merge_sweep and cuda:  # every merged launch under a few launch configurations
                from verimirage.backend.codegen import LaunchConfig

                with _merge(True):
                    names = [k.name for k in vm.compile(mg).kernels if k.members]
                sw: dict[str, Any] = {}
                for w, st in MERGE_SWEEP:
                    try:
                        _, sus, serr = run(mg, True, {k: LaunchConfig(w, st) for k in names})
                        sw[f"w{w}s{st}"] = {"us": sus, "err": serr}
                    except Exception as e:
                        sw[f"w{w}s{st}"] = {"error": f"{type(e).__name__}: {e}"[:200]}
                row["merge_sweep_us"] = sw
            if pdl != "off":  # the same candidate without programmatic dependent launch, in this process
                with _pdl("off"), _merge(best_merged):
                    nfn = vm.compile(mg, cuda_graph=cuda)
                if cuda:
                    _precompile(nfn, ordered)
                nouts = nfn(*ordered)
                row["verimirage_nopdl_err"] = _rel((nouts if isinstance(nouts, tuple) else (nouts,))[0].clone(), ref)
                row["verimirage_nopdl_us"] = _bench(lambda: nfn(*(nfn.static_inputs or ordered)), cudagraph=False)
            with _pdl("off"), _merge(best_merged):
                plain = vm.compile(mg)
            per: dict[str, float] = {}
            _, ksum = _kernels(lambda: plain(*ordered), per)
            row["verimirage_kernel_sum_us"] = ksum
            row["verimirage_kernels_us"] = per
            if ksum is not None:  # what the one graph still pays for beyond its kernels: launch gaps, tails
                row["graph_overhead_us"] = us - ksum
            if merge == "both" and cuda:  # the kernels of the other way too (merged: its launches' times by name)
                with _pdl("off"), _merge(not best_merged):
                    other = vm.compile(mg)
                oper: dict[str, float] = {}
                _kernels(lambda: other(*ordered), oper)
                row["verimirage_kernels_other_us"] = oper
            if sweep and cuda:
                row["config_sweep_us"] = config_sweep(mg, ordered)
        if persistent:
            row["persistent"] = persistent_runs(cands[:top_k], ordered, ref, ref_new, cuda, persistent)
            ok = [p for p in row["persistent"] if "us" in p and p["same"] and p["err"] < 2e-2]
            if ok:
                row["persistent_us"] = min(p["us"] for p in ok)
    except Exception as e:
        row["verimirage_error"] = f"{type(e).__name__}: {e}"[:500]
        log.error("verimirage failed on %s: %s", case, traceback.format_exc())
    with torch.no_grad():
        # eager, captured into a graph
        row["eager_err"] = _rel(m(*xs), ref)
        row["eager_us"] = _bench(lambda: m(*xs), cudagraph=True)
        row["eager_launches"], row["eager_kernel_sum_us"] = _kernels(lambda: m(*xs))
        if inductor:
            try:
                import statistics

                runs = []
                for rep in range(max(1, inductor_repeats)):
                    torch._dynamo.reset()
                    if rep:  # a fresh compile: max-autotune's choice moves between compiles (BENCHMARKS.md)
                        torch._inductor.config.force_disable_caches = True
                    t0 = time.perf_counter()
                    cm = torch.compile(m, mode="max-autotune")
                    for _ in range(3):
                        cm(*xs)
                    row.setdefault("inductor_compile_s", time.perf_counter() - t0)
                    row.setdefault("inductor_err", _rel(cm(*xs).clone(), ref))
                    runs.append(_bench(lambda cm=cm: cm(*xs), cudagraph=False))
                    if not rep:
                        row["inductor_launches"], row["inductor_kernel_sum_us"] = _kernels(lambda cm=cm: cm(*xs))
                torch._inductor.config.force_disable_caches = False
                row["inductor_us_runs"] = runs
                row["inductor_us"] = statistics.median(runs)
            except Exception as e:
                row["inductor_error"] = f"{type(e).__name__}: {e}"[:400]
                log.error("inductor failed on %s: %s", case, traceback.format_exc())
            try:  # the same kernels without cudagraph trees, captured into one CUDA graph as eager is
                torch._dynamo.reset()
                cm2 = torch.compile(m, mode="max-autotune-no-cudagraphs")
                for _ in range(3):
                    cm2(*xs)
                row["inductor_nocg_err"] = _rel(cm2(*xs).clone(), ref)
                row["inductor_nocg_us"] = _bench(lambda: cm2(*xs), cudagraph=True)
            except Exception as e:
                row["inductor_nocg_error"] = f"{type(e).__name__}: {e}"[:400]
    # no search: one kernel per op of the graph (its own lowering), the whole layer in one CUDA graph -- what
    # one graph alone gives, and the launches the fused μGraph saves
    try:
        if not per_op:
            raise RuntimeError("not asked for (--no-per-op)")
        po = vm.MuGraph.from_graph(g)
        pfn = vm.compile(po, cuda_graph=cuda)
        if cuda:
            _precompile(pfn, ordered)  # (its ~50 kernels' ptxas side by side: ~70 s one after another)
        outs = pfn(*ordered)
        row["per_op_err"] = _rel((outs if isinstance(outs, tuple) else (outs,))[0].clone(), ref)
        row["per_op_us"] = _bench(lambda: pfn(*(pfn.static_inputs or ordered)), cudagraph=False)
        row["per_op_launches"] = po.num_kernels
        try:  # (the cost model's package imports the search's egglog, which the GPU machine lacks)
            from verimirage.pipeline.pricing import cost

            row["per_op_bytes"] = cost(po).bytes
        except ImportError as e:
            row["per_op_bytes_error"] = f"{type(e).__name__}: {e}"
    except Exception as e:
        row["per_op_error"] = f"{type(e).__name__}: {e}"[:300]
    for k in ("verimirage", "inductor", "eager"):
        if f"{k}_us" in row:
            row[f"{k}_floor_fraction"] = row["floor_us"] / row[f"{k}_us"]
    if "verimirage_us" in row and "inductor_us" in row:
        row["speedup_vs_inductor"] = row["inductor_us"] / row["verimirage_us"]
    if "verimirage_us" in row:
        row["speedup_vs_eager"] = row["eager_us"] / row["verimirage_us"]
    if row.get("verimirage_bytes"):
        row["bytes_over_weights"] = row["verimirage_bytes"] / wbytes
    return row


def persistent_runs(cands: list[Any], ordered: list[Any], ref: Any, ref_new: Any, cuda: bool,
                    modes: tuple[str, ...] = ("coop", "plain")) -> list[dict[str, Any]]:
    """Each candidate as one persistent launch (each of ``modes``: cooperative, plain): its grid, error against
    float64, whether :data:`PERSISTENT_REPEATS` calls on the same inputs gave the same outputs, its time in one CUDA
    graph and its kernel's time alone (the profiler's)."""
    out: list[dict[str, Any]] = []
    for i, mg in enumerate(cands):
        for mode in modes if cuda else ("plain",):
            rec: dict[str, Any] = {"rank": i, "mode": mode}
            try:
                with _persistent(mode), _merge(False), _pdl("off"):
                    fn = vm.compile(mg, cuda_graph=cuda)
                    plain = vm.compile(mg)
                first = None
                same = True
                for _ in range(PERSISTENT_REPEATS if cuda else 1):
                    outs = plain(*ordered)
                    outs = tuple(o.clone() for o in (outs if isinstance(outs, tuple) else (outs,)))
                    if first is None:
                        first = outs
                    else:
                        same = same and all(bool((a == b).all()) for a, b in zip(first, outs, strict=True))
                assert first is not None
                err = _rel(first[0], ref)
                if ref_new is not None:
                    err = max(err, _rel(first[1:], ref_new))
                rec.update(launches=len(plain.steps), grid=dict(plain.grids), tasks=[k.grid[0] for k in plain.kernels],
                           warps=plain.launch, same=same, err=err)
                gouts = fn(*ordered)
                gerr = _rel((gouts if isinstance(gouts, tuple) else (gouts,))[0].clone(), ref)
                rec["graph_err"] = gerr
                rec["us"] = _bench(lambda fn=fn: fn(*(fn.static_inputs or ordered)), cudagraph=False)
                if cuda:
                    per: dict[str, float] = {}
                    _, rec["kernel_us"] = _kernels(lambda plain=plain: plain(*ordered), per)
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"[:400]
                log.error("persistent %s rank %d: %s", mode, i, traceback.format_exc())
            out.append(rec)
            log.info("persistent: %s", {k: v for k, v in rec.items() if k != "warps"})
    return out


def table(doc: dict[str, Any]) -> str:
    """The BENCHMARKS.md table of a layer.json document."""
    c = doc["ceilings"]
    lines = [
        f"Device: {doc['device']} · date {doc['date']} · torch {doc['torch']} · triton {doc['triton']} · "
        f"copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s, fp16 matmul {c['fp16_flops_per_s'] / 1e12:.0f} TFLOP/s",
        "",
        "| case | floor µs | verimirage µs (launches) | verimirage without PDL µs | one kernel per op µs (launches) | "
        "torch.compile µs (launches) | eager µs (launches) | vs torch.compile | floor / verimirage | bytes / weights |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(r: dict[str, Any], k: str, fmt: str = "{:.1f}") -> str:
        v = r.get(k)
        return fmt.format(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"

    for r in doc["rows"]:
        lines.append(
            f"| {r['case']} | {f(r, 'floor_us')} | {f(r, 'verimirage_us')} ({f(r, 'launches', '{}')}) | "
            f"{f(r, 'verimirage_nopdl_us')} | {f(r, 'per_op_us')} ({f(r, 'per_op_launches', '{}')}) | "
            f"{f(r, 'inductor_us')} ({f(r, 'inductor_launches', '{}')}) | {f(r, 'eager_us')} "
            f"({f(r, 'eager_launches', '{}')}) | {f(r, 'speedup_vs_inductor', '{:.2f}x')} | "
            f"{f(r, 'verimirage_floor_fraction', '{:.0%}')} | {f(r, 'bytes_over_weights', '{:.2f}')} |"
        )
    return "\n".join(lines) + "\n"


def gpu_main(args: argparse.Namespace) -> int:
    import torch
    import triton

    if not torch.cuda.is_available() and not args.small:
        print("layer.py gpu: needs a CUDA GPU (or --small: a dry run on the CPU, kernels interpreted)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run, interpreter)",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": "medians of CUDA-graph replays: verimirage (compile(cuda_graph=True), do_bench of the replay), "
                  "torch.compile mode=max-autotune (cudagraph trees, do_bench), eager (do_bench_cudagraph)",
        "floor": "floor_bytes_us: (weights + KV cache) bytes / measured copy bandwidth; floor_us: max of it and "
                 "flops / measured fp16 matmul rate",
        "ceilings": ceilings(),
        "rows": [],
    }
    for case in args.cases:
        t0 = time.perf_counter()
        try:
            row = gpu_case(case, args.candidates, doc["ceilings"], inductor=not args.no_inductor, top_k=args.top_k,
                           small=args.small, per_op=not args.no_per_op,
                           wait_until=time.time() + args.wait_s if args.wait_s else 0.0,
                           sweep=case in (args.sweep_configs or ()), pdl=args.pdl, merge=args.merge,
                           inductor_repeats=args.inductor_repeats, merge_sweep=args.merge_sweep,
                           persistent=() if args.persistent is None else tuple(args.persistent or ("coop", "plain")))
        except Exception as e:
            row = {"case": case, "error": f"{type(e).__name__}: {e}"[:500]}
            log.error("%s failed: %s", case, traceback.format_exc())
        row["wall_s"] = time.perf_counter() - t0
        doc["rows"].append(row)
        log.info("%s", {k: v for k, v in row.items() if k != "candidates"})
        (out / "layer.json").write_text(json.dumps(doc, indent=1))
        (out / "layer_table.md").write_text(table(doc))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print(table(doc))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["prepare", "plan", "prove", "check", "gpu", "regroup"])
    ap.add_argument("--cases", nargs="*", default=None)
    ap.add_argument("--small", action="store_true",
                    help="the scaled-down layer (check always uses it; gpu --small on a CPU is a dry run)")
    ap.add_argument("--candidates", type=Path, default=DEFAULT_CANDIDATES)
    ap.add_argument("--out", type=Path, default=None, help="prepare: candidate dir; gpu: results dir")
    ap.add_argument("--time-budget-s", type=float, default=300.0)
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--verify-timeout-s", type=float, default=300.0, help="prepare: the verifier's Z3 time limit")
    ap.add_argument("--max-verify", type=int, default=None, help="prepare: candidates to try verifying")
    ap.add_argument("--cert", type=Path, default=None, help="prepare: save the best candidate's certificate here; "
                    "regroup: where the new composition's certificate goes")
    ap.add_argument("--from-cert", type=Path, default=None, help="regroup: the composed certificate to start from")
    ap.add_argument("--window-ops", type=int, default=WINDOW_OPS,
                    help="prepare, plan: also search runs of three regions of at most this many ops as one (0: off)")
    ap.add_argument("--nodes", default=None, help="regroup: graph nodes (a-b ranges, commas) to search as one region")
    ap.add_argument("--alternatives", type=int, default=0,
                    help="regroup: append this many best verified designs of one region (its own skipped)")
    ap.add_argument("--grids", type=int, nargs="*", default=None,
                    help="regroup: the search's allowed per-axis block counts (default: all)")
    ap.add_argument("--franges", type=int, nargs="*", default=None,
                    help="regroup: the search's allowed loop ranges (default: all)")
    ap.add_argument("--max-splits", type=int, default=None, help="regroup: the search's most KV splits")
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--no-per-op", action="store_true", help="gpu: skip the one-kernel-per-op program")
    ap.add_argument("--sweep-configs", nargs="*", default=None,
                    help="gpu: for these cases also time every kernel under a few uniform launch configurations "
                    "(config_sweep_us)")
    ap.add_argument("--pdl", choices=["off", "start", "end", "auto"], default="auto",
                    help="gpu: programmatic dependent launch for verimirage's kernels (VERIMIRAGE_PDL); the best "
                    "candidate is also timed without it")
    ap.add_argument("--merge", choices=["off", "on", "both"], default="both",
                    help="gpu: independent kernels as one launch (VERIMIRAGE_MERGE): off, on, or both (each timed)")
    ap.add_argument("--persistent", nargs="*", choices=["coop", "plain"], default=None,
                    help="gpu: also run the top candidates as one persistent launch (VERIMIRAGE_PERSISTENT) in these "
                         "modes (none named: both), checked for races (repeated calls) and timed")
    ap.add_argument("--merge-sweep", action="store_true",
                    help="gpu: also time every merged launch under each MERGE_SWEEP launch configuration")
    ap.add_argument("--inductor-repeats", type=int, default=1,
                    help="gpu: compile and time torch.compile this many times (caches off after the first); median")
    ap.add_argument("--wait-s", type=float, default=0.0,
                    help="gpu: wait up to this long (from the case's start) for a candidate file a search beside "
                    "this run is still writing")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    small = args.small or args.mode == "check"
    args.cases = args.cases or layer_cases(small)
    if args.mode == "prepare":
        docs = [prepare(c, small, args.out or args.candidates, time_budget_s=args.time_budget_s, top_k=args.top_k,
                        cert_dir=args.cert, verify_timeout_s=args.verify_timeout_s, max_verify=args.max_verify,
                        window_ops=args.window_ops)
                for c in args.cases]
        for d in docs:
            print(f"{d['case']:16s} {d['search_s']:7.1f} s  kernels {[c['kernels'] for c in d['candidates']]}")
        return 0 if all(d["candidates"] for d in docs) else 1
    if args.mode == "plan":
        for c in args.cases:
            plan(c, small, args.out or args.candidates, time_budget_s=args.time_budget_s, window_ops=args.window_ops)
        return 0
    if args.mode == "prove":
        for c in args.cases:
            prove(c, small, args.candidates, args.cert, verify_timeout_s=args.verify_timeout_s)
        return 0
    if args.mode == "regroup":
        if args.from_cert is None or args.cert is None or args.nodes is None or len(args.cases) != 1:
            ap.error("regroup needs one case, --from-cert, --cert and --nodes")
        span = [range(int(a), int(b or a) + 1) for a, _, b in (x.partition("-") for x in args.nodes.split(","))]
        regroup(args.cases[0], small, args.candidates, args.from_cert, [i for r in span for i in r], args.cert,
                time_budget_s=args.time_budget_s, verify_timeout_s=args.verify_timeout_s,
                alternatives=args.alternatives, grids=args.grids, franges=args.franges, max_splits=args.max_splits)
        return 0
    if args.mode == "check":
        rows = [r for c in args.cases for r in check(c, args.candidates)]
        for r in rows:
            print(f"{r['case']:16s} rank {r['rank']} kernels {r['kernels']:3d} rel err {r['rel_err']:.2e}")
        return 0 if rows and all(r["rel_err"] < 2e-2 for r in rows) else 1
    args.out = args.out or HERE / "results"
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
