"""Which committed candidates' kernels a code generation change alters, and whether those compile for sm_90.

Two steps, each on the CPU (no GPU needed)::

    PYTHONPATH=$PWD python benchmarks/compile_check.py manifest OUT.json           # kernel texts' hashes
    PYTHONPATH=$PWD python benchmarks/compile_check.py changed BASE.json [--compile] [--out REPORT.json]

``manifest`` generates every committed candidate (the suite's ``benchmarks/candidates/*.json``, the layer's
``candidates/layer*/``, the models set's ``candidates_models/``, ``candidates_causal_cmp/``, the capture plans
``results/capture/plan_*.json`` and the cost calibration's measured rows, ``results/cost_calibration_models.json``)
under the tile options the profiler tries (:data:`VARIANTS`: ``recommend``'s, rows
padded to 16, rows padded to 16 with batch-1 dots, the block graph's own) and writes the SHA-256 of each kernel's
text. Run it with the old code (e.g. a worktree of the base revision on ``PYTHONPATH``), then ``changed`` with the new
code: it lists the candidates (and so the benchmark cases) whose kernels differ (a calibration row among them was
measured on kernels the code no longer generates: re-measure it), and with ``--compile`` compiles each
distinct changed kernel for sm_90 in a separate process (:func:`verimirage.backend.gpucompile.compile_modules`,
unspecialised and as the JIT specialises contiguous tensors) at the warps and stages it launches with (``recommend``'s
for its tile options, 4 warps and 3 stages for the fixed configurations), at 4 warps and at 8 (a failure above 4
warps only costs the runtime a retry at half the warps: ``runtime._layout_pass_failed``). Exits 1 when a kernel fails
at 4 warps or fewer. ``--only PREFIX ...`` (both steps) keeps the labels starting with one of the prefixes (e.g.
``results/cost_calibration_models.json``: the calibration rows alone, manifested with each row's own revision).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
log = logging.getLogger("compile_check")

#: tile-option variants (label -> TileOptions keyword arguments; None: ``recommend``'s per kernel, the tuned module)
VARIANTS: dict[str, dict[str, Any] | None] = {
    "tuned": None, "m16": {"dot_min_m": 16}, "m16b1": {"dot_min_m": 16, "dot_batch1": True}, "plain": {}}


#: the cost calibration's measured rows (``calibrate_cost.DATASET``): each row's μGraph, labelled by its place
CALIBRATION = "results/cost_calibration_models.json"


def committed(only: tuple[str, ...] = ()) -> Iterator[tuple[str, str]]:
    """``(label, μGraph text)`` of every committed candidate (and calibration row); ``only``: the labels starting
    with one of these prefixes."""
    for label, text in _committed():
        if not only or label.startswith(only):
            yield label, text


def _committed() -> Iterator[tuple[str, str]]:
    files = sorted(HERE.glob("candidates/*.json")) + sorted(HERE.glob("candidates/layer*/*.json")) \
        + sorted(HERE.glob("candidates_models/*.json")) + sorted(HERE.glob("candidates_causal_cmp/*.json"))
    for f in files:
        if f.name.endswith(".plan.json"):
            continue
        rel = f.relative_to(HERE)
        for i, c in enumerate(json.loads(f.read_text()).get("candidates", [])):
            yield f"{rel}#{i}", c["mugraph"]
    for f in sorted(HERE.glob("results/capture/plan_*.json")):
        rel = f.relative_to(HERE)
        for g, (graph, designs) in enumerate(json.loads(f.read_text()).items()):
            del graph
            for i, d in enumerate([designs] if isinstance(designs, (str, dict)) else designs):
                yield f"{rel}#{g}.{i}", d if isinstance(d, str) else d["mugraph"]
    if (HERE / CALIBRATION).exists():
        for i, e in enumerate(json.loads((HERE / CALIBRATION).read_text())["entries"]):
            yield f"{CALIBRATION}#{i}", e["mugraph"]


def kernel_texts(source: str, names: list[str]) -> dict[str, str]:
    """Each kernel's function text (decorator to the blank lines after it) in a generated module."""
    out = {}
    for name in names:
        m = re.search(rf"@triton\.jit\ndef {re.escape(name)}\(.*?(?=\n\n\n)", source, re.S)
        if m is None:
            raise ValueError(f"kernel {name} not found in the generated module")
        out[name] = m.group(0)
    return out


def generated(text: str) -> Iterator[tuple[str, Any, dict[str, str], dict[str, tuple[int, int]]]]:
    """``(variant, module, kernel texts, {kernel: (warps, stages)})`` of one μGraph under every :data:`VARIANTS`."""
    import verimirage as vm
    from verimirage.backend.codegen import TileOptions, generate
    from verimirage.backend.tuning import recommend, tuned_module
    from verimirage.ir.errors import GraphError
    from verimirage.ir.graph import node_list

    mg = vm.MuGraph.parse(text)
    for label, kw in VARIANTS.items():
        try:
            ms = tuned_module(mg) if kw is None else generate(mg, TileOptions(**kw))
        except GraphError as e:  # (e.g. a degenerate product's temporary above Triton's limit without padded rows)
            log.debug("%s: %s", label, str(e)[:120])
            continue
        nodes = node_list(ms.mugraph)
        launch = {}
        for k in ms.kernels:
            if kw is None:
                at = [nodes[a].outs[j] for a, j in nodes[k.node].args]
                c = recommend(nodes[k.node].attr("block"), at)
                launch[k.name] = (c.num_warps, c.num_stages)
            else:
                launch[k.name] = (4, 3)
        yield label, ms, kernel_texts(ms.source, [k.name for k in ms.kernels]), launch


