#!/usr/bin/env bash
# models20 (twentieth session), one device call: (a) the A/B of models20_ab.py (PDL_EARLY_OWN_MAX_BLOCKS 0 vs 64 under
# PDL auto; EARLY_CAST_BESIDE_CARRIED off vs on, PDL off), interleaved rounds in one process; (b) the cost
# calibration's stale rows (calibrate_cost.py --export) re-measured by bench.py under their sources' conditions
# (warm inputs, PDL off, 3 configurations for programs with a product, 1 otherwise), no torch.compile baseline.
set -u
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=benchmarks/results/models20_2026-11-27
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > "$OUT/start.txt"
timeout 115 python3 benchmarks/perf/models20_ab.py run $R/ab_in.json --out "$OUT/ab" --rounds 3 --rep-ms 30 \
  > "$OUT/ab.log" 2>&1
echo "ab rc=$? at $(( $(date +%s) - T0 )) s"
grep '^{' "$OUT/ab.log" | cut -c1-400
LEFT=$(( 292 - ($(date +%s) - T0) ))
CASES=$(ls $R/stale_cands/warm_pdl_off | sed 's/\.json$//' | tr '\n' ' ')
timeout $LEFT python3 benchmarks/bench.py --set models --candidates $R/stale_cands/warm_pdl_off --cases $CASES \
  --no-rotate --pdl off --top-k 99 --configs 3 --configs-no-matmul 1 --prewarm 15 --rep-ms 20 --select-rep-ms 10 \
  --no-inductor --budget-s $(( LEFT - 30 )) --out "$OUT/calib" > "$OUT/calib.log" 2>&1
echo "calib rc=$? at $(( $(date +%s) - T0 )) s"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "calib", "models.json")))
print("rows", len(d["rows"]), "not_run", d.get("not_run"), "prewarm_s", d.get("prewarm_s"))
for r in d["rows"]:
    m = [c["measured_us"] for c in r.get("cost_vs_measured", [])]
    print(r["case"], r.get("num_candidates"), "measured", sum(x is not None for x in m), round(r.get("wall_s", 0), 1),
          r.get("verimirage_error", "")[:100])
PY
date -u >> "$OUT/start.txt"
