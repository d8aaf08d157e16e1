#!/usr/bin/env bash
# On the GPU machine: the GPU tests of tests/test_verify_ff_gpu.py, then `python benchmarks/verify_perf.py` with the
# default $VERIMIRAGE_FF_DEVICE (auto) in a process that has started CUDA first (as a profiling search does), with
# any CUDA-context warning from the trials' worker threads shown. z3 carried in .whl/. Writes under $OUT.
# Usage: bash benchmarks/verify_auto_gpu.sh [NAMES] [BATCH]
set -u
names=${1:-gqa,mqa}
batch=${2:-8}
source benchmarks/device_env.sh
unset VERIMIRAGE_FF_DEVICE
python3 -m pytest -q -p no:cacheprovider tests/test_verify_ff_gpu.py 2>&1 | tail -4 | tee "$OUT/tests.txt"
python3 -W always -c "
import sys, torch
torch.cuda.init()
sys.path.insert(0, 'benchmarks')
import verify_perf
verify_perf.main(['$names', '$batch', '3'])" > "$OUT/perf_auto.txt" 2> "$OUT/perf_auto.err"
cat "$OUT/perf_auto.txt"
echo "== stderr:"; cat "$OUT/perf_auto.err"
