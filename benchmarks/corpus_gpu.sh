#!/usr/bin/env bash
# The corpus on a GPU through backend="verimirage" (issue 20), in device calls of at most ~540 s each (PART=1, PART=2
# and PART=3; the stages' timeouts below add up to 470 / 500 / 520 s, plus ~10-15 s around them): per module
# (CUDA-graph replays, medians; every variant checked against a float64 copy of the module): eager, torch.compile
# default, torch.compile max-autotune (without its own CUDA graphs: every variant is replayed as one), and
# backend="verimirage" (Inductor fallback, profile on: each partition timed against Inductor's code for it and each
# captured graph against Inductor's code for the whole graph, the faster kept; with MAXFB=1 also with max-autotune
# as the fallback).
#   PART=1: the GPU tests of the capture, the plan and the parallel kernel compile (TEST_S, 60 s), then the forward
#           (no grad) of the first 13 modules at DIMS (FWD_S, 410 s; 210-225 s in the two H100 runs so far);
#   PART=2: the forward of the other 17 modules at DIMS (FWD_S, 240 s; 128 s on the H100), then a training step
#           (forward + backward of out.float().sum(), captured as one CUDA graph by PyTorch's whole-network recipe:
#           warm-up and every earlier step on the capture's side stream, gradients None before the capture) for TRAIN
#           at TRAIN_DIMS (TRAIN_S, 260 s, with WARMERS warm-up processes as PART=3);
#   PART=3: the training step of every corpus module (the six of PART=2 first) in one stage (TRAIN_S, 520 s; 383 s
#           on the H100 before the interleaved re-timing, which adds ~3 s a module), with WARMERS
#           (default 5) warm-up processes compiling every variant ahead (max-autotune's autotuning took 52-81 s of
#           a training step's ~90 s in the tenth session); this process times each warmed module alone, every GPU
#           timing of every process under one lock (corpus_capture.gpu_run); their log is <train dims>/warm.log;
#   PART=all: both in one call (more than 600 s: 30 modules took ~19 s each with the four variants).
# The training variants' CUDA graphs are re-timed in 3 interleaved rounds (corpus_capture._interleave).
# Each module runs in a worker process (corpus_capture.Worker): a worker that dies (the H100's 18:40 run ended at
# gpt2_block with a segfault, exit 139, in its own autotuning) or runs past MODULE_S (150 s forward, 240 s a training
# step) gives that module a row with "error" and the reason (in table.md under "Failed"), and the next module gets a
# new worker. A watchdog dumps every thread's stack every 30 s of one module, and at a fatal signal, into
# faulthandler_*.txt (removed when nothing hung or crashed); each stage stops starting modules at its deadline (its
# timeout - 50 s), kills and records a module still running 8 s before its timeout, and is killed at its timeout, so
# the call ends in time and what ran comes back. Searches come from a plan made on a CPU (the device has no egglog;
# made from fake-CUDA traces, the graphs a GPU sees):
#   python benchmarks/corpus_capture.py all --make-plan benchmarks/results/capture/plan_<dims>_fp16.json --dims <dims>
# and every plan μGraph is re-checked against its partition before it is served (vm.verify: needs z3, which
# benchmarks/device_env.sh installs from the carried .whl/; without it nothing from the plan is served and every
# partition runs op by op). A partition not in the plan, or whose μGraphs do not re-check, runs the lifted graph
# itself, which the profile keeps only where it beats Inductor; its lifted graph is written to misses.json for the
# next plan (python benchmarks/corpus_capture.py "" --make-plan <plan> --from-misses <misses.json> --dims <dims>).
# Usage (device, repository root, .whl carried; one device call each, timeout_s 600):
#   source benchmarks/device_env.sh && PART=1 bash benchmarks/corpus_gpu.sh "$OUT"
#   source benchmarks/device_env.sh && PART=2 bash benchmarks/corpus_gpu.sh "$OUT"
#   source benchmarks/device_env.sh && PART=3 bash benchmarks/corpus_gpu.sh "$OUT"
# Defaults: DIMS=decode (8 x 1 x 1024: where fusing saves memory passes), CANDIDATES=2 (verified candidates a
# partition's profile compiles and times: fewer than the backend's 4, so more modules fit), TRAIN_DIMS=medium
# (4 x 128 x 512), TRAIN = 6 modules (MLPs, RMSNorm, SDPA causal / masked: CUDA flash / memory-efficient attention).
# Writes run.log, <dims>/{forward.jsonl,table.md,misses.json}, <train dims>/{train.jsonl,table.md,misses.json}
# (meta.json is made for the tables and removed: the device returns at most 8 files, and every row holds the device,
# date and versions). Tables of both calls together: put both forward.jsonl files in one folder, then
#   python benchmarks/corpus_capture.py --table <folder>
set -u
out=${1:?output folder}
part=${PART:-all}
dims=${DIMS:-decode}
# every corpus module, the most different first
fwd1=mlp_relu,swiglu,rmsnorm_linear,layernorm_linear,softmax_head,sdpa_causal,sdpa_mask,hand_attention,\
llama_block,gpt2_block,encoder_layer,cross_entropy,softcap_logits
fwd2=rotary_attention,qk_norm_attention,gqa_expand,mlp_gelu,geglu,residual_mlp,lora,llama_rmsnorm_linear,\
max_normalize,sdpa,gqa_repeat_interleave,mlp_silu,mlp_gelu_tanh,mlp_sigmoid,mlp_tanh,mlp_leaky_relu,mlp_relu_3d
train_default=mlp_relu,swiglu,sdpa_causal,rmsnorm_linear,mlp_gelu,sdpa_mask
# PART=3: every corpus module's training step, the six above first
train_all=sdpa_causal,rmsnorm_linear,mlp_gelu,sdpa_mask,mlp_relu,swiglu,llama_block,gpt2_block,encoder_layer,\
cross_entropy,softcap_logits,layernorm_linear,softmax_head,hand_attention,rotary_attention,qk_norm_attention,\
gqa_expand,gqa_repeat_interleave,sdpa,geglu,residual_mlp,lora,llama_rmsnorm_linear,max_normalize,mlp_silu,\
mlp_gelu_tanh,mlp_sigmoid,mlp_tanh,mlp_leaky_relu,mlp_relu_3d
case "$part" in
  1) fwd=${FWD:-$fwd1}; train=${TRAIN-}; tests=1; fwd_s=${FWD_S:-410}; train_s=0 ;;
  2) fwd=${FWD:-$fwd2}; train=${TRAIN-$train_default}; tests=0; fwd_s=${FWD_S:-240}; train_s=${TRAIN_S:-260}
     warmers=${WARMERS:-5} ;;
  3) fwd=${FWD-}; train=${TRAIN-$train_all}; tests=0; fwd_s=0; train_s=${TRAIN_S:-520}; warmers=${WARMERS:-5} ;;
  all) fwd=${FWD:-$fwd1,$fwd2}; train=${TRAIN-$train_default}; tests=1; fwd_s=${FWD_S:-560}; train_s=${TRAIN_S:-190} ;;
  *) echo "PART=$part; expected 1, 2, 3 or all" >&2; exit 2 ;;
