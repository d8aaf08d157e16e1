#!/usr/bin/env bash
# The corpus on a GPU through backend="verimirage" (issue 20), one device call: forward timings, then training
# steps in a second process (a watchdog dumps every thread's stack every 30 s of one module into
# faulthandler.txt, so a hang shows where). Searches come from a plan made on a CPU (the device has no egglog):
#   python benchmarks/corpus_capture.py <names> --make-plan benchmarks/results/capture/plan_medium_fp16.json
# Usage (device): source benchmarks/device_env.sh && bash benchmarks/corpus_gpu.sh "$OUT"
set -u
out=${1:?output folder}
plan=benchmarks/results/capture/plan_medium_fp16.json
fwd=${FWD:-swiglu,mlp_gelu_tanh,mlp_gelu,rmsnorm_linear,llama_rmsnorm_linear,layernorm_linear,softmax_head,sdpa_causal,mlp_relu,mlp_silu,geglu}
train=${TRAIN:-mlp_relu,layernorm_linear,mlp_leaky_relu,swiglu}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
timeout "${FWD_S:-100}" python benchmarks/corpus_capture.py "$fwd" --gpu-run "$out/forward" --plan "$plan" \
  --dims medium --deadline "${FWD_DEADLINE:-75}" > "$out/forward.log" 2>&1
echo "exit $?" >> "$out/forward.log"
timeout "${TRAIN_S:-90}" python benchmarks/corpus_capture.py "" --train-names "$train" --gpu-run "$out/train" \
  --plan "$plan" --dims medium --deadline "${TRAIN_DEADLINE:-50}" > "$out/train.log" 2>&1
echo "exit $?" >> "$out/train.log"
tail -n 5 "$out/forward.log" "$out/train.log"
