#!/usr/bin/env bash
# vm.verify on the GPU machine with the finite-field test's big products on the GPU ($VERIMIRAGE_FF_DEVICE=cuda)
# and on its host CPU (=cpu), in one run; z3 carried as a wheel in .whl/ (see benchmarks/results/verify_times_device.md).
# Runs the GPU tests of tests/test_verify_ff_gpu.py first. Writes under $OUT.
# Usage: bash benchmarks/verify_times_gpu.sh [NAMES] [BATCH]
set -u
names=${1:-gqa,mqa,qknorm_gqa,gqa_stable,mha,mha_stable,gated_mlp,rmsnorm_linear,lora}
batch=${2:-8}
source benchmarks/device_env.sh
(nproc; lscpu | grep -i "model name"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
 python3 -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__)") > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"
echo "== tests/test_verify_ff_gpu.py (every test runs its products on the GPU here)"
python3 -m pytest -q -p no:cacheprovider tests/test_verify_ff_gpu.py 2>&1 | tail -25 | tee "$OUT/tests.txt"
echo "== one GPU product, by part"
python3 benchmarks/perf/ffgpu_micro.py 2>&1 | tee "$OUT/micro.txt"
echo "== first vm.verify in a fresh process (gqa b8: imports, CUDA start-up, exp tables)"
for dev in cpu cuda; do
  VERIMIRAGE_FF_DEVICE=$dev python3 -c "
import time; t = time.perf_counter()
import verimirage as vm
g = vm.benchmarks.get('gqa', batch=$batch); m = vm.benchmarks.expert('gqa', g)
t1 = time.perf_counter(); v = vm.verify(g, m); t2 = time.perf_counter()
print('$dev', type(v).__name__, f'import+build {t1 - t:.2f} s, first verify {t2 - t1:.2f} s',
      dict(v.evidence[0].params)['products_on'])" 2>&1 | tee -a "$OUT/first.txt"
done
for dev in cuda cpu cuda; do
  echo "== VERIMIRAGE_FF_DEVICE=$dev"
  VERIMIRAGE_FF_DEVICE=$dev python3 benchmarks/verify_perf.py "$names" "$batch" 3 2>&1 | tee -a "$OUT/perf_$dev.txt"
done
echo "== timeline, products on the GPU"
VERIMIRAGE_FF_DEVICE=cuda python3 benchmarks/perf/verify_timeline.py gqa "$batch" 2>&1 | tee "$OUT/timeline_gpu.txt"
