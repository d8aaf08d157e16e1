#!/usr/bin/env bash
# models20, third device call: the capture plans' design order against measured times (benchmarks/perf/plan_rank.py;
# 22 sampled entries of plan_decode / plan_medium, their first 3 designs, default configurations, PDL off).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=benchmarks/results/models20_2026-11-27
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > "$OUT/start.txt"
timeout 165 python3 benchmarks/perf/plan_rank.py run $R/plan_rank_in.json --out "$OUT/rank" --rounds 3 --rep-ms 20 \
  > "$OUT/rank.log" 2>&1
echo "rank rc=$?"
grep '^{' "$OUT/rank.log" | cut -c1-300
date -u >> "$OUT/start.txt"
