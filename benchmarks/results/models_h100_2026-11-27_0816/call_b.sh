#!/usr/bin/env bash
# Lead's second call (session 16): the capture-counters GPU test with the last-block rules asked for; if it passes,
# the rules on in this copy (08:16 A/B: lora_scaled lb 15.48 us against 16.49); then lora_scaled and bias_attention
# (both at the 70% line; the 08:16 whole-set run stopped before lora); then the bs1 layer's new candidate 0.
set -u
mkdir -p "$OUT"
cp .carry/lead/test_capture_counters.py tests/
python3 -m pytest -q -p no:cacheprovider tests/test_capture_counters.py > "$OUT/counters_test.txt" 2>&1
t=$?
tail -3 "$OUT/counters_test.txt"
if [ "$t" = 0 ]; then
  sed -i 's/^PDL_START_BEFORE_EARLY_LOOP = False/PDL_START_BEFORE_EARLY_LOOP = True/; s/^PDL_LASTBLOCK_BEFORE_EARLY_LOOP = False/PDL_LASTBLOCK_BEFORE_EARLY_LOOP = True/' verimirage/backend/codegen.py
fi
grep -n "^PDL_START_BEFORE_EARLY_LOOP\|^PDL_LASTBLOCK_BEFORE_EARLY_LOOP" verimirage/backend/codegen.py | tee "$OUT/flip.txt"
python3 benchmarks/bench.py --set models --cases lora_scaled bias_attention --candidates benchmarks/candidates_models \
  --top-k 6 --configs 2 --configs-no-matmul 1 --prewarm 14 --rep-ms 50 --select-rep-ms 10 --budget-s 200 \
  --inductor-alone --out "$OUT/models" > "$OUT/models.log" 2>&1
tail -14 "$OUT/models.log"
git checkout -q verimirage/backend/codegen.py
timeout 200 python3 benchmarks/layer.py gpu --cases decode_bs1 --top-k 1 --no-per-op --merge both --inductor-repeats 2 \
  --out "$OUT/layer" > "$OUT/layer.log" 2>&1
tail -12 "$OUT/layer.log"
