# Sourced by the device-call scripts (norm_fixed_cost_run.sh, norm_retune_run.sh,
# norm_sweep_run.sh): steps run one after another within a budget of seconds. Needs $budget
# (seconds) and $res (the folder each step's log goes to); the clock starts when this is
# sourced.
start=$(date +%s)
# seconds kept back for a last `pytest -m gpu` step (it took about 100 s on an H100, session 33)
GPU_TESTS_S=110
# seconds a step may take: its own cap, or what is left of the budget
left() { local l=$((budget - ($(date +%s) - start))); [ "$l" -gt "$1" ] && l=$1; echo "$l"; }
step() {  # step NAME CAP COMMAND...: runs COMMAND under the time it may take, logged
    local name=$1 cap; cap=$(left "$2"); shift 2
    if [ "$cap" -lt 20 ]; then echo "== $name: skipped, the budget is spent"; return; fi
    echo "== $name ($(date +%T), ${cap} s at most)"
    timeout "$cap" "$@" 2>&1 | tee "$res/$name.log"
}
