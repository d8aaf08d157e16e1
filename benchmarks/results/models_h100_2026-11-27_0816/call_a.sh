#!/usr/bin/env bash
# Lead's final models call (session 16): the capture-counters GPU test, lora's last-block A/B, then the whole models
# set; the last-block rules (codegen.PDL_LASTBLOCK_BEFORE_EARLY_LOOP / PDL_START_BEFORE_EARLY_LOOP) are switched on
# in this copy only if the test passed and lb beats "now" by 0.2 us or more.
set -u
mkdir -p "$OUT"
python3 -m pytest -q -p no:cacheprovider tests/test_capture_counters.py > "$OUT/counters_test.txt" 2>&1
t=$?
tail -3 "$OUT/counters_test.txt"
python3 benchmarks/perf/pdl_models_ab.py --cases lora_scaled --variants main now lb lb_nofill --rounds 6 --out "$OUT/ab" > "$OUT/ab.log" 2>&1
tail -8 "$OUT/ab.log"
flip=$(python3 - "$t" <<'PY'
import json, os, sys
try:
    v = json.load(open(os.environ["OUT"] + "/ab/pdl_models_ab.json"))["rows"][0]["variants"]
    ok = sys.argv[1] == "0" and "us" in v["lb"] and v["lb"]["us"] <= v["now"]["us"] - 0.2
    print("yes" if ok else "no")
except Exception as e:
    print("no")
PY
)
echo "flip last-block rules: $flip" | tee "$OUT/flip.txt"
if [ "$flip" = yes ]; then
  sed -i 's/^PDL_START_BEFORE_EARLY_LOOP = False/PDL_START_BEFORE_EARLY_LOOP = True/; s/^PDL_LASTBLOCK_BEFORE_EARLY_LOOP = False/PDL_LASTBLOCK_BEFORE_EARLY_LOOP = True/' verimirage/backend/codegen.py
  grep -n "^PDL_START_BEFORE_EARLY_LOOP\|^PDL_LASTBLOCK_BEFORE_EARLY_LOOP" verimirage/backend/codegen.py | tee -a "$OUT/flip.txt"
fi
python3 benchmarks/bench.py --set models --candidates benchmarks/candidates_models --top-k 6 --configs 2 \
  --configs-no-matmul 1 --prewarm 14 --rep-ms 50 --select-rep-ms 10 --budget-s "${BUDGET_S:-430}" --inductor-alone \
  --out "$OUT/models" > "$OUT/models.log" 2>&1
tail -40 "$OUT/models.log"
