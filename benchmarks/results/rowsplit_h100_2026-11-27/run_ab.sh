#!/usr/bin/env bash
# rowsplit (session 18): log_softmax 16x32000 - the split designs with a second pass (new) against the one-block-a-row
# designs of main 36a7b2e, eager and torch.compile max-autotune, one call, CUDA-graph medians.
set -u
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; } > "$OUT/start.txt"
timeout 100 python3 benchmarks/bench.py --set models --candidates ab_cands --cases log_softmax --top-k 12 --configs 2 \
  --configs-no-matmul 1 --prewarm 12 --rep-ms 50 --select-rep-ms 20 --inductor-alone --out "$OUT/models" > "$OUT/models.log" 2>&1
echo "rc=$?"
tail -25 "$OUT/models.log"
python3 - <<'PY'
import json, os
d = json.load(open(os.path.join(os.environ["OUT"], "models", "models.json")))
for r in d["rows"]:
    print(r["case"], "eager", round(r.get("eager_us", 0), 2), "inductor", round(r.get("inductor_us", 0) or 0, 2),
          "ours", round(r.get("verimirage_us", 0) or 0, 2), "default", r.get("default_us"))
    for c in r.get("cost_vs_measured", []):
        print("  rank", c["rank"], "k", c["kernels"], "est", round(c["cost_us"], 2), "meas", round(c["measured_us"], 3))
PY
date -u >> "$OUT/start.txt"