def sha(text: str) -> str:
    """Short SHA-256 of a text."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def manifest(only: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """``{"label/variant": {kernel: hash}}`` over every committed candidate (``only``: as :func:`committed`)."""
    out: dict[str, dict[str, str]] = {}
    for label, text in committed(only):
        try:
            for var, _, texts, _ in generated(text):
                out[f"{label}/{var}"] = {k: sha(t) for k, t in texts.items()}
        except Exception as e:  # (report, go on: a candidate that no longer generates is a finding of its own)
            log.error("%s: %s", label, e)
            out[f"{label}/error"] = {"error": str(e)[:200]}
    return out


def module_for(source: str, kernel: str, text: str, signature: dict[str, str], warps: int, stages: int) -> str:
    """A module holding the header and helpers of ``source`` and only ``kernel`` (its ``text``), launched at
    ``warps`` and ``stages``, for :mod:`verimirage.backend.gpucompile`."""
    first = re.search(r"@triton\.jit\ndef k\w*\(", source)
    head = source[:first.start()] if first else ""
    return (f"{head}{text}\n\n\nLAUNCH = {{{kernel!r}: {{'num_warps': {warps}, 'num_stages': {stages}}}}}\n"
            f"SIGNATURES = {{{kernel!r}: {signature!r}}}\n")


def changed(base: dict[str, dict[str, str]], compile_: bool, only: tuple[str, ...] = ()) -> dict[str, Any]:
    """The candidates whose kernels differ from ``base``'s and, with ``compile_``, each distinct changed kernel's
    sm_90 compile at its launch warps and stages and at 8 warps (``only``: as :func:`committed`)."""
    diff: dict[str, list[str]] = {}
    todo: dict[tuple[str, int, int], tuple[str, str, str, dict[str, str]]] = {}
    where: dict[tuple[str, int, int], list[str]] = {}
    n = 0
    for label, text in committed(only):
        for var, ms, texts, launch in generated(text):
            n += 1
            old = base.get(f"{label}/{var}", {})
            sigs = {k.name: k.signature for k in ms.kernels}
            for k, t in texts.items():
                if old.get(k) == sha(t):
                    continue
                diff.setdefault(f"{label}/{var}", []).append(k)
                w, s = launch[k]
                for ws in {(w, s), (min(w, 4), s), (8, s)}:
                    key = (sha(t + repr(sigs[k])), *ws)
                    todo.setdefault(key, (ms.source, k, t, sigs[k]))
                    where.setdefault(key, []).append(f"{label}/{var}/{k}")
    report: dict[str, Any] = {"modules": n, "changed": diff, "cases": sorted({k.split("#")[0] for k in diff})}
    if compile_ and todo:
        from verimirage.backend.gpucompile import compile_modules

        with tempfile.TemporaryDirectory() as tmp:
            paths = {}
            for key, (src, k, t, sig) in todo.items():
                p = Path(tmp) / f"m_{key[0]}_w{key[1]}_s{key[2]}.py"
                p.write_text(module_for(src, k, t, sig, key[1], key[2]))
                paths[key] = p
            rep = compile_modules(list(paths.values()), timeout_s=7200)
        comp = []
        for key, p in paths.items():
            (r,) = rep[str(p)].values()
            comp.append({"kernel": key[0], "warps": key[1], "stages": key[2], "ok": r["ok"], "wgmma": r["wgmma"],
                         "error": r["error"][-300:], "where": where[key][:6], "n_where": len(where[key])})
        report["compiled"] = comp
    return report


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("out")
    m.add_argument("--only", nargs="*", default=[])
    c = sub.add_parser("changed")
    c.add_argument("base")
    c.add_argument("--compile", action="store_true")
    c.add_argument("--out")
    c.add_argument("--only", nargs="*", default=[])
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.cmd == "manifest":
        Path(a.out).write_text(json.dumps(manifest(tuple(a.only)), indent=0, sort_keys=True))
        return 0
    rep = changed(json.loads(Path(a.base).read_text()), a.compile, tuple(a.only))
    text = json.dumps(rep, indent=1)
    if a.out:
        Path(a.out).write_text(text)
    log.info("%d modules, %d with changed kernels; cases: %s", rep["modules"], len(rep["changed"]),
             ", ".join(rep["cases"]))
    bad = [r for r in rep.get("compiled", []) if not r["ok"]]
    for r in bad:
        log.info("FAILED at %d warps, %d stages: %s ...: %s", r["warps"], r["stages"], r["where"][:3],
                 r["error"][-160:])
    return 1 if any(r["warps"] <= 4 for r in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
