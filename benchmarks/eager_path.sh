#!/usr/bin/env bash
# On the GPU machine, from the repository root: the GPU tests of the eager path, then the measurement of the
# suite (benchmarks/eager_path.py, torch.compile included) into $OUT/suite and of the models set (plain and graph
# fields, no torch.compile) into $OUT/models. Usage: bash benchmarks/eager_path.sh [ARGS for both sets...]
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} VERIMIRAGE_CACHE_DIR=/tmp/vmcache
(nproc; lscpu | grep -i "model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
 python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)") 2>&1 \
  | tee "$OUT/host.txt"
echo "== GPU tests"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_eager_path.py 2>&1 | tail -30 | tee "$OUT/tests.txt"
echo "== measurement: suite"
mkdir -p "$OUT/suite" "$OUT/models"
python3 benchmarks/eager_path.py --out "$OUT/suite" --budget-s 200 "$@" > "$OUT/log.txt" 2>&1
rc=$?
echo "== measurement: models set"
python3 benchmarks/eager_path.py --set models --no-inductor --out "$OUT/models" "$@" >> "$OUT/log.txt" 2>&1
rc2=$?
grep -E " (WARNING|ERROR) |Traceback|Error" "$OUT/log.txt" | tail -20
cat "$OUT/suite/eager_path.md" "$OUT/models/eager_path.md" 2>/dev/null | cut -c1-400
exit $(( rc || rc2 ))
