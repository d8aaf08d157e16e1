#!/usr/bin/env bash
# models20, second device call: the four rotary_attention calibration rows whose kernels the first call measured under
# the first form of EARLY_CAST_BESIDE_CARRIED (no accumulator counted as carried), re-measured with the landed code
# (codegen 18) under their sources' conditions (warm inputs, PDL off, 3 configurations).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=benchmarks/results/models20_2026-11-27
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > "$OUT/start.txt"
timeout 150 python3 benchmarks/bench.py --set models --candidates $R/stale_cands2/warm_pdl_off --cases rotary_attention \
  --no-rotate --pdl off --top-k 99 --configs 3 --configs-no-matmul 1 --prewarm 12 --rep-ms 20 --select-rep-ms 10 \
  --no-inductor --out "$OUT/calib" > "$OUT/calib.log" 2>&1
echo "calib rc=$?"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "calib", "models.json")))
for r in d["rows"]:
    print(r["case"], [(c["rank"], c["kernels"], round(c["cost_us"], 2), c["measured_us"]) for c in r["cost_vs_measured"]])
PY
date -u >> "$OUT/start.txt"
