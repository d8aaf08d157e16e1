"""The ``verimirage`` command line.

    verimirage [-v] optimize NAME_OR_FILE [--batch N] [--small] [--out DIR] [--json] [--no-cache]
    verimirage check-cert PATH [--mode MODE [--module FILE]] [--json]
    verimirage show PATH [--svg OUT] [--dot OUT]
    verimirage cache info|clear [--json]
    verimirage bench [...]                      (on a GPU machine)

Exit codes: 0 success; 1 nothing verified / a check failed; 2 bad usage or
input (unknown suite name, unreadable file, malformed graph or certificate);
3 a certificate was rejected.

Start-up is cheap: torch and triton are imported only by the commands that run
kernels (``optimize --out`` writes generated kernels, ``bench``); ``check-cert``,
``show`` and ``cache`` never import them. Every file a command writes is named
on stdout. ``-v`` logs verimirage's progress at INFO, ``-vv`` also egglog's;
``VERIMIRAGE_LOG`` (see :mod:`verimirage.logs`) sets levels per logger.
"""

from __future__ import annotations

import argparse
import atexit
import gc
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


def _backend_mode() -> None:
    """Before anything imports triton: choose Triton's interpreter on a machine without CUDA (imports torch)."""
    from verimirage.backend.runtime import ensure_mode

    ensure_mode()


