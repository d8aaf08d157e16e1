#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU tests of the eager path, then the measurement
# (benchmarks/eager_path.py ARGS). Writes under $OUT. Usage: bash benchmarks/eager_path.sh [ARGS...]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VERIMIRAGE_CACHE_DIR=/tmp/vmcache
(nproc; lscpu | grep -i "model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
 python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)") 2>&1 \
  | tee "$OUT/host.txt"
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider -m "gpu or slow" tests/test_eager_path.py 2>&1 | tail -30 | tee "$OUT/tests.txt"
echo "== measurement"
python3 benchmarks/eager_path.py --out "$OUT" "$@" > "$OUT/log.txt" 2>&1
rc=$?
grep -v " INFO " "$OUT/log.txt" | tail -60
exit $rc
