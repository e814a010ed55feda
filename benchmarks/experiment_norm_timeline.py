"""Experiment (session 28): where a norm forward's fixed cost a call goes, from each
program's start and end on the GPU's clock.

Split into a fixed cost and a rate (experiment_norm_size.py --fit, session 23's H200 run),
the library's plain RMSNorm and LayerNorm forwards stream at 98-102% of the copy's rate for
1K-32K columns but pay 7.3-9.9 us a call on the suite's timer, against 6.2 us for an SM copy
(torch.neg) and 6.6-7.8 for torch.compile's RMSNorm; 90% of copy at the suite's 2^26
elements allows about 7.7 us. A fixed cost is paid where the GPU is not streaming: at the
start (the first loads in flight, no stores yet) and at the end (SMs out of rows while the
last rows finish). This times that directly. Each kernel runs inside a wrapper that reads
%globaltimer before and after the library's kernel body (the same @triton.jit function,
inlined, with the config the op takes from the sm90 table) and stores (start, end, SM) a
program; a plain Triton copy, wrapped the same way, is the reference. Each launch follows
do_bench's flush (a 256 MB buffer zeroed), as in the suite. Per launch:

  span      first start to last end;
  ramp      first start until 90% of the peak number of programs in flight;
  tail      the last time 90% of the peak were in flight, to the last end;
  idle_end  how long an SM waits, on average, between its last program's end and the last
            end on the GPU (a cost only where the SMs still busy cannot take up the
            bandwidth: session 30's RMSNorm at 32K idled 3.9 us against the copy's 2.0 and
            spanned 1 us less);
  idle_start the same at the start: an SM's first program's start after the first start;
  op_runs   which forward the op itself runs on these inputs: "looped" (this kernel) or
            "grouped" (on sm90, long rows such as 64K: then the row times another kernel).

The event-timed `wrapped` less `span` is the time outside the programs (launch, drain).
`tail` reads little where the number in flight peaks only as the grid starts and settles
under 90% of that (session 30's H100: the copy's tail was 77 of its 91 us).

A program's end is when its last store is issued, not when it reaches memory, so each span
misses the drain of the last stores (the same for the copy). Medians over --repeats
launches; the timer's resolution (the smallest step between stamps)
is printed, as %globaltimer may tick by 32 ns or by 1 us. The wrapper costs one read of the
timer and one 24-byte store a program: the plain kernels are timed beside it (CUDA graphs)
to show it changes nothing.

Prediction: at 32K (2048 rows of 128 KB on 264 programs, 7.8 waves of ~8 us rows) idle_end
is 2-4 us for the library's kernels and under 1 us for the copy; at 1K-4K, where rows are
2-8 KB, the ends are short and the excess lies in the ramp.

  python benchmarks/experiment_norm_timeline.py [--ops rms_norm,layer_norm]
      [--ns 1024,4096,8192,16384,32768] [--log2-elements 26] [--repeats 20] [--alternatives]
      [--out DIR]
      (CUDA GPU; writes norm_timeline.csv; --alternatives adds each bucket's other configs
      that the tuner re-timed from CUDA graphs, the plateau the table chose from)
  python benchmarks/experiment_norm_timeline.py --compile-only [--ops ... --ns ...]
      (no GPU: each wrapper compiled for sm90, its registers against the plain kernel's)
"""
import argparse
import csv
import os
import statistics
import sys

if "--compile-only" in sys.argv:
    os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported: it compiles only

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from build_tools import tune  # noqa: E402
from kernel_src import tuning  # noqa: E402
from kernel_src.spec import Config  # noqa: E402
from kernel_src.layer_norm import kernels as ln_kernels  # noqa: E402
from kernel_src.layer_norm import spec as ln_spec  # noqa: E402
from kernel_src.rms_norm import kernels as rms_kernels  # noqa: E402
from kernel_src.rms_norm import spec as rms_spec  # noqa: E402