def cmd_optimize(a: argparse.Namespace) -> int:
    import verimirage as vm

    if a.out:
        _backend_mode()  # the generated kernels' source is written too
    g = load_graph(a.target, a.batch, a.small)
    t0 = time.perf_counter()
    res = vm.superoptimize(g, progress=not a.json and sys.stderr.isatty(), cache=not a.no_cache)
    elapsed = time.perf_counter() - t0
    name = Path(a.target).stem if a.target.endswith(".py") else a.target
    tag = f"{name}_bs{a.batch}{'_small' if a.small else ''}"
    out = Path(a.out) if a.out else None
    rows = []
    written: list[str] = []
    for i, c in enumerate(res.candidates):
        row: dict[str, Any] = {
            "rank": i,
            "kernels": c.mugraph.num_kernels,
            "cost": _jsonable(c.cost),
            "cost_summary": str(c.cost),
            "verdict": type(c.verdict).__name__,
            "rules": list(c.rules),
        }
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            cert = out / f"{tag}_c{i}.json"
            c.certificate.save(str(cert))
            row["certificate"] = str(cert)
            written.append(str(cert))
            src = _kernel_source(c)
            if src is not None:
                kp = out / f"{tag}_c{i}_kernels.py"
                kp.write_text(src)
                row["kernels_source"] = str(kp)
                written.append(str(kp))
        rows.append(row)
    rep = res.report
    if a.json:
        print(json.dumps({"target": a.target, "batch": a.batch, "small": a.small, "search_s": round(elapsed, 3),
                          "from_cache": rep.from_cache or None, "candidates": rows, "written": written,
                          "report": _jsonable(rep)}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        con = Console()
        t = Table(title=f"{a.target} (batch {a.batch}{', small' if a.small else ''}): {len(rows)} verified "
                        f"candidate(s) in {elapsed:.1f} s{' (from the search cache)' if rep.from_cache else ''}")
        for col in ("#", "kernels", "estimated cost", "verdict", "rules"):
            t.add_column(col)
        for c, r in zip(res.candidates, rows, strict=True):
            t.add_row(str(r["rank"]), str(r["kernels"]), cost_summary(c.cost), r["verdict"], ", ".join(r["rules"]))
        con.print(t)
        con.print(str(rep), markup=False, highlight=False)
        if res.best is not None:
            con.print("best μGraph:")
            con.print(str(res.best.mugraph), markup=False, highlight=False)
        for w in written:
            print(f"wrote {w}")
    return EXIT_OK if res.candidates else EXIT_FAIL


def cost_summary(cost: Any) -> str:
    """A short readable line of a cost estimate: time, launches, bytes through device memory, flops."""
    try:
        s = (f"{cost.time_s * 1e6:.2f} µs est., {cost.launches} launch{'es' if cost.launches != 1 else ''}, "
             f"{_size(cost.bytes)} moved, {cost.tc_flops / 1e9:.3g} GFLOP on tensor cores")
    except (AttributeError, TypeError):
        return str(cost)
    return s + (f" (INFEASIBLE: {cost.reason})" if getattr(cost, "infeasible", False) else "")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _kernel_source(c: Any) -> str | None:
    """The module ``vm.compile`` runs for the candidate by default: the one its certificate's hash names."""
    try:
        from verimirage.backend.tuning import tuned_module
    except ImportError:
        return None
    return str(tuned_module(c.mugraph).source)


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
    if not Path(a.path).is_file():
        raise UsageError(f"no such certificate file: {a.path}")
    t0 = time.perf_counter()
    from verimirage import checkcall

    checkcall.prestart()  # the checker process imports its modules while this one imports numpy and the rest
    from verimirage.pipeline.certificates import check_certificate

    if a.module is not None and a.mode is None:
        raise UsageError("check-cert: --module needs --mode (the launch mode the module was generated for)")
    module = None
    if a.module is not None:
        try:
            module = Path(a.module).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"check-cert: cannot read the module {a.module}: {e}") from None
    from verimirage.ir.errors import GraphError

    try:
        v = check_certificate(a.path, mode=a.mode, module_source=module)
    except GraphError as e:  # (a file that is not a JSON object: CertificateError, itself a ValueError)
        raise UsageError(f"check-cert: {e}") from None
    except ValueError as e:  # (an unknown launch mode option)
        raise UsageError(f"check-cert: --mode {a.mode!r}: {e}") from None
    elapsed = time.perf_counter() - t0
    ok = bool(v.proved)
    if a.json:
        print(json.dumps({"path": a.path, "verdict": type(v).__name__, "reason": v.reason, "seconds": round(elapsed, 3),
                          "checks": [{"name": c.name, "outcome": c.outcome, "seconds": round(c.seconds, 3),
                                      "params": _jsonable(dict(c.params)), "detail": c.detail} for c in v.evidence]},
                         indent=2))
    else:
        print(verdict_summary(v, a.path, elapsed))
    return EXIT_OK if ok else EXIT_REJECTED


def verdict_summary(v: Any, path: str, seconds: float) -> str:
    """A readable multi-line summary of a certificate check: the verdict, then one line per check."""
    word = {"Proved": "ACCEPTED", "Unknown": "REJECTED", "Refuted": "REJECTED"}.get(type(v).__name__, "?")
    lines = [f"{path}: {word} ({type(v).__name__}) in {seconds:.2f} s", f"  {v.reason}"]
    for c in v.evidence:
        extra = []
        for k, val in c.params:
            if k == "false_accept_bound":  # (a probability only where the check states one: stated_bound)
                extra.append(f"false-accept bound {float(val):.2e}" if c.param("stated_bound") is not None else
                             f"per-node model bound {float(val):.2e} (no probability stated)")
            elif k in ("rules", "queries", "laws") and val:
                extra.append(f"{k}: {', '.join(map(str, val))}")
            elif k == "seeds":
                extra.append(f"{len(val)} seeded trial(s)")
            elif k in ("mode", "sha256"):
                extra.append(f"{'launch mode' if k == 'mode' else k} {val}")
        lines.append(f"  {c.outcome:>7}  {c.name} ({c.seconds:.2f} s){': ' + '; '.join(extra) if extra else ''}")
        if c.detail:
            lines.append(f"           {c.detail}")
    return "\n".join(lines)


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
        print(f"wrote {a.svg}")
    if a.dot:
        Path(a.dot).write_text(to_dot(mg))
        print(f"wrote {a.dot}")
    if not a.svg and not a.dot:
        print(mg)
    return EXIT_OK


#: The cache's parts (subdirectories of the cache directory) and what each holds.
CACHE_PARTS = {"search": "search results (superoptimize)", "kernels": "generated Triton modules",
               "select": "GPU launch-configuration selections"}


def _cache_parts(only: str | None) -> list[tuple[str, Path, list[Path]]]:
    from verimirage.backend.cache import cache_dir

    root = cache_dir()
    out = []
    for part in CACHE_PARTS if only in (None, "all") else [only]:
        d = root / part
        files = sorted(p for p in d.rglob("*") if p.is_file()) if d.is_dir() else []
        out.append((part, d, files))
    return out


def cmd_cache(a: argparse.Namespace) -> int:
    from verimirage.backend.cache import cache_dir

    parts = _cache_parts(getattr(a, "only", None))
    if a.action == "info":
        rows: list[dict[str, Any]] = [{"part": part, "path": str(d), "what": CACHE_PARTS[part], "entries": len(files),
                 "bytes": sum(f.stat().st_size for f in files)} for part, d, files in parts]
        if a.json:
            print(json.dumps({"cache_dir": str(cache_dir()), "parts": rows}, indent=2))
        else:
            print(f"cache directory: {cache_dir()} (set VERIMIRAGE_CACHE_DIR to move it)")
            for r in rows:
                print(f"  {r['part']:<8} {r['entries']:>6} file(s) {_size(r['bytes']):>10}  {r['what']}  ({r['path']})")
        return EXIT_OK
    removed: list[dict[str, Any]] = []
    for part, d, files in parts:
        n = 0
        size = 0
        for f in files:
            size += f.stat().st_size
            f.unlink()
            n += 1
        removed.append({"part": part, "path": str(d), "removed": n, "bytes": size})
    if a.json:
        print(json.dumps({"cache_dir": str(cache_dir()), "cleared": removed}, indent=2))
    else:
        for r in removed:
            print(f"removed {r['removed']} file(s) ({_size(r['bytes'])}) from {r['path']}")
    return EXIT_OK


def cmd_bench(a: argparse.Namespace) -> int:
    _backend_mode()
    root = Path(__file__).resolve().parent.parent / "benchmarks" / "bench.py"
    if not root.is_file():
        raise UsageError("the benchmark harness (benchmarks/bench.py) is part of the source checkout, not the wheel")
    import runpy

    sys.argv = [str(root), *a.rest]
    runpy.run_path(str(root), run_name="__main__")
    return EXIT_OK


def cmd_sweep(a: argparse.Namespace) -> int:
    """Run a rule ablation / sweep over suite programs; write the table (and plots) to --out."""
    import verimirage as vm

    programs = list(a.programs) or _suite_names()
    unknown = [p for p in programs if p not in _suite_names()]
    if unknown:
        raise UsageError(f"sweep: unknown suite program(s) {unknown}; expected some of {_suite_names()}")
    if a.processes is not None and (a.ray or a.processes < 0):
        raise UsageError("sweep: --processes N (N >= 0; 0: every core) runs the searches in a pool of processes; "
                         "it does not go with --ray" if a.ray else f"sweep: --processes {a.processes}; expected >= 0")
    if a.address is not None and not a.ray:
        raise UsageError("sweep: --address is a Ray cluster's; it goes with --ray")
    variants: dict[str, Any] = {}
    if a.disable:
        variants["all"] = {}
        for name in a.disable:
            variants[f"-{name}"] = {"disable_rules": [name]}
    if a.synthesized:
        rs = vm.rules.synthesize(depth=a.depth, seed=a.seed, time_budget_s=a.synth_budget, ray=a.ray,
                                 address=a.address, processes=a.processes, progress=None if not a.json else False)
        variants.setdefault("all", {})
        variants["synthesized"] = {"disable_rules": ["algebra"], "extra_rules": [rs]}  # in place of algebra
        log.info("sweep: synthesized %d rule(s)", len(rs.rules))
    if not variants or a.leave_one_theory_out:
        variants = {**vm.rules.leave_one_theory_out(), **variants}
    options: dict[str, Any] = {}
    if a.time_budget is not None:
        options["time_budget_s"] = a.time_budget
    table = vm.rules.sweep(programs, variants, {"default": options}, small=not a.full, batch=a.batch, seed=a.seed,
                           ray=a.ray, address=a.address, processes=a.processes, out_dir=a.out, plots=not a.no_plots,
                           progress=None if not a.json else False)
    files = [str(f) for f in sorted(Path(a.out).iterdir())]
    if a.json:
        print(json.dumps({"rows": [r.__dict__ for r in table.rows], "wall_s": table.wall_s, "files": files},
                         indent=2, default=str))
    else:
        print(table)
        where = ""
        if a.ray:
            where = " on Ray"
        elif a.processes is not None:
            where = f" in a pool of {a.processes} processes" if a.processes else " in a pool of one process per core"
        print(f"{len(table.rows)} search(es) in {table.wall_s:.1f}s{where}")
        for f in files:
            print(f"wrote {f}")
    return EXIT_OK


def _suite_names() -> list[str]:
    from verimirage.benchmarks import names

    return list(names())


#: stands for the suite's names in help texts, filled in when the help is printed (the suite imports numpy, which
#: ``check-cert`` must not wait for before it starts its checker process)
_SUITE = "{SUITE}"


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser: its help text names the suite's programs where it says :data:`_SUITE`."""

    def format_help(self) -> str:
        names = ", ".join(_suite_names())
        self.description = (self.description or "").replace(_SUITE, names)
        for action in self._actions:
            action.help = action.help.replace(_SUITE, names) if action.help else action.help
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for docs and tests)."""
    p = argparse.ArgumentParser(prog="verimirage", description="A verified superoptimizer for tensor programs.")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log progress: -v verimirage at INFO, -vv also egglog (or set VERIMIRAGE_LOG)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)
    o = sub.add_parser(
        "optimize", help="search for verified μGraphs of a suite program or a Python file",
        description="Search for verified μGraphs equivalent to a program and print them, best first, with the "
                    f"search report. Suite programs: {_SUITE}.")
    o.add_argument("target", metavar="NAME_OR_FILE",
                   help=f"a suite program ({_SUITE}) or a .py file defining a vm.Graph")
    o.add_argument("--batch", type=int, default=1, help="batch size of a suite program (default 1)")
    o.add_argument("--small", action="store_true", help="the small (CPU-interpreter) shapes of a suite program")
    o.add_argument("--out", metavar="DIR", help="write each candidate's certificate and generated kernels here")
    o.add_argument("--no-cache", action="store_true", help="search even if the search cache holds a result")
    o.add_argument("--json", action="store_true", help="machine-readable output")
    o.set_defaults(fn=cmd_optimize)
    c = sub.add_parser("check-cert", help="independently re-check a certificate",
                       description="Re-check a saved certificate in this process (hashes, rules, Z3 queries, "
                                   "finite-field trials). Exit 0 if accepted, 3 if rejected.")
    c.add_argument("path", metavar="CERTIFICATE")
    c.add_argument("--mode", metavar="MODE", help="also regenerate the module vm.compile runs in this launch mode "
                   "(e.g. merge, last_block, 'pdl=end,merge', persistent) from the certificate's μGraph")
    c.add_argument("--module", metavar="FILE", help="with --mode: a generated module (e.g. the kernels cache's "
                   "vm_<digest>.py) that must be that module, byte for byte")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(fn=cmd_check_cert)
    s = sub.add_parser("show", help="print or draw a μGraph (from a certificate, text or JSON file)")
    s.add_argument("path", metavar="FILE")
    s.add_argument("--svg", metavar="OUT", help="write an SVG drawing (block graphs as nested clusters)")
    s.add_argument("--dot", metavar="OUT", help="write graphviz dot source")
    s.set_defaults(fn=cmd_show)
    k = sub.add_parser("cache", help="show or clear the on-disk cache (search results, kernels, GPU selections)",
                       description="The cache directory is $VERIMIRAGE_CACHE_DIR, else ~/.cache/verimirage.")
    k.add_argument("action", choices=["info", "clear"])
    k.add_argument("--only", choices=[*CACHE_PARTS, "all"], default="all", help="one part of the cache")
    k.add_argument("--json", action="store_true", help="machine-readable output")
    k.set_defaults(fn=cmd_cache)
    b = sub.add_parser("bench", help="run the GPU benchmark harness (needs a CUDA GPU)")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    w = sub.add_parser(
        "sweep", help="rule ablations and sweeps over suite programs (CSV table and plots; --ray to scale out)",
        description="Search every suite program named (default: all) with each rule variant and write a table "
                    "(best cost estimate, kernels, search time, rules fired) and plots. Default variants: every "
                    "default rule, then each built-in theory left out.")
    w.add_argument("programs", nargs="*", metavar="PROGRAM", help="suite programs (default: all)")
    w.add_argument("--disable", action="append", default=[], metavar="NAME",
                   help="a variant with this rule or theory disabled (repeatable; 'all' is added as the baseline)")
    w.add_argument("--leave-one-theory-out", action="store_true",
                   help="also the built-in ablation (the default when no other variant is asked for)")
    w.add_argument("--synthesized", action="store_true",
                   help="synthesize rules (vm.rules.synthesize) and add the variant that uses them in place of "
                        "the built-in algebra theory")
    w.add_argument("--depth", type=int, default=2, help="term depth of --synthesized (default 2)")
    w.add_argument("--synth-budget", type=float, default=600.0, metavar="S",
                   help="time budget of --synthesized in seconds (default 600)")
    w.add_argument("--full", action="store_true", help="full-size programs (default: the small shapes)")
    w.add_argument("--batch", type=int, default=1, help="batch size of the programs (default 1)")
    w.add_argument("--time-budget", type=float, default=None, metavar="S", help="time budget of each search")
    w.add_argument("--seed", type=int, default=0, help="seed of every search (and of --synthesized)")
    w.add_argument("--out", metavar="DIR", default="sweep-out", help="output directory (default sweep-out)")
    w.add_argument("--no-plots", action="store_true", help="write the table only")
    w.add_argument("--ray", action="store_true", help="run the searches as Ray tasks (pip install 'verimirage[ray]')")
    w.add_argument("--address", metavar="ADDR", default=None,
                   help="with --ray: join this Ray cluster (default: start Ray on this machine)")
    w.add_argument("--processes", type=int, default=None, metavar="N",
                   help="run the searches (and the synthesis's proofs) in a pool of N worker processes, 0: one per "
                        "core (a many-core machine without Ray; default: one after another in this process)")
    w.add_argument("--json", action="store_true", help="machine-readable output")
    w.set_defaults(fn=cmd_sweep)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``verimirage`` command."""
    from verimirage.logs import configure

    # at exit, the objects made so far are left to the process's end instead of collected one by one (the
    # interpreter's teardown of the IR, numpy and the code generator took ~0.1 s of a 1 s `check-cert`)
    atexit.register(gc.freeze)
    args = build_parser().parse_args(argv)
    try:
        configure(args.verbose)
    except ValueError as e:  # a malformed VERIMIRAGE_LOG
        print(f"verimirage: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.fn(args))
    except BrokenPipeError:  # the reader went away (`verimirage show ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as e:
        from verimirage.ir.errors import GraphError  # (imported here: the IR imports numpy, see cmd_check_cert)

        if not isinstance(e, (UsageError, GraphError)):
            raise
        print(f"verimirage: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
