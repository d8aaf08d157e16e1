#!/usr/bin/env bash
# The corpus on a GPU through backend="verimirage" (issue 20), one device call: the GPU tests of the parallel
# kernel compile, forward timings at each of DIMS (CUDA-graph replays; eager, torch.compile default and
# max-autotune, verimirage with the Inductor fallback and, with MAXFB=1, with max-autotune as the fallback),
# then training steps at TRAIN_DIMS (a watchdog dumps every thread's stack every 30 s of one module into
# faulthandler_*.txt, so a hang shows where; removed when nothing hung). Searches come from plans made on a CPU
# (the device has no egglog):
#   python benchmarks/corpus_capture.py <names> --make-plan benchmarks/results/capture/plan_<dims>_fp16.json --dims <dims>
# Usage (device): source benchmarks/device_env.sh && bash benchmarks/corpus_gpu.sh "$OUT"
# Writes run.log and, per dims, <dims>/meta.json, <dims>/forward.jsonl (<dims>/train.jsonl for TRAIN_DIMS).
# Tables: python benchmarks/corpus_capture.py --table <folder>
set -u
out=${1:?output folder}
dims_list=${DIMS:-decode large}
fwd_decode=${FWD_DECODE:-rmsnorm_linear,swiglu,mlp_gelu,layernorm_linear,mlp_silu,llama_rmsnorm_linear,mlp_relu}
fwd_large=${FWD_LARGE:-hand_attention,mlp_gelu}
s_decode=${S_DECODE:-200}
s_large=${S_LARGE:-150}
train=${TRAIN:-mlp_relu,swiglu}
train_dims=${TRAIN_DIMS:-decode}
maxfb=()
[ "${MAXFB:-0}" = 1 ] && maxfb=(--max-fallback)
mkdir -p "$out"
log="$out/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$log" 2>&1
echo "=== gpu tests" >> "$log"
timeout "${TEST_S:-45}" python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py >> "$log" 2>&1
echo "exit $?" >> "$log"
last=""
for d in $dims_list; do
  last=$d
  var="fwd_$d"
  lim="s_$d"
  echo "=== forward $d" >> "$log"
  timeout "${!lim}" python benchmarks/corpus_capture.py "${!var}" --gpu-run "$out/$d" \
    --plan "benchmarks/results/capture/plan_${d}_fp16.json" --dims "$d" --deadline "$(( ${!lim} - 40 ))" \
    "${maxfb[@]}" >> "$log" 2>&1
  echo "exit $?" >> "$log"
done
if [ -n "$train" ]; then
  echo "=== train $train_dims" >> "$log"
  timeout "${TRAIN_S:-80}" python benchmarks/corpus_capture.py "" --train-names "$train" --gpu-run "$out/$train_dims" \
    --plan "benchmarks/results/capture/plan_${train_dims}_fp16.json" --dims "$train_dims" \
    --deadline "${TRAIN_DEADLINE:-45}" >> "$log" 2>&1
  echo "exit $?" >> "$log"
fi
for f in "$out"/*/faulthandler_*.txt; do
  grep -q "Thread\|Current thread" "$f" 2>/dev/null || rm -f "$f"
done
grep -E "passed|failed|exit" "$log" | tail -n 8
for d in $dims_list; do python benchmarks/corpus_capture.py --table "$out/$d" 2>&1 | head -n 30; done
