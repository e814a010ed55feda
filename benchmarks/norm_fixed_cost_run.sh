#!/usr/bin/env bash
# The norm forwards' fixed-cost measurements (docs/perf-notes.md, sessions 28-29) as one
# device call, most needed first, each step cut short so the whole run ends within a budget:
#   1. experiment_norm_timeline.py --alternatives: where the fixed cost a call goes (ramp or
#      tail), 1K-32K (not 64K, where the ops run the grouped kernels, which it cannot stamp);
#   2. experiment_norm_size.py over 2^24..2^28 elements: the fixed cost and the rate, fitted
#      (the current table, JIT-compiled: timing needs no build);
#   3. compare_tables.py: the current table against BASE_TABLE at the row lengths NS (default
#      896-2048, where session 27's table changed the forwards' configs; builds both tables:
#      the longest step).
# Results go to $OUT/norm_fixed_cost.tgz (one file: the device returns at most 8).
#
# usage: bash benchmarks/norm_fixed_cost_run.sh [SECONDS [BASE_TABLE [NS]]]
#   SECONDS     the whole run's budget (default 560); a step that would start past it is cut
#   BASE_TABLE  the older tuned table (default .whl/sm90-session26.json; make it with
#               git show 21e3c46~1:kernel_src/tuned/sm90.json > .whl/sm90-session26.json)
#   NS          the row lengths the tables are compared at, comma-separated
#               (default 896,1024,1536,2048)
# Where Liger-Kernel or other wheels are carried in .whl, they are installed first.
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n 2,19p "$0"; exit 0; fi
budget=${1:-560}
base=${2:-.whl/sm90-session26.json}
ns=${3:-896,1024,1536,2048}
[[ $ns =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "NS must be row lengths like 896,1536, not '$ns'" >&2; exit 2; }
[[ $budget =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number, not '$budget'" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "OUT is not set: the folder the results go to" >&2; exit 2; }
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d)  # the logs and the carried wheels' site, removed once archived
res=$work/norm_fixed_cost
mkdir -p "$res"
trap 'tar czf "$OUT/norm_fixed_cost.tgz" -C "$work" norm_fixed_cost; rm -rf "$work"' EXIT
. benchmarks/_carried_wheels.sh  # Liger-Kernel and the rest, from .whl
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$res/gpu.txt"
. benchmarks/_budget_steps.sh  # start, left CAP, step NAME CAP COMMAND...
step timeline 170 python3 benchmarks/experiment_norm_timeline.py --alternatives \
    --out "$res/timeline"
step size 160 python3 benchmarks/experiment_norm_size.py --log2-elements 24,25,26,27,28 \
    --ops rms_norm,layer_norm --paths liger-aot --out "$res/size"
if [ -f "$base" ]; then
    step compare_tables 600 python3 benchmarks/compare_tables.py --base "$base" \
        --ops rms_norm,layer_norm --ns "$ns" --jobs "$(nproc)" --out "$res/cmp"
else
    echo "== compare_tables: skipped, no base table at $base"
fi
echo "== done after $(( $(date +%s) - start )) s"
