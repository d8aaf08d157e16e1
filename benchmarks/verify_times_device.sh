#!/usr/bin/env bash
# Time vm.verify (python benchmarks/verify_perf.py) on the GPU machine's host CPU, with z3 carried as a wheel in .whl/
# (benchmarks/results/verify_times_device.md says how to fetch it). Writes under $OUT.
# Usage: bash benchmarks/verify_times_device.sh [NAMES] [BATCH]
set -u
names=${1:-gqa,mqa,qknorm_gqa,gqa_stable,mha,mha_stable,gated_mlp,rmsnorm_linear,lora}
batch=${2:-8}
source benchmarks/device_env.sh
(nproc; lscpu | grep -i "model name"; python3 -c "import numpy; print('numpy', numpy.__version__)") > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
echo "== default threads (usable cores; <= 4 trials at once, the cores left split each trial's big products)"
python3 benchmarks/verify_perf.py "$names" "$batch" 3 2>&1 | tee "$OUT/perf_default.txt"
for t in 1 2 4; do
  echo "== VERIMIRAGE_FF_THREADS=$t: gqa"
  VERIMIRAGE_FF_THREADS=$t python3 benchmarks/verify_perf.py gqa "$batch" 3 2>&1 | tee "$OUT/perf_gqa_t$t.txt"
done
