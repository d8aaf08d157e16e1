#!/usr/bin/env bash
# Lead's models call (session 17): the pipelining regression test on the GPU, then the whole models set.
set -u
mkdir -p "$OUT"
date -u > "$OUT/start.txt"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_pipelined_reduction.py -k "wrong_rows_on_the_gpu" > "$OUT/gpu_test.txt" 2>&1
tail -2 "$OUT/gpu_test.txt"
python3 benchmarks/bench.py --set models --candidates benchmarks/candidates_models --top-k 6 --configs 2 \
  --configs-no-matmul 1 --prewarm 14 --rep-ms 50 --select-rep-ms 10 --budget-s "${BUDGET_S:-470}" --inductor-alone \
  --out "$OUT/models" > "$OUT/models.log" 2>&1
tail -45 "$OUT/models.log"
date -u >> "$OUT/start.txt"
