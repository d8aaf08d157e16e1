#!/bin/bash
# One device call for the decoder layer (issue 23): today's code and candidates against the code and candidates
# before a change, each part under its own time limit (rows are written after every case).
#
#   bash benchmarks/perf/layer_ab.sh OUT BEFORE [LIMITS]
#
# OUT/after:  this tree (code + benchmarks/candidates/layer), all baselines (torch.compile max-autotune with and
#             without cudagraphs, eager) and the one-kernel-per-op program, per-kernel times by name;
# OUT/before: the tree BEFORE (another checkout: its code and its candidates), verimirage only, cases $BEFORE_CASES
#             (default decode_bs8 decode_bs32: decode_bs1's module is the same in both trees);
# OUT/mid:    this tree's code on the candidates in $MID_CANDIDATES (default BEFORE's), verimirage only, cases
#             $MID_CASES (default decode_bs32: what the code generator alone changed);
# OUT/sweep:  decode_bs8's kernels under a few uniform launch configurations (layer.py --sweep-configs).
# LIMITS: seconds for the four parts (default "320 100 60 100"). At most 8 files come back: 4 logs, 4 layer.json.
set -u
OUT=$1
BEFORE=$2
read -r T_AFTER T_BEFORE T_MID T_SWEEP <<< "${3:-320 100 60 100}"
HERE=$PWD
CASES="decode_bs1 decode_bs8 decode_bs32"
mkdir -p "$OUT"
PYTHONPATH=$HERE timeout "$T_AFTER" python3 benchmarks/layer.py gpu --cases $CASES --top-k 1 --out "$OUT/after" \
    > "$OUT/after.log" 2>&1
(cd "$BEFORE" && PYTHONPATH=$PWD timeout "$T_BEFORE" python3 benchmarks/layer.py gpu \
    --cases ${BEFORE_CASES:-decode_bs8 decode_bs32} --top-k 1 \
    --no-inductor --no-per-op --out "$OUT/before" > "$OUT/before.log" 2>&1)
PYTHONPATH=$HERE timeout "$T_MID" python3 benchmarks/layer.py gpu --cases ${MID_CASES:-decode_bs32} --top-k 1 \
    --no-inductor --no-per-op \
    --candidates "${MID_CANDIDATES:-$BEFORE/benchmarks/candidates/layer}" --out "$OUT/mid" > "$OUT/mid.log" 2>&1
PYTHONPATH=$HERE timeout "$T_SWEEP" python3 benchmarks/layer.py gpu --cases decode_bs8 --top-k 1 --no-inductor \
    --no-per-op --sweep-configs decode_bs8 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv >> "$OUT/after.log" 2>&1
rm -f "$OUT"/*/layer_table.md  # (the device tool brings back at most 8 files; each log ends with its table)
tail -n 6 "$OUT"/*.log
