"""The cost model's rank agreement with the measured per-candidate times of the models set (H100).

``benchmarks/results/cost_calibration_models.json`` holds every measured candidate μGraph of the models set with
its fastest measured time (built by ``benchmarks/calibrate_cost.py --build`` from the GPU runs' results); the
test re-estimates each with the current :func:`verimirage.rewrite.cost.cost` and holds the pooled Spearman rank
correlation at the figure recorded in the file when the model was last calibrated (``spearman_floor``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibrate_cost  # noqa: E402


def _doc() -> dict:
    return json.loads(calibrate_cost.DATASET.read_text())


def test_dataset_covers_the_models_set() -> None:
    import verimirage as vm

    doc = _doc()
    cases = {e["case"] for e in doc["entries"]}
    assert cases == set(vm.benchmarks.model_names())
    assert len(doc["entries"]) >= 100
    assert all(e["measured_us"] > 0 for e in doc["entries"])


def test_pooled_spearman_holds_the_calibrated_figure() -> None:
    doc = _doc()
    est = calibrate_cost.estimate(doc["entries"])
    rep = calibrate_cost.report(doc["entries"], est)
    assert rep["pooled"] >= doc["spearman_floor"], (rep["pooled"], doc["spearman_floor"])
    # the recorded floor is the figure the model reached, not a token: at least the run-time estimates' figure
    assert doc["spearman_floor"] >= rep["run_pooled"] - 1e-3


def test_within_program_spearman_holds_the_calibrated_figure() -> None:
    doc = _doc()
    rep = calibrate_cost.report(doc["entries"], calibrate_cost.estimate(doc["entries"]))
    assert rep["within_mean"] >= doc["within_floor"], (rep["within_mean"], doc["within_floor"])
    # pipeline_fill and sm_bandwidth took it from 0.682 to 0.783; log_softmax's eleven split-with-second-pass and
    # one-block-a-row candidates measured 2026-11-27 (rowsplit, H100; that program's within-Spearman 0.70) took the
    # mean over programs to 0.771 with the model unchanged
    assert doc["within_floor"] >= 0.77


def test_held_out_first_choices() -> None:
    # sets the dataset does not hold: the suite's programs (their H100 measurement) and run 17 of the models set
    # (measured with rotated inputs after the dataset's runs): the first-ranked measured candidate over the best,
    # geomean (run-time estimates: suite 1.073, run 17 1.033; the model before pipeline_fill 1.071 and 1.024)
    sets = calibrate_cost.heldout_sets()  # (stored by calibrate_cost.py --save-heldout: no git history needed)
    suite = sets["suite"]
    rep = calibrate_cost.report(suite, calibrate_cost.estimate(suite))
    assert rep["first_over_best_geomean"] <= 1.05, rep["first_over_best_geomean"]
    for case in ("gated_mlp_bs1", "gated_mlp_bs8", "rmsnorm_linear_bs1", "rmsnorm_linear_bs8"):
        assert rep["per_program"][case]["first_over_best"] == 1.0, case
    # (run 17's rotary_attention rows are of kernels codegen 16 and 18 changed since: its two-kernel designs measured
    # 33-40 us then, 19-25 in the sweep of 2026-11-27 22:10 UTC, now faster than the one-kernel design it measured
    # fastest; held to that sweep instead, test_sweep_first_choices)
    run17 = [e for e in sets["models_run17_h100_2315_onecard.json"] if e["case"] != "rotary_attention"]
    rep = calibrate_cost.report(run17, calibrate_cost.estimate(run17))
    assert rep["first_over_best_geomean"] <= 1.022, rep["first_over_best_geomean"]
    assert rep["within_mean"] >= 0.64, rep["within_mean"]
    # run 18: measured after the re-rank, L2-cold ranking, flat kernels (its entries say so)
    run18 = sets["models_run18_h100_0210_subset.json"]
    assert any(e["flat"] for e in run18)
    rep = calibrate_cost.report(run18, calibrate_cost.estimate(run18))
    assert rep["first_over_best_geomean"] <= 1.016, rep["first_over_best_geomean"]


def test_held_out_sets_match_their_result_files() -> None:
    # the stored held-out entries are the result files' measurements (each measured time appears in its file)
    for name, entries in calibrate_cost.heldout_sets().items():
        src = calibrate_cost.SUITE_RESULT if name == "suite" else name
        doc = json.loads((calibrate_cost.RESULTS / src).read_text())
        measured = {(r["case"], c["measured_us"]) for r in doc["rows"] for c in r.get("cost_vs_measured", [])}
        assert entries and all((e["case"], e["measured_us"]) in measured for e in entries), name


def test_spearman_ranks_ties_and_order() -> None:
    assert calibrate_cost.spearman([1, 2, 3], [10, 20, 30]) == 1.0
    assert calibrate_cost.spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert calibrate_cost.spearman([1, 1, 1], [1, 2, 3]) is None
    assert abs(calibrate_cost.spearman([1, 1, 2, 3], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-12


def _run8(case: str) -> list[dict]:
    """The designs run 8 measured (at most 2 kernels; the 3-kernel cut designs came later), as last measured: run 10
    re-measured some of them (the dataset keeps a μGraph's latest time)."""
    runs = ("models_run8_h100_1515.json", "models_run10_h100_1729.json")
    out = []
    for e in _doc()["entries"]:
        # (a row re-measured since, its kernels changed by later code generators, keeps run 8's or 10's under
        # "replaced": these tests cite those runs' figures)
        was = [e, *reversed(e.get("replaced", []))]
        m = next((w for w in was if w["source"] in runs), None)
        if e["case"] == case and m is not None and m["kernels"] <= 2:
            out.append({**e, "source": m["source"], "measured_us": m["measured_us"], "kernels": m["kernels"],
                        "flat": m.get("flat", False)})
    return out


def test_looped_block_reductions_wait_each_iteration() -> None:
    # run 8 (H100): cross_entropy's 16 blocks of whole 32000-column rows, 7.8 us, against 16 blocks looping 4 times
    # over 16 x 500 tiles with the online softmax's reductions in the loop, 36.6 us (estimated 9.7 and 9.6 then, so
    # the re-rank made the slow one the default); logsumexp's one-tile rows 3.4-3.6 us against 4-iteration loops
    # 4.8-4.9. Hardware.reduce_iteration_s ranks the whole rows first.
    import dataclasses

    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.cost import H100

    for case in ("cross_entropy", "logsumexp"):
        entries = _run8(case)
        assert len(entries) >= 6, case
        est = calibrate_cost.estimate(entries)
        first = min(range(len(entries)), key=lambda i: est[i])
        best = min(e["measured_us"] for e in entries)
        assert entries[first]["measured_us"] <= 1.05 * best, (case, entries[first]["measured_us"], best)
    ce = sorted(_run8("cross_entropy"), key=lambda e: e["measured_us"])
    rows = next(e for e in ce if "frange=1, grid=(1, 16)} : f16[1,16]" in e["mugraph"])  # 16 blocks of whole rows
    fast, slow = MuGraph.parse(rows["mugraph"]), MuGraph.parse(ce[-1]["mugraph"])
    assert ce[-1]["measured_us"] > 4 * rows["measured_us"]
    assert cost(fast).time_s < cost(slow).time_s
    # the term is what orders them: without it (and the narrow-store charge, which the looped design's 2-byte
    # column stores also pay) the looped design is estimated the cheaper, as at run time
    off = dataclasses.replace(H100, reduce_iteration_s=0.0, sector_write_exponent=0.0)
    assert cost(fast, off).time_s > cost(slow, off).time_s


def test_stores_narrower_than_a_sector_are_charged() -> None:
    # run 8 (H100): rotary_attention's two-kernel designs differ only in how the first kernel stores rotated K
    # transposed (2 MB in 16-, 8- or 4-byte rows): 34.5 / 36.7 / 41.5 us. Hardware.sector_write_exponent orders them
    # so, and the one-kernel design (30.8 us, models.json) is back among the 6 best estimated of the candidate file
    # (it had fallen to 7th: the re-rank left it out of the 6 the GPU profiles).
    import dataclasses
    import json

    from verimirage.ir.graph import MuGraph, node_list
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.cost import H100

    def store_run(mg: MuGraph) -> int:
        first = next(n for n in node_list(mg) if n.op == "custom")
        bg = first.attr("block")
        return bg.type_of(bg.outputs[0]).shape[-1] * 2

    # (the two-kernel designs with 64-key tiles: their attention kernels are the same)
    entries = [e for e in _run8("rotary_attention") if e["kernels"] == 2 and "frange=16, grid=(16, 16)" in e["mugraph"]]
    two = {store_run(MuGraph.parse(e["mugraph"])): e for e in entries}
    assert sorted(two) == [4, 8, 16], sorted(two)
    meas = [two[r]["measured_us"] for r in (16, 8, 4)]
    assert meas == sorted(meas)
    est = [cost(MuGraph.parse(two[r]["mugraph"])).time_s for r in (16, 8, 4)]
    assert est == sorted(est) and est[2] > 1.2 * est[0]
    off = dataclasses.replace(H100, sector_write_exponent=0.0)
    assert cost(MuGraph.parse(two[4]["mugraph"]), off).time_s <= cost(MuGraph.parse(two[16]["mugraph"]), off).time_s
    cands = json.loads((ROOT / "benchmarks" / "candidates_models" / "rotary_attention.json").read_text())["candidates"]
    # (the fastest one-kernel design; re-measured with codegen 18 warm, run 8's two-kernel designs ran faster:
    # 19.4 us against 25.2, H100 2026-11-27 19:29 UTC, benchmarks/results/models20_2026-11-27)
    one = min((e for e in _doc()["entries"] if e["case"] == "rotary_attention" and e["kernels"] == 1),
              key=lambda e: e["measured_us"])
    # (the candidate file holds the online softmax floored since red team 17: the measured design in that form)
    from verimirage.rewrite.floor import floor_running_maxes

    floored = str(floor_running_maxes(MuGraph.parse(one["mugraph"])))
    assert floored != one["mugraph"]
    assert floored in [c["mugraph"] for c in cands[:6]]
    ranked = sorted(cands, key=lambda c: cost(MuGraph.parse(c["mugraph"])).time_s)
    assert floored in [c["mugraph"] for c in ranked[:6]]


def test_tiles_held_in_registers() -> None:
    # run 10 (H100): logsumexp_prefill's designs with 128 KB of fp32 row a block ran 57.8-61.8 us, 8192 blocks of
    # 1 x 8,000 47.2; run 16 (the probe): cross_entropy_prefill's 2048 x 2 blocks of two 1 x 16,000 tiles (the
    # default then) 119.1 us at best, 2048 x 4 blocks of 1 x 8,000 96.7. Hardware.register_file and
    # stream_exposure rank the fast ones first (the cross-entropy one was ranked fourth, behind all three others)
    import dataclasses
    import sys

    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.cost import H100

    for case in ("logsumexp_prefill", "cross_entropy_prefill"):
        entries = [e for e in _doc()["entries"] if e["case"] == case]
        assert len(entries) >= 3, case
        first = min(entries, key=lambda e: cost(MuGraph.parse(e["mugraph"])).time_s)
        assert first["measured_us"] == min(e["measured_us"] for e in entries), case
    ce = [e for e in _doc()["entries"] if e["case"] == "cross_entropy_prefill"]
    off = dataclasses.replace(H100, stream_exposure=0.0)
    first_off = min(ce, key=lambda e: cost(MuGraph.parse(e["mugraph"]), off).time_s)
    assert first_off["measured_us"] > 1.1 * min(e["measured_us"] for e in ce)
    # the probe (run 15): batchnorm_relu's whole 3136-column rows, padded to 4096 lanes and masked, 38.5 us against
    # 39.1 for 64-wide tiles: the padding moves no bytes (the model charged it 1.55x: 60.8 us against 39.1)
    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    from bn_rows_ab import variant

    whole = cost(MuGraph.parse(variant(1, 8, 3136)))
    narrow = cost(MuGraph.parse(variant(32, 8, 64)))
    assert whole.time_s < 1.05 * narrow.time_s
    assert whole.kernels[0].mem_s < 1.05 * narrow.kernels[0].mem_s


def test_short_rows_of_streaming_kernels_pay_a_page() -> None:
    # run 16 (H100): batchnorm_relu's 64-column tiles (256 rows of 128 bytes a block) 38.8-39.1 us in either launch
    # order and at 4 or 8 warps; a flat kernel over the same bytes (2-8 KB contiguous a block) 35.9-36.1, Inductor's
    # 36.3. Hardware.page ranks tiles of whole 3,136-column rows (6 KB runs; the padding masked) ahead of them, and
    # leaves products alone (their K loops walk 128-byte weight rows in step: qkv_bias at 98% of the copy rate)
    import dataclasses
    import json

    from verimirage.ir.graph import MuGraph
    from verimirage.pipeline.pricing import cost
    from verimirage.rewrite.cost import H100

    sys.path.insert(0, str(ROOT / "benchmarks" / "perf"))
    from bn_rows_ab import variant

    rows, narrow = MuGraph.parse(variant(1, 2, 3136)), MuGraph.parse(variant(32, 8, 64))
    # (as their tiles run; the backend now launches both flat, test_cost_pipeline.py)
    tiled = dataclasses.replace(H100, flat_elementwise=False)
    assert cost(rows, tiled).time_s < cost(narrow, tiled).time_s
    off = dataclasses.replace(tiled, page_exponent=0.0)
    assert cost(rows, off).time_s == cost(rows, tiled).time_s
    assert cost(narrow, tiled).time_s > 1.05 * cost(narrow, off).time_s
    qkv = json.loads((ROOT / "benchmarks" / "candidates_models" / "qkv_bias.json").read_text())["candidates"][0]
    mg = MuGraph.parse(qkv["mugraph"])
    assert cost(mg).time_s == cost(mg, off).time_s


def test_pipeline_fill_is_chosen_leaving_each_program_out() -> None:
    # the held-out claim of Hardware.pipeline_fill: chosen for each program without that program's data (the value
    # with the best mean within-program Spearman over the other programs), 0.75 wins for every one of them against
    # no fill, and the within-program figure taken so is well above the model without it (0.682)
    from verimirage.rewrite.cost import H100

    doc = _doc()
    held = calibrate_cost.lopo(doc["entries"], {}, "pipeline_fill", [0.0, H100.pipeline_fill])
    assert set(held["chosen"].values()) == {H100.pipeline_fill}
    assert held["dataset"]["within_mean"] >= 0.77, held["dataset"]


def _sweep() -> dict:
    return json.loads(calibrate_cost.SWEEP_DATASET.read_text())


def test_sweep_dataset_is_todays_committed_candidates() -> None:
    # rebuilt by calibrate_cost.py --regen from one device sweep (benchmarks/calibration_sweep.sh, H100 2026-11-27
    # 22:10 UTC): every entry is a candidate of the committed candidate files, its estimate there the one recorded
    import verimirage as vm

    doc = _sweep()
    assert {e["case"] for e in doc["entries"]} == set(vm.benchmarks.model_names())
    assert len(doc["entries"]) >= 150 and set(doc["sets"]) == {"suite", "plans"}
    for e in doc["entries"][:40]:
        cands = json.loads((ROOT / calibrate_cost.CANDS / f"{e['case']}.json").read_text())["candidates"]
        assert cands[e["rank"]]["mugraph"] == e["mugraph"]
        assert abs(cands[e["rank"]]["cost_us"] - e["run_est_us"]) < 1e-6


def test_sweep_figures_hold() -> None:
    # the models set's pooled and within-program Spearman, and every set's first-ranked candidate's measured time over
    # the best (models, the suite, 44 sampled capture-plan entries), at least what the model reached when the file
    # was written (main's model before: 0.939 / 0.748, first/best models 1.036, suite 1.061, plans 1.072)
    doc = _sweep()
    rep = calibrate_cost.report(doc["entries"], calibrate_cost.estimate(doc["entries"]))
    assert rep["pooled"] >= doc["spearman_floor"] >= 0.95, rep["pooled"]
    assert rep["within_mean"] >= doc["within_floor"] >= 0.755, rep["within_mean"]
    assert rep["first_over_best_geomean"] <= doc["first_over_best"]["models"] <= 1.025
    for name, entries in doc["sets"].items():
        r = calibrate_cost.report(entries, calibrate_cost.estimate(entries))
        assert r["first_over_best_geomean"] <= doc["first_over_best"][name], (name, r["first_over_best_geomean"])
    assert doc["first_over_best"]["suite"] <= 1.04 and doc["first_over_best"]["plans"] <= 1.066


def test_sweep_first_choices() -> None:
    # today's kernels (the sweep): rotary_attention's two-kernel design of 64-row attention tiles (19.3 us) first, not
    # the one-kernel design of 128-row tiles (25.5, first on main: Hardware.chained_rows); the suite's mqa_bs1 keeps
    # its fastest first (128 blocks of 64 rows, one an SM); lora_bs8's 64-row (wgmma) products first, not the 32-row
    # mma.sync ones (5.3-5.7 us against 3.1-3.4, 1.69x on main: Hardware.mma_sync_slowdown)
    doc = _sweep()
    sets = {"models": doc["entries"], **doc["sets"]}

    def first_over_best(name: str, case: str) -> float:
        es = [e for e in sets[name] if e["case"] == case]
        return float(calibrate_cost.report(es, calibrate_cost.estimate(es))["per_program"][case]["first_over_best"])

    assert first_over_best("models", "rotary_attention") == 1.0
    assert first_over_best("suite", "mqa_bs1") == 1.0
    assert first_over_best("suite", "lora_bs8") <= 1.1