FLUSH_BYTES = 256 * 10**6  # do_bench's flush buffer
COPY_BLOCK = 4096  # the reference copy's elements a program (4 warps, 16-byte accesses)
STAMP = 3  # int64 words a program: start, end, SM
FIELDS = ("op", "n", "rows", "config", "programs", "peak_in_flight", "span_us", "ramp_us",
          "tail_us", "idle_end_us", "idle_start_us", "program_us", "resolution_ns",
          "wrapped_ms", "plain_ms", "op_runs")


@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _stamp_start(T):
    """Store this program's start before its body: nothing held across the body (a start
    kept in registers to the end took 6 more a thread at some configs, fewer programs an
    SM)."""
    tl.store(T + tl.program_id(0).to(tl.int64) * 3, _now())


@triton.jit
def _stamp_end(T):
    """Store this program's end and SM after the body's last instruction."""
    end = _now()
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                   is_pure=False, pack=1)
    base = T + tl.program_id(0).to(tl.int64) * 3
    tl.store(base + 1, end)
    tl.store(base + 2, sm.to(tl.int64))


@triton.jit
def rms_norm_fwd_stamped(T, Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
                         S, R, stride_s, stride_r, has_residual, store_stats,
                         CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         LOOP: tl.constexpr, STAGES: tl.constexpr,
                         PROGRAMS_PER_SM: tl.constexpr, PASS1_BLOCK: tl.constexpr = 0,
                         EXACT_N: tl.constexpr = 0):
    _stamp_start(T)
    rms_kernels.rms_norm_fwd(Y, X, W, RSTD, n_rows, n_cols, stride_y, stride_x, eps, offset,
                             S, R, stride_s, stride_r, has_residual, store_stats, CASTING,
                             BLOCK_M, BLOCK_N, LOOP, STAGES, PROGRAMS_PER_SM, PASS1_BLOCK,
                             EXACT_N)
    _stamp_end(T)


@triton.jit
def layer_norm_fwd_stamped(T, Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                           has_bias, store_stats, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, LOOP: tl.constexpr, STAGES: tl.constexpr,
                           PROGRAMS_PER_SM: tl.constexpr, PASS1_BLOCK: tl.constexpr = 0,
                           EXACT_N: tl.constexpr = 0, HOLD_ROW: tl.constexpr = 0):
    _stamp_start(T)
    ln_kernels.layer_norm_fwd(Y, X, W, B, MEAN, RSTD, n_rows, n_cols, stride_y, stride_x, eps,
                              has_bias, store_stats, BLOCK_M, BLOCK_N, LOOP, STAGES,
                              PROGRAMS_PER_SM, PASS1_BLOCK, EXACT_N, HOLD_ROW)
    _stamp_end(T)


@triton.jit
def copy_stamped(T, X, Y, BLOCK: tl.constexpr):
    """The reference: one read and one write an element, BLOCK elements a program."""
    _stamp_start(T)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs))
    _stamp_end(T)


# op -> (spec, the plain kernel, its stamped wrapper, tune's inputs and launch)
OPS = {
    "rms_norm": (rms_spec.FWD, rms_kernels.rms_norm_fwd, rms_norm_fwd_stamped,
                 lambda rows, n: tune.rms_norm_inputs(rows, n, False, torch.bfloat16, "cuda"),
                 tune.rms_norm_fwd),
    "layer_norm": (ln_spec.FWD, ln_kernels.layer_norm_fwd, layer_norm_fwd_stamped,
                   lambda rows, n: tune.layer_norm_inputs(rows, n, False, torch.bfloat16,
                                                          "cuda"),
                   tune.layer_norm_fwd),
}


def op_config(op: str, n: int):
    """The config the op takes on sm90 for bf16 rows of n columns (the tuned table's)."""
    spec = OPS[op][0]
    return tuning.select(spec, "sm90", (n, False) if op == "rms_norm" else (n,), 2)


