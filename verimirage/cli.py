"""The ``verimirage`` command line.

    verimirage optimize NAME_OR_FILE [--batch N] [--small] [--out DIR] [--json]
    verimirage check-cert PATH [--json]
    verimirage show PATH [--svg OUT] [--dot OUT]
    verimirage bench [...]                      (on a GPU machine)

Exit codes: 0 success; 1 nothing verified / a check failed; 2 bad usage or
input (unknown suite name, unreadable file, malformed graph or certificate);
3 a certificate was rejected.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 3

log = logging.getLogger("verimirage.cli")


class UsageError(Exception):
    """A problem with what the user asked for (exit code 2)."""


def load_graph(spec: str, batch: int, small: bool) -> Any:
    """A suite graph by name, or the graph a Python file defines.

    A file may define ``graph`` (a ``vm.Graph``), a function ``build()`` returning
    one, or exactly one module-level ``vm.Graph``.
    """
    import verimirage as vm

    if spec in vm.benchmarks.names():
        return vm.benchmarks.get(spec, batch=batch, small=small)
    p = Path(spec)
    if not p.suffix == ".py":
        raise UsageError(f"{spec!r} is neither a suite program ({', '.join(vm.benchmarks.names())}) nor a .py file")
    if not p.is_file():
        raise UsageError(f"no such file: {spec}")
    mod_spec = importlib.util.spec_from_file_location(f"_vm_user_{p.stem}", p)
    if mod_spec is None or mod_spec.loader is None:
        raise UsageError(f"cannot load {spec} as a Python module")
    mod = importlib.util.module_from_spec(mod_spec)
    try:
        mod_spec.loader.exec_module(mod)
    except vm.GraphError:
        raise
    except Exception as e:  # the user's file failed: say so, with the error
        raise UsageError(f"{spec} failed while loading: {type(e).__name__}: {e}") from e
    g = getattr(mod, "graph", None)
    if g is None and callable(getattr(mod, "build", None)):
        g = mod.build()
    if g is None:
        found = [v for v in vars(mod).values() if isinstance(v, vm.Graph)]
        if len(found) != 1:
            raise UsageError(
                f"{spec} defines {len(found)} vm.Graph objects; expected `graph = ...`, a `build()` function, or one"
            )
        g = found[0]
    if not isinstance(g, vm.Graph):
        raise UsageError(f"{spec}: `graph` is a {type(g).__name__}; expected a vm.Graph")
    g.check()
    return g


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def cmd_optimize(a: argparse.Namespace) -> int:
    import verimirage as vm

    g = load_graph(a.target, a.batch, a.small)
    t0 = time.perf_counter()
    res = vm.superoptimize(g, progress=not a.json and sys.stderr.isatty())
    elapsed = time.perf_counter() - t0
    name = Path(a.target).stem if a.target.endswith(".py") else a.target
    tag = f"{name}_bs{a.batch}{'_small' if a.small else ''}"
    out = Path(a.out) if a.out else None
    rows = []
    for i, c in enumerate(res.candidates):
        row: dict[str, Any] = {
            "rank": i,
            "kernels": c.mugraph.num_kernels,
            "cost": _jsonable(c.cost),
            "verdict": type(c.verdict).__name__,
            "rules": list(c.rules),
        }
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            cert = out / f"{tag}_c{i}.json"
            c.certificate.save(str(cert))
            row["certificate"] = str(cert)
            src = _kernel_source(c)
            if src is not None:
                kp = out / f"{tag}_c{i}_kernels.py"
                kp.write_text(src)
                row["kernels_source"] = str(kp)
        rows.append(row)
    if a.json:
        print(json.dumps({"target": a.target, "batch": a.batch, "small": a.small, "search_s": round(elapsed, 3),
                          "candidates": rows, "report": _jsonable(res.report)}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        con = Console()
        t = Table(title=f"{a.target} (batch {a.batch}{', small' if a.small else ''}): {len(rows)} verified "
                        f"candidate(s) in {elapsed:.1f} s")
        for col in ("#", "kernels", "cost", "verdict", "rules"):
            t.add_column(col)
        for r in rows:
            t.add_row(str(r["rank"]), str(r["kernels"]), _short(r["cost"]), r["verdict"], ", ".join(r["rules"])[:60])
        con.print(t)
        if res.candidates:
            con.print("best μGraph:")
            con.print(str(res.best.mugraph), markup=False, highlight=False)
    return EXIT_OK if res.candidates else EXIT_FAIL


def _kernel_source(c: Any) -> str | None:
    try:
        from verimirage.backend.codegen import generate
    except ImportError:
        return None
    return str(generate(c.mugraph).source)


def _short(cost: Any) -> str:
    if isinstance(cost, dict):
        return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in cost.items())[:60]
    return str(cost)[:60]


def _jsonable(x: Any) -> Any:
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if hasattr(x, "to_dict"):
        return _jsonable(x.to_dict())
    if hasattr(x, "__dataclass_fields__"):
        import dataclasses

        return _jsonable(dataclasses.asdict(x))
    return str(x)


def cmd_check_cert(a: argparse.Namespace) -> int:
    import verimirage as vm

    if not Path(a.path).is_file():
        raise UsageError(f"no such certificate file: {a.path}")
    v = vm.check_certificate(a.path)
    ok = isinstance(v, vm.Proved)
    if a.json:
        print(json.dumps({"path": a.path, "verdict": type(v).__name__, "reason": getattr(v, "reason", "")}))
    else:
        print(f"{a.path}: {v}")
    return EXIT_OK if ok else EXIT_REJECTED


def _load_mugraph(path: str) -> Any:
    import verimirage as vm

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"no such file: {path}")
    text = p.read_text()
    if text.lstrip().startswith(("graph", "mugraph")):
        return vm.MuGraph.parse(text)
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: neither a program text nor JSON ({e})") from None
    if isinstance(d, dict) and "mugraph_text" in d:  # a certificate
        return vm.MuGraph.parse(d["mugraph_text"])
    if isinstance(d, dict) and "mugraph" in d:  # a candidate record
        m = d["mugraph"]
        return vm.MuGraph.parse(m["text"] if isinstance(m, dict) else m)
    return vm.MuGraph.from_json(text)


def cmd_show(a: argparse.Namespace) -> int:
    from verimirage.ir.dot import to_dot
    from verimirage.ir.svg import render_svg

    mg = _load_mugraph(a.path)
    if a.svg:
        Path(a.svg).write_text(render_svg(mg))
    if a.dot:
        Path(a.dot).write_text(to_dot(mg))
    if not a.svg and not a.dot:
        print(mg)
    return EXIT_OK


def cmd_bench(a: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
    if not root.is_file():
        raise UsageError("the benchmark harness (benchmarks/bench.py) is part of the source checkout, not the wheel")
    import runpy

    sys.argv = [str(root), *a.rest]
    runpy.run_path(str(root), run_name="__main__")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    p = argparse.ArgumentParser(prog="verimirage", description="A verified superoptimizer for tensor programs.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("optimize", help="search for verified μGraphs of a suite program or a Python file")
    o.add_argument("target", help="suite name or a .py file defining a graph")
    o.add_argument("--batch", type=int, default=1)
    o.add_argument("--small", action="store_true", help="the small (CPU-interpreter) shapes of a suite program")
    o.add_argument("--out", help="directory for certificates and generated kernels")
    o.add_argument("--json", action="store_true", help="machine-readable output")
    o.set_defaults(fn=cmd_optimize)
    c = sub.add_parser("check-cert", help="independently re-check a certificate")
    c.add_argument("path")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_check_cert)
    s = sub.add_parser("show", help="print or draw a μGraph (from a certificate, text or JSON file)")
    s.add_argument("path")
    s.add_argument("--svg", help="write an SVG drawing (block graphs as nested clusters)")
    s.add_argument("--dot", help="write graphviz dot source")
    s.set_defaults(fn=cmd_show)
    b = sub.add_parser("bench", help="run the GPU benchmark harness (needs a CUDA GPU)")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verimirage`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:
        pass
    from verimirage.ir.errors import GraphError

    try:
        return int(args.fn(args))
    except (UsageError, GraphError) as e:
        print(f"verimirage: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
