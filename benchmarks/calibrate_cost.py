"""Calibrate the cost model against the measured per-candidate times of the models set.

    python benchmarks/calibrate_cost.py --build     # (re)collect the dataset from benchmarks/results/ + git
    python benchmarks/calibrate_cost.py --build --add models_run7.json   # with a newer run's results
    python benchmarks/calibrate_cost.py             # re-estimate every stored candidate, report Spearman
    python benchmarks/calibrate_cost.py --json      # the same report as JSON
    python benchmarks/calibrate_cost.py --test models_run17_h100_2315_onecard.json --suite   # held-out sets too
    python benchmarks/calibrate_cost.py --lopo pipeline_fill=0,0.5,0.75,1 --test models_run17_h100_2315_onecard.json
    python benchmarks/calibrate_cost.py --export DIR --rows STALE.json    # stale rows' candidate files for bench.py
    python benchmarks/calibrate_cost.py --refresh DIR RESULTS...           # their re-measurement into the dataset
    python benchmarks/calibrate_cost.py --regen SWEEP_DIR --plan-items ITEMS.json   # cost_calibration_sweep.json
    python benchmarks/calibrate_cost.py --sweep SWEEP_DIR --plan-items ITEMS.json   # a sweep's figures, held out

The GPU harness (``benchmarks/bench.py --set models --candidates DIR``) records, for every program, each
candidate's cost estimate next to its fastest measured launch configuration (``cost_vs_measured``: rank into
the candidate file, ``cost_us``, ``measured_us``). The candidate files are re-searched from time to time, so
``--build`` finds, for each measured row, the version of ``benchmarks/candidates_models/<case>.json`` (the
working tree's or one in git history) whose estimates match the recorded ones, and stores the measured
μGraphs with their times in :data:`DATASET` (one entry per distinct (program, μGraph), the latest run's
measurement kept). The default mode re-estimates every stored μGraph with the current
:func:`verimirage.rewrite.cost.cost` and reports Spearman's rank correlation of estimate and measured time,
pooled over all candidates and within each program, next to the figures of the estimates recorded at run time.

``spearman_floor`` and ``within_floor`` in the dataset are the pooled and the mean within-program figures the
current model reached when the file was last written (``--build`` or ``--set-floor``);
``tests/test_cost_calibration.py`` holds the model to them.

Stale rows: a row measured on kernels the code generator no longer emits for its μGraph (``benchmarks/compile_check.py
manifest --only results/cost_calibration_models.json`` with the row's own revision, then ``changed``) is re-measured
as it was measured: ``--export DIR --rows REPORT`` writes, for the rows a ``changed`` report (or a list of entry
indices) names, one candidate file per program into ``DIR/<conditions>/`` (the harness settings of the row's source:
rotated inputs or warm, PDL mode; :func:`conditions`) and ``DIR/rows.json``; ``bench.py --set models --candidates
DIR/<conditions>`` under those settings measures them; ``--refresh DIR RESULT...`` (bench.py's ``models.json`` of
each) writes the measurements as probe rows (``DIR/calibration_rows.json``, to list in :data:`PROBE_ROWS`) and
replaces the stored entries' times with them (the rest of the stored dataset unchanged: ``--build`` recollects from
every source and may differ from the stored file where result files were rewritten since).

Rebuilding from one sweep: the stored dataset above is a history (rows of many runs, some re-measured; not
rebuildable from its sources). :data:`SWEEP_DATASET` is rebuilt from the committed candidate files and one device
call: ``OUT=DIR bash benchmarks/calibration_sweep.sh [PLAN_ITEMS.json]`` on the device times every committed
candidate of the models set (``benchmarks/candidates_models/``) and of the suite (``benchmarks/candidates/``) at its
default launch configuration (warm inputs, PDL off) and the designs of sampled capture-plan entries
(``benchmarks/perf/plan_rank.py``); with that output copied under ``benchmarks/results/``, ``--regen DIR
[--plan-items PLAN_ITEMS.json]`` writes :data:`SWEEP_DATASET` (``--regen-to``): each measured candidate's μGraph
from the committed candidate file whose estimates the run recorded (as ``--build`` matches them), entries ``flat``
(today's code generator), the models set as ``entries`` and the suite and plans under ``sets``, and the floors the
current model reaches (``tests/test_cost_calibration.py`` holds them). Nothing of git history or older result files
enters it. ``--sweep DIR [--plan-items ...]`` reports on such an output without writing anything.

Held-out figures: ``--test FILE`` re-estimates the candidates a result file measured (matched to the committed
candidate files as ``--build`` does) without adding them to the dataset (run 17, measured with rotated inputs after
the dataset's runs); ``--suite`` does the same for the suite's candidates (``benchmarks/candidates/``) and their
measurement (:data:`SUITE_RESULT`), whose programs the dataset does not hold, and prints each program's
first-ranked candidate's measured time over its best (the default ``vm.superoptimize`` returns the first);
``--lopo PARAM=V1,V2,...`` chooses a :class:`~verimirage.rewrite.cost.Hardware` parameter leave-one-program-out:
for each program the value with the best mean within-program Spearman over the dataset's other programs, that
program's figures (in the dataset and in every ``--test`` file) then taken under that value.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import spearman  # Spearman's rank correlation, the harness's own

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CANDS = "benchmarks/candidates_models"
DATASET = RESULTS / "cost_calibration_models.json"
#: the calibration data rebuilt from one device sweep of today's committed candidates (``--regen``)
SWEEP_DATASET = RESULTS / "cost_calibration_sweep.json"
#: the held-out sets as last collected (``--test ... --suite --save-heldout``): what ``tests/`` read, without git
HELDOUT = RESULTS / "cost_calibration_heldout.json"
#: the suite's last full measurement (H100) of its stored candidates: the held-out programs of ``--suite``
SUITE_RESULT = "suite_h100_2026-11-26_s11/merged.json"
SUITE_CANDS = "benchmarks/candidates"

#: measured result files, oldest first (a later file's measurement of the same μGraph replaces an earlier one)
SOURCES = [
    "models_run1.json", "models_run2.json", "models_run3.json", "models_run4.json", "models_run5.json",
    "models_h100_session9/models_run6_part1.json", "models_h100_session9/models_run6_part2.json",
    "models_h100_session9/models_run6_part3.json", "models.json",
]


#: rows measured outside the harness (a probe's per-candidate timings: ``case``, ``graph``, ``mugraph``, ``kernels``,
#: ``measured_us``, ``run_est_us``), newer than every file of :data:`SOURCES`
PROBE_ROWS = ["run16_probe_calibration_rows.json", "rowsplit_h100_2026-11-27/calibration_rows.json",
              # the stale rows re-measured in the twentieth session (--export / --refresh; codegen 18)
              "models20_2026-11-27/stale_cands/calibration_rows.json",
              "models20_2026-11-27/stale_cands2/calibration_rows.json"]


def _times(doc: dict[str, Any]) -> set[tuple[str, float]]:
    """(program, measured µs) of every measured candidate of a result or probe-rows file."""
    out = set()
    for r in doc["rows"]:
        for c in r.get("cost_vs_measured", [r] if "measured_us" in r else []):
            if c.get("measured_us") is not None:
                out.add((r["case"], round(c["measured_us"], 6)))
    return out


def conditions(entry: dict[str, Any]) -> tuple[bool, str]:
    """The harness settings ``entry`` was measured under: rotated inputs (``rotate``) and the PDL mode (``pdl``) of its
    source file's version holding its time (the working tree's, else the newest in git: ``models.json`` is rewritten
    by later runs); files without them were measured warm, without PDL (the runs before both)."""
    src = f"benchmarks/results/{entry['source']}"
    key = (entry["case"], round(entry["measured_us"], 6))
    def versions() -> Iterator[dict[str, Any]]:
        if (ROOT / src).exists():
            yield json.loads((ROOT / src).read_text())
        for c in _git("log", "--format=%H", "--", src).split():
            yield json.loads(_git("show", f"{c}:{src}"))

    doc = next((d for d in versions() if key in _times(d)), None)
    if doc is None:
        raise SystemExit(f"{entry['case']}: no version of {src} holds its measured time {entry['measured_us']}")
    return bool(doc.get("rotate", False)), str(doc.get("pdl") or "off")


def export(rows: Sequence[int], out: Path) -> dict[str, Any]:
    """Write the stored entries ``rows`` (indices into :data:`DATASET`) as candidate files for ``bench.py --set models
    --candidates``, one directory per measurement conditions (``rotate`` / ``warm`` and the PDL mode, as each row's
    source measured), each candidate's ``cost_us`` the current estimate; and ``out/rows.json`` ({directory: {case:
    [entry index of each candidate]}}, the conditions). Entries of a program whose graph has changed since (the
    candidate file's ``graph`` differs) cannot be measured with today's inputs: listed under ``skipped``."""
    doc = json.loads(DATASET.read_text())
    entries = doc["entries"]
    est = estimate([entries[i] for i in rows])
    index: dict[str, Any] = {"dirs": {}, "skipped": []}
    files: dict[str, dict[str, dict[str, Any]]] = {}
    for i, e_us in zip(rows, est, strict=True):
        e = entries[i]
        graph = json.loads((ROOT / CANDS / f"{e['case']}.json").read_text())["graph"]
        if graph != e["graph"]:
            index["skipped"].append(i)
            continue
        rotate, pdl = conditions(e)
        sub = f"{'rotate' if rotate else 'warm'}_pdl_{pdl}"
        index["dirs"].setdefault(sub, {"rotate": rotate, "pdl": pdl, "cases": {}})["cases"].setdefault(
            e["case"], []).append(i)
        f = files.setdefault(sub, {}).setdefault(e["case"], {"case": e["case"], "graph": graph, "search_s": 0.0,
                                                             "candidates": []})
        f["candidates"].append({"mugraph": e["mugraph"], "cost_us": e_us, "kernels": e.get("kernels")})
    for sub, cases in files.items():
        (out / sub).mkdir(parents=True, exist_ok=True)
        for case, f in cases.items():
            (out / sub / f"{case}.json").write_text(json.dumps(f, indent=1) + "\n")
    (out / "rows.json").write_text(json.dumps(index, indent=1) + "\n")
    return index


def refresh(out: Path, results: Sequence[Path], only: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """The re-measurement of :func:`export`'s rows (``out``) by ``bench.py`` (its ``models.json`` files ``results``)
    as probe rows (:data:`PROBE_ROWS`' form), written to ``out/calibration_rows.json``; each stored entry of the same
    (program, μGraph) takes the new time (``source``: that file; the measurement it replaces listed under
    ``replaced``). ``only``: just these entries (indices into
    :data:`DATASET`; e.g. leaving out rows whose kernels changed again after the measurement). Returns the rows."""
    rows: list[dict[str, Any]] = []
    dirs = json.loads((out / "rows.json").read_text())["dirs"]
    for res in results:
        doc = json.loads(res.read_text())
        sub = f"{'rotate' if doc.get('rotate') else 'warm'}_pdl_{doc.get('pdl') or 'off'}"
        if sub not in dirs:
            raise SystemExit(f"{res}: measured under {sub}, which {out} has no rows for ({sorted(dirs)})")
        for r in doc["rows"]:
            cdoc = json.loads((out / sub / f"{r['case']}.json").read_text())
            for c in r.get("cost_vs_measured", []):
                if c.get("measured_us") is not None:
                    rows.append({"case": r["case"], "graph": cdoc["graph"],
                                 "mugraph": cdoc["candidates"][c["rank"]]["mugraph"], "kernels": c["kernels"],
                                 "measured_us": c["measured_us"], "run_est_us": c["cost_us"], "flat": True,
                                 "label": f"{sub} rank {c['rank']}"})
    dataset = json.loads(DATASET.read_text())
    if only is not None:
        keep = {(dataset["entries"][i]["case"], dataset["entries"][i]["mugraph"]) for i in only}
        rows = [r for r in rows if (r["case"], r["mugraph"]) in keep]
    src = str((out.resolve() / "calibration_rows.json").relative_to(RESULTS))
    new = {(r["case"], r["mugraph"]): r for r in rows}
    for e in dataset["entries"]:
        r = new.get((e["case"], e["mugraph"]))
        if r is not None:
            if e["source"] != src:  # (the measurement replaced, kept: tests cite some runs' own figures)
                e.setdefault("replaced", []).append({k: e.get(k) for k in ("source", "measured_us", "run_est_us",
                                                                           "kernels", "flat", "rank")})
            e.update(measured_us=r["measured_us"], run_est_us=r["run_est_us"], kernels=r["kernels"], flat=True,
                     source=src, candidates="probe", rank=None)
    if src not in dataset["sources"]:
        dataset["sources"].append(src)
    DATASET.write_text(json.dumps(dataset, indent=1) + "\n")
    return rows


def regen(sweep: Path, to: Path, plan_items: Path | None = None) -> dict[str, Any]:
    """The calibration data rebuilt from one sweep (``benchmarks/calibration_sweep.sh``'s output directory ``sweep``,
    under :data:`RESULTS`; :func:`sweep_sets`) over the committed candidate files: ``entries`` the models set's measured
    candidates (the dataset), ``sets`` the suite's and the sampled capture-plan entries' (``plan_items``), written to
    ``to`` with the floors the current model reaches on the models set (``spearman_floor``, ``within_floor``) and, for
    every set, the first-ranked candidate's measured time over the best as a ceiling (``first_over_best``). Raises
    where a measured row matches no committed candidate file's estimates or no models candidate was measured."""
    sets = sweep_sets(sweep, plan_items)
    if not sets.get("models"):
        raise SystemExit(f"{sweep}: no measured candidate of the models set")
    run = json.loads((sweep / "models" / "models.json").read_text())
    doc: dict[str, Any] = {
        "device": run.get("device"), "date": run.get("date"), "torch": run.get("torch"), "triton": run.get("triton"),
        "regenerated_from": str(sweep.resolve().relative_to(RESULTS.resolve())),
        "conditions": {k: run.get(k) for k in ("rotate", "pdl", "configs", "rep_ms", "select_rep_ms")},
        "note": "regenerated by calibrate_cost.py --regen from one sweep (benchmarks/calibration_sweep.sh): "
                "measured_us the candidate's time at its default launch configuration (CUDA-graph median, bench.py; "
                "models and suite warm, PDL off; plans: plan_rank.py, rotated inputs); run_est_us the committed "
                "candidate file's estimate (the plans': the estimate when the sample was drawn)",
        "entries": sets.pop("models"), "sets": sets}
    rep = report(doc["entries"], estimate(doc["entries"]))
    doc["spearman_floor"] = round(rep["pooled"] - 5e-4, 3)
    doc["within_floor"] = round(rep["within_mean"] - 5e-4, 3)
    doc["first_over_best"] = {"models": round(rep["first_over_best_geomean"] + 5e-4, 3)}
    for name, es in sets.items():
        doc["first_over_best"][name] = round(report(es, estimate(es))["first_over_best_geomean"] + 5e-4, 3)
    to.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def sweep_sets(sweep: Path, plan_items: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """The measured sets of one sweep (``benchmarks/calibration_sweep.sh``'s output directory ``sweep``, under
    :data:`RESULTS`): ``models`` and ``suite`` as dataset entries (their committed candidate files), and with
    ``plan_items`` (the sample ``plan_rank.py run`` timed) ``plans``: each sampled capture-plan entry's timed designs
    as entries of one program per plan entry (``case``: the entry's name)."""
    out: dict[str, list[dict[str, Any]]] = {}
    base = sweep.resolve().relative_to(RESULTS.resolve())
    for name, rel, cands in (("models", "models/models.json", CANDS), ("suite", "suite/latest.json", SUITE_CANDS)):
        if (sweep / rel).exists():
            doc = build(only=[str(base / rel)], cands_dir=cands)
            if doc["unmatched"]:
                raise SystemExit(f"{sweep / rel}: rows whose estimates match no candidate file: {doc['unmatched']}")
            out[name] = [{**e, "flat": True} for e in doc["entries"]]
    if plan_items is not None and (sweep / "plans" / "plan_rank.json").exists():
        items = {it["name"]: it for it in json.loads(plan_items.read_text())}
        rows: list[dict[str, Any]] = []
        for r in json.loads((sweep / "plans" / "plan_rank.json").read_text())["rows"]:
            it = items[r["name"]]
            for k, (d, us) in enumerate(zip(it["designs"], r.get("us", []), strict=False)):
                if us is not None:
                    rows.append({"case": r["name"], "graph": it["graph"], "mugraph": d, "kernels": None,
                                 "measured_us": us, "run_est_us": it["est_us"][k], "flat": True, "rank": k,
                                 "source": str(base / "plans" / "plan_rank.json"), "candidates": "plan"})
        out["plans"] = rows
    return out


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _candidate_versions(case: str, cands: str = CANDS) -> list[tuple[str, dict[str, Any]]]:
    """The candidate file of ``case`` (in ``cands``): the working tree's first, then every committed version, newest
    first."""
    out: list[tuple[str, dict[str, Any]]] = []
    path = f"{cands}/{case}.json"
    if (ROOT / path).exists():
        out.append(("worktree", json.loads((ROOT / path).read_text())))
    for c in _git("log", "--format=%H", "--", path).split():
        try:
            out.append((c[:10], json.loads(_git("show", f"{c}:{path}"))))
        except (subprocess.CalledProcessError, json.JSONDecodeError):
            continue
    return out


def build(extra: Sequence[str] = (), only: Sequence[str] | None = None, cands_dir: str = CANDS) -> dict[str, Any]:
    """Collect (program, μGraph, measured time) from the result files (see the module docstring); ``extra``: more
    result files (paths relative to ``benchmarks/results/``), measured after those of :data:`SOURCES`; ``only``:
    these result files alone (no probe rows), their candidates looked up in ``cands_dir``."""
    versions: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    entries: dict[tuple[str, str], dict[str, Any]] = {}
    unmatched: list[str] = []
    sources = [*SOURCES, *extra] if only is None else list(only)
    for src in sources:
        p = RESULTS / src
        if not p.exists():
            continue
        doc = json.loads(p.read_text())
        for row in doc["rows"]:
            case = row["case"]
            pairs = [c for c in row.get("cost_vs_measured", []) if c.get("measured_us") is not None]
            if not pairs:
                continue
            if case not in versions:
                versions[case] = _candidate_versions(case, cands_dir)
            hit = None
            for ver, cdoc in versions[case]:
                cands = cdoc["candidates"]
                if all(c["rank"] < len(cands) and abs(cands[c["rank"]]["cost_us"] - c["cost_us"]) < 1e-6
                       for c in pairs):
                    hit = (ver, cdoc)
                    break
            if hit is None:
                unmatched.append(f"{src}:{case}")
                continue
            ver, cdoc = hit
            for c in pairs:
                mg = cdoc["candidates"][c["rank"]]["mugraph"]
                entries[(case, mg)] = {"case": case, "graph": cdoc["graph"], "mugraph": mg, "flat": src in FLAT_RUNS,
                                       "kernels": c.get("kernels"), "measured_us": c["measured_us"],
                                       "run_est_us": c["cost_us"], "source": src, "candidates": ver,
                                       "rank": c["rank"]}
    for src in PROBE_ROWS if only is None else []:
        p = RESULTS / src
        if not p.exists():
            continue
        for r in json.loads(p.read_text())["rows"]:
            entries[(r["case"], r["mugraph"])] = {
                "case": r["case"], "graph": r["graph"], "mugraph": r["mugraph"], "kernels": r.get("kernels"),
                "measured_us": r["measured_us"], "run_est_us": r["run_est_us"], "source": src, "candidates": "probe",
                "rank": None}
        sources.append(src)
    return {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26",
            "note": "measured_us: the fastest launch configuration of the candidate (CUDA-graph median, "
                    "benchmarks/bench.py); run_est_us: the estimate recorded at run time",
            "sources": sources, "unmatched": unmatched, "entries": list(entries.values())}


#: whether the measured runs launched elementwise kernels flat (codegen's ``TileOptions.flat``, landed after run 17):
#: none of the dataset's, the suite's or run 17's did, so their kernels are estimated as their tiles ran; the result
#: files of :data:`FLAT_RUNS` did (their entries carry ``"flat": true``)
MEASURED_FLAT = False
FLAT_RUNS = {"models_run18_h100_0210_subset.json", "models_run18b_h100_0212_pdl_nopool.json"}


def estimate(entries: Sequence[dict[str, Any]], hw: Any = None) -> list[float]:
    """The current cost model's estimate (µs) of every entry's μGraph (on ``hw``, default the model's H100 with the
    kernels launched as the runs launched them: :data:`MEASURED_FLAT`)."""
    import dataclasses

    sys.path.insert(0, str(ROOT))
    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.cost import H100

    hws = {f: dataclasses.replace(hw or H100, flat_elementwise=f) for f in (False, True)}

    cache: dict[tuple[str, bool], float] = {}
    out = []
    for e in entries:
        key = (e["mugraph"], bool(e.get("flat", MEASURED_FLAT)))
        if key not in cache:
            cache[key] = cost(MuGraph.parse(e["mugraph"]), hws[key[1]]).time_s * 1e6
        out.append(cache[key])
    return out


def report(entries: Sequence[dict[str, Any]], est: Sequence[float]) -> dict[str, Any]:
    """Spearman pooled and per program of ``est`` against the measured times (and of the run-time estimates)."""
    meas = [e["measured_us"] for e in entries]
    run = [e["run_est_us"] for e in entries]
    per: dict[str, dict[str, Any]] = {}
    for case in sorted({e["case"] for e in entries}):
        idx = [i for i, e in enumerate(entries) if e["case"] == case]
        per[case] = {"pairs": len(idx), "spearman": spearman([est[i] for i in idx], [meas[i] for i in idx]),
                     "run_spearman": spearman([run[i] for i in idx], [meas[i] for i in idx]),
                     "est_over_measured": statistics.median(est[i] / meas[i] for i in idx),
                     # the measured time of the candidate the estimate ranks first (what the default, unprofiled
                     # vm.superoptimize returns) over the best measured one
                     "first_over_best": meas[min(idx, key=lambda i: est[i])] / min(meas[i] for i in idx),
                     "run_first_over_best": meas[min(idx, key=lambda i: run[i])] / min(meas[i] for i in idx)}
    # pairs of one program measured more than 5% apart (beyond the run-to-run noise of candidates within a few
    # percent of each other): the fraction the estimate orders as measured
    agree = total = run_agree = 0
    for case in per:
        idx = [i for i, e in enumerate(entries) if e["case"] == case]
        for a in idx:
            for b in idx:
                if meas[a] > 1.05 * meas[b]:
                    total += 1
                    agree += est[a] > est[b]
                    run_agree += run[a] > run[b]
    within = [v["spearman"] for v in per.values() if v["spearman"] is not None]
    within_run = [v["run_spearman"] for v in per.values() if v["run_spearman"] is not None]
    logr = [math.log(a / b) for a, b in zip(est, meas, strict=True)]
    first = [v["first_over_best"] for v in per.values()]
    run_first = [v["run_first_over_best"] for v in per.values()]
    return {"pairs": len(entries), "programs": len(per),
            "pooled": spearman(est, meas), "run_pooled": spearman(run, meas),
            "within_mean": statistics.fmean(within) if within else None,
            "within_median": statistics.median(within) if within else None,
            "run_within_mean": statistics.fmean(within_run) if within_run else None,
            "log_ratio_rms": math.sqrt(statistics.fmean(x * x for x in logr)),
            "pairs_5pct": total, "concordant_5pct": agree / total if total else None,
            "run_concordant_5pct": run_agree / total if total else None,
            "first_over_best_geomean": math.exp(statistics.fmean(math.log(x) for x in first)),
            "run_first_over_best_geomean": math.exp(statistics.fmean(math.log(x) for x in run_first)),
            "per_program": per}


def _hardware(param: str, value: float) -> Any:
    import dataclasses

    sys.path.insert(0, str(ROOT))
    from verimirage.rewrite.cost import H100

    return dataclasses.replace(H100, **{param: value})


def lopo(entries: Sequence[dict[str, Any]], tests: dict[str, Sequence[dict[str, Any]]], param: str,
         values: Sequence[float]) -> dict[str, Any]:
    """Leave-one-program-out choice of the :class:`Hardware` parameter ``param`` among ``values``: for each program,
    the value whose mean within-program Spearman over the other programs of ``entries`` is the highest (ties: the
    first listed); the program's figures, in ``entries`` and in each held-out set of ``tests``, under that value.
    Returns, per set, the held-out mean / median within-program Spearman and first-over-best geomean, and the
    value chosen for each program."""
    sets = {"dataset": entries, **tests}
    per = {v: {name: report(es, estimate(es, _hardware(param, v)))["per_program"] for name, es in sets.items()}
           for v in values}

    def score(v: float, leave: str) -> float:
        sp = [x["spearman"] for p, x in per[v]["dataset"].items() if p != leave and x["spearman"] is not None]
        return statistics.fmean(sp)

    chosen = {p: max(values, key=lambda v: score(v, p)) for p in per[values[0]]["dataset"]}
    out: dict[str, Any] = {"param": param, "values": list(values), "chosen": chosen}
    for name in sets:
        progs = per[values[0]][name]
        rows = {p: per[chosen.get(p, max(values, key=lambda v: score(v, "")))][name][p] for p in progs}
        sp = [r["spearman"] for r in rows.values() if r["spearman"] is not None]
        out[name] = {"within_mean": statistics.fmean(sp), "within_median": statistics.median(sp),
                     "first_over_best_geomean": math.exp(statistics.fmean(
                         math.log(r["first_over_best"]) for r in rows.values()))}
    return out


def suite_entries() -> list[dict[str, Any]]:
    """The suite's measured candidates (:data:`SUITE_RESULT`), matched to the versions of ``benchmarks/candidates/``."""
    doc = build(only=[SUITE_RESULT], cands_dir=SUITE_CANDS)
    if doc["unmatched"]:
        raise SystemExit(f"suite rows without their candidate file version: {doc['unmatched']}")
    return list(doc["entries"])


def heldout_sets() -> dict[str, list[dict[str, Any]]]:
    """The held-out sets stored in :data:`HELDOUT` (name: the result file, or ``suite``; each a list of entries)."""
    return dict(json.loads(HELDOUT.read_text())["sets"])


def _print(rep: dict[str, Any], label: str, floors: str = "") -> None:
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"{label}: {rep['pairs']} candidates of {rep['programs']} programs; Spearman pooled {f(rep['pooled'])} "
          f"(run-time estimates {f(rep['run_pooled'])}), within programs mean {f(rep['within_mean'])} median "
          f"{f(rep['within_median'])} (run-time {f(rep['run_within_mean'])}); rms |log(est/measured)| "
          f"{rep['log_ratio_rms']:.3f}{floors}; pairs of a program measured > 5% apart ordered as measured "
          f"{f(rep['concordant_5pct'])} of {rep['pairs_5pct']} (run-time {f(rep['run_concordant_5pct'])}); "
          f"the first-ranked candidate's measured time over the best: geomean "
          f"{rep['first_over_best_geomean']:.3f} (run-time {rep['run_first_over_best_geomean']:.3f})")
    for case, v in rep["per_program"].items():
        print(f"  {case:22s} {v['pairs']:3d}  spearman {f(v['spearman']):>6s} (run {f(v['run_spearman']):>6s})"
              f"  est/measured {v['est_over_measured']:.2f}  first/best {v['first_over_best']:.2f} "
              f"(run {v['run_first_over_best']:.2f})")


def _rows(spec: str) -> list[int]:
    """Entry indices from ``--rows``: a compile_check.py ``changed`` report's calibration labels, or "I,J,..."."""
    if not re.fullmatch(r"[\d,\s]*", spec):
        changed = json.loads(Path(spec).read_text())["changed"]
        pre = f"{DATASET.relative_to(ROOT / 'benchmarks')}#"
        return sorted({int(k[len(pre):].split("/")[0]) for k in changed if k.startswith(pre)})
    return sorted({int(x) for x in spec.split(",") if x.strip()})


def _device(results: Sequence[Path]) -> str:
    """The device and date of bench.py's result files."""
    docs = [json.loads(p.read_text()) for p in results]
    return "; ".join(sorted({f"{d.get('device')} {d.get('date')}" for d in docs}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="recollect the dataset from the result files and git")
    ap.add_argument("--add", nargs="*", default=[], metavar="FILE",
                    help="with --build: more result files (relative to benchmarks/results/), newest last")
    ap.add_argument("--set-floor", action="store_true",
                    help="store the current pooled and within-program figures as the floors")
    ap.add_argument("--test", nargs="*", default=[], metavar="FILE",
                    help="held out: report on these result files' candidates (relative to benchmarks/results/)")
    ap.add_argument("--suite", action="store_true", help=f"held out: report on the suite ({SUITE_RESULT})")
    ap.add_argument("--save-heldout", action="store_true",
                    help=f"store the --test / --suite sets in {HELDOUT.name} (what the tests read)")
    ap.add_argument("--lopo", metavar="PARAM=V1,V2,...",
                    help="choose a Hardware parameter leave-one-program-out and report the held-out figures")
    ap.add_argument("--export", type=Path, metavar="DIR",
                    help="write the --rows entries as candidate files for bench.py (one directory per conditions)")
    ap.add_argument("--rows", metavar="REPORT|I,J,...",
                    help="with --export: a compile_check.py 'changed' report (its calibration rows) or entry indices; "
                         "with --refresh: only these entries")
    ap.add_argument("--refresh", nargs="+", type=Path, metavar="DIR RESULT",
                    help="--export's DIR, then bench.py's models.json of each of its directories: the rows' new times")
    ap.add_argument("--regen", type=Path, metavar="DIR",
                    help="rebuild the sweep dataset from one sweep's output (benchmarks/calibration_sweep.sh; under "
                         "results/); with --plan-items its plan sample")
    ap.add_argument("--regen-to", type=Path, default=None, metavar="FILE",
                    help=f"where --regen writes (default {DATASET.name.replace('models', 'sweep')})")
    ap.add_argument("--sweep", type=Path, metavar="DIR",
                    help="report on one sweep's sets (benchmarks/calibration_sweep.sh's output, under results/)")
    ap.add_argument("--plan-items", type=Path, metavar="FILE", help="with --sweep: the plan sample it timed")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worst", type=int, default=0, help="list the N entries with the largest |log(est/measured)|")
    args = ap.parse_args()
    if args.export:
        if not args.rows:
            ap.error("--export needs --rows (a compile_check.py 'changed' report or entry indices)")
        idx = _rows(args.rows)
        index = export(idx, args.export)
        print(f"{len(idx)} rows: " + ", ".join(f"{s}: {sum(map(len, d['cases'].values()))} of {len(d['cases'])} "
                                               f"programs" for s, d in index["dirs"].items())
              + f"; skipped (program changed since): {index['skipped']}")
        return 0
    if args.refresh:
        if len(args.refresh) < 2:
            ap.error("--refresh DIR RESULT...: the exported directory, then bench.py's models.json of each run")
        rows = refresh(args.refresh[0], args.refresh[1:], _rows(args.rows) if args.rows else None)
        (args.refresh[0] / "calibration_rows.json").write_text(json.dumps(
            {"device": _device(args.refresh[1:]), "source": [str(p) for p in args.refresh[1:]],
             "note": "stale rows re-measured (calibrate_cost.py --export / --refresh): measured_us the fastest "
                     "configuration (CUDA-graph median, bench.py, the row's source's conditions); run_est_us the "
                     "estimate at export", "rows": rows}, indent=1) + "\n")
        print(f"{len(rows)} rows refreshed")
    if args.regen:
        doc = regen(args.regen, args.regen_to or SWEEP_DATASET, args.plan_items)
        progs = len({e["case"] for e in doc["entries"]})
        print(f"{len(doc['entries'])} entries of {progs} programs -> {args.regen_to or SWEEP_DATASET}")
    elif args.build:
        doc = build(args.add)
    else:
        doc = json.loads(DATASET.read_text())
    est = estimate(doc["entries"])
    rep = report(doc["entries"], est)
    if (args.build or args.set_floor) and not args.regen:
        doc["spearman_floor"] = round(rep["pooled"] - 5e-4, 3)
        doc["within_floor"] = round(rep["within_mean"] - 5e-4, 3)
        DATASET.write_text(json.dumps(doc, indent=1) + "\n")
    tests: dict[str, list[dict[str, Any]]] = {}
    for src in args.test:
        t = build(only=[src])
        if t["unmatched"]:
            print(f"{src}: rows without their candidate file version: {t['unmatched']}")
        tests[src] = t["entries"]
    if args.suite:
        tests["suite"] = suite_entries()
    if args.sweep:
        tests.update({f"sweep {k}": v for k, v in sweep_sets(args.sweep, args.plan_items).items()})
    if args.save_heldout:
        HELDOUT.write_text(json.dumps({
            "note": "held-out sets of the cost model's calibration (not in cost_calibration_models.json): entries as "
                    "in that file; 'flat': measured with flat elementwise kernels", "sets": tests}, indent=1) + "\n")
    reps = {name: report(es, estimate(es)) for name, es in tests.items()}
    held = None
    if args.lopo:
        param, _, vals = args.lopo.partition("=")
        held = lopo(doc["entries"], tests, param, [float(v) for v in vals.split(",")])
    if args.json:
        print(json.dumps({"dataset": rep, **reps, **({"lopo": held} if held else {})}, indent=1))
        return 0
    _print(rep, "dataset", f"; floors {doc.get('spearman_floor')} pooled, {doc.get('within_floor')} within")
    for name, r in reps.items():
        _print(r, f"held out, {name}")
    if held:
        print(f"leave-one-program-out over {held['param']} in {held['values']}: chosen {held['chosen']}")
        for name in ("dataset", *tests):
            h = held[name]
            print(f"  {name}: within programs mean {h['within_mean']:.3f} median {h['within_median']:.3f}, "
                  f"first/best geomean {h['first_over_best_geomean']:.3f}")
    if args.worst:
        order = sorted(range(len(est)), key=lambda i: -abs(math.log(est[i] / doc["entries"][i]["measured_us"])))
        for i in order[: args.worst]:
            e = doc["entries"][i]
            print(f"  {e['case']:20s} est {est[i]:8.2f} measured {e['measured_us']:8.2f}  ({e['source']} "
                  f"rank {e['rank']}, {e['kernels']} kernels)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