def config_from_tag(tag: str) -> Config:
    """The Config a tag names (Config.tag's inverse for the norm forwards' tags: integer
    and boolean constexprs, then wN.sN)."""
    constexprs, warps, stages = {}, None, None
    for part in tag.split("."):
        if "=" in part:
            name, value = part.split("=", 1)
            if value in ("True", "False"):
                constexprs[name] = value == "True"
            elif value.isdigit():
                constexprs[name] = int(value)
            else:
                raise ValueError(f"config tag {tag!r}: {name} is not an integer or boolean")
        elif part[:1] == "w" and part[1:].isdigit():
            warps = int(part[1:])
        elif part[:1] == "s" and part[1:].isdigit():
            stages = int(part[1:])
        else:
            raise ValueError(f"config tag {tag!r}: cannot read {part!r}")
    if warps is None or stages is None:
        raise ValueError(f"config tag {tag!r}: no wN.sN")
    config = Config(constexprs, num_warps=warps, num_stages=stages)
    if config.tag != tag:
        raise ValueError(f"config tag {tag!r} reads back as {config.tag!r}")
    return config


def alternatives(op: str, n: int) -> list:
    """The configs the tuner re-timed from CUDA graphs for this bucket (the table entry's
    `refined` list), other than the op's own: the plateau the table chose from."""
    spec = OPS[op][0]
    _, table = tuning.load_table("sm90")
    key = tuning.bucket_key(spec, (n, False) if op == "rms_norm" else (n,))
    entry = table["specs"].get(spec.name, {}).get(key, {})
    chosen = op_config(op, n).tag
    tags = [c["tag"] for c in entry.get("refined", {}).get("configs", [])]
    return [config_from_tag(t) for t in dict.fromkeys(tags) if t != chosen]


class Launch:
    """kernel[grid](*args) for tune's launch functions (written for the plain kernels): with
    `stamps`, the stamp buffer goes first and the registers are capped at `maxnreg`; the
    compiled kernel and the grid's programs are kept."""

    def __init__(self, kernel, stamps: torch.Tensor | None = None, maxnreg: int = 0):
        self.kernel, self.stamps, self.maxnreg = kernel, stamps, maxnreg

    def __getitem__(self, grid):
        self.programs = grid[0]

        def launch(*args, **kw):
            if self.stamps is not None:
                args = (self.stamps, *args)
                kw = {**kw, "maxnreg": self.maxnreg} if self.maxnreg else kw
            self.compiled = self.kernel[grid](*args, **kw)

        return launch


def analyze(start, end, sm) -> dict:
    """The timeline of one launch from its programs' (start, end, SM) in ns (lists of ints):
    see the module docstring. The number in flight is counted at every start and end."""
    t0, t1 = min(start), max(end)
    events = sorted([(s, 1) for s in start] + [(e, -1) for e in end])
    level, curve = 0, []
    for t, step in events:
        level += step
        curve.append((t, level))
    peak = max(level for _, level in curve)
    high = [i for i, (_, level) in enumerate(curve) if level >= 0.9 * peak]
    ramp_end = curve[high[0]][0]
    tail_start = curve[high[-1] + 1][0]  # the event that took the level under 90% last
    last_end, first_start = {}, {}
    for s, e, m in zip(start, end, sm):
        last_end[m] = max(last_end.get(m, e), e)
        first_start[m] = min(first_start.get(m, s), s)
    stamps = sorted(set(start) | set(end))
    steps = [b - a for a, b in zip(stamps, stamps[1:]) if b > a]
    return {
        "programs": len(start), "peak_in_flight": peak,
        "span_us": (t1 - t0) / 1e3, "ramp_us": (ramp_end - t0) / 1e3,
        "tail_us": (t1 - tail_start) / 1e3,
        "idle_end_us": statistics.fmean(t1 - e for e in last_end.values()) / 1e3,
        "idle_start_us": statistics.fmean(s - t0 for s in first_start.values()) / 1e3,
        "program_us": statistics.median(e - s for s, e in zip(start, end)) / 1e3,
        "resolution_ns": min(steps) if steps else 0,
    }


def median_of(analyses: list) -> dict:
    return {k: statistics.median(a[k] for a in analyses) for k in analyses[0]}


