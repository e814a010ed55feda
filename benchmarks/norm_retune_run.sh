#!/usr/bin/env bash
# One device call that re-measures the norm buckets' other lengths and says what it changes
# (docs/perf-notes.md, sessions 32-33), each step cut short so the whole run ends within a
# budget:
#   1. liger-aot tune --arch sm90 --specs SPECS --inexact-only --graphs-top 4 --cols COLS:
#      the buckets' other lengths (and lengths of their own) from the table as it is; it
#      writes bucket by bucket, so a cut keeps what it measured (at most 60% of the budget,
#      and no more than leaves steps 2 and 3 their 160 s and 110 s; 30 s at least);
#   2. compare_tables.py: the table before step 1 against the one after, at the row lengths
#      NS (both built, checked against fp32, then timed from CUDA graphs);
#   3. pytest -m gpu on step 2's build of the new table.
# Results go to $OUT/norm_retune.tgz (the device returns few files): the new table
# (sm90.json: copy it to kernel_src/tuned/ to keep it), the logs, compare_tables.csv.
#
# usage: bash benchmarks/norm_retune_run.sh [SECONDS [COLS [NS [SPECS]]]]
#   SECONDS  the whole run's budget (default 560)
#   COLS     the buckets' row lengths, comma-separated (default 4096,8192)
#   NS       the row lengths compared (default 2560,3072,3584,5120,6144,7168)
#   SPECS    the specs tuned (default rms_norm_fwd,rms_norm_bwd,layer_norm_fwd,layer_norm_bwd)
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n 2,19p "$0"; exit 0; fi
budget=${1:-560}
cols=${2:-4096,8192}
ns=${3:-2560,3072,3584,5120,6144,7168}
specs=${4:-rms_norm_fwd,rms_norm_bwd,layer_norm_fwd,layer_norm_bwd}
[[ $budget =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number, not '$budget'" >&2; exit 2; }
for v in "$cols" "$ns"; do
    [[ $v =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "COLS and NS are row lengths like 4096,8192, not '$v'" >&2; exit 2; }
done
[[ $specs =~ ^[a-z_]+(,[a-z_]+)*$ ]] || { echo "SPECS are spec names like rms_norm_fwd, not '$specs'" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "OUT is not set: the folder the results go to" >&2; exit 2; }
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
table=kernel_src/tuned/sm90.json
work=$(mktemp -d)  # the logs, removed once archived
res=$work/norm_retune
mkdir -p "$res"
trap 'cp "$table" "$res/sm90.json"; tar czf "$OUT/norm_retune.tgz" -C "$work" norm_retune; rm -rf "$work"' EXIT
cp "$table" "$res/sm90-before.json"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$res/gpu.txt"
. benchmarks/_budget_steps.sh  # start, left CAP, step NAME CAP COMMAND...
# compare_tables' share: two sm90 builds and two rounds took about 160 s on an H100 (session
# 30). A tune without it is not adopted (session 36: a 330 s run left it 32 s, cut in its
# first build), so the tune gives way first.
COMPARE_S=160
tune_cap=$(( budget - COMPARE_S - GPU_TESTS_S ))
[ "$tune_cap" -gt $((budget * 6 / 10)) ] && tune_cap=$((budget * 6 / 10))
[ "$tune_cap" -lt 30 ] && tune_cap=30
step tune "$tune_cap" python3 -m liger_aot tune --arch sm90 --specs "$specs" \
    --inexact-only --graphs-top 4 --cols "$cols"
step compare_tables $(( $(left 100000) - GPU_TESTS_S )) python3 benchmarks/compare_tables.py \
    --base "$res/sm90-before.json" --ns "$ns" --jobs "$(nproc)" --work "$work/stage" \
    --out "$res/cmp"
art=$work/stage/artifacts-new  # compare_tables' build of the new table
if [ -d "$art" ]; then export LIGER_AOT_ARTIFACT_DIR=$art; fi
step gpu_tests 600 python3 -m pytest -m gpu -q -x tests
echo "== done after $(( $(date +%s) - start )) s"
