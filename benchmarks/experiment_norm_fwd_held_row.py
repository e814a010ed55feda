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

  python benchmarks/experiment_norm_fwd_held_row.py [--cases "N:warps,warps;N:warps"]
      [--rounds 2] [--compile-only]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from _gpu import checked_timing, copy_bandwidth, graph_ms  # noqa: E402
from _op_helpers import ForcedConfig  # noqa: E402  (tests/)
from liger_aot.kernel_src import tuning  # noqa: E402
from liger_aot.kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from liger_aot.kernel_src.spec import EXACT_KEY, HOLD_KEY, Config  # noqa: E402
from liger_aot.ops import layer_norm as ln_mod  # noqa: E402

CASES = "1024:1,2,4;8192:8,16,32;16384:16,32;32768:32"
EPS = 1e-6


def parse_cases(text):
    """'N:warps,warps;N:warps' -> [(N, warps)]; N a power of two from 1024 (a bucket of the
    sm90 table), warps a power of two up to 32 with 8-64 columns a thread. SystemExit
    naming the bad item otherwise."""
    out = []
    for item in text.split(";"):
        try:
            n, warps = item.split(":")
            pairs = [(int(n), int(w)) for w in warps.split(",")]
        except ValueError:
            raise SystemExit(f"--cases: '{item}' is not N:warps[,warps...]") from None
        for n, w in pairs:
            if (n < 1024 or n & (n - 1) or not 1 <= w <= 32 or w & (w - 1)
                    or not 8 <= n // (32 * w) <= 64):
                raise SystemExit(f"--cases: '{item}': N must be a power of two from 1024, "
                                 "warps a power of two up to 32, 8-64 columns a thread")
        out += pairs
    return out


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
    args = parser.parse_args()
    if args.rounds < 1 or args.elements < 1024:
        parser.error("--rounds must be at least 1 and --elements at least 1024")
    configs = configs_of(parse_cases(args.cases))
    if args.compile_only:
        compile_only(configs)
        return
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this experiment times GPU kernels "
                         "(--compile-only runs on a CPU)")

    import warnings

    warnings.filterwarnings("ignore", message=".*compiling it with Triton JIT.*")
    bw = copy_bandwidth()
    print(f"layer_norm: copy {bw / 1e12:.2f} TB/s, {torch.cuda.get_device_name(0)}",
          flush=True)
    for r in range(args.rounds):
        print(f"== round {r + 1}", flush=True)
        time_round(configs, args.elements, bw)


def time_round(configs, elements, bw):
    """One timing of each config (and the library's own) at each row length."""
    shipped = ln_mod._fwd
    for n, named in configs.items():
        m = elements // n
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen) + 3.0
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16)
        ref = F.layer_norm(x.float(), (n,), w.float(), b.float(), EPS)
        floor_ms = 4 * m * n / bw * 1e3

        def err(y):
            return ((y.float() - ref).norm() / ref.norm()).item()

        def forward():
            return ln_mod.layer_norm_forward(x, w, b, EPS)[:1]

        for name, config in [("library", None)] + named:
            ln_mod._fwd = shipped if config is None else ForcedConfig(shipped, config)
            try:
                e, ms, status = checked_timing(forward, err, graph_ms)
            finally:
                ln_mod._fwd = shipped
            label = name if config is None else f"{name} {config.num_warps:2d} warps"
            print(f"{m:6d} x {n:5d} {label:16s} {ms:7.4f} ms "
                  f"{100 * floor_ms / ms:5.1f}% of copy  err {e:.1e} {status}"
                  + (f" {config.tag}" if name == "table" else ""), flush=True)


if __name__ == "__main__":
    main()