def timeline(launch, stamps: torch.Tensor, programs: int, repeats: int, dirty) -> dict:
    """`repeats` launches, each after the flush; the median of each measure."""
    analyses = []
    for _ in range(repeats):
        stamps.zero_()
        dirty.zero_()  # last, as do_bench's flush is
        launch()
        torch.cuda.synchronize()
        s = stamps[:programs].cpu().tolist()
        analyses.append(analyze([p[0] for p in s], [p[1] for p in s], [p[2] for p in s]))
    return median_of(analyses)


def op_kernel(op: str, t: dict) -> str:
    """Which forward the op itself runs on these inputs: "looped" (the kernel timed here) or
    "grouped" (on sm90 the ops send long rows, e.g. 64K, to the grouped kernels, which this
    does not stamp: there the row times another kernel than the op's)."""
    if op == "rms_norm":
        from liger_aot.ops.rms_norm import grouped_forward_applies
        grouped = grouped_forward_applies(t["x"], t["w"])
    else:
        from liger_aot.ops.layer_norm import grouped_forward_applies
        grouped = grouped_forward_applies(t["x"], t["w"], t["b"])
    return "grouped" if grouped else "looped"


def run_case(op, n, rows, repeats, dirty, bench, config):
    spec, plain, wrapper, make, launch_fn = OPS[op]
    t = make(rows, n)
    plain_launch = Launch(plain)
    launch_fn(plain_launch, t, config)
    # the wrapper at the plain kernel's registers, so as many programs fit an SM
    regs = plain_launch.compiled.n_regs
    stamps = torch.zeros((rows, STAMP), dtype=torch.int64, device="cuda")  # >= programs
    stamped = Launch(wrapper, stamps, regs)
    t["y"].zero_()
    launch_fn(stamped, t, config)
    torch.cuda.synchronize()
    err = ((t["y"].float() - t["y_ref"]).abs().max() / t["y_ref"].abs().max()).item()
    if not err < tune.TOLERANCE:
        raise SystemExit(f"{op} N={n} {config.tag}: stamped forward off by {err:.2e}")
    if stamped.compiled.n_regs > regs or stamped.compiled.n_spills:
        print(f"warning: {op} N={n}: stamped {stamped.compiled.n_regs} registers, "
              f"{stamped.compiled.n_spills} spills (plain {regs})", flush=True)
    record = {"op": op, "n": n, "rows": rows, "config": config.tag,
              "op_runs": op_kernel(op, t),
              **timeline(lambda: launch_fn(stamped, t, config), stamps, stamped.programs,
                         repeats, dirty)}
    record["wrapped_ms"] = bench(lambda: launch_fn(stamped, t, config))
    record["plain_ms"] = bench(lambda: launch_fn(plain_launch, t, config))
    return record


def run_copy(elements, repeats, dirty, bench):
    x = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    programs = elements // COPY_BLOCK
    stamps = torch.zeros((programs, STAMP), dtype=torch.int64, device="cuda")

    def launch():
        copy_stamped[(programs,)](stamps, x, y, BLOCK=COPY_BLOCK, num_warps=4)

    launch()
    torch.cuda.synchronize()
    if not torch.equal(x, y):
        raise SystemExit("the stamped copy is wrong")
    record = {"op": "copy", "n": "", "rows": "", "config": f"BLOCK={COPY_BLOCK}.w4",
              "op_runs": "",
              **timeline(launch, stamps, programs, repeats, dirty)}
    record["wrapped_ms"] = bench(launch)
    record["plain_ms"] = bench(lambda: torch.neg(x, out=y))  # torch's SM copy
    return record


