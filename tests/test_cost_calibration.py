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


def test_spearman_ranks_ties_and_order() -> None:
    assert calibrate_cost.spearman([1, 2, 3], [10, 20, 30]) == 1.0
    assert calibrate_cost.spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert calibrate_cost.spearman([1, 1, 1], [1, 2, 3]) is None
    assert abs(calibrate_cost.spearman([1, 1, 2, 3], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-12
