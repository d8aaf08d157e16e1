#!/usr/bin/env bash
# The corpus on a GPU through backend="verimirage" (issue 20), one device call of at most ~500 s: the GPU tests of
# the capture and of the parallel kernel compile, then per module (CUDA-graph replays, medians; every variant checked
# against a float64 copy of the module): eager, torch.compile default, torch.compile max-autotune (without its own
# CUDA graphs: every variant is replayed as one), and backend="verimirage" (Inductor fallback, profile on: each
# partition timed against Inductor's code for it and each captured graph against Inductor's code for the whole graph,
# the faster kept; with MAXFB=1 also with max-autotune as the fallback), forward (no grad) for FWD at DIMS, then a
# training step (forward + backward of out.float().sum(), captured as one CUDA graph) for TRAIN at TRAIN_DIMS. A watchdog
# dumps every thread's stack every 30 s of one module into faulthandler_*.txt (removed when nothing hung); each stage
# stops starting modules at its deadline and is killed at its timeout, so the call ends in time and what ran comes
# back. Searches come from a plan made on a CPU (the device has no egglog); a partition not in the plan runs the
# lifted graph itself (one kernel per op), which the profile keeps only where it beats Inductor:
#   python benchmarks/corpus_capture.py all --make-plan benchmarks/results/capture/plan_<dims>_fp16.json --dims <dims>
# Usage (device): source benchmarks/device_env.sh && bash benchmarks/corpus_gpu.sh "$OUT"
# Defaults: DIMS=decode (8 x 1 x 1024: where fusing saves memory passes), FWD = all 30 modules, CANDIDATES=2 (verified
# candidates a partition's profile compiles and times: fewer than the backend's 4, so more modules fit), TRAIN_DIMS=medium
# (4 x 128 x 512), TRAIN = 6 modules (MLPs, RMSNorm, SDPA causal / masked: CUDA flash / memory-efficient attention).
# Writes run.log, <dims>/{forward.jsonl,table.md}, <train dims>/{train.jsonl,table.md} (meta.json is made for the
# tables and removed: the device returns at most 8 files, and every row holds the device, date and versions).
# Tables again: python benchmarks/corpus_capture.py --table <folder>
set -u
out=${1:?output folder}
dims=${DIMS:-decode}
# every corpus module, the most different first (the forward stage's deadline cuts the tail, not a kind of module)
fwd=${FWD:-mlp_relu,swiglu,rmsnorm_linear,layernorm_linear,softmax_head,sdpa_causal,sdpa_mask,hand_attention,\
llama_block,gpt2_block,encoder_layer,cross_entropy,softcap_logits,rotary_attention,qk_norm_attention,gqa_expand,\
mlp_gelu,geglu,residual_mlp,lora,llama_rmsnorm_linear,max_normalize,sdpa,gqa_repeat_interleave,mlp_silu,\
mlp_gelu_tanh,mlp_sigmoid,mlp_tanh,mlp_leaky_relu,mlp_relu_3d}
cands=${CANDIDATES:-2}
train=${TRAIN:-mlp_relu,swiglu,rmsnorm_linear,mlp_gelu,sdpa_causal,sdpa_mask}
tdims=${TRAIN_DIMS:-medium}
fwd_s=${FWD_S:-290}
train_s=${TRAIN_S:-130}
maxfb=()
[ "${MAXFB:-0}" = 1 ] && maxfb=(--max-fallback)
mkdir -p "$out/$dims" "$out/$tdims"
log="$out/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$log" 2>&1
echo "=== gpu tests" >> "$log"
timeout "${TEST_S:-60}" python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py \
  tests/test_capture.py >> "$log" 2>&1
echo "exit $?" >> "$log"
plan="benchmarks/results/capture/plan_${dims}_fp16.json"
echo "=== forward $dims" >> "$log"
timeout "$fwd_s" python benchmarks/corpus_capture.py "$fwd" --gpu-run "$out/$dims" --plan "$plan" --dims "$dims" \
  --deadline "$(( fwd_s - 45 ))" --candidates "$cands" "${maxfb[@]}" >> "$log" 2>&1
echo "exit $?" >> "$log"
if [ -n "$train" ]; then
  echo "=== train $tdims" >> "$log"
  timeout "$train_s" python benchmarks/corpus_capture.py "" --train-names "$train" --gpu-run "$out/$tdims" \
    --plan "benchmarks/results/capture/plan_${tdims}_fp16.json" --dims "$tdims" --deadline "$(( train_s - 50 ))" \
    --candidates "$cands" >> "$log" 2>&1
  echo "exit $?" >> "$log"
fi
for f in "$out"/*/faulthandler_*.txt; do
  grep -q "Thread\|Current thread" "$f" 2>/dev/null || rm -f "$f"
done
for d in $(printf '%s\n' "$dims" "$tdims" | sort -u); do
  python benchmarks/corpus_capture.py --table "$out/$d" > "$out/$d/table.md" 2>&1
done
rm -f "$out"/*/meta.json  # (in every row too) at most 8 files come back from the device
grep -E "passed|failed|exit" "$log" | tail -n 8
cat "$out/$dims/table.md" | head -c 5000
[ "$tdims" != "$dims" ] && tail -c 2500 "$out/$tdims/table.md"
exit 0
