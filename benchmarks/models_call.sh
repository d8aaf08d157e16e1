#!/usr/bin/env bash
# One device call for issue 22's figures (run from the repository root on the GPU machine; writes under $OUT):
# first the GPU regression tests of the miscompiles code generation avoids (a failure is printed, and the run goes
# on so the figures still come back), then the whole models set with the harness's settings of the recorded runs.
#   bash benchmarks/models_call.sh [extra bench.py args]
# Carry .whl (z3 + egglog: the GPU tests' files import the search) or the tests fail to collect; the bench needs neither.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -f .whl/site.tar.xz ] && source benchmarks/device_env.sh
mkdir -p "$OUT/models"
date -u +"start %FT%TZ"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_backend_tuning.py tests/test_split_pass.py \
  "tests/test_pipelined_reduction.py::test_norm_matmul_gave_wrong_rows_on_the_gpu_under_pipelining" 2>&1 \
  | tail -6 | tee "$OUT/models/gpu_tests.txt"
python3 benchmarks/bench.py --set models --candidates benchmarks/candidates_models --top-k 6 --configs 2 \
  --configs-no-matmul 1 --prewarm 14 --rep-ms 50 --select-rep-ms 10 --budget-s "${BUDGET_S:-470}" --inductor-alone \
  --out "$OUT/models" "$@" > "$OUT/models/log.txt" 2>&1
tail -45 "$OUT/models/log.txt"
date -u +"end %FT%TZ"