esac
cands=${CANDIDATES:-2}
tdims=${TRAIN_DIMS:-medium}
maxfb=()
[ "${MAXFB:-0}" = 1 ] && maxfb=(--max-fallback)
[ -n "$fwd" ] && mkdir -p "$out/$dims"
log="$out/run.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$log" 2>&1
python -c "import z3" >> "$log" 2>&1 || echo "WARNING: no z3 here: no plan μGraph can be re-checked, none is served" \
  >> "$log"
if [ "$tests" = 1 ]; then
  echo "=== gpu tests" >> "$log"
  timeout "${TEST_S:-60}" python -m pytest -q -p no:cacheprovider -m gpu tests/test_precompile.py \
    tests/test_capture.py tests/test_capture_plan.py >> "$log" 2>&1
  echo "exit $?" >> "$log"
fi
plan="benchmarks/results/capture/plan_${dims}_fp16.json"
if [ -n "$fwd" ] && [ "$fwd_s" -gt 0 ]; then
  echo "=== forward $dims (part $part)" >> "$log"
  timeout "$fwd_s" python benchmarks/corpus_capture.py "$fwd" --gpu-run "$out/$dims" --plan "$plan" --dims "$dims" \
    --deadline "$(( fwd_s - 50 ))" --limit "$fwd_s" --module-timeout "${MODULE_S:-150}" --candidates "$cands" \
    "${maxfb[@]}" >> "$log" 2>&1
  echo "exit $?" >> "$log"
fi
if [ -n "$train" ] && [ "$train_s" -gt 0 ]; then
  mkdir -p "$out/$tdims"
  echo "=== train $tdims" >> "$log"
  timeout "$train_s" python benchmarks/corpus_capture.py "" --train-names "$train" --gpu-run "$out/$tdims" \
    --plan "benchmarks/results/capture/plan_${tdims}_fp16.json" --dims "$tdims" --deadline "$(( train_s - 50 ))" \
    --limit "$train_s" --module-timeout "${MODULE_S:-240}" --candidates "$cands" --warmers "${warmers:-0}" \
    >> "$log" 2>&1
  echo "exit $?" >> "$log"
fi
# at most 8 files come back: a watchdog file is kept only where a worker crashed or a module was killed (its stacks
# then say where), the warm-ups' log only for PART=3
for f in "$out"/*/faulthandler_*.txt; do
  d=$(dirname "$f")
  grep -q "Fatal Python" "$f" 2>/dev/null || grep -qs '"worker_failed": true' "$d"/*.jsonl || rm -f "$f"
done
[ "$part" = 3 ] || rm -f "$out"/*/warm.log
for d in $(printf '%s\n' "$dims" "$tdims" | sort -u); do
  ls "$out/$d"/*.jsonl > /dev/null 2>&1 && python benchmarks/corpus_capture.py --table "$out/$d" > "$out/$d/table.md" 2>&1
done
for f in "$out"/*/warm.log; do  # (the warm-ups' autotuning logs run to megabytes: their last 300 kB kept)
  [ -f "$f" ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"
done
rm -f "$out"/*/meta.json  # (in every row too) at most 8 files come back from the device
grep -E "passed|failed|exit|WARNING: no z3|crashed" "$log" | tail -n 10
[ -f "$out/$dims/table.md" ] && head -c 5000 "$out/$dims/table.md"
[ "$tdims" != "$dims" ] && [ -f "$out/$tdims/table.md" ] && tail -c 2500 "$out/$tdims/table.md"
exit 0
