"""Experiment (session 39): LayerNorm's looped forward with pass 2 from the row pass 1 loaded
(HOLD_ROW, kernel_src/layer_norm/kernels.py) against the table's configs, which read the row
again from L2.

The tuned looped forwards at 1K-32K load the whole row in pass 1 (PASS1_BLOCK = the bucket,
the length compiled in: EXACT_N), reduce, let those registers go and read the row again from
L2 in BLOCK_N chunks for pass 2 (evict_last, then evict_first). Holding the row instead was
timed only at 64K (session 11: one 1024-thread program an SM, 32-35%). Here, for each row
length: the op as shipped ("library": the AOT build where LIGER_AOT_ARTIFACT_DIR names one,
else the JIT of the table's config), the table's config forced through the op (JIT), and
HOLD_ROW configs on each warp count, all through `layer_norm_forward` (outputs allocated, the
kernel launched), each a CUDA-graph replay (the L2 flushed before each, do_bench's median),
checked first against an fp32 torch reference; bf16, 2^26 elements. Needs a CUDA GPU;
--compile-only: sm90 ptxas registers, stack and programs an SM of each config on a CPU.
--candidate-table PATH (session 40): after the rounds, where a row length's fastest held
config (median over the rounds) is at least 1% faster than the table's config, a copy of
the sm90 table with that config in the bucket goes to PATH, for compare_tables.py to A/B on
the AOT builds (benchmarks/held_row_run.sh); the bucket's other lengths keep what they ran.

  python benchmarks/experiment_norm_fwd_held_row.py [--cases "N:warps,warps;N:warps"]
      [--rounds 2] [--compile-only] [--candidate-table PATH]
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402

from _gpu import (checked_timing, graph_ms, layer_norm_forward_case,  # noqa: E402
                  parse_row_warps, start_timing)
from _op_helpers import ForcedConfig  # noqa: E402  (tests/)
from liger_aot.kernel_src import tuning  # noqa: E402
from liger_aot.kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from liger_aot.kernel_src.spec import EXACT_KEY, HOLD_KEY, Config  # noqa: E402
from liger_aot.ops import layer_norm as ln_mod  # noqa: E402

CASES = "1024:1,2,4;8192:8,16,32;16384:16,32;32768:32"
EPS = 1e-6


def parse_cases(text):
    """'N:warps,warps;N:warps' -> [(N, warps)]; N a power of two from 1024 (a bucket of the
    sm90 table; see _gpu.parse_row_warps)."""
    return parse_row_warps(text, 1024)


def held(n: int, warps: int) -> Config:
    """The HOLD_ROW config of one row a program on `warps` (BLOCK_N, unused, as the tuner
    writes it: under the row)."""
    return Config({"BLOCK_M": 1, "BLOCK_N": n // 2, "LOOP": True, "STAGES": 1,
                   "PROGRAMS_PER_SM": 0, "PASS1_BLOCK": n, EXACT_KEY: 1, HOLD_KEY: 1},
                  num_warps=warps)


def configs_of(cases):
    """{N: [(name, config)]}: the table's sm90 config for N, then the held rows."""
    out = {}
    for n, warps in cases:
        if n not in out:
            out[n] = [("table", tuning.select(ln_spec.FWD, "sm90", (n,)))]
        out[n].append(("held", held(n, warps)))
    return out


def describe(name, config) -> str:
    return f"{name} {config.num_warps:2d} warps" + (f" ({config.tag})" if name == "table" else "")


def programs_an_sm(kernel, config) -> int:
    from _sm90 import SM90_BLOCKS, programs_fit
    return max([k for k in range(1, SM90_BLOCKS + 1) if programs_fit(kernel, config, k)],
               default=0)


