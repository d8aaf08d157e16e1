"""GPU probe of the models set's last losers (issue 22, membound, session 13): batchnorm_relu's launch order and
tiles, qkv_bias under a warm and a rotated (L2-cold) measurement, cross_entropy_prefill's designs by warps, and
gelu_mlp's kernels by launch configuration.

    python benchmarks/perf/membound2_probe.py --build            # here (CPU): the variants file
    python benchmarks/perf/membound2_probe.py --out DIR          # on the GPU

Every variant is checked against a float64 reference of its program on fresh random inputs (relative error <=
2e-2; outputs poisoned with NaN first where the probe allocates them) before it is timed; times are CUDA-graph
replay medians (``do_bench_cudagraph``), baselines (eager, ``torch.compile`` max-autotune) in the same process.

*Launch order* (batchnorm_relu): the generated kernels launch grid axis 0 as CUDA's fastest-varying block index.
``rev`` reverses the axes (a text edit of the generated module: ``pid_a = tl.program_id(n - 1 - a)`` and the launch
grid reversed), so the axis that splits the contiguous last dim (the 64-column tiles) varies fastest: consecutive
blocks read neighbouring 128-byte runs of the same rows. ``flat`` is Inductor's form (one flat index over the
contiguous tensor, the channel as ``(i // HW) % C``), hand-written, as the reference for what the layout allows.

*Rotated* timing: the program is replayed over ``ROT`` input sets in one CUDA graph (time / ROT), so its weights are
not in L2 from the previous replay (4 x 33 MB for qkv_bias, over the H100's 50 MB): what ``triton.testing.do_bench``'s
L2 flush measures, and what a model's layer sees (the other layers' weights pass through L2 in between).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))

VARIANTS = Path(__file__).resolve().parent / "membound2_probe_in.json"
log = logging.getLogger("membound2_probe")
ROT = 4
T0 = time.perf_counter()


def build() -> None:
    """The cross_entropy_prefill design the stored file lacks (2048 x 4 blocks of one 8,000-column row, the one
    logsumexp_prefill measured fastest), from the partitioner, as a measurement probe (not verified)."""
    import verimirage as vm
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.partition import lower_all
    from verimirage.rewrite.stabilise import hoist_row_constants

    gp = vm.benchmarks.get_model("cross_entropy_prefill")
    g2 = hoist_row_constants(gp) or gp
    lows = [lo for lo in lower_all(g2, rank=cost)[0]
            if "partition.cut" in lo.steps and not cost(lo.mugraph).infeasible]
    lows.sort(key=lambda lo: cost(lo.mugraph).time_s)
    out = []
    for lo in lows:
        s = str(lo.mugraph)
        if "grid=(2048, 4)" in s and "f16[1,8000]" in s:
            out.append({"program": "cross_entropy_prefill", "label": "low 2048x4 1x8000", "mugraph": s,
                        "est_us": cost(lo.mugraph).time_s * 1e6})
            break
    VARIANTS.write_text(json.dumps(out, indent=1))
    print(f"{len(out)} variant(s) -> {VARIANTS}")


# ---------------------------------------------------------------------------------------------------------- GPU side

def _cfg(w: int, s: int, o: str = "") -> Any:
    """Uniform launch configuration; ``o = "o0"``: kernels launch their grid axes in the block graph's order (the
    code generator before ``TileOptions.stream_order``)."""
    from verimirage.backend.codegen import LaunchConfig, TileOptions

    return LaunchConfig(w, s, TileOptions(dot_min_m=16, unroll_max=16, stream_order=o != "o0"))


def _compile(mg: Any, c: Any) -> Any:
    """``vm.compile`` under configuration ``c``: "tuned" (the per-kernel rules), "tuned_o0" (the same launch
    parameters, grid axes in the block graph's order), or a uniform ``(warps, stages[, "o0"])``."""
    import verimirage as vm
    from verimirage.backend import tuning
    from verimirage.backend.codegen import LaunchConfig, generate
    from verimirage.ir.graph import node_list

    if c == "tuned":
        return vm.compile(mg, config=LaunchConfig(tuned=True))
    if c == "tuned_o0":
        ms = generate(mg)
        nodes = node_list(ms.mugraph)
        per = {k.name: tuning.recommend(nodes[k.node].attr("block"), [nodes[a].outs[j] for a, j in nodes[k.node].args])
               for k in ms.kernels}
        return vm.compile(mg, config=_cfg(4, 1, "o0"), per_kernel=per)
    return vm.compile(mg, config=_cfg(*c))


def _precompile_all(fns: list[tuple[Any, list[Any]]], workers: int = 16) -> int:
    """Compile every kernel of every program side by side (Triton's AsyncCompileMode; nothing runs on the GPU)."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from triton.runtime._async_compile import AsyncCompileMode

    n = 0
    with ThreadPoolExecutor(max_workers=workers) as pool, AsyncCompileMode(pool):
        for fn, args in fns:
            xs = fn._bind(tuple(args), {})
            bufs: dict[int, Any] = {}
            for st in fn.steps:
                jit = getattr(fn.module, st.kernel)
                for bi, shape, dt in st.outs:
                    bufs[bi] = torch.empty(shape, device=xs[0].device, dtype=getattr(torch, dt))
                call: list[Any] = []
                for ref, rank in (*st.args, *((("buf", bi), len(shape)) for bi, shape, _ in st.outs)):
                    t = xs[ref[1]] if ref[0] == "in" else bufs[ref[1]]
                    call.append(t)
                    call += [t.stride(d) for d in range(rank)]
                try:
                    jit.run(*call, grid=st.grid, warmup=True, **fn.launch[st.kernel])
                    n += 1
                except Exception:
                    log.exception("precompile of %s failed", st.kernel)
    return n


class Probe:
    def __init__(self, out: Path, budget_s: float) -> None:
        import torch

        self.out = out
        self.budget = budget_s
        self.doc: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                    time.gmtime()), "torch": torch.__version__, "rows": []}
        self.lines: list[str] = []

    def left(self) -> float:
        return self.budget - (time.perf_counter() - T0)

    def save(self) -> None:
        (self.out / "membound2_probe.json").write_text(json.dumps(self.doc, indent=1))

    def row(self, **kw: Any) -> None:
        self.doc["rows"].append(kw)
        us = kw.get("us")
        extra = " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items()
                         if k not in ("program", "label", "us", "err"))
        line = (f"{kw['program']:22s} {kw['label']:34s} {'-' if us is None else f'{us:8.2f}'}"
                f"  err {kw.get('err', float('nan')):.1e} {extra}")
        self.lines.append(line)
        log.info("%s", line)
        self.save()


def _bench(fn: Any) -> float:
    from triton.testing import do_bench_cudagraph

    return 1e3 * float(do_bench_cudagraph(fn, rep=150, return_mode="median"))


def _bench_rot(fn: Any, sets: list[list[Any]]) -> float:
    return _bench(lambda: [fn(*s) for s in sets]) / len(sets)


def _load_module(src: str, name: str) -> Any:
    d = Path(os.environ.get("TMPDIR", "/tmp")) / "membound2_mods"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.py"
    p.write_text(src)
    spec = importlib.util.spec_from_file_location(name, p)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reverse_axes(src: str) -> str:
    """The generated module with its kernels' grid axes launched in reverse order."""
    out = src
    for m in re.finditer(r"\n\s*(k\d+)\[\(([^)]*)\)\]", src):
        grid = [x.strip() for x in m.group(2).split(",") if x.strip()]
        if len(grid) < 2:
            continue
        out = out.replace(f"{m.group(1)}[({m.group(2)})]", f"{m.group(1)}[({', '.join(reversed(grid))},)]")
        n = len(grid)
        # (the kernel's pid lines: pid_a = tl.program_id(a) -> program_id(n - 1 - a))
        for a in range(n):
            out = out.replace(f"pid{a} = tl.program_id({a})", f"pid{a} = tl.program_id(__R{n - 1 - a}__)")
        for a in range(n):
            out = out.replace(f"__R{a}__", str(a))
    return out


def bn_section(p: Probe) -> None:
    import torch
    import triton
    import triton.language as tl
    from bench import make_inputs
    from torch_eager import rel_err, torch_fn

    import verimirage as vm
    from verimirage.backend.codegen import TileOptions, generate

    prog = "batchnorm_relu"
    g = vm.benchmarks.get_model(prog)
    ins = make_inputs(g, prog, 1)
    fresh = make_inputs(g, prog, 7)
    f = torch_fn(g)
    ref = f(*[x.double() for x in fresh])
    c, hw = ins[0].shape[1:]
    p.row(program=prog, label="eager", us=_bench(lambda: f(*ins)), err=rel_err(f(*fresh), ref))
    ind_dir = Path("/tmp/membound2_inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(ind_dir)
    torch._dynamo.reset()
    cf = torch.compile(f, mode="max-autotune-no-cudagraphs")
    err = rel_err(cf(*fresh), ref)
    p.row(program=prog, label="torch.compile", us=_bench(lambda: cf(*ins)), err=err)
    for path in glob.glob(str(ind_dir / "**" / "*.py"), recursive=True):
        t = Path(path).read_text(errors="replace")
        if "triton_poi" in t and "@triton.jit" in t and "3136" in t:
            shutil.copy(path, p.out / "inductor_batchnorm_relu.py")
            break

    @triton.jit
    def bn_flat(X, M, V, G, B, O, C: tl.constexpr, HW: tl.constexpr, XB: tl.constexpr):
        off = tl.program_id(0) * XB + tl.arange(0, XB)
        ch = (off // HW) % C
        xv = tl.load(X + off).to(tl.float32)
        mu = tl.load(M + ch, eviction_policy="evict_last").to(tl.float32)
        va = tl.load(V + ch, eviction_policy="evict_last").to(tl.float32)
        ga = tl.load(G + ch, eviction_policy="evict_last").to(tl.float32)
        be = tl.load(B + ch, eviction_policy="evict_last").to(tl.float32)
        y = (xv - mu) * tl.rsqrt(va + 1e-05) * ga + be
        y = tl.maximum(y, 0.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(O + off, y.to(tl.float16))

    for xb, w in ((1024, 4), (2048, 8), (4096, 8)):
        def run(xs: list[Any], xb: int = xb, w: int = w) -> Any:
            o = torch.empty_like(xs[0])
            bn_flat[(xs[0].numel() // xb,)](*xs, o, C=c, HW=hw, XB=xb, num_warps=w)
            return o
        try:
            e = rel_err(run(fresh), ref)
            p.row(program=prog, label=f"flat XB{xb}", us=_bench(lambda run=run: run(ins)) if e < 2e-2 else None,
                  err=e, warps=w)
        except Exception as ex:
            p.row(program=prog, label=f"flat XB{xb}", us=None, err=float("nan"), error=str(ex)[:200])
    cands = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{prog}.json").read_text())["candidates"]
    for i in (0, 1, 5):
        mg = vm.MuGraph.parse(cands[i]["mugraph"])
        src = generate(mg, TileOptions(stream_order=False)).source
        grid = re.search(r"grid=\(([^)]*)\)", cands[i]["mugraph"]).group(1)  # type: ignore[union-attr]
        for order, s in (("as-is", src), ("rev", _reverse_axes(src))):
            mod = _load_module(s, f"bn_c{i}_{order.replace('-', '')}")
            kname = next(k for k in mod.LAUNCH)
            for w in (4, 8):
                mod.LAUNCH[kname] = {"num_warps": w, "num_stages": 1}
                try:
                    e = rel_err(mod.forward(*fresh)[0], ref)
                    p.row(program=prog, label=f"cand{i} grid({grid}) {order}",
                          us=_bench(lambda mod=mod: mod.forward(*ins)) if e < 2e-2 else None, err=e, warps=w)
                except Exception as ex:
                    p.row(program=prog, label=f"cand{i} {order}", us=None, err=float("nan"), error=str(ex)[:200])
        for w in (4, 8) if i in (0, 1) else ():  # (the code generator's stream order, through vm.compile)
            fn = vm.compile(mg, config=_cfg(w, 1))
            e = rel_err(fn(*fresh), ref)
            p.row(program=prog, label=f"cand{i} grid({grid}) vm.compile", us=_bench(lambda fn=fn: fn(*ins)),
                  err=e, warps=w)


def qkv_section(p: Probe) -> None:
    import torch
    from bench import make_inputs
    from torch_eager import rel_err, torch_fn

    import verimirage as vm
    from verimirage.backend.codegen import LaunchConfig, generate

    prog = "qkv_bias"
    g = vm.benchmarks.get_model(prog)
    sets = [make_inputs(g, prog, s) for s in range(1, 1 + ROT)]
    ins = sets[0]
    fresh = make_inputs(g, prog, 99)
    f = torch_fn(g)
    ref = f(*[x.double() for x in fresh])

    def both(label: str, fn: Any, **kw: Any) -> None:
        e = rel_err(fn(*fresh), ref)
        ok = e < 2e-2
        p.row(program=prog, label=label, us=_bench(lambda: fn(*ins)) if ok else None, err=e,
              rot_us=_bench_rot(fn, sets) if ok else None, **kw)

    both("eager", f)
    torch._dynamo.reset()
    cf = torch.compile(f, mode="max-autotune-no-cudagraphs")
    both("torch.compile", cf)
    cands = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{prog}.json").read_text())["candidates"]
    mg = vm.MuGraph.parse(cands[0]["mugraph"])
    for st in (4, 3, 5, 6):
        fn = vm.compile(mg, config=_cfg(4, st))
        both(f"cand0 w4s{st}", fn)
    fn = vm.compile(mg, config=LaunchConfig(tuned=True))
    both("cand0 tuned", fn)
    # W read with evict_last (kept in L2 for the next replay): what a kernel gains from the warm L2
    src = generate(mg).source.replace("* a1_s1).to(tl.float32)",
                                      "* a1_s1, eviction_policy='evict_last').to(tl.float32)")
    mod = _load_module(src, "qkv_evict_last")
    mod.LAUNCH["k3"] = {"num_warps": 4, "num_stages": 4}
    both("cand0 w4s4 W evict_last", lambda *xs: mod.forward(*xs)[0])
    for i in (1, 2):
        fn = vm.compile(vm.MuGraph.parse(cands[i]["mugraph"]), config=LaunchConfig(tuned=True))
        both(f"cand{i} tuned", fn)


def _programs_section(p: Probe, prog: str, entries: list[tuple[str, str, list[Any]]], baselines: bool,
                      min_left: float) -> None:
    import torch
    from bench import make_inputs
    from layer import _kernel_medians
    from torch_eager import rel_err, torch_fn

    import verimirage as vm

    g = vm.benchmarks.get_model(prog)
    ins = make_inputs(g, prog, 1)
    fresh = make_inputs(g, prog, 7)
    f = torch_fn(g)
    ref = f(*[x.double() for x in fresh])
    fns: list[tuple[str, Any]] = []
    for label, mgtext, cfgs in entries:
        mg = vm.MuGraph.parse(mgtext)
        for c in cfgs:
            name = c if isinstance(c, str) else f"w{c[0]}s{c[1]}" + "".join(c[2:])
            try:
                fns.append((f"{label} {name}", _compile(mg, c)))
            except Exception as ex:
                p.row(program=prog, label=f"{label} {name}", us=None, err=float("nan"),
                      error=f"{type(ex).__name__}: {ex}"[:200])
    t = time.perf_counter()
    k = _precompile_all([(fn, ins) for _, fn in fns])
    log.info("%s: precompiled %d kernels in %.1f s", prog, k, time.perf_counter() - t)
    if baselines:
        p.row(program=prog, label="eager", us=_bench(lambda: f(*ins)), err=rel_err(f(*fresh), ref))
        torch._dynamo.reset()
        cf = torch.compile(f, mode="max-autotune-no-cudagraphs")
        e = rel_err(cf(*fresh), ref)
        p.row(program=prog, label="torch.compile", us=_bench(lambda: cf(*ins)), err=e)
    for label, fn in fns:
        if p.left() < min_left:
            log.warning("budget: skipping the rest of %s", prog)
            return
        try:
            e = rel_err(fn(*fresh), ref)
            us = _bench(lambda fn=fn: fn(*ins)) if e < 2e-2 else None
            per = _kernel_medians(lambda fn=fn: fn(*ins)) if us is not None else {}
            p.row(program=prog, label=label, us=us, err=e, kernels={k: round(v, 2) for k, v in per.items()})
        except Exception as ex:
            p.row(program=prog, label=label, us=None, err=float("nan"), error=f"{type(ex).__name__}: {ex}"[:200])


def _entries(prog: str, picks: dict[int, list[Any]]) -> list[tuple[str, str, list[Any]]]:
    cands = json.loads((ROOT / "benchmarks" / "candidates_models" / f"{prog}.json").read_text())["candidates"]
    out = []
    for i, cfgs in picks.items():
        if i < len(cands):
            grid = ",".join(re.findall(r"grid=[(]([^)]*)[)]", cands[i]["mugraph"])[:1])
            out.append((f"cand{i} grid({grid})", cands[i]["mugraph"], cfgs))
    return out


def _jobs() -> dict[str, list[tuple[str, str, list[Any]]]]:
    ce = _entries("cross_entropy_prefill", {0: ["tuned", "tuned_o0", (4, 1), (4, 1, "o0"), (16, 1)],
                                            1: ["tuned", "tuned_o0"], 2: ["tuned", "tuned_o0", (32, 1)]})
    if VARIANTS.exists():
        ce += [(v["label"], v["mugraph"], ["tuned", (4, 1), (16, 1)]) for v in json.loads(VARIANTS.read_text())]
    return {
        "ce": ce,
        "gelu": _entries("gelu_mlp", {3: ["tuned", (4, 4), (4, 5), (4, 6)], 0: ["tuned", (4, 4), (4, 5), (4, 6)],
                                      1: ["tuned"], 2: ["tuned"], 4: ["tuned"]}),
        "lse": _entries("logsumexp_prefill", {0: ["tuned", "tuned_o0"], 1: ["tuned", "tuned_o0"],
                                              2: ["tuned", "tuned_o0"]}),
        "ce16": _entries("cross_entropy", {0: ["tuned", "tuned_o0"], 1: ["tuned", "tuned_o0"]}),
    }


def _copy_rate() -> float:
    """Device copy bandwidth (TB/s, bytes read plus written) of a 512 MB copy."""
    import torch
    from triton.testing import do_bench

    a = torch.empty(1 << 28, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() * 2 / (do_bench(lambda: b.copy_(a), return_mode="median") * 1e-3) / 1e12


def run(out: Path, budget_s: float, sections: list[str]) -> None:
    from bench import launch_overhead

    p = Probe(out, budget_s)
    jobs = _jobs()
    p.doc["copy_TBps"] = _copy_rate()
    p.doc["launch_us"] = launch_overhead()
    p.save()
    progs = {"ce": "cross_entropy_prefill", "gelu": "gelu_mlp", "lse": "logsumexp_prefill", "ce16": "cross_entropy"}
    for s in sections:
        if p.left() < 30:
            log.warning("budget: section %s skipped", s)
            continue
        try:
            if s == "bn":
                bn_section(p)
            elif s == "qkv":
                qkv_section(p)
            else:
                _programs_section(p, progs[s], jobs[s], s == "gelu", 12)
        except Exception as ex:
            log.exception("section %s failed", s)
            p.doc.setdefault("errors", []).append(f"{s}: {type(ex).__name__}: {ex}"[:300])
        p.save()
    print(f"{p.doc['device']}  copy {p.doc['copy_TBps']:.2f} TB/s  launch {p.doc['launch_us']:.2f} us")
    print("\n".join(p.lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--sections", nargs="*", default=["bn", "qkv", "lse", "ce", "gelu", "ce16"])
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.build:
        build()
    else:
        a.out.mkdir(parents=True, exist_ok=True)
        run(a.out, a.budget_s, a.sections)


if __name__ == "__main__":
    main()
