#!/usr/bin/env bash
# Session 39's and 37's open leads as one device call, for an H200 (wrap it in on_card.sh),
# each step cut short so the whole run ends within a budget:
#   1. experiment_norm_fwd_held_row.py, three rounds: LayerNorm's looped forward with the row
#      held for pass 2 against the table's config at 1K, 8K, 16K and 32K; where a held config
#      is 1% faster, it writes the candidate table sm90-held.json;
#   2. compare_tables.py: the table against the candidate at 1024,8192,16384 (both AOT
#      builds, checked against fp32, timed from CUDA graphs), where step 1 wrote one;
#   3. pytest -m gpu on step 2's build of the candidate;
# Two trials follow, each a patch of docs/results applied to a copy of the checkout, two
# rounds of experiment_norm_fwd_grouped.py each:
#   4. no_exchange (session 40): the grouped forwards without their words' exchange (wrong
#      results, timed unchecked) against the shipped kernel, RMSNorm at 64K, LayerNorm at
#      64K and 32K: what the exchange costs beyond its memset;
#   5. w_fp32 (session 37): LayerNorm's grouped forward with w and b in fp32 at 64K, 48K
#      and 20K.
# Results go to $OUT/held_row.tgz (the device returns few files): each step's log, the
# candidate table (copy it to kernel_src/tuned/sm90.json to adopt it), compare_tables.csv.
#
# usage: bash benchmarks/held_row_run.sh [SECONDS]
#   SECONDS  the whole run's budget (default 560)
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n 2,23p "$0"; exit 0; fi
budget=${1:-560}
[[ $budget =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number, not '$budget'" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "OUT is not set: the folder the results go to" >&2; exit 2; }
cd "$(dirname "$0")/.."
root=$PWD
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d)  # the builds, the patched copy and the logs, removed once archived
res=$work/held_row
mkdir -p "$res"
trap 'tar czf "$OUT/held_row.tgz" -C "$work" held_row; rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$res/gpu.txt"
. benchmarks/_budget_steps.sh  # start, left CAP, step NAME CAP COMMAND...
TRIALS_S=120  # steps 4 and 5: six experiment processes (about 20 s each on an H100)
candidate=$res/sm90-held.json
step held_row 200 python3 benchmarks/experiment_norm_fwd_held_row.py --rounds 3 \
    --candidate-table "$candidate"
if [ -f "$candidate" ]; then
    step compare_tables $(( $(left 100000) - GPU_TESTS_S - TRIALS_S )) \
        python3 benchmarks/compare_tables.py --base kernel_src/tuned/sm90.json \
        --new "$candidate" --ops layer_norm --ns 1024,8192,16384 --jobs "$(nproc)" \
        --work "$work/stage" --out "$res/cmp"
else
    echo "== compare_tables: skipped, no candidate table"
fi
if [ -d "$work/stage/artifacts-new" ]; then
    LIGER_AOT_ARTIFACT_DIR=$work/stage/artifacts-new step gpu_tests \
        $(( $(left 100000) - TRIALS_S )) python3 -m pytest -m gpu -q -x tests
else
    echo "== gpu_tests: skipped, no build of a candidate table"
fi
# trial NAME PATCH CAP OP COLS CONFIGS [OP COLS CONFIGS...]: PATCH applied to a copy of the
# checkout, then two rounds of its experiment_norm_fwd_grouped.py for each OP at COLS (spaced)
trial() {
    local name=$1 patch=$2 cap=$3 copy=$work/$1; shift 3
    mkdir -p "$copy"
    cp -a benchmarks build_tools kernel_src liger_aot tests setup.py pyproject.toml "$copy"/
    if ! (cd "$copy" && git apply "$root/$patch"); then
        echo "== $name: skipped, $patch does not apply to this checkout"
        return
    fi
    # the copy's sources first: the experiment puts its own checkout on sys.path
    PYTHONPATH=$copy step "$name" "$cap" bash -c 'copy=$1; shift; args=("$@")
        for r in 1 2; do echo "== round $r"
            for ((i = 0; i < ${#args[@]}; i += 3)); do
                python3 "$copy"/benchmarks/experiment_norm_fwd_grouped.py --op "${args[i]}" \
                    --cols ${args[i + 1]} --configs "${args[i + 2]}"
            done
        done' _ "$copy" "$@"
}
trial no_exchange docs/results/2026-12-07-grouped-fwd-no-exchange-session40.patch \
    $(( $(left 100000) * 6 / 10 )) \
    rms_norm 65536 "2048,3,2,12,80,EXCHANGE=1;2048,3,2,12,80,EXCHANGE=0" \
    layer_norm "65536 32768" "2048,3,2,10,96,EXCHANGE=1;2048,3,2,10,96,EXCHANGE=0"
trial w_fp32 docs/results/2026-12-06-ln-grouped-fwd-w-fp32-session37.patch 100000 \
    layer_norm "65536 49152 20480" "2048,3,2,10,96,W_FP32=0;2048,3,2,8,128,W_FP32=1"
echo "== done after $(( $(date +%s) - start )) s"