def compile_only(cases):
    """Each wrapper and its plain kernel compiled for sm90 (no GPU), as the build compiles
    the op's aligned bf16 variant: their registers, local memory, stack (spills) and shared
    memory. cases: (op, n, config)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from _sm90 import compile_sm90, sm90_usage  # tests/: sm90 ptxas

    def usage(k):
        return (f"{k['regs']} registers, {k['local']} B local, {k['stack']} B stack, "
                f"{k['shared']} B shared")

    for op, n, config in cases:
        spec, wrapper = OPS[op][0], OPS[op][2]
        options = (("CASTING", 0),) if op == "rms_norm" else ()
        plain = compile_sm90(spec, options, config)
        variant = spec.variant("bf16", "a16", options, config)
        # the wrapper at the plain kernel's registers, as run_case launches it
        stamped = triton.compile(
            ASTSource(wrapper, signature={"T": "*i64", **variant.signature()},
                      constexprs=variant.constexprs(),
                      attrs={(0,): [["tt.divisibility", 16]],
                             **{(i + 1,): v for (i,), v in variant.divisibility_attrs().items()}}),
            target=GPUTarget("cuda", 90, 32),
            options={**config.compile_options(), "maxnreg": plain["regs"]})
        stamped = {"shared": stamped.metadata.shared, **sm90_usage(stamped.asm["cubin"])}
        print(f"{op} N={n} {config.tag}: plain {usage(plain)}; stamped at maxnreg "
              f"{plain['regs']}: {usage(stamped)}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="rms_norm,layer_norm")
    p.add_argument("--ns", default="1024,4096,8192,16384,32768")
    p.add_argument("--log2-elements", type=int, default=26,
                   help="M*N = 2^k bf16 elements (default 26, the suite's)")
    p.add_argument("--repeats", type=int, default=20, help="launches a case (default 20)")
    p.add_argument("--alternatives", action="store_true",
                   help="also each bucket's other configs the tuner re-timed from graphs "
                        "(the table's `refined` list): what sets the chosen one apart")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--compile-only", action="store_true",
                   help="compile each wrapper for sm90 and stop (no GPU needed)")
    args = p.parse_args(argv)
    ops = args.ops.split(",")
    for op in ops:
        if op not in OPS:
            p.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    ns = [int(n) for n in args.ns.split(",")]
    if any(n < 1 or 2**args.log2_elements % n for n in ns):
        p.error(f"--ns: every row length must divide 2^{args.log2_elements}")
    if args.repeats < 1:
        p.error("--repeats: at least 1")
    cases = [(op, n, config) for op in ops for n in ns
             for config in [op_config(op, n)] + (alternatives(op, n) if args.alternatives else [])]
    if args.compile_only:
        return compile_only(cases)
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this experiment reads the GPU's clock "
                         "(--compile-only needs none)")
    from benchmarks import suite

    timer = suite.Bench("cuda", warmup_ms=10.0, rep_ms=50.0)
    dirty = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    elements = 2**args.log2_elements
    records = [run_copy(elements, args.repeats, dirty, timer.time_graph)]
    for op, n, config in cases:
        records.append(run_case(op, n, elements // n, args.repeats, dirty, timer.time_graph,
                                config))
        torch.cuda.empty_cache()
    print(f"{torch.cuda.get_device_name()}, 2^{args.log2_elements} bf16 elements, medians of "
          f"{args.repeats} launches after the flush (us; resolution in ns):")
    print(f"{'case':18} {'programs':>8} {'peak':>5} {'span':>7} {'ramp':>6} {'tail':>6} "
          f"{'idle_end':>8} {'idle_start':>10} {'program':>7} {'res':>5} {'wrapped':>8} "
          f"{'plain':>8}")
    for r in records:
        print(f"{r['op'] + ' ' + str(r['n']):18} {r['programs']:8.0f} {r['peak_in_flight']:5.0f} "
              f"{r['span_us']:7.2f} {r['ramp_us']:6.2f} {r['tail_us']:6.2f} "
              f"{r['idle_end_us']:8.2f} {r['idle_start_us']:10.2f} {r['program_us']:7.2f} "
              f"{r['resolution_ns']:5.0f} {r['wrapped_ms']:8.4f} {r['plain_ms']:8.4f}  "
              f"{r['config']}" + ("  (not the op's kernel: it runs the grouped one here)"
                                  if r["op_runs"] == "grouped" else ""))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "norm_timeline.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(records)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
