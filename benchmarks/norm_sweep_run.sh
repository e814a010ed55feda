#!/usr/bin/env bash
# The issue's norm sweep on the checkout's table as one device call, each step cut short so
# the whole run ends within a budget:
#   1. liger-aot build --arch sm90 (the checkout's tuned table) into a temporary folder;
#   2. suite.py --ops rms_norm,layer_norm,fused_add_rms_norm --graphs over PATHS: liger-aot
#      on that build (strict: no JIT), torch.compile and Liger-Kernel side by side, N = 1K to
#      64K at 2^26 elements, every output checked against fp32 before it is timed;
#   3. pytest -m gpu on that build.
# Results go to $OUT/norm_sweep.tgz (the device returns few files): the suite's kernels.csv,
# kernels_targets.txt and plots, and each step's log.
#
# usage: bash benchmarks/norm_sweep_run.sh [SECONDS [PATHS]]
#   SECONDS  the whole run's budget (default 560)
#   PATHS    the suite's paths (default liger-aot,torch.compile,liger-kernel)
# Liger-Kernel comes from its wheel in .whl (pip download liger-kernel==0.8.5 --no-deps -d .whl).
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n 2,15p "$0"; exit 0; fi
budget=${1:-560}
paths=${2:-liger-aot,torch.compile,liger-kernel}
[[ $budget =~ ^[0-9]+$ ]] || { echo "SECONDS must be a whole number, not '$budget'" >&2; exit 2; }
[[ $paths =~ ^[a-z.-]+(,[a-z.-]+)*$ ]] || { echo "PATHS are suite paths like liger-aot,torch.compile, not '$paths'" >&2; exit 2; }
[ -n "${OUT:-}" ] || { echo "OUT is not set: the folder the results go to" >&2; exit 2; }
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d)  # the build, the logs and the carried wheels' site, removed once archived
res=$work/norm_sweep
mkdir -p "$res"
trap 'tar czf "$OUT/norm_sweep.tgz" -C "$work" norm_sweep; rm -rf "$work"' EXIT
. benchmarks/_carried_wheels.sh  # Liger-Kernel, from .whl
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$res/gpu.txt"
. benchmarks/_budget_steps.sh  # start, left CAP, step NAME CAP COMMAND...
art=$work/artifacts
step build 240 python3 -m liger_aot build --arch sm90 --out "$art" --jobs "$(nproc)"
export LIGER_AOT_ARTIFACT_DIR=$art
LIGER_AOT_STRICT=1 step suite $(( $(left 100000) - GPU_TESTS_S )) python3 benchmarks/suite.py \
    --ops rms_norm,layer_norm,fused_add_rms_norm --paths "$paths" --graphs --out "$res/suite"
step gpu_tests 600 python3 -m pytest -m gpu -q -x tests
echo "== done after $(( $(date +%s) - start )) s"
