#!/usr/bin/env bash
# The cost model's calibration sweep: one device call (an H100) that times every committed candidate of the models
# set and of the suite, and the designs of sampled capture-plan entries. Run from the repository root on the device:
#
#     OUT=/some/dir bash benchmarks/calibration_sweep.sh [PLAN_ITEMS.json] [SECONDS]
#
# then, on the CPU, with $OUT copied under benchmarks/results/ (its suite/latest.json too: bench.py logs each suite row,
# should the file not come back), `python benchmarks/calibrate_cost.py --regen DIR --plan-items PLAN_ITEMS.json`
# rebuilds benchmarks/results/cost_calibration_sweep.json from those measurements and the committed candidate files
# (benchmarks/calibrate_cost.py's docstring). Every candidate is timed at its default launch configuration
# (tuning.recommend's, what vm.compile launches unprofiled), warm inputs (the suite's and the dataset's condition), PDL
# off, CUDA-graph medians (bench.py); no torch.compile baselines. PLAN_ITEMS (benchmarks/perf/plan_rank.py prepare's
# output, or a sample of your own) adds the capture plans' designs (rotated inputs, plan_rank.py's method). SECONDS
# (default 270) bounds the whole call: each step gets a share and starts nothing past it.
set -u
T0=$(date +%s)
TOTAL=${2:-270}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
left() { echo $(( TOTAL - ($(date +%s) - T0) )); }
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > "$OUT/start.txt"
COMMON="--top-k 99 --configs 1 --prewarm 15 --rep-ms 20 --select-rep-ms 10 --no-inductor --pdl off --no-rotate"
B=$(( TOTAL * 38 / 100 ))
timeout $B python3 benchmarks/bench.py --set models --candidates benchmarks/candidates_models $COMMON \
  --budget-s $(( B - 20 )) --out "$OUT/models" > "$OUT/models.log" 2>&1
echo "models rc=$? at $(( $(date +%s) - T0 )) s"
if [ -n "${1:-}" ]; then
  B=$(( $(left) * 50 / 100 ))
  timeout $B python3 benchmarks/perf/plan_rank.py run "$1" --out "$OUT/plans" --rounds 2 --rep-ms 10 --prewarm 15 \
    --budget-s $(( B - 15 )) > "$OUT/plans.log" 2>&1
  echo "plans rc=$? at $(( $(date +%s) - T0 )) s"
fi
B=$(( $(left) - 5 ))
timeout $B python3 benchmarks/bench.py --set suite --candidates benchmarks/candidates $COMMON \
  --budget-s $(( B - 20 )) --out "$OUT/suite" > "$OUT/suite.log" 2>&1
echo "suite rc=$? at $(( $(date +%s) - T0 )) s"
date -u >> "$OUT/start.txt"
