#!/usr/bin/env bash
# The persistent kernel's H100 sweep (issue 23; BENCHMARKS.md "A decoder layer", persist2): merged launches against
# the persistent kernel (cooperative grid) at its defaults, at 8 warps, with tile waits, and with tile waits at 8
# warps, for decode_bs1 and decode_bs8 (each run checks first: repeated calls bitwise the same, error vs float64).
# On the device machine, from a folder holding verimirage/ and benchmarks/ (the carried branch):
#   bash benchmarks/persistent_sweep.sh        (writes under $OUT; about 4-5 minutes with the machine warm)
set -o pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/persistent_sweep}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
sweep() {  # name, timeout seconds, repeats, then environment assignments
    local name=$1 limit=$2 reps=$3
    shift 3
    date -u
    env "$@" timeout "$limit" python3 benchmarks/persistent_check.py --cases decode_bs1 decode_bs8 --repeats "$reps" \
        --modes coop --out "$OUT/$name" >"$OUT/$name.log" 2>&1
}
sweep default 100 50 VERIMIRAGE_PERSISTENT_TILES=
sweep w8 60 20 VERIMIRAGE_PERSISTENT_WARPS=8
sweep tiles 70 20 VERIMIRAGE_PERSISTENT_TILES=1
sweep tiles8 45 20 VERIMIRAGE_PERSISTENT_TILES=1 VERIMIRAGE_PERSISTENT_WARPS=8
date -u
grep -h "persistent kernel kp\|Error" "$OUT"/*.log | cut -c1-300 | head -20
OUT=$OUT python3 - <<'P'
import glob, json, os
for f in sorted(glob.glob(os.environ["OUT"] + "/*/persistent_check.json")):
    for r in json.load(open(f))["rows"]:
        c = r.get("coop", {})
        print(f.split("/")[-2], r.get("case"), "merged", r.get("merged_us"), r.get("merged_kernel_sum_us"), "persistent",
              c.get("us"), c.get("kernel_us"), c.get("grid"), c.get("launch"), c.get("same_calls"), c.get("err"),
              c.get("max_abs_diff_vs_merged"), (c.get("error") or r.get("error") or "")[:200])
P