def compile_only(configs):
    from _sm90 import compile_sm90
    for n, named in configs.items():
        for name, config in named:
            k = compile_sm90(ln_spec.FWD, [], config)
            print(f"N {n:6d} {describe(name, config)}: regs {k['regs']:3d}, stack "
                  f"{k['stack']} B, {programs_an_sm(k, config)} programs an SM", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=CASES,
                        help=f"'N:warps,warps;N:warps' (default {CASES})")
    parser.add_argument("--elements", type=int, default=1 << 26, help="rows x cols a shape")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each config is timed, in turns (default 2: the spread)")
    parser.add_argument("--compile-only", action="store_true",
                        help="sm90 ptxas only (no GPU): registers, stack, programs an SM")
    parser.add_argument("--candidate-table", metavar="PATH",
                        help="write the sm90 table with each length's held config that "
                             f"beats the table's by {100 * (1 - ADOPT_RATIO):.0f}%% (median "
                             "over the rounds) to PATH; nothing where none does")
    args = parser.parse_args()
    if args.rounds < 1 or args.elements < 1024:
        parser.error("--rounds must be at least 1 and --elements at least 1024")
    if args.candidate_table and args.compile_only:
        parser.error("--candidate-table needs timings: not with --compile-only")
    configs = configs_of(parse_cases(args.cases))
    if args.compile_only:
        compile_only(configs)
        return
    bw = start_timing("layer_norm")
    times = {}
    for r in range(args.rounds):
        print(f"== round {r + 1}", flush=True)
        time_round(configs, args.elements, bw, times)
    if args.candidate_table:
        write_candidate(args.candidate_table, configs, times)


def write_candidate(path, configs, times):
    """The sm90 table with candidate_configs' choices, atomically to `path`, and what it
    chose printed; nothing written where nothing is chosen."""
    from liger_aot.build_tools.aot import atomic_write

    _, table = tuning.read_table(tuning.table_path("sm90"), "sm90")
    chosen = candidate_configs(configs, times)
    for n, (config, table_ms, ms) in sorted(chosen.items()):
        print(f"candidate: N {n}: held on {config.num_warps} warps, {ms:.4f} ms against the "
              f"table's {table_ms:.4f} ms ({100 * (1 - ms / table_ms):.1f}% less)", flush=True)
    if not chosen:
        print(f"candidate: no held config beats the table's by {100 * (1 - ADOPT_RATIO):.0f}%: "
              f"{path} not written", flush=True)
        return
    entries = table["specs"][ln_spec.FWD.name]
    for n, (config, _, _) in chosen.items():
        entries[tuning.bucket_key(ln_spec.FWD, (n,))]["config"] = tuning.config_record(config)
    atomic_write(path, tuning.format_table(table))
    print(f"candidate: wrote {path}", flush=True)


# A held config goes into the candidate table where its median is at most this share of the
# table config's (both forced through the op on the JIT, the same rounds).
ADOPT_RATIO = 0.99


def candidate_configs(configs, times) -> dict:
    """{N: (held config, the table config's median ms, the held config's)} for the row lengths
    whose fastest held config (by the median of its rounds; a round that failed is NaN and
    loses) takes at most ADOPT_RATIO of the table config's median. times: {(N, config tag):
    [ms of each round]}."""
    out = {}
    for n, named in configs.items():
        (_, table_config), held_configs = named[0], [c for name, c in named[1:]]

        def median(config):
            ms = times.get((n, config.tag), [])
            return statistics.median(ms) if ms and all(m == m for m in ms) else float("inf")

        table_ms = median(table_config)
        if not held_configs or table_ms == float("inf"):
            continue
        best = min(held_configs, key=median)
        if median(best) <= ADOPT_RATIO * table_ms:
            out[n] = (best, table_ms, median(best))
    return out


def time_round(configs, elements, bw, times):
    """One timing of each config (and the library's own) at each row length, each config's
    ms appended to times[(N, its tag)]."""
    shipped = ln_mod._fwd
    for n, named in configs.items():
        m = elements // n
        x, w, b, err = layer_norm_forward_case(m, n, EPS)
        floor_ms = 4 * m * n / bw * 1e3

        def forward():
            return ln_mod.layer_norm_forward(x, w, b, EPS)[:1]

        for name, config in [("library", None)] + named:
            ln_mod._fwd = shipped if config is None else ForcedConfig(shipped, config)
            try:
                e, ms, status = checked_timing(forward, err, graph_ms)
            finally:
                ln_mod._fwd = shipped
            if config is not None:
                times.setdefault((n, config.tag), []).append(ms)
            label = name if config is None else f"{name} {config.num_warps:2d} warps"
            print(f"{m:6d} x {n:5d} {label:16s} {ms:7.4f} ms "
                  f"{100 * floor_ms / ms:5.1f}% of copy  err {e:.1e} {status}"
                  + (f" {config.tag}" if name == "table" else ""), flush=True)


if __name__ == "__main__":
    main()
